"""OpenCL's own completion events on tinygrad's CL device (tinygrad 0.14.x).

tinygrad's `CLAllocator._copyin` only enqueues a non-blocking write and keeps
the host bytes until `synchronize()` (`clFinish`, which drains the whole
queue); its `_copyout` drains the queue too; its allocator has no `_offset`.
So the bridge enqueues its own commands on the device's in-order queue, each
with a `cl_event`:

* a write or read at any byte offset of the allocation's `cl_mem`
  (`clEnqueueWriteBuffer`/`clEnqueueReadBuffer` take one);
* a marker (`clEnqueueMarkerWithWaitList`) that completes when every command
  queued before it has.

A command's status is a non-blocking `clGetEventInfo`. Its completion is
found by one watcher thread per queue, which blocks in `clWaitForEvents` on
each command in the order they were enqueued (the order an in-order queue
finishes them) and sets a `threading.Event`, so a wait blocks on that (with a
timeout), never spins. No completion callback (`clSetEventCallback`) is
registered: pocl runs those on its own thread and releases the event there,
which races with the owner's release (a use-after-free in pocl's event
code); the watcher is our own thread, and a command is released only after
it is done with it.
A synchronous write or read is OpenCL's blocking one: it returns when the
host bytes may be reused (write) or hold the data (read), having waited for
that command only (on an in-order queue, also for what was queued before it).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from tinygrad.device import Device
from tinygrad.runtime.autogen import opencl as cl

log = logging.getLogger("devbridge")


class CLCommandError(Exception):
    """OpenCL refused to enqueue a command (its error code in the message)."""


class Command:
    """One command on the queue: pending until its `cl_event` completes (or fails).

    The host bytes it reads or writes (`keep`) stay referenced until then. Its
    completion is recorded by whichever comes first, a query or the queue's
    watcher; then `on_done` listeners run once, on this module's dispatch
    thread (never on the watcher, which must go on to the next command, nor on
    a querying caller's, which may hold its own locks). The event is released
    with the command."""

    __slots__ = ("_event", "_finished", "_lock", "error", "keep", "listeners")

    def __init__(self, keep: memoryview | None) -> None:
        self.keep = keep
        self.error: str | None = None
        self.listeners: list[Callable[[], None]] | None = []
        self._event: Any = cl.cl_event()
        self._finished = threading.Event()
        self._lock = threading.Lock()

    def done(self) -> bool:
        """Whether the device has finished the command. Never blocks."""
        if self._finished.is_set():
            return True
        status = ctypes.c_int32()
        code = cl.clGetEventInfo(
            self._event, cl.CL_EVENT_COMMAND_EXECUTION_STATUS, ctypes.sizeof(status), ctypes.byref(status), None
        )
        if code == 0 and status.value > cl.CL_COMPLETE:
            return False  # running or queued
        self._record(status.value if code == 0 else code)  # a query OpenCL refuses settles it as failed
        return True

    def on_done(self, listener: Callable[[], None]) -> None:
        """Call `listener` once the command is known complete; at once (on the dispatch thread) if
        it already is."""
        with self._lock:
            if self.listeners is not None:
                self.listeners.append(listener)
                return
        _dispatch.put(listener)

    def wait(self, timeout: float | None) -> bool:
        """Block until the command is done or `timeout` seconds pass; whether it is done. It blocks
        on the event the watcher sets, asking OpenCL again every `RECHECK_S`: a report that never
        comes (a driver whose wait ends early or never) costs that long, never a wait forever."""
        ends = None if timeout is None else time.monotonic() + timeout
        while True:
            left = RECHECK_S if ends is None else min(RECHECK_S, ends - time.monotonic())
            if self._finished.wait(max(left, 0.0)) or self.done():
                return True
            if ends is not None and time.monotonic() >= ends:
                return False

    def _record(self, status: int) -> None:
        """Record completion once (a query and the watcher may both find it); then hand the
        listeners to the dispatch thread."""
        with self._lock:
            if self._finished.is_set():
                return
            if status < 0:
                self.error = f"OpenCL error {status} ({_ERRORS.get(status, 'unknown')})"
            self.keep = None
            self._finished.set()
            listeners, self.listeners = self.listeners or [], None
        for listener in listeners:
            _dispatch.put(listener)

    def __del__(self) -> None:
        if self._event and not _forked:  # a forked child must not release its parent's OpenCL objects
            with contextlib.suppress(Exception):  # at interpreter exit the bindings may be gone
                cl.clReleaseEvent(self._event)


#: How often a wait asks OpenCL itself, besides the watcher that normally ends it.
RECHECK_S = 0.25
_ERRORS = {v: k for k in dir(cl) if k.startswith("CL_") and isinstance(v := getattr(cl, k), int) and v < 0}
_dispatch: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()


def _run_listeners() -> None:
    while True:
        listener = _dispatch.get()
        try:
            listener()
        except Exception:  # a listener's own failure must not stop every later report
            log.exception("devbridge: a completion listener failed")


class _Watcher:
    """One queue's completions, found on a thread of ours: it blocks in `clWaitForEvents` on each
    command in the order they were enqueued, then records the command's status."""

    def __init__(self, name: str) -> None:
        self.pending: queue.SimpleQueue[Command] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=f"devbridge-cl-watch-{name}", daemon=True).start()

    def _run(self) -> None:
        while True:
            command = self.pending.get()
            cl.clWaitForEvents(1, ctypes.byref(command._event))  # blocks in OpenCL, without the GIL
            if not command.done():  # the driver's wait ended early: ask it until the command is done
                command.wait(None)
            del command  # released here, once waited for, if nothing else holds it


