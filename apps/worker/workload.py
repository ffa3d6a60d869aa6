"""The reference worker's workload: the objects' shapes, their inputs and weights, the MLP the
worker runs on them and numpy's answer for it, and the producer thread that fills the input ring."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from threadpoolctl import threadpool_limits

from devbridge.errors import RingFullError
from devbridge.ring.host import HostRange, HostRing

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


def one_blas_thread() -> AbstractContextManager[object]:
    """numpy's matrix products on the calling thread alone, for the block: after a product,
    OpenBLAS's pool threads spin for a while waiting for the next one, on the cores that a
    device computing on the CPU (tinygrad's CPU, pocl's CL) needs: answers made just before a
    run would take them from its kernels."""
    limits: AbstractContextManager[object] = threadpool_limits(limits=1, user_api="blas")
    return limits


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


class OutputCheck:
    """Which objects of a batch's output are numpy's answers within TOLERANCE (np.allclose's
    test, 10x cheaper), computed in arrays kept from batch to batch: a plain expression's
    temporaries are fresh allocations (page faults on every batch for outputs of hundreds of
    KiB), which cost ten times the comparison itself."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        """`shape`: (objects, rows, d_out) of the largest batch."""
        self.diff = np.empty(shape, np.float32)
        self.bound = np.empty(shape, np.float32)
        self.within = np.empty(shape, np.bool_)

    def __call__(self, got: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> list[bool]:
        """Per object (the first axis of `got` and `expected`), whether it is right."""
        n = len(got)
        diff, bound, within = self.diff[:n], self.bound[:n], self.within[:n]
        np.subtract(got, expected, out=diff)
        np.abs(diff, out=diff)
        np.abs(expected, out=bound)
        np.add(bound, 1, out=bound)
        np.multiply(bound, TOLERANCE, out=bound)  # |got - expected| <= TOLERANCE * (1 + |expected|)
        np.less_equal(diff, bound, out=within)
        per_object = np.logical_and.reduce(within.reshape(n, -1), axis=1)
        return [bool(right) for right in per_object]


class Producer(threading.Thread):
    """Writes objects into the input ring (blocking only while it is full), `batch` at a time in
    one reservation, each batch with the outputs numpy says it must give. The objects and their
    outputs are made when the producer is made, before the worker's clock starts (as a raw
    pipeline's inputs are made beforehand): the run measures moving and computing them, not
    generating them."""

    def __init__(
        self,
        ring: HostRing,
        ks: Sequence[int],
        seed: int,
        shapes: Shapes,
        space: threading.Condition,
        weights: dict[str, np.ndarray[Any, np.dtype[np.float32]]] | None = None,
        batch: int = 1,
    ) -> None:
        super().__init__(daemon=True, name="devbridge-producer")
        self.ring, self.ks, self.seed, self.shapes, self.space = ring, list(ks), seed, shapes, space
        self.batch = batch
        self.weights = weights if weights is not None else make_weights(seed, shapes)
        # one array each, object after object: a batch's inputs are one copy into the ring, and
        # its answers one slice
        self.xs = np.empty((len(self.ks), shapes.rows, shapes.d_in), np.float32)
        self.answers = np.empty((len(self.ks), shapes.rows, shapes.d_out), np.float32)
        with one_blas_thread():
            for i, k in enumerate(self.ks):
                self.xs[i] = make_input(seed, k, shapes)
                self.answers[i] = reference_mlp(self.xs[i], self.weights)
        self.ready: deque[Batch] = deque()  # batches in the ring
        self.arrived = threading.Condition()  # notified as batches are appended to `ready`
        self.blocked_s = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        for i in range(0, len(self.ks), self.batch):
            ks = self.ks[i : i + self.batch]
            r = self.reserve(len(ks) * self.xs[0].nbytes)
            if r is None:
                return
            self.ring.view(r)[:] = self.xs[i : i + len(ks)].data.cast("B")
            with self.arrived:
                self.ready.append(Batch(ks, r, self.answers[i : i + len(ks)]))
                self.arrived.notify()

    def reserve(self, nbytes: int) -> HostRange | None:
        """Room for a batch, once the ring has it; None when told to stop meanwhile."""
        while True:
            try:
                return self.ring.reserve(nbytes)
            except RingFullError:
                start = time.perf_counter()
                with self.space:
                    self.space.wait(0.05)
                self.blocked_s += time.perf_counter() - start
                if self.stop.is_set():
                    return None

    def take(self, timeout: float) -> Batch | None:
        """The next batch in the ring, waiting up to `timeout` seconds for one; None if none came."""
        if not self.ready and timeout > 0:
            with self.arrived:
                self.arrived.wait_for(lambda: self.ready, timeout)
        return self.ready.popleft() if self.ready else None


@dataclass(frozen=True)
class Batch:
    """Objects `ks`, their inputs one after another in `src`, and numpy's outputs for them (None
    where another process checks them); `record`: the input record `src` is part of, if more."""

    ks: list[int]
    src: HostRange
    answers: np.ndarray[Any, np.dtype[np.float32]] | None
    record: HostRange | None = None


class Feed(Protocol):
    """What fills a worker's input ring, as the worker sees it: the producer thread, or the
    input end of a ring that producer processes fill."""

    stop: threading.Event  # set to end it
    blocked_s: float  # time it waited for room in the ring

    @property
    def ready(self) -> Any: ...  # true while batches are in the ring, not yet taken

    def start(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...  # more batches may come

    def take(self, timeout: float) -> Batch | None: ...
