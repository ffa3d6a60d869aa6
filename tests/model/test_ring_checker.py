"""The bounded model checker of the shared ring's protocol (models/ring_checker.py): within the CI
bound it explores every interleaving of producers, a consumer, its replacement and the fenced
old one, with a crash before every word write, and finds nothing; each seeded protocol bug is
caught by the rule it breaks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from devbridge.models.ring_checker import RING_PROFILES, RingBound, check_ring
from devbridge.ring import shared as shared_ring
from devbridge.ring.host import HostRange, HostRing
from devbridge.ring.shared import SharedRing
from devbridge.spec import SpecError
from devbridge.spec.ring import RING_SPEC_PATH, load_ring, parse_ring

FINISH = ("taken", "finish")


@pytest.mark.holds("RING-1", "RING-4", "RING-5", "RING-6", "RING-7", "GEN-2")
@pytest.mark.parametrize("profile", ["ci", "finish"])
def test_the_ring_protocol_holds_with_a_crash_possible_at_every_step(profile: str) -> None:
    bound = RING_PROFILES[profile]
    assert (bound.producers, bound.restarts, bound.crashes) == (2, 1, 2)
    result = check_ring(bound)
    assert result.violation is None, str(result.violation)
    assert result.states >= 5000 and result.paths > 100
    every = {(t.source, t.event) for t in load_ring().transitions}
    # the reference moved along the transitions of spec/ring.toml, and only along those: `ci`
    # along every one but the finish (its consumers only release), `finish` along that too
    if profile == "ci":
        assert result.actions == {"reserve", "commit", "take", "release", "consume", "reclaim"}
        assert result.transitions == every - {FINISH}
    else:
        assert result.actions == {"reserve", "commit", "take", "release", "finish", "consume", "reclaim"}
        assert FINISH in result.transitions and result.transitions <= every


@pytest.mark.holds("RING-1", "RING-4", "RING-5", "RING-6", "GEN-2")
@pytest.mark.parametrize(("profile", "least"), [("tight", 3000), ("deep", 6000)])
def test_the_ring_protocol_holds_with_slots_reused_at_once_and_records_out_of_order(profile: str, least: int) -> None:
    """Two slots: each reservation takes the slot of one just released (`tight`, two crashes a
    path), and paths long enough for two producers' commits and the consumer's releases out of
    order to write over the commit-table entry of a record still held (`deep`, one crash)."""
    bound = RING_PROFILES[profile]
    assert (bound.producers, bound.records, bound.slots, bound.restarts) == (2, 2, 2, 1)
    result = check_ring(bound)
    assert result.violation is None, str(result.violation)
    assert result.states >= least
    assert result.transitions == {(t.source, t.event) for t in load_ring().transitions} - {FINISH}


def _skip_one_on_redelivery(self: SharedRing) -> tuple[int, int]:
    take_seq, until = _ORIGINAL["_rewind"](self)
    rewound = take_seq < self._words[shared_ring._H_TAKE_SEQ]
    return (take_seq + 1, until) if rewound else (take_seq, until)


def _reclaim_committed_too(self: SharedRing) -> int:
    tail, count = self._window()
    dead = [
        i
        for i in range(tail, count)
        if self._slot(i)[5] == shared_ring._RESERVED and not self.alive(*self._slot(i)[2:4])
    ]
    if dead:
        tail = self._live_window(*dead)[0]
        for index in dead:
            self._set_state(index, shared_ring._RECLAIMED)
        self._words[shared_ring._H_TAIL] = tail
    return len(dead)


def _release_fenced_too(self: SharedRing, r: HostRange) -> None:
    consumer, self._consumer = self._consumer, None
    try:
        HostRing.release(self, r)
    finally:
        self._consumer = consumer


def _release_then_commit(self: SharedRing, r: HostRange, finishes: HostRange) -> int:
    """The two halves in the wrong order, as two steps: the input's release, then the output."""
    finishes.ring.release(finishes)
    return self.commit(r)


def _forget_what_was_finished(self: SharedRing, seq: int) -> None:
    return None


def _rewind_by_the_commit_table(self: SharedRing) -> tuple[int, int]:
    """A new consumer rewinds to the records taken and not released that the commit table still
    names (an entry is written over once `slots` more records are committed)."""
    _, take_seq, until = self._take_words()
    lowest = take_seq
    tail, count = self._window()
    for index in range(tail, count):
        _, _, _, _, seq, state = self._slot(index)
        named = self._words[self._commits_at + seq % self._slots] == index
        if state == shared_ring._RESERVED and 0 <= seq < lowest and named:
            lowest = seq
    return lowest, max(until, take_seq) if lowest < take_seq else until


def _a_record_by_the_commit_table(self: SharedRing, index: int, seq: int, untaken: set[int]) -> bool:
    """A reservation with a number is a record only while the commit table's entry for the
    number names it."""
    named = self._words[self._commits_at + seq % self._slots] == index
    return (0 <= seq < self._words[shared_ring._H_NEXT_SEQ] and named) or (seq == -1 and index in untaken)


