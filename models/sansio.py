"""The sans-I/O checker: the lifecycle core and the host ring explored with states as values.

The lockstep checker (`checker`) runs the whole Bridge over the fake backend
beside the reference model, and rebuilds each state by replaying the path to
it. This one explores the two pieces of real code that make every lifetime
decision, with each state a value:

- `LifecycleCore`: when device memory may be released, which uses are held
  back behind which (ORDER-1), what a use's end reports;
- `HostRing`: when host bytes are released, readable, writable.

A state is what the core's `snapshot()` holds (its records and uses in
flight) and the ring's `state()`, put in a canonical form (`State`:
allocations sorted by what they are, uses by position, ring offsets moved
back by whole laps); `restore` takes each back. So a state is restored, one
action applied, and the result taken as a value: no replay, and symmetric states
(which allocation is which) are one. Without a depth the search is
exhaustive: every state the bound allows is reached.

What drives the core and the ring is `Step`, the calls the Bridge makes on
them for each API call, over a model device that runs submitted uses and ends
them in any order, successfully or not. The orchestration is the real one:
`Step` is the core's `Runner` over the model device, as the Bridge's engine is
over a backend: what a new use does (`plan`), when a use ends (`finish`,
exactly once), which held uses launch then and in what order, what a poll and
a completion reported while the lock is busy end, all run the same code, and
Step checks each effect the core returns. The device's
completions come every way they reach the Bridge: reported with the lock free,
reported while it is busy (applied by the next call), found by a poll on a
device that runs what the poll launches at once.

`Step` keeps its own record of what it issued (uses in flight, which are
submitted, which device buffers live, what the device finished) and checks
the core's and the ring's answers against it and against the spec's data,
never against their own view of themselves: the invariants (`INV-*`),
ORDER-1 (no two conflicting uses on the device at once, none held without
cause, none launched before what it follows ended), each use ended once
(`once`), no finished use left in flight (`completion`), the failures'
rules, the host-byte rules and every refusal.

Out of its scope: the Bridge's own code around the core (argument checks,
the backend protocol, the events, threads), tinygrad views and byte values.
The lockstep checker and the stateful tests cover those (`tests/model/test_sansio.py`
shows which seeded bugs each finds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

from devbridge.errors import BridgeError, OutputNotReadyError, RingFullError
from devbridge.models.checker import EXTENT, Bound, Figures
from devbridge.models.coverage import Coverage
from devbridge.models.explorer import Expansion, explore
from devbridge.ring.host import HostRange, HostRing, RingState, made_range
from devbridge.spec import Rejection, guard_values, level
from devbridge.spec import load as load_spec
from devbridge.statemachine import default_table
from devbridge.statemachine.core import (
    USE_EVENTS,
    Allocation,
    CoreState,
    InFlight,
    InvariantViolation,
    LifecycleCore,
    Settle,
)
from devbridge.statemachine.runner import Runner
from devbridge.statemachine.status import PENDING, Status

#: A state, canonical: (generation, faults injected so far, the ring's bookkeeping moved back
#: by whole laps, the allocations sorted by what they are). Each allocation is (generations
#: since its own, state, copies, computes, ever used, freed by the worker, extent, its uses in
#: issue order), each use (kind, device span, host bytes, generation, host kept, the earlier
#: uses of the allocation it follows, by position; None: none). Allocation n (from 1) of the
#: order and the uses numbered in it are the ids `Step` restores them with (`unpack`).
State = tuple[int, int, RingState, tuple[tuple[Any, ...], ...]]
Action = tuple[Any, ...]
COPIES = ("copy_in", "copy_out")
#: How a copy is submitted, without a fault and with one (the bound's faults allowing). A copy
#: that follows no use in flight goes to the device at once: synchronous, asynchronous; lost
#: (its first query fails), refused by the backend at submission. One that follows earlier
#: conflicting uses (ORDER-1): synchronous (the Bridge waits for them, then copies),
#: asynchronous (held back until they end); refused after the wait. (A held copy is not
#: submitted at its call, so a fault there cannot hit it: a lost or refused asynchronous one
#: would make the asynchronous one's calls, one for one; a copy that follows nothing, refused
#: after no wait, the asynchronous refusal's.) An asynchronous copy the backend finishes at
#: submission takes the synchronous one's path, or is held: no mode of its own here (the
#: lockstep checker has it).
SUBMITTED_MODES = ("sync", "async"), ("lost", "async_fails")
HELD_MODES = ("sync", "async"), ("sync_fails",)
DEAD = 0  # an allocation id no record ever has: a freed (or stale) handle's key

SPEC = load_spec()
#: The spec's data, read here and not through the core: what the checks compare against.
FAILURE_RULES = {f.when: f.rule for f in SPEC.failures.values()}
PENDING_STATES = frozenset(  # where free or restart leave a busy allocation
    t.dest for t in SPEC.transitions if t.event in ("free", "restart") and not SPEC.states[t.dest].terminal
)
CHECKS = frozenset(
    {
        "INV-NO-FREE-IN-USE", "INV-FREE-ONCE", "INV-COUNTS", "INV-CURSOR", "INV-OUTPUT", "INV-GENERATION",
        "INV-QUIESCENT", "ORDER-1", "H2D-2", "H2D-3", "COPY-F", "RING-2", "failure", "tracked", "states", "raised",
        "unchanged", "once", "completion",
    }
)  # fmt: skip


class Broken(AssertionError):
    """The core or the ring broke a check (`check`: an invariant, ORDER-1, a host-byte rule,
    `failure` (the rule a use's end reports), `tracked` (the uses in flight), `once` (a use
    ended or queried after its end), `completion` (a use the device finished left in flight),
    `raised`, `unchanged`, or `refused:RULE`)."""

    def __init__(self, check: str, detail: str) -> None:
        assert check in CHECKS or check.startswith("refused:"), check
        super().__init__(f"[{check}] {detail}")
        self.check = check


def kill_of(error: BaseException) -> str:
    """What caught a bug: a check's name, a core invariant, or (never for a seeded bug) a type."""
    if isinstance(error, Broken):
        return error.check
    if isinstance(error, InvariantViolation):
        return error.invariant
    return type(error).__name__


