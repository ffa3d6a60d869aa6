"""The reference worker's pipeline: input HostRing -> Bridge -> a tinygrad MLP on zero-copy views
-> output HostRing, with a window of objects in flight.

Objects go `batch` at a time (one by default): a batch is a `Job` (jobs.py) moving through the
stages of `Stage`, by the transitions of `STAGES` only (`Job.move` refuses any other): a slot
of pooled device memory, the upload (async host_to_device of the batch's inputs, one after
another in the input ring), the compute (a TinyJit MLP on zero-copy views, every row of the
batch at once), the download (async device_to_host), delivered object by object. The upload of
the next batch overlaps the compute of this one. A batch pays the per-call costs (the bridge's
calls, TinyJit's arguments, the worker's loop) once for all its objects. The MLP's weights are
uploaded once per generation under their own role.

Device memory is pooled per generation: a slot is an input and an output allocation with their
views, allocated once and reused by object after object (the lifecycle still tracks every copy
and compute on them); a restart frees the pool. The MLP runs under TinyJit with the object's
x and y views as its arguments (TinyJit swaps argument buffers per call) and the weights'
views captured, as a user would write it: one jitted MLP per generation, made again after a
restart (its capture pins the old weights until it goes, VIEW-3). A compute declares the
object's x and y; the weights are only read after their upload, and their views, alive for
the whole generation, pin them.

Ordering is the bridge's (ORDER-1): the download is issued right after the compute, without
waiting for its event; the bridge holds it back until the compute has written what it reads.
The worker still starts a compute only once its upload is done: compute() would wait for the
upload itself, but blocking there would stall the other objects in the window.

No object is lost: inputs are copied with `release=False` and released only once the object's
output is delivered, so a failed or restart-aborted copy is retried in the new generation from
the same host bytes; outputs are verified against numpy and tallied per object, so a duplicate
or a wrong answer is caught.
"""

from __future__ import annotations

import contextlib
import gc
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from devbridge.apps.tally import Delivery, Tally
from devbridge.apps.worker import workload
from devbridge.apps.worker.jobs import Job, Slot, Stage
from devbridge.apps.worker.workload import DEMO_SHAPES, Shapes
from devbridge.args import count
from devbridge.backends.base import Backend
from devbridge.bridge.bridge import Bridge
from devbridge.bridge.events import Event
from devbridge.bridge.trace import Trace
from devbridge.errors import (
    BridgeError,
    DeviceAllocationError,
    DeviceFreeError,
    HostBytesChangedError,
    RingFullError,
    WaitTimeoutError,
)
from devbridge.ring.host import HostRange, HostRing
from devbridge.spec import load as load_spec
from devbridge.types import DeviceHandle, DeviceRange, ObjectSpec, TensorViewSpec

IDLE_WAIT_S = 0.05  # the longest an idle worker blocks before it looks for new objects
#: Failures in a row, with no object delivered in between, after which the backend is taken to
#: fail for good (a device that cannot allocate, say), not by chance: the run ends, it never spins.
GIVE_UP_AFTER = 1000


#: The states an allocation ends in (the spec's terminal states): nothing pins it any more.
TERMINAL = frozenset(name for name, state in load_spec().states.items() if state.terminal)


class WorkerStalled(RuntimeError):
    """The backend kept failing: GIVE_UP_AFTER failures in a row and no object delivered."""


@dataclass
class Summary(Delivery):
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
    #: (--check-host-bytes, --inject-late-writes) uploads whose input was written into under them on
    #: purpose, those the check caught, those it did not, and checks that failed an upload no
    #: write touched; the objects of the uploads it failed are rejected, not delivered nor lost
    late_writes: int = 0
    late_writes_caught: int = 0
    late_writes_missed: int = 0
    false_reports: int = 0
    rejected: int = 0
    #: with `pins_report`: each allocation still pinned at the end and what pins it (PIN-1)
    pinned: list[str] = field(default_factory=list)


