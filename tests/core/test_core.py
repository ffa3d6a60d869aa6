"""The sans-I/O core on its own: counts, effects, and the EVENT-1 invariant."""

from __future__ import annotations

import itertools
from unittest import mock

import pytest
from rules import refused

from devbridge import (
    Bridge,
    BridgeError,
    DeviceRange,
    HostRing,
    InvalidHandleError,
    LifecycleError,
    ObjectSpec,
    OutputCopyError,
    StaleHandleError,
    TensorViewSpec,
)
from devbridge.backends.fake import FakeBackend
from devbridge.statemachine import LifecycleCore
from devbridge.statemachine.core import USE_EVENTS, Composite, HostDone, InvariantViolation, Release, Settle, Submit
from devbridge.statemachine.status import Status


@pytest.mark.holds("EVENT-1")
def test_uses_are_counted_and_the_state_follows_the_counts() -> None:
    core = LifecycleCore()
    rec = core.add(16, spec=None, memory="m0")
    key = (rec.id, rec.generation)
    c1 = core.begin("copy_in", [key])
    c2 = core.begin("copy_out", [key])
    k1 = core.begin("compute", [key, key])  # a handle named twice counts once
    assert (rec.state, rec.copies, rec.computes) == ("copying_computing", 2, 1)
    assert core.dependents(rec.id) == [c1, c2, k1]
    assert core.end(c1.id, ok=True).release == ()
    assert rec.state == "copying_computing"
    assert core.free(*key) is None and rec.state == "free_pending"
    core.end(c2.id, ok=False)
    effects = core.end(k1.id, ok=True)
    assert effects.release == (rec,) and rec.state == "freed" and core.allocation(rec.id) is None
    assert core.state(*key) == "freed"


@pytest.mark.rejects("EVENT-1")
def test_a_completion_without_a_use_in_flight_is_a_lifecycle_error() -> None:
    core = LifecycleCore()
    rec = core.add(16, spec=None, memory="m0")
    use = core.begin("copy_in", [(rec.id, 0)])
    core.end(use.id, ok=True)
    with refused("EVENT-1"):
        core.end(use.id, ok=True)
    with pytest.raises(LifecycleError, match=r"\[EVENT-1\] copy_end rejected: allocation #0 is idle"):
        core.fire(rec.id, 0, "copy_end")
    assert (rec.state, rec.copies) == ("idle", 0)


def test_effects_say_what_to_do_with_host_bytes() -> None:
    core = LifecycleCore()
    rec = core.add(8, spec=None, memory="m")
    ok = core.end(core.begin("copy_in", [(rec.id, 0)], host="R").id, ok=True)
    failed = core.end(core.begin("copy_in", [(rec.id, 0)], host="R").id, ok=False)
    stale_use = core.begin("copy_out", [(rec.id, 0)], host="O")
    assert core.restart() == []  # busy: released later
    aborted = core.end(stale_use.id, ok=True)
    assert [(e.host_ok, e.error_rule) for e in (ok, failed, aborted)] == [
        (True, None),
        (False, "COPY-F"),
        (False, "GEN-1"),
    ]
    assert aborted.release == (rec,) and core.state(rec.id, 0) == "stale"


def test_a_use_that_ends_at_once_is_its_begin_then_its_end_in_every_state() -> None:
    """core.instant (the synchronous copy's one composite step) against fire(begin), fire(end),
    in every state that accepts a copy, with every count of uses in flight (0..3 each)."""
    seen = 0
    for kind in ("copy_in", "copy_out"):
        for state in ("allocated", "copying", "computing", "copying_computing", "idle"):
            for copies in range(4):
                for computes in range(4):
                    if not LifecycleCore().spec.states[state].admits(copies, computes):
                        continue
                    cores = LifecycleCore(), LifecycleCore()
                    steps: list[tuple[str, str, object]] = []
                    cores[0].observer = lambda st, ev, step, out=steps: out.append((st, ev, step))
                    records = [core.add(8, spec=None, memory="m") for core in cores]
                    for rec in records:
                        rec.state, rec.copies, rec.computes = state, copies, computes
                    assert cores[0].instant(kind, (0, 0)) == 0  # it takes a use id
                    begin, end = USE_EVENTS[kind]
                    cores[1].fire(0, 0, begin)
                    assert cores[1].fire(0, 0, end) is None
                    after = [(r.state, r.copies, r.computes) for r in records]
                    assert after == [(records[1].state, copies, computes)] * 2, (kind, state, copies, computes)
                    assert records[1].state == ("idle" if state == "allocated" else state)
                    table = cores[1].table
                    middle = table.lookup(state, begin, copies, computes).dest
                    assert steps == [
                        (state, begin, table.lookup(state, begin, copies, computes)),
                        (middle, end, table.lookup(middle, end, *((copies + 1, computes)))),
                    ]  # the observer sees both spec steps, as for fire(begin), fire(end)
                    seen += 1
    assert seen == 2 * 17


