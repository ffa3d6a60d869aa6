"""The core's records and decisions as values: an allocation, a use in flight, what to do
with a new use (`Plan`), what a use's end means (`Effects`), what the core asks whoever runs the
uses to do (`Effect`: `Submit`, `HostDone`, `Release`, `Settle`), and what it reads from its spec
(`Lookups`)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol, TypeAlias

from devbridge.errors import ERRORS, BridgeError
from devbridge.spec import LEVELS, Lifecycle
from devbridge.spec import load as load_spec
from devbridge.statemachine.machine import Step, Table, default_table
from devbridge.statemachine.status import Status

#: The kinds of use that read or write host bytes (a copy's `HostRange`).
HOST_SIDE = frozenset({"copy_in", "copy_out"})

#: Kinds of use in flight, and the spec event that begins and ends each.
USE_EVENTS: Mapping[str, tuple[str, str]] = {
    "copy_in": ("copy_begin", "copy_end"),
    "copy_out": ("copy_begin", "copy_end"),
    "compute": ("compute_begin", "compute_end"),
    "view": ("compute_begin", "compute_end"),
}


class InvariantViolation(AssertionError):
    """A spec invariant (`INV-*`) failed inside the core: a bug in the bridge, never a caller's
    mistake. `invariant` names it."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"[{invariant}] {detail}")
        self.invariant = invariant


@dataclass(slots=True, eq=False)
class Allocation:
    """The core's record of one device allocation (dropped once terminal)."""

    id: int
    generation: int
    extent: int
    spec: Any
    memory: object  # the backend's buffer; opaque here
    state: str
    handle: object = None  # the handle the Bridge issued for it; opaque here
    copies: int = 0
    computes: int = 0
    accesses: list[InFlight] | None = None  # uses in flight that read or write its bytes (made on first use)


