"""The per-call path, counted in Python calls (`sys.setprofile`: deterministic, not timed): what a
synchronous copy, an allocation and an upload cost on tinygrad's CPU device, every Python function
counted (the bridge's, the ring's, the backend's, generated ones), and that the first copy on a new
allocation costs what the next ones do (every step a copy can take was made with the table, and
the backend makes a buffer's bytes with the buffer)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import numpy as np
import pytest

from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.testing import FakeBackend

#: The budgets: Python calls per call, on tinygrad's CPU device.
BUDGETS = {"host_to_device": 14, "device_to_host": 14, "alloc_device": 20, "upload": 30}


def calls(call: Callable[[], object]) -> list[str]:
    """Every Python function `call` runs, in order (its own frame not counted)."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            seen.append(f"{'/'.join(frame.f_code.co_filename.split('/')[-2:])}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen[1:]


def ours(path: list[str]) -> list[str]:
    """The calls of the bridge's own layers in `path`."""
    return [c for c in path if c.startswith(("bridge/", "ring/", "statemachine/", "spec/", "devbridge/"))]


#: What the idle probe calls when a CPU worker appeared since its last read (tinygrad_compat.idle_probe).
NEW_WORKER = ("backends/tinygrad_compat.py:<listcomp>", "backends/tinygrad_compat.py:_words")


def steady(path: list[str]) -> list[str]:
    """`path` without the idle probe's reading of a new CPU worker's counters."""
    return [c for c in path if c not in NEW_WORKER]


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
        paths.append((calls(lambda r=r: bridge.host_to_device(r, device)),
                      calls(lambda o=o: bridge.device_to_host(device, o))))  # fmt: skip
        assert bytes(out.view(o)) == bytes(range(64))
        out.release(o)
    if backend == "fake":  # the fake's own bookkeeping varies: the bridge's path is what is compared
        paths = [(ours(into), ours(back)) for into, back in paths]
    else:  # tinygrad makes its CPU workers lazily, from any thread: the probe reads a new one's counters once
        paths = [(steady(into), steady(back)) for into, back in paths]
    assert paths[0] == paths[1] == paths[2] == paths[3]
    into, back = paths[0]
    assert into[0].endswith("bridge.py:host_to_device") and back[0].endswith("bridge.py:device_to_host")


def test_each_per_call_path_is_within_its_budget_on_tinygrads_cpu_device() -> None:
    bridge = Bridge(TinygradBackend("CPU"))
    ring, out = HostRing(1 << 16), HostRing(1 << 16)
    spec = ObjectSpec("x", "uint8")
    h = bridge.alloc_device(spec, 1 << 10)
    device = DeviceRange(h, 0, 64)
    array = np.arange(64, dtype=np.uint8)
    bridge.upload(h, array)

    def alloc_device() -> list[str]:
        handles: list[object] = []
        path = calls(lambda: handles.append(bridge.alloc_device(spec, 1 << 10)))
        bridge.free_device(handles[0])  # its buffer kept for the next of its size
        return path

    def host_to_device() -> list[str]:
        r = ring.reserve(64)
        ring.write(r, bytes(range(64)))
        return calls(lambda: bridge.host_to_device(r, device))

    def device_to_host() -> list[str]:
        o = out.reserve(64)
        path = calls(lambda: bridge.device_to_host(device, o))
        assert bytes(out.view(o)) == bytes(range(64))
        out.release(o)
        return path

    alloc_device()
    # The steady path: the shortest of three. tinygrad makes its CPU workers lazily, from any
    # thread of the process, and the idle probe reads a new worker's counters once.
    paths = {"alloc_device": alloc_device, "host_to_device": host_to_device, "device_to_host": device_to_host,
             "upload": lambda: calls(lambda: bridge.upload(h, array))}  # fmt: skip
    counted = {name: min((path() for _ in range(3)), key=len) for name, path in paths.items()}
    assert bytes(bridge.download(h, np.uint8, 64)) == array.tobytes()
    assert {k: len(v) for k, v in counted.items() if len(v) > BUDGETS[k]} == {}, counted
    print({k: len(v) for k, v in counted.items()})
