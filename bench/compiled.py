"""The bridge's per-call path compiled with mypyc, against the same code in pure Python.

Copies the installed package to a temporary folder twice, makes in both the few changes mypyc
needs (below), compiles the per-call path of one copy with mypyc (the core, the engine, the
events, the staging buffers), then measures each copy in fresh processes, alternating (pure,
compiled, compiled, pure per round), the per-call figures of `devbridge bench` on tinygrad's
CPU device: a 64 B and a 1 MiB sync `host_to_device` (with its ring reservation), the same
on a backend that does nothing, and `alloc_device` + `free_device` of 1 MiB; beside each,
tinygrad's raw `_copyin` and `Buffer.allocate` + `deallocate`. Each process times every
figure in turn, five times over, and keeps each one's best; the ratios of the bridge's figures
to raw ones are taken within a process (raw is the same code in both), then their medians
over the processes.

What mypyc needs, and so what the copies change:

- `statemachine/records.py`: `InvariantViolation` (an `AssertionError`) is a non-native class,
  and the record fields typed `object` are typed `Any` (a compiled dataclass cannot resolve
  the annotation `object`).

`ring/host.py` and `types.py` stay interpreted: their frozen ranges are built without their checks
by `object.__new__` on the hot path, which a native class refuses.

Needs a C compiler (clang or gcc) and mypy (the `dev` extra).

    python bench/compiled.py [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

#: The per-call path mypyc compiles, relative to the package.
COMPILED = (
    "statemachine/records.py",
    "statemachine/ledger.py",
    "statemachine/core.py",
    "statemachine/machine.py",
    "statemachine/runner.py",
    "bridge/engine.py",
    "bridge/events.py",
    "ring/buffers.py",
    "bridge/transfer.py",
)

#: (file, text, replacement): what mypyc needs changed (each text must be found exactly once).
CHANGES = (
    (
        "statemachine/records.py",
        "class InvariantViolation(AssertionError):",
        "from mypy_extensions import mypyc_attr\n\n\n@mypyc_attr(native_class=False)\n"
        "class InvariantViolation(AssertionError):",
    ),
    ("statemachine/records.py", "    memory: object  #", "    memory: Any  #"),
    ("statemachine/records.py", "    handle: object = None  #", "    handle: Any = None  #"),
)

FIGURES = (
    "sync host_to_device 64 B",
    "raw _copyin 64 B",
    "sync host_to_device 64 B, null backend",
    "sync host_to_device 1 MiB",
    "raw _copyin 1 MiB",
    "alloc_device + free_device 1 MiB",
    "alloc + free 1 MiB, null backend",
    "raw allocate + deallocate 1 MiB",
)


#: (key, what, bridge figure, raw figure): the ratios taken within each process, where the
#: machine's speed at the time is the same for both; a goal's key is its bound's row
RATIOS = (
    ("own copy", "the bridge's own copy work / raw _copyin 64 B", "sync host_to_device 64 B, null backend",
     "raw _copyin 64 B"),
    ("own alloc + free", "its own alloc + free work / raw allocate + deallocate", "alloc + free 1 MiB, null backend",
     "raw allocate + deallocate 1 MiB"),
    ("64 B", "goal: sync 64 B / raw _copyin (<= 0.75)", "sync host_to_device 64 B", "raw _copyin 64 B"),
    ("1 MiB", "goal: sync 1 MiB / raw _copyin (<= 1.0)", "sync host_to_device 1 MiB", "raw _copyin 1 MiB"),
    ("alloc + free", "goal: alloc + free / raw (<= 1.2)", "alloc_device + free_device 1 MiB",
     "raw allocate + deallocate 1 MiB"),
)  # fmt: skip
PASSES = 5


def package_copy(root: Path) -> Path:
    """The installed package copied under `root` with CHANGES made; the folder to put on the path."""
    import devbridge

    shutil.copytree(Path(devbridge.__file__).parent, root / "devbridge", ignore=shutil.ignore_patterns("__pycache__"))
    for name, old, new in CHANGES:
        path = root / "devbridge" / name
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"bench/compiled.py: {name} no longer has the text it changes: {old!r}")
        path.write_text(text.replace(old, new))
    return root


def compile_path(root: Path) -> None:
    mypyc = Path(sys.executable).with_name("mypyc")
    env = dict(os.environ)
    if "CC" not in env and shutil.which("gcc") is None and shutil.which("clang") is not None:
        env["CC"] = "clang"  # the C compiler tinygrad's CPU device already needs
    run = subprocess.run(
        [str(mypyc), *(f"devbridge/{name}" for name in COMPILED)], cwd=root, capture_output=True, text=True, env=env
    )
    if run.returncode != 0:
        raise SystemExit(f"mypyc failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}")


def measure() -> dict[str, float]:
    """Microseconds per call of each of FIGURES, in this process: the best of PASSES passes, each
    pass timing every figure once."""
    from devbridge import Bridge
    from devbridge.backends import tinygrad_compat as tg
    from devbridge.backends.tinygrad import TinygradBackend
    from devbridge.bench import scaling
    from devbridge.bench.suite import SPEC, CopyBench, per_call

    small, large, null = CopyBench("CPU", 64), CopyBench("CPU", 1 << 20), scaling.Setup(10)
    bridge, nothing = Bridge(TinygradBackend("CPU")), Bridge(scaling.NullBackend())

    def alloc_free(b: Bridge) -> Callable[[], None]:
        return lambda: b.free_device(b.alloc_device(SPEC, 1 << 20))

    def raw_alloc() -> None:
        tg.allocate("CPU", 1 << 20).deallocate()  # type: ignore[no-untyped-call]

    calls: tuple[tuple[Callable[[], None], int], ...] = (
        (small.sync, 20000),
        (small.raw, 20000),
        (null.copy, 20000),
        (large.sync, 2000),
        (large.raw, 2000),
        (alloc_free(bridge), 5000),
        (alloc_free(nothing), 5000),
        (raw_alloc, 5000),
    )

    for fn, n in calls:
        per_call(fn, n // 10)  # warm-up
    passes = [[per_call(fn, n) for fn, n in calls] for _ in range(PASSES)]  # interleaved: drift hits all alike
    figures = {name: min(p[i] for p in passes) * 1e6 for i, name in enumerate(FIGURES)}
    small.check()  # the copies landed
    large.check()
    import devbridge.bridge.engine

    figures["compiled"] = float(not devbridge.bridge.engine.__file__.endswith(".py"))
    return figures


def run_copy(root: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--measure"], env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    figures: dict[str, float] = json.loads(out.stdout.splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the medians as JSON")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure()))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        pure, compiled = package_copy(Path(tmp) / "pure"), package_copy(Path(tmp) / "compiled")
        compile_path(compiled)
        runs: dict[str, list[dict[str, float]]] = {"pure": [], "compiled": []}
        for _ in range(args.rounds):
            for name in ("pure", "compiled", "compiled", "pure"):
                runs[name].append(run_copy(pure if name == "pure" else compiled))
    assert all(r["compiled"] == 0 for r in runs["pure"]) and all(r["compiled"] == 1 for r in runs["compiled"])
    medians = {k: {f: statistics.median(r[f] for r in rs) for f in FIGURES} for k, rs in runs.items()}
    ratios = {
        k: {key: statistics.median(r[bridge] / r[raw] for r in rs) for key, _, bridge, raw in RATIOS}
        for k, rs in runs.items()
    }
    if args.json:
        print(json.dumps({"rounds": args.rounds, **medians, "ratios": ratios}))
        return 0
    p, c = medians["pure"], medians["compiled"]
    print(f"mypyc-compiled per-call path against pure Python: medians of {2 * args.rounds} processes each")
    print(f"{'µs per call':<56} {'pure':>8} {'compiled':>9}")
    for f in FIGURES:
        print(f"{f:<56} {p[f]:8.2f} {c[f]:9.2f}")
    print(f"{'ratio, within each process':<56} {'pure':>8} {'compiled':>9}")
    for key, what, _, _ in RATIOS:
        print(f"{what:<56} {ratios['pure'][key]:8.2f} {ratios['compiled'][key]:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