class Worker:
    def __init__(
        self,
        backend: Backend,
        objects: int,
        *,
        seed: int = 0,
        shapes: Shapes = DEMO_SHAPES,
        window: int = 4,
        ring_objects: int = 64,  # the input ring holds 64 objects (256 KiB): the producer refills it in bursts
        batch: int = 1,
        restart_every: int = 0,
        pump: Callable[[], None] | None = None,
        ks: Sequence[int] | None = None,
        injected: Callable[[], int] = lambda: 0,
        trace: Trace | None = None,
        check_host_bytes: bool | None = None,
        late_writes: float = 0.0,
    ) -> None:
        """`objects` synthetic objects, numbered 0.. (or those of `ks`: a device's share), moved
        and computed `batch` at a time (the ring holds whole batches: `ring_objects` is rounded
        up to a multiple of `batch`).
        `injected` counts the faults injected so far (the summary reports it); `trace`: the
        timeline its bridge writes its tracks into (devbridge.bridge.trace), if any.
        `check_host_bytes`: its bridge's checking mode (None: the environment's say);
        `late_writes`: the share of uploads whose input the producer writes into while the upload
        may still read it (a deliberate bug, for the check to catch)."""
        ks = range(objects) if ks is None else ks
        batch = count("batch", batch, least=1)
        self.backend, self.objects, self.seed, self.shapes = backend, len(ks), seed, shapes
        self.window, self.restart_every, self.batch = window, restart_every, batch
        ring_objects = -(-ring_objects // batch) * batch
        self.pump = pump or (lambda: None)
        self.pumped = pump is not None  # a fake backend's pump completes events: never block for them
        self.injected = injected
        self.bridge = Bridge(backend, trace=trace, check_host_bytes=check_host_bytes)
        self.late_writes = late_writes
        self.spoils = random.Random(seed ^ 0x5B01)  # which uploads get a late write
        self.spoiled = self.caught = self.missed = self.false_reports = 0
        self.rejected: set[int] = set()  # objects whose upload the host-bytes check failed
        self.in_bytes = shapes.rows * shapes.d_in * 4
        self.out_bytes = shapes.rows * shapes.d_out * 4
        self.space = threading.Condition()
        # the producer is woken once half the ring is free again, not per object: each wake-up is
        # a GIL hand-off between it and this loop (it still retries every 0.05 s by itself)
        self.wake_every = max(1, ring_objects // 2)
        self.weights_np = workload.make_weights(seed, shapes)
        self.check = workload.OutputCheck((batch, shapes.rows, shapes.d_out))
        self.tally = Tally()
        self.deliveries = 0  # deliveries so far, kept as they happen: the loop reads it every pass
        self.failures_retried = 0
        self.failures_in_a_row = 0  # since the last delivery (GIVE_UP_AFTER)
        self.free_failures = 0
        self.restarts = 0
        self.overlapped = 0
        self.producer_blocked_s = 0.0
        self.peak_live = 0
        self.jobs: list[Job] = []
        self.moves: list[tuple[Stage, Stage]] | None = None  # set to a list to record every job's transitions
        self.since_restart = 0  # objects delivered since the last restart (restart_every)
        self.x_view = TensorViewSpec((batch * shapes.rows, shapes.d_in), "float32")
        self.y_view = TensorViewSpec((batch * shapes.rows, shapes.d_out), "float32")
        self.x_spec = ObjectSpec("x", "float32", role="input", view=self.x_view)
        self.y_spec = ObjectSpec("y", "float32", role="output", view=self.y_view)
        self.weights: dict[str, Any] = {}  # name -> live view of the uploaded weight
        self.free_slots: list[Slot] = []  # the pool: slots of this generation no object holds
        self.issued: list[DeviceHandle] = []  # every allocation not known to be over (pins_report)
        self.slots = 0  # slots made in this generation
        self.mlp: Callable[[Any, Any], None] | None = None  # jitted per generation (upload_weights)
        self.weight_ring = HostRing(sum(w.nbytes for w in self.weights_np.values()))
        self.weight_src = {}
        for name, w in self.weights_np.items():
            r = self.weight_ring.reserve(w.nbytes)
            self.weight_ring.view(r)[:] = w.tobytes()
            self.weight_src[name] = r
        self.inputs, self.outputs, self.producer = self.ends(ks, ring_objects)

    def ends(self, ks: Sequence[int], ring_objects: int) -> tuple[HostRing, HostRing, workload.Feed]:
        """The input ring, the output ring, and what fills the input ring: here, rings of this
        process and a producer thread (a worker between processes has shared rings)."""
        inputs = HostRing(ring_objects * self.in_bytes)
        outputs = HostRing(ring_objects * self.out_bytes)
        producer = workload.Producer(inputs, ks, self.seed, self.shapes, self.space, self.weights_np, self.batch)
        return inputs, outputs, producer

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
        if not (self.deliveries + len(self.rejected) < self.objects or self.jobs):
            return False
        self.pump()
        while len(self.jobs) < self.window and (item := producer.take(0 if self.jobs else wait)):
            self.jobs.append(Job(item.ks, item.src, item.answers, record=item.record, moves=self.moves))
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
        # (while objects remain, in flight or to come: how many restarts a run has does not
        # depend on whether the producer had the next object ready at that moment)
        more = self.jobs or self.deliveries + len(self.rejected) < self.objects
        if self.restart_every and self.since_restart >= self.restart_every and more:
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
            self.issued.append(handle)
            src = self.weight_src[name]
            self.retry(self.upload_weight, src, DeviceRange(handle, 0, src.nbytes))
            self.weights[name] = self.bridge.wrap_for_tinygrad(handle, TensorViewSpec(w.shape, "float32"))
        self.mlp = workload.jitted_mlp(self.weights)
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
        self.weights.clear()  # old views must go: they pin old memory (and so does the old MLP's capture)
        self.mlp = None
        self.free_slots.clear()
        self.slots = 0
        self.reported(self.bridge.restart)
        self.restarts += 1
        self.issued = [h for h in self.issued if self.bridge.state(h) not in TERMINAL]  # the live, and the pinned
        for job in self.jobs:
            if job.event is not None and not job.event.done():
                job.old.append(job.event)
            job.slot = None
            job.event = job.computed = None
            if job.stage is not Stage.SLOT:
                job.move(Stage.SLOT)
        self.upload_weights()

    def note_live(self) -> None:
        """Track the peak of live allocations (called where the worker allocates, not per pass)."""
        self.peak_live = max(self.peak_live, self.bridge.stats().live_allocations)

    def take_slot(self) -> Slot | None:
        """A slot from the pool, or a new one while the window allows; None for now (retried)."""
        if self.free_slots:
            return self.free_slots.pop()
        if self.slots >= self.window:
            return None
        try:
            x = self.bridge.alloc_device(self.x_spec, self.batch * self.in_bytes)
        except DeviceAllocationError as e:
            self.failed(e)
            return None
        try:
            y = self.bridge.alloc_device(self.y_spec, self.batch * self.out_bytes)
        except DeviceAllocationError as e:
            self.failed(e)
            self.reported(self.bridge.free_device, x)
            return None
        self.slots += 1
        self.issued += [x, y]
        self.note_live()
        xv, yv = self.bridge.wrap_for_tinygrad(x, self.x_view), self.bridge.wrap_for_tinygrad(y, self.y_view)
        xr, yr = DeviceRange(x, 0, self.batch * self.in_bytes), DeviceRange(y, 0, self.batch * self.out_bytes)
        return Slot(x, y, xv, yv, xr, yr)

    # ------------------------------------------------------------ one batch

    def step(self, job: Job) -> None:
        if job.old:
            job.old = [e for e in job.old if not e.done()]
            if job.old:
                return  # an aborted copy still uses this job's host bytes
        if job.stage is Stage.SLOT:
            job.slot = job.slot or self.take_slot()
            if job.slot is not None:
                self.upload(job)
        elif job.stage is Stage.UPLOAD and self.settled(job):
            self.compute(job)
        elif job.stage is Stage.COMPUTE:  # the output range was not free yet: the download follows the compute
            self.download(job)
        elif job.stage is Stage.DOWNLOAD and self.settled(job):
            self.deliver(job)

    def settled(self, job: Job) -> bool:
        """The job's event is done; on a failure the stage is retried (and False returned)."""
        assert job.event is not None
        if not job.event.done():
            return False
        if job.stage is Stage.DOWNLOAD and job.computed is not None and job.computed.error is not None:
            # the download ran on the bytes as the failed compute left them (ORDER-1): start over
            # from the kept input, in the same slot (the output range is reused)
            self.failed(job.computed.error)
            job.computed = None
            self.upload(job)
            return False
        if job.event.error is None:
            if job.spoiled and job.stage is Stage.UPLOAD:
                self.missed += 1  # the upload read the written bytes and nothing said so
                job.spoiled = False
            return True
        if isinstance(job.event.error, HostBytesChangedError) and job.stage is Stage.UPLOAD:
            self.reject(job)
            return False
        self.failed(job.event.error)
        (self.upload if job.stage is Stage.UPLOAD else self.download)(job)
        return False

    def attempt(self, job: Job, stage: Stage, copy: Callable[[], Event]) -> None:
        """Start a copy and move the job to `stage`. A copy that fails to start (a synchronous
        backend failure) is counted, and the job goes where that copy is retried on a later tick:
        SLOT for an upload, COMPUTE for a download (its old event is no longer its stage's)."""
        try:
            job.event = copy()
        except BridgeError as e:
            if e.rule != "COPY-F":
                raise
            self.failed(e)
            retry = Stage.SLOT if stage is Stage.UPLOAD else Stage.COMPUTE
            if job.stage is not retry:
                job.move(retry)
            return
        job.move(stage)

    def part(self, job: Job, whole: DeviceRange, nbytes: int) -> DeviceRange:
        """The slot's range a batch's copy moves: all of it for a full batch (the range made with
        the slot), its first `nbytes` for a short last batch."""
        return whole if len(job.ks) == self.batch else DeviceRange(whole.handle, 0, nbytes)

    def upload(self, job: Job) -> None:
        assert job.slot is not None
        x = self.part(job, job.slot.xr, job.src.nbytes)

        def copy() -> Event:
            return self.bridge.host_to_device(job.src, x, sync=False, release=False)

        if self.late_writes and not job.old and self.spoils.random() < self.late_writes:
            self.spoil(job, copy)
        else:
            self.attempt(job, Stage.UPLOAD, copy)

    def spoil(self, job: Job, copy: Callable[[], Event]) -> None:
        """The deliberate bug of `--inject-late-writes`: the producer's array over the batch's
        input, made before the upload, writes into it while the upload may still read it. The
        device's copies are held meanwhile (where the backend can hold them), so that the write
        lands before the device reads: what the demo counts as caught or missed is every write."""
        kept = self.inputs.array(job.src, np.uint8)
        hold = getattr(self.backend, "hold_copies", None)
        with hold() if hold is not None else contextlib.nullcontext():
            self.attempt(job, Stage.UPLOAD, copy)
            if job.stage is Stage.UPLOAD:  # the upload is in flight
                kept[3] ^= 0xC0  # the first input's sign and exponent: a wrong answer if the device reads it
                job.spoiled = True
                self.spoiled += 1

    def reject(self, job: Job) -> None:
        """An upload the host-bytes check failed: the batch's bytes are not what the producer
        made, so its objects are rejected, not delivered; its input goes back to the ring and its
        slot to the pool."""
        assert job.slot is not None
        if job.spoiled:
            self.caught += 1
        else:
            self.false_reports += 1
        self.rejected.update(job.ks)
        self.inputs.release(job.src)
        self.free_slots.append(job.slot)
        job.move(Stage.REJECTED)
        self.jobs.remove(job)
        with self.space:  # its input's room is free again
            self.space.notify_all()

    def compute(self, job: Job) -> None:
        slot, mlp = job.slot, self.mlp
        assert slot is not None and mlp is not None
        uploading = (j for j in self.jobs if j is not job and j.stage is Stage.UPLOAD)
        self.overlapped += any(j.event is not None and not j.event.done() for j in uploading)
        # x and y only: the weights are read by every compute but never written after their upload
        # (no copy to order against), and their live views pin them for the generation (VIEW-3)
        with self.bridge.compute(slot.x, slot.y) as event:
            mlp(slot.xv, slot.yv)
        job.event = job.computed = event
        job.move(Stage.COMPUTE)
        self.download(job)  # at once: held back by the bridge until the compute event completes

    def download(self, job: Job) -> None:
        assert job.slot is not None
        if job.out is None:
            try:
                job.out = self.reserve_output(job)
            except RingFullError:
                return  # the output ring drains as objects are delivered
        y, out = self.part(job, job.slot.yr, job.out.nbytes), job.out
        self.attempt(job, Stage.DOWNLOAD, lambda: self.bridge.device_to_host(y, out, sync=False))

    def reserve_output(self, job: Job) -> HostRange:
        """Room in the output ring for the job's outputs; RingFullError if none yet."""
        return self.outputs.reserve(len(job.ks) * self.out_bytes)

    def delivered(self, job: Job) -> None:
        """The job's objects are delivered: count them, give its slot back, drop the job."""
        assert job.slot is not None
        self.deliveries += len(job.ks)
        self.failures_in_a_row = 0
        self.free_slots.append(job.slot)  # the next batch's upload follows this download (ORDER-1)
        job.move(Stage.DELIVERED)
        self.jobs.remove(job)

    def deliver(self, job: Job) -> None:
        assert job.out is not None and job.slot is not None
        got = np.frombuffer(self.outputs.view(job.out), dtype=np.float32).reshape(len(job.ks), *job.answers.shape[1:])
        for k, right in zip(job.ks, self.check(got, job.answers), strict=True):
            self.tally.deliver(k, right)
        self.outputs.release(job.out)  # the consumer took it
        self.inputs.release(job.src)  # the objects are done: their inputs may go
        before = self.deliveries
        self.delivered(job)
        if before // self.wake_every != self.deliveries // self.wake_every:  # the producer refills in bursts
            with self.space:
                self.space.notify_all()

    # ------------------------------------------------------------ results

    def pins_report(self) -> list[str]:
        """Each allocation the worker made that is still held at the end, and what holds it: the
        uses in flight by kind and the tinygrad objects that still reach a view's memory
        (`Bridge.pins(holders=True)`, after a collection)."""
        gc.collect()
        self.reported(self.bridge.poll)
        lines = []
        for h in self.issued:
            pins = self.bridge.pins(h, holders=True)
            if pins.state in TERMINAL:
                continue
            kinds = {"copies in": pins.copies_in, "copies out": pins.copies_out, "computes": pins.computes}
            uses = ", ".join(f"{kind} {n}" for kind, n in {**kinds, "views": pins.views}.items() if n) or "no use"
            held = ", ".join(f"{kind} {n}" for kind, n in sorted(pins.holders.items()) if n)
            waited = f", waiting {pins.waiting_s:.1f} s" if pins.waiting_s else ""
            lines.append(
                f"#{h.id} {h.spec.name} (generation {h.generation}): {pins.state}{waited}; {uses}"
                + (f"; reached by {held}" if held else "")
            )
        return lines

    def summary(self, seconds: float, backend_name: str) -> Summary:
        stats = self.bridge.stats()
        delivery = self.tally.delivery(self.objects)
        delivery.lost -= len(self.rejected - set(self.tally.delivered))  # (rejected: accounted for)
        got = delivery.delivered
        return Summary(
            **vars(delivery),
            bytes_in=got * self.in_bytes,
            bytes_out=got * self.out_bytes,
            seconds=seconds,
            objects_per_s=got / seconds,
            gb_per_s_in=got * self.in_bytes / seconds / 1e9,
            gb_per_s_out=got * self.out_bytes / seconds / 1e9,
            peak_live_allocations=self.peak_live,
            allocations=stats.allocs,
            deferred_frees=stats.deferred_frees,
            faults_injected=self.injected(),
            faults_recovered=self.failures_retried,
            free_failures=self.free_failures,
            restarts=self.restarts,
            overlapped_computes=self.overlapped,
            producer_blocked_s=self.producer_blocked_s,
            unreleased_input_bytes=self.inputs.head - self.inputs.cursor,
            unreleased_output_bytes=self.outputs.head - self.outputs.cursor,
            backend=backend_name,
            late_writes=self.spoiled,
            late_writes_caught=self.caught,
            late_writes_missed=self.missed,
            false_reports=self.false_reports,
            rejected=len(self.rejected),
        )
