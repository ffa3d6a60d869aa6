"""Completions processed from another thread while the worker thread keeps calling."""

from __future__ import annotations

import threading

from support import U8, put

from devbridge import Bridge, DeviceRange, HostRing
from devbridge.backends.fake import FakeBackend


def test_completions_from_another_thread_release_every_byte_exactly_once() -> None:
    fake = FakeBackend()
    bridge = Bridge(fake)
    ring = HostRing(1 << 16)
    handles = [bridge.alloc_device(U8, 64) for _ in range(8)]
    stop = threading.Event()
    crashed: list[BaseException] = []

    def completer() -> None:
        try:
            while not stop.is_set() or fake.pending():
                for ev in fake.pending():  # oldest first: the last copy submitted lands last
                    try:
                        fake.complete(ev)
                    except ValueError:  # the worker's wait() ran it first (the fake's wait runs the work)
                        if ev.pending:
                            raise
                bridge.poll()
        except BaseException as e:  # a crash here must fail the test, not end the thread quietly
            crashed.append(e)

    thread = threading.Thread(target=completer)
    thread.start()
    events = []
    for i in range(400):
        h = handles[i % len(handles)]
        src = put(ring, bytes([i % 251]) * 64)
        events.append((bridge.host_to_device(src, DeviceRange(h, 0, 64), sync=False), src))
        if i % 50 == 49:
            for ev, _ in events:
                ev.wait(timeout=10)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and crashed == []
    for ev, src in events:
        assert ev.done() and ev.error is None and ring.released(src)
    assert ring.cursor == ring.head and bridge.stats().pending_events == 0
    assert all(bridge.state(h) == "idle" for h in handles)
    assert fake.violations == []
    # the last copy into each handle wins, byte for byte
    for k, h in enumerate(handles):
        last = max(i for i in range(400) if i % len(handles) == k)
        out = ring.reserve(64)
        bridge.device_to_host(DeviceRange(h, 0, 64), out)
        assert bytes(ring.view(out)) == bytes([last % 251]) * 64
        ring.release(out)
