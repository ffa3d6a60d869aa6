"""The host ring in shared memory: producers in their own processes, one consumer at a time.

The segment: a header of 64-bit words, the commit table (the slot of each sequence number, at
seq % slots), the slot table (one reservation each, in stream order, reused round the table)
and the data. Writers hold the segment's lock (`flock`: a dead holder's comes back); one word of
each call makes its change (`count`, `next_seq`, `take_seq`, a slot's state, `generation`), so a
process killed at any instruction leaves either the old state or the new one. A commit writes
the record's number into its slot after its commit point (`next_seq`): a number there means a
record, and the records a consumer took are found by it (their commit-table entries may hold
newer records since). Every word read is checked before use (SHM-1): a slot's fixed fields
carry a check word, counters must be in range, sequence numbers must name their own slot.

Each process tracks the bytes of its own reservations and taken records as an in-process ring
does (HostRing's bookkeeping: views, pending copies, partial releases); the segment says which
reservations are live, committed, taken and released.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable

from devbridge.args import as_count, as_seconds
from devbridge.errors import (
    InvalidArgumentError,
    RangeError,
    RingCorruptError,
    RingFullError,
    StaleHandleError,
    WaitTimeoutError,
    short,
)
from devbridge.ring.host import (
    MAX_CAPACITY,
    HostRange,
    HostRing,
    RingState,
    Span,
    _fmt,
    _Record,
    made_range,
    plain,
    record_range,
)
from devbridge.ring.segment import Segment, alive, this_process
from devbridge.spec.ring import load_ring

_MAGIC = 0x474E495242564544  # "DEVBRING"
_LAYOUT = 2
(_H_MAGIC, _H_LAYOUT, _H_CAPACITY, _H_SLOTS, _H_DATA, _H_COUNT, _H_TAIL, _H_NEXT_SEQ, _H_TAKE_SEQ,
 _H_GENERATION, _H_CONSUMER_PID, _H_CONSUMER_START, _H_REDELIVER_UNTIL, _H_RECLAIMED, _H_COMMITS,
 _H_RELEASES, _H_REDELIVERED, _H_TAKE_SLEEPERS, _H_RESERVE_SLEEPERS, _H_ID, _H_SOURCE) = range(21)  # fmt: skip
#: The futex word each waiter sleeps on, and the flag that says someone does (a wake only then).
_SLEEPERS = {_H_COMMITS: _H_TAKE_SLEEPERS, _H_RELEASES: _H_RESERVE_SLEEPERS}
_HEADER_WORDS = 32
_SLOT_WORDS = 8
_SLOT = struct.Struct("=8q")  # a slot's words, written at once
_S_START, _S_NBYTES, _S_PID, _S_PSTART, _S_CHECK, _S_SEQ, _S_STATE, _S_FREED = range(8)
#: A reservation's state word (spec/ring.toml): live (reserved, committed or taken: the sequence
#: numbers tell them apart), released, reclaimed.
_RESERVED, _RELEASED, _RECLAIMED = (load_ring().slot(state) for state in ("reserved", "released", "reclaimed"))
_BIG = 1 << 62  # no counter of a ring in use comes near
#: Most slots (live reservations) a shared ring may have.
MAX_SLOTS = 1 << 20
#: How often a reservation waiting for room looks for producers that died holding some.
RECLAIM_EVERY_S = 0.05
#: How often a waiting `take` looks whether a newer consumer replaced it.
FENCE_EVERY_S = 0.25

_forks = 0  # forks this process came through (a child's inherited attachments are refused)


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


def _seconds(timeout: object, what: str) -> float | None:
    return None if timeout is None else as_seconds(timeout, what)


def _check_word(start: int, nbytes: int, pid: int, pstart: int) -> int:
    return (start * 0x9E3779B97F4A7C15 ^ nbytes * 0xC2B2AE3D27D4EB4F ^ pid * 0x165667B1 ^ pstart ^ _MAGIC) & (_BIG - 1)


def _layout(capacity: int, slots: int) -> tuple[int, int, int, int]:
    """Word offsets of the commit table, the slot table and the source table (the input record
    each output finished, by output sequence number), and the data's byte offset (a page)."""
    commits = _HEADER_WORDS
    table = commits + slots
    sources = table + slots * _SLOT_WORDS
    data = -(-(sources + slots) * 8 // 4096) * 4096
    return commits, table, sources, data


class SharedRing(HostRing):
    """A HostRing in a named shared-memory segment, used by several processes at once: producers
    reserve, fill and `commit`; one consumer at a time (`consume`) takes, copies and releases.
    Each process tracks the bytes of its own reservations and taken records as an in-process
    ring does; the segment holds which reservations are live, committed, taken and released.
    Made by `HostRing.create` and `HostRing.attach`."""

    def __init__(self, segment: Segment, capacity: int, slots: int) -> None:
        self._segment = segment
        self._slots = slots
        self._commits_at, self._table_at, self._sources_at, data = _layout(capacity, slots)
        words = memoryview(segment.map)
        self._words = words[:data].cast("q")
        self._closed = False
        self._pid, self._forks = os.getpid(), _forks
        self._owner = this_process()  # (an attachment serves one process: a forked child's is refused)
        self.process: tuple[int, int] | None = None  # who this attachment is (None: this process)
        self.alive: Callable[[int, int], bool] = alive  # whether a process (pid, start time) still runs
        self._next_reclaim = 0.0  # when a waiting reserve looks for dead producers next
        # the fixed fields of reservations (by number: never reused) once checked
        self._fixed: dict[int, tuple[int, int, int, int]] = {}
        self._ring_id = self._words[_H_ID]  # (checked by `attach_segment`)
        self._setup(capacity, words[data : data + capacity])
        # The segment's lock: after the ring's (every use here holds that first), or alone
        # where the ring's is held already.
        self._both = segment.locked_after(self._lock)
        self._shared = segment.locked_after(None)
        self.name = os.path.basename(segment.path)

    # ------------------------------------------------------------ making and ending

    @classmethod
    def create_segment(cls, name: object, capacity: object, records: object) -> SharedRing:
        """A new ring in a new segment (`HostRing.create` checks nothing before it: this does)."""
        size = as_count(capacity)
        if size is None or not 0 < size <= MAX_CAPACITY:
            raise RangeError("RANGE-1", f"ring capacity must be an int in [1, 2**40], got {short(capacity)}")
        slots = as_count(records)
        if slots is None or not 0 < slots <= MAX_SLOTS:
            raise InvalidArgumentError("ARG-1", f"records must be an int in [1, 2**20], got {short(records)}")
        data = _layout(size, slots)[3]
        segment = Segment.create(name, data + size)
        words = memoryview(segment.map)[:data].cast("q")
        words[_H_LAYOUT], words[_H_CAPACITY], words[_H_SLOTS], words[_H_DATA] = _LAYOUT, size, slots, data
        words[_H_ID] = int.from_bytes(os.urandom(8), "little") % (_BIG - 1) + 1  # names a ring to another
        words[_H_MAGIC] = _MAGIC  # last: a half-made segment is no ring
        words.release()
        return cls(segment, size, slots)

    @classmethod
    def attach_segment(cls, name: object) -> SharedRing:
        """The ring in an existing segment, its header checked (`HostRing.attach`)."""
        segment = Segment.open(name, _HEADER_WORDS * 8)
        try:
            words = memoryview(segment.map)[: _HEADER_WORDS * 8].cast("q")
            magic, layout, size, slots, data = (words[i] for i in range(5))
            ring_id = words[_H_ID]
            words.release()
            if magic != _MAGIC:
                raise RingCorruptError("SHM-1", f"{name!r} is not a devbridge ring")
            if layout != _LAYOUT:
                raise RingCorruptError("SHM-1", f"{name!r} has ring layout {layout}; this devbridge reads {_LAYOUT}")
            if not (0 < size <= MAX_CAPACITY and 0 < slots <= MAX_SLOTS and data == _layout(size, slots)[3]):
                raise RingCorruptError("SHM-1", f"{name!r}'s header holds no ring's sizes")
            if not 0 < ring_id < _BIG:
                raise RingCorruptError("SHM-1", f"{name!r}'s header holds no ring's identity")
            if segment.size != data + size:
                raise RingCorruptError(
                    "SHM-1", f"{name!r} is {segment.size} B, not the {data + size} B its header says"
                )
            return cls(segment, size, slots)
        except BaseException:
            segment.close()
            raise

    def close(self) -> None:
        """Detach this process from the ring (its name and the other processes' stay). Ranges
        this process reserved or took and did not release stay live in the ring: a new consumer
        gets taken records again; reservations are reclaimed once this process has exited."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._starts, self._ends, self._records, self._record_starts = [], [], {}, []
            for view in (self._words, self._memory):
                with contextlib.suppress(BufferError):  # a view is still held: the map goes with the last
                    view.release()
            self._segment.close()

    def unlink(self) -> None:
        """Remove the ring's name: no process can attach it any more; the memory lives until
        the last process detaches."""
        Segment.unlink(self.name)

    def __enter__(self) -> SharedRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ the shared words, checked

    def _word(self, i: int, least: int = 0, most: int = _BIG) -> int:
        value = self._words[i]
        if not least <= value <= most:
            raise RingCorruptError(
                "SHM-1", f"ring {self.name!r}: header word {i} holds {value}, outside [{least}, {most}]"
            )
        return value

    def _window(self) -> tuple[int, int]:
        """`tail` and `count`: the reservations from the oldest live one to the newest."""
        words = self._words
        count, tail = words[_H_COUNT], words[_H_TAIL]
        if not (0 <= count <= _BIG and count - self._slots <= tail <= count and tail >= 0):
            count = self._word(_H_COUNT)  # (SHM-1, naming the word)
            tail = self._word(_H_TAIL, max(count - self._slots, 0), count)
        return tail, count

    def _fixed_fields(self, index: int) -> tuple[int, int, int, int]:
        """Reservation `index`'s start, size and owner (pid and start time), checked the first
        time (a reservation's fixed fields are written before it exists, and never change)."""
        fixed = self._fixed.get(index)
        if fixed is not None:
            return fixed
        base = self._table_at + (index % self._slots) * _SLOT_WORDS
        start, nbytes, pid, pstart, check = self._words[base : base + 5]
        if (
            check != _check_word(start, nbytes, pid, pstart)
            or not 0 <= start < _BIG
            or not 0 < nbytes <= self.capacity
            or start % self.capacity + nbytes > self.capacity
        ):
            raise RingCorruptError("SHM-1", f"ring {self.name!r}: reservation {index}'s slot holds no reservation")
        return self._remember(index, (start, nbytes, pid, pstart))

    def _remember(self, index: int, fixed: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        """Keep reservation `index`'s fixed fields, checked. At most twice as many as the ring's
        records are kept (the live ones are fewer): a process that makes or reads a record after
        another for hours keeps no more of them."""
        if len(self._fixed) >= 2 * self._slots:
            self._fixed.clear()
        self._fixed[index] = fixed
        return fixed

    def _state(self, index: int) -> int:
        """Reservation `index`'s state word, checked."""
        state = self._words[self._table_at + (index % self._slots) * _SLOT_WORDS + _S_STATE]
        if state != _RESERVED and state != _RELEASED and state != _RECLAIMED:
            raise RingCorruptError("SHM-1", f"ring {self.name!r}: reservation {index} is in no state ({state})")
        return state

    def _slot(self, index: int) -> tuple[int, int, int, int, int, int]:
        """Reservation `index`'s start, size, owner (pid and start time), sequence number and state."""
        base = self._table_at + (index % self._slots) * _SLOT_WORDS
        state = self._words[base + _S_STATE]
        if state != _RESERVED and state != _RELEASED and state != _RECLAIMED:
            self._state(index)  # (SHM-1)
        fixed = self._fixed.get(index) or self._fixed_fields(index)
        return (*fixed, self._words[base + _S_SEQ], state)

    def _untaken(self) -> set[int]:  # the segment locked
        """The reservations the commit table names for the records committed and never taken
        (their entries are never written over: each is a live reservation, and a ring has no
        more of those than entries). Not those a new consumer gets again (from `take_seq` up to
        `redeliver_until`): their entries may name newer reservations since, even one whose
        commit died before its commit point."""
        words, slots = self._words, self._slots
        next_seq, take_seq, until = self._take_words()
        return {words[self._commits_at + s % slots] for s in range(max(take_seq, until, next_seq - slots), next_seq)}

    def _is_record(self, index: int, seq: int, untaken: set[int]) -> bool:  # the segment locked
        """Whether reservation `index`, whose sequence number word holds `seq`, is a record: the
        word is written after the commit point, so any number below `next_seq` says so; a commit
        that died between the two is one the table names among the records not taken
        (`untaken`, from `_untaken`)."""
        return 0 <= seq < self._words[_H_NEXT_SEQ] or (seq == -1 and index in untaken)

    def _shared_head(self, count: int) -> int:
        if count == 0:
            return 0
        start, nbytes, _, _ = self._fixed_fields(count - 1)
        return start + nbytes

    def _oldest(self, tail: int, count: int) -> int:
        """The first byte not released: of the oldest live reservation (past the bytes its producer
        released at its front), or the head."""
        if tail == count:
            return self._shared_head(count)
        start, nbytes, _, _ = self._fixed_fields(tail)
        freed = self._words[self._table_at + (tail % self._slots) * _SLOT_WORDS + _S_FREED]
        if not 0 <= freed < nbytes:
            raise RingCorruptError("SHM-1", f"ring {self.name!r}: reservation {tail} has {freed} of {nbytes} B freed")
        return start + freed

    def _live_window(self, *released: int) -> tuple[int, int]:  # the segment locked
        """`tail` and `count` once the reservations `released` are: the tail past every released
        one. Reads only (a call checks every word it reads before it writes any)."""
        tail, count = self._window()
        words, at, slots = self._words, self._table_at + _S_STATE, self._slots
        while tail < count and (tail in released or words[at + (tail % slots) * _SLOT_WORDS] != _RESERVED):
            self._state(tail)  # (SHM-1 for a word in no state)
            tail += 1
        return tail, count

    def _set_state(self, index: int, state: int) -> None:
        self._words[self._table_at + (index % self._slots) * _SLOT_WORDS + _S_STATE] = state

    def _bump(self, word: int) -> bool:  # the segment locked
        """Change a futex word (its low 32 bits); True when a waiter said it sleeps on it: the
        caller then wakes it with `_wake`, after the segment's lock goes (a woken waiter wants
        the lock at once; a wake is a system call, and the lock is held for microseconds)."""
        self._words[word] = (self._words[word] + 1) & 0xFFFFFFFF
        if self._words[_SLEEPERS[word]]:
            self._words[_SLEEPERS[word]] = 0
            return True
        return False

    def _wake(self, word: int) -> None:
        self._segment.wake(word * 8)

    # ------------------------------------------------------------ fence

    def _me(self) -> tuple[int, int]:
        """The pid and start time this attachment's reservations are owned by."""
        return self.process or self._owner

    def _fenced(self) -> bool:
        """Whether a newer consumer replaced this one. Every write to the segment asks (or calls
        `_check_fence`) under the segment's lock, after taking it: a process stopped between an
        earlier check and the lock, continued after its replacement took over, changes nothing."""
        return self._consumer is not None and self._words[_H_GENERATION] != self._consumer

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError("ARG-1", f"ring {self.name!r} is closed in this process")
        if self._forks != _forks:  # a forked child shares the parent's lock: it must attach itself
            raise InvalidArgumentError("ARG-1", f"ring {self.name!r} was attached by process {self._pid}: attach again")

    def _check_fence(self) -> None:
        if self._closed or self._forks != _forks:
            self._check_open()
        if self._consumer is not None and self._words[_H_GENERATION] != self._consumer:  # (_fenced)
            raise StaleHandleError(
                "GEN-2",
                f"ring {self.name!r}: consumer generation {self._consumer} was replaced by generation "
                f"{self._words[_H_GENERATION]}",
            )

    @property
    def generation(self) -> int:
        self._check_open()
        return self._word(_H_GENERATION)

    def lock_held(self) -> bool:
        """Whether another process holds the ring's lock at this moment (a look: never waits). A
        process stopped (SIGSTOP) while it holds the lock stops every other user of the ring
        until it continues or dies: a supervisor that stops a process it takes for hung checks
        this, and continues it for a moment if so."""
        self._check_open()
        with self._lock:
            return self._segment.lock_held()

    # ------------------------------------------------------------ producers

    @property
    def head(self) -> int:
        self._check_open()
        with self._both:
            return self._shared_head(self._window()[1])

    @property
    def cursor(self) -> int:
        """Stream offset below which every byte is released (as this process sees its own
        reservations and records: bytes released of one not yet released whole count)."""
        self._check_open()
        with self._both:
            tail, count = self._live_window()
            oldest = self._oldest(tail, count)
            record = self._record_at(oldest, oldest + 1) if tail < count else None
            if record is not None:  # the oldest is this process's: its first byte not released
                return max(oldest, self._first_unreleased(record))
            return oldest

    def reserve(self, nbytes: int, *, timeout: float | None = 0.0) -> HostRange:
        if self._closed or self._forks != _forks:
            self._check_open()
        n = nbytes if type(nbytes) is int else as_count(nbytes)
        if n is None or n <= 0:
            raise RangeError("RANGE-1", f"reservation size must be a positive int, got {short(nbytes)}")
        wait = timeout if type(timeout) is float and timeout >= 0 else _seconds(timeout, "a reservation's timeout")
        if n > self.capacity:
            raise RingFullError("RING-2", f"reserving {n} B: larger than the ring's capacity of {self.capacity} B")
        deadline = None if wait is None else time.monotonic() + wait
        me = self.process or self._owner  # (_me)
        while True:
            seen = self._words[_H_RELEASES] & 0xFFFFFFFF
            with self._lock:
                with self._shared:  # (held for the segment's words only: the other processes wait)
                    self._check_fence()  # (under the segment's lock: see _fenced)
                    made = self._reserve_now(n, me)
                    if made is None and wait != 0 and time.monotonic() >= self._next_reclaim:
                        # (at most every RECLAIM_EVERY_S: it reads /proc for each live reservation)
                        self._next_reclaim = time.monotonic() + RECLAIM_EVERY_S
                        if self._reclaim_dead():
                            made = self._reserve_now(n, me)
                    if made is None:
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            raise RingFullError("RING-2", f"reserving {n} B: {self._why_full()}")
                        self._words[_H_RESERVE_SLEEPERS] = 1  # (before the lock goes: no wake is missed)
                if made is not None:
                    start, index = made
                    self._starts.append(start)
                    self._ends.append(start + n)
                    self._head = start + n
                    self._records[start] = _Record(start, start + n, -1, index)
                    self._record_starts.append(start)
                    return made_range(self, start, n)
            self._segment.wait(_H_RELEASES * 8, seen, RECLAIM_EVERY_S if left is None else min(left, RECLAIM_EVERY_S))

    def _reserve_now(self, n: int, me: tuple[int, int]) -> tuple[int, int] | None:  # both locks held
        """The start and the slot of a new reservation of `n` bytes made in the segment, or None
        when it does not fit now."""
        # (the tail word may lag behind released slots: its writer died between the two writes)
        tail, count = self._live_window()
        if count - tail == self._slots:
            return None  # every slot holds a live reservation
        if count:
            last = self._fixed.get(count - 1) or self._fixed_fields(count - 1)
            head = last[0] + last[1]  # (_shared_head)
        else:
            head = 0
        oldest = self._oldest(tail, count) if tail != count else head
        if not 0 <= head - oldest <= self.capacity:
            raise RingCorruptError("SHM-1", f"ring {self.name!r}: head {head} and oldest byte {oldest} are no ring")
        pos = head % self.capacity
        start = head if pos + n <= self.capacity else head + self.capacity - pos
        if tail == count:
            oldest = start  # nothing is live: bytes skipped at the lap's end are free, the whole ring is
        if start + n - oldest > self.capacity:
            return None
        pid, pstart = me
        # the tail word first: past every released reservation, so that it names none whose slot
        # the new one takes (a release that died before its tail word leaves it a lap behind)
        self._words[_H_TAIL] = tail
        _SLOT.pack_into(
            self._segment.map,
            (self._table_at + (count % self._slots) * _SLOT_WORDS) * 8,
            start, n, pid, pstart, _check_word(start, n, pid, pstart), -1, _RESERVED, 0,
        )  # fmt: skip
        self._words[_H_COUNT] = count + 1  # the reservation exists from here on
        self._remember(count, (start, n, pid, pstart))
        return start, count

    def _why_full(self) -> str:  # the segment locked
        """Why a reservation does not fit now: no record left, or no stretch of bytes as long."""
        tail, count = self._live_window()
        if count - tail == self._slots:
            return f"each of the ring's {self._slots} records holds a live reservation"
        return f"the largest free stretch is {self._largest_shared(tail, count)} B"

    def _largest_shared(self, tail: int, count: int) -> int:  # the segment locked
        """The longest reservation that would fit now, where some reservation is live (where none
        is, any reservation up to the capacity fits: a reserve never fails there)."""
        head, oldest = self._shared_head(count), self._oldest(tail, count)
        pos = head % self.capacity
        tail_room = min(self.capacity - pos, self.capacity - (head - oldest))
        front = self.capacity - (head + self.capacity - pos - oldest)
        return max(tail_room, front, 0)

    def commit(self, r: HostRange, *, finishes: HostRange | None = None) -> int:
        r = plain(r)
        if finishes is not None:
            return self._commit_finishing(r, plain(finishes))
        with self._lock:
            start, _ = self._check_commit(r)
            record = self._records[start]
            with self._shared:
                self._check_fence()
                self._check_own(record)
                seq = self._commit_words(record, 0)
                wake = self._bump(_H_COMMITS)
            if wake:
                self._wake(_H_COMMITS)
            self._forget(record)
            return seq

    def _check_own(self, record: _Record) -> None:  # the segment locked
        """This process's reservation `record` is still its own and live in the segment."""
        slot_start, _, pid, pstart = self._fixed.get(record.slot) or self._fixed_fields(record.slot)
        state = self._words[self._table_at + (record.slot % self._slots) * _SLOT_WORDS + _S_STATE]
        if slot_start == record.start and (pid, pstart) == (self.process or self._owner) and state == _RESERVED:
            return
        span = f"[{record.start}, {record.end})"
        if slot_start != record.start or (pid, pstart) != self._me():
            raise RingCorruptError("SHM-1", f"ring {self.name!r}: the slot of {span} holds another range")
        if self._state(record.slot) != _RESERVED:  # the ring took this process for dead and reclaimed it
            raise RangeError("RING-4", f"host bytes {span} were reclaimed, no longer this process's")

    def _commit_words(self, record: _Record, source: int) -> int:  # the segment locked, the record checked
        """Commit reservation `record` in the segment, as the output of input record `source - 1`
        (0: of none); its sequence number."""
        words, slots = self._words, self._slots
        seq = words[_H_NEXT_SEQ]
        if not 0 <= seq <= _BIG:
            self._word(_H_NEXT_SEQ)  # (SHM-1)
        words[self._commits_at + seq % slots] = record.slot
        words[self._sources_at + seq % slots] = source
        words[_H_NEXT_SEQ] = seq + 1  # committed from here on
        # last, the reservation's own word: a number in it means committed (a commit that dies
        # before it leaves -1, and the table entry says; `take` writes it then)
        words[self._table_at + (record.slot % slots) * _SLOT_WORDS + _S_SEQ] = seq
        return seq

    def _forget(self, record: _Record) -> None:  # the lock held
        """This process's record (a reservation committed, or a record released whole in the
        segment) is no longer its to track."""
        del self._records[record.start]
        self._record_starts.remove(record.start)
        self._cut_local(record.start, record.end)

    # ------------------------------------------------------------ outputs that finish inputs

    def _source_of(self, finishes: object) -> SharedRing:
        source = super()._source_of(finishes)
        assert isinstance(source, SharedRing)
        if source._ring_id == self._ring_id:
            raise InvalidArgumentError("ARG-1", f"an output of ring {self.name!r} finishes a record of its own")
        return source

    def _commit_finishing(self, r: HostRange, finishes: HostRange) -> int:
        source = self._source_of(finishes)
        # one order for every pair of rings in every process: two such commits never deadlock
        first, second = sorted((source, self), key=lambda ring: ring._ring_id)
        with first._lock, second._lock:
            start, _ = self._check_commit(r)
            output, taken = self._records[start], source._check_finishable(finishes)
            with first._shared, second._shared:
                source._check_fence()
                self._check_fence()
                self._check_own(output)
                slot_start, _, _, _, slot_seq, state = source._slot(taken.slot)
                if (slot_start, slot_seq, state) != (taken.start, taken.seq, _RESERVED):
                    raise RingCorruptError("SHM-1", f"ring {source.name!r}: the slot of {_fmt(finishes)} holds another")
                bound = self._word(_H_SOURCE)
                if bound not in (0, source._ring_id):
                    raise InvalidArgumentError("ARG-1", f"ring {self.name!r}'s outputs finish another ring's records")
                # (only a record delivered again can have been finished: one taken the first time
                # was never any consumer's before)
                done = self._finished_at(taken.seq) if bound and taken.redelivered else None
                # Every word is checked: now the writes. The output's commit first (the next
                # sequence number is its commit point), then the input's release (its state word):
                # a crash between the two leaves the input to be delivered again, and known
                # finished by `done`.
                if not bound:
                    self._words[_H_SOURCE] = source._ring_id
                if done is None:
                    seq, wake_out = self._commit_words(output, taken.seq + 1), self._bump(_H_COMMITS)
                else:  # finished before a crash: this output is not committed again, its bytes go back
                    seq, wake_out = done, self._release_slot(output.slot)
                wake_in = source._release_slot(taken.slot)
            if wake_out:
                self._wake(_H_COMMITS if done is None else _H_RELEASES)
            if wake_in:
                source._wake(_H_RELEASES)
            self._forget(output)
            source._forget(taken)
            return seq

    def _release_slot(self, index: int) -> bool:  # the segment locked
        """Release reservation `index` in the segment (its state word is the release); True when a
        waiter is to be woken."""
        tail = self._live_window(index)[0]
        self._set_state(index, _RELEASED)  # released from here on
        self._words[_H_TAIL] = tail
        return self._bump(_H_RELEASES)

    def _finished_at(self, seq: int) -> int | None:  # the segment locked
        """The output that finished input record `seq`: one of the last `slots - 1` committed (the
        source entry of the oldest may be the one a commit that died was writing)."""
        next_seq = self._word(_H_NEXT_SEQ)
        for out in range(next_seq - 1, max(next_seq - self._slots, -1), -1):
            if self._words[self._sources_at + out % self._slots] == seq + 1:
                return out
        return None

    def finished(self, r: HostRange) -> int | None:
        r = plain(r)
        source = self._source_of(r)
        if self._closed or self._forks != _forks:
            self._check_open()
        with self._lock, self._shared:
            return self._finished_at(r.seq) if self._word(_H_SOURCE) == source._ring_id else None  # type: ignore[arg-type]

    def _check_commit(self, r: HostRange) -> Span:  # the lock held
        # The usual case first: a whole reservation of this process, no copy pending anywhere.
        record = self._records.get(r.start) if type(r) is HostRange and r.ring is self else None
        usual = record is not None and record.seq < 0 and not record.taken and record.end == r.start + r.nbytes
        if usual and self._whole(r.start, r.start + r.nbytes) and not (self._reads or self._writes or self._failed):
            self._check_fence()
            if self._guards:
                self._run_guards(r)
            return r.start, r.start + r.nbytes
        span = super()._check_commit(r)
        # (every reservation of this process is a record here: the base class's test is moot)
        record = self._records.get(r.start)
        if record is None or record.end != r.end or record.seq >= 0 or record.taken:
            raise RangeError("RING-4", f"host bytes {_fmt(r)} are not a whole reservation of this process")
        return span

    def _cut_local(self, start: int, end: int) -> None:
        i = bisect_right(self._starts, start) - 1
        del self._starts[i], self._ends[i]

    # ------------------------------------------------------------ the consumer

    def consume(self) -> int:
        with self._lock:
            self._check_fence()
            with self._shared:
                self._check_fence()
                generation = self._word(_H_GENERATION, 0, _BIG - 1) + 1
                take_seq, redeliver_until = self._rewind()
                self._words[_H_GENERATION] = generation  # every older consumer is fenced from here on
                self._words[_H_CONSUMER_PID], self._words[_H_CONSUMER_START] = self._me()
                self._words[_H_REDELIVER_UNTIL] = redeliver_until
                self._words[_H_TAKE_SEQ] = take_seq
                wake = self._bump(_H_COMMITS)  # a fenced consumer waiting in take() wakes to its GEN-2
            if wake:
                self._wake(_H_COMMITS)
            # records this object took as an older generation go back to the ring
            for start in [s for s, rec in self._records.items() if rec.taken]:
                record = self._records.pop(start)
                self._record_starts.remove(start)
                i = bisect_right(self._starts, record.start)
                while i < len(self._starts) and self._starts[i] < record.end:
                    del self._starts[i], self._ends[i]
                if i and self._ends[i - 1] > record.start:
                    del self._starts[i - 1], self._ends[i - 1]
            self._consumer = self._generation = generation
            return generation

    def _take_words(self) -> tuple[int, int, int]:  # the segment locked
        """`next_seq`, `take_seq` and `redeliver_until`, checked. Records from `take_seq` up to
        `redeliver_until` are delivered again, found by their slots' own numbers; from there on,
        the commit table names each (no more records are committed and not taken than it has
        entries, so `take_seq` is then at most `slots` behind)."""
        words = self._words
        next_seq, seq, until = words[_H_NEXT_SEQ], words[_H_TAKE_SEQ], words[_H_REDELIVER_UNTIL]
        fine = 0 <= next_seq <= _BIG and 0 <= seq <= next_seq and 0 <= until <= next_seq
        if fine and next_seq - self._slots <= max(seq, until):
            return next_seq, seq, until
        next_seq = self._word(_H_NEXT_SEQ)  # (SHM-1, naming the word)
        until = self._word(_H_REDELIVER_UNTIL, 0, next_seq)
        least = max(next_seq - self._slots, 0)
        return next_seq, self._word(_H_TAKE_SEQ, 0 if until >= least else least, next_seq), until

    def _rewind(self) -> tuple[int, int]:  # the segment locked
        """`take_seq` and `redeliver_until` for a new consumer: back to the oldest record taken
        and not released, so that every such record is delivered again (reads only)."""
        _, take_seq, until = self._take_words()
        lowest = take_seq
        tail, count = self._window()
        for index in range(tail, count):  # the records taken and not released: a number below take_seq
            _, _, _, _, seq, state = self._slot(index)
            if state == _RESERVED and 0 <= seq < lowest:
                lowest = seq
        return lowest, max(until, take_seq) if lowest < take_seq else until

    def take(self, timeout: float | None = None) -> HostRange:
        if self._closed or self._forks != _forks:
            self._check_open()
        wait = timeout if type(timeout) is float and timeout >= 0 else _seconds(timeout, "take's timeout")
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            seen = self._words[_H_COMMITS] & 0xFFFFFFFF
            if self._consumer is None and self._word(_H_GENERATION) == 0:
                self.consume()  # the ring's first consumer
            if self._consumer is None:
                self._check_open()
                raise StaleHandleError(
                    "GEN-2", f"ring {self.name!r} has a consumer (generation {self.generation}): consume() takes over"
                )
            with self._lock:
                with self._shared:  # (held for the segment's words only: the other processes wait)
                    self._check_fence()  # (under the segment's lock: see _fenced)
                    record = self._take_now()
                    if record is None:
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            raise WaitTimeoutError(
                                "WAIT-1", f"no record was committed to ring {self.name!r} within {wait} s"
                            )
                        self._words[_H_TAKE_SLEEPERS] = 1  # (before the lock goes: no wake is missed)
                if record is not None:
                    record.taken = self._consumer or 0
                    self._records[record.start] = record
                    insort(self._record_starts, record.start)
                    self._rejoin(record.start, record.end)
                    return record_range(self, record)
            self._segment.wait(_H_COMMITS * 8, seen, FENCE_EVERY_S if left is None else min(left, FENCE_EVERY_S))

    def _take_now(self) -> _Record | None:  # both locks held
        """The next record to take, taken in the segment, or None when there is none."""
        words, slots = self._words, self._slots
        next_seq, seq, until = self._take_words()
        if seq < until:  # what an older consumer took and did not release, first
            record = self._take_again(seq, until)
            if record is not None:
                return record
            seq = words[_H_TAKE_SEQ] = until  # (none left to deliver again)
        if seq == next_seq:
            return None  # nothing committed that was not taken
        tail, count = self._window()
        index = words[self._commits_at + seq % slots]
        if not tail <= index < count:
            self._word(self._commits_at + seq % slots, tail, count - 1)  # (SHM-1)
        start, nbytes, _, _, slot_seq, state = self._slot(index)
        if slot_seq == -1 and state == _RESERVED:  # its commit died before its last word: written now
            words[self._table_at + (index % slots) * _SLOT_WORDS + _S_SEQ] = slot_seq = seq
        if slot_seq != seq or state != _RESERVED:
            raise RingCorruptError(
                "SHM-1", f"ring {self.name!r}: record {seq}'s slot holds record {slot_seq} in state {state}"
            )
        words[_H_TAKE_SEQ] = seq + 1  # taken from here on
        return _Record(start, start + nbytes, seq, index)

    def _take_again(self, seq: int, until: int) -> _Record | None:  # both locks held
        """The record numbered from `seq` up to `until` that an older consumer took and did not
        release, lowest first, taken again; None when none is left. Found by the numbers the
        slots of live reservations hold: the commit table's entries of records taken may have
        been written over by newer records since."""
        tail, count = self._window()
        found: tuple[int, int, int, int] | None = None
        for index in range(tail, count):
            start, nbytes, _, _, number, state = self._slot(index)
            if state == _RESERVED and seq <= number < until and (found is None or number < found[0]):
                found = (number, index, start, nbytes)
        if found is None:
            return None
        number, index, start, nbytes = found
        counted = self._word(_H_REDELIVERED) + 1
        self._words[_H_TAKE_SEQ] = number + 1  # taken from here on
        self._words[_H_REDELIVERED] = counted
        record = _Record(start, start + nbytes, number, index)
        record.redelivered = True
        return record

    # ------------------------------------------------------------ releases

    def _cut_span(self, start: int, end: int) -> None:  # the lock held
        record = self._records.get(start)
        if record is not None and record.end == end:  # a whole record or reservation (the usual case)
            i = bisect_right(self._starts, start) - 1
            if i >= 0 and self._starts[i] == start and self._ends[i] == end:  # none of it released before
                del self._starts[i], self._ends[i], self._records[start]
                self._record_starts.remove(start)
                self._record_released(record)
                if self._waiting:
                    self._freed.notify_all()
                return
        super()._cut_span(start, end)
        record = self._record_at(start, end)
        if record is not None and record.seq < 0 and record.start < self._first_unreleased(record):
            # A producer's own reservation, released at its front: those bytes are free for the
            # ring (one word, only growing). A taken record's stay held (RING-5).
            with self._shared:
                if self._fenced():
                    return
                self._slot(record.slot)
                base = self._table_at + (record.slot % self._slots) * _SLOT_WORDS
                self._words[base + _S_FREED] = self._first_unreleased(record) - record.start
                wake = self._bump(_H_RELEASES)
            if wake:
                self._wake(_H_RELEASES)

    def _first_unreleased(self, record: _Record) -> int:
        i = bisect_left(self._ends, record.start + 1)
        return max(record.start, self._starts[i]) if i < len(self._starts) else record.end

    def _record_released(self, record: _Record) -> None:  # the lock held
        with self._shared:
            if self._fenced():
                return  # a fenced consumer's release changes nothing: the record is delivered again
            start, *_ = self._slot(record.slot)
            if start != record.start:
                raise RingCorruptError("SHM-1", f"ring {self.name!r}: the slot of [{record.start}, ...) holds another")
            wake = self._release_slot(record.slot)
        if wake:
            self._wake(_H_RELEASES)

    def _check_live(self, r: HostRange, rule: str) -> None:  # the lock held
        # (every call on a range asks: view, release, commit, a copy's checks; on a shared ring
        # every live range is a record, so `check_copy`'s per-call test never skips this)
        self._check_fence()
        if type(r) is HostRange and r.ring is self:  # the usual case: a range of a record it may use
            record, end = self._records.get(r.start), r.start + r.nbytes
            if record is not None and (record.seq < 0 or record.taken) and end <= record.end:
                i = bisect_right(self._starts, r.start) - 1
                if i >= 0 and end <= self._ends[i]:  # in one unreleased span (HostRing._find)
                    return
        try:
            super()._check_live(r, rule)
        except RangeError:
            if not isinstance(r, HostRange) or r.ring is not self:
                raise  # (RANGE-1: not a range of this ring at all)
            owner = self._holder(r)
            if owner is not None:
                raise RangeError("RING-4", f"host bytes {_fmt(r)} are {owner}, not this process's") from None
            raise

    def _holder(self, r: HostRange) -> str | None:
        """Whose the live reservation holding `r`'s first byte is, when this process has none."""
        if self._closed:
            return None
        with self._shared:
            tail, count = self._window()
            for index in range(tail, count):
                start, nbytes, _, _, seq, state = self._slot(index)
                if state == _RESERVED and start <= r.start < start + nbytes:
                    if start in self._records:
                        return None  # this process's: the local check said what is wrong
                    if not self._is_record(index, seq, self._untaken()):
                        return "another process's reservation"
                    taken = 0 <= seq < self._words[_H_TAKE_SEQ]
                    return "a record the consumer took" if taken else "a committed record, not taken yet"
        return None

    def released(self, r: HostRange) -> bool:
        r = plain(r)
        self._check_open()
        with self._lock:
            self._check_ring(r)
            with self._shared:
                tail, count = self._window()
                if r.end > self._shared_head(count):
                    head = self._shared_head(count)
                    raise RangeError("RING-1", f"host bytes {_fmt(r)} were never reserved (head is {head})")
                for index in range(tail, count):
                    start, nbytes, _, _, _, state = self._slot(index)
                    if start >= r.end:
                        break
                    if state == _RESERVED and start + nbytes > r.start:
                        if start not in self._records:
                            return False  # another process's, or committed and not taken
                        if self._any_unreleased(
                            made_range(self, max(r.start, start), min(r.end, start + nbytes) - max(r.start, start))
                        ):
                            return False
                return True

    def reclaim(self) -> int:
        """Release the reservations of producers that died before committing them: the cursor
        does not wait behind them forever (RING-6). Returns how many were reclaimed."""
        with self._lock:
            self._check_fence()
            with self._shared:
                self._check_fence()
                return self._reclaim_dead()

    def _reclaim_dead(self) -> int:  # the segment locked
        tail, count = self._window()
        dead, untaken = [], self._untaken()
        for index in range(tail, count):
            _, _, pid, pstart, seq, state = self._slot(index)
            if state == _RESERVED and not self._is_record(index, seq, untaken) and not self.alive(pid, pstart):
                dead.append(index)
        reclaimed, moved = self._word(_H_RECLAIMED) + len(dead), self._live_window(*dead)[0]
        for index in dead:
            self._set_state(index, _RECLAIMED)  # each reclaimed from here on
        if dead:
            self._words[_H_RECLAIMED] = reclaimed
        if moved != tail:  # (also a tail a dead process left behind)
            self._words[_H_TAIL] = moved
            if self._bump(_H_RELEASES):
                self._wake(_H_RELEASES)  # (under the lock: this is rare)
        return len(dead)

    def stats(self) -> dict[str, int]:
        """The ring's counters across processes: records committed and taken, the consumer
        generation and the consumer's pid (0: none yet), records delivered again, reservations
        reclaimed, live reservations."""
        self._check_open()
        with self._both:
            tail, count = self._window()
            return {
                "committed": self._words[_H_NEXT_SEQ],
                "taken": self._words[_H_TAKE_SEQ],
                "generation": self._words[_H_GENERATION],
                "consumer_pid": self._words[_H_CONSUMER_PID],
                "redelivered": self._words[_H_REDELIVERED],
                "reclaimed": self._words[_H_RECLAIMED],
                "live": sum(self._slot(i)[5] == _RESERVED for i in range(tail, count)),
            }

    def snapshot(self) -> tuple[object, ...]:
        self._check_open()
        with self._both:
            return (*self._snapshot(), bytes(self._words))

    def restore(self, state: RingState) -> None:
        raise InvalidArgumentError("ARG-1", "a shared ring's bookkeeping is its segment's: it cannot be restored")
