"""HostRing: host ring memory with exact release and validity points.

Bytes are addressed by *stream offset*: monotone, never wrapping; byte `s`
lives at `s % capacity`. A reservation never straddles the end of the
buffer (the ring skips to the next lap; skipped bytes are free). The ring
tracks which reserved bytes are unreleased, which are read by pending input
copies, written by pending output copies, or left invalid by a failed one.

`cursor` is the first unreleased byte (or the head when none is): it is
monotone and never passes an unreleased byte (RING-1). The Bridge drives the
copy-facing methods; the worker calls `reserve`, `view`, `release`.

Records hand filled ranges from producers to one consumer: `commit` gives a
whole reservation the ring's next sequence number, `take` returns committed
records in sequence order (RING-4), and `consume` makes a new consumer
generation, which gets the records its predecessor took and did not release
again, first (RING-5). A taken record's bytes return to the ring only when all
of them are released, so a record delivered again is whole. `HostRing.create`
and `HostRing.attach` give the same ring in shared memory, across processes
(devbridge.ring.shared).
"""

from __future__ import annotations

import importlib
import threading
import time
from bisect import bisect_right, insort
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from devbridge.args import as_count, as_seconds
from devbridge.errors import (
    InvalidArgumentError,
    OutputNotReadyError,
    RangeError,
    RingFullError,
    StaleHandleError,
    WaitTimeoutError,
    short,
)
from devbridge.ring.buffers import array_layout, byte_view
from devbridge.types import range_fields, slot_setters

if TYPE_CHECKING:
    from types import ModuleType

    import numpy as np


#: Largest ring the bridge allocates (1 TiB): more is a caller's bug, not a request.
MAX_CAPACITY = 1 << 40

Span = tuple[int, int]  # [start, end) in stream bytes
#: `HostRing.state()`: head, unreleased starts and ends, pending reads, pending writes, failed outputs.
RingState = tuple[int, tuple[int, ...], tuple[int, ...], tuple[Span, ...], tuple[Span, ...], tuple[Span, ...]]


def _minus(spans: list[Span], cut: Span) -> list[Span]:
    """`spans` with the bytes of `cut` removed."""
    out: list[Span] = []
    for s, e in spans:
        if e <= cut[0] or cut[1] <= s:
            out.append((s, e))
            continue
        if s < cut[0]:
            out.append((s, cut[0]))
        if cut[1] < e:
            out.append((cut[1], e))
    return out


def _overlaps(spans: list[Span], r: HostRange) -> bool:
    return any(s < r.end and r.start < e for s, e in spans)


class _Record:
    """A committed reservation (in a shared ring, every reservation of this process's): its
    bytes, its sequence number (-1 before commit), the consumer generation that took it (0:
    not taken), whether it is delivered again, and its slot in a shared ring's table."""

    __slots__ = ("end", "redelivered", "seq", "slot", "start", "taken")

    def __init__(self, start: int, end: int, seq: int, slot: int = -1) -> None:
        self.start, self.end, self.seq, self.slot = start, end, seq, slot
        self.taken = 0
        self.redelivered = False


