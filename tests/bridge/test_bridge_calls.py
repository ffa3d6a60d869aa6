"""What every Bridge call does besides its own work, checked on the fake's exact calls: it first
applies what happened while no call ran (a view collected, a completion), a new bridge tells the
backend its generation, and the counters in `stats()` count each call once."""

from __future__ import annotations

import copy
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
from rules import deferred, refused
from support import put

import devbridge.bridge.bridge as bridge_module
from devbridge import Bridge, DeviceHandle, DeviceRange, HostRing, ObjectSpec, StaleHandleError, TensorViewSpec
from devbridge.backends.base import BackendError
from devbridge.backends.fake import DEFAULT_CAPACITY, Call, FakeBackend
from devbridge.bridge.engine import Engine
from devbridge.types import MAX_EXTENT

U8 = ObjectSpec("blob", "uint8")
WHOLE = TensorViewSpec((8,), "uint8", 0)

#: A call on a second allocation `other` (the name of the op the fake sees, or None: restart).
CALLS: dict[str, tuple[str | None, Callable[[Bridge, HostRing, DeviceHandle], Any]]] = {
    "alloc_device": ("alloc", lambda b, r, other: b.alloc_device(U8, 8)),
    "host_to_device": ("copy_in", lambda b, r, other: b.host_to_device(put(r, b"abcd"), DeviceRange(other, 0, 4))),
    "device_to_host": ("copy_out", lambda b, r, other: b.device_to_host(DeviceRange(other, 0, 4), r.reserve(4))),
    "compute": ("compute", lambda b, r, other: b.compute(other)),
    "wrap_for_tinygrad": ("view", lambda b, r, other: b.wrap_for_tinygrad(other, WHOLE)),
    "restart": (None, lambda b, r, other: b.restart()),
    "pins": (None, lambda b, r, other: b.pins(other)),
    "stats": (None, lambda b, r, other: b.stats()),
}


@pytest.fixture
def hung() -> FakeBackend:
    """A fake whose wait blocks until a test (maybe on another thread) completes the work."""
    return FakeBackend(run_on_wait=False)


def ops(fake: FakeBackend) -> list[tuple[str, int | None]]:
    return [(c.op, c.buffer) for c in fake.calls]


@pytest.mark.holds("VIEW-3", "FREE-1")
@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_call_first_applies_a_view_collected_while_no_call_ran(
    name: str, fake: FakeBackend, bridge: Bridge, ring: HostRing
) -> None:
    """The last tensor reaching a view goes between two calls: its finalizer only queues the end.
    Whatever the next call is, it ends the view and makes the deferred free before its own work."""
    op, call = CALLS[name]
    h, other = bridge.alloc_device(U8, 8), bridge.alloc_device(U8, 8)
    t = bridge.wrap_for_tinygrad(h, WHOLE)
    with deferred("FREE-1", lambda: [c.op for c in fake.calls]):
        bridge.free_device(h)
    del t
    gc.collect()
    before = ops(fake)
    assert ("free", 0) not in before  # queued, not applied: no bridge call ran since
    call(bridge, ring, other)
    after = ops(fake)[len(before) :]
    assert after[0] == ("free", 0), after  # the view's end came first, releasing the memory
    assert op is None or after[1][0] == op, after
    assert bridge.stats().backend_frees == (2 if name == "restart" else 1)  # restart frees `other` too


def test_a_new_bridge_tells_the_backend_generation_0(fake: FakeBackend) -> None:
    """Even a backend a previous bridge had restarted: its memory is then tagged generation 0,
    the generation of the new bridge's handles."""
    old = Bridge(fake)
    old.restart()
    old.restart()
    assert fake.generation == 2
    bridge = Bridge(fake)
    assert fake.generation == 0
    bridge.alloc_device(U8, 8)
    assert fake.calls[-1].generation == 0


def test_a_pending_warning_after_a_minute_by_default(fake: FakeBackend) -> None:
    assert Bridge(fake).pending_warning_s == 60.0


