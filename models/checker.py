"""An explicit-state, breadth-first bounded model checker over the real implementation.

Every state is reached by a sequence of actions on a fresh `Lockstep` (the
Bridge over FakeBackend and a HostRing, beside the reference model); a state
is explored by replaying its path and applying each enabled action. Every
step is checked against the model (refinement) and every invariant is checked
in every state. States are deduplicated by a canonical form that forgets
allocation identities (symmetry), byte values and stream offsets, so two
states that differ only in which allocation is which are explored once.

Breadth first, the first violation found is a shortest one; it is rendered as
a runnable pytest test against the public API (`Violation.test_source`).

Views are made at offset 0 (or at an unaligned offset: refused, VIEW-2); a
tensor can be derived from any live tensor reaching a view (a movement op, a
lazy op or an assign: `lockstep.DERIVE`) and any tensor dropped, the view
first or last. So within the bound no backend free happens while any tensor
reaching the memory lives, and the release follows the last one.

The bound limits successful allocations, restarts, injected faults, uses in
flight per allocation, live tensors per view, and depth. Within it every
interleaving of calls, completions (in any order, successful or failed),
faults and restarts is explored; beyond it nothing is claimed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from devbridge.models.coverage import Coverage
from devbridge.models.lockstep import DERIVE, Lockstep, kill_of
from devbridge.models.reference import Reject
from devbridge.statemachine import default_table
from devbridge.types import DeviceRange

Action = tuple[Any, ...]
EXTENT = 8  # bytes per allocation
UNALIGNED = 4  # a view offset the device cannot run on (VIEW-2)
CHUNK = 4  # bytes per copy: each copy reserves a fresh range of this size
AT_ONCE, LOST = "at_once", "lost"  # asynchronous copies the backend finishes at submission / whose first query fails
RING = 1 << 16  # large enough never to fill within any bound: stream offsets never matter


@dataclass(frozen=True)
class Bound:
    """The default reaches every spec transition and rejection (3 uses in flight for the
    copying_computing self-loops, 2 restarts for stale_pending's) in well under a minute."""

    allocations: int = 2  # successful allocations
    restarts: int = 2
    faults: int = 1  # injected failures (alloc, copy, compute, free, query) along one path
    in_flight: int = 3  # uses in flight per allocation (copies, computes, views)
    depth: int = 6  # actions per path
    tensors: int = 2  # live tensors per view: the view and one derived (or two derived, once it is dropped)


@dataclass
class Violation:
    path: tuple[Action, ...]
    error: str
    test_source: str
    kill: str = ""  # what caught it (models.lockstep.kill_of): a check, `fake:<kind>`, INV-*, or an error type


@dataclass
class Report:
    bound: Bound
    states: int = 0
    transitions: int = 0
    depth: int = 0
    seconds: float = 0.0
    coverage: Coverage = field(default_factory=lambda: Coverage(default_table(), "checker"))
    violation: Violation | None = None

    def summary(self) -> str:
        rate = self.states / max(self.seconds, 1e-9)
        candidates = self.coverage.table.candidates()
        hit = self.coverage.hits
        t = [c for c in candidates if c[3].rule is None]
        r = [c for c in candidates if c[3].rule is not None]
        edges = self.coverage.hazard_edges()
        return "\n".join(
            [
                f"bound: {self.bound}",
                f"distinct states: {self.states}   transitions: {self.transitions}   depth reached: {self.depth}",
                f"time: {self.seconds:.1f} s   states/s: {rate:.0f}",
                f"spec transitions covered: {sum((s, e, i) in hit for s, e, i, _ in t)}/{len(t)}   "
                f"rejections covered: {sum((s, e, i) in hit for s, e, i, _ in r)}/{len(r)}   "
                f"hazard edges covered: {len(edges) - len(self.coverage.missing_edges())}/{len(edges)}",
                "violations: "
                + ("none" if self.violation is None else f"1 (shortest: {len(self.violation.path)} steps)"),
            ]
        )


# ------------------------------------------------------------ actions


def enabled(s: Lockstep, bound: Bound, faults_used: int) -> list[Action]:
    """Every action the bound allows from this state, in a fixed order."""
    m = s.model
    can_fail = (False, True) if faults_used < bound.faults else (False,)
    actions: list[Action] = []
    if len(s.handles) < bound.allocations:
        actions += [("alloc", f) for f in can_fail]
    for a in range(len(s.handles)):
        busy = len(m.allocs[a].uses) >= bound.in_flight
        # a failing free: this allocation's (at once) or the next release (deferred by its uses)
        actions += [("free", a, f) for f in can_fail if not (f and m._use_rejection(a))]
        if not busy:
            for copy in ("h2d", "d2h"):
                actions += [(copy, a, sync, f) for sync in (True, False) for f in can_fail]
                actions += [(copy, a, AT_ONCE, f) for f in can_fail]  # the backend finishes it at submission
                if faults_used < bound.faults:
                    actions.append((copy, a, LOST))  # its first query (at submission) fails
            actions += [("compute", a, f) for f in can_fail]
            actions += [("wrap", a, 0), ("wrap", a, UNALIGNED)]
        actions += [("raw", a, "copy_end"), ("raw", a, "compute_end"), ("raw", a, "restart")]
    actions.append(("oob", 0))
    if m.generation < bound.restarts:
        actions += [("restart", f) for f in can_fail]  # a failing free: the first one it releases, or later
    for use in s.submitted():  # held-back uses are the bridge's to submit (ORDER-1)
        actions += [("complete", use, f) for f in can_fail]
        if faults_used < bound.faults:
            actions.append(("query", use))  # the backend's query fails: the event fails
    for use in sorted(s.pending):
        if not m.uses[use].submitted:
            actions.append(("wait", use))  # runs the chain it follows, oldest first
    if m.unreported:
        actions.append(("poll",))  # reports the deferred frees that failed
    for t in sorted(s.tensors):
        if len(m.uses[m.tensors[t]].tensors) < bound.tensors:
            actions += [("derive", t, kind) for kind in DERIVE]
        actions.append(("drop", t))
    for k, r in enumerate(s.reservations):
        if set(s.span(r)) <= m.unreleased:
            actions.append(("release", k))
    return [a for a in actions if _applies(s, a)]


def _applies(s: Lockstep, action: Action) -> bool:
    """Raw events only where no bridge call would send them (their rejection is the point)."""
    if action[0] != "raw":
        return action[0] != "oob" or bool(s.handles)
    a, event = action[1], action[2]
    if event == "restart":
        return s.model.state(a) in ("freed", "stale")
    return s.stray_end(a, event)


def apply(s: Lockstep, action: Action) -> None:
    kind = action[0]
    if kind == "alloc":
        s.alloc(EXTENT, action[1])
    elif kind == "free":
        if action[2]:
            s.arm_free_fault()
        s.free(s.handles[action[1]])
    elif kind in ("h2d", "d2h"):
        a, mode = action[1], action[2]
        fails = action[3] if len(action) > 3 else False
        sync = mode is True
        extra = {"at_once": mode == AT_ONCE, "lost": mode == LOST}
        r = s.reserve(CHUNK)
        assert r is not None
        if kind == "h2d":
            s.fill(r, bytes(range(len(s.reservations), len(s.reservations) + CHUNK)))
            s.host_to_device(r, s.handles[a], 0, sync, fails, **extra)
        else:
            s.device_to_host(s.handles[a], 0, r, sync, fails, **extra)
    elif kind == "compute":
        s.compute([s.handles[action[1]]], action[2])
    elif kind == "wrap":
        _, a, offset = action
        s.wrap(s.handles[a], offset, EXTENT - offset)
    elif kind == "derive":
        s.derive(action[1], action[2])
    elif kind == "drop":
        s.drop(action[1])
    elif kind == "complete":
        s.complete(action[1], action[2])
    elif kind == "query":
        s.query_fails(action[1], via_poll=False)
    elif kind == "wait":
        s.wait(action[1])
    elif kind == "poll":
        s.poll(0)
    elif kind == "restart":
        if action[1]:
            s.arm_free_fault()
        s.restart()
    elif kind == "release":
        s.release(s.reservations[action[1]])
    elif kind == "raw":
        _, a, event = action
        h = s.handles[a]
        core = s.bridge._core
        code = f"bridge._core.fire({h.id}, {h.generation}, {event!r})"
        if event == "restart":
            s.emit(code)
            core.fire(h.id, h.generation, event)
        else:
            s.expect(Reject("LifecycleError", "EVENT-1"), lambda: core.fire(h.id, h.generation, event), code)
    elif kind == "oob":
        h = s.handles[action[1]]
        code = f"DeviceRange(h{h.id}, 0, {h.extent + 1})"
        s.expect(Reject("RangeError", "RANGE-1"), lambda: DeviceRange(h, 0, h.extent + 1), code)
    else:
        raise ValueError(f"unknown action {action}")
    s.reconcile()  # events of uses the model ended on its own settle now (as check() would)


FAULTABLE = ("alloc", "free", "restart", "h2d", "d2h", "compute", "complete")


def faults_in(path: Iterable[Action]) -> int:
    return sum(1 for a in path if a[0] == "query" or a[-1] == LOST or (a[0] in FAULTABLE and a[-1] is True))


def canonical(s: Lockstep, faults_used: int) -> tuple[Any, ...]:
    """The state up to allocation identities, byte values and stream offsets."""
    m = s.model
    allocs = []
    for a, alloc in m.allocs.items():
        # copies and computes in issue order (which follows which matters: ORDER-1), views as a set
        ordered = tuple(
            (m.uses[u].kind, m.uses[u].fails, m.uses[u].submitted)
            for u in sorted(alloc.uses)
            if m.uses[u].kind != "view"
        )
        views = tuple(
            sorted(
                tuple(sorted(s.derived[t] for t in m.uses[u].tensors)) for u in alloc.uses if m.uses[u].kind == "view"
            )
        )
        uses = (ordered, views)  # fmt: skip
        allocs.append((m.state(a), m.generation - alloc.generation, alloc.released, alloc.free_failed, uses))
    leftovers = []
    for r in s.reservations:
        span = set(s.span(r))
        if span & m.unreleased:
            held = any(use.host is not None and span & set(use.host) for use in m.uses.values())
            leftovers.append((bool(span & m.failed), held, len(span & m.unreleased)))
    frees = (m.free_faults, m.unreported)  # armed free faults, failed deferred frees poll will report
    return (m.generation, faults_used, frees, tuple(sorted(allocs)), tuple(sorted(leftovers)))


# ------------------------------------------------------------ search


def replay(path: Iterable[Action], record: bool = False, observer: Any = None, edges: Any = None) -> Lockstep:
    s = Lockstep(RING, observer=observer, record=record, edges=edges)
    for action in path:
        apply(s, action)
    return s


def check(bound: Bound | None = None, progress: Callable[[int, int, int], None] | None = None) -> Report:
    """Explore every state within `bound`, breadth first. Stops at the first violation.
    `progress(states, transitions, depth)` is called after each state is expanded."""
    bound = bound or Bound()
    report = Report(bound)
    start = time.perf_counter()
    initial = replay(())
    seen = {canonical(initial, 0)}
    frontier: list[tuple[Action, ...]] = [()]
    report.states = 1
    for depth in range(bound.depth):
        next_frontier: list[tuple[Action, ...]] = []
        for path in frontier:
            base = replay(path)
            used = faults_in(path)
            for action in enabled(base, bound, used):
                report.transitions += 1
                new_path = (*path, action)
                try:
                    s = replay(path, observer=report.coverage.record, edges=report.coverage.record_edge)
                    apply(s, action)
                    s.check()
                except Exception as e:  # any failure is a violation: a wrong answer, a FakeViolation, a crash
                    error = f"{type(e).__name__}: {e}"
                    report.violation = Violation(new_path, error, render(new_path), kill_of(e))
                    report.seconds = time.perf_counter() - start
                    report.depth = depth + 1
                    return report
                key = canonical(s, faults_in(new_path))
                if key not in seen:
                    seen.add(key)
                    next_frontier.append(new_path)
            if progress is not None:
                progress(len(seen), report.transitions, depth + 1)
        if not next_frontier:
            break
        report.depth = depth + 1
        frontier = next_frontier
    report.states = len(seen)
    report.coverage.steps = report.transitions
    report.seconds = time.perf_counter() - start
    report.coverage.seconds = report.seconds
    return report


def render(path: tuple[Action, ...]) -> str:
    """The path as a pytest test of the public API, asserting the model's answer after each step."""
    s = replay((), record=True)
    try:
        for action in path:
            apply(s, action)
            s.check()
    except Exception as e:  # the violation itself: the script up to it is the counterexample
        s.emit(f"# the implementation diverged from the model here: {type(e).__name__}")
    return s.test_source()


def describe(path: Iterable[Action]) -> str:
    return " -> ".join(":".join(str(x) for x in a) for a in path)
