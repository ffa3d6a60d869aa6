"""The Bridge and the reference model, driven in lockstep by Hypothesis.

`BridgeMachine` is a RuleBasedStateMachine over `devbridge.models.lockstep.Lockstep`
(Bridge + FakeBackend + HostRing beside the reference model). Rules cover every
bridge call, the worker's ring calls, completing or failing any pending event in
any order, injected faults (allocations, copies, computes, backend frees that
fail at once, in a restart or deferred, queries and waits that fail), wait
timeouts, near-capacity reservations, views at aligned and unaligned offsets,
tensors derived from views (movement ops, lazy ops, assign targets) that keep
them in use after the view itself is dropped (also across a free or a restart),
and deliberately bad calls. After every step one `@invariant` per spec
invariant (`inv1_counts`, ..., `inv8_quiescent`: `Lockstep.check_invariant`)
compares the implementation with the model, so a failure names the invariant
it broke. `COVERAGE` records which compiled spec candidates
(transitions and rejections) the run exercised.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, precondition, rule

from devbridge import (
    DeviceHandle,
    DeviceRange,
    HostRange,
    InvalidHandleError,
    LifecycleError,
    RangeError,
    TensorViewSpec,
)
from devbridge.models.coverage import Coverage
from devbridge.models.lockstep import DERIVE, Act, Lockstep
from devbridge.models.reference import VIEW_ALIGNMENT, Reject
from devbridge.statemachine import default_table

RING = 384
index = st.integers(0, 1 << 16)
fault = st.sampled_from([False, False, False, True])
mostly = st.sampled_from([True, True, True, False])
MAX_HANDLES = 3
MAX_FREE_FAULTS = 2
MAX_TENSORS = 6  # live tensors reaching views, all views together
derivation = st.sampled_from(sorted(DERIVE))


COVERAGE = Coverage(default_table())


def checks(name: str, spec_invariant: str) -> Callable[[BridgeMachine], None]:
    """An @invariant `name` running one spec invariant's lockstep checks (a failure names it)."""

    def check(self: BridgeMachine) -> None:
        self.s.check_invariant(spec_invariant)

    check.__name__ = check.__qualname__ = name
    check.spec_invariant = spec_invariant  # type: ignore[attr-defined]
    return invariant()(check)


