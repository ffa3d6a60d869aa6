"""The supervisor of a node's processes (devbridge.apps.supervisor), with real processes and real
signals: a worker killed is started again with a backoff, not forever; a hung one is replaced
and reaped; the end (or SIGTERM to the supervisor) reaps every child and unlinks the rings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import supervised
from test_shared_ring import ring_name

from devbridge import HostRing, InvalidArgumentError
from devbridge.apps.supervisor import Supervisor, TooManyRestarts
from devbridge.ring.segment import SHM_DIR


def starts(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def wait_for(predicate: object, supervisor: Supervisor | None = None, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        if supervisor is not None:
            supervisor.check(timeout=0.05)
        else:
            time.sleep(0.01)


def gone(pid: int) -> bool:
    """Whether process `pid` is reaped (not even a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_killed_worker_is_started_again_after_its_backoff(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    with Supervisor(backoff=0.2, max_backoff=0.2) as supervisor:
        first = supervisor.spawn("worker", supervised.sleeper, str(log), restart=True)
        wait_for(lambda: len(starts(log)) == 1)
        supervisor.kill("worker")
        killed = time.monotonic()
        wait_for(lambda: len(starts(log)) == 2, supervisor)
        assert time.monotonic() - killed >= 0.2  # not before its backoff
        second = supervisor.pid("worker")
        assert starts(log) == [first, second] and first != second and gone(first)
        assert supervisor.restarts("worker") == 1 and supervisor.running("worker")
    assert gone(second)


def test_a_child_that_ends_well_is_not_started_again(tmp_path: Path) -> None:
    log = tmp_path / "producer.log"
    with Supervisor(backoff=0.01) as supervisor:
        pid = supervisor.spawn("producer", supervised.exits, str(log), 0, restart=True)
        wait_for(lambda: not supervisor.running("producer"), supervisor)
        supervisor.check(timeout=0.2)
        assert (starts(log), supervisor.exitcode("producer"), supervisor.restarts("producer")) == ([pid], 0, 0)


def test_a_child_that_dies_too_often_is_not_started_again(tmp_path: Path) -> None:
    log = tmp_path / "crashing.log"
    with Supervisor(backoff=0.01, max_backoff=0.01, max_restarts=3, window=60.0) as supervisor:
        supervisor.spawn("worker", supervised.exits, str(log), 3, restart=True)
        with pytest.raises(TooManyRestarts, match=r"worker died 4 times within 60\.0 s"):
            wait_for(lambda: False, supervisor)
    assert len(starts(log)) == 4  # the first start and three restarts


def test_a_hung_worker_is_replaced_then_reaped_at_the_end(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    with Supervisor() as supervisor:
        first = supervisor.spawn("worker", supervised.sleeper, str(log), restart=True)
        wait_for(lambda: len(starts(log)) == 1)
        supervisor.kill("worker", signal.SIGSTOP)
        old = supervisor.replace("worker")
        wait_for(lambda: len(starts(log)) == 2)
        assert old.pid == first and supervisor.pid("worker") == starts(log)[1] and old.is_alive()
    assert gone(first) and gone(starts(log)[1])  # the stopped one too: continued, then ended


def test_the_end_kills_what_ignores_sigterm_and_unlinks_the_rings(tmp_path: Path) -> None:
    log, name = tmp_path / "stubborn.log", ring_name()
    HostRing.create(name, 4096).close()
    with Supervisor(rings=(name,)) as supervisor:
        pid = supervisor.spawn("stubborn", supervised.stubborn, str(log))
        wait_for(lambda: len(starts(log)) == 1)
    assert gone(pid) and not Path(SHM_DIR, name).exists()


SUPERVISING = """
import sys, time, supervised
from devbridge import HostRing
from devbridge.apps.supervisor import Supervisor
log, name = sys.argv[1], sys.argv[2]
HostRing.create(name, 4096).close()
with Supervisor(rings=(name,)) as supervisor, supervisor.signals():
    for k in range(3):
        supervisor.spawn(f"child-{k}", supervised.sleeper, log, restart=True)
    print("ready", flush=True)
    while True:
        supervisor.check(timeout=0.1)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_supervisor_reaps_every_child_and_unlinks_the_rings(tmp_path: Path, sig: int) -> None:
    log, name = tmp_path / "children.log", ring_name()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISING, str(log), name], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        wait_for(lambda: len(starts(log)) == 3)
        proc.send_signal(sig)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code != 0  # ended by the signal, after the cleanup
    assert all(gone(pid) for pid in starts(log)) and not Path(SHM_DIR, name).exists()


def test_names_are_one_child_each_and_known() -> None:
    with Supervisor() as supervisor:
        with pytest.raises(InvalidArgumentError, match="no child is named 'nobody'"):
            supervisor.pid("nobody")
        supervisor.spawn("a", supervised.sleeper, os.devnull)
        with pytest.raises(InvalidArgumentError, match="a child named 'a' is running"):
            supervisor.spawn("a", supervised.sleeper, os.devnull)


JUNK = [None, True, 0, -1, 2**64, 1.5, float("nan"), b"x", [], {}, object()]


@pytest.mark.parametrize("rings", ["jobs", b"jobs", None, 7, {"jobs": 1}, ("jobs", 3), ["ok", "a/b"], ("",)], ids=repr)
def test_rings_that_name_no_ring_are_refused_when_the_supervisor_is_made(rings: object) -> None:
    """A name alone is not a tuple of names: unlinked at the end, "jobs" would be four rings
    named by its letters (each a segment another program may own)."""
    with pytest.raises(InvalidArgumentError) as info:
        Supervisor(rings=rings)  # type: ignore[arg-type]
    assert info.value.rule == "ARG-1"


def test_a_bad_name_target_restart_or_signal_is_refused_and_starts_nothing(tmp_path: Path) -> None:
    log = tmp_path / "starts.log"
    with Supervisor() as supervisor:
        supervisor.spawn("a", supervised.sleeper, str(log))
        wait_for(lambda: len(starts(log)) == 1)
        calls = [
            *(lambda j=j: supervisor.spawn(j, supervised.sleeper, str(log)) for j in JUNK),  # type: ignore[arg-type]
            *(lambda j=j: supervisor.spawn("b", j, str(log)) for j in (None, 3, "supervised.sleeper")),  # type: ignore[arg-type]
            *(lambda j=j: supervisor.spawn("b", supervised.sleeper, str(log), restart=j) for j in (1, "yes", None)),  # type: ignore[arg-type]
            lambda: supervisor.spawn("b", lambda: None),  # a lambda does not reach a fresh interpreter
            lambda: supervisor.spawn("b", supervised.sleeper, threading_lock()),  # nor does a lock
            *(
                lambda j=j, m=m: getattr(supervisor, m)(j)
                for j in JUNK
                for m in ("pid", "restarts", "running", "exitcode", "kill", "replace")
            ),
            *(lambda j=j: supervisor.kill("a", j) for j in (None, "KILL", 1.0, -1, 0, 65, 999, 2**64, True)),  # type: ignore[arg-type]
        ]
        for call in calls:
            with pytest.raises(InvalidArgumentError) as info:
                call()
            assert info.value.rule == "ARG-1"
        supervisor.check(timeout=0.2)
        assert supervisor.running("a") and supervisor.restarts("a") == 0 and len(starts(log)) == 1
        with pytest.raises(InvalidArgumentError, match="no child is named 'b'"):
            supervisor.pid("b")  # none of the refused spawns left a child behind


@pytest.mark.parametrize("timeout", [float("inf"), 2**64, 1e300])
def test_a_check_that_may_wait_for_ever_returns_when_a_child_ends(tmp_path: Path, timeout: float) -> None:
    log = tmp_path / "starts.log"
    with Supervisor() as supervisor:
        supervisor.spawn("a", supervised.sleeper, str(log))
        wait_for(lambda: len(starts(log)) == 1)
        supervisor.kill("a", signal.SIGTERM)
        began = time.monotonic()
        supervisor.check(timeout=timeout)  # woken by the child's end, not by the clock
        assert time.monotonic() - began < 20
        # (its end closes the sentinel a moment before the kernel lets it be reaped)
        wait_for(lambda: supervisor.exitcode("a") is not None, supervisor)
        assert supervisor.exitcode("a") == -signal.SIGTERM and not supervisor.running("a")


def threading_lock() -> object:
    import threading

    return threading.Lock()
