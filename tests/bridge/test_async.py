"""Events in asyncio: `await event`, `asyncio.wait_for(event, t)`, `Bridge.wait_any_async` and
`Bridge.wait_all_async` (WAIT-1, COPY-F, ARG-1), with one watcher thread per bridge."""

from __future__ import annotations

import asyncio
import threading

import pytest
from rules import refused
from support import U8, put

from devbridge import Bridge, DeviceCopyError, DeviceRange, HostRing
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.testing import FakeBackend


def watchers(besides: frozenset[threading.Thread] = frozenset()) -> int:
    """Watcher threads running now (not counting `besides`: another test's, still ending)."""
    return sum(t.name == "devbridge-await" and t not in besides for t in threading.enumerate())


def copies(bridge: Bridge, ring: HostRing, n: int) -> list:  # type: ignore[type-arg]
    h = bridge.alloc_device(U8, 4 * n)
    return [bridge.host_to_device(put(ring, bytes([k]) * 4), DeviceRange(h, 4 * k, 4), sync=False) for k in range(n)]


@pytest.mark.holds("WAIT-1", "H2D-3")
def test_await_returns_once_the_copy_is_done_and_its_bytes_released() -> None:
    fake = FakeBackend(run_on_wait=False)
    bridge, ring = Bridge(fake), HostRing(64)
    (ev,) = copies(bridge, ring, 1)

    async def main() -> list[str]:
        seen: list[str] = []

        async def device() -> None:  # the loop keeps running while the event is awaited
            await asyncio.sleep(0.02)
            seen.append("completed")
            fake.complete_all()

        task = asyncio.create_task(device())
        assert await ev is None
        seen.append("awaited")
        await task
        return seen

    assert asyncio.run(main()) == ["completed", "awaited"]
    assert ev.done() and ring.cursor == 4


@pytest.mark.rejects("COPY-F")
def test_await_raises_the_events_failure() -> None:
    fake = FakeBackend()
    bridge, ring = Bridge(fake), HostRing(64)
    (ev,) = copies(bridge, ring, 1)
    fake.fail(ev)

    async def main() -> None:
        await ev

    with refused("COPY-F", DeviceCopyError):
        asyncio.run(main())
    assert ev.error is not None and ring.cursor == 0  # a failed input stays unreleased


@pytest.mark.rejects("WAIT-1")
def test_wait_for_times_out_and_leaves_the_event_pending_and_no_thread_behind() -> None:
    fake = FakeBackend(run_on_wait=False)
    bridge, ring = Bridge(fake), HostRing(64)
    (ev,) = copies(bridge, ring, 1)

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ev, 0.05)
        assert not ev.done() and [e.pending for e in fake.pending()] == [True]
        with refused("WAIT-1"):
            await bridge.wait_any_async([ev], timeout=0.02)
        with refused("WAIT-1"):
            await bridge.wait_all_async([ev], timeout=0.02)

    asyncio.run(main())
    for _ in range(200):  # the watcher goes once nothing is awaited (after its current sleep)
        if not bridge._watcher._running:
            break
        threading.Event().wait(0.01)
    assert not bridge._watcher._running and not ev.done()


@pytest.mark.holds("WAIT-1")
def test_many_awaited_events_share_one_watcher_thread() -> None:
    fake = FakeBackend(run_on_wait=False)
    bridge, ring = Bridge(fake), HostRing(1024)
    events = copies(bridge, ring, 40)
    before = frozenset(threading.enumerate())

    async def main() -> int:
        gathered = asyncio.gather(*(asyncio.ensure_future(_await(e)) for e in events))
        await asyncio.sleep(0.02)
        threads = watchers(besides=before)
        fake.complete_all()
        await gathered
        return threads

    assert asyncio.run(main()) == 1
    assert all(e.done() and e.error is None for e in events) and ring.cursor == 160


async def _await(event: object) -> None:
    await event  # type: ignore[misc]


@pytest.mark.holds("WAIT-1")
def test_on_the_fake_awaiting_runs_the_work_as_event_wait_does() -> None:
    bridge, ring = Bridge(FakeBackend()), HostRing(64)
    a, b = copies(bridge, ring, 2)

    async def main() -> object:
        await a
        return await bridge.wait_any_async([b], timeout=5)

    assert asyncio.run(main()) is b and a.done() and b.done()


@pytest.mark.holds("WAIT-1")
def test_wait_any_async_returns_the_first_done_in_the_order_given_and_wait_all_async_waits_for_all() -> None:
    fake = FakeBackend(run_on_wait=False)
    bridge, ring = Bridge(fake), HostRing(64)
    a, b, c = copies(bridge, ring, 3)

    async def main() -> object:
        asyncio.get_running_loop().call_later(0.02, fake.complete, c)
        first = await bridge.wait_any_async([a, b, c], timeout=5)
        asyncio.get_running_loop().call_later(0.02, fake.complete_all)
        await bridge.wait_all_async([a, b, c], timeout=5)
        return first

    assert asyncio.run(main()) is c and all(e.done() for e in (a, b, c))


@pytest.mark.rejects("ARG-1")
def test_the_async_waits_refuse_what_the_waits_refuse() -> None:
    bridge, ring = Bridge(FakeBackend()), HostRing(64)
    (ev,) = copies(bridge, ring, 1)
    (foreign,) = copies(Bridge(FakeBackend()), HostRing(64), 1)

    async def main() -> None:
        for call in (
            bridge.wait_any_async([]),
            bridge.wait_any_async([foreign]),
            bridge.wait_all_async([ev, "x"]),  # type: ignore[list-item]
            bridge.wait_any_async([ev], timeout=-1),
            bridge.wait_all_async([ev], timeout=float("nan")),
        ):
            with refused("ARG-1"):
                await call
        assert not ev.done()

    asyncio.run(main())


@pytest.mark.holds("WAIT-1", "H2D-3")
def test_await_a_copy_on_tinygrads_cpu_device() -> None:
    bridge, ring = Bridge(TinygradBackend("CPU")), HostRing(1 << 23)
    h = bridge.alloc_device(U8, 1 << 22)
    ev = bridge.host_to_device(put(ring, b"\x07" * (1 << 22)), DeviceRange(h, 0, 1 << 22), sync=False)

    async def main() -> None:
        await asyncio.wait_for(ev, 30)

    asyncio.run(main())
    assert ev.done() and ev.error is None and ring.cursor == 1 << 22


@pytest.mark.rejects("WAIT-1")
def test_a_zero_timeout_only_looks_even_on_a_fake_that_runs_what_it_waits_for() -> None:
    bridge, ring = Bridge(FakeBackend()), HostRing(64)
    (ev,) = copies(bridge, ring, 1)

    async def main() -> None:
        with refused("WAIT-1"):
            await bridge.wait_any_async([ev], timeout=0)
        with refused("WAIT-1"):
            await bridge.wait_all_async([ev], timeout=0.0)
        await bridge.wait_all_async([], timeout=0)

    asyncio.run(main())
    assert not ev.done() and not bridge._watcher._running  # nothing was awaited
