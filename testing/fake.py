"""FakeBackend: byte-accurate device memory that records every call.

Tests drive it: asynchronous events complete only when a test calls
`complete` (or `fail`), in any order. Each buffer sits between guard bytes,
so a write outside the requested range is caught. The fake also keeps its
own books and raises `FakeViolation` whenever the Bridge asks for something
the contract forbids: freeing memory that a pending event or a live view
uses, freeing twice, touching a buffer of an older generation, or running a
copy or compute before a pending one it conflicts with has finished
(ORDER-1: overlapping bytes of one buffer, one of them writing; two computes
are ordered by the device's queue and never conflict).

`wait` runs the work it is asked to wait for, as a device does when a host
synchronizes with it: a synchronous call that must follow a pending copy
makes progress in a single-threaded test instead of blocking forever.

Asynchronous data moves at completion time, as on a real device: an input
copy reads the host bytes when it completes, so host bytes released too
early show up as wrong device bytes, and the fake's own `late-read` check
names it: the bytes a copy reads must be the bytes it was given.

`reads_sync_late` seeds the bug of a device whose synchronous copy only
enqueues, as tinygrad's own `_copyin` on OpenCL does: the copy reports done
at submission, but moves its bytes only when the queue reaches it: once the
events pending ahead of it have all completed, and no earlier than the
fake's next call that submits or ends work. Until then the device bytes it
lands on are poison: whatever a real device holds there is not the copy's.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from devbridge.args import flag, optional_count
from devbridge.backends.base import Backend, BackendError, fault_count, implements
from devbridge.errors import short
from devbridge.statemachine.status import OK, PENDING, Status

GUARD = 64  # guard bytes on each side of a buffer
GUARD_BYTE = 0xA5
POISON_BYTE = 0xDD  # freed memory is poisoned, never returned to the OS
DEFAULT_CAPACITY = 1 << 30  # the fake device's memory: a huge extent fails like a real device's
WRITES = {"copy_in": True, "copy_out": False, "compute": True}  # whether each op writes what it touches


class FakeViolation(AssertionError):
    """The Bridge asked the fake backend for something the contract forbids; `kind` names which
    of the fake's checks refused it (one of VIOLATION_KINDS)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


VIOLATION_KINDS = (
    "unknown-buffer",  # free or use of a buffer the fake never made
    "double-free",  # a buffer freed twice
    "free-in-use",  # freed while a pending event uses it
    "free-under-view",  # freed while a live view can read it
    "unaligned-view",  # a view tinygrad's CPU kernels would crash on
    "freed-buffer",  # a copy, compute or view of a freed buffer
    "old-generation",  # a buffer of a generation a restart ended
    "out-of-bounds",  # a range outside the buffer
    "order",  # run before a pending use it conflicts with (ORDER-1)
    "guard-bytes",  # bytes outside the buffer were written
    "late-read",  # an input copy read host bytes that changed after it was issued (released too early)
)


@dataclass(frozen=True, slots=True)
class Call:
    """One backend call as the fake saw it. `buffer` is the fake's buffer id."""

    op: str
    buffer: int | None = None
    offset: int | None = None
    nbytes: int | None = None
    sync: bool | None = None
    event: int | None = None
    buffers: tuple[int, ...] = ()
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    generation: int = 0


