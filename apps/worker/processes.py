"""The reference worker as processes: producer processes fill an input shared ring, one worker
process per device takes each batch, uploads it, computes, downloads into an output shared ring
and commits the output naming the input it finishes (RING-7), and a collector process takes
every output, checks it against numpy and tallies it. The main process supervises
(devbridge.apps.supervisor): it may kill a worker (SIGKILL) or stop it (SIGSTOP), start a
replacement, and continue the stopped one, which the rings then fence (GEN-2).

Records carry their objects' ids: an input record is `[n, k_0 .. k_(batch-1)]` (int64) and the
n objects' inputs; an output record is `[input sequence number, n, k_0 .. k_(batch-1)]` and the
n outputs. What a process reads from a ring is checked before use (a malformed record is
counted and released, never computed on).

Counters cross processes in shared memory without locks (a process can die at any instruction,
holding none): each worker writes its own row, by its consumer generation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import tempfile
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from devbridge.apps.backends import make_backend
from devbridge.apps.supervisor import SPAWN, Supervisor
from devbridge.apps.tally import Delivery, Tally
from devbridge.apps.worker.drivers import RANDOM_FAULTS, check_demo, check_run
from devbridge.apps.worker.jobs import Job
from devbridge.apps.worker.pipeline import Worker
from devbridge.apps.worker.workload import (
    DEMO_SHAPES,
    Batch,
    OutputCheck,
    Shapes,
    make_input,
    make_weights,
    one_blas_thread,
    reference_mlp,
)
from devbridge.args import count, refuse
from devbridge.backends.base import Backend
from devbridge.bridge.trace import Trace, TraceClock, ends_of_open, read_cut
from devbridge.errors import BridgeError, InvalidArgumentError, RingFullError, StaleHandleError, WaitTimeoutError, short
from devbridge.ring.host import HostRange, HostRing
from devbridge.ring.shared import RECLAIM_EVERY_S, SharedRing
from devbridge.testing import FakeBackend, FaultyBackend, fake_pump

#: The workers' counters, one row per worker process (by its consumer generation).
FIELDS = (
    "redelivered", "finished_before", "fenced", "malformed", "faults_injected", "faults_recovered", "restarts",
    "delivered", "busy_ns",  # objects it delivered, and the time from its first take to its last commit
)  # fmt: skip
ROWS = 8192
#: Input records the input ring holds, and outputs the output ring holds, in batches.
RING_BATCHES = 64


def _attach(name: str) -> SharedRing:
    return _shared(HostRing.attach(name))


def _shared(ring: HostRing) -> SharedRing:
    assert isinstance(ring, SharedRing)  # (a ring with a name is shared)
    return ring


def _words(header: memoryview) -> list[int]:
    """A record's header as ints (int64, native order)."""
    words = array("q")
    words.frombytes(header)
    return words.tolist()


def _row(generation: int, devices: int, index: int) -> int:
    """The first counter of the worker of device `index` that is its ring's consumer `generation`."""
    return ((generation * devices + index) % ROWS) * len(FIELDS)


@dataclass(frozen=True)
class Plan:
    """What every process of a run is told (picklable: it crosses `spawn`)."""

    objects: int
    batch: int
    seed: int
    devices: int = 1  # worker processes, a pair of rings each
    shapes: Shapes = DEMO_SHAPES

    @property
    def in_bytes(self) -> int:
        return self.shapes.rows * self.shapes.d_in * 4

    @property
    def out_bytes(self) -> int:
        return self.shapes.rows * self.shapes.d_out * 4

    @property
    def in_header(self) -> int:
        return 8 * (1 + self.batch)

    @property
    def out_header(self) -> int:
        return 8 * (2 + self.batch)

    def header(self, *words: int, ks: Sequence[int]) -> bytes:
        """A record's header: `words`, the count of `ks`, `ks`, zeros up to `plan.batch` ids."""
        return array("q", [*words, len(ks), *ks, *[0] * (self.batch - len(ks))]).tobytes()

    def objects_of(self, header: list[int], at: int, nbytes: int, each: int) -> list[int] | None:
        """The object ids a record's header names (`header[at]` is their count), or None if the
        header and the record's size do not agree with a record this run makes."""
        n = header[at]
        if not 1 <= n <= self.batch or nbytes != 8 * (at + 1 + self.batch) + n * each:
            return None
        ks = header[at + 1 : at + 1 + n]
        return ks if all(0 <= k < self.objects for k in ks) else None


