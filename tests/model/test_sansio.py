"""The sans-I/O checker: the core and the ring as values, explored without replaying paths.

Its states are values (`LifecycleCore.snapshot`/`restore`, `HostRing.state`/`restore`) in a
canonical form; every seeded bug in the core or the ring is found by the check it breaks with a
shortest counterexample, and the Bridge's own bugs are outside its scope (the lockstep checker's:
`tests/model/test_checker.py`)."""

from __future__ import annotations

import contextlib
import re
from dataclasses import replace
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mutants import MUTANTS, VALUES_KILLS

from devbridge.bridge.engine import Engine
from devbridge.cli.main import main
from devbridge.errors import RangeError, RingFullError
from devbridge.models import sansio
from devbridge.models.checker import PROFILES, Bound
from devbridge.ring.host import HostRange, HostRing, made_range
from devbridge.statemachine.core import LifecycleCore
from devbridge.statemachine.runner import Runner

DEFAULT = PROFILES["default"]
IN_SCOPE = sorted(name for name, kill in VALUES_KILLS.items() if kill is not None)
OUT_OF_SCOPE = sorted(name for name, kill in VALUES_KILLS.items() if kill is None)
TINY = Bound(allocations=1, restarts=1, faults=1, in_flight=2, spans=((0, 8),), ring=8)


def test_depth_5_of_the_default_bound_is_clean_and_covers_the_spec() -> None:
    report = sansio.check(DEFAULT, depth=5)
    assert report.violation is None and not report.exhaustive
    assert (report.states, report.transitions, report.depth) == (35435, 142469, 5)
    assert report.coverage.missing() == [] and report.coverage.missing_edges() == []


def test_a_small_bound_is_explored_to_its_last_state() -> None:
    """Without a depth the search ends when no new state comes: every reachable one was checked."""
    report = sansio.check(TINY, depth=None)
    assert report.violation is None and report.exhaustive
    assert (report.states, report.depth) == (323, 8)
    assert sansio.check(TINY, depth=report.depth).states == report.states  # depth 8 reaches them all


def test_two_processes_explore_exactly_what_one_does() -> None:
    one, two = sansio.check(DEFAULT, depth=4), sansio.check(DEFAULT, depth=4, jobs=2)
    assert (one.states, one.transitions, one.depth) == (two.states, two.transitions, two.depth) == (4339, 14059, 4)
    assert one.coverage.hits == two.coverage.hits and one.coverage.edges == two.coverage.edges
    with MUTANTS["missing_raw_edge"]():
        found = [sansio.check(DEFAULT, depth=4, jobs=jobs).violation for jobs in (1, 2)]
    assert found[0] is not None and found[1] is not None
    assert found[0].path == found[1].path and found[0].kill == found[1].kill == "ORDER-1"


#: The orchestration bugs (the core's settle, launches, completion queue) and their shortest paths.
ORCHESTRATION = {
    "use_settled_twice": "alloc -> copy_in:1:(0, 4):async -> copy_in:1:(0, 4):async -> end:0:True:poll",
    "completion_lost_while_busy": "alloc -> copy_in:1:(0, 4):async -> end:0:True:busy",
    "held_use_launched_early": "alloc -> copy_in:1:(0, 4):async -> copy_in:1:(0, 4):async -> "
    "copy_in:1:(0, 4):async -> end:0:True:report",
    "deferred_free_ignores_held_uses": "alloc -> copy_in:1:(0, 4):async -> copy_in:1:(0, 4):async -> free:1 -> "
    "end:0:True:report",
}


@pytest.mark.parametrize("name", IN_SCOPE)
def test_a_seeded_bug_in_the_core_or_the_ring_is_found_by_the_check_it_breaks(name: str) -> None:
    depth = len(ORCHESTRATION[name].split(" -> ")) if name in ORCHESTRATION else 4
    with MUTANTS[name]():
        violation = sansio.check(DEFAULT, depth=depth).violation
        assert violation is not None, f"{name} not found"
        assert violation.kill == VALUES_KILLS[name], f"{name} was caught by {violation.kill}: {violation.error}"
        shorter = sansio.check(DEFAULT, depth=len(violation.path) - 1)
        assert shorter.violation is None, "breadth first: no shorter counterexample exists"
    if name in ORCHESTRATION:
        assert sansio.describe(violation.path) == ORCHESTRATION[name]
    else:
        assert len(violation.path) <= 3
    print(f"\n{name}: {sansio.describe(violation.path)}\n  {violation.error[:120]}")