@dataclass(eq=False)
class FakeBuffer:
    id: int
    nbytes: int
    dtype: str
    generation: int
    raw: np.ndarray[Any, np.dtype[np.uint8]]
    freed: bool = False
    views: list[weakref.ref[Any]] = field(default_factory=list)  # anchors: alive while a tensor reaches them

    @property
    def data(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        return self.raw[GUARD : GUARD + self.nbytes]

    def live_views(self) -> int:
        self.views = [v for v in self.views if v() is not None]
        return len(self.views)


@dataclass(eq=False)
class FakeEvent:
    id: int
    op: str
    buffers: tuple[int, ...]
    fail: bool
    apply: Callable[[], None] | None
    status: Status = PENDING
    span: tuple[int, int] | None = None  # the bytes a copy touches; None: all of its buffers
    after: tuple[int, ...] = ()  # reads_sync_late: the events whose end moves this one's bytes

    @property
    def pending(self) -> bool:
        return not self.status.done


@implements(Backend)
class FakeBackend:
    """A device in memory for tests (the module's docstring says how it behaves): the Backend
    protocol, plus controls (`complete`, `fail`, `fail_next`, `complete_all`, `hold` ...) and
    its own books (`calls`, `counts`, `violations`, `live_allocations`)."""

    name = "fake"
    #: A seeded device bug (see the module's docstring): synchronous copies done on return
    #: while their bytes move only after the events pending ahead of them.
    reads_sync_late = False

    def __init__(
        self,
        capacity: int | None = DEFAULT_CAPACITY,
        *,
        run_on_wait: bool = True,
        in_order: bool = False,
        calls_kept: int | None = None,
    ) -> None:
        """`capacity` is the device size in bytes (None: unlimited); beyond it alloc fails.
        `run_on_wait`: `wait` runs the pending work it waits for (False: it blocks until a test,
        maybe on another thread, completes it, or the timeout passes, like a hung device).
        `in_order`: one in-order queue, as a CL or CUDA stream runs it: an event completes only
        after every event submitted before it (completing one completes those first), and a
        synchronous copy runs once everything ahead of it has (a compute marker moves to the
        queue's tail when its `with` block exits).
        `calls_kept`: how many of the latest calls `calls` keeps (None: all of them; 0: none), for
        long runs; `counts` counts every call by op either way.

        The fake forgets what is over: a freed buffer (its id stays known as freed: ids are
        never reused), a settled event nobody holds, calls beyond `calls_kept`. Memory in use is
        a running count, so a soak of any length runs in flat memory and time."""
        self.capacity = optional_count("capacity", capacity, least=1)
        self.run_on_wait = flag("run_on_wait", run_on_wait)
        self.in_order = flag("in_order", in_order)
        kept = optional_count("calls_kept", calls_kept)
        #: While True, an asynchronous copy that is not armed to fail finishes at submission (its
        #: token is done on return), as the tinygrad backend does with a small copy to an idle CPU.
        self.finish_at_once = False
        #: While False, an input copy reads host bytes that changed after it was issued without a
        #: `late-read` violation: a test that writes into them on purpose, as a caller's bug the
        #: Bridge's host-bytes check is to catch, sees the device read them as a device would.
        self.checks_late_reads = True
        self._late: list[FakeEvent] = []  # reads_sync_late: copies reported done whose bytes wait
        self.generation = 0
        self.calls: list[Call] | deque[Call] = [] if kept is None else deque(maxlen=kept)
        self.counts: Counter[str] = Counter()  # every call by op, however many `calls` keeps
        self.violations: list[FakeViolation] = []  # each also raised where it happened
        self._buffers: dict[int, FakeBuffer] = {}  # live buffers; ids below _made that are not here were freed
        self._made = 0  # buffers made so far: the next buffer's id
        self._in_use = 0  # bytes of the live buffers
        # events by id while anyone (the Bridge, a test, the pending list) holds them
        self._events: weakref.WeakValueDictionary[int, FakeEvent] = weakref.WeakValueDictionary()
        self._made_events = 0
        self._live: list[FakeEvent] = []  # events that may be pending, oldest first (pruned as they finish)
        self._faults: Counter[str] = Counter()
        self._listeners: list[Callable[[object], None]] = []
        self._cond = threading.Condition(threading.RLock())

    # ------------------------------------------------------------ test controls

    def fail_next(self, op: str, times: int = 1) -> None:
        """Make the next `times` calls of `op` fail. Synchronous calls raise; an asynchronous
        copy or compute fails at completion. A failing `free` raises and keeps the buffer
        (the device refused); a failing `query` or `wait` raises and, if the event was
        pending, fails it: the device gives up that work, whose data never moves."""
        count = fault_count(op, times)
        with self._cond:
            self._faults[op] += count

    def pending(self) -> list[FakeEvent]:
        """Events not yet completed, oldest first."""
        with self._cond:
            self._live = [e for e in self._live if e.pending]
            return list(self._live)

    def complete(self, event: Any, *, report: bool = True) -> None:
        """Complete one pending event (a FakeEvent, its id, or a Bridge event); in order, the
        events ahead of it first. `report=False`: no listener hears of it (a device marker
        that cannot report): the Bridge finds it done when it queries."""
        ev = self._resolve(event)
        report = flag("report", report)
        self._run_ahead(ev, notify=report)
        self._finish(ev, None, notify=report)

    def fail(self, event: Any, message: str = "injected failure") -> None:
        """Fail one pending event: its data never moves (in order, the events ahead end first)."""
        ev = self._resolve(event)
        self._run_ahead(ev)
        self._finish(ev, message)

    def complete_all(self) -> int:
        """Complete every pending event, oldest first, and those the completions let the Bridge
        submit (held-back copies), until none is pending; how many there were."""
        done = 0
        while events := self.pending():
            self._finish(events[0], None)
            done += 1
        return done

    @property
    def live_allocations(self) -> int:
        """Buffers made and not yet freed."""
        with self._cond:
            return len(self._buffers)

    @property
    def events_known(self) -> int:
        """Events the fake still knows: pending ones, and settled ones somebody still holds."""
        with self._cond:
            return len(self._events)

    @property
    def bytes_in_use(self) -> int:
        """Bytes of the live buffers (a running count)."""
        return self._in_use

    def buffer(self, buffer_id: int) -> FakeBuffer:
        """A live buffer (KeyError once it is freed: the fake forgets it)."""
        return self._buffers[buffer_id]

    def device_bytes(self, buffer_id: int) -> bytes | None:
        """A live buffer's bytes; None once it is freed."""
        with self._cond:
            buf = self._buffers.get(buffer_id)
            return None if buf is None else bytes(buf.data)

    def live_views(self, buffer_id: int) -> int:
        """Views of a live buffer that a tensor still reaches; 0 once it is freed (a free under a
        live view is refused: `free-under-view`)."""
        with self._cond:
            buf = self._buffers.get(buffer_id)
            return 0 if buf is None else buf.live_views()

    def snapshot(self) -> tuple[object, ...]:
        """Calls, every live buffer's bytes (guards included) and the pending events: for
        tests asserting that a rejected call changed nothing."""
        with self._cond:
            return (
                tuple(self.calls),
                tuple(self.counts.items()),
                tuple((b.id, b.raw.tobytes()) for b in self._buffers.values()),
                tuple((e.id, e.status) for e in self.pending()),
                tuple(self._faults.items()),
            )

    def ops(self) -> list[str]:
        """The op of every call so far, in order."""
        return [c.op for c in self.calls]

    # ------------------------------------------------------------ Backend protocol

    def begin_generation(self, generation: int) -> None:
        with self._cond:
            self.generation = generation

    def alloc(self, nbytes: int, dtype: str) -> object:
        with self._cond:
            buffer_id = self._made
            self._record(Call("alloc", buffer_id, 0, nbytes, generation=self.generation))
            if self._take_fault("alloc") or (self.capacity is not None and self._in_use + nbytes > self.capacity):
                raise BackendError(f"fake: cannot allocate {nbytes} B")
            try:
                raw = np.full(nbytes + 2 * GUARD, GUARD_BYTE, dtype=np.uint8)
            except (MemoryError, ValueError) as e:  # host memory runs out before an unlimited fake
                raise BackendError(f"fake: cannot allocate {nbytes} B: {e}") from e
            raw[GUARD : GUARD + nbytes] = 0
            self._buffers[buffer_id] = FakeBuffer(buffer_id, nbytes, dtype, self.generation, raw)
            self._made += 1
            self._in_use += nbytes
            return buffer_id

    def free(self, buffer: object) -> None:
        with self._cond:
            self._run_late()
            buf = self._buffers.get(buffer) if isinstance(buffer, int) else None
            freed = buf is None and self._was_freed(buffer)
            if buf is None and not freed:
                self._violate("unknown-buffer", f"free of unknown buffer {buffer!r}")
            self._record(Call("free", int(buffer) if buf is None else buf.id, generation=self.generation))  # type: ignore[call-overload]
            if self._take_fault("free"):
                raise BackendError(f"fake: cannot free buffer #{buffer}")
            if buf is None:
                self._violate("double-free", f"buffer #{buffer} freed twice")
            assert buf is not None
            if busy := [e.id for e in self.pending() if buf.id in e.buffers]:
                self._violate("free-in-use", f"buffer #{buf.id} freed while events {busy} use it")
            if buf.live_views():
                self._violate("free-under-view", f"buffer #{buf.id} freed while {buf.live_views()} view(s) can read it")
            self._check_guards(buf)
            buf.freed = True
            buf.data[:] = POISON_BYTE  # for whoever still holds it (a test, a view's memory)
            del self._buffers[buf.id]
            self._in_use -= buf.nbytes

    def copy_in(self, buffer: object, offset: int, src: memoryview, *, sync: bool) -> object:
        with self._cond:
            self._run_late()
            buf = self._usable(buffer, offset, len(src), "copy_in")
            span = (offset, offset + len(src))
            given = bytes(src)

            def move() -> None:
                if (data := bytes(src)) != given and self.checks_late_reads:
                    self._violate(
                        "late-read",
                        f"copy_in into buffer #{buf.id} {span} read host bytes that changed after it was issued: "
                        "they were released before the device read them (H2D-2, H2D-3)",
                    )
                self._write(buf, offset, data)

            ev = self._new_event("copy_in", (buf.id,), move, span)
            self._record(Call("copy_in", buf.id, offset, len(src), sync, ev.id, generation=self.generation))
            return self._submit(ev, sync)

    def copy_out(self, dst: memoryview, buffer: object, offset: int, *, sync: bool) -> object:
        with self._cond:
            self._run_late()
            buf = self._usable(buffer, offset, len(dst), "copy_out")

            def move() -> None:
                dst[:] = buf.data[offset : offset + len(dst)].tobytes()

            ev = self._new_event("copy_out", (buf.id,), move, (offset, offset + len(dst)))
            self._record(Call("copy_out", buf.id, offset, len(dst), sync, ev.id, generation=self.generation))
            return self._submit(ev, sync)

    def compute(self, buffers: Sequence[object]) -> object:
        with self._cond:
            self._run_late()
            bufs = [self._usable(b, 0, 0, "compute") for b in buffers]
            ev = self._new_event("compute", tuple(b.id for b in bufs), None)
            self._record(Call("compute", event=ev.id, buffers=ev.buffers, generation=self.generation))
            return ev

    def extend(self, token: object) -> None:
        """A fake compute event completes when a test says so; in order, its marker moves to the
        queue's tail (it now covers the work its block queued), pending again if the queue had
        reached it while the block was open."""
        with self._cond:
            ev = self._resolve(token)
            if self.in_order:
                if ev in self._live:
                    self._live.remove(ev)
                ev.status = PENDING
                self._live.append(ev)

    def view(self, buffer: object, offset: int, shape: tuple[int, ...], dtype: str) -> Any:
        from devbridge.backends import tinygrad_compat as tg

        with self._cond:
            nbytes = int(np.prod(shape)) * tg.dtype_of(dtype).itemsize
            buf = self._usable(buffer, offset, nbytes, "view")
            self._record(Call("view", buf.id, offset, nbytes, shape=shape, dtype=dtype, generation=self.generation))
            if self._take_fault("view"):
                raise BackendError(f"fake: cannot view buffer #{buf.id}")
            if offset % tg.VIEW_ALIGNMENT:
                self._violate(
                    "unaligned-view", f"view at offset {offset} of buffer #{buf.id} would crash tinygrad's CPU kernels"
                )
            tensor = tg.blob_view(buf.raw.ctypes.data + GUARD + offset, shape, dtype)
            buf.views.append(weakref.ref(tg.view_anchor(tensor)))  # reached by every derived tensor
            return tensor

    def view_anchor(self, view: Any) -> object:
        from devbridge.backends import tinygrad_compat as tg

        try:
            return tg.view_anchor(view)
        except Exception as e:
            raise BackendError(f"fake: no buffer under the view: {e}") from e

    def view_alignment(self, dtype: str) -> int:
        """The fake's views are tinygrad CPU tensors over its memory: the CPU device's alignment."""
        from devbridge.backends import tinygrad_compat as tg

        return tg.VIEW_ALIGNMENT

    def query(self, token: object) -> Status:
        with self._cond:
            ev = self._resolve(token)
            self._lose_on_fault("query", ev)
            return ev.status

    def wait(self, token: object, timeout: float | None) -> bool:
        """Runs the event's work if it is pending (as a device does when synchronized with), so
        it is done on return, failed as armed; without `run_on_wait`, blocks for a completion."""
        with self._cond:
            ev = self._resolve(token)
            self._lose_on_fault("wait", ev)
            if not (self.run_on_wait and ev.pending):
                return self._cond.wait_for(lambda: not ev.pending, timeout)
        self._run_ahead(ev)
        self._finish(ev, None, settled_ok=True)  # another thread may have completed it meanwhile
        return True

    @property
    def waits_run_work(self) -> bool:
        """Whether `wait` runs the work it waits for (`run_on_wait`): `Bridge.wait_any` then
        waits as `Event.wait` does."""
        return self.run_on_wait

    def subscribe(self, callback: Callable[[object], None]) -> bool:
        with self._cond:
            self._listeners.append(callback)
        return True

    # ------------------------------------------------------------ mechanics

    def _violate(self, kind: str, message: str) -> None:
        assert kind in VIOLATION_KINDS, kind
        violation = FakeViolation(kind, message)
        self.violations.append(violation)
        raise violation

    def _lose_on_fault(self, op: str, ev: FakeEvent) -> None:
        """An armed query/wait fault: the device gives up the event's work (if still pending) and says so."""
        if self._take_fault(op):
            if ev.pending:
                ev.status = Status(True, f"fake: {op} failed; the work was abandoned")
                self._run_late()
                self._cond.notify_all()
            raise BackendError(f"fake: {op} of event #{ev.id} failed")

    def _record(self, call: Call) -> None:
        self.calls.append(call)
        self.counts[call.op] += 1

    def _was_freed(self, buffer: object) -> bool:
        """An id the fake made and then freed (ids are never reused)."""
        return isinstance(buffer, int) and 0 <= buffer < self._made and buffer not in self._buffers

    def _take_fault(self, op: str) -> bool:
        if self._faults[op] > 0:
            self._faults[op] -= 1
            return True
        return False

    def _usable(self, buffer: object, offset: int, nbytes: int, op: str) -> FakeBuffer:
        """The fake's independent checks on a buffer about to be touched."""
        buf = self._buffers.get(buffer) if isinstance(buffer, int) else None
        if buf is None and self._was_freed(buffer):
            self._violate("freed-buffer", f"{op} on freed buffer #{buffer}")
        if buf is None:
            self._violate("unknown-buffer", f"{op} on unknown buffer {buffer!r}")
        assert buf is not None
        if buf.generation != self.generation:
            self._violate("old-generation", f"{op} on buffer #{buf.id} of old generation {buf.generation}")
        if offset < 0 or nbytes < 0 or offset + nbytes > buf.nbytes:
            self._violate(
                "out-of-bounds", f"{op} [{offset}, {offset + nbytes}) outside buffer #{buf.id} of {buf.nbytes} B"
            )
        return buf

    def _new_event(
        self, op: str, buffers: tuple[int, ...], apply: Callable[[], None] | None, span: tuple[int, int] | None = None
    ) -> FakeEvent:
        self._check_order(op, buffers, span)
        ev = FakeEvent(self._made_events, op, buffers, self._take_fault(op), apply, span=span)
        self._made_events += 1
        self._events[ev.id] = ev
        self._live.append(ev)
        return ev

    def _check_order(self, op: str, buffers: tuple[int, ...], span: tuple[int, int] | None) -> None:
        """ORDER-1, checked on the fake's own books: nothing runs before a pending conflicting use."""
        for ev in self.pending():
            if not set(ev.buffers) & set(buffers) or op == ev.op == "compute":
                continue
            overlap = ev.span is None or span is None or (ev.span[0] < span[1] and span[0] < ev.span[1])
            if overlap and (WRITES[op] or WRITES[ev.op]):
                self._violate(
                    "order",
                    f"{op} {span or 'whole'} on buffers {list(buffers)} submitted while pending event #{ev.id} "
                    f"({ev.op} {ev.span or 'whole'}) touches the same bytes",
                )

    def _submit(self, ev: FakeEvent, sync: bool) -> FakeEvent:
        if not (sync or (self.finish_at_once and not ev.fail)):
            return ev
        if ev.fail:
            ev.status = Status(True, f"fake: {ev.op} failed")
            raise BackendError(ev.status.error)
        if sync and self.reads_sync_late:  # reported done now; the bytes move when the queue reaches it
            ev.after = tuple(e.id for e in self.pending() if e is not ev)
            self._late.append(ev)
            if ev.op == "copy_in" and ev.span is not None:  # the bytes it lands on are none until it does
                self._buffers[ev.buffers[0]].data[ev.span[0] : ev.span[1]] = POISON_BYTE
        else:
            self._run_ahead(ev, notify=False)  # the caller holds its locks: it finds them done later
            if ev.apply:
                ev.apply()
        ev.status = OK
        return ev

    def _run_late(self) -> None:
        """reads_sync_late: move the bytes of the copies whose events ahead have all ended (at the
        next call that submits or ends work: the device runs what is ready before taking more)."""
        while ready := [e for e in self._late if not any(self._pending(a) for a in e.after)]:
            for ev in ready:
                self._late.remove(ev)
                if ev.apply:
                    ev.apply()

    def _write(self, buf: FakeBuffer, offset: int, data: bytes) -> None:
        buf.data[offset : offset + len(data)] = np.frombuffer(data, dtype=np.uint8)
        self._check_guards(buf)

    def _check_guards(self, buf: FakeBuffer) -> None:
        if (buf.raw[:GUARD] != GUARD_BYTE).any() or (buf.raw[GUARD + buf.nbytes :] != GUARD_BYTE).any():
            self._violate("guard-bytes", f"bytes outside buffer #{buf.id} were written")

    def _pending(self, event_id: int) -> bool:
        ev = self._events.get(event_id)  # one nobody holds any more is not pending: _live holds those
        return ev is not None and ev.pending

    def _resolve(self, token: Any) -> FakeEvent:
        token = getattr(token, "backend_token", token)
        key = token.id if isinstance(token, FakeEvent) else token
        ev = self._events.get(key) if type(key) is int else None  # (event ids are ints: a list is none)
        if ev is None:
            raise KeyError(f"no fake event {short(token)}")
        return ev

    def _run_ahead(self, ev: FakeEvent, notify: bool = True) -> None:
        """In order: end the events submitted before `ev`, oldest first, each as armed."""
        if not self.in_order:
            return
        for earlier in self.pending():
            if earlier is ev:
                return
            self._finish(earlier, None, settled_ok=True, notify=notify)

    def _finish(self, ev: FakeEvent, failure: str | None, settled_ok: bool = False, notify: bool = True) -> None:
        with self._cond:
            if not ev.pending:
                if settled_ok:
                    return
                raise ValueError(f"fake event #{ev.id} ({ev.op}) is not pending")
            if failure is None and ev.fail:
                failure = f"fake: {ev.op} failed"
            if failure is None and ev.apply is not None:
                ev.apply()
            ev.status = Status(True, failure)
            self._run_late()
            self._cond.notify_all()
            listeners = list(self._listeners) if notify else []
        for listener in listeners:  # outside the lock: listeners take the Bridge's lock
            listener(ev)
