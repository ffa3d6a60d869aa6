"""The tinygrad backend on real memory (tinygrad's CPU device) and its compatibility module."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from harness import DEVICES
from rules import refused

from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec, TensorViewSpec
from devbridge.backends import tinygrad_compat as tg
from devbridge.backends.tinygrad import INLINE_MAX_BYTES, TinygradBackend, TinygradToken

F32 = ObjectSpec("x", "float32")


def test_compat_copies_are_exact_at_any_offset() -> None:
    buf = tg.allocate("CPU", 32)
    tg.copy_in(buf, 0, memoryview(bytearray(b"\x11" * 32)))
    tg.copy_in(buf, 5, memoryview(bytearray(b"abc")))
    out = memoryview(bytearray(b"\xff" * 6))
    tg.copy_out(out[1:5], buf, 4)
    assert bytes(out) == b"\xff\x11abc\xff"
    whole = memoryview(bytearray(32))
    tg.copy_out(whole, buf, 0)
    assert bytes(whole) == b"\x11" * 5 + b"abc" + b"\x11" * 24


def test_compat_tensor_view_is_zero_copy_and_host_bytes_alias_it() -> None:
    buf = tg.allocate("CPU", 16)
    view = tg.tensor_view(buf, 8, (2,), "float32")
    mem = tg.host_bytes(buf)
    assert mem is not None and len(mem) == 16
    mem[8:16] = np.array([1.5, -2.0], dtype=np.float32).tobytes()
    np.testing.assert_array_equal(view.numpy(), [1.5, -2.0])
    (view * 0 + 7).realize()  # compute on the view does not write back unless assigned
    view.assign(view * 2).realize()
    assert np.frombuffer(bytes(mem[8:16]), dtype=np.float32).tolist() == [3.0, -4.0]


def test_compat_marker_is_done_after_synchronize() -> None:
    probe = tg.marker("CPU")
    tg.synchronize("CPU")
    assert probe()
    assert tg.canonical_device("cpu") == "CPU" and tg.dtype_of("float16").itemsize == 2


def test_async_copy_overlaps_compute_and_releases_only_at_completion() -> None:
    backend = TinygradBackend("CPU")
    bridge, ring = Bridge(backend), HostRing(1 << 20)
    a, b = bridge.alloc_device(F32, 1 << 18), bridge.alloc_device(F32, 64 * 64 * 4)
    src = ring.reserve(1 << 18)
    ring.view(src)[:] = np.arange(1 << 16, dtype=np.float32).tobytes()
    zeros = ring.reserve(64 * 64 * 4)  # tinygrad's LRU cache may hand b over dirty: zero it
    bridge.host_to_device(zeros, DeviceRange(b, 0, 64 * 64 * 4))
    bv = bridge.wrap_for_tinygrad(b, TensorViewSpec((64, 64), "float32"))
    with backend.hold_copies():  # the copy thread is held at the start of the copy
        ev = bridge.host_to_device(src, DeviceRange(a, 0, 1 << 18), sync=False)
        # the call returned, the copy has not run: other work proceeds meanwhile
        with bridge.compute(b):
            bv.assign(bv + 1).realize()
        assert not ev.done() and not ring.released(src) and bridge.state(a) == "copying"
        np.testing.assert_array_equal(bv.numpy(), np.ones((64, 64), dtype=np.float32))
    ev.wait(timeout=30)
    assert ring.released(src) and ring.cursor == zeros.end  # the zeros were released on return
    out = ring.reserve(1 << 18)
    bridge.device_to_host(DeviceRange(a, 0, 1 << 18), out)
    np.testing.assert_array_equal(np.frombuffer(ring.view(out), dtype=np.float32), np.arange(1 << 16))


def test_copy_thread_completions_reach_the_bridge_from_another_thread() -> None:
    backend = TinygradBackend("CPU")
    n = INLINE_MAX_BYTES + 256  # larger than a copy made at submission: the copy thread runs them
    bridge, ring = Bridge(backend), HostRing(16 * n)
    x = bridge.alloc_device(ObjectSpec("b", "uint8"), 16 * n)
    events = []
    for i in range(16):
        src = ring.reserve(n)
        ring.view(src)[:] = bytes([i]) * n
        events.append((bridge.host_to_device(src, DeviceRange(x, n * i, n), sync=False), src))
    assert all(isinstance(ev.backend_token, TinygradToken) and ev.backend_token.future for ev, _ in events)
    for ev, src in events:
        ev.wait(timeout=30)
        assert ring.released(src)
    assert threading.active_count() >= 2 and bridge.stats()["pending_events"] == 0
    out = ring.reserve(16 * n)
    bridge.device_to_host(DeviceRange(x, 0, 16 * n), out)
    assert bytes(ring.view(out)) == b"".join(bytes([i]) * n for i in range(16))


def test_small_async_copies_to_an_idle_cpu_finish_at_submission(monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to INLINE_MAX_BYTES on an idle CPU device an asynchronous copy is a memmove made at once
    (done on return, no copy thread); larger, held (hold_copies) or with work queued, it goes to
    the copy thread. Byte-exact either way."""
    backend = TinygradBackend("CPU")
    size = 2 * INLINE_MAX_BYTES
    bridge, ring = Bridge(backend), HostRing(8 * size)
    h = bridge.alloc_device(ObjectSpec("blob", "uint8"), size)
    record = bridge._core.allocation(h.id)
    assert record is not None
    counted = CountingCopies(monkeypatch, record.memory)
    rng = np.random.default_rng(3)
    expected = bytearray(size)
    bridge.host_to_device(ring.reserve(size), DeviceRange(h, 0, size))  # memory is not zeroed on allocation

    def copy(n: int, *, at_once: bool) -> None:
        offset = int(rng.integers(0, size - n + 1))
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        src = ring.reserve(n)
        ring.view(src)[:] = data
        direct = backend.direct_copies
        ev = bridge.host_to_device(src, DeviceRange(h, offset, n), sync=False)
        token = ev.backend_token
        assert isinstance(token, TinygradToken) and (token.future is None) is at_once
        if at_once:  # (the copy thread may finish one just as fast: only the route is certain then)
            assert ev.done() and ring.released(src)
        assert backend.direct_copies == direct + at_once
        ev.wait(timeout=30)
        expected[offset : offset + n] = data
        out = ring.reserve(n)
        back = bridge.device_to_host(DeviceRange(h, offset, n), out, sync=False)
        assert back.done() or not at_once
        back.wait(timeout=30)
        assert bytes(ring.view(out)) == data
        ring.release(out)

    for n in (1, 64, 4096, INLINE_MAX_BYTES):
        copy(n, at_once=True)
    copy(INLINE_MAX_BYTES + 1, at_once=False)
    with backend.hold_copies():
        src = ring.reserve(64)
        held = bridge.host_to_device(src, DeviceRange(h, 0, 64), sync=False)
        assert not held.done() and isinstance(held.backend_token, TinygradToken) and held.backend_token.future
    held.wait(timeout=30)
    expected[:64] = bytes(64)  # the ring's bytes there were zero
    monkeypatch.setattr(backend, "_idle", lambda: False)  # work queued: the copy thread, not a memmove
    copy(64, at_once=False)
    assert counted.calls == []  # neither way goes through the allocator
    out = ring.reserve(size)
    bridge.device_to_host(DeviceRange(h, 0, size), out)
    assert bytes(ring.view(out)) == bytes(expected)


