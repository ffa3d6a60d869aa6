"""An explicit-state, breadth-first bounded model checker over the real implementation.

Every state is reached by a sequence of actions on a fresh `Lockstep` (the
Bridge over FakeBackend and a HostRing, beside the reference model); a state
is explored by replaying its path and applying each enabled action. Every
step is checked against the model (refinement) and every invariant is checked
in every state. States are deduplicated by a canonical form that forgets
allocation identities (symmetry), byte values and, unless the ring can fill
within the bound, stream offsets, so two states that differ only in which
allocation is which are explored once. Replays skip the comparisons their
steps passed when first explored; `check(jobs=N)` expands each level in N
forked processes, with the same result as one.

Breadth first, the first violation found is a shortest one; it is rendered as
a runnable pytest test against the public API (`Violation.test_source`).

Views are made at offset 0 (or at an unaligned offset: refused, VIEW-2); a
tensor can be derived from any live tensor reaching a view (a movement op, a
lazy op or an assign: `lockstep.DERIVE`) and any tensor dropped, the view
first or last. So within the bound no backend free happens while any tensor
reaching the memory lives, and the release follows the last one.

The bound (`Bound`, named ones in `PROFILES`) limits successful allocations,
restarts, injected faults, uses in flight per allocation, live tensors per
view and depth, and sets the device spans copies touch and the ring's size. Within it every
interleaving of calls, completions (in any order, successful or failed),
faults and restarts is explored; beyond it nothing is claimed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from devbridge.models.coverage import Coverage
from devbridge.models.explorer import Expansion, explore
from devbridge.models.lockstep import DERIVE, Lockstep, kill_of
from devbridge.models.reference import Reject
from devbridge.statemachine import default_table
from devbridge.types import DeviceRange

Action = tuple[Any, ...]
EXTENT = 8  # bytes per allocation
UNALIGNED = 4  # a view offset the device cannot run on (VIEW-2)
AT_ONCE, LOST = "at_once", "lost"  # asynchronous copies the backend finishes at submission / whose first query fails
RING = 1 << 16  # large enough never to fill within any bound: stream offsets never matter
WIDE = ((0, 4), (4, 4), (2, 4), (0, 8))  # halves, an overlap of both, the whole: disjoint and overlapping copies


@dataclass(frozen=True)
class Bound:
    """What a check explores: every interleaving within these limits (see PROFILES)."""

    allocations: int = 3  # successful allocations
    restarts: int = 2
    faults: int = 1  # injected failures (alloc, copy, compute, view, free, query, wait) along one path
    in_flight: int = 3  # uses in flight per allocation (copies, computes, views)
    depth: int = 4  # actions per path (the lockstep checker's)
    tensors: int = 2  # live tensors per view: the view and one derived (or two derived, once it is dropped)
    #: the device bytes (offset, size) a copy may touch; each copy reserves that many fresh ring bytes
    spans: tuple[tuple[int, int], ...] = WIDE
    ring: int = 16  # host ring bytes: small enough to fill and wrap within the depth, stream offsets count
    #: actions per path in the sans-I/O checker (`models.sansio`; None: every reachable state)
    values_depth: int | None = 6
    #: the lockstep checker's device is one in-order queue (`FakeBackend(in_order=True)`): completing
    #: or waiting for an event ends what is ahead of it, a synchronous copy runs after what is ahead
    in_order: bool = False

    def __post_init__(self) -> None:
        if not self.spans or any(o < 0 or n < 1 or o + n > EXTENT for o, n in self.spans):
            raise ValueError(f"each span (offset, size) must lie within an allocation's {EXTENT} bytes: {self.spans}")
        if (
            min(self.allocations, self.in_flight, self.depth, self.tensors, self.ring, self.values_depth or 1) < 1
            or min(self.restarts, self.faults) < 0
        ):
            raise ValueError(f"a bound's limits are counts (allocations, depth, ... at least 1): {self}")

    @property
    def ring_fills(self) -> bool:
        return self.ring < self.depth * max(n for _, n in self.spans)


#: Named bounds. `narrow`: the first release's (one copy span, a ring that never fills): the
#: seeded-bug tests' bound. `default`: three allocations, copies of four spans, a ring of 16 B
#: that fills and wraps; the sans-I/O checker goes deeper than the lockstep one. `deep`: the
#: same, deeper (over a million states in each).
PROFILES: dict[str, Bound] = {
    "narrow": Bound(allocations=2, depth=6, spans=((0, 4),), ring=RING, values_depth=5),
    "default": Bound(),
    "deep": Bound(depth=6, values_depth=7),
}


@dataclass
class Violation:
    path: tuple[Action, ...]
    error: str
    test_source: str
    kill: str = ""  # what caught it (models.lockstep.kill_of): a check, `fake:<kind>`, INV-*, or an error type


@dataclass
class Figures:
    """What a checker's search counted; its `summary` prints them (both checkers' reports)."""

    bound: Bound
    states: int = 0
    transitions: int = 0
    depth: int = 0
    seconds: float = 0.0
    jobs: int = 1  # processes that explored
    coverage: Coverage = field(default_factory=lambda: Coverage(default_table(), "checker"))

    def figures(self, title: str, shortest: int | None) -> str:
        """The title, states, transitions, states/s in all and per process, spec coverage, and
        the violation's length (`shortest`; None: none)."""
        rate = self.states / max(self.seconds, 1e-9)
        return "\n".join(
            [
                title,
                f"distinct states: {self.states}   transitions: {self.transitions}   depth reached: {self.depth}",
                f"time: {self.seconds:.1f} s   states/s: {rate:.0f} "
                f"({self.jobs} process{'es' if self.jobs > 1 else ''}, {rate / self.jobs:.0f} per process)",
                self.coverage.covered(),
                "violations: " + ("none" if shortest is None else f"1 (shortest: {shortest} steps)"),
            ]
        )