@pytest.mark.rejects("USE-1")
def test_a_use_of_several_allocations_is_all_or_nothing() -> None:
    """One refused allocation refuses the use before any other allocation's state moves."""
    core = LifecycleCore()
    a, b = core.add(8, spec=None, memory="a"), core.add(8, spec=None, memory="b")
    assert core.free(b.id, 0) is not None  # idle: freed at once
    with refused("USE-1"):
        core.begin("compute", [(a.id, 0), (b.id, 0)])
    assert (a.state, a.computes, core.state(b.id, 0)) == ("allocated", 0, "freed")
    assert list(core.inflight()) == []


@pytest.mark.rejects("HANDLE-1")
@pytest.mark.parametrize("alloc_id", [-1, 2, 99])
def test_the_core_refuses_an_allocation_it_never_made(alloc_id: int) -> None:
    core = LifecycleCore()
    core.add(8, spec=None, memory="a")
    core.add(8, spec=None, memory="b")
    with refused("HANDLE-1"):
        core.state(alloc_id, 0)


def test_an_invariant_violation_names_its_invariant() -> None:
    error = InvariantViolation("INV-COUNTS", "allocation #3 is idle with 1 copy")
    assert (str(error), error.invariant) == ("[INV-COUNTS] allocation #3 is idle with 1 copy", "INV-COUNTS")
    assert isinstance(error, AssertionError)  # a bug in the bridge, not a caller's mistake


@pytest.mark.holds("ORDER-1")
def test_begin_finds_the_uses_a_new_one_follows_when_not_told() -> None:
    core = LifecycleCore()
    rec = core.add(16, spec=None, memory="m")
    key = (rec.id, rec.generation)
    first = core.begin("copy_in", [key], span=(0, 4))
    disjoint = core.begin("copy_in", [key], span=(8, 12))
    second = core.begin("copy_out", [key], span=(2, 6))  # reads bytes `first` writes: RAW
    view = core.begin("view", [key])  # a pin, not an access: follows nothing
    assert (first.after, disjoint.after, second.after, view.after) == (None, None, {first.id}, None)
    assert first.followers == [second] and rec.accesses == [first, disjoint, second]
    assert core.end(first.id, ok=True).ready == (second,) and second.after == set()


@pytest.mark.rejects("USE-1")
def test_an_instant_use_of_a_dead_or_free_pending_allocation_is_refused() -> None:
    core = LifecycleCore()
    busy, dead = core.add(8, spec=None, memory="a"), core.add(8, spec=None, memory="b")  # dead: id 1, generation 0
    assert core.free(dead.id, 0) is not None
    with refused("USE-1"):
        core.instant("copy_in", (dead.id, 0))
    use = core.begin("copy_out", [(busy.id, 0)])
    assert core.free(busy.id, 0) is None and busy.state == "free_pending"
    with refused("USE-1"):
        core.instant("copy_in", (busy.id, 0))
    assert (busy.state, busy.copies) == ("free_pending", 1)
    assert core.end(use.id, ok=True).release == (busy,)


@pytest.mark.holds("EVENT-1")
def test_an_instant_copy_steps_through_begin_and_end_in_one() -> None:
    core = LifecycleCore()
    rec = core.add(8, spec=None, memory="m")
    seen: list[tuple[str, str]] = []
    core.observer = lambda state, event, step: seen.append((state, event))
    use_id = core.instant("copy_in", (rec.id, 0))
    assert (rec.state, rec.copies, use_id) == ("idle", 0, 0)
    assert seen == [("allocated", "copy_begin"), ("copying", "copy_end")]
    comp = core.begin("compute", [(rec.id, 0)])
    seen.clear()
    assert core.instant("copy_out", (rec.id, 0)) == 2 and (rec.state, rec.copies) == ("computing", 0)
    assert seen == [("computing", "copy_begin"), ("copying_computing", "copy_end")]
    core.end(comp.id, ok=True)


