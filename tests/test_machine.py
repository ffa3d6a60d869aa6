"""The transitions.Machine built from the spec and the compiled runtime table agree everywhere."""

from __future__ import annotations

import pytest
from transitions.core import MachineError

from devbridge.spec import Rejection, load
from devbridge.statemachine import build_machine, compile_table, default_table
from devbridge.statemachine.machine import GuardModel, Rejected, Step, Table


def machine_outcome(state: str, event: str, valuation: dict[str, bool]) -> tuple[str, object, bool]:
    """Drive a fresh Machine model: ('move', dest, released) or ('reject', rule-or-None, False)."""
    model = GuardModel(valuation)
    build_machine(model=model)
    model.state = state
    try:
        getattr(model, event)()
    except Rejected as r:
        return ("reject", r.rule, False)
    except MachineError:
        return ("reject", None, False)  # unguarded rejection: the rule lives only in the spec
    return ("move", model.state, model.actions == ["release_memory"])


def test_table_and_machine_agree_on_every_state_event_and_guard_valuation() -> None:
    lc = load()
    table = compile_table(build_machine())
    unguarded = {(r.source, r.event): r.rule for r in lc.rejections if not r.guards}
    checked = 0
    for state, event in lc.pairs():
        for valuation in lc.valuations():
            kind, what, released = machine_outcome(state, event, valuation)
            step = table.decide(state, event, valuation)
            if kind == "reject":
                assert step.dest is None
                assert step.rule == (what if what is not None else unguarded[(state, event)])
            else:
                assert (step.dest, step.release, step.rule) == (what, released, None), (state, event, valuation)
            # and both agree with the spec's own reading
            spec_outcome = lc.decide(state, event, valuation)
            if isinstance(spec_outcome, Rejection):
                assert step.rule == spec_outcome.rule
            else:
                assert (step.dest, step.release) == (spec_outcome.dest, spec_outcome.action is not None)
            checked += 1
    assert checked == len(lc.states) * len(lc.events) * 2 ** len(lc.guards) == 9 * 6 * 16


def test_default_table_is_compiled_once() -> None:
    assert default_table() is default_table()
    assert default_table().terminal == frozenset({"freed", "stale"})


@pytest.mark.parametrize(("state", "event"), [("freed", "free"), ("stale", "copy_begin"), ("idle", "copy_end")])
def test_machine_raises_for_unguarded_rejections(state: str, event: str) -> None:
    assert machine_outcome(state, event, {g: False for g in load().guards}) == ("reject", None, False)


def test_guarded_rejection_lives_in_the_machine() -> None:
    valuation = {"last_copy": False, "last_compute": True, "no_copy": True, "no_compute": False}
    assert machine_outcome("free_pending", "copy_end", valuation) == ("reject", "EVENT-1", False)
    valuation = {"last_copy": True, "last_compute": False, "no_copy": False, "no_compute": True}
    assert machine_outcome("free_pending", "copy_end", valuation) == ("move", "freed", True)


def test_flat_table_agrees_with_the_guarded_candidates_for_any_counts() -> None:
    from devbridge.spec import guard_values

    table = default_table()
    for state, event in load().pairs():
        for copies in range(5):
            for computes in range(5):
                expected = table.decide(state, event, guard_values(copies, computes))
                assert table.lookup(state, event, copies, computes) == expected, (state, event, copies, computes)


def test_a_rejection_carries_its_rule_as_its_message() -> None:
    assert (str(Rejected("EVENT-1")), Rejected("EVENT-1").rule) == ("EVENT-1", "EVENT-1")


def test_candidates_read_as_the_coverage_report_prints_them() -> None:
    table = default_table()
    printed = {table.describe(s, e, step) for s, e, _, step in table.candidates()}
    assert "idle --free--> freed (release)" in printed
    assert "free_pending --copy_end[no_copy]--> reject EVENT-1" in printed
    assert "computing --compute_end[!last_compute]--> computing" in printed
    assert "freed --free--> reject FREE-2" in printed


def test_a_table_without_an_outcome_for_a_valuation_says_the_spec_was_not_validated() -> None:
    guarded = Step((("last_copy", True),), "idle", False, None)
    table = Table({("copying", "copy_end"): (guarded,)}, frozenset(), {})
    assert table.decide("copying", "copy_end", {"last_copy": True}) is guarded
    with pytest.raises(AssertionError, match=r"spec validation guarantees an outcome for \(copying, copy_end\)"):
        table.decide("copying", "copy_end", {"last_copy": False})
