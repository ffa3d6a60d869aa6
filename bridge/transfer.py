"""Uploads and downloads of numpy arrays: the reserve, fill, copy and release steps of a copy
through a host ring, done in one call (`Bridge.upload`, `Bridge.download`).

The copies are the bridge's own `host_to_device` and `device_to_host`, with their rules and
events. Their host bytes come from the caller's ring, or from a small staging ring the bridge
keeps for synchronous calls (an asynchronous upload without a ring gets host memory of its
own, which lives as long as its event: a failed copy leaves nothing behind in a shared ring).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

from devbridge.args import flag
from devbridge.errors import RangeError, RingFullError, short
from devbridge.ring.buffers import array_layout, byte_view
from devbridge.ring.host import HostRange, HostRing
from devbridge.types import DeviceHandle, DeviceRange

if TYPE_CHECKING:
    import numpy as np

    from devbridge.bridge.events import CopyEvent

#: The staging ring's size: a synchronous call larger than this gets host memory of its own.
STAGING_BYTES = 1 << 20


class Copies(Protocol):
    """What uploads and downloads need of a bridge."""

    def check_device_range(self, device: DeviceRange) -> None: ...

    def host_to_device(
        self, src: HostRange, dst: DeviceRange, *, sync: bool = True, release: bool = True
    ) -> CopyEvent: ...

    def device_to_host(self, src: DeviceRange, dst: HostRange, *, sync: bool = True) -> CopyEvent: ...


class Staging:
    """The host bytes of uploads and downloads made without a ring of the caller's."""

    def __init__(self) -> None:
        self._ring: HostRing | None = None
        self._lock = threading.Lock()

    def reserve(self, nbytes: int, sync: bool) -> HostRange:
        """Bytes for one copy: from the shared ring when it is synchronous and they fit now,
        else a ring of their own."""
        if sync and nbytes <= STAGING_BYTES:
            with self._lock:
                if self._ring is None:
                    self._ring = HostRing(STAGING_BYTES)
                ring = self._ring
            try:
                return ring.reserve(nbytes)
            except RingFullError:  # other threads' calls hold it: never wait on them
                pass
        return HostRing(nbytes).reserve(nbytes)


def upload(
    bridge: Copies, staging: Staging, handle: DeviceHandle, array: Any, offset: int, ring: Any, sync: bool
) -> CopyEvent:
    """`Bridge.upload`: see there."""
    source = byte_view(array)
    if type(sync) is not bool:
        flag("sync", sync)
    dst = DeviceRange(handle, offset, source.nbytes)
    bridge.check_device_range(dst)
    src = _reserve(staging, ring, source.nbytes, sync)
    try:
        src.ring.raw(src)[:] = source  # (bytes it reserved now: live, and no copy reads them yet)
        return bridge.host_to_device(src, dst, sync=sync)
    except BaseException:
        _release_if_unreleased(src)
        raise


def download(
    bridge: Copies, staging: Staging, handle: DeviceHandle, dtype: Any, shape: Any, offset: int, ring: Any
) -> np.ndarray:
    """`Bridge.download`: see there."""
    kind, dims, nbytes = array_layout(dtype, shape)
    if nbytes is None:
        raise RangeError("RANGE-1", "a download needs the shape of the array it returns")
    src = DeviceRange(handle, offset, nbytes)
    bridge.check_device_range(src)
    dst = _reserve(staging, ring, nbytes, True)
    try:
        bridge.device_to_host(src, dst, sync=True)
        return dst.ring.array(dst, kind, dims).copy()
    finally:
        _release_if_unreleased(dst)


def _reserve(staging: Staging, ring: Any, nbytes: int, sync: bool) -> HostRange:
    if ring is None:
        return staging.reserve(nbytes, sync)
    if not isinstance(ring, HostRing):
        raise RangeError("RANGE-1", f"ring must be a HostRing or None, got {short(ring)}")
    return ring.reserve(nbytes)


def _release_if_unreleased(r: HostRange) -> None:
    """Give back the bytes of a copy that did not take them (refused, failed, or read already)."""
    if not r.ring.released(r):
        r.ring.release(r)
