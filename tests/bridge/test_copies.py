"""Host<->device copies: exact ranges, release and validity points, failures (H2D-*, D2H-*, COPY-F, RANGE-1)."""

from __future__ import annotations

import pytest
from rules import assert_each_refused, assert_refused, refused
from support import U8, put, read_device, snapshot, world

from devbridge import (
    Bridge,
    DeviceCopyError,
    DeviceHandle,
    DeviceRange,
    HostRange,
    HostRing,
    OutputCopyError,
    OutputNotReadyError,
)
from devbridge.backends.fake import GUARD, GUARD_BYTE, Call, FakeBackend, FakeViolation
from devbridge.bridge.events import Event
from devbridge.statemachine.status import Status


@pytest.mark.holds("H2D-1", "H2D-2")
def test_sync_h2d_copies_exactly_the_range_and_releases_on_return(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 64)
    pad = put(ring, b"P" * 5)  # a neighbouring reservation that must not move
    src = put(ring, bytes(range(100, 120)))
    ev = bridge.host_to_device(src.sub(4, 10), DeviceRange(h, 30, 10))
    assert ev.done() and ev.error is None
    assert fake.calls[-1] == Call("copy_in", 0, 30, 10, True, 0)
    assert bytes(fake.buffer(0).data) == bytes(30) + bytes(range(104, 114)) + bytes(24)
    # exactly the copied bytes are released: not the 4 before, not the 6 after, not the pad
    assert ring.released(src.sub(4, 10)) and not ring.released(src.sub(0, 4)) and not ring.released(src.sub(14, 6))
    assert not ring.released(pad) and ring.cursor == 0
    assert read_device(bridge, ring, h, 30, 10) == bytes(range(104, 114))


@pytest.mark.holds("H2D-3")
def test_async_h2d_releases_only_at_completion_and_reads_host_bytes_then(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 16)
    src = put(ring, b"abcdefgh")
    ev = bridge.host_to_device(src, DeviceRange(h, 8, 8), sync=False)
    assert not ev.done() and not ring.released(src) and bridge.state(h) == "copying"
    assert ring.cursor == 0
    assert bytes(fake.buffer(0).data) == bytes(16)  # nothing moved yet
    fake.complete(ev)
    assert ev.done() and ring.released(src) and ring.cursor == src.end
    assert bytes(fake.buffer(0).data) == bytes(8) + b"abcdefgh"
    assert bridge.state(h) == "idle"


@pytest.mark.rejects("H2D-3")
def test_async_h2d_host_bytes_cannot_be_released_while_pending(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 16)
    src = put(ring, b"abcdefgh")
    ev = bridge.host_to_device(src, DeviceRange(h, 0, 8), sync=False)
    before = snapshot(bridge, fake, ring, [h])
    with refused("H2D-3"):
        ring.release(src.sub(2, 2))
    assert snapshot(bridge, fake, ring, [h]) == before
    fake.complete(ev)
    assert ring.released(src)


@pytest.mark.holds("H2D-3", "RING-1")
def test_overlapping_async_inputs_release_shared_bytes_with_the_last(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 32)
    src = put(ring, bytes(range(12)))
    a = bridge.host_to_device(src.sub(0, 8), DeviceRange(h, 0, 8), sync=False)
    b = bridge.host_to_device(src.sub(4, 8), DeviceRange(h, 16, 8), sync=False)
    fake.complete(a)
    assert ring.released(src.sub(0, 4)) and not ring.released(src.sub(4, 8))
    assert ring.cursor == src.start + 4
    fake.complete(b)
    assert ring.released(src) and ring.cursor == src.end
    assert bytes(fake.buffer(0).data) == bytes(range(8)) + bytes(8) + bytes(range(4, 12)) + bytes(8)


@pytest.mark.holds("D2H-1", "D2H-2")
def test_sync_d2h_writes_exactly_the_host_range(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 32)
    bridge.host_to_device(put(ring, bytes(range(1, 33))), DeviceRange(h, 0, 32))
    out = put(ring, b"\xee" * 12)
    ev = bridge.device_to_host(DeviceRange(h, 10, 8), out.sub(2, 8))
    assert ev.done() and fake.calls[-1] == Call("copy_out", 0, 10, 8, True, 1)
    assert bytes(ring.view(out)) == b"\xee\xee" + bytes(range(11, 19)) + b"\xee\xee"
    assert not ring.released(out)  # the worker releases output it consumed
    ring.release(out)
    assert ring.released(out) and ring.cursor == out.end


