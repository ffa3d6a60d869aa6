"""A Bridge's waits on many events: `wait_all`, `wait_any` and their asyncio forms.

A wait never spins: `wait_any` sleeps on the condition that every completion the backend reports
notifies, and queries again at most every POLL_S seconds for tokens a backend cannot report.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from devbridge.bridge import aio
from devbridge.bridge.events import Event, deadline, wait_done
from devbridge.errors import (
    InvalidArgumentError,
    WaitTimeoutError,
    short,
)

if TYPE_CHECKING:
    pass

from devbridge.bridge.engine import POLL_S, Engine


class Waiting(Engine):
    """The Bridge's waits on many of its events."""

    def wait_all(self, events: Iterable[Event], timeout: float | None = None) -> None:
        """Block until every one of `events` is done; failures stay with their events
        (`event.error`).

        Args:
            events: an iterable of this bridge's events.
            timeout: seconds >= 0, or None to wait as long as it takes.

        Raises:
            InvalidArgumentError: ARG-1, for anything but this bridge's events, or a bad timeout.
            WaitTimeoutError: WAIT-1, once `timeout` seconds pass (a TimeoutError)."""
        ends = deadline(timeout)
        for event in self._own_events(events, "wait_all"):
            wait_done(event, ends, timeout)

    def wait_any(self, events: Iterable[Event], timeout: float | None = None) -> Event:
        """The first of `events` found done (in the order given), blocking until one is. It
        sleeps on a condition that every completion the backend reports wakes; tokens a backend
        cannot report (a device marker) are queried again at most every POLL_S seconds.

        Args:
            events: an iterable of this bridge's events, at least one.
            timeout: seconds >= 0, or None to wait as long as it takes.

        Returns:
            The first done event.

        On a backend whose `wait` runs the work it waits for (`waits_run_work`: the fake, by
        default), it waits on the first event not done, as `Event.wait` does: the rule that
        `Event.wait`, `wait_all` and `wait_any` share.

        Raises:
            InvalidArgumentError: ARG-1, for no events, another bridge's, or a bad timeout.
            WaitTimeoutError: WAIT-1, once `timeout` seconds pass (a TimeoutError)."""
        ends = deadline(timeout)
        pending = self._own_events(events, "wait_any")
        if not pending:
            raise InvalidArgumentError("ARG-1", "wait_any needs at least one event")
        drive = self._watcher.drives
        while True:
            with self._progress:
                seen = self._completions
            for event in pending:
                if event.done():
                    return event
            remaining = None if ends is None else ends - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise WaitTimeoutError("WAIT-1", f"none of {len(pending)} events done after {timeout} s")
            # the backend runs what it is waited on: wait as Event.wait would (an open compute
            # block's event is not submitted yet: waiting on it is its block's to declare)
            first = next((e for e in pending if not getattr(e, "open", False)), None) if drive else None
            if first is not None:
                self._drive(first)
                if first.done():
                    return first
            with self._progress:
                if self._completions == seen:
                    self._progress.wait(POLL_S if remaining is None else min(remaining, POLL_S))

    async def wait_any_async(self, events: Iterable[Event], timeout: float | None = None) -> Event:
        """`wait_any` for asyncio: the first of `events` found done, in the order given. The
        loop is never blocked: the bridge's one watcher thread settles awaited events.

        Raises:
            InvalidArgumentError: ARG-1, for no events, another bridge's, or a bad timeout.
            WaitTimeoutError: WAIT-1, once `timeout` seconds pass (a TimeoutError)."""
        deadline(timeout)
        pending = self._own_events(events, "wait_any_async")
        if not pending:
            raise InvalidArgumentError("ARG-1", "wait_any_async needs at least one event")
        return await aio.wait_any(self._watcher, pending, None if timeout is None else float(timeout))

    async def wait_all_async(self, events: Iterable[Event], timeout: float | None = None) -> None:
        """`wait_all` for asyncio: every one of `events` done; failures stay with their events.

        Raises:
            InvalidArgumentError: ARG-1, for anything but this bridge's events, or a bad timeout.
            WaitTimeoutError: WAIT-1, once `timeout` seconds pass (a TimeoutError)."""
        deadline(timeout)
        pending = self._own_events(events, "wait_all_async")
        await aio.wait_all(self._watcher, pending, None if timeout is None else float(timeout))

    def _drive(self, event: Event) -> None:
        """Wait on `event` as Event.wait does, not longer than it takes: for a backend whose wait
        runs the work it waits for (`waits_run_work`)."""
        self._wait_backend(event, 0)

    def _own_events(self, events: object, call: str) -> list[Event]:
        """`events` as a list of this bridge's events (ARG-1 otherwise)."""
        if isinstance(events, str | bytes | Event) or not isinstance(events, Iterable):
            raise InvalidArgumentError("ARG-1", f"{call} needs an iterable of events, got {short(events)}")
        found: list[Event] = []
        try:
            for event in events:
                if not self._link.owns(event):
                    raise InvalidArgumentError("ARG-1", f"{call}: {short(event)} is not an event of this bridge")
                found.append(event)
        except InvalidArgumentError:
            raise
        except Exception as e:  # an iterable that fails as it is read
            raise InvalidArgumentError("ARG-1", f"{call}: reading {short(events)} failed: {short(e)}") from e
        return found