def test_an_observer_sees_each_handles_step_once_per_use() -> None:
    """A coverage tool counts what the observer sees: a use of one handle is looked up once (its
    own step checks before it changes anything); a use of several is checked whole first (all or
    nothing), then each steps."""
    core = LifecycleCore()
    a, b = core.add(8, spec=None, memory="a"), core.add(8, spec=None, memory="b")
    seen: list[tuple[str, str]] = []
    core.observer = lambda state, event, step: seen.append((state, event))
    core.begin("copy_in", [(a.id, 0)])
    assert seen == [("allocated", "copy_begin")]
    seen.clear()
    core.begin("compute", [(a.id, 0), (b.id, 0)])
    assert seen == [("copying", "compute_begin"), ("allocated", "compute_begin")] * 2


@pytest.mark.holds("ORDER-1")
@pytest.mark.parametrize(("first", "second"), [((4, 8), (0, 4)), ((0, 4), (4, 8))])
def test_adjacent_device_spans_do_not_conflict(first: tuple[int, int], second: tuple[int, int]) -> None:
    core = LifecycleCore()
    rec = core.add(8, spec=None, memory="m")
    core.begin("copy_in", [(rec.id, 0)], span=first)
    assert core.conflicts("copy_in", [(rec.id, 0)], second) == []
    assert [u.span for u in core.conflicts("copy_in", [(rec.id, 0)], (3, 5))] == [first]


def test_a_use_of_a_dead_allocation_whose_check_was_bypassed_does_not_crash_the_core() -> None:
    """Regression: with its check bypassed (a bug elsewhere), begin() on a dropped record raised
    KeyError from the core's own bookkeeping; it now records no bytes to order for it."""
    core = LifecycleCore()
    record = core.add(8, None, object())
    core.restart()  # idle: released at once, the record dropped
    assert core.allocation(record.id) is None
    with mock.patch.object(LifecycleCore, "check", lambda self, handles, event: None):
        use = core.begin("compute", [(record.id, 0)])
    assert use.allocations == (record.id,) and core.conflicts("compute", [(record.id, 0)]) == []


@pytest.mark.parametrize(
    ("restart", "error", "rule"), [(False, InvalidHandleError, "USE-1"), (True, StaleHandleError, "GEN-2")]
)
def test_a_dead_allocation_past_a_bypassed_check_is_still_refused_with_the_rule(
    restart: bool, error: type[BridgeError], rule: str
) -> None:
    """Defence in depth: with the core's check bypassed (a bug elsewhere), the bridge and the
    core refuse a dead allocation with the table's rule (not an `assert`, which `python -O`
    would drop, leaving an AttributeError on None)."""
    fake, ring = FakeBackend(), HostRing(64)
    bridge = Bridge(fake)
    h = bridge.alloc_device(ObjectSpec("blob", "uint8"), 8)
    bridge.restart() if restart else bridge.free_device(h)
    src = ring.reserve(8)
    calls = [
        lambda: bridge.host_to_device(src, DeviceRange(h, 0, 8)),
        lambda: bridge.wrap_for_tinygrad(h, TensorViewSpec((8,), "uint8")),
    ]
    with mock.patch.object(LifecycleCore, "check", lambda self, handles, event: None):
        for call in calls:
            with pytest.raises(error) as raised:
                call()
            assert raised.value.rule == rule
        with pytest.raises(error, match=rf"\[{rule}\] copy_begin rejected: allocation #0 \(generation 0\) is "):
            bridge._core.instant("copy_in", (h.id, h.generation))
    assert fake.ops() == ["alloc", "free"]


def test_closure_follows_a_chain_of_uses_to_its_oldest() -> None:
    """Four copies of one allocation, each overlapping only the one before it: the last follows
    the third directly and the first through two others. Its closure is all four, the oldest
    first (what a blocking call waits for: the one use of the chain on the device)."""
    core = LifecycleCore()
    a = core.add(16, "spec", "memory").id
    spans = [(0, 4), (2, 6), (5, 9), (8, 12)]  # each overlaps the next only
    uses = [core.begin("copy_in", [(a, 0)], host=(i, 4), span=span) for i, span in enumerate(spans)]
    assert [sorted(u.after or ()) for u in uses] == [[], [uses[0].id], [uses[1].id], [uses[2].id]]
    assert [u.id for u in core.closure([uses[3]])] == [u.id for u in uses]
    assert [u.id for u in core.closure([uses[2]])] == [u.id for u in uses[:3]]


