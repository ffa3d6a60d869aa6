"""The processes a checker's level is forked into: they inherit this process's objects and never
finalize them (a test process has often used an OpenCL device and other pools before)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

from devbridge.models.explorer import fork_pool


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
