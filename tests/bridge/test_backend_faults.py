"""A backend that fails anywhere: typed errors, no lost event, no hang, every release
attempted exactly once (FREE-3, FAULT-1, WAIT-1, COPY-F, COMPUTE-F)."""

from __future__ import annotations

import contextlib
import gc
import random
import threading
import time

import pytest
from rules import refused
from support import U8, put

from devbridge import (
    BackendFailureError,
    Bridge,
    ComputeError,
    DeviceCopyError,
    DeviceFreeError,
    DeviceRange,
    HostRing,
    OutputCopyError,
)
from devbridge.backends.base import FAULTABLE, BackendError
from devbridge.backends.fake import FakeBackend
from devbridge.backends.faulty import FaultyBackend


def frees(fake: FakeBackend) -> list[int | None]:
    return [c.buffer for c in fake.calls if c.op == "free"]


@pytest.mark.holds("FREE-3")
def test_a_deferred_free_that_fails_settles_the_event_and_is_reported_by_poll(
    bridge: Bridge, fake: FakeBackend
) -> None:
    """Regression: the failing free ran inside the completion, the event left the pending
    table unsettled, and wait(timeout=1) spun for ever at 100% CPU."""
    ring = HostRing(64)
    h = bridge.alloc_device(U8, 8)
    src = put(ring, b"deferred")
    ev = bridge.host_to_device(src, DeviceRange(h, 0, 8), sync=False)
    bridge.free_device(h)
    assert bridge.state(h) == "free_pending"
    fake.fail_next("free")
    fake.complete(ev)  # the completion releases the memory: the backend free fails
    assert ev.done() and ev.error is None  # the copy itself succeeded
    ev.wait(timeout=1)
    assert ring.released(src) and bridge.state(h) == "freed"
    assert frees(fake) == [0] and fake.live_allocations == 1  # attempted once; the device kept it
    stats = bridge.stats()
    assert (stats.free_failures, stats.backend_frees, stats.pending_events) == (1, 0, 0)
    with refused("FREE-3") as e:
        bridge.poll()
    assert "allocation #0" in str(e.value)
    assert bridge.poll() == 0  # reported once
    with refused("FREE-2"):
        bridge.free_device(h)
    assert frees(fake) == [0]  # never released twice


@pytest.mark.rejects("FREE-3")
def test_an_immediate_free_that_fails_raises_and_the_handle_is_dead(bridge: Bridge, fake: FakeBackend) -> None:
    """Regression: free_device leaked a raw BackendError after marking the handle freed."""
    h = bridge.alloc_device(U8, 8)
    fake.fail_next("free")
    with refused("FREE-3") as e:
        bridge.free_device(h)
    assert isinstance(e.value.__cause__, BackendError) is False
    assert bridge.state(h) == "freed" and frees(fake) == [0]
    assert bridge.stats().free_failures == 1 and bridge.stats().live_allocations == 0
    assert bridge.poll() == 0  # already reported by the call


@pytest.mark.holds("FREE-3")
def test_a_restart_releases_every_old_buffer_even_when_one_free_fails(bridge: Bridge, fake: FakeBackend) -> None:
    """Regression: restart() stopped at the first failing free and forgot the other buffers."""
    a, b, c = (bridge.alloc_device(U8, 8) for _ in range(3))
    fake.fail_next("free")
    with refused("FREE-3") as e:
        bridge.restart()
    assert "allocation #0" in str(e.value)
    assert bridge.generation == 1 and [bridge.state(x) for x in (a, b, c)] == ["stale"] * 3
    assert frees(fake) == [0, 1, 2] and fake.live_allocations == 1
    assert bridge.stats().backend_frees == 2 and bridge.stats().free_failures == 1
    d = bridge.alloc_device(U8, 8)  # the new generation works
    assert d.generation == 1 and bridge.state(d) == "allocated"


class RefusesGenerations(FakeBackend):
    def begin_generation(self, generation: int) -> None:
        if generation > 0:
            raise BackendError("no new generation")
        super().begin_generation(generation)


@pytest.mark.holds("FAULT-1")
@pytest.mark.rejects("FAULT-1")
def test_a_failed_generation_change_is_reported_after_every_old_buffer_is_released() -> None:
    fake = RefusesGenerations()
    bridge = Bridge(fake)
    a, b = bridge.alloc_device(U8, 8), bridge.alloc_device(U8, 8)
    with refused("FAULT-1") as e:
        bridge.restart()
    assert type(e.value) is BackendFailureError
    assert frees(fake) == [0, 1] and (bridge.state(a), bridge.state(b)) == ("stale", "stale")


