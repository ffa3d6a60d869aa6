"""A supervisor for the processes of one node: start them, start a worker again when it dies
(with a backoff, and not forever), and on the way out stop every child, reap it, and unlink the
shared rings. Standard library only (`multiprocessing` with `spawn`, signals): not a scheduler.
Across machines, Ray is the answer (the fleet); on one node, this.

    with Supervisor(rings=("jobs", "results")) as supervisor, supervisor.signals():
        supervisor.spawn("producer-0", produce, "jobs")
        supervisor.spawn("worker", work, "jobs", "results", restart=True)
        while supervisor.running("producer-0") or not done():
            supervisor.check(timeout=0.1)  # restarts a worker that died, reaps the rest
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from devbridge.args import as_seconds, count, refuse
from devbridge.errors import BridgeError, InvalidArgumentError, short
from devbridge.ring.host import HostRing
from devbridge.ring.segment import segment_path

SPAWN = multiprocessing.get_context("spawn")
#: How long `stop` waits for a child to end after SIGTERM before it sends SIGKILL.
TERM_GRACE_S = 2.0
#: The longest one wait of `check` for a child to end (the system's wait takes milliseconds
#: as a C int: about 24 days); a longer timeout waits in steps of it.
_WAIT_STEP_S = 86400.0


def _name(name: object) -> str:
    """A child's name; ARG-1 for what is not a str."""
    if type(name) is not str:
        refuse(f"a child's name must be a str, got {short(name)}")
    return name


class TooManyRestarts(RuntimeError):
    """A child died more often than the supervisor's limit within its window: it is not restarted."""


@dataclass
class _Child:
    name: str
    target: Callable[..., Any]
    args: tuple[Any, ...]
    restart: bool
    process: Any  # multiprocessing.process.BaseProcess
    deaths: deque[float] = field(default_factory=deque)  # when it died, within the window
    restarts: int = 0
    next_start: float | None = None  # when a child that died starts again (its backoff)


