"""The Backend protocol: what the Bridge asks of device memory.

A backend moves bytes and reports completion; it makes no lifetime decision.
Buffers and event tokens are opaque to the Bridge. Any operation may raise
`BackendError` for a device-side failure; the Bridge maps it to the typed
error of the contract. A backend must never be asked to free memory in use,
and the fake backend checks exactly that on its own.

A failing `query`, `wait` or `extend` settles its event as failed, and the
allocations it used may then be released: a backend raises there only for
work that will not touch memory again (finished, or abandoned by the device);
when it cannot tell, it reports the event pending. A failing `free` is
reported and never retried: the Bridge asks once per buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from devbridge.args import as_count
from devbridge.errors import InvalidArgumentError, short

# the core's vocabulary for a token's status, which a backend's `query` answers in
from devbridge.statemachine.status import OK as OK
from devbridge.statemachine.status import PENDING as PENDING
from devbridge.statemachine.status import Status as Status


class BackendError(Exception):
    """A device-side failure (allocation, copy, compute or view)."""


#: Backend operations a test can make fail (FakeBackend.fail_next, FaultyBackend.fail_next).
FAULTABLE = ("alloc", "free", "copy_in", "copy_out", "compute", "view", "query", "wait")


def fault_count(op: object, times: object) -> int:
    """`times` as a count of faults to arm for `op`; ARG-1 for an unknown op or a bad count."""
    count = as_count(times)
    if type(op) is not str or op not in FAULTABLE or count is None or count <= 0:
        raise InvalidArgumentError(
            "ARG-1", f"fail_next needs an op in {FAULTABLE} and times > 0, got {short(op)}, {short(times)}"
        )
    return count


T = TypeVar("T")


@runtime_checkable
class Backend(Protocol):
    """Device memory for one Bridge."""

    name: str

    def begin_generation(self, generation: int) -> None:
        """A restart began `generation`; older buffers may now only be freed."""

    def alloc(self, nbytes: int, dtype: str) -> object:
        """Allocate `nbytes` bytes of device memory."""

    def free(self, buffer: object) -> None:
        """Release a buffer. Called exactly once per buffer, never while it is in use."""

    def copy_in(self, buffer: object, offset: int, src: memoryview, *, sync: bool) -> object:
        """Copy host bytes `src` into the buffer at `offset`; returns an event token.

        With sync=True the copy is complete on return. Otherwise `src` must stay
        valid until the token is done, and is read no later than that."""

    def copy_out(self, dst: memoryview, buffer: object, offset: int, *, sync: bool) -> object:
        """Copy `len(dst)` device bytes from `offset` into host bytes `dst`; returns an event token."""

    def compute(self, buffers: Sequence[object]) -> object:
        """A completion marker for compute work on `buffers`; returns an event token."""

    def extend(self, token: object) -> None:
        """A compute marker now covers all work queued so far (a `with compute()` block exited)."""

    def view(self, buffer: object, offset: int, shape: tuple[int, ...], dtype: str) -> Any:
        """A zero-copy tinygrad Tensor over the buffer's bytes at `offset`."""

    def view_anchor(self, view: Any) -> object:
        """The object every tinygrad object that can reach `view`'s memory keeps alive (derived
        tensors, lazy graphs, assign targets, tensors that took it over, JIT captures): the
        view's use ends when it is collected (VIEW-3)."""

    def view_alignment(self, dtype: str) -> int:
        """The byte alignment a view's offset of `dtype` needs for the device to run on it (VIEW-2);
        0 where the device has no sub-buffer views (OpenCL): a view starts at offset 0."""

    def query(self, token: object) -> Status:
        """The token's status now. Never blocks."""

    def wait(self, token: object, timeout: float | None) -> bool:
        """Block until the token is done or `timeout` seconds pass; whether it is done.

        A backend whose `wait` itself runs the work it waits for (a device that runs queued
        work when synchronized with; the fake, by default) says so with an attribute
        `waits_run_work = True`: then `Bridge.wait_any` waits on the first pending event it is
        given, with no timeout, as `Event.wait` and `Bridge.wait_all` do, instead of sleeping
        until a completion is reported."""

    def subscribe(self, callback: Callable[[object], None]) -> bool:
        """Ask to be called with each token as it completes; False if the backend cannot."""


def implements(protocol: type) -> Callable[[type[T]], type[T]]:
    """A class decorator: each method of `protocol` the class defines without a docstring gets
    the protocol's, so `help(FakeBackend.copy_in)` reads as the contract it implements."""

    def document(cls: type[T]) -> type[T]:
        for name, member in vars(protocol).items():
            mine = vars(cls).get(name)
            if callable(member) and callable(mine) and not getattr(mine, "__doc__", None):
                mine.__doc__ = member.__doc__
        return cls

    return document
