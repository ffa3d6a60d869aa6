"""The reference worker against the pipeline a user would write without devbridge, in one process.

The user's pipeline, the yardstick: plain tinygrad tensors for one object's input and output,
the MLP under TinyJit with the weights captured and only x and y passed, per object the
allocator's `_copyin` of its 16x64 float32 input, the jitted step, `_copyout` of the 16x32
output; one object at a time, no ring, no lifecycle, no checks, inputs made beforehand.
The six-argument pipeline (a second, labelled row): the same with every tensor passed to the
JIT, weights included, over zero-copy views made as the bridge makes them. Worker:
`devbridge.apps.worker.run_demo` (producer thread, rings, the bridge, pooled slots,
asynchronous copies, every output checked against numpy). Rounds alternate; medians.
Both also run batched: the worker with `--batch B` (B objects per upload, compute and
download), the user's pipeline with B objects' inputs in one tensor per call. Goal: the
worker, batching, >= 0.8 of the user's pipeline one object at a time.

`--profile` runs each once under cProfile and prints, per object, the time spent in each part
(the bridge, the rings, events, the worker's own loop, the numpy check, TinyJit's argument
handling, kernels, tinygrad's copies): where the gap between them goes.

    python bench/pipeline.py [--objects N] [--rounds R] [--device CPU] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import functools
import os
import pstats
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from tinygrad.device import Buffer
from tinygrad.engine.jit import TinyJit
from tinygrad.tensor import Tensor

from devbridge.apps.backends import make_backend
from devbridge.apps.worker import (
    Shapes,
    device_worker,
    jitted_mlp,
    make_input,
    make_weights,
    mlp_step,
    one_blas_thread,
    reference_mlp,
    run_demo,
)
from devbridge.apps.worker.processes import RingFeed, RingWorker, WorkerSpec, run_processes, work
from devbridge.apps.worker.workload import DEMO_SHAPES
from devbridge.backends import tinygrad_compat as tg
from devbridge.backends.base import Backend

BATCH = 8  # the batched rows' objects per call


class UserTensors:
    """What a user's pipeline holds: the inputs made beforehand, the weights as plain realized
    tensors captured in the jitted MLP, one object's x and y as plain tensors, their Buffers
    (for the allocator's `_copyin` and `_copyout`) and a host array for the output."""

    def __init__(self, objects: int, device: str, shapes: Shapes = DEMO_SHAPES, seed: int = 0) -> None:
        self.shapes, self.seed = shapes, seed
        self.inputs = [make_input(seed, k, shapes) for k in range(objects)]
        weights = {name: Tensor(w, device=device).realize() for name, w in make_weights(seed, shapes).items()}
        self.step = jitted_mlp(weights)
        self.x = Tensor.zeros(shapes.rows, shapes.d_in, dtype="float32", device=device).contiguous().realize()
        self.y = Tensor.zeros(shapes.rows, shapes.d_out, dtype="float32", device=device).contiguous().realize()
        self.xb, self.yb = _buffer(self.x), _buffer(self.y)
        self.out = np.empty((shapes.rows, shapes.d_out), dtype=np.float32)

    def copy_in(self, k: int) -> None:
        self.xb.allocator._copyin(self.xb._buf, self.inputs[k].data.cast("B"))

    def copy_out(self) -> None:
        self.yb.allocator._copyout(self.out.data.cast("B"), self.yb._buf)

    def check(self) -> None:
        """The last output is numpy's for the last input: it computed what the worker computes."""
        _check(self.out, self.inputs[-1], self.seed, self.shapes)


def _buffer(t: Tensor) -> Buffer:
    buffer = t.uop.buffer
    assert isinstance(buffer, Buffer)
    return buffer


def user_pipeline(
    objects: int,
    seed: int = 0,
    device: str = "CPU",
    profiler: cProfile.Profile | None = None,
    shapes: Shapes = DEMO_SHAPES,
    batch: int = 1,
) -> float:
    """Objects per second of the pipeline a user writes: weights captured in the JIT, no waits
    but `_copyout`'s own (the timed loop profiled by `profiler`, if given); with `batch`, the
    inputs of `batch` objects at a time in one tensor (one copy in, one call, one copy out)."""
    calls = -(-objects // batch)
    t = UserTensors(calls, device, dataclasses.replace(shapes, rows=shapes.rows * batch), seed)
    with profiling(profiler):
        start = time.perf_counter()
        for k in range(calls):
            t.copy_in(k)
            t.step(t.x, t.y)
            t.copy_out()
        seconds = time.perf_counter() - start
    t.check()
    return calls * batch / seconds


def raw_pipeline(objects: int, seed: int = 0, device: str = "CPU") -> float:
    """Objects per second of the six-argument pipeline: every tensor passed to the JIT, over
    zero-copy views made as the bridge makes its views."""
    shapes = Shapes()
    inputs = [make_input(seed, k, shapes) for k in range(objects)]
    weights = [Tensor(w, device=device).realize() for w in make_weights(seed, shapes).values()]
    xb, yb = tg.allocate(device, inputs[0].nbytes), tg.allocate(device, shapes.rows * shapes.d_out * 4)
    x = tg.tensor_view(xb, 0, (shapes.rows, shapes.d_in), "float32")  # the tensors the worker's views are
    y = tg.tensor_view(yb, 0, (shapes.rows, shapes.d_out), "float32")
    step = TinyJit(mlp_step)
    out = np.empty((shapes.rows, shapes.d_out), dtype=np.float32)
    start = time.perf_counter()
    for k in range(objects):
        tg.copy_in(xb, 0, inputs[k].data.cast("B"))  # the allocator's _copyin
        step(x, *weights, y)
        tg.copy_out(out.data.cast("B"), yb, 0)  # the allocator's _copyout
    seconds = time.perf_counter() - start
    _check(out, inputs[-1], seed, shapes)
    return objects / seconds


def _check(out: np.ndarray[Any, Any], last: np.ndarray[Any, Any], seed: int, shapes: Shapes) -> None:
    """The last object's output is numpy's: the pipeline computed what the worker computes."""
    with one_blas_thread():  # no BLAS thread left spinning beside the next run
        expected = reference_mlp(last, make_weights(seed, shapes))
    assert np.allclose(out, expected, rtol=1e-4, atol=1e-4), "the pipeline computed something else"


def worker(objects: int, device: str = "CPU", profiler: cProfile.Profile | None = None, batch: int = 1) -> float:
    """Objects per second of the reference worker (`devbridge demo --batch {batch}`'s run, its
    timed part profiled by `profiler`, if given); every object delivered once and right."""
    if profiler is None:
        summary = run_demo(objects=objects, device=device, batch=batch)
    else:
        run = device_worker(make_backend("tinygrad", device), range(objects), 0.0, 0, 0, 0, batch=batch)
        with profiling(profiler):
            start = time.perf_counter()
            run.run()
            summary = run.summary(time.perf_counter() - start, device)
    assert summary.clean, summary
    return summary.objects_per_s


def process_worker(objects: int, device: str = "CPU", batch: int = 1) -> float:
    """Objects per second of the reference worker as a process (`devbridge demo --processes 1
    --batch {batch}`): a producer process fills the input shared ring, the worker process takes,
    computes and commits each output with its input, a collector process checks them. Its own
    time, from its first take to its last commit: the processes' start-up is left out, as the
    user's pipeline leaves out making its inputs."""
    s = run_processes(objects, 1, "tinygrad", [device], batch=batch)
    assert s.clean and s.repeated_inputs == 0 and s.worker_starts == 1, s
    return s.worker_objects_per_s


@contextlib.contextmanager
def profiling(profiler: cProfile.Profile | None) -> Iterator[None]:
    if profiler is not None:
        profiler.enable()
    try:
        yield
    finally:
        if profiler is not None:
            profiler.disable()


#: The parts of a run, by where the time is spent (the first match of a file's path wins).
PARTS = (
    ("ring/host.py", "rings"),
    ("ring/shared.py", "rings"),
    ("ring/segment.py", "rings"),
    ("bridge/events.py", "events"),
    ("bridge/aio.py", "events"),
    ("apps/worker/workload.py", "the numpy check"),
    ("apps/", "the worker's loop"),
    # the rest of the package, by its folders (as installed, or in a checkout)
    *((f"/{d}/", "the bridge") for d in ("devbridge", "api", "bridge", "ring", "statemachine", "backends", "spec")),
    ("tinygrad/engine/jit.py", "TinyJit: arguments"),
    ("tinygrad/uop/", "TinyJit: arguments"),
    ("tinygrad/runtime/", "kernels and copies"),
    ("tinygrad/engine/realize.py", "kernels and copies"),
    ("tinygrad/", "tinygrad, other"),
    ("numpy/", "the numpy check"),
    ("threading.py", "waiting"),
)


def profile(run: Callable[[cProfile.Profile], object], objects: int) -> Counter[str]:
    """Microseconds per object in each part of PARTS (own time in the timed part of `run`, the
    calling thread's)."""
    profiler = cProfile.Profile()
    run(profiler)
    return parts_of(pstats.Stats(profiler), objects)


def parts_of(stats: pstats.Stats, objects: int) -> Counter[str]:
    """Microseconds per object in each part of PARTS, from a profile's own times."""
    parts: Counter[str] = Counter()
    for (path, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
        own_s = row[2]
        # (a shared ring's futex wait is waiting: a take that found no record yet)
        sleeping = path.endswith("ring/segment.py") and function == "wait"
        part = "waiting" if sleeping else next((name for key, name in PARTS if key in path), None)
        if part is None:
            part = "waiting" if "acquire" in function or "wait" in function else "Python, other"
        parts[part] += own_s * 1e6 / objects
    return parts


def gap(objects: int, device: str) -> dict[str, dict[str, float]]:
    """Per part of PARTS: {"worker": µs per object, "user": µs per object}, each run once under
    cProfile after a warm-up run of each (kernels compiled, caches full); parts by the worker's
    cost, largest first."""
    user_pipeline(objects, device=device), worker(objects, device)
    w = profile(lambda p: worker(objects, device, p), objects)
    u = profile(lambda p: user_pipeline(objects, device=device, profiler=p), objects)
    names = sorted(set(w) | set(u), key=lambda name: -w[name])
    return {name: {"worker": round(w[name], 1), "user": round(u[name], 1)} for name in names}


class ProfiledRingWorker(RingWorker):
    """The worker process's loop under cProfile (its start-up and warm-up left out), the profile
    written to `path` when the loop ends."""

    def __init__(self, path: str, backend: Backend, feed: RingFeed, **options: Any) -> None:
        self.path = path
        super().__init__(backend, feed, **options)

    def run(self, progress: Callable[[int], None] | None = None) -> None:
        profiler = cProfile.Profile()
        with profiling(profiler):
            super().run(progress)
        profiler.dump_stats(self.path)


def profiled_work(path: str, spec: WorkerSpec, counters: Any, stop: Any) -> None:
    """A worker process whose loop is profiled into `path` (run_processes' work_target)."""
    work(spec, counters, stop, make=functools.partial(ProfiledRingWorker, path))


def process_gap(objects: int, device: str) -> dict[str, dict[str, float]]:
    """As `gap`, for the worker as a process (--batch 1, a producer and a collector process
    beside it): its loop's own time in the worker process, per part."""
    user_pipeline(objects, device=device)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "worker.prof")
        run_processes(objects, 1, "tinygrad", [device], work_target=functools.partial(profiled_work, path))
        w = parts_of(pstats.Stats(path), objects)
    u = profile(lambda p: user_pipeline(objects, device=device, profiler=p), objects)
    names = sorted(set(w) | set(u), key=lambda name: -w[name])
    return {name: {"worker": round(w[name], 1), "user": round(u[name], 1)} for name in names}


def gap_table(parts: dict[str, dict[str, float]]) -> list[str]:
    total = {side: sum(p[side] for p in parts.values()) for side in ("worker", "user")}
    lines = [f"{'part':<32} {'worker':>9} {'user':>9} {'gap':>9}"]
    for name, p in [*parts.items(), ("total", total)]:
        lines.append(f"{name:<32} {p['worker']:>9.1f} {p['user']:>9.1f} {p['worker'] - p['user']:>9.1f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="CPU")
    parser.add_argument(
        "--batch", type=int, default=BATCH, help=f"the batched rows' objects per call (default {BATCH})"
    )
    parser.add_argument("--profile", action="store_true", help="where each pipeline's time goes, per object")
    args = parser.parse_args()
    if args.profile:
        print(f"µs per object under cProfile ({args.objects} objects, device {args.device}; own time, main thread)")
        print("\n".join(gap_table(gap(args.objects, args.device))))
        return
    n, device, b = args.objects, args.device, args.batch
    user, one, many = (
        "user's pipeline (weights captured), one object a call",
        "reference worker, --batch 1",
        (f"reference worker, --batch {b}"),
    )
    pipelines: dict[str, Callable[[], float]] = {
        user: lambda: user_pipeline(n, device=device),
        f"user's pipeline, {b} objects a call": lambda: user_pipeline(n, device=device, batch=b),
        "six-argument pipeline, one object a call": lambda: raw_pipeline(n, device=device),
        one: lambda: worker(n, device),
        many: lambda: worker(n, device, batch=b),
    }
    runs: dict[str, list[float]] = {name: [] for name in pipelines}
    for run in pipelines.values():
        run()  # warm-up: kernels compiled, the allocator's cache full
    for _ in range(args.rounds):
        for name, run in pipelines.items():
            runs[name].append(run())
    medians = {name: statistics.median(figures) for name, figures in runs.items()}
    print(f"{n} objects per run, {args.rounds} rounds alternating, device {device} (medians, objects/s)")
    for name, figures in runs.items():
        print(f"{name:<56} {medians[name]:8.0f}   runs {[round(v) for v in figures]}")
    ratio_many, ratio_one = medians[many] / medians[user], medians[one] / medians[user]
    print(f"worker --batch {b} / user: {ratio_many:.2f} (goal >= 0.8)   worker --batch 1 / user: {ratio_one:.2f}")


if __name__ == "__main__":
    main()
