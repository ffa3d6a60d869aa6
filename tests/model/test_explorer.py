"""The breadth-first search both checkers run (models/explorer.py), on a toy search, and the
processes a level is forked into: they inherit this process's objects and never finalize them (a
test process has often used an OpenCL device and other pools before)."""

from __future__ import annotations

import gc
import os
import signal
from pathlib import Path

import pytest

from devbridge.models.explorer import Expansion, explore, fork_pool


class Grid:
    """Nodes are points (a, b) of a `top` x `top` grid; from each the actions step a or b up by
    one; reaching `bad` is a violation. A level is a diagonal (level L has L + 1 points: past
    FORK_AT * jobs of them it is forked); the shortest path to `bad` has a + b steps."""

    batch, collects = 4, True

    def __init__(self, top: int, bad: tuple[int, int] | None) -> None:
        self.top, self.bad = top, bad

    def expand(self, batch: list[tuple[int, tuple[int, int]]], known: set[tuple[int, int]]) -> Expansion:
        out = Expansion()
        for index, (a, b) in batch:
            for action, new in ((("a",), (a + 1, b)), (("b",), (a, b + 1))):
                out.transitions += 1
                if new == self.bad:
                    out.violation = (index, action, f"reached {new}", "toy")
                    return out
                if max(new) <= self.top and new not in known:
                    known.add(new)
                    out.found.append((new, new, index, action))
        return out


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_first_violation_found_is_a_shortest_path_to_it_whatever_the_processes(jobs: int) -> None:
    out = explore(Grid(60, (40, 41)), (0, 0), (0, 0), depth=None, jobs=jobs)
    assert out.violation is not None
    path, error, kill = out.violation
    assert len(path) == 81 and path.count(("a",)) == 40 and (error, kill) == ("reached (40, 41)", "toy")
    assert out.depth == 81 and not out.exhaustive


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_state_is_reached_once_and_the_search_ends_where_nothing_is_new(jobs: int) -> None:
    out = explore(Grid(60, None), (0, 0), (0, 0), depth=None, jobs=jobs)
    assert (out.states, out.transitions, out.depth, out.exhaustive) == (61 * 61, 2 * 61 * 61, 120, True)
    bounded = explore(Grid(60, None), (0, 0), (0, 0), depth=40, jobs=jobs)
    assert (bounded.states, bounded.depth, bounded.exhaustive) == (41 * 42 // 2, 40, False)


class Finalized:
    """Writes the pid of the process that finalizes it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cycle = self  # unreachable garbage only the collector frees

    def __del__(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def collect(_: int) -> int:
    gc.collect()
    return os.getpid()


def test_a_forked_worker_never_finalizes_what_it_inherited(tmp_path: Path) -> None:
    log = tmp_path / "finalized"
    was = gc.isenabled()
    gc.disable()  # the garbage waits for the collection in the children, as it would between two of ours
    try:
        Finalized(log)
        pool = fork_pool(2)
        try:
            children = set(pool.map(collect, range(8), chunksize=1))
        finally:
            pool.terminate()
        assert not log.exists(), f"finalized in {log.read_text().split()}, children {children}"
        gc.collect()
        assert log.read_text().split() == [str(os.getpid())]  # here, once
    finally:
        if was:
            gc.enable()


def sigterm_of_worker(_: int) -> tuple[str, bool]:
    return str(signal.getsignal(signal.SIGTERM)), signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_forked_worker_ends_at_sigterm_whatever_its_parent_made_of_it() -> None:
    """The pool's `terminate` ends its workers with SIGTERM: a worker must not inherit a parent's
    ignored or blocked SIGTERM (it would outlive `terminate`, whose `join` then waits forever)."""
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        pool = fork_pool(2)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        signal.signal(signal.SIGTERM, before)
    try:
        assert set(pool.map(sigterm_of_worker, range(4))) == {(str(signal.SIG_DFL), False)}
    finally:
        pool.terminate()
