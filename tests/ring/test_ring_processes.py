"""A shared ring between real processes (the `spawn` start method: nothing inherited): producers
and a consumer that share only the ring's name move every record exactly once, through a
Bridge on each device; SIGKILL at random points of any of them loses and duplicates nothing;
a consumer stopped while its replacement takes over is fenced when it wakes (RING-5, GEN-2).

Each test bounds its own time: a process that does not finish is a failure that prints the
ring's state and every log, not a CI timeout."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest
import ring_procs
from ring_procs import STOP, read_log

from devbridge import HostRing
from devbridge.ring.segment import SHM_DIR

SPAWN = multiprocessing.get_context("spawn")


class Run:
    """One test's ring, processes and logs; `end` checks exactly-once delivery and leaves nothing."""

    def __init__(self, tmp: Path, capacity: int, records: int) -> None:
        self.name = f"devbridge-procs-{os.getpid()}-{time.monotonic_ns()}"
        self.ring = HostRing.create(self.name, capacity, records=records)
        self.tmp = tmp
        self.produced = tmp / "produced.log"
        self.consumed = tmp / "consumed.log"
        self.until = str(tmp / "stop-producing")
        self.processes: list[BaseProcess] = []
        self.next_producer = 0

    def start(self, target: object, *args: object) -> BaseProcess:
        process = SPAWN.Process(target=target, args=args)  # type: ignore[arg-type]
        process.start()
        self.processes.append(process)
        return process

    def producer(self, count: int, largest: int, until: bool = False) -> BaseProcess:
        self.next_producer += 1
        return self.start(
            ring_procs.produce,
            self.name,
            self.next_producer,
            count,
            largest,
            str(self.produced),
            self.until if until else "",
        )

    def consumer(self, device: str = "none") -> BaseProcess:
        return self.start(ring_procs.consume, self.name, str(self.consumed), device)

    def state(self) -> str:
        stats = self.ring.stats()  # type: ignore[attr-defined]
        alive = [(p.pid, p.exitcode) for p in self.processes if p.exitcode is None]
        logs = "\n".join(" ".join(line) for line in read_log(self.consumed)[-20:])
        where = f"cursor {self.ring.cursor}, head {self.ring.head}"
        return f"ring {stats}, {where}; running {alive}\nlast consumed:\n{logs}"

    def join(self, process: BaseProcess, timeout: float) -> None:
        process.join(timeout)
        assert process.exitcode is not None, f"process {process.pid} still runs after {timeout} s\n{self.state()}"

    def grows(self, path: Path, kind: str | None, timeout: float) -> bool:
        """Wait (polling every 2 ms) until a line (of `kind`) is appended to `path` after now;
        reads only what was appended (a log grows to hundreds of thousands of lines)."""
        offset = path.stat().st_size if path.exists() else 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size > offset:
                with path.open("rb") as f:
                    f.seek(offset)
                    new = f.read().decode()
                lines = new.split("\n")[:-1] if "\n" in new else []
                if any(kind is None or line.startswith(kind + " ") for line in lines):
                    return True
            time.sleep(0.002)
        return False

    def finish(self, consumer: BaseProcess) -> None:
        """Stop the producers, send the STOP record, and wait for everything to end."""
        Path(self.until).touch()
        for process in self.processes:
            if process is not consumer:
                self.join(process, 120)  # (hang detectors: minutes on a loaded machine)
        ring_procs.stop(self.name)
        self.join(consumer, 120)

    def check(self) -> dict[str, int]:
        """Every committed record delivered, each once to the consumer that first took it (again
        only as `redelivered`), every byte exact; the cursor at the head."""
        produced = {(int(p), int(i)): int(seq) for p, i, seq, _ in read_log(self.produced)}
        lines = read_log(self.consumed)
        last_take: dict[str, int] = {}  # generation -> its last "D" line
        unreleased = set()  # a fenced consumer's last take, whose release was refused: no delivery
        for n, line in enumerate(lines):
            if line[0] == "D":
                last_take[line[6]] = n
            elif line[0] == "F" and line[3:] == ["unreleased"]:
                unreleased.add(last_take[line[1]])
        delivered: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        for n, line in enumerate(lines):
            if line[0] == "D" and n not in unreleased:
                seq, p, i, again, ok, _ = map(int, line[1:])
                assert ok == 1, f"record {seq} ({p}, {i}) arrived with wrong bytes"
                delivered[seq].append((p, i, again))
        self.ring.reclaim()  # type: ignore[attr-defined]
        stats = self.ring.stats()  # type: ignore[attr-defined]
        assert sorted(delivered) == list(range(stats["committed"])), "a committed record was never delivered"
        for seq, takes in delivered.items():
            assert len({(p, i) for p, i, _ in takes}) == 1, f"record {seq} was two records: {takes}"
            assert sum(1 for *_, again in takes if not again) <= 1, f"record {seq} delivered twice: {takes}"
        for key, seq in produced.items():
            assert delivered[seq][0][:2] == key, f"record {seq} was committed as {key}, delivered as {delivered[seq]}"
        last = max(delivered)
        assert delivered[last][0][0] == STOP
        assert self.ring.cursor == self.ring.head and stats["live"] == 0, self.state()
        return {**stats, "delivered": len(delivered), "takes": sum(map(len, delivered.values()))}

    def end(self) -> None:
        for process in self.processes:
            if process.exitcode is None:
                process.kill()
                process.join(10)
        self.ring.close()
        path = Path(SHM_DIR, self.name)
        if path.exists():
            HostRing.attach(self.name).unlink()
        assert not path.exists()
        assert all(p.exitcode is not None for p in self.processes)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    made: list[Run] = []

    def make(capacity: int = 64 << 10, records: int = 256) -> Run:
        made.append(Run(tmp_path, capacity, records))
        return made[-1]

    yield make  # type: ignore[misc]
    for r in made:
        r.end()


