"""Records through a ring (RING-4, RING-5), in one process and across processes in shared memory,
the fence of a replaced consumer (GEN-2), dead producers' reservations (RING-6), and the
segment as a boundary (SHM-1)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import ring_procs
import test_ring
from hypothesis import given, settings
from hypothesis import strategies as st
from rules import refused

from devbridge import (
    Bridge,
    BridgeError,
    DeviceRange,
    HostRange,
    HostRing,
    InvalidArgumentError,
    ObjectSpec,
    RangeError,
    RingCorruptError,
    StaleHandleError,
    WaitTimeoutError,
)
from devbridge.ring.host import made_range
from devbridge.ring.segment import SHM_DIR
from devbridge.ring.shared import SharedRing
from devbridge.testing import FakeBackend

SPAWN = multiprocessing.get_context("spawn")
_made = iter(range(1 << 30))


def ring_name() -> str:
    return f"devbridge-test-{os.getpid()}-{next(_made)}"


@pytest.fixture
def shared() -> Iterator[Callable[..., HostRing]]:
    """Makes shared rings; unlinks every one at the end (a test that left one fails)."""
    names: list[str] = []

    def make(capacity: int, **kwargs: int) -> HostRing:
        names.append(ring_name())
        return HostRing.create(names[-1], capacity, **kwargs)

    yield make
    for name in names:
        path = Path(SHM_DIR, name)
        if path.exists():
            path.unlink()


@pytest.fixture(params=["in-process", "shared"])
def ring_of(request: pytest.FixtureRequest, shared: Callable[..., HostRing]) -> Callable[[int], HostRing]:
    """Either kind of ring: the same methods, the same rules."""
    return HostRing if request.param == "in-process" else shared


def fill(ring: HostRing, data: bytes) -> HostRange:
    r = ring.reserve(len(data))
    ring.write(r, data)
    return r


# ---------------------------------------------------------------- one process


@pytest.mark.holds("RING-4")
def test_records_are_taken_in_commit_order_with_their_bytes(ring_of: Callable[[int], HostRing]) -> None:
    ring = ring_of(64)
    a, b, c = fill(ring, b"aaaa"), fill(ring, b"bbbbbbbb"), fill(ring, b"cc")
    assert [ring.commit(c), ring.commit(a), ring.commit(b)] == [0, 1, 2]
    taken = [ring.take(timeout=1) for _ in range(3)]
    assert [(r.start, r.nbytes, r.seq, r.redelivered) for r in taken] == [
        (12, 2, 0, False),
        (0, 4, 1, False),
        (4, 8, 2, False),
    ]
    assert [bytes(ring.view(r)) for r in taken] == [b"cc", b"aaaa", b"bbbbbbbb"]
    for r in taken:
        ring.release(r)
    assert ring.cursor == ring.head == 14 and ring.unreleased() == []
    assert ring.generation == 1  # the first take made this ring's first consumer


@pytest.mark.rejects("RING-4")
def test_a_committed_range_is_nobodys_until_taken(ring_of: Callable[[int], HostRing]) -> None:
    ring = ring_of(64)
    r, other = fill(ring, b"0123456789"), fill(ring, b"xy")
    ring.commit(r)
    before = ring.snapshot()
    for call in (
        ring.view,
        ring.release,
        ring.commit,
        partial(ring.check_copy, into_device=True),
        partial(ring.check_copy, into_device=False),
    ):
        with refused("RING-4"):
            call(r)
    with refused("RING-4"):
        ring.write(r, b"9876543210")
    with refused("RING-4"):
        ring.commit(other.sub(0, 1))  # a part of a reservation
    assert ring.snapshot() == before
    taken = ring.take(timeout=1)
    assert (taken, bytes(ring.view(taken))) == (r, b"0123456789")


@pytest.mark.rejects("RING-4")
def test_a_committed_range_is_never_copied_before_it_is_taken(ring_of: Callable[[int], HostRing]) -> None:
    fake = FakeBackend()
    bridge, ring = Bridge(fake), ring_of(64)
    handle = bridge.alloc_device(ObjectSpec("x", "uint8"), 8)
    r = fill(ring, b"abcdefgh")
    ring.commit(r)
    calls = len(fake.calls)
    with refused("RING-4"):
        bridge.host_to_device(r, DeviceRange(handle, 0, 8))
    with refused("RING-4"):
        bridge.device_to_host(DeviceRange(handle, 0, 8), r)
    assert len(fake.calls) == calls


@pytest.mark.holds("WAIT-1")
def test_take_waits_for_a_commit_and_gives_up_at_its_timeout(ring_of: Callable[[int], HostRing]) -> None:
    ring = ring_of(64)
    t0 = time.monotonic()
    with pytest.raises(WaitTimeoutError) as info:
        ring.take(timeout=0.05)
    assert info.value.rule == "WAIT-1" and time.monotonic() - t0 >= 0.05
    r = fill(ring, b"late")
    threading.Timer(0.05, ring.commit, (r,)).start()
    got = ring.take(timeout=5)
    assert (got.seq, bytes(ring.view(got))) == (0, b"late")


@pytest.mark.holds("RING-5")
def test_a_new_consumer_gets_what_the_old_one_did_not_release_whole_first(shared: Callable[..., HostRing]) -> None:
    ring = shared(64)
    old, new = HostRing.attach(ring.name), HostRing.attach(ring.name)  # type: ignore[attr-defined]
    records = [fill(ring, bytes([65 + i]) * 8) for i in range(4)]
    for r in records:
        ring.commit(r)
    assert old.consume() == 1
    first, second, third = old.take(timeout=1), old.take(timeout=1), old.take(timeout=1)
    old.release(second)  # done with
    old.release(first.sub(0, 4))  # half done: the record's bytes stay held
    assert new.consume() == 2
    again = [new.take(timeout=1) for _ in range(3)]
    assert [(r.seq, r.redelivered) for r in again] == [(0, True), (2, True), (3, False)]
    assert [bytes(new.view(r)) for r in again] == [b"A" * 8, b"C" * 8, b"D" * 8]  # whole, exact
    assert (third.start, third.nbytes, third.seq) == (again[1].start, again[1].nbytes, again[1].seq)
    for r in again:
        new.release(r)
    assert ring.cursor == ring.head == 32
    assert ring.stats()["redelivered"] == 2  # type: ignore[attr-defined]
    for attached in (old, new):
        attached.close()


@pytest.mark.rejects("RING-5", "GEN-2")
def test_a_replaced_consumer_is_fenced_and_changes_nothing(shared: Callable[..., HostRing]) -> None:
    ring = shared(64)
    old, new = HostRing.attach(ring.name), HostRing.attach(ring.name)  # type: ignore[attr-defined]
    fake = FakeBackend()
    bridge = Bridge(fake)
    handle = bridge.alloc_device(ObjectSpec("x", "uint8"), 8)
    for i in range(2):
        ring.commit(fill(ring, bytes([48 + i]) * 8))
    old.consume()
    held = old.take(timeout=1)
    new.consume()
    before, calls = ring.snapshot(), len(fake.calls)
    with refused("RING-5", StaleHandleError):
        old.release(held)
    for call in (old.take, old.consume):
        with refused("GEN-2"):
            call()
    for touch in (old.view, partial(old.check_copy, into_device=True), partial(old.check_copy, into_device=False)):
        with refused("GEN-2"):
            touch(held)
    with refused("GEN-2"):
        bridge.host_to_device(held, DeviceRange(handle, 0, 8))
    with refused("GEN-2"):
        bridge.device_to_host(DeviceRange(handle, 0, 8), held)
    assert ring.snapshot() == before and len(fake.calls) == calls
    assert [(r.seq, r.redelivered) for r in (new.take(timeout=1), new.take(timeout=1))] == [(0, True), (1, False)]
    old.close()
    new.close()


@pytest.mark.holds("GEN-2")
def test_a_fenced_consumers_copy_in_flight_releases_nothing(shared: Callable[..., HostRing]) -> None:
    ring = shared(64)
    old, new = HostRing.attach(ring.name), HostRing.attach(ring.name)  # type: ignore[attr-defined]
    fake = FakeBackend()
    bridge = Bridge(fake)
    handle = bridge.alloc_device(ObjectSpec("x", "uint8"), 8)
    ring.commit(fill(ring, b"inflight"))
    old.consume()
    r = old.take(timeout=1)
    event = bridge.host_to_device(r, DeviceRange(handle, 0, 8), sync=False)
    new.consume()
    fake.complete_all()
    event.wait(1)
    again = new.take(timeout=1)  # the old copy's completion released nothing
    assert (again.seq, again.redelivered, bytes(new.view(again))) == (0, True, b"inflight")
    new.release(again)
    assert ring.cursor == ring.head
    old.close()
    new.close()


# ---------------------------------------------------------------- the ring rules, on a shared ring


def _cases(test: Callable[..., None]) -> list[dict[str, object]]:
    """The arguments of each case of a test of test_ring.py (one case: no arguments)."""
    cases: list[dict[str, object]] = [{}]
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "parametrize":
            names = mark.args[0] if isinstance(mark.args[0], tuple) else tuple(mark.args[0].split(","))
            values = [v if len(names) > 1 else (v,) for v in mark.args[1]]
            cases = [{**c, **dict(zip(names, v, strict=True))} for c in cases for v in values]
    return cases


_UNCHANGED = [
    (name, case)
    for name, test in vars(test_ring).items()
    if name.startswith("test_")
    and any(
        m.name in ("holds", "rejects") and set(m.args) & {"RING-1", "RING-2"} for m in getattr(test, "pytestmark", [])
    )
    and "_wait_for_room" not in (test.__doc__ or "")  # (the in-process ring's own waiting)
    for case in _cases(test)
]


@pytest.mark.holds("RING-1", "RING-2")
@pytest.mark.parametrize(("name", "case"), _UNCHANGED, ids=[f"{n}{list(c.values())}" for n, c in _UNCHANGED])
def test_the_ring_tests_pass_unchanged_on_a_shared_ring(
    name: str, case: dict[str, object], monkeypatch: pytest.MonkeyPatch, shared: Callable[..., HostRing]
) -> None:
    """Each RING-1 and RING-2 test of test_ring.py, every case of it, run as it is with
    HostRing(capacity) making a ring in shared memory."""
    monkeypatch.setattr(test_ring, "HostRing", lambda capacity: shared(capacity))
    getattr(test_ring, name)(**case)


def test_the_unchanged_ring_tests_are_every_ring_1_and_ring_2_test() -> None:
    names = {name for name, _ in _UNCHANGED}
    assert len(names) == 12 and len(_UNCHANGED) == 23
    assert {"test_cursor_is_monotone_and_stops_at_the_first_unreleased_byte", "test_bad_reservation_sizes"} <= names


# ---------------------------------------------------------------- dead and live producers


@pytest.mark.holds("RING-6")
def test_a_dead_producers_reservation_is_reclaimed_and_its_commits_delivered(shared: Callable[..., HostRing]) -> None:
    ring = shared(64)
    committed = fill(ring, b"kept")
    ring.commit(committed)
    child = SPAWN.Process(target=ring_procs.reserve_and_die, args=(ring.name, 40, False))  # type: ignore[attr-defined]
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert ring.cursor == 0 and ring.head == 44
    got = ring.take(timeout=1)  # a dead producer's commits are delivered as usual
    assert (got.seq, bytes(ring.view(got))) == (0, b"kept")
    ring.release(got)
    assert ring.cursor == 4  # behind the dead one's 40 B
    r = ring.reserve(30, timeout=5)  # waits, finds them, reclaims them
    assert r.start == 64 and ring.stats()["reclaimed"] == 1  # type: ignore[attr-defined]
    ring.release(r)
    assert ring.cursor == ring.head == 94


def test_bytes_a_process_does_not_hold_are_refused_naming_whose_they_are(shared: Callable[..., HostRing]) -> None:
    """A producer touching bytes it handed over is told where they are (RING-4): committed and
    not taken, taken by the consumer, or by then another process's reservation."""
    ring = shared(32)
    other = HostRing.attach(ring.name)  # type: ignore[attr-defined]
    consumer = HostRing.attach(ring.name)  # type: ignore[attr-defined]
    r = fill(ring, b"x" * 16)
    ring.commit(r)
    with refused("RING-4", RangeError, match="are a committed record, not taken yet, not this process's"):
        ring.view(r)
    taken = consumer.take(timeout=1)
    with refused("RING-4", RangeError, match="are a record the consumer took, not this process's"):
        ring.view(r)
    consumer.release(taken)
    other.reserve(16)  # [16, 32)
    again = other.reserve(16)  # [32, 48): the bytes of `r`, a lap later
    assert again.start % 32 == r.start
    with refused("RING-4", RangeError, match="are another process's reservation, not this process's"):
        ring.view(made_range(ring, r.start + 32, 16))
    for attached in (other, consumer):
        attached.close()


