"""The Bridge: the lifecycle core plus a backend, in the calls a worker makes.

Every public call follows one pattern: validate everything (types, ranges,
the core's `check`, the ring's checks) without changing anything, then make
the backend call, then record what happened in the core and the ring. So a
rejected call changes nothing and makes no backend call, and a backend
failure at submission changes nothing either.

The core decides, the Bridge executes. It is one class, built with the core
and its `Engine` (devbridge.bridge.engine: the core's runner over the backend,
which carries out the core's effects and serves the events). This module holds
every public call, in sections: allocation, copies, compute and views,
completions and generations, waits on many events, what it says about itself;
then a copy's one path and the resolution of what a caller hands in.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import secrets
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from typing import IO, TYPE_CHECKING, Any, TypeVar

from devbridge.args import as_count, as_seconds, flag
from devbridge.backends.base import Backend, BackendError
from devbridge.bridge import aio, hostcheck, transfer
from devbridge.bridge.engine import POLL_S, Engine, holder, log
from devbridge.bridge.events import ComputeEvent, CopyEvent, Event, deadline, wait_done
from devbridge.bridge.memory import MemoryStats
from devbridge.bridge.stats import COUNTED, Pins, Stats
from devbridge.bridge.trace import BridgeTrace, Trace
from devbridge.errors import (
    BackendFailureError,
    BridgeError,
    DeviceAllocationError,
    DeviceFreeError,
    InvalidArgumentError,
    InvalidHandleError,
    InvalidSpecError,
    InvalidViewError,
    RangeError,
    WaitTimeoutError,
    short,
)
from devbridge.ring.host import HostRange, HostRing, altered, own_range
from devbridge.statemachine.core import Allocation, Composite, InFlight, LifecycleCore
from devbridge.statemachine.status import OK, Status
from devbridge.types import (
    MAX_EXTENT,
    DeviceHandle,
    DeviceRange,
    ObjectSpec,
    TensorViewSpec,
)

if TYPE_CHECKING:
    import numpy as np
    from tinygrad.tensor import Tensor

__all__ = ["POLL_S", "Bridge", "log"]

_owners = itertools.count(1)


#: What a call that returns an event returns once it is not blocked.
Done = TypeVar("Done", CopyEvent, ComputeEvent)


@dataclasses.dataclass(frozen=True, slots=True)
class Blocked:
    """A synchronous call must first wait for `event`, a use in flight it follows (ORDER-1)."""

    event: Event


def checked_view(view: TensorViewSpec) -> TensorViewSpec:
    """`view` as its own checks make it, each field read once: one whose fields were altered
    past those checks (`object.__setattr__` on a frozen view) gets VIEW-2 like any bad view."""
    try:
        shape, dtype, offset = view.shape, view.dtype, view.offset
    except AttributeError:
        raise InvalidViewError("VIEW-2", f"{short(view)} is not a whole TensorViewSpec") from None
    return TensorViewSpec(shape, dtype, offset)


class Bridge:
    """One device's bridge: allocations on the lifecycle of spec/lifecycle.toml, copies
    between HostRing ranges and device ranges, compute and zero-copy tinygrad views, over a
    Backend. Every call resolves its handles to the bridge's own records and asks the
    lifecycle core first; a refused call raises the rule's error, changes nothing and makes
    no backend call. A free, or a restart's release, waits for the uses of the memory.
    Thread-safe: calls are serialised; completions may arrive on any thread."""

    def __init__(
        self,
        backend: Backend,
        *,
        pending_warning_s: float = 60.0,
        trace: str | os.PathLike[str] | IO[str] | Trace | None = None,
        check_host_bytes: bool | None = None,
    ) -> None:
        """A bridge over `backend` (any object with the Backend protocol's methods).

        Args:
            backend: the device's backend, opened (`TinygradBackend("CL")`, `FakeBackend()`...).
            pending_warning_s: seconds after which a free or restart still waiting for uses to
                end is logged once (logger `devbridge`, WARNING) with what pins it (PIN-1).
            trace: where to write a timeline of every allocation's life (devbridge.bridge.trace): a
                path, a text file, or a `Trace` several bridges share; None (the default): none.
                A trace the bridge opened is ended by `close_trace()` (or when the bridge is
                collected).
            check_host_bytes: the host-bytes checking mode (devbridge.bridge.hostcheck): every
                copy's host bytes are fingerprinted when the call hands them over and when the
                copy completes (an output's: when it completes and when the worker first reads,
                commits or releases them), and a change fails the copy (HostBytesChangedError,
                H2D-3 or D2H-3). None (the default): on when the environment variable
                DEVBRIDGE_CHECK_HOST_BYTES is "1". Off, it costs nothing per call.

        Raises:
            InvalidArgumentError: ARG-1, for anything but a Backend, seconds >= 0, or a trace
                target that is not a path, a text file or a Trace.
            BackendFailureError: FAULT-1, when the backend refuses to start (nothing is kept)."""
        if isinstance(backend, type) or not isinstance(backend, Backend):
            raise InvalidArgumentError("ARG-1", f"Bridge needs a Backend, got {short(backend)}")
        self.pending_warning_s = as_seconds(pending_warning_s, "pending_warning_s")
        checking = hostcheck.wanted(check_host_bytes)
        self._core = LifecycleCore()
        self._records = self._core.records  # (the core's own, read per call)
        self._engine = engine = Engine(backend, self._core)  # what executes the core's decisions
        # the engine's parts this bridge's calls use directly (the same objects)
        self._backend, self._lock, self._counts, self._memory = backend, engine.lock, engine.counts, engine.memory
        self._watcher = engine.watcher
        if checking:
            engine.host_check = hostcheck.HostBytesCheck(engine.counts, engine.fault)
        self._owner = next(_owners)
        self._secret = secrets.randbits(64)  # seals the handles this bridge issues
        # the traffic, counted apart from `_counts`: once or twice on every copy
        self._copies_in = self._bytes_in = self._copies_out = self._bytes_out = 0
        self._staging = transfer.Staging()  # host bytes of uploads and downloads given no ring
        self._anchors: weakref.WeakValueDictionary[int, object] = weakref.WeakValueDictionary()  # view use -> anchor
        self._trace: BridgeTrace | None = None  # this bridge's tracks of a timeline, when tracing (the engine's too)
        # a path or a file is opened here, before any backend call: anything else is ARG-1
        self._own_trace = None if trace is None or isinstance(trace, Trace) else Trace(trace)
        try:
            backend.begin_generation(0)
            backend.subscribe(engine.on_complete)
        except BackendError as e:
            if self._own_trace is not None:
                self._own_trace.close()
            raise BackendFailureError("FAULT-1", f"backend {short(backend)} refused a new bridge: {e}") from e
        if trace is not None:
            shared = self._own_trace or trace
            assert isinstance(shared, Trace)
            label = f"bridge #{self._owner} ({getattr(backend, 'name', short(backend))})"
            tracks = shared.bridge(self._owner, label, self._core.table.terminal)
            self._trace = engine.trace = self._core.tracer = tracks
            self._memory.observer = self._trace.memory
            if self._own_trace is not None:
                weakref.finalize(self, self._own_trace.close)

    def close_trace(self) -> None:
        """End the trace this bridge opened (`trace=` a path or a file): what is still open
        (live allocations' states, uses in flight) ends now, then the file's JSON array. A
        shared `Trace` is its owner's to close. Tracing stops; idempotent. Never raises."""
        with self._lock:
            tracks, owned = self._trace, self._own_trace
            self._trace = self._engine.trace = self._core.tracer = self._memory.observer = None
            self._own_trace = None
        if tracks is not None and owned is None:
            tracks.end_all()
        if owned is not None:
            owned.close()

    # ------------------------------------------------------------ allocation

    @property
    def generation(self) -> int:
        """The current generation: 0, then +1 per `restart()` (GEN-1)."""
        return self._core.generation

    def alloc_device(self, spec: ObjectSpec, extent: int) -> DeviceHandle:
        """Allocate `extent` bytes for an object of `spec` in the current generation.

        Args:
            spec: what the allocation holds (name, dtype, role, optional view).
            extent: bytes, a positive whole number of `spec.dtype` items (ALLOC-1).

        Returns:
            The handle: a capability this bridge issued, valid until freed or restarted.

        Raises:
            InvalidSpecError: SPEC-1, for a spec that is not an ObjectSpec.
            RangeError: ALLOC-1, for an extent that is not a positive whole number of items
                (no backend call).
            DeviceAllocationError: ALLOC-2, when the backend cannot allocate (nothing leaked)."""
        self._lock.acquire()  # (not `with`: half its cost, on the per-call path)
        try:
            if self._core.unapplied or self._core.collected:  # what arrived while no call ran, first
                self._engine.drain()
            if type(spec) is not ObjectSpec:
                raise InvalidSpecError("SPEC-1", f"alloc_device needs an ObjectSpec, got {short(spec)}")
            size = extent if type(extent) is int else as_count(extent)
            if size is None or not 0 < size <= MAX_EXTENT:
                raise RangeError("ALLOC-1", f"extent must be an int in [1, 2**48], got {short(extent)}")
            if size % spec.itemsize:
                raise RangeError("ALLOC-1", f"extent {size} is not a whole number of {spec.dtype} items")
            try:
                memory = self._backend.alloc(size, spec.dtype)
            except BackendError as e:
                self._counts["alloc_failures"] += 1
                if self._trace is not None:
                    self._trace.fault(f"alloc of {size} B for {spec.name}")
                raise DeviceAllocationError("ALLOC-2", f"allocating {size} B for {spec.name}: {e}") from e
            record = self._core.add(size, spec, memory)
            self._counts["allocs"] += 1
            self._memory.allocated(spec.role, size)
            seal = self._seal(record.id, record.generation, size, spec)
            handle = DeviceHandle(record.id, record.generation, size, spec, self._owner, seal)
            record.handle = handle
            return handle
        finally:
            self._lock.release()

    def free_device(self, handle: DeviceHandle) -> None:
        """Free the allocation: now, or as soon as no copy, compute or view uses it (FREE-1).
        The handle is dead on return either way (USE-1).

        Args:
            handle: a live handle this bridge issued.

        Raises:
            InvalidHandleError: HANDLE-1, for a handle this bridge did not issue.
            StaleHandleError: GEN-2, for a handle of an older generation.
            InvalidHandleError: FREE-2, for a handle already freed.
            DeviceFreeError: FREE-3, when the backend fails to free now (reported once, never
                retried; the handle is dead anyway)."""
        self._lock.acquire()  # (not `with`: half its cost, on the per-call path)
        try:
            if self._core.unapplied or self._core.collected:  # what arrived while no call ran, first
                self._engine.drain()
            key, _ = self._resolve(handle)
            record = self._core.free(*key, time.monotonic())
            if record is None:
                self._counts["deferred_frees"] += 1
            elif failure := self._engine.free(record):
                raise DeviceFreeError("FREE-3", failure)
        finally:
            self._lock.release()

    # ------------------------------------------------------------ copies

    def host_to_device(self, src: HostRange, dst: DeviceRange, *, sync: bool = True, release: bool = True) -> CopyEvent:
        """Copy exactly `src` into exactly `dst` (H2D-1), after every earlier use of
        those device bytes (ORDER-1).

        Args:
            src: a reserved, unreleased host range (RING-3); its length is `dst`'s.
            dst: a range of a live allocation.
            sync: True: return once the copy is done and its host bytes read (H2D-2);
                False: return at once with a pending event (H2D-3).
            release: True: the bridge releases the host bytes when the copy is done (on return
                when sync, when the event completes when async), never after a failure. False:
                they are only safe to release then, and the worker releases them itself (a
                worker that must survive restarts keeps its inputs until delivered).

        Returns:
            The copy's event: done on return when sync.

        Raises:
            RangeError: RANGE-1 / RING-3, for a bad or mismatched range (no backend call).
            InvalidHandleError: HANDLE-1 (not this bridge's handle), USE-1 (freed).
            StaleHandleError: GEN-2, for a handle of an older generation.
            InvalidArgumentError: ARG-1, for sync or release other than a bool.
            OrderingError: ORDER-2, for a sync copy that would wait on an open compute block.
            DeviceCopyError: COPY-F, when the copy fails (a sync one raises; an async one's
                event carries it)."""
        if type(sync) is not bool or type(release) is not bool:  # (one test on the per-call path)
            flag("sync", sync)
            flag("release", release)
        event = self._copy("copy_in", src, dst, src, dst, sync, not release)
        if isinstance(event, Blocked):  # behind uses in flight: wait for them, then again
            return self._unblocked(event, lambda: self._copy("copy_in", src, dst, src, dst, sync, not release))
        return event

    def device_to_host(self, src: DeviceRange, dst: HostRange, *, sync: bool = True) -> CopyEvent:
        """Copy exactly `src` into exactly `dst` (D2H-1), after every earlier use that
        writes those device bytes (ORDER-1).

        Args:
            src: a range of a live allocation.
            dst: a reserved, unreleased host range of the same length (RING-3), not read by a
                pending input copy (D2H-3).
            sync: True: return with the host bytes valid (D2H-2); False: return at once, the
                bytes valid when the event completes (D2H-3).

        Returns:
            The copy's event: done on return when sync. A failed output range is never
            readable.

        Raises:
            RangeError: RANGE-1 / RING-3, for a bad or mismatched range (no backend call).
            InvalidHandleError: HANDLE-1 (not this bridge's handle), USE-1 (freed).
            StaleHandleError: GEN-2, for a handle of an older generation.
            InvalidArgumentError: ARG-1, for sync other than a bool.
            OrderingError: ORDER-2, for a sync copy that would wait on an open compute block.
            OutputCopyError: COPY-F, when the copy fails (a sync one raises; an async one's
                event carries it)."""
        if type(sync) is not bool:  # (one test on the per-call path)
            flag("sync", sync)
        event = self._copy("copy_out", dst, src, src, dst, sync, False)
        if isinstance(event, Blocked):  # behind uses in flight: wait for them, then again
            return self._unblocked(event, lambda: self._copy("copy_out", dst, src, src, dst, sync, False))
        return event

    def upload(
        self, handle: DeviceHandle, array: Any, *, offset: int = 0, ring: HostRing | None = None, sync: bool = True
    ) -> CopyEvent:
        """Copy the bytes of `array` into the allocation at `offset`: reserve host bytes, fill
        them, `host_to_device` them, in one call.

        Args:
            handle: a live allocation of this bridge.
            array: any C-contiguous buffer (a numpy array of any dtype, bytes, a memoryview).
            offset: where in the allocation, in bytes.
            ring: the HostRing to reserve the host bytes in; None: the bridge's own (a small
                staging ring for synchronous uploads, host memory of the copy's own otherwise).
            sync: as `host_to_device`'s: True returns once the copy is done.

        Returns:
            The copy's event. Its host bytes are released when it completes; after a failure
            they stay reserved in a ring of the caller's, as `host_to_device`'s do (COPY-F).

        Raises:
            InvalidArgumentError: ARG-1, for an array that is not a C-contiguous buffer or a
                sync other than a bool.
            RangeError: RANGE-1, for a range that does not fit the allocation or a ring that is
                not a HostRing. The errors of `host_to_device` and `HostRing.reserve`.
        A call refused before its copy (a bad argument, handle or range) reserves nothing."""
        return transfer.upload(self, self._staging, handle, array, offset, ring, sync)

    def download(
        self, handle: DeviceHandle, dtype: Any, shape: Any, *, offset: int = 0, ring: HostRing | None = None
    ) -> np.ndarray:
        """A numpy array of `dtype` and `shape` read from the allocation at `offset`: reserve host
        bytes, `device_to_host` them (synchronously), copy them out, release them.

        Args:
            handle: a live allocation of this bridge.
            dtype: anything numpy takes as a dtype of fixed-size items.
            shape: an int or a sequence of ints.
            offset: where in the allocation, in bytes.
            ring: the HostRing to reserve the host bytes in; None: the bridge's own.

        Returns:
            A new array the caller owns (the host bytes are released before it returns).

        Raises:
            InvalidArgumentError: ARG-1, for a dtype or shape numpy refuses.
            RangeError: RANGE-1, for a range that does not fit the allocation or a ring that is
                not a HostRing. The errors of `device_to_host` and `HostRing.reserve`.
        A call refused before its copy (a bad argument, handle or range) reserves nothing."""
        return transfer.download(self, self._staging, handle, dtype, shape, offset, ring)

    # ------------------------------------------------------------ compute and views

    def compute(self, *handles: DeviceHandle) -> ComputeEvent:
        """Mark `handles` in use by compute until the returned event completes. The copies in
        flight on them are waited for first (ORDER-1): the compute sees every byte they write,
        and none it writes reaches a copy issued before it.

        Args:
            *handles: live handles of this bridge (none: a marker that orders nothing).

        Returns:
            A ComputeEvent; as a context manager (`with bridge.compute(x, y):`), the block's
            tinygrad work is what it covers, done when the event is.

        Raises:
            InvalidHandleError: HANDLE-1 (not this bridge's handle), USE-1 (freed).
            StaleHandleError: GEN-2, for a handle of an older generation.
            OrderingError: ORDER-2, when a copy it must wait for would wait on an open block.
            ComputeError: COMPUTE-F, when the backend cannot mark the compute."""
        event = self._compute(handles)
        if isinstance(event, Blocked):  # behind copies in flight: wait for them, then again
            return self._unblocked(event, lambda: self._compute(handles))
        return event

    def wrap_for_tinygrad(self, handle: DeviceHandle, view: TensorViewSpec) -> Tensor:
        """A zero-copy tinygrad Tensor over the allocation (VIEW-1). While it, or
        anything derived from it, can reach the memory, the allocation is in use by compute
        (VIEW-3): freeing it is deferred until the Tensor is collected.

        Args:
            handle: a live handle of this bridge.
            view: the tensor to see: shape, dtype and byte offset inside the allocation.

        Returns:
            A tinygrad Tensor sharing the allocation's memory.

        Raises:
            InvalidViewError: VIEW-2, for a shape, dtype or offset outside the allocation or
                not aligned (nothing changes).
            InvalidHandleError: HANDLE-1 (not this bridge's handle), USE-1 (freed).
            StaleHandleError: GEN-2, for a handle of an older generation."""
        with self._lock:
            self._engine.drain()
            key, record = self._resolve(handle)
            self._core.check([key], "compute_begin")
            if record is None:  # the check refuses a dead allocation; should it not, still no crash
                raise self._core.dead(*key, "compute_begin")
            if type(view) is not TensorViewSpec:
                raise InvalidViewError("VIEW-2", f"wrap_for_tinygrad needs a TensorViewSpec, got {short(view)}")
            view = checked_view(view)
            spec = record.spec
            if view.dtype != spec.dtype:
                raise InvalidViewError("VIEW-2", f"view dtype {view.dtype} is not {spec.name}'s {spec.dtype}")
            if spec.view is not None and view != spec.view:
                raise InvalidViewError("VIEW-2", f"role {spec.role} uses {spec.view}, not {view}")
            if view.offset + view.nbytes > record.extent:
                raise InvalidViewError(
                    "VIEW-2",
                    f"view [{view.offset}, {view.offset + view.nbytes}) exceeds extent {record.extent}",
                )
            alignment = self._backend.view_alignment(view.dtype)
            if alignment == 0 and view.offset:
                raise InvalidViewError(
                    "VIEW-2", f"view offset {view.offset}: the device has no sub-buffer views, only offset 0"
                )
            if alignment and view.offset % alignment:
                raise InvalidViewError(
                    "VIEW-2", f"view offset {view.offset} is not a multiple of {alignment} B, which the device needs"
                )
            try:
                tensor: Tensor = self._backend.view(record.memory, view.offset, view.shape, view.dtype)
                anchor = self._backend.view_anchor(tensor)
            except BackendError as e:
                raise InvalidViewError("VIEW-1", f"backend could not view {spec.name}: {e}") from e
            use = self._core.begin("view", [key])
            # in use while any tinygrad object can reach the memory, not just this Tensor (VIEW-3)
            weakref.finalize(anchor, self._core.view_gone, use.id)
            self._anchors[use.id] = anchor  # (weakly: for pins' census of what holds it)
            self._counts["views"] += 1
            return tensor

    # ------------------------------------------------------------ completions and generations

    def poll(self) -> int:
        """Apply every use the backend has finished, then report deferred backend frees that
        failed since the last poll.

        Returns:
            How many uses were applied.

        Raises:
            DeviceFreeError: FREE-3, naming each deferred free that failed (once each)."""
        with self._lock:
            finished = self._engine.poll()
            self._engine.warn_long_waits(self.pending_warning_s)
            if failures := self._engine.release_failures:
                self._engine.release_failures = []
                raise DeviceFreeError("FREE-3", "; ".join(failures))
            return finished

    def restart(self) -> None:
        """Begin a new generation (GEN-1). Every prior handle and in-flight event is
        invalidated; old memory is released now if unused, else when the backend is done with
        it (and no view can reach it).

        Raises:
            DeviceFreeError: FREE-3 / FAULT-1, once every old buffer had its release, naming
                the backend failures (the new generation has begun anyway)."""
        with self._lock:
            self._engine.drain()
            releases = self._core.restart(time.monotonic())  # the rest wait for their uses (PIN-1)
            self._counts["restarts"] += 1
            failures: list[str] = []
            try:
                self._backend.begin_generation(self._core.generation)
            except BackendError as e:
                failures.append(f"beginning generation {self._core.generation}: {e}")
            generation_failed = bool(failures)
            failures += [failure for record in releases if (failure := self._engine.free(record))]
            if generation_failed:
                raise BackendFailureError("FAULT-1", "; ".join(failures))
            if failures:
                raise DeviceFreeError("FREE-3", "; ".join(failures))

    # ------------------------------------------------------------ waits on many events

    def wait_all(self, events: Iterable[Event], timeout: float | None = None) -> None:
        """Block until every one of `events` is done; failures stay with their events
        (`event.error`).

        Args:
            events: an iterable of this bridge's events.
            timeout: seconds >= 0, or None to wait as long as it takes.

        Raises:
            InvalidArgumentError: ARG-1, for anything but this bridge's events, or a bad timeout.
            WaitTimeoutError: WAIT-1, once `timeout` seconds pass (a TimeoutError)."""
        ends = deadline(timeout)
        for event in self._own_events(events, "wait_all"):
            wait_done(event, ends, timeout)

    def wait_any(self, events: Iterable[Event], timeout: float | None = None) -> Event:
        """The first of `events` found done (in the order given), blocking until one is. It
        sleeps on a condition that every completion the backend reports wakes; tokens a backend
        cannot report (a device marker) are queried again at most every POLL_S seconds.

        Args:
            events: an iterable of this bridge's events, at least one.
            timeout: seconds >= 0, or None to wait as long as it takes.

        Returns:
            The first done event.

        On a backend whose `wait` runs the work it waits for (`waits_run_work`: the fake, by
        default), it waits on the first event not done, as `Event.wait` does: the rule that
        `Event.wait`, `wait_all` and `wait_any` share.

        Raises:
            InvalidArgumentError: ARG-1, for no events, another bridge's, or a bad timeout.
            WaitTimeoutError: WAIT-1, once `timeout` seconds pass (a TimeoutError)."""
        ends = deadline(timeout)
        pending = self._own_events(events, "wait_any")
        if not pending:
            raise InvalidArgumentError("ARG-1", "wait_any needs at least one event")
        drive = self._watcher.drives
        while True:
            with self._engine.progress:
                seen = self._engine.completions
            for event in pending:
                if event.done():
                    return event
            remaining = None if ends is None else ends - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise WaitTimeoutError("WAIT-1", f"none of {len(pending)} events done after {timeout} s")
            # the backend runs what it is waited on: wait as Event.wait would (an open compute
            # block's event is not submitted yet: waiting on it is its block's to declare)
            first = next((e for e in pending if not getattr(e, "open", False)), None) if drive else None
            if first is not None:
                self._engine.drive(first)
                if first.done():
                    return first
            with self._engine.progress:
                if self._engine.completions == seen:
                    self._engine.progress.wait(POLL_S if remaining is None else min(remaining, POLL_S))

    async def wait_any_async(self, events: Iterable[Event], timeout: float | None = None) -> Event:
        """`wait_any` for asyncio: the first of `events` found done, in the order given. The
        loop is never blocked: the bridge's one watcher thread settles awaited events.

        Raises:
            InvalidArgumentError: ARG-1, for no events, another bridge's, or a bad timeout.
            WaitTimeoutError: WAIT-1, once `timeout` seconds pass (a TimeoutError)."""
        deadline(timeout)
        pending = self._own_events(events, "wait_any_async")
        if not pending:
            raise InvalidArgumentError("ARG-1", "wait_any_async needs at least one event")
        return await aio.wait_any(self._watcher, pending, None if timeout is None else float(timeout))

    async def wait_all_async(self, events: Iterable[Event], timeout: float | None = None) -> None:
        """`wait_all` for asyncio: every one of `events` done; failures stay with their events.

        Raises:
            InvalidArgumentError: ARG-1, for anything but this bridge's events, or a bad timeout.
            WaitTimeoutError: WAIT-1, once `timeout` seconds pass (a TimeoutError)."""
        deadline(timeout)
        pending = self._own_events(events, "wait_all_async")
        await aio.wait_all(self._watcher, pending, None if timeout is None else float(timeout))

    def _own_events(self, events: object, call: str) -> list[Event]:
        """`events` as a list of this bridge's events (ARG-1 otherwise)."""
        if isinstance(events, str | bytes | Event) or not isinstance(events, Iterable):
            raise InvalidArgumentError("ARG-1", f"{call} needs an iterable of events, got {short(events)}")
        found: list[Event] = []
        try:
            for event in events:
                if not self._engine.owns(event):
                    raise InvalidArgumentError("ARG-1", f"{call}: {short(event)} is not an event of this bridge")
                found.append(event)
        except InvalidArgumentError:
            raise
        except Exception as e:  # an iterable that fails as it is read
            raise InvalidArgumentError("ARG-1", f"{call}: reading {short(events)} failed: {short(e)}") from e
        return found

    # ------------------------------------------------------------ what it says about itself

    def pins(self, handle: DeviceHandle, *, holders: bool = False) -> Pins:
        """What keeps the allocation in use (PIN-1): its state, its uses in flight by kind
        (input and output copies, compute events, live views: a view counts while any tinygrad
        object can reach its memory) and each of them by name (`uses`: kind, use_id, byte
        range, the uses a held copy waits for, an open compute block), and how long a deferred
        release has waited.

        Args:
            handle: a handle this bridge issued (freed or of an old generation included).
            holders: also say what still reaches the views' memory, by kind: tensors that are
                the views themselves, tensors derived from them, gradients, TinyJit captures
                (a census of tinygrad's live objects: for diagnosis, not a hot path). Only a
                backend that can tell fills it (tinygrad's); otherwise it stays empty.

        Returns:
            A `Pins` (devbridge.bridge.stats), field by field.

        Raises:
            InvalidHandleError: HANDLE-1, for a handle this bridge did not issue.
            InvalidArgumentError: ARG-1, for holders other than a bool.
            BackendFailureError: FAULT-1, when the backend cannot make the census."""
        census = flag("holders", holders) and callable(getattr(self._backend, "holders", None))
        with self._lock:
            self._engine.drain()
            key, _ = self._resolve(handle)
            uses = self._core.dependents(key[0])
            kinds = Counter(use.kind for use in uses)
            anchors = [a for u in uses if u.kind == "view" and (a := self._anchors.get(u.id)) is not None]
            pins = Pins(
                state=self._core.state(*key),
                copies_in=kinds["copy_in"],
                copies_out=kinds["copy_out"],
                computes=kinds["compute"],
                views=kinds["view"],
                waiting_s=self._core.waited(key[0], time.monotonic()),
                uses=tuple(holder(use) for use in sorted(uses, key=lambda use: use.id)),
            )
        if not census:
            return pins
        total: Counter[str] = Counter()
        for anchor in anchors:  # without the lock: a census walks every live tensor
            try:
                total.update(self._backend.holders(anchor))  # type: ignore[attr-defined]
            except BackendError as e:
                raise BackendFailureError("FAULT-1", f"{short(handle)}: {e}") from e
        return dataclasses.replace(pins, holders=dict(total))

    def state(self, handle: DeviceHandle) -> str:
        """The allocation's lifecycle state, a state name of the spec.

        Args:
            handle: a handle this bridge issued (freed or of an old generation included).

        Raises:
            InvalidHandleError: HANDLE-1, for a handle this bridge did not issue."""
        with self._lock:
            self._engine.drain()
            key, _ = self._resolve(handle)
            return self._core.state(*key)

    def stats(self) -> Stats:
        """The bridge's counters and what is live now: a `Stats` (devbridge.bridge.stats), field by
        field. Never raises."""
        with self._lock:
            self._engine.drain()
            live = list(self._core.allocations())
            traffic = {
                "copies_in": self._copies_in,
                "bytes_in": self._bytes_in,
                "copies_out": self._copies_out,
                "bytes_out": self._bytes_out,
            }
            counts = {name: traffic.get(name, self._counts[name]) for name in COUNTED}
            return Stats(
                generation=self._core.generation,
                live_allocations=len(live),
                live_bytes=sum(r.extent for r in live),
                pending_events=sum(1 for use in self._core.inflight() if use.event is not None),
                inflight_uses=sum(1 for _ in self._core.inflight()),
                **counts,
            )

    def memory_stats(self) -> MemoryStats:
        """Device memory as this bridge holds it: bytes and allocations now, at the peak, and
        allocated and freed so far, in all and per role (the names of PyTorch's
        `memory_stats()` where the meaning is the same), with the deferred frees, the releases
        waiting for uses now and how long the oldest has waited, held copies, failed frees and
        restarts: a `MemoryStats` (devbridge.bridge.memory), field by field. Never raises. It applies
        nothing (unlike `stats()`): the memory it counts is what the backend holds right now."""
        with self._lock:
            return self._memory.stats(self._core.waits(time.monotonic()), self._counts)

    def reset_peak_stats(self) -> None:
        """Start the peaks of `memory_stats()` again from what is held now."""
        with self._lock:
            self._memory.reset_peak()

    # ------------------------------------------------------------ a copy's path, and what a caller hands in

    def _copy(
        self,
        kind: str,
        host: HostRange,
        device: DeviceRange,
        src: HostRange | DeviceRange,
        dst: HostRange | DeviceRange,
        sync: bool,
        keep_host: bool,
    ) -> CopyEvent | Blocked:
        """Either copy, `host` <-> `device` (`src` -> `dst` as the caller gave them): checked, then
        submitted now, held back behind the earlier uses it must follow (async, ORDER-1), or, when
        sync, Blocked on the first of them (the caller waits and tries again: `_unblocked`). One
        path for every copy: a synchronous one with nothing in flight on its allocation is the
        same path with no plan to make."""
        into_device = kind == "copy_in"
        core, engine = self._core, self._engine
        self._lock.acquire()  # (not `with`: half its cost, on the per-call path)
        try:
            if core.unapplied or core.collected:  # what arrived while no call ran, first
                engine.drain()
            if type(host) is not HostRange or type(host.start) is not int or type(host.nbytes) is not int:
                host = own_range(host)  # (RANGE-1, or a subclass's stored fields in a plain HostRange)
            ring = host.ring
            if type(ring) is not HostRing and not isinstance(ring, HostRing):
                raise altered(host)  # (a range built past its checks)
            record, step, offset, n = self._device_step(kind, device, host.nbytes, "H2D-1" if into_device else "D2H-1")
            counts = (record.state, record.copies, record.computes)  # what `step` was made for
            span = (offset, offset + n)
            ring.check_copy(host, into_device)
            check = engine.host_check  # (the checking mode: None when off)
            fingerprint = check.hand_over(host) if check is not None and into_device else None
            before: list[InFlight] | None = None
            if record.accesses:  # uses in flight touch its bytes: the ones this copy follows
                plan = core.plan(kind, [(record.id, record.generation)], span, sync)
                if plan.blocker is not None:  # a synchronous one waits for them, then checks again
                    return Blocked(plan.blocker.event)
                before = plan.before  # an asynchronous copy is held behind them (no token yet)
            token = None
            if not before:
                try:
                    token = engine.copy(kind, record.memory, offset, host, sync)
                except BackendError as e:
                    raise self._copy_failed(kind, host, src, dst, e) from e
                if fingerprint is not None:
                    self._checked(token, host, fingerprint, sync, hostcheck.copy_name(kind, record.id, span))
            if into_device:
                self._copies_in += 1
                self._bytes_in += host.nbytes
            else:
                self._copies_out += 1
                self._bytes_out += host.nbytes
            if sync or (status := self._first_status(token)) is OK:
                # done already: one composite step, nothing left in flight (H2D-2, D2H-2); made
                # again if a use of it ended during the call (a backend that reports this copy done
                # on the caller's thread applies what other threads reported meanwhile)
                if (record.state, record.copies, record.computes) != counts:
                    step = core.copy_step(record, kind)
                use_id = core.take(record, step)
                if self._trace is not None:
                    self._trace.instant(kind, record, host.nbytes)
                if into_device:
                    ring.read_done(host, not keep_host)
                else:
                    ring.write_done(host)
                    if check is not None:
                        check.guard_output(host, hostcheck.copy_name(kind, record.id, span))
                return CopyEvent(engine, use_id, token, True, src=src, dst=dst)
            use = core.begin(
                kind, [(record.id, record.generation)], host=host, keep_host=keep_host, span=span, before=before or []
            )
            if into_device:
                ring.begin_read(host)
                if check is not None and fingerprint is not None and token is None:  # held: checked once launched
                    check.hold(use.id, fingerprint, hostcheck.copy_name(kind, record.id, span))
            else:
                ring.begin_write(host)
            return self._submitted(use, CopyEvent(engine, use.id, token, src=src, dst=dst), status)
        finally:
            self._lock.release()

    def _compute(self, handles: tuple[DeviceHandle, ...]) -> ComputeEvent | Blocked:
        """A compute on `handles`, checked and marked on the backend, or Blocked on the first copy
        in flight it must follow (the caller waits and tries again: `_unblocked`)."""
        with self._lock:
            self._engine.drain()
            resolved = dict(self._resolve(h) for h in handles)  # one entry per allocation
            keys = list(resolved)
            self._core.check(keys, "compute_begin")
            if (plan := self._core.plan("compute", keys)).blocker is not None:
                return Blocked(plan.blocker.event)
            memories = [record.memory for record in resolved.values() if record is not None]
            try:
                token = self._backend.compute(memories)
            except BackendError as e:
                self._counts["compute_failures"] += 1
                raise self._core.failure("compute", f"compute on {[k[0] for k in keys]}: {e}") from e
            use = self._core.begin("compute", keys, before=[])
            self._counts["computes"] += 1
            event = ComputeEvent(self._engine, use.id, token, handles=handles)
            self._track(use, event)
            return event

    def _unblocked(self, blocked: Blocked, again: Callable[[], Done | Blocked]) -> Done:
        """The one wait of a synchronous call behind uses in flight (ORDER-1): wait for the use it
        is blocked on, outside the lock, then make the call `again` from its checks, as often as
        it takes."""
        outcome: Done | Blocked = blocked
        while isinstance(outcome, Blocked):
            self._engine.wait_for(outcome.event)
            outcome = again()
        return outcome

    def _device_step(
        self, kind: str, device: object, nbytes: int | None, rule: str
    ) -> tuple[Allocation, Composite, int, int]:
        """The one check of a copy's device side, and what the copy does there: the handle resolved
        to this bridge's record (HANDLE-1: the issued object itself in one lookup, or an exact copy
        of it), the range within the allocation's extent (RANGE-1) and as long as the host range
        (`nbytes`, `rule`: H2D-1, D2H-1), and the composite step the table made for a copy in the
        record's state and counts, or the rule that refuses it there (GEN-2, USE-1, ...); with the
        range's offset and size as checked (each field read once: the copy uses what was checked,
        whatever a subclass's property would say next). Changes nothing."""
        if type(device) is not DeviceRange and not isinstance(device, DeviceRange):
            raise RangeError("RANGE-1", f"a copy needs a DeviceRange, got {short(device)}")
        handle = device.handle
        record = self._records.get(handle.id) if type(handle) is DeviceHandle and type(handle.id) is int else None
        if record is None or record.handle is not handle:  # an exact copy of an issued handle, or a dead one
            key, record = self._resolve(handle)
            extent = record.extent if record is not None else handle.extent  # sealed when dead
        else:
            extent = record.extent
        offset, n = device.offset, device.nbytes
        if not (type(offset) is int and type(n) is int and offset >= 0 and 0 < n <= extent - offset):
            raise RangeError("RANGE-1", f"device range {short(device)} does not fit extent {extent}")
        if nbytes is not None and n != nbytes:
            raise RangeError(rule, f"host range is {nbytes} B but device range is {n} B")
        if record is None:  # dead: the table's refusal, as `check` finds and tells it
            self._core.check([key], "copy_begin")
            raise self._core.dead(*key, "copy_begin")
        return record, self._core.copy_step(record, kind), offset, n

    def _checked(
        self, token: object, host: HostRange, fingerprint: hostcheck.Fingerprint, sync: bool, name: str
    ) -> None:
        """(The checking mode) an input copy is on the device: a synchronous one, done, is checked
        now (HostBytesChangedError: failed, its bytes kept); an asynchronous one when it completes."""
        check = self._engine.host_check
        assert check is not None
        if not sync:
            check.submitted(token, host, fingerprint, name)
        elif (error := check.changed(host, fingerprint, name)) is not None:
            self._counts["copy_failures"] += 1
            raise error

    def _copy_failed(
        self, kind: str, host: HostRange, src: HostRange | DeviceRange, dst: HostRange | DeviceRange, e: BackendError
    ) -> BridgeError:
        """The error of a copy the backend refused (COPY-F); a failed output range is never readable."""
        self._counts["copy_failures"] += 1
        if kind == "copy_out":
            host.ring.begin_write(host)
            host.ring.end_write(host, valid=False)
        call = "host_to_device" if kind == "copy_in" else "device_to_host"
        return self._core.failure(kind, f"{call} {src} -> {dst}: {e}")

    def _seal(self, alloc_id: int, generation: int, extent: int, spec: ObjectSpec) -> int:
        """The seal of a handle's fields under this bridge's secret (the spec by its fields)."""
        return hash((self._secret, alloc_id, generation, extent, spec.name, spec.dtype, spec.role, spec.view))

    def _resolve(self, handle: object) -> tuple[tuple[int, int], Allocation | None]:
        """The core's key and live record (None once dead) of a handle this bridge issued,
        unaltered (HANDLE-1). Callers use the record, never the handle's own fields."""
        if type(handle) is DeviceHandle and type(handle.id) is int:
            record = self._records.get(handle.id)
            if record is not None and record.handle is handle:  # the issued object itself
                return (record.id, record.generation), record
            if self._genuine(handle):
                return (handle.id, handle.generation), record
        raise InvalidHandleError("HANDLE-1", f"{short(handle)} is not a handle this bridge issued")

    def _genuine(self, h: DeviceHandle) -> bool:
        """An exact copy of a handle this bridge issued: same-typed fields under this bridge's seal."""
        if not (type(h.generation) is int and type(h.extent) is int and type(h.spec) is ObjectSpec):
            return False
        if not (type(h.owner) is int and type(h.seal) is int and h.owner == self._owner):
            return False
        try:
            return h.seal == self._seal(h.id, h.generation, h.extent, h.spec)
        except Exception:  # a spec altered past its own validation (unhashable fields)
            return False

    def check_device_range(self, device: DeviceRange) -> None:
        """Whether a copy of `device` would pass the device side of a copy's checks now: a
        range of a live allocation of this bridge, within its extent. Changes nothing.

        Raises:
            RangeError: RANGE-1, for what is not a DeviceRange that fits its allocation.
            InvalidHandleError: HANDLE-1 (not this bridge's handle), USE-1 (freed).
            StaleHandleError: GEN-2, for a handle of an older generation."""
        with self._lock:
            self._device_step("copy_in", device, None, "RANGE-1")

    def _first_status(self, token: object) -> Status | None:
        """An asynchronous copy's status on submission: the backend's answer to one query (done
        already: it takes the synchronous copy's fused step); None for one held back (no token)."""
        if token is None:
            return None
        status = self._engine.ask(token)
        return OK if status.done and status.error is None else status

    def _submitted(self, use: InFlight, event: CopyEvent, status: Status | None) -> CopyEvent:
        """An asynchronous copy in flight, tracked until done (`status`: its first query; a
        failed one settles it at once)."""
        self._track(use, event)
        if status is None:  # held back: launched when its predecessors end
            self._counts["held"] += 1
        elif status.done:
            self._engine.end_event(event, status)
        return event

    def _track(self, use: InFlight, event: Event) -> None:
        """The core keeps the use's event (and its token, once submitted) until the use ends."""
        use.event = event
        if event.backend_token is not None:
            self._core.submitted(use, event.backend_token)