@pytest.mark.holds("ALLOC-1")
@pytest.mark.rejects("ALLOC-1")
def test_the_largest_extent_reaches_the_backend_and_one_more_byte_does_not(fake: FakeBackend) -> None:
    """2**48 bytes pass the bridge's bound and reach the backend, which cannot hold them (ALLOC-2);
    one byte more is the caller's mistake (ALLOC-1) and no backend call."""
    bridge = Bridge(fake)
    assert MAX_EXTENT == 1 << 48 > DEFAULT_CAPACITY
    with refused("ALLOC-2"):
        bridge.alloc_device(U8, MAX_EXTENT)
    assert [(c.op, c.nbytes) for c in fake.calls] == [("alloc", MAX_EXTENT)]
    with refused("ALLOC-1"):
        bridge.alloc_device(U8, MAX_EXTENT + 1)
    assert len(fake.calls) == 1


def counts(bridge: Bridge, *keys: str) -> dict[str, int]:
    stats = bridge.stats()
    return {k: getattr(stats, k) for k in keys}


def test_stats_count_each_output_copy_once_and_its_bytes(fake: FakeBackend, bridge: Bridge, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 8)
    bridge.device_to_host(DeviceRange(h, 0, 8), ring.reserve(8), sync=True)
    e = bridge.device_to_host(DeviceRange(h, 2, 4), ring.reserve(4), sync=False)
    keys = ("copies_out", "bytes_out", "copy_failures")
    assert counts(bridge, *keys) == {"copies_out": 2, "bytes_out": 12, "copy_failures": 0}
    fake.complete(e)
    fake.fail_next("copy_out")
    with refused("COPY-F"):
        bridge.device_to_host(DeviceRange(h, 0, 4), ring.reserve(4), sync=True)
    assert counts(bridge, *keys) == {"copies_out": 2, "bytes_out": 12, "copy_failures": 1}


def test_stats_count_each_view(bridge: Bridge) -> None:
    h = bridge.alloc_device(U8, 8)
    views = [bridge.wrap_for_tinygrad(h, WHOLE) for _ in range(3)]
    assert counts(bridge, "views") == {"views": 3}
    del views


class RefusesCompute(FakeBackend):
    """A backend whose compute marker cannot be made at submission (the protocol allows it)."""

    def compute(self, buffers: Any) -> object:
        self.calls.append(Call("compute"))
        raise BackendError("no compute queue")


@pytest.mark.rejects("COMPUTE-F")
def test_a_compute_the_backend_refuses_is_compute_f_and_nothing_is_in_use() -> None:
    fake = RefusesCompute()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    with refused("COMPUTE-F"):
        bridge.compute(h)
    assert counts(bridge, "computes", "compute_failures") == {"computes": 0, "compute_failures": 1}
    assert bridge.state(h) == "allocated" and bridge.pins(h).computes == 0
    bridge.free_device(h)  # nothing holds it: freed at once
    assert [c.op for c in fake.calls] == ["alloc", "compute", "free"]


class Deaf(FakeBackend):
    """A backend that cannot report completions: the bridge must ask it."""

    def __init__(self) -> None:
        super().__init__(run_on_wait=False)
        self.queries = 0

    def subscribe(self, callback: object) -> bool:  # type: ignore[override]
        return False

    def query(self, token: object) -> Any:
        self.queries += 1
        return super().query(token)


def test_poll_finishes_what_a_deaf_backend_says_is_done(ring: HostRing) -> None:
    fake = Deaf()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    r = put(ring, b"abcd")
    e = bridge.host_to_device(r, DeviceRange(h, 0, 4), sync=False)
    fake.complete(e)
    assert bridge.poll() == 1
    assert bridge.state(h) == "idle" and ring.released(r)  # before asking the event, which would ask too
    assert e.done() and e.error is None
    assert bytes(fake.buffer(0).data[:4]) == b"abcd"


@pytest.mark.rejects("WAIT-1")
def test_wait_any_keeps_asking_a_deaf_backend_until_its_timeout(ring: HostRing) -> None:
    """Nothing will wake it: it queries again and again (every POLL_S, 2 ms) rather than sleeping
    through the timeout, so a completion is seen within milliseconds."""
    fake = Deaf()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    e = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    fake.queries = 0
    with refused("WAIT-1"):
        bridge.wait_any([e], timeout=0.3)
    # about 150 at 2 ms: not once or twice (a 1 s interval), nor thousands (a spin that never sleeps)
    assert 10 <= fake.queries <= 1500, fake.queries


# ------------------------------------------------------------ held copies and refreshes


