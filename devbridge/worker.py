"""The reference worker: input HostRing -> Bridge -> a tinygrad MLP on zero-copy views -> output HostRing.

A producer thread fills the input ring with objects and blocks only when it
is full. The worker keeps a window of objects in flight, each moving through
slot -> upload (async host_to_device) -> compute (a TinyJit MLP on zero-copy
views) -> download (async device_to_host) -> delivered, so the upload of
object k+1 overlaps the compute of object k. The MLP's weights are uploaded
once per generation under their own role.

Device memory is pooled per generation: a slot is an input and an output
allocation with their views, allocated once and reused by object after
object (the lifecycle still tracks every copy and compute on them); a
restart frees the pool. The MLP runs under TinyJit with every view passed
as an argument (TinyJit swaps argument buffers per call), weights included.
A compute declares the object's x and y; the weights are only read after
their upload, and their views, alive for the whole generation, pin them.

Ordering is the bridge's (ORDER-1): the download is issued right after the
compute, without waiting for its event; the bridge holds it back until the
compute has written what it reads. The worker still starts a compute only
once its upload is done: compute() would wait for the upload itself, but
blocking there would stall the other objects in the window.

No object is lost: inputs are copied with `release=False` and released only
once the object's output is delivered, so a failed or restart-aborted copy
is retried in the new generation from the same host bytes; outputs are
verified against numpy and counted per object, so a duplicate or a wrong
answer is caught.
"""

from __future__ import annotations

import contextlib
import gc
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from devbridge.backends import make_backend
from devbridge.backends.base import Backend
from devbridge.backends.fake import FakeBackend
from devbridge.backends.faulty import FaultyBackend
from devbridge.bridge import Bridge
from devbridge.errors import (
    BridgeError,
    DeviceAllocationError,
    DeviceFreeError,
    InvalidArgumentError,
    RingFullError,
    WaitTimeoutError,
    short,
)
from devbridge.events import Event
from devbridge.ring import HostRange, HostRing
from devbridge.types import DeviceHandle, DeviceRange, ObjectSpec, TensorViewSpec

IDLE_WAIT_S = 0.05  # the longest an idle worker blocks before it looks for new objects
#: Failures in a row, with no object delivered in between, after which the backend is taken to
#: fail for good (a device that cannot allocate, say), not by chance: the run ends, it never spins.
GIVE_UP_AFTER = 1000
TOLERANCE = 1e-4  # an output is right if within this, absolute and relative, of numpy's (float32 MLP)


class WorkerStalled(RuntimeError):
    """The backend kept failing: GIVE_UP_AFTER failures in a row and no object delivered."""


@dataclass(frozen=True)
class Shapes:
    rows: int = 16
    d_in: int = 64
    hidden: int = 64
    d_out: int = 32


@dataclass
class Summary:
    objects: int
    delivered: int
    lost: int
    duplicated: int
    wrong: int
    bytes_in: int
    bytes_out: int
    seconds: float
    objects_per_s: float
    gb_per_s_in: float
    gb_per_s_out: float
    peak_live_allocations: int
    allocations: int  # alloc_device calls that succeeded: weights and pooled slots, per generation
    deferred_frees: int
    faults_injected: int
    faults_recovered: int
    free_failures: int  # backend frees that failed: reported by the bridge (FREE-3), not retried
    restarts: int
    overlapped_computes: int  # computes issued while another object's upload was in flight
    producer_blocked_s: float  # time the producer waited for ring space
    unreleased_input_bytes: int
    unreleased_output_bytes: int
    backend: str

    @property
    def clean(self) -> bool:
        return self.lost == self.duplicated == self.wrong == 0 and self.delivered == self.objects


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


@dataclass
class Slot:
    """Device memory for one object in flight, reused by object after object in a generation."""

    x: DeviceHandle
    y: DeviceHandle
    xv: Any  # zero-copy views, passed to the jitted MLP as arguments (they pin x and y)
    yv: Any
    xr: DeviceRange  # all of x and all of y: what every object's copies move
    yr: DeviceRange


def mlp_step(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, y: Any) -> None:
    """The worker's MLP, writing its result into the output view (jitted by the worker)."""
    y.assign(((x @ w1 + b1).relu() @ w2) + b2).realize()


@dataclass
class Job:
    k: int
    src: HostRange
    slot: Slot | None = None
    out: HostRange | None = None
    stage: str = "alloc"
    event: Event | None = None
    computed: Event | None = None  # the compute event the download follows (ORDER-1)
    old: list[Event] = field(default_factory=list)  # events of an older generation still on the device


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


