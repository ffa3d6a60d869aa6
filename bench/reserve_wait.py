"""A blocking `HostRing.reserve(nbytes, timeout=...)`: how soon it wakes after a release, and
what it costs while it waits.

A consumer thread holds the ring full, sleeps for `--hold-ms`, then releases; the producer
(this thread) is blocked in `reserve` meanwhile. Per round: the wake-up latency (from just
before the release to the producer's return, on one clock), and the producer's CPU time while
it waited (its thread's CPU clock), as a share of the wait. Goals: wakes within 1 ms (median),
under 5% of a core while waiting. A benchmark, not a test: run it on a quiet machine.

    python bench/reserve_wait.py [--rounds 50] [--hold-ms 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from devbridge import HostRing


def one_round(hold_s: float) -> tuple[float, float]:
    """(seconds from the release to the waiter's return, the waiter's CPU share while blocked)."""
    ring = HostRing(4096)
    full = ring.reserve(4096)
    released_at: list[float] = []

    def consumer() -> None:
        time.sleep(hold_s)
        released_at.append(time.perf_counter())
        ring.release(full)

    thread = threading.Thread(target=consumer)
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    thread.start()
    ring.reserve(1024, timeout=None)
    woke, cpu1 = time.perf_counter(), time.thread_time()
    thread.join()
    return woke - released_at[0], (cpu1 - cpu0) / (woke - wall0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--hold-ms", type=float, default=20.0, help="how long the ring stays full per round")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.hold_ms <= 0:
        parser.error("--rounds must be at least 1 and --hold-ms positive")
    rounds = [one_round(args.hold_ms / 1e3) for _ in range(args.rounds)]
    wake = sorted(w for w, _ in rounds)
    cpu = sorted(c for _, c in rounds)
    report = {
        "rounds": args.rounds,
        "hold_ms": args.hold_ms,
        "wake_ms_median": statistics.median(wake) * 1e3,
        "wake_ms_p90": wake[int(0.9 * (len(wake) - 1))] * 1e3,
        "cpu_share_median": statistics.median(cpu),
        "cpu_share_max": cpu[-1],
    }
    if args.json:
        print(json.dumps(report))
        return 0
    met_wake, met_cpu = report["wake_ms_median"] <= 1.0, report["cpu_share_median"] < 0.05
    print(f"blocking reserve, {args.rounds} rounds, ring full for {args.hold_ms:g} ms each")
    print(
        f"  wakes after a release: median {report['wake_ms_median']:.3f} ms, p90 {report['wake_ms_p90']:.3f} ms"
        f"  (goal <= 1 ms: {'met' if met_wake else 'not met'})"
    )
    print(
        f"  CPU while blocked: median {report['cpu_share_median']:.2%} of a core, max {report['cpu_share_max']:.2%}"
        f"  (goal < 5%: {'met' if met_cpu else 'not met'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