@pytest.mark.rejects("FAULT-1")
def test_a_backend_that_refuses_the_bridge_is_a_typed_error() -> None:
    class NoCallbacks(FakeBackend):
        def subscribe(self, callback: object) -> bool:  # type: ignore[override]
            raise BackendError("no callbacks here")

    with refused("FAULT-1"):
        Bridge(NoCallbacks())


@pytest.mark.holds("COPY-F")
@pytest.mark.parametrize("op", ["query", "wait"])
def test_a_failed_query_or_wait_settles_a_copy_as_failed(bridge: Bridge, fake: FakeBackend, op: str) -> None:
    ring = HostRing(64)
    h = bridge.alloc_device(U8, 8)
    src = put(ring, b"abcdefgh")
    ev = bridge.host_to_device(src, DeviceRange(h, 0, 8), sync=False)
    fake.fail_next(op)
    with refused("COPY-F") as e:
        if op == "query":
            assert ev.done()
            raise ev.error  # type: ignore[misc]
        ev.wait(timeout=5)
    assert f"{op}" in str(e.value)
    assert ev.done() and bridge.stats().pending_events == 0
    assert not ring.released(src) and bytes(fake.buffer(0).data) == bytes(8)  # not released; nothing moved
    assert bridge.state(h) == "idle"
    out = ring.reserve(8)
    down = bridge.device_to_host(DeviceRange(h, 0, 8), out, sync=False)
    fake.fail_next("query")
    assert down.done() and isinstance(down.error, OutputCopyError) and down.error.rule == "COPY-F"


