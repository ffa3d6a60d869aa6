"""A runnable round trip of the bridge: the README's main job until the
reference worker exists.

Each object goes host ring -> device (async) -> tinygrad `y = 2x + 1` on
zero-copy views -> host ring (async) -> checked against numpy. On the fake
backend events complete only when told, so this loop plays the device's part
too; on tinygrad (CPU here) it waits for the real device.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import numpy as np

from devbridge.backends import make_backend
from devbridge.backends.base import Backend
from devbridge.backends.fake import FakeBackend
from devbridge.bridge import Bridge
from devbridge.events import Event
from devbridge.ring import HostRing
from devbridge.types import DeviceRange, ObjectSpec, TensorViewSpec


@dataclass
class ExampleReport:
    objects: int
    verified: int
    lost: int
    bytes_in: int
    bytes_out: int
    deferred_frees: int
    calls: dict[str, int]
    live_allocations: int
    unreleased_host_bytes: int  # counted from both rings at the end: 0 means nothing is stuck
    seconds: float


def settle(backend: Backend, event: Event) -> None:
    """Let the device finish `event`: the fake is told to, a real device is waited on."""
    if isinstance(backend, FakeBackend):
        backend.complete(event)
    event.wait(timeout=60)


def run_example(
    objects: int = 16, floats: int = 1024, seed: int = 0, backend: str = "fake", device: str | None = None
) -> ExampleReport:
    dev = make_backend(backend, device)
    bridge = Bridge(dev)
    nbytes = floats * 4
    inputs, outputs = HostRing(4 * nbytes), HostRing(4 * nbytes)
    view = TensorViewSpec((floats,), "float32")
    x_spec = ObjectSpec("x", "float32", role="input", view=view)
    y_spec = ObjectSpec("y", "float32", role="output", view=view)
    rng = np.random.default_rng(seed)
    verified = 0
    start = time.perf_counter()
    for _ in range(objects):
        data = rng.standard_normal(floats, dtype=np.float32)
        src = inputs.reserve(nbytes)
        inputs.view(src)[:] = data.tobytes()  # the producer fills the input ring

        x, y = bridge.alloc_device(x_spec, nbytes), bridge.alloc_device(y_spec, nbytes)
        upload = bridge.host_to_device(src, DeviceRange(x, 0, nbytes), sync=False)
        settle(dev, upload)  # the device finished the copy: the input bytes are released now
        assert inputs.released(src)

        with bridge.compute(x, y) as step:
            xv, yv = bridge.wrap_for_tinygrad(x, view), bridge.wrap_for_tinygrad(y, view)
            yv.assign(xv * 2 + 1).realize()
            del xv, yv  # views pin their allocations while they live
        gc.collect()
        settle(dev, step)

        out = outputs.reserve(nbytes)
        download = bridge.device_to_host(DeviceRange(y, 0, nbytes), out, sync=False)
        bridge.free_device(x)
        bridge.free_device(y)  # deferred: the download still reads y
        settle(dev, download)

        result = np.frombuffer(outputs.view(out), dtype=np.float32)
        verified += bool(np.array_equal(result, data * 2 + 1))
        outputs.release(out)
    stats = bridge.stats()
    calls = {
        "allocs": stats["allocs"],
        "backend_frees": stats["backend_frees"],
        "copies_in": stats["copies_in"],
        "copies_out": stats["copies_out"],
        "computes": stats["computes"],
        "views": stats["views"],
    }
    return ExampleReport(
        objects=objects,
        verified=verified,
        lost=objects - verified,
        bytes_in=stats["bytes_in"],
        bytes_out=stats["bytes_out"],
        deferred_frees=stats["deferred_frees"],
        calls=calls,
        live_allocations=stats["live_allocations"],
        unreleased_host_bytes=(inputs.head - inputs.cursor) + (outputs.head - outputs.cursor),
        seconds=time.perf_counter() - start,
    )