class BridgeMachine(RuleBasedStateMachine):
    """Handles and reservations flow through Bundles: a counterexample reads as calls on named
    objects (`handles_0 = state.alloc(...)`, `state.free(handle=handles_0, ...)`). A handle stays
    in its bundle after a free or a restart: using it then is part of the contract too."""

    handles = Bundle("handles")
    reservations = Bundle("reservations")

    def __init__(self) -> None:
        super().__init__()
        self.s = Lockstep(RING, observer=COVERAGE.record, edges=COVERAGE.record_edge, refusals=COVERAGE.refusals)

    def teardown(self) -> None:
        self.s.tensors.clear()

    # ------------------------------------------------------------ choosing arguments

    def live(self, r: HostRange) -> HostRange:
        """The unreleased part of `r` (its first unreleased span), else any unreleased span, else
        `r`: most copies are meant to work."""
        spans = self.s.ring.unreleased()
        inside = [x for x in spans if x.start < r.end and r.start < x.end]
        if inside:
            start = max(inside[0].start, r.start)
            return HostRange(self.s.ring, start, min(inside[0].end, r.end) - start)
        return spans[0] if spans else r

    def pick_range(self, r: HostRange, off: int, n: int, live: bool = False) -> HostRange:
        """A sub-range of `r`; with `live`, of its unreleased part (see `live`)."""
        r = self.live(r) if live else r
        off %= r.nbytes
        return r.sub(off, 1 + (n - 1) % (r.nbytes - off))

    def device_range(self, h: DeviceHandle, off: int, n: int) -> tuple[int, int]:
        off %= h.extent
        return off, 1 + n % (h.extent - off)

    def copy_ranges(
        self, handle: DeviceHandle, r: HostRange, off: int, dev: int, n: int, live: bool
    ) -> tuple[HostRange, int]:
        """A host range in `r` and a device offset in `handle` for a copy of one size that fits
        both. With `live`, the host range comes from unreleased bytes (see `live`)."""
        r = self.live(r) if live else r
        off %= r.nbytes
        size = 1 + n % min(r.nbytes - off, handle.extent)
        return r.sub(off, size), dev % (handle.extent - size + 1)

    # ------------------------------------------------------------ allocation

    @precondition(lambda self: len(self.s.handles) < MAX_HANDLES)
    @rule(target=handles, extent=st.integers(1, 48), fails=fault)
    def alloc(self, extent: int, fails: bool) -> object:
        h = self.s.alloc(extent, fails)
        return multiple() if h is None else h

    def arm_free_fault(self, fails: bool) -> None:
        """Make the next backend free fail, whichever it is (at most two armed at once)."""
        if fails and self.s.model.free_faults < MAX_FREE_FAULTS:
            self.s.arm_free_fault()

    @rule(handle=handles, fails=fault)
    def free(self, handle: DeviceHandle, fails: bool = False) -> None:
        """With `fails`, the backend refuses the next free: this one if immediate (FREE-3 from
        free_device), else whichever release comes next (deferred: reported by the next poll)."""
        self.arm_free_fault(fails)
        self.s.free(handle)

    @rule(fails=fault)
    def restart(self, fails: bool = False) -> None:
        """With `fails`, one of the old idle allocations' frees fails: restart still releases the
        others, then reports FREE-3."""
        self.arm_free_fault(fails)
        self.s.restart()

    # ------------------------------------------------------------ ring

    @rule(target=reservations, n=st.integers(1, 40))
    def reserve(self, n: int) -> object:
        r = self.s.reserve(n)
        return multiple() if r is None else r

    @rule(n=st.integers(RING - 48, RING + 1), drain=mostly, keep=fault)
    def reserve_most(self, n: int, drain: bool, keep: bool) -> None:
        """A reservation of nearly the whole ring (or more than all of it: RING-2), usually after
        releasing every span no copy holds: with nothing unreleased the whole ring is free,
        whatever the head's position in its lap (bytes skipped at a lap's end are free).
        Usually released at once (the head has moved on), else kept (the ring is full)."""
        if drain:
            m = self.s.model
            held = m._pending("copy_in") | m._pending("copy_out")
            for span in self.s.ring.unreleased():
                if not set(self.s.span(span)) & held:
                    self.s.release(span)
        if (r := self.s.reserve(n)) is not None and not keep:
            self.s.release(r)

    @rule(back=st.integers(0, 8), extra=st.integers(1, 8))
    def released_unreserved(self, back: int, extra: int) -> None:
        """ring.released of a range reaching past the head (bytes never reserved): RING-1."""
        start = max(0, self.s.ring.head - back)
        self.s.released(start, self.s.ring.head - start + extra)

    @rule(r=reservations, off=index, n=index, seed=st.integers(0, 255), live=mostly)
    def fill(self, r: HostRange, off: int, n: int, seed: int, live: bool) -> None:
        """Write through ring.view; with `live`, into unreleased bytes (where input copies may
        be reading: the view is then read-only)."""
        part = self.pick_range(r, off, n, live)
        self.s.fill(part, bytes((seed + k) % 256 for k in range(part.nbytes)))

    @rule(r=reservations, off=index, n=index)
    def read(self, r: HostRange, off: int, n: int) -> None:
        self.s.read(self.pick_range(r, off, n))

    @rule(r=reservations, off=index, n=index)
    def release(self, r: HostRange, off: int, n: int) -> None:
        self.s.release(self.pick_range(r, off, n))

    # ------------------------------------------------------------ copies, compute, views

    @rule(
        r=reservations,
        off=index,
        n=index,
        handle=handles,
        dev=index,
        sync=st.booleans(),
        fails=fault,
        live=mostly,
        keep=fault,
    )
    def host_to_device(
        self,
        r: HostRange,
        off: int,
        n: int,
        handle: DeviceHandle,
        dev: int,
        sync: bool,
        fails: bool,
        live: bool,
        keep: bool = False,
    ) -> None:
        src, d_off = self.copy_ranges(handle, r, off, dev, n, live)
        self.s.host_to_device(src, handle, d_off, sync, fails, release=not keep)
        self.probe_end(handle, "compute_end")

    @rule(r=reservations, off=index, n=index, handle=handles, dev=index, sync=st.booleans(), fails=fault, live=mostly)
    def device_to_host(
        self, r: HostRange, off: int, n: int, handle: DeviceHandle, dev: int, sync: bool, fails: bool, live: bool
    ) -> None:
        dst, d_off = self.copy_ranges(handle, r, off, dev, n, live)
        self.s.device_to_host(handle, d_off, dst, sync, fails)
        self.probe_end(handle, "compute_end")

    @rule(r=reservations, off=index, n=index, handle=handles, dev=index, inward=st.booleans())
    def copy_lost_at_submit(self, r: HostRange, off: int, n: int, handle: DeviceHandle, dev: int, inward: bool) -> None:
        """The backend's first query of an asynchronous copy (at submission) fails: the call
        returns an event that is already done, failed (COPY-F); the host bytes as for a failed copy."""
        part, d_off = self.copy_ranges(handle, r, off, dev, n, live=True)
        if inward:
            self.s.host_to_device(part, handle, d_off, sync=False, fails=False, lost=True)
        else:
            self.s.device_to_host(handle, d_off, part, sync=False, fails=False, lost=True)

    @rule(r=reservations, off=index, n=index, handle=handles, dev=index, inward=st.booleans(), fails=fault, keep=fault)
    def copy_done_at_once(
        self, r: HostRange, off: int, n: int, handle: DeviceHandle, dev: int, inward: bool, fails: bool, keep: bool
    ) -> None:
        """An asynchronous copy the backend finishes at submission (tinygrad: a small copy to an
        idle CPU device) takes the synchronous copy's fused step; one held back or armed to fail
        stays in flight."""
        part, d_off = self.copy_ranges(handle, r, off, dev, n, live=True)
        if inward:
            self.s.host_to_device(part, handle, d_off, sync=False, fails=fails, release=not keep, at_once=True)
        else:
            self.s.device_to_host(handle, d_off, part, sync=False, fails=fails, at_once=True)
        self.probe_end(handle, "compute_end")

    @rule(
        r=reservations,
        off=index,
        n=index,
        handle=handles,
        dev=index,
        shift=st.integers(-4, 4),
        seed=st.integers(0, 255),
    )
    def fill_during_input_copy(
        self, r: HostRange, off: int, n: int, handle: DeviceHandle, dev: int, shift: int, seed: int
    ) -> None:
        """A producer writing host bytes an asynchronous input copy still reads (all or some of
        them): the view is read-only (H2D-3); the copy moves the bytes as they were."""
        src, d_off = self.copy_ranges(handle, r, off, dev, n, live=True)
        self.s.host_to_device(src, handle, d_off, sync=False, fails=False)
        span = next((x for x in self.s.ring.unreleased() if x.start <= src.start < x.end), None)
        if span is not None:
            start = min(max(src.start + shift, span.start), span.end - 1)
            end = min(max(src.end + shift, start + 1), span.end)
            self.s.fill(HostRange(self.s.ring, start, end - start), bytes((seed + k) % 256 for k in range(end - start)))

    @rule(rs=st.lists(reservations, min_size=1, max_size=2), off=index, n=index, handle=handles, dev=index, fails=fault)
    def free_during_output_copy(
        self, rs: list[HostRange], off: int, n: int, handle: DeviceHandle, dev: int, fails: bool
    ) -> None:
        """The worker's usual pattern: start the last downloads, free at once (a deferred free,
        whose backend free may be made to fail: reported by the poll after the last completion);
        then a compute end that no compute is waiting for must be refused."""
        for r in rs:
            self.device_to_host(r, off, n, handle, dev, sync=False, fails=False, live=True)
        self.free(handle, fails)
        self.probe_end(handle, "compute_end")

    @rule(r=reservations, off=index, n=index, handle=handles, dev=index)
    def restart_during_output_copy(self, r: HostRange, off: int, n: int, handle: DeviceHandle, dev: int) -> None:
        """A restart while a download is in flight (stale_pending), then a stray compute end."""
        self.device_to_host(r, off, n, handle, dev, sync=False, fails=False, live=True)
        self.restart()
        self.probe_end(handle, "compute_end")

    def probe_end(self, handle: DeviceHandle, event: str) -> None:
        """Send `event` straight to the core if no use of its kind is in flight: EVENT-1."""
        if self.s.stray_end(handle.id, event):
            self.s.expect(Reject(LifecycleError.__name__, "EVENT-1"), self.fire(handle, event))

    def fire(self, handle: DeviceHandle, event: str) -> Act:
        """A raw spec event sent straight to the core."""
        return self.s.act(self.s.bridge._core, "fire", handle.id, handle.generation, event)

    @rule(
        handle=handles,
        rs=st.lists(reservations, min_size=2, max_size=3),
        inward=st.booleans(),
        computes=st.integers(0, 2),
    )
    def copy_burst(self, handle: DeviceHandle, rs: list[HostRange], inward: bool, computes: int) -> None:
        """Several asynchronous copies on one allocation at once, and maybe computes beside them."""
        copy = self.host_to_device if inward else self.device_to_host
        for j, r in enumerate(rs):
            copy(r, 0, 1, handle, j, sync=False, fails=False, live=True)
        for _ in range(computes):
            self.compute([handle], fails=False)

    @precondition(lambda self: len(self.s.tensors) < MAX_TENSORS)
    @rule(handle=handles, rs=st.lists(reservations, min_size=1, max_size=2), inward=st.booleans())
    def copies_beside_a_view(self, handle: DeviceHandle, rs: list[HostRange], inward: bool) -> None:
        """Asynchronous copies while a live view keeps the allocation in use (a view orders
        nothing, ORDER-1): copying_computing until the copies end, one by one."""
        if self.s.wrap(handle, 0, handle.extent) is None:
            return
        copy = self.host_to_device if inward else self.device_to_host
        for j, r in enumerate(rs):
            copy(r, 0, 1, handle, j, sync=False, fails=False, live=True)

    @rule(
        handle=handles,
        other=handles,
        r=reservations,
        off=index,
        n=index,
        dev=index,
        inward=st.booleans(),
        sync=st.booleans(),
    )
    def copy_inside_compute_block(
        self,
        handle: DeviceHandle,
        other: DeviceHandle,
        r: HostRange,
        off: int,
        n: int,
        dev: int,
        inward: bool,
        sync: bool,
    ) -> None:
        """Inside `with bridge.compute(h):` a copy on any allocation: a synchronous one that would
        have to wait for the open compute event is refused (ORDER-2) and changes nothing; an
        asynchronous one is held back until the block exits and the compute completes."""
        use = self.s.compute([handle], fails=False)
        if use is None:
            return
        self.s.open_compute(use)
        copy = self.host_to_device if inward else self.device_to_host
        copy(r, off, n, other, dev, sync=sync, fails=False, live=True)
        self.s.close_compute(use)

    @rule(hs=st.lists(handles, min_size=1, max_size=2), fails=fault)
    def compute(self, hs: list[DeviceHandle], fails: bool) -> None:
        self.s.compute(hs, fails)
        self.probe_end(hs[0], "copy_end")

    def view_range(self, handle: DeviceHandle, off: int, n: int, aligned: bool) -> tuple[int, int]:
        """A view's offset and size within the extent: aligned (0, 16 or 32 for 1..48 bytes), or
        any offset (unaligned ones are refused: VIEW-2)."""
        if aligned:
            off = VIEW_ALIGNMENT * (off % -(-handle.extent // VIEW_ALIGNMENT))
        return self.device_range(handle, off, n)

    @precondition(lambda self: len(self.s.tensors) < MAX_TENSORS)
    @rule(handle=handles, off=index, n=index, keep=st.booleans(), aligned=mostly)
    def wrap(self, handle: DeviceHandle, off: int, n: int, keep: bool, aligned: bool) -> None:
        """Make a view; kept for later steps, or used and dropped at once (a transient view)."""
        t = self.s.wrap(handle, *self.view_range(handle, off, n, aligned))
        if not keep and t is not None:
            self.s.drop(t)

    def pick_tensor(self, i: int, views_only: bool = False) -> int | None:
        ids = sorted(t for t, how in self.s.derived.items() if how == "view" or not views_only)
        return ids[i % len(ids)] if ids else None

    @precondition(lambda self: self.s.tensors and len(self.s.tensors) < MAX_TENSORS)
    @rule(i=index, kind=derivation)
    def derive(self, i: int, kind: str) -> None:
        """Derive a tensor from a live one (the view or a derived one): it keeps the view in use."""
        t = self.pick_tensor(i)
        assert t is not None
        self.s.derive(t, kind)

    @precondition(lambda self: self.s.tensors)
    @rule(i=index)
    def drop_tensor(self, i: int) -> None:
        """Drop a view or a derived tensor: the view's use ends with the last one reaching it."""
        t = self.pick_tensor(i)
        assert t is not None
        self.s.drop(t)

    @precondition(lambda self: "view" in self.s.derived.values() and len(self.s.tensors) < MAX_TENSORS)
    @rule(i=index, kind=derivation)
    def drop_view_keep_derived(self, i: int, kind: str) -> None:
        """Derive a tensor from a view, then drop the view: the derived one keeps it in use."""
        t = self.pick_tensor(i, views_only=True)
        assert t is not None
        self.s.derive(t, kind)
        self.s.drop(t)

    @precondition(lambda self: len(self.s.tensors) < MAX_TENSORS)
    @rule(handle=handles, off=index, n=index, kind=derivation, restart=st.booleans(), fails=fault)
    def free_while_derived_pins(
        self, handle: DeviceHandle, off: int, n: int, kind: str, restart: bool, fails: bool
    ) -> None:
        """A view whose only live tensor is a derived one when the allocation is freed (or the
        worker restarts): the release is deferred while it lives (the fake refuses a free of
        memory a tensor reaches); dropping it releases the memory on the next bridge call (a
        release that may be made to fail: reported by that poll)."""
        t = self.s.wrap(handle, *self.view_range(handle, off, n, aligned=True))
        if t is None:
            return
        d = self.s.derive(t, kind)
        self.s.drop(t)
        self.s.check()
        if restart:
            self.restart()
        else:
            self.free(handle)
        self.arm_free_fault(fails)
        self.s.check()
        self.s.drop(d)

    # ------------------------------------------------------------ completions

    @precondition(lambda self: self.s.submitted())
    @rule(i=index, failed=fault)
    def complete(self, i: int, failed: bool) -> None:
        """The backend completes (or fails) any submitted event, in any order; held-back ones
        are submitted by the bridge when the last use they follow ends (ORDER-1)."""
        submitted = self.s.submitted()
        self.s.complete(submitted[i % len(submitted)], failed)

    @precondition(lambda self: self.s.submitted() and not self.s.fake.in_order)
    @rule(i=index)
    def complete_while_busy(self, i: int) -> None:
        """The backend reports a completion while another thread's call holds the bridge's lock:
        the next call applies it."""
        submitted = self.s.submitted()
        self.s.complete_while_busy(submitted[i % len(submitted)])

    @precondition(lambda self: self.s.submitted() and not self.s.fake.in_order)
    @rule(i=index)
    def poll_finds(self, i: int) -> None:
        """A completion the backend cannot report is found by poll(); what its end launches the
        idle device finishes at once, and the poll ends each use once."""
        submitted = self.s.submitted()
        self.s.poll_finds(submitted[i % len(submitted)])

    @precondition(lambda self: self.s.submitted())
    @rule(i=index, via_poll=st.booleans())
    def query_fails(self, i: int, via_poll: bool) -> None:
        """The backend's query of a submitted event fails: the event fails (or is aborted). Through
        event.done() on any of them, or through poll(), which queries the oldest first."""
        submitted = self.s.submitted()
        self.s.query_fails(submitted[0] if via_poll else submitted[i % len(submitted)], via_poll)

    @precondition(lambda self: self.s.submitted())
    @rule(i=index)
    def wait_fails(self, i: int) -> None:
        """The backend's wait on a submitted event fails: wait raises the event's error."""
        submitted = self.s.submitted()
        self.s.wait_fails(submitted[i % len(submitted)])

    @precondition(lambda self: self.s.pending)
    @rule(i=index)
    def wait_runs_the_chain(self, i: int) -> None:
        """wait() on any pending event, held back or not: the fake's wait runs the work waited
        for, oldest first, so every use it follows ends before it does (ORDER-1)."""
        self.s.wait(sorted(self.s.pending)[i % len(self.s.pending)])

    @precondition(lambda self: self.s.pending)
    @rule(i=index)
    def wait_times_out(self, i: int) -> None:
        """wait(timeout=0) on a pending event: WaitTimeoutError (WAIT-1), a TimeoutError, nothing changes."""
        self.s.wait_times_out(sorted(self.s.pending)[i % len(self.s.pending)])

    @rule()
    def poll(self) -> None:
        """Completions arrive by callback and views are drained at once, so poll finishes nothing;
        it reports deferred backend frees that failed since the last poll (FREE-3)."""
        self.s.poll(0)

    # ------------------------------------------------------------ bad calls

    @rule(handle=handles, op=st.sampled_from(["free_device", "compute", "state", "wrap_for_tinygrad"]))
    def foreign_handle(self, handle: DeviceHandle, op: str) -> None:
        forged = DeviceHandle(handle.id, handle.generation, handle.extent, handle.spec, owner=-1)
        args = (forged, TensorViewSpec((1,), "uint8")) if op == "wrap_for_tinygrad" else (forged,)
        self.s.expect(Reject(InvalidHandleError.__name__, "HANDLE-1"), self.s.act(self.s.bridge, op, *args))

    @rule(handle=handles, src=reservations, extra=st.integers(1, 8))
    def mismatched_copy(self, handle: DeviceHandle, src: HostRange, extra: int) -> None:
        assume(src.nbytes + extra <= handle.extent)
        dst = DeviceRange(handle, 0, src.nbytes + extra)
        self.s.expect(Reject(RangeError.__name__, "H2D-1"), self.s.act(self.s.bridge, "host_to_device", src, dst))

    @rule(handle=handles, over=st.integers(1, 4))
    def out_of_bounds(self, handle: DeviceHandle, over: int) -> None:
        self.s.expect(
            Reject(RangeError.__name__, "RANGE-1"), self.s.act(DeviceRange, None, handle, 0, handle.extent + over)
        )

    @rule(handle=handles, over=st.integers(1, 4), off=st.sampled_from([0, 0, 1, 4, 8, 12, 16]))
    def invalid_view(self, handle: DeviceHandle, over: int, off: int) -> None:
        """A view past the extent, maybe at an unaligned offset too: VIEW-2 (the model says
        USE-1 or GEN-2 first for a dead allocation)."""
        assert self.s.wrap(handle, off, handle.extent + over - off if off < handle.extent else over) is None

    @precondition(lambda self: self.s.handles)
    @rule(h=index, t=index, event=st.sampled_from(["copy_end", "compute_end", "restart"]))
    def raw_event(self, h: int, t: int, event: str) -> None:
        """Drive the core directly with an event no bridge call would send now: an end
        for a kind of use not in flight (EVENT-1), or a restart of an allocation whose
        record is gone (freed and stale stay dead). Picks among the handles where it applies."""
        model = self.s.model
        if event == "restart":
            dead = [x for x in self.s.handles if model.state(x.id) in ("freed", "stale")]
            if dead:
                handle = dead[h % len(dead)]
                state = model.state(handle.id)
                self.s.expect(None, self.fire(handle, event))
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
            self.s.expect(Reject(LifecycleError.__name__, "EVENT-1"), self.fire(handle, event))

    # ------------------------------------------------------------ invariants

    # One @invariant per spec invariant, so that a failure names the invariant it broke. Hypothesis
    # runs a machine's invariants sorted by name: the numbers keep the spec's order.

    @invariant()
    def inv0_steps(self) -> None:  # not a check: counts the steps for the coverage report
        COVERAGE.steps += 1

    inv1_counts = checks("inv1_counts", "INV-COUNTS")
    inv2_no_free_in_use = checks("inv2_no_free_in_use", "INV-NO-FREE-IN-USE")
    inv3_free_once = checks("inv3_free_once", "INV-FREE-ONCE")
    inv4_cursor = checks("inv4_cursor", "INV-CURSOR")
    inv5_output = checks("inv5_output", "INV-OUTPUT")
    inv6_exact = checks("inv6_exact", "INV-EXACT")
    inv7_generation = checks("inv7_generation", "INV-GENERATION")
    inv8_quiescent = checks("inv8_quiescent", "INV-QUIESCENT")


class InOrderBridgeMachine(BridgeMachine):
    """The same machine over one in-order queue (`FakeBackend(in_order=True)`, as a CL queue or a
    CUDA stream): completing or waiting for an event ends what is ahead of it, and a synchronous
    copy runs after what is ahead; the model learns of what the queue ran ahead as the Bridge does.
    Its coverage is its own (the any-order run must reach the spec's candidates by itself)."""

    def __init__(self) -> None:
        super().__init__()
        scratch = Coverage(default_table())
        self.s = Lockstep(
            RING, observer=scratch.record, edges=scratch.record_edge, refusals=scratch.refusals, in_order=True
        )
