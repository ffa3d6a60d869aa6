"""FaultyBackend: wraps any backend, records its calls, and fails the ones a test chooses.

Fault injection for real backends (the fake has its own `fail_next`): a
synchronous call fails by raising `BackendError` before reaching the inner
backend; an asynchronous copy or compute fails at completion: the inner
backend does its work, and the event reports failure when it is done.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from devbridge.backends.base import Backend, BackendError, Status

FAULTABLE = ("alloc", "copy_in", "copy_out", "compute", "view")


class FaultyBackend:
    def __init__(
        self,
        inner: Backend,
        rate: float = 0.0,
        seed: int = 0,
        random_ops: tuple[str, ...] = ("alloc", "copy_in", "copy_out"),
    ) -> None:
        """`rate`: besides the faults a test arms, fail each call of `random_ops` with this probability."""
        self.inner = inner
        self.name = f"faulty({inner.name})"
        self.ops: list[str] = []
        self.injected: Counter[str] = Counter()  # faults that fired, by op
        self.rate, self.random_ops = rate, random_ops
        self._rng = random.Random(seed)
        self._faults: Counter[str] = Counter()
        # tokens that must report failure, by id(); held so that no later token reuses the id
        self._failing: dict[int, object] = {}

    def fail_next(self, op: str, times: int = 1) -> None:
        if op not in FAULTABLE:
            raise ValueError(f"fail_next: op must be one of {FAULTABLE}, got {op!r}")
        self._faults[op] += times

    def _fault(self, op: str) -> bool:
        self.ops.append(op)
        if self._faults[op] > 0:
            self._faults[op] -= 1
        elif not (self.rate and op in self.random_ops and self._rng.random() < self.rate):
            return False
        self.injected[op] += 1
        return True

    def begin_generation(self, generation: int) -> None:
        self.inner.begin_generation(generation)

    def alloc(self, nbytes: int, dtype: str) -> object:
        if self._fault("alloc"):
            raise BackendError(f"injected: alloc of {nbytes} B")
        return self.inner.alloc(nbytes, dtype)

    def free(self, buffer: object) -> None:
        self.ops.append("free")
        self.inner.free(buffer)

    def copy_in(self, buffer: object, offset: int, src: memoryview, *, sync: bool) -> object:
        return self._maybe(self._fault("copy_in"), sync, lambda: self.inner.copy_in(buffer, offset, src, sync=sync))

    def copy_out(self, dst: memoryview, buffer: object, offset: int, *, sync: bool) -> object:
        return self._maybe(self._fault("copy_out"), sync, lambda: self.inner.copy_out(dst, buffer, offset, sync=sync))

    def compute(self, buffers: Sequence[object]) -> object:
        return self._maybe(self._fault("compute"), False, lambda: self.inner.compute(buffers))

    def extend(self, token: object) -> None:
        self.inner.extend(token)

    def view(self, buffer: object, offset: int, shape: tuple[int, ...], dtype: str) -> Any:
        if self._fault("view"):
            raise BackendError(f"injected: view {shape} {dtype}")
        return self.inner.view(buffer, offset, shape, dtype)

    def query(self, token: object) -> Status:
        status = self.inner.query(token)
        return Status(True, "injected failure") if status.done and id(token) in self._failing else status

    def wait(self, token: object, timeout: float | None) -> bool:
        return self.inner.wait(token, timeout)

    def subscribe(self, callback: Callable[[object], None]) -> bool:
        return self.inner.subscribe(callback)

    def _maybe(self, fail: bool, sync: bool, call: Callable[[], object]) -> object:
        if fail and sync:
            raise BackendError("injected: synchronous failure")
        token = call()
        if fail:
            self._failing[id(token)] = token
        return token

    def __getattr__(self, name: str) -> Any:
        # Test controls of the inner backend (complete, hold_copies, ...) pass through.
        return getattr(self.inner, name)
