"""The timeline trace (devbridge.bridge.trace): valid Chrome Trace JSON whose allocation tracks follow
the spec's transitions, from the demo with faults and restarts on every device, and a checker
that names each defect a broken trace can have."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from harness import COMPUTE_DEVICES
from support import U8

from devbridge import Bridge, DeviceRange, HostRing, InvalidArgumentError
from devbridge.backends.base import BackendError
from devbridge.backends.fake import FakeBackend
from devbridge.bridge.trace import MEMORY, Trace, TraceClock, check_trace
from devbridge.cli.main import main
from devbridge.spec import load

TRANSITIONS = {(t.source, t.dest) for t in load().transitions}


def demo_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[list[dict[str, Any]], Any]:
    path = tmp_path / "t.json"
    argv = ["demo", "--objects", "150", "--faults", "0.05", "--restart-every", "30", "--json", "--no-progress"]
    assert main([*argv, *args, "--trace", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return json.loads(path.read_text()), summary


@pytest.mark.parametrize(("backend", "device"), COMPUTE_DEVICES)
def test_a_demo_with_faults_and_restarts_writes_a_trace_whose_every_span_follows_the_spec(
    backend: str, device: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--backend", backend] + ([] if device is None else ["--device", device])
    events, summary = demo_trace(tmp_path, capsys, *where)
    assert summary["clean"] and check_trace(events, TRANSITIONS) == []
    names = Counter(e["name"] for e in events if e["ph"] == "i")
    assert sum(n for name, n in names.items() if name.startswith("restart: generation")) == summary["restarts"] > 0
    assert sum(n for name, n in names.items() if name.startswith("failed:")) > 0
    states = {e["name"] for e in events if e["ph"] == "B" and e["tid"] >= 1000}
    assert {"allocated", "idle", "copying", "computing"} <= states
    assert {"freed", "stale"} & set(names)  # allocations end, each with its terminal state
    memory = [e["args"]["bytes"] for e in events if e["ph"] == "C" and e["name"] == MEMORY]
    assert memory and min(memory) >= 0 and max(memory) > 0
    kinds = Counter(e["cat"] for e in events if e["ph"] == "b")
    assert kinds["copy_in"] > 0 and kinds["copy_out"] > 0 and kinds["compute"] > 0


def test_a_multi_device_demo_traces_each_bridge_as_its_own_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events, summary = demo_trace(tmp_path, capsys, "--backend", "tinygrad", "--device", "CPU:0,CPU:1")
    assert summary["clean"] and check_trace(events, TRANSITIONS) == []
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert len(processes) >= 2 and all(name.startswith("bridge #") for name in processes.values())


def test_a_held_copy_shows_what_it_follows_and_an_arrow_to_its_launch() -> None:
    fake, out = FakeBackend(), io.StringIO()
    bridge, ring = Bridge(fake, trace=out), HostRing(64)
    h = bridge.alloc_device(U8, 8)
    up = ring.reserve(8)
    ring.write(up, b"abcdefgh")
    first = bridge.host_to_device(up, DeviceRange(h, 0, 8), sync=False)
    bridge.device_to_host(DeviceRange(h, 0, 8), ring.reserve(8), sync=False)  # held behind the upload
    assert out.getvalue().startswith("[\n") and '"follows":[0]' in out.getvalue()  # written as it happens
    fake.complete(first)
    fake.complete_all()
    bridge.close_trace()
    events = json.loads(out.getvalue())
    assert check_trace(events, TRANSITIONS) == []
    flow = [(e["ph"], e["id"]) for e in events if e["ph"] in "sf"]
    assert flow == [("s", "0>1"), ("f", "0>1")]
    held = [e for e in events if e["ph"] in "ben" and e.get("id") == 1]
    assert [e["ph"] for e in held] == ["b", "n", "e"] and held[0]["args"]["follows"] == [0]
    start, end = (e for e in events if e["ph"] in "sf")  # from when it began to its launch
    assert start["ts"] == held[0]["ts"] and end["ts"] == held[1]["ts"]
    ends = [e["args"] for e in events if e["ph"] == "e"]
    assert ends == [{"ok": True}, {"ok": True}]  # each ended as it did, not left for close() to end
    assert [e["args"] for e in events if e["ph"] == "b" and e["id"] == 0] == [
        {"allocations": [0], "range": [0, 8], "bytes": 8}
    ]


def test_a_held_copy_a_restart_aborts_leaves_no_arrow_unfinished() -> None:
    fake, out = FakeBackend(), io.StringIO()
    bridge, ring = Bridge(fake, trace=out), HostRing(64)
    h = bridge.alloc_device(U8, 8)
    bridge.host_to_device(ring.reserve(8), DeviceRange(h, 0, 8), sync=False)
    held = bridge.device_to_host(DeviceRange(h, 0, 8), ring.reserve(8), sync=False)
    assert held.backend_token is None  # held behind the upload (ORDER-1)
    bridge.restart()  # aborts the held copy before it ever launched
    fake.complete_all()
    bridge.close_trace()
    events = json.loads(out.getvalue())
    assert check_trace(events, TRANSITIONS) == []
    assert [e for e in events if e["ph"] in "sf"] == []  # no arrow begun and left without its end
    assert [e["args"] for e in events if e["ph"] == "e" and e["id"] == held.use_id] == [{"ok": False}]


def test_a_copy_done_on_submission_draws_both_steps_of_the_spec() -> None:
    out = io.StringIO()
    bridge, ring = Bridge(FakeBackend(), trace=out), HostRing(64)
    h = bridge.alloc_device(U8, 8)
    src = ring.reserve(8)
    bridge.host_to_device(src, DeviceRange(h, 0, 8))
    bridge.free_device(h)
    bridge.close_trace()
    events = json.loads(out.getvalue())
    track = [(e["ph"], e["name"]) for e in events if e["tid"] == 1000 and e["ph"] != "M"]
    assert track == [
        ("B", "allocated"), ("E", "allocated"), ("B", "copying"), ("E", "copying"), ("B", "idle"),
        ("E", "idle"), ("i", "freed"),
    ]  # fmt: skip
    assert [e["args"] for e in events if e["name"] == "copy_in (done on submission)"] == [
        {"allocations": [0], "bytes": 8}
    ]


def test_a_long_run_keeps_nothing_but_what_is_live() -> None:
    out = io.StringIO()
    bridge = Bridge(FakeBackend(), trace=out)
    for _ in range(500):
        bridge.free_device(bridge.alloc_device(U8, 8))
    tracks = bridge._trace
    assert tracks is not None and tracks._states == {} and tracks._open == {} and tracks._held == {}
    bridge.close_trace()
    assert bridge._trace is None and check_trace(json.loads(out.getvalue()), TRANSITIONS) == []
    bridge.close_trace()  # idempotent


def test_a_shared_trace_is_closed_by_its_owner_and_each_bridge_ends_its_own_spans() -> None:
    out = io.StringIO()
    shared = Trace(out)
    one, two = Bridge(FakeBackend(), trace=shared), Bridge(FakeBackend(), trace=shared)
    one.alloc_device(U8, 8)
    two.alloc_device(U8, 8)
    one.close_trace()
    assert not shared.closed
    so_far = json.loads(out.getvalue() + "\n]")
    assert [(e["pid"], e["name"]) for e in so_far if e["ph"] == "E"] == [(so_far[0]["pid"], "allocated")]
    two.alloc_device(U8, 8)
    shared.close()
    events = json.loads(out.getvalue())
    assert check_trace(events, TRANSITIONS) == []
    assert len({e["pid"] for e in events if e["ph"] == "B"}) == 2


@pytest.mark.parametrize("target", [42, b"t.json", object(), ["t.json"]])
def test_a_trace_target_that_is_not_a_path_or_a_file_is_refused_before_any_backend_call(target: object) -> None:
    fake = FakeBackend()
    with pytest.raises(InvalidArgumentError) as raised:
        Bridge(fake, trace=target)  # type: ignore[arg-type]
    assert raised.value.rule == "ARG-1" and fake.calls == [] and fake.counts == Counter()


def test_a_trace_path_that_cannot_be_created_is_refused_before_any_backend_call(tmp_path: Path) -> None:
    fake = FakeBackend()
    with pytest.raises(InvalidArgumentError) as raised:
        Bridge(fake, trace=tmp_path / "missing" / "t.json")
    assert raised.value.rule == "ARG-1" and fake.calls == [] and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("command", [["demo", "--backend", "fake"], ["example", "--backend", "fake"], ["fleet"]])
def test_a_trace_path_the_command_line_cannot_write_is_one_line_and_exit_2_before_any_work(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing"
    assert main([*command, "--trace", str(missing / "t.json")]) == 2
    says = f"--trace {str(missing / 't.json')!r}: cannot create a file in {str(missing)!r}"
    assert capsys.readouterr().err == f"devbridge {command[0]}: error: {says}\n"
    assert main([*command, "--trace", str(tmp_path)]) == 2  # a folder
    assert capsys.readouterr().err == f"devbridge {command[0]}: error: --trace {str(tmp_path)!r} is a directory\n"
    assert list(tmp_path.iterdir()) == []


def test_including_another_process_trace_moves_it_to_its_own_process_and_onto_this_clock() -> None:
    """What the fleet's driver does with each batch's timeline: a process of its own (named
    after what the other trace called it), ids its own, times moved by the two starts."""
    theirs = valid_trace()
    out = io.StringIO()
    ours = Trace(out)
    ours.include(theirs, pid=7, label="actor 0", wall_ns=ours.wall_ns + 5_000_000)  # it started 5 ms later
    ours.include(theirs, pid=8, label="actor 1", wall_ns=ours.wall_ns)
    ours.close()
    events = json.loads(out.getvalue())
    assert check_trace(events, TRANSITIONS) == [] and len(events) == 2 * len(theirs)
    first, second = events[: len(theirs)], events[len(theirs) :]
    assert {e["pid"] for e in first} == {7} and {e["pid"] for e in second} == {8}
    for moved, before in zip(first, theirs, strict=True):
        assert moved["ts"] == pytest.approx(before["ts"] + 5000.0)
        assert moved.get("id") == (None if "id" not in before else f"7:{before['id']}")
    named = [e["args"]["name"] for e in first if e["ph"] == "M" and e["name"] == "process_name"]
    original = [e["args"]["name"] for e in theirs if e["ph"] == "M" and e["name"] == "process_name"]
    assert named == [f"actor 0: {original[0]}"] and len(original) == 1


def test_a_trace_of_this_machine_is_included_by_the_monotonic_clock_and_one_of_another_by_the_wall_clock() -> None:
    """One boot shares one monotonic clock: the shift is exact whatever the wall clock says
    (stepped, or read late by a preempted thread); another machine's trace aligns by the wall."""
    theirs = valid_trace()
    out = io.StringIO()
    ours = Trace(out)
    here, far = ours.clock, "another machine's boot"
    assert here.boot is not None and here.boot == Trace(io.StringIO()).clock.boot  # Linux: this boot's id
    later = TraceClock(here.boot, here.monotonic_ns + 2_000_000, here.wall_ns + 900_000_000)  # wall off by 0.9 s
    ours.include(theirs, pid=7, label="same machine", clock=later)
    ours.include(theirs, pid=8, label="other machine", clock=TraceClock(far, 0, here.wall_ns + 3_000_000))
    ours.close()
    events = json.loads(out.getvalue())
    first, second = events[: len(theirs)], events[len(theirs) :]
    assert [e["ts"] for e in first] == pytest.approx([e["ts"] + 2000.0 for e in theirs])
    assert [e["ts"] for e in second] == pytest.approx([e["ts"] + 3000.0 for e in theirs])
    assert here.shift_us(later) == 2000.0 and later.shift_us(here) == -2000.0
    assert TraceClock(None, 0, 5_000).shift_us(TraceClock(None, 10**9, 7_000)) == 2.0  # no boot id: the wall


