"""Compute events and zero-copy tinygrad views (COMPUTE-F, VIEW-*)."""

from __future__ import annotations

import functools
import gc

import numpy as np
import pytest
from rules import assert_each_refused, deferred, logged, refused
from support import F32, U8, put, world
from tinygrad.tensor import Tensor

from devbridge import (
    Bridge,
    ComputeError,
    DeviceRange,
    HostRing,
    ObjectSpec,
    TensorViewSpec,
)
from devbridge.backends.fake import Call, FakeBackend
from devbridge.bridge.stats import Holder


def floats(*values: float) -> bytes:
    return np.array(values, dtype=np.float32).tobytes()


@pytest.mark.holds("VIEW-1")
def test_view_shares_the_allocation_memory_at_its_offset(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(F32, 48)
    view = bridge.wrap_for_tinygrad(h, TensorViewSpec((2, 3), "float32", offset=16))
    assert isinstance(view, Tensor) and view.shape == (2, 3) and view.dtype.itemsize == 4
    assert fake.calls[-1] == Call("view", 0, 16, 24, shape=(2, 3), dtype="float32")
    # bytes written through the bridge after wrapping are seen by the existing view
    bridge.host_to_device(put(ring, floats(1, 2, 3, 4, 5, 6)), DeviceRange(h, 16, 24))
    np.testing.assert_array_equal(view.numpy(), np.arange(1, 7, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal((view * 2).sum(axis=1).numpy(), np.array([12, 30], dtype=np.float32))


@pytest.mark.holds("VIEW-2")
def test_views_at_aligned_offsets_up_to_the_extent_are_accepted(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(F32, 32)
    tail = bridge.wrap_for_tinygrad(h, TensorViewSpec((4,), "float32", offset=16))
    whole = bridge.wrap_for_tinygrad(h, TensorViewSpec((2, 2, 2), "float32"))
    assert (tail.shape, whole.shape) == ((4,), (2, 2, 2))
    assert [(c.offset, c.nbytes) for c in fake.calls if c.op == "view"] == [(16, 16), (0, 32)]


@pytest.mark.rejects("VIEW-2")
def test_invalid_views_are_rejected_without_a_backend_call(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(F32, 32)
    role = bridge.alloc_device(ObjectSpec("w", "float32", role="weights", view=TensorViewSpec((4,), "float32")), 16)
    bad_views = [
        (h, TensorViewSpec((4,), "int32")),  # not the spec's dtype
        (h, TensorViewSpec((9,), "float32")),  # past the extent
        (h, TensorViewSpec((2,), "float32", offset=28)),  # straddles the end
        (h, TensorViewSpec((2,), "float32", offset=4)),  # aligned to float32, not to what the device runs
        (h, TensorViewSpec((2,), "float32", offset=8)),
        (role, TensorViewSpec((2, 2), "float32")),  # not the role's view
        (h, (8,)),  # not a TensorViewSpec
    ]
    calls = [functools.partial(bridge.wrap_for_tinygrad, handle, view) for handle, view in bad_views]
    assert_each_refused("VIEW-2", calls, world(bridge, fake, ring, [h, role]))  # type: ignore[arg-type]


@pytest.mark.rejects("VIEW-2")
@pytest.mark.parametrize(
    ("shape", "dtype", "offset"),
    [((), "float32", 0), ((0, 2), "float32", 0), ((2,), "float31", 0), ((2,), "float32", 2), ((2,), "float32", -4),
     ([], "float32", 0), ((2.0,), "float32", 0)],
)  # fmt: skip
def test_view_spec_validates_itself(shape: object, dtype: str, offset: int) -> None:
    with refused("VIEW-2"):
        TensorViewSpec(shape, dtype, offset)  # type: ignore[arg-type]


@pytest.mark.rejects("VIEW-1")
def test_backend_view_failure_is_an_invalid_view_error(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(U8, 8)
    fake.fail_next("view")
    with refused("VIEW-1"):
        bridge.wrap_for_tinygrad(h, TensorViewSpec((8,), "uint8"))
    assert bridge.state(h) == "allocated"


@pytest.mark.holds("VIEW-3")
@pytest.mark.rejects("VIEW-3")
def test_a_live_view_pins_its_allocation_until_collected(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(U8, 8)
    view = bridge.wrap_for_tinygrad(h, TensorViewSpec((8,), "uint8"))
    assert bridge.state(h) == "computing"
    with deferred("VIEW-3", fake.ops):
        bridge.free_device(h)
    assert bridge.state(h) == "free_pending" and "free" not in fake.ops()
    assert view.numpy().tolist() == [0] * 8  # still readable: the memory was not released
    del view
    gc.collect()
    assert bridge.state(h) == "freed" and fake.ops()[-1] == "free"


@pytest.mark.holds("VIEW-3")
def test_two_views_both_pin(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(U8, 32)
    a = bridge.wrap_for_tinygrad(h, TensorViewSpec((4,), "uint8"))
    b = bridge.wrap_for_tinygrad(h, TensorViewSpec((4,), "uint8", offset=16))
    bridge.free_device(h)
    del a
    gc.collect()
    assert bridge.state(h) == "free_pending"
    del b
    gc.collect()
    assert bridge.poll() == 1 and bridge.state(h) == "freed"  # poll processed the collected view


@pytest.mark.holds("COMPUTE-F")
def test_compute_event_holds_handles_until_complete(bridge: Bridge, fake: FakeBackend) -> None:
    a, b = bridge.alloc_device(U8, 8), bridge.alloc_device(U8, 8)
    ev = bridge.compute(a, b, a)
    assert fake.calls[-1] == Call("compute", event=0, buffers=(0, 1))
    assert [bridge.state(a), bridge.state(b)] == ["computing", "computing"] and not ev.done()
    fake.complete(ev)
    assert ev.done() and ev.error is None and [bridge.state(a), bridge.state(b)] == ["idle", "idle"]
    ev.wait()


@pytest.mark.holds("COMPUTE-F")
def test_compute_context_stays_open_for_its_block(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(U8, 8)
    with bridge.compute(h) as ev:
        fake.complete(ev)  # the marker completes while the block still enqueues work
        assert not ev.done() and bridge.state(h) == "computing"
    assert ev.done() and bridge.state(h) == "idle"


@pytest.mark.rejects("COMPUTE-F")
def test_compute_failure_surfaces_and_ends_the_use(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(U8, 8)
    fake.fail_next("compute")
    ev = bridge.compute(h)
    fake.complete(ev)
    assert isinstance(ev.error, ComputeError) and ev.error.rule == "COMPUTE-F"
    with refused("COMPUTE-F"):
        ev.wait()
    assert bridge.state(h) == "idle" and bridge.stats().compute_failures == 1


def test_wait_times_out_on_an_event_nobody_completes(bridge: Bridge, fake: FakeBackend) -> None:
    fake.run_on_wait = False  # a device that never finishes the work by itself
    ev = bridge.compute(bridge.alloc_device(U8, 8))
    with pytest.raises(TimeoutError):
        ev.wait(timeout=0.05)
    fake.complete(ev)
    ev.wait(timeout=0)


@pytest.mark.holds("PIN-1")
def test_pins_say_what_keeps_an_allocation_in_use(bridge: Bridge, fake: FakeBackend, ring: HostRing) -> None:
    h = bridge.alloc_device(U8, 32)
    assert bridge.pins(h).as_dict() == {
        "state": "allocated", "copies_in": 0, "copies_out": 0, "computes": 0, "views": 0, "waiting_s": 0.0,
        "holders": {}, "uses": (),
    }  # fmt: skip
    ev = bridge.compute(h)
    up = bridge.host_to_device(put(ring, b"pinned!!"), DeviceRange(h, 0, 8), sync=False)  # held: ORDER-1
    down = bridge.device_to_host(DeviceRange(h, 16, 8), ring.reserve(8), sync=False)
    view = bridge.wrap_for_tinygrad(h, TensorViewSpec((2, 2), "uint8", offset=16))
    derived = view.reshape(4)
    del view
    pins = bridge.pins(h)
    assert {k: v for k, v in pins.as_dict().items() if k not in ("waiting_s", "uses")} == {
        "state": "copying_computing", "copies_in": 1, "copies_out": 1, "computes": 1, "views": 1, "holders": {},
    }  # fmt: skip
    assert pins.waiting_s == 0.0
    # each by name: the compute, the two copies held behind it with their byte ranges, the view
    assert [ev.use_id, up.use_id, down.use_id] == [0, 1, 2]
    assert pins.uses == (
        Holder("compute", 0, None, False, (), False),
        Holder("copy_in", 1, (0, 8), True, (0,), False),
        Holder("copy_out", 2, (16, 24), True, (0,), False),
        Holder("view", 3, None, False, (), False),
    )
    assert [str(u) for u in pins.uses] == [
        "compute #0", "copy_in #1 bytes 0..8 held behind #0", "copy_out #2 bytes 16..24 held behind #0", "view #3",
    ]  # fmt: skip
    assert pins.as_dict()["uses"][1] == {
        "kind": "copy_in", "use_id": 1, "range": (0, 8), "held": True, "follows": (0,), "open": False,
    }  # fmt: skip
    fake.complete(ev)  # the compute ends: both copies are launched, on the device now
    assert [(u.kind, u.held, u.follows) for u in bridge.pins(h).uses] == [
        ("copy_in", False, ()), ("copy_out", False, ()), ("view", False, ()),
    ]  # fmt: skip
    with bridge.compute(h) as block:  # waits for both copies first (ORDER-1: the fake runs them)
        assert up.done() and down.done()
        assert [str(u) for u in bridge.pins(h).uses] == ["view #3", f"compute #{block.use_id} (block open)"]
    fake.complete(block)
    bridge.free_device(h)
    pins = bridge.pins(h)
    assert (pins.state, pins.views, pins.computes) == ("free_pending", 1, 0)
    assert isinstance(pins.waiting_s, float) and pins.waiting_s >= 0.0
    del derived
    assert bridge.poll() == 1 and bridge.pins(h).state == "freed" and fake.ops().count("free") == 1


@pytest.mark.rejects("PIN-1")
def test_a_release_still_waiting_is_logged_once_with_its_spec_name(
    fake: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = Bridge(fake, pending_warning_s=0)
    h = bridge.alloc_device(ObjectSpec("kv-cache", "uint8", role="state"), 16)
    view = bridge.wrap_for_tinygrad(h, TensorViewSpec((16,), "uint8"))
    lazy = view + 1  # a lazy graph the worker forgot: it still reaches the memory
    del view
    bridge.free_device(h)
    with caplog.at_level("WARNING", logger="devbridge"):
        assert bridge.poll() == 0 and bridge.poll() == 0
    logged("PIN-1", caplog.records, like="#0 (kv-cache, role state) is free_pending after")
    assert [r.getMessage().split(" after ")[0] for r in caplog.records] == [
        "allocation #0 (kv-cache, role state) is free_pending"
    ]
    assert caplog.records[0].getMessage().endswith("still in use by 1 view (view #0)")
    assert "free" not in fake.ops()
    del lazy
    assert bridge.poll() == 1 and fake.ops() == ["alloc", "view", "free"]


@pytest.mark.holds("VIEW-3", "FREE-1")
def test_a_free_after_the_views_tensor_was_collected_frees_at_once(bridge: Bridge, fake: FakeBackend) -> None:
    h = bridge.alloc_device(U8, 16)
    view = bridge.wrap_for_tinygrad(h, TensorViewSpec((16,), "uint8"))
    del view
    gc.collect()
    bridge.free_device(h)  # no poll() first: the free itself sees the view is gone
    assert bridge.state(h) == "freed" and fake.ops() == ["alloc", "view", "free"]
    assert bridge.stats().deferred_frees == 0


class Extending(FakeBackend):
    """Records the compute markers the bridge extends."""

    def __init__(self) -> None:
        super().__init__()
        self.extended: list[int] = []

    def extend(self, token: object) -> None:
        self.extended.append(self._resolve(token).id)
        super().extend(token)


@pytest.mark.holds("COMPUTE-F")
@pytest.mark.parametrize("close", ["block-exit", "wait-inside-the-block"])
def test_closing_a_compute_block_extends_its_marker_then_settles_it(close: str) -> None:
    """The marker must cover the work the block queued: the bridge extends it when the block
    closes (by exiting, or by a wait inside it), then settles a marker already done."""
    fake = Extending()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    with bridge.compute(h) as ev:
        fake.complete(ev)  # the marker completes while the block still enqueues work
        assert fake.extended == [] and ev.open and not ev.done()
        if close == "wait-inside-the-block":
            ev.wait(timeout=5)
            assert fake.extended == [0] and not ev.open and ev.done()
    assert fake.extended == [0]  # once
    assert ev.done() and ev.error is None and not ev.open and bridge.state(h) == "idle"


def test_a_compute_never_entered_as_a_block_is_not_open_and_its_wait_extends_nothing() -> None:
    """Only a `with` block opens a compute event: one waited for outside any block was never open,
    so its marker is not extended (nothing was queued under it after the call)."""
    fake = Extending()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    ev = bridge.compute(h)
    assert ev.open is False
    fake.complete(ev)
    ev.wait(timeout=5)
    assert fake.extended == [] and ev.done() and ev.error is None and bridge.state(h) == "idle"
