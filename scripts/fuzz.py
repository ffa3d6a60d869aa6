"""Run the hostile-API fuzzer (tests/model/fuzz.py) for as long as asked, randomized, on the fake or
tinygrad's CPU device. Any exception but a BridgeError, or a hang, fails it with Hypothesis'
shortest reproduction; otherwise it prints how many sequences and calls it made.

    scripts/fuzz --minutes 10                 # the fake
    scripts/fuzz --minutes 10 --backend cpu   # TinygradBackend("CPU")
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "model"), str(ROOT / "tests")]  # the fuzzer and its helpers

from fuzz import APIFuzz, TinygradCPUFuzz  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--backend", choices=["fake", "cpu"], default="fake")
    parser.add_argument("--steps", type=int, default=50, help="calls per sequence (default 50)")
    args = parser.parse_args(argv)
    machine = APIFuzz if args.backend == "fake" else TinygradCPUFuzz
    run = settings(
        max_examples=100,
        stateful_step_count=args.steps,
        derandomize=False,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    quiet = logging.getLogger("devbridge")  # PIN-1 warnings (pending_warning_s=0) run, unprinted
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    started = time.monotonic()
    while time.monotonic() - started < 60 * args.minutes:
        run_state_machine_as_test(machine, settings=run)
    minutes = (time.monotonic() - started) / 60
    print(f"{args.backend}: {APIFuzz.runs:,} sequences, {APIFuzz.calls_made:,} calls in {minutes:.1f} min; "
          "nothing but BridgeError escaped")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