def _conflicting(earlier: str, later: str) -> bool:
    """Whether overlapping uses of these kinds must not run at once: both touch device bytes and
    one of them writes (from the spec's accesses; the device orders `device_ordered` pairs)."""
    first, then = SPEC.accesses[earlier], SPEC.accesses[later]
    touch = all(a.does("reads") or a.does("writes") for a in (first, then))
    return touch and (first.does("writes") or then.does("writes")) and (earlier, later) not in SPEC.device_ordered


KINDS_CONFLICT = {(a, b): _conflicting(a, b) for a in USE_EVENTS for b in USE_EVENTS}


def conflicting(earlier: str, a: tuple[int, int] | None, later: str, b: tuple[int, int] | None) -> bool:
    """Whether uses of these kinds over device spans `a` and `b` of one allocation must not run
    at once (ORDER-1): kinds that conflict, touching a common byte (None: the whole allocation)."""
    return KINDS_CONFLICT[(earlier, later)] and (a is None or b is None or (a[0] < b[1] and b[0] < a[1]))


def conflict(earlier: Use, later: Use) -> bool:
    """`conflicting` for two uses `Step` issued."""
    return conflicting(earlier.kind, earlier.span, later.kind, later.span)


class Use(NamedTuple):
    """What `Step` issued: a use's kind, allocation, device span (None: all), host bytes."""

    kind: str
    alloc: int
    span: tuple[int, int] | None
    host: tuple[int, int] | None  # (stream start, size)
    generation: int


