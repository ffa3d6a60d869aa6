"""A view's use lasts while any tinygrad object can reach its memory (VIEW-3, PIN-1).

Every test here failed when only the Tensor returned by `wrap_for_tinygrad`
pinned its allocation: a reshape, a lazy graph, an assign target, a model
that took the view over and a TinyJit that captured it all outlive that
Tensor. Each runs on the fake (whose own checks raise `FakeViolation` if it
is asked to free memory a tensor can reach, and which poisons freed memory
with 0xDD) and on tinygrad's CPU device (through FaultyBackend, which records
the backend ops).
"""

from __future__ import annotations

import gc
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from rules import deferred, logged
from support import put, read_device
from tinygrad import Tensor, TinyJit, nn
from tinygrad.helpers import Context

from devbridge import Bridge, DeviceHandle, DeviceRange, HostRing, ObjectSpec, TensorViewSpec
from devbridge.backends.fake import FakeBackend
from devbridge.backends.faulty import FaultyBackend
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.bridge.stats import Pins


@dataclass
class Rig:
    """A Bridge over one backend, a ring, and the backend ops it made."""

    name: str
    bridge: Bridge
    ring: HostRing
    fake: FakeBackend | None  # the fake itself (its calls), or None on tinygrad
    recorder: FaultyBackend | None  # records tinygrad's ops

    def ops(self) -> list[str]:
        if self.fake is not None:
            return self.fake.ops()
        assert self.recorder is not None
        return list(self.recorder.ops)

    def frees(self) -> int:
        return self.ops().count("free")

    def upload(self, handle: DeviceHandle, array: np.ndarray[Any, Any], offset: int = 0) -> None:
        self.bridge.host_to_device(put(self.ring, array.tobytes()), DeviceRange(handle, offset, array.nbytes))

    def download(self, handle: DeviceHandle, shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray[Any, Any]:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return np.frombuffer(read_device(self.bridge, self.ring, handle, 0, nbytes), dtype=dtype).reshape(shape)

    def view(self, handle: DeviceHandle, *shape: int) -> Tensor:
        return self.bridge.wrap_for_tinygrad(handle, TensorViewSpec(shape, "float32"))


MakeRig = Callable[..., Rig]


@pytest.fixture(params=["fake", "tinygrad-CPU"])
def make_rig(request: pytest.FixtureRequest) -> Iterator[MakeRig]:
    """`make_rig(**bridge_kwargs)`: a Rig over the parametrized backend. Both views live on
    tinygrad's CPU device, so the test's own tensors (nn layers, inputs) are made there too,
    whatever device tinygrad would pick by default."""
    fakes: list[FakeBackend] = []

    def make(**bridge_kwargs: Any) -> Rig:
        if request.param == "fake":
            fake = FakeBackend()
            fakes.append(fake)
            return Rig("fake", Bridge(fake, **bridge_kwargs), HostRing(1 << 16), fake, None)
        recorder = FaultyBackend(TinygradBackend("CPU"))
        return Rig("tinygrad-CPU", Bridge(recorder, **bridge_kwargs), HostRing(1 << 16), None, recorder)

    with Context(DEV="CPU"):
        yield make
    assert [f.violations for f in fakes] == [[] for _ in fakes]  # the fake's own checks never fired


def by_count(pins: Pins) -> dict[str, object]:
    """The pins as a dict without `uses`, once `uses` is checked to name exactly the views (these
    tests' allocations have no copy or compute in flight): one view use per view counted."""
    assert [use.kind for use in pins.uses] == ["view"] * pins.views
    assert all(use.range is None and not use.held for use in pins.uses)
    return {k: v for k, v in pins.as_dict().items() if k != "uses"}


def f32(name: str = "x", role: str = "data") -> ObjectSpec:
    return ObjectSpec(name, "float32", role=role)


def devbridge_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "devbridge" and r.levelno == logging.WARNING]


X16 = np.arange(16, dtype=np.float32) - 5.5


# ---------------------------------------------------------------- derived tensors


