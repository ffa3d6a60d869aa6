"""Waits and the PIN-1 timer on a clock that does not move between two reads (a coarse or frozen
`time.monotonic`): a timeout of 0 s is a poll that raises at once when the event is pending, a
wait never spins, and a release pending for `pending_warning_s=0` is logged on the first poll."""

from __future__ import annotations

import logging

import pytest
from support import U8, put

from devbridge import Bridge, DeviceRange, HostRing, WaitTimeoutError
from devbridge.backends.fake import FakeBackend
from devbridge.bridge import bridge as bridge_module
from devbridge.bridge import engine, events


class FrozenClock:
    """`time` for the bridge and its events: monotonic() always says the same; a wait that keeps
    reading it without raising would spin forever, so reading it too often fails the test."""

    def __init__(self, reads: int = 1000) -> None:
        self.reads, self.limit = 0, reads

    def monotonic(self) -> float:
        self.reads += 1
        assert self.reads <= self.limit, f"the clock was read {self.reads} times: the wait spins"
        return 1000.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    frozen = FrozenClock()
    for module in (bridge_module, engine, events):  # each that reads the clock
        monkeypatch.setattr(module, "time", frozen)
    return frozen


def pending_copy(bridge: Bridge, ring: HostRing):  # type: ignore[no-untyped-def]
    h = bridge.alloc_device(U8, 4)
    src = put(ring, b"abcd")
    return h, src, bridge.host_to_device(src, DeviceRange(h, 0, 4), sync=False)


@pytest.mark.holds("WAIT-1")
@pytest.mark.parametrize("wait", ["event.wait", "wait_all", "wait_any"])
def test_a_zero_timeout_on_a_pending_event_raises_at_once(
    wait: str, fake: FakeBackend, ring: HostRing, clock: FrozenClock
) -> None:
    """The fake would run the work if asked to wait for it: a 0 s timeout must not ask."""
    bridge = Bridge(fake)
    h, src, ev = pending_copy(bridge, ring)
    calls = {
        "event.wait": lambda: ev.wait(timeout=0),
        "wait_all": lambda: bridge.wait_all([ev], timeout=0),
        "wait_any": lambda: bridge.wait_any([ev], timeout=0),
    }
    with pytest.raises(WaitTimeoutError) as raised:
        calls[wait]()
    assert raised.value.rule == "WAIT-1" and clock.reads <= 3
    assert not ev.done() and not ring.released(src) and bridge.state(h) == "copying"
    fake.complete(ev)
    assert ev.done() and ring.released(src)


@pytest.mark.holds("PIN-1")
def test_a_release_pending_for_zero_seconds_is_logged_on_the_first_poll(
    fake: FakeBackend, ring: HostRing, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = Bridge(fake, pending_warning_s=0.0)
    h, _, ev = pending_copy(bridge, ring)
    with caplog.at_level(logging.WARNING, logger="devbridge"):
        bridge.free_device(h)
        bridge.poll()
    messages = [r.getMessage() for r in caplog.records if r.name == "devbridge"]
    assert messages == [
        "allocation #0 (blob, role data) is free_pending after 0 s; still in use by 1 copy_in (copy_in #0 bytes 0..4)"
    ]
    fake.complete(ev)
    assert bridge.state(h) == "freed"
