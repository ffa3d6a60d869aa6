"""The spec compiled to one table.

The `Table` is what everything reads: the core's every decision, the docs'
diagram and transition table, the coverage reports and the model checker.
The reference it is proven against, the spec as a `transitions.Machine`,
is verification and lives in `devbridge.models.machine`: nothing here
imports `transitions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from devbridge.spec import LEVELS, Lifecycle, Outcome, Rejection, guard_values, level
from devbridge.spec import load as load_spec

#: Names that moved to devbridge.models.machine; served from here for one release, with a warning.


@dataclass(frozen=True, slots=True)
class Step:
    """One compiled candidate: take it when every (guard, value) holds."""

    guards: tuple[tuple[str, bool], ...]
    dest: str | None  # None: a rejection
    release: bool
    rule: str | None  # set for rejections


@dataclass(frozen=True)
class Table:
    """(state, event) -> candidates in the order they are tried (`steps`), and every decision
    keyed by the counters' levels (`flat`): the hot path is one dict lookup."""

    steps: Mapping[tuple[str, str], tuple[Step, ...]]
    terminal: frozenset[str]
    flat: Mapping[tuple[str, str, int, int], Step]

    def lookup(self, state: str, event: str, copies: int, computes: int) -> Step:
        return self.flat[(state, event, level(copies), level(computes))]

    def candidates(self) -> list[tuple[str, str, int, Step]]:
        """Every compiled candidate: (state, event, its index for the pair, step)."""
        return [(s, e, i, step) for (s, e), steps in self.steps.items() for i, step in enumerate(steps)]

    @staticmethod
    def describe(state: str, event: str, step: Step) -> str:
        guards = ",".join(g if want else "!" + g for g, want in step.guards)
        head = f"{state} --{event}{f'[{guards}]' if guards else ''}-->"
        if step.rule is not None:
            return f"{head} reject {step.rule}"
        return f"{head} {step.dest}{' (release)' if step.release else ''}"


def compile_table(lifecycle: Lifecycle | None = None) -> Table:
    """The spec's candidates as a Table; each decision is the spec's own (`Lifecycle.decide`)."""
    lc = lifecycle or load_spec()
    outcomes: tuple[Outcome, ...] = (*lc.rejections, *lc.transitions)
    compiled = {o: _compile(o) for o in outcomes}
    steps = {(s, e): tuple(compiled[o] for o in lc.outcomes(s, e)) for s, e in lc.pairs()}
    flat = {
        (s, e, c, k): compiled[lc.decide(s, e, guard_values(c, k))]
        for s, e in lc.pairs()
        for c in range(LEVELS)
        for k in range(LEVELS)
    }
    return Table(steps, frozenset(s for s, st in lc.states.items() if st.terminal), flat)


def _compile(outcome: Outcome) -> Step:
    if isinstance(outcome, Rejection):
        return Step(outcome.guards, None, False, outcome.rule)
    return Step(outcome.guards, outcome.dest, outcome.action == "release_memory", None)


_DEFAULT: Table | None = None


def default_table() -> Table:
    """The table compiled from the packaged spec (built once per process)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = compile_table()
    return _DEFAULT
