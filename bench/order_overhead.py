"""The per-call cost of a copy that conflicts with nothing, before and after a change.

Builds the bridge of an older revision (`--old`, a git revision; default HEAD,
the last commit) as a package `devbridge_old` in a temp dir, next to the
current `devbridge`, and times both in one process on tinygrad's CPU device:

* sync: `Bridge.host_to_device(sync=True)` (ring reservation and release
  included, as in bench/copy_bandwidth.py) against tinygrad's raw
  `allocator._copyin`, per size;
* async: `host_to_device(sync=False)` into an allocation with nothing else in
  flight, then `.wait()`, old against new (64 B);
* traced: the new bridge with a trace on (`Bridge(trace=...)`, to a file) against
  the same bridge with it off, sync and async (64 B): what tracing costs per call.

Rounds interleave the variants (the order rotates each round); each variant's
figure is the median over rounds of µs per call, and `paired` is the median of
the per-round ratios. A benchmark, not a test: run it on a quiet machine.

    python bench/order_overhead.py [--old REV] [--sizes 64,1048576] [--rounds 41] [--block-ms 50]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import devbridge
from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec
from devbridge.backends import tinygrad_compat as tg
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.checkout import script

DEVICE = "CPU"


@dataclass(frozen=True)
class Version:
    """One bridge implementation: the classes a benchmark needs, from `devbridge` or `devbridge_old`."""

    label: str
    bridge: Any  # Bridge class
    ring: Any  # HostRing class
    backend: Any  # TinygradBackend class
    device_range: Any  # DeviceRange class
    object_spec: Any  # ObjectSpec class
    ordered: bool  # whether its lifecycle core tracks hazards (ORDER-1)


# ------------------------------------------------------------ the old revision as `devbridge_old`


def import_old(pkg: Path) -> Version:
    revisions, rest = script("revisions"), ("types", "backends.tinygrad", "statemachine.core")
    try:
        mods = revisions.import_revision(pkg, "bridge.bridge", "ring.host", *rest)
        bridge, ring = mods["bridge.bridge"], mods["ring.host"]
    except ModuleNotFoundError:  # a revision from before the folders were the layers
        mods = revisions.import_revision(pkg, "bridge", "ring", *rest)
        bridge, ring = mods["bridge"], mods["ring"]
    old = Version(
        "old",
        bridge.Bridge,
        ring.HostRing,
        mods["backends.tinygrad"].TinygradBackend,
        mods["types"].DeviceRange,
        mods["types"].ObjectSpec,
        hasattr(mods["statemachine.core"].LifecycleCore, "conflicts"),
    )
    assert old.bridge is not Bridge and old.ring is not HostRing, "devbridge_old must not be the current package"
    return old


def current() -> Version:
    from devbridge.statemachine.core import LifecycleCore

    return Version(
        "new", Bridge, HostRing, TinygradBackend, DeviceRange, ObjectSpec, hasattr(LifecycleCore, "conflicts")
    )


def round_trip(v: Version) -> None:
    """A copy in and back out returns the same bytes (sync and async), or AssertionError."""
    bridge, ring = v.bridge(v.backend(DEVICE)), v.ring(1 << 16)
    handle = bridge.alloc_device(v.object_spec("check", "uint8"), 4096)
    payload = np.random.default_rng(1).integers(0, 255, 4096, dtype=np.uint8).tobytes()
    for sync in (True, False):
        r = ring.reserve(4096)
        ring.view(r)[:] = payload
        bridge.host_to_device(r, v.device_range(handle, 0, 4096), sync=sync).wait()
        out = ring.reserve(4096)
        bridge.device_to_host(v.device_range(handle, 0, 4096), out, sync=sync).wait()
        assert bytes(ring.view(out)) == payload, f"{v.label}: round trip (sync={sync}) lost bytes"
        ring.release(out)
    bridge.free_device(handle)
    bridge.poll()


# ------------------------------------------------------------ timing


def per_call(fn: Callable[[], None], calls: int) -> float:
    """Seconds per call over `calls` calls, the collector off (as timeit does)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls
    finally:
        gc.enable()


def calls_for(fn: Callable[[], None], block_s: float) -> int:
    """Calls per block so that one block takes about `block_s` (warms the variant up, too)."""
    n = 8
    while (t := per_call(fn, n) * n) < block_s / 4 and n < 1_000_000:
        n *= 4
    return max(8, min(1_000_000, round(n * block_s / max(t, 1e-9))))


def interleaved(variants: dict[str, Callable[[], None]], rounds: int, block_s: float) -> dict[str, list[float]]:
    """µs per call of each variant, one figure per round; the order rotates each round."""
    calls = {name: calls_for(fn, block_s) for name, fn in variants.items()}
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(per_call(variants[name], calls[name]) * 1e6)
    return times


