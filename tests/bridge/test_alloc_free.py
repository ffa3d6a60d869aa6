"""Allocation, free, deferred free, handles: ALLOC-*, SPEC-1, FREE-*, USE-1, HANDLE-1."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from rules import assert_each_refused, deferred, refused
from support import F32, U8, put, read_device, snapshot, world

from devbridge import (
    Bridge,
    DeviceHandle,
    DeviceRange,
    HostRing,
    ObjectSpec,
    TensorViewSpec,
)
from devbridge.backends.fake import Call, FakeBackend


@pytest.mark.holds("ALLOC-1")
def test_alloc_gives_a_handle_of_the_extent_in_the_current_generation(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(F32, 256)
    assert (h.extent, h.generation, h.spec, bridge.state(h)) == (256, 0, F32, "allocated")
    assert fake.calls == [Call("alloc", 0, 0, 256)]
    assert fake.buffer(0).nbytes == 256 and fake.buffer(0).dtype == "float32"
    bridge.restart()
    assert bridge.alloc_device(F32, 8).generation == 1


@pytest.mark.rejects("ALLOC-1")
@pytest.mark.parametrize("extent", [0, -4, 6, 2.5, True, "8"])
def test_alloc_rejects_bad_extents_without_a_backend_call(bridge: Bridge, fake: FakeBackend, extent: object) -> None:
    with refused("ALLOC-1"):
        bridge.alloc_device(F32, extent)  # type: ignore[arg-type]
    assert fake.calls == [] and bridge.stats().live_allocations == 0


@pytest.mark.holds("SPEC-1")
def test_object_spec_accepts_known_dtypes_and_a_matching_role_view() -> None:
    view = TensorViewSpec((2, 3), "float16")
    spec = ObjectSpec("w", "float16", role="weights", view=view)
    assert (spec.itemsize, spec.view) == (2, view)


@pytest.mark.rejects("SPEC-1")
@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "", "dtype": "float32"},
        {"name": "x", "dtype": "float33"},
        {"name": "x", "dtype": "float32", "role": ""},
        {"name": "x", "dtype": "float32", "view": TensorViewSpec((4,), "int32")},
    ],
)
def test_object_spec_rejects_malformed_specs(kwargs: dict[str, object]) -> None:
    with refused("SPEC-1"):
        ObjectSpec(**kwargs)  # type: ignore[arg-type]


@pytest.mark.rejects("SPEC-1")
def test_alloc_rejects_a_non_spec(bridge: Bridge, fake: FakeBackend) -> None:
    with refused("SPEC-1"):
        bridge.alloc_device("float32", 8)  # type: ignore[arg-type]
    assert fake.calls == []


@pytest.mark.holds("ALLOC-2")
@pytest.mark.rejects("ALLOC-2")
def test_alloc_failure_is_typed_and_leaks_nothing(bridge: Bridge, fake: FakeBackend) -> None:
    fake.fail_next("alloc")
    with refused("ALLOC-2"):
        bridge.alloc_device(F32, 64)
    assert fake.live_allocations == 0 and bridge.stats().live_allocations == 0
    assert bridge.stats().alloc_failures == 1
    h = bridge.alloc_device(F32, 64)  # the next one works, and got the next id
    assert (h.id, fake.live_allocations) == (0, 1)


@pytest.mark.rejects("ALLOC-2")
def test_alloc_beyond_device_capacity_fails() -> None:
    bridge = Bridge(FakeBackend(capacity=100))
    bridge.alloc_device(U8, 60)
    with refused("ALLOC-2"):
        bridge.alloc_device(U8, 60)
    assert bridge.stats().live_allocations == 1


@pytest.mark.holds("FREE-1", "FREE-2")
def test_free_of_an_idle_allocation_frees_once_on_the_backend(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(F32, 64)
    bridge.free_device(h)
    assert fake.ops() == ["alloc", "free"] and fake.calls[1] == Call("free", 0)
    assert bridge.state(h) == "freed" and fake.live_allocations == 0
    assert bridge.stats().backend_frees == 1 and bridge.stats().live_allocations == 0


@pytest.mark.holds("FREE-1")
@pytest.mark.rejects("FREE-1")
def test_free_while_a_copy_is_in_flight_is_deferred_to_its_completion(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 32)
    ev = bridge.host_to_device(put(ring, b"x" * 8), DeviceRange(h, 0, 8), sync=False)
    with deferred("FREE-1", fake.ops):
        bridge.free_device(h)
    assert bridge.state(h) == "free_pending"
    assert "free" not in fake.ops()  # not while the copy uses it
    assert bridge.stats().deferred_frees == 1
    fake.complete(ev)
    assert fake.ops() == ["alloc", "copy_in", "free"]
    assert bridge.state(h) == "freed" and ev.done() and ev.error is None


@pytest.mark.holds("FREE-1")
def test_deferred_free_waits_for_every_use(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    """Held-back copies count too: they follow the compute (ORDER-1) and the free follows them."""
    h = bridge.alloc_device(U8, 32)
    comp = bridge.compute(h)
    c1 = bridge.host_to_device(put(ring, b"a" * 4), DeviceRange(h, 0, 4), sync=False)
    c2 = bridge.device_to_host(DeviceRange(h, 8, 4), ring.reserve(4), sync=False)
    assert bridge.state(h) == "copying_computing" and fake.ops() == ["alloc", "compute"]
    bridge.free_device(h)
    for ev in (comp, c2):
        fake.complete(ev)
        assert bridge.state(h) == "free_pending" and "free" not in fake.ops()
    assert fake.ops() == ["alloc", "compute", "copy_in", "copy_out"]
    fake.complete(c1)
    assert bridge.state(h) == "freed" and fake.ops().count("free") == 1


@pytest.mark.rejects("FREE-2")
def test_double_free_is_rejected_both_while_pending_and_after(
    bridge: Bridge, fake: FakeBackend, ring: HostRing
) -> None:
    h = bridge.alloc_device(U8, 16)
    ev = bridge.compute(h)
    bridge.free_device(h)
    before = snapshot(bridge, fake, ring, [h])
    with refused("FREE-2"):
        bridge.free_device(h)
    assert snapshot(bridge, fake, ring, [h]) == before
    fake.complete(ev)
    with refused("FREE-2"):
        bridge.free_device(h)
    assert fake.ops() == ["alloc", "compute", "free"]


@pytest.mark.holds("USE-1")
def test_an_idle_allocation_accepts_new_uses(bridge: Bridge, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 16)
    bridge.host_to_device(put(ring, b"0123"), DeviceRange(h, 4, 4))
    assert bridge.state(h) == "idle"
    assert read_device(bridge, ring, h, 4, 4) == b"0123"


@pytest.mark.rejects("USE-1")
@pytest.mark.parametrize("pending", [False, True])
def test_use_after_free_is_rejected(bridge: Bridge, fake: FakeBackend, ring: HostRing, pending: bool) -> None:
    h = bridge.alloc_device(U8, 16)
    if pending:
        bridge.compute(h)
    bridge.free_device(h)
    src = put(ring, b"abcd")
    calls = [
        lambda: bridge.host_to_device(src, DeviceRange(h, 0, 4)),
        lambda: bridge.device_to_host(DeviceRange(h, 0, 4), src),
        lambda: bridge.compute(h),
        lambda: bridge.wrap_for_tinygrad(h, TensorViewSpec((16,), "uint8")),
    ]
    assert_each_refused("USE-1", calls, world(bridge, fake, ring, [h]))


@pytest.mark.holds("HANDLE-1")
@pytest.mark.rejects("HANDLE-1")
def test_foreign_and_forged_handles_are_rejected(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    other_fake = FakeBackend()
    other = Bridge(other_fake)
    mine, theirs = bridge.alloc_device(U8, 16), other.alloc_device(U8, 16)
    assert bridge.state(mine) == "allocated" and other.state(theirs) == "allocated"
    forged = DeviceHandle(5, 0, 16, U8, owner=mine.owner)
    src = put(ring, b"ab")
    calls = [
        functools.partial(call, h)
        for h in (theirs, forged, "not a handle")
        for call in (bridge.free_device, bridge.compute, bridge.state)
    ]
    calls.append(lambda: bridge.host_to_device(src, DeviceRange(theirs, 0, 2)))
    assert_each_refused("HANDLE-1", calls, world(bridge, fake, ring, [mine]))
    assert fake.ops() == ["alloc"] and other_fake.ops() == ["alloc"]


@pytest.mark.rejects("HANDLE-1")
@pytest.mark.parametrize(
    "change",
    [
        {"extent": 1 << 16},
        {"extent": 1 << 40},
        {"extent": 64.0},
        {"spec": ObjectSpec("blob", "float64")},
        {"spec": None},
        {"id": 0.0},
        {"id": "x"},
        {"id": None},
        {"id": 1},
        {"generation": 1},
        {"generation": -1},
        {"owner": 0},
        {"seal": 0},
    ],
    ids=repr,
)
def test_altered_handles_are_rejected_before_any_backend_call(
    bridge: Bridge, fake: FakeBackend, ring: HostRing, change: dict[str, object]
) -> None:
    """Regression: the bridge trusted a handle's own fields. A forged extent read (and wrote)
    past the allocation, a forged spec gave a float64 view over uint8 bytes, id=float(h.id)
    freed the real allocation, id="x" leaked TypeError."""
    import dataclasses

    h, _ = bridge.alloc_device(U8, 64), bridge.alloc_device(U8, 64)
    bridge.host_to_device(put(ring, bytes(range(64))), DeviceRange(h, 0, 64))
    forged = dataclasses.replace(h, **change)  # type: ignore[arg-type]
    out = ring.reserve(64)
    calls = [
        lambda: bridge.free_device(forged),
        lambda: bridge.state(forged),
        lambda: bridge.compute(h, forged),
        lambda: bridge.wrap_for_tinygrad(forged, TensorViewSpec((8,), "float64")),
        lambda: bridge.device_to_host(DeviceRange(forged, 0, 64), out),
        lambda: bridge.host_to_device(out, DeviceRange(forged, 0, 64)),
    ]
    assert_each_refused("HANDLE-1", calls, world(bridge, fake, ring, [h]))
    assert bridge.state(h) == "idle" and bytes(fake.buffer(0).data) == bytes(range(64))


@pytest.mark.holds("HANDLE-1")
def test_an_exact_copy_of_an_issued_handle_is_the_same_capability(bridge: Bridge, fake: FakeBackend) -> None:
    import copy
    import dataclasses
    import pickle

    h = bridge.alloc_device(U8, 16)
    for twin in (copy.copy(h), copy.deepcopy(h), dataclasses.replace(h), pickle.loads(pickle.dumps(h))):
        assert twin == h and bridge.state(twin) == "allocated"
    bridge.free_device(copy.deepcopy(h))
    assert bridge.state(h) == "freed" and fake.ops() == ["alloc", "free"]
    with refused("HANDLE-1"):
        bridge.free_device(dataclasses.replace(h, extent=32))  # a dead handle, altered: still forged


@pytest.mark.rejects("HANDLE-1")
@pytest.mark.parametrize("alloc_id", [-1, -2, 1 << 62])
def test_a_handle_with_an_id_never_issued_is_forged_not_freed(bridge: Bridge, fake: FakeBackend, alloc_id: int) -> None:
    """A negative id must not index the bridge's records from the end."""
    a, b = bridge.alloc_device(U8, 8), bridge.alloc_device(U8, 8)
    forged = dataclasses.replace(b, id=alloc_id)
    for call in (bridge.free_device, bridge.state, bridge.compute, bridge.pins):
        with refused("HANDLE-1"):
            call(forged)
    assert [bridge.state(a), bridge.state(b)] == ["allocated", "allocated"] and fake.ops() == ["alloc", "alloc"]