@pytest.mark.holds("VIEW-3")
@pytest.mark.rejects("VIEW-3")
def test_a_reshape_keeps_the_allocation_in_use_after_the_view_is_dropped(make_rig: MakeRig) -> None:
    rig = make_rig()
    h = rig.bridge.alloc_device(f32(), 64)
    rig.upload(h, X16)
    v = rig.view(h, 16)
    d = v.reshape(4, 4)
    del v
    gc.collect()
    assert rig.bridge.state(h) == "computing"
    assert by_count(rig.bridge.pins(h)) == {
        "state": "computing", "copies_in": 0, "copies_out": 0, "computes": 0, "views": 1, "waiting_s": 0.0,
        "holders": {},
    }  # fmt: skip
    with deferred("VIEW-3", rig.ops):
        rig.bridge.free_device(h)
    assert rig.bridge.state(h) == "free_pending" and rig.ops() == ["alloc", "copy_in", "view"]
    pins = rig.bridge.pins(h)
    assert isinstance(pins.waiting_s, float) and 0.0 <= pins.waiting_s < 60.0
    assert by_count(pins) | {"waiting_s": None} == {
        "state": "free_pending", "copies_in": 0, "copies_out": 0, "computes": 0, "views": 1, "waiting_s": None,
        "holders": {},
    }  # fmt: skip
    got = d.numpy()  # the allocation's bytes, not the fake's poison (0xDD)
    np.testing.assert_array_equal(got, X16.reshape(4, 4))
    assert got.tobytes() == X16.tobytes()
    del d
    gc.collect()
    assert rig.bridge.poll() == 1
    assert rig.bridge.state(h) == "freed"
    assert rig.ops() == ["alloc", "copy_in", "view", "free"]  # exactly one backend free, after the last reader


@pytest.mark.holds("VIEW-3")
@pytest.mark.rejects("VIEW-3")
def test_an_unrealized_lazy_graph_keeps_the_allocation_in_use(make_rig: MakeRig) -> None:
    rig = make_rig()
    h = rig.bridge.alloc_device(f32(), 64)
    rig.upload(h, X16)
    v = rig.view(h, 16)
    lazy = v + 1  # nothing realized: the graph reads the memory when it runs
    del v
    gc.collect()
    assert rig.bridge.state(h) == "computing"
    with deferred("VIEW-3", rig.ops):
        rig.bridge.free_device(h)
    assert rig.bridge.state(h) == "free_pending" and rig.frees() == 0
    assert lazy.numpy().tobytes() == (X16 + 1).tobytes()
    del lazy
    gc.collect()
    assert rig.bridge.poll() == 1 and rig.bridge.state(h) == "freed"
    assert rig.ops() == ["alloc", "copy_in", "view", "free"]


@pytest.mark.holds("VIEW-3")
@pytest.mark.rejects("VIEW-3")
def test_an_assign_target_keeps_the_allocation_in_use(make_rig: MakeRig) -> None:
    rig = make_rig()
    h = rig.bridge.alloc_device(f32(), 64)
    rig.upload(h, X16)
    v = rig.view(h, 16)
    pending = v.reshape(4, 4).assign(Tensor.full((4, 4), 7.0))  # an unrealized write into the allocation
    del v
    gc.collect()
    assert rig.bridge.state(h) == "computing"
    assert rig.download(h, (16,)).tobytes() == X16.tobytes()  # not written yet
    pending.realize()
    assert rig.download(h, (16,)).tobytes() == np.full(16, 7.0, dtype=np.float32).tobytes()  # it wrote the allocation
    with deferred("VIEW-3", rig.ops):
        rig.bridge.free_device(h)
    assert rig.bridge.state(h) == "free_pending" and rig.frees() == 0
    del pending
    gc.collect()
    assert rig.bridge.poll() == 1 and rig.bridge.state(h) == "freed" and rig.frees() == 1


# ---------------------------------------------------------------- a model that took the views over


@pytest.mark.holds("VIEW-3")
@pytest.mark.rejects("VIEW-3")
def test_load_state_dict_consume_keeps_the_weights_in_use_while_the_model_lives(make_rig: MakeRig) -> None:
    rig = make_rig()
    w = np.arange(16, dtype=np.float32).reshape(4, 4) - 8  # small integers: the model's output is exact
    b = np.array([1, -2, 3, -4], dtype=np.float32)
    hw = rig.bridge.alloc_device(f32("w", "weights"), 64)
    hb = rig.bridge.alloc_device(f32("b", "weights"), 16)
    rig.upload(hw, w)
    rig.upload(hb, b)
    model = nn.Linear(4, 4)
    views = {"weight": rig.view(hw, 4, 4), "bias": rig.view(hb, 4)}
    nn.state.load_state_dict(model, views, consume=True, verbose=False)
    assert views == {}  # consumed: only the model refers to the views now
    gc.collect()
    assert [rig.bridge.state(hw), rig.bridge.state(hb)] == ["computing", "computing"]
    with deferred("VIEW-3", rig.ops):
        rig.bridge.free_device(hw)
        rig.bridge.free_device(hb)
    assert [rig.bridge.state(hw), rig.bridge.state(hb)] == ["free_pending", "free_pending"]
    assert rig.bridge.stats().live_bytes == 80 and rig.frees() == 0
    x = np.array([[1, 2, 3, 4], [0, -1, 2, -3]], dtype=np.float32)
    out = model(Tensor(x)).numpy()
    assert out.tobytes() == (x @ w.T + b).tobytes()  # the weights are still the allocations' bytes
    assert rig.bridge.poll() == 0 and rig.frees() == 0
    del model
    gc.collect()
    assert rig.bridge.poll() == 2
    assert [rig.bridge.state(hw), rig.bridge.state(hb)] == ["freed", "freed"]
    assert rig.bridge.stats().live_bytes == 0 and rig.frees() == 2


