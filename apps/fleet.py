"""The fleet: N Ray actors, each a worker with its own Bridge on its own device, fed batches of
objects by one driver, with exactly-once accounting keyed by object id.

Ray is the engine (`pip install devbridge[ray]`): actors, their method calls, `ray.wait`,
`ray.kill`; nothing distributed is written here. The bridge stays a per-device, in-process
library: each actor is one process with one backend on one device, and runs each batch it is
given with the reference worker (`device_worker`: its own Bridge, rings, weights and
restarts, verified against numpy). The driver holds the only copy of every object's state
(queued, in flight on an actor, delivered): an actor that dies (`ray.kill`, injected by
`kill_every`, or lost with its node) fails the call it was running, its batch goes back to the
front of the queue and a new actor starts on the same device. A batch's results count only when
its call returns, so one redone after a kill counts once; deliveries are counted per object id,
so an object delivered twice would show as duplicated.

`run_fleet(address=...)` joins a running cluster; without one it starts a local Ray with one
CPU per actor (and stops it at the end).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import itertools
import json
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from devbridge.apps.tally import Delivery, Tally
from devbridge.apps.worker.drivers import check_demo, check_run, device_worker
from devbridge.args import count, refuse
from devbridge.bridge.trace import Trace, TraceClock
from devbridge.errors import BridgeError, short

#: How many times a batch is tried (each on a live actor) before its objects count as lost.
ATTEMPTS = 5
KILL_WAIT_S = 10.0  # the longest a run waits at its end for its killed actors to be gone


class FleetUnavailable(RuntimeError):
    """Ray is not installed: `pip install devbridge[ray]`."""


def ray_module() -> Any:
    """Ray, or FleetUnavailable with the way to get it."""
    try:
        return importlib.import_module("ray")
    except ImportError as e:
        raise FleetUnavailable("the fleet runs on Ray: pip install 'devbridge[ray]'") from e


@dataclass
class BatchResult:
    """What an actor did with one batch: its tally (each object it delivered, how many times
    within the batch, and those whose output was wrong), its restarts and the seconds it took."""

    tally: Tally
    restarts: int
    seconds: float
    cpu_s: float  # CPU time of the actor's process (all its threads) while it ran the batch
    pid: int
    #: with `trace`: the batch's timeline (its bridge's events) and the clocks at its start
    trace: list[dict[str, Any]] | None = None
    trace_clock: TraceClock | None = None


class DeviceActor:
    """One fleet member (made a Ray actor by `run_fleet`): a backend on one device, opened once;
    each batch runs on a fresh reference worker over it."""

    def __init__(self, backend: str, device: str | None, faults: float, restart_every: int, seed: int) -> None:
        import tinygrad.helpers

        from devbridge.apps.backends import make_backend

        if "PARALLEL" not in os.environ:  # (the user's setting wins)
            # kernels compiled in this process, not by tinygrad's pool of compile processes: an
            # actor is killed with ray.kill, and its pool's processes and semaphores with it
            # would outlive it
            tinygrad.helpers.PARALLEL.value = 0
        self.failure: BridgeError | None = None  # why its backend did not open: every call raises it
        try:
            self.backend = make_backend(backend, device)
        except BridgeError as e:
            self.failure = e
        self.faults, self.restart_every, self.seed = faults, restart_every, seed

    def ready(self) -> int:
        """Its process id, once it is up (the backend opened)."""
        if self.failure is not None:
            raise self.failure
        return os.getpid()

    def run(self, ks: list[int], trace: bool = False) -> BatchResult:
        """Run one batch; with `trace`, its timeline comes back with the result."""
        if self.failure is not None:
            raise self.failure
        out = io.StringIO()
        timeline = Trace(out) if trace else None
        worker = device_worker(
            self.backend, ks, self.faults, self.restart_every, self.seed, self.seed + ks[0], timeline
        )  # fmt: skip
        start, cpu = time.perf_counter(), time.process_time()
        worker.run()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        result = BatchResult(worker.tally, worker.restarts, seconds, cpu, os.getpid())
        if timeline is not None:
            timeline.close()
            result.trace, result.trace_clock = json.loads(out.getvalue()), timeline.clock
        return result


@dataclass
class ActorRun:
    """One actor slot over the run (its replacements included)."""

    device: str
    batches: int
    objects: int
    busy_s: float  # seconds its actors spent running batches
    cpu_s: float  # CPU seconds they used for them
    killed: int  # actors of this slot killed (and replaced)


@dataclass
class FleetSummary(Delivery):
    seconds: float  # from the first batch given, every actor up, to the last result
    objects_per_s: float
    workers: int
    kills: int  # actors killed by kill_every
    replaced: int  # actors started in place of one that died
    redelivered: int  # objects whose batch was given to another actor after its actor died
    restarts: int  # bridge restarts inside the workers (restart_every)
    actors: list[ActorRun]


def check_fleet(workers: object, batch: object, kill_every: object) -> None:
    """The fleet's own options (ARG-1), checked before Ray starts."""
    for name, value, least in (("workers", workers, 1), ("batch", batch, 1), ("kill_every", kill_every, 0)):
        count(name, value, least)