class HostRing:
    """Host memory as a ring of stream bytes: `reserve` hands out ranges at a monotone stream
    offset, `view` exposes a range's bytes, and bytes are released (by the bridge after an
    input copy, or by `release`) in any order; `cursor` is the offset below which all are.
    Bytes an output copy has not yet written cannot be read (D2H-3); bytes an input copy
    still reads cannot be written or released (H2D-3). Thread-safe."""

    def __init__(self, capacity: int) -> None:
        size = as_count(capacity)
        if size is None or not 0 < size <= MAX_CAPACITY:
            raise RangeError("RANGE-1", f"ring capacity must be an int in [1, 2**40], got {short(capacity)}")
        try:
            memory = bytearray(size)
        except MemoryError as e:
            raise RangeError("RANGE-1", f"cannot allocate a ring of {size} B") from e
        self._setup(size, memoryview(memory))

    def _setup(self, size: int, memory: memoryview) -> None:
        self.capacity = size
        self._memory = memory
        self._lock = threading.Lock()  # never taken twice: no locked method calls another
        self._freed = threading.Condition(self._lock)  # notified when bytes are released
        self._waiting = 0  # reservations blocked on `_freed` (a release notifies only then)
        self._head = 0
        # Unreleased bytes, one span per reservation (split by partial releases), sorted.
        self._starts: list[int] = []
        self._ends: list[int] = []
        # starts of spans that are what is left of a reservation released in part: never
        # committed (stream offsets never repeat, so one whose span went since is harmless)
        self._trimmed: set[int] = set()
        self._reads: list[Span] = []  # pending input copies (a multiset)
        self._writes: list[Span] = []  # pending output copies
        self._failed: list[Span] = []  # outputs whose copy failed: never readable
        # checks to run on bytes before their next view, commit or release (`guard`), by start
        self._guards: dict[int, tuple[int, Callable[[memoryview], None]]] = {}
        # Records: committed reservations by start until released whole (their starts sorted),
        # those committed and not yet taken in sequence order, and the consumer generations.
        self._records: dict[int, _Record] = {}
        self._record_starts: list[int] = []
        self._ready: deque[_Record] = deque()
        self._committed = threading.Condition(self._lock)  # notified on commit and consume
        self._next_seq = 0
        self._generation = 0  # the ring's consumer generation (0: no consumer yet)
        self._consumer: int | None = None  # the generation this object consumes as
        self.redelivered = 0  # records delivered again to a new consumer

    # ------------------------------------------------------------ across processes

    @classmethod
    def create(cls, name: str, capacity: int, *, records: int = 4096) -> HostRing:
        """A new ring in the shared-memory segment `name` (a file under /dev/shm, mode 0600),
        for producers and a consumer in other processes of this user (`attach`).

        Args:
            name: the segment's name: 1 to 200 letters, digits, '_', '.' or '-'.
            capacity: the ring's bytes, an int in [1, 2**40].
            records: how many reservations may be live at once (the segment's slot table).

        Raises:
            InvalidArgumentError: ARG-1 for a bad or taken name, or a bad `records`.
            RangeError: RANGE-1 for a bad capacity."""
        ring: HostRing = _shared().SharedRing.create_segment(name, capacity, records)
        return ring

    @classmethod
    def attach(cls, name: str) -> HostRing:
        """The shared ring `name` that a process of this user created.

        Raises:
            InvalidArgumentError: ARG-1 when no segment has that name.
            RingCorruptError: SHM-1 when it is not a devbridge ring, not this user's alone, or
                its header does not hold a ring's sizes."""
        ring: HostRing = _shared().SharedRing.attach_segment(name)
        return ring

    def close(self) -> None:
        """Detach from a shared ring; an in-process ring has nothing to detach."""

    def unlink(self) -> None:
        """Remove a shared ring's name. ARG-1 on an in-process ring: it has none."""
        raise InvalidArgumentError("ARG-1", "an in-process ring has no name to unlink")

    # ------------------------------------------------------------ worker API

    @property
    def cursor(self) -> int:
        """Stream offset below which every byte is released."""
        with self._lock:
            cursor = self._starts[0] if self._starts else self._head
            # a taken record holds all its bytes until the last is released (RING-5)
            return min(cursor, self._record_starts[0]) if self._record_starts else cursor

    @property
    def head(self) -> int:
        """Stream offset where the next reservation starts (before any lap skip)."""
        return self._head

    def reserve(self, nbytes: int, *, timeout: float | None = 0.0) -> HostRange:
        """Reserve `nbytes` contiguous bytes at the head of the stream.

        Args:
            nbytes: how many bytes, an int >= 1.
            timeout: how long to wait for enough bytes to be released, in seconds: 0 (the
                default) does not wait, None waits for as long as it takes. A waiting call
                sleeps on a condition that every release signals; it never spins.

        Returns:
            The reserved range, writable through `view` until released.

        Raises:
            RangeError: RANGE-1, for `nbytes` that is not an int >= 1.
            InvalidArgumentError: ARG-1, for a timeout that is not None or seconds >= 0.
            RingFullError: RING-2, when they do not fit by the timeout (a reservation that
                fits always succeeds), or at once when they exceed the ring's capacity;
                nothing is overwritten or changed."""
        n = nbytes if type(nbytes) is int else as_count(nbytes)
        if n is None or n <= 0:
            raise RangeError("RANGE-1", f"reservation size must be a positive int, got {short(nbytes)}")
        # (the default, 0.0, without a check: this is the per-call path)
        no_wait = type(timeout) is float and timeout == 0.0
        wait = 0.0 if no_wait else None if timeout is None else as_seconds(timeout, "a reservation's timeout")
        if n > self.capacity:
            raise RingFullError("RING-2", f"reserving {n} B: larger than the ring's capacity of {self.capacity} B")
        self._lock.acquire()  # (not `with`: half its cost, on the per-call path)
        try:
            start = self._fit(n)
            if start is None and wait != 0:
                start = self._wait_for_room(n, wait)
            if start is None:
                raise RingFullError("RING-2", f"reserving {n} B: the largest free stretch is {self._largest_free()} B")
            self._starts.append(start)
            self._ends.append(start + n)
            self._head = start + n
            return made_range(self, start, n)
        finally:
            self._lock.release()

    def write(self, r: HostRange, data: Any) -> None:
        """Copy `data` into the bytes of `r`.

        Args:
            r: an unreleased range of this ring.
            data: any C-contiguous buffer of exactly `r.nbytes` bytes: bytes, bytearray, a
                memoryview of any format, a numpy array of any dtype.

        Raises:
            InvalidArgumentError: ARG-1, for data that is not a C-contiguous buffer.
            RangeError: RANGE-1 when its size is not `r.nbytes`; RING-3 when `r` is not
                unreleased; H2D-3 while an input copy still reads `r`.
            OutputNotReadyError: D2H-3 while an output copy into `r` is not valid.
        Nothing is written when it raises."""
        r = plain(r)
        source = byte_view(data)
        if source.nbytes != getattr(r, "nbytes", None):
            raise RangeError("RANGE-1", f"{source.nbytes} B of data for {short(r)}")
        target = self.view(r)
        if target.readonly:
            raise RangeError("H2D-3", f"host bytes {_fmt(r)} are still read by a pending input copy")
        target[:] = source

    def array(self, r: HostRange, dtype: Any, shape: Any = None) -> np.ndarray:
        """The bytes of `r` as a numpy array, without a copy.

        Args:
            r: an unreleased range of this ring.
            dtype: anything numpy takes as a dtype.
            shape: the array's shape (an int or a sequence of ints); None: one dimension over
                the whole range.

        Returns:
            An array over the ring's memory: read-only while an input copy still reads `r`.

        Raises:
            InvalidArgumentError: ARG-1, for what is not a numpy dtype of fixed-size items, or
                a shape that is not an int or a sequence of ints >= 0.
            RangeError: RANGE-1 when the shape's bytes (or, without a shape, a whole number of
                items) are not exactly `r.nbytes`; RING-3 when `r` is not unreleased.
            OutputNotReadyError: D2H-3 while an output copy into `r` has not completed."""
        import numpy as np

        r = plain(r)
        memory = self.view(r)
        kind, dims, nbytes = array_layout(dtype, shape)
        if nbytes is None:
            if r.nbytes % kind.itemsize:
                raise RangeError("RANGE-1", f"{r.nbytes} B of {_fmt(r)} are not a whole number of {kind}")
            return np.frombuffer(memory, dtype=kind)
        if nbytes != r.nbytes:
            raise RangeError(
                "RANGE-1", f"{nbytes} B of {kind} in shape {short(shape)} for the {r.nbytes} B of {_fmt(r)}"
            )
        return np.frombuffer(memory, dtype=kind).reshape(dims)

    def view(self, r: HostRange) -> memoryview:
        """The bytes of an unreleased range: writable, except read-only while an input copy
        still reads them (H2D-3); refused while an output copy into them is not valid (D2H-3)."""
        r = plain(r)
        with self._lock:
            self._check_live(r, "RING-3")
            if self._writes and _overlaps(self._writes, r):
                raise OutputNotReadyError("D2H-3", f"host bytes {_fmt(r)} are still being copied from the device")
            if self._failed and _overlaps(self._failed, r):
                raise OutputNotReadyError("D2H-3", f"host bytes {_fmt(r)} belong to a failed output copy")
            if self._guards:
                self._run_guards(r)
            view = self.raw(r)
            return view.toreadonly() if self._reads and _overlaps(self._reads, r) else view

    def released(self, r: HostRange) -> bool:
        """Whether every byte of `r` is released. Bytes never reserved are an error (RING-1)."""
        r = plain(r)
        with self._lock:
            self._check_ring(r)
            if r.end > self._head:
                raise RangeError("RING-1", f"host bytes {_fmt(r)} were never reserved (head is {self._head})")
            return not self._any_unreleased(r)

    def _any_unreleased(self, r: HostRange) -> bool:  # the lock held
        """Whether any byte of `r` lies in an unreleased span."""
        i = max(bisect_right(self._starts, r.start) - 1, 0)
        while i < len(self._starts) and self._starts[i] < r.end:
            if self._ends[i] > r.start:
                return True
            i += 1
        return False

    def release(self, r: HostRange) -> None:
        """Release bytes the worker consumed. Refused for bytes a pending copy still uses."""
        r = plain(r)
        with self._lock:
            self._check_live(r, "RING-1")
            if self._reads and _overlaps(self._reads, r):
                raise RangeError("H2D-3", f"host bytes {_fmt(r)} are still read by a pending input copy")
            if self._writes and _overlaps(self._writes, r):
                raise RangeError("RING-3", f"host bytes {_fmt(r)} are still written by a pending output copy")
            if self._guards:
                self._run_guards(r)
            self._cut(r)
            if self._failed:
                self._failed = _minus(self._failed, (r.start, r.end))

    def unreleased(self) -> list[HostRange]:
        """The unreleased spans, oldest first."""
        with self._lock:
            return [made_range(self, s, e - s) for s, e in zip(self._starts, self._ends, strict=True)]

    # ------------------------------------------------------------ records

    def commit(self, r: HostRange, *, finishes: HostRange | None = None) -> int:
        """Hand a filled reservation to the consumer: it becomes the record with the ring's next
        sequence number (0, 1, 2, ... in commit order), and nobody's until `take` gives it out.

        Args:
            r: a whole unreleased reservation of this ring (not part of one), no copy pending on it.
            finishes: a record this process took from another ring (of the same kind) that `r`
                is the output of. The commit then releases it too, in the same step (RING-7):
                each input record gets at most one output. On shared rings a crash
                between the two halves is recovered as one: the input, delivered again, is known
                finished (`finished`), and committing an output for it again commits nothing.
                Its bytes must all be unreleased (upload it with `release=False`).

        Returns:
            The record's sequence number (with `finishes`: that of the output that finished it,
            an earlier one when it was finished before a crash).

        Raises:
            RangeError: RING-4 when `r` is not one whole unreleased reservation, or is a record
                already; RING-7 when `finishes` is not a whole record this consumer took with
                every byte unreleased; RING-3 while a copy into or from either is pending.
            OutputNotReadyError: D2H-3 when an output copy into it failed.
            StaleHandleError: GEN-2 on a consumer that a newer one replaced (of either ring).
            InvalidArgumentError: ARG-1 when `finishes` is not a record of another ring of this
                kind, or this ring's outputs finish another ring's records.
        Nothing changes when it raises."""
        r = plain(r)
        if finishes is not None:
            return self._commit_finishing(r, plain(finishes))
        with self._lock:
            return self._commit_locked(*self._check_commit(r))

    def _commit_locked(self, start: int, end: int) -> int:  # the lock held, the commit checked
        record = _Record(start, end, self._next_seq)
        self._next_seq += 1
        self._records[start] = record
        insort(self._record_starts, start)
        self._ready.append(record)
        self._committed.notify_all()
        return record.seq

    def _commit_finishing(self, r: HostRange, finishes: HostRange) -> int:
        source = self._source_of(finishes)
        first, second = sorted((source, self), key=id)  # one order for every pair: no deadlock
        with first._lock, second._lock:
            start, end = self._check_commit(r)
            record = source._check_finishable(finishes)
            seq = self._commit_locked(start, end)
            source._cut_span(record.start, record.end)  # the input record goes with the same lock held
            return seq

    def _source_of(self, finishes: object) -> HostRing:
        """The ring a record this ring's output finishes came from (ARG-1 for anything else)."""
        source = finishes.ring if isinstance(finishes, HostRange) and finishes.seq is not None else None
        if source is None or type(source) is not type(self) or source is self:
            raise InvalidArgumentError(
                "ARG-1", f"an output finishes a record taken from another ring of its kind, got {short(finishes)}"
            )
        return source

    def _check_finishable(self, r: HostRange) -> _Record:  # the lock held
        """The record `r` when an output may finish it: a whole record this consumer took, every
        byte unreleased, no copy pending on it."""
        self._check_live(r, "RING-7")
        record = self._records.get(r.start)
        if record is None or record.seq != r.seq or not record.taken or record.end != r.end:
            raise RangeError("RING-7", f"host bytes {_fmt(r)} are not a whole record this consumer took")
        if not self._whole(r.start, r.end):
            raise RangeError(
                "RING-7", f"bytes of record {_fmt(r)} were released: the output's commit releases a record it finishes"
            )
        if _overlaps(self._reads, r) or _overlaps(self._writes, r):
            raise RangeError("RING-3", f"host bytes {_fmt(r)} are in use by a pending copy")
        return record

    def finished(self, r: HostRange) -> int | None:
        """The sequence number of this ring's output that finished record `r` (see `commit`'s
        `finishes`), or None. In one process a finished record is released in the same step and
        never delivered again, so this is None; on shared rings, a record delivered again after a
        crash between the two halves is known here. A worker asks it of each record it takes
        with `r.redelivered`, and releases instead of redoing one that is finished.

        Raises:
            InvalidArgumentError: ARG-1 when `r` is not a record taken from another ring of this kind."""
        self._source_of(plain(r))
        return None

    def take(self, timeout: float | None = None) -> HostRange:
        """The next committed record, in sequence order: first those a previous consumer took and
        did not release (`r.redelivered`), then new ones. Its bytes are this consumer's to view,
        copy and release; they return to the ring when all of them are released.

        Args:
            timeout: how long to wait for a commit, in seconds; None waits for as long as it
                takes. A waiting call sleeps until a commit wakes it; it never spins.

        Returns:
            The record's range, with `r.seq` and `r.redelivered`.

        Raises:
            WaitTimeoutError: WAIT-1 when no record is committed by the timeout.
            StaleHandleError: GEN-2 on a consumer that a newer one replaced (a waiting call
                raises it when the replacement comes).
            InvalidArgumentError: ARG-1 for a timeout that is not None or seconds >= 0.
        The first `take` of a ring that has no consumer yet makes the caller its consumer."""
        wait = None if timeout is None else as_seconds(timeout, "take's timeout")
        deadline = None if wait is None else time.monotonic() + wait
        with self._lock:
            self._check_consumer()
            while not self._ready:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeoutError("WAIT-1", f"no record was committed within {wait} s")
                self._committed.wait(left)
                self._check_consumer()
            record = self._ready.popleft()
            record.taken = self._generation
            return record_range(self, record)

    def consume(self) -> int:
        """Become the ring's consumer: the ring's next consumer generation (1, 2, ...). Records
        the previous consumer took and did not release whole are delivered again, first, in
        sequence order; a previous consumer elsewhere is fenced: its calls raise GEN-2.

        Raises:
            StaleHandleError: GEN-2 on a consumer that a newer one replaced."""
        with self._lock:
            self._check_fence()
            self._generation += 1
            self._consumer = self._generation
            again = sorted((r for r in self._records.values() if r.taken), key=lambda r: r.seq)
            for record in again:
                record.taken, record.redelivered = 0, True
                self._rejoin(record.start, record.end)
            self.redelivered += len(again)
            self._ready.extendleft(reversed(again))
            self._committed.notify_all()
            return self._generation

    @property
    def generation(self) -> int:
        """The ring's consumer generation: how many times a consumer took the role."""
        return self._generation

    def lock_held(self) -> bool:
        """Whether another process holds the ring's lock now: never, for a ring of one process
        (a shared ring's says; see SharedRing.lock_held)."""
        return False

    def _check_commit(self, r: HostRange) -> Span:  # the lock held
        """The bytes of `r` when it may be committed (see `commit`)."""
        self._check_fence()
        self._check_live(r, "RING-4")
        if not self._whole(r.start, r.end) or r.start in self._trimmed:
            raise RangeError("RING-4", f"host bytes {_fmt(r)} are not one whole unreleased reservation")
        record = self._records.get(r.start)
        if record is not None and record.seq >= 0:
            raise RangeError("RING-4", f"host bytes {_fmt(r)} are a record already")
        if _overlaps(self._reads, r) or _overlaps(self._writes, r):
            raise RangeError("RING-3", f"host bytes {_fmt(r)} are in use by a pending copy")
        if _overlaps(self._failed, r):
            raise OutputNotReadyError("D2H-3", f"host bytes {_fmt(r)} belong to a failed output copy")
        if self._guards:
            self._run_guards(r)
        return r.start, r.end

    def _check_consumer(self) -> None:  # the lock held
        """The caller may take: this object is the current consumer (or the ring has none yet)."""
        if self._consumer is None and self._generation == 0:
            self._generation = self._consumer = 1
        self._check_fence()
        if self._consumer is None:
            raise StaleHandleError(
                "GEN-2", f"another consumer holds this ring (generation {self._generation}): consume() takes over"
            )

    def _check_fence(self) -> None:
        """GEN-2 for a consumer that a newer one replaced (in one process there is none)."""

    def _rejoin(self, start: int, end: int) -> None:  # the lock held
        """Make [start, end) one unreleased span again (a record delivered again: its released
        bytes were held, never reused)."""
        i = bisect_right(self._starts, start)
        j = i
        while j < len(self._starts) and self._starts[j] < end:
            j += 1
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]

    def _record_at(self, start: int, end: int) -> _Record | None:  # the lock held
        """The record holding the bytes [start, end), if any."""
        i = bisect_right(self._record_starts, start) - 1
        if i >= 0:
            record = self._records[self._record_starts[i]]
            if end <= record.end:
                return record
        return None

    def _check_taken(self, r: HostRange, rule: str) -> None:  # the lock held, `r` live
        """A record's bytes are nobody's between its commit and its take (RING-4)."""
        record = self._record_at(r.start, r.end)
        if record is not None and record.seq >= 0 and not record.taken:
            raise RangeError("RING-4", f"host bytes {_fmt(r)} are committed, not taken yet")

    def _settle_record(self, start: int) -> None:  # the lock held, bytes at `start` released
        """Forget the record holding `start` once none of its bytes is unreleased."""
        record = self._record_at(start, start + 1)
        if record is None:
            return
        i = bisect_right(self._starts, record.start) - 1
        if i >= 0 and self._ends[i] > record.start:
            return
        if i + 1 < len(self._starts) and self._starts[i + 1] < record.end:
            return
        del self._records[record.start]
        self._record_starts.remove(record.start)
        self._record_released(record)

    def _record_released(self, record: _Record) -> None:
        """All bytes of a record are released (a shared ring frees its slot here)."""

    # ------------------------------------------------------------ Bridge API

    def check_copy(self, r: HostRange, into_device: bool) -> None:
        """A copy may use `r`: an input copy (`into_device`) read it (RING-3, D2H-3), an output
        copy write it (RING-3). Changes nothing."""
        self._lock.acquire()  # (not `with`: half its cost, on the per-call path)
        try:
            if type(r) is not HostRange or r.ring is not self or self._records:
                self._check_live(r, "RING-3")  # (a taken record's range: its own checks)
            else:  # one unreleased span holds it (the per-call path: `_check_live`'s test, no call)
                i = bisect_right(self._starts, r.start) - 1
                if i < 0 or r.start + r.nbytes > self._ends[i]:
                    self._check_live(r, "RING-3")
            if into_device:
                if self._writes and _overlaps(self._writes, r):
                    raise RangeError("RING-3", f"host bytes {_fmt(r)} are being written by a pending output copy")
                if self._failed and _overlaps(self._failed, r):
                    raise OutputNotReadyError("D2H-3", f"host bytes {_fmt(r)} belong to a failed output copy")
            elif (self._reads and _overlaps(self._reads, r)) or (self._writes and _overlaps(self._writes, r)):
                raise RangeError("RING-3", f"host bytes {_fmt(r)} are in use by a pending copy")
        finally:
            self._lock.release()

    def guard(self, r: HostRange, check: Callable[[memoryview], None]) -> None:
        """Run `check` on the bytes of `r` before the next view, array, commit or release of any
        of them, once; what it raises refuses that call, which changes nothing. For the Bridge's
        host-bytes check (devbridge.bridge.hostcheck)."""
        if type(r) is not HostRange or r.ring is not self:
            r = self._range_of_this_ring(r)
        if not callable(check):
            raise InvalidArgumentError("ARG-1", f"a guard's check must be callable, got {short(check)}")
        with self._lock:
            for start in [
                s for s, (e, _) in self._guards.items() if not self._any_unreleased(made_range(self, s, e - s))
            ]:
                del self._guards[start]  # (released since, by other means)
            self._guards[r.start] = (r.start + r.nbytes, check)

    def _run_guards(self, r: HostRange) -> None:  # the lock held
        end = r.start + r.nbytes
        for start, (stop, check) in list(self._guards.items()):
            if start < end and r.start < stop:
                del self._guards[start]
                check(self.raw(made_range(self, start, stop - start)))

    def _range_of_this_ring(self, r: object) -> HostRange:
        """`r` when it is a range of this ring, for the calls the Bridge makes after its checks
        (a caller that makes them itself gets RANGE-1 for anything else, not an AttributeError)."""
        r = plain(r)  # type: ignore[arg-type]
        self._check_ring(r)
        return r

    def raw(self, r: HostRange) -> memoryview:
        """The bytes of `r` with no checks of its state: for the Bridge, after `check_copy`."""
        if type(r) is not HostRange or r.ring is not self:
            r = self._range_of_this_ring(r)
        pos = r.start % self.capacity
        return self._memory[pos : pos + r.nbytes]

    def begin_read(self, r: HostRange) -> None:
        """An input copy starts reading `r` (checked by `check_copy` first): its bytes are
        read-only until `end_read` (H2D-3). For the Bridge."""
        if type(r) is not HostRange or r.ring is not self:
            r = self._range_of_this_ring(r)
        with self._lock:
            self._reads.append((r.start, r.end))

    def end_read(self, r: HostRange, release: bool) -> None:
        """An input copy is done. On success its bytes are released, except those other
        pending input copies still read (they go when the last of those succeeds)."""
        if type(r) is not HostRange or r.ring is not self:
            r = self._range_of_this_ring(r)
        with self._lock:
            try:
                self._reads.remove((r.start, r.end))
            except ValueError:
                raise InvalidArgumentError("ARG-1", f"no input copy of host bytes {_fmt(r)} began") from None
            if release:
                self._release_read(r)

    def read_done(self, r: HostRange, release: bool) -> None:
        """A synchronous input copy read `r` (begin_read and end_read in one)."""
        if type(r) is not HostRange or r.ring is not self:
            r = self._range_of_this_ring(r)
        if release:
            self._lock.acquire()  # (not `with`: half its cost, on the per-call path)
            try:
                if self._reads:
                    self._release_read(r)
                else:  # no other input copy reads any byte: all of `r` goes (the per-call path)
                    self._cut_span(r.start, r.start + r.nbytes)
            finally:
                self._lock.release()

    def _release_read(self, r: HostRange) -> None:
        pieces = [(r.start, r.start + r.nbytes)]
        for span in self._reads:
            pieces = _minus(pieces, span)
        for s, e in pieces:
            self._cut_span(s, e)

    def begin_write(self, r: HostRange) -> None:
        """An output copy starts writing `r` (checked by `check_copy` first): its bytes are not
        readable until `end_write` says they are valid (D2H-3). For the Bridge."""
        if type(r) is not HostRange or r.ring is not self:
            r = self._range_of_this_ring(r)
        with self._lock:
            self._writes.append((r.start, r.end))
            self._failed = _minus(self._failed, (r.start, r.end))

    def write_done(self, r: HostRange) -> None:
        """A synchronous output copy wrote `r`: its bytes are valid (begin_write and end_write in one)."""
        if type(r) is not HostRange or r.ring is not self:
            r = self._range_of_this_ring(r)
        with self._lock:
            if self._failed:
                self._failed = _minus(self._failed, (r.start, r.end))

    def end_write(self, r: HostRange, valid: bool) -> None:
        """An output copy into `r` is over: its bytes are readable if `valid`, never if it
        failed (COPY-F). For the Bridge."""
        if type(r) is not HostRange or r.ring is not self:
            r = self._range_of_this_ring(r)
        with self._lock:
            try:
                self._writes.remove((r.start, r.end))
            except ValueError:
                raise InvalidArgumentError("ARG-1", f"no output copy into host bytes {_fmt(r)} began") from None
            if not valid:
                self._failed.append((r.start, r.end))

    def snapshot(self) -> tuple[object, ...]:
        """Everything the ring knows, for tests asserting that a rejected call changed nothing."""
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> tuple[object, ...]:  # the lock held
        records = tuple((r.start, r.end, r.seq, r.taken, r.redelivered) for r in self._records.values())
        queue = tuple(r.seq for r in self._ready)
        trimmed = tuple(sorted(self._trimmed))
        return (*self._bookkeeping(), trimmed, records, queue, self._next_seq, self._generation, bytes(self._memory))

    def state(self) -> RingState:
        """Its bookkeeping as a value, without the bytes (`restore` takes it back): a model
        checker keeps states as values instead of replaying paths to them."""
        with self._lock:
            return self._bookkeeping()

    def restore(self, state: RingState) -> None:
        """Take back the bookkeeping `state()` gave (the bytes stay as they are); ARG-1 for what
        is not the shape of one."""
        if not _is_state(state):
            raise InvalidArgumentError("ARG-1", f"a ring's state is what state() returns, got {short(state)}")
        head, starts, ends, reads, writes, failed = state
        with self._lock:
            self._head = head
            self._starts, self._ends = list(starts), list(ends)
            self._trimmed = set()  # (every span is taken for a whole reservation or record)
            self._reads, self._writes, self._failed = list(reads), list(writes), list(failed)
            self._freed.notify_all()

    # ------------------------------------------------------------ mechanics

    def _bookkeeping(self) -> RingState:  # the lock held
        return (
            self._head,
            tuple(self._starts),
            tuple(self._ends),
            tuple(sorted(self._reads)),
            tuple(sorted(self._writes)),
            tuple(sorted(self._failed)),
        )

    def _fit(self, n: int) -> int | None:  # the lock held
        """Where a reservation of `n` bytes starts now, or None when it does not fit."""
        pos = self._head % self.capacity
        start = self._head if pos + n <= self.capacity else self._head + self.capacity - pos
        # Bytes skipped at a lap's end are free: with nothing unreleased, the whole ring is.
        oldest = self._starts[0] if self._starts else start
        if self._record_starts:  # a taken record holds all its bytes until the last is released
            oldest = min(oldest, self._record_starts[0])
        return start if start + n - oldest <= self.capacity else None

    def _wait_for_room(self, n: int, wait: float | None) -> int | None:  # the lock held
        """Sleep until `n` bytes fit (a release wakes it) or `wait` seconds pass."""
        deadline = None if wait is None else time.monotonic() + wait
        self._waiting += 1
        try:
            while (start := self._fit(n)) is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._freed.wait(left)
            return start
        finally:
            self._waiting -= 1

    def _largest_free(self) -> int:
        """The longest reservation that would fit now (for messages)."""
        if not self._starts and not self._record_starts:
            return self.capacity
        oldest, pos = min(self._starts[:1] + self._record_starts[:1]), self._head % self.capacity
        tail = min(self.capacity - pos, self.capacity - (self._head - oldest))
        front = self.capacity - (self._head + self.capacity - pos - oldest)
        return max(tail, front, 0)

    def _check_ring(self, r: HostRange) -> None:
        if not isinstance(r, HostRange) or r.ring is not self:
            raise RangeError("RANGE-1", f"{short(r)} is not a range of this ring")

    def _whole(self, start: int, end: int) -> bool:  # the lock held
        """Whether [start, end) is one whole unreleased span (nothing of it released, nothing beside)."""
        i = bisect_right(self._starts, start) - 1
        return i >= 0 and self._starts[i] == start and self._ends[i] == end

    def _find(self, r: HostRange) -> int:
        """Index of the unreleased span holding all of `r`, or -1."""
        i = bisect_right(self._starts, r.start) - 1
        return i if i >= 0 and r.end <= self._ends[i] else -1

    def _check_live(self, r: HostRange, rule: str) -> None:
        self._check_ring(r)
        if self._find(r) < 0:
            raise RangeError(rule, f"host bytes {_fmt(r)} are not reserved and unreleased in one reservation")
        if self._records:
            self._check_taken(r, rule)

    def _cut(self, r: HostRange) -> None:
        self._cut_span(r.start, r.start + r.nbytes)

    def _trim(self, start: int) -> None:  # the lock held
        """The span at `start` is what is left of a reservation released in part. (Starts whose
        spans went are dropped once there are more of them than spans.)"""
        if len(self._trimmed) > len(self._starts):
            self._trimmed.intersection_update(self._starts)
        self._trimmed.add(start)

    def _cut_span(self, start: int, end: int) -> None:
        """Release [start, end), which lies in one unreleased span (what is left of it stays)."""
        i = bisect_right(self._starts, start) - 1
        if i < 0 or end > self._ends[i]:  # (a caller of read_done's own, past the Bridge's checks)
            raise RangeError("RING-1", f"host bytes [{start}, {end}) are not unreleased in one reservation")
        s, e = self._starts[i], self._ends[i]
        if end < e:  # the tail stays
            self._starts[i] = end
            self._trim(end)
            if s < start:  # and the head: one span becomes two
                self._starts.insert(i, s)
                self._ends.insert(i, start)
                self._trim(s)
        elif s < start:  # the head stays
            self._ends[i] = start
            self._trim(s)
        else:  # the whole span goes (the usual case)
            del self._starts[i], self._ends[i]
        if self._records:
            self._settle_record(start)
        if self._waiting:
            self._freed.notify_all()


