"""The spec as a `transitions.Machine`: the reference engine the compiled table is proven
against (`tests/core/test_machine.py`: they agree on every state, event and guard valuation). It
costs microseconds per trigger and kilobytes per model, so the runtime never uses it; it is
verification, and the only module that imports `transitions`."""

from __future__ import annotations

from collections.abc import Mapping
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
