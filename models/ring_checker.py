"""A bounded model checker of the shared ring's protocol, run over the real SharedRing.

Actors: producers, each its own attachment (a process); consumers, one attachment each: a restart
attaches a new one and calls `consume()`, and the consumer it replaces stays alive, fenced, and
keeps calling. Every action is a call of the real implementation. A crash is the same call dying
just before its k-th word write into the segment, for every k, as a SIGKILL there would: the
writes before it stay, its lock comes back (the kernel drops a dead holder's flock), and its
identity is dead from then on (`alive`). Beside the ring runs the reference: which records are
committed, taken by which generation, released.

Checked at every step, each breach named by the rule it breaks:
- RING-4: commits are numbered 0, 1, 2, ...; `take` returns the lowest committed record that is
  neither released nor held by the live consumer.
- RING-5: `r.redelivered` exactly for records an earlier consumer took; those come first (a take
  that passes one skipped a redelivery); a record's bytes whole when delivered again; a live
  consumer finding nothing while a record is due is a loss; at the
  end of every path a drain by the live consumer (or a new one) gets every record due, exactly.
- RING-6: no committed record is ever reclaimed; after the drain and a reclaim, the cursor
  reaches the head (nothing stays stuck: no deadlock).
- RING-1: the cursor is monotone along a path and never passes a live reservation.
- GEN-2: a fenced consumer's call raises StaleHandleError and changes no word of the segment.

States are told apart by the segment's words (futex counters aside) and the actors' and the
reference's states; each is reached by replaying its path on a fresh segment.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from devbridge.errors import BridgeError, StaleHandleError, WaitTimeoutError
from devbridge.ring import shared as shared_ring
from devbridge.ring.host import HostRange, HostRing
from devbridge.ring.segment import SHM_DIR
from devbridge.ring.shared import SharedRing
from devbridge.spec.ring import load_ring

Action = tuple[Any, ...]
SIZE = 8  # bytes per record


class Crash(BaseException):
    """The process making a call dies here (a BaseException: no `except Exception` catches it)."""


class _Writes:
    """The word writes of one process's call, into any segment: it dies at the `crash_at`-th."""

    def __init__(self) -> None:
        self.writes = 0
        self.crash_at: int | None = None


class _Words:
    """A segment's words that count the writes a process makes through them (`_Writes`)."""

    def __init__(self, words: memoryview, count: _Writes) -> None:
        self.words = words
        self.count = count

    def __getitem__(self, i: Any) -> Any:
        return self.words[i]

    def __setitem__(self, i: Any, value: Any) -> None:
        count = self.count
        if count.crash_at is not None and count.writes == count.crash_at:
            raise Crash
        count.writes += 1
        self.words[i] = value

    def release(self) -> None:
        self.words.release()


@dataclass(frozen=True)
class RingBound:
    """What a check explores: every interleaving and crash point within these limits."""

    producers: int = 2
    records: int = 2  # reservations per producer
    restarts: int = 1  # consumers that replace the first one
    crashes: int = 2  # deaths along one path
    depth: int = 7  # actions per path
    capacity: int = 32  # ring bytes (below records x 8 B a reservation, reservations wrap)
    slots: int = 4  # live reservations at once
    finishes: bool = False  # consumers may also finish a record: commit its output to a second ring

    def __post_init__(self) -> None:
        if min(self.producers, self.records, self.depth, self.slots) < 1 or min(self.restarts, self.crashes) < 0:
            raise ValueError(f"a ring bound's limits are counts: {self}")
        if self.capacity < SIZE:
            raise ValueError(f"the ring must hold a record of {SIZE} B: {self}")


#: Named bounds: the test suite runs `ci` (the protocol: a ring of three records' bytes, so that
#: it fills and the fourth reservation wraps to its start), `finish` (outputs that finish their
#: records, RING-7, into a ring that fills), `tight` (two records live at most: each new one
#: takes the slot of one just released) and `deep` (paths long enough for commits and releases
#: out of order to write over the commit table's entry of a record still held, one crash on
#: each). In the last two a ring of 20 bytes skips its last 4 at the end of each lap.
RING_PROFILES = {
    "ci": RingBound(capacity=24),
    "finish": RingBound(records=1, capacity=16, slots=2, finishes=True),
    "tight": RingBound(slots=2, depth=6, capacity=20),
    "deep": RingBound(crashes=1, depth=11, slots=2, capacity=20),
    "small": RingBound(producers=1, records=2, restarts=1, crashes=1, depth=5, finishes=True),
}