@pytest.mark.holds("RING-4", "RING-5")
@pytest.mark.parametrize("device", ["fake", "CPU", "CL"])
def test_a_producer_and_a_consumer_process_move_10000_records_exactly(run: object, device: str) -> None:
    ring: Run = run(256 << 10, 1024)  # type: ignore[operator]
    consumer = ring.consumer(device)
    for _ in range(2):
        ring.producer(5000, 4096)
    ring.finish(consumer)
    stats = ring.check()
    assert (stats["delivered"], stats["takes"], stats["redelivered"], stats["generation"]) == (10001, 10001, 0, 1)


def _kill_at_random(ring: Run, rng: random.Random, process: BaseProcess, log: Path, kind: str | None) -> None:
    """SIGKILL `process` at a random point after it made progress (not while it starts up)."""
    ring.grows(log, kind, 10)
    time.sleep(rng.uniform(0, 0.01))
    os.kill(process.pid or 0, signal.SIGKILL)
    ring.join(process, 10)


#: SIGKILLs per run, and runs: 200 in all, each run well within a minute on a loaded machine
#: (`scripts/ring-soak KILLS` runs them with more).
KILLS, RUNS = int(os.environ.get("DEVBRIDGE_RING_SOAK_KILLS", "50")), 4


@pytest.mark.holds("RING-5", "RING-6")
@pytest.mark.parametrize("seed", range(1, RUNS + 1))
def test_kill_9_at_random_points_loses_and_duplicates_nothing(run: object, seed: int) -> None:
    """SIGKILLs, each of the consumer or of a producer, at a random point of its loop; each dead
    one is replaced (a new consumer takes over; a new producer adds records)."""
    ring: Run = run(16 << 10, 64)  # type: ignore[operator]
    rng = random.Random(seed)
    deadline = time.monotonic() + 60 + 3 * KILLS  # (a hang detector; about 10 s here)
    consumer = ring.consumer()
    producers = [ring.producer(1 << 30, 2048, until=True) for _ in range(2)]
    kills = {"consumer": 0, "producer": 0}
    # past KILLS, only consumers, until one dies holding a record (a kill that lands while it waits
    # in `take` proves nothing about redelivery; on a slow machine most can land there)
    while sum(kills.values()) < KILLS or not ring.ring.stats()["redelivered"]:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"{kills} kills, none redelivered in time\n{ring.state()}"
        if sum(kills.values()) >= KILLS or rng.random() < 0.5:
            _kill_at_random(ring, rng, consumer, ring.consumed, "D")
            kills["consumer"] += 1
            consumer = ring.consumer()
        else:
            victim = producers.pop(rng.randrange(len(producers)))
            _kill_at_random(ring, rng, victim, ring.produced, None)
            kills["producer"] += 1
            producers.append(ring.producer(1 << 30, 2048, until=True))
    ring.finish(consumer)
    stats = ring.check()
    assert stats["generation"] == kills["consumer"] + 1 and min(kills.values()) >= 10, (kills, stats)
    assert stats["delivered"] > 100 and stats["redelivered"] > 0, stats  # (reclaims: test_shared_ring.py)


