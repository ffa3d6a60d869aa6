"""What a Bridge is made of below its public calls: its state, its copies' one path to the
backend, the resolution of what a caller hands in, and `_Execution`, through which the core's
orchestration runs on the backend.

The core decides, the Engine executes: what to do with a new use (submit, hold, wait: the core's
`plan`, ORDER-1), when a use ends (exactly once, its `settle`), which held uses launch then, and
what `poll` and a backend's completion callback settle are the core's orchestration, run with
`_Execution` as its executor: it queries and submits on the backend, applies a use's end (host
bytes released, output valid, deferred frees to the backend) and settles the event. A
synchronous copy or compute() that must follow earlier uses waits for them without the lock,
blocking on the backend.

The per-call path: a synchronous copy that the checks would let straight through to one
composite step (the issued handle of a live allocation with nothing in flight on it, a range
within its extent, a step the core made before from its state) finds that step in one lookup
(`_plain`, the core's `plain_step`) and skips the checks' other work; anything else, every
refusal included, goes through the checks, which name the rule.

Nothing a caller hands in is trusted: a handle is resolved to the bridge's own record
(HANDLE-1), and only the record's extent, spec and memory are used. A backend failure anywhere
becomes a typed error and never loses an event: a failed query, wait or marker settles the
event as failed; a failed free is reported, never retried (FREE-3), and never stops a restart.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import Counter

from devbridge.backends.base import Backend, BackendError
from devbridge.bridge import aio, transfer
from devbridge.bridge.events import ComputeEvent, CopyEvent, Event, Link
from devbridge.bridge.memory import MemoryBook
from devbridge.bridge.stats import Holder
from devbridge.bridge.trace import BridgeTrace
from devbridge.errors import (
    BridgeError,
    InvalidHandleError,
    RangeError,
    short,
)
from devbridge.ring.host import HostRange
from devbridge.statemachine.core import SUBMIT, Allocation, Composite, Effects, InFlight, LifecycleCore
from devbridge.statemachine.status import OK, Status
from devbridge.types import DeviceHandle, DeviceRange, ObjectSpec

#: How often wait_any queries again when no completion wakes it (for tokens a backend cannot report).
POLL_S = 0.002
log = logging.getLogger("devbridge")


class Engine:
    """A Bridge's state and machinery (the Bridge sets it up and adds the public calls)."""

    pending_warning_s: float
    _backend: Backend
    _core: LifecycleCore
    _owner: int
    _secret: int  # seals the handles this bridge issues
    _lock: threading.RLock
    _run: _Execution  # the core's orchestration runs on the backend through it
    _progress: threading.Condition  # notified as completions arrive (wait_any)
    _completions: int  # completions reported or applied so far (under _progress)
    _watcher: aio.Watcher
    _link: Link  # what its events ask
    _counts: Counter[str]
    # the traffic, counted apart from `_counts`: once or twice on every copy
    _copies_in: int
    _bytes_in: int
    _copies_out: int
    _bytes_out: int
    _release_failures: list[str]  # deferred backend frees that failed, for the next poll()
    _staging: transfer.Staging  # host bytes of uploads and downloads given no ring
    _anchors: weakref.WeakValueDictionary[int, object]  # view use -> anchor
    _memory: MemoryBook  # device memory held, now and at peak, in all and per role
    _trace: BridgeTrace | None  # this bridge's tracks of a timeline, when tracing

    def _copy(
        self,
        kind: str,
        host: HostRange,
        device: DeviceRange,
        src: HostRange | DeviceRange,
        dst: HostRange | DeviceRange,
        sync: bool,
        keep_host: bool,
    ) -> CopyEvent:
        """Either copy, `host` <-> `device` (`src` -> `dst` as the caller gave them): submitted
        now, held back behind the earlier uses it must follow (async, ORDER-1), or submitted once
        they ended (sync)."""
        into_device = kind == "copy_in"
        while True:
            with self._lock:
                self._core.drain(self._run)
                if sync and (plain := self._plain(kind, host, device)) is not None:
                    record, step = plain  # what the checks below would find, found at once
                    self._check_host(host, into_device)
                    token = self._submit_now(kind, record.memory, device.offset, host, src, dst, True)
                    return self._copied(kind, self._core.take(record, step), record, host, keep_host, token, src, dst)
                key, record = self._check_copy(host, device, "H2D-1" if into_device else "D2H-1")
                self._check_host(host, into_device)
                span = (device.offset, device.offset + device.nbytes)
                # (nothing in flight on the allocation: nothing to follow)
                plan = self._core.plan(kind, [key], span, sync) if record.accesses else SUBMIT
                if plan.blocker is None:
                    before = plan.before  # when any, it is held back behind them (no token yet: ORDER-1)
                    token = None
                    if not before:
                        token = self._submit_now(kind, record.memory, device.offset, host, src, dst, sync)
                    # a synchronous copy here follows nothing: submitted, and done on return
                    if (status := OK if sync else self._first_status(token)) is OK:
                        # done already: one composite step, nothing in flight (H2D-2, D2H-2)
                        use_id = self._core.instant(kind, key)
                        return self._copied(kind, use_id, record, host, keep_host, token, src, dst)
                    self._count(into_device, host.nbytes)
                    use = self._core.begin(kind, [key], host=host, keep_host=keep_host, span=span, before=before)
                    if into_device:
                        host.ring.begin_read(host)
                    else:
                        host.ring.begin_write(host)
                    return self._submitted(use, CopyEvent(self._link, use.id, token, src, dst), status)
                blocker = plan.blocker.event
            self._wait_for(blocker)

    def _plain(self, kind: str, host: object, device: object) -> tuple[Allocation, Composite] | None:
        """The record and step of a synchronous copy that `_copy`'s checks would let through to
        one composite step, found without them (the per-call path): the issued handle of a live
        allocation with nothing in flight on it, a range within its extent as long as the host
        range, a step the core made before. None: the checks decide (and name what they refuse)."""
        if type(host) is not HostRange or type(device) is not DeviceRange:
            return None
        handle = device.handle
        if type(handle) is not DeviceHandle or type(handle.id) is not int:
            return None
        record = self._core.allocation(handle.id)
        if record is None or record.handle is not handle or record.accesses:
            return None
        offset, nbytes = device.offset, device.nbytes
        if not (type(offset) is int and type(nbytes) is int and offset >= 0 and 0 < nbytes <= record.extent - offset):
            return None
        if nbytes != host.nbytes or (step := self._core.plain_step(record, kind)) is None:
            return None
        return record, step

    @staticmethod
    def _check_host(host: HostRange, into_device: bool) -> None:
        """The host side of a copy: a range an input copy may read or an output copy may write."""
        if into_device:
            host.ring.check_source(host)
        else:
            host.ring.check_dest(host)

    def _submit_now(
        self,
        kind: str,
        memory: object,
        offset: int,
        host: HostRange,
        src: HostRange | DeviceRange,
        dst: HostRange | DeviceRange,
        sync: bool,
    ) -> object:
        """Hand a copy to the backend on the caller's call; its token. A failure raises the copy's
        error (COPY-F), and a failed output range is never readable."""
        try:  # (`_submit`, inlined: the per-call path)
            if kind == "copy_in":
                return self._backend.copy_in(memory, offset, host.ring.raw(host), sync=sync)
            return self._backend.copy_out(host.ring.raw(host), memory, offset, sync=sync)
        except BackendError as e:
            self._counts["copy_failures"] += 1
            if kind == "copy_out":
                host.ring.begin_write(host)
                host.ring.end_write(host, valid=False)
            call = "host_to_device" if kind == "copy_in" else "device_to_host"
            raise self._core.failure(kind, f"{call} {src} -> {dst}: {e}") from e

    def _copied(
        self,
        kind: str,
        use_id: int,
        record: Allocation,
        host: HostRange,
        keep_host: bool,
        token: object,
        src: HostRange | DeviceRange,
        dst: HostRange | DeviceRange,
    ) -> CopyEvent:
        """A copy the backend finished on the call, after its step: counted, traced, its host
        bytes released (an input's) or valid (an output's); its event, settled."""
        into_device = kind == "copy_in"
        self._count(into_device, host.nbytes)
        if self._trace is not None:
            self._trace.instant(kind, record, host.nbytes)
        if into_device:
            host.ring.read_done(host, not keep_host)
        else:
            host.ring.write_done(host)
        return self._link.copied(use_id, token, src, dst)

    def _count(self, into_device: bool, nbytes: int) -> None:
        """A copy the backend took (or one held back): the traffic `stats()` counts."""
        if into_device:
            self._copies_in += 1
            self._bytes_in += nbytes
        else:
            self._copies_out += 1
            self._bytes_out += nbytes

    def _submit(self, kind: str, memory: object, offset: int, host: HostRange, sync: bool) -> object:
        """Hand a copy to the backend; its token."""
        if kind == "copy_in":
            return self._backend.copy_in(memory, offset, host.ring.raw(host), sync=sync)
        return self._backend.copy_out(host.ring.raw(host), memory, offset, sync=sync)

    def _seal(self, alloc_id: int, generation: int, extent: int, spec: ObjectSpec) -> int:
        return hash((self._secret, alloc_id, generation, extent, spec))

    def _resolve(self, handle: object) -> tuple[tuple[int, int], Allocation | None]:
        """The core's key and live record (None once dead) of a handle this bridge issued,
        unaltered (HANDLE-1). Callers use the record, never the handle's own fields."""
        if type(handle) is DeviceHandle and type(handle.id) is int:
            record = self._core.allocation(handle.id)
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

    def _check_copy(self, host: HostRange, device: DeviceRange, rule: str) -> tuple[tuple[int, int], Allocation]:
        if not isinstance(host, HostRange) or not isinstance(device, DeviceRange):
            raise RangeError(
                "RANGE-1", f"a copy needs a HostRange and a DeviceRange, got {short(host)}, {short(device)}"
            )
        key, record = self._fitting(device)
        if host.nbytes != device.nbytes:
            raise RangeError(rule, f"host range is {host.nbytes} B but device range is {device.nbytes} B")
        return key, self._copyable(key, record)

    def check_device_range(self, device: DeviceRange) -> None:
        """Whether a copy of `device` would pass the device side of a copy's checks now: a
        range of a live allocation of this bridge, within its extent. Changes nothing.

        Raises:
            RangeError: RANGE-1, for what is not a DeviceRange that fits its allocation.
            InvalidHandleError: HANDLE-1 (not this bridge's handle), USE-1 (freed).
            StaleHandleError: GEN-2, for a handle of an older generation."""
        if not isinstance(device, DeviceRange):
            raise RangeError("RANGE-1", f"a copy needs a DeviceRange, got {short(device)}")
        with self._lock:
            self._copyable(*self._fitting(device))

    def _fitting(self, device: DeviceRange) -> tuple[tuple[int, int], Allocation | None]:
        """The key and record of `device`'s allocation, the range within its extent (RANGE-1)."""
        key, record = self._resolve(device.handle)
        extent = record.extent if record is not None else device.handle.extent  # sealed when dead
        offset, nbytes = device.offset, device.nbytes
        if not (type(offset) is int and type(nbytes) is int and offset >= 0 and 0 < nbytes <= extent - offset):
            raise RangeError("RANGE-1", f"device range {short(device)} does not fit extent {extent}")
        return key, record

    def _copyable(self, key: tuple[int, int], record: Allocation | None) -> Allocation:
        """The record, once the core says a copy may begin on it (GEN-2, USE-1)."""
        self._core.check([key], "copy_begin")
        if record is None:  # the check refuses a dead allocation; should it not, still no crash
            raise self._core.dead(*key, "copy_begin")
        return record

    def _first_status(self, token: object) -> Status | None:
        """An asynchronous copy's status on submission: the backend's answer to one query (done
        already: it takes the synchronous copy's fused step); None for one held back (no token)."""
        if token is None:
            return None
        status = self._query(token)
        return OK if status.done and status.error is None else status

    def _submitted(self, use: InFlight, event: CopyEvent, status: Status | None) -> CopyEvent:
        """An asynchronous copy in flight, tracked until done (`status`: its first query; a
        failed one settles it at once)."""
        self._track(use, event)
        if status is None:  # held back: launched when its predecessors end
            self._counts["held"] += 1
        elif status.done:
            self._finish(event, status)
        return event

    def _track(self, use: InFlight, event: Event) -> None:
        """The core keeps the use's event (and its token, once submitted) until the use ends."""
        use.event = event
        if event.backend_token is not None:
            self._core.submitted(use, event.backend_token)

    def _live(self, event: Event) -> bool:
        """Whether the event's use has not ended."""
        return self._core.use(event.use_id) is not None

    def _wait_for(self, event: Event) -> None:
        """Block, without the lock, until `event` (a use a call must follow) is done."""
        with self._lock:
            self._counts["waits"] += 1
        self._wait_backend(event, None)
        self._refresh(event)

    def _entered(self, event: ComputeEvent) -> None:
        """A `with compute(...)` block began: the compute cannot end before the block does."""
        with self._lock:
            if (use := self._core.use(event.use_id)) is not None:
                use.open = True

    def _closed(self, event: ComputeEvent) -> None:
        """A `with compute(...)` block exited: the marker must cover the work it queued."""
        with self._lock:
            if (use := self._core.use(event.use_id)) is not None:
                use.open = False
                try:
                    self._backend.extend(event.backend_token)
                except BackendError as e:
                    self._finish(event, Status(True, f"marking the end of the compute failed: {e}"))
            self._refresh(event)

    def _refresh(self, event: Event) -> None:
        """Settle `event` if the backend is done with it (a held one: first what it follows)."""
        with self._lock:
            if (use := self._core.use(event.use_id)) is not None:
                self._core.refresh(use, self._run)

    def _query(self, token: object) -> Status:
        """The backend's status of an event's token; a failed query settles it as failed (the
        protocol: a backend raises only for work it will not touch again)."""
        try:
            return self._backend.query(token)
        except BackendError as e:
            return Status(True, f"querying the backend failed: {e}")

    def _wait_backend(self, event: Event, timeout: float | None) -> None:
        """Block on the backend for `event`, or for a held event the oldest use it follows."""
        with self._lock:
            if (use := self._core.use(event.use_id)) is None:
                return
            if event.backend_token is None:
                event = self._core.blocker([use]).event
        try:
            self._backend.wait(event.backend_token, timeout)  # without the lock: may block
        except BackendError as e:
            with self._lock:
                if self._live(event):
                    self._finish(event, Status(True, f"waiting on the backend failed: {e}"))

    def _notify_progress(self) -> None:
        with self._progress:
            self._completions += 1
            self._progress.notify_all()

    def _on_complete(self, token: object) -> None:
        """The backend reports a finished token, on any thread. Never blocks: a device thread
        must not wait for a caller that may be waiting for that thread (a synchronous copy
        ordered after queued ones). When the lock is busy, the next call applies it; done(),
        wait() and poll() also query the backend themselves, so nothing waits on this."""
        if self._lock.acquire(blocking=False):
            try:
                self._core.reported(token, self._run)
            finally:
                self._lock.release()
        else:
            self._core.reported(token, None)  # the lock's holder, or the next call, applies it
        self._notify_progress()  # a waiter in wait_any looks again (it queries the backend itself)

    def _finish(self, event: Event, status: Status) -> None:
        """End the event's use with `status` (the core's `settle`: once, whatever calls it)."""
        if (use := self._core.use(event.use_id)) is not None:
            self._core.settle(use, status, self._run)

    def _apply(self, effects: Effects) -> None:
        use = effects.use
        if use.kind == "copy_in":
            use.host.ring.end_read(use.host, release=effects.host_ok)
        elif use.kind == "copy_out":
            use.host.ring.end_write(use.host, valid=effects.host_ok)
        for record in effects.release:
            if failure := self._release(record):
                self._release_failures.append(failure)

    def _error(self, effects: Effects, status: Status) -> BridgeError | None:
        """The event's failure, as the spec's `failures` name it (rule and error type)."""
        kind = effects.use.kind
        if effects.error_rule is None:
            return None
        if effects.aborted:
            self._counts["aborted"] += 1
            return self._core.failure("aborted", f"{kind} #{effects.use.id} was aborted by restart")
        self._counts["compute_failures" if kind == "compute" else "copy_failures"] += 1
        return self._core.failure(kind, f"{kind} #{effects.use.id} failed: {status.error}")

    def _drain(self) -> int:
        """Apply what arrived while no call ran (the core's `drain`); how many uses ended."""
        return self._core.drain(self._run)

    def _warn_long_waits(self) -> None:
        """Log, once each, deferred releases waiting longer than `pending_warning_s` (PIN-1):
        a JIT or a model that captured a view is found in minutes, not by a memory leak. One at
        a time: a log handler may call back and release one."""
        while (overdue := self._core.overdue(time.monotonic(), self.pending_warning_s)) is not None:
            record, waited = overdue
            uses = sorted(self._core.dependents(record.id), key=lambda use: use.id)
            kinds = Counter(use.kind for use in uses)
            log.warning(
                "allocation #%d (%s, role %s) is %s after %.0f s; still in use by %s",
                record.id, record.spec.name, record.spec.role, record.state, waited,
                (", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "nothing")
                + (f" ({'; '.join(str(holder(use)) for use in uses)})" if uses else ""),
            )  # fmt: skip

    def _release(self, record: Allocation) -> str | None:
        """The one backend free of an allocation (FREE-2); a failure is returned, never retried."""
        try:
            self._backend.free(record.memory)
        except BackendError as e:
            self._counts["free_failures"] += 1
            self._memory.released(record.spec.role, record.extent, failed=True)  # never freed again
            if self._trace is not None:
                self._trace.fault(f"free of allocation #{record.id}")
            return f"releasing allocation #{record.id} (generation {record.generation}) failed: {e}"
        self._counts["backend_frees"] += 1
        self._memory.released(record.spec.role, record.extent, failed=False)
        return None


def holder(use: InFlight) -> Holder:
    """A use in flight as `pins(h).uses` names it."""
    after = tuple(sorted(use.after or ()))
    return Holder(use.kind, use.id, use.span, bool(after), after, use.open)


class _Execution:
    """The core's executor for one Bridge: the backend calls and the Bridge's own effects that
    the core's orchestration (settle, launch, poll, drain) asks for."""

    __slots__ = ("bridge",)

    def __init__(self, bridge: Engine) -> None:
        self.bridge = bridge

    def query(self, use: InFlight) -> Status:
        return self.bridge._query(use.token)

    def launch(self, use: InFlight) -> Status | None:
        bridge = self.bridge
        record = bridge._core.allocation(use.allocations[0])
        assert record is not None and use.span is not None, "a held use keeps its allocation's record"
        try:
            token = bridge._submit(use.kind, record.memory, use.span[0], use.host, False)
        except BackendError as e:
            return Status(True, f"submitting it once its predecessors ended failed: {e}")
        use.event.backend_token = token
        bridge._core.submitted(use, token)
        return None

    def ended(self, use: InFlight, effects: Effects | BridgeError, status: Status) -> None:
        """Apply the use's end, then settle its event whatever happens here (a view has none)."""
        bridge = self.bridge
        error = effects if isinstance(effects, BridgeError) else None
        try:
            if error is None:
                assert isinstance(effects, Effects)
                bridge._apply(effects)
                error = bridge._error(effects, status)
        finally:
            if use.event is not None:
                Link.settle(use.event, error)
            bridge._notify_progress()