@dataclass
class RingViolation:
    rule: str
    message: str
    path: tuple[Action, ...]

    def __str__(self) -> str:
        steps = "\n".join(f"  {i}. {a}" for i, a in enumerate(self.path, 1))
        return f"{self.rule}: {self.message}\nafter:\n{steps}"


@dataclass
class RingResult:
    states: int
    paths: int
    seconds: float
    violation: RingViolation | None = None
    actions: set[str] = field(default_factory=set)
    #: the record transitions of spec/ring.toml the reference took, as (state, event)
    transitions: set[tuple[str, str]] = field(default_factory=set)


class _Broken(Exception):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


def _pattern(producer: int, index: int) -> bytes:
    return bytes([producer * 16 + index]) * SIZE


def _output(seq: int) -> bytes:
    """The output of input record `seq`."""
    return bytes([0x80 | seq]) * SIZE


class _World:
    """One path's ring, actors and reference, built by applying actions in order."""

    def __init__(self, bound: RingBound) -> None:
        self.bound = bound
        self.name = f"devbridge-ring-check-{os.getpid()}-{next(_names)}"
        ring = HostRing.create(self.name, bound.capacity, records=bound.slots)
        assert isinstance(ring, SharedRing)
        self.ring = ring
        ring.alive = self._alive
        # the consumers' outputs, each finishing the record it was made from (RING-7): a second
        # ring, where the bound has outputs
        self.out_name = f"{self.name}-out"
        self.outputs: SharedRing | None = None
        if bound.finishes:
            outputs = HostRing.create(self.out_name, bound.capacity, records=bound.slots)
            assert isinstance(outputs, SharedRing)
            self.outputs = outputs
            outputs.alive = self._alive
        self.consumer_outs: list[SharedRing | None] = []
        self.output_of: dict[int, int] = {}  # the reference: input seq -> the output that finished it
        self.producers: list[SharedRing | None] = []
        self.reserved: list[HostRange | None] = []
        self.made = [0] * bound.producers
        for p in range(bound.producers):
            self.producers.append(self._attach(p))
            self.reserved.append(None)
        self.consumers: list[SharedRing | None] = []
        self.held: list[dict[int, HostRange]] = []
        self.live: int | None = None  # the consumer of the newest generation, while it lives
        self.generation = 0
        # the reference
        self.committed: dict[int, tuple[int, int, int]] = {}  # seq -> (producer, index, start)
        self.taken_ever: set[int] = set()
        self.released: set[int] = set()
        self.crashes = 0
        self.cursor = 0
        self.records: dict[int, str] = {}  # each record's state in spec/ring.toml, by its start
        self.moved: set[tuple[str, str]] = set()
        self._new_consumer(crash_at=None)

    def close(self) -> None:
        for attached in [self.ring, self.outputs, *self.producers, *self.consumers, *self.consumer_outs]:
            if attached is not None:
                _bury(attached)
        os.unlink(os.path.join(SHM_DIR, self.name))
        if self.outputs is not None:
            os.unlink(os.path.join(SHM_DIR, self.out_name))

    def _attach(self, who: int, name: str | None = None, count: _Writes | None = None) -> SharedRing:
        attached = HostRing.attach(name or self.name)
        assert isinstance(attached, SharedRing)
        attached.process = (_FAKE_PID + who, 1)
        attached.alive = self._alive
        attached._words = _Words(attached._words, count or _Writes())  # type: ignore[assignment]
        return attached

    def _attach_out(self, c: int, count: _Writes | None = None) -> SharedRing | None:
        """Consumer `c`'s attachment of the outputs' ring (its writes counted with `count`), if any."""
        return None if self.outputs is None else self._attach(self.bound.producers + c, self.out_name, count)

    def _alive(self, pid: int, started: int) -> bool:
        """The checker's processes: dead once crashed."""
        return (pid, started) not in _dead(self)

    def _words(self, ring: SharedRing | None = None) -> bytes:
        words = (ring or self.ring)._words
        raw = bytearray(words.cast("B"))  # the futex counters change on every wake: not state,
        # nor is a ring's identity (random, made anew by each replay), nor the one it is bound to
        for i in (*shared_ring._SLEEPERS, *shared_ring._SLEEPERS.values(), shared_ring._H_ID, shared_ring._H_SOURCE):
            raw[i * 8 : i * 8 + 8] = bytes(8)
        return bytes(raw)

    # ------------------------------------------------------------ what may happen next

    def actions(self) -> Iterator[Action]:
        b = self.bound
        for p, attached in enumerate(self.producers):
            if attached is None:
                continue
            if self.reserved[p] is None and self.made[p] < b.records:
                yield ("reserve", p)
            if self.reserved[p] is not None:
                yield ("commit", p)
        for c, attached in enumerate(self.consumers):
            if attached is None:
                continue
            yield ("take", c)
            for seq in sorted(self.held[c]):
                yield ("release", c, seq)
                if b.finishes:
                    yield ("finish", c, seq)
        if len(self.consumers) <= b.restarts:
            yield ("consume",)
        if any(p is None and r is not None for p, r in zip(self.producers, self.reserved, strict=True)):
            yield ("reclaim",)

    # ------------------------------------------------------------ doing it

    def apply(self, action: Action, crash_at: int | None = None) -> None:
        kind = action[0]
        self.last_writes = 0
        if crash_at is not None:
            self.crashes += 1
        if kind == "reserve":
            self._reserve(action[1], crash_at)
        elif kind == "commit":
            self._commit(action[1], crash_at)
        elif kind == "take":
            self._take(action[1], crash_at)
        elif kind == "release":
            self._release(action[1], action[2], crash_at)
        elif kind == "finish":
            self._finish(action[1], action[2], crash_at)
        elif kind == "consume":
            self._new_consumer(crash_at)
        elif kind == "reclaim":
            self._reclaim()
        self._check_state(kind)

    @contextmanager
    def _call(self, attached: SharedRing, crash_at: int | None) -> Iterator[None]:
        words = attached._words
        assert isinstance(words, _Words)
        count = words.count  # (the process's writes into every segment it attached)
        count.writes, count.crash_at = 0, crash_at
        try:
            yield
            if crash_at is not None and crash_at == count.writes:
                raise Crash  # after its last write, before it returned
        finally:
            self.last_writes = count.writes
            count.crash_at = None

    def _reserve(self, p: int, crash_at: int | None) -> None:
        attached = self.producers[p]
        assert attached is not None
        try:
            with self._call(attached, crash_at):
                r = attached.reserve(SIZE)
        except Crash:
            self._producer_died(p)
            return
        except BridgeError:
            return  # full: nothing reserved
        attached.write(r, _pattern(p, self.made[p]))
        self.reserved[p] = r
        self.records[r.start] = RECORDS.initial

    def _commit(self, p: int, crash_at: int | None) -> None:
        attached, r = self.producers[p], self.reserved[p]
        assert attached is not None and r is not None
        before = self.ring._words[shared_ring._H_NEXT_SEQ]
        try:
            with self._call(attached, crash_at):
                seq = attached.commit(r)
        except Crash:
            self._producer_died(p)
            if self.ring._words[shared_ring._H_NEXT_SEQ] != before:  # it died after the commit point
                self.committed[before] = (p, self.made[p], r.start)
                self._move(r.start, "commit")
                self.reserved[p] = None
            return
        if seq != len(self.committed):
            raise _Broken("RING-4", f"commit number {len(self.committed)} got sequence number {seq}")
        self.committed[seq] = (p, self.made[p], r.start)
        self._move(r.start, "commit")
        self.made[p] += 1
        self.reserved[p] = None

    def _due(self) -> list[int]:
        """The records the live consumer's next take must give, in order (the reference)."""
        held = set(self.held[self.live]) if self.live is not None else set()
        return sorted(s for s in self.committed if s not in self.released and s not in held)

    def _take(self, c: int, crash_at: int | None) -> None:
        attached = self.consumers[c]
        assert attached is not None
        fenced = c != self.live
        before = self._words()
        due = self._due()
        try:
            with self._call(attached, crash_at):
                r = attached.take(timeout=0)
        except Crash:
            self._consumer_died(c)
            # it died after the take point: `take_seq` past the record (not only past records
            # none had to be delivered again)
            if due and self.ring._words[shared_ring._H_TAKE_SEQ] > due[0] and not fenced:
                self.taken_ever.add(due[0])
                self._move(self.committed[due[0]][2], "take")
            return
        except StaleHandleError as e:
            self._refused(e, fenced, before, "take")
            return
        except WaitTimeoutError:
            if fenced:
                raise _Broken("GEN-2", "a fenced consumer's take was not refused") from None
            if self._due():
                raise _Broken("RING-5", f"the live consumer found nothing while {self._due()} are due") from None
            return
        if fenced:
            raise _Broken("GEN-2", f"a fenced consumer took record {r.seq}")
        due = self._due()
        if due and r.seq != due[0] and due[0] in self.taken_ever:
            raise _Broken(
                "RING-5", f"take gave record {r.seq}; record {due[0]}, an earlier consumer's, is due again first"
            )
        if not due or r.seq != due[0]:
            raise _Broken("RING-4", f"take gave record {r.seq}; the next due is {due[:1]}")
        if r.redelivered != (r.seq in self.taken_ever):
            raise _Broken("RING-5", f"record {r.seq} came with redelivered={r.redelivered}")
        if bytes(attached.view(r)) != _pattern(*self.committed[r.seq][:2]):
            raise _Broken("RING-5", f"record {r.seq} came with other bytes")
        self.taken_ever.add(r.seq)
        self.held[c][r.seq] = r
        self._move(r.start, "take")

    def _refused(self, e: StaleHandleError, fenced: bool, before: bytes, call: str) -> None:
        """A call refused as stale: only a fenced consumer's, citing GEN-2, changing no word."""
        if not fenced or e.rule != "GEN-2":
            raise _Broken("GEN-2", f"the live consumer's {call} was refused: {e}") from e
        if self._words() != before:
            raise _Broken("GEN-2", f"a fenced consumer's refused {call} changed the segment") from e

    def _release(self, c: int, seq: int, crash_at: int | None) -> None:
        attached = self.consumers[c]
        assert attached is not None
        r = self.held[c][seq]
        fenced = c != self.live
        before = self._words()
        try:
            with self._call(attached, crash_at):
                attached.release(r)
        except Crash:
            self._consumer_died(c)
            if not fenced and self._slot_state(r.start) != shared_ring._RESERVED:
                self.released.add(seq)  # it died after the release point
                self._move(r.start, "release")
            return
        except StaleHandleError as e:
            self._refused(e, fenced, before, "release")
            return
        if fenced:
            raise _Broken("GEN-2", f"a fenced consumer's release of record {seq} was accepted")
        if seq in self.released:
            raise _Broken("RING-5", f"record {seq} was released twice")
        self.released.add(seq)
        del self.held[c][seq]
        self._move(r.start, "release")

    def _finish(self, c: int, seq: int, crash_at: int | None) -> None:
        """Consumer `c` makes the output of record `seq` and commits it finishing the record."""
        attached, out, outputs = self.consumers[c], self.consumer_outs[c], self.outputs
        assert attached is not None and out is not None and outputs is not None
        r = self.held[c][seq]
        fenced = c != self.live
        before, out_seq = self._words(), outputs._words[shared_ring._H_NEXT_SEQ]
        live = self._slot_state(r.start) == shared_ring._RESERVED
        try:
            with self._call(attached, crash_at):
                o = out.reserve(SIZE)
                out.write(o, _output(seq))
                got = out.commit(o, finishes=r)
        except Crash:
            self._consumer_died(c)
            committed = outputs._words[shared_ring._H_NEXT_SEQ] != out_seq
            released = live and self._slot_state(r.start) != shared_ring._RESERVED
            if fenced and (committed or released):
                raise _Broken("GEN-2", f"a fenced consumer's finish of record {seq} changed a ring") from None
            if committed:
                self._output_committed(seq, out_seq)
            if released:
                if seq not in self.output_of:
                    raise _Broken("RING-7", f"record {seq} was released by its finish, no output committed") from None
                self.released.add(seq)
                self._move(r.start, "finish")
            return
        except StaleHandleError as e:
            if not fenced or e.rule != "GEN-2":
                raise _Broken("GEN-2", f"the live consumer's finish was refused: {e}") from e
            if self._words() != before or outputs._words[shared_ring._H_NEXT_SEQ] != out_seq:
                raise _Broken("GEN-2", "a fenced consumer's refused finish changed a ring") from e
            return
        except BridgeError:
            return  # the output ring is full: nothing reserved
        if fenced:
            raise _Broken("GEN-2", f"a fenced consumer's finish of record {seq} was accepted")
        if seq in self.output_of:  # finished before a crash: nothing committed again
            if got != self.output_of[seq] or outputs._words[shared_ring._H_NEXT_SEQ] != out_seq:
                raise _Broken("RING-7", f"record {seq}, finished by output {self.output_of[seq]}, got output {got}")
        else:
            if got != out_seq:
                raise _Broken("RING-4", f"output number {out_seq} got sequence number {got}")
            self._output_committed(seq, got)
        if seq in self.released:
            raise _Broken("RING-5", f"record {seq} was released twice")
        self.released.add(seq)
        del self.held[c][seq]
        self._move(r.start, "finish")

    def _output_committed(self, seq: int, out: int) -> None:
        if seq in self.output_of:
            raise _Broken("RING-7", f"record {seq} has two outputs: {self.output_of[seq]} and {out}")
        self.output_of[seq] = out

    def _collect(self, collector: SharedRing) -> None:
        """The collector: every output committed, each of a different input, as the reference says."""
        collector.consume()
        got: dict[int, int] = {}
        while True:
            try:
                o = collector.take(timeout=0)
            except WaitTimeoutError:
                break
            seq = bytes(collector.view(o))[0] & 0x7F
            if seq in got:
                raise _Broken("RING-7", f"the collector got two outputs of record {seq}: {got[seq]} and {o.seq}")
            got[seq] = o.start
            collector.release(o)
        if set(got) != set(self.output_of):
            raise _Broken("RING-7", f"the collector got outputs {got}; the records finished are {self.output_of}")

    def _new_consumer(self, crash_at: int | None) -> None:
        c = len(self.consumers)
        attached = self._attach(self.bound.producers + c)
        self.consumers.append(attached)
        words = attached._words
        assert isinstance(words, _Words)
        self.consumer_outs.append(self._attach_out(c, words.count))
        self.held.append({})
        before = self.ring._words[shared_ring._H_GENERATION]
        try:
            with self._call(attached, crash_at):
                generation = attached.consume()
        except Crash:
            self._consumer_died(c)
            if self.ring._words[shared_ring._H_GENERATION] != before:
                self.live = None  # a generation began; its consumer is dead
                self.generation = before + 1
                self._redeliver()
            return
        if generation != self.generation + 1:
            raise _Broken("RING-5", f"consume() gave generation {generation} after {self.generation}")
        self.generation, self.live = generation, c
        self._redeliver()

    def _producer_died(self, p: int) -> None:
        attached = self.producers[p]
        assert attached is not None
        _bury(attached)
        self.producers[p] = None

    def _move(self, start: int, event: str) -> None:
        """The reference's record at `start` takes `event`: a transition of spec/ring.toml, or a breach."""
        state = self.records[start]
        dest = RECORDS.next(state, event)
        if dest is None:
            raise _Broken(_RULE_OF[event], f"the record at {start} took {event!r} while {state}: no such transition")
        self.moved.add((state, event))
        self.records[start] = dest

    def _redeliver(self) -> None:
        """A new generation began: what earlier consumers held is due again."""
        for start, state in list(self.records.items()):
            if state == "taken":
                self._move(start, "redeliver")

    def _reclaim(self) -> None:
        """ring.reclaim(), and the reference's records whose slots it reclaimed: every one a
        dead producer reserved and did not commit."""
        self.ring.reclaim()
        for start, state in list(self.records.items()):
            if state == "reserved" and self._slot_state(start) == shared_ring._RECLAIMED:
                self._move(start, "reclaim")
        for p, (attached, r) in enumerate(zip(self.producers, self.reserved, strict=True)):
            if attached is None and r is not None:
                if self.records[r.start] == "reserved":
                    raise _Broken("RING-6", f"reclaim() left the reservation at {r.start} of a dead producer")
                self.reserved[p] = None  # (its bytes may hold a newer reservation from here on)

    def _consumer_died(self, c: int) -> None:
        attached, out = self.consumers[c], self.consumer_outs[c]
        assert attached is not None
        _bury(attached)
        if out is not None:
            _bury(out)
        self.consumers[c] = self.consumer_outs[c] = None
        self.held[c] = {}
        if self.live == c:
            self.live = None

    def _slot_state(self, start: int) -> int | None:
        """The state of the newest reservation at `start` whose slot is not reused yet (released
        and reclaimed ones too: past the tail), None when there is none."""
        ring = self.ring
        count = ring._window()[1]
        for index in range(count - 1, max(count - ring._slots, 0) - 1, -1):
            s, _, _, _, _, state = ring._slot(index)
            if s == start:
                return state
        return None

    # ------------------------------------------------------------ invariants

    def _check_state(self, kind: str = "") -> None:
        ring = self.ring
        for seq, (_, _, start) in self.committed.items():
            if seq not in self.released and (state := self._slot_state(start)) != shared_ring._RESERVED:
                rule = "RING-6" if state == shared_ring._RECLAIMED or kind == "reclaim" else "RING-5"
                raise _Broken(rule, f"committed record {seq}, not released, left the ring by {kind or 'the drain'}")
        tail, count = ring._live_window()
        cursor = ring._oldest(tail, count)
        if cursor < self.cursor:
            raise _Broken("RING-1", f"the cursor went back from {self.cursor} to {cursor}")
        self.cursor = cursor
        untaken = ring._untaken()
        for index in range(tail, count):
            start, _, _, _, seq, state = ring._slot(index)
            if state == shared_ring._RESERVED and start < cursor:
                raise _Broken("RING-1", f"the cursor {cursor} passed the live reservation at {start}")
            if state == shared_ring._RECLAIMED and ring._is_record(index, seq, untaken):
                raise _Broken("RING-6", f"committed record {seq} was reclaimed")

    def drain(self) -> None:
        """The end of a path: the live consumer (or a new one) gets every record due, exactly;
        dead producers' reservations are reclaimed; the cursor reaches the head."""
        if self.live is None:
            c = len(self.consumers)
            self.consumers.append(self._attach(self.bound.producers + c))
            self.consumer_outs.append(self._attach_out(c))
            self.held.append({})
            self.live = c
            consumer = self.consumers[-1]
            assert consumer is not None
            self.generation = consumer.consume()
            self._redeliver()
        c = self.live
        for seq in sorted(self.held[c]):
            self._release(c, seq, None)
        while self._due():
            self._take(c, None)
            for seq in sorted(self.held[c]):
                self._release(c, seq, None)
        self._take(c, None)  # nothing more: a timeout
        for p, attached in enumerate(self.producers):
            r = self.reserved[p]
            if attached is not None and r is not None:
                attached.release(r)
                self._move(r.start, "release")
        self._reclaim()
        self._check_state()
        if self.ring.cursor != self.ring.head:
            raise _Broken("RING-6", f"after the drain the cursor stays at {self.ring.cursor}, head {self.ring.head}")
        if self.outputs is None:
            return
        for out in self.consumer_outs:  # outputs a fenced consumer reserved and could not commit
            if out is not None:
                for r in out.unreleased():
                    out.release(r)
        self._collect(self.outputs)
        self.outputs.reclaim()
        if self.outputs.cursor != self.outputs.head:
            raise _Broken("RING-6", f"after the drain the outputs' cursor stays at {self.outputs.cursor}")


