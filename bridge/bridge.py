"""The Bridge: the lifecycle core plus a backend, in the calls a worker makes.

Every public call follows one pattern: validate everything (types, ranges,
the core's `check`, the ring's checks) without changing anything, then make
the backend call, then record what happened in the core and the ring. So a
rejected call changes nothing and makes no backend call, and a backend
failure at submission changes nothing either.

The core decides, the Bridge executes (devbridge.bridge.engine says how). Its parts:
this module's calls (allocation, copies, compute and views, completions and
generations); the waits on many events (devbridge.bridge.waiting); what it says
about itself (devbridge.bridge.introspection); its state and machinery below the
calls (devbridge.bridge.engine).
"""

from __future__ import annotations

import itertools
import os
import secrets
import threading
import time
import weakref
from collections import Counter
from typing import IO, TYPE_CHECKING, Any

from devbridge.args import as_count, as_seconds, flag
from devbridge.backends.base import Backend, BackendError
from devbridge.bridge import aio, transfer
from devbridge.bridge.engine import POLL_S, _Execution, log
from devbridge.bridge.events import ComputeEvent, CopyEvent, Link
from devbridge.bridge.introspection import Introspection
from devbridge.bridge.memory import MemoryBook
from devbridge.bridge.trace import BridgeTrace, Trace
from devbridge.bridge.waiting import Waiting
from devbridge.errors import (
    BackendFailureError,
    DeviceAllocationError,
    DeviceFreeError,
    InvalidArgumentError,
    InvalidSpecError,
    InvalidViewError,
    RangeError,
    short,
)
from devbridge.ring.host import HostRange, HostRing
from devbridge.statemachine.core import LifecycleCore
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


class Bridge(Waiting, Introspection):
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

        Raises:
            InvalidArgumentError: ARG-1, for anything but a Backend, seconds >= 0, or a trace
                target that is not a path, a text file or a Trace.
            BackendFailureError: FAULT-1, when the backend refuses to start (nothing is kept)."""
        if isinstance(backend, type) or not isinstance(backend, Backend):
            raise InvalidArgumentError("ARG-1", f"Bridge needs a Backend, got {short(backend)}")
        self.pending_warning_s = as_seconds(pending_warning_s, "pending_warning_s")
        self._backend = backend
        self._core = LifecycleCore()
        self._owner = next(_owners)
        self._secret = secrets.randbits(64)  # seals the handles this bridge issues
        self._lock = threading.RLock()
        self._run = _Execution(self)  # the core's orchestration runs on the backend through it
        self._progress = threading.Condition(threading.Lock())  # notified as completions arrive (wait_any)
        self._completions = 0  # completions reported or applied so far (under _progress)
        drive = getattr(backend, "waits_run_work", False) is True  # its wait runs the work (the fake)
        self._watcher = aio.Watcher(self._progress, lambda: self._completions, self._drive if drive else None, POLL_S)
        # what its events ask
        self._link = Link(self._refresh, self._wait_backend, self._entered, self._closed, self._watcher.future)
        self._counts: Counter[str] = Counter()
        self._copies_in = self._bytes_in = self._copies_out = self._bytes_out = 0
        self._release_failures: list[str] = []  # deferred backend frees that failed, for the next poll()
        self._staging = transfer.Staging()  # host bytes of uploads and downloads given no ring
        self._anchors: weakref.WeakValueDictionary[int, object] = weakref.WeakValueDictionary()  # view use -> anchor
        self._memory = MemoryBook()  # device memory held, now and at peak, in all and per role
        self._trace: BridgeTrace | None = None
        # a path or a file is opened here, before any backend call: anything else is ARG-1
        self._own_trace = None if trace is None or isinstance(trace, Trace) else Trace(trace)
        try:
            backend.begin_generation(0)
            backend.subscribe(self._on_complete)
        except BackendError as e:
            if self._own_trace is not None:
                self._own_trace.close()
            raise BackendFailureError("FAULT-1", f"backend {short(backend)} refused a new bridge: {e}") from e
        if trace is not None:
            shared = self._own_trace or trace
            assert isinstance(shared, Trace)
            label = f"bridge #{self._owner} ({getattr(backend, 'name', short(backend))})"
            self._trace = self._core.tracer = shared.bridge(self._owner, label, self._core.table.terminal)
            self._memory.observer = self._trace.memory
            if self._own_trace is not None:
                weakref.finalize(self, self._own_trace.close)

    def close_trace(self) -> None:
        """End the trace this bridge opened (`trace=` a path or a file): what is still open
        (live allocations' states, uses in flight) ends now, then the file's JSON array. A
        shared `Trace` is its owner's to close. Tracing stops; idempotent. Never raises."""
        with self._lock:
            tracks, owned = self._trace, self._own_trace
            self._trace = self._core.tracer = self._memory.observer = None
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
        with self._lock:
            self._drain()
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
            handle = DeviceHandle._issued(record.id, record.generation, size, spec, self._owner, seal)
            record.handle = handle
            return handle

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
        with self._lock:
            self._drain()
            key, _ = self._resolve(handle)
            record = self._core.free(*key, time.monotonic())
            if record is None:
                self._counts["deferred_frees"] += 1
            elif failure := self._release(record):
                raise DeviceFreeError("FREE-3", failure)

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
        return self._copy("copy_in", src, dst, src, dst, sync, not release)

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
        return self._copy("copy_out", dst, src, src, dst, sync, False)

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
        while True:
            with self._lock:
                self._drain()
                resolved = dict(self._resolve(h) for h in handles)  # one entry per allocation
                keys = list(resolved)
                self._core.check(keys, "compute_begin")
                if (plan := self._core.plan("compute", keys)).blocker is None:
                    memories = [record.memory for record in resolved.values() if record is not None]
                    try:
                        token = self._backend.compute(memories)
                    except BackendError as e:
                        self._counts["compute_failures"] += 1
                        raise self._core.failure("compute", f"compute on {[k[0] for k in keys]}: {e}") from e
                    use = self._core.begin("compute", keys, before=[])
                    self._counts["computes"] += 1
                    event = ComputeEvent(self._link, use.id, token, tuple(handles))
                    self._track(use, event)
                    return event
                blocker = plan.blocker.event
            self._wait_for(blocker)

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
            self._drain()
            key, record = self._resolve(handle)
            self._core.check([key], "compute_begin")
            if record is None:  # the check refuses a dead allocation; should it not, still no crash
                raise self._core.dead(*key, "compute_begin")
            if type(view) is not TensorViewSpec:
                raise InvalidViewError("VIEW-2", f"wrap_for_tinygrad needs a TensorViewSpec, got {short(view)}")
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
            finished = self._core.poll(self._run)
            self._warn_long_waits()
            if self._release_failures:
                failures, self._release_failures = self._release_failures, []
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
            self._drain()
            releases = self._core.restart(time.monotonic())  # the rest wait for their uses (PIN-1)
            self._counts["restarts"] += 1
            failures: list[str] = []
            try:
                self._backend.begin_generation(self._core.generation)
            except BackendError as e:
                failures.append(f"beginning generation {self._core.generation}: {e}")
            generation_failed = bool(failures)
            failures += [failure for record in releases if (failure := self._release(record))]
            if generation_failed:
                raise BackendFailureError("FAULT-1", "; ".join(failures))
            if failures:
                raise DeviceFreeError("FREE-3", "; ".join(failures))
