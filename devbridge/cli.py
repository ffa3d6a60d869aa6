"""The `devbridge` command line (also `python -m devbridge`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devbridge", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    example = commands.add_parser("example", help="run the bridge round trip (fake backend by default)")
    example.add_argument("--backend", choices=("fake", "tinygrad"), default="fake")
    example.add_argument("--device", default=None, help="tinygrad device (default: tinygrad's default)")
    example.add_argument("--objects", type=int, default=16)
    example.add_argument("--floats", type=int, default=1024, help="float32 values per object")
    example.add_argument("--seed", type=int, default=0)
    example.add_argument("--json", action="store_true", help="print the report as JSON")
    commands.add_parser(
        "docs", help="write spec/CONTRACT.md from the spec (--check, --svg; see docs -h)", add_help=False
    )
    check = commands.add_parser("check", help="exhaustive bounded model check of the implementation")
    for name, default, meaning in (
        ("allocations", 2, "successful allocations"),
        ("restarts", 2, "restarts"),
        ("faults", 1, "injected failures per path"),
        ("in-flight", 3, "uses in flight per allocation"),
        ("depth", 6, "actions per path"),
    ):  # the defaults are models.checker.Bound's (a test holds them equal)
        check.add_argument(f"--{name}", type=int, default=default, help=f"{meaning} (default {default})")
    check.add_argument("--no-progress", action="store_true", help="no progress bar")
    check.add_argument("--test-out", default=None, help="write the counterexample test to this file")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["docs"]:
        from devbridge.docs import main as docs_main

        return docs_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "check":
        return run_check(args)

    from devbridge.example import run_example

    report = run_example(args.objects, args.floats, args.seed, args.backend, args.device)
    if args.json:
        print(json.dumps(asdict(report)))
    else:
        print(
            f"objects {report.objects}  verified {report.verified}  lost {report.lost}\n"
            f"bytes in {report.bytes_in}  bytes out {report.bytes_out}  deferred frees {report.deferred_frees}\n"
            f"calls {report.calls}\n"
            f"at the end: live allocations {report.live_allocations}, "
            f"unreleased host bytes {report.unreleased_host_bytes}\n"
            f"{report.seconds:.2f} s"
        )
    clean = report.lost == report.live_allocations == report.unreleased_host_bytes == 0
    return 0 if clean else 1


def run_check(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from devbridge.models.checker import Bound, check, describe

    bound = Bound(args.allocations, args.restarts, args.faults, args.in_flight, args.depth)
    with tqdm(desc="states", unit=" states", disable=args.no_progress, leave=False) as bar:

        def progress(states: int, transitions: int, depth: int) -> None:
            bar.n = states
            bar.set_postfix(transitions=transitions, depth=depth, refresh=False)
            bar.update(0)

        report = check(bound, progress)
    print(report.summary())
    if report.violation is None:
        missing = report.coverage.missing()
        if missing:
            print("spec candidates outside this bound:\n  " + "\n  ".join(missing))
        return 0
    print(f"\nshortest counterexample ({len(report.violation.path)} steps): {describe(report.violation.path)}")
    print(report.violation.error)
    if args.test_out:
        with open(args.test_out, "w") as f:
            f.write(report.violation.test_source)
        print(f"wrote {args.test_out}")
    else:
        print("\n" + report.violation.test_source)
    return 1


if __name__ == "__main__":
    sys.exit(main())
