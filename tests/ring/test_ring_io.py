"""The ring's conveniences: `write` any buffer into a range, `array` over a range without a copy,
and `reserve(timeout=...)` that sleeps until a release makes room (RING-2, ARG-1, RANGE-1,
H2D-3, D2H-3)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from rules import refused

from devbridge import Bridge, DeviceRange, HostRange, HostRing, ObjectSpec
from devbridge.errors import InvalidArgumentError
from devbridge.testing import FakeBackend

U8 = ObjectSpec("blob", "uint8")


def unchanged(ring: HostRing, call: Callable[[], object], rule: str) -> None:
    """`call` is refused citing `rule`, and the ring (its bookkeeping and every byte) is as before."""
    before = ring.snapshot()
    with refused(rule):
        call()
    assert ring.snapshot() == before


# ------------------------------------------------------------------------------------------ write


@pytest.mark.holds("H2D-1")
@pytest.mark.parametrize(
    "data",
    [
        b"\x01\x02\x03\x04\x05\x06\x07\x08",
        bytearray(range(10, 18)),
        memoryview(bytes(range(20, 28))).cast("i"),
        memoryview(bytes(range(30, 38))).cast("B", (2, 4)),
        np.arange(2, dtype=np.float32),
        np.arange(4, dtype=np.int16).reshape(2, 2),
        np.array([1 + 2j], dtype=np.complex64),
        np.array([(7, 1.5)], dtype=[("a", "<i4"), ("b", "<f4")]),
        np.array(["2026-12-02"], dtype="datetime64[D]"),
        np.array(3.25),
        np.array([True, False, True, True, False, False, True, False]),
    ],
    ids=lambda d: type(d).__name__ + ":" + getattr(getattr(d, "dtype", None), "str", getattr(d, "format", "")),
)
def test_write_copies_exactly_the_buffers_bytes_into_exactly_the_range(data: object) -> None:
    ring = HostRing(32)
    before, r, after = ring.reserve(4), ring.reserve(8), ring.reserve(4)
    ring.view(before)[:] = b"\xaa" * 4
    ring.view(after)[:] = b"\xbb" * 4
    expected = memoryview(data).tobytes() if not isinstance(data, np.ndarray) else data.tobytes()  # type: ignore[arg-type]
    assert len(expected) == 8
    ring.write(r, data)
    assert bytes(ring.view(r)) == expected
    assert (bytes(ring.view(before)), bytes(ring.view(after))) == (b"\xaa" * 4, b"\xbb" * 4)


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize(
    "data",
    [
        5,
        "abcdefgh",
        None,
        [1, 2, 3, 4, 5, 6, 7, 8],
        object(),
        np.zeros((4, 4), np.int8)[:, :2],
        memoryview(bytes(16))[::2],
    ],
    ids=["int", "str", "None", "list", "object", "numpy-strided", "memoryview-strided"],
)
def test_write_refuses_what_is_not_a_contiguous_buffer(data: object) -> None:
    ring = HostRing(16)
    r = ring.reserve(8)
    unchanged(ring, lambda: ring.write(r, data), "ARG-1")


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize("size", [0, 7, 9, 64])
def test_write_refuses_data_of_another_size(size: int) -> None:
    ring = HostRing(16)
    r = ring.reserve(8)
    unchanged(ring, lambda: ring.write(r, bytes(size)), "RANGE-1")


@pytest.mark.rejects("RING-3", "RANGE-1")
def test_write_refuses_a_range_released_or_of_another_ring() -> None:
    ring, other = HostRing(16), HostRing(16)
    r, foreign = ring.reserve(8), other.reserve(8)
    ring.release(r)
    unchanged(ring, lambda: ring.write(r, bytes(8)), "RING-3")
    unchanged(ring, lambda: ring.write(foreign, bytes(8)), "RANGE-1")
    unchanged(ring, lambda: ring.write("not a range", bytes(8)), "RANGE-1")  # type: ignore[arg-type]


@pytest.mark.rejects("H2D-3", "D2H-3")
def test_write_refuses_bytes_a_pending_copy_reads_or_writes_and_a_failed_output() -> None:
    fake = FakeBackend()
    bridge, ring = Bridge(fake), HostRing(64)
    h = bridge.alloc_device(U8, 16)
    src = ring.reserve(8)
    ring.write(src, b"inputs!!")
    up = bridge.host_to_device(src, DeviceRange(h, 0, 8), sync=False)
    unchanged(ring, lambda: ring.write(src, bytes(8)), "H2D-3")  # the copy still reads them
    fake.complete(up)
    bridge.poll()
    dst = ring.reserve(8)
    down = bridge.device_to_host(DeviceRange(h, 0, 8), dst, sync=False)
    unchanged(ring, lambda: ring.write(dst, bytes(8)), "D2H-3")  # not written yet
    fake.fail(down)
    bridge.poll()
    unchanged(ring, lambda: ring.write(dst, bytes(8)), "D2H-3")  # a failed output is never valid


# ------------------------------------------------------------------------------------------ array


@pytest.mark.holds("D2H-2")
def test_array_is_the_rings_memory_without_a_copy() -> None:
    ring = HostRing(64)
    r = ring.reserve(24)
    a = ring.array(r, "float32", (2, 3))
    assert (a.shape, a.dtype, a.flags.writeable) == ((2, 3), np.dtype(np.float32), True)
    a[:] = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert bytes(ring.view(r)) == np.arange(6, dtype=np.float32).tobytes()
    ring.view(r)[:4] = np.float32(9).tobytes()
    assert a[0, 0] == 9.0
    assert ring.array(r, np.int64).tolist() == np.frombuffer(bytes(ring.view(r)), np.int64).tolist()
    assert ring.array(r, np.dtype("u1"), 24).shape == (24,)
    assert ring.array(r, "f4", [np.int64(3), 2]).shape == (3, 2)
    four = ring.reserve(4)
    assert ring.array(four, "i4", ()).shape == () and ring.array(four, "i4", [1, 1, 1]).shape == (1, 1, 1)


@pytest.mark.holds("H2D-3", "D2H-3")
def test_array_is_read_only_while_an_input_copy_reads_and_refused_until_an_output_is_valid() -> None:
    fake = FakeBackend()
    bridge, ring = Bridge(fake), HostRing(64)
    h = bridge.alloc_device(U8, 8)
    src = ring.reserve(8)
    ring.write(src, np.array([1.5, -2.0], dtype=np.float32))
    up = bridge.host_to_device(src, DeviceRange(h, 0, 8), sync=False, release=False)
    reading = ring.array(src, "f4")
    assert reading.tolist() == [1.5, -2.0] and not reading.flags.writeable
    fake.complete(up)
    bridge.poll()
    assert ring.array(src, "f4").flags.writeable
    dst = ring.reserve(8)
    down = bridge.device_to_host(DeviceRange(h, 0, 8), dst, sync=False)
    unchanged(ring, lambda: ring.array(dst, "f4"), "D2H-3")
    fake.complete(down)
    bridge.poll()
    assert ring.array(dst, "f4").tolist() == [1.5, -2.0]


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("nope", None), (object, None), (object(), None), (None, None), ("V0", None), (None.__class__, None),
     ("f4", [2, True]), ("f4", (-1, -2)),
     ("f4", 2.0), ("f4", [[2, 1]]), ("f4", "2")],
)  # fmt: skip
def test_array_refuses_what_is_not_a_dtype_of_fixed_items_or_a_shape(dtype: object, shape: object) -> None:
    ring = HostRing(16)
    r = ring.reserve(8)
    unchanged(ring, lambda: ring.array(r, dtype, shape), "ARG-1")


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize(("dtype", "shape"), [("f4", (3,)), ("f8", None), ("f4", (1, 1)), ("u1", 0), ("V3", None)])
def test_array_refuses_a_shape_that_does_not_fill_the_range_exactly(dtype: str, shape: object) -> None:
    ring = HostRing(16)
    r = ring.reserve(4) if shape is None and dtype == "f8" else ring.reserve(8)
    unchanged(ring, lambda: ring.array(r, dtype, shape), "RANGE-1")


# ------------------------------------------------------------------------------- blocking reserve


def blocked_reserve(ring: HostRing, nbytes: int, timeout: float | None) -> tuple[threading.Thread, list[object]]:
    """A thread blocked in `ring.reserve` (returned once it is waiting) and where its result lands."""
    out: list[object] = []

    def reserve() -> None:
        try:
            out.append(ring.reserve(nbytes, timeout=timeout))
        except Exception as e:
            out.append(e)

    thread = threading.Thread(target=reserve, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while ring._waiting == 0:  # the test waits for the thread to block; the ring never polls
        assert time.monotonic() < deadline and thread.is_alive(), out
        time.sleep(0.001)
    return thread, out


@pytest.mark.rejects("RING-2")
def test_reserve_without_a_timeout_refuses_at_once_and_with_one_when_it_passes() -> None:
    ring = HostRing(16)
    ring.reserve(12)
    unchanged(ring, lambda: ring.reserve(8), "RING-2")
    unchanged(ring, lambda: ring.reserve(8, timeout=0), "RING-2")
    start = time.monotonic()
    unchanged(ring, lambda: ring.reserve(8, timeout=0.05), "RING-2")
    assert time.monotonic() - start >= 0.05
    # larger than the ring: it could never fit, so no timeout makes it wait
    unchanged(ring, lambda: ring.reserve(17, timeout=None), "RING-2")


@pytest.mark.holds("RING-2")
def test_a_blocked_reserve_wakes_when_a_release_makes_room_and_not_before() -> None:
    ring = HostRing(16)
    a, b = ring.reserve(8), ring.reserve(8)
    thread, out = blocked_reserve(ring, 12, None)
    ring.release(b)  # 8 B free, but not where 12 contiguous bytes could go
    thread.join(0.05)
    assert thread.is_alive() and out == []
    ring.release(a)
    thread.join(10)
    assert not thread.is_alive()
    (r,) = out
    assert isinstance(r, HostRange) and (r.start, r.nbytes) == (16, 12) and ring._waiting == 0


@pytest.mark.holds("RING-2", "H2D-3")
def test_a_blocked_reserve_wakes_when_an_input_copy_completes_and_releases_its_bytes() -> None:
    fake = FakeBackend()
    bridge, ring = Bridge(fake), HostRing(16)
    h = bridge.alloc_device(U8, 16)
    src = ring.reserve(16)
    up = bridge.host_to_device(src, DeviceRange(h, 0, 16), sync=False)
    thread, out = blocked_reserve(ring, 16, 30.0)
    fake.complete(up)
    bridge.poll()
    thread.join(10)
    (r,) = out
    assert isinstance(r, HostRange) and (r.start, r.nbytes) == (16, 16)


@pytest.mark.rejects("RING-2")
def test_a_blocked_reserve_gives_up_at_its_timeout_with_nothing_reserved() -> None:
    ring = HostRing(16)
    ring.reserve(16)
    before = ring.snapshot()
    thread, out = blocked_reserve(ring, 4, 0.05)
    thread.join(10)
    (error,) = out
    with refused("RING-2"):
        raise error  # type: ignore[misc]
    assert ring.snapshot() == before and ring._waiting == 0


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("timeout", [-1, -0.5, math.nan, True, False, "1", [1], object()])
def test_reserve_refuses_a_timeout_that_is_not_none_or_seconds(timeout: object) -> None:
    ring = HostRing(16)
    unchanged(ring, lambda: ring.reserve(4, timeout=timeout), "ARG-1")  # type: ignore[arg-type]


@pytest.mark.holds("RING-2")
@pytest.mark.parametrize("timeout", [1.0, 1, 30.0])
def test_a_reserve_given_seconds_waits_for_room_whatever_the_seconds(timeout: float) -> None:
    """Only a timeout of 0 refuses at once: one of exactly 1 s (a float or an int) waits too."""
    ring = HostRing(16)
    first = ring.reserve(16)
    thread, out = blocked_reserve(ring, 8, timeout)
    thread.join(0.05)
    assert thread.is_alive() and out == []  # waiting, not refused
    ring.release(first)
    thread.join(10)
    (r,) = out
    assert isinstance(r, HostRange) and (r.start, r.nbytes) == (16, 8)


@pytest.mark.holds("RING-2")
def test_a_restore_that_makes_room_wakes_a_blocked_reserve() -> None:
    """`restore` can free the whole ring at once (a model checker going back to a state): a
    reserve asleep for room wakes to it, as it does to a release."""
    ring = HostRing(16)
    empty = ring.state()
    ring.reserve(16)
    thread, out = blocked_reserve(ring, 8, None)
    ring.restore(empty)
    thread.join(10)
    (r,) = out
    assert isinstance(r, HostRange) and (r.start, r.nbytes) == (0, 8)


@pytest.mark.holds("RING-2")
def test_a_reserve_whose_deadline_is_reached_exactly_gives_up_without_another_sleep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With `timeout` seconds passed to the tick (a coarse clock), the reserve is refused at
    once: the clock is read twice, for the deadline and for what is left, and never again."""
    import devbridge.ring.host

    ticks = iter([100.0, 101.0])

    def clock() -> float:
        tick = next(ticks, None)
        assert tick is not None, "the clock was read after the deadline was reached"
        return tick

    ring = HostRing(16)
    ring.reserve(16)
    before = ring.snapshot()
    monkeypatch.setattr(devbridge.ring.host, "time", type("Clock", (), {"monotonic": staticmethod(clock)}))
    with refused("RING-2"):
        ring.reserve(8, timeout=1.0)
    assert ring.snapshot() == before and ring._waiting == 0


