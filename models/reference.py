"""A reference model of the device bridge contract, written to be obviously right.

Plain dicts and sets of byte positions; no code shared with statemachine/ or
the Bridge. For any sequence of calls and completions it answers: the state
of each allocation, which calls are rejected and with which error and rule,
which host bytes are released or readable and what they hold, what every
allocation's device bytes are, and which backend frees must have happened.

Calls return `Reject(error, rule)` when the contract says the call is refused
and changes nothing, `Fail(error, rule)` when the backend was asked and
failed (counted; a failed synchronous output copy also leaves its range
unreadable; a failed free leaves the allocation dead all the same), and
otherwise an id.

A view's use lasts while any tensor reaching its memory lives (VIEW-3): the
view itself and every tensor derived from it (movement ops, lazy ops, assign
targets). `wrap` returns the view's tensor, `derive` a tensor derived from a
live one, `drop` forgets one; the use ends when its last tensor is dropped
(the bridge applies the end on its next call). A view's offset must be a
multiple of the device's alignment (VIEW-2).

Backend frees can be made to fail (`arm_free_faults`): each allocation gets
exactly one release attempt, the next attempts consume the armed faults, and a
failed one is reported where the release happened: by `free` (immediate), by
`restart` (after every old allocation had its attempt), or, for a release a
completion or a dropped view caused, by the next `poll`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

VIEW_ALIGNMENT = 16  # the fake device's (tinygrad CPU's): a view's offset is a multiple of it


@dataclass(frozen=True)
class Reject:
    error: str
    rule: str


@dataclass(frozen=True)
class Fail:
    error: str
    rule: str


@dataclass
class Alloc:
    generation: int
    data: bytearray
    freed_by_user: bool = False
    used: bool = False
    released: bool = False  # its one backend free was attempted (never retried)
    free_failed: bool = False  # ...and the backend refused it: the buffer is still held
    uses: set[int] = field(default_factory=set)  # use ids in flight


@dataclass
class Use:
    kind: str  # copy_in, copy_out, compute, view
    allocs: list[int]
    generation: int
    host: range | None = None  # stream bytes read (copy_in) or written (copy_out)
    device_offset: int = 0
    fails: bool = False  # an injected fault: fails when the backend finishes it
    release: bool = True  # an input copy's bytes are released by the bridge (else by the worker)
    tensors: set[int] = field(default_factory=set)  # a view's live tensors: the view and those derived from it


class ReferenceModel:
    def __init__(self, ring_capacity: int) -> None:
        self.generation = 0
        self.allocs: dict[int, Alloc] = {}
        self.uses: dict[int, Use] = {}
        self.frees: list[int] = []  # backend free attempts, in order (each allocation at most once)
        self.free_faults = 0  # armed: the next backend frees fail
        self.free_failures = 0  # backend frees that failed
        self.unreported = 0  # deferred frees that failed since the last poll (which reports them)
        self.next_use = 0
        self.tensors: dict[int, int] = {}  # live tensor id -> the view use it reaches
        self.next_tensor = 0
        # host ring, byte by byte (stream offsets)
        self.capacity = ring_capacity
        self.head = 0
        self.reservations: list[range] = []
        self.unreleased: set[int] = set()
        self.failed: set[int] = set()  # output bytes whose copy failed
        self.memory = bytearray(ring_capacity)  # the ring's bytes: stream byte b lives at b % capacity

    # ------------------------------------------------------------ states

    def state(self, a: int) -> str:
        alloc = self.allocs[a]
        copies = sum(1 for u in alloc.uses if self.uses[u].kind in ("copy_in", "copy_out"))
        computes = len(alloc.uses) - copies
        if alloc.generation != self.generation:
            return "stale_pending" if alloc.uses else "stale"
        if alloc.freed_by_user:
            return "free_pending" if alloc.uses else "freed"
        if copies and computes:
            return "copying_computing"
        if copies:
            return "copying"
        if computes:
            return "computing"
        return "idle" if alloc.used else "allocated"

    def _use_rejection(self, a: int) -> Reject | None:
        state = self.state(a)
        if state.startswith("stale"):
            return Reject("StaleHandleError", "GEN-2")
        if state in ("freed", "free_pending"):
            return Reject("InvalidHandleError", "USE-1")
        return None

    # ------------------------------------------------------------ ring

    def cursor(self) -> int:
        return min(self.unreleased) if self.unreleased else self.head

    def reserve(self, n: int) -> range | Reject:
        pos = self.head % self.capacity
        start = self.head if pos + n <= self.capacity else self.head + self.capacity - pos
        oldest = min(self.unreleased) if self.unreleased else start  # skipped bytes are free
        if n > self.capacity or start + n - oldest > self.capacity:
            return Reject("RingFullError", "RING-2")
        r = range(start, start + n)
        self.reservations.append(r)
        self.unreleased |= set(r)
        self.head = start + n
        return r

    def _in_one_reservation(self, r: range) -> bool:
        return set(r) <= self.unreleased and any(r.start >= s.start and r.stop <= s.stop for s in self.reservations)

    def _pending(self, kind: str) -> set[int]:
        return {b for u in self.uses.values() if u.kind == kind and u.host is not None for b in u.host}

    def write_host(self, r: range, data: bytes) -> Reject | None:
        """The producer writes bytes through ring.view."""
        if rejected := self.view_rejection(r):
            return rejected
        assert not self.view_readonly(r), "a read-only view cannot be written"
        for b, v in zip(r, data, strict=True):
            self.memory[b % self.capacity] = v
        return None

    def view_rejection(self, r: range) -> Reject | None:
        if not self._in_one_reservation(r):
            return Reject("RangeError", "RING-3")
        if set(r) & (self._pending("copy_out") | self.failed):
            return Reject("OutputNotReadyError", "D2H-3")
        return None

    def view_readonly(self, r: range) -> bool:
        """A view that is not refused is read-only while a pending input copy reads any of it (H2D-3)."""
        return bool(set(r) & self._pending("copy_in"))

    def released(self, r: range) -> bool | Reject:
        """ring.released: every byte of `r` released; bytes never reserved are an error."""
        if r.stop > self.head:
            return Reject("RangeError", "RING-1")
        return not set(r) & self.unreleased

    def read_host(self, r: range) -> bytes:
        return bytes(self.memory[b % self.capacity] for b in r)

    def release(self, r: range) -> Reject | None:
        if not self._in_one_reservation(r):
            return Reject("RangeError", "RING-1")
        if set(r) & self._pending("copy_in"):
            return Reject("RangeError", "H2D-3")
        if set(r) & self._pending("copy_out"):
            return Reject("RangeError", "RING-3")
        self.unreleased -= set(r)
        self.failed -= set(r)
        return None

    # ------------------------------------------------------------ bridge calls

    def alloc(self, extent: int, fails: bool) -> int | Fail:
        if fails:
            return Fail("DeviceAllocationError", "ALLOC-2")
        a = len(self.allocs)
        self.allocs[a] = Alloc(self.generation, bytearray(extent))
        return a

    def free(self, a: int) -> Reject | Fail | None:
        state = self.state(a)
        if state.startswith("stale"):
            return Reject("StaleHandleError", "GEN-2")
        if state in ("freed", "free_pending"):
            return Reject("InvalidHandleError", "FREE-2")
        self.allocs[a].freed_by_user = True
        if self._release_if_done(a):
            return Fail("DeviceFreeError", "FREE-3")  # freed all the same
        return None

    def host_to_device(
        self, src: range, a: int, offset: int, sync: bool, fails: bool, release: bool = True
    ) -> int | Reject | Fail:
        if rejected := self._use_rejection(a):
            return rejected
        if not self._in_one_reservation(src) or set(src) & self._pending("copy_out"):
            return Reject("RangeError", "RING-3")
        if set(src) & self.failed:
            return Reject("OutputNotReadyError", "D2H-3")
        if sync and fails:
            return Fail("DeviceCopyError", "COPY-F")  # the host bytes stay unreleased for a retry
        return self._begin(Use("copy_in", [a], self.generation, src, offset, fails, release), sync)

    def device_to_host(self, a: int, offset: int, dst: range, sync: bool, fails: bool) -> int | Reject | Fail:
        if rejected := self._use_rejection(a):
            return rejected
        if not self._in_one_reservation(dst) or set(dst) & (self._pending("copy_in") | self._pending("copy_out")):
            return Reject("RangeError", "RING-3")
        if sync and fails:
            self.failed |= set(dst)
            return Fail("OutputCopyError", "COPY-F")
        self.failed -= set(dst)
        return self._begin(Use("copy_out", [a], self.generation, dst, offset, fails), sync)

    def compute(self, allocs: list[int], fails: bool) -> int | Reject:
        unique = list(dict.fromkeys(allocs))
        for a in unique:
            if rejected := self._use_rejection(a):
                return rejected
        return self._begin(Use("compute", unique, self.generation, fails=fails), sync=False)

    def wrap(self, a: int, offset: int, nbytes: int) -> int | Reject:
        """A view of `nbytes` at `offset`: the id of its tensor. Checked as the bridge does: the
        allocation's lifecycle, then the extent, then the alignment (both VIEW-2)."""
        if rejected := self._use_rejection(a):
            return rejected
        if offset + nbytes > len(self.allocs[a].data) or offset % VIEW_ALIGNMENT:
            return Reject("InvalidViewError", "VIEW-2")
        u = self._begin(Use("view", [a], self.generation), sync=False)
        return self._tensor(u)

    def derive(self, t: int) -> int:
        """A tensor derived from live tensor `t` (a movement op, a lazy op, an assign): it reaches
        the same view, whatever became of the allocation since (not a bridge call: never refused)."""
        return self._tensor(self.tensors[t])

    def drop(self, t: int) -> int:
        """The last reference to tensor `t` goes: how many uses that ends (1 if it was its view's
        last tensor, else 0). The bridge ends it on its next call."""
        u = self.tensors.pop(t)
        use = self.uses[u]
        use.tensors.remove(t)
        if use.tensors:
            return 0
        self.finish(u)  # a view's end is reported to nobody, aborted by a restart or not
        return 1

    def pins(self, a: int) -> dict[str, object]:
        """bridge.pins without the time waited: the state and the uses in flight by kind."""
        kinds = Counter(self.uses[u].kind for u in self.allocs[a].uses)
        return {
            "state": self.state(a),
            "copies_in": kinds["copy_in"],
            "copies_out": kinds["copy_out"],
            "computes": kinds["compute"],
            "views": kinds["view"],
        }

    def restart(self) -> Fail | None:
        """Every old idle allocation gets its release, even after one failed; then any failure
        is reported (the generation has advanced anyway)."""
        self.generation += 1
        failed = [a for a in self.allocs if self._release_if_done(a)]
        return Fail("DeviceFreeError", "FREE-3") if failed else None

    def poll(self, finished: int) -> int | Fail:
        """bridge.poll, after it processed `finished` uses: reports the deferred frees that
        failed since the last poll (and forgets them), else returns `finished`."""
        if self.unreported:
            self.unreported = 0
            return Fail("DeviceFreeError", "FREE-3")
        return finished

    def arm_free_faults(self, times: int = 1) -> None:
        self.free_faults += times

    # ------------------------------------------------------------ completions

    def finish(self, u: int, failed: bool = False) -> tuple[str, str] | None:
        """The backend finished use `u`; returns the (error, rule) its event reports, or None."""
        use = self.uses.pop(u)
        failed = failed or use.fails
        aborted = use.generation != self.generation
        alloc = self.allocs[use.allocs[0]]
        if use.kind == "copy_in" and not failed:
            assert use.host is not None
            alloc.data[use.device_offset : use.device_offset + len(use.host)] = self.read_host(use.host)
            if not aborted and use.release:
                self.unreleased -= set(use.host) - self._pending("copy_in")
        if use.kind == "copy_out":
            assert use.host is not None
            if not failed:  # an aborted copy still moved its bytes; they are just not valid
                data = alloc.data[use.device_offset : use.device_offset + len(use.host)]
                for b, v in zip(use.host, data, strict=True):
                    self.memory[b % self.capacity] = v
            if failed or aborted:
                self.failed |= set(use.host)
        for a in use.allocs:
            self.allocs[a].uses.discard(u)
            if self._release_if_done(a):
                self.unreported += 1
        if aborted:
            return ("StaleHandleError", "GEN-1")
        if failed:
            error = {"copy_in": "DeviceCopyError", "copy_out": "OutputCopyError"}.get(use.kind, "ComputeError")
            return (error, "COMPUTE-F" if use.kind == "compute" else "COPY-F")
        return None

    # ------------------------------------------------------------ mechanics

    def _begin(self, use: Use, sync: bool) -> int:
        u = self.next_use
        self.next_use += 1
        self.uses[u] = use
        for a in use.allocs:
            self.allocs[a].uses.add(u)
            self.allocs[a].used = True
        if sync:
            self.finish(u)
        return u

    def _tensor(self, u: int) -> int:
        t = self.next_tensor
        self.next_tensor += 1
        self.tensors[t] = u
        self.uses[u].tensors.add(t)
        return t

    def _release_if_done(self, a: int) -> bool:
        """Release a dead allocation nothing uses (once); whether that backend free failed."""
        alloc = self.allocs[a]
        dead = alloc.freed_by_user or alloc.generation != self.generation
        if dead and not alloc.uses and not alloc.released:
            alloc.released = True
            self.frees.append(a)
            if self.free_faults:
                self.free_faults -= 1
                self.free_failures += 1
                alloc.free_failed = True
                return True
        return False

    def held(self) -> int:
        """Buffers the backend still holds: live allocations, and dead ones whose free failed."""
        return sum(not a.released or a.free_failed for a in self.allocs.values())

    def quiescent_leaks(self) -> list[int]:
        """With nothing in flight: allocations the worker freed (or a restart ended) not yet released."""
        assert not self.uses
        return [
            a
            for a, alloc in self.allocs.items()
            if (alloc.freed_by_user or alloc.generation != self.generation) and not alloc.released
        ]