class Worker:
    def __init__(
        self,
        backend: Backend,
        objects: int,
        *,
        seed: int = 0,
        shapes: Shapes = Shapes(),  # frozen
        window: int = 4,
        ring_objects: int = 64,  # the input ring holds 64 objects (256 KiB): the producer refills it in batches
        restart_every: int = 0,
        pump: Callable[[], None] | None = None,
        ks: Sequence[int] | None = None,
    ) -> None:
        """`objects` synthetic objects, numbered 0.. (or those of `ks`: a device's share)."""
        ks = range(objects) if ks is None else ks
        self.backend, self.objects, self.seed, self.shapes = backend, len(ks), seed, shapes
        self.window, self.restart_every = window, restart_every
        self.pump = pump or (lambda: None)
        self.pumped = pump is not None  # a fake backend's pump completes events: never block for them
        self.bridge = Bridge(backend)
        self.in_bytes = shapes.rows * shapes.d_in * 4
        self.out_bytes = shapes.rows * shapes.d_out * 4
        self.inputs = HostRing(ring_objects * self.in_bytes)
        self.outputs = HostRing(ring_objects * self.out_bytes)
        self.space = threading.Condition()
        # the producer is woken once half the ring is free again, not per object: each wake-up is
        # a GIL hand-off between it and this loop (it still retries every 0.05 s by itself)
        self.wake_every = max(1, ring_objects // 2)
        self.weights_np = make_weights(seed, shapes)
        self.expected: dict[int, np.ndarray[Any, Any]] = {}
        self.delivered: Counter[int] = Counter()
        self.deliveries = 0  # sum(self.delivered.values()), kept as it grows: the loop reads it every pass
        self.wrong_ks: list[int] = []  # the objects whose output was wrong
        self.failures_retried = 0
        self.failures_in_a_row = 0  # since the last delivery (GIVE_UP_AFTER)
        self.free_failures = 0
        self.restarts = 0
        self.overlapped = 0
        self.producer_blocked_s = 0.0
        self.peak_live = 0
        self.jobs: list[Job] = []
        self.since_restart = 0  # objects delivered since the last restart (restart_every)
        self.x_view = TensorViewSpec((shapes.rows, shapes.d_in), "float32")
        self.y_view = TensorViewSpec((shapes.rows, shapes.d_out), "float32")
        self.x_spec = ObjectSpec("x", "float32", role="input", view=self.x_view)
        self.y_spec = ObjectSpec("y", "float32", role="output", view=self.y_view)
        self.weights: dict[str, Any] = {}  # name -> live view of the uploaded weight
        self.free_slots: list[Slot] = []  # the pool: slots of this generation no object holds
        self.slots = 0  # slots made in this generation
        self.mlp = _jit(mlp_step)
        self.weight_ring = HostRing(sum(w.nbytes for w in self.weights_np.values()))
        self.weight_src = {}
        for name, w in self.weights_np.items():
            r = self.weight_ring.reserve(w.nbytes)
            self.weight_ring.view(r)[:] = w.tobytes()
            self.weight_src[name] = r
        self.producer = Producer(self.inputs, ks, seed, shapes, self.space, self.weights_np)

    @property
    def wrong(self) -> int:
        """Objects whose output was wrong."""
        return len(self.wrong_ks)

    # ------------------------------------------------------------ the loop

    def run(self, progress: Callable[[int], None] | None = None) -> None:
        self.start()
        try:
            while self.tick(progress, IDLE_WAIT_S):
                pass
        finally:
            self.stop()
        self.finish()

    def start(self) -> None:
        self.producer.start()
        self.upload_weights()
        self.since_restart = 0

    def tick(self, progress: Callable[[int], None] | None, wait: float) -> bool:
        """One pass over the jobs; False once the work is done. A pass where nothing moved
        blocks up to `wait` seconds for the producer or a completion. (run_devices interleaves
        the passes of several workers in one thread: tinygrad is not thread-safe.)"""
        producer = self.producer
        if not (self.deliveries < self.objects or self.jobs):
            return False
        self.pump()
        while len(self.jobs) < self.window and (item := producer.take(0 if self.jobs else wait)):
            k, src, expected = item
            self.expected[k] = expected
            self.jobs.append(Job(k, src))
        before = self.deliveries
        states = [(job.stage, job.event) for job in self.jobs]
        for job in list(self.jobs):
            self.step(job)
        if states == [(job.stage, job.event) for job in self.jobs]:
            # nothing moved: take what the backend finished and failed deferred frees (FREE-3),
            # then block until an event is done (events settle as their jobs look at them)
            self.reported(self.bridge.poll)
            self.idle(wait)
        done = self.deliveries
        self.since_restart += done - before
        if progress is not None and done != before:
            progress(done)
        if self.restart_every and self.since_restart >= self.restart_every and self.jobs:
            self.restart()
            self.since_restart = 0
        return bool(self.jobs or producer.ready or producer.is_alive())

    def stop(self) -> None:
        producer = self.producer
        producer.stop.set()
        producer.join(timeout=5)
        self.producer_blocked_s = producer.blocked_s

    def finish(self) -> None:
        if self.restarts:
            gc.collect()  # views of old pools in reference cycles: their releases (and failures) now
        self.reported(self.bridge.poll)

    def idle(self, wait: float = IDLE_WAIT_S) -> None:
        """Nothing moved this pass: block until one of the events the jobs wait on is done (the
        bridge's wait_any sleeps on completions; no polling loop takes the GIL from the copy
        thread), at most `wait` seconds. A fake backend's pump completes events itself."""
        if self.pumped:
            return
        events = [e for job in self.jobs for e in (job.event, *job.old) if e is not None and not e.done()]
        if events:
            with contextlib.suppress(WaitTimeoutError):  # the producer may have a new object ready by now
                self.bridge.wait_any(events, timeout=wait)

    def upload_weights(self) -> None:
        """The MLP's weights, once per generation, under their own role; their views live as long."""
        self.weights.clear()
        for name, w in self.weights_np.items():
            handle = self.retry(self.bridge.alloc_device, ObjectSpec(name, "float32", role="weights"), w.nbytes)
            src = self.weight_src[name]
            self.retry(self.upload_weight, src, DeviceRange(handle, 0, src.nbytes))
            self.weights[name] = self.bridge.wrap_for_tinygrad(handle, TensorViewSpec(w.shape, "float32"))
        self.note_live()

    def upload_weight(self, src: HostRange, dst: DeviceRange) -> None:
        self.bridge.host_to_device(src, dst, release=False)  # kept: uploaded again after a restart

    def retry(self, call: Callable[..., Any], *args: Any) -> Any:
        """Call until it does not fail with an injected allocation or copy failure."""
        while True:
            try:
                return call(*args)
            except BridgeError as e:
                if e.rule not in ("ALLOC-2", "COPY-F"):
                    raise
                self.failed(e)

    def failed(self, error: BaseException) -> None:
        """A failure the worker retries; too many in a row and the run ends (WorkerStalled)."""
        self.failures_retried += 1
        self.failures_in_a_row += 1
        if self.failures_in_a_row >= GIVE_UP_AFTER:
            raise WorkerStalled(
                f"the backend failed {self.failures_in_a_row} times in a row with no object delivered "
                f"(the last: {error}): giving up"
            )

    def reported(self, call: Callable[..., object], *args: object) -> None:
        """A call that may report a failed backend free (FREE-3): the bridge finished its own
        work and will never free that memory again, so the worker counts it and goes on."""
        try:
            call(*args)
        except DeviceFreeError:
            self.free_failures += 1

    def restart(self) -> None:
        """Restart mid-flight: every job starts over in the new generation from its kept input;
        the pool goes with the old generation (its views are dropped, so its memory is released)."""
        self.weights.clear()  # old views must go: they pin old memory
        self.free_slots.clear()
        self.slots = 0
        self.reported(self.bridge.restart)
        self.restarts += 1
        for job in self.jobs:
            if job.event is not None and not job.event.done():
                job.old.append(job.event)
            job.slot = None
            job.event = job.computed = None
            job.stage = "alloc"
        self.upload_weights()

    def note_live(self) -> None:
        """Track the peak of live allocations (called where the worker allocates, not per pass)."""
        self.peak_live = max(self.peak_live, self.bridge.stats()["live_allocations"])

    def take_slot(self) -> Slot | None:
        """A slot from the pool, or a new one while the window allows; None for now (retried)."""
        if self.free_slots:
            return self.free_slots.pop()
        if self.slots >= self.window:
            return None
        try:
            x = self.bridge.alloc_device(self.x_spec, self.in_bytes)
        except DeviceAllocationError as e:
            self.failed(e)
            return None
        try:
            y = self.bridge.alloc_device(self.y_spec, self.out_bytes)
        except DeviceAllocationError as e:
            self.failed(e)
            self.reported(self.bridge.free_device, x)
            return None
        self.slots += 1
        self.note_live()
        xv, yv = self.bridge.wrap_for_tinygrad(x, self.x_view), self.bridge.wrap_for_tinygrad(y, self.y_view)
        return Slot(x, y, xv, yv, DeviceRange(x, 0, self.in_bytes), DeviceRange(y, 0, self.out_bytes))

    # ------------------------------------------------------------ one object

    def step(self, job: Job) -> None:
        if job.old:
            job.old = [e for e in job.old if not e.done()]
            if job.old:
                return  # an aborted copy still uses this job's host bytes
        if job.stage == "alloc":
            job.slot = job.slot or self.take_slot()
            if job.slot is not None:
                self.upload(job)
        elif job.stage == "upload" and self.settled(job):
            self.compute(job)
        elif job.stage == "compute":  # the output range was not free yet: the download follows the compute
            self.download(job)
        elif job.stage == "download" and job.out is not None and self.settled(job):
            self.deliver(job)

    def settled(self, job: Job) -> bool:
        """The job's event is done; on a failure the stage is retried (and False returned)."""
        assert job.event is not None
        if not job.event.done():
            return False
        if job.stage == "download" and job.computed is not None and job.computed.error is not None:
            # the download ran on the bytes as the failed compute left them (ORDER-1): start over
            # from the kept input, in the same slot (the output range is reused)
            self.failed(job.computed.error)
            job.computed = None
            self.upload(job)
            return False
        if job.event.error is None:
            return True
        self.failed(job.event.error)
        (self.upload if job.stage == "upload" else self.download)(job)
        return False

    def attempt(self, job: Job, stage: str, copy: Callable[[], Event]) -> None:
        """Start a copy; a synchronous backend failure is counted and retried on a later tick."""
        try:
            job.event = copy()
        except BridgeError as e:
            if e.rule != "COPY-F":
                raise
            self.failed(e)
            return
        job.stage = stage

    def upload(self, job: Job) -> None:
        assert job.slot is not None
        x = job.slot.xr
        self.attempt(job, "upload", lambda: self.bridge.host_to_device(job.src, x, sync=False, release=False))

    def compute(self, job: Job) -> None:
        slot, w = job.slot, self.weights
        assert slot is not None
        uploading = (j for j in self.jobs if j is not job and j.stage == "upload")
        self.overlapped += any(j.event is not None and not j.event.done() for j in uploading)
        # x and y only: the weights are read by every compute but never written after their upload
        # (no copy to order against), and their live views pin them for the generation (VIEW-3)
        with self.bridge.compute(slot.x, slot.y) as event:
            self.mlp(slot.xv, w["w1"], w["b1"], w["w2"], w["b2"], slot.yv)
        job.event = job.computed = event
        job.stage = "compute"
        self.download(job)  # at once: held back by the bridge until the compute event completes

    def download(self, job: Job) -> None:
        assert job.slot is not None
        if job.out is None:
            try:
                job.out = self.outputs.reserve(self.out_bytes)
            except RingFullError:
                return  # the output ring drains as objects are delivered
        y, out = job.slot.yr, job.out
        self.attempt(job, "download", lambda: self.bridge.device_to_host(y, out, sync=False))

    def deliver(self, job: Job) -> None:
        assert job.out is not None and job.slot is not None
        got = np.frombuffer(self.outputs.view(job.out), dtype=np.float32).reshape(self.shapes.rows, self.shapes.d_out)
        expected = self.expected.pop(job.k)
        if not (np.abs(got - expected) <= TOLERANCE * (1 + np.abs(expected))).all():  # np.allclose, 10x cheaper
            self.wrong_ks.append(job.k)
        self.delivered[job.k] += 1
        self.deliveries += 1
        self.failures_in_a_row = 0
        self.outputs.release(job.out)  # the consumer took it
        self.inputs.release(job.src)  # the object is done: its input may go
        if self.deliveries % self.wake_every == 0:  # the producer refills the ring in batches
            with self.space:
                self.space.notify_all()
        self.free_slots.append(job.slot)  # the next object's upload follows this download (ORDER-1)
        self.jobs.remove(job)

    # ------------------------------------------------------------ results

    def summary(self, seconds: float, backend_name: str) -> Summary:
        stats = self.bridge.stats()
        delivered = len(self.delivered)
        injected = sum(self.backend.injected.values()) if isinstance(self.backend, FaultyBackend) else 0
        return Summary(
            objects=self.objects,
            delivered=delivered,
            lost=self.objects - delivered,
            duplicated=sum(n - 1 for n in self.delivered.values() if n > 1),
            wrong=self.wrong,
            bytes_in=delivered * self.in_bytes,
            bytes_out=delivered * self.out_bytes,
            seconds=seconds,
            objects_per_s=delivered / seconds,
            gb_per_s_in=delivered * self.in_bytes / seconds / 1e9,
            gb_per_s_out=delivered * self.out_bytes / seconds / 1e9,
            peak_live_allocations=self.peak_live,
            allocations=stats["allocs"],
            deferred_frees=stats["deferred_frees"],
            faults_injected=injected,
            faults_recovered=self.failures_retried,
            free_failures=self.free_failures,
            restarts=self.restarts,
            overlapped_computes=self.overlapped,
            producer_blocked_s=self.producer_blocked_s,
            unreleased_input_bytes=self.inputs.head - self.inputs.cursor,
            unreleased_output_bytes=self.outputs.head - self.outputs.cursor,
            backend=backend_name,
        )


def _jit(step: Callable[..., None]) -> Callable[..., None]:
    from tinygrad.engine.jit import TinyJit

    jitted: Callable[..., None] = TinyJit(step)
    return jitted


def fake_pump(fake: FakeBackend, seed: int) -> Callable[[], None]:
    """The fake device's progress: each tick it finishes a random part of its pending work, in any order."""
    rng = random.Random(seed)

    def pump() -> None:
        pending = fake.pending()
        rng.shuffle(pending)
        for event in pending[: max(1, len(pending) * 2 // 3)]:
            fake.complete(event)

    return pump


#: What `--faults` fails at random: allocations, copies, frees and event queries.
RANDOM_FAULTS = ("alloc", "copy_in", "copy_out", "free", "query")


def check_demo(objects: object, faults: object, restart_every: object) -> None:
    """The demo's options, checked before anything starts (ARG-1): a bad one would spin forever."""
    if type(objects) is not int or objects < 1:
        raise InvalidArgumentError("ARG-1", f"objects must be an int >= 1, got {short(objects)}")
    if type(faults) not in (int, float) or not 0 <= faults < 1:  # type: ignore[operator]
        raise InvalidArgumentError("ARG-1", f"faults is a probability in [0, 1), got {short(faults)}")
    if type(restart_every) is not int or restart_every < 0:
        raise InvalidArgumentError("ARG-1", f"restart_every must be an int >= 0 (0: never), got {short(restart_every)}")


def backend_name(backend: Backend) -> str:
    """`fake`, or `tinygrad:<device>`."""
    device = getattr(backend, "device", None)
    return backend.name if device is None else f"{backend.name}:{device}"


def run_demo(
    objects: int = 1500,
    backend: str | Backend = "tinygrad",
    device: str | None = None,
    faults: float = 0.0,
    restart_every: int = 0,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Summary:
    """The reference worker over `objects` synthetic objects on `backend` (a name for
    make_backend, or an opened Backend). Raises WorkerStalled if the backend fails for good."""
    check_demo(objects, faults, restart_every)
    inner = make_backend(backend, device) if isinstance(backend, str) else backend
    worker = device_worker(inner, range(objects), faults, restart_every, seed, seed)
    start = time.perf_counter()
    worker.run(progress)
    return worker.summary(time.perf_counter() - start, backend_name(inner))


def device_worker(
    inner: Backend, ks: Sequence[int], faults: float, restart_every: int, seed: int, fault_seed: int
) -> Worker:
    """A worker for objects `ks` on one device: its fake's pump, its injected faults."""
    pump = fake_pump(inner, fault_seed) if isinstance(inner, FakeBackend) else None
    wrapped = FaultyBackend(inner, rate=faults, seed=fault_seed, random_ops=RANDOM_FAULTS) if faults else inner
    return Worker(wrapped, len(ks), seed=seed, restart_every=restart_every, pump=pump, ks=ks)


#: How long one device's idle pass may block while other devices wait for their turn.
DEVICE_IDLE_S = 0.002


@dataclass
class DeviceRun:
    """One device's part of a multi-device run."""

    device: str
    objects: int  # its share (the objects k with k % devices == its index), or those it redid
    delivered: int
    seconds: float
    objects_per_s: float
    restarts: int
    faults_injected: int
    faults_recovered: int
    stalled: str  # why it gave up (WorkerStalled), or ""


@dataclass
class DevicesSummary:
    objects: int
    delivered: int
    lost: int
    duplicated: int
    wrong: int
    seconds: float
    objects_per_s: float
    redone: int  # objects of a device that gave up, delivered by another one after it
    devices: list[DeviceRun]

    @property
    def clean(self) -> bool:
        return self.lost == self.duplicated == self.wrong == 0 and self.delivered == self.objects


def run_devices(
    objects: int,
    devices: Sequence[str],
    backend: str = "tinygrad",
    faults: float = 0.0,
    restart_every: int = 0,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    make: Callable[[str], Backend] | None = None,
) -> DevicesSummary:
    """One Bridge per device in one process: object k goes to device k % len(devices), each
    device a worker with its own rings, restarts and injected faults, so one that restarts or
    fails does not stop the others. The workers' passes are interleaved in this thread
    (tinygrad is not thread-safe: its compile cache and device context are per thread); each
    producer fills its ring from a thread of its own, and copies run on each device's copy
    thread. A device that gives up for good (WorkerStalled) leaves its undelivered objects to
    the first device that did not: they are redone there once the others finish. Deliveries
    are counted per object across devices."""
    check_demo(objects, faults, restart_every)
    if not devices or len(set(devices)) != len(devices) or any(type(d) is not str for d in devices):
        raise InvalidArgumentError("ARG-1", f"devices must be distinct names, got {short(devices)}")
    make = make or (lambda device: make_backend(backend, None if backend == "fake" else device))
    n = len(devices)
    shares = [range(d, objects, n) for d in range(n)]
    workers = [
        device_worker(make(dev), shares[d], faults, restart_every, seed, seed + d) for d, dev in enumerate(devices)
    ]
    done = [0] * n
    stalled: dict[int, str] = {}
    seconds = [0.0] * n

    def report(d: int) -> Callable[[int], None]:
        def record(delivered: int) -> None:
            done[d] = delivered
            if progress is not None:
                progress(sum(done))

        return record

    start = time.perf_counter()
    running = list(range(n))
    try:
        for d, w in enumerate(workers):
            try:
                w.start()
            except WorkerStalled as e:  # it could not even upload its weights
                stalled[d] = str(e)
                running.remove(d)
        while running:
            for d in list(running):
                try:
                    more = workers[d].tick(report(d), DEVICE_IDLE_S)
                except WorkerStalled as e:
                    stalled[d], more = str(e), False
                if not more:
                    running.remove(d)
                    seconds[d] = time.perf_counter() - start
    finally:
        for w in workers:
            w.stop()
    for d, w in enumerate(workers):
        if d not in stalled:
            w.finish()
    delivered = Counter[int]()
    for w in workers:
        delivered.update(w.delivered)
    runs = [_device_run(devices[d], w, seconds[d], stalled.get(d, "")) for d, w in enumerate(workers)]
    wrong = sum(w.wrong for w in workers)
    leftovers = [k for d in sorted(stalled) for k in shares[d] if k not in delivered]
    healthy = [d for d in range(n) if d not in stalled]
    if leftovers and healthy:
        again = device_worker(make(devices[healthy[0]]), leftovers, faults, restart_every, seed, seed + n)
        began, why = time.perf_counter(), ""
        try:
            again.run()
        except WorkerStalled as e:
            why = str(e)
        delivered.update(again.delivered)
        wrong += again.wrong
        runs.append(_device_run(f"{devices[healthy[0]]} (redoing)", again, time.perf_counter() - began, why))
    total = time.perf_counter() - start
    return DevicesSummary(
        objects=objects,
        delivered=len(delivered),
        lost=objects - len(delivered),
        duplicated=sum(c - 1 for c in delivered.values() if c > 1),
        wrong=wrong,
        seconds=total,
        objects_per_s=len(delivered) / total,
        redone=sum(1 for k in leftovers if k in delivered),
        devices=runs,
    )


def _device_run(device: str, worker: Worker, seconds: float, stalled: str) -> DeviceRun:
    injected = sum(worker.backend.injected.values()) if isinstance(worker.backend, FaultyBackend) else 0
    got = len(worker.delivered)
    return DeviceRun(
        device, worker.objects, got, seconds, got / max(seconds, 1e-9), worker.restarts, injected,
        worker.failures_retried, stalled,
    )  # fmt: skip