# ------------------------------------------------------------ producers


def produce(plan: Plan, ring_names: Sequence[str], ks: Sequence[int], stop: Any) -> None:
    """A producer process: writes objects `ks` into the input rings (object k into ring
    k % len(ring_names), one per device), `plan.batch` at a time."""
    rings = [HostRing.attach(name) for name in ring_names]
    try:
        for d, ring in enumerate(rings):
            mine = [k for k in ks if k % len(rings) == d]
            xs = np.stack([make_input(plan.seed, k, plan.shapes) for k in mine]) if mine else None
            for i in range(0, len(mine), plan.batch):
                part = mine[i : i + plan.batch]
                r = _reserve(ring, plan.in_header + len(part) * plan.in_bytes, stop)
                if r is None:
                    return
                view = ring.view(r)
                view[: plan.in_header] = plan.header(ks=part)
                assert xs is not None
                view[plan.in_header :] = xs[i : i + len(part)].data.cast("B")
                del view
                ring.commit(r)
    finally:
        for ring in rings:
            ring.close()


def _reserve(ring: HostRing, nbytes: int, stop: Any) -> HostRange | None:
    while not stop.value:
        with contextlib.suppress(RingFullError):
            return ring.reserve(nbytes, timeout=0.1)
    return None


# ------------------------------------------------------------ the worker


