"""The sans-I/O lifecycle core: what to do with each use, and what happens as uses end.

The core holds every lifecycle decision and performs no device work: the
Bridge asks it whether a call is allowed (`check`), tells it what happened
(`begin`, `end`, `free`, `restart`), and carries out the `Effects` it
returns (backend frees, host-ring releases). Its books are a `Ledger`
(statemachine/ledger.py); its records and decisions are values
(statemachine/records.py). Not thread-safe: the Bridge serialises calls.

Ordering (ORDER-1): a new use follows each earlier one in flight it
conflicts with (a hazard of the spec's table over overlapping bytes). `plan`
says what to do with a new use: submit it, hold it behind the uses it
follows, or wait for one of them first (ORDER-2 refuses a wait that could
never end).

Orchestration: the core also decides what happens as uses end. `settle` ends a
use exactly once, whatever order completions, launches and polls come in; the
held uses its end made ready are launched in issue order (`launch_ready`, one
loop however long the chain); `poll`, `refresh` and `drain` settle what the
device finished. Each takes an `Executor`, which does the I/O: the Bridge over
a backend, the sans-I/O checker over a model device. Both run this same code.
"""

from __future__ import annotations

from collections.abc import Sequence

from devbridge.errors import BridgeError, OrderingError
from devbridge.statemachine.ledger import Ledger
from devbridge.statemachine.records import (
    ABORTED,
    SUBMIT,
    USE_EVENTS,
    Allocation,
    Composite,
    CoreState,
    Effects,
    Executor,
    InFlight,
    InvariantViolation,
    Lookups,
    Plan,
    packaged_lookups,
)
from devbridge.statemachine.status import OK, Status

# the core's records and its ledger, importable from here as before
__all__ = [
    "ABORTED",
    "SUBMIT",
    "USE_EVENTS",
    "Allocation",
    "Composite",
    "CoreState",
    "Effects",
    "Executor",
    "InFlight",
    "InvariantViolation",
    "Ledger",
    "LifecycleCore",
    "Lookups",
    "Plan",
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

    def settle(self, use: InFlight, status: Status, run: Executor) -> bool:
        """The one place a use ends, exactly once: False when it ended already (a poll that
        reaches a use an earlier settle launched and the device ended at once). The held uses
        its end made ready are launched after its event is settled."""
        if self.ended(use):
            return False
        try:
            effects = self.end(use.id, ok=status.error is None)
        except BridgeError as e:  # a bug in the bookkeeping: the event still settles, with it
            run.ended(use, e, status)
            raise
        if effects.ready:
            self._ready.extend(effects.ready)
        run.ended(use, effects, status)
        if self._ready:
            self.launch_ready(run)
        return True

    def ended(self, use: InFlight) -> bool:
        """Whether `use` is no longer in flight."""
        return self._inflight.get(use.id) is not use

    def launch_ready(self, run: Executor) -> None:
        """Launch the held uses made ready, in issue order; one loop however long the chain (a
        launch that fails, aborts or ends at once makes its followers ready in turn, for this
        same loop). A use a restart made stale is aborted, never submitted."""
        if self._launching:
            return
        self._launching = True
        try:
            while self._ready:
                use = self._ready.popleft()
                if use.generation != self.generation:
                    self.settle(use, ABORTED, run)
                elif (failure := run.launch(use)) is not None:
                    self.settle(use, failure, run)
                else:
                    self.settle_if_done(use, run)
        finally:
            self._launching = False

    def settle_if_done(self, use: InFlight, run: Executor) -> bool:
        """Settle a submitted use the executor reports done (an open compute cannot be done)."""
        if use.token is None or use.open or self.ended(use):
            return False
        status = run.query(use)
        return status.done and self.settle(use, status, run)

    def refresh(self, use: InFlight, run: Executor) -> None:
        """Settle `use` if it is done; a held one first settles what it follows, whose end may
        launch it."""
        if self.ended(use):
            return
        if use.token is None:
            for before in self.closure([use]):
                if before is not use:
                    self.settle_if_done(before, run)
        self.settle_if_done(use, run)

    def poll(self, run: Executor) -> int:
        """Settle every use the executor reports done; how many ended (the drained ones too)."""
        finished = self.drain(run)
        for use in list(self._inflight.values()):  # settling may launch (and end) later ones
            finished += self.settle_if_done(use, run)
        return finished

    def reported(self, token: object, run: Executor | None) -> None:
        """The backend finished `token` (on any thread). With `run`, the caller holds the
        Bridge's lock and it is applied now; without (the lock is busy), the next `drain` does."""
        self._reported.append(token)
        if run is not None:
            self.drain(run)

    def view_gone(self, use_id: int) -> None:
        """A view's anchor was collected (on any thread): the next `drain` ends its use."""
        self._views_gone.append(use_id)

    def drain(self, run: Executor) -> int:
        """Apply what arrived while no call ran: views collected, tokens the backend finished.
        How many uses ended."""
        drained = 0
        views, reported = self._views_gone, self._reported
        while views:
            use = self._inflight.get(views.popleft())
            drained += use is not None and self.settle(use, OK, run)
        while reported:
            token = reported.popleft()
            if (use := self.submitted_use(token)) is not None:
                self.refresh(use, run)
                drained += self.ended(use)
        return drained