class _TailWordLast:
    """A segment's words whose tail word, when written, is written just before the count word."""

    def __init__(self, words: Any) -> None:
        self.words, self.tail = words, None

    def __getitem__(self, i: Any) -> Any:
        return self.words[i]

    def __setitem__(self, i: int, value: int) -> None:
        if i == shared_ring._H_TAIL:
            self.tail = value
            return
        if i == shared_ring._H_COUNT and self.tail is not None:
            self.words[shared_ring._H_TAIL] = self.tail
        self.words[i] = value


def _slot_before_the_tail_word(self: SharedRing, n: int, me: tuple[int, int]) -> tuple[int, int] | None:
    """A reservation writes its slot before the tail word: a tail word a lap behind (its
    releaser died before writing it) names the slot while it is rewritten."""
    words, self._words = self._words, _TailWordLast(self._words)  # type: ignore[assignment]
    try:
        return _ORIGINAL["_reserve_now"](self, n, me)
    finally:
        self._words = words


_ORIGINAL: dict[str, Callable[..., Any]] = {"_rewind": SharedRing._rewind, "_reserve_now": SharedRing._reserve_now}
SEEDED = {
    "a redelivery that skips a record": ({"_rewind": _skip_one_on_redelivery}, "ci", "RING-5"),
    "a reclaim of a committed range": ({"_reclaim_dead": _reclaim_committed_too}, "ci", "RING-6"),
    "a fenced consumer's release accepted": ({"release": _release_fenced_too}, "ci", "GEN-2"),
    "an input released before its output is committed": (
        {"_commit_finishing": _release_then_commit},
        "finish",
        "RING-7",
    ),
    "a record finished before a crash finished again": (
        {"_finished_at": _forget_what_was_finished},
        "finish",
        "RING-7",
    ),
    "a rewind that trusts the commit table": ({"_rewind": _rewind_by_the_commit_table}, "deep", "RING-5"),
    "a reclaim that trusts the commit table": ({"_is_record": _a_record_by_the_commit_table}, "deep", "RING-6"),
    "a reservation's slot written before the tail word": (
        {"_reserve_now": _slot_before_the_tail_word},
        "tight",
        "RING-1",
    ),
}


@contextmanager
def seeded(patches: dict[str, Callable[..., Any]]) -> Iterator[None]:
    saved = {name: vars(SharedRing).get(name) for name in patches}  # (None: inherited from HostRing)
    for name, bug in patches.items():
        setattr(SharedRing, name, bug)
    try:
        yield
    finally:
        for name, method in saved.items():
            if method is None:
                delattr(SharedRing, name)
            else:
                setattr(SharedRing, name, method)


@pytest.mark.parametrize("bug", sorted(SEEDED))
def test_each_seeded_protocol_bug_is_caught_by_the_rule_it_breaks(bug: str) -> None:
    patches, profile, rule = SEEDED[bug]
    with seeded(patches):
        result = check_ring(RING_PROFILES[profile])
    assert result.violation is not None, f"{bug}: not caught in {result.states} states"
    assert result.violation.rule == rule, str(result.violation)
    assert result.violation.path  # a path of actions that leads to it, shortest first


def test_a_bound_of_no_counts_is_refused() -> None:
    with pytest.raises(ValueError, match="counts"):
        RingBound(producers=0)
    with pytest.raises(ValueError, match="hold a record"):
        RingBound(capacity=4)


def _spec_with(edit: Callable[[str], str], tmp_path: Any) -> Any:
    path = tmp_path / "ring.toml"
    path.write_text(edit(RING_SPEC_PATH.read_text()))
    return path


@pytest.mark.parametrize(
    ("edit", "complaint"),
    [
        (lambda t: t.replace('rule = "RING-6"', 'rule = "RING-99"'), "unknown rule"),
        (lambda t: t.replace('dest = "reclaimed"', 'dest = "lost"'), "unknown state"),
        (lambda t: t.replace('event = "reclaim"', 'event = "commit"'), "two transitions"),
        (lambda t: t.replace("slot = 3", "slot = 2"), "slot value"),
        (lambda t: t.replace('initial = "reserved"', 'initial = "taken"'), "cannot be reached"),
    ],
)
def test_the_ring_spec_refuses_an_unsound_protocol(edit: Callable[[str], str], complaint: str, tmp_path: Any) -> None:
    path = _spec_with(edit, tmp_path)
    with pytest.raises(SpecError, match=complaint):
        load_ring(path)


def test_the_shared_rings_state_words_come_from_the_ring_spec() -> None:
    ring = load_ring()
    assert (
        ring.slot("reserved"),
        ring.slot("released"),
        ring.slot("reclaimed"),
    ) == (shared_ring._RESERVED, shared_ring._RELEASED, shared_ring._RECLAIMED)
    assert {ring.slot(s) for s in ("reserved", "committed", "taken")} == {shared_ring._RESERVED}
    with pytest.raises(SpecError, match="ring spec"):
        parse_ring({"initial": "reserved"})  # no states, no transitions
