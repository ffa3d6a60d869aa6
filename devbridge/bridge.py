"""The Bridge: the lifecycle core plus a backend.

Every public call follows one pattern: validate everything (types, ranges,
the core's `check`, the ring's checks) without changing anything, then make
the backend call, then record what happened in the core and the ring. So a
rejected call changes nothing and makes no backend call, and a backend
failure at submission changes nothing either. Completions, from `poll`, an
event's `done`/`wait`, or a backend callback on any thread, go through
`_finish`, the one place where host bytes are released, output becomes
valid, and deferred frees reach the backend.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import Counter, deque
from typing import TYPE_CHECKING

from devbridge.backends.base import Backend, BackendError, Status
from devbridge.errors import (
    BridgeError,
    ComputeError,
    DeviceAllocationError,
    DeviceCopyError,
    InvalidHandleError,
    InvalidSpecError,
    InvalidViewError,
    OutputCopyError,
    RangeError,
    StaleHandleError,
)
from devbridge.events import ComputeEvent, CopyEvent, Event
from devbridge.statemachine.core import Effects, LifecycleCore
from devbridge.types import DeviceHandle, DeviceRange, HostRange, ObjectSpec, TensorViewSpec

if TYPE_CHECKING:
    from tinygrad.tensor import Tensor

_owners = itertools.count(1)


class Bridge:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._core = LifecycleCore()
        self._owner = next(_owners)
        self._lock = threading.RLock()
        self._pending: dict[int, Event] = {}  # use id -> event awaiting the backend
        self._by_token: dict[int, Event] = {}  # id(backend token) -> the same events
        self._views_gone: deque[int] = deque()  # use ids of collected views (appended by GC)
        self._counts: Counter[str] = Counter()
        backend.begin_generation(0)
        backend.subscribe(self._on_complete)

    # ------------------------------------------------------------ allocation

    @property
    def generation(self) -> int:
        return self._core.generation

    def alloc_device(self, spec: ObjectSpec, extent: int) -> DeviceHandle:
        """Allocate `extent` bytes for an object of `spec` in the current generation."""
        with self._lock:
            self._drain_views()
            if not isinstance(spec, ObjectSpec):
                raise InvalidSpecError("SPEC-1", f"alloc_device needs an ObjectSpec, got {spec!r}")
            if not isinstance(extent, int) or isinstance(extent, bool) or extent <= 0:
                raise RangeError("ALLOC-1", f"extent must be a positive int, got {extent!r}")
            if extent % spec.itemsize:
                raise RangeError("ALLOC-1", f"extent {extent} is not a whole number of {spec.dtype} items")
            try:
                memory = self._backend.alloc(extent, spec.dtype)
            except BackendError as e:
                self._counts["alloc_failures"] += 1
                raise DeviceAllocationError("ALLOC-2", f"allocating {extent} B for {spec.name}: {e}") from e
            record = self._core.add(extent, spec, memory)
            self._counts["allocs"] += 1
            return DeviceHandle(record.id, record.generation, extent, spec, self._owner)

    def free_device(self, handle: DeviceHandle) -> None:
        """Free now, or as soon as no copy, compute or view uses the allocation (FREE-1)."""
        with self._lock:
            self._drain_views()
            self._own(handle)
            record = self._core.free(handle.id, handle.generation)
            if record is None:
                self._counts["deferred_frees"] += 1
            else:
                self._release(record.memory)

    # ------------------------------------------------------------ copies

    def host_to_device(self, src: HostRange, dst: DeviceRange, *, sync: bool = True, release: bool = True) -> CopyEvent:
        """Copy exactly `src` into exactly `dst`. The host bytes are released on return
        (sync) or when the event completes (async); never after a failure. With
        release=False they are only safe to release then, and the worker releases them
        itself (a worker that must survive restarts keeps its inputs until delivered)."""
        with self._lock:
            self._drain_views()
            self._check_copy(src, dst, "H2D-1")
            src.ring.check_source(src)
            try:
                token = self._backend.copy_in(self._memory(dst.handle), dst.offset, src.ring.raw(src), sync=sync)
            except BackendError as e:
                self._counts["copy_failures"] += 1
                raise DeviceCopyError("COPY-F", f"host_to_device {src} -> {dst}: {e}") from e
            use = self._core.begin("copy_in", [(dst.handle.id, dst.handle.generation)], host=src, keep_host=not release)
            src.ring.begin_read(src)
            self._counts["copies_in"] += 1
            self._counts["bytes_in"] += src.nbytes
            return self._submitted(CopyEvent(self, use.id, token, src, dst), sync)

    def device_to_host(self, src: DeviceRange, dst: HostRange, *, sync: bool = True) -> CopyEvent:
        """Copy exactly `src` into exactly `dst`. The host bytes are valid on return (sync) or
        when the event completes (async); a failed output range is never readable."""
        with self._lock:
            self._drain_views()
            self._check_copy(dst, src, "D2H-1")
            dst.ring.check_dest(dst)
            try:
                token = self._backend.copy_out(dst.ring.raw(dst), self._memory(src.handle), src.offset, sync=sync)
            except BackendError as e:
                self._counts["copy_failures"] += 1
                dst.ring.begin_write(dst)
                dst.ring.end_write(dst, valid=False)
                raise OutputCopyError("COPY-F", f"device_to_host {src} -> {dst}: {e}") from e
            use = self._core.begin("copy_out", [(src.handle.id, src.handle.generation)], host=dst)
            dst.ring.begin_write(dst)
            self._counts["copies_out"] += 1
            self._counts["bytes_out"] += dst.nbytes
            return self._submitted(CopyEvent(self, use.id, token, src, dst), sync)

    # ------------------------------------------------------------ compute and views

    def compute(self, *handles: DeviceHandle) -> ComputeEvent:
        """Mark `handles` in use by compute until the returned event completes."""
        with self._lock:
            self._drain_views()
            keys = [self._own(h) for h in handles]
            self._core.check(keys, "compute_begin")
            memories = [self._memory(h) for h in dict.fromkeys(handles)]
            try:
                token = self._backend.compute(memories)
            except BackendError as e:
                self._counts["compute_failures"] += 1
                raise ComputeError("COMPUTE-F", f"compute on {[h.id for h in handles]}: {e}") from e
            use = self._core.begin("compute", keys)
            self._counts["computes"] += 1
            event = ComputeEvent(self, use.id, token, tuple(handles))
            self._track(event)
            return event

    def wrap_for_tinygrad(self, handle: DeviceHandle, view: TensorViewSpec) -> Tensor:
        """A zero-copy tinygrad Tensor over the allocation. While it lives, the allocation
        is in use by compute (VIEW-3): freeing it is deferred until the Tensor is collected."""
        with self._lock:
            self._drain_views()
            key = self._own(handle)
            self._core.check([key], "compute_begin")
            if not isinstance(view, TensorViewSpec):
                raise InvalidViewError("VIEW-2", f"wrap_for_tinygrad needs a TensorViewSpec, got {view!r}")
            spec = handle.spec
            if view.dtype != spec.dtype:
                raise InvalidViewError("VIEW-2", f"view dtype {view.dtype} is not {spec.name}'s {spec.dtype}")
            if spec.view is not None and view != spec.view:
                raise InvalidViewError("VIEW-2", f"role {spec.role} uses {spec.view}, not {view}")
            if view.offset + view.nbytes > handle.extent:
                raise InvalidViewError(
                    "VIEW-2",
                    f"view [{view.offset}, {view.offset + view.nbytes}) exceeds extent {handle.extent}",
                )
            try:
                tensor: Tensor = self._backend.view(self._memory(handle), view.offset, view.shape, view.dtype)
            except BackendError as e:
                raise InvalidViewError("VIEW-1", f"backend could not view {spec.name}: {e}") from e
            use = self._core.begin("view", [key])
            weakref.finalize(tensor, self._views_gone.append, use.id)
            self._counts["views"] += 1
            return tensor

    # ------------------------------------------------------------ completions and generations

    def poll(self) -> int:
        """Process every use the backend has finished; how many were processed."""
        with self._lock:
            finished = self._drain_views()
            for event in list(self._pending.values()):
                status = self._backend.query(event.backend_token)
                if status.done and self._ready(event):
                    self._finish(event, status)
                    finished += 1
            return finished

    def restart(self) -> None:
        """Begin a new generation. Every prior handle and in-flight event is invalidated;
        old memory is released now if unused, else when the backend is done with it."""
        with self._lock:
            self._drain_views()
            releases = self._core.restart()
            self._backend.begin_generation(self._core.generation)
            for record in releases:
                self._release(record.memory)
            self._counts["restarts"] += 1

    # ------------------------------------------------------------ introspection

    def state(self, handle: DeviceHandle) -> str:
        """The allocation's lifecycle state, a state name from the spec."""
        with self._lock:
            self._drain_views()
            key = self._own(handle)
            return self._core.state(*key)

    def stats(self) -> dict[str, int]:
        with self._lock:
            self._drain_views()
            live = list(self._core.allocations())
            counts = {
                k: self._counts[k]
                for k in (
                    "allocs", "backend_frees", "deferred_frees", "copies_in", "copies_out", "bytes_in",
                    "bytes_out", "computes", "views", "copy_failures", "compute_failures", "alloc_failures",
                    "aborted", "restarts",
                )
            }  # fmt: skip
            return {
                "generation": self._core.generation,
                "live_allocations": len(live),
                "live_bytes": sum(r.extent for r in live),
                "pending_events": len(self._pending),
                "inflight_uses": sum(1 for _ in self._core.inflight()),
                **counts,
            }

    # ------------------------------------------------------------ internals

    def _own(self, handle: DeviceHandle) -> tuple[int, int]:
        if not isinstance(handle, DeviceHandle) or handle.owner != self._owner:
            raise InvalidHandleError("HANDLE-1", f"{handle!r} was not made by this bridge")
        return handle.id, handle.generation

    def _memory(self, handle: DeviceHandle) -> object:
        record = self._core.allocation(handle.id)
        assert record is not None, "checked by the core before any backend call"
        return record.memory

    def _check_copy(self, host: HostRange, device: DeviceRange, rule: str) -> None:
        if not isinstance(host, HostRange) or not isinstance(device, DeviceRange):
            raise RangeError("RANGE-1", f"a copy needs a HostRange and a DeviceRange, got {host!r}, {device!r}")
        key = self._own(device.handle)
        if host.nbytes != device.nbytes:
            raise RangeError(rule, f"host range is {host.nbytes} B but device range is {device.nbytes} B")
        self._core.check([key], "copy_begin")

    def _submitted(self, event: CopyEvent, sync: bool) -> CopyEvent:
        self._track(event)
        status = self._backend.query(event.backend_token)
        if status.done:
            self._finish(event, status)
            if sync and event._error is not None:
                raise event._error  # a synchronous copy reports its failure from the call
        return event

    def _track(self, event: Event) -> None:
        self._pending[event.use_id] = event
        self._by_token[id(event.backend_token)] = event

    def _ready(self, event: Event) -> bool:
        return not (isinstance(event, ComputeEvent) and event.open)

    def _closed(self, event: ComputeEvent) -> None:
        """A `with compute(...)` block exited: the marker must cover the work it queued."""
        with self._lock:
            if event.use_id in self._pending:
                self._backend.extend(event.backend_token)
            self._refresh(event)

    def _refresh(self, event: Event) -> None:
        with self._lock:
            if event.use_id in self._pending and self._ready(event):
                status = self._backend.query(event.backend_token)
                if status.done:
                    self._finish(event, status)

    def _wait_backend(self, event: Event, timeout: float | None) -> bool:
        return self._backend.wait(event.backend_token, timeout)  # without the lock: may block

    def _on_complete(self, token: object) -> None:
        with self._lock:
            event = self._by_token.get(id(token))
            if event is not None and event.backend_token is token:
                self._refresh(event)

    def _finish(self, event: Event, status: Status) -> None:
        del self._pending[event.use_id], self._by_token[id(event.backend_token)]
        effects = self._core.end(event.use_id, ok=status.error is None)
        self._apply(effects)
        event._settle(self._error(effects, status))

    def _apply(self, effects: Effects) -> None:
        use = effects.use
        if use.kind == "copy_in":
            use.host.ring.end_read(use.host, release=effects.host_ok)
        elif use.kind == "copy_out":
            use.host.ring.end_write(use.host, valid=effects.host_ok)
        for record in effects.release:
            self._release(record.memory)

    def _error(self, effects: Effects, status: Status) -> BridgeError | None:
        rule, kind = effects.error_rule, effects.use.kind
        if rule is None:
            return None
        if rule == "GEN-1":
            self._counts["aborted"] += 1
            return StaleHandleError("GEN-1", f"{kind} #{effects.use.id} was aborted by restart")
        self._counts["compute_failures" if kind == "compute" else "copy_failures"] += 1
        error_type = {"copy_in": DeviceCopyError, "copy_out": OutputCopyError}.get(kind, ComputeError)
        return error_type(rule, f"{kind} #{effects.use.id} failed: {status.error}")

    def _drain_views(self) -> int:
        drained = 0
        while self._views_gone:
            self._apply(self._core.end(self._views_gone.popleft(), ok=True))
            drained += 1
        return drained

    def _release(self, memory: object) -> None:
        self._backend.free(memory)
        self._counts["backend_frees"] += 1