@pytest.mark.parametrize(
    "how",
    [{}, {"clock": "clock"}, {"wall_ns": 1.5}, {"wall_ns": True}, {"clock": None, "wall_ns": None}, "both"],
    ids=["neither", "not-a-clock", "float-wall", "bool-wall", "nones", "both"],
)
def test_include_refuses_a_missing_or_foreign_clock_and_writes_nothing(how: Any) -> None:
    out = io.StringIO()
    ours = Trace(out)
    kwargs = {"clock": ours.clock, "wall_ns": ours.wall_ns} if how == "both" else how
    with pytest.raises(InvalidArgumentError) as e:
        ours.include(valid_trace(), pid=7, label="actor", **kwargs)
    assert e.value.rule == "ARG-1" and ours.events == 0


def valid_trace() -> list[dict[str, Any]]:
    out = io.StringIO()
    bridge, ring = Bridge(FakeBackend(), trace=out), HostRing(64)
    h = bridge.alloc_device(U8, 8)
    bridge.host_to_device(ring.reserve(8), DeviceRange(h, 0, 8), sync=False)
    bridge.close_trace()
    events: list[dict[str, Any]] = json.loads(out.getvalue())
    assert check_trace(events, TRANSITIONS) == []
    return events


def seeded(kind: str) -> list[dict[str, Any]]:
    events = valid_trace()
    if kind == "illegal order":  # allocated -> idle: the spec goes through a copy
        return [{**e, "name": "idle"} if e["ph"] in "BE" and e["name"] == "copying" else e for e in events]
    if kind == "unclosed span":
        return [e for e in events if not (e["ph"] == "E" and e["name"] == "copying")]
    if kind == "unclosed use":
        return [e for e in events if e["ph"] != "e"]
    if kind == "negative counter":
        return [{**e, "args": {"bytes": -8}} if e["ph"] == "C" else e for e in events]
    assert kind == "unknown phase"
    return [*events, {"ph": "X", "ts": 0, "pid": 1, "tid": 1, "name": "x"}]


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("illegal order", "goes allocated -> idle, no transition of the spec"),
        ("unclosed span", "['copying'] never end"),
        ("unclosed use", "never ends"),
        ("negative counter", "below zero"),
        ("unknown phase", "not a trace event this writer makes"),
    ],
)
def test_the_trace_check_names_each_seeded_defect(kind: str, says: str) -> None:
    problems = check_trace(seeded(kind), TRANSITIONS)
    assert problems and all(says in p for p in problems), problems