class RingFeed:
    """The worker's input end of a shared ring, as its loop sees a producer (workload.Feed):
    records taken, their headers checked, redelivered ones whose output is committed already
    released at once."""

    def __init__(
        self, plan: Plan, inputs: SharedRing, outputs: SharedRing, counters: Any, stop: Any, index: int = 0
    ) -> None:
        self.plan, self.inputs, self.outputs, self.counters, self.stop_flag = plan, inputs, outputs, counters, stop
        self.index = index  # its device's, among the run's
        self.stop = threading.Event()
        self.blocked_s = 0.0
        self.ready = False  # (records wait in the shared ring, not here)
        self.row = _row(0, plan.devices, index)  # (its own once it consumes)
        self.taken = 0  # batches handed to the worker
        self.first_take = 0  # when the first was (perf_counter_ns)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[self.row + FIELDS.index(name)] += n

    def start(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass

    def is_alive(self) -> bool:
        return not (self.stop.is_set() or self.stop_flag.value)

    def take(self, timeout: float) -> Batch | None:
        while True:
            try:
                r = self.inputs.take(timeout)
            except WaitTimeoutError:
                return None
            if r.redelivered:
                self.count("redelivered")
                if self.outputs.finished(r) is not None:  # its output was committed before a crash
                    self.inputs.release(r)
                    self.count("finished_before")
                    timeout = 0
                    continue
            header = _words(self.inputs.view(r)[: self.plan.in_header])
            ks = self.plan.objects_of(header, 0, r.nbytes, self.plan.in_bytes)
            if ks is None:  # not a record this run's producers write: never computed on
                self.inputs.release(r)
                self.count("malformed")
                timeout = 0
                continue
            if not self.taken:
                self.first_take = time.perf_counter_ns()
            self.taken += 1
            return Batch(ks, r.sub(self.plan.in_header, len(ks) * self.plan.in_bytes), None, record=r)


class RingWorker(Worker):
    """The reference worker between shared rings: its batches come from a RingFeed, and each
    output is committed naming the input record it finishes (one step: RING-7). Outputs are
    checked by the collector, not here."""

    def __init__(self, backend: Backend, feed: RingFeed, **options: Any) -> None:
        self.feed = feed
        self.next_reclaim = 0.0  # when a full output ring is next looked at for dead reservations
        self.last_commit = 0  # when the last output was committed (perf_counter_ns)
        plan = feed.plan
        super().__init__(backend, 1 << 62, seed=plan.seed, shapes=plan.shapes, batch=plan.batch, **options)

    def ends(self, ks: Sequence[int], ring_objects: int) -> tuple[HostRing, HostRing, RingFeed]:
        return self.feed.inputs, self.feed.outputs, self.feed

    def warm_up(self) -> None:
        """Upload the weights and call the jitted MLP on a pooled slot until TinyJit replays it
        (its first call runs, its second captures, its third makes the replay's executor): before
        this worker takes over, so that a new worker process's first objects do not wait for
        that. A failure here is left to the loop."""
        self.upload_weights()
        slot = self.take_slot()
        if slot is None or self.mlp is None:
            return
        with contextlib.suppress(BridgeError):
            for _ in range(3):
                with self.bridge.compute(slot.x, slot.y) as event:
                    self.mlp(slot.xv, slot.yv)
                event.wait()
        self.free_slots.append(slot)

    def start(self) -> None:
        self.since_restart = 0  # (the weights are uploaded by warm_up)

    def reserve_output(self, job: Job) -> HostRange:
        plan, record = self.feed.plan, job.record
        assert record is not None and record.seq is not None
        nbytes = plan.out_header + len(job.ks) * plan.out_bytes
        try:
            o = self.outputs.reserve(nbytes)
        except RingFullError:
            # a predecessor that died may hold output reservations it never committed: they go
            # back (at most every RECLAIM_EVERY_S: it reads /proc for each live reservation)
            now = time.monotonic()
            if now < self.next_reclaim:
                raise
            self.next_reclaim = now + RECLAIM_EVERY_S
            if not self.feed.outputs.reclaim():
                raise
            o = self.outputs.reserve(nbytes)
        self.outputs.view(o)[: plan.out_header] = plan.header(record.seq, ks=job.ks)
        job.out_record = o
        return o.sub(plan.out_header, len(job.ks) * plan.out_bytes)

    def deliver(self, job: Job) -> None:
        assert job.out_record is not None and job.record is not None
        self.outputs.commit(job.out_record, finishes=job.record)  # the output, and its input's release
        self.last_commit = time.perf_counter_ns()
        self.delivered(job)
        self.report()

    def quiesce(self, timeout: float = 5.0) -> None:
        """Wait (at most `timeout` seconds) for the copies and computes of every job in flight:
        before this process lets go of the rings' memory, no copy still reads or writes it (a
        held download would otherwise be launched into a ring already closed)."""
        events = [e for job in self.jobs for e in (job.event, job.computed, *job.old) if e is not None]
        with contextlib.suppress(BridgeError):
            self.bridge.wait_all(events, timeout=timeout)

    def report(self) -> None:
        """This worker's fault and restart counts, in its row."""
        row, counters = self.feed.row, self.feed.counters
        counters[row + FIELDS.index("faults_injected")] = self.injected()
        counters[row + FIELDS.index("faults_recovered")] = self.failures_retried
        counters[row + FIELDS.index("restarts")] = self.restarts
        counters[row + FIELDS.index("delivered")] = self.deliveries
        if self.deliveries:
            counters[row + FIELDS.index("busy_ns")] = self.last_commit - self.feed.first_take


@dataclass(frozen=True)
class WorkerSpec:
    """One worker process's device and rings (picklable)."""

    plan: Plan
    inputs: str
    outputs: str
    backend: str
    device: str | None
    faults: float
    restart_every: int
    fault_seed: int
    name: str = "worker-0"
    index: int = 0  # its device's, among the run's
    #: threads a kernel of tinygrad's CPU device is split over (None: tinygrad's default, one per
    #: core). One: the producers and the collector run on the same cores, and a kernel split over
    #: every core waits for its slowest part, which any other process on a core delays.
    kernel_threads: int | None = 1
    trace_dir: str | None = None  # each worker process writes its bridge's timeline there
    #: where a worker whose backend cannot be made (a device that does not open) leaves why,
    #: for the run to end with that error instead of starting it again and again
    failed: Any = None  # a shared char array of the run's


def _part(trace_dir: str, name: str) -> Trace:
    """A worker process's own timeline, `name`.json in `trace_dir`, its clock beside it (the main
    process puts the parts together: Trace.include)."""
    part = Trace(os.path.join(trace_dir, f"{name}.json"))
    with open(os.path.join(trace_dir, f"{name}.clock"), "w", encoding="utf-8") as f:
        json.dump(dataclasses.asdict(part.clock), f)
    return part


def _merge_parts(trace: Trace, trace_dir: str) -> None:
    """Every worker process's timeline into `trace`, a killed one's ended where it was cut."""
    for name in sorted(n.removesuffix(".clock") for n in os.listdir(trace_dir) if n.endswith(".clock")):
        with open(os.path.join(trace_dir, f"{name}.clock"), encoding="utf-8") as f:
            clock = TraceClock(**json.load(f))
        try:
            with open(os.path.join(trace_dir, f"{name}.json"), encoding="utf-8") as f:
                events = read_cut(f.read())
        except FileNotFoundError:
            continue
        last = max((e["ts"] for e in events if isinstance(e.get("ts"), int | float)), default=0.0)
        pid = int(name.rsplit("-", 1)[1])
        trace.include([*events, *ends_of_open(events, last)], pid=pid, label=name, clock=clock)


def _tinygrad_settings(spec: WorkerSpec) -> None:
    """tinygrad's settings in a worker process, where the user set none: CPU kernels on
    `spec.kernel_threads` threads; the worker's device as tinygrad's default, so that tensors
    made without a device (the MLP's constants) go to it and tinygrad does not open every device
    it knows to find a default (a quarter of a second in each new worker process here)."""
    import tinygrad.helpers

    if spec.kernel_threads is not None and "NUM_CPU_THREADS" not in os.environ:
        tinygrad.helpers.NUM_CPU_THREADS.value = spec.kernel_threads
    device = "CPU" if spec.backend == "fake" else spec.device  # (the fake's views are CPU tensors)
    default = getattr(tinygrad.helpers, "DEV", None)  # (a setting of recent tinygrad versions)
    if device is not None and default is not None and "DEV" not in os.environ:
        default.value = device


def work(spec: WorkerSpec, counters: Any, stop: Any, make: Callable[..., RingWorker] = RingWorker) -> None:
    """A worker process: attach both rings, take over as the input ring's consumer (what a
    predecessor took and did not finish comes again), and run until told to stop. Fenced by a
    newer worker (GEN-2), it counts that and ends, having changed nothing."""
    _tinygrad_settings(spec)
    inputs, outputs = _attach(spec.inputs), _attach(spec.outputs)
    part: Trace | None = None
    quiet: Callable[[], None] | None = None
    try:
        feed = RingFeed(spec.plan, inputs, outputs, counters, stop, spec.index)
        try:
            inner = make_backend(spec.backend, spec.device)
        except InvalidArgumentError as e:  # a configuration no restart mends: the run ends with it
            if spec.failed is None:
                raise
            spec.failed.value = e.detail.encode()[: len(spec.failed) - 1]
            return
        pump = fake_pump(inner, spec.fault_seed) if isinstance(inner, FakeBackend) else None
        backend: Backend = inner
        injected: Callable[[], int] = lambda: 0  # noqa: E731
        if spec.faults:
            faulty = FaultyBackend(inner, rate=spec.faults, seed=spec.fault_seed, random_ops=RANDOM_FAULTS)
            backend, injected = faulty, lambda: sum(faulty.injected.values())
        if spec.trace_dir is not None:
            part = _part(spec.trace_dir, f"{spec.name}-{os.getpid()}")
        worker = make(backend, feed, restart_every=spec.restart_every, pump=pump, injected=injected, trace=part)
        quiet = worker.quiesce
        try:
            worker.warm_up()
            inputs.consume()
            feed.row = _row(inputs.generation, spec.plan.devices, spec.index)
            worker.run()
        except StaleHandleError as e:
            if e.rule != "GEN-2":
                raise
            feed.count("fenced")
        worker.report()
    finally:
        if quiet is not None:
            quiet()
        if part is not None:
            part.close()
        inputs.close()
        outputs.close()


# ------------------------------------------------------------ the collector


def collect(plan: Plan, ring_names: Sequence[str], delivered: Any, finish: Any, results: Any) -> None:
    """The collector process: takes every output from the output rings, checks it against
    numpy's answer, tallies it by object and by input record, and releases it; sends its tally
    through `results` once `finish` is set and the rings are drained."""
    rings = [HostRing.attach(name) for name in ring_names]
    try:
        for ring in rings:
            ring.consume()
        weights = make_weights(plan.seed, plan.shapes)
        with one_blas_thread():
            answers = np.stack(
                [reference_mlp(make_input(plan.seed, k, plan.shapes), weights) for k in range(plan.objects)]
            )
        check = OutputCheck((plan.batch, plan.shapes.rows, plan.shapes.d_out))
        tally, seen, malformed = Tally(), Counter[tuple[int, int]](), 0
        wait = 0.05 / len(rings)
        while True:
            took = False
            for d, ring in enumerate(rings):
                try:
                    r = ring.take(wait)
                except WaitTimeoutError:
                    continue
                took = True
                view = ring.view(r)
                header = _words(view[: plan.out_header])
                ks = plan.objects_of(header, 1, r.nbytes, plan.out_bytes)
                if ks is None:
                    malformed += 1
                else:
                    seen[d, header[0]] += 1
                    got = np.frombuffer(view[plan.out_header :], np.float32).reshape(len(ks), *answers.shape[1:])
                    for k, right in zip(ks, check(got, answers[ks]), strict=True):
                        tally.deliver(k, right)
                del view, header
                ring.release(r)
                delivered.value = len(tally)
            if not took and finish.value:
                break
        repeated = sum(n - 1 for n in seen.values())
        results.send((dict(tally.delivered), sorted(tally.wrong), repeated, malformed))
    finally:
        for ring in rings:
            ring.close()
        results.close()


# ------------------------------------------------------------ the main process


@dataclass
class ProcessSummary(Delivery):
    seconds: float
    objects_per_s: float
    processes: int  # producer processes
    devices: list[str]  # one worker process each
    kills: int  # workers killed (SIGKILL) and started again
    hangs: int  # workers stopped (SIGSTOP), replaced, then continued
    worker_starts: int  # worker processes started, the first ones included
    redelivered: int  # input records delivered again to a new worker
    finished_before: int  # of them, already finished by an output committed before a crash
    fenced: int  # workers that woke after their replacement took over, and were refused (GEN-2)
    repeated_inputs: int  # input records the collector saw an output of more than once
    malformed: int  # records refused by the worker or the collector (never computed on)
    faults_injected: int
    faults_recovered: int
    restarts: int  # bridge restarts inside workers (--restart-every)
    #: objects delivered per second of a worker's own time, from its first take to its last
    #: commit (start-up and the producers' head start left out)
    worker_objects_per_s: float
    worker_deliveries: int  # objects the workers delivered, by their own counts (one row each)
    backend: str
    leftover_segments: list[str] = field(default_factory=list)  # this run's names still in /dev/shm


def run_processes(
    objects: int = 1500,
    processes: int = 2,
    backend: str = "tinygrad",
    devices: Sequence[str | None] = (None,),
    faults: float = 0.0,
    restart_every: int = 0,
    kill_every: int = 0,
    hang_every: int = 0,
    seed: int = 0,
    batch: int = 1,
    progress: Callable[[int], None] | None = None,
    work_target: Callable[..., None] = work,
    trace: str | None = None,
) -> ProcessSummary:
    """`objects` synthetic objects through `processes` producer processes, one worker process
    per device of `devices` (object k to device k % len(devices), each with its own input and
    output ring) and a collector process. Each time `kill_every` more objects are delivered, a
    worker is killed (SIGKILL) and its supervisor starts it again; each time `hang_every` more
    are, a worker is stopped (SIGSTOP), replaced, and continued once its replacement took over.
    Every child is reaped and every ring unlinked at the end, however it ends. With `trace` (a
    path), each worker process's bridge writes its timeline, all put together there at the end."""
    objects, processes, kill_every, hang_every, seed, devices = _checked(
        objects, processes, backend, devices, faults, restart_every, kill_every, hang_every, seed, batch, progress
    )
    timeline = None if trace is None else Trace(trace)
    with contextlib.ExitStack() as cleanup:
        trace_dir = None
        if timeline is not None:
            cleanup.callback(timeline.close)
            trace_dir = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="devbridge-trace-"))
        summary = _run_processes(
            objects, processes, backend, devices, faults, restart_every, kill_every, hang_every, seed, batch,
            progress, work_target, trace_dir,
        )  # fmt: skip
        if timeline is not None and trace_dir is not None:
            _merge_parts(timeline, trace_dir)
        return summary