def run_fleet(
    objects: int = 600,
    workers: int = 2,
    backend: str = "tinygrad",
    devices: Sequence[str | None] | None = None,
    kill_every: int = 0,
    batch: int = 50,
    faults: float = 0.0,
    restart_every: int = 0,
    seed: int = 0,
    address: str | None = None,
    progress: Callable[[int], None] | None = None,
    trace: str | None = None,
) -> FleetSummary:
    """`objects` synthetic objects over `workers` Ray actors (actor i on devices[i % len], by
    default `CPU:i` for tinygrad), in batches of `batch`. With `kill_every` K, each time K more
    objects are delivered one actor with a batch in flight is killed (`ray.kill`): its batch
    goes to another actor and a new one takes its place. With `trace` (a path), one timeline
    of the run (devbridge.bridge.trace): the driver's batches and kills, and each batch's bridge as
    its own process (the timeline of a batch whose actor died goes with it)."""
    check_demo(objects, faults, restart_every, 1, seed, progress)
    check_fleet(workers, batch, kill_every)
    if devices is None:
        devices = [f"CPU:{i}" for i in range(workers)] if backend == "tinygrad" else [None]
    devices = check_run(backend, devices)
    if address is not None and type(address) is not str:
        refuse(f"address must be None or a Ray address, got {short(address)}")
    ray = ray_module()
    timeline = None if trace is None else Trace(trace)  # a path that cannot be made: ARG-1, before Ray starts
    with contextlib.closing(timeline) if timeline is not None else contextlib.nullcontext():
        started = not ray.is_initialized()
        if started:
            ray.init(
                address=address,
                num_cpus=None if address else workers,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="ERROR",
            )
        try:
            return _drive(
                ray, objects, workers, backend, devices, kill_every, batch, faults, restart_every, seed, progress,
                timeline,
            )  # fmt: skip
        finally:
            if started:
                ray.shutdown()