def test_finish_ends_a_use_once_and_says_what_to_do_as_values() -> None:
    """`finish` returns the end's effects in order (the host bytes, then the event); a second
    finish of the same use returns nothing and changes nothing."""
    core = LifecycleCore()
    record = core.add(8, None, None)
    use = core.begin("copy_in", [(record.id, record.generation)], host="R", span=(0, 4))
    effects = core.finish(use, Status(True))
    assert effects == [HostDone(use, True), Settle(use, None, aborted=False, broken=False)]
    before = core.snapshot()
    assert core.finish(use, Status(True, "again")) == []  # ended already: nothing happens
    assert core.snapshot() == before and core.ended(use) and core.state(record.id, 0) == "idle"


def test_finish_of_a_failed_use_names_its_rule_and_keeps_its_host_bytes() -> None:
    core = LifecycleCore()
    record = core.add(8, None, None)
    use = core.begin("copy_out", [(record.id, 0)], host="R", span=(0, 4))
    host, settled = core.finish(use, Status(True, "device lost"))
    assert host == HostDone(use, False) and isinstance(settled, Settle)
    assert isinstance(settled.error, OutputCopyError) and settled.error.rule == "COPY-F"
    assert "device lost" in str(settled.error) and not settled.aborted and not settled.broken


def test_finish_launches_the_held_uses_it_made_ready_and_aborts_the_stale_ones() -> None:
    """A use's end makes its followers ready: a current one is to be submitted (after the end's
    own effects); one a restart made stale never reaches the device and ends at once, aborted
    (GEN-1), with its own followers after it."""
    core = LifecycleCore()
    a = core.add(8, None, None)
    first = core.begin("copy_in", [(a.id, 0)], host="A", span=(0, 4))
    core.submitted(first, object())
    held = core.begin("copy_out", [(a.id, 0)], host="B", span=(0, 4), before=[first])
    assert core.finish(first, Status(True)) == [
        HostDone(first, True),
        Settle(first, None, aborted=False, broken=False),
        Submit(held),
    ]
    core2 = LifecycleCore()
    b = core2.add(8, None, None)
    up = core2.begin("copy_in", [(b.id, 0)], host="A", span=(0, 4))
    core2.submitted(up, object())
    down = core2.begin("copy_out", [(b.id, 0)], host="B", span=(0, 4), before=[up])
    core2.restart()
    effects = core2.finish(up, Status(True))
    assert [type(e) for e in effects] == [HostDone, Settle, HostDone, Release, Settle]
    assert effects[0] == HostDone(up, False) and effects[2] == HostDone(down, False)  # aborted: kept, not valid
    aborted = effects[4]
    assert isinstance(aborted, Settle) and aborted.use is down and aborted.aborted
    assert isinstance(aborted.error, StaleHandleError) and aborted.error.rule == "GEN-1"
    assert effects[3] == Release(b, down)  # the last use of b ended: b is freed before its event settles


def test_a_free_or_restart_told_no_time_counts_its_wait_from_zero() -> None:
    core = LifecycleCore()
    a, b = core.add(8, None, None), core.add(8, None, None)
    core.begin("compute", [(a.id, 0)])
    core.begin("compute", [(b.id, 0)])
    assert core.free(a.id, 0) is None  # deferred: waiting since 0.0
    assert core.waited(a.id, 5.0) == 5.0
    core.restart()
    assert core.waited(b.id, 7.0) == 7.0