def _checked(
    objects: object,
    processes: object,
    backend: object,
    devices: object,
    faults: object,
    restart_every: object,
    kill_every: object,
    hang_every: object,
    seed: object,
    batch: object,
    progress: object,
) -> tuple[int, int, int, int, int, list[str | None]]:
    """The run's options, checked before any process or ring is made (ARG-1)."""
    check_demo(objects, faults, restart_every, batch, seed, progress)
    named = check_run(backend, devices)
    if backend != "fake" and len(set(named)) != len(named):
        refuse(f"devices must be distinct, got {short(devices)}")
    return (
        count("objects", objects, least=1),
        count("processes", processes, least=1),
        count("kill_every", kill_every, note=" (0: never)"),
        count("hang_every", hang_every, note=" (0: never)"),
        count("seed", seed),
        named,
    )


def _run_processes(
    objects: int,
    processes: int,
    backend: str,
    devices: Sequence[str | None],
    faults: float,
    restart_every: int,
    kill_every: int,
    hang_every: int,
    seed: int,
    batch: int,
    progress: Callable[[int], None] | None,
    work_target: Callable[..., None],
    trace_dir: str | None,
) -> ProcessSummary:
    plan = Plan(objects, batch, seed, len(devices))
    tag = f"devbridge-demo-{os.getpid()}-{random.getrandbits(32):08x}"
    n = len(devices)
    names = [(f"{tag}-in{d}", f"{tag}-out{d}") for d in range(n)]
    counters = SPAWN.RawArray("q", ROWS * len(FIELDS))
    stop, finish, delivered = SPAWN.RawValue("b", 0), SPAWN.RawValue("b", 0), SPAWN.RawValue("q", 0)
    receive, send = SPAWN.Pipe(duplex=False)
    failed = SPAWN.RawArray("c", 1024)
    rings: list[tuple[SharedRing, SharedRing]] = []
    kills_allowed = objects // kill_every if kill_every else 0
    # intended kills are deaths too: the backoff stays short, and the limit above them
    supervisor = Supervisor(
        rings=tuple(name for pair in names for name in pair), backoff=0.01, max_backoff=0.05,
        max_restarts=kills_allowed + 100,
    )  # fmt: skip
    kills = hangs = 0
    start = time.perf_counter()
    with supervisor, supervisor.signals():
        in_size, out_size = plan.in_header + batch * plan.in_bytes, plan.out_header + batch * plan.out_bytes
        for i, o in names:
            rings.append(
                (
                    _shared(HostRing.create(i, RING_BATCHES * in_size, records=RING_BATCHES * 2)),
                    _shared(HostRing.create(o, RING_BATCHES * out_size, records=RING_BATCHES * 2)),
                )
            )
        supervisor.spawn("collector", collect, plan, [o for _, o in names], delivered, finish, send)
        for p in range(processes):
            supervisor.spawn(f"producer-{p}", produce, plan, [i for i, _ in names], range(p, objects, processes), stop)
        workers = []
        for d, ((i, o), device) in enumerate(zip(names, devices, strict=True)):
            workers.append(f"worker-{d}")
            spec = WorkerSpec(
                plan, i, o, backend, device, faults, restart_every, seed + d, workers[-1], d,
                trace_dir=trace_dir, failed=failed,
            )  # fmt: skip
            supervisor.spawn(workers[-1], work_target, spec, counters, stop, restart=True)
        next_kill, next_hang, shown = kill_every, hang_every, 0
        producers = [f"producer-{p}" for p in range(processes)]
        while delivered.value < objects:
            supervisor.check(timeout=0.01)
            if failed.value:  # a worker's backend cannot be made: the rings and children go on the way out
                for pair in rings:
                    for ring in pair:
                        ring.close()
                raise InvalidArgumentError("ARG-1", failed.value.decode(errors="replace"))
            if not supervisor.running("collector") or any(supervisor.exitcode(p) for p in producers):
                break  # (what never came is reported lost)
            done = delivered.value
            if progress is not None and done != shown:
                progress(shown := done)
            if done >= objects:
                break
            if kill_every and done >= next_kill:
                supervisor.kill(workers[kills % n])
                kills, next_kill = kills + 1, next_kill + kill_every
            # each device's worker in turn, or the next that is its ring's consumer now
            turn = [(hangs + t) % n for t in range(n)] if hang_every and done >= next_hang else []
            if any(hang(supervisor, workers[d], *rings[d]) for d in turn):
                hangs, next_hang = hangs + 1, next_hang + hang_every
        if progress is not None:
            progress(delivered.value)
        stop.value = 1  # the workers end once idle, the producers at once
        _wait_for(supervisor, workers)
        finish.value = 1
        got: tuple[dict[int, int], list[int], int, int] | None = None
        if receive.poll(30):
            got = receive.recv()
        starts = sum(1 + supervisor.restarts(w) for w in workers)
        seconds = time.perf_counter() - start
        for pair in rings:
            for ring in pair:
                ring.close()
    leftover = sorted(name for pair in names for name in pair if os.path.exists(f"/dev/shm/{name}"))
    by_object, wrong, repeated, malformed = got if got is not None else ({}, [], 0, 0)
    tally = Tally(Counter(by_object), set(wrong))
    sums = {name: sum(counters[r * len(FIELDS) + j] for r in range(ROWS)) for j, name in enumerate(FIELDS)}
    return ProcessSummary(
        **vars(tally.delivery(objects)),
        seconds=seconds,
        objects_per_s=len(tally) / seconds,
        processes=processes,
        devices=[d or "default" for d in devices],
        kills=kills,
        hangs=hangs,
        worker_starts=starts,
        redelivered=sums["redelivered"],
        finished_before=sums["finished_before"],
        fenced=sums["fenced"],
        repeated_inputs=repeated,
        malformed=malformed + sums["malformed"],
        faults_injected=sums["faults_injected"],
        faults_recovered=sums["faults_recovered"],
        restarts=sums["restarts"],
        worker_objects_per_s=sums["delivered"] / max(sums["busy_ns"] / 1e9, 1e-9),
        worker_deliveries=sums["delivered"],
        backend=backend,
        leftover_segments=leftover,
    )