@pytest.mark.holds("D2H-3")
@pytest.mark.rejects("D2H-3")
def test_async_d2h_is_readable_only_after_completion(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 8)
    bridge.host_to_device(put(ring, b"ABCDEFGH"), DeviceRange(h, 0, 8))
    out = ring.reserve(8)
    ev = bridge.device_to_host(DeviceRange(h, 0, 8), out, sync=False)
    for r in (out, out.sub(3, 1)):
        with refused("D2H-3"):
            ring.view(r)
    with refused("RING-3"):
        ring.release(out)  # the device still writes there
    fake.complete(ev)
    assert bytes(ring.view(out)) == b"ABCDEFGH"


@pytest.mark.holds("COPY-F")
@pytest.mark.rejects("COPY-F")
def test_sync_h2d_failure_raises_and_keeps_host_bytes_for_a_retry(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 8)
    src = put(ring, b"retry me")
    fake.fail_next("copy_in")
    with refused("COPY-F") as e:
        bridge.host_to_device(src, DeviceRange(h, 0, 8))
    assert not isinstance(e.value, OutputCopyError)
    assert not ring.released(src) and bridge.state(h) == "allocated"
    assert bridge.stats().copy_failures == 1
    bridge.host_to_device(src, DeviceRange(h, 0, 8))
    assert ring.released(src) and read_device(bridge, ring, h, 0, 8) == b"retry me"


@pytest.mark.holds("COPY-F")
@pytest.mark.parametrize("at_once", [False, True])
def test_async_h2d_failure_surfaces_from_the_event(
    bridge: Bridge, fake: FakeBackend, ring: HostRing, at_once: bool
) -> None:
    """Also where the backend finishes other copies at submission: one armed to fail stays in flight."""
    h = bridge.alloc_device(U8, 8)
    src = put(ring, b"12345678")
    fake.finish_at_once = at_once
    fake.fail_next("copy_in")
    ev = bridge.host_to_device(src, DeviceRange(h, 0, 8), sync=False)
    assert not ev.done() and bridge.state(h) == "copying" and not ring.released(src)
    fake.complete(ev)  # the injected failure fires at completion
    assert ev.done() and isinstance(ev.error, DeviceCopyError) and ev.error.rule == "COPY-F"
    with refused("COPY-F"):
        ev.wait()
    assert not ring.released(src) and bridge.state(h) == "idle"
    assert bytes(fake.buffer(0).data) == bytes(8) and bridge.stats().copy_failures == 1


@pytest.mark.holds("COPY-F", "D2H-3")
@pytest.mark.parametrize("sync", [True, False])
def test_d2h_failure_is_an_output_copy_error_and_the_range_is_never_readable(
    bridge: Bridge, fake: FakeBackend, ring: HostRing, sync: bool
) -> None:
    h = bridge.alloc_device(U8, 8)
    out = ring.reserve(8)
    fake.fail_next("copy_out")
    if sync:
        with pytest.raises(OutputCopyError) as e:
            bridge.device_to_host(DeviceRange(h, 0, 8), out)
        error = e.value
    else:
        ev = bridge.device_to_host(DeviceRange(h, 0, 8), out, sync=False)
        fake.fail(ev, "link down")
        error = ev.error  # type: ignore[assignment]
        assert isinstance(error, OutputCopyError) and "link down" in str(error)
    assert isinstance(error, DeviceCopyError) and error.rule == "COPY-F"
    with pytest.raises(OutputNotReadyError, match="failed output"):
        ring.view(out)
    bridge.device_to_host(DeviceRange(h, 0, 8), out)  # a retry makes it valid
    assert bytes(ring.view(out)) == bytes(8)


