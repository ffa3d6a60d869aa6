"""`Bridge.stats()` and `Bridge.pins()`: frozen dataclasses with `as_dict()`; the old dict reads
still work, each with a DeprecationWarning that names what to read instead."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings

import pytest

from devbridge import Bridge, DeviceRange, HostRing, ObjectSpec
from devbridge.bridge.stats import COUNTED, LIVE, Pins, Stats
from devbridge.testing import FakeBackend


def test_stats_and_pins_are_frozen_dataclasses_whose_dicts_are_json(bridge: Bridge, ring: HostRing) -> None:
    h = bridge.alloc_device(ObjectSpec("x", "uint8"), 16)
    src = ring.reserve(16)
    ring.view(src)[:] = bytes(range(16))
    bridge.host_to_device(src, DeviceRange(h, 0, 16), sync=False)
    stats, pins = bridge.stats(), bridge.pins(h)
    assert isinstance(stats, Stats) and isinstance(pins, Pins)
    assert (stats.allocs, stats.copies_in, stats.bytes_in, stats.live_allocations, stats.pending_events) == (
        1,
        1,
        16,
        1,
        1,
    )
    assert pins.as_dict() == {
        "state": "copying", "copies_in": 1, "copies_out": 0, "computes": 0, "views": 0, "waiting_s": 0.0, "holders": {},
        "uses": ({"kind": "copy_in", "use_id": 0, "range": (0, 16), "held": False, "follows": (), "open": False},),
    }  # fmt: skip
    assert json.loads(json.dumps(pins.as_dict()))["uses"] == [
        {"kind": "copy_in", "use_id": 0, "range": [0, 16], "held": False, "follows": [], "open": False}
    ]
    assert json.loads(json.dumps(stats.as_dict())) == stats.as_dict()
    # what the standard library's asdict gives, nested dataclasses included
    memory = bridge.memory_stats()
    for report in (stats, pins, memory):
        assert report.as_dict() == dataclasses.asdict(report)  # type: ignore[call-overload]
    assert type(memory.as_dict()["all"]) is dict
    assert tuple(stats.as_dict()) == LIVE + COUNTED and len(set(COUNTED)) == len(COUNTED) == 18
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.allocs = 5  # type: ignore[misc]


def test_the_old_dict_reads_work_with_a_deprecation_warning(bridge: Bridge) -> None:
    h = bridge.alloc_device(ObjectSpec("x", "uint8"), 16)
    stats, pins = bridge.stats(), bridge.pins(h)
    with pytest.warns(DeprecationWarning, match=r"Stats is a dataclass now: \['allocs'\] is deprecated"):
        assert stats["allocs"] == 1  # type: ignore[index]
    with pytest.warns(DeprecationWarning, match=r"Pins is a dataclass now: \['state'\]"):
        assert pins["state"] == "allocated"  # type: ignore[index]
    with pytest.warns(DeprecationWarning) as caught:  # dict() reads .keys(), then each key
        assert dict(stats) == stats.as_dict()  # type: ignore[call-overload]
    assert [str(w.message).split(": ")[1].split(" is")[0] for w in caught] == [
        ".keys()",
        *(f"[{k!r}]" for k in LIVE + COUNTED),
    ]
    with pytest.warns(DeprecationWarning, match=r"\.items\(\)"):
        assert dict(pins.items()) == pins.as_dict()
    for read, want, said in (
        (lambda: list(stats.values()), list(stats.as_dict().values()), ".values()"),
        (lambda: stats.get("allocs"), 1, ".get('allocs')"),
        (lambda: stats.get("nope", -1), -1, ".get('nope')"),
        (lambda: "allocs" in stats, True, "`in`"),
        (lambda: "nope" in pins, False, "`in`"),
        (lambda: [k for k in pins], list(pins.as_dict()), "iterating"),  # (list() would ask len() too)
        (lambda: len(stats), len(LIVE + COUNTED), "len()"),
    ):
        with pytest.warns(DeprecationWarning, match=re.escape(f"{said} is deprecated")) as caught:
            assert read() == want
        assert len(caught) == 1
    for key in ("nope", 3, None):
        with pytest.warns(DeprecationWarning), pytest.raises(KeyError):
            stats[key]  # type: ignore[index]


def test_reading_the_attributes_warns_nothing() -> None:
    bridge = Bridge(FakeBackend())
    h = bridge.alloc_device(ObjectSpec("x", "uint8"), 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (bridge.stats().allocs, bridge.pins(h).views, bridge.stats().as_dict()["allocs"]) == (1, 0, 1)
