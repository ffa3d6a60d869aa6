"""Restart and generations (GEN-1, GEN-2)."""

from __future__ import annotations

import gc

import pytest
from rules import assert_each_refused, assert_refused
from support import U8, put, read_device, world

from devbridge import Bridge, DeviceRange, HostRing, OutputNotReadyError, StaleHandleError, TensorViewSpec
from devbridge.backends.fake import Call, FakeBackend, FakeViolation


@pytest.mark.holds("GEN-1")
@pytest.mark.rejects("GEN-1")
def test_restart_releases_idle_memory_now_and_busy_memory_once_the_backend_is_done(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    idle, busy, freed = (bridge.alloc_device(U8, 8) for _ in range(3))
    src = put(ring, b"inflight")
    ev = bridge.host_to_device(src, DeviceRange(busy, 0, 8), sync=False)
    bridge.free_device(freed)
    bridge.restart()
    assert bridge.generation == 1
    assert [bridge.state(h) for h in (idle, busy, freed)] == ["stale", "stale_pending", "stale"]
    assert [c.buffer for c in fake.calls if c.op == "free"] == [2, 0]  # freed before, idle now; not busy
    assert not ev.done()  # the backend still uses the memory
    fake.complete(ev)
    assert [c.buffer for c in fake.calls if c.op == "free"] == [2, 0, 1]
    assert bridge.state(busy) == "stale" and fake.live_allocations == 0
    assert_refused(ev.error, "GEN-1")  # the old generation's event cannot complete as done
    with pytest.raises(StaleHandleError, match="aborted by restart"):
        ev.wait()
    # the aborted input's host bytes stay unreleased, so the worker can retry in the new generation
    assert not ring.released(src)
    fresh = bridge.alloc_device(U8, 8)
    bridge.host_to_device(src, DeviceRange(fresh, 0, 8))
    assert ring.released(src) and read_device(bridge, ring, fresh, 0, 8) == b"inflight"
    assert bridge.stats().aborted == 1 and bridge.stats().restarts == 1


@pytest.mark.holds("GEN-1")
def test_restart_aborted_output_is_never_readable(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 4)
    out = ring.reserve(4)
    ev = bridge.device_to_host(DeviceRange(h, 0, 4), out, sync=False)
    bridge.restart()
    fake.complete(ev)  # the data did move, but from a dead generation
    with pytest.raises(OutputNotReadyError):
        ring.view(out)
    ring.release(out)
    assert ring.released(out)


@pytest.mark.holds("GEN-1", "VIEW-3")
def test_a_view_outliving_a_restart_keeps_old_memory_until_collected(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(U8, 4)
    view = bridge.wrap_for_tinygrad(h, TensorViewSpec((4,), "uint8"))
    bridge.restart()
    assert bridge.state(h) == "stale_pending" and "free" not in fake.ops()
    del view
    gc.collect()
    assert bridge.state(h) == "stale" and fake.ops().count("free") == 1


@pytest.mark.holds("GEN-1")
def test_restart_never_frees_memory_twice(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(U8, 4)
    bridge.free_device(h)
    bridge.restart()
    bridge.restart()
    assert fake.ops() == ["alloc", "free"] and bridge.state(h) == "stale"


@pytest.mark.holds("GEN-2")
def test_new_generation_handles_work_after_restart(bridge: Bridge, ring: HostRing) -> None:
    bridge.restart()
    h = bridge.alloc_device(U8, 4)
    assert h.generation == 1 and bridge.state(h) == "allocated"
    bridge.host_to_device(put(ring, b"gen1"), DeviceRange(h, 0, 4))
    assert read_device(bridge, ring, h, 0, 4) == b"gen1"


@pytest.mark.rejects("GEN-2")
@pytest.mark.parametrize("busy", [False, True])
def test_old_generation_handles_are_rejected_without_a_backend_call(
    bridge: Bridge, fake: FakeBackend, ring: HostRing, busy: bool
) -> None:
    h = bridge.alloc_device(U8, 8)
    if busy:
        bridge.compute(h)
    bridge.restart()
    src, out = put(ring, b"12345678"), ring.reserve(8)
    calls = [
        lambda: bridge.free_device(h),
        lambda: bridge.host_to_device(src, DeviceRange(h, 0, 8)),
        lambda: bridge.device_to_host(DeviceRange(h, 0, 8), out),
        lambda: bridge.compute(h),
        lambda: bridge.wrap_for_tinygrad(h, TensorViewSpec((8,), "uint8")),
    ]
    assert_each_refused("GEN-2", calls, world(bridge, fake, ring, [h]))


def test_fake_refuses_old_generation_buffers_on_its_own(fake: FakeBackend) -> None:
    buf = fake.alloc(8, "uint8")
    fake.begin_generation(1)
    with pytest.raises(FakeViolation, match="old generation"):
        fake.copy_in(buf, 0, memoryview(b"x"), sync=True)
    fake.free(buf)  # releasing old memory is allowed
    assert fake.live_allocations == 0


def test_fake_refuses_to_free_busy_or_freed_memory(fake: FakeBackend) -> None:
    buf = fake.alloc(8, "uint8")
    ev = fake.compute([buf])
    with pytest.raises(FakeViolation, match=r"freed while events \[0\] use it"):
        fake.free(buf)
    fake.complete(ev)
    fake.free(buf)
    with pytest.raises(FakeViolation, match="freed twice"):
        fake.free(buf)
    assert len(fake.violations) == 2


@pytest.mark.holds("GEN-1")
def test_restart_tells_the_backend_the_new_generation(bridge: Bridge, fake: FakeBackend) -> None:
    bridge.restart()
    bridge.restart()
    assert (bridge.generation, fake.generation) == (2, 2)
    h = bridge.alloc_device(U8, 4)
    assert h.generation == 2 and fake.calls == [Call("alloc", 0, 0, 4, generation=2)]
