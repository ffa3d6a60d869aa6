"""The records of a host ring as data: spec/ring.toml, loaded and checked against the rules.

A record's states and the transitions between them, each citing the rule it follows. The
shared ring takes its reservations' state words from here, the protocol's model checker moves
its reference only along these transitions (and reports which it covered), and `devbridge docs`
draws the section of CONTRACT.md on the ring from them.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from devbridge.spec import SpecError, _closure, load

RING_SPEC_PATH = Path(__file__).with_name("ring.toml")


@dataclass(frozen=True)
class RecordState:
    name: str
    doc: str
    slot: int  # the reservation's state word in a shared ring's segment
    terminal: bool


@dataclass(frozen=True)
class RecordTransition:
    source: str
    event: str
    dest: str
    rule: str
    doc: str


@dataclass(frozen=True)
class RingProtocol:
    initial: str
    states: dict[str, RecordState]
    transitions: tuple[RecordTransition, ...]

    def next(self, state: str, event: str) -> str | None:
        """Where `event` takes a record in `state`, or None when no transition allows it."""
        for t in self.transitions:
            if (t.source, t.event) == (state, event):
                return t.dest
        return None

    def slot(self, state: str) -> int:
        return self.states[state].slot


def parse_ring(data: dict[str, Any]) -> RingProtocol:
    """A RingProtocol from parsed TOML, checked: known states and rules, one transition per
    (state, event), every state reachable from the initial one, terminal states final, and the
    slot values telling live, released and reclaimed apart."""
    try:
        states = {
            s["name"]: RecordState(s["name"], s["doc"], int(s["slot"]), bool(s.get("terminal", False)))
            for s in data["states"]
        }
        transitions = tuple(
            RecordTransition(t["source"], t["event"], t["dest"], t["rule"], t["doc"]) for t in data["transitions"]
        )
        protocol = RingProtocol(data["initial"], states, transitions)
    except (KeyError, TypeError, ValueError) as e:
        raise SpecError(f"ring spec: {e!r}") from e
    rules = load().rules
    if protocol.initial not in states:
        raise SpecError(f"ring spec: the initial state {protocol.initial!r} is not a state")
    pairs = [(t.source, t.event) for t in transitions]
    if len(set(pairs)) != len(pairs):
        raise SpecError("ring spec: two transitions leave one state on one event")
    for t in transitions:
        if t.source not in states or t.dest not in states:
            raise SpecError(f"ring spec: transition {t} names an unknown state")
        if t.rule not in rules:
            raise SpecError(f"ring spec: transition {t} cites an unknown rule")
        if states[t.source].terminal:
            raise SpecError(f"ring spec: terminal state {t.source} has a transition")
    edges: dict[str, set[str]] = {name: set() for name in states}
    for t in transitions:
        edges[t.source].add(t.dest)
    reached = _closure(edges, {protocol.initial})
    if reached != set(states):
        raise SpecError(f"ring spec: states {sorted(set(states) - reached)} cannot be reached")
    live = {s.slot for s in states.values() if not s.terminal}
    if len(live) != 1 or len({s.slot for s in states.values()}) != 1 + sum(s.terminal for s in states.values()):
        raise SpecError("ring spec: live states share one slot value; each terminal state has its own")
    return protocol


def load_ring(path: Path | str | None = None) -> RingProtocol:
    """The ring's record protocol (the packaged spec/ring.toml by default, read once)."""
    return _load(Path(path or RING_SPEC_PATH))


@cache
def _load(path: Path) -> RingProtocol:
    with open(path, "rb") as f:
        return parse_ring(tomllib.load(f))
