"""The ring across processes, against the same work through an in-process ring.

- A record's way through a shared ring (reserve, write and commit in a producer *process*; take
  and release in this one) against the same through an in-process ring with a producer
  *thread*, records per second, at 64 B, 64 KiB and 1 MiB.
- Producers that spend CPU to make each object (small numpy operations, which hold the GIL):
  two producer processes feeding a shared ring against two producer threads feeding an
  in-process one.
- How soon a `take` waiting on an empty shared ring returns after a commit in another process
  (median and 99th percentile, one monotonic clock).

Producer processes are started (`spawn`) before the clock starts and wait for a go, once they
use no CPU beside their main thread: numpy's BLAS threads spin for a while after import
(OpenBLAS's thread timeout), and on a small machine that spin takes a core from the run timed.

Its rows are part of `devbridge bench` (`--only ring` for them alone).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from devbridge import HostRing

SPAWN = multiprocessing.get_context("spawn")
#: Records per run at each size (`quick`: a tenth).
COUNTS = {64: 20_000, 64 << 10: 4_000, 1 << 20: 400}
#: Objects per producer in the CPU-bound rows, and the numpy steps that make each.
WORK_OBJECTS, WORK_STEPS = 400, 200


def _name() -> str:
    return f"devbridge-bench-{os.getpid()}-{time.monotonic_ns()}"


def _capacity(nbytes: int) -> int:
    return min(max(64 * nbytes, 1 << 16), 16 << 20)


def make_object(seed: int) -> bytes:
    """An object that costs CPU to make: small numpy steps (each holds the GIL)."""
    import numpy as np

    a = np.full(64, float(seed))
    for _ in range(WORK_STEPS):
        a = np.sqrt(a * a + 1.0) - 0.5
    return a.tobytes()


def _produce(ring: HostRing, count: int, nbytes: int, work: bool, first: int = 0) -> None:
    payload = bytes(nbytes)
    for i in range(count):
        data = make_object(first + i) if work else payload
        r = ring.reserve(len(data), timeout=None)
        ring.write(r, data)
        ring.commit(r)


def settle() -> None:
    """Return once this process has used no CPU for a 20 ms nap (at most 1 s): its threads idle."""
    used = sum(os.times()[:2])
    for _ in range(50):
        time.sleep(0.02)
        now = sum(os.times()[:2])
        if now - used < 0.005:  # (less than one clock tick)
            return
        used = now


def _producer_process(name: str, count: int, nbytes: int, work: bool, first: int, ready: Any, go: Any) -> None:
    ring = HostRing.attach(name)
    make_object(0)  # numpy imported and warm before the clock starts
    settle()
    ready.set()
    go.wait()
    _produce(ring, count, nbytes, work, first)
    ring.close()


def _drain(ring: HostRing, count: int) -> None:
    for _ in range(count):
        ring.release(ring.take(timeout=60))


def across_processes(nbytes: int, count: int, producers: int = 1, work: bool = False) -> float:
    """Records per second through a shared ring fed by `producers` producer processes."""
    name = _name()
    ring = HostRing.create(name, _capacity(nbytes if not work else 512))
    try:
        ring.consume()
        go = SPAWN.Event()
        ready = [SPAWN.Event() for _ in range(producers)]
        each = count // producers
        procs = [
            SPAWN.Process(target=_producer_process, args=(name, each, nbytes, work, k * each, ready[k], go))
            for k in range(producers)
        ]
        for p in procs:
            p.start()
        for event in ready:
            event.wait(60)
        start = time.perf_counter()
        go.set()
        _drain(ring, each * producers)
        seconds = time.perf_counter() - start
        for p in procs:
            p.join(60)
        return each * producers / seconds
    finally:
        ring.unlink()
        ring.close()


def in_process(nbytes: int, count: int, producers: int = 1, work: bool = False) -> float:
    """Records per second through an in-process ring fed by `producers` producer threads."""
    make_object(0)
    ring = HostRing(_capacity(nbytes if not work else 512))
    ring.consume()
    each = count // producers
    threads = [threading.Thread(target=_produce, args=(ring, each, nbytes, work, k * each)) for k in range(producers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    _drain(ring, each * producers)
    seconds = time.perf_counter() - start
    for t in threads:
        t.join()
    return each * producers / seconds


def _stamper(name: str, rounds: int, gap_s: float, go: Any) -> None:
    ring = HostRing.attach(name)
    settle()
    go.wait()
    for _ in range(rounds):
        time.sleep(gap_s)
        r = ring.reserve(8, timeout=None)
        ring.write(r, struct.pack("<d", time.perf_counter()))
        ring.commit(r)
    ring.close()


def wake_up(rounds: int, gap_s: float = 0.002) -> list[float]:
    """Seconds from a commit in another process to the return of the `take` waiting for it."""
    name = _name()
    ring = HostRing.create(name, 1 << 12)
    try:
        ring.consume()
        go = SPAWN.Event()
        proc = SPAWN.Process(target=_stamper, args=(name, rounds, gap_s, go))
        proc.start()
        go.set()
        waits = []
        for _ in range(rounds):
            r = ring.take(timeout=60)
            woke = time.perf_counter()
            waits.append(woke - struct.unpack("<d", bytes(ring.view(r)))[0])
            ring.release(r)
        proc.join(60)
        return sorted(waits)
    finally:
        ring.unlink()
        ring.close()


def rows(
    rounds: int,
    quick: bool,
    side_by_side: Callable[..., Any],
    row: Callable[..., Any],
    label: Callable[[int], str],
) -> list[Any]:
    """The suite's rows, made by its `side_by_side` and `row`: throughput ratios, then the wake-up."""
    out = []
    for nbytes, goal in ((64, ">= 0.5"), (64 << 10, ">= 0.9"), (1 << 20, ">= 0.95")):
        count = COUNTS[nbytes] // (10 if quick else 1)
        path = f"a record through a shared ring (producer process) {label(nbytes)} / in-process ring (thread)"
        out.append(
            side_by_side(
                path,
                lambda n=nbytes, c=count: across_processes(n, c),
                lambda n=nbytes, c=count: in_process(n, c),
                rounds,
                "rec/s",
                goal,
                1.0,
                f"shared ring {label(nbytes)}",
            )
        )
    objects = 2 * WORK_OBJECTS // (10 if quick else 1)
    out.append(
        side_by_side(
            "two producer processes making objects with numpy / two producer threads",
            lambda: across_processes(512, objects, producers=2, work=True),
            lambda: in_process(512, objects, producers=2, work=True),
            rounds,
            "obj/s",
            ">= 1.5",
            1.0,
            "producer processes / threads",
        )
    )
    waits = wake_up(50 if quick else 400)
    median, p99 = statistics.median(waits) * 1e6, waits[int(0.99 * (len(waits) - 1))] * 1e6
    out.append(row("take's wake-up after a commit in another process, median / 100 µs", median, 100.0, "µs", "<= 1.0"))
    out.append(row("  the same, 99th percentile / 100 µs", p99, 100.0, "µs", ""))
    return out