class Step(Runner):
    """One action from one state: the Bridge's calls on the core and the ring, a device that
    runs what is submitted, and the checks of every answer against its own record. It runs the
    core's effects as the Bridge does: it is the core's `Runner` over the model device."""

    def __init__(self, ring_capacity: int) -> None:
        super().__init__(LifecycleCore())
        self.ring = HostRing(ring_capacity)
        # Step's record; each set a value (a change makes a new one), so that a state's are
        # shared by every action from it, not copied for each
        self.uses: dict[int, Use] = {}
        self.submitted: frozenset[int] = frozenset()
        self.live: frozenset[int] = frozenset()  # allocations whose device buffer is not freed
        self.used: frozenset[int] = frozenset()  # allocations some use began on
        self.freed: frozenset[int] = frozenset()  # allocations the worker freed
        self.faults = 0
        # the model device, within one action: what it finished (use id -> its status), and
        # whether it runs a launched use at once (an idle device, found done by a poll)
        self.done: dict[int, Status] = {}
        self.instant = False
        self.tokens: dict[int, object] = {}  # use id -> the token the device gave it (an object of its own)
        self._state: State | None = None  # the state last loaded, and what Step knows of it
        self.rows: CoreState = self.core.snapshot()  # the loaded state's core, as `snapshot` gives it
        self._known: tuple[dict[int, Use], frozenset[int], frozenset[int], frozenset[int], frozenset[int]] = (
            {}, frozenset(), frozenset(), frozenset(), frozenset()
        )  # fmt: skip

    # ------------------------------------------------------------ states as values

    def load(self, state: State) -> None:
        """Become `state`: the core and the ring restored, and what Step knows of it."""
        if state is not self._state:  # derived once per state, restored for each action from it
            self._state = state
            self.rows, used, freed = unpack(state)
            rows = self.rows[4]
            self._known = (
                {u[0]: Use(u[1], u[2][0], u[6], u[3], u[4]) for u in rows},
                frozenset(u[0] for u in rows if u[1] != "view" and u[7] is None),
                frozenset(r[0] for r in self.rows[3]),
                used,
                freed,
            )
        core = self.core
        core.restore(self.rows)
        self.ring.restore(state[2])
        self.faults = state[1]
        uses, self.submitted, self.live, self.used, self.freed = self._known
        self.uses = dict(uses)
        self.tokens = {}
        for u in self.submitted:  # a token is no part of the value: each submitted use gets one
            use = core.use(u)
            assert use is not None
            core.submitted(use, self.token(u))
        self.done, self.instant = {}, False

    def value(self, cursor: int | None = None) -> State:
        """The state, canonical (`State`): allocations in the order of what they are, their
        uses by position, ring offsets moved back by whole laps so that the cursor is in the
        first; which allocation or use had which id is forgotten. Read from the core's records
        and uses in flight as they are (what `snapshot` reads), without a snapshot between.

        With `cursor` (the ring's before the action), it first checks that what the core and
        the ring record is what was issued: then the value determines everything `check` reads."""
        core = self.core
        generation = core.generation
        records = list(core.allocations())
        uses = list(core.inflight())  # in issue order (the core keeps them so)
        ring = self.ring.state()
        if cursor is not None:
            self.track(records, uses, cursor)
        head, starts = ring[0], ring[1]
        capacity = self.ring.capacity
        base = (starts[0] if starts else head) // capacity * capacity
        by_alloc: dict[int, list[InFlight]] = {r.id: [] for r in records}
        for u in uses:
            by_alloc[u.allocations[0]].append(u)
        used, freed = self.used, self.freed
        allocations = []
        for r in records:
            mine = by_alloc[r.id]
            sig = tuple([
                (u.kind, u.span, u.host if u.host is None or not base else (u.host[0] - base, u.host[1]),
                 u.generation, u.keep_host,
                 tuple([i for i, w in enumerate(mine) if w.id in u.after]) if u.after else None)  # by position
                for u in mine
            ])  # fmt: skip
            a = r.id
            allocations.append((generation - r.generation, r.state, r.copies, r.computes, a in used, a in freed,
                                r.extent, sig))  # fmt: skip
        allocations.sort()
        if base:
            ring = (
                head - base,
                tuple(s - base for s in starts),
                tuple(e - base for e in ring[2]),
                *(tuple((s - base, e - base) for s, e in spans) for spans in ring[3:]),
            )  # type: ignore[assignment]
        return generation, self.faults, ring, tuple(allocations)

    def track(self, records: list[Allocation], uses: list[InFlight], cursor: int) -> None:
        """The core's records and uses are what was issued, its held-back uses those not on the
        device, and the ring's cursor did not go back."""
        mine, submitted = self.uses, self.submitted
        if len(uses) != len(mine):
            raise Broken("tracked", f"the core has {len(uses)} uses in flight, issued {sorted(mine.items())}")
        for u in uses:
            if mine.get(u.id) != (u.kind, u.allocations[0] if len(u.allocations) == 1 else u.allocations, u.span,
                                  u.host, u.generation):  # fmt: skip
                raise Broken("tracked", f"the core has {u}, issued {sorted(mine.items())}")
            if bool(u.after) == (u.id in submitted or u.kind == "view"):
                raise Broken("ORDER-1", f"use #{u.id} held back: {bool(u.after)}; on the device: {u.id in submitted}")
        live = self.live
        if live != {r.id for r in records}:
            raise Broken("INV-FREE-ONCE", f"records {[r.id for r in records]} != device {sorted(live)}")
        if (now := self.ring.cursor) < cursor:
            raise Broken("INV-CURSOR", f"cursor went back from {cursor} to {now}")

    # ------------------------------------------------------------ the Bridge's side

    def host(self, start: int, nbytes: int) -> HostRange:
        return made_range(self.ring, start, nbytes)

    def key(self, alloc: int) -> tuple[int, int]:
        record = self.core.allocation(alloc)
        assert record is not None, f"#{alloc} has no record"
        return alloc, record.generation

    def alloc(self) -> None:
        record = self.core.add(EXTENT, None, None)
        record.memory = record.id
        self.live |= {record.id}
        self.used -= {record.id}
        self.freed -= {record.id}

    def free(self, alloc: int) -> None:
        record = self.core.free(*self.key(alloc))
        self.freed |= {alloc}
        if record is not None:
            self.release_device(record.memory)

    def copy(self, kind: str, alloc: int, span: tuple[int, int], mode: str) -> None:
        """host_to_device / device_to_host of fresh ring bytes (`enabled` offers only copies
        that fit: a reservation that fits must succeed, RING-2)."""
        offset, nbytes = span
        try:
            r = self.ring.reserve(nbytes)
        except RingFullError as e:
            raise Broken("RING-2", f"a reservation of {nbytes} B that fits was refused: {e}") from e
        key = self.key(alloc)
        self.core.check([key], "copy_begin")
        self.ring.check_copy(r, kind == "copy_in")
        dspan = (offset, offset + nbytes)
        sync = mode in ("sync", "sync_fails")
        while (plan := self.core.plan(kind, [key], dspan, sync)).blocker is not None:
            self.wait(plan.blocker)  # the Bridge waits for the oldest use of their chain, then plans again
        before = plan.before
        if not before and mode in ("sync_fails", "async_fails"):  # the backend refuses it: COPY-F
            self.faults += 1
            if kind == "copy_out":
                self.ring.begin_write(r)
                self.ring.end_write(r, valid=False)
            self.expect_host(kind, r, ok=False)
            return
        if not before and mode == "sync":  # done at once: one fused step
            self.core.instant(kind, key)
            self.used |= {alloc}
            if kind == "copy_in":
                self.ring.read_done(r, True)
            else:
                self.ring.write_done(r)
            self.expect_host(kind, r, ok=True)
            return
        use = self.core.begin(kind, [key], host=(r.start, r.nbytes), span=dspan, before=before)
        (self.ring.begin_read if kind == "copy_in" else self.ring.begin_write)(r)
        self.uses[use.id] = Use(kind, alloc, dspan, (r.start, r.nbytes), self.core.generation)
        self.used |= {alloc}
        if not before:
            self.take(use.id)
            if mode == "lost":  # its first query fails: settled as failed at once
                self.faults += 1
                self.done[use.id] = failed = Status(True, "querying the backend failed")
                self.end(use, failed)

    def compute(self, alloc: int, fails: bool) -> None:
        key = self.key(alloc)
        self.core.check([key], "compute_begin")
        while (plan := self.core.plan("compute", [key])).blocker is not None:
            self.wait(plan.blocker)
        if fails:  # the backend refuses it: COMPUTE-F, nothing recorded
            self.faults += 1
            return
        use = self.core.begin("compute", [key], before=[])
        self.uses[use.id] = Use("compute", alloc, None, None, self.core.generation)
        self.used |= {alloc}
        self.take(use.id)

    def wrap(self, alloc: int) -> None:
        key = self.key(alloc)
        self.core.check([key], "compute_begin")
        use = self.core.begin("view", [key])
        self.uses[use.id] = Use("view", alloc, None, None, self.core.generation)
        self.used |= {alloc}

    def restart(self) -> None:
        for record in self.core.restart():
            self.release_device(record.memory)

    def release(self, start: int, end: int) -> bool:
        """The worker releases unreleased host bytes: refused while a pending copy uses them."""
        r = self.host(start, end - start)
        reads = [u for u in self.uses.values() if u.kind == "copy_in" and _hits(u.host, start, end)]
        writes = [u for u in self.uses.values() if u.kind == "copy_out" and _hits(u.host, start, end)]
        rule = "H2D-3" if reads else "RING-3" if writes else None
        if rule is None:
            try:
                self.ring.release(r)
            except BridgeError as e:
                raise Broken("raised", f"releasing {r}, which no pending copy uses: {e}") from e
            return True
        self.refused(rule, lambda: self.ring.release(r))
        return False

    def refuse(self, key: tuple[int, int], event: str, rule: str | None) -> None:
        """A spec event that must change nothing, sent as the Bridge sends it (a begin asked
        with `check`, a free, a stray end or restart fired): refused as `rule` (None: accepted)."""
        if event in ("copy_begin", "compute_begin"):
            self.refused(rule, lambda: self.core.check([key], event))
        elif event == "free":
            self.refused(rule, lambda: self.core.free(*key))
        else:
            self.refused(rule, lambda: self.core.fire(*key, event))

    def refused(self, rule: str | None, call: Callable[[], object]) -> None:
        """`call` raises `rule`'s error (None: none) and changes nothing: the core and the ring
        are still the state loaded (refusals are actions of their own, taken from it)."""
        assert self._state is not None
        before = (self.rows, self._state[2])
        try:
            call()
        except BridgeError as e:
            if e.rule != rule:
                raise Broken(f"refused:{rule}" if rule else "raised", f"{e.rule} raised: {e}") from e
        else:
            if rule is not None:
                raise Broken(f"refused:{rule}", "the call was not refused")
        if (self.core.snapshot(), self.ring.state()) != before:
            raise Broken("unchanged", f"a call that must change nothing ({rule or 'accepted'}) changed the state")

    # ------------------------------------------------------------ the device

    def take(self, use_id: int) -> None:
        """The device takes a use and gives it a token."""
        use = self.uses[use_id]
        record = self.core.allocation(use.alloc)
        if record is None or not record.generation == use.generation == self.core.generation:
            raise Broken("INV-GENERATION", f"use #{use_id} submitted on memory of an older generation")
        self.submitted |= {use_id}
        inflight = self.core.use(use_id)
        assert inflight is not None
        self.core.submitted(inflight, self.token(use_id))

    def token(self, use_id: int) -> object:
        token = self.tokens[use_id] = [use_id]  # compared by identity, as a backend's are
        return token

    def wait(self, blocker: InFlight) -> None:
        """A blocking call waits for the oldest use of the chain it must follow: on the device
        (it cannot be held, or the wait would never end), and it ends well; then the Bridge's
        `_refresh` of it (the core settles it)."""
        if blocker.id not in self.submitted:
            raise Broken("ORDER-1", f"waiting for use #{blocker.id}, which is held: forever")
        self.done[blocker.id] = Status(True)
        self.refresh(blocker)
        self.settled()

    def settled(self) -> None:
        """Nothing the device finished is left in flight (the core settled each)."""
        if left := [u for u in self.done if u in self.uses]:
            raise Broken("completion", f"uses {left} finished on the device are still in flight")
        self.done.clear()

    # ------------------------------------------------------------ the device, for the core's runner

    def query(self, use: InFlight) -> Status:
        if use.id not in self.uses:
            raise Broken("once", f"use #{use.id} queried after it ended")
        if use.id not in self.submitted:
            raise Broken("ORDER-1", f"use #{use.id} queried while held back")
        return self.done.get(use.id, PENDING)

    def submit(self, use: InFlight) -> Status | None:
        """A held use the core launches: every earlier use it conflicts with has ended."""
        u = use.id
        if (mine := self.uses.get(u)) is None:
            raise Broken("once", f"use #{u} launched after it ended")
        if u in self.submitted:
            raise Broken("once", f"use #{u} launched twice")
        if early := [v for v, w in self.uses.items() if v < u and w.alloc == mine.alloc and conflict(w, mine)]:
            raise Broken("ORDER-1", f"use #{u} launched before the uses {early} it follows ended")
        self.take(u)
        if self.instant:
            self.done[u] = Status(True)
        return None

    def expected(self, u: int, mine: Use) -> str | None:
        """The rule use `u`'s end must report, by Step's record: aborted by a restart, failed on the
        device, or none."""
        if mine.generation != self.core.generation:
            return FAILURE_RULES["aborted"]
        status = self.done.get(u)
        return None if status is None or status.error is None else FAILURE_RULES[mine.kind]

    def host_done(self, use: InFlight, ok: bool) -> None:
        """The Bridge's end of a copy's host bytes, checked against the record."""
        if (mine := self.uses.get(use.id)) is None or mine.host is None:
            raise Broken("once", f"use #{use.id}'s host bytes ended after it ended")
        r = self.host(*mine.host)
        if mine.kind == "copy_in":
            self.ring.end_read(r, release=ok)
        else:
            self.ring.end_write(r, valid=ok)
        self.expect_host(mine.kind, r, ok=self.expected(use.id, mine) is None)

    def release_memory(self, record: Allocation, by: InFlight) -> None:
        self.release_device(record.memory, ending=by.id)

    def settle(self, effect: Settle) -> None:
        """The use's event, once, with the failure the spec names for how it ended."""
        if effect.broken:
            return  # the runner raises it
        u = effect.use.id
        if (mine := self.uses.pop(u, None)) is None:
            raise Broken("once", f"use #{u} ended twice")
        self.submitted -= {u}
        expected, got = self.expected(u, mine), None if effect.error is None else effect.error.rule
        if got != expected:
            raise Broken("failure", f"use #{u} reported {got}, not {expected}")

    # ------------------------------------------------------------ how completions arrive

    def complete(self, use_id: int, ok: bool, how: str) -> None:
        """The device finishes a submitted use, and the Bridge learns it: `report`ed with the
        lock free (applied at once), `busy` (reported while another call holds the lock: the
        next call's drain applies it), or `poll`ed (not reported; the device runs what the
        poll launches at once)."""
        use = self.core.use(use_id)
        assert use is not None
        self.done[use_id] = Status(True, None if ok else "the device failed it")
        token = self.tokens[use_id]
        if how == "report":
            self.reported(token)
        elif how == "busy":
            self.core.reported(token)
            self.drain()  # the next call, first thing
        else:
            self.instant = True
            try:
                self.poll()
            finally:
                self.instant = False
        self.settled()

    def release_device(self, memory: object, ending: int | None = None) -> None:
        """The Bridge frees an allocation's device buffer (its memory here is its id), as the use
        `ending` ends (its event is settled next)."""
        if memory not in self.live:
            raise Broken("INV-FREE-ONCE", f"allocation #{memory} freed on the device twice")
        if users := [u for u, use in self.uses.items() if use.alloc == memory and u != ending]:
            raise Broken("INV-NO-FREE-IN-USE", f"allocation #{memory} freed while uses {users} use it")
        self.live -= {memory}

    # ------------------------------------------------------------ checks

    def expect_host(self, kind: str, r: HostRange, ok: bool) -> None:
        """After a copy ends: a good input's bytes are released (H2D-2), a failed one's kept for a
        retry (COPY-F); a good output's bytes are readable, a failed one's never (D2H-3)."""
        if kind == "copy_in":
            if self.ring.released(r) != ok:
                raise Broken("H2D-2" if ok else "COPY-F", f"input {r} released: {not ok}")
        else:
            try:
                self.ring.view(r)
                readable = True
            except OutputNotReadyError:
                readable = False
            if readable != ok:
                raise Broken("INV-OUTPUT", f"output {r} readable: {readable}, succeeded: {ok}")

    def check(self) -> None:
        """Every invariant of a state reached for the first time."""
        uses, submitted = self.uses, self.submitted
        records = {r.id: r for r in self.core.allocations()}
        mine: dict[int, list[tuple[int, Use]]] = {a: [] for a in records}
        for u, use in uses.items():
            mine[use.alloc].append((u, use))
        for a, record in records.items():
            theirs = mine[a]
            copies = sum(use.kind in COPIES for _, use in theirs)
            if (record.copies, record.computes) != (copies, len(theirs) - copies):
                raise Broken("INV-COUNTS", f"#{a} counts {record.copies} copies, {record.computes} computes; "
                             f"{len(theirs)} uses in flight")  # fmt: skip
            if not theirs and record.state in PENDING_STATES:
                raise Broken("INV-QUIESCENT", f"#{a} {record.state} with nothing in flight")
            expected = self.expected_state(record.generation, a, copies, len(theirs) - copies)
            if record.state != expected:
                raise Broken("states", f"#{a} is {record.state}, not {expected}")
            for i, (u, use) in enumerate(theirs):  # in issue order
                held = u not in submitted and use.kind != "view"
                if held and not any(conflict(w, use) for _, w in theirs[:i]):
                    raise Broken("ORDER-1", f"use #{u} held back behind nothing it conflicts with")
                clash = [] if held or use.kind == "view" else [
                    v for v, w in theirs[:i] if v in submitted and conflict(w, use)
                ]  # fmt: skip
                if clash:
                    raise Broken("ORDER-1", f"use #{u} runs beside earlier conflicting uses {clash}")
                if use.host is not None:
                    self.check_pending_host(use)
        now = self.ring.cursor
        if (unreleased := self.ring.unreleased()) and now > unreleased[0].start:
            raise Broken("INV-CURSOR", f"cursor {now} passed {unreleased[0]}")

    def expected_state(self, generation: int, alloc: int, copies: int, computes: int) -> str:
        """The state the spec gives an allocation with this history (a second statement of it)."""
        if generation != self.core.generation:
            return "stale_pending"
        if alloc in self.freed:
            return "free_pending"
        if copies and computes:
            return "copying_computing"
        if copies or computes:
            return "copying" if copies else "computing"
        return "idle" if alloc in self.used else "allocated"

    def check_pending_host(self, use: Use) -> None:
        assert use.host is not None
        r = self.host(*use.host)
        if use.kind == "copy_in":
            if self.ring.released(r):
                raise Broken("H2D-3", f"a pending input's bytes {r} are released")
            return
        try:
            self.ring.view(r)
        except OutputNotReadyError:
            return
        raise Broken("INV-OUTPUT", f"a pending output's bytes {r} are readable")

    # ------------------------------------------------------------ actions

    def apply(self, action: Action) -> bool:
        """Take `action`; False when it changed nothing: a refusal (checked to change nothing)."""
        kind = action[0]
        if kind == "alloc":
            self.alloc()
        elif kind == "free":
            self.free(action[1])
        elif kind in COPIES:
            self.copy(kind, action[1], action[2], action[3])
        elif kind == "compute":
            self.compute(action[1], action[2])
        elif kind == "wrap":
            self.wrap(action[1])
        elif kind == "end":
            if not action[2]:
                self.faults += 1
            self.complete(action[1], action[2], action[3])
        elif kind == "drop":  # the view's tensor is collected; the next call drains it
            self.core.view_gone(action[1])
            self.drain()
            if action[1] in self.uses:
                raise Broken("completion", f"view #{action[1]} is still in flight after it was collected")
        elif kind == "restart":
            self.restart()
        elif kind == "release":
            return self.release(action[1], action[2])
        elif kind == "refuse":
            self.refuse(action[1], action[2], action[3])
            return False
        elif kind == "full":  # a copy of this size: the ring refuses its reservation (RING-2)
            self.refused("RING-2", lambda: self.ring.reserve(action[1]))
            return False
        else:
            raise ValueError(f"unknown action {action}")
        return True