def _bury(attached: SharedRing) -> None:
    """A process's end: its attachment's mapping and file go (and with the file its lock)."""
    if isinstance(attached._words, _Words):
        attached._words = attached._words.words
    attached.close()


_FAKE_PID = 1 << 30  # identities no process has
RECORDS = load_ring()
#: The rule a move the spec does not allow breaks, by its event.
_RULE_OF = {
    "commit": "RING-4",
    "take": "RING-4",
    "release": "RING-5",
    "redeliver": "RING-5",
    "reclaim": "RING-6",
    "finish": "RING-7",
}
_names = itertools.count()


def _dead(world: _World) -> set[tuple[int, int]]:
    n = world.bound.producers
    dead = {(_FAKE_PID + p, 1) for p, a in enumerate(world.producers) if a is None}
    return dead | {(_FAKE_PID + n + c, 1) for c, a in enumerate(world.consumers) if a is None}


def _key(world: _World) -> tuple[object, ...]:
    return (
        world._words(),
        world._words(world.outputs) if world.outputs is not None else b"",
        tuple(sorted(world.output_of.items())),
        tuple(
            (a is None, r.start if r else None, m)
            for a, r, m in zip(world.producers, world.reserved, world.made, strict=True)
        ),
        tuple((a is None, tuple(sorted(h))) for a, h in zip(world.consumers, world.held, strict=True)),
        world.live,
        tuple(sorted(world.committed.items())),
        frozenset(world.released),
        frozenset(world.taken_ever),
        world.crashes,
        world.cursor,
    )


