"""The tinygrad backend on real memory (tinygrad's CPU device) and its compatibility module."""

from __future__ import annotations

import gc
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from harness import DEVICES
from rules import refused

from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec, TensorViewSpec
from devbridge.backends import tinygrad as tinygrad_backend
from devbridge.backends import tinygrad_compat as tg
from devbridge.backends.base import BackendError
from devbridge.backends.tinygrad import INLINE_MAX_BYTES, VIEW_COPY_MAX_BYTES, TinygradBackend, TinygradToken

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
    assert threading.active_count() >= 2 and bridge.stats().pending_events == 0
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

    assert INLINE_MAX_BYTES == 64 << 10  # the documented threshold: 64 KiB at once, a byte more on the thread
    for n in (1, 64, 4096, 65536):
        copy(n, at_once=True)
    copy(65537, at_once=False)
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
    first, second = backend.alloc(64, "uint8"), backend.alloc(64, "uint8")
    backend.free(first)  # parked, then its marker is done too
    later = [False]
    monkeypatch.setattr(backend, "_markers", lambda: lambda: later[0])
    backend.free(second)  # a free reaps as well: the first goes, this one stays
    assert backend.parked == 1


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
    assert bytes(ring.view(out)) == b"\x01" and bridge.stats().pending_events == 0
    del view


