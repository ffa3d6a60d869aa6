"""The core's behaviour on every backend: one suite, parametrised (fake and tinygrad in CI)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest
from harness import HARNESSES, Harness

from devbridge import (
    ComputeError,
    DeviceAllocationError,
    DeviceCopyError,
    DeviceHandle,
    DeviceRange,
    HostRange,
    InvalidViewError,
    ObjectSpec,
    OutputCopyError,
    OutputNotReadyError,
    StaleHandleError,
    TensorViewSpec,
)

U8 = ObjectSpec("blob", "uint8")
F32 = ObjectSpec("x", "float32")


@pytest.fixture(params=list(HARNESSES))
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    harness = HARNESSES[request.param]()
    yield harness
    gc.collect()


def put(h: Harness, data: bytes) -> HostRange:
    r = h.ring.reserve(len(data))
    h.ring.view(r)[:] = data
    return r


def read(h: Harness, handle: DeviceHandle, offset: int, nbytes: int) -> bytes:
    out = h.ring.reserve(nbytes)
    h.bridge.device_to_host(DeviceRange(handle, offset, nbytes), out)
    data = bytes(h.ring.view(out))
    h.ring.release(out)
    return data


def test_sync_copies_touch_exactly_their_ranges(h: Harness) -> None:
    x = h.bridge.alloc_device(U8, 64)
    h.bridge.host_to_device(put(h, b"\xaa" * 64), DeviceRange(x, 0, 64))  # guard pattern on real memory
    src = put(h, bytes(range(100, 120)))
    h.bridge.host_to_device(src.sub(4, 10), DeviceRange(x, 30, 10))
    assert h.ring.released(src.sub(4, 10)) and not h.ring.released(src.sub(0, 4))
    assert read(h, x, 0, 64) == b"\xaa" * 30 + bytes(range(104, 114)) + b"\xaa" * 24
    out = put(h, b"\xee" * 12)
    h.bridge.device_to_host(DeviceRange(x, 33, 4), out.sub(4, 4))
    assert bytes(h.ring.view(out)) == b"\xee" * 4 + bytes(range(107, 111)) + b"\xee" * 4


def test_async_input_is_released_exactly_at_completion(h: Harness) -> None:
    x = h.bridge.alloc_device(U8, 16)
    src = put(h, b"async in bytes!!")
    with h.hold():
        ev = h.bridge.host_to_device(src, DeviceRange(x, 0, 16), sync=False)
        assert not ev.done() and not h.ring.released(src) and h.bridge.state(x) == "copying"
    h.settle(ev)
    assert ev.done() and ev.error is None and h.ring.released(src)
    assert h.bridge.state(x) == "idle" and read(h, x, 0, 16) == b"async in bytes!!"


def test_async_output_is_readable_only_at_completion(h: Harness) -> None:
    x = h.bridge.alloc_device(U8, 8)
    h.bridge.host_to_device(put(h, b"OUTBYTES"), DeviceRange(x, 0, 8))
    out = h.ring.reserve(8)
    with h.hold():
        ev = h.bridge.device_to_host(DeviceRange(x, 0, 8), out, sync=False)
        with pytest.raises(OutputNotReadyError):
            h.ring.view(out)
    h.settle(ev)
    assert bytes(h.ring.view(out)) == b"OUTBYTES"


def test_free_is_deferred_until_the_copy_completes(h: Harness) -> None:
    x = h.bridge.alloc_device(U8, 8)
    src = put(h, b"deferred")
    with h.hold():
        ev = h.bridge.host_to_device(src, DeviceRange(x, 0, 8), sync=False)
        h.bridge.free_device(x)
        assert h.bridge.state(x) == "free_pending" and h.backend_ops("free") == []
    h.settle(ev)
    assert h.bridge.state(x) == "freed" and h.backend_ops("alloc", "copy_in", "free") == ["alloc", "copy_in", "free"]


def test_restart_releases_old_memory_once_after_the_backend_is_done(h: Harness) -> None:
    idle, busy = h.bridge.alloc_device(U8, 8), h.bridge.alloc_device(U8, 8)
    src = put(h, b"restart!")
    with h.hold():
        ev = h.bridge.host_to_device(src, DeviceRange(busy, 0, 8), sync=False)
        h.bridge.restart()
        assert (h.bridge.state(idle), h.bridge.state(busy)) == ("stale", "stale_pending")
        assert h.backend_ops("free") == ["free"]
    h.settle(ev)
    assert h.bridge.state(busy) == "stale" and h.backend_ops("free") == ["free", "free"]
    assert isinstance(ev.error, StaleHandleError) and not h.ring.released(src)
    before = list(h.backend.ops)
    with pytest.raises(StaleHandleError):
        h.bridge.host_to_device(src, DeviceRange(busy, 0, 8))
    assert list(h.backend.ops) == before  # rejected before any backend call
    fresh = h.bridge.alloc_device(U8, 8)
    h.bridge.host_to_device(src, DeviceRange(fresh, 0, 8))
    assert read(h, fresh, 0, 8) == b"restart!"


def test_injected_faults_surface_as_typed_errors(h: Harness) -> None:
    h.backend.fail_next("alloc")
    with pytest.raises(DeviceAllocationError):
        h.bridge.alloc_device(U8, 8)
    x = h.bridge.alloc_device(U8, 8)
    src = put(h, b"faulty!!")
    h.backend.fail_next("copy_in")
    with pytest.raises(DeviceCopyError):
        h.bridge.host_to_device(src, DeviceRange(x, 0, 8))
    h.backend.fail_next("copy_in")
    ev = h.bridge.host_to_device(src, DeviceRange(x, 0, 8), sync=False)
    h.settle(ev)
    assert isinstance(ev.error, DeviceCopyError) and not h.ring.released(src)
    out = h.ring.reserve(8)
    h.backend.fail_next("copy_out")
    ev = h.bridge.device_to_host(DeviceRange(x, 0, 8), out, sync=False)
    h.settle(ev)
    assert isinstance(ev.error, OutputCopyError)
    with pytest.raises(OutputNotReadyError):
        h.ring.view(out)
    h.backend.fail_next("view")
    with pytest.raises(InvalidViewError):
        h.bridge.wrap_for_tinygrad(x, TensorViewSpec((8,), "uint8"))
    h.backend.fail_next("compute")
    comp = h.bridge.compute(x)
    h.settle(comp)
    assert isinstance(comp.error, ComputeError) and h.bridge.state(x) == "idle"
    assert h.bridge.stats().copy_failures == 3 and h.bridge.stats().compute_failures == 1


def test_views_share_memory_and_compute_like_numpy(h: Harness) -> None:
    x, y = h.bridge.alloc_device(F32, 64), h.bridge.alloc_device(F32, 64)
    xv = h.bridge.wrap_for_tinygrad(x, TensorViewSpec((4, 4), "float32"))
    yv = h.bridge.wrap_for_tinygrad(y, TensorViewSpec((4, 4), "float32"))
    data = np.arange(16, dtype=np.float32).reshape(4, 4)
    h.bridge.host_to_device(put(h, data.tobytes()), DeviceRange(x, 0, 64))
    np.testing.assert_array_equal(xv.numpy(), data)  # written after wrapping, seen by the view
    with h.bridge.compute(x, y) as ev:
        yv.assign(xv @ xv + 1).realize()
    h.settle(ev)
    got = np.frombuffer(read(h, y, 0, 64), dtype=np.float32).reshape(4, 4)
    np.testing.assert_allclose(got, data @ data + 1)


def test_a_live_view_defers_the_free(h: Harness) -> None:
    x = h.bridge.alloc_device(U8, 8)
    view = h.bridge.wrap_for_tinygrad(x, TensorViewSpec((8,), "uint8"))
    h.bridge.free_device(x)
    assert h.bridge.state(x) == "free_pending" and h.backend_ops("free") == []
    del view
    gc.collect()
    assert h.bridge.poll() == 1 and h.bridge.state(x) == "freed" and h.backend_ops("free") == ["free"]
