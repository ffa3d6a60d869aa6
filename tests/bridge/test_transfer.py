"""`Bridge.upload` and `Bridge.download`: a numpy array into an allocation and out of it in one
call, through the caller's ring or the bridge's own host bytes, on every backend."""

from __future__ import annotations

import numpy as np
import pytest
from harness import HARNESSES, Harness
from rules import refused

from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec
from devbridge.bridge.transfer import STAGING_BYTES
from devbridge.testing import FakeBackend

F32 = ObjectSpec("x", "float32")


@pytest.fixture(params=list(HARNESSES))
def h(request: pytest.FixtureRequest) -> Harness:
    return HARNESSES[request.param]()


@pytest.mark.holds("H2D-1", "D2H-1", "H2D-2")
def test_upload_then_download_moves_exactly_the_arrays_bytes(h: Harness) -> None:
    x = h.bridge.alloc_device(F32, 64)
    a = np.arange(16, dtype=np.float32) - 7.5
    ev = h.bridge.upload(x, a)
    assert ev.done() and ev.error is None
    assert h.backend_ops("copy_in", "copy_out") == ["copy_in"]
    np.testing.assert_array_equal(h.bridge.download(x, np.float32, 16), a)
    np.testing.assert_array_equal(h.bridge.download(x, "f4", (2, 2), offset=16), a[4:8].reshape(2, 2))
    assert h.backend_ops("copy_in", "copy_out") == ["copy_in", "copy_out", "copy_out"]
    # another dtype over the same bytes, at an offset: the device holds bytes, not an array
    h.bridge.upload(x, np.array([1, 2], dtype=np.int16), offset=60)
    assert h.bridge.download(x, np.int16, 2, offset=60).tolist() == [1, 2]
    assert h.bridge.download(x, np.float32, 15).tolist() == a[:15].tolist()


@pytest.mark.holds("H2D-3")
def test_an_asynchronous_upload_returns_its_event_and_the_download_after_it_reads_its_bytes(h: Harness) -> None:
    x = h.bridge.alloc_device(F32, 4096)
    a = np.linspace(0, 1, 1024, dtype=np.float32)
    ev = h.bridge.upload(x, a, sync=False)
    h.settle(ev)
    assert ev.done() and ev.error is None
    np.testing.assert_array_equal(h.bridge.download(x, np.float32, 1024), a)


@pytest.mark.holds("H2D-2", "D2H-2")
def test_through_the_callers_ring_every_byte_it_reserved_is_released_on_return() -> None:
    fake = FakeBackend()
    bridge, ring = Bridge(fake), HostRing(64)
    x = bridge.alloc_device(F32, 16)
    bridge.upload(x, b"0123456789abcdef", ring=ring)
    assert (ring.head, ring.cursor) == (16, 16)
    out = bridge.download(x, np.uint8, 16, ring=ring)
    assert out.tobytes() == b"0123456789abcdef" and (ring.head, ring.cursor) == (32, 32)
    out[:] = 0  # the caller's own array, not the ring's bytes
    assert fake.device_bytes(0) == b"0123456789abcdef"


@pytest.mark.holds("H2D-3")
def test_an_asynchronous_upload_through_the_callers_ring_releases_its_bytes_when_it_completes() -> None:
    fake = FakeBackend()
    bridge, ring = Bridge(fake), HostRing(64)
    x = bridge.alloc_device(F32, 16)
    ev = bridge.upload(x, np.ones(4, np.float32), ring=ring, sync=False)
    assert not ev.done() and ring.cursor == 0 and [r.nbytes for r in ring.unreleased()] == [16]
    fake.complete(ev)
    bridge.poll()
    assert ring.cursor == 16 and ring.unreleased() == []