@pytest.mark.holds("RING-2")
def test_a_reservation_that_fits_never_reads_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reserve that fits returns at once whatever its timeout: no deadline is computed and no
    waiter counted (the per-call path)."""
    import devbridge.ring.host

    def clock() -> float:
        raise AssertionError("a reservation that fits read the clock")

    ring = HostRing(16)
    monkeypatch.setattr(devbridge.ring.host, "time", type("Clock", (), {"monotonic": staticmethod(clock)}))
    for timeout in (0.0, 0, 1.0, 1, math.inf, None):
        r = ring.reserve(8, timeout=timeout)
        assert (r.start, r.nbytes, ring._waiting) == (ring.snapshot()[0] - 8, 8, 0)
        ring.release(r)


@pytest.mark.holds("RING-2")
def test_a_blocked_reserve_that_wraps_at_the_lap_end_fits_once_the_oldest_is_released() -> None:
    """Past the lap's end a reservation starts at the next lap (the skipped bytes are free):
    asleep for room, it wakes to a place the first reserve would have taken."""
    ring = HostRing(16)
    a, b = ring.reserve(6), ring.reserve(6)
    ring.release(a)
    c = ring.reserve(6)  # 12..18 does not fit the lap: starts at 16, the next lap's 0
    assert (c.start, ring.snapshot()[0]) == (16, 22)
    thread, out = blocked_reserve(ring, 8, None)  # 22 + 8 - 6 > 16: waits for b
    ring.release(b)
    thread.join(10)
    (r,) = out
    assert isinstance(r, HostRange) and (r.start, r.nbytes) == (22, 8)
    ring.release(c)
    ring.release(r)
    assert ring.reserve(10).start == 32  # 30 + 10 crosses the lap's end: the next lap's 0


def test_reserve_takes_an_infinite_timeout_and_numpy_seconds() -> None:
    ring = HostRing(16)
    assert ring.reserve(4, timeout=math.inf).nbytes == 4
    assert ring.reserve(4, timeout=np.float32(0.5)).nbytes == 4
    with pytest.raises(InvalidArgumentError):
        ring.reserve(4, timeout=np.float64("nan"))
