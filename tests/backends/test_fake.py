"""The fake backend's own checks, without a bridge: each one a bug in the bridge would trip.

The stateful tests and the checker rely on these checks to catch a bridge bug where it happens
(a free while a copy is pending, a range past the buffer, ...), so each is shown to fire, with
its kind, its message on record and nothing else changed, and the fake's memory conventions
(guard bytes, poison after free) are shown as the checks assume them.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from rules import refused

from devbridge.backends.base import BackendError
from devbridge.backends.fake import GUARD, GUARD_BYTE, POISON_BYTE, Call, FakeBackend, FakeViolation
from devbridge.statemachine.status import OK


def violation(fake: FakeBackend, call: Callable[[], object]) -> tuple[str, str]:
    """The kind and message of the FakeViolation `call` raises; the message is on record."""
    recorded = len(fake.violations)
    with pytest.raises(FakeViolation) as e:
        call()
    assert fake.violations[recorded:] == [e.value]
    return e.value.kind, str(e.value)


def test_a_new_buffer_is_zeroed_between_guard_bytes() -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    raw = fake.buffer(0).raw
    assert buf == 0 and len(raw) == 8 + 2 * GUARD
    assert raw[:GUARD].tolist() == [GUARD_BYTE] * GUARD and raw[GUARD + 8 :].tolist() == [GUARD_BYTE] * GUARD
    assert fake.buffer(0).data.tolist() == [0] * 8
    assert fake.calls == [Call("alloc", 0, 0, 8)] and fake.live_allocations == 1


def test_a_freed_buffer_is_poisoned_and_forgotten() -> None:
    fake = FakeBackend()
    buf = fake.alloc(4, "uint8")
    fake.copy_in(buf, 0, memoryview(b"abcd"), sync=True)
    held = fake.buffer(0)  # as a view's memory would be held
    fake.free(buf)
    assert held.freed and held.data.tobytes() == bytes([POISON_BYTE]) * 4
    assert (fake.live_allocations, fake.bytes_in_use, fake.device_bytes(0), fake.live_views(0)) == (0, 0, None, 0)
    with pytest.raises(KeyError):
        fake.buffer(0)
    assert fake.ops() == ["alloc", "copy_in", "free"] and fake.alloc(4, "uint8") == 1  # ids are never reused


def test_allocations_past_the_capacity_fail_and_freed_bytes_count_again() -> None:
    fake = FakeBackend(capacity=16)
    a = fake.alloc(12, "uint8")
    with pytest.raises(BackendError, match="cannot allocate 8 B"):
        fake.alloc(8, "uint8")
    fake.free(a)
    fake.alloc(16, "uint8")  # the freed 12 B are free again
    assert fake.live_allocations == 1


@pytest.mark.parametrize("buffer", [99, -1, "0", None])
def test_unknown_buffers_are_refused(buffer: object) -> None:
    fake = FakeBackend()
    fake.alloc(8, "uint8")
    assert violation(fake, lambda: fake.free(buffer))[0] == "unknown-buffer"
    kind, message = violation(fake, lambda: fake.copy_in(buffer, 0, memoryview(b"x"), sync=True))
    assert (kind, message) == ("unknown-buffer", f"copy_in on unknown buffer {buffer!r}")
    assert fake.ops() == ["alloc"] and not fake.buffer(0).freed


def test_a_double_free_is_refused() -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    fake.free(buf)
    assert violation(fake, lambda: fake.free(buf)) == ("double-free", "buffer #0 freed twice")


def test_a_free_while_a_pending_event_uses_the_buffer_is_refused() -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    ev = fake.copy_in(buf, 0, memoryview(b"abcd"), sync=False)
    assert violation(fake, lambda: fake.free(buf)) == ("free-in-use", "buffer #0 freed while events [0] use it")
    assert not fake.buffer(0).freed
    fake.complete(ev)
    fake.free(buf)  # fine once the copy is done
    assert fake.live_allocations == 0


def test_a_free_under_a_live_view_is_refused_until_the_view_is_collected() -> None:
    fake = FakeBackend()
    buf = fake.alloc(16, "uint8")
    view = fake.view(buf, 0, (16,), "uint8")
    assert violation(fake, lambda: fake.free(buf)) == (
        "free-under-view", "buffer #0 freed while 1 view(s) can read it",
    )  # fmt: skip
    del view
    gc.collect()
    fake.free(buf)
    assert fake.live_allocations == 0


@pytest.mark.parametrize("op", ["copy_in", "copy_out", "compute", "view"])
def test_a_freed_buffer_cannot_be_touched(op: str) -> None:
    fake = FakeBackend()
    buf = fake.alloc(16, "uint8")
    fake.free(buf)
    touch = {
        "copy_in": lambda: fake.copy_in(buf, 0, memoryview(b"x"), sync=True),
        "copy_out": lambda: fake.copy_out(memoryview(bytearray(1)), buf, 0, sync=True),
        "compute": lambda: fake.compute([buf]),
        "view": lambda: fake.view(buf, 0, (16,), "uint8"),
    }[op]
    assert violation(fake, touch) == ("freed-buffer", f"{op} on freed buffer #0")


def test_an_old_generations_buffer_cannot_be_touched() -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    fake.begin_generation(1)
    kind, message = violation(fake, lambda: fake.copy_in(buf, 0, memoryview(b"x"), sync=True))
    assert (kind, message) == ("old-generation", "copy_in on buffer #0 of old generation 0")
    fake.free(buf)  # freeing old memory is what a restart does: allowed
    assert fake.calls[-1] == Call("free", 0, generation=1)


@pytest.mark.parametrize(("offset", "nbytes"), [(-1, 1), (0, 9), (8, 1), (4, 5)])
def test_ranges_outside_the_buffer_are_refused(offset: int, nbytes: int) -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    kind, message = violation(fake, lambda: fake.copy_in(buf, offset, memoryview(bytes(nbytes)), sync=True))
    assert (kind, message) == ("out-of-bounds", f"copy_in [{offset}, {offset + nbytes}) outside buffer #0 of 8 B")
    assert fake.buffer(0).raw[:GUARD].tolist() == [GUARD_BYTE] * GUARD  # nothing was written
    assert fake.buffer(0).data.tolist() == [0] * 8


def test_a_view_at_an_offset_tinygrad_would_crash_on_is_refused() -> None:
    fake = FakeBackend()
    buf = fake.alloc(32, "float32")
    kind, message = violation(fake, lambda: fake.view(buf, 4, (4,), "float32"))
    assert (kind, message) == ("unaligned-view", "view at offset 4 of buffer #0 would crash tinygrad's CPU kernels")


@pytest.mark.parametrize("side", ["before", "after"])
@pytest.mark.parametrize("caught_by", ["copy_in", "free"])
def test_bytes_written_outside_a_buffer_are_caught_at_its_next_write_or_its_free(side: str, caught_by: str) -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    fake.buffer(0).raw[GUARD - 1 if side == "before" else GUARD + 8] = 0  # an off-by-one memmove's doing
    if caught_by == "copy_in":
        call: Callable[[], object] = lambda: fake.copy_in(buf, 0, memoryview(b"ok"), sync=True)  # noqa: E731
    else:
        call = lambda: fake.free(buf)  # noqa: E731
    assert violation(fake, call) == ("guard-bytes", "bytes outside buffer #0 were written")


def test_an_armed_failure_fails_the_next_calls_of_its_op_only() -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    fake.fail_next("copy_in", 2)
    for _ in range(2):
        with pytest.raises(BackendError, match="copy_in failed"):
            fake.copy_in(buf, 0, memoryview(b"x"), sync=True)
    fake.copy_in(buf, 0, memoryview(b"y"), sync=True)
    fake.copy_out(memoryview(bytearray(1)), buf, 0, sync=True)
    assert fake.buffer(0).data[:1].tobytes() == b"y" and fake.violations == []


def test_an_async_copy_moves_its_bytes_at_completion_and_a_failed_one_never() -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    ok = fake.copy_in(buf, 0, memoryview(b"good"), sync=False)
    fake.fail_next("copy_in")
    bad = fake.copy_in(buf, 4, memoryview(b"lost"), sync=False)
    assert fake.buffer(0).data.tobytes() == bytes(8) and fake.query(ok).done is False
    fake.complete(ok)
    fake.complete(bad)  # armed: completes as failed
    assert fake.query(ok).error is None and fake.query(bad).error == "fake: copy_in failed"
    assert fake.buffer(0).data.tobytes() == b"good" + bytes(4)
    with pytest.raises(ValueError, match="not pending"):
        fake.complete(ok)


def test_snapshot_changes_with_every_call_bytes_and_status() -> None:
    fake = FakeBackend()
    seen = [fake.snapshot()]
    buf = fake.alloc(8, "uint8")
    seen.append(fake.snapshot())
    ev = fake.copy_in(buf, 0, memoryview(b"ab"), sync=False)
    seen.append(fake.snapshot())
    fake.complete(ev)
    seen.append(fake.snapshot())
    fake.fail_next("free")
    seen.append(fake.snapshot())
    assert len(set(map(repr, seen))) == len(seen)
    assert fake.snapshot() == seen[-1]  # and only then


def test_subscribers_hear_every_completion_with_its_event() -> None:
    fake = FakeBackend()
    heard: list[int] = []
    assert fake.subscribe(lambda ev: heard.append(ev.id)) is True  # type: ignore[attr-defined]
    buf = fake.alloc(8, "uint8")
    a = fake.copy_in(buf, 0, memoryview(b"a"), sync=False)
    b = fake.copy_in(buf, 4, memoryview(b"b"), sync=False)
    fake.fail(b)
    fake.complete(a)
    assert heard == [1, 0]
    assert np.array_equal(fake.buffer(0).data[:1], [ord("a")])


def test_the_default_fake_device_holds_1_gib() -> None:
    fake = FakeBackend()
    assert fake.capacity == 1 << 30
    with pytest.raises(BackendError, match=f"cannot allocate {(1 << 30) + 1} B"):
        fake.alloc((1 << 30) + 1, "uint8")  # refused before any memory is taken
    assert fake.live_allocations == 0


def test_a_compute_writes_so_it_may_not_run_beside_a_pending_read() -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    fake.copy_out(memoryview(bytearray(4)), buf, 0, sync=False)
    kind, message = violation(fake, lambda: fake.compute([buf]))
    assert kind == "order" and message.startswith("compute whole on buffers [0] submitted while pending event #0")


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("value", ["yes", 1, None])
def test_run_on_wait_must_be_a_bool(value: object) -> None:
    with refused("ARG-1", match="run_on_wait must be a bool"):
        FakeBackend(run_on_wait=value)  # type: ignore[arg-type]


def test_a_one_byte_device_is_a_device() -> None:
    fake = FakeBackend(capacity=1)
    fake.alloc(1, "uint8")
    assert fake.capacity == 1 and fake.live_allocations == 1


def test_host_memory_running_out_is_a_backend_error() -> None:
    fake = FakeBackend(capacity=None)  # unlimited: the host's memory is the limit
    with pytest.raises(BackendError, match=f"fake: cannot allocate {1 << 50} B: "):
        fake.alloc(1 << 50, "uint8")
    assert fake.live_allocations == 0


def test_extend_and_view_anchor_refuse_what_is_not_theirs() -> None:
    fake = FakeBackend()
    with pytest.raises(KeyError, match="no fake event 999"):
        fake.extend(999)
    with pytest.raises(BackendError, match="fake: no buffer under the view"):
        fake.view_anchor(object())


def test_a_hung_wait_says_whether_the_event_finished_in_time() -> None:
    fake = FakeBackend(run_on_wait=False)
    buf = fake.alloc(8, "uint8")
    ev = fake.copy_in(buf, 0, memoryview(b"late"), sync=False)
    assert fake.wait(ev, 0.01) is False and ev.pending  # nobody completed it: the timeout passed
    fake.complete(ev)
    assert fake.wait(ev, 0.01) is True and fake.buffer(0).data[:4].tobytes() == b"late"


def test_fail_next_arms_one_failure_by_default() -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    fake.fail_next("copy_in")
    with pytest.raises(BackendError):
        fake.copy_in(buf, 0, memoryview(b"x"), sync=True)
    fake.copy_in(buf, 0, memoryview(b"y"), sync=True)  # only one was armed


def test_a_synchronizing_wait_runs_the_work_and_says_it_is_done() -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    ev = fake.copy_in(buf, 0, memoryview(b"now!"), sync=False)
    assert fake.wait(ev, None) is True and not ev.pending and fake.buffer(0).data[:4].tobytes() == b"now!"
    assert fake.wait(ev, 0) is True  # already done


def test_a_failed_query_abandons_the_work_and_wakes_a_waiter() -> None:
    fake = FakeBackend(run_on_wait=False)
    buf = fake.alloc(8, "uint8")
    ev = fake.copy_in(buf, 0, memoryview(b"lost"), sync=False)
    answers: list[bool] = []
    waiter = threading.Thread(target=lambda: answers.append(fake.wait(ev, 30)))
    waiter.start()
    time.sleep(0.05)
    fake.fail_next("query")
    with pytest.raises(BackendError, match="fake: query of event #0 failed"):
        fake.query(ev)
    waiter.join(10)
    assert answers == [True] and not waiter.is_alive()  # woken, not left to its 30 s timeout
    assert fake.query(ev).error == "fake: query failed; the work was abandoned"
    assert fake.buffer(0).data.tobytes() == bytes(8)


@pytest.mark.parametrize(("first", "second"), [((4, 8), (0, 4)), ((0, 4), (4, 8))])
def test_copies_of_adjacent_bytes_may_run_together(first: tuple[int, int], second: tuple[int, int]) -> None:
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    fake.copy_in(buf, first[0], memoryview(bytes(4)), sync=False)
    fake.copy_in(buf, second[0], memoryview(bytes(4)), sync=False)
    assert len(fake.pending()) == 2 and fake.violations == []


def test_the_order_check_looks_past_pending_work_on_other_buffers() -> None:
    fake = FakeBackend()
    a, b = fake.alloc(8, "uint8"), fake.alloc(8, "uint8")
    fake.copy_in(a, 0, memoryview(bytes(4)), sync=False)
    fake.copy_in(b, 0, memoryview(bytes(4)), sync=False)
    kind, message = violation(fake, lambda: fake.copy_out(memoryview(bytearray(2)), b, 2, sync=False))
    assert kind == "order" and "pending event #1" in message


def test_an_input_copy_that_reads_changed_host_bytes_is_a_late_read() -> None:
    """Host bytes an asynchronous input copy was given must not change before the device reads
    them (at completion): if they do, they were released too early (H2D-2, H2D-3)."""
    fake = FakeBackend()
    buf = fake.alloc(4, "uint8")
    host = bytearray(b"good")
    ev = fake.copy_in(buf, 0, memoryview(host), sync=False)
    host[:] = b"evil"
    kind, message = violation(fake, lambda: fake.complete(ev))
    assert kind == "late-read" and "read host bytes that changed after it was issued" in message
    assert fake.buffer(0).data.tobytes() == b"\0\0\0\0"  # nothing moved


def seeded_device_run(reads_sync_late: bool) -> tuple[FakeBackend, bytes]:
    """Through the Bridge: an async upload pending on the device, then a sync upload whose host
    bytes are reused once it returns (the contract allows it), then the pending upload ends."""
    from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec

    fake = FakeBackend()
    fake.reads_sync_late = reads_sync_late
    bridge, ring = Bridge(fake), HostRing(8)
    x, y = (bridge.alloc_device(ObjectSpec("b", "uint8"), 4) for _ in range(2))
    first, second = ring.reserve(4), ring.reserve(4)
    ring.view(first)[:], ring.view(second)[:] = b"sync", b"asyn"
    pending = bridge.host_to_device(second, DeviceRange(x, 0, 4), sync=False)
    bridge.host_to_device(first, DeviceRange(y, 0, 4))  # sync: the bytes are released on return
    reused = ring.reserve(4)
    assert ring.raw(reused) == ring.raw(first)  # the same bytes of the ring
    ring.view(reused)[:] = b"XXXX"
    fake.complete(pending)
    return fake, fake.buffer(1).data.tobytes()


def test_a_device_whose_sync_copy_only_enqueues_is_caught_by_the_late_read_check() -> None:
    """The seeded device bug (`reads_sync_late`, tinygrad's `_copyin` on OpenCL): the sync copy
    reports done, the Bridge releases its bytes, and the device reads them after they were reused."""
    fake, got = seeded_device_run(reads_sync_late=False)
    assert got == b"sync" and fake.violations == []  # a device that reads before returning
    with pytest.raises(FakeViolation) as caught:
        seeded_device_run(reads_sync_late=True)
    assert caught.value.kind == "late-read"


#: The device bytes a late copy lands on, until it does.
UNLANDED = bytes([POISON_BYTE]) * 4


def late_device(pending_ahead: int = 0) -> tuple[FakeBackend, list[object], int]:
    """A `reads_sync_late` fake holding one sync upload of b"late" into a new buffer, reported done
    but not yet moved (its bytes poison until then), behind `pending_ahead` pending async uploads
    (a buffer each)."""
    fake = FakeBackend()
    fake.reads_sync_late = True
    ahead = [fake.copy_in(fake.alloc(4, "uint8"), 0, memoryview(b"head"), sync=False) for _ in range(pending_ahead)]
    target: int = fake.alloc(4, "uint8")  # type: ignore[assignment]
    done = fake.copy_in(target, 0, memoryview(b"late"), sync=True)
    assert fake.query(done).done and fake.buffer(target).data.tobytes() == UNLANDED
    return fake, ahead, target


@pytest.mark.parametrize(
    "next_call",
    [
        pytest.param(lambda f: f.free(f.alloc(4, "uint8")), id="free"),
        pytest.param(lambda f: f.copy_in(f.alloc(4, "uint8"), 0, memoryview(b"next"), sync=False), id="copy_in"),
        pytest.param(lambda f: f.copy_out(memoryview(bytearray(4)), f.alloc(4, "uint8"), 0, sync=False), id="copy_out"),
        pytest.param(lambda f: f.compute([f.alloc(4, "uint8")]), id="compute"),
    ],
)
def test_a_late_copy_with_nothing_ahead_moves_at_the_next_call_that_submits_or_ends_work(
    next_call: Callable[[FakeBackend], object],
) -> None:
    fake, _, target = late_device()
    fake.alloc(4, "uint8")  # an alloc submits no work: the bytes still wait
    assert fake.buffer(target).data.tobytes() == UNLANDED
    next_call(fake)
    assert fake.buffer(target).data.tobytes() == b"late" and fake.violations == []


def test_a_late_copy_waits_for_the_events_ahead_of_it_whatever_else_is_called() -> None:
    fake, (ahead,), target = late_device(1)
    fake.compute([fake.alloc(4, "uint8")])  # a call that submits work: the queue has not reached it
    assert fake.buffer(target).data.tobytes() == UNLANDED
    fake.complete(ahead)
    assert fake.buffer(target).data.tobytes() == b"late"


def test_a_late_copy_moves_when_a_failed_query_abandons_the_work_ahead_of_it() -> None:
    fake, (ahead,), target = late_device(1)
    fake.fail_next("query")
    with pytest.raises(BackendError, match="query of event #0 failed"):
        fake.query(ahead)
    assert fake.buffer(target).data.tobytes() == b"late"


def test_the_next_buffer_id_is_unknown_not_freed() -> None:
    fake = FakeBackend()
    fake.free(fake.alloc(4, "uint8"))  # id 0 freed; id 1 was never made
    assert violation(fake, lambda: fake.free(1)) == ("unknown-buffer", "free of unknown buffer 1")
    assert violation(fake, lambda: fake.compute([1])) == ("unknown-buffer", "compute on unknown buffer 1")
    assert violation(fake, lambda: fake.free(0)) == ("double-free", "buffer #0 freed twice")


def in_order_queue() -> tuple[FakeBackend, list[object], list[int]]:
    """An in-order fake with three pending uploads, each into its own buffer, and a listener's log."""
    fake = FakeBackend(in_order=True)
    events = [fake.copy_in(fake.alloc(4, "uint8"), 0, memoryview(b"%4d" % i), sync=False) for i in range(3)]
    heard: list[int] = []
    fake.subscribe(lambda ev: heard.append(ev.id))  # type: ignore[attr-defined]
    return fake, events, heard


def test_in_order_a_failed_event_ends_the_events_ahead_of_it_first_and_they_are_heard() -> None:
    fake, (first, second, third), heard = in_order_queue()
    fake.fail(second)
    assert heard == [0, 1] and third.pending  # type: ignore[attr-defined]
    assert fake.query(first) == OK and fake.query(second).error == "injected failure"
    assert fake.buffer(0).data.tobytes() == b"   0" and fake.buffer(1).data.tobytes() == bytes(4)


def test_in_order_a_synchronizing_wait_runs_the_events_ahead_first_and_they_are_heard() -> None:
    fake, (first, second, third), heard = in_order_queue()
    assert fake.wait(second, None) is True
    assert heard == [0, 1] and not first.pending and third.pending  # type: ignore[attr-defined]
    assert fake.buffer(0).data.tobytes() == b"   0" and fake.buffer(1).data.tobytes() == b"   1"


def test_in_order_a_sync_copy_ends_the_work_ahead_unheard_because_its_caller_holds_its_locks() -> None:
    fake, (first, second, third), heard = in_order_queue()
    host = bytearray(b"host")
    fake.copy_out(memoryview(host), fake.alloc(4, "uint8"), 0, sync=True)  # behind all three on the queue
    assert host == bytes(4) and heard == [] and not any(e.pending for e in (first, second, third))  # type: ignore[attr-defined]


def test_in_order_an_event_ahead_ended_by_a_listener_meanwhile_is_passed_over() -> None:
    """Completing the last event runs the two ahead; hearing of the first, a listener completes
    the second (as the Bridge's launch of a held use may): the queue then finds it done."""
    fake, (first, second, third), heard = in_order_queue()
    fake.subscribe(lambda ev: fake.complete(second) if ev is first else None)
    fake.complete(third)
    assert heard == [0, 1, 2] and fake.violations == []
    assert [fake.buffer(i).data.tobytes() for i in range(3)] == [b"   0", b"   1", b"   2"]


class CompletesOnExit:
    """The fake's condition, completing `token` (once armed) as the outermost block that holds it
    exits: another thread completing the event in the instant between wait's check and its own
    run of the work, made deterministic."""

    def __init__(self, fake: FakeBackend) -> None:
        self.inner, self.fake, self.depth = fake._cond, fake, 0
        self.token: object = None

    def __enter__(self) -> bool:
        self.depth += 1
        return self.inner.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1
        self.inner.__exit__(*exc)
        if self.depth == 0 and self.token is not None:
            token, self.token = self.token, None
            self.fake.complete(token)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_a_wait_that_loses_the_race_to_another_completion_returns_done() -> None:
    fake = FakeBackend()
    buf = fake.alloc(4, "uint8")
    token = fake.copy_in(buf, 0, memoryview(b"race"), sync=False)
    racing = CompletesOnExit(fake)
    fake._cond = racing  # type: ignore[assignment]
    racing.token = token
    assert fake.wait(token, None) is True
    assert racing.token is None and fake.query(token).done and fake.query(token).error is None
    assert fake.violations == [] and fake.buffer(buf).data.tobytes() == b"race"  # type: ignore[arg-type]


def test_every_backend_documents_each_protocol_method_its_own_docstring_first() -> None:
    import inspect

    from devbridge.backends.base import Backend
    from devbridge.backends.tinygrad import TinygradBackend
    from devbridge.testing import FaultyBackend

    methods = [n for n, m in vars(Backend).items() if callable(m) and not n.startswith("_")]
    assert len(methods) == 13
    for cls in (FakeBackend, FaultyBackend, TinygradBackend):
        assert inspect.getdoc(cls) and all(inspect.getdoc(getattr(cls, n)) for n in methods), cls
    assert FakeBackend.copy_in.__doc__ == Backend.copy_in.__doc__  # the protocol's, where it had none
    assert FakeBackend.wait.__doc__ != Backend.wait.__doc__  # its own kept


@pytest.mark.parametrize("token", [[0], {}, False, True, 0.0, "0", None])
def test_a_control_given_what_is_no_event_id_names_it_in_a_key_error(token: object) -> None:
    """An unhashable token, or one equal to an event's id but not an int (False == 0), is no
    event: the same KeyError as an unknown id, never a TypeError, never the pending event."""
    fake = FakeBackend()
    buf = fake.alloc(8, "uint8")
    event = fake.copy_in(buf, 0, memoryview(bytes(8)), sync=False)
    for control in (fake.complete, fake.fail):
        with pytest.raises(KeyError, match="no fake event"):
            control(token)
    assert not fake.query(event).done


@pytest.mark.parametrize(
    "options",
    [
        {"inner": None},
        {"inner": "fake"},
        {"rate": 1.5},
        {"rate": "0.1"},
        {"rate": True},
        {"seed": []},
        {"seed": -1},
        {"random_ops": ["alloc"]},
        {"random_ops": ("launch",)},
        {"log_limit": -1},
        {"log_limit": 2**64},
        {"log_limit": 1.5},
    ],
    ids=repr,
)
def test_a_faulty_backend_refuses_options_out_of_their_range(options: dict[str, object]) -> None:
    from devbridge.backends.faulty import FaultyBackend
    from devbridge.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as refused_:
        FaultyBackend(**{"inner": FakeBackend(), **options})  # type: ignore[arg-type]
    assert refused_.value.rule == "ARG-1"