class Supervisor:
    """Starts child processes (`spawn`: nothing inherited) and watches them. A child spawned with
    `restart=True` is started again when it ends other than with exit code 0: after `backoff`
    seconds, doubling with each death up to `max_backoff`; more than `max_restarts` deaths
    within `window` seconds raise TooManyRestarts from `check`. `stop` (and leaving the `with`
    block) ends every child (SIGTERM, then SIGKILL after TERM_GRACE_S), reaps it, and unlinks
    the shared rings named in `rings`."""

    def __init__(
        self,
        *,
        rings: tuple[str, ...] = (),
        backoff: float = 0.05,
        max_backoff: float = 2.0,
        max_restarts: int = 100,
        window: float = 60.0,
    ) -> None:
        if type(rings) not in (tuple, list):
            refuse(f"rings must be a tuple of ring names, got {short(rings)}")
        for name in rings:
            segment_path(name)  # (ARG-1 for what names no ring)
        self.rings = tuple(rings)
        self.backoff = as_seconds(backoff, "backoff")
        self.max_backoff = as_seconds(max_backoff, "max_backoff")
        self.max_restarts = count("max_restarts", max_restarts)
        self.window = as_seconds(window, "window")
        self._children: dict[str, _Child] = {}
        self._detached: list[Any] = []  # processes replaced while still alive (`replace`): reaped at the end

    # ------------------------------------------------------------ children

    def spawn(self, name: str, target: Callable[..., Any], *args: Any, restart: bool = False) -> int:
        """Start `target(*args)` in a new process named `name`; its pid. ARG-1 for a name in use, a
        target that is not callable, and a target or arguments that do not pickle (`spawn`
        starts a fresh interpreter: a lambda or a nested function does not reach it)."""
        if _name(name) in self._children:
            raise InvalidArgumentError("ARG-1", f"a child named {name!r} is running under this supervisor")
        if not callable(target):
            refuse(f"a child's target must be callable, got {short(target)}")
        if type(restart) is not bool:
            refuse(f"restart must be a bool, got {short(restart)}")
        child = _Child(name, target, args, restart, self._start(name, target, args))
        self._children[name] = child
        return int(child.process.pid)

    def _start(self, name: str, target: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        process = SPAWN.Process(target=target, args=args, name=name, daemon=True)
        try:
            process.start()  # (the target and its arguments are pickled before a process exists)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            refuse(f"child {name!r}: its target or arguments do not pickle: {e}")
        return process

    def pid(self, name: str) -> int | None:
        """The pid of child `name`'s current process, None while it waits to start again."""
        process = self._child(name).process
        return None if process is None else int(process.pid)

    def restarts(self, name: str) -> int:
        return self._child(name).restarts

    def running(self, name: str) -> bool:
        """Whether child `name` has not ended for good (a restartable one waiting to start again runs)."""
        child = self._child(name)
        if child.process is None:
            return True
        return child.process.is_alive() or (child.restart and child.process.exitcode != 0)

    def exitcode(self, name: str) -> int | None:
        """Child `name`'s exit code once it ended for good (negative: the signal that ended it)."""
        process = self._child(name).process
        return None if process is None or process.is_alive() else process.exitcode

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to child `name`'s current process (SIGKILL: `check` starts it again); ARG-1
        for what is no signal."""
        process = self._child(name).process
        if type(sig) not in (int, signal.Signals) or sig not in signal.valid_signals():
            refuse(f"sig must be a signal number, got {short(sig)}")
        if process is not None and process.is_alive():
            os.kill(process.pid, sig)

    def replace(self, name: str) -> Any:
        """Start a new process for child `name` while its current one stays (a hung worker and its
        replacement); the old process is returned and reaped by `stop` if not before."""
        child = self._child(name)
        old, child.process = child.process, self._start(name, child.target, child.args)
        child.restarts += 1
        if old is not None:
            self._detached.append(old)
        return old

    def check(self, timeout: float = 0.0) -> None:
        """Wait up to `timeout` seconds for a child to end, then reap what ended and start again
        each restartable child that died whose backoff is over. TooManyRestarts when one died
        more than `max_restarts` times within the window."""
        now = time.monotonic()
        waits = [c.next_start - now for c in self._children.values() if c.next_start is not None]
        sentinels = [c.process.sentinel for c in self._children.values() if c.process is not None]
        sentinels += [p.sentinel for p in self._detached]
        wait = min([as_seconds(timeout, "timeout"), *(max(w, 0.0) for w in waits)])
        end = now + wait
        while sentinels and wait > 0 and not multiprocessing.connection.wait(sentinels, min(wait, _WAIT_STEP_S)):
            wait = end - time.monotonic()
        for process in [p for p in self._detached if not p.is_alive()]:
            process.join()
            self._detached.remove(process)
        now = time.monotonic()
        for child in self._children.values():
            process = child.process
            if process is not None and not process.is_alive():
                process.join()
                if child.restart and process.exitcode != 0:
                    self._died(child, now)
            if child.process is None and child.next_start is not None and now >= child.next_start:
                child.process, child.next_start = self._start(child.name, child.target, child.args), None
                child.restarts += 1

    def _died(self, child: _Child, now: float) -> None:
        child.deaths.append(now)
        while child.deaths and child.deaths[0] < now - self.window:
            child.deaths.popleft()
        if len(child.deaths) > self.max_restarts:
            raise TooManyRestarts(
                f"{child.name} died {len(child.deaths)} times within {self.window} s "
                f"(exit code {child.process.exitcode}): not started again"
            )
        delay = min(self.backoff * 2 ** (len(child.deaths) - 1), self.max_backoff)
        child.process, child.next_start = None, now + delay

    def _child(self, name: str) -> _Child:
        child = self._children.get(_name(name))
        if child is None:
            raise InvalidArgumentError("ARG-1", f"no child is named {name!r}")
        return child

    # ------------------------------------------------------------ the end

    def stop(self) -> None:
        """End every child (SIGTERM, SIGKILL after TERM_GRACE_S; a stopped one is continued so
        that it can end), reap each, and unlink the rings. Safe to call twice."""
        processes = [c.process for c in self._children.values() if c.process is not None] + self._detached
        for process in processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
                    os.kill(process.pid, signal.SIGCONT)
        deadline = time.monotonic() + TERM_GRACE_S
        for process in processes:
            process.join(max(deadline - time.monotonic(), 0.0))
            if process.is_alive():
                process.kill()
                process.join()
        self._children.clear()
        self._detached.clear()
        for name in self.rings:
            with contextlib.suppress(BridgeError):  # (gone already)
                ring = HostRing.attach(name)
                ring.unlink()
                ring.close()

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT end the block as an exception (SystemExit, KeyboardInterrupt), so
        that leaving the `with Supervisor` around it stops and reaps every child and unlinks the
        rings; the handlers before are put back after."""

        def terminated(signum: int, frame: FrameType | None) -> None:
            raise SystemExit(128 + signum)

        before = signal.signal(signal.SIGTERM, terminated), signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, before[0])
            signal.signal(signal.SIGINT, before[1])