@pytest.mark.rejects("H2D-2", "RING-3")
def test_released_host_bytes_cannot_be_copied_again(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 8)
    src = put(ring, b"once....")
    bridge.host_to_device(src, DeviceRange(h, 0, 8))
    before = snapshot(bridge, fake, ring, [h])
    with refused("H2D-2") as e:  # released when the sync copy returned: refused as RING-3
        bridge.host_to_device(src, DeviceRange(h, 0, 8))
    assert_refused(e.value, "RING-3")
    assert snapshot(bridge, fake, ring, [h]) == before


@pytest.mark.rejects("D2H-2")
def test_sync_d2h_that_fails_leaves_no_valid_bytes(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 4)
    out = put(ring, b"old!")
    fake.fail_next("copy_out")
    with refused("COPY-F", OutputCopyError):
        bridge.device_to_host(DeviceRange(h, 0, 4), out)
    with refused("D2H-2"):  # refused as D2H-3
        ring.view(out)  # the stale "old!" is never presented as output


@pytest.mark.rejects("RING-3")
def test_pending_copies_guard_their_host_bytes(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 16)
    src = put(ring, b"s" * 8)
    out = ring.reserve(8)
    bridge.host_to_device(src, DeviceRange(h, 0, 8), sync=False)
    bridge.device_to_host(DeviceRange(h, 8, 8), out, sync=False)
    bad = [
        lambda: bridge.device_to_host(DeviceRange(h, 0, 4), src.sub(0, 4)),  # write into bytes being read
        lambda: bridge.device_to_host(DeviceRange(h, 0, 4), out.sub(4, 4)),  # two writers
        lambda: bridge.host_to_device(out.sub(0, 4), DeviceRange(h, 0, 4)),  # read bytes being written
    ]
    assert_each_refused("RING-3", bad, world(bridge, fake, ring, [h]))
    # a second reader of the same input bytes is fine
    bridge.host_to_device(src, DeviceRange(h, 8, 8), sync=False)


@pytest.mark.holds("RANGE-1")
def test_ranges_at_the_very_edges_are_accepted(bridge: Bridge, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 16)
    bridge.host_to_device(put(ring, b"Z"), DeviceRange(h, 15, 1))
    bridge.host_to_device(put(ring, b"A"), DeviceRange(h, 0, 1))
    assert read_device(bridge, ring, h, 0, 16) == b"A" + bytes(14) + b"Z"


@pytest.mark.rejects("RANGE-1")
def test_bad_ranges_raise_range_error_before_any_backend_call(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 16)
    src = put(ring, b"x" * 8)
    other_ring = HostRing(64)
    foreign = other_ring.reserve(8)
    constructions = [
        lambda: DeviceRange(h, 12, 8),  # past the extent
        lambda: DeviceRange(h, -1, 4),  # negative offset
        lambda: DeviceRange(h, 0, 0),  # empty
        lambda: DeviceRange(h, 0, -3),  # negative size
        lambda: HostRange(ring, -8, 8),
        lambda: src.sub(4, 8),  # past the host range
    ]
    calls = [
        lambda: bridge.host_to_device(DeviceRange(h, 0, 8), src),  # type: ignore[arg-type]  # swapped
        lambda: ring.release(foreign),  # another ring's range
    ]
    raised = assert_each_refused("RANGE-1", constructions + calls, world(bridge, fake, ring, [h]))
    assert all(isinstance(e, ValueError) for e in raised)


def test_fake_catches_a_write_outside_the_buffer(fake: FakeBackend) -> None:
    buf = fake.alloc(8, "uint8")
    fake.buffer(buf).raw[GUARD + 8] = 0  # scribble on the guard, as an off-by-one write would
    with pytest.raises(FakeViolation, match="outside buffer"):
        fake.copy_in(buf, 0, memoryview(b"abcd"), sync=True)
    fake.buffer(buf).raw[GUARD + 8] = GUARD_BYTE


def test_fake_refuses_out_of_bounds_offsets(fake: FakeBackend) -> None:
    buf = fake.alloc(8, "uint8")
    with pytest.raises(FakeViolation, match=r"\[6, 10\) outside buffer #0"):
        fake.copy_in(buf, 6, memoryview(b"abcd"), sync=True)


