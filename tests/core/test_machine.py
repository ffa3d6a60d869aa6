"""The transitions.Machine built from the spec and the compiled runtime table agree everywhere."""

from __future__ import annotations

import itertools

import pytest
from transitions.core import MachineError

from devbridge.models.machine import GuardModel, Rejected, build_machine
from devbridge.spec import LEVELS, Rejection, guard_values, level, load
from devbridge.statemachine import compile_table, default_table


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


def test_table_and_machine_agree_on_every_state_event_and_counter_level() -> None:
    """The compiled table (what the runtime, docs and checker read) against the reference
    Machine, driven through its public trigger API, for every level of both counters."""
    lc = load()
    table = compile_table()
    unguarded = {(r.source, r.event): r.rule for r in lc.rejections if not r.guards}
    checked = 0
    for state, event in lc.pairs():
        for copies, computes in itertools.product(range(LEVELS), range(LEVELS)):
            kind, what, released = machine_outcome(state, event, guard_values(copies, computes))
            step = table.lookup(state, event, copies, computes)
            if kind == "reject":
                assert (step.dest, step.rule) == (None, what if what is not None else unguarded[(state, event)])
            else:
                assert (step.dest, step.release, step.rule) == (what, released, None), (state, event, copies, computes)
            checked += 1
    assert checked == len(lc.states) * len(lc.events) * LEVELS**2 == 9 * 6 * 9


def test_spec_and_machine_agree_on_every_guard_valuation() -> None:
    """The spec's own reading (which the table compiles) against the Machine, for every
    valuation of the guards, possible counts or not."""
    lc = load()
    unguarded = {(r.source, r.event): r.rule for r in lc.rejections if not r.guards}
    checked = 0
    for state, event in lc.pairs():
        for valuation in lc.valuations():
            kind, what, released = machine_outcome(state, event, valuation)
            outcome = lc.decide(state, event, valuation)
            if isinstance(outcome, Rejection):
                assert kind == "reject" and outcome.rule == (what if what is not None else unguarded[(state, event)])
            else:
                assert (kind, what, released) == ("move", outcome.dest, outcome.action == "release_memory")
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


def test_any_count_is_decided_as_its_level() -> None:
    lc, table = load(), default_table()
    for state, event in lc.pairs():
        for copies, computes in itertools.product(range(6), range(6)):
            taken = table.lookup(state, event, copies, computes)
            outcome = lc.decide(state, event, guard_values(copies, computes))
            assert taken == table.lookup(state, event, level(copies), level(computes))
            assert (taken.dest, taken.rule) == (
                (None, outcome.rule) if isinstance(outcome, Rejection) else (outcome.dest, None)
            ), (state, event, copies, computes)


def test_a_rejection_carries_its_rule_as_its_message() -> None:
    assert (str(Rejected("EVENT-1")), Rejected("EVENT-1").rule) == ("EVENT-1", "EVENT-1")


def test_candidates_read_as_the_coverage_report_prints_them() -> None:
    table = default_table()
    printed = {table.describe(s, e, step) for s, e, _, step in table.candidates()}
    assert "idle --free--> freed (release)" in printed
    assert "free_pending --copy_end[no_copy]--> reject EVENT-1" in printed
    assert "computing --compute_end[!last_compute]--> computing" in printed
    assert "freed --free--> reject FREE-2" in printed


def test_a_guard_model_reads_no_uses_in_flight_by_default_and_nothing_else() -> None:
    """The reference Machine's model: its guards default to the counters of a fresh allocation
    (0 copies, 0 computes); a name that is neither a guard nor an action is an AttributeError."""
    model = GuardModel()
    assert model.guards == guard_values(0, 0) == {
        "last_copy": False, "last_compute": False, "no_copy": True, "no_compute": True,
    }  # fmt: skip
    assert model.no_copy() is True and model.last_compute() is False
    model.release_memory()
    assert model.actions == ["release_memory"]
    with pytest.raises(AttributeError, match="not_a_guard"):
        model.not_a_guard  # noqa: B018
