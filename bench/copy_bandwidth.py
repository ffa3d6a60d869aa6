"""Copy cost of the bridge against raw tinygrad and numpy, measured in one run.

For each size: host->device through `Bridge.host_to_device(sync=True)` (ring
reservation and release included, as a worker pays them), through tinygrad's
raw `allocator._copyin`, and a numpy memcpy of the same bytes. Reports µs per
call, GB/s, and the ratios bridge/raw and bridge/numpy. A benchmark, not a
test: run it on a quiet machine.

    python bench/copy_bandwidth.py [--device CPU] [--sizes 64,1048576] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np

from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec
from devbridge.backends import tinygrad_compat as tg
from devbridge.backends.tinygrad import TinygradBackend


def best_of(fn: Callable[[], None], calls: int, repeats: int = 5) -> float:
    """Seconds per call, best of `repeats` runs of `calls` calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def measure(device: str, nbytes: int) -> dict[str, float]:
    calls = max(20, min(20000, (256 << 20) // max(nbytes, 1) // 8))
    payload = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)

    buf = tg.allocate(device, nbytes)
    src = memoryview(bytearray(payload.tobytes()))
    raw = best_of(lambda: buf.allocator._copyin(buf._buf, src), calls)

    dst = np.empty_like(payload)
    numpy = best_of(lambda: np.copyto(dst, payload), calls)

    bridge = Bridge(TinygradBackend(device))
    ring = HostRing(max(4 * nbytes, 1 << 16))
    handle = bridge.alloc_device(ObjectSpec("bench", "uint8"), nbytes)
    target = DeviceRange(handle, 0, nbytes)

    def via_bridge() -> None:
        r = ring.reserve(nbytes)
        bridge.host_to_device(r, target)

    bridged = best_of(via_bridge, calls)
    return {
        "bytes": nbytes,
        "bridge_us": bridged * 1e6,
        "raw_tinygrad_us": raw * 1e6,
        "numpy_us": numpy * 1e6,
        "bridge_GBps": nbytes / bridged / 1e9,
        "numpy_GBps": nbytes / numpy / 1e9,
        "ratio_vs_raw": bridged / raw,
        "bandwidth_vs_numpy": numpy / bridged,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="CPU")
    parser.add_argument("--sizes", default="64,4096,65536,1048576,16777216")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(args.device, int(s)) for s in args.sizes.split(",")]
    if args.json:
        print(json.dumps({"device": args.device, "rows": rows}))
        return
    print(f"host->device on {args.device}")
    print(
        f"{'bytes':>10} {'bridge µs':>10} {'raw µs':>9} {'numpy µs':>9} {'bridge/raw':>10} {'GB/s':>7} {'vs numpy':>8}"
    )
    for r in rows:
        print(
            f"{r['bytes']:>10} {r['bridge_us']:>10.2f} {r['raw_tinygrad_us']:>9.2f} {r['numpy_us']:>9.2f} "
            f"{r['ratio_vs_raw']:>10.2f} {r['bridge_GBps']:>7.2f} {r['bandwidth_vs_numpy']:>8.2f}"
        )


if __name__ == "__main__":
    main()