def test_a_consumer_waiting_in_take_learns_of_a_replacement_that_died_before_waking_it(
    shared: Callable[..., HostRing],
) -> None:
    """A replacement killed between its generation write and its wake-up leaves the old consumer
    asleep in `take`: it looks again every FENCE_EVERY_S (250 ms), and then raises GEN-2."""
    ring = shared(64)
    assert isinstance(ring, SharedRing)
    ring.consume()
    words = _words_of(ring.name)
    # (the header's generation word, written as a consume() killed right after it leaves it)
    scribbler = threading.Timer(0.1, words.__setitem__, (9, words[9] + 1))
    scribbler.start()
    t0 = time.monotonic()
    with refused("GEN-2", StaleHandleError):
        ring.take(timeout=1.0)
    waited = time.monotonic() - t0
    scribbler.join()
    words.release()
    assert 0.1 <= waited < 0.8


def test_a_reservation_waiting_for_room_gets_it_soon_after_the_producer_holding_it_dies(
    shared: Callable[..., HostRing],
) -> None:
    """A waiting `reserve` looks for dead producers every RECLAIM_EVERY_S (50 ms), not only when
    it starts: a producer killed while another waits for its room frees it within a few looks."""
    ring = shared(64)
    child = SPAWN.Process(target=ring_procs.reserve_and_die, args=(ring.name, 60, True))  # type: ignore[attr-defined]
    child.start()
    try:
        deadline = time.monotonic() + 30
        while ring.head != 60 and time.monotonic() < deadline:  # (its reservation made)
            time.sleep(0.01)
        assert ring.head == 60
        killer = threading.Timer(0.2, os.kill, (child.pid, signal.SIGKILL))
        killer.start()
        t0 = time.monotonic()
        r = ring.reserve(30, timeout=1.0)  # its first look finds the producer alive
        waited = time.monotonic() - t0
        killer.join()
        assert 0.2 <= waited < 0.8 and r.start == 64 and ring.stats()["reclaimed"] == 1  # type: ignore[attr-defined]
        ring.release(r)
    finally:
        child.kill()
        child.join(30)


@pytest.mark.rejects("RING-6")
def test_a_live_producers_reservation_is_never_reclaimed(shared: Callable[..., HostRing]) -> None:
    ring = shared(64)
    child = SPAWN.Process(target=ring_procs.reserve_and_die, args=(ring.name, 40, True))  # type: ignore[attr-defined]
    child.start()
    try:
        deadline = time.monotonic() + 30
        while ring.head != 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(child.pid or 0, signal.SIGSTOP)  # stopped, not dead
        with refused("RING-6"):
            ring.reserve(40, timeout=0.2)
        assert ring.reclaim() == 0 and ring.cursor == 0  # type: ignore[attr-defined]
    finally:
        child.kill()
        child.join(30)
    assert ring.reclaim() == 1 and ring.cursor == ring.head == 40  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the segment is a boundary


@pytest.mark.rejects("SHM-1")
def test_attach_refuses_what_is_not_a_devbridge_ring_of_this_users_alone(tmp_path: Path) -> None:
    """Each way a name can fail to be this user's ring is refused as SHM-1, saying which."""
    names = [ring_name() for _ in range(14)]
    paths = [Path(SHM_DIR, n) for n in names]
    header = (0x474E495242564544).to_bytes(8, "little") + (2).to_bytes(8, "little")  # DEVBRING, layout 2

    def ring_header(capacity: int, slots: int, data: int, ring_id: int) -> bytes:
        words = [capacity, slots, data, *[0] * 14, ring_id]  # (words 2 to 4, then 5 to 18; the identity 19)
        return header + b"".join(w.to_bytes(8, "little") for w in words)

    try:
        paths[0].write_bytes(os.urandom(8192))  # random bytes: no magic
        ring = HostRing.create(names[1], 64)
        ring.close()
        os.chmod(paths[1], 0o644)  # a ring others could read
        paths[2].symlink_to(tmp_path)  # a link
        paths[3].write_bytes(b"\0" * 16)  # a ring's header, cut short
        paths[4].write_bytes(ring_header(64, 4, 4096, 7).ljust(256, b"\0"))  # a header and no tables
        paths[5].write_bytes(ring_header(64, 4, 8192, 7).ljust(4096 + 64, b"\0"))  # tables at the wrong place
        paths[6].write_bytes(ring_header(64, 4, 4096, 0).ljust(4096 + 64, b"\0"))  # no identity
        paths[7].write_bytes(ring_header(64, 4, 4096, 1).ljust(4096 + 64, b"\0"))  # a ring's header: attaches
        paths[8].write_bytes(ring_header(0, 4, 4096, 7).ljust(4096, b"\0"))  # no bytes
        paths[9].write_bytes(ring_header(64, 0, 4096, 7).ljust(4096 + 64, b"\0"))  # no records
        paths[10].write_bytes(ring_header((1 << 40) + 1, 4, 4096, 7).ljust(4096, b"\0"))  # past the largest
        paths[11].write_bytes(ring_header(64, (1 << 20) + 1, 84 << 20, 7).ljust(4096, b"\0"))  # too many records
        paths[12].write_bytes(ring_header(1 << 40, 4, 4096, 7).ljust(4096, b"\0"))  # the largest, in a page
        paths[13].write_bytes(ring_header(64, 4, 4096, 1 << 62).ljust(4096 + 64, b"\0"))  # an identity too large
        for path in (paths[0], *paths[3:]):
            os.chmod(path, 0o600)
        said = {
            0: "is not a devbridge ring",
            1: "is not this user's alone",
            2: "cannot be opened as a ring",
            3: "is 16 B: too short for a ring",
            4: "is 256 B, not the 4160 B its header says",
            5: "header holds no ring's sizes",
            6: "header holds no ring's identity",
            **dict.fromkeys(range(8, 12), "header holds no ring's sizes"),
            12: f"is 4096 B, not the {4096 + (1 << 40)} B its header says",
            13: "header holds no ring's identity",
        }
        for k, message in said.items():
            with refused("SHM-1", RingCorruptError, match=re.escape(message)):
                HostRing.attach(names[k])
        open_files = set()  # what this process's file descriptors point at now
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # (one closed meanwhile, by another thread)
                open_files.add(os.readlink(f"/proc/self/fd/{fd}"))
        assert not open_files & {str(path) for path in paths}  # a refused segment's file is closed
        HostRing.attach(names[7]).close()
    finally:
        for path in paths:
            if path.exists() or path.is_symlink():
                path.unlink()


