"""The bounded model checker: the default bound is clean and covers the spec; every seeded bug
yields a shortest counterexample that, run as a test, fails on the bug and passes on the real code."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from mutants import KILLS, MUTANTS

from devbridge import LifecycleError
from devbridge.backends.fake import FakeBackend
from devbridge.cli.main import main
from devbridge.models.checker import PROFILES, Bound, check, describe, render, replay
from devbridge.statemachine.core import LifecycleCore


def run_source(source: str) -> None:
    namespace: dict[str, object] = {}
    exec(compile(source, "counterexample.py", "exec"), namespace)
    namespace["test_counterexample"]()  # type: ignore[operator]


NARROW = PROFILES["narrow"]  # the seeded bugs' bound: each is found within depth 5 of it


def test_narrow_bound_is_explored_with_no_violation_and_covers_the_spec() -> None:
    """To depth 5, where every seeded bug is found and every spec candidate and edge is already
    covered (its full depth, 6, and the default bound, wider and slower, are for the command
    line; the docs give their figures; two processes explore what one does, below)."""
    report = check(replace(NARROW, depth=5))
    assert report.violation is None
    assert report.coverage.missing() == [] and report.coverage.missing_edges() == []
    assert (report.states, report.transitions, report.depth) == (3814, 20693, 5)


def test_the_default_bound_fills_and_wraps_the_ring_with_copies_of_every_span() -> None:
    """Three allocations, copies of four spans, a 16 B ring that the bound can fill: stream offsets
    count in the canonical state, a full ring refuses a reservation (RING-2) and one wraps."""
    bound = Bound()
    assert bound.allocations == 3 and bound.ring_fills and len(bound.spans) == 4
    path = (("alloc", False), *(("h2d", 0, (0, 8), True, False),) * 2, ("h2d", 0, (0, 4), True, False))
    s = replay(path[:3], ring=bound.ring)  # two copies of 8 B fill the ring: it wraps to 0 after release
    s.check()
    assert [(r.start, r.nbytes) for r in s.reservations] == [(0, 8), (8, 8)]
    s = replay(path, ring=bound.ring)
    s.check()
    assert [(r.start, r.nbytes) for r in s.reservations] == [(0, 8), (8, 8), (16, 4)]  # stream offsets
    assert s.refusals == {}  # each sync copy released its bytes: the ring had room
    full = replay((("alloc", False), *(("h2d", 0, (0, 8), False, False),) * 3), ring=bound.ring)
    full.check()
    assert full.refusals["RING-2"] == 1 and len(full.reservations) == 2  # two copies in flight fill it


def test_two_processes_explore_exactly_what_one_does() -> None:
    one, two = check(replace(NARROW, depth=4)), check(replace(NARROW, depth=4), jobs=2)
    assert (one.states, one.transitions, one.depth) == (two.states, two.transitions, two.depth)
    assert one.coverage.hits == two.coverage.hits and one.coverage.edges == two.coverage.edges
    with MUTANTS["missing_waw_edge"]():
        found = [check(replace(NARROW, depth=5), jobs=jobs).violation for jobs in (1, 2)]
    assert found[0] is not None and found[1] is not None
    assert found[0].path == found[1].path and found[0].kill == found[1].kill == "fake:order"


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_seeded_bug_yields_a_shortest_counterexample_test(name: str) -> None:
    with MUTANTS[name]():
        report = check(replace(NARROW, depth=5))
        violation = report.violation
        assert violation is not None, f"{name} not found"
        assert violation.kill in KILLS[name], f"{name} was caught by {violation.kill}, not by {sorted(KILLS[name])}"
        shorter = check(replace(NARROW, depth=len(violation.path) - 1))
        assert shorter.violation is None, "breadth first: no shorter counterexample exists"
        # an assertion of the model's answer fails (or, for a use ended twice, the core's refusal of
        # the second end escapes the call: what the bug does to a caller)
        fails = (AssertionError, pytest.fail.Exception) + ((LifecycleError,) if violation.kill == "once" else ())
        with pytest.raises(fails):
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
        violation = check(replace(NARROW, depth=3)).violation
    assert violation is not None and violation.kill == "TypeError", violation
    assert violation.kill not in KILLS["view_does_not_pin"]


@pytest.mark.parametrize("name", ["missing_raw_edge", "missing_war_edge", "missing_waw_edge"])
def test_a_missing_hazard_edge_is_caught_by_the_issue_order_bytes_alone(name: str) -> None:
    """Without the fake's own ordering check, the model's issue-order bytes still catch each
    missing edge: the device or output bytes differ from a synchronous run's (ORDER-1)."""
    with MUTANTS[name](), mock.patch.object(FakeBackend, "_check_order", lambda self, *a: None):
        violation = check(replace(NARROW, depth=5)).violation
    assert violation is not None, f"{name} not found"
    assert violation.kill in ("device-bytes", "host-bytes", "event"), violation.error
    print(f"\n{name}: {describe(violation.path)}\n  {violation.error[:160]}")