@pytest.mark.holds("COMPUTE-F")
def test_a_failed_query_settles_a_compute_and_runs_the_deferred_free(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(U8, 8)
    ev = bridge.compute(h)
    bridge.free_device(h)
    fake.fail_next("query")
    assert bridge.poll() == 1
    assert isinstance(ev.error, ComputeError) and ev.error.rule == "COMPUTE-F"
    assert bridge.state(h) == "freed" and frees(fake) == [0] and fake.violations == []


@pytest.mark.holds("WAIT-1")
def test_wait_blocks_until_another_thread_completes_the_event(bridge: Bridge, fake: FakeBackend) -> None:
    ring = HostRing(64)
    fake.run_on_wait = False  # the device finishes the work on another thread
    h = bridge.alloc_device(U8, 8)
    ev = bridge.host_to_device(put(ring, b"threaded"), DeviceRange(h, 0, 8), sync=False)
    threading.Timer(0.05, fake.complete, [ev]).start()
    ev.wait(timeout=30)
    assert ev.done() and ev.error is None and bytes(fake.buffer(0).data) == b"threaded"


@pytest.mark.rejects("WAIT-1")
@pytest.mark.parametrize("timeout", [0, 0.0, 0.05])
def test_wait_honours_its_timeout(bridge: Bridge, fake: FakeBackend, timeout: float) -> None:
    ring = HostRing(64)
    fake.run_on_wait = False  # a device that never finishes the work by itself
    h = bridge.alloc_device(U8, 8)
    ev = bridge.host_to_device(put(ring, b"timeout!"), DeviceRange(h, 0, 8), sync=False)
    start = time.monotonic()
    with refused("WAIT-1") as e:
        ev.wait(timeout=timeout)
    assert isinstance(e.value, TimeoutError)
    assert time.monotonic() - start < 10  # a hang detector, not a speed goal
    assert not ev.done() and bridge.stats().pending_events == 1


def test_faulty_backend_forgets_settled_failing_tokens_and_bounds_its_log() -> None:
    """Regression: FaultyBackend kept every failed token (2,000 of 2,000) and every op."""
    fake = FakeBackend()
    faulty = FaultyBackend(fake, log_limit=100)
    bridge, ring = Bridge(faulty), HostRing(1 << 12)
    h = bridge.alloc_device(U8, 8)
    src = put(ring, b"again!!!")
    for _ in range(2000):
        faulty.fail_next("copy_in")
        ev = bridge.host_to_device(src, DeviceRange(h, 0, 8), sync=False, release=False)
        fake.complete(ev)
        assert isinstance(ev.error, DeviceCopyError)
    del ev
    gc.collect()
    assert faulty.failing == 0 and len(faulty.ops) == 100 and faulty.injected["copy_in"] == 2000


@pytest.mark.holds("FAULT-1")
@pytest.mark.parametrize("seed", range(6))
def test_a_backend_failing_every_operation_at_random_loses_nothing(seed: int) -> None:
    """Random calls over a backend where every op fails a third of the time: every error is
    typed, every event settles, no buffer is freed twice or while in use, none is leaked."""
    from devbridge import BridgeError

    rng = random.Random(seed)
    fake = FakeBackend()
    faulty = FaultyBackend(fake, rate=0.3, seed=seed, random_ops=FAULTABLE)
    bridge, ring = Bridge(faulty), HostRing(1 << 12)
    handles, events = [], []
    for _ in range(300):
        action = rng.choice(["alloc", "free", "h2d", "d2h", "compute", "complete", "poll", "restart", "wait"])
        try:
            if action == "alloc" or not handles:
                handles.append(bridge.alloc_device(U8, 8))
            elif action == "free":
                bridge.free_device(rng.choice(handles))
            elif action in ("h2d", "d2h"):
                r = ring.reserve(4)
                d = DeviceRange(rng.choice(handles), rng.randrange(5), 4)
                if action == "h2d":
                    events.append(bridge.host_to_device(r, d, sync=rng.random() < 0.3))
                else:
                    events.append(bridge.device_to_host(d, r, sync=rng.random() < 0.3))
            elif action == "compute":
                events.append(bridge.compute(rng.choice(handles)))
            elif action == "complete" and fake.pending():
                fake.complete(rng.choice(fake.pending()))
            elif action == "poll":
                bridge.poll()
            elif action == "restart":
                bridge.restart()
            elif action == "wait" and events:
                rng.choice(events).wait(timeout=0)
        except BridgeError:
            pass
        for r in ring.unreleased():  # keep the ring from filling: the worker consumes what it can
            if not any(s < r.end and r.start < e for s, e in ring._reads + ring._writes):
                ring.release(r)
    for ev in fake.pending():
        fake.complete(ev)
    with contextlib.suppress(DeviceFreeError):
        bridge.poll()
    assert all(ev.done() for ev in events), "an event was lost"
    assert bridge.stats().pending_events == bridge.stats().inflight_uses == 0
    assert fake.violations == []  # never freed while in use, never twice, never an old buffer
    attempted = frees(fake)
    assert len(attempted) == len(set(attempted)), "a buffer was freed twice"
    stats = bridge.stats()
    live = stats.live_allocations
    assert stats.backend_frees == len(attempted) and stats.free_failures == faulty.injected["free"]
    assert fake.live_allocations == live + stats.free_failures, "a buffer was leaked without a report"


@pytest.mark.holds("FAULT-1", "COPY-F", "COMPUTE-F")
def test_stats_count_each_call_and_each_failure_once(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h, other = bridge.alloc_device(U8, 16), bridge.alloc_device(U8, 8)
    fake.fail_next("alloc")
    with refused("ALLOC-2"):
        bridge.alloc_device(U8, 8)
    bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4))
    fake.fail_next("copy_in")
    with refused("COPY-F"):
        bridge.host_to_device(put(ring, b"efgh"), DeviceRange(h, 4, 4))  # counted as a failure, not a copy
    copy = bridge.host_to_device(put(ring, b"ijkl"), DeviceRange(h, 8, 4), sync=False)
    fake.fail_next("compute")
    compute = bridge.compute(other)
    zero = dict.fromkeys(bridge.stats().as_dict(), 0)
    base = zero | {"live_allocations": 2, "live_bytes": 24, "allocs": 2, "copies_in": 2, "bytes_in": 8,
                   "computes": 1, "copy_failures": 1, "alloc_failures": 1}  # fmt: skip
    assert bridge.stats().as_dict() == base | {"pending_events": 2, "inflight_uses": 2}
    fake.complete(compute)  # armed: it fails
    bridge.free_device(h)  # the async copy still writes it: deferred
    failed = {"compute_failures": 1, "deferred_frees": 1}
    assert bridge.stats().as_dict() == base | failed | {"pending_events": 1, "inflight_uses": 1}
    fake.complete(copy)
    assert bridge.stats().as_dict() == base | failed | {"live_allocations": 1, "live_bytes": 8, "backend_frees": 1}