@pytest.mark.holds("EVENT-1")
def test_every_copy_a_call_can_meet_is_made_with_the_table_a_step_or_its_refusal() -> None:
    """`copy_steps` holds, for every state, copy kind and level of counts the state admits, what the
    table makes of a copy there: the composite step of its begin and end, or the rule refusing its
    begin. `copy_step` reads it (the per-call path's one lookup) and raises the refusal; `take`
    advances the record and the use ids as `instant` does, telling an observer and a tracer both
    spec steps."""
    core = LifecycleCore()
    spec = core.spec
    expected = {
        (state, kind, c, k)
        for state in spec.states
        for kind in ("copy_in", "copy_out")
        for c in range(3)
        for k in range(3)
        if spec.states[state].admits(c, k)
    }
    assert set(core.copy_steps) == expected
    for (state, kind, c, k), step in core.copy_steps.items():
        rule = core.table.lookup(state, "copy_begin", c, k).rule
        if rule is not None:
            assert step == rule
        else:
            assert isinstance(step, Composite) and (step.begin, step.end) == USE_EVENTS[kind]
            assert step.first == core.table.lookup(state, "copy_begin", c, k)
    rec = core.add(8, spec=None, memory="m")
    first = core.copy_step(rec, "copy_in")  # made with the core, before any copy
    assert (first.begin, first.middle, first.end, first.dest) == ("copy_begin", "copying", "copy_end", "idle")
    assert core.take(rec, first) == 0 and rec.state == "idle"
    step = core.copy_step(rec, "copy_in")  # from "idle" now
    assert step is not first and (step.middle, step.dest) == ("copying", "idle")
    assert core.copy_step(rec, "copy_out") is core.copy_steps[("idle", "copy_out", 0, 0)]
    assert core.instant("copy_in", (rec.id, 0)) == 1 and core.take(rec, step) == 2  # one sequence of use ids
    comp = core.begin("compute", [(rec.id, 0)])
    during = core.copy_step(rec, "copy_in")  # a copy beside a compute: its own step
    assert (during.middle, during.dest) == ("copying_computing", "computing")
    core.end(comp.id, ok=True)
    told: list[tuple[str, str]] = []
    core.observer = lambda state, event, found: told.append((state, event))
    core.tracer = tracer = mock.Mock()
    assert core.take(rec, core.copy_step(rec, "copy_in")) == 4  # the same step, told as its two spec steps
    assert told == [("idle", "copy_begin"), ("copying", "copy_end")]
    assert [c.args[1:] for c in tracer.state.call_args_list] == [("copy_begin", "copying"), ("copy_end", "idle")]
    core.observer = core.tracer = None
    use = core.begin("copy_out", [(rec.id, 0)], span=(0, 4))
    assert core.free(rec.id, 0) is None and rec.state == "free_pending"
    with refused("USE-1"):  # the table refuses a copy there: its rule, nothing changed
        core.copy_step(rec, "copy_in")
    assert core.copy_steps[("free_pending", "copy_in", 1, 0)] == "USE-1" and use.id == 5


def test_a_copy_on_counts_its_state_does_not_admit_is_refused_by_the_tables_rule() -> None:
    """No step is made for counts a state does not admit (only a bug leaves a record so):
    `copy_step` composes one then, from the table, and where the table refuses the copy it
    raises the rule's error, as for admitted counts, and changes nothing."""
    core = LifecycleCore()
    refused_in: set[str] = set()
    for state, kind, c, k in itertools.product(core.spec.states, ("copy_in", "copy_out"), range(3), range(3)):
        rule = core.table.lookup(state, "copy_begin", c, k).rule
        if core.spec.states[state].admits(c, k) or rule is None:
            continue
        rec = core.add(8, spec=None, memory="m")
        rec.state, rec.copies, rec.computes = state, c, k
        with pytest.raises(BridgeError) as refusal:
            core.copy_step(rec, kind)
        assert refusal.value.rule == rule, (state, kind, c, k)
        assert (rec.state, rec.copies, rec.computes) == (state, c, k)
        refused_in.add(state)
    assert refused_in == {"free_pending", "freed", "stale_pending", "stale"}


def test_a_step_that_breaks_the_states_counts_is_an_invariant_violation_every_time() -> None:
    """fire asks the spec's `where` once per (state, no copies, no computes) and keeps the answer:
    a breach is refused the second time as the first."""
    core = LifecycleCore()
    rec = core.add(8, spec=None, memory="m")
    for _ in range(2):
        rec.state, rec.copies, rec.computes = "copying", 1, 1  # a compute the state does not count
        with pytest.raises(InvariantViolation, match=r"\[INV-COUNTS\] allocation #0 is idle after copy_end"):
            core.fire(rec.id, 0, "copy_end")
    rec.state, rec.copies, rec.computes = "copying", 1, 0
    assert core.fire(rec.id, 0, "copy_end") is None and (rec.state, rec.copies) == ("idle", 0)


