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

Device bytes are computed by issue order, as a plain synchronous interpreter
would (ORDER-1): every input copy is journalled with the host bytes it reads
(they cannot change while it is in flight, H2D-3); an output copy reads, at
its completion, what the journal's earlier writes that did not fail leave;
a failed write never happened. A use that conflicts with an earlier one in
flight (overlapping bytes of one allocation, one of them writing; two
computes never conflict; a view is no access) is held back: not submitted to
the backend until those end. A synchronous copy and a compute first run what
they must follow, oldest first, as the fake's `wait` does. A held use of an
ended generation is aborted when it would be submitted. A fault is injected
only into a call submitted at once (`armed` says whether the last call's
was); a held use fails only by failing it at completion.

Backend frees can be made to fail (`arm_free_faults`): each allocation gets
exactly one release attempt, the next attempts consume the armed faults, and a
failed one is reported where the release happened: by `free` (immediate), by
`restart` (after every old allocation had its attempt), or, for a release a
completion or a dropped view caused, by the next `poll`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

VIEW_ALIGNMENT = 16  # the fake device's (tinygrad CPU's): a view's offset is a multiple of it
WRITES = {"copy_in": True, "copy_out": False, "compute": True}  # views touch no bytes


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
    extent: int
    writes: list[tuple[int, int, bytes]] = field(default_factory=list)  # (use, offset, bytes): issued, not failed
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
    submitted: bool = True  # False while held back behind conflicting uses (ORDER-1)
    open: bool = False  # a compute event inside its `with` block: it cannot end (ORDER-2)

    @property
    def span(self) -> range | None:
        """The device bytes a copy touches; None: every byte of its allocations."""
        return None if self.host is None else range(self.device_offset, self.device_offset + len(self.host))


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
        self.outcomes: dict[int, tuple[str, str] | None] = {}  # finished use -> the (error, rule) its event reports
        self.armed = False  # whether the last call's fault is injected (it is submitted at once)
        self.ran = False  # whether the last call first ran uses it had to follow (so it changed things)
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
        self.allocs[a] = Alloc(self.generation, extent)
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
        self, src: range, a: int, offset: int, sync: bool, fails: bool, release: bool = True, at_once: bool = False
    ) -> int | Reject | Fail:
        self.armed = self.ran = False
        while True:  # a synchronous call checks again after running what it must follow
            if rejected := self._use_rejection(a):
                return rejected
            if not self._in_one_reservation(src) or set(src) & self._pending("copy_out"):
                return Reject("RangeError", "RING-3")
            if set(src) & self.failed:
                return Reject("OutputNotReadyError", "D2H-3")
            use = Use("copy_in", [a], self.generation, src, offset, fails and not self.ran, release)
            if sync and (refused := self._refused_wait(use)):
                return refused
            if not (sync and self._run_before(use)):
                break
        if sync and use.fails:
            self.armed = True
            return Fail("DeviceCopyError", "COPY-F")  # the host bytes stay unreleased for a retry
        return self._begin(use, sync, at_once)

    def device_to_host(
        self, a: int, offset: int, dst: range, sync: bool, fails: bool, at_once: bool = False
    ) -> int | Reject | Fail:
        self.armed = self.ran = False
        while True:
            if rejected := self._use_rejection(a):
                return rejected
            if not self._in_one_reservation(dst) or set(dst) & (self._pending("copy_in") | self._pending("copy_out")):
                return Reject("RangeError", "RING-3")
            use = Use("copy_out", [a], self.generation, dst, offset, fails and not self.ran)
            if sync and (refused := self._refused_wait(use)):
                return refused
            if not (sync and self._run_before(use)):
                break
        if sync and use.fails:
            self.armed = True
            self.failed |= set(dst)
            return Fail("OutputCopyError", "COPY-F")
        self.failed -= set(dst)
        return self._begin(use, sync, at_once)

    def compute(self, allocs: list[int], fails: bool) -> int | Reject:
        self.armed = self.ran = False
        unique = list(dict.fromkeys(allocs))
        while True:
            for a in unique:
                if rejected := self._use_rejection(a):
                    return rejected
            use = Use("compute", unique, self.generation, fails=fails)
            if refused := self._refused_wait(use):
                return refused
            if not self._run_before(use):
                return self._begin(use, sync=False)

    def wrap(self, a: int, offset: int, nbytes: int, fails: bool = False) -> int | Reject | Fail:
        """A view of `nbytes` at `offset`: the id of its tensor. Checked as the bridge does: the
        allocation's lifecycle, then the extent, then the alignment (both VIEW-2); then the
        backend makes it, or (`fails`) cannot: VIEW-1, and nothing is in use."""
        if rejected := self._use_rejection(a):
            return rejected
        if offset + nbytes > self.allocs[a].extent or offset % VIEW_ALIGNMENT:
            return Reject("InvalidViewError", "VIEW-2")
        if fails:
            return Fail("InvalidViewError", "VIEW-1")
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
        failed = failed or use.fails or not use.submitted  # a held use never ran: aborted
        aborted = use.generation != self.generation
        alloc = self.allocs[use.allocs[0]]
        if use.kind == "copy_in":
            assert use.host is not None
            if failed:  # a failed write never happened
                alloc.writes = [w for w in alloc.writes if w[0] != u]
            elif not aborted and use.release:
                self.unreleased -= set(use.host) - self._pending("copy_in")
        if use.kind == "copy_out":
            assert use.host is not None
            if not failed:  # an aborted copy still moved its bytes; they are just not valid
                data = self._bytes_before(use.allocs[0], u)[use.device_offset : use.device_offset + len(use.host)]
                for b, v in zip(use.host, data, strict=True):
                    self.memory[b % self.capacity] = v
            if failed or aborted:
                self.failed |= set(use.host)
        for a in use.allocs:
            self.allocs[a].uses.discard(u)
            if self._release_if_done(a):
                self.unreported += 1
        outcome: tuple[str, str] | None = None
        if aborted:
            outcome = ("StaleHandleError", "GEN-1")
        elif failed:
            error = {"copy_in": "DeviceCopyError", "copy_out": "OutputCopyError"}.get(use.kind, "ComputeError")
            outcome = (error, "COMPUTE-F" if use.kind == "compute" else "COPY-F")
        self.outcomes[u] = outcome
        self._launch()
        return outcome

    # ------------------------------------------------------------ ordering (ORDER-1)

    def _conflict(self, earlier: Use, later: Use) -> bool:
        """Overlapping bytes of one allocation, one of the two writing; never two computes."""
        if "view" in (earlier.kind, later.kind) or earlier.kind == later.kind == "compute":
            return False
        if not (WRITES[earlier.kind] or WRITES[later.kind]) or not set(earlier.allocs) & set(later.allocs):
            return False
        first, then = earlier.span, later.span
        return first is None or then is None or bool(set(first) & set(then))

    def _blockers(self, use: Use, before: int | None = None) -> list[int]:
        """The uses in flight issued before `before` (default: all) that `use` must follow."""
        return [u for u in sorted(self.uses) if (before is None or u < before) and self._conflict(self.uses[u], use)]

    def _run_before(self, use: Use, before: int | None = None) -> bool:
        """A synchronous call (or a compute) that must follow uses in flight runs one of them: the
        oldest among those and what they follow in turn (it follows nothing, so it is submitted),
        as the fake's `wait` does. Whether it ran one; the call is then checked again (`ran`)."""
        if not (chain := self._chain(use, before)):
            return False
        oldest = min(chain)
        assert self.uses[oldest].submitted, "the oldest of a chain follows nothing"
        self.ran = True
        self.finish(oldest)
        return True

    def _chain(self, use: Use, before: int | None = None) -> set[int]:
        """The uses in flight `use` must follow, and those they follow in turn."""
        chain = set(self._blockers(use, before))
        todo = list(chain)
        while todo:
            v = todo.pop()
            for w in self._blockers(self.uses[v], before=v):
                if w not in chain:
                    chain.add(w)
                    todo.append(w)
        return chain

    def _refused_wait(self, use: Use) -> Reject | None:
        """ORDER-2: a call that would wait for an open compute event (directly or not) is refused."""
        if any(self.uses[v].open for v in self._chain(use)):
            return Reject("OrderingError", "ORDER-2")
        return None

    def _run_before_use(self, u: int) -> None:
        """event.wait() on use `u` in flight: run the oldest of its chain (itself, once submitted)."""
        use = self.uses[u]
        if use.submitted:
            self.finish(u)
        else:
            self._run_before(replace(use, fails=False), before=u)

    def _launch(self) -> None:
        """Held uses that follow nothing in flight any more are submitted, oldest first; one of
        an ended generation is aborted instead (which may free others in turn)."""
        for u in sorted(self.uses):
            use = self.uses.get(u)
            if use is None or use.submitted or self._blockers(use, before=u):
                continue
            if use.generation != self.generation:
                self.finish(u, failed=True)
            else:
                use.submitted = True

    def _bytes_before(self, a: int, t: float) -> bytearray:
        """The allocation's bytes as a synchronous run leaves them for a use issued at `t`: every
        earlier write that did not fail, in issue order."""
        alloc = self.allocs[a]
        data = bytearray(alloc.extent)
        for u, offset, chunk in alloc.writes:
            if u < t:
                data[offset : offset + len(chunk)] = chunk
        return data

    def device_bytes(self, a: int) -> bytes:
        """What the device holds now: each byte as left by the writes issued before the oldest
        write still in flight on it (they ran in issue order; that one has not)."""
        alloc = self.allocs[a]
        inflight = [(u, self.uses[u].span) for u in sorted(alloc.uses) if self.uses[u].kind == "copy_in"]
        out = bytearray(alloc.extent)
        for b in range(alloc.extent):
            t = next((u for u, span in inflight if span is not None and b in span), float("inf"))
            out[b] = self._bytes_before(a, t)[b]
        return bytes(out)

    # ------------------------------------------------------------ mechanics

    def _begin(self, use: Use, sync: bool, at_once: bool = False) -> int:
        """Issue a use (a synchronous one or a compute follows nothing in flight by now); an
        asynchronous one that must follow uses in flight is held back, and takes no fault.
        `at_once`: the backend finishes a submitted asynchronous copy that does not fail at
        submission, so it ends as a synchronous one does."""
        use.submitted = not self._blockers(use)
        use.fails = use.fails and use.submitted
        self.armed = use.fails
        u = self.next_use
        self.next_use += 1
        self.uses[u] = use
        if use.kind == "copy_in":
            assert use.host is not None
            self.allocs[use.allocs[0]].writes.append((u, use.device_offset, self.read_host(use.host)))
        for a in use.allocs:
            self.allocs[a].uses.add(u)
            self.allocs[a].used = True
        if sync or (at_once and use.submitted and not use.fails):
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