PROCEDURE = ("execute", "launch", "settle_if_done", "end", "refresh", "drain", "poll", "reported")
DECISIONS = ("finish", "plan", "refresh_order", "polled", "reports", "views_ended", "queryable")


def test_the_checker_runs_the_cores_orchestration() -> None:
    """`Step` is the core's `Runner` over the model device, as the Bridge's engine is over a
    backend: both run the runner's one procedure (neither restates any of it), and the checker's
    completions go through the core's own decisions (each seen here being called)."""
    for name in PROCEDURE:
        assert getattr(sansio.Step, name) is getattr(Runner, name) is getattr(Engine, name), name
    seen: set[str] = set()
    stack = contextlib.ExitStack()
    for name in DECISIONS:
        original = getattr(LifecycleCore, name)

        def spy(self: LifecycleCore, *args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            seen.add(_name)
            return _original(self, *args, **kwargs)

        stack.enter_context(mock.patch.object(LifecycleCore, name, spy))
    try:
        report = sansio.check(DEFAULT, depth=4)
    finally:
        stack.close()
    assert report.violation is None
    assert seen == set(DECISIONS)


@pytest.mark.parametrize("name", OUT_OF_SCOPE)
def test_a_seeded_bug_in_the_bridge_is_outside_its_scope(name: str) -> None:
    """What the Bridge itself does (its fused paths, its events, its value types, views over the
    fake) is not run here: these bugs pass, and the lockstep checker finds each of them."""
    with MUTANTS[name]():
        assert sansio.check(DEFAULT, depth=4).violation is None


def test_a_seeded_bug_that_fails_for_another_reason_is_not_counted_as_caught() -> None:
    """free_while_in_use written with a wrong signature (no *args: the core is called with
    the generation) fails at the first free with a TypeError: a kill that is not its own."""
    original = LifecycleCore.free

    def free(self: LifecycleCore, alloc_id: int) -> Any:
        record = self.allocation(alloc_id)
        original(self, alloc_id, record.generation if record else 0)
        return record

    with mock.patch.object(LifecycleCore, "free", free):
        violation = sansio.check(DEFAULT, depth=3).violation
    assert violation is not None and violation.kill == "TypeError", violation
    assert violation.kill != VALUES_KILLS["free_while_in_use"]


def fitting_reservation_refused() -> Any:
    """The ring refuses a reservation that would end exactly one lap after its oldest
    unreleased byte: one that fits (an off-by-one in RING-2)."""
    original = HostRing.reserve

    def reserve(self: HostRing, nbytes: int, *args: Any, **kwargs: Any) -> HostRange:
        head, starts = self.head, self.state()[1]
        start = head if head % self.capacity + nbytes <= self.capacity else head + self.capacity - head % self.capacity
        if starts and start + nbytes - starts[0] == self.capacity:
            raise RingFullError("RING-2", "seeded: refused a reservation that fits")
        return original(self, nbytes, *args, **kwargs)

    return mock.patch.object(HostRing, "reserve", reserve)


def unreleased_bytes_overwritten() -> Any:
    """The ring hands out a reservation over unreleased bytes where it should refuse it (RING-2)."""
    original = HostRing.reserve

    def reserve(self: HostRing, nbytes: int, *args: Any, **kwargs: Any) -> HostRange:
        try:
            return original(self, nbytes, *args, **kwargs)
        except RingFullError:
            head, starts, ends, *rest = self.state()
            self.restore((head + nbytes, (*starts, head), (*ends, head + nbytes), *rest))
            return made_range(self, head, nbytes)

    return mock.patch.object(HostRing, "reserve", reserve)


@pytest.mark.parametrize(
    ("bug", "kill", "path"),
    [
        (fitting_reservation_refused, "RING-2", "alloc -> copy_in:1:(0, 8):async -> copy_in:1:(0, 8):sync"),
        (unreleased_bytes_overwritten, "refused:RING-2",
         "alloc -> copy_in:1:(0, 4):sync -> copy_in:1:(0, 8):async -> full:8"),
    ],
)  # fmt: skip
def test_a_ring_wrong_about_its_free_space_is_caught_by_ring_2(bug: Any, kill: str, path: str) -> None:
    """Copies the ring has room for are offered and must be reserved; for those it has none, one
    refused reservation per size is: a ring wrong either way is caught, with a shortest path
    (the 8 B that fill the 16 B ring to its oldest unreleased byte; 8 B where 4 are free)."""
    with bug():
        violation = sansio.check(DEFAULT, depth=6).violation
        assert violation is not None and violation.kill == kill, violation
        assert sansio.describe(violation.path) == path
        assert sansio.check(DEFAULT, depth=len(violation.path) - 1).violation is None


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 9)), max_size=12), st.integers(1, 17))
@settings(max_examples=300, deadline=None)
def test_fits_is_what_the_ring_reserves(ops: list[tuple[bool, int]], nbytes: int) -> None:
    """`fits`, the checker's own statement of RING-2, agrees with `HostRing.reserve` after any
    run of reservations and releases (oldest first or not) of a 16 B ring."""
    ring = HostRing(16)
    for reserve, n in ops:
        spans = ring.unreleased()
        if reserve:
            with contextlib.suppress(RingFullError):
                ring.reserve(n)
        elif spans:
            ring.release(spans[n % len(spans)])
    state = ring.state()
    try:
        ring.reserve(nbytes)
        reserved = True
    except RingFullError as e:
        assert e.rule == "RING-2" and ring.state() == state
        reserved = False
    assert sansio.fits(state, 16, nbytes) == reserved


