"""Every speed and memory goal in one run: `devbridge bench` (or `python bench/suite.py`).

Each row measures the bridge and its raw counterpart in one process, side by
side: every round runs raw, bridge, bridge, raw (neither side gains from its
place in a round) and the row reports the medians over the rounds; rows
indented under a goal explain it and have none of their own. Raw sides are tinygrad's
own allocator (`_copyin`, `Buffer.allocate/deallocate`) and the tinygrad pipeline
a user would write (weights captured in the JIT, no lifecycle, one object per call) (numpy's memcpy
beside them: bench/copy_bandwidth.py). The worker's goal row batches (`devbridge demo --batch`); the
rows under it show it one object at a time, and against the user's pipeline batching as it does.
Where OpenCL opens (pocl here), the worker on CL against the user's pipeline there, and with 1 MiB
objects against a strictly serial pipeline, with the share of the upload time it saves (bench/overlap.py).
With the worker's rows, a profile of the gap between the worker and the user's pipeline:
microseconds per object in each part (the bridge, rings, events, TinyJit, kernels...).
A benchmark, not a test: run it on a quiet machine.

    devbridge bench [--rounds 5] [--quick] [--json] [--device CPU]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec
from devbridge.backends import tinygrad_compat as tg
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.bench import pipeline, scaling, shared_ring

Call = Callable[[], object]
SPEC = ObjectSpec("bench", "uint8")


@dataclass
class Row:
    """One goal: the bridge's figure, its raw counterpart's, their ratio and the goal's bound."""

    path: str
    bridge: float
    raw: float
    unit: str
    ratio: float
    goal: str  # "<= 1.03" or ">= 0.8"; "" for a row that explains another (no goal of its own)
    rounds: list[tuple[float, float]]  # (bridge, raw) per round
    key: str = ""  # what the benchmark page finds the row by, for the rows it explains; else ""

    @property
    def met(self) -> bool | None:
        if not self.goal:
            return None
        op, bound = self.goal.split()
        return self.ratio <= float(bound) if op == "<=" else self.ratio >= float(bound)