def fits(ring: RingState, capacity: int, nbytes: int) -> bool:
    """Whether a reservation of `nbytes` fits in the ring's free space (RING-2; a second statement
    of it, beside `HostRing.reserve`'s): at the head, or at the next lap's start where it would
    straddle the buffer's end, with it and every unreleased byte within one lap."""
    head, starts = ring[0], ring[1]
    start = head if head % capacity + nbytes <= capacity else head + capacity - head % capacity
    return start + nbytes - (starts[0] if starts else start) <= capacity


def _follows(kind: str, span: tuple[int, int], uses: Iterable[tuple[Any, ...]]) -> bool:
    """Whether a copy of `kind` over the device `span` (offset, size) must follow one of `uses`
    (the core's rows), by the spec's hazards (ORDER-1): what the core should answer."""
    device = (span[0], span[0] + span[1])
    return any(conflicting(u[1], u[6], kind, device) for u in uses)


def _hits(host: tuple[int, int] | None, start: int, end: int) -> bool:
    return host is not None and host[0] < end and start < host[0] + host[1]


@cache
def refusals(state: str, copies: int, computes: int) -> tuple[tuple[str, str | None], ...]:
    """Every spec event that must change nothing in `state` with these counters (0, 1, more),
    and the rule that refuses it: each the spec refuses, and in a terminal state every event."""
    found = ((event, SPEC.decide(state, event, guard_values(copies, computes))) for event in SPEC.events)
    return tuple(
        (event, outcome.rule if isinstance(outcome, Rejection) else None)
        for event, outcome in found
        if isinstance(outcome, Rejection) or SPEC.states[state].terminal
    )