def test_the_example_writes_a_trace_of_its_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.json"
    assert main(["example", "--objects", "4", "--trace", str(path)]) == 0
    events = json.loads(path.read_text())
    assert check_trace(events, TRANSITIONS) == []
    freed = [e for e in events if e["ph"] == "i" and e["name"] == "freed"]
    assert len(freed) == 8  # x and y of each of the 4 round trips, each to its end


def test_a_callers_file_closed_under_the_trace_ends_it_quietly() -> None:
    out = io.StringIO()
    bridge = Bridge(FakeBackend(), trace=out)
    bridge.alloc_device(U8, 8)
    out.close()
    bridge.alloc_device(U8, 8)  # tracing ends: the bridge goes on
    bridge.close_trace()
    assert bridge.stats().live_allocations == 2


def test_a_failed_allocation_a_failed_free_and_a_failed_copy_are_marked() -> None:
    from devbridge.errors import DeviceAllocationError, DeviceCopyError, DeviceFreeError

    fake, out = FakeBackend(), io.StringIO()
    bridge, ring = Bridge(fake, trace=out), HostRing(64)
    fake.fail_next("alloc")
    with pytest.raises(DeviceAllocationError):
        bridge.alloc_device(U8, 8)
    h = bridge.alloc_device(U8, 8)
    fake.fail_next("copy_in")
    copy = bridge.host_to_device(ring.reserve(8), DeviceRange(h, 0, 8), sync=False)
    fake.complete(copy)
    with pytest.raises(DeviceCopyError):
        copy.wait()
    fake.fail_next("free")
    with pytest.raises(DeviceFreeError):
        bridge.free_device(h)
    bridge.close_trace()
    events = json.loads(out.getvalue())
    assert [e["name"] for e in events if e.get("cat") == "fault"] == [
        "failed: alloc of 8 B for blob", "failed: copy_in #0", "failed: free of allocation #0",
    ]  # fmt: skip
    assert [e["args"] for e in events if e["ph"] == "e"] == [{"ok": False}]
    assert [e["args"]["bytes"] for e in events if e["ph"] == "C" and e["name"] == MEMORY] == [8, 0]


def test_a_bridge_the_backend_refuses_leaves_its_trace_file_ended(tmp_path: Path) -> None:
    from devbridge.errors import BackendFailureError

    path = tmp_path / "t.json"

    class Refusing(FakeBackend):
        def begin_generation(self, generation: int) -> None:
            raise BackendError("no")

    with pytest.raises(BackendFailureError):
        Bridge(Refusing(), trace=path)
    assert json.loads(path.read_text()) == []


def test_a_trace_the_bridge_opened_is_ended_when_the_bridge_is_collected(tmp_path: Path) -> None:
    import gc

    path = tmp_path / "t.json"
    bridge = Bridge(FakeBackend(), trace=path)
    bridge.alloc_device(U8, 8)
    del bridge
    gc.collect()
    events = json.loads(path.read_text())
    assert check_trace(events, TRANSITIONS) == [] and [e["name"] for e in events if e["ph"] == "E"] == ["allocated"]