def test_a_segments_header_says_what_it_is_and_another_layout_is_refused_by_name(
    shared: Callable[..., HostRing],
) -> None:
    """What an operator sees in /dev/shm: a ring's first 8 bytes spell DEVBRING, the next word is
    its layout version (2). A segment of another version (an older devbridge's) is refused with
    both versions named, before anything else of it is read."""
    ring = shared(64)
    assert isinstance(ring, SharedRing)
    path = Path(SHM_DIR, ring.name)
    header = path.read_bytes()[:16]
    assert header[:8] == b"DEVBRING" and int.from_bytes(header[8:], "little") == 2
    with open(path, "r+b") as f:
        f.seek(8)
        f.write((1).to_bytes(8, "little"))
    with refused("SHM-1", RingCorruptError, match="has ring layout 1; this devbridge reads 2"):
        HostRing.attach(ring.name)
    ring.close()


def test_the_futex_system_call_numbers_are_the_kernels() -> None:
    """Linux's numbers of futex: arch/x86/entry/syscalls/syscall_64.tbl, the generic table
    aarch64 uses (include/uapi/asm-generic/unistd.h), arch/powerpc/kernel/syscalls/syscall.tbl
    and arch/s390/kernel/syscalls/syscall.tbl. (On this machine a wait's tests use its own.)"""
    from devbridge.ring import segment

    assert segment.FUTEX_SYSCALLS == {"x86_64": 202, "aarch64": 98, "ppc64le": 221, "s390x": 238}


def test_layout_2_word_by_word(shared: Callable[..., HostRing]) -> None:
    """Layout 2, as another version must read it: a header of 32 words, the commit table (a word
    per record), the slot table (8 words per record: start, size, pid, start time, check word,
    sequence number, state, bytes freed; states 1 reserved, 2 released, 3 reclaimed), the source
    table, the data at the next page. A change to any of it is a new layout version."""
    ring = shared(256, records=4)
    assert isinstance(ring, SharedRing)
    ring.process = (1 << 30, 1)  # (an identity of its own: the check words below are fixed)
    first, second = ring.reserve(16), ring.reserve(8)
    ring.commit(second)
    ring.release(first)
    words = memoryview(Path(SHM_DIR, ring.name).read_bytes()).cast("q")
    slots = 32 + 4
    assert list(words[slots : slots + 8]) == [0, 16, 1 << 30, 1, 3022253366024139189, -1, 2, 0]
    assert list(words[slots + 8 : slots + 16]) == [16, 8, 1 << 30, 1, 3763103563314028141, 0, 1, 0]
    assert words[32] == 1  # the commit table: record 0 is reservation 1
    assert list(words[5:9]) == [2, 1, 1, 0]  # reservations made, the oldest live, next record, next to take
    assert len(words) * 8 == 4096 + 256  # (32 + 4 + 32 + 4) words of tables, then the data
    ring.close()
    # 48 records: 32 + 48 + 8 * 48 + 48 words of tables fill the first page exactly; the smallest
    # ring, one byte, follows them
    edge = shared(1, records=48)
    assert isinstance(edge, SharedRing)
    assert Path(SHM_DIR, edge.name).stat().st_size == 4096 + 1
    r = edge.reserve(1)
    edge.commit(r)
    consumer = HostRing.attach(edge.name)
    consumer.release(consumer.take(timeout=1))
    consumer.close()
    assert edge.cursor == edge.head == 1
    edge.close()
    # 1021 records: 10,242 words of tables, 16 B past 20 pages: the data starts at the 22nd page
    past = shared(8, records=1021)
    assert Path(SHM_DIR, past.name).stat().st_size == 21 * 4096 + 8
    past.commit(fill(past, b"p" * 8))
    consumer = HostRing.attach(past.name)  # type: ignore[attr-defined]
    got = consumer.take(timeout=1)
    assert (got.seq, bytes(consumer.view(got))) == (0, b"p" * 8)
    consumer.close()
    past.close()
    most = shared(8, records=1 << 20)  # the most records a ring may have (84 MB of tables, untouched)
    most.commit(fill(most, b"m"))
    consumer = HostRing.attach(most.name)  # type: ignore[attr-defined]
    consumer.release(consumer.take(timeout=1))
    consumer.close()
    most.close()
    one = shared(8, records=1)  # one record at a time, its slot reused
    consumer = HostRing.attach(one.name)  # type: ignore[attr-defined]
    for i in range(3):
        one.commit(fill(one, bytes([i]) * 8))
        got = consumer.take(timeout=1)
        assert (got.seq, bytes(consumer.view(got))) == (i, bytes([i]) * 8)
        consumer.release(got)
    consumer.close()
    one.close()


def test_a_ring_is_made_readable_and_writable_by_its_user_only(shared: Callable[..., HostRing]) -> None:
    old = os.umask(0)
    try:
        ring = shared(64)
    finally:
        os.umask(old)
    info = os.stat(Path(SHM_DIR, ring.name))  # type: ignore[attr-defined]
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
    with pytest.raises(Exception, match="exists already"):
        HostRing.create(ring.name, 64)  # type: ignore[attr-defined]


# ---------------------------------------------------------------- hostile input


def _words_of(name: str) -> memoryview:
    """The segment's header and tables as 64-bit words, through a mapping of the scribbler's own."""
    import mmap

    fd = os.open(Path(SHM_DIR, name), os.O_RDWR)
    try:
        mapped = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
    data = memoryview(mapped)[32:40].cast("q")[0]  # the data's offset, from the header
    return memoryview(mapped)[:data].cast("q")


_OPS: dict[str, Callable[[HostRing, HostRing, HostRange, HostRange], object]] = {
    "take": lambda ring, consumer, held, open_: consumer.take(timeout=0.01),
    "release": lambda ring, consumer, held, open_: consumer.release(held),
    "view": lambda ring, consumer, held, open_: consumer.view(held),
    "reserve": lambda ring, consumer, held, open_: ring.reserve(24, timeout=0.01),
    "commit": lambda ring, consumer, held, open_: ring.commit(open_),
    "release-open": lambda ring, consumer, held, open_: ring.release(open_),
    "cursor": lambda ring, consumer, held, open_: ring.cursor,
    "head": lambda ring, consumer, held, open_: ring.head,
    "released": lambda ring, consumer, held, open_: ring.released(HostRange(ring, 0, 4)),
    "reclaim": lambda ring, consumer, held, open_: ring.reclaim(),  # type: ignore[attr-defined]
    "consume": lambda ring, consumer, held, open_: HostRing.attach(ring.name).consume(),  # type: ignore[attr-defined]
    "stats": lambda ring, consumer, held, open_: ring.stats(),  # type: ignore[attr-defined]
}


def test_a_counter_past_2_to_the_62_is_corruption_named_by_its_word() -> None:
    """No counter of a ring in use comes near 2**62 (a record a nanosecond for 146 years): a
    larger one is a scribble, refused as SHM-1 naming the word and its range, changing nothing."""
    name = ring_name()
    ring = HostRing.create(name, 256, records=8)
    try:
        ring.commit(fill(ring, b"x"))
        words = _words_of(name)
        words[7] = (1 << 62) + 1  # the next sequence number
        before = bytes(words)
        with refused(
            "SHM-1",
            RingCorruptError,
            match=r"header word 7 holds 4611686018427387905, outside \[0, 4611686018427387904\]",
        ):
            ring.take(timeout=0)
        assert bytes(words) == before
        words.release()
        ring.close()
    finally:
        os.unlink(Path(SHM_DIR, name))