_watchers: dict[int, _Watcher] = {}  # the queue's address -> its watcher
_watchers_lock = threading.Lock()
_forked = False  # True in a process forked from the one that made the commands


def _after_fork_in_child() -> None:
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)
threading.Thread(target=_run_listeners, name="devbridge-cl-events", daemon=True).start()


class CLQueue:
    """Commands with events on one CL device's queue (the queue tinygrad runs its kernels on)."""

    def __init__(self, device: str) -> None:
        dev: Any = Device[device]
        self.device = device
        self.queue = dev.queue
        self.context = dev.context
        key = int(ctypes.cast(self.queue, ctypes.c_void_p).value or 0)
        with _watchers_lock:
            self._watcher = _watchers.get(key) or _watchers.setdefault(key, _Watcher(device))

    def copy(self, host: memoryview, mem: Any, offset: int, *, into_device: bool, blocking: bool) -> Command:
        """Host bytes `host` -> `len(host)` bytes of `mem` at `offset` (`into_device`), or those
        device bytes -> `host`: one write or read command."""
        command = Command(None if blocking else host)
        enqueue = cl.clEnqueueWriteBuffer if into_device else cl.clEnqueueReadBuffer
        address = _address(host)
        self._enqueue(command, lambda ev: enqueue(self.queue, mem, blocking, offset, len(host), address, 0, None, ev))
        return command

    def marker(self) -> Command:
        """A command done once everything queued before it is."""
        command = Command(None)
        self._enqueue(command, lambda ev: cl.clEnqueueMarkerWithWaitList(self.queue, 0, None, ev))
        return command

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Until the block exits the device runs nothing enqueued after this (a barrier waiting on
        a user event): a test sees what a late-running command does with host bytes."""
        status = ctypes.c_int32()
        user = cl.clCreateUserEvent(self.context, ctypes.byref(status))
        _check(status.value, "clCreateUserEvent")
        try:
            _check(cl.clEnqueueBarrierWithWaitList(self.queue, 1, ctypes.byref(user), None), "barrier")
            cl.clFlush(self.queue)
            yield
        finally:
            cl.clSetUserEventStatus(user, cl.CL_COMPLETE)
            cl.clReleaseEvent(user)

    def finish(self) -> None:
        """Wait for everything queued (clFinish)."""
        _check(cl.clFinish(self.queue), "clFinish")

    def _enqueue(self, command: Command, enqueue: Callable[[Any], int]) -> None:
        code = enqueue(ctypes.byref(command._event))
        if code != 0:
            command._event = None
            _check(code, "enqueue")
        cl.clFlush(self.queue)  # submitted now, not at the next synchronize
        self._watcher.pending.put(command)


def _check(code: int, what: str) -> None:
    if code != 0:
        raise CLCommandError(f"{what}: OpenCL error {code} ({_ERRORS.get(code, 'unknown')})")


def _address(view: memoryview) -> int:
    """The address of a contiguous host view's first byte (read-only views included)."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