Step = tuple[Action, int | None]


def check_ring(bound: RingBound | None = None) -> RingResult:
    """Explore every path within `bound` breadth first; the first violation found (a shortest one)."""
    bound = bound or RING_PROFILES["ci"]
    t0 = time.perf_counter()
    seen: set[tuple[object, ...]] = set()
    queue: deque[tuple[Step, ...]] = deque([()])
    # what a probe (run to count a step's writes) found at the path it ran: that path's state,
    # when the queue comes to it, without replaying it again
    probed: dict[tuple[Step, ...], tuple[tuple[object, ...], list[Action], int, set[tuple[str, str]]]] = {}
    result = RingResult(0, 0, 0.0)
    while queue and result.violation is None:
        path = queue.popleft()
        found = probed.pop(path, None)
        if found is None:
            world, result.violation = _run(bound, path, final=False)
            if world is None:
                break
            found = _found(world)
            world.close()
        key, every, crashes, moved = found
        result.transitions |= moved
        actions = every if len(path) < bound.depth and key not in seen else []
        if key in seen:
            continue
        seen.add(key)
        result.states += 1
        if not actions:  # a path's end: the drain
            result.paths += 1
            done, result.violation = _run(bound, path, final=True)
            if done is not None:
                result.transitions |= done.moved
                done.close()
            continue
        for action in actions:
            result.actions.add(action[0])
            queue.append((*path, (action, None)))
            if crashes < bound.crashes and action[0] != "reclaim":
                probe, result.violation = _run(bound, (*path, (action, None)), final=False)
                if probe is None:
                    break
                writes = probe.last_writes
                probed[(*path, (action, None))] = _found(probe)
                probe.close()
                queue.extend((*path, (action, k)) for k in range(writes + 1))
    result.seconds = time.perf_counter() - t0
    return result


def _found(world: _World) -> tuple[tuple[object, ...], list[Action], int, set[tuple[str, str]]]:
    """What the search reads of a world: its state's key, the actions open to it, its crashes
    so far and the spec transitions it moved along."""
    return _key(world), list(world.actions()), world.crashes, set(world.moved)


def _run(bound: RingBound, path: tuple[Step, ...], final: bool) -> tuple[_World | None, RingViolation | None]:
    """`path` replayed on a fresh ring (and drained, when `final`): the world, or the violation."""
    world = _World(bound)
    try:
        for action, crash_at in path:
            world.apply(action, crash_at)
        if final:
            world.drain()
        return world, None
    except _Broken as e:
        world.close()
        return None, RingViolation(e.rule, str(e), tuple(a if c is None else ("crash", c, *a) for a, c in path))
    except BaseException:
        world.close()
        raise