# ---------------------------------------------------------------- TinyJit holding views


WARNING = r"allocation #{id} \({name}, role {role}\) is {state} after \d+ s; still in use by 1 view \(view #\d+\)"


@pytest.mark.holds("VIEW-3", "PIN-1")
@pytest.mark.rejects("VIEW-3", "PIN-1")
@pytest.mark.parametrize("how", ["returns", "assigns"])
def test_a_jit_holding_its_output_view_pins_it_until_the_jit_is_deleted(
    make_rig: MakeRig, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    caplog.set_level(logging.WARNING, logger="devbridge")
    rig = make_rig(pending_warning_s=0)
    hx = rig.bridge.alloc_device(f32("x"), 64)
    ho = rig.bridge.alloc_device(f32("out"), 64)
    rig.upload(hx, X16)
    x, out = rig.view(hx, 16), rig.view(ho, 16)
    if how == "returns":  # the output view passed in and returned reshaped: the JIT keeps what it returned

        def returns(x: Tensor, out: Tensor) -> Tensor:
            return out.assign(x * 2).realize().reshape(4, 4)

        step = TinyJit(returns)
        for _ in range(3):  # run, capture, replay
            result = step(x, out)
        assert result.numpy().tobytes() == (X16 * 2).tobytes()
        del result
    else:  # the output view reached through a closure: the JIT keeps the buffers its kernels write
        held = {"out": out}

        def assigns(x: Tensor) -> None:
            held["out"].assign(x * 2).realize()

        step = TinyJit(assigns)
        for _ in range(3):
            step(x)
        held.clear()  # the closure no longer reaches the view: only what the JIT captured does
    assert step.cnt == 3 and step.captured is not None
    assert rig.download(ho, (16,)).tobytes() == (X16 * 2).tobytes()
    del x, out
    gc.collect()
    assert rig.bridge.state(hx) == "idle"  # the input was an argument: the JIT did not keep it
    assert by_count(rig.bridge.pins(ho)) == {
        "state": "computing", "copies_in": 0, "copies_out": 0, "computes": 0, "views": 1, "waiting_s": 0.0,
        "holders": {},
    }  # fmt: skip
    rig.bridge.free_device(hx)
    with deferred("VIEW-3", rig.ops):
        rig.bridge.free_device(ho)
    assert [rig.bridge.state(hx), rig.bridge.state(ho)] == ["freed", "free_pending"] and rig.frees() == 1
    assert rig.bridge.pins(ho).views == 1
    assert devbridge_warnings(caplog) == []
    assert rig.bridge.poll() == 0
    warned = devbridge_warnings(caplog)
    assert len(warned) == 1 and re.fullmatch(
        WARNING.format(id=1, name="out", role="data", state="free_pending"), warned[0]
    )
    assert rig.bridge.poll() == 0 and len(devbridge_warnings(caplog)) == 1  # logged once
    logged("PIN-1", caplog.records, like="#1 (out, role data) is free_pending after")
    assert rig.bridge.state(ho) == "free_pending" and rig.frees() == 1
    del step
    gc.collect()
    assert rig.bridge.poll() == 1 and rig.bridge.state(ho) == "freed"
    assert rig.frees() == 2 and rig.ops()[-1] == "free"


@pytest.mark.holds("VIEW-3", "PIN-1")
@pytest.mark.rejects("VIEW-3", "PIN-1")
def test_weights_captured_by_a_jit_closure_stay_pinned_across_restart(
    make_rig: MakeRig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="devbridge")
    rig = make_rig(pending_warning_s=0)
    w = np.arange(16, dtype=np.float32).reshape(4, 4) - 3
    hw = rig.bridge.alloc_device(f32("w", "weights"), 64)
    rig.upload(hw, w)
    held = {"weights": rig.view(hw, 4, 4)}

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x @ held["weights"]).realize()  # the anti-pattern: weights through a closure

    eye = np.eye(4, dtype=np.float32)
    for k in range(1, 4):
        assert f(Tensor(eye * k)).numpy().tobytes() == (eye * k @ w).tobytes()
    held.clear()  # the closure no longer reaches the view: only what the JIT captured does
    gc.collect()
    assert rig.bridge.state(hw) == "computing"
    with deferred("VIEW-3", rig.ops):
        rig.bridge.restart()
    assert rig.bridge.state(hw) == "stale_pending" and rig.frees() == 0
    pins = rig.bridge.pins(hw)
    assert isinstance(pins.waiting_s, float) and 0.0 <= pins.waiting_s < 60.0
    assert by_count(pins) | {"waiting_s": None} == {
        "state": "stale_pending", "copies_in": 0, "copies_out": 0, "computes": 0, "views": 1, "waiting_s": None,
        "holders": {},
    }  # fmt: skip
    assert rig.bridge.poll() == 0
    warned = devbridge_warnings(caplog)
    assert len(warned) == 1
    assert re.fullmatch(WARNING.format(id=0, name="w", role="weights", state="stale_pending"), warned[0])
    logged("PIN-1", caplog.records, like="#0 (w, role weights) is stale_pending after")
    # the old generation's memory was not released: the JIT still reads the weights
    assert f(Tensor(eye * 5)).numpy().tobytes() == (eye * 5 @ w).tobytes()
    assert rig.bridge.state(hw) == "stale_pending" and rig.frees() == 0
    del f
    gc.collect()
    assert rig.bridge.poll() == 1 and rig.bridge.state(hw) == "stale"
    assert rig.frees() == 1 and rig.ops()[-1] == "free" and len(devbridge_warnings(caplog)) == 1