def inputs(fake: FakeBackend) -> list[tuple[str, bool | None]]:
    return [(c.op, c.sync) for c in fake.calls if c.op in ("copy_in", "copy_out")]


@pytest.mark.parametrize("second", ["copy_in", "copy_out"])
def test_a_held_copy_is_submitted_asynchronously_once_its_predecessor_ends(
    second: str, fake: FakeBackend, bridge: Bridge, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 8)
    e0 = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    if second == "copy_in":
        e1 = bridge.host_to_device(put(ring, b"wxyz"), DeviceRange(h, 2, 4), sync=False)  # WAW: held
    else:
        e1 = bridge.device_to_host(DeviceRange(h, 0, 4), ring.reserve(4), sync=False)  # RAW: held
    assert inputs(fake) == [("copy_in", False)]
    fake.complete(e0)
    assert inputs(fake) == [("copy_in", False), (second, False)]  # launched, not run at once
    assert not e1.done() and bridge.state(h) == "copying"
    fake.complete(e1)
    assert e1.done() and e1.error is None and bridge.state(h) == "idle"


def test_asking_a_held_event_asks_the_copies_it_follows_on_a_deaf_backend(ring: HostRing) -> None:
    """Nothing reports completions: done() on a held event queries the use it follows, whose end
    launches it."""
    fake = Deaf()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    e0 = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    e1 = bridge.host_to_device(put(ring, b"wxyz"), DeviceRange(h, 0, 4), sync=False)
    fake.complete(e0)
    assert not e1.done()
    assert inputs(fake) == [("copy_in", False), ("copy_in", False)] and bridge.state(h) == "copying"
    fake.complete(e1)
    assert e1.done() and bytes(fake.buffer(0).data[:4]) == b"wxyz"


def test_a_synchronous_copy_on_a_deaf_backend_waits_for_the_copy_it_follows(ring: HostRing) -> None:
    fake = Deaf()
    fake.run_on_wait = True  # the device runs the work it is waited for
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    e0 = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    out = ring.reserve(4)
    bridge.device_to_host(DeviceRange(h, 0, 4), out, sync=True)  # RAW: waits for e0 first
    assert e0.done() and bytes(ring.view(out)) == b"abcd"
    assert inputs(fake) == [("copy_in", False), ("copy_out", True)] and bridge.stats().waits == 1


def test_a_compute_completed_inside_its_block_ends_as_the_block_exits(fake: FakeBackend, bridge: Bridge) -> None:
    h = bridge.alloc_device(U8, 8)
    with bridge.compute(h) as e:
        fake.complete(e)
        assert bridge.state(h) == "computing"  # cannot end while the block is open (ORDER-2)
    assert bridge.state(h) == "idle" and e.done() and e.error is None


class RefusesExtend(FakeBackend):
    def extend(self, token: object) -> None:
        raise BackendError("the marker cannot be extended")


def test_a_compute_marker_the_backend_cannot_extend_fails_the_compute() -> None:
    fake = RefusesExtend()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    with bridge.compute(h) as e:
        pass
    assert e.done() and type(e.error).__name__ == "ComputeError" and e.error.rule == "COMPUTE-F"
    assert "extended" in str(e.error) and bridge.state(h) == "idle"


class WaitRaises(FakeBackend):
    """A backend whose wait raises and leaves the work pending (it will not touch it again)."""

    def wait(self, token: object, timeout: float | None) -> bool:
        raise BackendError("the device stopped answering")


@pytest.mark.rejects("COPY-F")
def test_a_wait_the_backend_refuses_fails_the_event_even_if_its_token_stays_pending(ring: HostRing) -> None:
    fake = WaitRaises()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    e = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    with refused("COPY-F", match="stopped answering"):
        e.wait(timeout=1)
    assert e.done() and bridge.state(h) == "idle" and len(fake.pending()) == 1


def test_a_bookkeeping_error_at_an_end_settles_the_event_with_it_and_is_raised(
    fake: FakeBackend, bridge: Bridge, ring: HostRing
) -> None:
    """Never silently lost: the error reaches whoever delivered the end, and the event."""
    from devbridge import LifecycleError
    from devbridge.statemachine.core import LifecycleCore

    h = bridge.alloc_device(U8, 8)
    e = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    broken = LifecycleError("EVENT-1", "the core lost the use")
    with mock.patch.object(LifecycleCore, "end", side_effect=broken), pytest.raises(LifecycleError) as raised:
        fake.complete(e)
    assert raised.value is broken and e.done() and e.error is broken