def test_free_parks_the_buffer_until_the_device_is_done_and_views_keep_memory_alive() -> None:
    backend = TinygradBackend("CPU")
    bridge, ring = Bridge(backend), HostRing(64)
    x = bridge.alloc_device(F32, 16)
    src = ring.reserve(16)
    ring.view(src)[:] = np.array([1, 2, 3, 4], dtype=np.float32).tobytes()
    bridge.host_to_device(src, DeviceRange(x, 0, 16))  # device memory is not zeroed: write it
    view = bridge.wrap_for_tinygrad(x, TensorViewSpec((4,), "float32"))
    lazy = view + 1  # a lazy graph that still refers to the memory: it pins the allocation (VIEW-3)
    del view
    gc.collect()
    bridge.poll()
    bridge.free_device(x)
    assert bridge.state(x) == "free_pending"
    np.testing.assert_array_equal(lazy.numpy(), [2, 3, 4, 5])  # the memory is still the allocation's
    del lazy
    assert bridge.poll() == 1 and bridge.state(x) == "freed"
    backend.synchronize()
    assert backend.parked == 0


def test_free_drops_the_buffer_at_once_on_an_idle_device_and_parks_it_while_work_is_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = TinygradBackend("CPU")
    tg.synchronize("CPU")
    backend.free(backend.alloc(64, "uint8"))
    assert backend.parked == 0
    monkeypatch.setattr(backend, "_idle", lambda: False)  # work queued: it may still use the buffer
    queued = [False]  # the marker taken at the free: done once the device finished that work
    monkeypatch.setattr(backend, "_markers", lambda: lambda: queued[0])
    backend.free(backend.alloc(64, "uint8"))
    backend.free(backend.alloc(64, "uint8"))
    assert backend.parked == 2
    backend.alloc(64, "uint8")  # every call reaps what the device finished with: not yet
    assert backend.parked == 2
    queued[0] = True
    backend.alloc(64, "uint8")
    assert backend.parked == 0


