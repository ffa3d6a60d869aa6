"""The per-call path, counted in Python calls (`sys.setprofile`: deterministic, not timed): what a
synchronous copy costs the bridge, and that the first copy on a new allocation costs what the
next ones do (every step a copy can take was made with the table, not on first use)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import devbridge
from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.testing import FakeBackend

PACKAGE = Path(devbridge.__file__).resolve().parent
#: The bridge's own calls: the package's, not a backend's (a backend's first touch of a buffer
#: is its own business) and not tinygrad's or the standard library's.
BACKENDS = ("backends", "testing")


def own_calls(call: Callable[[], object]) -> list[str]:
    """The package's own Python functions `call` runs, in order (its own frame not counted)."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = Path(frame.f_code.co_filename).resolve()
        if path.is_relative_to(PACKAGE) or any(path.is_relative_to(p) for p in _FOLDERS):
            where = path.parent.name
            if where not in BACKENDS:
                seen.append(f"{where}/{path.name}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def _folders() -> list[Path]:
    """Each package's folder (an editable install's resolve to the checkout's folders)."""
    import devbridge.bridge
    import devbridge.ring
    import devbridge.spec
    import devbridge.statemachine

    return [Path(m.__file__).resolve().parent for m in (devbridge.bridge, devbridge.ring, devbridge.spec,
                                                        devbridge.statemachine)]  # fmt: skip


_FOLDERS = _folders()


@pytest.mark.parametrize("backend", ["fake", "tinygrad"])
def test_the_first_copy_on_an_allocation_takes_the_path_of_the_next_ones(backend: str) -> None:
    bridge = Bridge(FakeBackend() if backend == "fake" else TinygradBackend("CPU"))
    ring = HostRing(1 << 16)
    out = HostRing(1 << 16)
    h = bridge.alloc_device(ObjectSpec("x", "uint8"), 1 << 10)
    device = DeviceRange(h, 0, 64)
    paths = []
    for _ in range(4):
        r = ring.reserve(64)
        ring.write(r, bytes(range(64)))
        o = out.reserve(64)
        paths.append((own_calls(lambda r=r: bridge.host_to_device(r, device)),
                      own_calls(lambda o=o: bridge.device_to_host(device, o))))  # fmt: skip
        assert bytes(out.view(o)) == bytes(range(64))
        out.release(o)
    assert paths[0] == paths[1] == paths[2] == paths[3]
    into, back = paths[0]
    assert into[0] == "bridge/bridge.py:host_to_device" and back[0] == "bridge/bridge.py:device_to_host"
    # the bridge's own calls today (the goal is fewer): a ceiling, so the path only gets shorter
    assert len(into) <= 18 and len(back) <= 17, (into, back)