BIG = 1 << 62
#: A scribbled header or commit-table word just outside the range a call checks it against: (the
#: records moved through the ring first, the word, its value, the call that reads it, the range
#: its SHM-1 names). After `cycles` records, `_scribbled` leaves 3 more committed, one of them
#: taken, and a reservation open: 14 reservations made (4 without cycles), the oldest live is 10
#: (0), 13 records committed (3), 11 taken (1); the ring holds 8 records.
_OUTSIDE: list[tuple[int, int, int, str, tuple[int, int]]] = [
    (10, 5, -1, "head", (0, BIG)),  # reservations made
    (10, 5, BIG + 1, "reserve", (0, BIG)),
    (10, 6, 5, "head", (6, 14)),  # the oldest live reservation: at most 8 behind
    (10, 6, 15, "reserve", (6, 14)),
    (10, 6, -1, "cursor", (6, 14)),
    (0, 6, -1, "head", (0, 4)),
    (0, 6, 5, "released", (0, 4)),
    (10, 7, -1, "take", (0, BIG)),  # the next sequence number
    (10, 7, BIG + 1, "commit", (0, BIG)),
    (10, 8, 4, "take", (5, 13)),  # the next record to take: at most 8 behind the next committed
    (10, 8, 14, "take", (5, 13)),
    (0, 8, -1, "take", (0, 3)),
    (0, 8, 4, "consume", (0, 3)),
    (10, 9, BIG, "consume", (0, BIG - 1)),  # the consumer generation
    (10, 9, -1, "consume", (0, BIG - 1)),
    (10, 12, 14, "take", (0, 13)),  # records delivered again up to
    (0, 12, -1, "take", (0, 3)),
    (10, 13, -1, "reclaim", (0, BIG)),  # reservations reclaimed
    (10, 32 + 11 % 8, 14, "take", (10, 13)),  # the commit table: record 11's reservation, a live one
    (10, 32 + 11 % 8, 9, "take", (10, 13)),
    (0, 32 + 1, -1, "take", (0, 3)),
]


def _scribbled(name: str, cycles: int) -> tuple[HostRing, HostRing, HostRange, HostRange]:
    ring = HostRing.create(name, 256, records=8)
    consumer = HostRing.attach(name)
    for i in range(cycles):
        ring.commit(fill(ring, bytes([i]) * 16))
        consumer.release(consumer.take(timeout=1))
    for i in range(3):
        ring.commit(fill(ring, bytes([i]) * 16))
    return ring, consumer, consumer.take(timeout=1), fill(ring, b"open")


def _refused_once_scribbled(cycles: int, word: int, value: int, op: str, match: str) -> None:
    """`value` written into word `word` of a ring `_scribbled` after `cycles` records: the call
    `op` is refused as SHM-1 with `match`, and changes no word."""
    name = ring_name()
    try:
        ring, consumer, held, open_ = _scribbled(name, cycles)
        words = _words_of(name)
        assert list(words[5:9]) == [cycles + 4, cycles, cycles + 3, cycles + 1]  # (the state the tables are of)
        words[word] = value
        before = bytes(words)
        with refused("SHM-1", RingCorruptError, match=match):
            _OPS[op](ring, consumer, held, open_)
        assert bytes(words) == before
        words.release()
    finally:
        os.unlink(Path(SHM_DIR, name))


@pytest.mark.rejects("SHM-1")
@pytest.mark.parametrize(("cycles", "word", "value", "op", "bounds"), _OUTSIDE, ids=lambda v: str(v))
def test_a_word_just_outside_its_range_is_refused_naming_the_word_and_the_range(
    cycles: int, word: int, value: int, op: str, bounds: tuple[int, int]
) -> None:
    """Each checked word of the header and the commit table, one step outside the range the
    ring's state allows, is refused as SHM-1 by the call that reads it, naming the word, its
    value and the range, and changing no word."""
    _refused_once_scribbled(
        cycles, word, value, op, rf"header word {word} holds {value}, outside \[{bounds[0]}, {bounds[1]}\]"
    )


#: A scribbled word of the slot table (8 words from word 40 per reservation: start, size, owner's
#: pid and start time, check word, sequence number, state, bytes freed), as `_scribbled(name, 0)`
#: leaves the ring: (reservation, its word, the value, the call that reads it, its SHM-1 message).
_SLOT_SCRIBBLES: list[tuple[int, int, int, str, str]] = [
    (0, 6, 0, "cursor", r"reservation 0 is in no state \(0\)"),  # the oldest live one's state
    (0, 6, 4, "reserve", r"reservation 0 is in no state \(4\)"),
    (1, 6, -1, "take", r"reservation 1 is in no state \(-1\)"),  # the next record to take's
    (0, 7, 16, "cursor", r"reservation 0 has 16 of 16 B freed"),  # bytes its producer released at its front
    (0, 7, -1, "reserve", r"reservation 0 has -1 of 16 B freed"),
    (1, 5, 2, "take", r"record 1's slot holds record 2"),  # a sequence number not its own
    (1, 5, 0, "take", r"record 1's slot holds record 0"),
]


@pytest.mark.rejects("SHM-1")
@pytest.mark.parametrize(("index", "word", "value", "op", "message"), _SLOT_SCRIBBLES, ids=lambda v: str(v))
def test_a_slot_word_in_no_state_of_a_reservation_is_refused_naming_the_reservation(
    index: int, word: int, value: int, op: str, message: str
) -> None:
    """A slot's state outside reserved, released and reclaimed, more of its bytes freed than it
    has, or a sequence number that is another record's: SHM-1 naming the reservation or the
    record, by the call that reads the word, changing no word."""
    _refused_once_scribbled(0, 40 + 8 * index + word, value, op, message)


@pytest.mark.holds("SHM-1")
@settings(max_examples=200, deadline=None)
@given(
    writes=st.lists(
        st.tuples(
            st.integers(0, 32 + 8 + 8 * 8 - 1),  # the header, the commit table, the slot table
            st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-2, 300)),
        ),
        min_size=1,
        max_size=6,
    ),
    ops=st.lists(st.sampled_from(sorted(_OPS)), min_size=1, max_size=8),
)
def test_random_words_in_a_live_segment_never_crash_or_hang_a_process(
    writes: list[tuple[int, int]], ops: list[str]
) -> None:
    """Whatever another process writes into the header and the record tables, every call either
    works or raises a BridgeError, within its timeout; one refused as SHM-1 changes no word."""
    name = ring_name()
    ring = HostRing.create(name, 256, records=8)
    try:
        consumer = HostRing.attach(name)
        for i in range(3):
            ring.commit(fill(ring, bytes([i]) * 16))
        held = consumer.take(timeout=1)
        open_ = fill(ring, b"open")
        words = _words_of(name)
        for index, value in writes:
            words[index] = value
        for op in ops:
            before = bytes(words)
            t0 = time.monotonic()
            try:
                _OPS[op](ring, consumer, held, open_)
            except RingCorruptError as e:
                assert e.rule == "SHM-1" and bytes(words) == before, op
            except BridgeError:
                pass
            assert time.monotonic() - t0 < 5, op
        words.release()
    finally:
        os.unlink(Path(SHM_DIR, name))


@pytest.mark.parametrize("bad", [None, 1, b"name", "", "a/b", "../x", ".hidden", "x" * 201, "sp ace", "ünï", object()])
def test_create_and_attach_refuse_what_is_not_a_segment_name(bad: object) -> None:
    for call in (lambda: HostRing.create(bad, 64), lambda: HostRing.attach(bad)):  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError) as info:
            call()
        assert info.value.rule == "ARG-1"
    assert not any(p.name.startswith(("x" * 201, "ünï")) for p in Path(SHM_DIR).iterdir())


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "64", None, 1 << 41])
def test_create_refuses_a_bad_capacity_or_record_count_and_makes_nothing(bad: object) -> None:
    name = ring_name()
    with pytest.raises(RangeError):
        HostRing.create(name, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"records must be an int in \[1, 2\*\*20\]"):
        HostRing.create(name, 64, records=bad if bad != 1 << 41 else (1 << 20) + 1)  # type: ignore[arg-type]
    assert not Path(SHM_DIR, name).exists()


@pytest.mark.parametrize("bad", [None, 1, "r", object(), b"x", 1.0])
def test_commit_and_take_refuse_any_argument_of_the_wrong_kind(ring_of: Callable[[int], HostRing], bad: object) -> None:
    ring = ring_of(64)
    before = ring.snapshot()
    with pytest.raises(RangeError):
        ring.commit(bad)  # type: ignore[arg-type]
    if type(bad) not in (type(None), int, float):  # (those are timeouts)
        with pytest.raises(InvalidArgumentError):
            ring.take(timeout=bad)  # type: ignore[arg-type]
    assert ring.snapshot() == before