def test_uploads_larger_than_the_staging_ring_and_many_in_a_row_use_host_memory_of_their_own() -> None:
    fake = FakeBackend()
    bridge = Bridge(fake)
    big = bridge.alloc_device(F32, STAGING_BYTES + 4)
    a = np.arange((STAGING_BYTES + 4) // 4, dtype=np.float32)
    bridge.upload(big, a)
    np.testing.assert_array_equal(bridge.download(big, np.float32, a.size), a)
    small = bridge.alloc_device(F32, 4)
    held = [bridge.upload(small, np.float32(i).tobytes(), sync=False) for i in range(3)]  # none completes yet
    assert [e.done() for e in held] == [False, False, False]
    fake.complete_all()
    bridge.poll()
    assert bridge.download(small, np.float32, 1).tolist() == [2.0]


@pytest.mark.rejects("COPY-F")
def test_a_failed_upload_raises_and_leaves_no_byte_of_the_callers_ring_reserved() -> None:
    fake = FakeBackend()
    bridge, ring = Bridge(fake), HostRing(64)
    x = bridge.alloc_device(F32, 16)
    fake.fail_next("copy_in")
    with refused("COPY-F"):
        bridge.upload(x, bytes(16), ring=ring)
    assert ring.unreleased() == [] and ring.cursor == ring.head == 16
    fake.fail_next("copy_out")
    with refused("COPY-F"):
        bridge.download(x, np.uint8, 16, ring=ring)
    assert ring.unreleased() == [] and ring.cursor == ring.head == 32


@pytest.mark.rejects("ARG-1", "RANGE-1", "HANDLE-1", "USE-1", "GEN-2")
def test_a_refused_upload_or_download_reserves_nothing_and_calls_no_backend() -> None:
    fake = FakeBackend()
    bridge, ring = Bridge(fake), HostRing(64)
    x = bridge.alloc_device(F32, 16)
    freed = bridge.alloc_device(F32, 16)
    bridge.free_device(freed)
    forged = type(x)(x.id, x.generation, x.extent, x.spec, x.owner, x.seal + 1)
    calls = len(fake.calls)
    cases = [
        ("ARG-1", lambda: bridge.upload(x, object(), ring=ring)),
        ("ARG-1", lambda: bridge.upload(x, np.zeros((4, 4), np.float32)[:, :1], ring=ring)),
        ("ARG-1", lambda: bridge.upload(x, bytes(16), ring=ring, sync="yes")),  # type: ignore[arg-type]
        ("ARG-1", lambda: bridge.download(x, "nope", 4, ring=ring)),
        ("ARG-1", lambda: bridge.download(x, np.float32, [-1], ring=ring)),
        ("RANGE-1", lambda: bridge.download(x, np.float32, None, ring=ring)),
        ("RANGE-1", lambda: bridge.upload(x, bytes(17), ring=ring)),
        ("RANGE-1", lambda: bridge.upload(x, bytes(0), ring=ring)),
        ("RANGE-1", lambda: bridge.upload(x, bytes(8), offset=9, ring=ring)),
        ("RANGE-1", lambda: bridge.download(x, np.float32, 4, offset=-4, ring=ring)),
        ("RANGE-1", lambda: bridge.download(x, np.float32, 5, ring=ring)),
        ("RANGE-1", lambda: bridge.upload(x, bytes(16), ring=bytearray(64))),  # type: ignore[arg-type]
        ("HANDLE-1", lambda: bridge.upload(forged, bytes(16), ring=ring)),
        ("HANDLE-1", lambda: bridge.download("x", np.uint8, 4, ring=ring)),  # type: ignore[arg-type]
        ("USE-1", lambda: bridge.upload(freed, bytes(16), ring=ring)),
        ("USE-1", lambda: bridge.download(freed, np.uint8, 16, ring=ring)),
    ]
    before = (ring.snapshot(), bridge.stats(), bridge.state(x))
    for rule, call in cases:
        with refused(rule):
            call()
        assert (ring.snapshot(), bridge.stats(), bridge.state(x)) == before, rule
    bridge.restart()
    with refused("GEN-2"):
        bridge.upload(x, bytes(16), ring=ring)
    assert ring.snapshot() == before[0] and [c.op for c in fake.calls[calls:]] == ["free"]


def test_upload_and_download_check_the_device_range_first() -> None:
    bridge = Bridge(FakeBackend())
    x = bridge.alloc_device(F32, 16)
    bridge.check_device_range(DeviceRange(x, 0, 16))
    with refused("RANGE-1"):
        bridge.check_device_range(DeviceRange(x, 8, 16))
    with refused("RANGE-1"):
        bridge.check_device_range((x, 0, 16))  # type: ignore[arg-type]
