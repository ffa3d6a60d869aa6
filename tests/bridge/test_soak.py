"""Soaks: cycle after cycle of alloc / copy / free through the Bridge keeps nothing that is over.

The bound asserted is on what is kept (buffers, events, calls, traced bytes of devbridge's own
files), never on time; bench/soak.py measures both over 100k cycles."""

from __future__ import annotations

import gc

import pytest
from harness import DEVICES

from devbridge.backends.tinygrad import TinygradBackend
from devbridge.bench.soak import growth, soak
from devbridge.errors import InvalidArgumentError
from devbridge.testing import FakeBackend


def test_the_fake_forgets_what_is_over_and_its_memory_stays_flat() -> None:
    fake = FakeBackend(calls_kept=100)
    readings = soak(fake, cycles=4000, every=1000, own=True)
    gc.collect()
    assert [r.cycles for r in readings] == [1000, 2000, 3000, 4000]
    assert (fake.live_allocations, fake.bytes_in_use, fake.events_known, len(fake.calls)) == (0, 0, 0, 100)
    assert fake.counts == {"alloc": 4000, "copy_in": 4000, "free": 4000}
    assert [c.op for c in list(fake.calls)[-3:]] == ["alloc", "copy_in", "free"]
    per_10k, _ = growth(readings)
    assert per_10k <= 1024, [r.traced_bytes for r in readings]


def test_calls_kept_is_a_count_or_none() -> None:
    assert FakeBackend(calls_kept=0).calls.maxlen == 0  # type: ignore[union-attr]
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(InvalidArgumentError, match=r"\[ARG-1\] calls_kept must be None or an int >= 0"):
            FakeBackend(calls_kept=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"\[ARG-1\] calls_kept must be None or an int <= "):
        FakeBackend(calls_kept=2**64)  # (a deque's length is a C size)


@pytest.mark.skipif("CPU" not in DEVICES, reason="tinygrad's CPU device does not open here")
def test_the_bridge_on_tinygrads_cpu_keeps_nothing_per_cycle() -> None:
    readings = soak(TinygradBackend("CPU"), cycles=10_000, every=2500, own=True)
    per_10k, _ = growth(readings)
    assert per_10k <= 1024, [r.traced_bytes for r in readings]
