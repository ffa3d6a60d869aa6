"""`bridge.pins(h, holders=True)`: what still reaches a view's memory, by kind (views, derived
tensors, gradients, TinyJit captures), on tinygrad's CPU device; and letting it all go."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from rules import deferred
from tinygrad import Tensor, TinyJit

from devbridge import Bridge, ObjectSpec, TensorViewSpec
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.errors import BackendFailureError, InvalidArgumentError
from devbridge.testing import FakeBackend, FaultyBackend

NONE = {"views": 0, "derived": 0, "grads": 0, "jit": 0}


def weights(bridge: Bridge) -> tuple[object, Tensor]:
    h = bridge.alloc_device(ObjectSpec("w", "float32", role="weights"), 64)
    bridge.upload(h, np.arange(16, dtype=np.float32))
    return h, bridge.wrap_for_tinygrad(h, TensorViewSpec((4, 4), "float32"))


@pytest.mark.holds("PIN-1", "VIEW-3")
def test_the_census_names_each_kind_of_holder_as_it_comes_and_goes() -> None:
    backend = TinygradBackend("CPU")
    bridge = Bridge(backend)
    h, w = weights(bridge)
    assert bridge.pins(h, holders=True).holders == NONE | {"views": 1}
    assert bridge.pins(h).holders == {}  # only when asked: a census walks every live tensor
    derived = w.T + 1  # lazy: reads w's memory when realized
    assert bridge.pins(h, holders=True).holders == NONE | {"views": 1, "derived": 1}
    del derived
    w.requires_grad = True
    x = Tensor.ones(2, 4, device="CPU")
    loss = (x @ w).sum()
    loss.backward()  # x.grad reads w; the loss's graph too
    assert bridge.pins(h, holders=True).holders == NONE | {"views": 1, "derived": 1, "grads": 1}

    @TinyJit
    def step(a: Tensor, weight: Tensor = w) -> Tensor:
        return (a @ weight).realize()  # the weights captured, not passed

    for _ in range(3):
        step(Tensor.ones(2, 4, device="CPU").contiguous().realize())
    assert bridge.pins(h, holders=True).holders == NONE | {"views": 1, "derived": 1, "grads": 1, "jit": 1}

    with deferred("FREE-1", lambda: backend_frees(bridge)):
        bridge.free_device(h)
    del w, loss
    pins = bridge.pins(h, holders=True)
    # the view tensor lives on as the step's default argument; x.grad and the capture read it
    assert (pins.state, pins.views, pins.holders) == ("free_pending", 1, NONE | {"views": 1, "grads": 1, "jit": 1})
    del x, step
    gc.collect()
    assert bridge.poll() == 1 and bridge.state(h) == "freed"
    assert bridge.pins(h, holders=True).holders == {}  # no view left: nothing to ask about


def backend_frees(bridge: Bridge) -> list[str]:
    return ["free"] * bridge.stats().backend_frees


def test_a_backend_that_cannot_tell_leaves_the_census_empty_and_a_failing_one_is_fault_1() -> None:
    bridge = Bridge(FakeBackend())
    h = bridge.alloc_device(ObjectSpec("w", "float32"), 64)
    view = bridge.wrap_for_tinygrad(h, TensorViewSpec((16,), "float32"))
    assert bridge.pins(h, holders=True).holders == {} and bridge.pins(h).views == 1
    with pytest.raises(InvalidArgumentError):
        bridge.pins(h, holders=1)  # type: ignore[arg-type]
    del view

    class Broken(TinygradBackend):
        def holders(self, anchor: object) -> dict[str, int]:
            raise __import__("devbridge.backends.base", fromlist=["BackendError"]).BackendError("census failed")

    broken = Bridge(Broken("CPU"))
    hb, wb = weights(broken)
    with pytest.raises(BackendFailureError, match="census failed") as e:
        broken.pins(hb, holders=True)
    assert e.value.rule == "FAULT-1" and broken.pins(hb).views == 1
    del wb
    assert FaultyBackend(TinygradBackend("CPU")).holders  # the wrapper passes the census on


def test_a_census_that_tinygrad_breaks_is_a_backend_failure_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """tinygrad's internals moved (its table of live tensors cannot be read): the census is
    FAULT-1, naming the device, and the allocation is as it was."""
    import tinygrad.tensor

    class Moved(type(tinygrad.tensor.all_tensors)):  # type: ignore[misc]  # tensors still come and go
        def __iter__(self) -> object:
            raise RuntimeError("all_tensors moved")

    bridge = Bridge(TinygradBackend("CPU"))
    h, w = weights(bridge)
    state = bridge.state(h)
    monkeypatch.setattr(tinygrad.tensor, "all_tensors", Moved(tinygrad.tensor.all_tensors))
    with pytest.raises(BackendFailureError, match="CPU: cannot tell what holds the view: all_tensors moved") as e:
        bridge.pins(h, holders=True)
    assert e.value.rule == "FAULT-1" and bridge.pins(h).views == 1 and bridge.state(h) == state
    del w


def test_the_demos_pins_report_names_what_still_holds_each_allocation_at_the_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from devbridge.apps.worker import run_demo
    from devbridge.cli.main import main

    summary = run_demo(60, "tinygrad", "CPU", restart_every=20, pins_report=True)
    assert summary.restarts == 2 and summary.pinned
    names = [line.split()[1] for line in summary.pinned]
    assert {"w1", "b1", "w2", "b2"} <= set(names) <= {"w1", "b1", "w2", "b2", "x", "y"}
    for line in summary.pinned:  # the last generation's memory, pinned by its live views (and
        # the weights by the generation's jitted MLP too, which captured them): no older generation
        reached = "jit 1, views 1" if line.split()[1] in ("w1", "b1", "w2", "b2") else "views 1"
        assert f"(generation 2): computing; views 1; reached by {reached}" in line, line
    assert main(["demo", "--backend", "fake", "--objects", "20", "--pins-report"]) == 0
    out = capsys.readouterr().out
    assert "pinned at the end: 0 allocations" not in out and "\n  #0 w1 (generation 0): computing; views 1" in out
    assert main(["demo", "--backend", "fake", "--objects", "20", "--pins-report", "--device", "a,b"]) == 2
