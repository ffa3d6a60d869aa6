"""The host-bytes checking mode (H2D-3, D2H-3): a write into host bytes a copy may still read, or
into an output between its copy and the worker's read, fails with HostBytesChangedError naming
the copy, the range and the first changed byte, and the bytes stay unreleased."""

from __future__ import annotations

import numpy as np
import pytest
from support import U8, put

from devbridge import (
    Bridge,
    CopyEvent,
    DeviceHandle,
    DeviceRange,
    HostBytesChangedError,
    HostRange,
    HostRing,
    InvalidArgumentError,
    RangeError,
)
from devbridge.backends.fake import FakeBackend
from devbridge.backends.tinygrad import TinygradBackend


def checking(fake: FakeBackend) -> Bridge:
    fake.checks_late_reads = False  # the test writes late on purpose: the device reads what is there
    return Bridge(fake, check_host_bytes=True)


def late_write(checked: bool) -> tuple[Bridge, FakeBackend, HostRing, HostRange, CopyEvent]:
    """An asynchronous upload of bytes 0..63 whose bytes 37..39 the caller overwrites through an
    array kept from before the call, then the device reads (the bug the mode is for)."""
    fake = FakeBackend()
    fake.checks_late_reads = False  # the test writes late on purpose: the device reads what is there
    bridge = Bridge(fake, check_host_bytes=checked)
    ring = HostRing(1 << 12)
    h = bridge.alloc_device(U8, 64)
    src = put(ring, bytes(range(64)))
    kept = ring.array(src, np.uint8)  # made before the copy: writable whatever the copy does
    event = bridge.host_to_device(src, DeviceRange(h, 0, 64), sync=False)
    kept[37:40] = 0xEE  # the caller's bug: the copy may still read these
    fake.complete(event)
    return bridge, fake, ring, src, event


@pytest.mark.holds("H2D-3")
def test_a_write_through_a_kept_array_fails_the_async_copy_and_keeps_its_bytes() -> None:
    bridge, _, ring, src, event = late_write(checked=True)
    with pytest.raises(HostBytesChangedError) as caught:
        event.wait()
    e = caught.value
    assert (e.rule, e.offset, e.range) == ("H2D-3", 37, src) and "first at byte 37" in str(e)
    assert isinstance(e, RangeError) and event.error is e
    assert not ring.released(src)  # nothing downstream consumes them silently
    stats = bridge.stats()
    assert (stats.host_bytes_changed, stats.copy_failures) == (1, 1)
    ring.release(src)  # the worker's to release, now that the copy is over


def test_without_the_mode_the_device_reads_the_late_write() -> None:
    """The control: the same bug with the mode off goes unnoticed, and the device got the write."""
    bridge, fake, ring, src, event = late_write(checked=False)
    event.wait()
    assert bytes(fake.buffer(0).data[37:40]) == b"\xee" * 3 and ring.released(src)
    assert bridge.stats().host_bytes_changed == 0


@pytest.mark.holds("H2D-3")
def test_an_unchanged_copy_passes_and_releases_as_usual() -> None:
    fake = FakeBackend()
    bridge = checking(fake)
    ring = HostRing(1 << 12)
    h = bridge.alloc_device(U8, 64)
    src = put(ring, bytes(range(64)))
    event = bridge.host_to_device(src, DeviceRange(h, 0, 64), sync=False)
    fake.complete(event)
    event.wait()
    assert ring.released(src) and bytes(fake.buffer(0).data) == bytes(range(64))
    done = bridge.host_to_device(put(ring, b"x" * 64), DeviceRange(h, 0, 64))
    assert done.error is None and bridge.stats().host_bytes_changed == 0


class WritesDuringCopy(FakeBackend):
    """A device whose copy in runs while another writer changes the source's byte `at`."""

    at = -1

    def copy_in(self, buffer: object, offset: int, src: memoryview, *, sync: bool) -> object:
        if self.at >= 0:
            src[self.at] ^= 0xFF
        return super().copy_in(buffer, offset, src, sync=sync)


