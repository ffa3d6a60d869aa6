"""What every Bridge call does besides its own work, checked on the fake's exact calls: it first
applies what happened while no call ran (a view collected, a completion), a new bridge tells the
backend its generation, and the counters in `stats()` count each call once."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest
from rules import deferred, refused
from support import put

from devbridge import Bridge, DeviceHandle, DeviceRange, HostRing, ObjectSpec, TensorViewSpec
from devbridge.backends.base import BackendError
from devbridge.backends.fake import DEFAULT_CAPACITY, Call, FakeBackend
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
}


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
    assert bridge.stats()["backend_frees"] == (2 if name == "restart" else 1)  # restart frees `other` too


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
    return {k: stats[k] for k in keys}


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
    assert bridge.state(h) == "allocated" and bridge.pins(h)["computes"] == 0
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
    assert fake.queries >= 10, fake.queries  # 150 at 2 ms; a 1 s interval would ask once or twice
