"""The sans-I/O lifecycle core: what to do with each use, and what happens as uses end.

The core holds every lifecycle decision and performs no device work: the
Bridge asks it whether a call is allowed (`check`), tells it what happened
(`begin`, `submitted`, `finish`, `free`, `restart`), and carries out what it
returns (backend frees, host-ring releases, events to settle). Its books are a `Ledger`
(statemachine/ledger.py); its records and decisions are values
(statemachine/records.py). Not thread-safe: the Bridge serialises calls.

Ordering (ORDER-1): a new use follows each earlier one in flight it
conflicts with (a hazard of the spec's table over overlapping bytes). `plan`
says what to do with a new use: submit it, hold it behind the uses it
follows, or wait for one of them first (ORDER-2 refuses a wait that could
never end).

Orchestration: the core also decides what happens as uses end, and says it as
values. `finish` ends a use exactly once, whatever order completions, launches
and polls come in, and returns what must happen (`Effect`s: the host bytes,
the device frees, the event, the held uses to launch, in issue order);
`refresh_order`, `polled`, `reports` and `views_ended` say which uses to ask
the device about. The core never calls out: whoever runs the uses executes the
effects and feeds the device's answers back (the Bridge over a backend, the
sans-I/O checker over a model device; both read the same values).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from devbridge.errors import BridgeError, OrderingError
from devbridge.statemachine.ledger import Ledger
from devbridge.statemachine.records import (
    ABORTED,
    HOST_SIDE,
    SUBMIT,
    USE_EVENTS,
    Allocation,
    Composite,
    CoreState,
    Effect,
    Effects,
    HostDone,
    InFlight,
    InvariantViolation,
    Lookups,
    Plan,
    Release,
    Settle,
    Submit,
    packaged_lookups,
)
from devbridge.statemachine.status import Status

# the core's records and its ledger, importable from here as before
__all__ = [
    "ABORTED",
    "SUBMIT",
    "USE_EVENTS",
    "Allocation",
    "Composite",
    "CoreState",
    "Effect",
    "Effects",
    "HostDone",
    "InFlight",
    "InvariantViolation",
    "Ledger",
    "LifecycleCore",
    "Lookups",
    "Plan",
    "Release",
    "Settle",
    "Submit",
    "packaged_lookups",
]


class LifecycleCore(Ledger):
    """The lifecycle's decisions over its ledger: how a new use is ordered (ORDER-1) and how
    uses end, exactly once, with the held uses their ends make ready; the Bridge performs the
    effects it returns."""

    def closure(self, uses: Sequence[InFlight]) -> list[InFlight]:
        """`uses` and every use in flight they follow, directly or not, oldest first. The oldest
        has no predecessor in flight, so it is not held: waiting for it always makes progress."""
        seen = {u.id: u for u in uses}
        todo = list(uses)
        while todo:
            for before in todo.pop().after or ():
                if before not in seen and (use := self._inflight.get(before)) is not None:
                    seen[before] = use
                    todo.append(use)
        return [seen[k] for k in sorted(seen)]

    def plan(
        self, kind: str, handles: Sequence[tuple[int, int]], span: tuple[int, int] | None = None, sync: bool = True
    ) -> Plan:
        """What to do with a new use of `kind` on `handles` (checked already): `SUBMIT` when it
        follows nothing in flight; else hold it (asynchronous) or wait (ORDER-1). ORDER-2 when
        the wait would be for an open compute, which cannot end while the caller waits."""
        before = self.conflicts(kind, handles, span)
        if not before:
            return SUBMIT
        return Plan(before, self.blocker(before) if sync else None)

    def blocker(self, uses: Sequence[InFlight]) -> InFlight:
        """The use to wait for so that `uses` make progress: the oldest of them and their own
        predecessors (it follows nothing, so it is on the device). ORDER-2 if any of them is an
        open compute, which cannot end while the caller waits."""
        chain = self.closure(uses)
        for use in chain:
            if use.open:
                raise OrderingError(
                    "ORDER-2",
                    f"this call must follow {use.event!r}, whose `with` block is open: it would wait forever",
                )
        return chain[0]

    # ------------------------------------------------------------ orchestration

    def finish(self, use: InFlight, status: Status) -> list[Effect]:
        """The one place a use ends, exactly once ([] when it ended already: a poll that reaches a
        use an earlier end launched and the device ended at once). What the executor must do, in
        order: the host side of a copy (`HostDone`), the device frees it allows (`Release`), its
        event (`Settle`), then the held uses its end made ready (`Submit`, in issue order; the
        executor launches them after whatever it has yet to launch). A ready use a restart made
        stale never reaches the device: it ends here, aborted, and its followers with it."""
        if self.ended(use):
            return []
        effects: list[Effect] = []
        ready: deque[tuple[InFlight, Status]] = deque([(use, status)])
        while ready:
            use, status = ready.popleft()
            try:
                end = self.end(use.id, ok=status.error is None)
            except BridgeError as e:  # a bug in the bookkeeping: the event still settles, with it
                effects.append(Settle(use, e, aborted=False, broken=True))
                return effects
            effects.extend(self._ending(end, status))
            for follower in end.ready:  # in issue order
                if follower.generation != self.generation:
                    ready.append((follower, ABORTED))
                else:
                    effects.append(Submit(follower))
        return effects

    def _ending(self, end: Effects, status: Status) -> list[Effect]:
        """The executor's part of one use's end: its host bytes, its frees, its event's outcome
        (the spec's `failures` name the rule and the error)."""
        use = end.use
        effects: list[Effect] = []
        if use.kind in HOST_SIDE:
            effects.append(HostDone(use, end.host_ok))
        effects.extend(Release(record, use) for record in end.release)
        error = None
        if end.aborted:
            error = self.failure("aborted", f"{use.kind} #{use.id} was aborted by restart")
        elif end.error_rule is not None:
            error = self.failure(
                status.failure or use.kind, f"{use.kind} #{use.id} failed: {status.error}", **dict(status.fields)
            )
        effects.append(Settle(use, error, aborted=end.aborted, broken=False))
        return effects

    def ended(self, use: InFlight) -> bool:
        """Whether `use` is no longer in flight."""
        return self._inflight.get(use.id) is not use

    def queryable(self, use: InFlight) -> bool:
        """Whether the device may say `use` is done: submitted, in flight, and not a compute whose
        `with` block is open (it cannot end before the block does)."""
        return use.token is not None and not use.open and not self.ended(use)

    def refresh_order(self, use: InFlight) -> list[InFlight]:
        """The uses to ask the device about so that `use` ends if it can: itself, and first, when
        it is held, the uses it follows (whose ends may launch it), oldest first."""
        if self.ended(use):
            return []
        if use.token is None:
            return self.closure([use])
        return [use]

    def polled(self) -> list[InFlight]:
        """The uses `poll` asks the device about, in issue order (a copy: ending one may launch,
        and end, later ones)."""
        return list(self._inflight.values())

    def reported(self, token: object) -> None:
        """The backend finished `token` while a call held the Bridge's lock (on any thread): the
        next call applies it (`reports`)."""
        self.unapplied.append(token)

    def view_gone(self, use_id: int) -> None:
        """A view's anchor was collected (on any thread): the next call ends its use (`views_ended`)."""
        self.collected.append(use_id)

    def views_ended(self) -> Iterator[InFlight]:
        """The uses of the views collected since the last call, each still in flight (to `finish`
        with OK), taken from the queue one at a time."""
        views = self.collected
        while views:
            if (use := self._inflight.get(views.popleft())) is not None:
                yield use

    def reports(self) -> Iterator[InFlight]:
        """The submitted uses whose tokens the backend reported while a call ran, each still in
        flight (to refresh), taken from the queue one at a time."""
        reported = self.unapplied
        while reported:
            if (use := self.submitted_use(reported.popleft())) is not None:
                yield use