def per_call(fn: Call, calls: int) -> float:
    """Seconds per call of `calls` calls in a row."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def side_by_side(
    path: str,
    bridge: Callable[[], float],
    raw: Callable[[], float],
    rounds: int,
    unit: str,
    goal: str,
    scale: float,
    key: str = "",
) -> Row:
    """Run `bridge` and `raw` (each returns one run's figure) in `rounds` rounds after a warm-up;
    each round runs them raw, bridge, bridge, raw (ABBA: whatever favours a position in the round
    favours both sides alike) and keeps each side's mean. The medians over the rounds and their
    ratio."""
    bridge(), raw()
    pairs: list[tuple[float, float]] = []
    for _ in range(rounds):
        r1 = raw()
        b1 = bridge()
        b2 = bridge()
        r2 = raw()
        pairs.append(((b1 + b2) / 2 * scale, (r1 + r2) / 2 * scale))
    b, r = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    return Row(path, b, r, unit, b / r, goal, pairs, key)


class CopyBench:
    """A bridge, a ring and an allocation of `nbytes`, beside a raw tinygrad Buffer of the same size."""

    def __init__(self, device: str, nbytes: int, check_host_bytes: bool = False) -> None:
        self.nbytes = nbytes
        self.bridge = Bridge(TinygradBackend(device), check_host_bytes=check_host_bytes)
        self.ring = HostRing(max(4, (1 << 16) // nbytes) * nbytes)
        self.handle = self.bridge.alloc_device(SPEC, nbytes)
        self.target = DeviceRange(self.handle, 0, nbytes)
        self.payload = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8).tobytes()
        whole = self.ring.reserve(self.ring.capacity)  # every slice of nbytes the copies reserve holds the payload
        self.ring.view(whole)[:] = self.payload * (self.ring.capacity // nbytes)
        # the raw side reads the same ring slices, in the same order (memory the bridge's reservations cycle through)
        self.raw_srcs = [self.ring.raw(whole.sub(k * nbytes, nbytes)) for k in range(self.ring.capacity // nbytes)]
        self.next_raw = 0
        self.ring.release(whole)
        self.raw_buf = tg.allocate(device, nbytes)

    def sync(self) -> None:
        self.bridge.host_to_device(self.ring.reserve(self.nbytes), self.target)

    def async_wait(self) -> None:
        self.bridge.host_to_device(self.ring.reserve(self.nbytes), self.target, sync=False).wait()

    def raw(self) -> None:
        self.raw_buf.allocator._copyin(self.raw_buf._buf, self.raw_srcs[self.next_raw])
        self.next_raw = (self.next_raw + 1) % len(self.raw_srcs)

    def check(self) -> None:
        """The bridge's copies landed: the device bytes are the ring's."""
        out = memoryview(bytearray(self.nbytes))
        record = self.bridge._core.allocation(self.handle.id)
        assert record is not None and isinstance(record.memory, tg.Buffer)
        tg.copy_out(out, record.memory, 0)
        assert bytes(out) == self.payload


def calls_for(nbytes: int, quick: bool) -> int:
    calls = max(20, min(5000, (128 << 20) // nbytes // 4))
    return max(5, calls // 20) if quick else calls


def timed_row(path: str, bridge: Call, raw: Call, calls: int, rounds: int, goal: str, key: str = "") -> Row:
    return side_by_side(
        path, lambda: per_call(bridge, calls), lambda: per_call(raw, calls), rounds, "µs", goal, 1e6, key
    )


def copy_rows(device: str, rounds: int, quick: bool) -> list[Row]:
    rows = []
    for nbytes, goal in ((64, "<= 0.75"), (1 << 20, "<= 1.0"), (16 << 20, "<= 1.03")):
        b = CopyBench(device, nbytes)
        path = f"sync host_to_device {size_label(nbytes)} / raw _copyin"
        rows.append(
            timed_row(path, b.sync, b.raw, calls_for(nbytes, quick), rounds, goal, f"sync copy {size_label(nbytes)}")
        )
        b.check()
    null = scaling.Setup(10)
    path = "  the bridge's share of 64 B alone (a backend that does nothing) / raw _copyin 64 B"
    rows.insert(
        1, timed_row(path, null.copy, CopyBench(device, 64).raw, calls_for(64, quick), rounds, "", "own copy work")
    )
    b = CopyBench(device, 64)
    path = "async host_to_device 64 B + wait() / sync 64 B"
    rows.append(timed_row(path, b.async_wait, b.sync, calls_for(64, quick), rounds, "<= 1.3"))
    b.check()
    return rows


def check_rows(device: str, rounds: int, quick: bool) -> list[Row]:
    """The host-bytes checking mode's cost: a synchronous copy with it against one without."""
    rows = []
    for nbytes, goal in ((64, ""), (64 << 10, ""), (1 << 20, "<= 1.5"), (16 << 20, "")):
        checked, plain = CopyBench(device, nbytes, check_host_bytes=True), CopyBench(device, nbytes)
        path = f"sync host_to_device {size_label(nbytes)}, host bytes checked / unchecked"
        calls = calls_for(nbytes, quick)
        rows.append(timed_row(path, checked.sync, plain.sync, calls, rounds, goal, f"checked {size_label(nbytes)}"))
        checked.check()
    return rows


def alloc_row(device: str, rounds: int, quick: bool) -> list[Row]:
    nbytes, calls = 1 << 20, 50 if quick else 1000
    bridge = Bridge(TinygradBackend(device))

    def via_bridge() -> None:
        bridge.free_device(bridge.alloc_device(SPEC, nbytes))

    def raw() -> None:
        tg.allocate(device, nbytes).deallocate()  # type: ignore[no-untyped-call]

    path = "alloc_device + free_device 1 MiB / raw Buffer allocate + deallocate"
    row = timed_row(path, via_bridge, raw, calls, rounds, "<= 1.2", "alloc + free")
    null = Bridge(scaling.NullBackend())

    def bookkeeping() -> None:
        null.free_device(null.alloc_device(SPEC, nbytes))

    path = "  the bridge's share alone (a backend that does nothing) / raw allocate + deallocate"
    return [row, timed_row(path, bookkeeping, raw, calls, rounds, "", "own alloc + free work")]


def objects_row(
    path: str, bridge: Callable[[], float], raw: Callable[[], float], rounds: int, goal: str = "", key: str = ""
) -> Row:
    """A row of two pipelines' objects per second (each callable runs one and returns it)."""
    return side_by_side(path, bridge, raw, rounds, "obj/s", goal, 1.0, key)


def worker_rows(device: str, rounds: int, quick: bool) -> list[Row]:
    objects, b = (100 if quick else 1000), pipeline.BATCH

    def worker(batch: int) -> Callable[[], float]:
        return lambda: pipeline.worker(objects, device, batch=batch)

    def user(batch: int = 1) -> Callable[[], float]:
        return lambda: pipeline.user_pipeline(objects, device=device, batch=batch)

    def process(batch: int) -> Callable[[], float]:
        run = functools.partial(pipeline.process_worker, objects, device, batch=batch)
        # each run starts three processes (seconds): a smoke run runs it once and reuses its figure
        return functools.cache(run) if quick else run

    return [
        objects_row(f"reference worker --batch {b} / the user's tinygrad pipeline ({objects} objects, objects/s)",
                    worker(b), user(), rounds, ">= 0.8"),
        objects_row("  reference worker --batch 1 (an object per upload, compute, download) / the same",
                    worker(1), user(), rounds),
        objects_row(f"  reference worker --batch {b} / the user's pipeline, {b} objects per call",
                    worker(b), user(b), rounds),
        objects_row("  reference worker --batch 1 / the pipeline passing all six tensors to TinyJit",
                    worker(1), lambda: pipeline.raw_pipeline(objects, device=device), rounds),
        objects_row("reference worker as a process, --batch 1 / the user's pipeline (a producer and a collector "
                    "process beside it)", process(1), user(), rounds, ">= 0.9", "process worker 1"),
        objects_row(f"reference worker as a process, --batch {b} / the user's pipeline, {b} objects per call",
                    process(b), user(b), rounds, ">= 0.9", "process worker 8"),
    ]  # fmt: skip


def queue_rows(rounds: int, quick: bool) -> list[Row]:
    """On a device with its own queue (CL, where it opens): the worker against the user's
    pipeline, and for 1 MiB objects against a strictly serial pipeline, with the share of the
    upload time it saves (bench/overlap.py)."""
    if TinygradBackend("CL").unusable() is not None:
        return []
    from devbridge.apps.worker import Shapes
    from devbridge.bench import overlap

    # a worker's objects/s is its steady state: enough objects that the run's start (the weights'
    # upload, the MLP's two un-jitted calls) and its end weigh as little as in a long run
    objects, big, b = (50, 16, overlap.BATCH) if quick else (500, overlap.OBJECTS, overlap.BATCH)
    shapes = Shapes(rows=overlap.ROWS)

    def per_s(run: Callable[[], float], n: int) -> Callable[[], float]:
        return lambda: n / run()

    def serial(n: int) -> Callable[[], float]:
        return per_s(lambda: overlap.serial(shapes, n, "CL"), n)

    def worker(n: int, batch: int) -> Callable[[], float]:
        return per_s(lambda: overlap.worker(shapes, n, "CL", batch), n)

    demo = objects_row(
        f"reference worker --batch {pipeline.BATCH} on CL / the user's tinygrad pipeline on CL ({objects} objects)",
        lambda: pipeline.worker(objects, "CL", batch=pipeline.BATCH),
        lambda: pipeline.user_pipeline(objects, device="CL"),
        rounds,
        ">= 0.8",
    )
    versus_serial = objects_row(
        f"reference worker --batch {b} on CL, {big} objects of 1 MiB / serial (each step waited for)",
        worker(big, b),
        serial(big),
        rounds,
        ">= 1.0",
        "CL worker / serial",
    )
    single = objects_row(
        "  reference worker --batch 1 on CL, the same objects / the same",
        worker(big, 1),
        serial(big),
        rounds,
        key="CL worker --batch 1 / serial",
    )
    # the upload time the batched worker saves against the serial run, over the uploads' own time
    ms = 1e3 / versus_serial.raw - 1e3 / versus_serial.bridge
    uploads = statistics.median(overlap.serial(shapes, big, "CL", compute=False) * 1e3 / big for _ in range(rounds))
    hidden = Row(
        "  upload time saved (serial - worker, ms per object) / uploads alone: the overlap",
        ms,
        uploads,
        "ms",
        ms / uploads,
        "",
        [(ms, uploads)],
        "CL overlap",
    )
    return [demo, versus_serial, single, hidden]


def scaling_rows(rounds: int, quick: bool) -> list[Row]:
    live, calls = (10_000, 2000) if quick else (100_000, 20000)
    many = scaling.Setup(live)
    few = scaling.Setup(10)
    path = f"per-op cost (reserve + sync copy, null backend) at {live:,} live / at 10 live"
    cost = timed_row(path, many.copy, few.copy, calls, rounds, "<= 1.2")
    per_alloc = scaling.bytes_per_allocation(live)
    memory = Row(
        "bookkeeping per live allocation / 1 KiB", per_alloc, 1024, "B", per_alloc / 1024, "<= 1.0", [(per_alloc, 1024)]
    )
    return [cost, memory]


def fixed_row(path: str, value: float, reference: float, unit: str, goal: str) -> Row:
    """A row of one measured figure against a fixed bound (a latency against its budget)."""
    return Row(path, value, reference, unit, value / reference, goal, [(value, reference)])


def ring_rows(rounds: int, quick: bool) -> list[Row]:
    """The ring across processes against the in-process ring (bench/shared_ring.py)."""
    rows: list[Row] = shared_ring.rows(rounds, quick, side_by_side, fixed_row, size_label)
    return rows


def run(device: str, rounds: int, quick: bool, only: Sequence[str] = ()) -> list[Row]:
    rows: list[Row] = []
    parts: dict[str, Callable[[], list[Row]]] = {
        "copies": lambda: copy_rows(device, rounds, quick),
        "alloc": lambda: alloc_row(device, rounds, quick),
        "scaling": lambda: scaling_rows(rounds, quick),
        "worker": lambda: worker_rows(device, rounds, quick),
        "queue": lambda: queue_rows(rounds, quick),
        "ring": lambda: ring_rows(rounds, quick),
        "check": lambda: check_rows(device, rounds, quick),
    }
    for name, part in parts.items():
        if not only or name in only:
            rows += part()
    return rows


def table(rows: Sequence[Row], rounds: int, device: str) -> str:
    lines = [
        f"devbridge bench on {device}: medians of {rounds} interleaved rounds",
        f"{'path':<86} {'bridge':>10} {'raw':>10} {'unit':>5} {'ratio':>6} {'goal':>8} {'met':>4}",
    ]
    for r in rows:
        lines.append(
            f"{r.path:<86} {r.bridge:>10.2f} {r.raw:>10.2f} {r.unit:>5} {r.ratio:>6.2f} {r.goal:>8} "
            f"{'-' if r.met is None else 'yes' if r.met else 'no':>4}"
        )
    return "\n".join(lines)


def machine() -> dict[str, object]:
    """What the figures were measured on: they hold for that machine only."""
    import os
    import platform
    from importlib import metadata

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "unknown"

    return {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "tinygrad": version("tinygrad"),
        "devbridge": version("devbridge"),
        "date": time.strftime("%Y-%m-%d"),
    }


def size_label(nbytes: int) -> str:
    """A size as the benchmark's rows and pages name it: whole MiB, whole KiB, or bytes."""
    for unit, name in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit} {name}"
    return f"{nbytes} B"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="devbridge bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="CPU")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per row (default 5)")
    parser.add_argument("--quick", action="store_true", help="few calls per round: checks that it runs, not speed")
    parser.add_argument(
        "--only",
        action="append",
        choices=("copies", "alloc", "scaling", "worker", "queue", "ring", "check"),
        default=[],
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    from devbridge.errors import InvalidArgumentError

    try:
        reason = TinygradBackend(args.device).unusable()
    except InvalidArgumentError as e:
        reason = e.detail
    if reason is not None:
        parser.error(reason)
    rows = run(args.device, args.rounds, args.quick, args.only)
    objects = 100 if args.quick else 1000
    profiled = not args.only or "worker" in args.only
    gap = pipeline.gap(objects, args.device) if profiled else None
    process_gap = pipeline.process_gap(objects, args.device) if profiled else None
    if args.json:
        report = {"device": args.device, "rounds": args.rounds, "quick": args.quick, "machine": machine()}
        report["rows"] = [asdict(r) for r in rows]
        if gap is not None:
            report["profile"] = {"objects": objects, "parts": gap, "process_parts": process_gap}
        print(json.dumps(report))
    else:
        print(table(rows, args.rounds, args.device))
        for title, parts in (("", gap), (" the worker as a process,", process_gap)):
            if parts is not None:
                print(f"\nwhere the time goes:{title} µs per object under cProfile ({objects} objects; own time)")
                print("\n".join(pipeline.gap_table(parts)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
