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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["docs"]:
        from devbridge.docs import main as docs_main

        return docs_main(argv[1:])
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    sys.exit(main())
