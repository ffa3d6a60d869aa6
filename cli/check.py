"""`devbridge check`: the two model checkers (devbridge.models) run under the bound the
arguments choose, their reports printed, and a counterexample written as a runnable test."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from devbridge.cli.args import progress_bar, usage_error


def run_check(args: argparse.Namespace) -> int:
    from devbridge.models.checker import PROFILES

    if args.tier == "ring":
        return 0 if check_ring_protocol(args) else 1
    fields = ("allocations", "restarts", "faults", "in_flight", "depth", "tensors", "ring", "spans")
    chosen = {k: getattr(args, k) for k in fields if getattr(args, k) is not None}
    if args.values_depth is not None:
        chosen["values_depth"] = None if args.values_depth == "all" else args.values_depth
    if args.in_order:
        chosen["in_order"] = True
    try:
        bound = replace(PROFILES[args.profile], **chosen)
    except ValueError as e:
        return usage_error("check", str(e))
    print(f"bound: {bound}")
    clean = True
    if args.tier in ("both", "values"):
        clean = check_values(args, bound)
    if args.tier in ("both", "lockstep"):
        clean = check_lockstep(args, bound) and clean
    return 0 if clean else 1


def check_ring_protocol(args: argparse.Namespace) -> bool:
    """The shared ring's protocol (models/ring_checker.py) under the chosen bound."""
    from devbridge.models.ring_checker import RING_PROFILES, check_ring
    from devbridge.spec.ring import load_ring

    bound = RING_PROFILES[args.ring_bound]
    print(f"ring bound: {bound}")
    result = check_ring(bound)
    every = {(t.source, t.event) for t in load_ring().transitions}
    print(
        f"{result.states} states, {result.paths} paths drained, {result.seconds:.1f} s; "
        f"record transitions covered: {len(result.transitions & every)} of {len(every)}"
    )
    if result.violation is not None:
        print(f"\n{result.violation}")
    return result.violation is None


def states_bar(args: argparse.Namespace) -> Any:
    """A progress bar of states explored (only on a terminal), and the callback that moves it."""
    from tqdm import tqdm

    bar = tqdm(desc="states", unit=" states", disable=not progress_bar(args), leave=False)

    def progress(states: int, transitions: int, depth: int) -> None:
        bar.n = states
        bar.set_postfix(transitions=transitions, depth=depth, refresh=False)
        bar.update(0)

    return bar, progress


def check_values(args: argparse.Namespace, bound: Any) -> bool:
    from devbridge.models import sansio

    bar, progress = states_bar(args)
    with bar:
        report = sansio.check(bound, bound.values_depth, jobs=args.jobs, progress=progress)
    print(report.summary())
    if report.violation is not None:
        path = report.violation.path
        print(f"\nshortest counterexample ({len(path)} steps): {sansio.describe(path)}")
        print(f"(ids are the canonical ones of the state each action is taken in)\n{report.violation.error}")
    return report.violation is None


def check_lockstep(args: argparse.Namespace, bound: Any) -> bool:
    from devbridge.models.checker import check, describe

    bar, progress = states_bar(args)
    with bar:
        report = check(bound, progress, jobs=args.jobs)
    print(report.summary())
    if report.violation is None:
        missing = report.coverage.missing()
        if missing:
            print("spec candidates outside this bound:\n  " + "\n  ".join(missing))
        return True
    print(f"\nshortest counterexample ({len(report.violation.path)} steps): {describe(report.violation.path)}")
    print(report.violation.error)
    if args.test_out:
        try:
            with open(args.test_out, "w") as f:
                f.write(report.violation.test_source)
        except OSError as e:
            print(f"devbridge check: cannot write the counterexample test: {e}", file=sys.stderr)
            return False
        print(f"wrote {args.test_out}")
    else:
        print("\n" + report.violation.test_source)
    return False
