"""Running the reference worker: `devbridge demo` on one device, with injected faults and restarts."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from devbridge.apps.backends import make_backend
from devbridge.apps.worker.pipeline import Summary, Worker
from devbridge.args import count, probability, refuse
from devbridge.backends.base import Backend
from devbridge.bridge.trace import Trace
from devbridge.errors import short
from devbridge.testing import FakeBackend, FaultyBackend, fake_pump

#: What `--faults` fails at random: allocations, copies, frees and event queries.
RANDOM_FAULTS = ("alloc", "copy_in", "copy_out", "free", "query")


#: The most objects a run makes, and objects a batch holds (far past any run's; a larger
#: number overflows a C size on the way).
MAX_OBJECTS, MAX_BATCH = 1 << 40, 1 << 16


def check_demo(
    objects: object, faults: object, restart_every: object, batch: object = 1, seed: object = 0, progress: object = None
) -> None:
    """The demo's options, checked before anything starts (ARG-1): a bad one would spin forever."""
    count("objects", objects, least=1, most=MAX_OBJECTS)
    probability("faults", faults)
    count("restart_every", restart_every, note=" (0: never)")
    count("batch", batch, least=1, most=MAX_BATCH)
    count("seed", seed)
    if progress is not None and not callable(progress):
        refuse(f"progress must be callable, got {short(progress)}")


def check_run(backend: object, devices: object) -> list[str | None]:
    """The backend and devices of a run across processes or actors (ARG-1), checked before
    anything starts; the devices as a list."""
    if backend not in ("fake", "tinygrad"):
        refuse(f"backend must be 'fake' or 'tinygrad', got {short(backend)}")
    named = list(devices) if isinstance(devices, list | tuple) else []
    if not named or not all(d is None or (type(d) is str and d) for d in named):
        refuse(f"devices must be a non-empty list of device names (None: tinygrad's default), got {short(devices)}")
    if backend == "fake" and any(d is not None for d in named):
        refuse(f"the fake backend has no devices: each must be None, got {short(devices)}")
    return named


def backend_name(backend: Backend) -> str:
    """`fake`, or `tinygrad:<device>`."""
    device = getattr(backend, "device", None)
    return backend.name if device is None else f"{backend.name}:{device}"


def run_demo(
    objects: int = 1500,
    backend: str | Backend = "tinygrad",
    device: str | None = None,
    faults: float = 0.0,
    restart_every: int = 0,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    trace: str | None = None,
    pins_report: bool = False,
    batch: int = 1,
    check_host_bytes: bool | None = None,
    late_writes: float = 0.0,
) -> Summary:
    """The reference worker over `objects` synthetic objects on `backend` (a name for
    make_backend, or an opened Backend), its timeline written to `trace` (a path) if given;
    with `pins_report`, the summary's `pinned` names each allocation still held at the end and
    what holds it; objects go `batch` at a time (one upload, compute and download for all);
    `check_host_bytes`: the bridge's checking mode (None: the environment's say); `late_writes`:
    the share of uploads whose input is written into under them, on purpose (Worker).
    Raises WorkerStalled if the backend fails for good."""
    check_demo(objects, faults, restart_every, batch, seed, progress)
    timeline = None if trace is None else Trace(trace)
    try:
        inner = make_backend(backend, device) if isinstance(backend, str) else backend
        late = probability("late_writes", late_writes)
        worker = device_worker(
            inner, range(objects), faults, restart_every, seed, seed, timeline, batch, check_host_bytes, late
        )
        start = time.perf_counter()
        worker.run(progress)
        summary = worker.summary(time.perf_counter() - start, backend_name(inner))
        if pins_report:
            summary.pinned = worker.pins_report()
        return summary
    finally:
        if timeline is not None:
            timeline.close()


def device_worker(
    inner: Backend,
    ks: Sequence[int],
    faults: float,
    restart_every: int,
    seed: int,
    fault_seed: int,
    trace: Trace | None = None,
    batch: int = 1,
    check_host_bytes: bool | None = None,
    late_writes: float = 0.0,
) -> Worker:
    """A worker for objects `ks` on one device, `batch` at a time: its fake's pump, its injected
    faults, its tracks in `trace`."""
    pump = fake_pump(inner, fault_seed) if isinstance(inner, FakeBackend) else None
    if late_writes and isinstance(inner, FakeBackend):
        inner.checks_late_reads = False  # the late writes are the demo's own, on purpose
    if not faults:
        return Worker(
            inner, len(ks), seed=seed, restart_every=restart_every, pump=pump, ks=ks, trace=trace, batch=batch,
            check_host_bytes=check_host_bytes, late_writes=late_writes,
        )  # fmt: skip
    faulty = FaultyBackend(inner, rate=faults, seed=fault_seed, random_ops=RANDOM_FAULTS)
    return Worker(
        faulty, len(ks), seed=seed, restart_every=restart_every, pump=pump, ks=ks,
        injected=lambda: sum(faulty.injected.values()), trace=trace, batch=batch,
        check_host_bytes=check_host_bytes, late_writes=late_writes,
    )  # fmt: skip
