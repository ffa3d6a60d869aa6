"""What a call costs while the device is busy: the bridge on a real queue (CL by default).

Each round queues about `--busy` seconds of tinygrad matmuls on the device
without waiting, then times one bridge call: an asynchronous
`host_to_device` of 64 KiB, the `done()` that follows it, a `with
bridge.compute(h)` block, `free_device` of an allocation with a copy in
flight, `restart()` with a copy in flight, and for contrast a synchronous
`host_to_device` (which must wait for the queue ahead of its command on an
in-order queue) and the time until the queued work drained. Medians over
`--rounds`. A benchmark, not a test.

    python bench/queue_latency.py [--device CL] [--busy 1.0] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Iterator

from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec
from devbridge.backends import tinygrad_compat as tg
from devbridge.backends.tinygrad import TinygradBackend

NBYTES = 64 << 10
U8 = ObjectSpec("bench", "uint8")


class Load:
    """About `seconds` of matmuls, queued without waiting (calibrated on the device first)."""

    def __init__(self, device: str, seconds: float) -> None:
        from tinygrad.tensor import Tensor

        self.device = device
        self.a = Tensor.rand(512, 512, device=device).realize()
        (self.a @ self.a).realize()
        tg.synchronize(device)
        start = time.perf_counter()
        for _ in range(3):
            (self.a @ self.a).realize()
        tg.synchronize(device)
        self.count = max(1, round(seconds / ((time.perf_counter() - start) / 3)))

    def queue(self) -> None:
        x = self.a
        for _ in range(self.count):
            x = (x @ self.a * 1e-3).realize()


class Clock:
    """Wall time per named step, over rounds."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.times.setdefault(name, []).append(time.perf_counter() - start)


def one_round(bridge: Bridge, ring: HostRing, load: Load, clock: Clock) -> None:
    device = load.device
    x, y, z = (bridge.alloc_device(U8, NBYTES) for _ in range(3))
    src, src2, src3 = (ring.reserve(NBYTES) for _ in range(3))
    start = time.perf_counter()
    with clock("queue the work"):
        load.queue()
    with clock("async host_to_device"):
        upload = bridge.host_to_device(src, DeviceRange(x, 0, NBYTES), sync=False)
    with clock("done() while pending"):
        upload.done()
    with clock("with compute() block"), bridge.compute(y) as comp:
        pass
    with clock("free_device (copy in flight)"):
        bridge.free_device(x)
    late = bridge.host_to_device(src2, DeviceRange(z, 0, NBYTES), sync=False, release=False)
    with clock("restart (copy in flight)"):
        bridge.restart()
    events = [upload, comp, late]
    clock.times.setdefault("pending after the calls", []).append(sum(not e.done() for e in events))
    tg.synchronize(device)
    clock.times.setdefault("drain the queue", []).append(time.perf_counter() - start)
    bridge.wait_all(events, timeout=60)  # the aborted copy's failure stays with its event
    bridge.poll()
    ring.release(src2)
    w = bridge.alloc_device(U8, NBYTES)
    load.queue()
    with clock("sync host_to_device (queue ahead)"):
        bridge.host_to_device(src3, DeviceRange(w, 0, NBYTES))
    tg.synchronize(device)
    bridge.free_device(w)


def measure(device: str, busy: float, rounds: int) -> dict[str, object]:
    load = Load(device, busy)
    bridge = Bridge(TinygradBackend(device))
    ring = HostRing(1 << 22)
    clock = Clock()
    for _ in range(rounds):
        one_round(bridge, ring, load, clock)
    return {
        "device": device,
        "busy_s": busy,
        "rounds": rounds,
        "median_s": {name: statistics.median(values) for name, values in clock.times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="CL")
    parser.add_argument("--busy", type=float, default=1.0, help="seconds of work queued ahead (approximate)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(tg.open_device(args.device), args.busy, args.rounds)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['device']}: about {args.busy} s of work queued ahead, medians of {args.rounds} rounds")
    medians = result["median_s"]
    assert isinstance(medians, dict)
    for name, seconds in medians.items():
        shown = f"{seconds:.0f}" if name.startswith("pending") else f"{seconds * 1e3:10.3f} ms"
        print(f"  {name:<36} {shown}")


if __name__ == "__main__":
    main()