# ------------------------------------------------------------ waits


@pytest.mark.parametrize("call", ["wait_any", "wait_all"])
@pytest.mark.parametrize("timeout", [None, 0.9])
def test_waits_return_the_completion_another_thread_makes(
    call: str, timeout: float | None, hung: FakeBackend, ring: HostRing
) -> None:
    """Under a second of timeout (or none) is time to wait, not a timeout already passed."""
    bridge = Bridge(hung)
    h = bridge.alloc_device(U8, 8)
    e = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    threading.Timer(0.05, hung.complete, [e]).start()
    if call == "wait_any":
        assert bridge.wait_any([e], timeout=timeout) is e
    else:
        bridge.wait_all([e], timeout=timeout)
    assert e.done() and e.error is None


def assert_woken(bridge: Bridge, event: Any, end: Callable[[], None]) -> None:
    """wait_any returns `event`, which `end` (on another thread, 50 ms later) ends: woken by it,
    not by its 5 s deadline (with POLL_S at 10 s, a waiter nobody wakes sleeps until then)."""
    with mock.patch.object(bridge_module, "POLL_S", 10.0):
        threading.Timer(0.05, end).start()
        start = time.monotonic()
        assert bridge.wait_any([event], timeout=5) is event
    assert time.monotonic() - start < 4.5  # woken, not at the 5 s deadline


@pytest.mark.parametrize("lock_busy", [False, True], ids=["lock free", "lock busy"])
def test_a_completion_wakes_wait_any_at_once(lock_busy: bool, hung: FakeBackend, ring: HostRing) -> None:
    """wait_any sleeps on a condition each reported completion notifies (with POLL_S at 10 s it
    would otherwise sleep until its 5 s deadline), whether or not the completing thread could
    take the bridge's lock."""
    bridge = Bridge(hung)
    h = bridge.alloc_device(U8, 8)
    e = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)

    held, done = threading.Event(), threading.Event()

    def hold() -> None:  # another call holds the bridge's lock while the completion arrives
        with bridge._lock:
            held.set()
            done.wait(5)
            time.sleep(0.05)

    def complete() -> None:
        if lock_busy:
            threading.Thread(target=hold).start()
            held.wait(5)
        hung.complete(e)
        done.set()

    assert_woken(bridge, e, complete)


def test_an_end_found_by_another_threads_poll_wakes_wait_any(ring: HostRing) -> None:
    fake = Deaf()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    e = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)

    def complete_and_poll() -> None:
        fake.complete(e)
        bridge.poll()

    assert_woken(bridge, e, complete_and_poll)


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize(
    ("events", "message"),
    [
        ("abc", "needs an iterable of events"),
        (5, "needs an iterable of events"),
        (None, "needs an iterable of events"),
        ([1], "is not an event of this bridge"),
    ],
    ids=repr,
)
@pytest.mark.parametrize("call", ["wait_any", "wait_all"])
def test_waits_say_what_is_wrong_with_their_events(call: str, events: object, message: str, bridge: Bridge) -> None:
    with refused("ARG-1", match=message):
        getattr(bridge, call)(events, timeout=0)


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("call", ["wait_any", "wait_all"])
def test_waits_refuse_events_that_fail_as_they_are_read(call: str, bridge: Bridge, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 8)
    e = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=True)

    def events() -> Iterator[object]:
        yield e
        raise ValueError("the list went away")

    with refused("ARG-1", match="reading .* failed"):
        getattr(bridge, call)(events(), timeout=0)


# ------------------------------------------------------------ forged arguments


@pytest.mark.rejects("HANDLE-1")
def test_a_handle_whose_spec_was_made_unhashable_is_not_this_bridges(bridge: Bridge) -> None:
    h = bridge.alloc_device(U8, 8)
    spec = copy.copy(h.spec)
    object.__setattr__(spec, "role", ["data"])  # past ObjectSpec's own validation
    forged = copy.copy(h)
    object.__setattr__(forged, "spec", spec)
    with refused("HANDLE-1"):
        bridge.state(forged)
    assert bridge.state(h) == "allocated"