def states_within(bound: Bound, depth: int) -> set[sansio.State]:
    """Every state within `depth` actions, breadth first (as `check` finds them, unchecked)."""
    step, level = sansio.Step(bound.ring), [sansio.initial(bound)]
    seen = set(level)
    for _ in range(depth):
        found = []
        for state in level:
            for action in sansio.enabled(state, sansio.unpack(state)[0], bound):
                step.load(state)
                if step.apply(action) and (new := step.value()) not in seen:
                    seen.add(new)
                    found.append(new)
        level = found
    return seen


def test_a_copy_left_out_of_the_search_repeats_one_that_is_in_it() -> None:
    """`enabled` leaves out copies that would repeat another action's calls: those the ring has
    no room for (one refused reservation per size stands for them), the faulty modes of a copy
    held behind earlier uses (a held copy is not submitted, so no submission fault hits it: the
    asynchronous copy stands for them), and a synchronous refusal with nothing to wait for (the
    asynchronous refusal). From every state within depth 4, each left out leads exactly where
    its stand-in does, or is refused as the ring is full."""
    states = states_within(DEFAULT, 4)
    assert len(states) == sansio.check(DEFAULT, depth=4).states
    step, left_out = sansio.Step(DEFAULT.ring), {"full": 0, "lost": 0, "async_fails": 0, "sync_fails": 0}
    for state in states:
        offered = sansio.enabled(state, sansio.unpack(state)[0], DEFAULT)
        modes = ("sync", "async", *(("lost", "async_fails", "sync_fails") if state[1] < DEFAULT.faults else ()))
        copying = [action[1] for action in offered if action[0] == "compute" and action[2] is False]
        every = [(k, a, span, m) for k in sansio.COPIES for a in copying for span in DEFAULT.spans for m in modes]
        for action in (a for a in every if a not in offered):
            step.load(state)
            if ("full", action[2][1]) in offered:
                with pytest.raises(sansio.Broken) as broken:
                    step.apply(action)
                assert broken.value.check == "RING-2" and isinstance(broken.value.__cause__, RingFullError)
                assert (step.core.snapshot(), step.ring.state()) == (step.rows, state[2])
                left_out["full"] += 1
                continue
            stand_in = (*action[:3], "async_fails" if action[3] == "sync_fails" else "async")
            assert stand_in in offered, (state, action)
            step.apply(action)
            after = step.value()
            step.load(state)
            step.apply(stand_in)
            assert step.value() == after, (state, action)
            left_out[action[3]] += 1
    assert min(left_out.values()) > 0, left_out
    print(f"\nleft out from {len(states)} states: {left_out}")


# ------------------------------------------------------------ states as values


def test_a_core_restored_from_its_snapshot_decides_as_the_original() -> None:
    core = LifecycleCore()
    a, b = core.add(8, "spec", "m0"), core.add(8, "spec", "m1")
    write = core.begin("copy_in", [(a.id, 0)], host=(0, 4), span=(0, 4))
    read = core.begin("copy_out", [(a.id, 0)], host=(4, 4), span=(2, 6))  # follows the write (RAW)
    core.begin("view", [(b.id, 0)])
    assert core.free(a.id, 0) is None  # deferred: free_pending
    state = core.snapshot()
    assert hash(state) == hash(core.snapshot())
    other = LifecycleCore()
    other.restore(state)
    assert other.snapshot() == state
    for c in (core, other):
        effects = c.end(write.id, ok=True)
        assert [u.id for u in effects.ready] == [read.id] and effects.release == ()
        last = c.end(read.id, ok=True)
        assert [r.memory for r in last.release] == ["m0"] and last.use.host == (4, 4)
        assert [r.state for r in c.allocations()] == ["computing"]
    assert other.snapshot() == core.snapshot()


