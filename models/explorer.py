"""What both checkers' breadth-first searches share: the processes a level is expanded in."""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.pool
from collections.abc import Callable
from typing import Any


def fork_pool(
    jobs: int, initializer: Callable[..., object] | None = None, initargs: tuple[Any, ...] = ()
) -> multiprocessing.pool.Pool:
    """`jobs` processes forked from this one (they inherit its state: nothing is sent).

    Every object this process holds is frozen out of the garbage collector for the fork, so a
    child never finalizes what it inherited: a parent's OpenCL event released by a child, or a
    pipe of an earlier pool closed under the number a newer pool's pipe has by then, lost that
    pool its results and hung the search (a process that had used a CL device, then forked)."""
    gc.freeze()
    try:
        return multiprocessing.get_context("fork").Pool(jobs, initializer, initargs)
    finally:
        gc.unfreeze()