@dataclass
class Report(Figures):
    violation: Violation | None = None

    def summary(self) -> str:
        return self.figures(
            "lockstep checker (the Bridge over the fake backend, beside the reference model): "
            f"depth {self.bound.depth}",
            None if self.violation is None else len(self.violation.path),
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
        if busy:
            pass
        elif m._use_rejection(a):  # refused before the backend: which fault it would meet cannot matter
            actions += [
                (c, a, span, sync, False) for c in ("h2d", "d2h") for span in bound.spans for sync in (True, False)
            ]
            actions += [("compute", a, False), ("wrap", a, 0, False), ("wrap", a, UNALIGNED, False)]
        else:
            for copy in ("h2d", "d2h"):
                for span in bound.spans:
                    # synchronous, asynchronous, finished by the backend at submission
                    actions += [(copy, a, span, mode, f) for mode in (True, False, AT_ONCE) for f in can_fail]
                    if faults_used < bound.faults:
                        actions.append((copy, a, span, LOST, False))  # its first query (at submission) fails
            actions += [("compute", a, f) for f in can_fail]
            actions += [("wrap", a, 0, f) for f in can_fail] + [("wrap", a, UNALIGNED, False)]
        actions += [("raw", a, "copy_end"), ("raw", a, "compute_end"), ("raw", a, "restart")]
    actions.append(("oob", 0))
    if m.generation < bound.restarts:
        actions += [("restart", f) for f in can_fail]  # a failing free: the first one it releases, or later
    held = any(not u.submitted for u in m.uses.values())
    for use in s.submitted():  # held-back uses are the bridge's to submit (ORDER-1)
        actions += [("complete", use, f) for f in can_fail]
        if not s.fake.in_order:  # reported while the lock is busy; found by a poll (its launches run at once)
            actions += [("busy", use)] + ([("found", use)] if held else [])
        if faults_used < bound.faults:
            actions += [("query", use), ("wait", use, True)]  # the backend's query / wait fails: the event fails
    for use in sorted(s.pending):
        if not m.uses[use].submitted:
            actions.append(("wait", use, False))  # runs the chain it follows, oldest first
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
        _, a, (d_off, n), mode, fails = action
        extra = {"at_once": mode == AT_ONCE, "lost": mode == LOST}
        r = s.reserve(n)
        if r is None:  # the ring is full (RING-2): the refusal was the step
            pass
        elif kind == "h2d":
            s.fill(r, bytes((len(s.reservations) * 16 + i) % 256 for i in range(n)))
            s.host_to_device(r, s.handles[a], d_off, mode is True, fails, **extra)
        else:
            s.device_to_host(s.handles[a], d_off, r, mode is True, fails, **extra)
    elif kind == "compute":
        s.compute([s.handles[action[1]]], action[2])
    elif kind == "wrap":
        _, a, offset, fails = action
        s.wrap(s.handles[a], offset, EXTENT - offset, fails)
    elif kind == "derive":
        s.derive(action[1], action[2])
    elif kind == "drop":
        s.drop(action[1])
    elif kind == "complete":
        s.complete(action[1], action[2])
    elif kind == "busy":
        s.complete_while_busy(action[1])
    elif kind == "found":
        s.poll_finds(action[1])
    elif kind == "query":
        s.query_fails(action[1], via_poll=False)
    elif kind == "wait":
        (s.wait_fails if action[2] else s.wait)(action[1])
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
        fire = s.act(s.bridge._core, "fire", h.id, h.generation, event)
        s.expect(None if event == "restart" else Reject("LifecycleError", "EVENT-1"), fire)
    elif kind == "oob":
        h = s.handles[action[1]]
        s.expect(Reject("RangeError", "RANGE-1"), s.act(DeviceRange, None, h, 0, h.extent + 1))
    else:
        raise ValueError(f"unknown action {action}")
    s.reconcile()  # events of uses the model ended on its own settle now (as check() would)


def faults_of(action: Action) -> int:
    """How many injected faults an action spends: a failing call or completion, a lost copy,
    a failing query or wait."""
    kind = action[0]
    if kind in ("h2d", "d2h"):
        return int(action[3] == LOST or action[4] is True)
    if kind in ("alloc", "free", "restart", "compute", "complete", "wrap"):
        return int(action[-1] is True)
    return int(kind == "query" or (kind == "wait" and action[2] is True))


def faults_in(path: Iterable[Action]) -> int:
    return sum(map(faults_of, path))


def canonical(s: Lockstep, faults_used: int, positions: bool = False) -> tuple[Any, ...]:
    """The state up to allocation identities and byte values; stream offsets count only where
    the ring can fill (`positions`: the head and each leftover range, modulo the capacity)."""
    m = s.model
    allocs = []
    for a, alloc in m.allocs.items():
        # copies and computes in issue order (which follows which matters: ORDER-1), views as a set
        ordered = tuple(
            (u_.kind, u_.fails, u_.submitted, u_.device_offset, None if u_.host is None else len(u_.host))
            for u in sorted(alloc.uses)
            if (u_ := m.uses[u]).kind != "view"
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
            where = (r.start % m.capacity, r.nbytes) if positions else ()
            leftovers.append((bool(span & m.failed), held, len(span & m.unreleased), where))
    frees = (m.free_faults, m.unreported)  # armed free faults, failed deferred frees poll will report
    head = m.head % m.capacity if positions else 0
    return (m.generation, faults_used, frees, head, tuple(sorted(allocs)), tuple(sorted(leftovers)))


# ------------------------------------------------------------ search


def replay(
    path: Iterable[Action],
    record: bool = False,
    observer: Any = None,
    edges: Any = None,
    checked: bool = False,
    ring: int = RING,
    in_order: bool = False,
) -> Lockstep:
    """A fresh Lockstep taken along `path`; `checked`: each step was compared when the path was
    first explored, so the replay skips the comparisons (the next step's `check()` sees all)."""
    s = Lockstep(ring, observer=observer, record=record, edges=edges, in_order=in_order)
    s.replaying = checked
    for action in path:
        apply(s, action)
    s.replaying = False
    return s


def expand(batch: Iterable[tuple[int, tuple[Action, ...]]], bound: Bound, known: set[tuple[Any, ...]]) -> Expansion:
    """Take every enabled action from each path's state, check the step and every invariant, and
    report the new paths whose canonical state `known` lacks (adding it). Stops at the first
    violation."""
    coverage = Coverage(default_table(), "checker")
    ring, in_order = bound.ring, bound.in_order
    out = Expansion(hits=coverage.hits, edges=coverage.edges)
    for index, path in batch:
        used = faults_in(path)
        s: Lockstep | None = replay(
            path, observer=coverage.record, edges=coverage.record_edge, checked=True, ring=ring, in_order=in_order
        )
        assert s is not None
        for action in enabled(s, bound, used):  # the first action takes the state enabled() saw; the rest replay
            out.transitions += 1
            try:
                s = s or replay(
                    path,
                    observer=coverage.record,
                    edges=coverage.record_edge,
                    checked=True,
                    ring=ring,
                    in_order=in_order,
                )
                apply(s, action)
                s.check()
            except Exception as e:  # any failure is a violation: a wrong answer, a FakeViolation, a crash
                out.violation = (index, action, f"{type(e).__name__}: {e}", kill_of(e))
                return out
            key = canonical(s, used + faults_of(action), bound.ring_fills)
            s = None
            size = len(known)
            known.add(key)
            if len(known) > size:
                out.found.append((key, (*path, action), index, action))
    return out


@dataclass
class _Search:
    """Paths of actions, replayed on a fresh Bridge and model; a path's key is its canonical state."""

    bound: Bound
    batch: int = 64
    collects: bool = True  # a replayed Bridge is garbage with cycles

    def expand(self, batch: list[tuple[int, Any]], known: set[Any]) -> Expansion:
        return expand(batch, self.bound, known)


def check(bound: Bound | None = None, progress: Callable[[int, int, int], None] | None = None, jobs: int = 1) -> Report:
    """Explore every state within `bound`, breadth first, in `jobs` processes (forked: a seeded
    bug patched in before the call is in them too). Stops at the first violation, the first in
    breadth-first order whatever `jobs` is. `progress(states, transitions, depth)` is called as
    states are expanded."""
    bound = bound or Bound()
    root = canonical(replay((), ring=bound.ring, in_order=bound.in_order), 0, bound.ring_fills)
    out = explore(_Search(bound), (), root, depth=bound.depth, jobs=jobs, progress=progress)
    report = Report(bound, jobs=jobs, states=out.states, transitions=out.transitions, depth=out.depth)
    report.seconds = out.seconds
    report.coverage.merge(out.hits, out.edges)
    report.coverage.steps, report.coverage.seconds = report.transitions, report.seconds
    if out.violation is not None:
        path, error, kill = out.violation
        report.violation = Violation(tuple(path), error, render(tuple(path), bound.ring, bound.in_order), kill)
    return report


def render(path: tuple[Action, ...], ring: int = RING, in_order: bool = False) -> str:
    """The path as a pytest test of the public API, asserting the model's answer after each step."""
    s = replay((), record=True, ring=ring, in_order=in_order)
    try:
        for action in path:
            apply(s, action)
            s.check()
    except Exception as e:  # the violation itself: the script up to it is the counterexample
        s.emit(f"# the implementation diverged from the model here: {type(e).__name__}")
    return s.test_source()


def describe(path: Iterable[Action]) -> str:
    return " -> ".join(":".join(str(x) for x in a) for a in path)