@pytest.mark.rejects("H2D-1", "D2H-1")
def test_copies_between_ranges_of_different_sizes_are_rejected(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 16)
    src, out = put(ring, b"x" * 8), put(ring, b"y" * 8)
    before = snapshot(bridge, fake, ring, [h])
    with refused("H2D-1"):
        bridge.host_to_device(src, DeviceRange(h, 0, 4))  # would drop 4 host bytes
    with refused("D2H-1"):
        bridge.device_to_host(DeviceRange(h, 0, 8), out.sub(0, 4))  # would spill past the host range
    assert snapshot(bridge, fake, ring, [h]) == before and bytes(ring.view(out)) == b"y" * 8


@pytest.mark.holds("H2D-3")
def test_kept_input_is_released_by_the_worker_only_after_completion(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 8)
    src = put(ring, b"keep me!")
    ev = bridge.host_to_device(src, DeviceRange(h, 0, 8), sync=False, release=False)
    with refused("H2D-3"):
        ring.release(src)  # still read by the copy
    fake.complete(ev)
    assert ev.done() and not ring.released(src)  # safe to release now, but the worker decides
    bridge.restart()  # e.g. a restart before the object was delivered: its input is still there
    h2 = bridge.alloc_device(U8, 8)
    bridge.host_to_device(src, DeviceRange(h2, 0, 8), release=False)
    assert read_device(bridge, ring, h2, 0, 8) == b"keep me!"
    ring.release(src)
    assert ring.released(src) and ring.cursor == ring.head


@pytest.mark.holds("H2D-3")
def test_host_bytes_read_by_a_pending_input_copy_are_read_only(bridge: Bridge, fake: FakeBackend) -> None:
    """Regression: view() handed out writable bytes while an async copy still read them,
    and the device received the overwritten bytes."""
    ring = HostRing(64)
    h = bridge.alloc_device(U8, 8)
    src = put(ring, b"original")
    ev = bridge.host_to_device(src, DeviceRange(h, 0, 8), sync=False, release=False)
    view = ring.view(src)
    assert view.readonly and bytes(view) == b"original"
    assert ring.view(src.sub(2, 2)).readonly
    with pytest.raises(TypeError):
        view[:] = b"XXXXXXXX"
    fake.complete(ev)
    assert ev.done() and ev.error is None
    assert bytes(fake.buffer(0).data) == b"original"
    writable = ring.view(src)  # the copy is done: the worker's bytes again
    assert not writable.readonly
    writable[:] = b"reusable"
    assert bytes(ring.view(src)) == b"reusable"


@pytest.mark.holds("ARG-1")
def test_numpy_integers_are_sizes_and_flags_are_bools(bridge: Bridge, fake: FakeBackend) -> None:
    import numpy as np

    from devbridge import ObjectSpec, TensorViewSpec

    ring = HostRing(np.int64(64))
    h = bridge.alloc_device(ObjectSpec("x", "float32"), np.int32(16))
    src = ring.reserve(np.uint16(8))
    ring.view(src)[:] = b"12345678"
    bridge.host_to_device(src.sub(np.int8(0), np.int64(8)), DeviceRange(h, np.int64(4), np.uint8(8)), sync=True)
    view = TensorViewSpec((np.int64(2),), "float32", np.int32(4))
    assert (view.shape, view.offset, type(view.shape[0])) == ((2,), 4, int)
    assert bytes(fake.buffer(0).data) == bytes(4) + b"12345678" + bytes(4)


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("flag", ["no", 0, 1, 0.0, None, [], "False"])
def test_flags_that_are_not_bools_are_refused(bridge: Bridge, fake: FakeBackend, flag: object) -> None:

    ring = HostRing(64)
    h = bridge.alloc_device(U8, 8)
    src, out = put(ring, b"flagflag"), ring.reserve(8)
    calls = [
        lambda: bridge.host_to_device(src, DeviceRange(h, 0, 8), sync=flag),  # type: ignore[arg-type]
        lambda: bridge.host_to_device(src, DeviceRange(h, 0, 8), release=flag),  # type: ignore[arg-type]
        lambda: bridge.device_to_host(DeviceRange(h, 0, 8), out, sync=flag),  # type: ignore[arg-type]
    ]
    assert_each_refused("ARG-1", calls, world(bridge, fake, ring, [h]))


