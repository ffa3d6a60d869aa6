"""ORDER-1 and ORDER-2 on the fake backend: conflicting uses of device bytes keep issue order.

The fake completes events only when a test says so, in any order, and refuses
on its own (FakeViolation) to run a use before a pending one it conflicts
with. So each test below states the exact backend calls the bridge made, and
when: a held-back copy is not submitted until its predecessors ended.
"""

from __future__ import annotations

import pytest
from rules import assert_each_refused, deferred, refused
from support import U8, put, read_device, snapshot, world

from devbridge import (
    Bridge,
    ComputeError,
    DeviceCopyError,
    DeviceRange,
    HostRing,
    StaleHandleError,
)
from devbridge.backends.base import BackendError
from devbridge.backends.fake import FakeBackend, FakeViolation
from devbridge.spec import load


def calls(fake: FakeBackend) -> list[tuple[str, int | None, int | None, bool | None]]:
    """(op, offset, nbytes, sync) of every copy and compute the fake was asked for."""
    return [(c.op, c.offset, c.nbytes, c.sync) for c in fake.calls if c.op in ("copy_in", "copy_out", "compute")]


# ------------------------------------------------------------ the spec's table


@pytest.mark.holds("ORDER-1")
def test_the_spec_orders_every_conflicting_pair_and_only_those() -> None:
    lc = load()
    table = {(a, b): lc.hazard(a, b) for a in lc.accesses for b in lc.accesses}
    assert {pair: h for pair, h in table.items() if h} == {
        ("copy_in", "copy_in"): "WAW",
        ("copy_in", "copy_out"): "RAW",
        ("copy_in", "compute"): "RAW",
        ("copy_out", "copy_in"): "WAR",
        ("copy_out", "compute"): "WAR",
        ("compute", "copy_in"): "WAR",
        ("compute", "copy_out"): "RAW",
    }  # two reads never conflict; two computes are ordered by the device's queue; a view is a pin


# ------------------------------------------------------------ held back, then launched


@pytest.mark.holds("ORDER-1")
@pytest.mark.rejects("ORDER-1")
def test_async_write_after_async_write_is_held_until_the_first_completes(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 8)
    first = bridge.host_to_device(put(ring, b"AAAA"), DeviceRange(h, 2, 4), sync=False)
    with deferred("ORDER-1", fake.ops, held="copy_in"):
        second = bridge.host_to_device(put(ring, b"BBBB"), DeviceRange(h, 4, 4), sync=False)  # overlaps [4, 6)
    assert calls(fake) == [("copy_in", 2, 4, False)] and second.backend_token is None
    assert not second.done() and bridge.stats().held == 1
    fake.complete(first)
    assert first.done() and not second.done()
    assert calls(fake) == [("copy_in", 2, 4, False), ("copy_in", 4, 4, False)]
    fake.complete(second)
    assert second.done() and second.error is None
    assert bytes(fake.buffer(0).data) == b"\0\0AABBBB"


@pytest.mark.holds("ORDER-1")
def test_disjoint_async_copies_overlap_and_complete_in_any_order(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 8)
    low = bridge.host_to_device(put(ring, b"LLLL"), DeviceRange(h, 0, 4), sync=False)
    high = bridge.host_to_device(put(ring, b"HHHH"), DeviceRange(h, 4, 4), sync=False)
    out = ring.reserve(4)
    read_low = bridge.device_to_host(DeviceRange(h, 4, 4), out, sync=False)  # reads [4, 8): follows `high`
    assert calls(fake) == [("copy_in", 0, 4, False), ("copy_in", 4, 4, False)]
    fake.complete(high)  # the later one first: nothing orders disjoint bytes
    assert calls(fake)[-1] == ("copy_out", 4, 4, False) and not low.done()
    fake.complete(read_low)
    fake.complete(low)
    assert bytes(ring.view(out)) == b"HHHH" and bytes(fake.buffer(0).data) == b"LLLLHHHH"
    assert bridge.stats().held == 1


