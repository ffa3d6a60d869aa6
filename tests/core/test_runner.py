"""The Runner, the one procedure that carries out the core's effects, over a recording device:
every event is settled whatever fails before it, and held uses are launched in one loop, in
issue order, even when a launch makes more ready on the same thread."""

from __future__ import annotations

import pytest

from devbridge.statemachine import LifecycleCore
from devbridge.statemachine.records import Allocation, HostDone, InFlight, Settle, Submit
from devbridge.statemachine.runner import Runner
from devbridge.statemachine.status import PENDING, Status


class Recorder(Runner):
    """A device that records what it is asked, in order; `on_submit` runs inside a submit."""

    def __init__(self, core: LifecycleCore) -> None:
        super().__init__(core)
        self.calls: list[tuple[str, int, int]] = []  # (what, use id, how deep in submits)
        self.depth = 0
        self.on_submit: dict[int, list[InFlight]] = {}  # use id -> uses made ready inside its submit
        self.failing_host_done = False
        self.done: set[object] = set()  # tokens the device has finished

    def submit(self, use: InFlight) -> Status | None:
        self.calls.append(("submit", use.id, self.depth))
        self.core.submitted(use, f"token-{use.id}")
        self.depth += 1
        try:
            if ready := self.on_submit.get(use.id):
                self.execute([Submit(u) for u in ready])  # a completion reported inside a launch
        finally:
            self.depth -= 1
        return None

    def query(self, use: InFlight) -> Status:
        return Status(True) if use.token in self.done else PENDING

    def host_done(self, use: InFlight, ok: bool) -> None:
        self.calls.append(("host_done", use.id, self.depth))
        if self.failing_host_done:
            raise RuntimeError("the ring refused")

    def release_memory(self, record: Allocation, by: InFlight) -> None:
        self.calls.append(("release", by.id, self.depth))

    def settle(self, effect: Settle) -> None:
        self.calls.append(("settle", effect.use.id, self.depth))


def uses(core: LifecycleCore, n: int) -> list[InFlight]:
    record = core.add(64, None, None)
    return [
        core.begin("copy_in", [(record.id, record.generation)], host=f"R{i}", span=(8 * i, 8 * i + 4)) for i in range(n)
    ]


def test_a_failure_before_them_leaves_no_event_pending_and_is_raised() -> None:
    core = LifecycleCore()
    runner = Recorder(core)
    a, b, c = uses(core, 3)
    runner.failing_host_done = True
    effects = [HostDone(a, True), Settle(a, None, False, False), HostDone(b, True), Settle(c, None, False, False)]
    with pytest.raises(RuntimeError, match="the ring refused"):
        runner.execute(effects)
    # every Settle after the failure, and only those: the host bytes' effects are not retried
    assert runner.calls == [("host_done", a.id, 0), ("settle", a.id, 0), ("settle", c.id, 0)]


def test_held_uses_made_ready_inside_a_launch_are_launched_by_the_same_loop_in_issue_order() -> None:
    core = LifecycleCore()
    runner = Recorder(core)
    a, b, c, d = uses(core, 4)
    runner.on_submit = {a.id: [c, d]}  # launching a makes c and d ready, on this thread
    runner.execute([Submit(a), Submit(b)])
    # one loop: c and d wait for b, issued before them, and none is launched inside another's submit
    assert runner.calls == [("submit", u.id, 0) for u in (a, b, c, d)]
    runner.execute([])  # nothing left to launch
    assert len(runner.calls) == 4 and not runner._launches


def test_a_report_applied_now_applies_the_ones_queued_before_it_first() -> None:
    """A completion the device reports while a call holds the lock is queued (`core.reported`);
    the next one applied at once (`Runner.reported`) applies the queued ones first."""
    core = LifecycleCore()
    runner = Recorder(core)
    a, b = uses(core, 2)
    tokens = {a.id: object(), b.id: object()}  # (the core knows a token by its identity)
    for use in (a, b):
        core.submitted(use, tokens[use.id])
    runner.done |= set(tokens.values())
    core.reported(tokens[a.id])  # while a call held the lock: queued
    assert not core.ended(a)
    runner.reported(tokens[b.id])
    assert core.ended(a) and core.ended(b)
    assert [c for c in runner.calls if c[0] == "settle"] == [("settle", a.id, 0), ("settle", b.id, 0)]