def recorded_queries(fake: FakeBackend) -> list[object]:
    """The tokens `fake` is queried for, in order, from now on."""
    queries: list[object] = []
    original = fake.query

    def query(token: object) -> Status:
        queries.append(token)
        return original(token)

    fake.query = query  # type: ignore[method-assign]
    return queries


@pytest.mark.holds("H2D-2", "D2H-2")
@pytest.mark.parametrize("release", [True, False])
def test_an_async_copy_the_backend_finishes_at_submission_ends_as_a_sync_copy_does(release: bool) -> None:
    """One query at submission; done already: the synchronous copy's fused step, nothing tracked."""
    results = []
    for sync in (True, False):
        fake = FakeBackend()
        bridge, ring = Bridge(fake), HostRing(64)
        h = bridge.alloc_device(U8, 16)
        src, out = put(ring, b"at once!"), ring.reserve(8)
        fake.finish_at_once = True
        queries = recorded_queries(fake)
        ev_in = bridge.host_to_device(src, DeviceRange(h, 4, 8), sync=sync, release=release)
        ev_out = bridge.device_to_host(DeviceRange(h, 4, 8), out, sync=sync)
        assert ev_in.done() and ev_out.done() and ev_in.error is None and ev_out.error is None
        assert bytes(ring.view(out)) == b"at once!" and ring.released(src) is release
        assert queries == ([] if sync else [ev_in.backend_token, ev_out.backend_token])
        calls = [(c.op, c.offset, c.nbytes, c.sync) for c in fake.calls[1:]]
        assert fake.calls[0].op == "alloc" and calls == [("copy_in", 4, 8, sync), ("copy_out", 4, 8, sync)]
        results.append((bridge.state(h), bridge.stats(), ring.snapshot()))
    (sync_state, sync_stats, sync_ring), (async_state, async_stats, async_ring) = results
    assert async_state == sync_state == "idle" and async_ring == sync_ring
    assert async_stats == sync_stats and async_stats.pending_events == 0