_RANGE_CALLS: dict[str, Callable[[HostRing, object], object]] = {
    "commit": lambda ring, bad: ring.commit(bad),  # type: ignore[arg-type]
    "release": lambda ring, bad: ring.release(bad),  # type: ignore[arg-type]
    "view": lambda ring, bad: ring.view(bad),  # type: ignore[arg-type]
    "write": lambda ring, bad: ring.write(bad, b"x"),  # type: ignore[arg-type]
    "released": lambda ring, bad: ring.released(bad),  # type: ignore[arg-type]
}
_NOT_RANGES = [None, -1, float("nan"), "r", object(), b"x", (0, 8)]


def _label(value: object) -> str:
    """A test id the same in every worker process (an object's repr holds its address)."""
    return "object()" if type(value) is object else repr(value)


def _live_ring(make: Callable[[int], HostRing]) -> tuple[HostRing, HostRange, HostRange]:
    """A ring with a record held and a reservation open: live slots to look through for whose
    bytes a range is."""
    ring = make(64)
    ring.commit(fill(ring, b"a" * 8))
    held = ring.take(timeout=1)
    return ring, held, fill(ring, b"b" * 8)


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize("call", sorted(_RANGE_CALLS))
@pytest.mark.parametrize("bad", _NOT_RANGES, ids=_label)
def test_a_range_call_refuses_what_is_not_a_range_with_records_and_reservations_live(
    ring_of: Callable[[int], HostRing], call: str, bad: object
) -> None:
    ring, held, _ = _live_ring(ring_of)
    before = ring.snapshot()
    with refused("RANGE-1", match="of data for" if call == "write" else "is not a range of this ring"):
        _RANGE_CALLS[call](ring, bad)
    assert ring.snapshot() == before and bytes(ring.view(held)) == b"a" * 8


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("bad", _NOT_RANGES[1:], ids=_label)  # (None: an output that finishes nothing)
def test_an_output_refuses_to_finish_what_is_not_a_record(ring_of: Callable[[int], HostRing], bad: object) -> None:
    ring, held, open_ = _live_ring(ring_of)
    before = ring.snapshot()
    with refused("ARG-1", match="an output finishes a record taken from another ring"):
        ring.commit(open_, finishes=bad)  # type: ignore[arg-type]
    assert ring.snapshot() == before and bytes(ring.view(held)) == b"a" * 8


_BRIDGES_CALLS: dict[str, Callable[[HostRing, object], object]] = {
    "raw": lambda ring, bad: ring.raw(bad),  # type: ignore[arg-type]
    "begin_read": lambda ring, bad: ring.begin_read(bad),  # type: ignore[arg-type]
    "end_read": lambda ring, bad: ring.end_read(bad, True),  # type: ignore[arg-type]
    "read_done": lambda ring, bad: ring.read_done(bad, True),  # type: ignore[arg-type]
    "begin_write": lambda ring, bad: ring.begin_write(bad),  # type: ignore[arg-type]
    "end_write": lambda ring, bad: ring.end_write(bad, True),  # type: ignore[arg-type]
    "write_done": lambda ring, bad: ring.write_done(bad),  # type: ignore[arg-type]
    "guard": lambda ring, bad: ring.guard(bad, lambda view: None),  # type: ignore[arg-type]
}


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize("call", sorted(_BRIDGES_CALLS))
@pytest.mark.parametrize("bad", [None, -1, float("nan"), "r", (0, 8), "other"], ids=repr)
def test_the_calls_a_bridge_makes_refuse_what_is_not_a_range_of_the_ring(
    ring_of: Callable[[int], HostRing], call: str, bad: object
) -> None:
    """The calls the Bridge makes on a ring after its own checks (a copy's start and end), made
    by a caller with anything but a range of the ring: RANGE-1, and nothing changes."""
    ring, held, _ = _live_ring(ring_of)
    if bad == "other":
        bad = HostRing(64).reserve(8)
    before = ring.snapshot()
    with refused("RANGE-1", match="is not a range of this ring"):
        _BRIDGES_CALLS[call](ring, bad)
    assert ring.snapshot() == before and bytes(ring.view(held)) == b"a" * 8


@pytest.mark.rejects("ARG-1")
def test_a_copy_that_never_began_is_not_ended_and_a_guard_needs_a_check(ring_of: Callable[[int], HostRing]) -> None:
    ring, _, open_ = _live_ring(ring_of)
    before = ring.snapshot()
    with refused("ARG-1", match=r"no input copy of host bytes \[8, 16\) began"):
        ring.end_read(open_, True)
    with refused("ARG-1", match=r"no output copy into host bytes \[8, 16\) began"):
        ring.end_write(open_, False)
    with refused("ARG-1", match="a guard's check must be callable, got 3"):
        ring.guard(open_, 3)  # type: ignore[arg-type]
    assert ring.snapshot() == before


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize(
    "bad",
    [None, (), (0,) * 6, (0, (), (), (), ()), (0, (1,), (), (), (), ()), (0, (), (), ((1, 2, 3),), (), ())],
    ids=repr,
)
def test_restore_takes_only_the_shape_of_a_state(bad: object) -> None:
    ring = HostRing(64)
    ring.reserve(8)
    before = ring.snapshot()
    with refused("ARG-1", match="a ring's state is what state"):
        ring.restore(bad)  # type: ignore[arg-type]
    assert ring.snapshot() == before


@pytest.mark.rejects("RING-1")
def test_a_synchronous_read_of_bytes_released_already_is_refused(ring_of: Callable[[int], HostRing]) -> None:
    ring, _, open_ = _live_ring(ring_of)
    ring.release(open_)
    before = ring.snapshot()
    with refused("RING-1", match=r"host bytes \[8, 16\) are not unreleased in one reservation"):
        ring.read_done(open_, True)
    assert ring.snapshot() == before


def test_a_closed_attachment_refuses_every_call_and_others_go_on(shared: Callable[..., HostRing]) -> None:
    ring = shared(64)
    other = HostRing.attach(ring.name)  # type: ignore[attr-defined]
    r = fill(other, b"abcd")
    other.commit(r)
    mine = other.reserve(4)
    other.close()
    other.close()  # twice: nothing more to do
    calls: list[Callable[[], object]] = [
        lambda: other.reserve(4),
        lambda: other.reserve(4, timeout=1),
        other.take,
        other.consume,
        lambda: other.commit(r),
        lambda: other.generation,
        lambda: other.head,
        lambda: other.cursor,
        other.stats,  # type: ignore[attr-defined]
        other.snapshot,
        lambda: other.released(mine),
        other.reclaim,  # type: ignore[attr-defined]
        other.lock_held,
        lambda: other.view(mine),
        lambda: other.array(mine, np.uint8),
        lambda: other.write(mine, b"wxyz"),
        lambda: other.release(mine),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError, match="is closed in this process"):
            call()
    assert other.unreleased() == []
    got = ring.take(timeout=1)
    assert bytes(ring.view(got)) == b"abcd"


def test_closing_with_views_still_held_detaches_and_leaves_the_views_their_bytes(
    shared: Callable[..., HostRing],
) -> None:
    """A process may close its attachment while a view or an array of a record is still held
    somewhere: the close works, the views keep reading their bytes (the mapping goes with the
    last of them), the attachment holds nothing any more and refuses every call, and what it
    took comes to the next consumer again."""
    ring = shared(64)
    ring.commit(fill(ring, b"abcdefgh"))
    consumer = HostRing.attach(ring.name)  # type: ignore[attr-defined]
    got = consumer.take(timeout=1)
    view, array = consumer.view(got), consumer.array(got, np.uint8)
    consumer.reserve(4)
    assert [(r.start, r.nbytes) for r in consumer.unreleased()] == [(0, 8), (8, 4)]
    consumer.close()
    assert consumer.unreleased() == []
    assert bytes(view) == b"abcdefgh" and array.tolist() == list(b"abcdefgh")
    with pytest.raises(InvalidArgumentError, match="is closed in this process"):
        consumer.released(got)
    again = HostRing.attach(ring.name)  # type: ignore[attr-defined]
    again.consume()
    taken = again.take(timeout=1)
    assert (taken.seq, taken.redelivered, bytes(again.view(taken))) == (0, True, b"abcdefgh")
    again.close()


def test_an_in_process_ring_has_no_name_to_unlink() -> None:
    ring = HostRing(16)
    ring.close()  # nothing to detach
    with pytest.raises(InvalidArgumentError):
        ring.unlink()


def _use_inherited(ring: HostRing) -> None:
    try:
        ring.reserve(4)
    except InvalidArgumentError as e:
        os._exit(3 if e.rule == "ARG-1" and "attach again" in str(e) else 4)
    os._exit(5)