def dead_state(generation: int, current: int) -> str:
    return "freed" if generation == current else "stale"


def unpack(state: State) -> tuple[CoreState, frozenset[int], frozenset[int]]:
    """A canonical state's core as `LifecycleCore.snapshot` gives it (allocation n of the order
    has id n, its memory n; uses numbered in order), and which allocations were used, freed."""
    generation, _, _, allocations = state
    records: list[tuple[Any, ...]] = []
    uses: list[tuple[Any, ...]] = []
    used, freed = set(), set()
    for n, (age, state_, copies, computes, was_used, was_freed, extent, mine) in enumerate(allocations, start=1):
        records.append((n, generation - age, extent, None, n, state_, copies, computes))
        if was_used:
            used.add(n)
        if was_freed:
            freed.add(n)
        first = len(uses)
        for kind, span, host, use_generation, keep_host, after in mine:
            follows = None if after is None else tuple(first + i for i in after)
            uses.append((len(uses), kind, (n,), host, use_generation, keep_host, span, follows))
    return (generation, len(records) + 1, len(uses), tuple(records), tuple(uses)), frozenset(used), frozenset(freed)


def enabled(state: State, core: CoreState, bound: Bound) -> list[Action]:
    """Every action the bound allows from `state` (canonical; `core`: its core unpacked), in a
    fixed order. A copy that would repeat another action's calls one for one is left out: one
    the ring has no room for (one `full` action per size stands for them), and the modes a copy
    that follows earlier uses (or none) cannot take apart from another (`SUBMITTED_MODES`)."""
    generation, faults, ring, _ = state
    starts, ends = ring[1], ring[2]
    room = {n: fits(ring, bound.ring, n) for _, n in bound.spans}
    full: set[int] = set()  # sizes of copies the ring has no room for
    records, uses = core[3], core[4]
    can_fail = faults < bound.faults
    theirs: dict[int, list[tuple[Any, ...]]] = {}
    for u in uses:
        theirs.setdefault(u[2][0], []).append(u)
    actions: list[Action] = []
    if len(records) < bound.allocations:
        actions.append(("alloc",))
    for a, gen, _, _, _, state_, copies, computes in records:
        if gen == generation and state_ not in PENDING_STATES:
            actions.append(("free", a))
            if len(mine := theirs.get(a, ())) < bound.in_flight:
                for kind in COPIES:
                    for span in bound.spans:
                        if not room[span[1]]:  # every such copy makes the one refused reservation below
                            full.add(span[1])
                            continue
                        good, faulty = HELD_MODES if mine and _follows(kind, span, mine) else SUBMITTED_MODES
                        actions += [(kind, a, span, mode) for mode in (good + faulty if can_fail else good)]
                actions += [("compute", a, False)] + ([("compute", a, True)] if can_fail else [])
                actions.append(("wrap", a))
        actions += [
            ("refuse", (a, gen), event, rule) for event, rule in refusals(state_, level(copies), level(computes))
        ]
    actions += [("full", n) for n in sorted(full)]
    for g in (generation, generation - 1) if generation else (generation,):  # a freed handle, a stale one
        actions += [("refuse", (DEAD, g), event, rule) for event, rule in refusals(dead_state(g, generation), 0, 0)]
    followed = {earlier for u in uses if u[7] for earlier in u[7]}
    for uid, kind, _, _, _, _, _, after in uses:
        if kind == "view":
            actions.append(("drop", uid))
        elif not after:
            actions.append(("end", uid, True, "report"))
            actions.append(("end", uid, True, "busy"))
            if uid in followed:  # a poll differs from a report only in what its launches do
                actions.append(("end", uid, True, "poll"))
            if can_fail:
                actions.append(("end", uid, False, "report"))
    if generation < bound.restarts:
        actions.append(("restart",))
    actions += [("release", s, e) for s, e in zip(starts, ends, strict=True)]
    return actions


