"""How much of the upload time the worker hides behind compute, on a device with its own queue.

Objects large enough that copies matter (default: 4096x64 float32 inputs, 1 MiB; 512 KiB
outputs), the same MLP as the demo. Four runs of the same objects, interleaved, medians:

- serial: per object, `_copyin` and wait for the device, the jitted MLP and wait, `_copyout`
  (each step waited for: nothing overlaps);
- uploads alone: the serial run's `_copyin` and wait, nothing else (what there is to hide);
- the user's pipeline: `_copyin`, the jitted MLP, `_copyout`, with no waits of its own (the
  device's queue orders them);
- the reference worker: asynchronous uploads of the next objects while one computes, one
  object per upload, compute and download (`--batch 1`) and `--batch B` of them at a time.

The overlap fraction is the share of the upload time the worker saves against the serial
run, (serial - worker) / uploads, within [0, 1]: 1 when every upload is hidden behind other
work, 0 when nothing is gained; the time saved per object is printed beside it (more than
the uploads when the serial run's waits cost more than the uploads themselves).

    python bench/overlap.py [--device CL] [--objects 200] [--rounds 3] [--rows 4096] [--batch 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

from devbridge.apps.worker import Shapes, Worker
from devbridge.backends import tinygrad_compat as tg
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.bench.pipeline import UserTensors, user_pipeline

BATCH = 4  # the batched worker's objects per call
ROWS = 4096  # rows of 64 float32 per input: 1 MiB


def serial(shapes: Shapes, objects: int, device: str, compute: bool = True) -> float:
    """Seconds for `objects` objects, each step waited for; with compute=False, the uploads alone."""
    t = UserTensors(objects, device, shapes)
    start = time.perf_counter()
    for k in range(objects):
        t.copy_in(k)
        tg.synchronize(device)
        if compute:
            t.step(t.x, t.y)
            tg.synchronize(device)
            t.copy_out()
    seconds = time.perf_counter() - start
    if compute:
        t.check()
    return seconds


def user(shapes: Shapes, objects: int, device: str) -> float:
    """Seconds for the user's pipeline: no waits but `_copyout`'s own."""
    return objects / user_pipeline(objects, device=device, shapes=shapes)


def worker(shapes: Shapes, objects: int, device: str, batch: int = 1) -> float:
    """Seconds for the reference worker, `batch` objects per upload, compute and download (every
    output checked against numpy)."""
    run = Worker(TinygradBackend(device), objects, shapes=shapes, ring_objects=16, batch=batch)
    start = time.perf_counter()
    run.run()
    seconds = time.perf_counter() - start
    delivery = run.tally.delivery(objects)
    assert delivery.clean, delivery
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="CL")
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=ROWS, help=f"rows of 64 float32 per input (default {ROWS}: 1 MiB)")
    parser.add_argument(
        "--batch", type=int, default=BATCH, help=f"the batched worker's objects per call (default {BATCH})"
    )
    args = parser.parse_args()
    shapes = Shapes(rows=args.rows)
    n, device, b = args.objects, args.device, args.batch
    runs: dict[str, list[float]] = {"serial": [], "uploads": [], "user": [], "worker": [], "batched": []}
    for _ in range(2):  # warm-up: kernels compiled, the allocator's cache full
        serial(shapes, 4, device), user(shapes, 4, device), worker(shapes, 4, device), worker(shapes, b, device, b)
    for _ in range(args.rounds):
        runs["serial"].append(serial(shapes, n, device))
        runs["worker"].append(worker(shapes, n, device))
        runs["uploads"].append(serial(shapes, n, device, compute=False))
        runs["user"].append(user(shapes, n, device))
        runs["batched"].append(worker(shapes, n, device, b))
    s, u, p, w, wb = (statistics.median(runs[k]) for k in ("serial", "uploads", "user", "worker", "batched"))
    kib_in, kib_out = shapes.rows * shapes.d_in * 4 >> 10, shapes.rows * shapes.d_out * 4 >> 10
    print(f"{n} objects of {kib_in} KiB in, {kib_out} KiB out, device {device}, {args.rounds} rounds (medians)")
    for name, seconds in (("serial (each step waited for)", s), ("uploads alone", u), ("user's pipeline", p),
                          ("reference worker --batch 1", w), (f"reference worker --batch {b}", wb)):  # fmt: skip
        print(f"{name:<32} {seconds * 1e3 / n:8.3f} ms per object   {n / seconds:8.1f} objects/s")
    for name, seconds in (("--batch 1", w), (f"--batch {b}", wb)):
        fraction = min(1.0, max(0.0, (s - seconds) / u))
        print(
            f"worker {name}: {s / seconds:.2f}x as fast as serial, {p / seconds:.2f}x the user's pipeline; "
            f"overlap fraction {fraction:.2f} of the upload time hidden (1: all, 0: none), "
            f"{(s - seconds) * 1e3 / n:.3f} ms per object saved against serial (uploads take {u * 1e3 / n:.3f} ms)"
        )


if __name__ == "__main__":
    main()
