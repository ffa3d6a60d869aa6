"""The reference worker against a raw tinygrad pipeline of the same work, in one process.

Raw: per object, `allocator._copyin` of its 16x64 float32 input into a device
Buffer, the same MLP under TinyJit (zero-copy tensors over the Buffers, made
as the bridge makes its views, passed as arguments; the result assigned into
the output), `allocator._copyout` of the 16x32 output; one object at a time,
no ring, no lifecycle, no checks, inputs made beforehand. Worker:
`devbridge.apps.worker.run_demo` (producer thread, rings, the bridge, pooled
slots, asynchronous copies, every output checked against numpy). Rounds
alternate; medians. Goal: worker/raw >= 0.8.

    python bench/pipeline.py [--objects N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from tinygrad.device import Device
from tinygrad.engine.jit import TinyJit
from tinygrad.tensor import Tensor

from devbridge.apps.worker import Shapes, make_input, make_weights, mlp_step, run_demo
from devbridge.backends import tinygrad_compat as tg


def raw_pipeline(objects: int, seed: int = 0, device: str = "CPU") -> float:
    """Objects per second of the raw pipeline."""
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
    expected = inputs[-1] @ make_weights(seed, shapes)["w1"]  # a sanity check that it computed
    assert np.isfinite(out).all() and expected.shape == (shapes.rows, shapes.hidden)
    return objects / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    raw, worker = [], []
    for _ in range(args.rounds):
        raw.append(raw_pipeline(args.objects))
        summary = run_demo(objects=args.objects)
        assert summary.clean, summary
        worker.append(summary.objects_per_s)
    r, w = statistics.median(raw), statistics.median(worker)
    print(f"{args.objects} objects per run, {args.rounds} rounds alternating, device {Device.DEFAULT} (medians)")
    print(f"raw tinygrad pipeline: {r:8.0f} objects/s   runs {[round(v) for v in raw]}")
    print(f"reference worker:      {w:8.0f} objects/s   runs {[round(v) for v in worker]}")
    print(f"worker/raw: {w / r:.2f}   (goal >= 0.8)")


if __name__ == "__main__":
    main()
