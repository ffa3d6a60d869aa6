"""A soak: alloc / async copy in / complete / free, cycle after cycle, through the Bridge.

Memory and time are read every `--every` cycles: memory as the bytes tracemalloc sees allocated
(all of Python's but the soak's own, or only the lines of devbridge's own files with `--own`), time per cycle. A
backend that keeps what is over (freed buffers, settled events, every call) grows with each
cycle and slows as it sums them; the fake keeps a running count and forgets what is over, so
both stay flat. DESIGN's goal for the fake: after warm-up, at most 1 KiB of growth per 10k
cycles, and the last 10k cycles at most 1.2x the time of the first. A benchmark, not a test.

    python bench/soak.py [--cycles 100000] [--every 10000] [--backend fake|tinygrad] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from dataclasses import asdict, dataclass

from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec
from devbridge.backends.base import Backend
from devbridge.testing import FakeBackend

SPEC = ObjectSpec("x", "uint8")
#: The runtime's files, in a checkout (spec/, ...) or installed (devbridge/spec/, ...); not bench/.
OWN = [f"*/{folder}/*" for folder in ("devbridge", "api", "bridge", "ring", "backends", "statemachine", "spec")]


@dataclass(frozen=True)
class Reading:
    cycles: int  # cycles run so far
    traced_bytes: int  # allocated bytes tracemalloc sees now (devbridge's own lines with own=True)
    seconds: float  # for the cycles since the last reading


def soak(backend: Backend, cycles: int, every: int, nbytes: int = 1024, own: bool = False) -> list[Reading]:
    """`cycles` alloc / copy / complete / free cycles of `nbytes` on a Bridge over `backend`; a
    Reading every `every` cycles (the first after `every`: the warm-up is cycle 0 to `every`)."""
    bridge = Bridge(backend)
    ring = HostRing(4 * nbytes)
    fake = backend if isinstance(backend, FakeBackend) else None
    # the soak's own bookkeeping (its readings, tracemalloc's snapshots) is not the backend's
    filters: list[tracemalloc.Filter] = [
        tracemalloc.Filter(False, __file__),
        tracemalloc.Filter(False, tracemalloc.__file__),
    ]
    if own:
        filters += [tracemalloc.Filter(True, folder) for folder in OWN]
    readings: list[Reading] = []
    tracemalloc.start()
    try:
        start = time.perf_counter()
        for n in range(1, cycles + 1):
            h = bridge.alloc_device(SPEC, nbytes)
            src = ring.reserve(nbytes)
            event = bridge.host_to_device(src, DeviceRange(h, 0, nbytes), sync=False)
            if fake is not None:
                fake.complete(event)
            event.wait(10)
            bridge.free_device(h)
            if n % every == 0:
                seconds = time.perf_counter() - start
                gc.collect()
                snapshot = tracemalloc.take_snapshot().filter_traces(filters) if own else None
                traced = (
                    sum(s.size for s in snapshot.statistics("filename"))
                    if snapshot
                    else tracemalloc.get_traced_memory()[0]
                )
                readings.append(Reading(n, traced, seconds))
                start = time.perf_counter()
    finally:
        tracemalloc.stop()
    return readings


def growth(readings: list[Reading]) -> tuple[float, float]:
    """(bytes of growth per 10k cycles after the first reading, time of the last interval over
    the first's): the soak's two figures."""
    first, last = readings[0], readings[-1]
    per_10k = (last.traced_bytes - first.traced_bytes) / max(1, last.cycles - first.cycles) * 10_000
    return per_10k, last.seconds / first.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000)
    parser.add_argument("--backend", choices=["fake", "tinygrad"], default="fake")
    parser.add_argument("--own", action="store_true", help="count only devbridge's own lines")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.backend == "fake":
        backend: Backend = FakeBackend(calls_kept=1000)
    else:
        from devbridge.backends.tinygrad import TinygradBackend

        backend = TinygradBackend("CPU")
    readings = soak(backend, args.cycles, args.every, own=args.own)
    per_10k, slowdown = growth(readings)
    if args.json:
        print(json.dumps({"readings": [asdict(r) for r in readings], "growth_per_10k": per_10k, "slowdown": slowdown}))
        return
    print(f"{args.backend}: {args.cycles} cycles of alloc / async copy in (1 KiB) / complete / free")
    print(f"{'cycles':>8} {'traced KiB':>11} {'s per 10k':>10}")
    for r in readings:
        print(f"{r.cycles:>8} {r.traced_bytes / 1024:>11.1f} {r.seconds / (args.every / 10_000):>10.3f}")
    print(f"growth after warm-up: {per_10k:.0f} B per 10k cycles; last interval / first: {slowdown:.2f}x")


if __name__ == "__main__":
    main()
