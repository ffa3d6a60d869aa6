"""The fleet on Ray: every object delivered exactly once, by id, while actors are killed.

Skipped, with the reason, where the `ray` extra is not installed (`pip install 'devbridge[ray]'`;
`scripts/setup` installs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from devbridge.apps.fleet import FleetUnavailable, ray_module, run_fleet
from devbridge.cli.main import main
from devbridge.errors import InvalidArgumentError

ray: Any = pytest.importorskip("ray", reason="the fleet's tests need the ray extra: pip install 'devbridge[ray]'")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One local Ray for the module's tests (run_fleet uses a running one and leaves it running)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def run_cli(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "devbridge", *argv], capture_output=True, text=True, timeout=timeout, env=env,
        cwd=Path(__file__).parents[3],
    )  # fmt: skip


def test_killed_actors_lose_nothing_and_duplicate_nothing(cluster: None) -> None:
    """12 batches of 25 over two actors on the fake backend; each time 100 more objects are
    delivered an actor with a batch in flight is killed: its batch is redone by another actor
    and a new actor takes its place. Counted by object id: 300 delivered once each."""
    s = run_fleet(objects=300, workers=2, backend="fake", kill_every=100, batch=25)
    assert (s.objects, s.delivered, s.lost, s.duplicated, s.wrong) == (300, 300, 0, 0, 0) and s.clean
    assert s.kills == 2 and s.replaced == 2 and s.redelivered == 50  # each killed call held one batch of 25
    assert sum(a.killed for a in s.actors) == 2
    assert sum(a.objects for a in s.actors) == 300 and sum(a.batches for a in s.actors) == 12
    assert ray.is_initialized()  # it used the running Ray and left it running


def test_a_fleet_trace_holds_the_driver_and_every_returned_batch_each_a_process_of_its_own(
    cluster: None, tmp_path: Path
) -> None:
    """The driver's batches are spans on one track per actor, kills are marked on them, and each
    batch whose call returned brings its bridge's timeline as a process of its own, on the
    driver's clock; the whole checks against the spec."""
    from devbridge.bridge.trace import check_trace
    from devbridge.spec import load

    path = tmp_path / "fleet.json"
    s = run_fleet(objects=120, workers=2, backend="fake", kill_every=50, batch=20, trace=str(path))
    assert s.clean and s.kills == 2
    events = json.loads(path.read_text())
    assert check_trace(events, {(t.source, t.dest) for t in load().transitions}) == []
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[0] == "fleet driver"
    batches = sorted(n.split(", ")[2].split(":")[0] for pid, n in names.items() if pid)
    returned = [e for e in events if e["ph"] == "e" and e.get("cat") == "batch" and e["args"]["ended"] == "delivered"]
    assert len(batches) == len(returned) == 6  # one process per returned batch, 6 batches of 20
    assert sorted(e["name"] for e in returned) == batches
    assert set(batches) == {f"objects {k}..{k + 19}" for k in range(0, 120, 20)}
    died = [e for e in events if e["ph"] == "e" and e.get("cat") == "batch" and e["args"]["ended"] == "its actor died"]
    kills = [e for e in events if e["ph"] == "i" and e["name"].endswith("killed")]
    assert len(died) == len(kills) == 2 and all(e["pid"] == 0 for e in died + kills)
    end = max(e["ts"] for e in events if e["pid"] == 0)
    for pid in (p for p in names if p):  # each batch's events lie within the driver's run, on its clock
        stamps = [e["ts"] for e in events if e["pid"] == pid and e["ph"] != "M"]
        assert stamps and min(stamps) >= 0 and max(stamps) <= end
        assert any(e["pid"] == pid and e["ph"] == "B" for e in events)  # allocations' states are in it


def test_a_batch_that_always_fails_is_tried_a_bounded_number_of_times(cluster: None) -> None:
    """A backend that fails nearly everything makes each worker give up (WorkerStalled); the
    batch is tried again on a live actor, then counted lost: the run ends, and says so."""
    s = run_fleet(objects=10, workers=2, backend="fake", batch=10, faults=0.999)
    assert (s.delivered, s.lost, s.duplicated) == (0, 10, 0) and not s.clean
    assert sum(a.batches for a in s.actors) == 0


@pytest.mark.parametrize(
    ("options", "detail"),
    [
        ({"workers": 0}, "workers must be an int >= 1, got 0"),
        ({"batch": 0}, "batch must be an int >= 1, got 0"),
        ({"kill_every": -1}, "kill_every must be an int >= 0, got -1"),
        ({"objects": 0}, "objects must be an int >= 1, got 0"),
        ({"devices": []}, "devices must be a non-empty list of device names (None: tinygrad's default), got []"),
        ({"devices": "CPU"}, "devices must be a non-empty list of device names (None: tinygrad's default), got 'CPU'"),
        (
            {"backend": "tinygrad", "devices": [3]},
            "devices must be a non-empty list of device names (None: tinygrad's default), got [3]",
        ),
        ({"devices": ["CPU"]}, "the fake backend has no devices: each must be None, got ['CPU']"),
        ({"backend": "cuda"}, "backend must be 'fake' or 'tinygrad', got 'cuda'"),
        ({"address": 5}, "address must be None or a Ray address, got 5"),
        ({"progress": 5}, "progress must be callable, got 5"),
        ({"seed": "x"}, "seed must be an int >= 0, got 'x'"),
    ],
)
def test_bad_options_are_refused_before_ray_starts(options: dict[str, Any], detail: str) -> None:
    started = ray.is_initialized()
    with pytest.raises(InvalidArgumentError) as refused:
        run_fleet(**{"backend": "fake", **options})
    assert refused.value.rule == "ARG-1" and refused.value.detail == detail
    assert ray.is_initialized() == started