@pytest.mark.holds("ORDER-1")
@pytest.mark.rejects("ORDER-1")
def test_write_after_read_waits_for_the_read(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 4)
    bridge.host_to_device(put(ring, b"old!"), DeviceRange(h, 0, 4))
    out = ring.reserve(4)
    read = bridge.device_to_host(DeviceRange(h, 0, 4), out, sync=False)
    with deferred("ORDER-1", fake.ops, held="copy_in"):
        write = bridge.host_to_device(put(ring, b"new!"), DeviceRange(h, 0, 4), sync=False)
    assert write.backend_token is None
    fake.complete(read)
    fake.complete(write)
    assert bytes(ring.view(out)) == b"old!" and bytes(fake.buffer(0).data) == b"new!"


@pytest.mark.holds("ORDER-1")
def test_a_held_event_completes_after_the_uses_it_follows(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 4)
    events = [bridge.host_to_device(put(ring, bytes([k]) * 4), DeviceRange(h, 0, 4), sync=False) for k in range(4)]
    settled: list[int] = []
    for k in range(4):
        assert [e.done() for e in events] == [i < k for i in range(4)]
        assert len(fake.pending()) == 1  # exactly one of the chain is on the device at a time
        fake.complete(events[k])
        settled.append(k)
    assert bytes(fake.buffer(0).data) == b"\3\3\3\3" and ring.cursor == 16 and settled == [0, 1, 2, 3]


# ------------------------------------------------------------ synchronous calls wait


