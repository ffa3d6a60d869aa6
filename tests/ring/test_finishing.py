"""An output commit that finishes its input record (RING-7): the output's commit and the input's
release in one step, in one process and across processes, and a crash between the two halves
recovered as one."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from rules import refused
from test_shared_ring import ring_of, shared  # noqa: F401  (fixtures)

from devbridge import HostRange, HostRing
from devbridge.ring import shared as shared_ring
from devbridge.ring.host import record_range
from devbridge.ring.shared import SharedRing


class Died(BaseException):
    """The worker process dies here (no `except Exception` catches it)."""


def committed(ring: HostRing, data: bytes) -> int:
    r = ring.reserve(len(data))
    ring.write(r, data)
    return ring.commit(r)


def output(ring: HostRing, data: bytes) -> HostRange:
    o = ring.reserve(len(data))
    ring.write(o, data)
    return o


@pytest.fixture
def rings(ring_of: Callable[[int], HostRing]) -> Iterator[tuple[HostRing, HostRing]]:  # noqa: F811
    """An input ring with two records committed, and an output ring of the same kind."""
    inputs, outputs = ring_of(64), ring_of(64)
    assert [committed(inputs, b"in-0"), committed(inputs, b"in-1")] == [0, 1]
    yield inputs, outputs


@pytest.mark.holds("RING-7")
def test_an_output_commit_releases_the_input_it_finishes(rings: tuple[HostRing, HostRing]) -> None:
    inputs, outputs = rings
    r0 = inputs.take(timeout=1)
    assert outputs.commit(output(outputs, b"out-0"), finishes=r0) == 0
    assert inputs.cursor == 4  # r0 is gone; r1 waits to be taken
    got = outputs.take(timeout=1)
    assert (got.seq, bytes(outputs.view(got))) == (0, b"out-0")
    across = isinstance(outputs, SharedRing)
    assert outputs.finished(r0) == (0 if across else None)  # in one process: never delivered again
    r1 = inputs.take(timeout=1)
    assert outputs.finished(r1) is None
    assert outputs.commit(output(outputs, b"out-1"), finishes=r1) == 1
    assert inputs.cursor == inputs.head == 8


@pytest.mark.holds("RING-7")
@pytest.mark.parametrize("dies", ["before the output's commit", "between the output's commit and the release"])
def test_a_worker_dying_between_the_two_halves_is_recovered_as_one(
    shared: Callable[..., HostRing],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    dies: str,
) -> None:
    inputs, outputs = shared(64), shared(64)
    committed(inputs, b"in-0")
    worker_in, worker_out = HostRing.attach(inputs.name), HostRing.attach(outputs.name)  # type: ignore[attr-defined]
    assert isinstance(worker_in, SharedRing) and isinstance(worker_out, SharedRing)
    worker_in.consume()
    r0 = worker_in.take(timeout=1)
    o = output(worker_out, b"first")

    def death(ring: SharedRing, name: str) -> None:
        def died(*args: object) -> object:
            raise Died

        monkeypatch.setattr(ring, name, died)

    if dies == "before the output's commit":
        death(worker_out, "_commit_words")
    else:
        death(worker_in, "_release_slot")
    with pytest.raises(Died):
        worker_out.commit(o, finishes=r0)
    worker_in.close()  # the worker's process is gone: its locks with it
    worker_out.close()
    after_commit = dies != "before the output's commit"
    assert outputs.stats()["committed"] == after_commit  # type: ignore[attr-defined]

    # its replacement: the input comes again, known finished only when its output was committed
    again_in, again_out = HostRing.attach(inputs.name), HostRing.attach(outputs.name)  # type: ignore[attr-defined]
    again_in.consume()
    again = again_in.take(timeout=1)
    assert (again.seq, again.redelivered, bytes(again_in.view(again))) == (0, True, b"in-0")
    assert again_out.finished(again) == (0 if after_commit else None)
    assert again_out.commit(output(again_out, b"again"), finishes=again) == 0
    # exactly one output for input 0, whichever way it went; the second's bytes went back
    got = outputs.take(timeout=1)
    assert (got.seq, bytes(outputs.view(got))) == (0, b"first" if after_commit else b"again")
    outputs.release(got)
    assert outputs.stats() == {  # type: ignore[attr-defined]
        "committed": 1,
        "taken": 1,
        "generation": 1,
        "consumer_pid": os.getpid(),
        "redelivered": 0,
        "reclaimed": 0,
        "live": 0 if after_commit else 1,  # (the dead worker's reservation, until reclaimed)
    }
    assert inputs.stats()["live"] == 0 and inputs.cursor == inputs.head  # type: ignore[attr-defined]
    for ring in (again_in, again_out):
        ring.close()  # type: ignore[attr-defined]


def hung_worker(make: Callable[..., HostRing]) -> tuple[HostRing, ...]:
    """Rings with input 0 committed, a worker consuming them (old_in, old_out), and the attachment
    of its replacement (not consuming yet): inputs, outputs, old_in, old_out, new_in."""
    inputs, outputs = make(64), make(64)
    committed(inputs, b"in-0")
    old_in, old_out = HostRing.attach(inputs.name), HostRing.attach(outputs.name)  # type: ignore[attr-defined]
    old_in.consume()
    return inputs, outputs, old_in, old_out, HostRing.attach(inputs.name)  # type: ignore[attr-defined]


@pytest.mark.rejects("GEN-2")
def test_a_fenced_workers_finishing_commit_changes_neither_ring(shared: Callable[..., HostRing]) -> None:  # noqa: F811
    inputs, outputs, old_in, old_out, new_in = hung_worker(shared)
    r0 = old_in.take(timeout=1)
    o = output(old_out, b"late")
    new_in.consume()  # the hung worker's replacement
    before = (inputs.snapshot(), outputs.snapshot())
    with refused("GEN-2"):
        old_out.commit(o, finishes=r0)
    assert (inputs.snapshot(), outputs.snapshot()) == before
    assert outputs.finished(r0) is None
    again = new_in.take(timeout=1)
    assert (again.seq, again.redelivered) == (0, True)
    for ring in (old_in, old_out, new_in):
        ring.close()  # type: ignore[attr-defined]


@pytest.mark.rejects("RING-7")
def test_an_input_not_whole_and_taken_is_refused_and_nothing_changes(rings: tuple[HostRing, HostRing]) -> None:
    inputs, outputs = rings
    r0 = inputs.take(timeout=1)
    o = output(outputs, b"out")
    before = (inputs.snapshot(), outputs.snapshot())
    with refused("RING-7"):
        outputs.commit(o, finishes=record_range(inputs, _part_of(inputs, r0)))
    inputs.release(r0.sub(0, 1))  # uploaded with release=True: its first byte went
    before = (inputs.snapshot(), outputs.snapshot())
    with refused("RING-7"):
        outputs.commit(o, finishes=r0)
    assert (inputs.snapshot(), outputs.snapshot()) == before


def _part_of(ring: HostRing, r: HostRange) -> object:
    """A record-like of the first half of `r` (the same sequence number, half its bytes)."""
    record = ring._records[r.start]
    part = type(record)(record.start, record.start + 2, record.seq, record.slot)
    part.taken = record.taken
    return part


@pytest.mark.rejects("RING-3")
def test_an_input_a_copy_still_reads_is_refused(rings: tuple[HostRing, HostRing]) -> None:
    inputs, outputs = rings
    r0 = inputs.take(timeout=1)
    o = output(outputs, b"out")
    inputs.begin_read(r0)  # an upload in flight (the bridge's begin of an input copy)
    before = (inputs.snapshot(), outputs.snapshot())
    with refused("RING-3"):
        outputs.commit(o, finishes=r0)
    assert (inputs.snapshot(), outputs.snapshot()) == before
    inputs.end_read(r0, release=False)
    assert outputs.commit(o, finishes=r0) == 0


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("bad", ["a record of the other kind", "a reservation", "its own ring's record", "an int"])
def test_finishes_refuses_what_is_not_a_record_of_another_ring(
    rings: tuple[HostRing, HostRing],
    shared: Callable[..., HostRing],  # noqa: F811
    bad: str,
) -> None:
    inputs, outputs = rings
    inputs.take(timeout=1)
    committed(outputs, b"own")
    other = HostRing(64) if isinstance(outputs, SharedRing) else shared(64)
    committed(other, b"other")
    finishes: object = {
        "a record of the other kind": other.take(timeout=1),
        "a reservation": inputs.reserve(4),
        "its own ring's record": outputs.take(timeout=1),
        "an int": 0,
    }[bad]
    o = output(outputs, b"out")
    before = (inputs.snapshot(), outputs.snapshot())
    with refused("ARG-1"):
        outputs.commit(o, finishes=finishes)  # type: ignore[arg-type]
    assert (inputs.snapshot(), outputs.snapshot()) == before
    with refused("ARG-1"):
        outputs.finished(finishes)  # type: ignore[arg-type]


@pytest.mark.rejects("ARG-1")
def test_a_shared_rings_outputs_finish_one_rings_records(shared: Callable[..., HostRing]) -> None:  # noqa: F811
    first, second, outputs = shared(64), shared(64), shared(64)
    committed(first, b"a")
    committed(second, b"b")
    outputs.commit(output(outputs, b"A"), finishes=first.take(timeout=1))
    r = second.take(timeout=1)
    o = output(outputs, b"B")
    before = outputs.snapshot()
    with refused("ARG-1"):
        outputs.commit(o, finishes=r)
    assert outputs.snapshot() == before
    assert outputs.finished(r) is None  # (another ring's records: none finished here)


@pytest.mark.rejects("GEN-2")
def test_a_worker_replaced_while_it_waits_for_the_lock_finishes_nothing(
    shared: Callable[..., HostRing],  # noqa: F811
) -> None:
    """The hung worker passed its fence check and stopped before the segments' locks; its
    replacement took over meanwhile: under the locks it must find itself fenced."""
    inputs, outputs, old_in, old_out, new_in = hung_worker(shared)
    r0 = old_in.take(timeout=1)
    o = output(old_out, b"late")
    locks = (old_in._shared, old_out._shared)  # type: ignore[attr-defined]
    enter = type(locks[0]).__enter__
    before: list[object] = []

    def stopped_at_the_lock(self: object) -> None:
        if self in locks and not before:
            new_in.consume()
            before.append((inputs.snapshot(), outputs.snapshot()))
        enter(self)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(locks[0]), "__enter__", stopped_at_the_lock)
        with refused("GEN-2"):
            old_out.commit(o, finishes=r0)
    assert before and (inputs.snapshot(), outputs.snapshot()) == before[0]
    again = new_in.take(timeout=1)
    assert (again.seq, again.redelivered, bytes(new_in.view(again))) == (0, True, b"in-0")
    for ring in (old_in, old_out, new_in):
        ring.close()  # type: ignore[attr-defined]


class _DiesAt:
    """A segment's words whose write to word `index` kills the process first."""

    def __init__(self, words: memoryview, index: int) -> None:
        self.words, self.index = words, index

    def __getitem__(self, i: object) -> object:
        return self.words[i]  # type: ignore[index]

    def __setitem__(self, i: object, value: object) -> None:
        if i == self.index:
            raise Died
        self.words[i] = value  # type: ignore[index]


