"""The host ring: reservations, cursor, wrap-around, release (RING-*)."""

from __future__ import annotations

import numpy as np
import pytest
from rules import refused
from support import put

from devbridge import (
    Bridge,
    DeviceRange,
    HostRange,
    HostRing,
    ObjectSpec,
    OutputNotReadyError,
    RangeError,
    RingFullError,
)  # fmt: skip
from devbridge.backends.fake import FakeBackend


@pytest.mark.holds("RING-1")
def test_cursor_is_monotone_and_stops_at_the_first_unreleased_byte() -> None:
    ring = HostRing(100)
    a, b, c = ring.reserve(10), ring.reserve(20), ring.reserve(30)
    assert (a.start, b.start, c.start, ring.cursor) == (0, 10, 30, 0)
    ring.release(b)
    assert ring.cursor == 0  # a is still unreleased
    ring.release(a)
    assert ring.cursor == 30
    ring.release(c.sub(0, 10))
    assert ring.cursor == 40
    ring.release(c.sub(10, 20))
    assert ring.cursor == 60 == ring.head and ring.unreleased() == []


@pytest.mark.rejects("RING-1")
def test_releasing_unreserved_or_released_bytes_is_rejected() -> None:
    ring = HostRing(64)
    r = ring.reserve(16)
    ring.release(r.sub(0, 8))
    before = ring.snapshot()
    for bad in (r, r.sub(4, 8), HostRange(ring, 20, 4)):
        with refused("RING-1"):
            ring.release(bad)
    assert ring.snapshot() == before and ring.cursor == 8


@pytest.mark.holds("RING-2")
def test_reservations_wrap_to_the_next_lap_without_straddling() -> None:
    ring = HostRing(100)
    a = put(ring, b"a" * 70)
    ring.release(a)
    b = ring.reserve(40)  # 30 bytes left in this lap: skip to the next one
    assert b.start == 100 and ring.view(b).nbytes == 40
    ring.view(b)[:] = b"b" * 40
    c = ring.reserve(60)
    assert c.start == 140
    with pytest.raises(RingFullError):
        ring.reserve(1)
    ring.release(b)
    assert ring.reserve(40).start == 200  # lap boundary reached exactly, then the freed front


@pytest.mark.rejects("RING-2")
def test_a_full_ring_refuses_and_changes_nothing() -> None:
    ring = HostRing(64)
    a = put(ring, b"x" * 40)
    before = ring.snapshot()
    with refused("RING-2"):
        ring.reserve(25)
    assert ring.snapshot() == before
    ring.release(a)
    assert ring.reserve(25).start == 64  # 24 left in the lap: wraps


@pytest.mark.holds("RING-3")
def test_view_gives_exactly_the_range_bytes() -> None:
    ring = HostRing(32)
    r = put(ring, b"0123456789")
    assert bytes(ring.view(r.sub(3, 4))) == b"3456"
    ring.view(r.sub(0, 2))[:] = b"ab"
    assert bytes(ring.view(r)) == b"ab23456789"


@pytest.mark.rejects("RING-3")
def test_released_bytes_cannot_be_viewed() -> None:
    ring = HostRing(32)
    r = put(ring, b"01234567")
    ring.release(r.sub(0, 4))
    with refused("RING-3"):
        ring.view(r)


@pytest.mark.rejects("RANGE-1", "RING-2")
@pytest.mark.parametrize(
    ("size", "rule"), [(0, "RANGE-1"), (-1, "RANGE-1"), (65, "RING-2"), (1.5, "RANGE-1"), (True, "RANGE-1")]
)
def test_bad_reservation_sizes(size: object, rule: str) -> None:
    ring = HostRing(64)
    with refused(rule):
        ring.reserve(size)  # type: ignore[arg-type]
    assert ring.head == 0


@pytest.mark.parametrize("capacity", [0, -5, 2.0])
def test_bad_capacity(capacity: object) -> None:
    with refused("RANGE-1"):
        HostRing(capacity)  # type: ignore[arg-type]


