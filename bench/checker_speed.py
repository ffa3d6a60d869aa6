"""The sans-I/O checker's speed before and after: an older revision's checker and this tree's,
in one process, interleaved.

Builds the older revision (`--old`) as the package `devbridge_old` (scripts/revisions.py) and runs
its `models.sansio.check` and the current one on the default bound to `--depth`, in one process
and in `--jobs` forked ones. Each round runs old, new, new, old for each process count (neither
gains from its place); the figures are medians over the runs. Both must find the same distinct
states (a checker that found fewer would look faster): it stops otherwise. Per process is
states/s over the processes: the issue's "per core" on a machine with as many cores.
A benchmark, not a test: run it on a quiet machine.

    python -m devbridge.bench.checker_speed [--old REV] [--depth 6] [--jobs 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devbridge.checkout import script
from devbridge.models import checker, sansio


@dataclass
class Runs:
    """One checker at one process count: its states and transitions, and each run's seconds."""

    label: str
    jobs: int
    states: int = 0
    transitions: int = 0
    seconds: list[float] = field(default_factory=list)

    def add(self, report: Any) -> None:
        if report.violation is not None or (self.seconds and report.states != self.states):
            raise SystemExit(f"{self.label}: {report.states} states, violation {report.violation}: not comparable")
        self.states, self.transitions = report.states, report.transitions
        self.seconds.append(report.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rate(self) -> float:
        return self.states / self.median


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", default="HEAD", help="git revision to compare against (default HEAD: the last commit)")
    parser.add_argument("--depth", type=int, default=6, help="actions per path (default 6)")
    parser.add_argument("--jobs", type=int, default=2, help="processes of the parallel runs (default 2)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="devbridge_old_") as tmp:
        revisions = script("revisions")  # a tool of the checkout: --old needs git
        pkg, _ = revisions.build_old(args.old, Path(tmp))
        old = revisions.import_revision(pkg, "models.sansio", "models.checker")
        old_sansio, old_checker = old["models.sansio"], old["models.checker"]
        checks: dict[str, tuple[Callable[..., Any], Any]] = {
            "old": (old_sansio.check, old_checker.PROFILES["default"]),
            "new": (sansio.check, checker.PROFILES["default"]),
        }
        print(f"old: {revisions.short_rev(args.old)} as {revisions.OLD}; new: this tree. Default bound, "
              f"depth {args.depth}, {args.rounds} rounds of old, new, new, old")  # fmt: skip
        table = {(label, jobs): Runs(label, jobs) for jobs in (1, args.jobs) for label in checks}
        for _ in range(args.rounds):
            for jobs in (1, args.jobs):
                for label in ("old", "new", "new", "old"):
                    check, bound = checks[label]
                    table[(label, jobs)].add(check(bound, depth=args.depth, jobs=jobs))
        states = {runs.states for runs in table.values()}
        if len(states) != 1:
            raise SystemExit(f"the checkers found different states: {states}")
        print(f"{'checker':8} {'processes':>9} {'states':>9} {'transitions':>12} {'time':>8} "
              f"{'states/s':>9} {'per process':>12} {'new/old':>8}")  # fmt: skip
        for (label, jobs), runs in table.items():
            ratio = runs.rate / table[("old", jobs)].rate
            print(f"{label:8} {jobs:>9} {runs.states:>9,} {runs.transitions:>12,} {runs.median:>7.1f}s "
                  f"{runs.rate:>9,.0f} {runs.rate / jobs:>12,.0f} {ratio:>8.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