@pytest.mark.holds("RING-7")
def test_an_output_commit_that_died_before_its_commit_point_finished_nothing(
    shared: Callable[..., HostRing],  # noqa: F811
) -> None:
    """The source entry a dying commit wrote is never taken for a finished input: the output
    ring's table has wrapped, so that entry is the oldest one (of the output `records` ago)."""
    inputs, outputs = shared(64), shared(64, records=2)
    for k in range(3):
        committed(inputs, b"in-%d" % k)
    worker_in, worker_out = HostRing.attach(inputs.name), HostRing.attach(outputs.name)  # type: ignore[attr-defined]
    worker_in.consume()
    for k in range(2):  # outputs 0 and 1, each taken and released by the collector
        assert worker_out.commit(output(worker_out, b"out-%d" % k), finishes=worker_in.take(timeout=1)) == k
        outputs.release(outputs.take(timeout=1))
    r2 = worker_in.take(timeout=1)
    o = output(worker_out, b"out-2")
    worker_out._words = _DiesAt(worker_out._words, shared_ring._H_NEXT_SEQ)  # type: ignore[attr-defined]
    with pytest.raises(Died):
        worker_out.commit(o, finishes=r2)  # its source entry is written, its commit point is not
    worker_out._words = worker_out._words.words  # type: ignore[attr-defined]
    again_in = HostRing.attach(inputs.name)  # type: ignore[attr-defined]
    again_in.consume()
    again = again_in.take(timeout=1)
    assert (again.seq, again.redelivered) == (2, True)
    assert outputs.finished(again) is None  # not finished: its output was never committed
    assert outputs.commit(output(outputs, b"again"), finishes=again) == 2
    got = outputs.take(timeout=1)
    assert (got.seq, bytes(outputs.view(got))) == (2, b"again")
    for ring in (worker_in, worker_out, again_in):
        ring.close()  # type: ignore[attr-defined]