def _drive(
    ray: Any,
    objects: int,
    workers: int,
    backend: str,
    devices: Sequence[str | None],
    kill_every: int,
    batch: int,
    faults: float,
    restart_every: int,
    seed: int,
    progress: Callable[[int], None] | None,
    timeline: Trace | None = None,
) -> FleetSummary:
    remote = ray.remote(num_cpus=1, max_restarts=0)(DeviceActor)
    where = [devices[i % len(devices)] for i in range(workers)]
    marks = _Marks(timeline, [str(device) for device in where])

    def spawn(slot: int) -> Any:
        return remote.remote(backend, where[slot], faults, restart_every, seed)

    queue = deque([list(range(k, min(k + batch, objects))) for k in range(0, objects, batch)])
    attempts: Counter[int] = Counter()  # by the batch's first object
    actors = [spawn(slot) for slot in range(workers)]
    runs = [ActorRun(str(where[slot]), 0, 0, 0.0, 0.0, 0) for slot in range(workers)]
    running: dict[Any, tuple[int, list[int]]] = {}  # call -> (actor slot, its batch)
    tally = Tally()  # deliveries by object id, over every batch whose call returned
    kills = replaced = redelivered = restarts = victim = 0
    next_kill = kill_every
    killed: list[Any] = []  # actors killed mid-run, waited for with the others at the end
    try:
        ray.get([actor.ready.remote() for actor in actors])  # the clock starts with every actor up
    except ray.exceptions.RayTaskError as e:  # a backend that did not open (a device) never will
        if not isinstance(e.cause, BridgeError):
            raise
        refuse(f"an actor of the fleet could not start: {e.cause.detail}")
    start = time.perf_counter()
    while queue or running:
        busy = {slot for slot, _ in running.values()}
        for slot in range(workers):
            if slot not in busy and queue:
                ks = queue.popleft()
                attempts[ks[0]] += 1
                running[actors[slot].run.remote(ks, timeline is not None)] = (slot, ks)
                marks.given(slot, ks)
        done, _ = ray.wait(list(running), num_returns=1)  # blocks until a call ends
        for call in done:
            slot, ks = running.pop(call)
            try:
                result: BatchResult = ray.get(call)
            except ray.exceptions.RayActorError:  # the actor died: its batch goes to another one
                marks.ended(slot, ks, "its actor died")
                actors[slot] = spawn(slot)
                replaced += 1
                runs[slot].killed += 1
                if attempts[ks[0]] < ATTEMPTS:  # else its objects stay undelivered: lost, reported
                    queue.appendleft(ks)
                    redelivered += len(ks)
                continue
            except ray.exceptions.RayTaskError:  # the worker gave up (WorkerStalled): another try
                marks.ended(slot, ks, "its worker gave up")
                if attempts[ks[0]] < ATTEMPTS:
                    queue.append(ks)
                continue
            tally.add(result.tally)
            marks.ended(slot, ks, "delivered", result)
            restarts += result.restarts
            run = runs[slot]
            run.batches += 1
            run.objects += len(result.tally)
            run.busy_s += result.seconds
            run.cpu_s += result.cpu_s
            if progress is not None:
                progress(len(tally))
        if kill_every and len(tally) >= next_kill and running and len(tally) < objects:
            busy = {slot for slot, _ in running.values()}
            victim = next(s for s in [*range(victim + 1, workers), *range(victim + 1)] if s in busy)  # in turn
            ray.kill(actors[victim], no_restart=True)
            killed.append(actors[victim])
            marks.killed(victim)
            kills += 1
            next_kill += kill_every
    seconds = time.perf_counter() - start
    for actor in actors:  # their CPUs go back to Ray now, not when it collects the handles
        ray.kill(actor)
    for actor in [*actors, *killed]:  # and they are gone before the run returns (a shutdown
        # right after would otherwise leave a process whose kill was still on its way)
        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            ray.get(actor.ready.remote(), timeout=KILL_WAIT_S)
    return FleetSummary(
        **vars(tally.delivery(objects)),
        seconds=seconds,
        objects_per_s=len(tally) / seconds,
        workers=workers,
        kills=kills,
        replaced=replaced,
        redelivered=redelivered,
        restarts=restarts,
        actors=runs,
    )


class _Marks:
    """The driver's part of a fleet trace: process 0, a track per actor slot with each batch as
    a span from given to returned, kills as instants; each returned batch's own timeline goes
    in as a process of its own. Does nothing without a trace."""

    def __init__(self, trace: Trace | None, devices: list[str]) -> None:
        self.trace, self.batches, self.pids = trace, itertools.count(), itertools.count(1)
        self.open: dict[tuple[int, int], int] = {}  # (slot, first object) -> the batch span's id
        if trace is not None:
            trace.emit({"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "fleet driver"}})
            for slot, device in enumerate(devices):
                name = {"name": f"actor {slot} ({device})"}
                trace.emit({"ph": "M", "name": "thread_name", "pid": 0, "tid": slot + 1, "args": name})

    def given(self, slot: int, ks: list[int]) -> None:
        if self.trace is not None:
            self.open[slot, ks[0]] = n = next(self.batches)
            name = f"objects {ks[0]}..{ks[-1]}"
            self.trace.emit({"ph": "b", "id": f"batch {n}", "cat": "batch", "name": name, "pid": 0, "tid": slot + 1})

    def ended(self, slot: int, ks: list[int], how: str, result: BatchResult | None = None) -> None:
        if self.trace is None:
            return
        n = self.open.pop((slot, ks[0]))
        name = f"objects {ks[0]}..{ks[-1]}"
        event = {"ph": "e", "id": f"batch {n}", "cat": "batch", "name": name, "pid": 0, "tid": slot + 1}
        self.trace.emit({**event, "args": {"ended": how}})
        if result is not None and result.trace is not None:
            label = f"actor {slot}, process {result.pid}, {name}"
            self.trace.include(result.trace, pid=next(self.pids), label=label, clock=result.trace_clock)

    def killed(self, slot: int) -> None:
        if self.trace is not None:
            name = f"actor {slot} killed"
            self.trace.emit({"ph": "i", "s": "p", "name": name, "cat": "fault", "pid": 0, "tid": slot + 1})