@pytest.mark.rejects("RANGE-1")
def test_a_forged_empty_device_range_is_refused_before_the_backend(
    fake: FakeBackend, bridge: Bridge, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 8)
    empty = copy.copy(DeviceRange(h, 0, 4))
    object.__setattr__(empty, "nbytes", 0)  # DeviceRange refuses 0 B itself; the bridge checks again
    host = copy.copy(ring.reserve(4))
    object.__setattr__(host, "nbytes", 0)
    calls = len(fake.calls)
    with refused("RANGE-1"):
        bridge.host_to_device(host, empty)
    assert len(fake.calls) == calls


class CompletesOnADeviceThread(FakeBackend):
    """A synchronous copy that, like a device, first lets a thread of its own report an earlier
    copy's completion, and waits for that thread."""

    reporter_returned: bool | None = None

    def copy_in(self, buffer: object, offset: int, src: memoryview, *, sync: bool) -> object:
        if sync and (earlier := self.pending()):
            reporter = threading.Thread(target=self.complete, args=[earlier[0]])
            reporter.start()
            reporter.join(2)
            self.reporter_returned = not reporter.is_alive()
        return super().copy_in(buffer, offset, src, sync=sync)


def test_a_completion_reported_while_a_call_holds_the_lock_never_blocks_the_reporter(ring: HostRing) -> None:
    """The device thread must not wait for the bridge's lock (the caller holding it may be waiting
    for that thread): the next call applies the completion instead."""
    fake = CompletesOnADeviceThread()
    bridge = Bridge(fake)
    a, b = bridge.alloc_device(U8, 8), bridge.alloc_device(U8, 8)
    e0 = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(a, 0, 4), sync=False)
    bridge.host_to_device(put(ring, b"wxyz"), DeviceRange(b, 0, 4), sync=True)
    assert fake.reporter_returned is True
    assert bridge.state(a) == "idle" and e0.done() and e0.error is None