def test_the_kept_answers_of_the_count_invariant_tell_every_case_the_spec_does() -> None:
    """The count invariant's answers are kept per state and per which of copies, computes and
    their sum are zero: counts that only a bookkeeping bug makes (a negative one) are told
    apart from the ones admitted before."""
    core, spec = LifecycleCore(), LifecycleCore().spec
    cases = [(c, k) for c in range(-1, 3) for k in range(-1, 3)]
    for _ in range(2):  # asked, then answered from what was kept
        for state in spec.states:
            assert [core._admits(state, c, k) for c, k in cases] == [spec.states[state].admits(c, k) for c, k in cases]
    assert core._admits("free_pending", 1, 1) and not core._admits("free_pending", 1, -1)


def test_a_broken_end_settles_its_event_with_the_error_then_raises_it() -> None:
    """A bookkeeping bug while a use ends (its `end` raises): `finish` returns one broken
    `Settle` carrying the error; the runner settles the event with it, then raises it."""
    from devbridge.statemachine.runner import Runner

    class Recorder(Runner):
        def __init__(self, core: LifecycleCore) -> None:
            super().__init__(core)
            self.settled: list[Settle] = []

        def settle(self, effect: Settle) -> None:
            self.settled.append(effect)

    core = LifecycleCore()
    record = core.add(8, None, None)
    use = core.begin("compute", [(record.id, 0)])
    broken = LifecycleError("EVENT-1", "the books are wrong")
    with mock.patch.object(LifecycleCore, "end", side_effect=broken):
        effects = core.finish(use, Status(True))
    assert effects == [Settle(use, broken, aborted=False, broken=True)]
    runner = Recorder(core)
    with pytest.raises(LifecycleError) as raised:
        runner.execute(effects)
    assert raised.value is broken and runner.settled == effects


def test_refresh_asks_nothing_of_an_ended_use_and_a_held_one_s_chain_oldest_first() -> None:
    core = LifecycleCore()
    a = core.add(16, "spec", "memory").id
    first = core.begin("copy_in", [(a, 0)], host="R1", span=(0, 8))
    core.submitted(first, "token")
    held = core.begin("copy_in", [(a, 0)], host="R2", span=(4, 12))  # follows `first`: no token yet
    assert held.token is None and [u.id for u in core.refresh_order(held)] == [first.id, held.id]
    assert core.refresh_order(first) == [first]
    core.finish(first, Status(True))
    core.finish(held, Status(True))
    assert core.refresh_order(first) == [] and core.refresh_order(held) == []


def test_the_kept_firings_stay_within_the_levels_however_many_uses_are_in_flight() -> None:
    """`fire` keeps what it worked out for counts below the levels' cap only: counts above it
    are worked out each time, so the kept answers do not grow with the uses in flight."""
    from devbridge.spec import LEVELS

    core = LifecycleCore()
    a = core.add(16, "spec", "memory").id
    copies = [core.begin("copy_in", [(a, 0)], host=f"R{i}", span=(i, i + 1)) for i in range(6)]
    computes = [core.begin("compute", [(a, 0)]) for _ in range(6)]
    for use in copies + computes:
        core.finish(use, Status(True))
    assert core.state(a, 0) == "idle"
    kept = list(core._firings)
    assert kept and all(c < LEVELS and k < LEVELS for _, _, c, k in kept), sorted(kept)
    assert {(c, k) for _, _, c, k in kept} >= {(0, 0), (1, 0), (2, 0)}


def test_a_runner_that_leaves_out_the_device_side_fails_loudly() -> None:
    from devbridge.statemachine.runner import Runner

    runner, core = Runner(LifecycleCore()), LifecycleCore()
    record = core.add(8, None, None)
    use = core.begin("copy_in", [(record.id, record.generation)], host="R", span=(0, 4))
    calls = [
        lambda: runner.submit(use),
        lambda: runner.query(use),
        lambda: runner.host_done(use, True),
        lambda: runner.release_memory(record, use),
        lambda: runner.settle(Settle(use, None, aborted=False, broken=False)),
    ]
    for call in calls:
        with pytest.raises(NotImplementedError):
            call()