def sync_copy(v: Version, nbytes: int, trace: Any = None) -> Callable[[], None]:
    """One synchronous host->device copy through `v`'s bridge, as bench/copy_bandwidth.py does."""
    backend = v.backend(DEVICE)
    bridge = v.bridge(backend) if trace is None else v.bridge(backend, trace=trace)
    ring = v.ring(max(4 * nbytes, 1 << 16))
    target = v.device_range(bridge.alloc_device(v.object_spec("bench", "uint8"), nbytes), 0, nbytes)

    def copy() -> None:
        bridge.host_to_device(ring.reserve(nbytes), target)

    return copy


def async_copy(v: Version, nbytes: int, trace: Any = None) -> Callable[[], None]:
    """An asynchronous host->device copy with nothing else in flight, then its wait."""
    backend = v.backend(DEVICE)
    bridge = v.bridge(backend) if trace is None else v.bridge(backend, trace=trace)
    ring = v.ring(max(4 * nbytes, 1 << 16))
    target = v.device_range(bridge.alloc_device(v.object_spec("bench", "uint8"), nbytes), 0, nbytes)

    def copy() -> None:
        bridge.host_to_device(ring.reserve(nbytes), target, sync=False).wait()

    return copy


def raw_copy(nbytes: int) -> Callable[[], None]:
    buf = tg.allocate(DEVICE, nbytes)
    src = memoryview(bytearray(np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8).tobytes()))

    def copy() -> None:
        buf.allocator._copyin(buf._buf, src)

    return copy


# ------------------------------------------------------------ report


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def paired(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Median and quartiles of the per-round ratios a/b."""
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    q1, q2, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return q2, q1, q3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", default="HEAD", help="git revision to compare against (default HEAD: the last commit)")
    parser.add_argument("--sizes", default="64,1048576", help="sync copy sizes in bytes")
    parser.add_argument("--async-size", type=int, default=64, help="async copy size in bytes")
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--block-ms", type=float, default=50.0, help="time per variant per round")
    args = parser.parse_args()
    block_s = args.block_ms / 1e3

    with tempfile.TemporaryDirectory(prefix="devbridge_old_") as tmp:
        revisions = script("revisions")  # a tool of the checkout: --old needs git
        pkg, rewritten = revisions.build_old(args.old, Path(tmp))
        old, new = import_old(pkg), current()
        for v in (old, new):
            round_trip(v)
        rev = revisions.short_rev(args.old)
        print(f"old: {rev} as {revisions.OLD} ({rewritten} import lines rewritten), ORDER-1 tracking: {old.ordered}")
        print(f"new: working tree {Path(devbridge.__file__).resolve().parent}, ORDER-1 tracking: {new.ordered}")
        print(f"both round-trip; device {DEVICE}, {args.rounds} rounds, ~{args.block_ms:g} ms per variant per round")
        print()
        print("sync host->device, µs per copy (median over rounds); ratios of medians, [paired median (q1-q3)]")
        print(
            f"{'bytes':>8} {'raw':>8} {'old':>8} {'new':>8} {'old/raw':>8} {'new/raw':>8} {'new/old':>8}"
            f"  {'paired new/old':>22}"
        )
        for nbytes in (int(s) for s in args.sizes.split(",")):
            t = interleaved(
                {"raw": raw_copy(nbytes), "old": sync_copy(old, nbytes), "new": sync_copy(new, nbytes)},
                args.rounds,
                block_s,
            )
            raw, o, n = med(t["raw"]), med(t["old"]), med(t["new"])
            p, q1, q3 = paired(t["new"], t["old"])
            print(
                f"{nbytes:>8} {raw:>8.2f} {o:>8.2f} {n:>8.2f} {o / raw:>8.2f} {n / raw:>8.2f} {n / o:>8.3f}"
                f"  {p:>7.3f} ({q1:.3f}-{q3:.3f})"
            )
        print()
        nbytes = args.async_size
        print(f"async host->device + wait, nothing else in flight, {nbytes} B, µs per copy")
        t = interleaved({"old": async_copy(old, nbytes), "new": async_copy(new, nbytes)}, args.rounds, block_s)
        o, n = med(t["old"]), med(t["new"])
        p, q1, q3 = paired(t["new"], t["old"])
        print(f"{'old':>8} {'new':>8} {'new/old':>8}  {'paired new/old':>22}")
        print(f"{o:>8.2f} {n:>8.2f} {n / o:>8.3f}  {p:>7.3f} ({q1:.3f}-{q3:.3f})")
        print()
        print(f"tracing (new bridge, a trace file on / off), {nbytes} B, µs per copy")
        print(f"{'copy':>8} {'off':>8} {'on':>8} {'on/off':>8} {'µs more':>8}")
        with open(Path(tmp) / "trace.json", "w", encoding="utf-8") as out:
            for name, make in (("sync", sync_copy), ("async", async_copy)):
                t = interleaved({"off": make(new, nbytes), "on": make(new, nbytes, out)}, args.rounds, block_s)
                off, on = med(t["off"]), med(t["on"])
                print(f"{name:>8} {off:>8.2f} {on:>8.2f} {on / off:>8.3f} {on - off:>8.2f}")


if __name__ == "__main__":
    main()