@dataclass(slots=True, eq=False)
class InFlight:
    """A use the backend has not finished: a copy, a compute, or a live view."""

    id: int
    kind: str
    allocations: tuple[int, ...]
    host: Any  # the HostRange a copy reads or writes; None for compute and views
    generation: int
    keep_host: bool = False  # an input copy whose host bytes the worker releases itself
    span: tuple[int, int] | None = None  # the device bytes [start, stop) a copy touches; None: all
    after: set[int] | None = None  # earlier uses in flight it follows: held while any (None: none, ever)
    followers: list[InFlight] | None = None  # later uses that follow it (None: none; the hot path)
    event: Any = None  # the Bridge's event for it (None: a view); opaque here
    token: Any = None  # the backend's token once submitted (None while held back); opaque here
    open: bool = False  # a compute whose `with` block is open: it cannot end before the block does


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with a new use (ORDER-1): submit it now (nothing `before` it: SUBMIT); hold it
    behind `before` (an asynchronous copy: submitted when the last of them ends); or, with a
    `blocker`, wait for that use first, the oldest of their chain (it follows nothing, so it is
    on the device), then plan again."""

    before: list[InFlight] = field(default_factory=list)
    blocker: InFlight | None = None


SUBMIT = Plan()
#: How a held use a restart made stale ends, never submitted.
ABORTED = Status(True, "aborted by a restart before it was submitted")


class Tracer(Protocol):
    """What the core reports as it goes, to whoever draws a timeline (devbridge.bridge.trace)."""

    def state(self, record: Allocation, event: str, state: str) -> None:
        """The allocation is in `state` after `event` (a terminal state is its last)."""

    def began(self, use: InFlight) -> None:
        """A use in flight begins (held when its `after` is not empty)."""

    def submitted(self, use: InFlight) -> None:
        """The backend took the use (a held one: launched now)."""

    def ended(self, use: InFlight, ok: bool) -> None:
        """The use ended, successfully or not."""

    def instant(self, kind: str, record: Allocation, nbytes: int) -> None:
        """A copy of `nbytes` began and ended in one step (the backend finished it on submission)."""

    def restarted(self, generation: int) -> None:
        """A new generation began."""


#: `LifecycleCore.snapshot()`: (generation, next allocation id, next use id, records, uses).
CoreState = tuple[int, int, int, tuple[tuple[Any, ...], ...], tuple[tuple[Any, ...], ...]]


@dataclass(frozen=True, slots=True)
class Effects:
    """What the Bridge must do after a use ends.

    `host_ok` says whether the host range's side effect happened: for an input
    copy the bridge releases the bytes (unless the worker keeps them), for an
    output copy they are valid.
    `error_rule` is set when the use failed (COPY-F, COMPUTE-F) or was
    `aborted` by a restart (GEN-1): the spec's `failures`.
    `ready` are held uses that followed only this one, in issue order: the
    Bridge submits them now (ORDER-1).
    """

    release: tuple[Allocation, ...]
    use: InFlight
    host_ok: bool
    error_rule: str | None
    ready: tuple[InFlight, ...] = ()
    aborted: bool = False


@dataclass(frozen=True, slots=True)
class Submit:
    """Hand a held use to the device now: every use it followed has ended. The executor reports
    what the device said: its token (`submitted`), then its first status, or the refusal, to
    `finish` when done."""

    use: InFlight


@dataclass(frozen=True, slots=True)
class HostDone:
    """A copy ended: its host bytes are released (an input's, `ok`) or kept for the worker, valid
    (an output's, `ok`) or never readable."""

    use: InFlight
    ok: bool


@dataclass(frozen=True, slots=True)
class Release:
    """Free the allocation's device memory: nothing uses it any more (FREE-2: once), since the end
    of the use `by`."""

    allocation: Allocation
    by: InFlight


@dataclass(frozen=True, slots=True)
class Settle:
    """The use's event is done; `error` is its failure (None: it succeeded). `aborted`: a restart
    ended it (GEN-1). `broken`: the bookkeeping failed (a bug): the executor settles the event
    with the error, then raises it."""

    use: InFlight
    error: BridgeError | None
    aborted: bool
    broken: bool


#: What the core asks whoever runs the uses to do (the Bridge over a backend, the sans-I/O checker
#: over a model device), in the order it returns them.
Effect: TypeAlias = "Submit | HostDone | Release | Settle"


@dataclass(frozen=True, slots=True)
class Composite:
    """A use that begins and ends at once: its two compiled steps and where they lead."""

    begin: str
    first: Step
    middle: str
    end: str
    then: Step
    dest: str


#: (state, kind, level(copies), level(computes)) -> what a copy meets there: the composite step
#: of its begin and end, or the rule that refuses it.
CopySteps: TypeAlias = "Mapping[tuple[str, str, int, int], Composite | str]"


@dataclass(frozen=True, slots=True)
class Lookups:
    """What a core reads from its spec on every call, derived once per spec (not per core)."""

    spec: Lifecycle
    table: Table
    errors: Mapping[str, type[BridgeError]]  # rule -> the error it raises
    deltas: Mapping[str, tuple[str | None, int]]  # event -> (counter, delta)
    #: (earlier kind, later kind) -> the hazard that orders them (RAW, WAR, WAW) or None
    hazards: Mapping[tuple[str, str], str | None]
    accesses: frozenset[str]  # the kinds of use that some hazard orders
    #: a failed use's kind, or "aborted" -> the rule its event reports and the error it raises
    failures: Mapping[str, tuple[str, type[BridgeError]]]
    #: what a copy meets, made with the table for every count each state admits: the composite
    #: step of its begin and end (it may begin: `take` takes it once the backend finished the
    #: copy), or the rule that refuses it. A copy's checks and its per-call path are this lookup.
    copy_steps: CopySteps

    @classmethod
    def of(cls, spec: Lifecycle, table: Table) -> Lookups:
        hazards = {(a, b): spec.hazard(a, b) for a in USE_EVENTS for b in USE_EVENTS}
        errors = {r.id: ERRORS[r.error or "BridgeError"] for r in spec.rules.values()}
        deltas = {e.name: (e.counter, e.delta) for e in spec.events.values()}
        copy_steps: dict[tuple[str, str, int, int], Composite | str] = {}
        for state, kind, copies, computes in itertools.product(
            spec.states, ("copy_in", "copy_out"), range(LEVELS), range(LEVELS)
        ):
            if spec.states[state].admits(copies, computes):
                case = (state, kind, copies, computes)
                rule = table.lookup(state, USE_EVENTS[kind][0], copies, computes).rule
                # (a spec that breaks its counts there makes none: a copy that meets it is refused then)
                with contextlib.suppress(InvariantViolation):
                    copy_steps[case] = rule if rule is not None else compose(spec, table, errors, deltas, *case)
        return cls(
            spec,
            table,
            errors,
            deltas,
            hazards,
            frozenset(k for k in USE_EVENTS if any(hazards[(k, b)] for b in USE_EVENTS)),
            {f.when: (f.rule, ERRORS[f.error]) for f in spec.failures.values()},
            copy_steps,
        )


def compose(
    spec: Lifecycle,
    table: Table,
    errors: Mapping[str, type[BridgeError]],
    deltas: Mapping[str, tuple[str | None, int]],
    state: str,
    kind: str,
    copies: int,
    computes: int,
) -> Composite:
    """A use's begin then end from the compiled table, validated: the rule's error when the table
    refuses the begin, INV-COUNTS when the end would leave counts its state does not admit."""
    begin, end = USE_EVENTS[kind]
    first = table.lookup(state, begin, copies, computes)
    if first.rule is not None:
        raise errors[first.rule](first.rule, f"{begin} rejected: allocation is {state}")
    assert first.dest is not None and not first.release, (state, begin, first)
    counter, _ = deltas[begin]
    after = (copies + 1, computes) if counter == "copies" else (copies, computes + 1)
    then = table.lookup(first.dest, end, *after)
    assert then.dest is not None and not then.release and then.dest not in table.terminal, (then, after)
    if not spec.states[then.dest].admits(copies, computes):
        raise InvariantViolation(
            "INV-COUNTS",
            f"a {kind} from {state} would leave it {then.dest} with {copies} copies and {computes} computes in flight",
        )
    return Composite(begin, first, first.dest, end, then, then.dest)


@cache
def packaged_lookups() -> Lookups:
    return Lookups.of(load_spec(), default_table())
