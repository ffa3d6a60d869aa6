"""The reference worker as processes (`devbridge demo --processes`): producer processes, a
worker process, a collector process, with real SIGKILL and SIGSTOP/SIGCONT of the worker and
a worker killed at each stage of an object's way. The collector counts every input record it
sees an output of: none twice, without de-duplicating."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import signal
import subprocess
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path

import process_stages
import pytest
from harness import DEVICES
from rules import refused
from test_shared_ring import shared  # noqa: F401  (a fixture)

from devbridge import HostRing, InvalidArgumentError
from devbridge.apps.worker.processes import FIELDS, ROWS, Plan, ProcessSummary, RingFeed, run_processes
from devbridge.bridge.trace import ends_of_open, read_cut
from devbridge.ring.segment import SHM_DIR


def demo_segments() -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith(f"devbridge-demo-{os.getpid()}-")}


def assert_exactly_once(s: ProcessSummary, objects: int) -> None:
    assert (s.objects, s.delivered, s.lost, s.duplicated, s.wrong) == (objects, objects, 0, 0, 0)
    assert s.repeated_inputs == 0 and s.malformed == 0
    assert s.leftover_segments == [] and demo_segments() == set()


#: One worker process on CPU; then, where CL opens, a worker process on each of CPU and CL.
DEVICE_SETS = [["CPU"]] + ([["CPU", "CL"]] if "CL" in DEVICES else [])


@pytest.mark.holds("RING-7", "GEN-2")
@pytest.mark.parametrize("devices", DEVICE_SETS, ids=",".join)
def test_a_killed_and_a_hung_worker_lose_nothing_and_repeat_nothing(
    devices: list[str], capfd: pytest.CaptureFixture[str]
) -> None:
    """160 objects on devices that fail at random and restart their bridges every 40 objects; a
    worker killed each time 60 more are delivered (each device's in turn) and one stopped at 90:
    every object delivered once and right, the hang fenced, every child reaped, no segment left."""
    s = run_processes(160, 2, "tinygrad", devices, faults=0.05, restart_every=40, kill_every=60, hang_every=90)
    assert_exactly_once(s, 160)
    assert s.kills == 2 and s.hangs == 1 and s.fenced == 1
    assert s.worker_starts == len(devices) + s.kills + s.hangs and s.devices == devices
    assert s.faults_injected > 0 and s.restarts > 0
    # a worker lets go of the rings only once its copies are done (the children write to fd 2)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.holds("RING-7")
def test_a_worker_killed_at_each_stage_of_an_object_loses_nothing(tmp_path: Path) -> None:
    """The worker kills itself at each stage of an object's way in turn (taken, uploading,
    computing, downloading, between the output's commit and the input's release, released),
    once each; each replacement takes what its predecessor held. Killed between the commit and
    the release, the record comes again and is known finished: released, not computed again."""
    target = functools.partial(process_stages.dying_work, str(tmp_path))
    s = run_processes(130, 1, "fake", [None], batch=2, work_target=target)
    assert sorted(os.listdir(tmp_path)) == sorted(process_stages.STAGES)  # it died at each stage
    assert_exactly_once(s, 130)
    assert s.worker_starts == 1 + len(process_stages.STAGES) and s.kills == 0
    assert s.finished_before == 1  # the record whose output was in the ring already
    assert s.redelivered >= len(process_stages.STAGES) - 1  # each victim but the one released


@pytest.mark.holds("RING-7", "GEN-2")
def test_the_cli_runs_the_process_demo_with_kills_and_hangs_and_its_trace_follows_the_spec(tmp_path: Path) -> None:
    """On the fake backend, through the command line: the JSON summary, and one trace of every
    worker process's bridge (a killed one's spans ended where it was cut) that follows the spec."""
    trace = tmp_path / "t.json"
    argv = ["demo", "--processes", "2", "--backend", "fake", "--objects", "150", "--kill-worker-every", "60",
            "--hang-worker-every", "100", "--json", "--trace", str(trace)]  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "devbridge", *argv], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    s = json.loads(run.stdout)
    assert (s["lost"], s["duplicated"], s["wrong"], s["repeated_inputs"], s["clean"]) == (0, 0, 0, 0, True)
    assert (s["kills"], s["hangs"], s["fenced"], s["worker_starts"]) == (2, 1, 1, 4)
    assert s["leftover_segments"] == [] and demo_segments() == set()
    check = subprocess.run([sys.executable, "-m", "devbridge", "trace", str(trace), "--check"], capture_output=True)
    assert check.returncode == 0, check.stdout
    pids = {e["pid"] for e in json.loads(trace.read_text()) if e.get("name") == "process_name"}
    assert len(pids) == 4  # the worker's processes: the first, two after kills, one after the hang


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--kill-worker-every", "5"], "need --processes"),
        (["--hang-worker-every", "5"], "need --processes"),
        (["--processes", "1", "--pins-report"], "--pins-report"),
        (["--processes", "0"], "--processes"),
    ],
)
def test_process_options_that_do_not_fit_are_one_line_and_exit_2(argv: list[str], message: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "devbridge", "demo", "--backend", "fake", *argv], capture_output=True, text=True
    )
    assert run.returncode == 2 and message in run.stderr.strip().splitlines()[-1]


def test_a_trace_cut_by_a_kill_reads_to_its_last_whole_event_and_its_spans_are_ended() -> None:
    text = '[\n{"ph":"B","name":"allocated","pid":1,"tid":1000,"ts":1},\n' + (
        '{"ph":"b","name":"copy_in #1","cat":"copy_in","id":1,"pid":1,"tid":1,"ts":2},\n{"ph":"E","na'
    )
    events = read_cut(text)
    assert [e["ph"] for e in events] == ["B", "b"]
    assert ends_of_open(events, 5.0) == [
        {"ph": "e", "name": "copy_in #1", "cat": "copy_in", "id": 1, "pid": 1, "tid": 1, "ts": 5.0},
        {"ph": "E", "name": "allocated", "pid": 1, "tid": 1000, "ts": 5.0},
    ]


def test_lock_held_says_whether_another_process_holds_the_rings_lock(shared: Callable[..., HostRing]) -> None:  # noqa: F811
    """What the demo's supervisor asks before it leaves a worker stopped: a worker stopped with
    the lock held would stop every other user of the ring. (Another open file of the segment
    stands for another process: `flock` is per open file.)"""
    ring = shared(64)
    assert ring.lock_held() is False and HostRing(64).lock_held() is False
    fd = os.open(os.path.join(SHM_DIR, ring.name), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert ring.lock_held() is True
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert ring.lock_held() is False
    finally:
        os.close(fd)
    assert ring.stats()["consumer_pid"] == 0  # no consumer yet
    ring.consume()
    assert ring.stats()["consumer_pid"] == os.getpid()


def process_state(pid: int) -> bytes:
    """Process `pid`'s state letter from /proc (Z: dead, not yet reaped); b"X" once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b"X"


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def children_of(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found |= {int(c) for c in (task / "children").read_text().split()}
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_demo_ended_by_a_signal_reaps_every_child_and_unlinks_every_ring(sig: int) -> None:
    """SIGTERM or SIGINT to `devbridge demo --processes` mid-run: it ends with the signal's exit
    status, every process it started is gone and none of its rings is left in /dev/shm."""
    argv = ["demo", "--processes", "2", "--backend", "fake", "--objects", "1000000", "--no-progress"]
    demo = subprocess.Popen([sys.executable, "-m", "devbridge", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    prefix = f"devbridge-demo-{demo.pid}-"
    try:
        deadline = time.monotonic() + 60
        while len(children_of(demo.pid)) < 4 or not any(n.startswith(prefix) for n in os.listdir(SHM_DIR)):
            assert time.monotonic() < deadline and demo.poll() is None, "the demo never started its processes"
            time.sleep(0.05)
        time.sleep(1.0)  # mid-run: the worker is taking objects
        children = children_of(demo.pid)
        names = {c: Path(f"/proc/{c}/cmdline").read_bytes()[:150].decode(errors="replace") for c in children}
        demo.send_signal(sig)
        demo.wait(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode != 0
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)] == []
    # (none still running: multiprocessing's resource tracker ends on its own once its parent is
    # gone, a moment later, and may stay a zombie until the machine's init reaps it)
    deadline = time.monotonic() + 10
    while running := {c: names[c] for c in children if process_state(c) not in (b"Z", b"X")}:
        assert time.monotonic() < deadline, running
        time.sleep(0.05)


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize(
    "options",
    [
        {"objects": 0},
        {"objects": "10"},
        {"processes": 0},
        {"processes": 1.5},
        {"backend": "cuda"},
        {"backend": None},
        {"devices": []},
        {"devices": "CPU"},
        {"devices": ["CPU", "CPU"]},
        {"devices": [3]},
        {"devices": [""]},
        {"backend": "fake", "devices": ["CPU"]},
        {"kill_every": -1},
        {"hang_every": True},
        {"faults": 1.0},
        {"batch": 0},
        {"restart_every": -2},
        {"seed": "0"},
        {"progress": 5},
    ],
)
def test_bad_options_are_refused_before_any_process_or_ring(options: dict[str, object]) -> None:
    """Each bad option: ARG-1, naming it, and no process started, no ring made."""
    before = children_of(os.getpid())
    with refused("ARG-1", InvalidArgumentError):
        run_processes(**{"objects": 10, "backend": "fake", **options})  # type: ignore[arg-type]
    assert demo_segments() == set() and children_of(os.getpid()) == before


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("devices", [["NOPE"], ["CPU", "NOPE"]], ids=str)
def test_a_device_that_does_not_open_ends_the_run_with_its_error(devices: list[str]) -> None:
    """A worker whose device does not open would fail again at every start: the run ends with
    its ARG-1 at once (it restarted the worker for ever), every child reaped, every ring gone."""
    before = children_of(os.getpid())
    began = time.monotonic()
    with refused("ARG-1", InvalidArgumentError, match="tinygrad cannot open device 'NOPE'"):
        run_processes(objects=20, processes=1, backend="tinygrad", devices=devices)  # type: ignore[arg-type]
    assert time.monotonic() - began < 60
    # (the first process `spawn` starts also starts multiprocessing's resource tracker, for good)
    left = {c for c in children_of(os.getpid()) - before if b"resource_tracker" not in cmdline(c)}
    assert demo_segments() == set() and left == set()


@pytest.mark.parametrize(
    "bad",
    [
        [0, 1, 2],  # no objects
        [3, 1, 2],  # more objects than a batch
        [2, 1, 99],  # an object the run does not have
        [2, 1, -1],
        [1, 1, 0],  # one object named, two objects' bytes
    ],
)
def test_a_malformed_input_record_is_counted_released_and_never_computed_on(
    bad: list[int],
    shared: Callable[..., HostRing],  # noqa: F811
) -> None:
    """What a worker reads from a ring is checked before use: a record whose header does not
    agree with what this run's producers write is released and counted, and the next is taken."""
    plan = Plan(objects=10, batch=2, seed=0)
    inputs, outputs = shared(1 << 16), shared(1 << 16)
    for header in (bad, [2, 3, 4]):
        r = inputs.reserve(plan.in_header + 2 * plan.in_bytes)
        inputs.write(r, array("q", header).tobytes() + bytes(2 * plan.in_bytes))
        inputs.commit(r)
    counters = array("q", [0] * (ROWS * len(FIELDS)))
    inputs.consume()
    feed = RingFeed(plan, inputs, outputs, counters, type("Flag", (), {"value": 0})())  # type: ignore[arg-type]
    batch = feed.take(1.0)
    assert batch is not None and batch.ks == [3, 4] and batch.record is not None and batch.record.seq == 1
    assert counters[FIELDS.index("malformed")] == 1
    assert inputs.stats()["live"] == 1  # type: ignore[attr-defined]  # (the good one, taken; the bad one released)
    inputs.release(batch.record)


def test_two_workers_count_in_rows_of_their_own_and_no_kill_follows_the_last_object() -> None:
    """Two worker processes (two fake devices, a pair of rings each), a worker killed each time 150
    more objects are delivered: one kill (at 150), none at 300, when the run is over; the workers'
    own counts, one row each, add up to every object (two workers of one consumer generation on
    two rings keep apart rows; a kill between a commit and its count may miss one batch). (The
    run polls the delivered count: the second half is long enough that the kill is not missed
    by a poll that comes late on a loaded machine.)"""
    s = run_processes(300, 1, "fake", [None, None], kill_every=150, batch=2)
    assert_exactly_once(s, 300)
    assert s.kills == 1 and s.worker_starts == 3
    assert 300 - 2 <= s.worker_deliveries <= 300
