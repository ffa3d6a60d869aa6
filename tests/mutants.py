"""Deliberately broken variants of the implementation: each must be caught by the stateful test.

Each mutant is a context manager that patches one plausible bug into the
real code (the core, the ring, the Bridge, the value types) and undoes it on
exit. `tests/model/test_mutants.py` runs the stateful machine under each.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from devbridge import Bridge, DeviceRange, HostRing, RangeError
from devbridge.backends.fake import FakeBackend
from devbridge.bridge.engine import Engine
from devbridge.spec import Lifecycle, guard_values
from devbridge.statemachine.core import Effects, InFlight, LifecycleCore, packaged_lookups
from devbridge.statemachine.machine import Step, Table
from devbridge.statemachine.status import OK

Mutant = Callable[[], contextlib.AbstractContextManager[None]]
MUTANTS: dict[str, Mutant] = {}
#: The checks that may catch each seeded bug (`models.lockstep.kill_of`): a lockstep check, a
#: FakeViolation kind as `fake:<kind>`, or a core invariant `INV-*`. Any other failure (a
#: TypeError, an unrelated assertion) means the mutant broke something else: its test fails.
KILLS: dict[str, frozenset[str]] = {}


#: The check of the sans-I/O checker (`models.sansio`) that must catch each seeded bug in the
#: core or the ring; None for a bug in the Bridge, the value types or the fake (outside its scope).
VALUES_KILLS: dict[str, str | None] = {}


def mutant(*kills: str, values: str | None = None) -> Callable[[Callable[[], Iterator[None]]], Mutant]:
    """Register a seeded bug, the checks that must catch it, and (`values`) the sans-I/O
    checker's check that must, when the bug is in its scope."""
    assert kills, "a seeded bug names what must catch it"

    def register(fn: Callable[[], Iterator[None]]) -> Mutant:
        MUTANTS[fn.__name__] = contextlib.contextmanager(fn)
        KILLS[fn.__name__] = frozenset(kills)
        VALUES_KILLS[fn.__name__] = values
        return MUTANTS[fn.__name__]

    return register


@mutant("fake:free-in-use", "fake:free-under-view", values="INV-NO-FREE-IN-USE")
def free_while_in_use() -> Iterator[None]:
    """free_device releases the memory at once, even while a copy or compute uses it."""
    original = LifecycleCore.free

    def free(self: LifecycleCore, alloc_id: int, *args: Any, **kwargs: Any) -> Any:
        record = self.allocation(alloc_id)
        original(self, alloc_id, *args, **kwargs)
        return record

    with mock.patch.object(LifecycleCore, "free", free):
        yield


@mutant("device-bytes", "host-bytes", "fake:late-read")
def sync_copy_done_at_submission() -> Iterator[None]:
    """The device's synchronous copy only enqueues (tinygrad's `_copyin` on OpenCL): it is done on
    return, but its bytes move only once the events pending ahead of it have ended. The device
    bytes (or, for an output copy, the host bytes) are not the ones the copy returned with."""
    with mock.patch.object(FakeBackend, "reads_sync_late", True):
        yield


@mutant("cursor", values="H2D-3")
def release_on_submit() -> Iterator[None]:
    """An async input's host bytes are released when the copy is submitted, not completed."""

    def begin_read(self: HostRing, r: Any, *args: Any, **kwargs: Any) -> None:
        self._cut(r)

    with (
        mock.patch.object(HostRing, "begin_read", begin_read),
        mock.patch.object(HostRing, "end_read", lambda self, *args, **kwargs: None),
    ):
        yield


@mutant("cursor", values="INV-CURSOR")
def cursor_jumps_a_hole() -> Iterator[None]:
    """The cursor skips past the first unreleased span."""
    prop = property(lambda self: self._ends[0] if self._starts else self._head)
    with mock.patch.object(HostRing, "cursor", prop):
        yield


@mutant("refused:GEN-2", "refused:EVENT-1", values="refused:GEN-2")
def stale_handle_accepted() -> Iterator[None]:
    """Handles of an older generation pass the core's check: a call on one is not refused
    (GEN-2), and an end the core must refuse for an old allocation is accepted (EVENT-1)."""
    original = LifecycleCore.check

    def check(self: LifecycleCore, handles: Any, *args: Any, **kwargs: Any) -> None:
        original(self, [(a, g) for a, g in handles if g == self.generation], *args, **kwargs)

    with mock.patch.object(LifecycleCore, "check", check):
        yield


@mutant("fake:double-free")
def double_backend_free() -> Iterator[None]:
    """The release action runs twice when an allocation's last use ends."""
    original = Engine.release_memory

    def release_memory(self: Engine, record: Any, *args: Any, **kwargs: Any) -> None:
        original(self, record, *args, **kwargs)
        original(self, record, *args, **kwargs)

    with mock.patch.object(Engine, "release_memory", release_memory):
        yield


