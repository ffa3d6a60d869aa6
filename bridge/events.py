"""Copy and compute events as the worker sees them. An event asks the engine of the Bridge that
issued it (devbridge.bridge.engine) to apply what the backend finished, to block on the backend,
to open and close a compute's block; the engine settles it (`settle`), and only it."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from devbridge.args import as_seconds
from devbridge.errors import BridgeError, WaitTimeoutError
from devbridge.ring.host import HostRange
from devbridge.types import DeviceHandle, DeviceRange


class Issuer(Protocol):
    """What an event asks of the engine of the Bridge that issued it (devbridge.bridge.engine)."""

    def refresh_event(self, event: Event) -> None:
        """Apply what the backend finished for `event` (and for what it follows)."""

    def block(self, event: Event, timeout: float | None) -> None:
        """Block on the backend until it may have finished `event`, or `timeout` seconds pass."""

    def enter(self, event: ComputeEvent) -> None:
        """A compute's block begins: it cannot end before the block does."""

    def close(self, event: ComputeEvent) -> None:
        """A compute's block is over: its work is all enqueued."""

    def future(self, event: Event) -> asyncio.Future[None]:
        """An asyncio future of the running loop that ends as `event` does."""


@dataclass(eq=False, repr=False)
class Event:
    """A use in flight on the backend. Done once the backend finished it and the Bridge
    applied its effects (released host bytes, made output valid, ran deferred frees).
    Its bridge makes it (a dataclass: each kind's fields set in one generated call)."""

    _engine: Issuer
    use_id: int
    backend_token: object
    _done: bool = False  # (True: a copy done before its event was made, a synchronous one)
    _error: BridgeError | None = field(default=None, init=False)

    def _settle(self, error: BridgeError | None) -> None:
        """Done, its effects applied (by its bridge's engine only); `error`: its failure."""
        self._error = error
        self._done = True

    def done(self) -> bool:
        """Whether the use is over and its effects applied; asks the bridge to apply what the
        backend finished, never blocks. Never raises."""
        if not self._done:
            self._engine.refresh_event(self)
        return self._done

    @property
    def error(self) -> BridgeError | None:
        """The failure (DeviceCopyError, OutputCopyError, ComputeError, or StaleHandleError
        for a use a restart aborted); None while pending or on success."""
        self.done()
        return self._error

    def __await__(self) -> Generator[Any, None, None]:
        """`await event` in asyncio: returns once it is done, raises its failure; with
        `asyncio.wait_for(event, timeout)` for a timeout. No thread per event: the bridge's
        one watcher settles every awaited event as the backend reports completions."""
        return self._engine.future(self).__await__()

    def wait(self, timeout: float | None = None) -> None:
        """Block until done; raise the event's failure. WaitTimeoutError (a TimeoutError) if
        `timeout` seconds pass first (WAIT-1): the wait blocks on the backend, never spins."""
        ends = deadline(timeout)
        if not self._done:  # (done already, the common case: no call)
            wait_done(self, ends, timeout)
        if self._error is not None:
            raise self._error


def issued_by(event: object, engine: Issuer) -> bool:
    """Whether `event` is an event of the bridge whose engine is `engine`."""
    return isinstance(event, Event) and event._engine is engine


def settle(event: Event, error: BridgeError | None) -> None:
    """The event is done, its use's effects applied; `error` is its failure, if any (the Bridge
    that issued it calls this, through its engine, and only it)."""
    event._settle(error)


def wait_done(event: Event, ends: float | None, timeout: object) -> None:
    """The one wait for one event (Event.wait, Bridge.wait_all): block on the backend through the
    event's engine until it is done; WaitTimeoutError (WAIT-1) once `ends` (a `deadline` of
    `timeout`) passes."""
    while not event.done():
        remaining = None if ends is None else ends - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise WaitTimeoutError("WAIT-1", f"{event!r} not done after {timeout} s")
        event._engine.block(event, remaining)


def deadline(timeout: object) -> float | None:
    """When a wait of `timeout` seconds ends (None: never). ARG-1 for anything but None or a
    non-negative number."""
    if timeout is None:
        return None
    seconds = as_seconds(timeout, "timeout")
    return None if math.isinf(seconds) else time.monotonic() + seconds


@dataclass(eq=False, repr=False)
class CopyEvent(Event):
    """A host_to_device or device_to_host copy. `src` and `dst` are exactly the requested ranges."""

    src: HostRange | DeviceRange = field(kw_only=True)
    dst: HostRange | DeviceRange = field(kw_only=True)

    def __repr__(self) -> str:
        return f"CopyEvent(#{self.use_id}, {self.src!r} -> {self.dst!r})"


@dataclass(eq=False, repr=False)
class ComputeEvent(Event):
    """Compute on `handles`: they are in use by compute from the call until the event is done.

    As a context manager the event stays open for the block (the work the block
    enqueues is covered) and cannot complete before the block exits.
    """

    handles: tuple[DeviceHandle, ...] = field(kw_only=True)
    open: bool = field(default=False, init=False)

    def __enter__(self) -> ComputeEvent:
        """Open the block: the tinygrad work it queues is what the compute covers, so the
        event cannot complete before the block ends."""
        self.open = True
        self._engine.enter(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the block: its work is all queued; the event completes when the device has run
        it. An exception in the block passes through."""
        self.open = False
        self._engine.close(self)

    def wait(self, timeout: float | None = None) -> None:
        """Waiting declares the compute work submitted: an open event is closed first."""
        deadline(timeout)  # a refused timeout leaves the event open
        if self.open:
            self.open = False
            self._engine.close(self)
        super().wait(timeout)

    def __repr__(self) -> str:
        return f"ComputeEvent(#{self.use_id}, handles={[h.id for h in self.handles]})"
