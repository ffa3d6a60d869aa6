"""Helpers shared by the tests (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from devbridge import Bridge, DeviceHandle, DeviceRange, HostRange, HostRing, ObjectSpec
from devbridge.backends.fake import FakeBackend

F32 = ObjectSpec("activations", "float32", role="input")
U8 = ObjectSpec("blob", "uint8")


def put(ring: HostRing, data: bytes) -> HostRange:
    """Reserve a range and fill it, as a producer would."""
    r = ring.reserve(len(data))
    ring.view(r)[:] = data
    return r


def read_device(bridge: Bridge, ring: HostRing, handle: DeviceHandle, offset: int, nbytes: int) -> bytes:
    """Read device bytes back through the bridge (sync device_to_host), then release them."""
    out = ring.reserve(nbytes)
    bridge.device_to_host(DeviceRange(handle, offset, nbytes), out)
    data = bytes(ring.view(out))
    ring.release(out)
    return data


def snapshot(bridge: Bridge, fake: FakeBackend, ring: HostRing, handles: Sequence[DeviceHandle]) -> object:
    """Everything a rejected call must leave unchanged."""
    return (bridge.stats(), [bridge.state(h) for h in handles], ring.snapshot(), fake.snapshot())


def world(bridge: Bridge, fake: FakeBackend, ring: HostRing, handles: Sequence[DeviceHandle]) -> Callable[[], object]:
    """`snapshot` of these, taken whenever called (for `rules.assert_each_refused`)."""
    return lambda: snapshot(bridge, fake, ring, handles)
