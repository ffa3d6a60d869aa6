"""bridge.wait_any and bridge.wait_all: block until events are done, honour timeouts (WAIT-1),
and refuse anything but this bridge's events (ARG-1)."""

from __future__ import annotations

import threading
import time

import pytest
from rules import refused
from support import U8, put

from devbridge import (
    Bridge,
    DeviceCopyError,
    DeviceRange,
    HostRing,
    InvalidArgumentError,
    WaitTimeoutError,
)
from devbridge.backends.fake import FakeBackend
from devbridge.backends.tinygrad import TinygradBackend


@pytest.fixture
def hung() -> FakeBackend:
    """A fake whose wait blocks until a test (maybe on another thread) completes the work."""
    return FakeBackend(run_on_wait=False)


def two_copies(bridge: Bridge, ring: HostRing) -> list:  # type: ignore[type-arg]
    h = bridge.alloc_device(U8, 8)
    return [
        bridge.host_to_device(put(ring, b"aaaa"), DeviceRange(h, 0, 4), sync=False),
        bridge.host_to_device(put(ring, b"bbbb"), DeviceRange(h, 4, 4), sync=False),
    ]


@pytest.mark.holds("WAIT-1")
def test_wait_any_returns_the_event_another_thread_completes(ring: HostRing, hung: FakeBackend) -> None:
    fake, bridge = hung, Bridge(hung)
    first, second = two_copies(bridge, ring)
    threading.Timer(0.05, fake.complete, [second]).start()
    start = time.monotonic()
    assert bridge.wait_any([first, second], timeout=30) is second
    assert time.monotonic() - start < 10 and not first.done()  # a hang detector, not a speed goal
    fake.complete(first)
    assert bridge.wait_any([first, second]) is first  # the first done, in the order given


@pytest.mark.holds("WAIT-1")
def test_wait_all_waits_for_every_event_and_leaves_failures_on_them(ring: HostRing, hung: FakeBackend) -> None:
    fake, bridge = hung, Bridge(hung)
    first, second = two_copies(bridge, ring)
    threading.Timer(0.02, fake.fail, [first]).start()
    threading.Timer(0.05, fake.complete, [second]).start()
    bridge.wait_all([first, second], timeout=30)
    assert isinstance(first.error, DeviceCopyError) and second.error is None
    assert bytes(fake.buffer(0).data) == b"\0\0\0\0bbbb"


