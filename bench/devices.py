"""Objects per second on one device against two in one process.

Runs the reference worker on one tinygrad device (`run_demo`) and on two (`run_devices`),
alternately, in one process, and reports each one's objects/s, the ratio, and the CPU time the
process used per wall second (its utilisation of this machine's cores). A benchmark, not a test.

    python bench/devices.py [--objects 1500] [--rounds 3] [--devices CPU:0,CPU:1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from devbridge.apps.worker import run_demo, run_devices


def measure(run: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of this process per wall second, the run's summary)."""
    cpu, wall = os.times(), time.perf_counter()
    summary = run()
    wall = time.perf_counter() - wall
    used = os.times()
    return wall, (used.user - cpu.user + used.system - cpu.system) / wall, summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--devices", default="CPU:0,CPU:1")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    devices = args.devices.split(",")
    rows: dict[str, list[tuple[float, float]]] = {"one": [], "all": []}
    for _ in range(args.rounds):  # alternately: the machine's noise falls on both
        wall, cpu, s = measure(lambda: run_demo(args.objects, device=devices[0]))
        assert s.clean, s
        rows["one"].append((args.objects / wall, cpu))
        wall, cpu, m = measure(lambda: run_devices(args.objects, devices))
        assert m.clean, m
        rows["all"].append((args.objects / wall, cpu))
    one = statistics.median(r for r, _ in rows["one"])
    many = statistics.median(r for r, _ in rows["all"])
    report = {
        "objects": args.objects,
        "rounds": args.rounds,
        "cores": os.cpu_count(),
        "one_device": {
            "device": devices[0],
            "objects_per_s": one,
            "cpu_per_wall_s": statistics.median(c for _, c in rows["one"]),
        },
        "devices": {
            "devices": devices,
            "objects_per_s": many,
            "cpu_per_wall_s": statistics.median(c for _, c in rows["all"]),
        },
        "ratio": many / one,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{args.objects} objects, median of {args.rounds} alternating rounds, {os.cpu_count()} cores\n"
            f"  1 device ({devices[0]}): {one:.0f} objects/s, "
            f"CPU {report['one_device']['cpu_per_wall_s']:.2f} s per s\n"
            f"  {len(devices)} devices ({args.devices}): {many:.0f} objects/s, "
            f"CPU {report['devices']['cpu_per_wall_s']:.2f} s per s\n"
            f"  ratio {len(devices)} devices / 1: {many / one:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