@pytest.mark.holds("H2D-1", "H2D-2", "D2H-1", "D2H-2")
def test_a_repeated_sync_copy_takes_the_per_call_path_with_the_same_effects(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    """Every synchronous copy that follows nothing finds its composite step at once, the first on
    the allocation too (the steps are made with the core; no check call): the same backend calls,
    bytes, releases, events and counts each time."""
    h = bridge.alloc_device(U8, 64)
    checks: list[str] = []
    check = bridge._core.check
    bridge._core.check = lambda handles, event: (checks.append(event), check(handles, event))[1]  # type: ignore[method-assign]
    for i in range(3):
        src = put(ring, bytes([i + 1]) * 16)
        event = bridge.host_to_device(src, DeviceRange(h, 16 * i, 16))
        assert event.done() and event.error is None and (event.src, event.dst) == (src, DeviceRange(h, 16 * i, 16))
        assert ring.released(src) and fake.calls[-1] == Call("copy_in", 0, 16 * i, 16, True, 2 * i)
        out = ring.reserve(16)
        event = bridge.device_to_host(DeviceRange(h, 16 * i, 16), out)
        assert event.done() and event.error is None and bytes(ring.view(out)) == bytes([i + 1]) * 16
        assert fake.calls[-1] == Call("copy_out", 0, 16 * i, 16, True, 2 * i + 1) and not ring.released(out)
        ring.release(out)
    # never checked: each copy's step was looked up (the checks' refusals have their own tests)
    assert checks == []
    assert fake.ops() == ["alloc"] + ["copy_in", "copy_out"] * 3
    stats = bridge.stats()
    assert (stats.copies_in, stats.bytes_in, stats.copies_out, stats.bytes_out) == (3, 48, 3, 48)
    assert bridge.pins(h).state == "idle" and bytes(fake.buffer(0).data) == bytes(
        [1] * 16 + [2] * 16 + [3] * 16 + [0] * 16
    )


def test_a_copys_event_has_every_field_the_base_event_makes_with_the_same_values(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    """A copy's event has every field the base event makes, with the same values, and only its
    ranges besides."""
    h = bridge.alloc_device(U8, 16)
    src = put(ring, b"x" * 16)
    copy = bridge.host_to_device(src, DeviceRange(h, 0, 16), sync=False)
    base = Event(copy._engine, copy.use_id, copy.backend_token)
    assert vars(base).keys() <= vars(copy).keys()
    assert {k: v for k, v in vars(copy).items() if k in vars(base)} == {**vars(base), "_done": copy._done}
    assert set(vars(copy)) - set(vars(base)) == {"src", "dst"}


@pytest.mark.rejects("RING-3")
def test_the_per_call_path_refuses_the_host_bytes_the_checks_refuse(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    """A copy into or out of an allocation with nothing in flight, of a kind and state that took
    the per-call path before, still checks its host range: released bytes, bytes a pending copy
    (on another allocation) writes or reads, are refused with nothing changed."""
    h, other = bridge.alloc_device(U8, 16), bridge.alloc_device(U8, 16)
    for _ in range(2):  # each kind's step made from both states the copies leave h in
        bridge.host_to_device(put(ring, b"w" * 8), DeviceRange(h, 0, 8))
        out = ring.reserve(8)
        bridge.device_to_host(DeviceRange(h, 0, 8), out)
        ring.release(out)
    released = put(ring, b"r" * 8)
    bridge.host_to_device(released, DeviceRange(h, 0, 8))
    reading, writing = put(ring, b"s" * 8), ring.reserve(8)
    bridge.host_to_device(reading, DeviceRange(other, 0, 8), sync=False)
    bridge.device_to_host(DeviceRange(other, 8, 8), writing, sync=False)
    bad = [
        lambda: bridge.host_to_device(released, DeviceRange(h, 0, 8)),  # released on return
        lambda: bridge.device_to_host(DeviceRange(h, 0, 8), released),
        lambda: bridge.host_to_device(writing, DeviceRange(h, 0, 8)),  # read bytes being written
        lambda: bridge.device_to_host(DeviceRange(h, 0, 8), reading),  # write bytes being read
    ]
    assert_each_refused("RING-3", bad, world(bridge, fake, ring, [h, other]))


@pytest.mark.rejects("RANGE-1")
def test_the_per_call_path_takes_exactly_the_ranges_the_checks_accept(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    """Once a kind's step is made, the per-call path takes every range within the extent, to its
    very edges, and declines every other one (a range altered after its own checks included),
    which the checks then refuse as RANGE-1 with nothing changed."""
    h = bridge.alloc_device(U8, 16)
    for _ in range(2):
        bridge.host_to_device(put(ring, b"w" * 16), DeviceRange(h, 0, 16))
    src = put(ring, b"e" * 16)
    for offset, nbytes in ((0, 16), (0, 1), (15, 1), (8, 8)):
        bridge.host_to_device(src.sub(0, nbytes), DeviceRange(h, offset, nbytes))
        assert fake.calls[-1].op == "copy_in" and (fake.calls[-1].offset, fake.calls[-1].nbytes) == (offset, nbytes)
        src = put(ring, b"e" * 16)

    def altered(offset: object, nbytes: object) -> DeviceRange:
        r = DeviceRange(h, 0, 1)
        object.__setattr__(r, "offset", offset)
        object.__setattr__(r, "nbytes", nbytes)
        return r

    bad = [altered(-1, 1), altered(8, 9), altered(0, 0), altered(0, -1), altered(0.0, 1), altered(0, 1.0)]

    def host_for(r: DeviceRange) -> HostRange:  # as long as the range where it can be: only the range is wrong
        return src.sub(0, r.nbytes) if type(r.nbytes) is int and 0 < r.nbytes <= 16 else src.sub(0, 1)

    empty = src.sub(0, 1)
    object.__setattr__(empty, "nbytes", 0)  # an empty host range for the empty device range
    assert_each_refused(
        "RANGE-1",
        [lambda r=r: bridge.host_to_device(host_for(r), r) for r in bad]
        + [lambda: bridge.host_to_device(empty, altered(0, 0))],
        world(bridge, fake, ring, [h]),
    )


def warm(bridge: Bridge, ring: HostRing, h: DeviceHandle) -> None:
    """Make each kind's one-step copy of `h` from the states its copies leave it in: later
    synchronous copies of `h` with nothing in flight take the per-call path."""
    for _ in range(2):
        bridge.host_to_device(put(ring, bytes(4)), DeviceRange(h, 0, 4))
        out = ring.reserve(4)
        bridge.device_to_host(DeviceRange(h, 0, 4), out)
        ring.release(out)


@pytest.mark.rejects("RANGE-1", "HANDLE-1")
def test_the_per_call_path_declines_whatever_is_not_the_issued_range_of_a_live_allocation(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 16)
    warm(bridge, ring, h)
    src = put(ring, b"x" * 4)
    copy = DeviceHandle(h.id, h.generation, h.extent, h.spec, h.owner, h.seal)  # genuine, not the issued object
    forged = DeviceRange(h, 0, 4)
    object.__setattr__(forged, "handle", "not a handle")
    renamed = DeviceRange(h, 0, 4)
    object.__setattr__(renamed, "handle", DeviceHandle("0", h.generation, h.extent, h.spec, h.owner, h.seal))
    bridge.host_to_device(src, DeviceRange(copy, 0, 4))  # the checks take a genuine copy
    assert_each_refused(
        "RANGE-1",
        [lambda: bridge.host_to_device(object(), DeviceRange(h, 0, 4)), lambda: bridge.host_to_device(src, object())],
        world(bridge, fake, ring, [h]),
    )
    assert_each_refused(
        "HANDLE-1",
        [
            lambda: bridge.host_to_device(put(ring, b"y" * 4), forged),
            lambda: bridge.host_to_device(put(ring, b"z" * 4), renamed),
        ],
        lambda: (bridge.stats(), bridge.state(h), fake.snapshot()),
    )


@pytest.mark.holds("ORDER-1")
def test_a_sync_copy_on_an_allocation_with_copies_in_flight_still_follows_them(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    """A one-step copy made while another copy was in flight on other bytes of the allocation
    is never taken at once by a copy of bytes that one writes: it waits for it (ORDER-1)."""
    h = bridge.alloc_device(U8, 16)
    warm(bridge, ring, h)
    pending = bridge.host_to_device(put(ring, b"A" * 8), DeviceRange(h, 0, 8), sync=False)
    out = ring.reserve(8)
    bridge.device_to_host(DeviceRange(h, 8, 8), out)  # other bytes: one step, made with a copy in flight
    ring.release(out)
    out = ring.reserve(8)
    bridge.device_to_host(DeviceRange(h, 0, 8), out)  # the bytes `pending` writes: after it
    assert bytes(ring.view(out)) == b"A" * 8 and pending.done()


@pytest.mark.holds("H2D-2", "H2D-3")
def test_the_per_call_path_keeps_host_bytes_a_caller_keeps_or_another_copy_still_reads(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h, other = bridge.alloc_device(U8, 16), bridge.alloc_device(U8, 16)
    warm(bridge, ring, h)
    kept = put(ring, b"k" * 4)
    bridge.host_to_device(kept, DeviceRange(h, 0, 4), release=False)
    assert not ring.released(kept) and bytes(ring.view(kept)) == b"k" * 4
    ring.release(kept)
    shared = put(ring, b"s" * 8)
    reading = bridge.host_to_device(shared, DeviceRange(other, 0, 8), sync=False)
    bridge.host_to_device(shared, DeviceRange(h, 0, 8))  # done: but `reading` still reads the bytes
    assert not ring.released(shared)
    fake.complete_all()
    assert reading.done() and ring.released(shared)


@pytest.mark.rejects("COPY-F")
def test_a_failed_copy_names_the_call_and_the_ranges_on_either_path(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 16)
    for warmed in (False, True):
        if warmed:
            warm(bridge, ring, h)
        src, out = put(ring, b"f" * 4), ring.reserve(4)
        fake.fail_next("copy_in")
        with refused(
            "COPY-F", DeviceCopyError, match=r"host_to_device HostRange\(start=\d+, nbytes=4\) -> DeviceRange"
        ):
            bridge.host_to_device(src, DeviceRange(h, 4, 4))
        fake.fail_next("copy_out")
        with refused(
            "COPY-F", OutputCopyError, match=r"device_to_host DeviceRange\(.*\) -> HostRange\(start=\d+, nbytes=4\)"
        ):
            bridge.device_to_host(DeviceRange(h, 4, 4), out)
        ring.release(src)
        ring.release(out)
