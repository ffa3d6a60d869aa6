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


class HeardAtOnce(FakeBackend):
    """A device whose copy can finish before the call that issued it returns, heard on the
    caller's thread (as tinygrad's CPU copy thread is: a future already done runs its callback at
    once), while a device thread reports an earlier copy (queued: the call holds the lock)."""

    earlier: object = None

    def copy_in(self, buffer: object, offset: int, src: memoryview, *, sync: bool) -> object:
        token = super().copy_in(buffer, offset, src, sync=sync)
        if self.earlier is not None and not sync:
            reporter = threading.Thread(target=self.complete, args=(self.earlier,))
            reporter.start()  # the device thread: the Bridge's lock is busy, its report waits
            reporter.join()
            self.complete(token)  # this copy, done already: heard here, where the lock is ours
        return token


def test_a_use_that_ends_during_a_copy_call_leaves_the_state_its_counts_say() -> None:
    fake = HeardAtOnce()
    bridge = Bridge(fake)
    ring = HostRing(1024)
    h = bridge.alloc_device(U8, 64)
    first = bridge.host_to_device(put(ring, b"a" * 16), DeviceRange(h, 0, 16), sync=False)
    assert bridge.state(h) == "copying"
    fake.earlier = first
    second = bridge.host_to_device(put(ring, b"b" * 16), DeviceRange(h, 16, 16), sync=False)
    # both ended: the first during the second's call, the second before it returned
    assert first.done() and second.done()
    assert bridge.pins(h).copies_in == 0
    assert bridge.state(h) == "idle"
    assert fake.device_bytes(h.id)[:32] == b"a" * 16 + b"b" * 16
    bridge.free_device(h)  # freed at once: no use is left to wait for
    assert fake.calls[-1].op == "free" and bridge.state(h) == "freed"