@pytest.mark.holds("H2D-3")
def test_a_write_during_a_synchronous_copy_raises_from_the_call() -> None:
    fake = WritesDuringCopy()
    bridge = checking(fake)
    ring = HostRing(1 << 12)
    h = bridge.alloc_device(U8, 64)
    src = put(ring, bytes(64))
    fake.at = 5
    with pytest.raises(HostBytesChangedError) as caught:
        bridge.host_to_device(src, DeviceRange(h, 0, 64))
    assert (caught.value.rule, caught.value.offset) == ("H2D-3", 5)
    assert not ring.released(src) and bridge.stats().host_bytes_changed == 1


@pytest.mark.holds("H2D-3", "ORDER-1")
def test_a_held_copy_is_fingerprinted_when_the_call_hands_its_bytes_over() -> None:
    """A copy held behind an earlier use: a write before it even reaches the device is caught."""
    fake = FakeBackend()
    bridge = checking(fake)
    ring = HostRing(1 << 12)
    h = bridge.alloc_device(U8, 64)
    first = bridge.host_to_device(put(ring, b"a" * 64), DeviceRange(h, 0, 64), sync=False)
    src = put(ring, b"b" * 64)
    kept = ring.array(src, np.uint8)
    held = bridge.host_to_device(src, DeviceRange(h, 0, 64), sync=False)
    assert held.backend_token is None  # held back (ORDER-1): not on the device yet
    kept[63] = 0
    fake.complete(first)
    bridge.poll()
    fake.complete(held)
    with pytest.raises(HostBytesChangedError) as caught:
        held.wait()
    assert (caught.value.offset, first.error) == (63, None) and not ring.released(src)


def outputs() -> tuple[Bridge, FakeBackend, DeviceHandle, HostRing]:
    """A checking bridge whose 32 B allocation holds bytes 0..31, and an output ring."""
    fake = FakeBackend()
    bridge = checking(fake)
    h = bridge.alloc_device(U8, 32)
    bridge.host_to_device(put(HostRing(1 << 12), bytes(range(32))), DeviceRange(h, 0, 32))
    return bridge, fake, h, HostRing(1 << 12)


@pytest.mark.holds("D2H-3")
def test_an_output_changed_before_the_worker_reads_it_is_refused_once() -> None:
    bridge, _, h, out = outputs()
    o = out.reserve(32)
    kept = out.array(o, np.uint8)
    bridge.device_to_host(DeviceRange(h, 0, 32), o)
    kept[9] = 0xAB  # a late writer spoils the output before the worker reads it
    with pytest.raises(HostBytesChangedError) as caught:
        out.view(o)
    assert (caught.value.rule, caught.value.offset, caught.value.range) == ("D2H-3", 9, o)
    assert bridge.stats().host_bytes_changed == 1 and not out.released(o)
    assert bytes(out.view(o))[9] == 0xAB  # reported once: the worker decides what to do with them
    out.release(o)


@pytest.mark.holds("D2H-3")
def test_an_async_output_is_checked_at_its_release_and_at_its_commit() -> None:
    bridge, fake, h, out = outputs()
    o, p = out.reserve(16), out.reserve(16)
    kept_o, kept_p = out.array(o, np.uint8), out.array(p, np.uint8)
    events = [bridge.device_to_host(DeviceRange(h, k * 16, 16), r, sync=False) for k, r in ((0, o), (1, p))]
    for event in events:
        fake.complete(event)
        event.wait()
    kept_o[0] = 0xFF
    kept_p[15] = 0
    with pytest.raises(HostBytesChangedError) as released:
        out.release(o)
    with pytest.raises(HostBytesChangedError) as committed:
        out.commit(p)
    assert (released.value.offset, committed.value.offset) == (0, 15)
    assert not out.released(o) and out.commit(p) == 0  # refused once, changing nothing
    assert bridge.stats().host_bytes_changed == 2


