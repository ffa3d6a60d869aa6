"""Objects per second on one Ray actor against two.

Runs the fleet (`devbridge.apps.fleet.run_fleet`, tinygrad's CPU device: actor i on `CPU:i`) with one
actor and with two, alternately, in one local Ray session of one CPU per actor, and reports each
one's objects/s (wall time from the first batch given to the last result, actors' start
included), the ratio, and the CPU time the actors used per wall second (their utilisation of
this machine's cores). A benchmark, not a test; it needs the `ray` extra.

    python bench/fleet.py [--objects 6000] [--batch 300] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Sequence

from devbridge.apps.fleet import FleetSummary, ray_module, run_fleet


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=6000)
    parser.add_argument("--batch", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=("tinygrad", "fake"), default="tinygrad")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    ray = ray_module()
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    rows: dict[int, list[FleetSummary]] = {1: [], 2: []}
    try:
        for _ in range(args.rounds):  # alternately: the machine's noise falls on both
            for workers in (1, 2):
                s = run_fleet(args.objects, workers, args.backend, batch=args.batch)
                assert s.clean, s
                rows[workers].append(s)
    finally:
        if started:
            ray.shutdown()

    def figures(runs: list[FleetSummary]) -> dict[str, float]:
        return {
            "objects_per_s": statistics.median(s.objects_per_s for s in runs),
            "actor_cpu_per_wall_s": statistics.median(sum(a.cpu_s for a in s.actors) / s.seconds for s in runs),
        }

    one, two = figures(rows[1]), figures(rows[2])
    report = {
        "objects": args.objects,
        "batch": args.batch,
        "rounds": args.rounds,
        "cores": os.cpu_count(),
        "backend": args.backend,
        "one_actor": one,
        "two_actors": two,
        "ratio": two["objects_per_s"] / one["objects_per_s"],
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{args.objects} objects in batches of {args.batch}, median of {args.rounds} alternating rounds, "
            f"{os.cpu_count()} cores, {args.backend}\n"
            f"  1 actor:  {one['objects_per_s']:.0f} objects/s, actors' CPU {one['actor_cpu_per_wall_s']:.2f} s per s\n"
            f"  2 actors: {two['objects_per_s']:.0f} objects/s, actors' CPU {two['actor_cpu_per_wall_s']:.2f} s per s\n"
            f"  ratio 2 actors / 1: {report['ratio']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