def _shared() -> ModuleType:
    """devbridge.ring.shared, which builds on this module (imported on first use, not here)."""
    return importlib.import_module("devbridge.ring.shared")


def _is_state(state: object) -> bool:
    """Whether `state` has the shape of a RingState (its values are the model checker's to keep)."""
    if type(state) is not tuple or len(state) != 6 or type(state[0]) is not int:
        return False
    starts, ends, *spans = state[1:]
    ints = all(type(x) is tuple and all(type(i) is int for i in x) for x in (starts, ends))
    pairs = all(type(x) is tuple and all(type(p) is tuple and len(p) == 2 for p in x) for x in spans)
    return ints and pairs and len(starts) == len(ends)


def _fmt(r: HostRange) -> str:
    return f"[{r.start}, {r.end})"


@dataclass(frozen=True, slots=True)
class HostRange:
    """`nbytes` bytes of a HostRing at stream offset `start` (stream offsets never wrap)."""

    ring: HostRing = field(repr=False)
    start: int
    nbytes: int
    # set on a range `take` returned (read through `seq` and `redelivered`)
    _seq: int = field(init=False, repr=False, compare=False)
    _redelivered: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.ring, HostRing):
            raise RangeError("RANGE-1", f"a host range needs a HostRing, got {short(self.ring)}")
        start, nbytes = range_fields("host range", self.start, self.nbytes)
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "nbytes", nbytes)

    def __getstate__(self) -> tuple[object, ...]:  # (copy.copy: the record's fields may be unset)
        return self.ring, self.start, self.nbytes, self.seq, self.redelivered

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        ring, start, nbytes, seq, redelivered = state
        _set_ring(self, ring)
        _set_start(self, start)
        _set_nbytes(self, nbytes)
        if seq is not None:
            _set_seq(self, seq)
            _set_redelivered(self, redelivered)

    @property
    def end(self) -> int:
        """The stream offset just past the range."""
        return self.start + self.nbytes

    @property
    def seq(self) -> int | None:
        """The record's sequence number, on a range `take` returned; None on any other."""
        try:
            return self._seq
        except AttributeError:
            return None

    @property
    def redelivered(self) -> bool:
        """Whether `take` gave this record out before, to a consumer that did not release it."""
        try:
            return self._redelivered
        except AttributeError:
            return False

    def sub(self, offset: int, nbytes: int) -> HostRange:
        """The part of this range at `offset` (relative), `nbytes` long."""
        o, n = range_fields("host sub-range", offset, nbytes)
        if o + n > self.nbytes:
            raise RangeError("RANGE-1", f"sub-range [{o}, {o + n}) exceeds {self.nbytes} bytes")
        return made_range(self.ring, self.start + o, n)