def test_an_unchanged_output_reads_and_releases_as_usual() -> None:
    bridge, _, h, out = outputs()
    o = out.reserve(32)
    bridge.device_to_host(DeviceRange(h, 0, 32), o)
    assert bytes(out.view(o)) == bytes(range(32))
    out.release(o)
    assert out.released(o) and bridge.stats().host_bytes_changed == 0


def test_the_environment_turns_the_mode_on_and_a_wrong_flag_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVBRIDGE_CHECK_HOST_BYTES", "1")
    fake = WritesDuringCopy()
    fake.checks_late_reads = False
    bridge = Bridge(fake)
    ring = HostRing(1 << 12)
    h = bridge.alloc_device(U8, 8)
    fake.at = 0
    with pytest.raises(HostBytesChangedError):
        bridge.host_to_device(put(ring, bytes(8)), DeviceRange(h, 0, 8))
    assert Bridge(FakeBackend(), check_host_bytes=False)._engine.host_check is None
    monkeypatch.setenv("DEVBRIDGE_CHECK_HOST_BYTES", "0")
    assert Bridge(FakeBackend())._engine.host_check is None
    for wrong in ("yes", 1, 0.0):
        with pytest.raises(InvalidArgumentError) as refused:
            Bridge(FakeBackend(), check_host_bytes=wrong)  # type: ignore[arg-type]
        assert refused.value.rule == "ARG-1"


@pytest.mark.holds("H2D-3")
def test_on_tinygrads_cpu_device_a_write_while_the_copy_thread_is_held_is_caught() -> None:
    backend = TinygradBackend("CPU")
    bridge = Bridge(backend, check_host_bytes=True)
    ring = HostRing(1 << 20)
    h = bridge.alloc_device(U8, 1 << 16)
    src = put(ring, bytes(1 << 16))
    kept = ring.array(src, np.uint8)
    with backend.hold_copies():
        event = bridge.host_to_device(src, DeviceRange(h, 0, 1 << 16), sync=False)
        kept[4096:] = 7
    with pytest.raises(HostBytesChangedError) as caught:
        event.wait(10)
    assert (caught.value.offset, ring.released(src)) == (4096, False)


def test_a_caught_change_is_marked_on_the_trace() -> None:
    import io
    import json

    fake, out = WritesDuringCopy(), io.StringIO()
    fake.checks_late_reads = False
    bridge = Bridge(fake, check_host_bytes=True, trace=out)
    ring = HostRing(1 << 12)
    h = bridge.alloc_device(U8, 16)
    fake.at = 2
    with pytest.raises(HostBytesChangedError):
        bridge.host_to_device(put(ring, bytes(16)), DeviceRange(h, 0, 16))
    bridge.close_trace()
    faults = [e["name"] for e in json.loads(out.getvalue()) if e.get("cat") == "fault"]
    assert faults == ["failed: host_to_device into allocation #0 [0, 16): host bytes [0, 16) changed at +2"]


def test_a_copy_that_ends_without_completing_leaves_no_fingerprint_behind() -> None:
    """A restart aborts an upload on the device and one held behind it (ORDER-1), which never
    reaches the device: the mode keeps nothing for either (a kept fingerprint would grow with
    every abort, and could be taken for a later copy's)."""
    fake = FakeBackend()
    bridge = checking(fake)
    check = bridge._engine.host_check
    assert check is not None
    ring = HostRing(1 << 12)
    h = bridge.alloc_device(U8, 64)
    on_device = bridge.host_to_device(put(ring, bytes(64)), DeviceRange(h, 0, 64), sync=False)
    held = bridge.host_to_device(put(ring, bytes(64)), DeviceRange(h, 0, 64), sync=False)  # behind it
    assert (len(check._inputs), len(check._held)) == (1, 1)
    bridge.restart()
    assert not on_device.done() and not held.done()  # the device still reads the first one's bytes
    fake.complete(on_device)  # then both end aborted; the held one never reached the device
    assert [(e.done(), getattr(e.error, "rule", None)) for e in (on_device, held)] == [(True, "GEN-1")] * 2
    assert (check._inputs, check._held) == ({}, {})