@pytest.mark.holds("RING-2")
@pytest.mark.parametrize(("capacity", "first", "then"), [(1000, 600, 700), (64, 1, 64), (100, 30, 100)])
def test_an_empty_ring_takes_any_reservation_that_fits(capacity: int, first: int, then: int) -> None:
    """Regression: bytes skipped at a lap's end were counted as used, so an empty ring
    refused a reservation that fits, forever (a retrying producer waited forever)."""
    ring = HostRing(capacity)
    ring.release(ring.reserve(first))
    assert ring.unreleased() == []
    r = ring.reserve(then)
    assert (r.start, r.nbytes, r.start % capacity) == (capacity, then, 0)  # starts the next lap
    assert ring.cursor == capacity and ring.unreleased() == [r]


@pytest.mark.holds("RING-2")
def test_a_reservation_that_fits_the_front_of_the_next_lap_succeeds() -> None:
    ring = HostRing(100)
    a, b = ring.reserve(60), ring.reserve(30)  # [0, 60) [60, 90)
    ring.release(a)
    c = ring.reserve(55)  # the tail [90, 100) is too small; [0, 60) of the next lap is free
    assert (c.start, c.end) == (100, 155) and ring.unreleased() == [b, c]


@pytest.mark.rejects("RING-2")
def test_a_reservation_larger_than_the_ring_says_so() -> None:
    ring = HostRing(64)
    before = ring.snapshot()
    with refused("RING-2", match="larger than the ring's capacity of 64 B"):
        ring.reserve(65)
    assert ring.snapshot() == before


@pytest.mark.rejects("RING-2")
def test_a_reservation_that_does_not_fit_names_the_largest_free_stretch() -> None:
    ring = HostRing(100)
    a = ring.reserve(60)
    before = ring.snapshot()
    with refused("RING-2", match="largest free stretch is 40 B"):
        ring.reserve(60)  # 40 B free at the tail, and the front is held
    assert ring.snapshot() == before
    ring.reserve(40)
    ring.release(a.sub(0, 30))
    with pytest.raises(RingFullError, match="largest free stretch is 30 B"):
        ring.reserve(31)  # the front of the next lap, up to the oldest unreleased byte
    assert ring.reserve(30).start == 100


@pytest.mark.rejects("RING-1")
def test_released_refuses_bytes_that_were_never_reserved() -> None:
    """Regression: released() said True for bytes the ring never reserved."""
    ring = HostRing(64)
    r = ring.reserve(16)
    with refused("RING-1", match=r"host bytes \[16, 20\) were never reserved \(head is 16\)"):
        ring.released(HostRange(ring, 16, 4))
    with refused("RING-1", match=r"host bytes \[1000, 1004\) were never reserved"):
        ring.released(HostRange(ring, 1000, 4))
    assert ring.released(r) is False
    ring.release(r)
    assert ring.released(r) is True


def test_snapshot_changes_with_every_ring_operation_and_only_then() -> None:
    """Tests compare snapshots to prove a refused call changed nothing: each change must show."""
    fake, ring = FakeBackend(), HostRing(64)
    bridge = Bridge(fake)
    h = bridge.alloc_device(ObjectSpec("x", "uint8"), 16)
    seen = [ring.snapshot()]
    a = put(ring, b"a" * 16)
    seen.append(ring.snapshot())
    b = ring.reserve(8)
    seen.append(ring.snapshot())
    ev = bridge.host_to_device(a, DeviceRange(h, 0, 16), sync=False)  # a pending read of a
    seen.append(ring.snapshot())
    out = bridge.device_to_host(DeviceRange(h, 0, 8), b, sync=False)  # a pending write of b
    seen.append(ring.snapshot())
    fake.complete(ev)
    seen.append(ring.snapshot())
    fake.complete(out)
    seen.append(ring.snapshot())
    ring.release(b)
    seen.append(ring.snapshot())
    assert len(set(seen)) == len(seen), seen
    assert ring.snapshot() == seen[-1] and HostRing(64).snapshot() == seen[0]


@pytest.mark.rejects("RANGE-1")
def test_a_ring_may_be_up_to_1_tib_and_no_larger() -> None:
    """Refused by the limit itself (the message says so), not by a failed 1 TiB allocation."""
    with refused("RANGE-1", match=r"ring capacity must be an int in \[1, 2\*\*40\], got 1099511627777"):
        HostRing((1 << 40) + 1)


