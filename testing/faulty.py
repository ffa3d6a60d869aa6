"""FaultyBackend: wraps any backend, records its calls, and fails the ones a test chooses.

Fault injection for real backends (the fake has its own `fail_next`): a
synchronous call fails by raising `BackendError` before reaching the inner
backend; an asynchronous copy or compute fails at completion: the inner
backend does its work, and the event reports failure when it is done. A
failing `free` raises without freeing (the buffer is the inner backend's to
reclaim when dropped). A failing `query` or `wait` raises only for an event
the inner backend has finished: a backend may say it lost work only when the
work no longer touches memory (the Backend protocol); on a pending event the
fault stays armed.

Failing tokens are held weakly and forgotten once their failure is reported
(the Bridge settles an event on the first query that finds it done); the op log keeps
the last `log_limit` ops, so a long faulty run stays bounded.
"""

from __future__ import annotations

import random
import weakref
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

from devbridge.args import count, refuse
from devbridge.backends.base import FAULTABLE, Backend, BackendError, fault_count, implements
from devbridge.errors import short
from devbridge.statemachine.status import Status


@implements(Backend)
class FaultyBackend:
    """Any backend, with the faults a test chooses (`fail_next`) or draws (`rate`): the module's
    docstring says how each op fails. `ops` and `injected` record what happened."""

    def __init__(
        self,
        inner: Backend,
        rate: float = 0.0,
        seed: int = 0,
        random_ops: tuple[str, ...] = ("alloc", "copy_in", "copy_out"),
        log_limit: int = 100_000,
    ) -> None:
        """`rate`: besides the faults a test arms, fail each call of `random_ops` with this
        probability (ARG-1 for an inner that is no backend, or an option out of its range)."""
        if not isinstance(getattr(inner, "name", None), str) or not callable(getattr(inner, "alloc", None)):
            refuse(f"inner must be a backend, got {short(inner)}")
        if not (isinstance(rate, int | float) and not isinstance(rate, bool) and 0.0 <= rate <= 1.0):
            refuse(f"rate must be a probability in [0, 1], got {short(rate)}")
        if type(random_ops) is not tuple or not all(op in FAULTABLE for op in random_ops):
            refuse(f"random_ops must be a tuple of ops in {FAULTABLE}, got {short(random_ops)}")
        count("seed", seed)
        log_limit = count("log_limit", log_limit, most=1 << 40)
        self.inner = inner
        self.name = f"faulty({inner.name})"
        self.ops: deque[str] = deque(maxlen=log_limit)  # the latest backend ops, oldest first
        self.injected: Counter[str] = Counter()  # faults that fired, by op
        self.rate, self.random_ops = rate, random_ops
        self._rng = random.Random(seed)
        self._faults: Counter[str] = Counter()
        # tokens that must report failure: weak, so a settled token the bridge dropped is forgotten
        self._failing: weakref.WeakSet[Any] = weakref.WeakSet()

    def fail_next(self, op: str, times: int = 1) -> None:
        """Make the next `times` calls of `op` fail (ARG-1 for an op it cannot fail, or times < 1)."""
        self._faults[op] += fault_count(op, times)

    @property
    def failing(self) -> int:
        """Tokens still held because they must report an injected failure."""
        return len(self._failing)

    def _fault(self, op: str, log: bool = True) -> bool:
        if log:
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
        if self._fault("free"):
            raise BackendError("injected: free")
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

    def view_anchor(self, view: Any) -> object:
        return self.inner.view_anchor(view)

    def view_alignment(self, dtype: str) -> int:
        return self.inner.view_alignment(dtype)

    def query(self, token: object) -> Status:
        status = self.inner.query(token)
        if status.done and self._fault("query", log=False):
            raise BackendError("injected: query")
        if status.done and token in self._failing:
            self._failing.discard(token)  # reported once, to the query that finds it done: then forgotten
            return Status(True, "injected failure")
        return status

    def wait(self, token: object, timeout: float | None) -> bool:
        done = self.inner.wait(token, timeout)
        if done and self._fault("wait", log=False):
            raise BackendError("injected: wait")
        return done

    def subscribe(self, callback: Callable[[object], None]) -> bool:
        return self.inner.subscribe(callback)

    def _maybe(self, fail: bool, sync: bool, call: Callable[[], object]) -> object:
        if fail and sync:
            raise BackendError("injected: synchronous failure")
        token = call()
        if fail:
            self._failing.add(token)
        return token

    def __getattr__(self, name: str) -> Any:
        # Test controls of the inner backend (complete, hold_copies, ...) pass through.
        return getattr(self.inner, name)
