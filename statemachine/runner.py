"""The one procedure that carries out the core's decisions over a device: `Runner`.

The core (statemachine/core.py) decides and returns its decisions as values (`Effect`s); it never
calls out. A `Runner` executes them, in the order given, and feeds the device's answers back to
the core: a held use it launches is asked once whether it is done, a use the device reports done
is ended through the core's `finish`, and whatever that end asks for is executed in turn. What
the device is, a subclass says (`submit`, `query`, `host_done`, `release_memory`, `settle`): the
Bridge's over a backend (devbridge.bridge.engine), the sans-I/O checker's over a model device
(devbridge.models.sansio). Both run this code, so the checker proves the orchestration the Bridge
runs. Not thread-safe: the Bridge serialises calls.
"""

from __future__ import annotations

from collections import deque

from devbridge.statemachine.core import LifecycleCore
from devbridge.statemachine.records import Allocation, Effect, HostDone, InFlight, Release, Settle, Submit
from devbridge.statemachine.status import OK, Status


class Runner:
    """Executes the core's effects over a device, and asks the device what the core needs to know."""

    def __init__(self, core: LifecycleCore) -> None:
        self.core = core
        self._launches: deque[InFlight] = deque()  # held uses made ready, to launch in issue order
        self._launching = False  # a launch loop runs further up this thread's stack: it takes new ones too

    # ------------------------------------------------------------ the device (a subclass's)

    def submit(self, use: InFlight) -> Status | None:
        """Hand a held use to the device and tell the core its token (`submitted`); None, or the
        failure status when the device refused it."""
        raise NotImplementedError

    def query(self, use: InFlight) -> Status:
        """The submitted use's status now (a failed query: done, with an error). Never blocks."""
        raise NotImplementedError

    def host_done(self, use: InFlight, ok: bool) -> None:
        """A copy's host bytes: an input's released (`ok`) or kept, an output's valid or not."""
        raise NotImplementedError

    def release_memory(self, record: Allocation, by: InFlight) -> None:
        """Free the allocation's device memory, once the use `by` ended (a failure is the
        subclass's to report)."""
        raise NotImplementedError

    def settle(self, effect: Settle) -> None:
        """The use's event is done, with `effect.error`."""
        raise NotImplementedError

    # ------------------------------------------------------------ the procedure

    def execute(self, effects: list[Effect]) -> None:
        """Carry out what the core returned, in its order. The held uses it made ready are launched
        after any not launched yet, in issue order, in one loop however long the chain (a launch
        that fails or ends at once makes its followers ready for the same loop; so does a
        completion the device reports inside a launch, on this thread). An event is settled
        whatever fails before it; a broken end (a bookkeeping bug) raises once it is."""
        for i, effect in enumerate(effects):
            try:
                if isinstance(effect, Submit):
                    self._launches.append(effect.use)
                elif isinstance(effect, HostDone):
                    self.host_done(effect.use, effect.ok)
                elif isinstance(effect, Release):
                    self.release_memory(effect.allocation, effect.by)
                else:
                    self.settle(effect)
                    if effect.broken:
                        assert effect.error is not None
                        raise effect.error
            except BaseException:
                for later in effects[i + 1 :]:  # no event is left pending by a failure before it
                    if isinstance(later, Settle):
                        self.settle(later)
                raise
        if self._launching or not self._launches:
            return
        self._launching = True
        try:
            while self._launches:
                self.launch(self._launches.popleft())
        finally:
            self._launching = False

    def launch(self, use: InFlight) -> None:
        """Submit a held use whose predecessors all ended, then ask once whether it is done (a
        refusal ends it as failed)."""
        if (failure := self.submit(use)) is not None:
            self.execute(self.core.finish(use, failure))
        else:
            self.settle_if_done(use)

    def settle_if_done(self, use: InFlight) -> bool:
        """End a submitted use the device reports done; whether it ended now."""
        if not self.core.queryable(use):
            return False
        status = self.query(use)
        if not status.done:
            return False
        return self.end(use, status)

    def end(self, use: InFlight, status: Status) -> bool:
        """End `use` with `status` (the core's `finish`: once, whoever calls it) and carry out what
        that asks for; whether it ended now."""
        effects = self.core.finish(use, status)
        self.execute(effects)
        return bool(effects)

    def refresh(self, use: InFlight) -> None:
        """End `use` if the device is done with it; a held one first ends what it follows, whose
        end may launch it."""
        for asked in self.core.refresh_order(use):
            self.settle_if_done(asked)

    def drain(self) -> int:
        """Apply what arrived while no call ran: views collected, tokens the device reported while
        a call held the lock. How many uses ended."""
        core, drained = self.core, 0
        if not (core.collected or core.unapplied):  # (the common case: one call)
            return 0
        for use in core.views_ended():
            drained += self.end(use, OK)
        for use in core.reports():
            self.refresh(use)
            drained += core.ended(use)
        return drained

    def poll(self) -> int:
        """End every use the device reports done; how many ended (the drained ones too)."""
        finished = self.drain()
        for use in self.core.polled():  # ending one may launch (and end) later ones
            finished += self.settle_if_done(use)
        return finished

    def reported(self, token: object) -> None:
        """The device finished `token`, and the caller holds the lock: apply it now (with anything
        queued before it)."""
        self.drain()
        if (use := self.core.submitted_use(token)) is not None:
            self.refresh(use)
