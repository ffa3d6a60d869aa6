"""The example: the round trip on the fake backend, the README's quick start, the TinyJit pattern."""

from __future__ import annotations

import json

import pytest
from harness import COMPUTE_DEVICES, DEVICES

from devbridge.apps.example import run_example
from devbridge.cli.main import main

# (backend, device, deferred frees): the fake finishes a download when told, so y is freed while it
# is in flight; CPU and PYTHON finish a copy at submission, so y is idle when it is freed; on CL the
# download runs on the queue and is still there or not when y is freed (None: any of 0..objects)
ROUND_TRIPS = [("fake", None, 3)] + [("tinygrad", d, None if d == "CL" else 0) for d in DEVICES]


@pytest.mark.parametrize(("backend", "device", "deferred"), ROUND_TRIPS, ids=lambda v: str(v))
def test_example_round_trip_verifies_every_object_and_leaves_nothing_behind(
    backend: str, device: str | None, deferred: int | None
) -> None:
    report = run_example(objects=3, floats=64, backend=backend, device=device)
    assert (report.objects, report.verified, report.lost) == (3, 3, 0)
    assert (report.bytes_in, report.bytes_out) == (3 * 256, 3 * 256)
    if deferred is None:
        assert report.deferred_frees in range(4)
    else:
        assert report.deferred_frees == deferred
    assert report.calls == {
        "allocs": 6, "backend_frees": 6, "copies_in": 3, "copies_out": 3, "computes": 3, "views": 6,
    }  # fmt: skip
    assert report.live_allocations == report.unreleased_host_bytes == 0


def test_cli_prints_a_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["example", "--objects", "2", "--floats", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["objects"], report["verified"], report["lost"]) == (2, 2, 0)


def test_readme_usage_block_runs() -> None:
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), namespace)
    bridge = namespace["bridge"]
    assert bridge.stats().backend_frees == 1 and bridge.stats().live_allocations == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(("backend", "device"), COMPUTE_DEVICES, ids=lambda v: str(v))
def test_jit_example_runs_views_as_arguments_and_reports_a_captured_view(
    backend: str, device: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    from devbridge.apps.example import JitReport, run_jit_example

    with caplog.at_level("WARNING", logger="devbridge"):
        report = run_jit_example(steps=4, restart_at=2, backend=backend, device=device)
    assert report == JitReport(
        steps=4,
        verified=4,
        restarts=1,
        live_allocations=0,
        captured_state="free_pending",
        captured_views=1,
        captured_released=True,
    )
    assert [r.getMessage().split(" after ")[0] for r in caplog.records] == [
        "allocation #5 (w, role weights) is free_pending"
    ]


def test_cli_runs_the_jit_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["example", "--jit", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["verified"], report["captured_state"], report["captured_released"]) == (6, "free_pending", True)
