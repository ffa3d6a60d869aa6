"""Several devices in one process: one reference worker per device, their passes interleaved."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from devbridge.apps.backends import make_backend
from devbridge.apps.tally import Delivery, Tally
from devbridge.apps.worker.drivers import check_demo, device_worker
from devbridge.apps.worker.pipeline import Worker, WorkerStalled
from devbridge.args import refuse
from devbridge.backends.base import Backend
from devbridge.bridge.trace import Trace
from devbridge.errors import short

#: How long one device's idle pass may block while other devices wait for their turn.
DEVICE_IDLE_S = 0.002


@dataclass
class DeviceRun:
    """One device's part of a multi-device run."""

    device: str
    objects: int  # its share (the objects k with k % devices == its index), or those it redid
    delivered: int
    seconds: float
    objects_per_s: float
    restarts: int
    faults_injected: int
    faults_recovered: int
    stalled: str  # why it gave up (WorkerStalled), or ""


@dataclass
class DevicesSummary(Delivery):
    seconds: float
    objects_per_s: float
    redone: int  # objects of a device that gave up, delivered by another one after it
    devices: list[DeviceRun]


def run_devices(
    objects: int,
    devices: Sequence[str],
    backend: str = "tinygrad",
    faults: float = 0.0,
    restart_every: int = 0,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    make: Callable[[str], Backend] | None = None,
    trace: str | None = None,
    batch: int = 1,
) -> DevicesSummary:
    """One Bridge per device in one process: object k goes to device k % len(devices), each
    device a worker with its own rings, restarts and injected faults, so one that restarts or
    fails does not stop the others. The workers' passes are interleaved in this thread
    (tinygrad is not thread-safe: its compile cache and device context are per thread); each
    producer fills its ring from a thread of its own, and copies run on each device's copy
    thread. A device that gives up for good (WorkerStalled) leaves its undelivered objects to
    the first device that did not: they are redone there once the others finish. Deliveries
    are tallied per object across devices. With `trace` (a path), every bridge writes its
    tracks into that one timeline (devbridge.bridge.trace). Each worker moves its objects `batch` at a
    time."""
    check_demo(objects, faults, restart_every, batch, seed, progress)
    named = list(devices) if isinstance(devices, list | tuple) else []
    if not named or any(type(d) is not str for d in named) or len(set(named)) != len(named):
        refuse(f"devices must be distinct names, got {short(devices)}")
    if make is not None and not callable(make):
        refuse(f"make must be callable, got {short(make)}")
    make = make or (lambda device: make_backend(backend, None if backend == "fake" else device))
    timeline = None if trace is None else Trace(trace)
    try:
        return _run_devices(objects, devices, faults, restart_every, seed, progress, make, timeline, batch)
    finally:
        if timeline is not None:
            timeline.close()


def _run_devices(
    objects: int,
    devices: Sequence[str],
    faults: float,
    restart_every: int,
    seed: int,
    progress: Callable[[int], None] | None,
    make: Callable[[str], Backend],
    timeline: Trace | None,
    batch: int,
) -> DevicesSummary:
    n = len(devices)
    shares = [range(d, objects, n) for d in range(n)]
    workers = [
        device_worker(make(dev), shares[d], faults, restart_every, seed, seed + d, timeline, batch)
        for d, dev in enumerate(devices)
    ]
    done = [0] * n
    stalled: dict[int, str] = {}
    seconds = [0.0] * n

    def report(d: int) -> Callable[[int], None]:
        def record(delivered: int) -> None:
            done[d] = delivered
            if progress is not None:
                progress(sum(done))

        return record

    start = time.perf_counter()
    running = list(range(n))
    try:
        for d, w in enumerate(workers):
            try:
                w.start()
            except WorkerStalled as e:  # it could not even upload its weights
                stalled[d] = str(e)
                running.remove(d)
        while running:
            for d in list(running):
                try:
                    more = workers[d].tick(report(d), DEVICE_IDLE_S)
                except WorkerStalled as e:
                    stalled[d], more = str(e), False
                if not more:
                    running.remove(d)
                    seconds[d] = time.perf_counter() - start
    finally:
        for w in workers:
            w.stop()
    for d, w in enumerate(workers):
        if d not in stalled:
            w.finish()
    tally = Tally()
    for w in workers:
        tally.add(w.tally)
    runs = [_device_run(devices[d], w, seconds[d], stalled.get(d, "")) for d, w in enumerate(workers)]
    leftovers = [k for d in sorted(stalled) for k in shares[d] if k not in tally]
    healthy = [d for d in range(n) if d not in stalled]
    if leftovers and healthy:
        again = device_worker(
            make(devices[healthy[0]]), leftovers, faults, restart_every, seed, seed + n, timeline, batch
        )
        began, why = time.perf_counter(), ""
        try:
            again.run()
        except WorkerStalled as e:
            why = str(e)
        tally.add(again.tally)
        runs.append(_device_run(f"{devices[healthy[0]]} (redoing)", again, time.perf_counter() - began, why))
    total = time.perf_counter() - start
    return DevicesSummary(
        **vars(tally.delivery(objects)),
        seconds=total,
        objects_per_s=len(tally) / total,
        redone=sum(1 for k in leftovers if k in tally),
        devices=runs,
    )


def _device_run(device: str, worker: Worker, seconds: float, stalled: str) -> DeviceRun:
    got = len(worker.tally)
    return DeviceRun(
        device, worker.objects, got, seconds, got / max(seconds, 1e-9), worker.restarts, worker.injected(),
        worker.failures_retried, stalled,
    )  # fmt: skip