@mutant("refused:RANGE-1")
def off_by_one_device_range() -> Iterator[None]:
    """A device range one byte past the extent is accepted."""

    def post_init(self: DeviceRange) -> None:
        if self.offset < 0 or self.nbytes <= 0 or self.offset + self.nbytes > self.handle.extent + 1:
            raise RangeError("RANGE-1", "out of bounds")

    with mock.patch.object(DeviceRange, "__post_init__", post_init):
        yield


@mutant("frees", values="INV-FREE-ONCE")
def restart_leaks_idle_memory() -> Iterator[None]:
    """restart() forgets to release allocations nothing uses."""
    original = LifecycleCore.restart

    def restart(self: LifecycleCore, *args: Any, **kwargs: Any) -> list[Any]:
        original(self, *args, **kwargs)
        return []

    with mock.patch.object(LifecycleCore, "restart", restart):
        yield


@mutant("host-view", "refused:D2H-3", "refused:RING-3", values="INV-OUTPUT")
def output_readable_before_completion() -> Iterator[None]:
    """An output range is not marked pending while its copy is in flight."""
    with (
        mock.patch.object(HostRing, "begin_write", lambda self, *args, **kwargs: None),
        mock.patch.object(HostRing, "end_write", lambda self, *args, **kwargs: None),
    ):
        yield


@mutant("host-view", "cursor", values="COPY-F")
def failed_input_released() -> Iterator[None]:
    """The host bytes of a failed input copy are released as if it had succeeded."""
    original = LifecycleCore.end

    def end(self: LifecycleCore, *args: Any, **kwargs: Any) -> Effects:
        effects = original(self, *args, **kwargs)
        return dataclasses.replace(effects, host_ok=effects.error_rule != "GEN-1")

    with mock.patch.object(LifecycleCore, "end", end):
        yield


@mutant("states", values="tracked")
def view_does_not_pin() -> Iterator[None]:
    """A tinygrad view is not counted as a compute use of its allocation."""
    original = LifecycleCore.begin

    def begin(self: LifecycleCore, kind: str, handles: Any, *args: Any, **kwargs: Any) -> InFlight:
        if kind != "view":
            return original(self, kind, handles, *args, **kwargs)
        use = InFlight(self._next_use, kind, (), None, self.generation)
        self._inflight[use.id] = use
        self._next_use += 1
        return use

    with mock.patch.object(LifecycleCore, "begin", begin):
        yield


@mutant("poll")
def view_use_ends_with_its_tensor() -> Iterator[None]:
    """A view's use ends when the Tensor wrap_for_tinygrad returned is collected, not when the
    view's anchor is (the finalizer on the tensor, as before VIEW-3 covered derived tensors):
    a tensor derived from the view no longer keeps the allocation in use. The fake still
    tracks the real anchors, so it refuses a free of memory a derived tensor reaches."""
    with mock.patch.object(FakeBackend, "view_anchor", lambda self, view, *args, **kwargs: view):
        yield


@mutant("pending")
def compute_done_at_submit() -> Iterator[None]:
    """A compute event is treated as complete when it is submitted."""
    original = Bridge.compute

    def compute(self: Bridge, *handles: Any) -> Any:
        event = original(self, *handles)
        self._engine.end_event(event, OK)  # (one the backend already finished: ended already, nothing)
        return event

    with mock.patch.object(Bridge, "compute", compute):
        yield


@mutant("refused:H2D-3", values="refused:H2D-3")
def release_ignores_pending_reads() -> Iterator[None]:
    """The worker may release host bytes a pending input copy still reads."""
    original = HostRing.release

    def release(self: HostRing, *args: Any, **kwargs: Any) -> None:
        reads, self._reads = self._reads, []
        try:
            original(self, *args, **kwargs)
        finally:
            self._reads = reads

    with mock.patch.object(HostRing, "release", release):
        yield


@mutant("INV-COUNTS", values="INV-COUNTS")
def last_copy_guard_wrong() -> Iterator[None]:
    """The `last_copy` guard is read as "a copy is in flight" (copies >= 1)."""

    def lookup(self: Table, state: str, event: str, copies: int, computes: int) -> Step:
        values = guard_values(copies, computes)
        values["last_copy"] = copies >= 1
        return next(s for s in self.steps[(state, event)] if all(values[g] == want for g, want in s.guards))

    with mock.patch.object(Table, "lookup", lookup):
        yield


def _without_hazard(name: str) -> Iterator[None]:
    """The spec's hazard table loses every edge of one kind (as the core compiles it)."""
    original = Lifecycle.hazard

    def hazard(self: Lifecycle, earlier: str, later: str) -> str | None:
        found = original(self, earlier, later)
        return None if found == name else found

    packaged_lookups.cache_clear()  # cores compile the packaged spec's hazards once per process
    try:
        with mock.patch.object(Lifecycle, "hazard", hazard):
            yield
    finally:
        packaged_lookups.cache_clear()


@mutant("fake:order", values="ORDER-1")
def missing_raw_edge() -> Iterator[None]:
    """A read does not follow the write in flight before it: a device_to_host (or compute) issued
    after an asynchronous host_to_device of the same bytes may run first and see the old bytes."""
    yield from _without_hazard("RAW")