# ------------------------------------------------------------ search


@dataclass
class Violation:
    path: tuple[Action, ...]  # each action names the canonical ids of the state it was taken in
    error: str
    kill: str


@dataclass
class Report(Figures):
    exhaustive: bool = False  # the search ran out of new states before any depth limit
    violation: Violation | None = None

    def summary(self) -> str:
        reach = "every reachable state" if self.exhaustive else f"depth {self.depth}"
        return self.figures(
            f"sans-I/O checker (the core and the ring as values): {reach}",
            None if self.violation is None else len(self.violation.path),
        )


def expand(step: Step, batch: Iterable[tuple[int, State]], bound: Bound, known: set[State]) -> Expansion:
    """Every enabled action from each state, checked; the successors not in `known` (which it
    extends). A state's own invariants are checked once, when it is first reached: everything
    they read is in its value (`Step.track` made sure of that after the action)."""
    coverage = Coverage(default_table(), "sans-I/O checker")
    step.core.observer, step.core.edge_observer = coverage.record, coverage.record_edge
    out = Expansion(hits=coverage.hits, edges=coverage.edges)
    for index, state in batch:
        step.load(state)
        loaded = True
        cursor = step.ring.cursor  # before each action: each starts from this state, restored
        for action in enabled(state, step.rows, bound):
            out.transitions += 1
            if not loaded:
                step.load(state)
            try:
                loaded = not step.apply(action)  # a refused action changed nothing (it checks so)
                if loaded:
                    continue
                new = step.value(cursor)
                size = len(known)
                known.add(new)  # one hash of the nested tuple, not two (`in`, then `add`)
                if len(known) == size:
                    continue
                step.check()
            except Exception as e:  # any failure is a violation; the kill says which check caught it
                out.violation = (index, action, f"{type(e).__name__}: {e}", kill_of(e))
                return out
            out.found.append((new, new, index, action))
    return out