def test_a_path_through_every_view_action_renders_a_runnable_test() -> None:
    """Tensors derived every way keep a view in use past the view itself, a free and a restart;
    the release comes with the last one (here failing: reported by that poll). The rendered
    script runs and asserts the model's answer after every step."""
    path = [
        ("alloc", False), ("wrap", 0, 0, False), ("wrap", 0, 4, False),  # t0; unaligned: refused (VIEW-2)
        ("derive", 0, "reshape"), ("derive", 0, "lazy"), ("derive", 1, "assign"),  # t1, t2, t3
        ("drop", 0), ("free", 0, True), ("drop", 1), ("drop", 2), ("drop", 3),  # FREE-3 from the poll
        ("alloc", False), ("wrap", 1, 0, False), ("derive", 4, "lazy"), ("drop", 4),  # t4, t5
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
    assert main(["check", "--tier", "lockstep", "--depth", "3", "--no-progress", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert f"bound: {Bound(depth=3)}" in out  # the CLI's default profile is Bound's defaults
    assert "sans-I/O" not in out
    assert "distinct states: 686   transitions: 2081   depth reached: 3" in out
    assert re.search(r"time: [0-9.]+ s   states/s: [0-9]+ \(2 processes, [0-9]+ per process\)", out), out
    assert "spec candidates outside this bound:" in out  # depth 3 is too shallow for all of them
    narrow = ["--tier", "lockstep", "--profile", "narrow", "--depth", "2", "--spans", "2:4", "--no-progress"]
    assert main(["check", *narrow]) == 0
    assert f"bound: {replace(NARROW, depth=2, spans=((2, 4),))}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--depth", "-1"], ["--depth", "0"], ["--allocations", "0"], ["--faults", "-1"], ["--jobs", "0"],
        ["--ring", "x"], ["--spans", "6:4"], ["--spans", "0:0"], ["--spans", "4"], ["--profile", "huge"],
    ],
    ids=" ".join,
)  # fmt: skip
def test_cli_refuses_a_bound_that_is_not_one(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """One line on stderr and exit 2, before anything is explored."""
    with pytest.raises(SystemExit) as exited:
        code = main(["check", "--no-progress", *argv])
        raise SystemExit(code)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "distinct states" not in captured.err
    assert len(captured.err.strip().splitlines()[-1]) > 0


def test_cli_exits_non_zero_and_writes_the_counterexample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "test_cx.py"
    with MUTANTS["restart_leaks_idle_memory"]():
        assert main(["check", "--values-depth", "3", "--depth", "3", "--no-progress", "--test-out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "shortest counterexample (2 steps): alloc:False -> restart:False" in text  # the lockstep
    assert "shortest counterexample (2 steps): alloc -> restart" in text and "[INV-FREE-ONCE]" in text  # sans-I/O
    assert "def test_counterexample():" in out.read_text()
    run_source(out.read_text())


def test_a_rendered_test_quotes_bytes_with_braces_and_runs() -> None:
    """Regression: the line a call writes was made with str.format, so bytes with braces in
    them (b'{x}}') raised ValueError from the harness instead of rendering."""
    from devbridge.models.lockstep import Lockstep

    s = Lockstep(64, record=True)
    s.alloc(8, False)
    r = s.reserve(4)
    assert r is not None
    s.fill(r, b"{x}}")
    s.read(r)
    s.host_to_device(r, s.handles[0], 0, sync=True, fails=False)
    s.check()
    at = s.script.index("    ring.view(r0)[:] = b'{x}}'")
    assert s.script[at : at + 3] == [
        "    ring.view(r0)[:] = b'{x}}'",
        "    assert bytes(ring.view(r0)) == b'{x}}'",
        "    e0 = bridge.host_to_device(r0, DeviceRange(h0, 0, 4), sync=True, release=True)",
    ]
    run_source(s.test_source())


def test_an_event_returned_done_while_the_model_has_it_in_flight_is_a_pending_disagreement() -> None:
    """Regression: the harness took a returned event's done-ness on trust, so a bug that
    finishes a compute at submission surfaced later as a KeyError of the harness's own (opening
    the compute's block), not as the `pending` disagreement it is."""
    from devbridge.models.lockstep import Disagreement, Lockstep

    s = Lockstep(64)
    s.alloc(8, False)
    with MUTANTS["compute_done_at_submit"](), pytest.raises(Disagreement) as raised:
        s.compute([s.handles[0]], False)
    assert raised.value.check == "pending" and "returned done, the model says in flight" in str(raised.value)


def test_the_lockstep_checker_on_an_in_order_queue() -> None:
    """`devbridge check --in-order`: the same exploration over one in-order queue (what it runs
    ahead of a use ends in the model as the Bridge learns of it): no violation within depth 5 of
    the narrow bound, and the seeded device whose sync copy only enqueues is found, by a check
    that names it, with a shortest counterexample."""
    bound = replace(NARROW, depth=5, in_order=True)
    report = check(bound)
    assert report.violation is None and report.states > 2000
    with MUTANTS["sync_copy_done_at_submission"]():
        found = check(bound).violation
        assert found is not None and found.kill in KILLS["sync_copy_done_at_submission"]
        assert check(replace(bound, depth=len(found.path) - 1)).violation is None
    assert "FakeBackend(in_order=True)" in found.test_source
