"""Bridge bookkeeping per live allocation, and per-call cost against the number of live allocations.

Uses a backend that does nothing, so only the bridge is measured. DESIGN's targets:
at most 1 KiB of bookkeeping per live allocation, and a per-call cost flat in the
number of live allocations (100k vs 10: at most 1.2x). A benchmark, not a test.

    python bench/scaling.py [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec
from devbridge.statemachine.status import OK, Status

SPEC = ObjectSpec("x", "uint8")


class NullBackend:
    """Device work that costs nothing: every event is done at once."""

    name = "null"

    def begin_generation(self, generation: int) -> None: ...
    def alloc(self, nbytes: int, dtype: str) -> object:
        return nbytes

    def free(self, buffer: object) -> None: ...
    def copy_in(self, buffer: object, offset: int, src: memoryview, *, sync: bool) -> object:
        return OK

    def copy_out(self, dst: memoryview, buffer: object, offset: int, *, sync: bool) -> object:
        return OK

    def compute(self, buffers: Sequence[object]) -> object:
        return OK

    def extend(self, token: object) -> None: ...
    def view(self, buffer: object, offset: int, shape: tuple[int, ...], dtype: str) -> Any:
        raise NotImplementedError

    def view_anchor(self, view: Any) -> object:
        raise NotImplementedError

    def view_alignment(self, dtype: str) -> int:
        return 16

    def query(self, token: object) -> Status:
        return OK

    def wait(self, token: object, timeout: float | None) -> bool:
        return True

    def subscribe(self, callback: Callable[[object], None]) -> bool:
        return False


def bytes_per_allocation(n: int) -> float:
    bridge = Bridge(NullBackend())
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    handles = [bridge.alloc_device(SPEC, 64) for _ in range(n)]
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(handles) == n
    return (after - before) / n


class Setup:
    """A bridge on the null backend with `live` other allocations alive, and one to copy into."""

    def __init__(self, live: int) -> None:
        self.bridge, self.ring = Bridge(NullBackend()), HostRing(1 << 20)
        self.keep = [self.bridge.alloc_device(SPEC, 64) for _ in range(live)]
        self.target = DeviceRange(self.bridge.alloc_device(SPEC, 64), 0, 64)

    def copy(self) -> None:
        """One reserve + synchronous host_to_device (the ring's release included)."""
        self.bridge.host_to_device(self.ring.reserve(64), self.target)


def call_cost(live: int, calls: int = 20000) -> float:
    """Seconds per reserve + sync host_to_device with `live` other allocations alive (best of 5)."""
    setup = Setup(live)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            setup.copy()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    per_alloc = bytes_per_allocation(100_000)
    small, large = call_cost(10), call_cost(100_000)
    result = {
        "bytes_per_live_allocation": round(per_alloc),
        "call_us_10_live": small * 1e6,
        "call_us_100k_live": large * 1e6,
        "ratio_100k_vs_10": large / small,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"bookkeeping per live allocation (handle included): {per_alloc:.0f} B")
        print(
            f"reserve + sync host_to_device: {small * 1e6:.2f} µs with 10 live, {large * 1e6:.2f} µs with 100k live "
            f"(ratio {large / small:.2f})"
        )


if __name__ == "__main__":
    main()