@pytest.mark.holds("WAIT-1")
def test_wait_all_runs_held_copies_on_the_fake(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    """The default fake's wait runs the work: a chain of held copies ends in order."""
    h = bridge.alloc_device(U8, 4)
    events = [bridge.host_to_device(put(ring, bytes([k]) * 4), DeviceRange(h, 0, 4), sync=False) for k in range(3)]
    bridge.wait_all(events)
    assert all(e.done() and e.error is None for e in events) and bytes(fake.buffer(0).data) == b"\2\2\2\2"


@pytest.mark.rejects("WAIT-1")
@pytest.mark.parametrize("call", ["wait_any", "wait_all"])
def test_waits_time_out_and_change_nothing(call: str, ring: HostRing, hung: FakeBackend) -> None:
    bridge = Bridge(hung)
    events = two_copies(bridge, ring)
    start = time.monotonic()
    with refused("WAIT-1") as e:
        getattr(bridge, call)(events, timeout=0.05)
    assert isinstance(e.value, TimeoutError)
    assert time.monotonic() - start < 10 and not any(ev.done() for ev in events)
    assert bridge.stats().pending_events == 2


BAD = {
    "none": lambda: None,
    "int": lambda: 3,
    "str": lambda: "events",
    "bytes": lambda: b"xy",
    "list of None": lambda: [None],
    "list of object": lambda: [object()],
    "iterator of int": lambda: iter([1]),
    "generator of floats": lambda: (x for x in [1.0, 2.0]),
}


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("bad", sorted(BAD))
def test_waits_refuse_anything_but_this_bridges_events(bad: str, bridge: Bridge, fake: FakeBackend) -> None:
    for call in (bridge.wait_any, bridge.wait_all):
        with refused("ARG-1"):
            call(BAD[bad]())  # type: ignore[arg-type]
    assert fake.calls == []


@pytest.mark.rejects("ARG-1")
def test_waits_refuse_other_bridges_events_an_empty_any_and_bad_timeouts(ring: HostRing) -> None:
    fake = FakeBackend()
    bridge, other = Bridge(fake), Bridge(FakeBackend())
    mine = two_copies(bridge, ring)
    theirs = other.host_to_device(put(ring, b"zz"), DeviceRange(other.alloc_device(U8, 2), 0, 2), sync=False)
    for call in (bridge.wait_any, bridge.wait_all):
        with pytest.raises(InvalidArgumentError, match="not an event of this bridge"):
            call([*mine, theirs])
        with refused("ARG-1"):
            call(mine, timeout=-1)
    with pytest.raises(InvalidArgumentError, match="at least one event"):
        bridge.wait_any([])
    bridge.wait_all([])  # nothing to wait for
    assert not any(e.done() for e in mine)


def broken() -> object:
    def gen() -> object:
        yield 1
        raise RuntimeError("broken iterable")

    return gen()


@pytest.mark.rejects("ARG-1")
def test_an_iterable_that_fails_as_it_is_read_is_an_arg_error(bridge: Bridge) -> None:
    with refused("ARG-1"):
        bridge.wait_any(broken())  # type: ignore[arg-type]


@pytest.mark.holds("WAIT-1")
def test_wait_any_on_tinygrad_copies_blocks_until_the_copy_thread_finishes() -> None:
    backend = TinygradBackend("CPU")
    bridge, ring = Bridge(backend), HostRing(1 << 20)
    h = bridge.alloc_device(U8, 1 << 16)
    with backend.hold_copies():
        events = [
            bridge.host_to_device(put(ring, bytes([k + 1]) * (1 << 15)), DeviceRange(h, k << 15, 1 << 15), sync=False)
            for k in range(2)
        ]
        with pytest.raises(WaitTimeoutError):
            bridge.wait_any(events, timeout=0.02)  # the copy thread is held: nothing can finish
    done = bridge.wait_any(events, timeout=30)
    assert done in events and done.error is None
    bridge.wait_all(events, timeout=30)
    out = ring.reserve(1 << 16)
    bridge.device_to_host(DeviceRange(h, 0, 1 << 16), out)
    assert bytes(ring.view(out)) == b"\1" * (1 << 15) + b"\2" * (1 << 15)


@pytest.mark.holds("WAIT-1")
def test_event_wait_returns_when_another_thread_completes_it(ring: HostRing, hung: FakeBackend) -> None:
    bridge = Bridge(hung)
    first, second = two_copies(bridge, ring)
    assert (first.done(), first.error) == (False, None)  # pending: no verdict yet
    threading.Timer(0.05, hung.complete, [first]).start()
    start = time.monotonic()
    first.wait(timeout=30)
    assert time.monotonic() - start < 10  # a hang detector: it returned at completion, not at the deadline
    assert first.done() and first.error is None and not second.done()


class Deaf(FakeBackend):
    """A backend that cannot report completions (the protocol allows it): the bridge must ask."""

    def subscribe(self, callback: object) -> bool:  # type: ignore[override]
        return False


@pytest.mark.holds("WAIT-1")
@pytest.mark.parametrize("call", ["wait_any", "wait_all"])
def test_waits_on_a_backend_that_cannot_report_completions_query_it(call: str, ring: HostRing) -> None:
    fake = Deaf(run_on_wait=False)
    bridge = Bridge(fake)
    first, second = two_copies(bridge, ring)
    threading.Timer(0.05, fake.complete, [second]).start()
    threading.Timer(0.05, fake.complete, [first]).start()
    if call == "wait_any":
        got = bridge.wait_any([first, second], timeout=30)
        assert got in (first, second) and got.done() and got.error is None
    else:
        bridge.wait_all([first, second], timeout=30)
        assert first.done() and second.done() and bridge.stats().pending_events == 0


@pytest.mark.holds("COPY-F")
def test_an_events_error_asks_the_backend_when_it_cannot_report_completions(ring: HostRing) -> None:
    fake = Deaf(run_on_wait=False)
    bridge = Bridge(fake)
    first, second = two_copies(bridge, ring)
    fake.fail(first)  # nothing tells the bridge: reading .error must ask the backend
    fake.complete(second)
    assert isinstance(first.error, DeviceCopyError) and first.error.rule == "COPY-F"
    assert second.error is None and second.done()


@pytest.mark.holds("WAIT-1")
def test_wait_any_runs_the_work_on_the_fake_as_event_wait_does(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    """The fake runs what it is waited on (`waits_run_work`): wait_any waits on the first event
    not done, in the order given, and returns the first found done."""
    assert fake.waits_run_work is True
    a, b = two_copies(bridge, ring)
    assert bridge.wait_any([b, a], timeout=5) is b
    assert (a.done(), b.done()) == (False, True)  # the fake's copies run in any order
    assert fake.device_bytes(0) == b"\0\0\0\0bbbb"
    assert bridge.wait_any([a, b], timeout=5) is b  # one done already: returned without a wait
    assert bridge.wait_any([a], timeout=5) is a and fake.device_bytes(0) == b"aaaabbbb"
    # a copy held behind another (ORDER-1) has no token yet: its blocker is waited on, and the
    # first event found done is returned
    h = bridge.alloc_device(U8, 4)
    first = bridge.host_to_device(put(ring, b"1111"), DeviceRange(h, 0, 4), sync=False)
    held = bridge.host_to_device(put(ring, b"2222"), DeviceRange(h, 0, 4), sync=False)
    assert held.backend_token is None
    assert bridge.wait_any([held, first], timeout=5) is first


@pytest.mark.holds("WAIT-1")
def test_wait_any_leaves_an_open_compute_block_alone_and_runs_the_next_event(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h, other = bridge.alloc_device(U8, 4), bridge.alloc_device(U8, 4)
    with bridge.compute(h) as block:
        copy = bridge.host_to_device(put(ring, b"cccc"), DeviceRange(other, 0, 4), sync=False)
        assert bridge.wait_any([block, copy], timeout=5) is copy
        assert block.open and not block.done()
    block.wait(5)


@pytest.mark.rejects("WAIT-1")
def test_wait_any_on_a_fake_that_does_not_run_waited_work_times_out(ring: HostRing, hung: FakeBackend) -> None:
    bridge = Bridge(hung)
    a, _ = two_copies(bridge, ring)
    assert hung.waits_run_work is False
    with refused("WAIT-1"):
        bridge.wait_any([a], timeout=0.05)
    assert not a.done() and [e.pending for e in hung.pending()] == [True, True]


def test_wait_any_asks_a_driven_backend_without_a_timeout_of_its_own(ring: HostRing) -> None:
    """wait_any keeps its own deadline: the backend it drives is asked to wait 0 s (the fake
    runs the work at once), never for a time of the backend's choosing."""

    class Timed(FakeBackend):
        def __init__(self) -> None:
            super().__init__()
            self.waited: list[float | None] = []

        def wait(self, token: object, timeout: float | None) -> bool:
            self.waited.append(timeout)
            return super().wait(token, timeout)

    timed = Timed()
    bridge = Bridge(timed)
    a, b = two_copies(bridge, ring)
    assert bridge.wait_any([a, b], timeout=5) is a
    assert timed.waited == [0] and not b.done()


def test_only_a_backend_that_says_true_is_driven_and_the_faulty_wrapper_passes_it_on(ring: HostRing) -> None:
    from devbridge.testing import FaultyBackend

    assert FaultyBackend(FakeBackend()).waits_run_work is True
    assert FaultyBackend(FakeBackend(run_on_wait=False)).waits_run_work is False

    class Vague(FakeBackend):
        waits_run_work = "yes"  # type: ignore[assignment]  # not True: not a promise

    bridge = Bridge(Vague())
    a, _ = two_copies(bridge, ring)
    with refused("WAIT-1"):
        bridge.wait_any([a], timeout=0.05)
    assert not a.done()


def test_a_backend_that_says_nothing_is_not_driven(ring: HostRing) -> None:
    """A backend with no `waits_run_work` at all (a device's own backend) makes no promise:
    wait_any sleeps until a completion is reported, it never waits on an event unbounded."""

    class Silent(FakeBackend):
        @property
        def waits_run_work(self) -> bool:
            raise AttributeError("waits_run_work")  # as if the backend had no such attribute

    silent = Silent()
    assert not hasattr(silent, "waits_run_work")
    bridge = Bridge(silent)
    a, _ = two_copies(bridge, ring)
    with refused("WAIT-1"):
        bridge.wait_any([a], timeout=0.05)
    assert not a.done()
