"""The spec as a `transitions.Machine`, and the flat table compiled from it.

The Machine is the reference engine: it validates the graph, draws diagrams
and serves as the oracle in tests. It costs microseconds per trigger and
kilobytes per model, so the runtime never uses it; each allocation keeps its
state as a plain string and the core looks up the `Table` compiled from the
Machine's own transition lists. `tests/test_machine.py` proves the two agree
on every (state, event, guard valuation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from transitions import Machine

from devbridge.spec import Lifecycle, Rejection, guard_values
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
    """(state, event) -> candidates in order: the runtime's whole lifecycle logic.

    `flat` is the same table with the guards already evaluated: guards only tell
    0, 1 and more apart, so (state, event, min(copies, 2), min(computes, 2)) keys
    every decision and the hot path is one dict lookup.
    """

    steps: Mapping[tuple[str, str], tuple[Step, ...]]
    terminal: frozenset[str]
    flat: Mapping[tuple[str, str, int, int], Step]

    def lookup(self, state: str, event: str, copies: int, computes: int) -> Step:
        return self.flat[(state, event, copies if copies < 2 else 2, computes if computes < 2 else 2)]

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

    def decide(self, state: str, event: str, guards: Mapping[str, bool]) -> Step:
        for step in self.steps[(state, event)]:
            if all(guards[g] == want for g, want in step.guards):
                return step
        raise AssertionError(f"spec validation guarantees an outcome for ({state}, {event})")


def compile_table(machine: Machine, lifecycle: Lifecycle | None = None) -> Table:
    """Read the Machine's transition lists into a Table.

    Pairs the Machine has no transition for are rejections; their rule comes
    from the spec, the only place that names it.
    """
    lc = lifecycle or load_spec()
    unguarded = {(r.source, r.event): r.rule for r in lc.rejections if not r.guards}
    steps: dict[tuple[str, str], tuple[Step, ...]] = {}
    for state, event in lc.pairs():
        found = machine.events[event].transitions.get(state, []) if event in machine.events else []
        compiled = [_compile_transition(t) for t in found]
        if (state, event) in unguarded:
            compiled.append(Step((), None, False, unguarded[(state, event)]))
        steps[(state, event)] = tuple(compiled)
    terminal = frozenset(s for s, st in lc.states.items() if st.terminal)
    table = Table(steps, terminal, {})
    flat = {
        (s, e, c, k): table.decide(s, e, guard_values(c, k)) for (s, e) in steps for c in range(3) for k in range(3)
    }
    return Table(steps, terminal, flat)


def _compile_transition(t: Any) -> Step:
    guards = tuple((c.func, bool(c.target)) for c in t.conditions)
    rejects = [cb for cb in t.before if isinstance(cb, _Reject)]
    if rejects:
        return Step(guards, None, False, rejects[0].rule)
    return Step(guards, t.dest, "release_memory" in t.after, None)


_DEFAULT: Table | None = None


def default_table() -> Table:
    """The table compiled from the packaged spec (built once per process)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = compile_table(build_machine())
    return _DEFAULT
