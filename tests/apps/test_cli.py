"""The command line as a user meets it: every bad option is one line and exit 2, a backend that
fails for good ends the run, nothing hangs. Each runs `python -m devbridge` in a subprocess
with a timeout, from outside the checkout (the installed package, as a user has it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devbridge.apps.example import run_example
from devbridge.apps.worker import GIVE_UP_AFTER, WorkerStalled, run_demo
from devbridge.backends.base import BackendError
from devbridge.backends.fake import FakeBackend
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.errors import InvalidArgumentError

TIMEOUT_S = 60  # each of these ends in well under a second; a hang is what this catches


def devbridge(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devbridge", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


BAD_OPTIONS = [
    (["demo", "--device", "NOPE"], "tinygrad cannot open device 'NOPE'"),
    (["demo", "--faults", "2"], "argument --faults: must be a probability in [0, 1), got 2"),
    (["demo", "--faults", "1"], "argument --faults: must be a probability in [0, 1), got 1"),
    (["demo", "--faults", "-0.1"], "argument --faults: must be a probability in [0, 1), got -0.1"),
    (["demo", "--faults", "often"], "argument --faults: not a number: 'often'"),
    (["demo", "--restart-every", "-3"], "argument --restart-every: must be at least 1, got -3"),
    (["demo", "--restart-every", "0"], "argument --restart-every: must be at least 1, got 0"),
    (["demo", "--objects", "0"], "argument --objects: must be at least 1, got 0"),
    (["demo", "--objects", "-2"], "argument --objects: must be at least 1, got -2"),
    (["demo", "--backend", "fake", "--device", "CPU"], "--device names a tinygrad device; the fake backend has none"),
    (["check", "--depth", "-1"], "argument --depth: must be at least 1, got -1"),
    (["check", "--allocations", "0"], "argument --allocations: must be at least 1, got 0"),
    (["check", "--jobs", "0"], "argument --jobs: must be at least 1, got 0"),
    (["check", "--spans", "6:4"], "each span (offset, size) must lie within an allocation's 8 bytes"),
    (["example", "--floats", "0"], "argument --floats: must be at least 1, got 0"),
    (["example", "--objects", "0"], "argument --objects: must be at least 1, got 0"),
    (["example", "--backend", "tinygrad", "--device", "NOPE"], "tinygrad cannot open device 'NOPE'"),
    (["example", "--jit", "--backend", "tinygrad", "--device", "NOPE"], "tinygrad cannot open device 'NOPE'"),
    # devices that open but cannot run the worker: no copies (NPY), no kernels on a view (NULL, DISK)
    (["demo", "--device", "NPY"], "device NPY cannot upload: "),
    (["demo", "--device", "NULL"], "device NULL cannot run a kernel on a view: "),
    (["demo", "--device", "CPU:0,NULL"], "device NULL cannot run a kernel on a view: "),
    (["example", "--backend", "tinygrad", "--device", "NULL"], "device NULL cannot run a kernel on a view: "),
    (["bench", "--device", "NPY", "--quick"], "device NPY cannot upload: "),
    (["demo", "--inject-late-writes", "1.5"], "argument --inject-late-writes: "),
    (["demo", "--check-host-bytes", "--processes", "1"], "--check-host-bytes and --inject-late-writes run one worker"),
    (["demo", "--inject-late-writes", "0.1", "--device", "CPU:0,CPU:1"], "--inject-late-writes run one worker"),
    # a trace file that cannot be made where a writable-looking directory is: found once the run begins
    (["demo", "--backend", "fake", "--objects", "3", "--trace", "/proc/x"], "trace: cannot create '/proc/x'"),
    (["demo", "--backend", "fake", "--processes", "1", "--trace", "/proc/x"], "trace: cannot create '/proc/x'"),
    (["example", "--trace", "/proc/x"], "trace: cannot create '/proc/x'"),
]


@pytest.mark.parametrize(("args", "says"), BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_a_bad_option_is_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    run = devbridge(tmp_path, *args)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"devbridge {args[0]}: error: ") and says in last, run.stderr
    assert "Traceback" not in run.stderr


def test_injected_faults_that_never_let_up_end_the_demo(tmp_path: Path) -> None:
    run = devbridge(tmp_path, "demo", "--backend", "fake", "--objects", "5", "--faults", "0.999")
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"devbridge demo: the backend failed {GIVE_UP_AFTER} times in a row with no object delivered (the last: "
        "[ALLOC-2] allocating 256 B for b1: injected: alloc of 256 B (see spec/CONTRACT.md#alloc-2)): giving up"
    ]


class CannotAllocate(FakeBackend):
    """A device that is out of memory for good (a real failure, not an injected one)."""

    def alloc(self, nbytes: int, dtype: str) -> object:
        raise BackendError("out of device memory")


def test_a_backend_that_fails_for_good_ends_the_run_with_worker_stalled() -> None:
    backend = CannotAllocate()
    with pytest.raises(WorkerStalled, match=f"failed {GIVE_UP_AFTER} times in a row .*out of device memory"):
        run_demo(objects=3, backend=backend)
    assert backend.calls == []  # never reached the device: every alloc failed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"objects": 0}, "objects must be an int >= 1, got 0"),
        ({"objects": True}, "objects must be an int >= 1, got True"),
        ({"faults": 1.0}, "faults is a probability in [0, 1), got 1.0"),
        ({"faults": float("nan")}, "faults is a probability in [0, 1), got nan"),
        ({"faults": "0.1"}, "faults is a probability in [0, 1), got '0.1'"),
        ({"restart_every": -1}, "restart_every must be an int >= 0 (0: never), got -1"),
        ({"objects": 2**64}, f"objects must be an int <= {2**40}, got {2**64}"),
        ({"batch": 2**64}, f"batch must be an int <= {2**16}, got {2**64}"),
        ({"seed": -1}, "seed must be an int >= 0, got -1"),
        ({"seed": "x"}, "seed must be an int >= 0, got 'x'"),
        ({"seed": 1.5}, "seed must be an int >= 0, got 1.5"),
        ({"progress": 5}, "progress must be callable, got 5"),
    ],
)
def test_run_demo_checks_its_options_before_anything_starts(options: dict[str, object], message: str) -> None:
    backend = FakeBackend()
    with pytest.raises(InvalidArgumentError) as raised:
        run_demo(**{"objects": 3, "backend": backend, **options})  # type: ignore[arg-type]
    assert raised.value.rule == "ARG-1" and raised.value.detail == message
    assert backend.calls == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"devices": "ab"}, "devices must be distinct names, got 'ab'"),
        ({"devices": 3}, "devices must be distinct names, got 3"),
        ({"devices": ["a", "a"]}, "devices must be distinct names, got ['a', 'a']"),
        ({"make": 5}, "make must be callable, got 5"),
        ({"seed": b"x"}, "seed must be an int >= 0, got b'x'"),
        ({"progress": "bar"}, "progress must be callable, got 'bar'"),
        ({"objects": 2**64}, f"objects must be an int <= {2**40}, got {2**64}"),
    ],
)
def test_run_devices_checks_its_options_before_anything_starts(options: dict[str, object], message: str) -> None:
    from devbridge.apps.worker import run_devices

    made: list[str] = []
    with pytest.raises(InvalidArgumentError) as raised:
        run_devices(**{"objects": 3, "devices": ["a", "b"], "backend": "fake", "make": made.append, **options})  # type: ignore[arg-type]
    assert raised.value.rule == "ARG-1" and raised.value.detail == message
    assert made == []  # no backend was made


@pytest.mark.parametrize(
    "options", [{"objects": 0}, {"floats": 0}, {"floats": 2.5}, {"objects": 2**64}, {"seed": -1}, {"seed": "x"}]
)
def test_run_example_checks_its_options(options: dict[str, object]) -> None:
    backend = FakeBackend()
    with pytest.raises(InvalidArgumentError) as raised:
        run_example(**{"backend": backend, **options})  # type: ignore[arg-type]
    assert raised.value.rule == "ARG-1" and backend.calls == []


@pytest.mark.parametrize("options", [{"steps": 0}, {"steps": "6"}, {"restart_at": -1}, {"seed": -1}, {"seed": 1.5}])
def test_run_jit_example_checks_its_options(options: dict[str, object]) -> None:
    from devbridge.apps.example import run_jit_example

    backend = FakeBackend()
    with pytest.raises(InvalidArgumentError) as raised:
        run_jit_example(**{"backend": backend, **options})  # type: ignore[arg-type]
    assert raised.value.rule == "ARG-1" and backend.calls == []


def test_version(tmp_path: Path) -> None:
    from importlib.metadata import version

    run = devbridge(tmp_path, "--version")
    assert (run.returncode, run.stdout, run.stderr) == (0, f"devbridge {version('devbridge')}\n", "")


def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    run = devbridge(tmp_path, "demo", "--backend", "fake", "--objects", "3")
    assert run.returncode == 0 and run.stderr == ""
    assert "lost: 0  duplicated: 0  wrong: 0" in run.stdout


def test_help_texts_carry_no_timings(tmp_path: Path) -> None:
    for command in ("demo", "check", "example"):
        text = devbridge(tmp_path, command, "--help").stdout
        assert " here" not in text and " s)" not in text, text


def test_check_runs_the_lockstep_checker_on_an_in_order_queue(tmp_path: Path) -> None:
    args = ("check", "--profile", "narrow", "--tier", "lockstep", "--depth", "3", "--in-order", "--jobs", "1")
    run = devbridge(tmp_path, *args, "--no-progress")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("bound: Bound(") and "in_order=True" in run.stdout.splitlines()[0]


def test_check_runs_the_ring_protocol_checker(tmp_path: Path) -> None:
    run = devbridge(tmp_path, "check", "--tier", "ring", "--ring-bound", "small")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("ring bound: RingBound(producers=1, records=2")
    assert lines[1].endswith("record transitions covered: 7 of 7")


def test_compiler_chatter_on_file_descriptor_2_is_dropped_and_the_rest_kept(capfd: pytest.CaptureFixture[str]) -> None:
    from devbridge.cli.main import without_compiler_chatter

    with without_compiler_chatter() as live:
        os.write(2, b"1 warning generated.\nan error of our own\n12 warnings generated.\n")
        live.write("a progress bar")
        live.flush()
        os.write(2, b"a warning of our own\n")
    err = capfd.readouterr().err
    assert err == "a progress bar" + "an error of our own\n" + "a warning of our own\n"  # (the bar at once)


@pytest.mark.skipif(TinygradBackend("CL").unusable() is not None, reason="OpenCL does not open here")
def test_the_demo_on_a_fresh_kernel_cache_prints_no_compiler_chatter(tmp_path: Path) -> None:
    """pocl compiles each kernel with clang, which prints "1 warning generated." to fd 2; with
    no kernel cache every kernel is compiled (a fresh machine, as CI's)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run = subprocess.run(
        [sys.executable, "-m", "devbridge", "demo", "--device", "CL", "--objects", "40", "--no-progress"],
        cwd=tmp_path,
        capture_output=True,
        env=env,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == b"" and run.stdout.startswith(b"backend tinygrad:CL: 40/40 objects")
