"""`devbridge bench` runs every row of the speed goals (a smoke run: it checks rows, never times)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from devbridge.backends.tinygrad import TinygradBackend
from devbridge.bench import checker_speed
from devbridge.bench.suite import Row
from devbridge.checkout import script
from devbridge.cli.main import main

REVISIONS = script("revisions")  # the checkout's revision builder (bench --old)


def test_devbridge_bench_reports_every_goal_as_bridge_beside_raw(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--rounds", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "CPU" and report["rounds"] == 2
    cl = TinygradBackend("CL").unusable() is None  # where OpenCL opens (pocl, in CI)
    paths = [row["path"] for row in report["rows"]]
    assert paths == [
        "sync host_to_device 64 B / raw _copyin",
        "  the bridge's share of 64 B alone (a backend that does nothing) / raw _copyin 64 B",
        "sync host_to_device 1 MiB / raw _copyin",
        "sync host_to_device 16 MiB / raw _copyin",
        "async host_to_device 64 B + wait() / sync 64 B",
        "alloc_device + free_device 1 MiB / raw Buffer allocate + deallocate",
        "  the bridge's share alone (a backend that does nothing) / raw allocate + deallocate",
        "per-op cost (reserve + sync copy, null backend) at 10,000 live / at 10 live",
        "bookkeeping per live allocation / 1 KiB",
        "reference worker --batch 8 / the user's tinygrad pipeline (100 objects, objects/s)",
        "  reference worker --batch 1 (an object per upload, compute, download) / the same",
        "  reference worker --batch 8 / the user's pipeline, 8 objects per call",
        "  reference worker --batch 1 / the pipeline passing all six tensors to TinyJit",
        "reference worker as a process, --batch 1 / the user's pipeline (a producer and a collector process beside it)",
        "reference worker as a process, --batch 8 / the user's pipeline, 8 objects per call",
    ] + (
        [
            "reference worker --batch 8 on CL / the user's tinygrad pipeline on CL (50 objects)",
            "reference worker --batch 8 on CL, 16 objects of 1 MiB / serial (each step waited for)",
            "  reference worker --batch 1 on CL, the same objects / the same",
            "  upload time saved (serial - worker, ms per object) / uploads alone: the overlap",
        ]
        if cl
        else []
    ) + [
        "a record through a shared ring (producer process) 64 B / in-process ring (thread)",
        "a record through a shared ring (producer process) 64 KiB / in-process ring (thread)",
        "a record through a shared ring (producer process) 1 MiB / in-process ring (thread)",
        "two producer processes making objects with numpy / two producer threads",
        "take's wake-up after a commit in another process, median / 100 µs",
        "  the same, 99th percentile / 100 µs",
        "sync host_to_device 64 B, host bytes checked / unchecked",
        "sync host_to_device 64 KiB, host bytes checked / unchecked",
        "sync host_to_device 1 MiB, host bytes checked / unchecked",
        "sync host_to_device 16 MiB, host bytes checked / unchecked",
    ]
    keys = {row["key"]: row["path"].strip() for row in report["rows"] if row["key"]}  # what the page reads
    assert keys == {
        "sync copy 64 B": "sync host_to_device 64 B / raw _copyin",
        "own copy work": "the bridge's share of 64 B alone (a backend that does nothing) / raw _copyin 64 B",
        "sync copy 1 MiB": "sync host_to_device 1 MiB / raw _copyin",
        "sync copy 16 MiB": "sync host_to_device 16 MiB / raw _copyin",
        "alloc + free": "alloc_device + free_device 1 MiB / raw Buffer allocate + deallocate",
        "own alloc + free work": "the bridge's share alone (a backend that does nothing) / raw allocate + deallocate",
        "process worker 1": (
            "reference worker as a process, --batch 1 / the user's pipeline (a producer and a collector process "
            "beside it)"
        ),
        "process worker 8": "reference worker as a process, --batch 8 / the user's pipeline, 8 objects per call",
    } | (
        {
            "CL worker / serial": (
                "reference worker --batch 8 on CL, 16 objects of 1 MiB / serial (each step waited for)"
            ),
            "CL worker --batch 1 / serial": "reference worker --batch 1 on CL, the same objects / the same",
            "CL overlap": "upload time saved (serial - worker, ms per object) / uploads alone: the overlap",
        }
        if cl
        else {}
    ) | {
        "shared ring 64 B": "a record through a shared ring (producer process) 64 B / in-process ring (thread)",
        "shared ring 64 KiB": "a record through a shared ring (producer process) 64 KiB / in-process ring (thread)",
        "shared ring 1 MiB": "a record through a shared ring (producer process) 1 MiB / in-process ring (thread)",
        "producer processes / threads": "two producer processes making objects with numpy / two producer threads",
    } | {
        f"checked {size}": f"sync host_to_device {size}, host bytes checked / unchecked"
        for size in ("64 B", "64 KiB", "1 MiB", "16 MiB")
    }
    fixed = ("bookkeeping", "  upload time saved", "take's wake-up", "  the same, 99th")  # one figure against a bound
    measured = [row for row in report["rows"] if not row["path"].startswith(fixed)]
    wake_up = [row for row in report["rows"] if row["path"].startswith(fixed[2:])]
    for row in wake_up:  # microseconds against the 100 µs budget
        assert row["unit"] == "µs" and row["raw"] == 100.0 and row["rounds"] == [[row["bridge"], 100.0]]
    assert 0 < wake_up[0]["bridge"] <= wake_up[1]["bridge"]  # the median, then the 99th percentile
    for row in measured:  # two rounds of (bridge, raw), their medians and the medians' ratio
        assert len(row["rounds"]) == 2 and all(b > 0 and r > 0 for b, r in row["rounds"])
        assert row["bridge"] == pytest.approx(sum(b for b, _ in row["rounds"]) / 2)
        assert row["ratio"] == pytest.approx(row["bridge"] / row["raw"])
    for parts in (report["profile"]["parts"], report["profile"]["process_parts"]):  # where the time goes
        assert {"the bridge", "the worker's loop", "rings"} <= set(parts)
        assert all(p["worker"] >= 0 and p["user"] >= 0 for p in parts.values())


@pytest.mark.parametrize(("ratio", "goal", "met"), [(1.0, "<= 1.0", True), (1.01, "<= 1.0", False),
                                                    (0.8, ">= 0.8", True), (0.79, ">= 0.8", False)])  # fmt: skip
def test_a_row_meets_its_goal_by_the_goals_own_bound(ratio: float, goal: str, met: bool) -> None:
    assert Row("p", ratio, 1.0, "µs", ratio, goal, []).met is met
    assert Row("p", ratio, 1.0, "µs", ratio, "", []).met is None  # a row that explains another


def test_bench_refuses_a_round_count_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "--rounds", "0"])
    assert e.value.code == 2 and "--rounds must be at least 1" in capsys.readouterr().err


def test_the_devices_benchmark_runs_one_device_beside_two(capsys: pytest.CaptureFixture[str]) -> None:
    from devbridge.bench import devices

    assert devices.main(["--objects", "20", "--rounds", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["objects"], report["rounds"], report["devices"]["devices"]) == (20, 1, ["CPU:0", "CPU:1"])
    assert report["one_device"]["objects_per_s"] > 0 and report["devices"]["objects_per_s"] > 0
    assert report["ratio"] == report["devices"]["objects_per_s"] / report["one_device"]["objects_per_s"]


def test_the_fleet_benchmark_runs_one_actor_beside_two(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray", reason="the fleet's benchmark needs the ray extra: pip install 'devbridge[ray]'")
    from devbridge.bench import fleet

    assert fleet.main(["--objects", "20", "--batch", "10", "--rounds", "1", "--backend", "fake", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["objects"], report["batch"], report["rounds"], report["backend"]) == (20, 10, 1, "fake")
    assert report["one_actor"]["objects_per_s"] > 0 and report["two_actors"]["objects_per_s"] > 0
    assert report["ratio"] == report["two_actors"]["objects_per_s"] / report["one_actor"]["objects_per_s"]


def test_the_checker_benchmark_runs_an_older_checker_beside_this_one(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/checker_speed.py builds a revision as `devbridge_old` and times both checkers on the same
    bound (a smoke run at depth 3 against HEAD, which a clean clone always has)."""
    checker_speed.main(["--old", "HEAD", "--depth", "3", "--rounds", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("old: ") and lines[0].endswith(" as devbridge_old; new: this tree. Default bound, "
                                                              "depth 3, 1 rounds of old, new, new, old")  # fmt: skip
    rows = [line.split() for line in lines[2:]]
    assert [r[:3] for r in rows] == [[label, jobs, "373"] for jobs in ("1", "2") for label in ("old", "new")]
    assert [r[-1] for r in rows if r[0] == "old"] == ["1.00", "1.00"]


def test_a_revision_built_after_another_is_imported_from_its_own_folder(tmp_path: Path) -> None:
    """Two benchmarks in one process (the checker's, then the queue's) each build a revision: the
    second's modules come from its own folder, not from the first's, which is gone by then."""
    first, _ = REVISIONS.build_old("HEAD", tmp_path / "first")
    assert REVISIONS.import_revision(first, "types")["types"].__file__.startswith(str(first))
    shutil.rmtree(tmp_path / "first")
    second, _ = REVISIONS.build_old("HEAD", tmp_path / "second")
    got = REVISIONS.import_revision(second, "types", "backends.tinygrad")
    assert {name: m.__file__.startswith(str(second)) for name, m in got.items()} == {
        "types": True,
        "backends.tinygrad": True,
    }
    assert str(first) not in sys.path and sys.modules[f"{REVISIONS.OLD}.types"] is got["types"]


def test_the_queue_latency_benchmark_runs_a_revision_beside_this_one(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/queue_latency.py on CL with work queued ahead, HEAD beside this tree (a smoke run: it
    checks rows, never times): every call returns with its event still pending on the busy queue."""
    from harness import DEVICES

    from devbridge.bench import queue_latency

    if "CL" not in DEVICES:
        pytest.skip("no OpenCL device")
    queue_latency.main(["--device", "CL", "--busy", "0.2", "--rounds", "1", "--before", "HEAD", "--json"])
    got = json.loads(capsys.readouterr().out)
    steps = [
        "queue the work", "async host_to_device", "done() while pending", "with compute() block",
        "free_device (copy in flight)", "restart (copy in flight)", "pending after the calls", "drain the queue",
        "sync host_to_device (queue ahead)",
    ]  # fmt: skip
    assert list(got["median_s"]) == ["now", "before"] and got["before"] == REVISIONS.short_rev("HEAD")
    assert [list(steps_of) for steps_of in got["median_s"].values()] == [steps, steps]
    assert got["median_s"]["now"]["pending after the calls"] == 3


def test_reserve_wait_bench_runs_and_reports_wake_up_and_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/reserve_wait.py: a smoke run (its figures are the benchmark's, not a test's)."""
    from devbridge.bench import reserve_wait

    assert reserve_wait.main(["--rounds", "3", "--hold-ms", "5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(report) == ["cpu_share_max", "cpu_share_median", "hold_ms", "rounds", "wake_ms_median", "wake_ms_p90"]
    assert report["rounds"] == 3 and 0 <= report["wake_ms_median"] <= report["wake_ms_p90"]


def test_the_compiled_benchmark_makes_its_changes_in_a_copy_of_the_package(tmp_path: Path) -> None:
    """bench/compiled.py's changes for mypyc still find their text (once each) in the package,
    and land in the copy only."""
    import devbridge
    from devbridge.bench import compiled

    root = compiled.package_copy(tmp_path)
    for name, old, new in compiled.CHANGES:
        copied = (root / "devbridge" / name).read_text()
        assert new in copied and (not new or old not in copied.replace(new, ""))
        assert old in (Path(devbridge.__file__).parent / name).read_text()  # the package itself unchanged
    assert "def __getattr__" not in (root / "devbridge" / "statemachine" / "machine.py").read_text()
    assert all((root / "devbridge" / name).is_file() for name in compiled.COMPILED)