@pytest.mark.holds("ORDER-1")
def test_sync_read_after_async_write_waits_for_the_write(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    """The fake's wait runs the work waited for, as a device does when synchronized."""
    h = bridge.alloc_device(U8, 4)
    write = bridge.host_to_device(put(ring, b"data"), DeviceRange(h, 0, 4), sync=False)
    assert read_device(bridge, ring, h, 0, 4) == b"data"
    assert write.done() and write.error is None
    assert calls(fake) == [("copy_in", 0, 4, False), ("copy_out", 0, 4, True)]
    assert bridge.stats().waits == 1


@pytest.mark.holds("ORDER-1")
def test_sync_write_after_async_write_lands_last(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 4)
    bridge.host_to_device(put(ring, b"AAAA"), DeviceRange(h, 0, 4), sync=False)
    bridge.host_to_device(put(ring, b"BBBB"), DeviceRange(h, 0, 4), sync=False)  # held behind the first
    bridge.host_to_device(put(ring, b"CCCC"), DeviceRange(h, 0, 4))  # waits for both, in order
    assert bytes(fake.buffer(0).data) == b"CCCC" and fake.pending() == []
    assert calls(fake) == [("copy_in", 0, 4, False), ("copy_in", 0, 4, False), ("copy_in", 0, 4, True)]


@pytest.mark.holds("ORDER-1")
def test_compute_waits_for_the_copies_on_its_allocations_and_copies_after_it_are_held(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    a, b = bridge.alloc_device(U8, 4), bridge.alloc_device(U8, 4)
    up = bridge.host_to_device(put(ring, b"in!!"), DeviceRange(a, 0, 4), sync=False)
    other = bridge.host_to_device(put(ring, b"else"), DeviceRange(b, 0, 4), sync=False)
    comp = bridge.compute(a)
    assert up.done() and not other.done()  # only the copy on `a` had to finish first
    out = ring.reserve(4)
    down = bridge.device_to_host(DeviceRange(a, 0, 4), out, sync=False)
    assert down.backend_token is None and bridge.state(a) == "copying_computing"
    comp2 = bridge.compute(b, b)  # waits for `other`; two computes need no edge
    assert other.done() and not comp2.done()
    fake.complete(comp)
    fake.complete(down)
    assert bytes(ring.view(out)) == b"in!!"
    assert [c.op for c in fake.calls if c.op != "alloc"] == ["copy_in", "copy_in", "compute", "compute", "copy_out"]


@pytest.mark.holds("ORDER-1")
def test_waiting_on_a_held_event_runs_what_it_follows(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 4)
    first = bridge.host_to_device(put(ring, b"1111"), DeviceRange(h, 0, 4), sync=False)
    out = ring.reserve(4)
    read = bridge.device_to_host(DeviceRange(h, 0, 4), out, sync=False)
    read.wait(timeout=5)
    assert first.done() and bytes(ring.view(out)) == b"1111"


# ------------------------------------------------------------ failures and restarts


@pytest.mark.holds("ORDER-1")
def test_a_failed_predecessor_leaves_its_follower_the_bytes_as_they_are(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 4)
    bridge.host_to_device(put(ring, b"kept"), DeviceRange(h, 0, 4))
    fake.fail_next("copy_in")
    lost = bridge.host_to_device(put(ring, b"lost"), DeviceRange(h, 0, 4), sync=False)
    out = ring.reserve(4)
    read = bridge.device_to_host(DeviceRange(h, 0, 4), out, sync=False)
    fake.complete(lost)
    assert isinstance(lost.error, DeviceCopyError) and lost.error.rule == "COPY-F"
    fake.complete(read)
    assert read.error is None and bytes(ring.view(out)) == b"kept"  # as a synchronous run would read


@pytest.mark.holds("ORDER-1")
def test_a_held_copy_a_restart_made_stale_is_aborted_never_submitted(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 4)
    first = bridge.host_to_device(put(ring, b"1111"), DeviceRange(h, 0, 4), sync=False)
    src = put(ring, b"2222")
    held = bridge.host_to_device(src, DeviceRange(h, 0, 4), sync=False)
    bridge.restart()
    assert bridge.state(h) == "stale_pending"
    fake.complete(first)
    assert isinstance(held.error, StaleHandleError) and held.error.rule == "GEN-1"
    assert [c.op for c in fake.calls] == ["alloc", "copy_in", "free"] and fake.violations == []
    assert not ring.released(src)  # an aborted input's bytes stay for the worker to retry (COPY-F)


class RefusingFake(FakeBackend):
    """A fake whose next asynchronous copy_in submissions raise (a device queue that is full)."""

    refuse = 0

    def copy_in(self, buffer: object, offset: int, src: memoryview, *, sync: bool) -> object:
        if self.refuse and not sync:
            self.refuse -= 1
            raise BackendError("fake: the copy queue refused it")
        return super().copy_in(buffer, offset, src, sync=sync)


@pytest.mark.holds("ORDER-1")
def test_a_launch_the_backend_refuses_fails_that_copy_and_launches_its_followers(ring: HostRing) -> None:
    fake = RefusingFake()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 4)
    first = bridge.host_to_device(put(ring, b"1111"), DeviceRange(h, 0, 4), sync=False)
    refused = bridge.host_to_device(put(ring, b"2222"), DeviceRange(h, 0, 4), sync=False)
    out = ring.reserve(4)
    read = bridge.device_to_host(DeviceRange(h, 0, 4), out, sync=False)
    fake.refuse = 1
    fake.complete(first)
    assert isinstance(refused.error, DeviceCopyError) and "refused" in str(refused.error)
    assert calls(fake)[-1] == ("copy_out", 0, 4, False)  # the follower of the refused copy went on
    fake.complete(read)
    assert bytes(ring.view(out)) == b"1111" and bridge.stats().copy_failures == 1


@pytest.mark.holds("ORDER-1")
def test_a_long_chain_of_held_copies_is_launched_and_aborted_without_recursion(fake: FakeBackend) -> None:
    bridge, ring = Bridge(fake), HostRing(1 << 16)
    h = bridge.alloc_device(U8, 4)
    src = put(ring, b"same")
    events = [bridge.host_to_device(src, DeviceRange(h, 0, 4), sync=False, release=False) for _ in range(5000)]
    assert len(fake.pending()) == 1
    bridge.restart()  # every held copy is aborted as its predecessor ends: one loop, no recursion
    fake.complete(events[0])
    assert all(isinstance(e.error, StaleHandleError) for e in events[1:]) and events[0].error is not None
    assert bridge.stats().inflight_uses == 0 and fake.ops().count("copy_in") == 1


# ------------------------------------------------------------ ORDER-2


@pytest.mark.rejects("ORDER-2")
def test_a_sync_copy_that_must_follow_an_open_compute_is_refused(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 4)
    src, out = put(ring, b"data"), ring.reserve(4)
    with bridge.compute(h) as comp:
        calls = [
            lambda: bridge.host_to_device(src, DeviceRange(h, 0, 4)),
            lambda: bridge.device_to_host(DeviceRange(h, 0, 4), out),
        ]
        assert_each_refused("ORDER-2", calls, world(bridge, fake, ring, [h]))
        held = bridge.host_to_device(src, DeviceRange(h, 0, 4), sync=False)  # asynchronous: held, fine
        with refused("ORDER-2"):
            held.wait(timeout=1)
    fake.complete(comp)
    fake.complete(held)
    assert bytes(fake.buffer(0).data) == b"data"
    assert bytes(ring.view(out)) == b"\0\0\0\0"  # the refused output copy never wrote its range


@pytest.mark.rejects("ORDER-2")
def test_compute_that_must_follow_a_copy_held_behind_an_open_compute_is_refused(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    a, b = bridge.alloc_device(U8, 4), bridge.alloc_device(U8, 4)
    with bridge.compute(a) as comp:
        inner = bridge.compute(a)  # compute after compute: the device's queue orders them
        bridge.host_to_device(put(ring, b"held"), DeviceRange(a, 0, 4), sync=False)
        before = snapshot(bridge, fake, ring, [a, b])
        with refused("ORDER-2"):
            bridge.compute(b, a)
        assert snapshot(bridge, fake, ring, [a, b]) == before
    assert fake.complete_all() == 3 and comp.done() and inner.done()
    assert bytes(fake.buffer(0).data) == b"held"


def test_the_fake_refuses_to_run_a_use_before_a_pending_one_it_conflicts_with(fake: FakeBackend) -> None:
    """The fake's own check, without a bridge: what a missing hazard edge would ask of it."""
    buf = fake.alloc(8, "uint8")
    pending = fake.copy_in(buf, 0, memoryview(bytearray(4)), sync=False)
    fake.copy_out(memoryview(bytearray(4)), buf, 4, sync=False)  # disjoint: fine
    fake.copy_out(memoryview(bytearray(4)), buf, 4, sync=True)  # two reads: fine
    for conflicting in (
        lambda: fake.copy_in(buf, 3, memoryview(bytearray(2)), sync=False),  # WAW
        lambda: fake.copy_out(memoryview(bytearray(1)), buf, 0, sync=True),  # RAW
        lambda: fake.compute([buf]),  # compute reads and writes the whole buffer
    ):
        with pytest.raises(FakeViolation, match="submitted while pending event #0"):
            conflicting()
    assert fake.complete_all() == 2 and not pending.pending
    fake.compute([buf])
    with pytest.raises(FakeViolation, match="compute whole"):
        fake.copy_in(buf, 7, memoryview(bytearray(1)), sync=True)  # WAR against the compute marker
    assert len(fake.violations) == 4


@pytest.mark.holds("ORDER-1")
def test_a_compute_failure_is_its_own_and_the_copy_after_it_runs(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 4)
    fake.fail_next("compute")
    comp = bridge.compute(h)
    up = bridge.host_to_device(put(ring, b"next"), DeviceRange(h, 0, 4), sync=False)
    fake.complete(comp)
    assert isinstance(comp.error, ComputeError) and comp.error.rule == "COMPUTE-F"
    fake.complete(up)
    assert up.error is None and bytes(fake.buffer(0).data) == b"next"


@pytest.mark.holds("ORDER-2")
def test_only_a_wait_on_an_open_compute_is_refused_and_closing_the_block_lifts_it(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    a, b = bridge.alloc_device(U8, 4), bridge.alloc_device(U8, 4)
    with bridge.compute(a) as comp:
        bridge.host_to_device(put(ring, b"bbbb"), DeviceRange(b, 0, 4))  # another allocation: no wait
        assert read_device(bridge, ring, b, 0, 4) == b"bbbb"
    bridge.host_to_device(put(ring, b"aaaa"), DeviceRange(a, 0, 4))  # waits for the closed compute
    assert comp.done() and comp.error is None and bytes(fake.buffer(0).data) == b"aaaa"
    assert calls(fake)[-1] == ("copy_in", 0, 4, True) and bridge.stats().waits == 1