def test_allocation_failure_maps_to_backend_error() -> None:

    bridge = Bridge(TinygradBackend("CPU"))
    with refused("ALLOC-2"):
        bridge.alloc_device(ObjectSpec("huge", "uint8"), 1 << 46)


def test_a_sync_copy_lands_after_the_async_copies_issued_before_it() -> None:
    """Regression: an async host_to_device A then a sync host_to_device B into the same bytes
    left A's bytes on the device in about 1 run in 10 (the copy thread ran A after B)."""
    bridge, ring = Bridge(TinygradBackend("CPU")), HostRing(1 << 16)
    h = bridge.alloc_device(ObjectSpec("x", "uint8"), 64)
    wrong = 0
    for k in range(2000):
        a, b = ring.reserve(64), ring.reserve(64)
        ring.view(a)[:] = bytes([k % 251]) * 64
        ring.view(b)[:] = bytes([(k % 251) + 1]) * 64
        first = bridge.host_to_device(a, DeviceRange(h, 0, 64), sync=False)
        bridge.host_to_device(b, DeviceRange(h, 0, 64), sync=True)
        first.wait(timeout=30)
        out = ring.reserve(64)
        bridge.device_to_host(DeviceRange(h, 0, 64), out)
        wrong += bytes(ring.view(out)) != bytes([(k % 251) + 1]) * 64
        ring.release(out)
    assert wrong == 0


def test_a_sync_read_sees_the_async_write_issued_before_it() -> None:
    """Regression: a sync device_to_host issued after a queued async host_to_device of the
    same bytes returned the old bytes."""
    bridge, ring = Bridge(TinygradBackend("CPU")), HostRing(1 << 16)
    h = bridge.alloc_device(ObjectSpec("x", "uint8"), 64)
    stale = 0
    for k in range(2000):
        src = ring.reserve(64)
        ring.view(src)[:] = bytes([k % 251]) * 64
        bridge.host_to_device(src, DeviceRange(h, 0, 64), sync=False)
        out = ring.reserve(64)
        bridge.device_to_host(DeviceRange(h, 0, 64), out)
        stale += bytes(ring.view(out)) != bytes([k % 251]) * 64
        ring.release(out)
        bridge.poll()
    assert stale == 0