@dataclass
class _Search:
    """The states as values: a state is its own key."""

    bound: Bound
    step: Step
    batch: int = 256
    collects: bool = False  # nothing here makes a reference cycle

    def expand(self, batch: list[tuple[int, Any]], known: set[Any]) -> Expansion:
        return expand(self.step, batch, self.bound, known)


def initial(bound: Bound) -> State:
    return Step(bound.ring).value()


def check(
    bound: Bound | None = None,
    depth: int | None = None,
    jobs: int = 1,
    progress: Callable[[int, int, int], None] | None = None,
) -> Report:
    """Breadth first from the empty bridge, within `bound` (its allocations, restarts, faults,
    uses in flight, spans and ring; `depth` limits the actions per path, None: none). Stops at
    the first violation, a shortest one. Every state reached is checked; each is kept once."""
    bound = bound or Bound()
    root = initial(bound)
    out = explore(_Search(bound, Step(bound.ring)), root, root, depth=depth, jobs=jobs, progress=progress)
    report = Report(bound, jobs=jobs, states=out.states, transitions=out.transitions, depth=out.depth)
    report.seconds, report.exhaustive = out.seconds, out.exhaustive
    report.coverage.merge(out.hits, out.edges)
    report.coverage.steps, report.coverage.seconds = report.transitions, report.seconds
    if out.violation is not None:
        path, error, kill = out.violation
        report.violation = Violation(tuple(path), error, kill)
    return report


def describe(path: Iterable[Action]) -> str:
    return " -> ".join(":".join(str(x) for x in a) for a in path)
