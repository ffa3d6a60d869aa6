"""What a call costs while the device is busy: the bridge on a real queue (CL by default).

Each round queues about `--busy` seconds of tinygrad matmuls on the device
without waiting, then times one bridge call: an asynchronous
`host_to_device` of 64 KiB, the `done()` that follows it, a `with
bridge.compute(h)` block, `free_device` of an allocation with a copy in
flight, `restart()` with a copy in flight, and for contrast a synchronous
`host_to_device` (which must wait for the queue ahead of its command on an
in-order queue) and the time until the queued work drained. Medians over
`--rounds`. With `--before REV`, that revision's bridge (built as
`devbridge_old`, scripts/revisions.py) runs beside this one in the same
process, rounds interleaved (now, before, before, now, ...). A benchmark,
not a test.

    python bench/queue_latency.py [--device CL] [--busy 1.0] [--rounds 5] [--before REV] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import astuple
from pathlib import Path

from devbridge.backends import tinygrad_compat as tg
from devbridge.bench.order_overhead import Version, current, import_old
from devbridge.checkout import script

NBYTES = 64 << 10


class Load:
    """About `seconds` of matmuls, queued without waiting (calibrated on the device first)."""

    def __init__(self, device: str, seconds: float) -> None:
        from tinygrad.tensor import Tensor

        self.device = device
        self.a = Tensor.rand(512, 512, device=device).realize()
        self.count = 3
        self.queue()  # compiled now
        tg.synchronize(device)
        start = time.perf_counter()
        self.queue()
        tg.synchronize(device)
        self.count = max(1, round(seconds / ((time.perf_counter() - start) / 3)))

    def queue(self) -> None:
        x = self.a
        for _ in range(self.count):
            x = (x @ self.a * 1e-3).realize()


class Clock:
    """Wall time per version and named step, over rounds."""

    def __init__(self) -> None:
        self.times: dict[str, dict[str, list[float]]] = {}

    def record(self, label: str, name: str, value: float) -> None:
        self.times.setdefault(label, {}).setdefault(name, []).append(value)

    @contextlib.contextmanager
    def __call__(self, label: str, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.record(label, name, time.perf_counter() - start)


def one_round(v: Version, load: Load, clock: Clock) -> None:
    """One round on a fresh bridge of version `v`: every call timed with the work queued ahead."""
    device = load.device
    bridge, ring = v.bridge(v.backend(device)), v.ring(1 << 22)
    u8 = v.object_spec("bench", "uint8")
    x, y, z = (bridge.alloc_device(u8, NBYTES) for _ in range(3))
    src, src2, src3 = (ring.reserve(NBYTES) for _ in range(3))
    start = time.perf_counter()
    with clock(v.label, "queue the work"):
        load.queue()
    with clock(v.label, "async host_to_device"):
        upload = bridge.host_to_device(src, v.device_range(x, 0, NBYTES), sync=False)
    with clock(v.label, "done() while pending"):
        upload.done()
    with clock(v.label, "with compute() block"), bridge.compute(y) as comp:
        pass
    with clock(v.label, "free_device (copy in flight)"):
        bridge.free_device(x)
    late = bridge.host_to_device(src2, v.device_range(z, 0, NBYTES), sync=False, release=False)
    with clock(v.label, "restart (copy in flight)"):
        bridge.restart()
    events = [upload, comp, late]
    clock.record(v.label, "pending after the calls", sum(not e.done() for e in events))
    tg.synchronize(device)
    clock.record(v.label, "drain the queue", time.perf_counter() - start)
    bridge.wait_all(events, timeout=60)  # the aborted copy's failure stays with its event
    bridge.poll()
    w = bridge.alloc_device(u8, NBYTES)
    load.queue()
    with clock(v.label, "sync host_to_device (queue ahead)"):
        bridge.host_to_device(src3, v.device_range(w, 0, NBYTES))
    tg.synchronize(device)


def measure(device: str, busy: float, rounds: int, before: str | None) -> dict[str, object]:
    load = Load(device, busy)
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="devbridge_old_") as tmp:
        versions = [current()]
        if before is not None:
            old = import_old(script("revisions").build_old(before, Path(tmp))[0])
            versions.append(Version("before", *astuple(old)[1:]))
        versions[0] = Version("now", *astuple(versions[0])[1:])
        for k in range(rounds):
            for v in versions if k % 2 == 0 else versions[::-1]:
                one_round(v, load, clock)
    return {
        "device": device,
        "busy_s": busy,
        "rounds": rounds,
        "before": None if before is None else script("revisions").short_rev(before),
        "median_s": {
            label: {step: statistics.median(values) for step, values in steps.items()}
            for label, steps in clock.times.items()
        },
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="CL")
    parser.add_argument("--busy", type=float, default=1.0, help="seconds of work queued ahead (approximate)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", default=None, help="a git revision to measure beside this one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(tg.open_device(args.device), args.busy, args.rounds, args.before)
    if args.json:
        print(json.dumps(result))
        return
    medians = result["median_s"]
    assert isinstance(medians, dict)
    labels = list(medians)
    if result["before"] is not None:
        print(f"before: {result['before']} (built as devbridge_old); now: this tree")
    print(
        f"{result['device']}: matmuls queued ahead (calibrated to about {args.busy} s; the 'drain the queue' row "
        f"says how long they really ran), medians of {args.rounds} rounds"
    )
    print(f"  {'':<36}" + "".join(f"{label:>14}" for label in labels))
    for step in medians[labels[0]]:
        cells = [medians[label][step] for label in labels]
        shown = [f"{c:.0f} of 3" if step.startswith("pending") else f"{c * 1e3:.3f} ms" for c in cells]
        print(f"  {step:<36}" + "".join(f"{c:>14}" for c in shown))


if __name__ == "__main__":
    main()