# fill a frozen range without running its checks again
_set_ring, _set_start, _set_nbytes, _set_seq, _set_redelivered = slot_setters(
    HostRange, "ring", "start", "nbytes", "_seq", "_redelivered"
)


# what a range stores, read past any property a subclass put over its fields
_STORED = tuple(vars(HostRange)[name].__get__ for name in ("ring", "start", "nbytes", "_seq", "_redelivered"))


def altered(r: object) -> RangeError:
    """RANGE-1 for a HostRange whose fields were altered past its checks."""
    return RangeError("RANGE-1", f"{short(r)} is not a range of a HostRing: its fields were altered")


def own_range(r: object) -> HostRange:
    """`r` as a copy may use it: a HostRange of exactly this class over a HostRing, with int
    fields. A subclass's stored fields are read once, past any property it put over them, into a
    new one (so no later read can differ); RANGE-1 for what is not a HostRange or is one whose
    fields were altered past its checks."""
    if not isinstance(r, HostRange):
        raise RangeError("RANGE-1", f"a copy needs a HostRange, got {short(r)}")
    ring_of, start_of, nbytes_of, seq_of, redelivered_of = _STORED
    try:
        ring, start, nbytes = ring_of(r), start_of(r), nbytes_of(r)
    except AttributeError:
        raise RangeError("RANGE-1", f"{short(r)} is not a whole HostRange") from None
    if not isinstance(ring, HostRing) or type(start) is not int or type(nbytes) is not int:
        raise altered(r)
    own = made_range(ring, start, nbytes)
    try:
        seq, redelivered = seq_of(r), redelivered_of(r)
    except AttributeError:
        return own  # (not a record `take` gave out)
    if type(seq) is not int or type(redelivered) is not bool:
        raise altered(r)
    _set_seq(own, seq)
    _set_redelivered(own, redelivered)
    return own


def plain(r: HostRange) -> HostRange:
    """`r` as a ring's methods read it: a HostRange of exactly this class with int fields is
    itself; another HostRange (a subclass, or fields altered past its checks) is `own_range`'s
    (its stored fields, read once, or RANGE-1); anything else is left to the method's checks."""
    if type(r) is HostRange and type(r.start) is int and type(r.nbytes) is int:
        return r
    return own_range(r) if isinstance(r, HostRange) else r


def made_range(ring: HostRing, start: int, nbytes: int) -> HostRange:
    """A range a ring made itself, known valid: built without the checks (the hot path)."""
    r = object.__new__(HostRange)
    _set_ring(r, ring)
    _set_start(r, start)
    _set_nbytes(r, nbytes)
    return r


def record_range(ring: HostRing, record: _Record) -> HostRange:
    """The range of a record `take` gives out."""
    r = made_range(ring, record.start, record.end - record.start)
    _set_seq(r, record.seq)
    _set_redelivered(r, record.redelivered)
    return r