@mutant("fake:order", "refused:EVENT-1", values="ORDER-1")
def missing_war_edge() -> Iterator[None]:
    """A write does not follow the read in flight before it: an asynchronous host_to_device may
    overwrite bytes an earlier device_to_host has not read yet. (When the read is held back, the
    fake never sees it; a compute that should have waited for it leaves it in flight, so a copy
    end the model refuses is accepted: refused:EVENT-1.)"""
    yield from _without_hazard("WAR")


@mutant("fake:order", values="ORDER-1")
def missing_waw_edge() -> Iterator[None]:
    """Two writes of the same bytes are not ordered: the earlier may land last."""
    yield from _without_hazard("WAW")


@mutant("states", values="states")
def sync_copy_skips_its_step() -> Iterator[None]:
    """The fused path of a synchronous copy (its composite step, taken by the per-call path and by
    `instant`) takes a use id but leaves the allocation's state alone (an allocation copied into
    stays `allocated`)."""

    def take(self: LifecycleCore, record: Any, step: Any) -> int:
        self._next_use += 1
        return self._next_use - 1

    with mock.patch.object(LifecycleCore, "take", take):
        yield


@mutant("cursor", values="H2D-2")
def sync_copy_keeps_host_bytes() -> Iterator[None]:
    """The fused path of a synchronous input copy never releases its host bytes (H2D-2)."""
    with mock.patch.object(HostRing, "read_done", lambda self, *args, **kwargs: None):
        yield


@mutant("pending", "refused:RING-3", "fake:free-in-use")
def async_copy_taken_as_done_at_submission() -> Iterator[None]:
    """The fused path takes every submitted asynchronous copy as done at once, without asking the
    backend: its host bytes are released (or its output made valid) before the data moved, and
    its allocation is idle, so a free reaches the backend while the copy still runs."""

    def first_status(self: Bridge, token: object, *args: Any, **kwargs: Any) -> Any:
        return None if token is None else OK

    with mock.patch.object(Bridge, "_first_status", first_status):
        yield


@mutant("event")
def async_copy_failed_at_submission_taken_as_done() -> Iterator[None]:
    """The fused path takes an asynchronous copy whose first query says done as a success, even
    when it says failed (a lost query): the event reports success for bytes that never moved."""
    original = Bridge._first_status

    def first_status(self: Bridge, *args: Any, **kwargs: Any) -> Any:
        status = original(self, *args, **kwargs)
        return OK if status is not None and status.done else status

    with mock.patch.object(Bridge, "_first_status", first_status):
        yield


# ------------------------------------------------------------ the orchestration (the core's settle, launches, drain)


@mutant("once", values="once")
def use_settled_twice() -> Iterator[None]:
    """The core forgets which uses ended: a poll's loop reaches a use that an earlier settle in the
    same loop launched and the device ended at once, and ends it again (the first release's
    `KeyError` out of `poll`)."""
    with mock.patch.object(LifecycleCore, "ended", lambda self, use, *args, **kwargs: False):
        yield


@mutant("fake:order", values="ORDER-1")
def held_use_launched_early() -> Iterator[None]:
    """A held use is made ready when the first of the uses it follows ends, not the last: it
    reaches the device while an earlier conflicting one still runs."""
    original = LifecycleCore.end

    def end(self: LifecycleCore, use_id: int, *args: Any, **kwargs: Any) -> Effects:
        use = self.use(use_id)
        followers = list(use.followers or ()) if use is not None else []
        effects = original(self, use_id, *args, **kwargs)
        early = tuple(f for f in followers if f.after and self.use(f.id) is f and f not in effects.ready)
        return dataclasses.replace(effects, ready=effects.ready + early) if early else effects

    with mock.patch.object(LifecycleCore, "end", end):
        yield


@mutant("completion", values="completion")
def completion_lost_while_busy() -> Iterator[None]:
    """A completion the backend reports while another call holds the lock is dropped instead of
    queued for the next call: nothing settles the event until someone queries it."""

    def reported(self: LifecycleCore, token: object, *args: Any, **kwargs: Any) -> None:
        pass  # the next call's drain never sees it

    with mock.patch.object(LifecycleCore, "reported", reported):
        yield


@mutant("fake:free-in-use", "fake:double-free", "fake:freed-buffer", "frees", values="INV-NO-FREE-IN-USE")
def deferred_free_ignores_held_uses() -> Iterator[None]:
    """A deferred free (or a restart's release) waits only for the uses on the device: when the
    last of them ends, the memory is released though a held use, made ready by that end and not
    launched yet, still names it."""
    original = LifecycleCore.end

    def end(self: LifecycleCore, use_id: int, *args: Any, **kwargs: Any) -> Effects:
        effects = original(self, use_id, *args, **kwargs)
        early = []
        for alloc_id in effects.use.allocations:
            record, users = self.allocation(alloc_id), self.dependents(alloc_id)
            pending = record is not None and record.state.endswith("_pending")
            if pending and users and all(u.token is None and u.kind != "view" for u in users):
                early.append(record)
        return dataclasses.replace(effects, release=effects.release + tuple(early)) if early else effects

    with mock.patch.object(LifecycleCore, "end", end):
        yield
