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

The overlap fraction is the time the worker saves against the serial run over the uploads'
own time, (serial - worker) / uploads, capped to [0, 1]: 1 when the saving covers every upload
(as if each were hidden behind other work), 0 when nothing is gained. The uncapped ratio and the
time saved per object are printed beside it: above 1, the serial run's waits are saved as well.
On a queue that runs one command at a time on the host's cores (pocl), nothing truly runs
beside a kernel and the whole saving is waits.

    python bench/overlap.py [--device CL] [--objects 192] [--rounds 3] [--rows 4096] [--batch 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

from devbridge.apps.worker import Shapes, Worker
from devbridge.backends import tinygrad_compat as tg
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.bench.pipeline import UserTensors, user_pipeline

BATCH = 8  # the batched worker's objects per call
RING_BATCHES = 4  # the input ring holds this many batches: as many as the worker's window
ROWS = 4096  # rows of 64 float32 per input: 1 MiB
OBJECTS = 192  # a run long enough that its start and end weigh little (a worker runs for hours)


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
    run = Worker(TinygradBackend(device), objects, shapes=shapes, ring_objects=RING_BATCHES * batch, batch=batch)
    start = time.perf_counter()
    run.run()
    seconds = time.perf_counter() - start
    delivery = run.tally.delivery(objects)
    assert delivery.clean, delivery
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="CL")
    parser.add_argument("--objects", type=int, default=OBJECTS)
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
            f"overlap fraction {fraction:.2f} (saved / uploads, capped to 0..1; uncapped {(s - seconds) / u:.2f}), "
            f"{(s - seconds) * 1e3 / n:.3f} ms per object saved against serial (uploads take {u * 1e3 / n:.3f} ms)"
        )


if __name__ == "__main__":
    main()
