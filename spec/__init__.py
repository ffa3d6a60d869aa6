"""The allocation lifecycle as data, loaded and validated.

`lifecycle.toml` is the single source of truth. `load()` parses it into
frozen dataclasses and refuses a spec that is incomplete or unsound:

* every name it references exists (states, events, guards, rules, actions);
* every (state, event) pair has candidates (guarded rejections first, then
  transitions; only the last may be unguarded) covering every guard valuation;
* every state is reachable from the initial state, and every state reaches a
  terminal one;
* every transition keeps the state's `where` invariant on the use counters;
* the ordering data (accesses, hazards, device-ordered pairs) names only
  known uses, access extents and access modes.
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

SPEC_PATH = Path(__file__).with_name("lifecycle.toml")
SEED_PATH = Path(__file__).with_name("SEED.md")

#: Actions a transition may carry; the core turns them into backend calls.
ACTIONS = frozenset({"release_memory"})
#: Counter predicates a state's `where` may use.
PREDICATES = frozenset({"zero", "positive", "any"})
COUNTERS = ("copies", "computes")
#: How much of an allocation a use reads or writes (ORDER-1): its device range, or all of it.
EXTENTS = frozenset({"range", "whole"})
MODES = ("reads", "writes")
#: What can make an event report a failure: the backend failing a use of these kinds (a view
#: never fails: it ends when its tensors go), or a restart aborting it.
FAILING = ("copy_in", "copy_out", "compute", "aborted", "host_bytes")
#: How a rule without an error keeps a breach (besides naming the rule whose error refuses it).
KEEPERS = ("deferring", "logging")
#: Guards only tell a counter's 0, 1 and more apart: `level(n)` is all of n they read, and a
#: table keyed by levels (0, 1, 2) decides for any count.
LEVELS = 3


def level(count: int) -> int:
    return count if count < 2 else 2


#: Counts the invariant check tries: every level, and a "more" that is not 2.
_COUNT_RANGE = range(LEVELS + 1)


class SpecError(ValueError):
    """The lifecycle spec is malformed or unsound."""


@dataclass(frozen=True)
class State:
    name: str
    doc: str
    where: Mapping[str, str]
    terminal: bool

    def admits(self, copies: int, computes: int) -> bool:
        """Whether these counters are allowed in this state (the `where` invariant)."""
        for key, pred in self.where.items():
            value = copies if key == "copies" else computes if key == "computes" else copies + computes
            if not _holds(pred, value):
                return False
        return True


@dataclass(frozen=True)
class Event:
    name: str
    doc: str
    counter: str | None
    delta: int


@dataclass(frozen=True)
class Transition:
    source: str
    event: str
    dest: str
    guards: tuple[tuple[str, bool], ...]  # (guard name, value it must have)
    action: str | None

    def matches(self, valuation: Mapping[str, bool]) -> bool:
        return all(valuation[name] == want for name, want in self.guards)


@dataclass(frozen=True)
class Rejection:
    source: str
    event: str
    rule: str
    guards: tuple[tuple[str, bool], ...] = ()

    def matches(self, valuation: Mapping[str, bool]) -> bool:
        return all(valuation[name] == want for name, want in self.guards)


Outcome = Transition | Rejection


@dataclass(frozen=True)
class Failure:
    """What an event reports when its use does not succeed: `when` is the kind of use the
    backend failed, or "aborted" (a restart ended its generation first)."""

    when: str
    rule: str
    error: str  # the rule's error or a subclass of it (tests/core/test_spec.py checks)


@dataclass(frozen=True)
class Rule:
    id: str
    section: str
    text: str
    error: str | None
    seed: tuple[str, ...]  # the contract bullets (spec/SEED.md) the rule implements
    kept_by: str | None = None  # without an error: "deferring", "logging" or the refusing rule's ID

    @property
    def refused_as(self) -> str | None:
        """The rule ID a refused breach of this rule cites, or None when a breach is not refused."""
        if self.error is not None:
            return self.id
        return self.kept_by if self.kept_by not in KEEPERS else None


@dataclass(frozen=True)
class Access:
    """What one kind of use does to device bytes: reads/writes are None, "range" or "whole"."""

    use: str
    reads: str | None
    writes: str | None
    doc: str

    def does(self, mode: str) -> bool:
        return (self.reads if mode == "reads" else self.writes) is not None


@dataclass(frozen=True)
class Hazard:
    """A later use must follow an earlier one in flight when `earlier` and `later` (reads or
    writes) touch an overlapping byte."""

    name: str
    earlier: str
    later: str
    doc: str


@dataclass(frozen=True)
class Invariant:
    id: str
    text: str


@dataclass(frozen=True)
class Lifecycle:
    initial: str
    states: Mapping[str, State]
    events: Mapping[str, Event]
    guards: Mapping[str, str]
    transitions: tuple[Transition, ...]
    rejections: tuple[Rejection, ...]
    rules: Mapping[str, Rule]
    invariants: Mapping[str, Invariant]
    accesses: Mapping[str, Access]
    hazards: tuple[Hazard, ...]
    device_ordered: frozenset[tuple[str, str]]
    ordering_doc: str
    failures: Mapping[str, Failure]  # when -> what the event reports

    def hazard(self, earlier: str, later: str) -> str | None:
        """The hazard that makes a use of kind `later` follow an overlapping one of kind
        `earlier` still in flight (RAW, WAR, WAW), or None when they need no edge."""
        if (earlier, later) in self.device_ordered:
            return None
        first, then = self.accesses[earlier], self.accesses[later]
        return next((h.name for h in self.hazards if first.does(h.earlier) and then.does(h.later)), None)

    def outcomes(self, state: str, event: str) -> tuple[Outcome, ...]:
        """The candidates for (state, event) in the order they are tried: rejections first."""
        return tuple(r for r in self.rejections if (r.source, r.event) == (state, event)) + tuple(
            t for t in self.transitions if (t.source, t.event) == (state, event)
        )

    def decide(self, state: str, event: str, valuation: Mapping[str, bool]) -> Outcome:
        """The first candidate whose guards hold (validation guarantees there is one)."""
        return next(o for o in self.outcomes(state, event) if o.matches(valuation))

    def pairs(self) -> Iterator[tuple[str, str]]:
        """Every (state, event) pair, in spec order."""
        return itertools.product(self.states, self.events)

    def valuations(self) -> Iterator[dict[str, bool]]:
        """Every assignment of truth values to the guards."""
        names = sorted(self.guards)
        for values in itertools.product((False, True), repeat=len(names)):
            yield dict(zip(names, values, strict=True))


def guard_values(copies: int, computes: int) -> dict[str, bool]:
    """The guard vocabulary, evaluated on the counters before an event."""
    return {
        "last_copy": copies == 1,
        "last_compute": computes == 1,
        "no_copy": copies == 0,
        "no_compute": computes == 0,
    }


def _holds(pred: str, value: int) -> bool:
    return pred == "any" or (pred == "zero") == (value == 0)


def _guards(entry: Mapping[str, Any]) -> tuple[tuple[str, bool], ...]:
    return tuple((g.lstrip("!"), not g.startswith("!")) for g in entry.get("guards", []))


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def parse(data: Mapping[str, Any]) -> Lifecycle:
    """Build a Lifecycle from parsed TOML data and validate it."""
    try:
        states = {
            s["name"]: State(s["name"], s["doc"], dict(s.get("where", {})), bool(s.get("terminal", False)))
            for s in data["states"]
        }
        events = {
            e["name"]: Event(e["name"], e["doc"], e.get("counter"), int(e.get("delta", 0))) for e in data["events"]
        }
        guards = dict(data["guards"])
        transitions = tuple(
            Transition(
                source,
                t["event"],
                t["dest"],
                _guards(t),
                t.get("action"),
            )
            for t in data["transitions"]
            for source in _as_list(t["source"])
        )
        rejections = tuple(
            Rejection(source, event, r["rule"], _guards(r))
            for r in data["rejections"]
            for source, event in itertools.product(_as_list(r["source"]), _as_list(r["event"]))
        )
        rules: dict[str, Rule] = {}
        for r in data["rules"]:
            if r["id"] in rules:
                raise SpecError(f"rule {r['id']} is defined twice")
            seed = tuple(" ".join(b.split()) for b in _as_list(r["seed"]))
            rules[r["id"]] = Rule(r["id"], r["section"], r["text"], r.get("error"), seed, r.get("kept_by"))
        invariants = {i["id"]: Invariant(i["id"], i["text"]) for i in data["invariants"]}
        accesses = {a["use"]: Access(a["use"], a.get("reads"), a.get("writes"), a["doc"]) for a in data["accesses"]}
        hazards = tuple(Hazard(h["name"], h["earlier"], h["later"], h["doc"]) for h in data["hazards"])
        ordering = data["ordering"]
        device_ordered = frozenset((a, b) for a, b in ordering["device_ordered"])
        failures = {f["when"]: Failure(f["when"], f["rule"], f["error"]) for f in data["failures"]}
        lifecycle = Lifecycle(
            data["initial"], states, events, guards, transitions, rejections, rules, invariants,
            accesses, hazards, device_ordered, ordering["doc"], failures,
        )  # fmt: skip
    except KeyError as missing:
        raise SpecError(f"spec entry lacks the key {missing}") from None
    validate(lifecycle)
    return lifecycle


def validate(lc: Lifecycle) -> None:
    """Raise SpecError naming the first way in which `lc` is incomplete or unsound."""
    _check_names(lc)
    for state, event in lc.pairs():
        _check_pair(lc, state, event)
    _check_graph(lc)
    _check_invariants(lc)
    _check_ordering(lc)


def _check_names(lc: Lifecycle) -> None:
    if lc.initial not in lc.states:
        raise SpecError(f"initial state {lc.initial!r} is not a state")
    known_guards = set(guard_values(0, 0))
    if set(lc.guards) != known_guards:
        raise SpecError(f"guards must be exactly {sorted(known_guards)}, got {sorted(lc.guards)}")
    for s in lc.states.values():
        for key, pred in s.where.items():
            if key not in (*COUNTERS, "uses") or pred not in PREDICATES:
                raise SpecError(f"state {s.name}: bad where clause {key} = {pred!r}")
    for e in lc.events.values():
        if (e.counter is None) != (e.delta == 0) or (e.counter and e.counter not in COUNTERS):
            raise SpecError(f"event {e.name}: counter and delta must come together, on {COUNTERS}")
    for t in lc.transitions:
        if t.source not in lc.states or t.dest not in lc.states or t.event not in lc.events:
            raise SpecError(f"transition {t} names an unknown state or event")
        if any(g not in lc.guards for g, _ in t.guards) or (t.action and t.action not in ACTIONS):
            raise SpecError(f"transition {t} names an unknown guard or action")
    for rule in lc.rules.values():
        if not rule.seed or not rule.section:
            raise SpecError(f"rule {rule.id} needs a section and at least one seed clause")
        if (rule.error is None) == (rule.kept_by is None):
            raise SpecError(f"rule {rule.id} needs exactly one of `error` and `kept_by`")
        keeper = lc.rules.get(rule.kept_by or "")
        if rule.kept_by is not None and rule.kept_by not in KEEPERS and (keeper is None or keeper.error is None):
            raise SpecError(f"rule {rule.id}: kept_by must be one of {KEEPERS} or a rule with an error")
    for r in lc.rejections:
        if r.source not in lc.states or r.event not in lc.events or r.rule not in lc.rules:
            raise SpecError(f"rejection {r} names an unknown state, event or rule")
        if any(g not in lc.guards for g, _ in r.guards):
            raise SpecError(f"rejection {r} names an unknown guard")
    if set(lc.failures) != set(FAILING) or any(f.rule not in lc.rules for f in lc.failures.values()):
        raise SpecError(f"failures must name a known rule for each of {sorted(FAILING)}, got {dict(lc.failures)}")


def _check_pair(lc: Lifecycle, state: str, event: str) -> None:
    candidates = lc.outcomes(state, event)
    if not candidates:
        raise SpecError(f"({state}, {event}) is neither a transition nor a rejection")
    unguarded = [o for o in candidates if not o.guards]
    if len(unguarded) > 1 or (unguarded and unguarded[0] is not candidates[-1]):
        raise SpecError(f"({state}, {event}): only its last candidate may be unguarded")
    for valuation in lc.valuations():
        if not any(o.matches(valuation) for o in candidates):
            raise SpecError(f"({state}, {event}) has no outcome when guards are {valuation}")


def _check_graph(lc: Lifecycle) -> None:
    edges: dict[str, set[str]] = {s: set() for s in lc.states}
    for t in lc.transitions:
        edges[t.source].add(t.dest)
    reached = _closure(edges, {lc.initial})
    if unreached := set(lc.states) - reached:
        raise SpecError(f"states unreachable from {lc.initial}: {sorted(unreached)}")
    terminal = {s for s, st in lc.states.items() if st.terminal}
    for s in lc.states:
        if not _closure(edges, {s}) & terminal:
            raise SpecError(f"state {s} cannot reach a terminal state")


def _closure(edges: Mapping[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(start), list(start)
    while todo:
        for nxt in edges[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def _check_invariants(lc: Lifecycle) -> None:
    """Every transition, from any counters its source admits, lands on counters its dest admits."""
    for state, event in lc.pairs():
        ev = lc.events[event]
        for copies, computes in itertools.product(_COUNT_RANGE, _COUNT_RANGE):
            if not lc.states[state].admits(copies, computes):
                continue
            taken = lc.decide(state, event, guard_values(copies, computes))
            if isinstance(taken, Rejection):
                continue
            after = {"copies": copies, "computes": computes}
            if ev.counter:
                after[ev.counter] += ev.delta
            if min(after.values()) < 0 or not lc.states[taken.dest].admits(**after):
                raise SpecError(
                    f"{state} --{event}--> {taken.dest} breaks the counters' invariant "
                    f"(copies={copies}, computes={computes} -> {after})"
                )


def _check_ordering(lc: Lifecycle) -> None:
    for a in lc.accesses.values():
        if any(extent not in EXTENTS for extent in (a.reads, a.writes) if extent is not None):
            raise SpecError(f"access of {a.use}: reads and writes must be one of {sorted(EXTENTS)}")
    for h in lc.hazards:
        if h.earlier not in MODES or h.later not in MODES:
            raise SpecError(f"hazard {h.name}: earlier and later must be one of {MODES}")
    for pair in lc.device_ordered:
        if len(pair) != 2 or any(use not in lc.accesses for use in pair):
            raise SpecError(f"device_ordered pair {pair} names a use with no access entry")


def load(path: Path | str | None = None) -> Lifecycle:
    """Load and validate a lifecycle spec (the packaged one by default)."""
    if path is None:
        return _packaged()
    with open(path, "rb") as f:
        return parse(tomllib.load(f))


@cache
def _packaged() -> Lifecycle:
    with open(SPEC_PATH, "rb") as f:
        return parse(tomllib.load(f))