def _wait_for_start(ring: Run, offset: int, timeout: float) -> bool:
    """Wait until a consumer logs its start ("S ...") past `offset` of the log; False at the
    timeout, or as soon as the ring's lock stays held look after look: its holder is the stopped
    consumer (the others hold it for microseconds), and the replacement waits until it goes on."""
    deadline, held = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        with ring.consumed.open("rb") as f:
            f.seek(offset)
            if b"\nS " in b"\n" + f.read():
                return True
        held = held + 1 if ring.ring.lock_held() else 0  # type: ignore[attr-defined]
        if held == 50:
            return False
        time.sleep(0.002)
    return False


@pytest.mark.holds("RING-5", "GEN-2")
def test_a_stopped_consumer_that_wakes_after_its_replacement_changes_nothing(run: object) -> None:
    """SIGSTOP the consumer at a random point, start its replacement, SIGCONT the old one: its next
    call is refused (GEN-2) and it exits; what it held is delivered again. (Stopped while it held
    the ring's lock, it holds up the replacement until it is continued: then it finishes that one
    call, made before the replacement came, and is fenced at its next.)"""
    ring: Run = run(16 << 10, 64)  # type: ignore[operator]
    rng = random.Random(3)
    consumer = ring.consumer()
    ring.producer(1 << 30, 2048, until=True)
    stopped: list[BaseProcess] = []
    for _ in range(10):
        assert ring.grows(ring.consumed, "D", 10), ring.state()
        time.sleep(rng.uniform(0, 0.01))
        os.kill(consumer.pid or 0, signal.SIGSTOP)
        offset = ring.consumed.stat().st_size
        replacement = ring.consumer()
        _wait_for_start(ring, offset, 30)  # not when the old one holds the lock
        os.kill(consumer.pid or 0, signal.SIGCONT)
        ring.join(consumer, 60)
        assert consumer.exitcode == 3, f"the old consumer ended with {consumer.exitcode}\n{ring.state()}"
        stopped.append(consumer)
        consumer = replacement
    ring.finish(consumer)
    fenced = [x for x in read_log(ring.consumed) if x[0] == "F"]
    assert [(int(g), rule) for _, g, rule, *_ in fenced] == [(g, "GEN-2") for g in range(1, 11)]
    stats = ring.check()
    assert stats["generation"] == 11


@pytest.mark.holds("H2D-3")
def test_a_producer_process_writing_into_a_committed_record_is_caught_by_the_consumers_check() -> None:
    """The host-bytes check across processes: the consumer's upload of a record is in flight when
    its producer, another process, writes into it; the upload fails, naming the byte."""
    from devbridge import Bridge, DeviceRange, HostBytesChangedError, ObjectSpec
    from devbridge.backends.fake import FakeBackend

    name = f"devbridge-late-{os.getpid()}-{time.monotonic_ns()}"
    ring = HostRing.create(name, 1 << 12)
    go, done = SPAWN.Event(), SPAWN.Event()
    producer = SPAWN.Process(target=ring_procs.write_after_commit, args=(name, 21, go, done))
    try:
        producer.start()
        fake = FakeBackend()
        fake.checks_late_reads = False
        bridge = Bridge(fake, check_host_bytes=True)
        h = bridge.alloc_device(ObjectSpec("x", "uint8"), 64)
        r = ring.take(timeout=30)
        event = bridge.host_to_device(r, DeviceRange(h, 0, 64), sync=False)
        go.set()
        assert done.wait(30), "the producer did not write"
        fake.complete(event)
        with pytest.raises(HostBytesChangedError) as caught:
            event.wait(10)
        assert (caught.value.rule, caught.value.offset, caught.value.range) == ("H2D-3", 21, r)
        assert not ring.released(r)
        ring.release(r)
        producer.join(30)
        assert producer.exitcode == 0
    finally:
        if producer.is_alive():
            producer.kill()
            producer.join(10)
        ring.unlink()
        ring.close()
