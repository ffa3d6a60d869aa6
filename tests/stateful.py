"""The Bridge and the reference model, driven in lockstep by Hypothesis.

`BridgeMachine` is a RuleBasedStateMachine over Bridge + FakeBackend + HostRing
and `models.reference.ReferenceModel`. Rules cover every bridge call, the
worker's ring calls, completing or failing any pending event in any order,
injected faults, and deliberately bad calls. After every step the invariants
compare the implementation with the model and check the spec's invariants.
`COVERAGE` records which compiled spec candidates (transitions and
rejections) the run exercised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from devbridge import (
    Bridge,
    BridgeError,
    DeviceHandle,
    DeviceRange,
    Event,
    HostRange,
    HostRing,
    InvalidHandleError,
    InvalidViewError,
    LifecycleError,
    ObjectSpec,
    RangeError,
    TensorViewSpec,
)
from devbridge.backends.fake import FakeBackend
from devbridge.models.reference import Fail, ReferenceModel, Reject
from devbridge.statemachine import default_table
from devbridge.statemachine.machine import Step, Table

RING = 384
U8 = ObjectSpec("blob", "uint8")
index = st.integers(0, 1 << 16)
fault = st.sampled_from([False, False, False, True])
mostly = st.sampled_from([True, True, True, False])
MAX_HANDLES = 3


@dataclass
class Coverage:
    """Which compiled spec candidates a run exercised, and how many steps it took."""

    table: Table
    hits: dict[tuple[str, str, int], int] = field(default_factory=dict)
    steps: int = 0
    seconds: float = 0.0

    def record(self, state: str, event: str, step: Step) -> None:
        key = (state, event, self.table.steps[(state, event)].index(step))
        self.hits[key] = self.hits.get(key, 0) + 1

    def missing(self) -> list[str]:
        return [
            self.table.describe(s, e, step) for s, e, i, step in self.table.candidates() if (s, e, i) not in self.hits
        ]

    def report(self) -> str:
        candidates = self.table.candidates()
        transitions = [c for c in candidates if c[3].rule is None]
        rejections = [c for c in candidates if c[3].rule is not None]
        rate = self.steps / max(self.seconds, 1e-9)
        lines = [
            f"stateful: {self.steps} steps in {self.seconds:.1f} s ({rate:.0f} steps/s)",
            f"spec transitions covered: {sum((s, e, i) in self.hits for s, e, i, _ in transitions)}/{len(transitions)}",
            f"spec rejections covered:  {sum((s, e, i) in self.hits for s, e, i, _ in rejections)}/{len(rejections)}",
        ]
        for s, e, i, step in candidates:
            lines.append(f"  {self.hits.get((s, e, i), 0):>7}  {self.table.describe(s, e, step)}")
        return "\n".join(lines)


COVERAGE = Coverage(default_table())


class BridgeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fake = FakeBackend()
        self.bridge = Bridge(self.fake)
        self.ring = HostRing(RING)
        self.model = ReferenceModel(RING)
        self.bridge._core.observer = COVERAGE.record
        self.handles: list[DeviceHandle] = []
        self.reservations: list[HostRange] = []
        self.pending: dict[int, Event] = {}  # model use id -> bridge event, for copies and computes
        self.views: dict[int, Any] = {}  # model use id -> live tinygrad view
        self.cursor = 0

    def teardown(self) -> None:
        self.views.clear()

    # ------------------------------------------------------------ helpers

    def snapshot(self) -> object:
        return (
            self.bridge.stats(),
            [self.bridge.state(h) for h in self.handles],
            self.ring.snapshot(),
            self.fake.snapshot(),
        )

    def expect(self, outcome: object, call: Callable[[], Any]) -> Any:
        """Run `call`; a model rejection must raise that error and change nothing."""
        if isinstance(outcome, Reject | Fail):
            before = self.snapshot() if isinstance(outcome, Reject) else None
            try:
                call()
            except BridgeError as e:
                assert (type(e).__name__, e.rule) == (outcome.error, outcome.rule), (e, outcome)
            else:
                raise AssertionError(f"expected {outcome}, the call succeeded")
            if before is not None:
                assert self.snapshot() == before, "a rejected call changed something"
            return None
        return call()

    def pick_range(self, i: int, off: int, n: int) -> HostRange:
        r = self.reservations[i % len(self.reservations)]
        off %= r.nbytes
        return r.sub(off, 1 + (n - 1) % (r.nbytes - off))

    def handle(self, i: int) -> DeviceHandle:
        return self.handles[i % len(self.handles)]

    def device_range(self, h: DeviceHandle, off: int, n: int) -> tuple[int, int]:
        off %= h.extent
        return off, 1 + n % (h.extent - off)

    def copy_ranges(
        self, h: int, i: int, off: int, dev: int, n: int, live: bool
    ) -> tuple[DeviceHandle, HostRange, int]:
        """A handle, a host range and a device offset for a copy of one size that fits both.
        With `live`, the host range comes from unreleased bytes (most copies are meant to work)."""
        handle = self.handle(h)
        spans = self.ring.unreleased() if live else []
        r = (spans or self.reservations)[i % len(spans or self.reservations)]
        off %= r.nbytes
        size = 1 + n % min(r.nbytes - off, handle.extent)
        return handle, r.sub(off, size), dev % (handle.extent - size + 1)

    def track(self, use: int, event: Event) -> None:
        assert event.use_id == use, (event.use_id, use)
        if not event.done():
            self.pending[use] = event

    # ------------------------------------------------------------ allocation

    @precondition(lambda self: len(self.handles) < MAX_HANDLES)
    @rule(extent=st.integers(1, 48), fails=fault)
    def alloc(self, extent: int, fails: bool) -> None:
        outcome = self.model.alloc(extent, fails)
        if fails:
            self.fake.fail_next("alloc")  # alloc always reaches the backend
        h = self.expect(outcome, lambda: self.bridge.alloc_device(U8, extent))
        if h is not None:
            assert h.id == outcome == len(self.handles)
            self.handles.append(h)

    @precondition(lambda self: self.handles)
    @rule(i=index)
    def free(self, i: int) -> None:
        h = self.handle(i)
        self.expect(self.model.free(h.id), lambda: self.bridge.free_device(h))

    @rule()
    def restart(self) -> None:
        self.model.restart()
        self.bridge.restart()

    # ------------------------------------------------------------ ring

    @rule(n=st.integers(1, 40))
    def reserve(self, n: int) -> None:
        outcome = self.model.reserve(n)
        r = self.expect(outcome, lambda: self.ring.reserve(n))
        if r is not None:
            assert isinstance(outcome, range) and (r.start, r.end) == (outcome.start, outcome.stop)
            self.reservations.append(r)

    @precondition(lambda self: self.reservations)
    @rule(i=index, off=index, n=index, seed=st.integers(0, 255))
    def fill(self, i: int, off: int, n: int, seed: int) -> None:
        r = self.pick_range(i, off, n)
        data = bytes((seed + k) % 256 for k in range(r.nbytes))
        outcome = self.model.view_rejection(range(r.start, r.end))

        def write() -> None:
            self.ring.view(r)[:] = data

        self.expect(outcome, write)
        if outcome is None:
            self.model.write_host(range(r.start, r.end), data)

    @precondition(lambda self: self.reservations)
    @rule(i=index, off=index, n=index)
    def read(self, i: int, off: int, n: int) -> None:
        r = self.pick_range(i, off, n)
        outcome = self.model.view_rejection(range(r.start, r.end))
        got = self.expect(outcome, lambda: bytes(self.ring.view(r)))
        if outcome is None:
            assert got == self.model.read_host(range(r.start, r.end))

    @precondition(lambda self: self.reservations)
    @rule(i=index, off=index, n=index)
    def release(self, i: int, off: int, n: int) -> None:
        r = self.pick_range(i, off, n)
        self.expect(self.model.release(range(r.start, r.end)), lambda: self.ring.release(r))

    # ------------------------------------------------------------ copies, compute, views

    @precondition(lambda self: self.handles and self.reservations)
    @rule(i=index, off=index, n=index, h=index, dev=index, sync=st.booleans(), fails=fault, live=mostly)
    def host_to_device(self, i: int, off: int, n: int, h: int, dev: int, sync: bool, fails: bool, live: bool) -> None:
        handle, src, d_off = self.copy_ranges(h, i, off, dev, n, live)
        outcome = self.model.host_to_device(range(src.start, src.end), handle.id, d_off, sync, fails)
        if fails and not isinstance(outcome, Reject):  # the call reaches the backend: arm the fault
            self.fake.fail_next("copy_in")
        dst = DeviceRange(handle, d_off, src.nbytes)
        event = self.expect(outcome, lambda: self.bridge.host_to_device(src, dst, sync=sync))
        if isinstance(outcome, int):
            self.track(outcome, event)

    @precondition(lambda self: self.handles and self.reservations)
    @rule(i=index, off=index, n=index, h=index, dev=index, sync=st.booleans(), fails=fault, live=mostly)
    def device_to_host(self, i: int, off: int, n: int, h: int, dev: int, sync: bool, fails: bool, live: bool) -> None:
        handle, dst, d_off = self.copy_ranges(h, i, off, dev, n, live)
        outcome = self.model.device_to_host(handle.id, d_off, range(dst.start, dst.end), sync, fails)
        if fails and not isinstance(outcome, Reject):
            self.fake.fail_next("copy_out")
        src = DeviceRange(handle, d_off, dst.nbytes)
        event = self.expect(outcome, lambda: self.bridge.device_to_host(src, dst, sync=sync))
        if isinstance(outcome, int):
            self.track(outcome, event)

    @precondition(lambda self: self.handles and self.reservations)
    @rule(i=index, off=index, n=index, h=index, dev=index)
    def free_during_output_copy(self, i: int, off: int, n: int, h: int, dev: int) -> None:
        """The worker's usual pattern: start the last download, free at once (a deferred free)."""
        self.device_to_host(i, off, n, h, dev, sync=False, fails=False, live=True)
        self.free(h)

    @precondition(lambda self: self.handles and self.reservations)
    @rule(h=index, i=index, k=st.integers(2, 3), inward=st.booleans())
    def copy_burst(self, h: int, i: int, k: int, inward: bool) -> None:
        """Several asynchronous copies on one allocation at once (concurrent uses)."""
        copy = self.host_to_device if inward else self.device_to_host
        for j in range(k):
            copy(i + j, 0, 1, h, j, sync=False, fails=False, live=True)

    @precondition(lambda self: self.handles)
    @rule(hs=st.lists(index, min_size=1, max_size=2), fails=fault)
    def compute(self, hs: list[int], fails: bool) -> None:
        handles = [self.handle(i) for i in hs]
        outcome = self.model.compute([h.id for h in handles], fails)
        if fails and not isinstance(outcome, Reject):
            self.fake.fail_next("compute")
        event = self.expect(outcome, lambda: self.bridge.compute(*handles))
        if isinstance(outcome, int):
            self.track(outcome, event)

    @precondition(lambda self: self.handles)
    @rule(h=index, off=index, n=index)
    def wrap(self, h: int, off: int, n: int) -> None:
        handle = self.handle(h)
        d_off, d_n = self.device_range(handle, off, n)
        outcome = self.model.wrap(handle.id)
        view = self.expect(
            outcome, lambda: self.bridge.wrap_for_tinygrad(handle, TensorViewSpec((d_n,), "uint8", d_off))
        )
        if isinstance(outcome, int):
            self.views[outcome] = view

    @precondition(lambda self: self.views)
    @rule(i=index)
    def drop_view(self, i: int) -> None:
        use = sorted(self.views)[i % len(self.views)]
        del self.views[use]  # the finalizer queues the end of the use; the bridge applies it on its next call
        self.model.finish(use)  # a view's end is reported to nobody, aborted by a restart or not
        assert self.bridge.poll() == 1

    # ------------------------------------------------------------ completions

    @precondition(lambda self: self.pending)
    @rule(i=index, failed=fault)
    def complete(self, i: int, failed: bool) -> None:
        use = sorted(self.pending)[i % len(self.pending)]
        event = self.pending.pop(use)
        expected = self.model.finish(use, failed)
        if failed:
            self.fake.fail(event, "failed by the test")
        else:
            self.fake.complete(event)
        assert event.done()
        error = event.error
        assert (None if error is None else (type(error).__name__, error.rule)) == expected, (error, expected)

    @rule()
    def poll(self) -> None:
        assert self.bridge.poll() == 0  # completions arrive by callback; views are drained on every call

    # ------------------------------------------------------------ bad calls

    @precondition(lambda self: self.handles)
    @rule(h=index, op=st.sampled_from(["free", "compute", "state", "wrap"]))
    def foreign_handle(self, h: int, op: str) -> None:
        handle = self.handle(h)
        forged = DeviceHandle(handle.id, handle.generation, handle.extent, handle.spec, owner=-1)
        calls: dict[str, Callable[[], object]] = {
            "free": lambda: self.bridge.free_device(forged),
            "compute": lambda: self.bridge.compute(forged),
            "state": lambda: self.bridge.state(forged),
            "wrap": lambda: self.bridge.wrap_for_tinygrad(forged, TensorViewSpec((1,), "uint8")),
        }
        self.expect(Reject(InvalidHandleError.__name__, "HANDLE-1"), calls[op])

    @precondition(lambda self: self.handles and self.reservations)
    @rule(h=index, i=index, extra=st.integers(1, 8))
    def mismatched_copy(self, h: int, i: int, extra: int) -> None:
        handle = self.handle(h)
        src = self.reservations[i % len(self.reservations)]
        assume(src.nbytes + extra <= handle.extent)
        dst = DeviceRange(handle, 0, src.nbytes + extra)
        self.expect(Reject(RangeError.__name__, "H2D-1"), lambda: self.bridge.host_to_device(src, dst))

    @precondition(lambda self: self.handles)
    @rule(h=index, over=st.integers(1, 4))
    def out_of_bounds(self, h: int, over: int) -> None:
        handle = self.handle(h)
        self.expect(Reject(RangeError.__name__, "RANGE-1"), lambda: DeviceRange(handle, 0, handle.extent + over))

    @precondition(lambda self: self.handles)
    @rule(h=index, over=st.integers(1, 4))
    def invalid_view(self, h: int, over: int) -> None:
        handle = self.handle(h)
        assume(self.model._use_rejection(handle.id) is None)
        view = TensorViewSpec((handle.extent + over,), "uint8")
        self.expect(Reject(InvalidViewError.__name__, "VIEW-2"), lambda: self.bridge.wrap_for_tinygrad(handle, view))

    @precondition(lambda self: self.handles)
    @rule(h=index, t=index, event=st.sampled_from(["copy_end", "compute_end", "restart"]))
    def raw_event(self, h: int, t: int, event: str) -> None:
        """Drive the core directly with an event no bridge call would send now: an end
        for a kind of use not in flight (EVENT-1), or a restart of an allocation whose
        record is gone (freed and stale stay dead). Picks among the handles where it applies."""
        core = self.bridge._core
        if event == "restart":
            dead = [x for x in self.handles if self.model.state(x.id) in ("freed", "stale")]
            if dead:
                handle = dead[h % len(dead)]
                state = self.model.state(handle.id)
                core.fire(handle.id, handle.generation, event)
                assert self.bridge.state(handle) == state
                return
            event = "copy_end"
        kinds = {"copy_end": {"copy_in", "copy_out"}, "compute_end": {"compute", "view"}}[event]
        idle = [x for x in self.handles if not kinds & {self.model.uses[u].kind for u in self.model.allocs[x.id].uses}]
        by_state: dict[str, list[DeviceHandle]] = {}
        for x in idle:  # first a state, then a handle in it: rare states get their turn
            by_state.setdefault(self.model.state(x.id), []).append(x)
        if by_state:
            group = by_state[sorted(by_state)[t % len(by_state)]]
            handle = group[h % len(group)]
            self.expect(
                Reject(LifecycleError.__name__, "EVENT-1"), lambda: core.fire(handle.id, handle.generation, event)
            )

    # ------------------------------------------------------------ invariants

    @invariant()
    def count_step(self) -> None:
        COVERAGE.steps += 1

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert [self.bridge.state(h) for h in self.handles] == [self.model.state(h.id) for h in self.handles]
        freed = [c.buffer for c in self.fake.calls if c.op == "free"]
        assert freed == self.model.frees, "backend frees differ (none while in use, each exactly once)"
        assert self.fake.violations == []

    @invariant()
    def ring_agrees(self) -> None:
        cursor = self.ring.cursor
        assert cursor >= self.cursor, "cursor moved backwards"
        assert cursor == self.model.cursor(), "cursor passed an unreleased byte or stopped early"
        self.cursor = cursor
        for r in self.reservations:
            assert self.ring.released(r) == (not set(range(r.start, r.end)) & self.model.unreleased)

    @invariant()
    def device_bytes_are_exact(self) -> None:
        for h in self.handles:
            alloc = self.model.allocs[h.id]
            if not alloc.released:
                assert bytes(self.fake.buffer(h.id).data) == bytes(alloc.data), f"device bytes of #{h.id}"

    @invariant()
    def quiescent_means_released(self) -> None:
        if not self.model.uses:
            assert self.model.quiescent_leaks() == []
            live = sum(not a.released for a in self.model.allocs.values())
            assert self.fake.live_allocations == live
