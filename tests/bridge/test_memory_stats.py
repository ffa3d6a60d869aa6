"""`Bridge.memory_stats()` and `reset_peak_stats()`: device memory held now, at the peak, and
allocated and freed so far, in all and per role, with deferred frees, held copies, failed frees
and restarts (FREE-1, FREE-3, GEN-1)."""

from __future__ import annotations

import json

import pytest
from rules import refused

from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec
from devbridge.bridge.memory import MemoryCounts, MemoryStats
from devbridge.testing import FakeBackend

IN, W = ObjectSpec("x", "uint8", role="input"), ObjectSpec("w", "float32", role="weights")


def counts(*values: int) -> MemoryCounts:
    return MemoryCounts(*values)


@pytest.mark.holds("FREE-1")
def test_memory_is_held_from_the_allocation_to_the_backend_free_even_while_a_free_waits() -> None:
    fake = FakeBackend()
    bridge, ring = Bridge(fake), HostRing(64)
    assert bridge.memory_stats() == MemoryStats(all=counts(0, 0, 0, 0, 0, 0, 0, 0))
    x = bridge.alloc_device(IN, 16)
    w = bridge.alloc_device(W, 32)
    up = bridge.host_to_device(ring.reserve(16), DeviceRange(x, 0, 16), sync=False)
    bridge.free_device(x)  # deferred: the copy still writes it
    stats = bridge.memory_stats()
    assert stats.all == counts(48, 48, 48, 0, 2, 2, 2, 0)
    assert stats.by_role == {"input": counts(16, 16, 16, 0, 1, 1, 1, 0), "weights": counts(32, 32, 32, 0, 1, 1, 1, 0)}
    assert (stats.deferred_frees, stats.waiting_releases, stats.failed_frees) == (1, 1, 0)
    assert 0.0 <= stats.longest_wait_s < 60.0
    fake.complete(up)
    bridge.poll()
    stats = bridge.memory_stats()
    assert stats.all == counts(32, 48, 48, 16, 1, 2, 2, 1) and fake.bytes_in_use == 32
    assert stats.by_role["input"] == counts(0, 16, 16, 16, 0, 1, 1, 1)
    assert (stats.waiting_releases, stats.longest_wait_s) == (0, 0.0)
    bridge.reset_peak_stats()
    assert bridge.memory_stats().all == counts(32, 32, 48, 16, 1, 1, 2, 1)
    bridge.free_device(w)
    assert bridge.memory_stats().all == counts(0, 32, 48, 48, 0, 1, 2, 2) and fake.bytes_in_use == 0


@pytest.mark.rejects("FREE-3")
def test_a_failed_free_leaves_the_books_and_is_counted_with_its_bytes() -> None:
    fake = FakeBackend()
    bridge = Bridge(fake)
    x = bridge.alloc_device(IN, 16)
    fake.fail_next("free")
    with refused("FREE-3"):
        bridge.free_device(x)
    stats = bridge.memory_stats()
    assert stats.all == counts(0, 16, 16, 16, 0, 1, 1, 1)
    assert (stats.failed_frees, stats.failed_free_bytes, fake.bytes_in_use) == (1, 16, 16)


@pytest.mark.holds("GEN-1", "ORDER-1")
def test_a_restart_releases_the_old_generation_and_held_copies_are_counted() -> None:
    fake = FakeBackend()
    bridge, ring = Bridge(fake), HostRing(64)
    x = bridge.alloc_device(IN, 16)
    first = bridge.host_to_device(ring.reserve(16), DeviceRange(x, 0, 16), sync=False)
    bridge.host_to_device(ring.reserve(16), DeviceRange(x, 0, 16), sync=False)  # held behind the first
    bridge.alloc_device(W, 8)
    bridge.restart()  # the idle one goes now; x waits for its copy
    stats = bridge.memory_stats()
    assert (stats.restarts, stats.held_uses, stats.waiting_releases) == (1, 1, 1)
    assert stats.all == counts(16, 24, 24, 8, 1, 2, 2, 1)
    fake.complete(first)
    bridge.poll()
    assert bridge.memory_stats().all == counts(0, 24, 24, 24, 0, 2, 2, 2)


def test_memory_stats_are_a_frozen_dataclass_whose_dict_is_json() -> None:
    bridge = Bridge(FakeBackend())
    bridge.alloc_device(W, 8)
    stats = bridge.memory_stats()
    as_dict = stats.as_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert as_dict["all"]["allocated_bytes_current"] == 8 and as_dict["by_role"]["weights"]["allocation_current"] == 1
    with pytest.raises(AttributeError):
        stats.restarts = 3  # type: ignore[misc]