def test_a_forked_child_must_attach_for_itself(shared: Callable[..., HostRing]) -> None:
    """A forked child holds the parent's open file, whose flock it would share: every call of its
    inherited attachment is refused, and the parent's ring is untouched."""
    ring = shared(64)
    before = ring.snapshot()
    child = multiprocessing.get_context("fork").Process(target=_use_inherited, args=(ring,))
    child.start()
    child.join(30)
    assert child.exitcode == 3 and ring.snapshot() == before


@pytest.mark.holds("RING-5", "GEN-2")
@pytest.mark.parametrize("call", ["release", "take", "consume", "reclaim"])
def test_a_consumer_stopped_between_its_check_and_the_lock_changes_nothing(
    shared: Callable[..., HostRing], call: str
) -> None:
    """A consumer passes its fence check, is stopped before it takes the segment's lock, and its
    replacement takes over meanwhile: when it gets the lock, it must find itself fenced there
    (a release: the record is delivered again, whole; any other call: GEN-2), changing no word."""
    ring = shared(64)
    old, new = HostRing.attach(ring.name), HostRing.attach(ring.name)  # type: ignore[attr-defined]
    for text in (b"heldheld", b"nextnext"):
        r = ring.reserve(8)
        ring.write(r, text)
        ring.commit(r)
    old.consume()
    held = old.take(timeout=1)
    locks = (old._both, old._shared)  # type: ignore[attr-defined]
    enter = type(locks[0]).__enter__
    replaced: list[int] = []

    def stopped_at_the_lock(self: object) -> None:
        if self in locks and not replaced:
            replaced.append(new.consume())  # the replacement takes over while this one is stopped
            replaced.append(len(ring.snapshot()))
            before[:] = [ring.snapshot()]
        enter(self)  # type: ignore[arg-type]

    before: list[object] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(locks[0]), "__enter__", stopped_at_the_lock)
        if call == "release":
            old.release(held)  # the fence held at the call's start; under the lock it does not
        else:
            with refused("GEN-2"):
                {"take": old.take, "consume": old.consume, "reclaim": old.reclaim}[call]()  # type: ignore[attr-defined]
    assert replaced[0] == 2 and ring.snapshot() == before[0]
    again = new.take(timeout=1)
    assert (again.seq, again.redelivered, bytes(new.view(again))) == (0, True, b"heldheld")
    old.close()
    new.close()


@pytest.mark.rejects("RING-4")
def test_a_reservation_reclaimed_under_a_live_producer_is_never_committed(shared: Callable[..., HostRing]) -> None:
    """Should the ring ever take a live producer for dead (its /proc entry unreadable, say), the
    reservation it reclaimed cannot be committed after all: the producer is told, nothing is
    delivered from bytes the ring may reuse."""
    ring = shared(64)
    producer = HostRing.attach(ring.name)  # type: ignore[attr-defined]
    r = fill(producer, b"doomed!!")
    ring.alive = lambda pid, started: False  # type: ignore[attr-defined]
    assert ring.reclaim() == 1  # type: ignore[attr-defined]
    before = ring.snapshot()
    with refused("RING-4"):
        producer.commit(r)
    assert ring.snapshot() == before and ring.stats()["committed"] == 0  # type: ignore[attr-defined]
    with pytest.raises(WaitTimeoutError):
        ring.take(timeout=0.01)
    producer.close()


def test_a_process_proc_cannot_describe_is_taken_as_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    from devbridge.ring import segment

    pid, started = segment.this_process()
    assert segment.alive(pid, started) and not segment.alive(pid, started + 1) and not segment.alive(0, 0)

    def unreadable(*args: object, **kwargs: object) -> object:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr("builtins.open", unreadable)
    assert segment.alive(pid, started + 1)  # not known dead: alive


@pytest.mark.rejects("SHM-1")
@pytest.mark.parametrize(("field", "value"), [(0, 8), (1, 4), (2, 1), (3, 7)])
def test_a_reservation_whose_fixed_fields_were_rewritten_is_refused(
    shared: Callable[..., HostRing], field: int, value: int
) -> None:
    """Another process rewrites a committed record's start, size or owner with values that look
    like a reservation's: the check word over them tells, and nothing is delivered or changed."""
    ring = shared(64)
    ring.commit(fill(ring, b"12345678"))
    consumer = HostRing.attach(ring.name)  # type: ignore[attr-defined]
    words = _words_of(ring.name)  # type: ignore[attr-defined]
    slot = 32 + 4096  # the header, the commit table (4096 slots), then slot 0
    words[slot + field] = value
    before = bytes(words)
    with refused("SHM-1", RingCorruptError):
        consumer.take(timeout=0.01)
    assert bytes(words) == before
    words.release()
    consumer.close()


def _rewrite_slot_0(ring: HostRing, start: int, nbytes: int) -> memoryview:
    """Slot 0 of `ring` (64 records) holding `start` and `nbytes`, with the check word over them."""
    from devbridge.ring.shared import _check_word

    words = _words_of(ring.name)  # type: ignore[attr-defined]
    slot = 32 + 4096  # the header, the commit table (4096 slots), then slot 0
    pid, pstart = words[slot + 2], words[slot + 3]
    words[slot], words[slot + 1], words[slot + 4] = start, nbytes, _check_word(start, nbytes, pid, pstart)
    return words


@pytest.mark.rejects("SHM-1")
@pytest.mark.parametrize(
    ("start", "nbytes"),
    [
        (-8, 8),  # before the stream
        (BIG, 8),  # past any stream a ring comes to
        (0, 0),  # no bytes
        (0, 65),  # more than the ring
        (60, 8),  # across the ring's end
    ],
)
def test_a_slot_rewritten_with_its_check_word_is_still_checked_against_the_ring(
    shared: Callable[..., HostRing], start: int, nbytes: int
) -> None:
    """A scribbler that writes a slot's check word over the fields it wrote (start and size) gets
    them checked all the same: bytes outside the stream or the ring, or across its end, are no
    reservation (SHM-1, nothing taken or changed)."""
    ring = shared(64)
    ring.commit(fill(ring, b"12345678"))
    consumer = HostRing.attach(ring.name)  # type: ignore[attr-defined]
    words = _rewrite_slot_0(ring, start, nbytes)
    before = bytes(words)
    with refused("SHM-1", RingCorruptError, match=r"reservation 0's slot holds no reservation"):
        consumer.take(timeout=0.01)
    assert bytes(words) == before
    words.release()
    consumer.close()


@pytest.mark.parametrize(("start", "nbytes"), [(56, 8), (64, 64)])  # up to the ring's end; all of it, a lap on
def test_a_slot_rewritten_as_a_reservation_could_be_is_taken_as_it_says(
    shared: Callable[..., HostRing], start: int, nbytes: int
) -> None:
    """Fields a reservation could have, with their check word, are taken as they say: a forgery
    this consistent is indistinguishable from a producer's own record."""
    ring = shared(64)
    ring.commit(fill(ring, b"12345678"))
    consumer = HostRing.attach(ring.name)  # type: ignore[attr-defined]
    words = _rewrite_slot_0(ring, start, nbytes)
    got = consumer.take(timeout=0.01)
    assert (got.seq, got.start, got.nbytes) == (0, start, nbytes)
    words.release()
    consumer.close()


@pytest.mark.rejects("RING-2")
def test_a_ring_whose_every_record_is_live_says_so_when_a_reservation_does_not_fit(
    shared: Callable[..., HostRing],
) -> None:
    """With each of its records holding a live reservation, a ring refuses the next however
    many bytes are free, and says why; the first release makes room for one more."""
    ring = shared(64, records=2)
    first, _ = ring.reserve(4), ring.reserve(4)
    with refused("RING-2", match=r"reserving 1 B: each of the ring's 2 records holds a live reservation"):
        ring.reserve(1)
    with refused("RING-2", match=r"each of the ring's 2 records holds a live reservation"):
        ring.reserve(1, timeout=0.01)
    ring.release(first)
    assert (ring.reserve(56).start, ring.unreleased()[0].start) == (8, 4)