def test_a_ring_restored_from_its_state_answers_as_the_original() -> None:
    ring = HostRing(16)
    r1, r2 = ring.reserve(8), ring.reserve(4)
    ring.begin_read(r1)
    ring.release(r2)
    state = ring.state()
    other = HostRing(16)
    other.restore(state)
    assert other.state() == state and other.cursor == ring.cursor == 0 and other.head == 12
    for r in (ring, other):
        first = made_range(r, 0, 8)  # r1's bytes, as a range of this ring
        with pytest.raises(RangeError) as refused:
            r.release(first)
        assert refused.value.rule == "H2D-3"
        r.end_read(first, release=True)
        assert r.cursor == 12 and r.reserve(4).start == 12 and r.reserve(4).start == 16  # wraps
    assert other.state() == ring.state() == (20, (12, 16), (16, 20), (), (), ())


def test_states_that_differ_only_in_which_allocation_is_which_are_one() -> None:
    step = sansio.Step(16)
    step.load(sansio.initial(DEFAULT))
    for action in (("alloc",), ("alloc",), ("copy_in", 1, (0, 4), "async")):
        step.apply(action)
    first = step.value()
    step.load(sansio.initial(DEFAULT))
    for action in (("alloc",), ("alloc",), ("copy_in", 2, (0, 4), "async")):
        step.apply(action)
    assert step.value() == first
    generation, faults, ring, allocations = first
    assert (generation, faults, ring) == (0, 0, (4, (0,), (4,), ((0, 4),), (), ()))
    assert allocations == (
        (0, "allocated", 0, 0, False, False, 8, ()),
        (0, "copying", 1, 0, True, False, 8, (("copy_in", (0, 4), (0, 4), 0, False, None),)),
    )
    core, used, freed = sansio.unpack(first)  # as the core's snapshot: allocation n has id n
    assert core == (0, 3, 1, ((1, 0, 8, None, 1, "allocated", 0, 0), (2, 0, 8, None, 2, "copying", 1, 0)),
                    ((0, "copy_in", (2,), (0, 4), 0, False, (0, 4), None),))  # fmt: skip
    assert (used, freed) == ({2}, set())
    step.load(first)
    assert step.core.snapshot() == core and step.value() == first


def test_ring_offsets_count_modulo_whole_laps() -> None:
    """The same bytes in flight a lap later are the same state: offsets move back by the capacity."""
    step = sansio.Step(16)
    step.load(sansio.initial(DEFAULT))
    step.apply(("alloc",))
    step.apply(("copy_in", 1, (0, 4), "async"))
    early = step.value()
    step.load(sansio.initial(DEFAULT))
    step.apply(("alloc",))
    for _ in range(4):  # 16 B copied and released: a lap
        step.apply(("copy_in", 1, (0, 4), "sync"))
    step.apply(("copy_in", 1, (0, 4), "async"))
    assert step.ring.state()[1] == (16,)
    assert step.value() == early


# ------------------------------------------------------------ the command line


def test_cli_runs_both_checkers_and_reports_each(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--values-depth", "3", "--depth", "2", "--no-progress", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"bound: {replace(DEFAULT, depth=2, values_depth=3)}\n")
    assert "sans-I/O checker (the core and the ring as values): depth 3\n" in out
    assert "lockstep checker (the Bridge over the fake backend, beside the reference model): depth 2\n" in out
    assert len(re.findall(r"time: [0-9.]+ s   states/s: [0-9]+ \(1 process, [0-9]+ per process\)", out)) == 2
    assert main(["check", "--tier", "values", "--values-depth", "all", "--allocations", "1", "--restarts", "1",
                 "--in-flight", "2", "--spans", "0:8", "--ring", "8", "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "every reachable state\ndistinct states: 323 " in out and "lockstep" not in out


def test_cli_reports_a_violation_of_either_checker(capsys: pytest.CaptureFixture[str]) -> None:
    with MUTANTS["missing_waw_edge"]():
        assert main(["check", "--tier", "values", "--values-depth", "4", "--no-progress", "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    assert "violations: 1 (shortest: 3 steps)" in out and "[ORDER-1]" in out
    assert "shortest counterexample (3 steps): alloc -> copy_in:1:(0, 4):async -> copy_in:1:(0, 4):async" in out


@pytest.mark.parametrize("value", ["0", "-1", "x", "none"])
def test_cli_refuses_a_values_depth_that_is_not_one(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["check", "--values-depth", value, "--no-progress"])
    assert exited.value.code == 2
    assert "argument --values-depth" in capsys.readouterr().err
