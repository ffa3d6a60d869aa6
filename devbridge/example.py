"""A runnable round trip of the bridge on the fake backend: the README's main job
until the reference worker exists.

Each object goes host ring -> device (async) -> tinygrad `y = 2x + 1` on
zero-copy views -> host ring (async) -> checked against numpy. The fake backend
completes events only when told, so this loop plays the device's part too.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import numpy as np

from devbridge.backends.fake import FakeBackend
from devbridge.bridge import Bridge
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
    backend_calls: dict[str, int]
    live_allocations: int
    unreleased_host_bytes: int  # counted from both rings at the end: 0 means nothing is stuck
    seconds: float


def run_example(objects: int = 16, floats: int = 1024, seed: int = 0) -> ExampleReport:
    fake = FakeBackend()
    bridge = Bridge(fake)
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
        fake.complete(upload)  # the device finishes the copy: the input bytes are released now
        assert inputs.released(src)

        with bridge.compute(x, y) as step:
            xv, yv = bridge.wrap_for_tinygrad(x, view), bridge.wrap_for_tinygrad(y, view)
            yv.assign(xv * 2 + 1).realize()
            del xv, yv  # views pin their allocations while they live
        gc.collect()
        fake.complete(step)

        out = outputs.reserve(nbytes)
        download = bridge.device_to_host(DeviceRange(y, 0, nbytes), out, sync=False)
        bridge.free_device(x)
        bridge.free_device(y)  # deferred: the download still reads y
        fake.complete(download)

        result = np.frombuffer(outputs.view(out), dtype=np.float32)
        verified += bool(np.array_equal(result, data * 2 + 1))
        outputs.release(out)
    stats = bridge.stats()
    calls: dict[str, int] = {}
    for op in fake.ops():
        calls[op] = calls.get(op, 0) + 1
    return ExampleReport(
        objects=objects,
        verified=verified,
        lost=objects - verified,
        bytes_in=stats["bytes_in"],
        bytes_out=stats["bytes_out"],
        deferred_frees=stats["deferred_frees"],
        backend_calls=calls,
        live_allocations=fake.live_allocations,
        unreleased_host_bytes=(inputs.head - inputs.cursor) + (outputs.head - outputs.cursor),
        seconds=time.perf_counter() - start,
    )
