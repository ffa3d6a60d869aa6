"""Copy and compute events as the worker sees them."""

from __future__ import annotations

import math
import time
from types import TracebackType
from typing import TYPE_CHECKING

from devbridge.errors import BridgeError, WaitTimeoutError
from devbridge.types import DeviceHandle, DeviceRange, HostRange, as_seconds

if TYPE_CHECKING:
    from devbridge.bridge import Bridge


class Event:
    """A use in flight on the backend. Done once the backend finished it and the Bridge
    applied its effects (released host bytes, made output valid, ran deferred frees)."""

    def __init__(self, bridge: Bridge, use_id: int, backend_token: object) -> None:
        self._bridge = bridge
        self.use_id = use_id
        self.backend_token = backend_token
        self._done = False
        self._error: BridgeError | None = None

    def done(self) -> bool:
        if not self._done:
            self._bridge._refresh(self)
        return self._done

    @property
    def error(self) -> BridgeError | None:
        """The failure (DeviceCopyError, OutputCopyError, ComputeError, or StaleHandleError
        for a use a restart aborted); None while pending or on success."""
        self.done()
        return self._error

    def wait(self, timeout: float | None = None) -> None:
        """Block until done; raise the event's failure. WaitTimeoutError (a TimeoutError) if
        `timeout` seconds pass first (WAIT-1): the wait blocks on the backend, never spins."""
        deadline = _deadline(timeout)
        while not self.done():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise WaitTimeoutError("WAIT-1", f"{self!r} not done after {timeout} s")
            self._bridge._wait_backend(self, remaining)
        if self._error is not None:
            raise self._error

    def _settle(self, error: BridgeError | None) -> None:
        self._error = error
        self._done = True


def _deadline(timeout: object) -> float | None:
    """When a wait of `timeout` seconds ends (None: never). ARG-1 for anything but None or a
    non-negative number."""
    if timeout is None:
        return None
    seconds = as_seconds(timeout, "timeout")
    return None if math.isinf(seconds) else time.monotonic() + seconds


class CopyEvent(Event):
    """A host_to_device or device_to_host copy. `src` and `dst` are exactly the requested ranges."""

    def __init__(
        self,
        bridge: Bridge,
        use_id: int,
        backend_token: object,
        src: HostRange | DeviceRange,
        dst: HostRange | DeviceRange,
    ) -> None:
        super().__init__(bridge, use_id, backend_token)
        self.src = src
        self.dst = dst

    def __repr__(self) -> str:
        return f"CopyEvent(#{self.use_id}, {self.src!r} -> {self.dst!r})"


class ComputeEvent(Event):
    """Compute on `handles`: they are in use by compute from the call until the event is done.

    As a context manager the event stays open for the block (the work the block
    enqueues is covered) and cannot complete before the block exits.
    """

    def __init__(self, bridge: Bridge, use_id: int, backend_token: object, handles: tuple[DeviceHandle, ...]) -> None:
        super().__init__(bridge, use_id, backend_token)
        self.handles = handles
        self.open = False

    def __enter__(self) -> ComputeEvent:
        self.open = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.open = False
        self._bridge._closed(self)

    def wait(self, timeout: float | None = None) -> None:
        """Waiting declares the compute work submitted: an open event is closed first."""
        _deadline(timeout)  # a refused timeout leaves the event open
        if self.open:
            self.open = False
            self._bridge._closed(self)
        super().wait(timeout)

    def __repr__(self) -> str:
        return f"ComputeEvent(#{self.use_id}, handles={[h.id for h in self.handles]})"
