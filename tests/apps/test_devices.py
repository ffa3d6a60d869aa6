"""Several devices in one process: one bridge per device, objects sharded
across them, every object delivered exactly once across all of them, under faults, restarts and a
device that stays down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devbridge.apps.worker import GIVE_UP_AFTER, run_devices
from devbridge.backends.base import Backend, BackendError
from devbridge.backends.fake import FakeBackend
from devbridge.errors import InvalidArgumentError


def test_two_fake_devices_deliver_every_object_once_under_faults_and_restarts() -> None:
    s = run_devices(120, ["a", "b"], backend="fake", faults=0.1, restart_every=15, seed=3)
    assert (s.objects, s.delivered, s.lost, s.duplicated, s.wrong, s.redone) == (120, 120, 0, 0, 0, 0)
    assert [(d.device, d.objects, d.delivered, d.stalled) for d in s.devices] == [
        ("a", 60, 60, ""),
        ("b", 60, 60, ""),
    ]
    assert all(d.restarts >= 3 and d.faults_injected > 0 and d.faults_recovered > 0 for d in s.devices)
    assert s.clean


class DownDevice(FakeBackend):
    """A device that cannot allocate at all: its worker gives up (WorkerStalled)."""

    def alloc(self, nbytes: int, dtype: str) -> object:
        raise BackendError("device lost")


def test_a_device_that_stays_down_has_its_objects_redone_on_another() -> None:
    made: list[str] = []

    def make(device: str) -> Backend:
        made.append(device)
        return DownDevice() if device == "down" else FakeBackend()

    s = run_devices(30, ["up", "down"], backend="fake", seed=1, make=make)
    assert (s.delivered, s.lost, s.duplicated, s.wrong, s.redone) == (30, 0, 0, 0, 15)
    up, down, redo = s.devices
    assert (up.device, up.objects, up.delivered, up.stalled) == ("up", 15, 15, "")
    assert (down.device, down.objects, down.delivered) == ("down", 15, 0)
    assert f"failed {GIVE_UP_AFTER} times in a row" in down.stalled and "device lost" in down.stalled
    assert (redo.device, redo.objects, redo.delivered, redo.stalled) == ("up (redoing)", 15, 15, "")
    assert made == ["up", "down", "up"] and s.clean


@pytest.mark.parametrize("devices", [[], ["a", "a"], ["a", 3]])
def test_devices_must_be_distinct_names(devices: list[object]) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        run_devices(4, devices, backend="fake")  # type: ignore[arg-type]
    assert raised.value.rule == "ARG-1"


FAULTY = ("--faults", "0.05", "--restart-every", "50")


def test_the_demo_on_two_tinygrad_cpu_devices_reports_each(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "devbridge", "demo", "--device", "CPU:0,CPU:1", "--objects", "200", *FAULTY],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("2 devices: 200/200 objects in ") and lines[0].endswith(", 0 redone on another device")
    assert lines[1].startswith("  CPU:0: 100/100 objects in ") and lines[2].startswith("  CPU:1: 100/100 objects in ")
    assert lines[-1] == "lost: 0  duplicated: 0  wrong: 0"


@pytest.mark.parametrize(
    ("device", "says"),
    [
        ("CPU:0,NOPE", "tinygrad cannot open device 'NOPE'"),
        ("CPU:0,CPU:0", "--device needs distinct device names, got 'CPU:0,CPU:0'"),
        ("CPU:0,", "--device needs distinct device names, got 'CPU:0,'"),
    ],
)
def test_bad_device_lists_are_one_line_and_exit_2(tmp_path: Path, device: str, says: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "devbridge", "demo", "--device", device],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and run.stdout == ""
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("devbridge demo: error: ") and says in last, run.stderr


def test_the_devices_summary_as_json(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "devbridge", "demo", "--device", "CPU:0,CPU:1", "--objects", "20", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert {k: got[k] for k in ("objects", "delivered", "lost", "duplicated", "wrong", "redone", "clean")} == {
        "objects": 20, "delivered": 20, "lost": 0, "duplicated": 0, "wrong": 0, "redone": 0, "clean": True,
    }  # fmt: skip
    assert [(d["device"], d["objects"], d["delivered"], d["stalled"]) for d in got["devices"]] == [
        ("CPU:0", 10, 10, ""),
        ("CPU:1", 10, 10, ""),
    ]
