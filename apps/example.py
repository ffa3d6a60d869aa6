"""Runnable round trips of the bridge, the shortest code that uses it right
(`devbridge example`; the reference worker, `devbridge demo`, is the full job).

Each object goes host ring -> device (async) -> tinygrad `y = 2x + 1` on
zero-copy views -> host ring (async) -> checked against numpy. On the fake
backend events complete only when told, so this loop plays the device's part
too; on tinygrad (CPU here) it waits for the real device.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from devbridge.apps.backends import make_backend
from devbridge.args import count
from devbridge.backends.base import Backend
from devbridge.bridge.bridge import Bridge
from devbridge.bridge.events import Event
from devbridge.ring.host import HostRing
from devbridge.testing import FakeBackend
from devbridge.types import DeviceHandle, DeviceRange, ObjectSpec, TensorViewSpec


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
    objects: int = 16,
    floats: int = 1024,
    seed: int = 0,
    backend: str | Backend = "fake",
    device: str | None = None,
    trace: str | None = None,
) -> ExampleReport:
    """`objects` round trips of `floats` float32 values each on `backend` (a name for
    make_backend, or an opened Backend); its timeline written to `trace` (a path), if given."""
    for name, value in (("objects", objects), ("floats", floats)):
        count(name, value, least=1, most=1 << 30)
    count("seed", seed)
    dev = make_backend(backend, device) if isinstance(backend, str) else backend
    bridge = Bridge(dev, trace=trace)
    try:
        return _round_trips(bridge, dev, objects, floats, seed)
    finally:
        bridge.close_trace()


def _round_trips(bridge: Bridge, dev: Backend, objects: int, floats: int, seed: int) -> ExampleReport:
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
        bridge.free_device(y)  # deferred while the download reads y (a small one may be done already)
        settle(dev, download)

        result = np.frombuffer(outputs.view(out), dtype=np.float32)
        verified += bool(np.array_equal(result, data * 2 + 1))
        outputs.release(out)
    stats = bridge.stats()
    calls = {
        "allocs": stats.allocs,
        "backend_frees": stats.backend_frees,
        "copies_in": stats.copies_in,
        "copies_out": stats.copies_out,
        "computes": stats.computes,
        "views": stats.views,
    }
    return ExampleReport(
        objects=objects,
        verified=verified,
        lost=objects - verified,
        bytes_in=stats.bytes_in,
        bytes_out=stats.bytes_out,
        deferred_frees=stats.deferred_frees,
        calls=calls,
        live_allocations=stats.live_allocations,
        unreleased_host_bytes=(inputs.head - inputs.cursor) + (outputs.head - outputs.cursor),
        seconds=time.perf_counter() - start,
    )


@dataclass
class JitReport:
    steps: int
    verified: int
    restarts: int
    live_allocations: int  # at the end, after the weights are freed: 0
    captured_state: str  # what the bridge says of an allocation a JIT captured by closure, after its free
    captured_views: int  # pins(handle).views for it
    captured_released: bool  # released once the JIT is gone


def run_jit_example(
    steps: int = 6,
    restart_at: int = 3,
    backend: str | Backend = "tinygrad",
    device: str | None = None,
    seed: int = 0,
) -> JitReport:
    """TinyJit done right: every view the jitted step touches is passed as an argument, so the
    JIT swaps them per call; weights are uploaded through the bridge (again after a restart) and
    passed as arguments too; the output is written into a view argument and read back with
    device_to_host. Then the wrong way, a JIT capturing a view in a closure, and what the
    bridge reports about it (PIN-1)."""
    from tinygrad.engine.jit import TinyJit
    from tinygrad.tensor import Tensor

    count("steps", steps, least=1, most=1 << 20)
    count("restart_at", restart_at)
    count("seed", seed)
    dev = make_backend(backend, device) if isinstance(backend, str) else backend
    bridge, ring = Bridge(dev, pending_warning_s=0.0), HostRing(1 << 16)
    rows, d_in, d_out = 4, 8, 8
    x_view, y_view = TensorViewSpec((rows, d_in), "float32"), TensorViewSpec((rows, d_out), "float32")
    w_view = TensorViewSpec((d_in, d_out), "float32")
    rng = np.random.default_rng(seed)
    w_np = rng.standard_normal((d_in, d_out), dtype=np.float32)

    def finish(event: Event) -> None:
        if isinstance(dev, FakeBackend) and not event.done():
            dev.complete(event)
        event.wait(timeout=60)

    def upload(handle: DeviceHandle, data: np.ndarray[Any, Any]) -> None:
        src = ring.reserve(data.nbytes)
        ring.view(src)[:] = data.tobytes()
        bridge.host_to_device(src, DeviceRange(handle, 0, data.nbytes))  # sync: released on return

    def weights() -> tuple[DeviceHandle, Any]:
        w = bridge.alloc_device(ObjectSpec("w", "float32", role="weights"), w_np.nbytes)
        upload(w, w_np)
        return w, bridge.wrap_for_tinygrad(w, w_view)

    @TinyJit
    def step(x: Tensor, w: Tensor, y: Tensor) -> None:
        y.assign((x @ w).relu()).realize()

    w, wv = weights()
    verified = restarts = 0
    for k in range(steps):
        if k == restart_at:
            del wv  # old views pin old memory: drop them, restart, upload the weights again
            bridge.restart()
            restarts += 1
            w, wv = weights()
        x_np = rng.standard_normal((rows, d_in), dtype=np.float32)
        x = bridge.alloc_device(ObjectSpec("x", "float32", role="input"), x_np.nbytes)
        y = bridge.alloc_device(ObjectSpec("y", "float32", role="output"), rows * d_out * 4)
        upload(x, x_np)
        with bridge.compute(x, y, w) as event:
            xv, yv = bridge.wrap_for_tinygrad(x, x_view), bridge.wrap_for_tinygrad(y, y_view)
            step(xv, wv, yv)
            del xv, yv
        finish(event)
        out = ring.reserve(rows * d_out * 4)
        finish(bridge.device_to_host(DeviceRange(y, 0, out.nbytes), out, sync=False))
        got = np.frombuffer(ring.view(out), dtype=np.float32).reshape(rows, d_out)
        verified += bool(np.allclose(got, np.maximum(x_np @ w_np, 0), rtol=1e-5, atol=1e-5))
        ring.release(out)
        bridge.free_device(x)
        bridge.free_device(y)

    # The wrong way: a view the jitted function reads from a model attribute, not an argument.
    # The JIT's captured kernels keep the memory after the model lets go of it.
    model = {"w": wv}
    del wv

    @TinyJit
    def scaled(x: Tensor) -> Any:
        return (x @ model["w"]).realize()

    for _ in range(3):
        scaled(Tensor.ones(rows, d_in, device=model["w"].device).contiguous().realize())  # the view's device
    model.clear()
    bridge.free_device(w)  # deferred: the JIT can still read w
    bridge.poll()  # logs a warning naming "w" (pending_warning_s=0 here)
    pins = bridge.pins(w)
    del scaled, step
    gc.collect()
    bridge.poll()
    return JitReport(
        steps=steps,
        verified=verified,
        restarts=restarts,
        live_allocations=bridge.stats().live_allocations,
        captured_state=pins.state,
        captured_views=pins.views,
        captured_released=bridge.state(w) == "freed",
    )
