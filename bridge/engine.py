"""The executing half of a Bridge: `Engine`, the core's `Runner` over a backend.

The core decides (devbridge.statemachine.core) and the Engine executes: it carries out the effects
the core returns (a copy's host bytes released or made valid, the backend's frees, the events
settled, the held uses launched in issue order) and feeds the backend's answers back to the core
(devbridge.statemachine.runner: the procedure, shared with the sans-I/O checker). It also serves
the events its Bridge issued: what `done()`, `wait()`, a compute's `with` block and `await` ask.

A backend failure anywhere becomes a typed error and never loses an event: a failed query, wait
or marker settles the event as failed; a failed free is reported, never retried (FREE-3), and
never stops a restart. A synchronous call that must follow earlier uses waits for them without
the lock, blocking on the backend.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter

from devbridge.backends.base import Backend, BackendError
from devbridge.bridge import aio
from devbridge.bridge.events import ComputeEvent, Event, issued_by, settle
from devbridge.bridge.hostcheck import HostBytesCheck, copy_name
from devbridge.bridge.memory import MemoryBook
from devbridge.bridge.stats import Holder
from devbridge.bridge.trace import BridgeTrace
from devbridge.ring.host import HostRange
from devbridge.statemachine.core import Allocation, InFlight, LifecycleCore, Settle
from devbridge.statemachine.runner import Runner
from devbridge.statemachine.status import Status

#: How often wait_any queries again when no completion wakes it (for tokens a backend cannot report).
POLL_S = 0.002
log = logging.getLogger("devbridge")


class Engine(Runner):
    """A Bridge's backend, core and lock, and the execution of the core's effects on them."""

    def __init__(self, backend: Backend, core: LifecycleCore) -> None:
        super().__init__(core)
        self.backend = backend
        self.lock = threading.RLock()  # serialises the Bridge's calls and what the engine applies
        self.counts: Counter[str] = Counter()  # what `stats()` and `memory_stats()` count
        self.release_failures: list[str] = []  # deferred backend frees that failed, for the next poll()
        self.memory = MemoryBook()  # device memory held, now and at peak, in all and per role
        self.trace: BridgeTrace | None = None  # this bridge's tracks of a timeline, when tracing
        self.host_check: HostBytesCheck | None = None  # the host-bytes checking mode, when on
        self.progress = threading.Condition(threading.Lock())  # notified as completions arrive (wait_any)
        self.completions = 0  # completions reported or applied so far (under `progress`)
        drives = getattr(backend, "waits_run_work", False) is True  # its wait runs the work (the fake)
        self.watcher = aio.Watcher(self.progress, lambda: self.completions, self.drive if drives else None, POLL_S)

    # ------------------------------------------------------------ the device, for the runner

    def submit(self, use: InFlight) -> Status | None:
        record = self.core.allocation(use.allocations[0])
        assert record is not None and use.span is not None, "a held use keeps its allocation's record"
        try:
            token = self.copy(use.kind, record.memory, use.span[0], use.host, False)
        except BackendError as e:
            return Status(True, f"submitting it once its predecessors ended failed: {e}")
        if self.host_check is not None:
            self.host_check.launched(use.id, token, use.host)
        use.event.backend_token = token
        self.core.submitted(use, token)
        return None

    def query(self, use: InFlight) -> Status:
        return self.ask(use.token)

    def host_done(self, use: InFlight, ok: bool) -> None:
        host = use.host
        if use.kind == "copy_in":
            host.ring.end_read(host, release=ok)
        else:
            host.ring.end_write(host, valid=ok)
            if ok and self.host_check is not None:
                assert use.span is not None
                self.host_check.guard_output(host, copy_name(use.kind, use.allocations[0], use.span))

    def release_memory(self, record: Allocation, by: InFlight) -> None:
        if failure := self.free(record):
            self.release_failures.append(failure)

    def settle(self, effect: Settle) -> None:
        """The use's event is done (a view has none), counted by how it ended."""
        use, error = effect.use, effect.error
        if error is not None and not effect.broken:
            if effect.aborted:
                self.counts["aborted"] += 1
            else:
                self.counts["compute_failures" if use.kind == "compute" else "copy_failures"] += 1
        if use.event is not None:
            settle(use.event, error)
        if self.host_check is not None:
            self.host_check.ended(use.id, use.token)
        self.notify_progress()

    # ------------------------------------------------------------ the backend's calls

    def copy(self, kind: str, memory: object, offset: int, host: HostRange, sync: bool) -> object:
        """Hand a copy to the backend; its token."""
        if kind == "copy_in":
            return self.backend.copy_in(memory, offset, host.ring.raw(host), sync=sync)
        return self.backend.copy_out(host.ring.raw(host), memory, offset, sync=sync)

    def ask(self, token: object) -> Status:
        """The backend's status of a token; a failed query settles its use as failed (the protocol:
        a backend raises only for work it will not touch again)."""
        try:
            status = self.backend.query(token)
        except BackendError as e:
            status = Status(True, f"querying the backend failed: {e}")
        return status if self.host_check is None else self.host_check.completed(token, status)

    def fault(self, what: str) -> None:
        """Mark a failure on the trace, if any."""
        if self.trace is not None:
            self.trace.fault(what)

    def free(self, record: Allocation) -> str | None:
        """The one backend free of an allocation (FREE-2); a failure is returned, never retried."""
        try:
            self.backend.free(record.memory)
        except BackendError as e:
            self.counts["free_failures"] += 1
            self.memory.released(record.spec.role, record.extent, failed=True)  # never freed again
            if self.trace is not None:
                self.trace.fault(f"free of allocation #{record.id}")
            return f"releasing allocation #{record.id} (generation {record.generation}) failed: {e}"
        self.counts["backend_frees"] += 1
        self.memory.released(record.spec.role, record.extent, failed=False)
        return None

    # ------------------------------------------------------------ what its events ask

    def owns(self, event: object) -> bool:
        """Whether `event` is an event of this engine's bridge."""
        return issued_by(event, self)

    def refresh_event(self, event: Event) -> None:
        """Settle `event` if the backend is done with it (a held one: first what it follows)."""
        with self.lock:
            if (use := self.core.use(event.use_id)) is not None:
                self.refresh(use)

    def end_event(self, event: Event, status: Status) -> None:
        """End the event's use with `status` (once, whatever calls it)."""
        if (use := self.core.use(event.use_id)) is not None:
            self.end(use, status)

    def block(self, event: Event, timeout: float | None) -> None:
        """Block on the backend for `event`, or for a held event the oldest use it follows."""
        with self.lock:
            if (use := self.core.use(event.use_id)) is None:
                return
            if event.backend_token is None:
                event = self.core.blocker([use]).event
        try:
            self.backend.wait(event.backend_token, timeout)  # without the lock: may block
        except BackendError as e:
            with self.lock:
                if self.core.use(event.use_id) is not None:
                    self.end_event(event, Status(True, f"waiting on the backend failed: {e}"))

    def wait_for(self, event: Event) -> None:
        """Block, without the lock, until `event` (a use a call must follow) is done."""
        with self.lock:
            self.counts["waits"] += 1
        self.block(event, None)
        self.refresh_event(event)

    def drive(self, event: Event) -> None:
        """Wait on `event` as Event.wait does, not longer than it takes: for a backend whose wait
        runs the work it waits for (`waits_run_work`)."""
        self.block(event, 0)

    def enter(self, event: ComputeEvent) -> None:
        """A `with compute(...)` block began: the compute cannot end before the block does."""
        with self.lock:
            if (use := self.core.use(event.use_id)) is not None:
                use.open = True

    def close(self, event: ComputeEvent) -> None:
        """A `with compute(...)` block exited: the marker must cover the work it queued."""
        with self.lock:
            if (use := self.core.use(event.use_id)) is not None:
                use.open = False
                try:
                    self.backend.extend(event.backend_token)
                except BackendError as e:
                    self.end_event(event, Status(True, f"marking the end of the compute failed: {e}"))
            self.refresh_event(event)

    def future(self, event: Event) -> asyncio.Future[None]:
        """An asyncio future of the running loop that ends as `event` does."""
        return self.watcher.future(event)

    # ------------------------------------------------------------ completions

    def on_complete(self, token: object) -> None:
        """The backend reports a finished token, on any thread. Never blocks: a device thread
        must not wait for a caller that may be waiting for that thread (a synchronous copy
        ordered after queued ones). When the lock is busy, the next call applies it; done(),
        wait() and poll() also query the backend themselves, so nothing waits on this."""
        if self.lock.acquire(blocking=False):
            try:
                self.reported(token)
            finally:
                self.lock.release()
        else:
            self.core.reported(token)  # the lock's holder, or the next call, applies it
        self.notify_progress()  # a waiter in wait_any looks again (it queries the backend itself)

    def notify_progress(self) -> None:
        with self.progress:
            self.completions += 1
            self.progress.notify_all()

    def warn_long_waits(self, limit_s: float) -> None:
        """Log, once each, deferred releases waiting longer than `limit_s` (PIN-1): a JIT or a
        model that captured a view is found in minutes, not by a memory leak. One at a time: a
        log handler may call back and release one."""
        while (overdue := self.core.overdue(time.monotonic(), limit_s)) is not None:
            record, waited = overdue
            uses = sorted(self.core.dependents(record.id), key=lambda use: use.id)
            kinds = Counter(use.kind for use in uses)
            log.warning(
                "allocation #%d (%s, role %s) is %s after %.0f s; still in use by %s",
                record.id, record.spec.name, record.spec.role, record.state, waited,
                (", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "nothing")
                + (f" ({'; '.join(str(holder(use)) for use in uses)})" if uses else ""),
            )  # fmt: skip


def holder(use: InFlight) -> Holder:
    """A use in flight as `pins(h).uses` names it."""
    after = tuple(sorted(use.after or ()))
    return Holder(use.kind, use.id, use.span, bool(after), after, use.open)