@pytest.mark.parametrize(
    ("cut", "left"),
    [
        ((0, 6), [(6, 10), (20, 30)]),  # the front of the first span
        ((10, 20), [(4, 10), (20, 30)]),  # the gap between them, touching both: nothing
        ((6, 8), [(4, 6), (8, 10), (20, 30)]),  # the middle: two pieces
        ((6, 10), [(4, 6), (20, 30)]),  # the end of a span: no empty piece after it
        ((8, 25), [(4, 8), (25, 30)]),  # across the gap
        ((0, 40), []),  # everything
        ((30, 31), [(4, 10), (20, 30)]),  # just past the end
    ],
)
def test_cutting_bytes_out_of_spans_keeps_exactly_the_rest(cut: tuple[int, int], left: list[tuple[int, int]]) -> None:
    from devbridge.ring.host import _minus

    assert _minus([(0, 10), (20, 30)], (0, 4)) == [(4, 10), (20, 30)]
    assert _minus([(4, 10), (20, 30)], cut) == left


@pytest.mark.holds("RANGE-1")
@pytest.mark.parametrize("capacity", [1, 1 << 40])
def test_a_ring_of_1_byte_to_1_tib_is_allowed_and_a_failed_allocation_is_range_1(
    capacity: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import devbridge.ring.host

    asked: list[int] = []

    def no_memory(size: int) -> bytearray:
        asked.append(size)
        if size > 1 << 20:
            raise MemoryError
        return bytearray(size)

    monkeypatch.setattr(devbridge.ring.host, "bytearray", no_memory, raising=False)
    if capacity == 1:
        assert HostRing(1).capacity == 1 and asked == [1]
    else:
        with refused("RANGE-1", match=f"cannot allocate a ring of {1 << 40} B"):
            HostRing(capacity)
        assert asked == [1 << 40]  # within the limit: it was attempted


@pytest.mark.holds("RING-1")
def test_released_looks_at_every_unreleased_span_a_range_crosses() -> None:
    ring = HostRing(64)
    parts = [ring.reserve(8) for _ in range(5)]  # [0, 8) [8, 16) [16, 24) [24, 32) [32, 40)
    ring.release(parts[1])
    ring.release(parts[3])
    assert [(u.start, u.nbytes) for u in ring.unreleased()] == [(0, 8), (16, 8), (32, 8)]
    assert ring.released(HostRange(ring, 8, 8)) and ring.released(HostRange(ring, 24, 8))
    assert not ring.released(HostRange(ring, 10, 10))  # [10, 20): bytes 16..19 of the second span
    assert not ring.released(HostRange(ring, 12, 24))  # across the second span to the third
    assert not ring.released(HostRange(ring, 30, 4))  # into the third span


def _layout(steps: str) -> HostRing:
    """A 64-byte ring after `steps`: "r40" reserves 40 bytes, "x0" releases the first reservation."""
    ring, made = HostRing(64), []
    for step in steps.split():
        if step[0] == "r":
            made.append(ring.reserve(int(step[1:])))
        else:
            ring.release(made[int(step[1:])])
    return ring


@pytest.mark.rejects("RING-2")
@pytest.mark.parametrize(
    ("steps", "largest"),
    [
        ("r40", 24),  # the tail of the lap
        ("r16 r32 x0", 16),  # the tail and the released front are both 16
        ("r8 r40 x0", 16),  # the tail beats the front
        ("r32 r24 x0", 32),  # the released front beats the tail
        ("r32 r24 x0 r20", 12),  # wrapped: what is left before the oldest unreleased byte
        ("r64", 0),  # full
    ],
)
def test_a_full_ring_names_its_largest_free_stretch(steps: str, largest: int) -> None:
    ring = _layout(steps)
    before = ring.snapshot()
    with refused("RING-2", match=rf"reserving {largest + 1} B: the largest free stretch is {largest} B"):
        ring.reserve(largest + 1)
    assert ring.snapshot() == before
    if largest:
        assert ring.reserve(largest).nbytes == largest  # and that much does fit


def test_an_input_copy_may_not_read_bytes_a_failed_output_left() -> None:
    """Bytes an output copy failed to write are never readable (D2H-3), not even by an input
    copy: check_copy refuses them for either copy once released (RING-3)."""
    ring = HostRing(16)
    r = ring.reserve(8)
    ring.begin_write(r)
    ring.end_write(r, valid=False)
    with pytest.raises(OutputNotReadyError) as failed:
        ring.check_copy(r, True)
    assert failed.value.rule == "D2H-3"
    before = ring.state()
    ring.release(r)  # the worker gives the failed bytes back
    assert ring.state() != before and ring.released(r)
    for into_device in (False, True):
        with pytest.raises(RangeError) as gone:
            ring.check_copy(r, into_device)
        assert gone.value.rule == "RING-3"


def test_a_host_range_holds_plain_ints_and_does_not_print_its_ring() -> None:
    ring = HostRing(16)
    r = HostRange(ring, np.int64(4), np.uint8(8))
    assert (r.start, r.nbytes, type(r.start), type(r.nbytes)) == (4, 8, int, int)
    assert repr(r) == "HostRange(start=4, nbytes=8)"


@pytest.mark.parametrize("into_device", [True, False])
def test_a_copys_host_check_refuses_what_is_not_a_live_range_of_this_ring(into_device: bool) -> None:
    ring, other = HostRing(64), HostRing(64)
    live, elsewhere = ring.reserve(8), other.reserve(8)
    before = ring.snapshot()
    for bad in (object(), None, "range", elsewhere):
        with pytest.raises(RangeError) as info:
            ring.check_copy(bad, into_device)
        assert info.value.rule == "RANGE-1"
    assert ring.snapshot() == before  # a check changes nothing
    ring.release(live)
    with pytest.raises(RangeError) as info:
        ring.check_copy(live, into_device)
    assert info.value.rule == "RING-3"


def test_a_copys_one_bisect_liveness_test_agrees_with_the_full_check_on_every_range() -> None:
    """A copy's host check asks one bisect first (the per-call path) and the full check only when
    it fails: it accepts exactly the ranges the full check accepts, in whichever span they lie."""
    ring = HostRing(64)
    spans = [ring.reserve(8) for _ in range(4)]  # [0, 8) [8, 16) [16, 24) [24, 32)
    ring.release(spans[1])  # live: [0, 8), [16, 24), [24, 32)
    accepted = []
    for start in range(0, 40):
        for nbytes in range(1, 12):
            r = HostRange(ring, start, nbytes)
            try:
                ring._check_live(r, "RING-3")
                full = True
            except RangeError:
                full = False
            for into_device in (True, False):
                try:
                    ring.check_copy(r, into_device)
                    quick = True
                except RangeError as e:
                    assert e.rule == "RING-3"
                    quick = False
                assert quick is full, (start, nbytes, into_device)
            if full:
                accepted.append((start, nbytes))
    assert (16, 8) in accepted and (24, 8) in accepted and (8, 8) not in accepted and (20, 8) not in accepted


@pytest.mark.parametrize("timeout", [None, 0.0, 0])
def test_a_reservation_that_does_not_fit_waits_only_when_asked_to(timeout: float | None) -> None:
    """The default timeout (0.0, as 0) refuses at once without waiting for room (RING-2);
    only a timeout other than zero, or None, waits."""
    ring = HostRing(16)
    held = ring.reserve(16)
    waited: list[float | None] = []
    ring._wait_for_room = lambda n, wait: (waited.append(wait), None)[1]  # type: ignore[method-assign]
    kwargs = {} if timeout == 0.0 and type(timeout) is float else {"timeout": timeout}
    with pytest.raises(RingFullError) as full:
        ring.reserve(8, **kwargs)
    assert full.value.rule == "RING-2" and waited == ([None] if timeout is None else [])
    assert ring.unreleased() == [held]


def test_an_in_process_ring_counts_the_records_it_delivers_again() -> None:
    """`ring.redelivered`: records a consumer took and did not release whole, given again to the
    next (0 on a new ring; a record released whole is not counted, one released in part is)."""
    ring = HostRing(64)
    assert ring.redelivered == 0
    for i in range(3):
        r = ring.reserve(8)
        ring.write(r, bytes([i]) * 8)
        ring.commit(r)
    ring.consume()
    first, second, third = (ring.take(timeout=1) for _ in range(3))
    ring.release(second)
    ring.release(first.sub(0, 4))
    ring.consume()
    assert ring.redelivered == 2
    again = [ring.take(timeout=1) for _ in range(2)]
    assert [(r.seq, r.redelivered) for r in again] == [(0, True), (2, True)]
    assert (third.seq, ring.redelivered) == (2, 2)