def test_waiting_on_a_device_marker_pauses_50_us_doubling_to_2_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OS primitive signals a marker (the CPU device's work): a wait queries it again after a
    pause that starts at 50 µs and doubles up to 2 ms, so a short wait stays short and a long one
    costs a query every 2 ms, never a spinning core."""
    import types

    from devbridge.backends import tinygrad as module

    backend = TinygradBackend("CPU")
    pauses: list[float] = []
    clock = iter(range(1000))  # the backend's own clock: it moves 1 ms per reading
    fake = types.SimpleNamespace(sleep=pauses.append, monotonic=lambda: next(clock) / 1000)
    monkeypatch.setattr(module, "time", fake)
    answers = iter([False] * 8 + [True])
    assert backend.wait(TinygradToken("compute", probe=lambda: next(answers)), None) is True
    assert pauses == pytest.approx([50e-6, 100e-6, 200e-6, 400e-6, 800e-6, 1.6e-3, 2e-3, 2e-3])
    pauses.clear()
    never = TinygradToken("compute", probe=lambda: False)
    clock = iter(range(1000))  # the deadline is taken at the first reading: 5.5 ms from then
    assert backend.wait(never, 0.0055) is False
    # each pause is cut to the time left; the wait returns once the deadline has passed
    assert pauses == pytest.approx([50e-6, 100e-6, 200e-6, 400e-6, 0.5e-3])
    pauses.clear()
    clock = iter(range(1000))
    assert backend.wait(never, 0.005) is False
    assert pauses == pytest.approx([50e-6, 100e-6, 200e-6, 400e-6])  # at the deadline itself: no pause


def test_a_token_reports_its_commands_or_copys_failure() -> None:
    """A finished OpenCL command or copy-thread copy that failed is done with its error; one that
    succeeded is OK; one still running is pending."""
    from concurrent.futures import Future

    from devbridge.statemachine.status import OK, PENDING, Status

    class Finished:
        def __init__(self, error: str | None, done: bool = True) -> None:
            self.error, self._done = error, done

        def done(self) -> bool:
            return self._done

    def status(command: object) -> Status:
        return TinygradToken("copy_in", command=command).status()  # type: ignore[arg-type]

    assert status(Finished("OpenCL error -5 (CL_OUT_OF_RESOURCES)")) == Status(
        True, "OpenCL error -5 (CL_OUT_OF_RESOURCES)"
    )
    assert status(Finished(None)) == OK and status(Finished(None, done=False)) == PENDING
    failed: Future[None] = Future()
    failed.set_exception(ValueError("the device is gone"))
    assert TinygradToken("copy_out", future=failed).status() == Status(True, "ValueError: the device is gone")
    succeeded: Future[None] = Future()
    succeeded.set_result(None)
    assert TinygradToken("copy_out", future=succeeded).status() == OK


def test_asynchronous_copies_run_one_at_a_time_on_one_copy_thread() -> None:
    """The CPU device's copy thread is one thread: copies run in the order issued, never two at
    once (a second one, issued while the first is held, waits for it rather than starting)."""
    backend = TinygradBackend("CPU")
    assert backend.generation == 0  # a new backend, before any bridge began one
    bridge, ring = Bridge(backend), HostRing(1 << 20)
    h = bridge.alloc_device(ObjectSpec("blob", "uint8"), 4 * INLINE_MAX_BYTES)
    ran: list[tuple[int, str]] = []
    real_move = backend._move

    def move(memory: memoryview, offset: int, host: memoryview, *, into_device: bool) -> None:
        real_move(memory, offset, host, into_device=into_device)
        ran.append((len(host), threading.current_thread().name))

    backend._move = move  # type: ignore[method-assign]
    sizes = [INLINE_MAX_BYTES + 1 + k for k in range(3)]  # each too large to be made at once; disjoint
    with backend.hold_copies():
        events = [
            bridge.host_to_device(ring.reserve(n), DeviceRange(h, k * (INLINE_MAX_BYTES + 8), n), sync=False)
            for k, n in enumerate(sizes)
        ]
    bridge.wait_all(events, timeout=30)
    assert [n for n, _ in ran] == sizes
    assert {name for _, name in ran} == {"devbridge-copy_0"}


@pytest.mark.parametrize("sync", [True, False])
def test_a_copy_tinygrads_allocator_refuses_is_a_backend_error(monkeypatch: pytest.MonkeyPatch, sync: bool) -> None:
    """Through the allocator (work queued on the CPU device, so no memmove): its failure is the
    backend's BackendError naming the device and the copy, never tinygrad's own exception."""
    from devbridge.backends import tinygrad as module
    from devbridge.backends.base import BackendError

    backend = TinygradBackend("CPU")
    buffer = backend.alloc(64, "uint8")
    monkeypatch.setattr(backend, "_idle", lambda: False)  # work queued: no memmove
    monkeypatch.setattr(module.tg, "host_bytes", lambda buf: None)  # and no copy thread

    def refuse(*args: object) -> None:
        raise RuntimeError("the device is gone")

    monkeypatch.setattr(module.tg, "copy_in", refuse)
    monkeypatch.setattr(module.tg, "copy_out", refuse)
    with pytest.raises(BackendError, match=r"^CPU: copy_in failed: the device is gone$"):
        backend.copy_in(buffer, 0, memoryview(bytearray(64)), sync=sync)
    with pytest.raises(BackendError, match=r"^CPU: copy_out failed: the device is gone$"):
        backend.copy_out(memoryview(bytearray(64)), buffer, 0, sync=sync)


def test_a_view_tinygrad_cannot_make_or_anchor_is_a_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from devbridge.backends import tinygrad as module
    from devbridge.backends.base import BackendError

    backend = TinygradBackend("CPU")
    buffer = backend.alloc(64, "uint8")
    with pytest.raises(BackendError, match=r"^CPU: no buffer under the view: 'str' object has no attribute 'uop'$"):
        backend.view_anchor("not a tensor")

    def refuse(*args: object) -> None:
        raise RuntimeError("no such dtype here")

    monkeypatch.setattr(module.tg, "tensor_view", refuse)
    with pytest.raises(BackendError, match=r"^CPU: cannot view \(4,\) float32 at 16: no such dtype here$"):
        backend.view(buffer, 16, (4,), "float32")


def test_on_cl_a_compute_extended_by_its_block_reports_when_the_work_it_covers_ends() -> None:
    """A `with compute()` block queues more work: the compute's marker is taken again as it exits,
    and the subscribers hear of the compute once that second marker is done (not only of the
    first, which ended before the block's work did)."""
    if "CL" not in DEVICES:
        pytest.skip("no OpenCL device here")
    backend = TinygradBackend("CL")
    assert backend._queue is not None
    heard: list[bool] = []
    ended = threading.Event()

    def listener(token: object) -> None:
        done = backend.query(token).done
        heard.append(done)
        if done:
            ended.set()

    backend.subscribe(listener)
    token = backend.compute([])
    assert ended.wait(30) and heard == [True]  # the first marker: the queue was empty
    ended.clear()
    with backend._queue.held():  # the block's work, still queued as the block exits
        backend.extend(token)
        assert not backend.query(token).done
    assert ended.wait(10) and heard == [True, True]


@pytest.mark.parametrize("device", [d for d in ("CPU", "CL") if d in DEVICES])
def test_a_wait_on_a_copy_blocks_on_its_primitive_until_it_is_done(
    monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    """A copy's wait blocks on what completes it (the copy thread's future on CPU, the OpenCL
    event on CL), never a query-and-sleep loop, and says True once the copy is done."""
    import time
    import types

    from devbridge.backends import tinygrad as module

    backend = TinygradBackend(device)
    buffer = backend.alloc(2 * INLINE_MAX_BYTES, "uint8")
    data = memoryview(bytearray(b"\x07" * 2 * INLINE_MAX_BYTES))  # too large to be made at once
    real_sleep, pauses = time.sleep, []

    def sleep(seconds: float) -> None:
        pauses.append(threading.current_thread().name)
        real_sleep(seconds)

    monkeypatch.setattr(module, "time", types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    result: list[object] = []
    with backend.hold_copies():
        token = backend.copy_in(buffer, 0, data, sync=False)
        waiter = threading.Thread(target=lambda: result.append(backend.wait(token, 30)), name="waiter")
        waiter.start()
        real_sleep(0.2)
        assert waiter.is_alive() and result == []  # blocked while the copy is held
    waiter.join(30)
    assert result == [True] and "waiter" not in pauses
    out = memoryview(bytearray(len(data)))
    backend.copy_out(out, buffer, 0, sync=True)
    assert bytes(out) == bytes(data)


@pytest.mark.parametrize("device", DEVICES)
def test_the_preflight_passes_on_every_device_that_opens(device: str) -> None:
    backend = TinygradBackend(device)
    backend.preflight()
    assert backend.unusable() is None


def test_the_preflight_copies_synchronously(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = TinygradBackend("CPU")
    calls: list[tuple[str, bool]] = []
    real_in, real_out = backend.copy_in, backend.copy_out

    def copy_in(buffer: object, offset: int, src: memoryview, *, sync: bool) -> object:
        calls.append(("copy_in", sync))
        return real_in(buffer, offset, src, sync=sync)

    def copy_out(dst: memoryview, buffer: object, offset: int, *, sync: bool) -> object:
        calls.append(("copy_out", sync))
        return real_out(dst, buffer, offset, sync=sync)

    monkeypatch.setattr(backend, "copy_in", copy_in)
    monkeypatch.setattr(backend, "copy_out", copy_out)
    backend.preflight()
    assert calls == [("copy_in", True), ("copy_out", True)]


def test_a_preflight_step_that_fails_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's check of a device that opens: the first step that fails, by name, and why."""
    from devbridge.backends.base import BackendError

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("refused")

    class NoKernels:
        def __add__(self, other: object) -> None:
            raise RuntimeError("no kernels on this device")

    for method, step in (
        ("alloc", "allocate"),
        ("copy_in", "upload"),
        ("view", "make a view"),
        ("copy_out", "download"),
        ("free", "download"),  # the free is the last step before the bytes are compared
    ):
        backend = TinygradBackend("CPU")
        monkeypatch.setattr(backend, method, refuse)
        says = f"CPU cannot {step}: RuntimeError('refused')"
        with pytest.raises(BackendError, match=f"^{re.escape(says)}$"):
            backend.preflight()
        assert backend.unusable() == f"device {says}: the worker needs copies, views and kernels"
    backend = TinygradBackend("CPU")
    monkeypatch.setattr(backend, "view", lambda *args: NoKernels())
    says = "CPU cannot run a kernel on a view: RuntimeError('no kernels on this device')"
    with pytest.raises(BackendError, match=f"^{re.escape(says)}$"):
        backend.preflight()
    backend = TinygradBackend("CPU")
    real_copy_out = backend.copy_out

    def wrong(dst: memoryview, buffer: object, offset: int, *, sync: bool) -> object:
        token = real_copy_out(dst, buffer, offset, sync=sync)
        dst[0] ^= 1
        return token

    monkeypatch.setattr(backend, "copy_out", wrong)
    with pytest.raises(BackendError, match=r"^CPU computes or copies wrong bytes$"):
        backend.preflight()


@pytest.mark.parametrize("device", [d for d in ("CPU", "CL") if d in DEVICES])
def test_a_subscriber_hears_of_each_asynchronous_copy_as_it_completes(device: str) -> None:
    backend = TinygradBackend(device)
    heard: list[object] = []
    arrived = threading.Event()

    def listener(token: object) -> None:
        heard.append(token)
        arrived.set()

    assert backend.subscribe(listener) is True  # this backend reports completions
    buffer = backend.alloc(2 * INLINE_MAX_BYTES, "uint8")
    token = backend.copy_in(buffer, 0, memoryview(bytearray(2 * INLINE_MAX_BYTES)), sync=False)
    assert arrived.wait(10) and heard == [token] and backend.query(token).done


CAPABILITIES = {
    "CPU": {"host_memory": True, "sub_buffers": True, "events": "hcq2-timeline", "copyin_reads": "on return"},
    "CL": {"host_memory": False, "sub_buffers": False, "events": "cl-event", "copyin_reads": "when the queue runs it"},
    "PYTHON": {"host_memory": False, "sub_buffers": True, "events": "synchronize", "copyin_reads": "on return"},
}


@pytest.mark.parametrize("device", [d for d in CAPABILITIES if d in DEVICES])
def test_each_device_that_opens_here_has_its_capability_record(device: str) -> None:
    assert tg.capabilities(device).as_dict() == {"device": device, **CAPABILITIES[device]}
    assert TinygradBackend(device).capabilities == tg.capabilities(device)


def test_the_capability_record_is_read_from_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """Devices not here (GPUs), as tinygrad's runtimes present them: what each has decides."""
    from types import SimpleNamespace

    class WithOffset(tg.Allocator):  # type: ignore[misc]
        def _offset(self, buf: object, size: int, offset: int) -> object:
            return buf

    class WithoutOffset(tg.Allocator):  # type: ignore[misc]
        pass

    class HostMemory(WithOffset):
        def _as_buffer(self, buf: object) -> memoryview:
            return memoryview(bytearray(1))

    def dev(allocator: type, **attributes: object) -> SimpleNamespace:
        return SimpleNamespace(allocator=allocator.__new__(allocator), **attributes)

    hcq = {"timeline_signal": 1, "timeline_value": 1}
    devices = {
        "NV": dev(WithOffset, **hcq),
        "AMD:1": dev(WithOffset, **hcq),
        "CUDA": dev(WithOffset),
        "METAL": dev(WithoutOffset),
        "CPU:2": dev(WithOffset, signal=1, _wait_signal=1),  # no _as_buffer: not host memory
        "CPU:3": dev(HostMemory, signal=1, _wait_signal=1),
        "METAL:1": dev(HostMemory),  # memory it can show, on a device that is not the CPU
        "HALF": dev(WithoutOffset, signal=1),  # half of HCQ2: neither
        "GPU": dev(WithoutOffset, queue=1, pending_copyin=[]),
        "ODD": dev(WithoutOffset, timeline_signal=1, queue=1),  # half of two families: neither
    }
    monkeypatch.setattr(tg, "Device", devices)
    tg.capabilities.cache_clear()
    try:
        got = {name: tg.capabilities(name) for name in devices}
    finally:
        tg.capabilities.cache_clear()
    assert all(c.device == name for name, c in got.items())
    staging, unknown, queued = (
        "into a staging buffer before return",
        "unknown: treated as on return",
        "when the queue runs it",
    )
    assert {name: (c.host_memory, c.sub_buffers, c.events, c.copyin_reads) for name, c in got.items()} == {
        "NV": (False, True, "hcq-timeline", staging),
        "AMD:1": (False, True, "hcq-timeline", staging),
        "CUDA": (False, True, "synchronize", staging),
        "METAL": (False, False, "synchronize", unknown),
        "CPU:2": (False, True, "hcq2-timeline", "on return"),
        "CPU:3": (True, True, "hcq2-timeline", "on return"),
        "METAL:1": (False, True, "synchronize", unknown),
        "HALF": (False, False, "synchronize", unknown),
        "GPU": (False, False, "cl-event", queued),
        "ODD": (False, False, "synchronize", unknown),
    }


def test_the_allocators_handle_on_a_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole buffer is the buffer's own handle; a range is the allocator's `_offset`. A
    device without one (CL's allocator; the bridge copies there with its own commands) copies
    whole buffers only."""
    if "CL" in DEVICES:
        whole = tg.allocate("CL", 64)
        assert tg._raw_range(whole, 0, 64) is whole._buf
    buf = tg.allocate("CPU", 64)
    assert tg._raw_range(buf, 0, 64) is buf._buf
    tg.copy_in(buf, 0, memoryview(bytearray(64)))
    tg.copy_in(buf, 16, memoryview(bytearray(b"\x01" * 8)))  # through _offset
    out = memoryview(bytearray(64))
    tg.copy_out(out, buf, 0)
    assert bytes(out) == bytes(16) + b"\x01" * 8 + bytes(40)

    def no_offset(*args: object) -> object:
        raise NotImplementedError

    monkeypatch.setattr(buf.allocator, "_offset", no_offset)
    tg.copy_in(buf, 0, memoryview(bytearray(b"\x02" * 64)))  # the whole buffer needs no _offset
    with pytest.raises(NotImplementedError):
        tg.copy_in(buf, 40, memoryview(bytearray(8)))
    tg.copy_out(out, buf, 0)
    assert bytes(out) == b"\x02" * 64


def test_the_idle_probe_is_false_while_any_worker_or_the_timeline_lags(monkeypatch: pytest.MonkeyPatch) -> None:
    """The idle probe's reading of the CPU device, on a device whose counters the test sets: idle
    only when every worker has done what was put, the timeline has reached the last value, and
    the device is the one tinygrad's runtime is set to."""
    from array import array
    from types import SimpleNamespace

    from tinygrad.runtime.support.hcq2 import HCQ_RUNTIME_DEV

    def counter(value: int) -> tuple[array[int], SimpleNamespace]:
        cell = array("Q", [value])
        view = SimpleNamespace(view=lambda fmt: memoryview(cell))
        return cell, SimpleNamespace(_buf=SimpleNamespace(cpu_view=lambda: view))

    timeline, timeline_signal = counter(9)
    value, value_signal = counter(10)
    put, put_signal = counter(3)
    done, done_signal = counter(3)
    workers = [SimpleNamespace(put=put_signal, done=done_signal)]
    signals = {"timeline": timeline_signal, "value": value_signal}
    device = SimpleNamespace(workers=workers, signal=lambda name, *args, **kwargs: signals[name])
    monkeypatch.setattr(tg, "Device", {"CPU": device, "CPU:1": device, "CL": SimpleNamespace(workers=[], signal=0)})
    monkeypatch.setattr(HCQ_RUNTIME_DEV, "value", "CPU")
    idle = tg.idle_probe("CPU")
    assert idle is not None and idle() is True  # timeline 9 reached value 10 - 1, nothing put undone
    put[0] = 4  # the worker was given work
    assert idle() is False
    done[0] = 4
    assert idle() is True
    timeline[0] = 8  # the last value not yet reached
    assert idle() is False
    timeline[0] = 9
    value[0] = 11  # a new value taken: the timeline must reach 10
    assert idle() is False
    value[0] = 10
    workers.append(SimpleNamespace(put=counter(1)[1], done=counter(0)[1]))  # a second worker, busy
    assert idle() is False
    workers.pop()
    assert idle() is True
    monkeypatch.setattr(HCQ_RUNTIME_DEV, "value", "CPU:1")  # set to another device: not this one's reading
    assert idle() is False
    assert tg.idle_probe("CL") is None
    device.workers = None
    del device.workers
    assert tg.idle_probe("CPU:1") is None  # a CPU device without workers: none


def test_synchronize_waits_for_the_copy_thread_and_the_device_and_drops_parked_buffers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from devbridge.backends import tinygrad as module

    backend = TinygradBackend("CPU")
    buffer = backend.alloc(2 * INLINE_MAX_BYTES, "uint8")
    real_move, seen = backend._move, threading.Event()

    def slow_move(memory: memoryview, offset: int, host: memoryview, *, into_device: bool) -> None:
        seen.wait(10)  # not before the test saw the copy pending (however long the machine stalls)
        time.sleep(0.2)  # and still copying when synchronize is called
        real_move(memory, offset, host, into_device=into_device)

    backend._move = slow_move  # type: ignore[method-assign]
    token = backend.copy_in(buffer, 0, memoryview(bytearray(b"\x05" * 2 * INLINE_MAX_BYTES)), sync=False)
    assert isinstance(token, TinygradToken) and token.future is not None and not token.future.done()
    seen.set()
    synchronized: list[str] = []
    real_synchronize = module.tg.synchronize
    monkeypatch.setattr(
        module.tg, "synchronize", lambda device: (synchronized.append(device), real_synchronize(device))
    )
    monkeypatch.setattr(backend, "_idle", lambda: False)  # a free now parks the buffer behind a marker
    monkeypatch.setattr(backend, "_markers", lambda: lambda: bool(synchronized))  # done once synchronized
    backend.free(backend.alloc(64, "uint8"))
    assert backend.parked == 1
    backend.synchronize()
    assert token.future.done() and synchronized == ["CPU"] and backend.parked == 0


def test_a_device_that_cannot_mark_its_queue_fails_the_compute_with_a_backend_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from devbridge.backends.base import BackendError

    def refuse() -> object:
        raise RuntimeError("no signal left")

    for device in [d for d in ("CPU", "CL") if d in DEVICES]:
        backend = TinygradBackend(device)
        if backend._queue is not None:
            monkeypatch.setattr(backend._queue, "marker", refuse)
        else:
            monkeypatch.setattr(backend, "_markers", refuse)
        with pytest.raises(BackendError, match=rf"^{device}: cannot mark the end of queued work: no signal left$"):
            backend.compute([])


@pytest.mark.skipif("CL" not in DEVICES, reason="no OpenCL device here")
def test_an_opencl_copy_refused_or_failed_is_a_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from devbridge.backends.base import BackendError
    from devbridge.backends.tinygrad_cl import CLCommandError

    backend = TinygradBackend("CL")
    assert backend._queue is not None
    buffer = backend.alloc(64, "uint8")
    done_in = backend.copy_in(buffer, 0, memoryview(bytearray(64)), sync=True)
    done_out = backend.copy_out(memoryview(bytearray(64)), buffer, 0, sync=True)
    assert isinstance(done_in, TinygradToken) and isinstance(done_out, TinygradToken)
    assert (done_in.op, done_out.op) == ("copy_in", "copy_out") and done_in.status().done

    def refuse(*args: object, **kwargs: object) -> object:
        raise CLCommandError("enqueue: OpenCL error -5 (CL_OUT_OF_RESOURCES)")

    monkeypatch.setattr(backend._queue, "copy", refuse)
    for sync in (True, False):
        with pytest.raises(
            BackendError, match=r"^CL: copy_in failed: enqueue: OpenCL error -5 \(CL_OUT_OF_RESOURCES\)$"
        ):
            backend.copy_in(buffer, 0, memoryview(bytearray(64)), sync=sync)

    class Failed:
        error = "OpenCL error -14 (CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)"

        def wait(self, timeout: float | None) -> bool:
            return True

    monkeypatch.setattr(backend._queue, "copy", lambda *args, **kwargs: Failed())
    with pytest.raises(BackendError, match=r"^CL: copy_out failed: OpenCL error -14 "):
        backend.copy_out(memoryview(bytearray(64)), buffer, 0, sync=True)


def test_only_the_cpu_devices_memory_is_host_memory_to_copy_by_memmove() -> None:
    """PYTHON's allocator can show its memory too, but it is not the device the bridge may
    memmove into; a read-only host view has no address to memmove from."""
    cpu = tg.allocate("CPU", 16)
    assert tg.host_bytes(cpu) is not None
    assert tg.move_now(cpu, 0, memoryview(bytearray(b"\x03" * 16)), into_device=True) is True
    assert tg.move_now(cpu, 0, memoryview(b"read-only bytes!"), into_device=True) is False  # no address
    out = memoryview(bytearray(16))
    tg.copy_out(out, cpu, 0)
    assert bytes(out) == b"\x03" * 16
    for device in [d for d in ("CL", "PYTHON") if d in DEVICES]:
        other = tg.allocate(device, 16)
        assert tg.host_bytes(other) is None
        assert tg.move_now(other, 0, memoryview(bytearray(16)), into_device=True) is False


@pytest.mark.skipif("CL" not in DEVICES, reason="no OpenCL device here")
def test_a_whole_view_on_cl_is_the_allocations_memory_and_counts_as_one_view_while_it_lives() -> None:
    import numpy as np

    buffer = tg.allocate("CL", 64)
    tg.copy_in(buffer, 0, memoryview(bytearray(np.arange(16, dtype=np.float32).tobytes())))
    before = buffer.allocated_views
    view = tg.whole_view(buffer, 16, tg.dtype_of("float32"))
    assert view.offset == 0 and view._buf is buffer._buf and buffer.allocated_views == before + 1
    del view
    gc.collect()
    assert buffer.allocated_views == before  # a collected view frees nothing and is no longer counted
    with pytest.raises(AssertionError):
        tg.whole_view(buffer, 17, tg.dtype_of("float32"))  # past the allocation
    tensor = tg.tensor_view(buffer, 0, (4, 4), "float32")
    assert tensor.numpy().tolist() == np.arange(16, dtype=np.float32).reshape(4, 4).tolist()
    with pytest.raises(NotImplementedError):  # an offset the device cannot view is never offset 0
        tg.tensor_view(buffer, 16, (4,), "float32")


def test_markers_on_devices_not_here_read_what_each_runtime_offers(monkeypatch: pytest.MonkeyPatch) -> None:
    """NV/AMD (HCQ): a marker is done once the timeline signal reaches the last value handed out
    before it; CUDA, METAL, ...: no cheap query, so the first probe synchronizes, once."""
    from types import SimpleNamespace

    signal = SimpleNamespace(value=4)
    nv = SimpleNamespace(timeline_signal=signal, timeline_value=6)  # values up to 5 handed out
    synchronized: list[int] = []
    cuda = SimpleNamespace(synchronize=lambda: synchronized.append(1))
    odd = SimpleNamespace(timeline_signal=signal, synchronize=lambda: synchronized.append(2))  # half an HCQ
    half = SimpleNamespace(signal=signal, synchronize=lambda: synchronized.append(3))  # half an HCQ2
    cells = {"timeline": [8], "value": [10]}  # the CPU device's: timeline reached, last value handed out

    def cpu_signal(name: str, *args: object, **kwargs: object) -> SimpleNamespace:
        view = SimpleNamespace(view=lambda fmt: cells[name])
        return SimpleNamespace(_buf=SimpleNamespace(cpu_view=lambda: view))

    cpu = SimpleNamespace(signal=cpu_signal, _wait_signal=None)
    devices = {"NV": nv, "CUDA": cuda, "ODD": odd, "HALF": half, "CPU": cpu}
    monkeypatch.setattr(tg, "Device", devices)
    probe = tg.marker("NV")
    assert probe() is False
    signal.value = 5
    assert probe() is True
    nv.timeline_value = 9  # later work: a marker taken now waits for it, the earlier one does not
    later = tg.marker("NV")
    assert later() is False and probe() is True
    cuda_probe = tg.marker("CUDA")
    assert synchronized == [] and cuda_probe() is True and cuda_probe() is True and synchronized == [1]
    assert tg.marker("ODD")() is True and synchronized == [1, 2]
    assert tg.marker("HALF")() is True and synchronized == [1, 2, 3]
    tg.synchronize("CUDA")
    assert synchronized == [1, 2, 3, 1]
    cpu_probe = tg.marker("CPU")  # done once the timeline reaches 9, the last value handed out
    assert cpu_probe() is False
    cells["timeline"][0] = 9
    assert cpu_probe() is True


# ------------------------------------------------------------ the pool of freed Buffers


def keeps(device: str) -> bool:
    """Whether a free on `device` keeps the Buffer at once (an idle CPU device, CL's in-order queue)."""
    return device in ("CPU", "CL")


@pytest.mark.parametrize("device", DEVICES)
def test_a_freed_buffer_never_viewed_is_the_next_allocation_of_its_size(device: str) -> None:
    backend = TinygradBackend(device)
    a = backend.alloc(4096, "uint8")
    backend.free(a)
    if not keeps(device):  # parked behind the device's work, then dropped to tinygrad
        assert backend.pooled() == {} and backend.alloc(4096, "uint8") is not a
        return
    assert backend.pooled() == {4096: 1}
    assert backend.alloc(2048, "uint8") is not a  # another size: a Buffer of its own
    assert backend.alloc(4096, "uint8") is a and backend.pooled() == {}
    assert backend.alloc(4096, "uint8") is not a


@pytest.mark.parametrize("device", [d for d in DEVICES if keeps(d)])
def test_a_buffer_a_view_was_made_over_is_never_kept(device: str) -> None:
    backend = TinygradBackend(device)
    a, b = backend.alloc(64, "uint8"), backend.alloc(64, "uint8")
    view = backend.view(a, 0, (16,), "float32")
    assert view.shape == (16,)
    del view
    gc.collect()
    backend.free(a)
    backend.free(b)
    assert backend.pooled() == {64: 1} and backend.alloc(64, "uint8") is b


def test_the_pool_keeps_a_few_buffers_per_size_and_a_bounded_total(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = TinygradBackend("CPU")
    per_size = tinygrad_backend.POOL_PER_SIZE
    buffers = [backend.alloc(256, "uint8") for _ in range(per_size + 2)]
    for buf in buffers:
        backend.free(buf)
    assert backend.pooled() == {256: per_size}
    assert [backend.alloc(256, "uint8") for _ in range(per_size)] == buffers[per_size - 1 :: -1]  # last kept, first out
    monkeypatch.setattr(tinygrad_backend, "POOL_MAX_BYTES", 1024)
    for buf in [backend.alloc(512, "uint8") for _ in range(3)]:
        backend.free(buf)
    assert backend.pooled() == {512: 2}  # 1024 B in all
    big = backend.alloc(2048, "uint8")
    backend.free(big)
    assert backend.pooled() == {512: 2}


@pytest.mark.parametrize("device", [d for d in DEVICES if keeps(d)])
def test_a_new_generation_gives_the_kept_buffers_back(device: str) -> None:
    backend = TinygradBackend(device)
    a = backend.alloc(128, "uint8")
    backend.free(a)
    assert backend.pooled() == {128: 1}
    backend.begin_generation(1)
    assert backend.pooled() == {} and backend.alloc(128, "uint8") is not a


def test_an_allocation_that_fails_is_tried_again_once_the_kept_buffers_are_given_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = TinygradBackend("CPU")
    backend.free(backend.alloc(128, "uint8"))
    real, calls = tg.allocate, []

    def failing_once(device: str, nbytes: int) -> tg.Buffer:
        calls.append((nbytes, backend.pooled()))
        if len(calls) == 1:
            raise MemoryError("out of memory")
        return real(device, nbytes)

    monkeypatch.setattr(tg, "allocate", failing_once)
    assert backend.alloc(256, "uint8").nbytes == 256
    assert calls == [(256, {128: 1}), (256, {})]  # the second try after the pool was given back

    def failing(device: str, nbytes: int) -> tg.Buffer:
        calls.append((nbytes, backend.pooled()))
        raise MemoryError("out of memory")

    calls.clear()
    monkeypatch.setattr(tg, "allocate", failing)
    with pytest.raises(BackendError, match="cannot allocate 512 B"):
        backend.alloc(512, "uint8")
    assert calls == [(512, {})]  # nothing kept to give back: no second try


@pytest.mark.parametrize("nbytes", [64, VIEW_COPY_MAX_BYTES, VIEW_COPY_MAX_BYTES + 64])
def test_a_direct_copy_is_a_slice_assignment_up_to_its_bound_and_a_memmove_above(
    monkeypatch: pytest.MonkeyPatch, nbytes: int
) -> None:
    backend = TinygradBackend("CPU")
    buf = backend.alloc(nbytes + 16, "uint8")
    moves: list[bool] = []
    real = tg.move_now
    monkeypatch.setattr(tg, "move_now", lambda *a, **k: (moves.append(k["into_device"]), real(*a, **k))[1])
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    backend.copy_in(buf, 16, memoryview(bytearray(data.tobytes())), sync=True)
    out = memoryview(bytearray(nbytes + 16))
    backend.copy_out(out[16:], buf, 16, sync=True)
    assert bytes(out[16:]) == data.tobytes() and backend.direct_copies == 2
    assert moves == ([] if nbytes <= VIEW_COPY_MAX_BYTES else [True, False])


def test_the_backend_does_what_the_guides_say_of_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sizes a user reads in the guides are the backend's own: the pool keeps as many Buffers
    of one size, and as many bytes in all, as the views guide says; a direct copy is a slice
    assignment up to the size the devices guide says, a memmove above; an async copy up to the
    size it says is done on return."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    devices = " ".join((docs / "guides" / "devices.md").read_text().split())
    views = " ".join((docs / "concepts" / "views-and-jit.md").read_text().split())
    found = re.search(r"as PyTorch's: (\d+) per size, (\d+) MiB in all,", views)
    slice_max = re.search(r"\(a slice assignment up to (\d+) MiB, a memmove above\)", devices)
    inline_max = re.search(r"an async copy of up to (\d+) KiB to an idle device is done on return", devices)
    assert found and slice_max and inline_max
    per_size, total = int(found[1]), int(found[2]) << 20
    backend = TinygradBackend("CPU")
    for buf in [backend.alloc(1 << 20, "uint8") for _ in range(per_size + 1)]:
        backend.free(buf)
    assert backend.pooled() == {1 << 20: per_size}
    backend.trim()
    for buf in [backend.alloc(total // per_size, "uint8") for _ in range(per_size)] + [backend.alloc(64, "uint8")]:
        backend.free(buf)
    assert backend.pooled() == {total // per_size: per_size}  # the whole total: not one byte more
    backend.trim()
    moves: list[bool] = []
    real = tg.move_now
    monkeypatch.setattr(tg, "move_now", lambda *a, **k: (moves.append(k["into_device"]), real(*a, **k))[1])
    for nbytes in (int(slice_max[1]) << 20, (int(slice_max[1]) << 20) + 256):
        buf = backend.alloc(nbytes, "uint8")
        backend.copy_in(buf, 0, memoryview(bytearray(nbytes)), sync=True)
        backend.free(buf)
    assert moves == [True]  # only the copy above the bound
    assert int(inline_max[1]) << 10 == INLINE_MAX_BYTES


def test_an_allocation_that_fails_again_after_the_pool_is_given_back_is_a_backend_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = TinygradBackend("CPU")
    backend.free(backend.alloc(128, "uint8"))
    calls: list[dict[int, int]] = []

    def failing(device: str, nbytes: int) -> tg.Buffer:
        calls.append(backend.pooled())
        raise MemoryError("out of memory")

    monkeypatch.setattr(tg, "allocate", failing)
    with pytest.raises(BackendError, match=r"^CPU: cannot allocate 256 B: out of memory$"):
        backend.alloc(256, "uint8")
    assert calls == [{128: 1}, {}]  # tried twice, the second time with nothing kept


def test_after_trim_the_pool_takes_its_whole_bound_again(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = TinygradBackend("CPU")
    monkeypatch.setattr(tinygrad_backend, "POOL_MAX_BYTES", 1024)
    for _ in range(2):  # before and after a trim: exactly 1024 B kept
        for buf in [backend.alloc(256, "uint8") for _ in range(4)]:
            backend.free(buf)
        assert backend.pooled() == {256: 4}
        assert backend.trim() == 4 and backend.pooled() == {}


def test_a_freed_viewed_buffer_is_forgotten_and_a_cpu_buffers_bytes_view_is_made_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing is remembered of a Buffer past its free, and the bytes of a CPU Buffer that direct
    copies use are made once and kept while it lives."""
    backend = TinygradBackend("CPU")
    a = backend.alloc(64, "uint8")
    view = backend.view(a, 0, (16,), "float32")
    del view
    gc.collect()
    backend.free(a)
    assert backend._viewed == set() and backend.pooled() == {}
    made, real = [], tg.host_bytes
    monkeypatch.setattr(tg, "host_bytes", lambda buf: (made.append(buf), real(buf))[1])
    b = backend.alloc(64, "uint8")
    for k in range(3):
        backend.copy_in(b, 0, memoryview(bytes([k]) * 64), sync=True)
    out = memoryview(bytearray(64))
    backend.copy_out(out, b, 0, sync=True)
    assert bytes(out) == bytes([2]) * 64 and made == [b] and backend.direct_copies == 4


def test_a_direct_copy_that_cannot_move_the_bytes_goes_through_the_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = TinygradBackend("CPU")
    nbytes = VIEW_COPY_MAX_BYTES + 256  # above the slice bound: a memmove, which this device refuses here
    buf = backend.alloc(nbytes, "uint8")
    monkeypatch.setattr(tg, "move_now", lambda *a, **k: False)
    data = bytes(range(256)) * (nbytes // 256)
    backend.copy_in(buf, 0, memoryview(bytearray(data)), sync=True)  # (the allocator writes from writable memory)
    out = memoryview(bytearray(nbytes))
    backend.copy_out(out, buf, 0, sync=True)
    assert bytes(out) == data and backend.direct_copies == 0
