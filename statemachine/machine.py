"""The spec compiled to one table, and the spec as a `transitions.Machine`.

The `Table` is what everything reads: the core's every decision, the docs'
diagram and transition table, the coverage reports and the model checker.
The Machine is the reference engine the table is proven against
(`tests/test_machine.py`: they agree on every state, event and guard
valuation); it costs microseconds per trigger and kilobytes per model, so the
runtime never uses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from transitions import Machine

from devbridge.spec import LEVELS, Lifecycle, Outcome, Rejection, guard_values, level
from devbridge.spec import load as load_spec


class Rejected(Exception):
    """Raised by a Machine callback when an event is rejected; carries the rule ID."""

    def __init__(self, rule: str) -> None:
        super().__init__(rule)
        self.rule = rule


class _Reject:
    """A `before` callback that rejects the event: how guarded rejections live in the Machine."""

    def __init__(self, rule: str) -> None:
        self.rule = rule

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise Rejected(self.rule)


class GuardModel:
    """A model object for the Machine whose guards read settable truth values."""

    state: str

    def __init__(self, guards: Mapping[str, bool] | None = None) -> None:
        self.guards: dict[str, bool] = dict(guards or guard_values(0, 0))
        self.actions: list[str] = []

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not set on the instance: guards and actions.
        guards = self.__dict__.get("guards", {})
        if name in guards:
            return lambda *a, **k: guards[name]
        if name == "release_memory":
            return lambda *a, **k: self.actions.append(name)
        raise AttributeError(name)


def build_machine(lifecycle: Lifecycle | None = None, model: Any = None) -> Machine:
    """A transitions.Machine with exactly the spec's states, transitions and guarded rejections.

    Unguarded rejections are absent (the Machine raises MachineError for them);
    guarded ones are internal transitions whose `before` callback raises Rejected.
    """
    lc = lifecycle or load_spec()
    specs: list[dict[str, Any]] = []
    for state, event in lc.pairs():
        for outcome in lc.outcomes(state, event):
            conditions = [g for g, want in outcome.guards if want]
            unless = [g for g, want in outcome.guards if not want]
            entry: dict[str, Any] = {
                "trigger": event,
                "source": state,
                "conditions": conditions,
                "unless": unless,
            }
            if isinstance(outcome, Rejection):
                if not outcome.guards:
                    continue
                entry.update(dest=None, before=[_Reject(outcome.rule)])
            else:
                entry.update(dest=outcome.dest, after=[outcome.action] if outcome.action else [])
            specs.append(entry)
    return Machine(
        model=model if model is not None else GuardModel(),
        states=list(lc.states),
        initial=lc.initial,
        transitions=specs,
        auto_transitions=False,
        ignore_invalid_triggers=False,
    )


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
