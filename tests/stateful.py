"""The Bridge and the reference model, driven in lockstep by Hypothesis.

`BridgeMachine` is a RuleBasedStateMachine over `devbridge.models.lockstep.Lockstep`
(Bridge + FakeBackend + HostRing beside the reference model). Rules cover every
bridge call, the worker's ring calls, completing or failing any pending event in
any order, injected faults, and deliberately bad calls. After every step
`Lockstep.check` compares the implementation with the model and checks the
spec's invariants. `COVERAGE` records which compiled spec candidates
(transitions and rejections) the run exercised.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from devbridge import (
    DeviceHandle,
    DeviceRange,
    HostRange,
    InvalidHandleError,
    InvalidViewError,
    LifecycleError,
    RangeError,
    TensorViewSpec,
)
from devbridge.models.coverage import Coverage
from devbridge.models.lockstep import Lockstep
from devbridge.models.reference import Reject
from devbridge.statemachine import default_table

RING = 384
index = st.integers(0, 1 << 16)
fault = st.sampled_from([False, False, False, True])
mostly = st.sampled_from([True, True, True, False])
MAX_HANDLES = 3


COVERAGE = Coverage(default_table())


class BridgeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = Lockstep(RING, observer=COVERAGE.record)

    def teardown(self) -> None:
        self.s.views.clear()

    # ------------------------------------------------------------ choosing arguments

    def handle(self, i: int) -> DeviceHandle:
        return self.s.handles[i % len(self.s.handles)]

    def pick_range(self, i: int, off: int, n: int) -> HostRange:
        r = self.s.reservations[i % len(self.s.reservations)]
        off %= r.nbytes
        return r.sub(off, 1 + (n - 1) % (r.nbytes - off))

    def device_range(self, h: DeviceHandle, off: int, n: int) -> tuple[int, int]:
        off %= h.extent
        return off, 1 + n % (h.extent - off)

    def copy_ranges(
        self, h: int, i: int, off: int, dev: int, n: int, live: bool
    ) -> tuple[DeviceHandle, HostRange, int]:
        """A handle, a host range and a device offset for a copy of one size that fits both.
        With `live`, the host range comes from unreleased bytes (most copies are meant to work)."""
        handle = self.handle(h)
        spans = self.s.ring.unreleased() if live else []
        r = (spans or self.s.reservations)[i % len(spans or self.s.reservations)]
        off %= r.nbytes
        size = 1 + n % min(r.nbytes - off, handle.extent)
        return handle, r.sub(off, size), dev % (handle.extent - size + 1)

    # ------------------------------------------------------------ allocation

    @precondition(lambda self: len(self.s.handles) < MAX_HANDLES)
    @rule(extent=st.integers(1, 48), fails=fault)
    def alloc(self, extent: int, fails: bool) -> None:
        self.s.alloc(extent, fails)

    @precondition(lambda self: self.s.handles)
    @rule(i=index)
    def free(self, i: int) -> None:
        self.s.free(self.handle(i))

    @rule()
    def restart(self) -> None:
        self.s.restart()

    # ------------------------------------------------------------ ring

    @rule(n=st.integers(1, 40))
    def reserve(self, n: int) -> None:
        self.s.reserve(n)

    @precondition(lambda self: self.s.reservations)
    @rule(i=index, off=index, n=index, seed=st.integers(0, 255))
    def fill(self, i: int, off: int, n: int, seed: int) -> None:
        r = self.pick_range(i, off, n)
        self.s.fill(r, bytes((seed + k) % 256 for k in range(r.nbytes)))

    @precondition(lambda self: self.s.reservations)
    @rule(i=index, off=index, n=index)
    def read(self, i: int, off: int, n: int) -> None:
        self.s.read(self.pick_range(i, off, n))

    @precondition(lambda self: self.s.reservations)
    @rule(i=index, off=index, n=index)
    def release(self, i: int, off: int, n: int) -> None:
        self.s.release(self.pick_range(i, off, n))

    # ------------------------------------------------------------ copies, compute, views

    @precondition(lambda self: self.s.handles and self.s.reservations)
    @rule(i=index, off=index, n=index, h=index, dev=index, sync=st.booleans(), fails=fault, live=mostly, keep=fault)
    def host_to_device(
        self, i: int, off: int, n: int, h: int, dev: int, sync: bool, fails: bool, live: bool, keep: bool = False
    ) -> None:
        handle, src, d_off = self.copy_ranges(h, i, off, dev, n, live)
        self.s.host_to_device(src, handle, d_off, sync, fails, release=not keep)
        self.probe_end(handle, "compute_end")

    @precondition(lambda self: self.s.handles and self.s.reservations)
    @rule(i=index, off=index, n=index, h=index, dev=index, sync=st.booleans(), fails=fault, live=mostly)
    def device_to_host(self, i: int, off: int, n: int, h: int, dev: int, sync: bool, fails: bool, live: bool) -> None:
        handle, dst, d_off = self.copy_ranges(h, i, off, dev, n, live)
        self.s.device_to_host(handle, d_off, dst, sync, fails)
        self.probe_end(handle, "compute_end")

    @precondition(lambda self: self.s.handles and self.s.reservations)
    @rule(i=index, off=index, n=index, h=index, dev=index, k=st.integers(1, 2))
    def free_during_output_copy(self, i: int, off: int, n: int, h: int, dev: int, k: int) -> None:
        """The worker's usual pattern: start the last downloads, free at once (a deferred free);
        then a compute end that no compute is waiting for must be refused."""
        for j in range(k):
            self.device_to_host(i + j, off, n, h, dev, sync=False, fails=False, live=True)
        self.free(h)
        self.probe_end(self.handle(h), "compute_end")

    @precondition(lambda self: self.s.handles and self.s.reservations)
    @rule(i=index, off=index, n=index, h=index, dev=index)
    def restart_during_output_copy(self, i: int, off: int, n: int, h: int, dev: int) -> None:
        """A restart while a download is in flight (stale_pending), then a stray compute end."""
        self.device_to_host(i, off, n, h, dev, sync=False, fails=False, live=True)
        self.restart()
        self.probe_end(self.handle(h), "compute_end")

    def probe_end(self, handle: DeviceHandle, event: str) -> None:
        """Send `event` straight to the core if no use of its kind is in flight: EVENT-1."""
        if self.s.stray_end(handle.id, event):
            core = self.s.bridge._core
            self.s.expect(
                Reject(LifecycleError.__name__, "EVENT-1"), lambda: core.fire(handle.id, handle.generation, event), ""
            )

    @precondition(lambda self: self.s.handles and self.s.reservations)
    @rule(h=index, i=index, k=st.integers(2, 3), inward=st.booleans(), computes=st.integers(0, 2))
    def copy_burst(self, h: int, i: int, k: int, inward: bool, computes: int) -> None:
        """Several asynchronous copies on one allocation at once, and maybe computes beside them."""
        copy = self.host_to_device if inward else self.device_to_host
        for j in range(k):
            copy(i + j, 0, 1, h, j, sync=False, fails=False, live=True)
        for _ in range(computes):
            self.compute([h], fails=False)

    @precondition(lambda self: self.s.handles)
    @rule(hs=st.lists(index, min_size=1, max_size=2), fails=fault)
    def compute(self, hs: list[int], fails: bool) -> None:
        self.s.compute([self.handle(i) for i in hs], fails)
        self.probe_end(self.handle(hs[0]), "copy_end")

    @precondition(lambda self: self.s.handles)
    @rule(h=index, off=index, n=index, keep=st.booleans())
    def wrap(self, h: int, off: int, n: int, keep: bool) -> None:
        """Make a view; kept for later steps, or used and dropped at once (a transient view)."""
        handle = self.handle(h)
        d_off, d_n = self.device_range(handle, off, n)
        before = set(self.s.views)
        self.s.wrap(handle, d_off, d_n)
        if not keep and (new := set(self.s.views) - before):
            self.s.drop_view(new.pop())

    @precondition(lambda self: self.s.views)
    @rule(i=index)
    def drop_view(self, i: int) -> None:
        self.s.drop_view(sorted(self.s.views)[i % len(self.s.views)])

    # ------------------------------------------------------------ completions

    @precondition(lambda self: self.s.pending)
    @rule(i=index, failed=fault)
    def complete(self, i: int, failed: bool) -> None:
        self.s.complete(sorted(self.s.pending)[i % len(self.s.pending)], failed)

    @rule()
    def poll(self) -> None:
        assert self.s.bridge.poll() == 0  # completions arrive by callback; views are drained on every call

    # ------------------------------------------------------------ bad calls

    @precondition(lambda self: self.s.handles)
    @rule(h=index, op=st.sampled_from(["free", "compute", "state", "wrap"]))
    def foreign_handle(self, h: int, op: str) -> None:
        handle = self.handle(h)
        forged = DeviceHandle(handle.id, handle.generation, handle.extent, handle.spec, owner=-1)
        bridge = self.s.bridge
        calls: dict[str, Callable[[], object]] = {
            "free": lambda: bridge.free_device(forged),
            "compute": lambda: bridge.compute(forged),
            "state": lambda: bridge.state(forged),
            "wrap": lambda: bridge.wrap_for_tinygrad(forged, TensorViewSpec((1,), "uint8")),
        }
        self.s.expect(Reject(InvalidHandleError.__name__, "HANDLE-1"), calls[op], op)

    @precondition(lambda self: self.s.handles and self.s.reservations)
    @rule(h=index, i=index, extra=st.integers(1, 8))
    def mismatched_copy(self, h: int, i: int, extra: int) -> None:
        handle = self.handle(h)
        src = self.s.reservations[i % len(self.s.reservations)]
        assume(src.nbytes + extra <= handle.extent)
        dst = DeviceRange(handle, 0, src.nbytes + extra)
        self.s.expect(Reject(RangeError.__name__, "H2D-1"), lambda: self.s.bridge.host_to_device(src, dst), "h2d")

    @precondition(lambda self: self.s.handles)
    @rule(h=index, over=st.integers(1, 4))
    def out_of_bounds(self, h: int, over: int) -> None:
        handle = self.handle(h)
        self.s.expect(Reject(RangeError.__name__, "RANGE-1"), lambda: DeviceRange(handle, 0, handle.extent + over), "")

    @precondition(lambda self: self.s.handles)
    @rule(h=index, over=st.integers(1, 4))
    def invalid_view(self, h: int, over: int) -> None:
        handle = self.handle(h)
        assume(self.s.model._use_rejection(handle.id) is None)
        view = TensorViewSpec((handle.extent + over,), "uint8")
        self.s.expect(
            Reject(InvalidViewError.__name__, "VIEW-2"), lambda: self.s.bridge.wrap_for_tinygrad(handle, view), "wrap"
        )

    @precondition(lambda self: self.s.handles)
    @rule(h=index, t=index, event=st.sampled_from(["copy_end", "compute_end", "restart"]))
    def raw_event(self, h: int, t: int, event: str) -> None:
        """Drive the core directly with an event no bridge call would send now: an end
        for a kind of use not in flight (EVENT-1), or a restart of an allocation whose
        record is gone (freed and stale stay dead). Picks among the handles where it applies."""
        core, model = self.s.bridge._core, self.s.model
        if event == "restart":
            dead = [x for x in self.s.handles if model.state(x.id) in ("freed", "stale")]
            if dead:
                handle = dead[h % len(dead)]
                state = model.state(handle.id)
                core.fire(handle.id, handle.generation, event)
                assert self.s.bridge.state(handle) == state
                return
            event = "copy_end"
        idle = [x for x in self.s.handles if self.s.stray_end(x.id, event)]
        by_state: dict[str, list[DeviceHandle]] = {}
        for x in idle:  # first a state, then a handle in it: rare states get their turn
            by_state.setdefault(model.state(x.id), []).append(x)
        if by_state:
            group = by_state[sorted(by_state)[t % len(by_state)]]
            handle = group[h % len(group)]
            self.s.expect(
                Reject(LifecycleError.__name__, "EVENT-1"), lambda: core.fire(handle.id, handle.generation, event), ""
            )

    # ------------------------------------------------------------ invariants

    @invariant()
    def agrees_with_the_model(self) -> None:
        COVERAGE.steps += 1
        self.s.check()