def completed_while_the_lock_is_busy(bridge: Bridge, fake: FakeBackend, event: object) -> None:
    """Complete `event` on the fake while another thread holds the bridge's lock: the report
    is only queued (nobody applies it until the next call)."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with bridge._lock:
            held.set()
            done.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    fake.complete(event)
    done.set()
    holder.join(5)


def test_poll_counts_the_completions_reported_while_the_lock_was_busy(
    fake: FakeBackend, bridge: Bridge, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 8)
    e = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    completed_while_the_lock_is_busy(bridge, fake, e)
    assert bridge.poll() == 1
    assert e.done() and bridge.state(h) == "idle"


def test_a_queued_report_of_an_event_already_ended_is_dropped(
    fake: FakeBackend, bridge: Bridge, ring: HostRing
) -> None:
    """The event ended through its own query before the queued report was applied."""
    h = bridge.alloc_device(U8, 8)
    e = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    completed_while_the_lock_is_busy(bridge, fake, e)
    assert e.done()  # asks the backend itself
    assert bridge.poll() == 0 and bridge.state(h) == "idle" and bridge.stats().copies_in == 1


@pytest.mark.holds("PIN-1")
def test_a_deferred_release_is_logged_once_each_after_pending_warning_s(
    fake: FakeBackend, ring: HostRing, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = Bridge(fake, pending_warning_s=0.0)
    a, b = bridge.alloc_device(U8, 8), bridge.alloc_device(U8, 8)
    busy = [bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False) for h in (a, b)]
    with caplog.at_level(logging.WARNING, logger="devbridge"):
        bridge.free_device(a)
        bridge.poll()
        bridge.free_device(b)  # a was logged already: b is logged in its own turn
        bridge.poll()
        bridge.poll()
    messages = [r.getMessage() for r in caplog.records if r.name == "devbridge"]
    assert [m.split(" (")[0] for m in messages] == ["allocation #0", "allocation #1"]
    assert all(" is free_pending after 0 s; still in use by 1 copy_in" in m for m in messages), messages
    for e in busy:
        fake.complete(e)


def test_no_deferred_release_is_logged_before_a_minute(
    fake: FakeBackend, ring: HostRing, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    e = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    with caplog.at_level(logging.WARNING, logger="devbridge"):
        bridge.free_device(h)
        bridge.poll()
    assert [r for r in caplog.records if r.name == "devbridge"] == []
    fake.complete(e)


def test_a_held_copy_the_backend_finishes_at_submission_ends_as_it_is_launched(
    fake: FakeBackend, bridge: Bridge, ring: HostRing
) -> None:
    """A backend may finish a small copy before returning its token (tinygrad's CPU device does):
    the launch asks, and the use ends there, not at some later call."""
    h = bridge.alloc_device(U8, 8)
    e0 = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    e1 = bridge.host_to_device(put(ring, b"wxyz"), DeviceRange(h, 0, 4), sync=False)  # held (WAW)
    fake.finish_at_once = True
    fake.complete(e0)
    assert bridge.state(h) == "idle" and bridge.pins(h).copies_in == 0
    assert e1.done() and e1.error is None and bytes(fake.buffer(0).data[:4]) == b"wxyz"


class Unsubscribed(FakeBackend):
    """A fake that reports no completion by callback: poll() is what finds each one."""

    def subscribe(self, callback: Callable[[object], None]) -> bool:
        return False


def test_poll_finishes_a_download_launched_behind_a_compute_once_on_the_fake() -> None:
    """poll() finishes a compute; that launches the download held behind it (ORDER-1), which the
    device finishes at submission: poll's own loop must not finish it again (it raised KeyError)."""
    fake = Unsubscribed()
    bridge, ring = Bridge(fake), HostRing(64)
    src, out = ring.reserve(1), ring.reserve(1)
    ring.view(src)[:] = b"\x07"
    h = bridge.alloc_device(ObjectSpec("o", "uint8"), 2)
    bridge.host_to_device(src, DeviceRange(h, 0, 1))
    comp = bridge.compute(h)
    down = bridge.device_to_host(DeviceRange(h, 0, 1), out, sync=False)  # held behind the compute
    assert [c.op for c in fake.calls] == ["alloc", "copy_in", "compute"]  # not submitted yet
    fake.complete(comp)  # no callback: the bridge does not know yet
    fake.finish_at_once = True  # the launched download is done at submission
    assert bridge.poll() == 1  # the compute; the download ended inside its launch
    assert comp.done() and down.done() and down.error is None and bytes(ring.view(out)) == b"\x07"
    assert [c.op for c in fake.calls] == ["alloc", "copy_in", "compute", "copy_out"]
    assert bridge.stats().pending_events == 0 and bridge.state(h) == "idle"


@pytest.mark.parametrize("reported", [True, False], ids=["reported", "found by poll"])
def test_a_chain_of_three_held_copies_each_done_at_launch_ends_each_once_in_issue_order(reported: bool) -> None:
    """An upload, then three copies held in a chain behind it (a download, an upload over the same
    bytes, a download): when the upload ends, each launched copy is done at submission, which
    makes the next ready while the first settle is still running. One launch loop takes them in
    issue order, each use ends exactly once, and a poll counts only the one it found."""
    fake = FakeBackend() if reported else Unsubscribed()
    bridge, ring = Bridge(fake), HostRing(64)
    h = bridge.alloc_device(ObjectSpec("o", "uint8"), 4)
    first = bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False)
    out1, out2 = ring.reserve(4), ring.reserve(4)
    down1 = bridge.device_to_host(DeviceRange(h, 0, 4), out1, sync=False)  # RAW behind the upload
    up2 = bridge.host_to_device(put(ring, b"wxyz"), DeviceRange(h, 0, 4), sync=False)  # WAR behind it
    down2 = bridge.device_to_host(DeviceRange(h, 0, 4), out2, sync=False)  # RAW behind that
    events = [first, down1, up2, down2]
    assert [c.op for c in fake.calls] == ["alloc", "copy_in"] and bridge.stats().held == 3
    ended: list[int] = []
    original = Engine.settle

    def record(self: Any, effect: Any) -> None:
        ended.append(effect.use.id)
        original(self, effect)

    with mock.patch.object(Engine, "settle", record):
        fake.finish_at_once = True
        if reported:
            fake.complete(first)  # the callback settles it, and the chain, before it returns
        else:
            fake.complete(first, report=False)
            assert bridge.poll() == 1  # the one it found; the three launched ended inside its settle
    assert ended == [e.use_id for e in events]  # each once, in issue order
    assert all(e.done() and e.error is None for e in events)
    assert [(c.op, c.sync) for c in fake.calls if c.op.startswith("copy")] == [
        ("copy_in", False), ("copy_out", False), ("copy_in", False), ("copy_out", False)
    ]  # fmt: skip
    assert bytes(ring.view(out1)) == b"abcd" and bytes(ring.view(out2)) == b"wxyz"
    assert bridge.stats().inflight_uses == 0 and bridge.state(h) == "idle"


