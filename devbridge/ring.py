"""HostRing: host ring memory with exact release and validity points.

Bytes are addressed by *stream offset*: monotone, never wrapping; byte `s`
lives at `s % capacity`. A reservation never straddles the end of the
buffer (the ring skips to the next lap; skipped bytes are free). The ring
tracks which reserved bytes are unreleased, which are read by pending input
copies, written by pending output copies, or left invalid by a failed one.

`cursor` is the first unreleased byte (or the head when none is): it is
monotone and never passes an unreleased byte (RING-1). The Bridge drives the
copy-facing methods; the worker calls `reserve`, `view`, `release`.
"""

from __future__ import annotations

import threading
from bisect import bisect_right

from devbridge.errors import OutputNotReadyError, RangeError, RingFullError
from devbridge.types import HostRange

Span = tuple[int, int]  # [start, end) in stream bytes


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


class HostRing:
    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise RangeError("RANGE-1", f"ring capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self._memory = memoryview(bytearray(capacity))
        self._lock = threading.RLock()
        self._head = 0
        # Unreleased bytes, one span per reservation (split by partial releases), sorted.
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._reads: list[Span] = []  # pending input copies (a multiset)
        self._writes: list[Span] = []  # pending output copies
        self._failed: list[Span] = []  # outputs whose copy failed: never readable

    # ------------------------------------------------------------ worker API

    @property
    def cursor(self) -> int:
        """Stream offset below which every byte is released."""
        with self._lock:
            return self._starts[0] if self._starts else self._head

    @property
    def head(self) -> int:
        """Stream offset where the next reservation starts (before any lap skip)."""
        return self._head

    def reserve(self, nbytes: int) -> HostRange:
        """Reserve `nbytes` contiguous bytes; RingFullError if they do not fit (RING-2)."""
        with self._lock:
            if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
                raise RangeError("RANGE-1", f"reservation size must be a positive int, got {nbytes!r}")
            pos = self._head % self.capacity
            start = self._head if pos + nbytes <= self.capacity else self._head + self.capacity - pos
            free = self.capacity - (start - self.cursor)
            if nbytes > free:
                raise RingFullError(
                    "RING-2", f"reserving {nbytes} B needs {nbytes - free} B more than the ring has free"
                )
            self._starts.append(start)
            self._ends.append(start + nbytes)
            self._head = start + nbytes
            return HostRange(self, start, nbytes)

    def view(self, r: HostRange) -> memoryview:
        """Writable bytes of an unreleased range; refused while an output copy into it is not valid."""
        with self._lock:
            self._check_live(r, "RING-3")
            if _overlaps(self._writes, r):
                raise OutputNotReadyError("D2H-3", f"host bytes {_fmt(r)} are still being copied from the device")
            if _overlaps(self._failed, r):
                raise OutputNotReadyError("D2H-3", f"host bytes {_fmt(r)} belong to a failed output copy")
            return self.raw(r)

    def released(self, r: HostRange) -> bool:
        """Whether every byte of `r` is released."""
        with self._lock:
            self._check_ring(r)
            i = max(bisect_right(self._starts, r.start) - 1, 0)
            while i < len(self._starts) and self._starts[i] < r.end:
                if self._ends[i] > r.start:
                    return False
                i += 1
            return True

    def release(self, r: HostRange) -> None:
        """Release bytes the worker consumed. Refused for bytes a pending copy still uses."""
        with self._lock:
            self._check_live(r, "RING-1")
            if _overlaps(self._reads, r):
                raise RangeError("H2D-3", f"host bytes {_fmt(r)} are still read by a pending input copy")
            if _overlaps(self._writes, r):
                raise RangeError("RING-3", f"host bytes {_fmt(r)} are still written by a pending output copy")
            self._cut(r)
            self._failed = _minus(self._failed, (r.start, r.end))

    def unreleased(self) -> list[HostRange]:
        """The unreleased spans, oldest first."""
        with self._lock:
            return [HostRange(self, s, e - s) for s, e in zip(self._starts, self._ends, strict=True)]

    # ------------------------------------------------------------ Bridge API

    def check_source(self, r: HostRange) -> None:
        """An input copy may read `r` (RING-3, D2H-3). Changes nothing."""
        with self._lock:
            self._check_live(r, "RING-3")
            if _overlaps(self._writes, r):
                raise RangeError("RING-3", f"host bytes {_fmt(r)} are being written by a pending output copy")
            if _overlaps(self._failed, r):
                raise OutputNotReadyError("D2H-3", f"host bytes {_fmt(r)} belong to a failed output copy")

    def check_dest(self, r: HostRange) -> None:
        """An output copy may write `r` (RING-3). Changes nothing."""
        with self._lock:
            self._check_live(r, "RING-3")
            if _overlaps(self._reads, r) or _overlaps(self._writes, r):
                raise RangeError("RING-3", f"host bytes {_fmt(r)} are in use by a pending copy")

    def raw(self, r: HostRange) -> memoryview:
        """The bytes of `r` with no checks: for the Bridge, after `check_source`/`check_dest`."""
        pos = r.start % self.capacity
        return self._memory[pos : pos + r.nbytes]

    def begin_read(self, r: HostRange) -> None:
        with self._lock:
            self._reads.append((r.start, r.end))

    def end_read(self, r: HostRange, release: bool) -> None:
        """An input copy is done. On success its bytes are released, except those other
        pending input copies still read (they go when the last of those succeeds)."""
        with self._lock:
            self._reads.remove((r.start, r.end))
            if not release:
                return
            pieces = [(r.start, r.end)]
            for span in self._reads:
                pieces = _minus(pieces, span)
            for s, e in pieces:
                self._cut(HostRange(self, s, e - s))

    def begin_write(self, r: HostRange) -> None:
        with self._lock:
            self._writes.append((r.start, r.end))
            self._failed = _minus(self._failed, (r.start, r.end))

    def end_write(self, r: HostRange, valid: bool) -> None:
        with self._lock:
            self._writes.remove((r.start, r.end))
            if not valid:
                self._failed.append((r.start, r.end))

    def snapshot(self) -> tuple[object, ...]:
        """Everything the ring knows, for tests asserting that a rejected call changed nothing."""
        with self._lock:
            return (
                self._head,
                tuple(self._starts),
                tuple(self._ends),
                tuple(sorted(self._reads)),
                tuple(sorted(self._writes)),
                tuple(sorted(self._failed)),
                bytes(self._memory),
            )

    # ------------------------------------------------------------ mechanics

    def _check_ring(self, r: HostRange) -> None:
        if not isinstance(r, HostRange) or r.ring is not self:
            raise RangeError("RANGE-1", f"{r!r} is not a range of this ring")

    def _find(self, r: HostRange) -> int:
        """Index of the unreleased span holding all of `r`, or -1."""
        i = bisect_right(self._starts, r.start) - 1
        return i if i >= 0 and r.end <= self._ends[i] else -1

    def _check_live(self, r: HostRange, rule: str) -> None:
        self._check_ring(r)
        if self._find(r) < 0:
            raise RangeError(rule, f"host bytes {_fmt(r)} are not reserved and unreleased in one reservation")

    def _cut(self, r: HostRange) -> None:
        i = self._find(r)
        assert i >= 0, f"releasing bytes that are not unreleased: {_fmt(r)}"
        s, e = self._starts[i], self._ends[i]
        del self._starts[i], self._ends[i]
        for ps, pe in reversed([(s, r.start), (r.end, e)]):
            if ps < pe:
                self._starts.insert(i, ps)
                self._ends.insert(i, pe)


def _fmt(r: HostRange) -> str:
    return f"[{r.start}, {r.end})"
