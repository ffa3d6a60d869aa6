"""The reference worker's workload: the objects' shapes, their inputs and weights, the MLP the
worker runs on them and numpy's answer for it, and the producer thread that fills the input ring."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from devbridge.errors import RingFullError
from devbridge.ring import HostRange, HostRing

TOLERANCE = 1e-4  # an output is right if within this, absolute and relative, of numpy's (float32 MLP)


@dataclass(frozen=True)
class Shapes:
    rows: int = 16
    d_in: int = 64
    hidden: int = 64
    d_out: int = 32


DEMO_SHAPES = Shapes()  # the demo's objects: 16 rows of 64 floats in, 32 out


def make_input(seed: int, k: int, shapes: Shapes) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.random.default_rng((seed, k)).standard_normal((shapes.rows, shapes.d_in), dtype=np.float32)


def make_weights(seed: int, shapes: Shapes) -> dict[str, np.ndarray[Any, np.dtype[np.float32]]]:
    rng = np.random.default_rng((seed, 1 << 40))  # a stream no object index reaches
    scale = np.float32(1 / np.sqrt(shapes.d_in))
    return {
        "w1": rng.standard_normal((shapes.d_in, shapes.hidden), dtype=np.float32) * scale,
        "b1": rng.standard_normal((1, shapes.hidden), dtype=np.float32),
        "w2": rng.standard_normal((shapes.hidden, shapes.d_out), dtype=np.float32) * scale,
        "b2": rng.standard_normal((1, shapes.d_out), dtype=np.float32),
    }


def reference_mlp(x: np.ndarray[Any, Any], w: dict[str, np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    result: np.ndarray[Any, Any] = np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"] + w["b2"]
    return result


def mlp_step(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, y: Any) -> None:
    """The worker's MLP, writing its result into the output view (jitted by the worker)."""
    y.assign(((x @ w1 + b1).relu() @ w2) + b2).realize()


def jitted_mlp(weights: dict[str, Any]) -> Callable[[Any, Any], None]:
    """The MLP over one generation's weights (tensors), jitted as a user writes it: x and y are
    its arguments, the weights its captures (TinyJit bakes their buffers into what it replays)."""
    from tinygrad.engine.jit import TinyJit

    w1, b1, w2, b2 = (weights[name] for name in ("w1", "b1", "w2", "b2"))

    def step(x: Any, y: Any) -> None:
        mlp_step(x, w1, b1, w2, b2, y)

    jitted: Callable[[Any, Any], None] = TinyJit(step)
    return jitted


def is_right(got: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> bool:
    """`got` is numpy's answer within TOLERANCE (np.allclose's test, 10x cheaper)."""
    return bool((np.abs(got - expected) <= TOLERANCE * (1 + np.abs(expected))).all())


class Producer(threading.Thread):
    """Writes objects into the input ring (blocking only while it is full), each with the output
    numpy says it must give. The objects and their outputs are made when the producer is made,
    before the worker's clock starts (as a raw pipeline's inputs are made beforehand): the run
    measures moving and computing them, not generating them."""

    def __init__(
        self,
        ring: HostRing,
        ks: Sequence[int],
        seed: int,
        shapes: Shapes,
        space: threading.Condition,
        weights: dict[str, np.ndarray[Any, np.dtype[np.float32]]] | None = None,
    ) -> None:
        super().__init__(daemon=True, name="devbridge-producer")
        self.ring, self.ks, self.seed, self.shapes, self.space = ring, list(ks), seed, shapes, space
        self.weights = weights if weights is not None else make_weights(seed, shapes)
        self.xs = [make_input(seed, k, shapes) for k in self.ks]
        self.answers = [reference_mlp(x, self.weights) for x in self.xs]
        self.ready: deque[tuple[int, HostRange, np.ndarray[Any, Any]]] = deque()  # objects in the ring
        self.arrived = threading.Condition()  # notified as objects are appended to `ready`
        self.blocked_s = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        nbytes = self.shapes.rows * self.shapes.d_in * 4
        for i, k in enumerate(self.ks):
            while True:
                try:
                    r = self.ring.reserve(nbytes)
                    break
                except RingFullError:
                    start = time.perf_counter()
                    with self.space:
                        self.space.wait(0.05)
                    self.blocked_s += time.perf_counter() - start
                    if self.stop.is_set():
                        return
            self.ring.view(r)[:] = self.xs[i].data.cast("B")
            with self.arrived:
                self.ready.append((k, r, self.answers[i]))
                self.arrived.notify()

    def take(self, timeout: float) -> tuple[int, HostRange, np.ndarray[Any, Any]] | None:
        """The next object in the ring, waiting up to `timeout` seconds for one; None if none came."""
        if not self.ready and timeout > 0:
            with self.arrived:
                self.arrived.wait_for(lambda: self.ready, timeout)
        return self.ready.popleft() if self.ready else None