def test_a_log_handler_that_calls_back_and_ends_a_deferred_release_does_not_break_the_warning_loop(
    fake: FakeBackend, ring: HostRing
) -> None:
    """poll() logs a long deferred release (PIN-1); a handler on the `devbridge` logger that calls
    the bridge back (completing the copy that pins it, then asking for stats) ends that release
    while the warning loop runs: the loop must go on over what it had (it raised RuntimeError:
    dictionary changed size during iteration)."""
    bridge = Bridge(fake, pending_warning_s=0.0)
    a, b = bridge.alloc_device(U8, 8), bridge.alloc_device(U8, 8)
    busy = [bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4), sync=False) for h in (a, b)]
    bridge.free_device(a)
    bridge.free_device(b)
    heard: list[str] = []

    class CallsBack(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            heard.append(record.getMessage().split(" (")[0])
            if len(heard) == 1:
                fake.complete(busy[0])  # a's copy ends: its release happens under the warning loop
                bridge.stats()

    handler = CallsBack()
    logger = logging.getLogger("devbridge")
    logger.addHandler(handler)
    try:
        bridge.poll()
    finally:
        logger.removeHandler(handler)
    assert heard == ["allocation #0", "allocation #1"]
    assert bridge.state(a) == "freed" and bridge.state(b) == "free_pending"
    fake.complete(busy[1])
    assert bridge.state(b) == "freed"


class CompletesOnFree(FakeBackend):
    """A device that, as it frees one buffer, finishes another pending copy and reports it at once
    (on the freeing thread, inside the Bridge's own call)."""

    finish_on_free: object = None

    def free(self, buffer: object) -> None:
        super().free(buffer)
        if (token := self.finish_on_free) is not None:
            self.finish_on_free = None
            self.complete(token)


def test_a_completion_reported_inside_restarts_release_loop_frees_each_buffer_once() -> None:
    """restart() releases the idle allocation; that free reports the end of the copy on the busy
    one, which ends its use and releases it from inside the loop. Both are freed exactly once."""
    fake = CompletesOnFree()
    bridge, ring = Bridge(fake), HostRing(64)
    idle, busy = bridge.alloc_device(U8, 4), bridge.alloc_device(U8, 4)
    src = put(ring, b"busy")
    ev = bridge.host_to_device(src, DeviceRange(busy, 0, 4), sync=False)
    fake.finish_on_free = ev
    bridge.restart()
    assert fake.finish_on_free is None and ev.done() and isinstance(ev.error, StaleHandleError)
    assert [c.op for c in fake.calls] == ["alloc", "alloc", "copy_in", "free", "free"]
    assert [c.buffer for c in fake.calls if c.op == "free"] == [0, 1]
    assert (bridge.state(idle), bridge.state(busy)) == ("stale", "stale") and bridge.poll() == 0
    assert not ring.released(src)  # an aborted input is never released by the bridge


def test_wait_any_over_events_that_the_first_ones_end_returns_the_first_done_in_order(ring: HostRing) -> None:
    """wait_any asks the first download, held behind the compute: that finishes the compute (no
    callback told the bridge), which launches both downloads, which the device ends at submission.
    wait_any's list of events is its own, so those ends change nothing it iterates."""
    fake = Unsubscribed()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 4)
    bridge.host_to_device(put(ring, b"abcd"), DeviceRange(h, 0, 4))
    comp = bridge.compute(h)
    outs = [ring.reserve(2), ring.reserve(2)]
    downs = [bridge.device_to_host(DeviceRange(h, 2 * i, 2), outs[i], sync=False) for i in range(2)]
    fake.complete(comp)
    fake.finish_at_once = True
    assert bridge.stats().pending_events == 3  # the bridge has not heard of the compute's end
    assert bridge.wait_any([downs[1], downs[0], comp], timeout=5) is downs[1]
    assert all(e.done() and e.error is None for e in [comp, *downs])
    assert [bytes(ring.view(o)) for o in outs] == [b"ab", b"cd"]
    assert [c.op for c in fake.calls].count("copy_out") == 2 and bridge.stats().pending_events == 0
