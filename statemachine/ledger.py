"""The lifecycle's ledger: every allocation's state, generation and uses in flight.

Each allocation's state is a plain string advanced through the compiled spec
table, one raw spec event at a time (`fire`); the Bridge's calls are built from
it (`check`, `begin`, `end`, `free`, `restart`). Every use that reads or writes
device bytes is listed on the allocations it touches, so that `conflicts` finds
the earlier uses a new one must follow (ORDER-1). Not thread-safe: the Bridge
serialises calls; only `reported` and `view_gone` (the core's) append from any
thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeAlias

from devbridge.errors import BridgeError, InvalidHandleError, LifecycleError
from devbridge.spec import LEVELS, Lifecycle, level
from devbridge.statemachine.machine import Step, Table, compile_table
from devbridge.statemachine.records import (
    USE_EVENTS,
    Allocation,
    Composite,
    CoreState,
    Effects,
    InFlight,
    InvariantViolation,
    Lookups,
    Tracer,
    compose,
    packaged_lookups,
)

#: What `fire` does in one case: the table's step, the counter it moves (None: neither), by how
#: much, and whether the state it leads to admits the counts after it.
Firing: TypeAlias = "tuple[Step, str | None, int, bool]"


class Ledger:
    """Every allocation's lifecycle state, generation and uses in flight, advanced only
    through the compiled spec table (the core, LifecycleCore, decides with it)."""

    def __init__(self, lifecycle: Lifecycle | None = None) -> None:
        lookups = packaged_lookups() if lifecycle is None else Lookups.of(lifecycle, compile_table(lifecycle))
        self._spec = lookups.spec
        self._table = lookups.table
        self._errors = lookups.errors
        self._deltas = lookups.deltas
        self._hazards = lookups.hazards
        self._accesses = lookups.accesses
        self._failures = lookups.failures
        #: what a copy meets, by state, kind and levels of its counts (`Lookups.copy_steps`:
        #: made once per spec). A copy's checks and its per-call path are this one lookup.
        self.copy_steps = lookups.copy_steps
        #: (state, no copies, no computes, no uses) -> whether the spec's `where` admits it (`_admits`)
        self._admitted: dict[tuple[str, bool, bool, bool], bool] = {}
        #: (state, event, copies, computes) -> what `fire` does there (`_firing`), made with the
        #: table the first time a case comes, for the counts below the levels' cap
        self._firings: dict[tuple[str, str, int, int], Firing] = {}
        self.generation = 0
        self.records: dict[int, Allocation] = {}  # the live allocations by id
        self._inflight: dict[int, InFlight] = {}
        self._by_token: dict[int, InFlight] = {}  # id(token) -> the submitted use it belongs to
        #: PIN-1's clock: allocation id -> when its release was deferred (a free or a restart
        #: waiting for uses to end), and the ones already reported as waiting too long
        self._waiting: dict[int, float] = {}
        self._warned: set[int] = set()
        #: tokens the backend reported finished while a call held the lock, and collected views'
        #: use ids: appended on any thread (deque appends are atomic), applied by the next call
        self.unapplied: deque[object] = deque()
        self.collected: deque[int] = deque()
        self._next_allocation = 0
        self._next_use = 0
        #: Called with (state, event, step) for every decision; coverage tools set it.
        self.observer: Callable[[str, str, Step], None] | None = None
        #: Told of every state change, use and restart as it happens (a timeline: devbridge.bridge.trace).
        self.tracer: Tracer | None = None
        #: Called with (earlier kind, later kind, hazard) for every ordering edge found (ORDER-1).
        self.edge_observer: Callable[[str, str, str], None] | None = None

    # ------------------------------------------------------------ queries

    @property
    def spec(self) -> Lifecycle:
        return self._spec

    @property
    def table(self) -> Table:
        return self._table

    def state(self, alloc_id: int, generation: int) -> str:
        """The allocation's state; a dropped record is `freed` in its own generation, else `stale`."""
        self._known(alloc_id)
        record = self.records.get(alloc_id)
        if record is not None:
            return record.state
        return "freed" if generation == self.generation else "stale"

    def allocation(self, alloc_id: int) -> Allocation | None:
        return self.records.get(alloc_id)

    def allocations(self) -> Iterable[Allocation]:
        return self.records.values()

    def inflight(self) -> Iterable[InFlight]:
        return self._inflight.values()

    def use(self, use_id: int) -> InFlight | None:
        return self._inflight.get(use_id)

    def submitted_use(self, token: object) -> InFlight | None:
        """The use in flight that the backend's `token` belongs to (None: none, or it ended)."""
        use = self._by_token.get(id(token))
        return use if use is not None and use.token is token else None

    def waited(self, alloc_id: int, now: float) -> float:
        """How long the allocation's deferred release has waited (0.0: none is)."""
        since = self._waiting.get(alloc_id)
        return 0.0 if since is None else now - since

    def waits(self, now: float) -> list[float]:
        """How long each deferred release waiting now has waited."""
        return [now - since for since in self._waiting.values()]

    def overdue(self, now: float, limit: float) -> tuple[Allocation, float] | None:
        """One deferred release that has waited `limit` seconds or more and was not reported yet
        (PIN-1), now marked reported, with how long it waited; None when there is none."""
        for alloc_id, since in self._waiting.items():
            if alloc_id not in self._warned and now - since >= limit:
                self._warned.add(alloc_id)
                record = self.records[alloc_id]  # a waiting allocation is live: released, it leaves
                return record, now - since
        return None

    def dependents(self, alloc_id: int) -> list[InFlight]:
        """The uses in flight that the allocation's memory must outlive."""
        return [u for u in self._inflight.values() if alloc_id in u.allocations]

    def conflicts(
        self, kind: str, handles: Iterable[tuple[int, int]], span: tuple[int, int] | None = None
    ) -> list[InFlight]:
        """The uses in flight that a new use of `kind` touching `span` (None: all) of each
        allocation must follow (ORDER-1), oldest first. Changes nothing."""
        found: dict[int, InFlight] | None = None
        for alloc_id, _ in handles:
            record = self.records.get(alloc_id)
            if record is None or not record.accesses:  # the hot path: nothing in flight touches it
                continue
            for use in record.accesses:
                if (hazard := self._hazards[(use.kind, kind)]) and _overlap(use.span, span):
                    found = found if found is not None else {}
                    found[use.id] = use
                    if self.edge_observer is not None:
                        self.edge_observer(use.kind, kind, hazard)
        return [found[k] for k in sorted(found)] if found else []

    # ------------------------------------------------------------ decisions

    def check(self, handles: Iterable[tuple[int, int]], event: str) -> None:
        """Raise the rule's error if `event` is rejected for any handle. Changes nothing."""
        for alloc_id, generation in handles:
            record = self.records.get(alloc_id)
            copies, computes = (record.copies, record.computes) if record else (0, 0)
            state = self.state(alloc_id, generation)
            step = self._table.lookup(state, event, copies, computes)
            if self.observer is not None:
                self.observer(state, event, step)
            if step.rule is not None:
                raise self.refusal(step.rule, alloc_id, generation, state, event)

    def refusal(self, rule: str, alloc_id: int, generation: int, state: str, event: str) -> BridgeError:
        """The error of `rule`, refusing `event` on an allocation in `state`."""
        return self._errors[rule](
            rule, f"{event} rejected: allocation #{alloc_id} (generation {generation}) is {state}"
        )

    def dead(self, alloc_id: int, generation: int, event: str) -> BridgeError:
        """The refusal of `event` on an allocation whose record is gone (freed or stale), read
        from the table: what a caller raises where its check should have refused already."""
        state = self.state(alloc_id, generation)
        rule = self._table.lookup(state, event, 0, 0).rule
        assert rule is not None, f"the spec refuses {event} in {state}"  # validated: terminal states refuse uses
        return self.refusal(rule, alloc_id, generation, state, event)

    def failure(self, when: str, detail: str, **fields: Any) -> BridgeError:
        """The error a use that did not succeed reports (`when`: its kind, "aborted" or
        "host_bytes"), with the rule the spec's `failures` name (`fields`: the error's own)."""
        rule, error = self._failures[when]
        return error(rule, detail, **fields)

    def add(self, extent: int, spec: Any, memory: object) -> Allocation:
        record = Allocation(self._next_allocation, self.generation, extent, spec, memory, self._spec.initial)
        self.records[record.id] = record
        self._next_allocation += 1
        if self.tracer is not None:
            self.tracer.state(record, "alloc", record.state)
        return record

    def begin(
        self,
        kind: str,
        handles: Iterable[tuple[int, int]],
        host: Any = None,
        keep_host: bool = False,
        span: tuple[int, int] | None = None,
        before: list[InFlight] | None = None,
    ) -> InFlight:
        """Record a use of each distinct handle, all or nothing. It follows every earlier use in
        flight it conflicts with (ORDER-1; `before`, if the caller already asked `conflicts`):
        while its `after` is not empty, the Bridge must not submit it."""
        unique = tuple(dict.fromkeys(handles))
        event = USE_EVENTS[kind][0]
        if len(unique) > 1:  # all or nothing; one handle's fire() checks before it changes anything
            self.check(unique, event)
        if before is None:
            before = self.conflicts(kind, unique, span) if kind in self._accesses else []
        for alloc_id, generation in unique:
            self.fire(alloc_id, generation, event)
        use = InFlight(self._next_use, kind, tuple(a for a, _ in unique), host, self.generation, keep_host, span)
        if before:
            use.after = {earlier.id for earlier in before}
            for earlier in before:
                if earlier.followers is None:
                    earlier.followers = []
                earlier.followers.append(use)
        if kind in self._accesses:
            for alloc_id in use.allocations:
                # a dead record here means a check was bypassed (a bug): no bytes to order, no crash
                if (record := self.records.get(alloc_id)) is None:
                    continue
                if record.accesses is None:
                    record.accesses = []
                record.accesses.append(use)
        self._inflight[use.id] = use
        self._next_use += 1
        if self.tracer is not None:
            self.tracer.began(use)
        return use

    def submitted(self, use: InFlight, token: object) -> None:
        """The backend took `use` and gave `token` for it."""
        use.token = token
        self._by_token[id(token)] = use
        if self.tracer is not None:
            self.tracer.submitted(use)

    def copy_step(self, record: Allocation, kind: str) -> Composite:
        """The composite step a copy of `kind` on the live `record` takes if it begins and ends at
        once, from its state and counts now (made with the table); the rule's error when the
        table refuses the copy there."""
        state, copies, computes = record.state, record.copies, record.computes
        step = self.copy_steps.get((state, kind, copies, computes))  # (counts below the cap are their levels)
        if step is None:  # counts above the cap, or none made: the spec breaks its counts there
            copies, computes = level(copies), level(computes)
            step = self.copy_steps.get((state, kind, copies, computes))
            if step is None:  # (INV-COUNTS, raised now)
                return compose(self._spec, self._table, self._errors, self._deltas, state, kind, copies, computes)
        if type(step) is str:  # the table's refusal: `check` finds it, tells an observer, raises it
            self.check([(record.id, record.generation)], USE_EVENTS[kind][0])
        assert isinstance(step, Composite), step  # (a refusal never gets here)
        return step

    def instant(self, kind: str, key: tuple[int, int]) -> int:
        """A use the backend finished before it was recorded (a synchronous copy that follows
        nothing): its begin and its end as one composite step (`copy_step`, then `take`). Its use
        id. No effects: nothing is released."""
        record = self.records.get(key[0])
        if record is None:  # dead: the caller's check let it through by mistake
            raise self.dead(key[0], key[1], USE_EVENTS[kind][0])
        return self.take(record, self.copy_step(record, kind))

    def _admits(self, state: str, copies: int, computes: int) -> bool:
        """The spec's `admits` (its `where` tells zero from not, of copies, computes and their
        sum), asked once per case."""
        case = (state, copies == 0, computes == 0, copies + computes == 0)
        if (admitted := self._admitted.get(case)) is None:
            admitted = self._admitted[case] = self._spec.states[state].admits(copies, computes)
        return admitted

    def take(self, record: Allocation, step: Composite) -> int:
        """Take a copy's composite step (`copy_step`, or `copy_steps` looked up), once the backend
        finished the copy: both its spec steps, told to an observer and a tracer as two. Its use
        id."""
        if self.observer is not None:  # coverage tools see both spec steps
            self.observer(record.state, step.begin, step.first)
            self.observer(step.middle, step.end, step.then)
        record.state = step.dest
        if self.tracer is not None:  # a timeline draws both
            self.tracer.state(record, step.begin, step.middle)
            self.tracer.state(record, step.end, step.dest)
        self._next_use += 1
        return self._next_use - 1

    def end(self, use_id: int, ok: bool) -> Effects:
        """The backend is done with a use (successfully or not)."""
        use = self._inflight.pop(use_id, None)
        if use is None:
            raise LifecycleError("EVENT-1", f"use #{use_id} is not in flight")
        if use.token is not None:
            del self._by_token[id(use.token)]
        if self.tracer is not None:
            self.tracer.ended(use, ok)
        event = USE_EVENTS[use.kind][1]
        if use.kind in self._accesses:
            for alloc_id in use.allocations:
                if (record := self.records.get(alloc_id)) is not None and record.accesses:
                    record.accesses.remove(use)
        ready: list[InFlight] = []
        for follower in use.followers or ():  # in issue order
            assert follower.after is not None
            follower.after.discard(use.id)
            if not follower.after and follower.id in self._inflight:
                ready.append(follower)
        release = tuple(r for a in use.allocations if (r := self.fire(a, use.generation, event)) is not None)
        aborted = use.generation != self.generation
        rule = self._failures["aborted" if aborted else use.kind][0] if aborted or not ok else None
        host_ok = ok and not aborted and not use.keep_host
        return Effects(release, use, host_ok, rule, tuple(ready) if ready else (), aborted)

    def free(self, alloc_id: int, generation: int, now: float = 0.0) -> Allocation | None:
        """free_device: the record to release now, or None when the free is deferred (its wait
        counted from `now`, PIN-1). (One step: `fire` refuses as `check` would, before it
        changes anything.)"""
        record = self.fire(alloc_id, generation, "free")
        if record is None:
            self._waiting[alloc_id] = now
        return record

    def restart(self, now: float = 0.0) -> list[Allocation]:
        """Begin a new generation; returns the old allocations to release now. The others wait
        for their uses to end, counted from `now` (PIN-1)."""
        old = list(self.records.values())
        self.generation += 1
        if self.tracer is not None:
            self.tracer.restarted(self.generation)
        release = [r for r in old if self.fire(r.id, r.generation, "restart") is not None]
        for record in self.records.values():  # all of an older generation: none is new yet
            self._waiting.setdefault(record.id, now)
        return release

    # ------------------------------------------------------------ the state as a value

    def snapshot(self) -> CoreState:
        """Every record and use in flight as one hashable value (`restore` takes it back): a
        model checker keeps states as values instead of replaying paths to them. The records'
        spec and memory must be hashable for the value to be; the issued handles are left out."""
        return (
            self.generation,
            self._next_allocation,
            self._next_use,
            tuple(
                (r.id, r.generation, r.extent, r.spec, r.memory, r.state, r.copies, r.computes)
                for r in self.records.values()
            ),
            tuple(
                (u.id, u.kind, u.allocations, u.host, u.generation, u.keep_host, u.span,
                 tuple(sorted(u.after)) if u.after else None)  # an empty `after` acts as none
                for u in self._inflight.values()
            ),
        )  # fmt: skip

    def restore(self, state: CoreState) -> None:
        """Become the core `state` was taken from (the per-use links are rebuilt from it; its uses
        in issue order, as `snapshot` gives them)."""
        self.generation, self._next_allocation, self._next_use, records, uses = state
        self._by_token, self._waiting = {}, {}  # neither is part of the value: no token, no clock
        self.unapplied, self.collected = deque(), deque()  # empty between calls
        self.records = {r[0]: Allocation(r[0], r[1], r[2], r[3], r[4], r[5], None, r[6], r[7]) for r in records}
        self._inflight = inflight = {}
        for uid, kind, allocations, host, generation, keep_host, span, after in uses:  # in issue order
            use = InFlight(uid, kind, allocations, host, generation, keep_host, span, set(after) if after else None)
            inflight[uid] = use
            for earlier in after or ():  # followers in issue order, as `begin` appends them
                before = inflight[earlier]
                if before.followers is None:
                    before.followers = []
                before.followers.append(use)
            if kind in self._accesses:
                for alloc_id in allocations:
                    if (record := self.records.get(alloc_id)) is not None:
                        if record.accesses is None:
                            record.accesses = []
                        record.accesses.append(use)

    # ------------------------------------------------------------ mechanics

    def _known(self, alloc_id: int) -> None:
        if not 0 <= alloc_id < self._next_allocation:
            raise InvalidHandleError("HANDLE-1", f"allocation #{alloc_id} was not made by this bridge")

    def fire(self, alloc_id: int, generation: int, event: str) -> Allocation | None:
        """Advance one allocation by one raw spec event; returns it when its memory must be
        released now. The Bridge's calls are built from this; the model checker and the
        stateful tests also drive it directly."""
        record = self.records.get(alloc_id)
        if record is None:  # freed or stale: no counters, no memory
            self.check([(alloc_id, generation)], event)
            return None
        state, copies, computes = record.state, record.copies, record.computes
        step, counter, delta, admitted = self._firings.get((state, event, copies, computes)) or self._firing(
            state, event, copies, computes
        )
        if self.observer is not None:
            self.observer(state, event, step)
        if step.rule is not None:
            raise self._errors[step.rule](step.rule, f"{event} rejected: allocation #{alloc_id} is {state}")
        if counter == "copies":
            record.copies = copies = copies + delta
        elif counter == "computes":
            record.computes = computes = computes + delta
        assert step.dest is not None
        record.state = step.dest
        if self.tracer is not None:
            self.tracer.state(record, event, record.state)
        if not admitted:
            raise InvariantViolation(
                "INV-COUNTS",
                f"allocation #{alloc_id} is {step.dest} after {event} with {copies} copies "
                f"and {computes} computes in flight",
            )
        if step.dest in self._table.terminal:
            del self.records[alloc_id]
            self._waiting.pop(alloc_id, None)
        return record if step.release else None

    def _firing(self, state: str, event: str, copies: int, computes: int) -> Firing:
        """What `fire` does for `event` in `state` with these counts: the table's step, the
        counter it moves and by how much, and whether the state it leads to admits the counts
        after it (a rejection moves nothing); kept for the next time below the levels' cap."""
        step = self._table.lookup(state, event, copies, computes)
        counter, delta = self._deltas[event]
        copies_after = copies + delta if counter == "copies" else copies
        computes_after = computes + delta if counter == "computes" else computes
        admitted = step.dest is None or self._admits(step.dest, copies_after, computes_after)
        if copies < LEVELS and computes < LEVELS:
            self._firings[(state, event, copies, computes)] = (step, counter, delta, admitted)
        return step, counter, delta, admitted


def _overlap(a: tuple[int, int] | None, b: tuple[int, int] | None) -> bool:
    """Whether two device spans share a byte (None: the whole allocation)."""
    return a is None or b is None or (a[0] < b[1] and b[0] < a[1])