class CountingCopies:
    """Counts the CPU allocator's _copyin/_copyout calls (the path that synchronizes first)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, buffer: object) -> None:
        allocator = buffer.allocator  # type: ignore[attr-defined]
        self.calls: list[str] = []
        for name in ("_copyin", "_copyout"):
            original = getattr(allocator, name)
            monkeypatch.setattr(allocator, name, self._counted(name, original))

    def _counted(self, name: str, original: object) -> object:
        def call(*args: object) -> object:
            self.calls.append(name)
            return original(*args)  # type: ignore[operator]

        return call


def test_sync_copies_on_an_idle_cpu_device_are_a_memmove_and_byte_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = TinygradBackend("CPU")
    bridge, ring = Bridge(backend), HostRing(1 << 16)
    h = bridge.alloc_device(ObjectSpec("blob", "uint8"), 256)
    record = bridge._core.allocation(h.id)
    assert record is not None
    counted = CountingCopies(monkeypatch, record.memory)
    rng = np.random.default_rng(7)
    expected = bytearray(256)  # device memory is not zeroed on allocation (tinygrad's LRU cache): zero it
    zeros = ring.reserve(256)
    bridge.host_to_device(zeros, DeviceRange(h, 0, 256))
    for _ in range(200):
        offset = int(rng.integers(0, 255))
        n = int(rng.integers(1, 256 - offset + 1))
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        src = ring.reserve(n)
        ring.view(src)[:] = data
        bridge.host_to_device(src, DeviceRange(h, offset, n))
        expected[offset : offset + n] = data
        out = ring.reserve(256)
        bridge.device_to_host(DeviceRange(h, 0, 256), out)
        assert bytes(ring.view(out)) == bytes(expected)
        ring.release(out)
    assert backend.direct_copies == 401 and counted.calls == []  # never through the allocator


def test_sync_copies_go_through_the_allocator_while_the_device_reports_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """With work queued (the probe false) a synchronous copy takes `_copyin`/`_copyout`, which
    synchronize first; the bytes are the same. (tinygrad's CPU realize() returns once its kernel
    ran, so the test makes the device report queued work through the probe.)"""
    backend = TinygradBackend("CPU")
    bridge, ring = Bridge(backend), HostRing(1 << 12)
    h = bridge.alloc_device(ObjectSpec("blob", "uint8"), 64)
    record = bridge._core.allocation(h.id)
    assert record is not None
    bridge.host_to_device(ring.reserve(64), DeviceRange(h, 0, 64))  # zeros: memory is not zeroed on allocation
    counted = CountingCopies(monkeypatch, record.memory)
    monkeypatch.setattr(backend, "_idle", lambda: False)
    src = ring.reserve(16)
    ring.view(src)[:] = bytes(range(16))
    bridge.host_to_device(src, DeviceRange(h, 8, 16))
    out = ring.reserve(32)
    bridge.device_to_host(DeviceRange(h, 0, 32), out)
    assert bytes(ring.view(out)) == bytes(8) + bytes(range(16)) + bytes(8)
    assert counted.calls == ["_copyin", "_copyout"] and backend.direct_copies == 1  # only the zeroing


def test_the_idle_probe_reads_what_synchronize_waits_for() -> None:
    """After synchronize() the CPU device is idle; a lazy op realized runs to completion (tinygrad's
    CPU realize waits for its kernel), so the device is idle again after it."""
    probe = tg.idle_probe("CPU")
    assert probe is not None and tg.idle_probe("CPU") is not probe  # a fresh probe per call
    tg.synchronize("CPU")
    assert probe() is True
    from tinygrad.tensor import Tensor

    (Tensor.ones(256, 256, device="CPU") @ Tensor.ones(256, 256, device="CPU")).realize()
    tg.synchronize("CPU")
    assert probe() is True
    assert tg.host_address(memoryview(b"read-only")) is None  # no address: the allocator path


@pytest.mark.parametrize("device", DEVICES)
def test_poll_finishes_a_download_launched_behind_a_compute_once(device: str) -> None:
    """poll() finishes a compute; that launches the download held behind it (ORDER-1), which an
    idle device finishes at once: poll must not reach it again in its own list (it raised KeyError
    there and left the bookkeeping half-updated; the reference worker hit it on CL)."""
    backend = TinygradBackend(device)
    bridge, ring = Bridge(backend), HostRing(64)
    src, out = ring.reserve(1), ring.reserve(1)
    ring.view(src)[:] = b"\x01"
    h = bridge.alloc_device(ObjectSpec("o", "bool", role="data"), 2)
    bridge.host_to_device(src, DeviceRange(h, 0, 1))
    comp = bridge.compute(h)  # not waited for
    down = bridge.device_to_host(DeviceRange(h, 0, 1), out, sync=False)  # held behind the compute
    view = bridge.wrap_for_tinygrad(h, TensorViewSpec((1,), "bool", 0))
    gc.collect()
    assert backend.wait(comp.backend_token, 30)  # the device is done with the compute; the bridge is not told
    finished = bridge.poll()  # on CL its completion callback may have told the bridge already
    assert finished == 1 or device == "CL"
    down.wait(timeout=30)
    assert comp.done() and comp.error is None and down.error is None
    assert bytes(ring.view(out)) == b"\x01" and bridge.stats()["pending_events"] == 0
    del view