def test_a_device_that_does_not_open_ends_the_run_with_its_error(cluster: None) -> None:
    """Its actor fails as it is made, and would each time: the run ends with ARG-1 naming why."""
    with pytest.raises(InvalidArgumentError) as refused:
        run_fleet(objects=4, workers=1, backend="tinygrad", devices=["NOPE"], batch=2)
    assert refused.value.rule == "ARG-1"
    assert refused.value.detail.startswith("an actor of the fleet could not start: tinygrad cannot open device 'NOPE'")


def test_without_ray_the_fleet_says_how_to_get_it(capsys: pytest.CaptureFixture[str]) -> None:
    with mock.patch("devbridge.apps.fleet.importlib.import_module", side_effect=ImportError("no ray")):
        with pytest.raises(FleetUnavailable, match=r"pip install 'devbridge\[ray\]'"):
            ray_module()
        with pytest.raises(FleetUnavailable):
            run_fleet(objects=4, backend="fake")
        assert main(["fleet", "--backend", "fake", "--objects", "4", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "devbridge fleet: error: the fleet runs on Ray: pip install 'devbridge[ray]'\n"


def test_cli_two_tinygrad_actors_with_kills_deliver_every_object_once() -> None:
    """The issue's run: `devbridge fleet --workers 2 --kill-every 200` (600 objects, batches of
    50, actors on CPU:0 and CPU:1 of tinygrad), from a shell."""
    got = run_cli("fleet", "--workers", "2", "--kill-every", "200", "--no-progress", "--json")
    assert got.returncode == 0, got.stderr[-2000:]
    s = json.loads(got.stdout)
    assert (s["objects"], s["delivered"], s["lost"], s["duplicated"], s["wrong"]) == (600, 600, 0, 0, 0)
    assert s["kills"] == s["replaced"] == 2 and s["redelivered"] == 100
    assert [a["device"] for a in s["actors"]] == ["CPU:0", "CPU:1"]
    text = run_cli("fleet", "--workers", "1", "--objects", "40", "--batch", "20", "--backend", "fake", "--no-progress")
    assert text.returncode == 0, text.stderr[-2000:]
    assert text.stdout.startswith(
        "objects 40  delivered 40  lost 0  duplicated 0  wrong 0\n1 actor:\n  None: 2 batches"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "0"], "argument --workers: must be at least 1, got 0"),
        (["--kill-every", "-2"], "argument --kill-every: must be at least 0, got -2"),
        (["--device", "NOPE"], "devbridge fleet: error:"),
        (["--backend", "fake", "--device", "CPU:0"], "--device names a tinygrad device; the fake backend has none"),
    ],
)
def test_cli_refuses_bad_options_in_one_line(argv: list[str], message: str) -> None:
    got = run_cli("fleet", "--no-progress", *argv, timeout=60)
    assert got.returncode == 2 and got.stdout == ""
    assert message in got.stderr.strip().splitlines()[-1]  # the error is one line (after argparse's usage)
    assert "Traceback" not in got.stderr


def orphaned_actors() -> set[int]:
    """This machine's fleet actor processes (their command line names the class) whose parent,
    their Ray, is gone (init adopted them). Live fleets of other tests have a parent."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(b"ray::DeviceActor"):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == 1:
                    pids.add(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return pids


SCRIPT = """
import ray
from devbridge.apps.fleet import run_fleet
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
try:
    for workers in (1, 2, 1, 2):
        assert run_fleet(objects=20, workers=workers, backend="fake", batch=10).clean
finally:
    ray.shutdown()
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the processes from /proc")
def test_a_run_s_actors_are_gone_when_it_returns() -> None:
    """A script's runs in a Ray of its own, shut down right after the last one returns: no actor
    process of theirs outlives them (a kill still on its way when Ray shut down used to leave
    the actor's process running, its parent gone)."""
    before = orphaned_actors()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    subprocess.run([sys.executable, "-c", SCRIPT], check=True, capture_output=True, timeout=240, env=env)
    assert orphaned_actors() - before == set()


def test_an_actor_compiles_in_its_own_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """tinygrad's pool of compile processes would outlive an actor killed with ray.kill (its
    processes orphaned, its semaphores left in /dev/shm): an actor compiles in its own process,
    unless the user set PARALLEL."""
    import tinygrad.helpers

    from devbridge.apps.fleet import DeviceActor

    monkeypatch.setattr(tinygrad.helpers.PARALLEL, "value", 2)  # (put back after the test)
    monkeypatch.delenv("PARALLEL", raising=False)
    DeviceActor("fake", None, 0.0, 0, 0)
    assert tinygrad.helpers.PARALLEL.value == 0
    monkeypatch.setenv("PARALLEL", "3")
    tinygrad.helpers.PARALLEL.value = 3
    DeviceActor("fake", None, 0.0, 0, 0)
    assert tinygrad.helpers.PARALLEL.value == 3