def _wait_for(supervisor: Supervisor, names: Sequence[str], timeout: float = 60.0) -> None:
    """Until the children `names` ended (a worker killed meanwhile is started again, and ends)."""
    deadline = time.monotonic() + timeout
    while any(supervisor.running(name) for name in names) and time.monotonic() < deadline:
        supervisor.check(timeout=0.05)


def _until_stopped(pid: int) -> bool:
    """Block until child `pid` is stopped (True) or has ended (False; its exit is left for the
    supervisor to reap). A stop's report is taken, so that the next stop is reported anew."""
    try:
        info = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
        if info is None or info.si_code != os.CLD_STOPPED:
            return False
        os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG)
    except ChildProcessError:  # (reaped already)
        return False
    return True


def hang(supervisor: Supervisor, name: str, inputs: SharedRing, outputs: SharedRing, wait: float = 60.0) -> bool:
    """Stop worker `name` (SIGSTOP) at a moment it holds neither ring's lock, start a replacement,
    and continue the stopped one (SIGCONT) once the replacement is the input ring's consumer:
    from then on the rings refuse the old one (GEN-2). False (and nothing done) while the
    worker is not yet the input ring's consumer: one stopped before its `consume` would take
    over again when continued, as a newer worker would."""
    pid = supervisor.pid(name)
    if pid is None or inputs.stats()["consumer_pid"] != pid:
        return False
    for _ in range(1000):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        if not _until_stopped(pid):
            return False  # it died meanwhile: nothing to hang
        if not (inputs.lock_held() or outputs.lock_held()):
            break
        os.kill(pid, signal.SIGCONT)  # stopped holding a lock: every other user would wait
        time.sleep(random.uniform(0, 0.002))
    generation = inputs.generation
    supervisor.replace(name)
    deadline = time.monotonic() + wait
    while inputs.generation == generation and time.monotonic() < deadline:
        supervisor.check(timeout=0.01)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    return True