def test_a_waiter_is_woken_by_the_call_that_makes_what_it_waits_for(
    shared: Callable[..., HostRing], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `take` waiting on an empty ring says it sleeps (header word 17) and is woken by the
    commit, which clears the word; a `reserve` waiting for room (word 18) by the release. The
    periodic looks are put off for a minute: only the wake can end either wait in time."""
    from devbridge.ring import shared as shared_ring

    monkeypatch.setattr(shared_ring, "FENCE_EVERY_S", 60.0)
    monkeypatch.setattr(shared_ring, "RECLAIM_EVERY_S", 60.0)
    producer = shared(16, records=4)
    consumer = HostRing.attach(producer.name)  # type: ignore[attr-defined]
    words = _words_of(producer.name)  # type: ignore[attr-defined]

    def asleep(word: int) -> None:
        deadline = time.monotonic() + 10
        while words[word] != 1:
            assert time.monotonic() < deadline, f"no waiter said it sleeps on word {word}"
            time.sleep(0.005)
        time.sleep(0.05)  # (past the flag, into the futex wait)

    got: list[HostRange] = []
    taker = threading.Thread(target=lambda: got.append(consumer.take(timeout=30)))
    taker.start()
    asleep(17)
    t0 = time.monotonic()
    producer.commit(fill(producer, b"wake" * 4))
    taker.join(10)
    assert not taker.is_alive() and time.monotonic() - t0 < 10 and words[17] == 0
    assert (got[0].seq, bytes(consumer.view(got[0]))) == (0, b"wake" * 4)
    made: list[HostRange] = []
    reserver = threading.Thread(target=lambda: made.append(producer.reserve(8, timeout=30)))
    reserver.start()
    asleep(18)
    t0 = time.monotonic()
    consumer.release(got[0])
    reserver.join(10)
    assert not reserver.is_alive() and time.monotonic() - t0 < 10 and words[18] == 0
    assert (made[0].start, made[0].nbytes) == (16, 8)
    words.release()
    consumer.close()


def test_the_wake_counters_are_32_bit_words_that_wrap(shared: Callable[..., HostRing]) -> None:
    """The words a waiter sleeps on (header words 14, commits, and 15, releases) count in their
    low 32 bits, the futex's: each call that may end a wait adds one, and 2**32 - 1 wraps to 0."""
    ring = shared(64)
    words = _words_of(ring.name)  # type: ignore[attr-defined]
    ring.consume()  # (a new consumer wakes a fenced one waiting in take)
    ring.commit(fill(ring, b"1234"))
    assert (words[14], words[15]) == (2, 0)
    words[14], words[15] = 0xFFFFFFFF, 0xFFFFFFFE
    ring.commit(fill(ring, b"5678"))
    assert words[14] == 0
    ring.release(ring.take(timeout=1))
    assert words[15] == 0xFFFFFFFF
    ring.release(ring.take(timeout=1))
    assert (words[14], words[15]) == (0, 0)
    words.release()


@pytest.mark.holds("RING-6")
def test_only_a_waiting_reservation_or_reclaim_takes_back_a_dead_producers_bytes(
    shared: Callable[..., HostRing],
) -> None:
    """A reservation that may not wait (timeout 0) does not look for dead producers (that reads
    /proc for each live reservation): it is refused while a dead one's bytes are in the way;
    `reclaim()` takes them back, and the same reservation then fits."""
    ring = shared(64)
    assert isinstance(ring, SharedRing)
    dead = HostRing.attach(ring.name)
    assert isinstance(dead, SharedRing)
    dead.process = (1 << 30, 7)  # an identity no process has
    dead.reserve(40)
    ring.alive = lambda pid, started: (pid, started) != (1 << 30, 7)
    with refused("RING-2", match=r"reserving 30 B: the largest free stretch is 24 B"):
        ring.reserve(30)
    assert ring.stats()["reclaimed"] == 0
    assert ring.reclaim() == 1 and ring.stats()["reclaimed"] == 1
    assert (ring.reserve(30).start, ring.cursor) == (64, 64)
    dead.close()


@pytest.mark.holds("WAIT-1")
def test_a_wait_ends_at_its_timeout_however_far_off_the_next_periodic_look_is(
    shared: Callable[..., HostRing], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`reserve` and `take` sleep until their timeout at the most, not until the next look for
    dead producers or a replacement consumer (put off for a minute here)."""
    from devbridge.ring import shared as shared_ring

    monkeypatch.setattr(shared_ring, "FENCE_EVERY_S", 60.0)
    monkeypatch.setattr(shared_ring, "RECLAIM_EVERY_S", 60.0)
    ring = shared(16)
    ring.commit(fill(ring, b"f" * 16))
    t0 = time.monotonic()
    with refused("RING-2", match=r"reserving 8 B: the largest free stretch is 0 B"):
        ring.reserve(8, timeout=0.05)
    assert 0.05 <= time.monotonic() - t0 < 10
    ring.release(ring.take(timeout=1))
    t0 = time.monotonic()
    with pytest.raises(WaitTimeoutError) as info:
        ring.take(timeout=0.05)
    assert info.value.rule == "WAIT-1" and 0.05 <= time.monotonic() - t0 < 10


@pytest.mark.holds("RING-2")
def test_with_nothing_live_the_whole_ring_fits_wherever_the_head_is(shared: Callable[..., HostRing]) -> None:
    """Once every reservation is released, the bytes skipped at the lap's end are free too: a
    reservation of the whole capacity fits, at the next lap's start."""
    ring = shared(64)
    ring.release(ring.reserve(40))
    whole = ring.reserve(64)
    assert (whole.start, whole.nbytes, ring.cursor, ring.head) == (64, 64, 64, 128)


def test_a_reservation_moves_a_lagging_tail_word_to_the_oldest_live_reservation(
    shared: Callable[..., HostRing],
) -> None:
    """A process killed between a release's two writes leaves the tail word (header word 6)
    behind a released reservation: the next reservation writes it where the oldest live one is."""
    ring = shared(64, records=8)
    first, _ = ring.reserve(8), ring.reserve(8)
    ring.release(first)
    words = _words_of(ring.name)  # type: ignore[attr-defined]
    assert list(words[5:7]) == [2, 1]
    words[6] = 0  # (as the killed process left it)
    ring.reserve(8)
    assert list(words[5:7]) == [3, 1]
    words.release()


@pytest.mark.rejects("SHM-1")
@pytest.mark.parametrize(
    ("index", "start", "message"),
    [
        (1, 1000, r"head 1008 and oldest byte 0 are no ring"),  # the newest a lap and more ahead
        (0, 200, r"head 16 and oldest byte 200 are no ring"),  # the oldest ahead of the newest
    ],
)
def test_reservations_farther_apart_than_the_ring_are_refused(
    shared: Callable[..., HostRing], index: int, start: int, message: str
) -> None:
    """Slots rewritten with check words over their new fields, each a reservation on its own,
    but the oldest and the newest farther apart than the ring holds: SHM-1 for the next
    reservation, which changes nothing."""
    from devbridge.ring.shared import _check_word

    ring = shared(64)
    for _ in range(2):
        ring.reserve(8)
    words = _words_of(ring.name)  # type: ignore[attr-defined]
    slot = 32 + 4096 + 8 * index
    words[slot], words[slot + 4] = start, _check_word(start, 8, words[slot + 2], words[slot + 3])
    before = bytes(words)
    other = HostRing.attach(ring.name)  # (no fields of its own cached)
    with refused("SHM-1", RingCorruptError, match=message):
        other.reserve(8)
    assert bytes(words) == before
    words.release()
    other.close()


def test_a_producer_and_a_consumer_keep_bounded_memory_however_many_records_they_move(
    shared: Callable[..., HostRing],
) -> None:
    """Each attachment keeps the checked fields of the reservations it meets, a bounded number
    of them: after thousands of records through a ring of 8, neither the producer's nor the
    consumer's memory has grown (traced allocations of the ring's code, 6,000 records apart)."""
    import tracemalloc

    producer = shared(1024, records=8)
    consumer = HostRing.attach(producer.name)  # type: ignore[attr-defined]

    def move(records: int) -> None:
        for _ in range(records):
            producer.commit(producer.reserve(16))
            consumer.release(consumer.take(timeout=1))

    ring_code = [tracemalloc.Filter(True, "*/ring/*.py")]
    move(2000)
    tracemalloc.start()
    try:
        move(100)
        before = tracemalloc.take_snapshot().filter_traces(ring_code)
        move(6000)
        after = tracemalloc.take_snapshot().filter_traces(ring_code)
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 16 << 10, [str(stat) for stat in after.compare_to(before, "lineno")[:5]]
    consumer.close()


@pytest.mark.rejects("RING-4")
def test_what_is_left_of_a_reservation_released_in_part_is_not_committed(shared: Callable[..., HostRing]) -> None:
    """A shared ring's records are its reservations as they were made (their fields never
    change): with part of one released, neither what is left nor the whole is committed. Its
    producer releases the rest, and the bytes go back."""
    ring = shared(64)
    r = ring.reserve(16)
    ring.release(r.sub(8, 8))
    with refused("RING-4", match=r"host bytes \[0, 8\) are not one whole unreleased reservation"):
        ring.commit(r.sub(0, 8))
    with refused("RING-4", match=r"host bytes \[0, 16\) are not reserved and unreleased in one reservation"):
        ring.commit(r)
    assert ring.stats()["committed"] == 0  # type: ignore[attr-defined]
    ring.release(r.sub(0, 8))
    assert ring.cursor == ring.head == 16 and ring.unreleased() == []


@pytest.mark.rejects("RING-4")
@pytest.mark.parametrize("part", [(8, 8), (0, 8), (4, 4)], ids=["end", "front", "middle"])
def test_no_ring_commits_what_is_left_of_a_reservation_released_in_part(
    ring_of: Callable[[int], HostRing], part: tuple[int, int]
) -> None:
    """Either kind of ring: a reservation released in part (at its end, its front or in the
    middle) is no longer one a commit takes, whole or any piece of it; the next one is."""
    ring = ring_of(64)
    r = ring.reserve(16)
    ring.release(r.sub(*part))
    before = ring.snapshot()
    for left in [r, *ring.unreleased()]:
        with refused("RING-4"):
            ring.commit(left)
        assert ring.snapshot() == before
    for left in ring.unreleased():
        ring.release(left)
    assert ring.commit(fill(ring, b"n" * 8)) == 0 and ring.cursor == 16


@pytest.mark.holds("RING-1")
def test_released_answers_from_the_segment_and_the_processs_own_releases(shared: Callable[..., HostRing]) -> None:
    """`released(r)` on a shared ring: bytes of a live reservation or record are not released
    (another process's, committed, taken, or this process's own not yet released); bytes whose
    reservation went back, or this process's own released part of a live one, are; past the
    head is RING-1."""
    a = shared(64)
    b = HostRing.attach(a.name)  # type: ignore[attr-defined]
    consumer = HostRing.attach(a.name)  # type: ignore[attr-defined]
    a.commit(fill(a, b"r" * 8))  # [0, 8): a record, taken below
    b.reserve(8)  # [8, 16): b's, open
    a.release(a.reserve(8))  # [16, 24): gone back
    part = a.reserve(8)  # [24, 32): a's, open, its first half released
    a.release(part.sub(0, 4))
    taken = consumer.take(timeout=1)

    def answers(ring: HostRing) -> list[bool]:
        spans = [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4), (16, 12), (0, 32), (31, 1)]  # (start, bytes)
        return [ring.released(made_range(ring, start, nbytes)) for start, nbytes in spans]

    assert answers(a) == [False, False, True, True, False, True, False, False]
    assert answers(b) == [False, False, True, False, False, False, False, False]
    with refused("RING-1", match=r"host bytes \[32, 33\) were never reserved \(head is 32\)"):
        a.released(made_range(a, 32, 1))
    consumer.release(taken)
    assert a.released(made_range(a, 0, 8)) and b.released(made_range(b, 0, 8))
    for ring in (b, consumer):
        ring.close()


@pytest.mark.holds("RING-5")
@pytest.mark.parametrize(("part", "spans"), [(0, [(0, 8), (12, 12)]), (4, [(0, 8), (8, 4), (16, 8)])])
def test_consuming_again_gives_back_what_this_object_took_and_keeps_its_reservations(
    shared: Callable[..., HostRing], part: int, spans: list[tuple[int, int]]
) -> None:
    """An attachment that produces and consumes calls `consume()` again: the records it took (one
    released in part: at its front, or inside) are no longer its and come again, first; its own open reservations on
    either side of them stay its own, whole."""
    ring = shared(64)
    before = ring.reserve(8)  # [0, 8): open, just before the records
    ring.commit(fill(ring, b"a" * 16))  # [8, 24)
    ring.commit(fill(ring, b"b" * 8))  # [24, 32)
    first = ring.take(timeout=1)
    ring.take(timeout=1)
    ring.release(first.sub(part, 4))  # 4 B of the first released already
    after = ring.reserve(8)  # [32, 40): open, just after them
    assert [(r.start, r.nbytes) for r in ring.unreleased()] == [*spans, (24, 8), (32, 8)]
    assert ring.consume() == 2
    assert [(r.start, r.nbytes) for r in ring.unreleased()] == [(0, 8), (32, 8)]
    again = [ring.take(timeout=1) for _ in range(2)]
    assert [(r.seq, r.start, r.redelivered) for r in again] == [(0, 8, True), (1, 24, True)]
    assert bytes(ring.view(again[0])) == b"a" * 16 and bytes(ring.view(again[1])) == b"b" * 8
    for r in (*again, before, after):
        ring.release(r)
    assert ring.cursor == ring.head == 40


@pytest.mark.holds("RING-5")
def test_a_new_consumer_skips_records_released_before_it_even_in_a_slot_reused_since(
    shared: Callable[..., HostRing],
) -> None:
    """Records committed out of their reservations' order (two slots): the old consumer takes
    both and releases the second, whose slot a new reservation reuses. The new consumer gets the
    first again, skips the released one (its slot holds another record now: not corruption),
    and takes the new one as new."""
    producer = shared(64, records=2)
    first, second = fill(producer, b"1" * 8), fill(producer, b"2" * 8)
    producer.commit(second)  # record 0: the second reservation
    producer.commit(first)  # record 1: the first
    old = HostRing.attach(producer.name)  # type: ignore[attr-defined]
    got = [old.take(timeout=1), old.take(timeout=1)]
    assert [(r.seq, r.start) for r in got] == [(0, 8), (1, 0)]
    old.release(got[1])  # the first reservation goes back: its slot is free
    producer.commit(fill(producer, b"3" * 8))  # record 2, in the first's slot
    new = HostRing.attach(producer.name)  # type: ignore[attr-defined]
    new.consume()
    again = [new.take(timeout=1), new.take(timeout=1)]
    assert [(r.seq, r.start, r.redelivered) for r in again] == [(0, 8, True), (2, 16, False)]
    assert [bytes(new.view(r)) for r in again] == [b"2" * 8, b"3" * 8]
    with pytest.raises(WaitTimeoutError):
        new.take(timeout=0)
    for ring in (old, new):
        ring.close()


@pytest.mark.holds("RING-6")
def test_a_dead_producers_record_the_consumer_holds_is_never_reclaimed(shared: Callable[..., HostRing]) -> None:
    """Two producers commit out of their reservations' order (two slots); the dead one's record
    is taken and held, and a newer record has since written over its commit-table entry. A
    reservation waiting for room reclaims nothing of it: the consumer's bytes stay its own."""
    live = shared(64, records=2)
    assert isinstance(live, SharedRing)
    dead = HostRing.attach(live.name)
    assert isinstance(dead, SharedRing)
    dead.process = (1 << 30, 7)  # an identity no process has
    mine = fill(live, b"L" * 8)  # reservation 0
    theirs = fill(dead, b"D" * 8)  # reservation 1
    dead.commit(theirs)  # record 0
    live.commit(mine)  # record 1
    consumer = HostRing.attach(live.name)  # type: ignore[attr-defined]
    held, done = consumer.take(timeout=1), consumer.take(timeout=1)
    consumer.release(done)  # reservation 0 goes back
    live.commit(fill(live, b"N" * 8))  # record 2, in reservation 0's slot and record 0's entry
    live.alive = lambda pid, started: (pid, started) != (1 << 30, 7)
    with refused("RING-2", match=r"each of the ring's 2 records holds a live reservation"):
        live.reserve(8, timeout=0.2)  # waits, looks for the dead, finds only a record
    assert live.stats()["reclaimed"] == 0 and bytes(consumer.view(held)) == b"D" * 8
    consumer.release(held)
    assert live.reserve(8, timeout=1).nbytes == 8
    for ring in (dead, consumer):
        ring.close()


@pytest.mark.holds("RING-6")
def test_a_dead_commits_table_entry_keeps_no_reservation_from_reclaim_while_records_come_again(
    shared: Callable[..., HostRing],
) -> None:
    """A producer dies committing: its commit-table entry written, not the commit point. The
    entry is one of a record a new consumer gets again (an older record's, written over): it
    names no committed record, and the dead reservation is reclaimed at once, not only after
    the records due again are taken."""
    live = shared(64, records=2)
    assert isinstance(live, SharedRing)
    first, second = fill(live, b"1" * 8), fill(live, b"2" * 8)
    live.commit(second)  # record 0: the second reservation
    live.commit(first)  # record 1: the first
    old = HostRing.attach(live.name)  # type: ignore[attr-defined]
    old.take(timeout=1)  # record 0, held
    old.release(old.take(timeout=1))  # record 1: the first reservation goes back, its slot free
    dead = HostRing.attach(live.name)
    assert isinstance(dead, SharedRing)
    dead.process = (1 << 30, 7)  # an identity no process has
    dying = fill(dead, b"D" * 8)  # reservation 2, in the first's slot
    dead._words[dead._commits_at + 2 % 2] = 2  # its commit's first write (record 2's entry, record 0's before)
    live.alive = lambda pid, started: (pid, started) != (1 << 30, 7)
    new = HostRing.attach(live.name)  # type: ignore[attr-defined]
    new.consume()  # record 0 is due again
    assert live.reclaim() == 1  # type: ignore[attr-defined]
    again = new.take(timeout=1)
    assert (again.seq, again.start, again.redelivered, bytes(new.view(again))) == (0, 8, True, b"2" * 8)
    with pytest.raises(WaitTimeoutError):
        new.take(timeout=0)  # record 2 was never committed
    new.release(again)
    assert (live.cursor, live.head, dying.start) == (24, 24, 16)
    for ring in (old, dead, new):
        ring.close()
