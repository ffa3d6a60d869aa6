"""The bounded model checker: the default bound is clean and covers the spec; every seeded bug
yields a shortest counterexample that, run as a test, fails on the bug and passes on the real code."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from mutants import KILLS, MUTANTS

from devbridge.backends.fake import FakeBackend
from devbridge.cli import main
from devbridge.models.checker import Bound, check, describe, render, replay
from devbridge.statemachine.core import LifecycleCore


def run_source(source: str) -> None:
    namespace: dict[str, object] = {}
    exec(compile(source, "counterexample.py", "exec"), namespace)
    namespace["test_counterexample"]()  # type: ignore[operator]


def test_default_bound_is_explored_with_no_violation_and_covers_the_spec() -> None:
    report = check(Bound())
    assert report.violation is None
    assert report.coverage.missing() == [] and report.coverage.missing_edges() == []
    assert (report.states, report.transitions, report.depth) == (14464, 98667, 6)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_seeded_bug_yields_a_shortest_counterexample_test(name: str) -> None:
    with MUTANTS[name]():
        report = check(Bound(depth=5))
        violation = report.violation
        assert violation is not None, f"{name} not found"
        assert violation.kill in KILLS[name], f"{name} was caught by {violation.kill}, not by {sorted(KILLS[name])}"
        shorter = check(Bound(depth=len(violation.path) - 1))
        assert shorter.violation is None, "breadth first: no shorter counterexample exists"
        with pytest.raises((AssertionError, pytest.fail.Exception)):  # an assertion of the model's answer fails
            run_source(violation.test_source)
    run_source(violation.test_source)  # the same test passes on the real implementation
    print(f"\n{name}: {describe(violation.path)}\n  {violation.error[:120]}")


def test_a_seeded_bug_that_fails_for_another_reason_is_not_counted_as_caught() -> None:
    """view_does_not_pin written with a wrong signature (no **kwargs: the core's begin takes
    keywords) fails every copy with a TypeError. The checker reports that, and it is not the
    bug's kill, so the seeded-bug test above would fail on it."""
    original = LifecycleCore.begin

    def begin(self: LifecycleCore, kind: str, handles: Any) -> Any:
        return original(self, kind, handles)

    with mock.patch.object(LifecycleCore, "begin", begin):
        violation = check(Bound(depth=3)).violation
    assert violation is not None and violation.kill == "TypeError", violation
    assert violation.kill not in KILLS["view_does_not_pin"]


@pytest.mark.parametrize("name", ["missing_raw_edge", "missing_war_edge", "missing_waw_edge"])
def test_a_missing_hazard_edge_is_caught_by_the_issue_order_bytes_alone(name: str) -> None:
    """Without the fake's own ordering check, the model's issue-order bytes still catch each
    missing edge: the device or output bytes differ from a synchronous run's (ORDER-1)."""
    with MUTANTS[name](), mock.patch.object(FakeBackend, "_check_order", lambda self, *a: None):
        violation = check(Bound(depth=5)).violation
    assert violation is not None, f"{name} not found"
    assert violation.kill in ("device-bytes", "host-bytes", "event"), violation.error
    print(f"\n{name}: {describe(violation.path)}\n  {violation.error[:160]}")


def test_a_path_through_every_view_action_renders_a_runnable_test() -> None:
    """Tensors derived every way keep a view in use past the view itself, a free and a restart;
    the release comes with the last one (here failing: reported by that poll). The rendered
    script runs and asserts the model's answer after every step."""
    path = [
        ("alloc", False), ("wrap", 0, 0), ("wrap", 0, 4),  # t0; an unaligned view is refused (VIEW-2)
        ("derive", 0, "reshape"), ("derive", 0, "lazy"), ("derive", 1, "assign"),  # t1, t2, t3
        ("drop", 0), ("free", 0, True), ("drop", 1), ("drop", 2), ("drop", 3),  # FREE-3 from the poll
        ("alloc", False), ("wrap", 1, 0), ("derive", 4, "lazy"), ("drop", 4),  # t4, t5
        ("restart", False), ("drop", 5),  # the stale allocation is released with its last tensor
    ]  # fmt: skip
    s = replay(path)
    s.check()
    assert s.model.frees == [0, 1] and s.model.free_failures == 1 and not s.tensors
    source = render(tuple(path))
    assert "diverged" not in source
    for line in ("t3 = t1.detach().assign(t1 + 0)", "t2 = t0 + 1", "t1 = t0.reshape(1, -1)", "del t3"):
        assert line in source, line
    run_source(source)


def test_cli_reports_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--depth", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"bound: {Bound(depth=3)}" in out  # the CLI's defaults are Bound's
    assert "distinct states: 168   transitions: 519   depth reached: 3" in out
    assert "spec candidates outside this bound:" in out  # depth 3 is too shallow for all of them


def test_cli_exits_non_zero_and_writes_the_counterexample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "test_cx.py"
    with MUTANTS["restart_leaks_idle_memory"]():
        assert main(["check", "--depth", "3", "--no-progress", "--test-out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "shortest counterexample (2 steps): alloc:False -> restart:False" in text
    assert "def test_counterexample():" in out.read_text()
    run_source(out.read_text())
