"""CPU time a caller spends waiting for an asynchronous copy (goal: <= 10% of the wait).

An asynchronous host_to_device of SIZE bytes on tinygrad's CPU device runs on the
backend's copy thread (about 10 ms here); the caller then waits for it with
`event.wait()`, `bridge.wait_any([event])` or `bridge.wait_all([event])`. The
waiting thread's own CPU time (`time.thread_time`) is compared with the wall
time of the wait: a spinning wait would burn close to 100%.

    python bench/wait_cpu.py [--size BYTES] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from devbridge import Bridge, CopyEvent, DeviceRange, HostRing, ObjectSpec
from devbridge.backends.tinygrad import TinygradBackend

WAYS: dict[str, Callable[[Bridge, CopyEvent], object]] = {
    "event.wait()": lambda bridge, ev: ev.wait(),
    "bridge.wait_any([ev])": lambda bridge, ev: bridge.wait_any([ev]),
    "bridge.wait_all([ev])": lambda bridge, ev: bridge.wait_all([ev]),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=192 << 20, help="bytes per copy (default 192 MiB)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    bridge = Bridge(TinygradBackend("CPU"))
    ring = HostRing(2 * args.size)
    h = bridge.alloc_device(ObjectSpec("blob", "uint8"), args.size)
    results: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way, wait in WAYS.items():  # interleaved: each round runs every way once
            src = ring.reserve(args.size)
            ring.view(src)[:1] = b"\1"
            ev = bridge.host_to_device(src, DeviceRange(h, 0, args.size), sync=False)
            wall, cpu = time.perf_counter(), time.thread_time()
            wait(bridge, ev)
            results[way].append((time.perf_counter() - wall, time.thread_time() - cpu))
            assert ev.done() and ev.error is None
    print(f"asynchronous host_to_device of {args.size} B on CPU, {args.rounds} rounds (medians)")
    print(f"{'wait':>24} {'wall ms':>9} {'caller CPU ms':>14} {'CPU/wall':>9}")
    for way, rows in results.items():
        wall = statistics.median(w for w, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        print(f"{way:>24} {wall * 1e3:9.2f} {cpu * 1e3:14.3f} {cpu / wall:9.3f}")


if __name__ == "__main__":
    main()
