"""Events in asyncio: `await event`, and the awaitable forms of `wait_any` and `wait_all`.

One watcher thread per bridge, started when something is awaited and gone when nothing is,
settles the futures of every awaited event: it sleeps on the condition each completion the
backend reports wakes (asking again at most every `poll_s` seconds for work a backend cannot
report), so no event costs a thread and no loop spins. On a backend that runs the work it is
waited on (`waits_run_work`), it waits on the first awaited event as `Event.wait` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from devbridge.errors import WaitTimeoutError

if TYPE_CHECKING:
    from devbridge.bridge.events import Event


class Watcher:
    """The futures of the awaited events of one bridge, and the thread that settles them."""

    def __init__(
        self,
        progress: threading.Condition,
        completions: Callable[[], int],
        drive: Callable[[Event], None] | None,
        poll_s: float,
    ) -> None:
        self._progress = progress  # notified as completions are reported (its lock guards the rest)
        self._completions = completions  # how many were reported so far (read under the lock)
        self._drive = drive  # wait on an event as Event.wait does (a backend that runs waited work)
        self._poll_s = poll_s
        self._awaited: list[tuple[Event, asyncio.Future[None]]] = []
        self._running = False

    @property
    def drives(self) -> bool:
        """Whether its bridge's backend runs the work it is waited on (`waits_run_work`)."""
        return self._drive is not None

    def future(self, event: Event) -> asyncio.Future[None]:
        """A future of the running loop that ends as `event` does: None, or its failure."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if event.done():
            _settle(future, event)
            return future
        with self._progress:
            self._awaited.append((event, future))
            if not self._running:
                self._running = True
                threading.Thread(target=self._watch, name="devbridge-await", daemon=True).start()
            self._progress.notify_all()
        return future

    def _watch(self) -> None:
        while True:
            with self._progress:
                self._awaited = [(e, f) for e, f in self._awaited if not f.done()]  # (cancelled)
                if not self._awaited:
                    self._running = False
                    return
                seen, awaited = self._completions(), list(self._awaited)
            ended = [(e, f) for e, f in awaited if e.done()]
            for event, future in ended:
                _settle_soon(future, event)
            if not ended and self._drive is not None:
                first = next((e for e, _ in awaited if not getattr(e, "open", False)), None)
                if first is not None:
                    self._drive(first)
                    if first.done():
                        continue
            with self._progress:
                gone = {id(f) for _, f in ended}
                self._awaited = [(e, f) for e, f in self._awaited if id(f) not in gone]
                if not ended and self._completions() == seen:
                    self._progress.wait(self._poll_s)


def _settle_soon(future: asyncio.Future[None], event: Event) -> None:
    """Settle `future` with `event`'s outcome on its own loop's thread."""
    with contextlib.suppress(RuntimeError):  # its loop is closed: no one is waiting any more
        future.get_loop().call_soon_threadsafe(_settle, future, event)


def _settle(future: asyncio.Future[None], event: Event) -> None:
    if future.done():  # cancelled meanwhile (asyncio.wait_for's timeout)
        return
    error = event.error
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


async def wait_any(watcher: Watcher, events: Sequence[Event], timeout: float | None) -> Event:
    """`Bridge.wait_any_async`: the first of `events` found done, in the order given."""
    futures = [watcher.future(e) for e in events] if timeout != 0 else []  # 0 s: look, never wait
    try:
        if futures:
            await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in futures:
            if not f.done():
                f.cancel()
    for event in events:
        if event.done():
            return event
    raise WaitTimeoutError("WAIT-1", f"none of {len(events)} events done after {timeout} s")


async def wait_all(watcher: Watcher, events: Sequence[Event], timeout: float | None) -> None:
    """`Bridge.wait_all_async`: every one of `events` done; failures stay with their events."""
    if timeout == 0:  # look, never wait (nor ask a backend that runs what it waits for)
        if left := sum(not e.done() for e in events):
            raise WaitTimeoutError("WAIT-1", f"{left} of {len(events)} events not done after 0 s")
        return
    futures = [watcher.future(e) for e in events]
    try:
        _, pending = await asyncio.wait(futures, timeout=timeout) if futures else (set(), set())
    finally:
        for f in futures:
            if not f.done():
                f.cancel()
    if pending:
        raise WaitTimeoutError("WAIT-1", f"{len(pending)} of {len(events)} events not done after {timeout} s")
    for f in futures:
        f.exception()  # retrieved: the failure stays with its event, not in the loop's log