# ---------------------------------------------------------------- JIT done right: views as arguments


def mlp(x: np.ndarray[Any, Any], w1: np.ndarray[Any, Any], b1: np.ndarray[Any, Any],
        w2: np.ndarray[Any, Any], b2: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # fmt: skip
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


@pytest.mark.holds("VIEW-3")
@pytest.mark.parametrize("mode", ["same-allocation", "new-allocation", "restart"])
def test_a_jitted_step_over_views_passed_as_arguments_pins_nothing_between_steps(make_rig: MakeRig, mode: str) -> None:
    rig = make_rig()
    bridge = rig.bridge
    rng = np.random.default_rng(7)
    shapes = {"w1": (8, 16), "b1": (16,), "w2": (16, 4), "b2": (4,)}

    @TinyJit
    def step(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, out: Tensor) -> None:
        out.assign((x @ w1 + b1).relu() @ w2 + b2).realize()

    def upload_weights() -> dict[str, tuple[DeviceHandle, np.ndarray[Any, Any]]]:
        weights = {}
        for name, shape in shapes.items():
            value = rng.standard_normal(shape).astype(np.float32)
            h = bridge.alloc_device(ObjectSpec(name, "float32", role="weights"), value.nbytes)
            rig.upload(h, value)
            weights[name] = (h, value)
        return weights

    weights = upload_weights()
    hx = bridge.alloc_device(f32("x", "input"), 128)
    ho = bridge.alloc_device(f32("out", "output"), 64)
    frees = 0
    for i in range(4):  # run, capture, replay, replay
        if mode == "restart" and i > 0:
            old = [h for h, _ in weights.values()] + [hx, ho]
            bridge.restart()  # nothing pins the old generation: all of it is released now
            frees += len(old)
            assert [bridge.state(h) for h in old] == ["stale"] * len(old) and rig.frees() == frees
            weights = upload_weights()
        if mode in ("new-allocation", "restart") and i > 0:
            hx = bridge.alloc_device(f32("x", "input"), 128)
            ho = bridge.alloc_device(f32("out", "output"), 64)
        x = rng.standard_normal((4, 8)).astype(np.float32)
        rig.upload(hx, x)
        views = {
            name: bridge.wrap_for_tinygrad(h, TensorViewSpec(shapes[name], "float32"))
            for name, (h, _) in weights.items()
        }
        xv, ov = rig.view(hx, 4, 8), rig.view(ho, 4, 4)
        step(xv, views["w1"], views["b1"], views["w2"], views["b2"], ov)
        got = rig.download(ho, (4, 4))
        want = mlp(x, *(value for _, value in weights.values()))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert bridge.state(ho) == "computing"
        del views, xv, ov
        gc.collect()
        handles = [h for h, _ in weights.values()] + [hx, ho]
        assert [bridge.state(h) for h in handles] == ["idle"] * len(handles)  # the JIT kept none of them
        if mode == "new-allocation":
            bridge.free_device(hx)
            bridge.free_device(ho)
            frees += 2
            assert [bridge.state(hx), bridge.state(ho)] == ["freed", "freed"] and rig.frees() == frees
    assert step.cnt == 4 and step.captured is not None  # captured, then replayed over the new views
    handles = [h for h, _ in weights.values()] + ([] if mode == "new-allocation" else [hx, ho])
    for h in handles:
        bridge.free_device(h)
    assert [bridge.state(h) for h in handles] == ["freed"] * len(handles)
    assert rig.frees() == frees + len(handles) and bridge.stats().live_allocations == 0
