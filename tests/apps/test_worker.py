"""The reference worker and `devbridge demo`: every object delivered exactly once, right, under faults and restarts."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
from harness import COMPUTE_DEVICES
from rules import refused

from devbridge.apps.worker import STAGES, Job, Producer, Stage, StageError, Worker, run_demo
from devbridge.apps.worker import workload as worker_module
from devbridge.backends.base import BackendError
from devbridge.cli.main import main
from devbridge.ring.host import HostRing
from devbridge.testing import FakeBackend, FaultyBackend, fake_pump


@pytest.mark.parametrize(("backend", "device"), COMPUTE_DEVICES, ids=lambda v: str(v))
def test_demo_survives_faults_and_restarts_with_nothing_lost(backend: str, device: str | None) -> None:
    summary = run_demo(objects=60, backend=backend, device=device, faults=0.1, restart_every=15, seed=3)
    assert (summary.delivered, summary.lost, summary.duplicated, summary.wrong) == (60, 0, 0, 0)
    assert summary.restarts >= 3 and summary.faults_injected > 0
    assert summary.faults_recovered > 0  # failed frees: see the deterministic test below
    assert summary.unreleased_input_bytes == summary.unreleased_output_bytes == 0
    assert (summary.bytes_in, summary.bytes_out) == (60 * 16 * 64 * 4, 60 * 16 * 32 * 4)
    assert summary.clean


@pytest.mark.parametrize(("backend", "device"), COMPUTE_DEVICES, ids=lambda v: str(v))
def test_batches_survive_faults_and_restarts_with_nothing_lost(backend: str, device: str | None) -> None:
    """Objects moved 4 at a time (61: the last batch has one), with failing copies, computes,
    frees and queries and a restart every 15: every object delivered once and right."""
    summary = run_demo(objects=61, backend=backend, device=device, faults=0.1, restart_every=15, seed=3, batch=4)
    assert (summary.delivered, summary.lost, summary.duplicated, summary.wrong) == (61, 0, 0, 0)
    assert summary.restarts >= 3 and summary.faults_injected > 0 and summary.clean
    assert summary.unreleased_input_bytes == summary.unreleased_output_bytes == 0
    assert (summary.bytes_in, summary.bytes_out) == (61 * 16 * 64 * 4, 61 * 16 * 32 * 4)


def test_a_batch_is_one_upload_one_compute_and_one_download() -> None:
    """10 objects, 4 at a time: batches of 4, 4 and 2, each one copy in of its inputs (the
    producer wrote them one after another), one compute and one copy out, of exactly its bytes."""
    fake = FakeBackend()
    worker = Worker(fake, 10, seed=1, batch=4, pump=fake_pump(fake, 1))
    worker.run()
    assert worker.summary(1.0, "fake").clean
    moved = [(c.op, c.nbytes) for c in fake.calls if c.op in ("copy_in", "compute", "copy_out")]
    moved = moved[4:]  # after the weights' uploads
    x, y = 16 * 64 * 4, 16 * 32 * 4
    ins = [n for op, n in moved if op == "copy_in"]
    outs = [n for op, n in moved if op == "copy_out"]
    assert sorted(ins) == [2 * x, 4 * x, 4 * x] and sorted(outs) == [2 * y, 4 * y, 4 * y]
    assert [op for op, _ in moved].count("compute") == 3
    allocs = [c.nbytes for c in fake.calls if c.op == "alloc"][4:]
    assert set(allocs) == {4 * x, 4 * y}  # a slot holds a whole batch


def test_a_wrong_output_in_a_batch_is_that_object_s_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's answer for object 5 is off: of the batch 4..7, only 5 is wrong."""
    reference = worker_module.reference_mlp
    calls = iter(range(10))

    def off_for_5(x: Any, w: Any) -> Any:
        return reference(x, w) + np.float32(1 if next(calls) == 5 else 0)

    monkeypatch.setattr(worker_module, "reference_mlp", off_for_5)
    fake = FakeBackend()
    worker = Worker(fake, 10, seed=1, batch=4, pump=fake_pump(fake, 1))
    worker.run()
    summary = worker.summary(1.0, "fake")
    assert (summary.delivered, summary.wrong, summary.lost, summary.duplicated) == (10, 1, 0, 0)
    assert worker.tally.wrong == {5}


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("batch", [0, -1, True, 1.5, "2", None])
def test_a_batch_that_is_not_a_positive_count_is_refused_before_anything_starts(batch: object) -> None:
    fake = FakeBackend()
    with refused("ARG-1", match="batch must be an int >= 1"):
        run_demo(objects=3, backend=fake, batch=batch)  # type: ignore[arg-type]
    with refused("ARG-1", match="batch must be an int >= 1"):
        Worker(fake, 3, batch=batch)  # type: ignore[arg-type]
    assert fake.calls == []


def test_the_output_check_is_numpys_tolerance_and_allocates_nothing_per_batch() -> None:
    """The same verdicts as |got - expected| <= TOLERANCE * (1 + |expected|), edges included (a
    difference exactly at the bound, NaN, inf), per object; after the first call no memory is
    allocated for a batch's comparison but its list of verdicts."""
    import tracemalloc

    tol = worker_module.TOLERANCE
    expected = np.zeros((3, 4, 8), np.float32)
    got = expected.copy()
    got[1, 0, 0] = np.float32(tol)  # exactly at the bound (TOLERANCE * (1 + 0)): right
    check = worker_module.OutputCheck((4, 4, 8))
    assert check(got, expected) == [True, True, True]
    got[1, 0, 0] = np.nextafter(got[1, 0, 0], np.float32(2))  # just past it: wrong
    got[2, 3, 7] = np.nan
    assert check(got, expected) == [True, False, False]
    got[1, 0, 0], got[2, 3, 7] = expected[1, 0, 0], np.inf
    assert check(got[:2], expected[:2]) == [True, True] and check(got, expected) == [True, True, False]
    big = np.ones((4, 4096, 32), np.float32)
    check = worker_module.OutputCheck(big.shape)
    check(big, big)
    tracemalloc.start()
    try:
        check(big, big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4096  # a 2 MiB batch compared without a temporary


def test_device_memory_is_pooled_per_generation() -> None:
    """20 objects reuse the window's 4 slots (x and y each): no allocation or free per object; the
    next object's upload into a slot follows the last one's download by ORDER-1, not by waiting."""
    for _ in range(5):  # overlap needs the producer thread ahead of the worker: a loaded machine can starve it
        summary = run_demo(objects=20, backend="fake", seed=1)
        # weights + one slot (x and y) per object in the window at once: at most 4, fewer if the
        # producer fell behind (a loaded machine); never one per object, and none freed mid-run
        slots, odd = divmod(summary.allocations - 4, 2)
        assert summary.clean and odd == 0 and 1 <= slots <= 4 and summary.deferred_frees == 0
        assert summary.peak_live_allocations == summary.allocations
        if summary.overlapped_computes > 0:
            break
    assert summary.overlapped_computes > 0  # the upload of a later object was in flight meanwhile
    restarted = run_demo(objects=20, backend="fake", seed=1, restart_every=5)
    assert restarted.clean and restarted.restarts >= 3
    assert restarted.allocations <= (restarted.restarts + 1) * (4 + 2 * 4)  # a pool per generation


def test_cli_json_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["demo", "--objects", "12", "--backend", "fake", "--faults", "0.05", "--restart-every", "5", "--json"])
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert (summary["objects"], summary["lost"], summary["duplicated"], summary["wrong"], summary["clean"]) == (
        12, 0, 0, 0, True,
    )  # fmt: skip


def test_demo_exits_non_zero_on_a_wrong_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = worker_module.reference_mlp
    monkeypatch.setattr(worker_module, "reference_mlp", lambda x, w: reference(x, w) + 1)
    assert main(["demo", "--objects", "3", "--backend", "fake", "--no-progress"]) == 1
    assert "wrong: 3" in capsys.readouterr().out


@pytest.mark.parametrize(("shift", "wrong"), [(0.0, 0), (2e-5, 0), (float("nan"), 3), (1e-2, 3)])
def test_an_output_is_right_within_the_tolerance_of_numpys(
    monkeypatch: pytest.MonkeyPatch, shift: float, wrong: int
) -> None:
    reference = worker_module.reference_mlp
    monkeypatch.setattr(worker_module, "reference_mlp", lambda x, w: reference(x, w) + np.float32(shift))
    summary = run_demo(objects=3, backend="fake")
    assert (summary.delivered, summary.wrong) == (3, wrong)


def test_demo_exits_non_zero_when_an_object_is_lost(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Producer.run

    def lossy(self: Producer) -> None:
        self.ks.pop()  # the producer drops the last object on the floor
        run(self)

    monkeypatch.setattr(Producer, "run", lossy)
    assert main(["demo", "--objects", "4", "--backend", "fake", "--no-progress"]) == 1
    assert "lost: 1" in capsys.readouterr().out


def test_failed_computes_start_the_object_over_from_its_kept_input() -> None:
    from devbridge.apps.worker import Worker
    from devbridge.backends.fake import FakeBackend
    from devbridge.backends.faulty import FaultyBackend
    from devbridge.testing import fake_pump

    fake = FakeBackend()
    backend = FaultyBackend(fake, rate=0.2, seed=5, random_ops=("compute",))
    worker = Worker(backend, 40, seed=5, pump=fake_pump(fake, 5))
    worker.run()
    summary = worker.summary(1.0, "fake")
    assert backend.injected["compute"] > 0 and summary.faults_recovered == backend.injected["compute"]
    assert summary.clean and summary.unreleased_input_bytes == 0


def test_failed_frees_are_reported_and_the_worker_goes_on() -> None:
    """Pooled slots are freed with their generation: three failing frees are reported (FREE-3,
    by the restart or the next poll), counted, and nothing is lost."""
    from devbridge.apps.worker import Worker
    from devbridge.backends.fake import FakeBackend
    from devbridge.backends.faulty import FaultyBackend
    from devbridge.testing import fake_pump

    fake = FakeBackend()
    backend = FaultyBackend(fake)  # no random faults: exactly the armed ones
    backend.fail_next("free", 3)
    worker = Worker(backend, 30, seed=2, restart_every=10, pump=fake_pump(fake, 2))
    worker.run()
    summary = worker.summary(1.0, "fake")
    assert summary.clean and summary.restarts >= 2
    assert backend.injected["free"] == 3 and worker.bridge.stats().free_failures == 3
    assert 1 <= summary.free_failures <= 3  # a restart reports all its failed frees at once


class FailsToStart(FaultyBackend):
    """Copies fail to start (the call raises, as a device out of queue slots would), besides the
    faults a FaultyBackend injects: the `nth` copy_in (1-based), or each copy with probability `rate`."""

    def __init__(self, inner: FakeBackend, *, nth: int = 0, start_rate: float = 0.0, seed: int = 0, **kw: Any) -> None:
        super().__init__(inner, seed=seed, **kw)
        self.copies_in, self.nth, self.start_rate = 0, nth, start_rate
        self.starts = random.Random(seed)
        self.not_started = 0

    def refuse(self) -> None:
        if self.start_rate and self.starts.random() < self.start_rate:
            self.not_started += 1
            raise BackendError("injected: the copy could not start")

    def copy_in(self, buffer: object, offset: int, src: memoryview, *, sync: bool) -> object:
        self.copies_in += 1
        if self.copies_in == self.nth:
            self.not_started += 1
            raise BackendError("injected: the copy could not start")
        self.refuse()
        return super().copy_in(buffer, offset, src, sync=sync)

    def copy_out(self, dst: memoryview, buffer: object, offset: int, *, sync: bool) -> object:
        self.refuse()
        return super().copy_out(dst, buffer, offset, sync=sync)


def test_an_object_whose_compute_failed_is_redone_even_when_its_new_upload_fails_to_start() -> None:
    """The compute fails, so its download carries garbage; the upload that starts the object over
    fails at the call. The object goes back to SLOT and is uploaded and computed again (a worker
    that left it in DOWNLOAD delivered the failed compute's output: one compute, no redo)."""
    fake = FakeBackend()
    backend = FailsToStart(fake, nth=6)  # 4 weights, the object's upload, then its redo
    backend.fail_next("compute")
    worker = Worker(backend, 1, seed=4, pump=fake_pump(fake, 4))
    worker.moves = []
    worker.run()
    summary = worker.summary(1.0, "fake")
    assert (backend.injected["compute"], backend.not_started) == (1, 1)
    assert (summary.delivered, summary.wrong, summary.lost) == (1, 0, 0) and summary.faults_recovered == 2
    moved = [c.op for c in fake.calls if c.op in ("copy_in", "compute", "copy_out")]
    assert moved == ["copy_in"] * 5 + ["compute", "copy_out", "copy_in", "compute", "copy_out"]
    S = Stage
    assert worker.moves == [
        (S.SLOT, S.UPLOAD), (S.UPLOAD, S.COMPUTE), (S.COMPUTE, S.DOWNLOAD),  # the compute fails
        (S.DOWNLOAD, S.SLOT),  # its redo fails to start
        (S.SLOT, S.UPLOAD), (S.UPLOAD, S.COMPUTE), (S.COMPUTE, S.DOWNLOAD), (S.DOWNLOAD, S.DELIVERED),
    ]  # fmt: skip


def test_jobs_move_only_by_the_stage_table_and_runs_take_every_transition_in_it() -> None:
    """Runs with failing copies (at completion and at the call), failing computes and restarts:
    each job's stage changes only by STAGES (Job.move raises StageError otherwise), every object
    is delivered once and right, and together the runs take all of the table's transitions. (A
    restart that finds a job in COMPUTE needs its download refused in the very pass that
    restarts: about one run in two has one, so runs go on, up to 40, until every one is taken.) An
    upload the host-bytes check fails is rejected: a run with late writes takes that one."""
    table = {(at, to) for at, tos in STAGES.items() for to in tos}
    fake = FakeBackend()
    fake.checks_late_reads = False
    worker = Worker(fake, 40, seed=1, check_host_bytes=True, late_writes=0.2, pump=fake_pump(fake, 1))
    worker.moves = []
    worker.run()
    assert (Stage.UPLOAD, Stage.REJECTED) in worker.moves and set(worker.moves) <= table
    taken: set[tuple[Stage, Stage]] = set(worker.moves)
    for seed in range(40):
        fake = FakeBackend()
        ops = ("copy_in", "copy_out", "compute")
        backend = FailsToStart(fake, start_rate=0.3, rate=0.1, seed=seed, random_ops=ops)
        worker = Worker(backend, 40, seed=seed, restart_every=3, ring_objects=6, pump=fake_pump(fake, seed))
        worker.moves = []
        worker.run()
        assert worker.summary(1.0, "fake").clean and backend.not_started > 0
        assert set(worker.moves) <= table
        taken |= set(worker.moves)
        if taken == table:
            break
    assert taken == table


def test_a_move_the_table_does_not_have_is_refused() -> None:
    ring = HostRing(64)
    job = Job([7], ring.reserve(8))
    with pytest.raises(StageError, match="object 7: no transition slot -> delivered"):
        job.move(Stage.DELIVERED)
    assert job.stage is Stage.SLOT
    job.move(Stage.UPLOAD)
    assert job.stage is Stage.UPLOAD


def defined(module: Any) -> list[str]:
    """The names a module (or, for a package, its submodules' __all__) defines at its top level."""
    import ast
    import inspect

    if hasattr(module, "__path__"):
        return list(module.__all__)
    tree = ast.parse(inspect.getsource(module))
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    names += [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
    return names + [n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def test_the_test_doubles_promised_paths_in_backends_give_the_testing_kits_objects() -> None:
    import devbridge.backends.fake
    import devbridge.backends.faulty
    import devbridge.testing.fake
    import devbridge.testing.faulty

    for old, new in (
        (devbridge.backends.fake, devbridge.testing.fake),
        (devbridge.backends.faulty, devbridge.testing.faulty),
    ):
        names = [n for n in defined(new) if not n.startswith("_")]
        assert names and all(getattr(old, n) is getattr(new, n) for n in names), old.__name__


def test_the_producer_makes_numpy_s_answers_on_one_blas_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the answers are made (just before a run starts), BLAS runs on the calling thread
    alone, and afterwards on as many threads as before: no pool thread is left spinning beside
    the run on the cores a CPU device computes on."""
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    before = blas_threads()
    seen: list[list[int]] = []
    reference = worker_module.reference_mlp

    def watched(x: Any, w: Any) -> Any:
        seen.append(blas_threads())
        return reference(x, w)

    monkeypatch.setattr(worker_module, "reference_mlp", watched)
    Worker(FakeBackend(), 3, seed=1)
    assert before and seen == [[1] * len(before)] * 3
    assert blas_threads() == before


@pytest.mark.holds("H2D-3")
@pytest.mark.parametrize(("backend", "device"), COMPUTE_DEVICES, ids=lambda v: str(v))
@pytest.mark.parametrize("batch", [1, 4])
def test_late_writes_the_demo_injects_are_each_caught_and_nothing_else(
    backend: str, device: str | None, batch: int
) -> None:
    """`--check-host-bytes --inject-late-writes 0.05`: every upload the producer writes into under
    it fails (its objects rejected), no other does, and every other object is delivered right."""
    s = run_demo(objects=300, backend=backend, device=device, batch=batch, check_host_bytes=True, late_writes=0.05)
    assert s.late_writes > 0 and (s.late_writes_caught, s.late_writes_missed, s.false_reports) == (s.late_writes, 0, 0)
    assert s.rejected <= s.late_writes * batch and s.delivered + s.rejected == 300
    assert (s.lost, s.duplicated, s.wrong) == (0, 0, 0)
    assert s.unreleased_input_bytes == s.unreleased_output_bytes == 0


def test_late_writes_without_the_check_are_delivered_wrong() -> None:
    """The control: the same bug with the mode off reaches the device, and the outputs are wrong."""
    s = run_demo(objects=300, backend="tinygrad", device="CPU", check_host_bytes=False, late_writes=0.05)
    assert s.late_writes > 0 and (s.late_writes_missed, s.late_writes_caught, s.rejected) == (s.late_writes, 0, 0)
    assert s.wrong == s.late_writes and s.delivered == 300


def test_the_demo_command_reports_the_late_writes_it_caught(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["demo", "--backend", "fake", "--objects", "200", "--check-host-bytes", "--inject-late-writes", "0.05"])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    caught = next(line for line in out if line.startswith("late writes injected"))
    n = int(caught.split()[3].rstrip(":"))
    assert n > 0 and caught.startswith(f"late writes injected {n}: caught {n}, missed 0, false reports 0")
    assert out[-1] == "lost: 0  duplicated: 0  wrong: 0"
    assert main(["demo", "--backend", "fake", "--objects", "200", "--inject-late-writes", "0.05"]) == 1  # missed


def test_restart_every_counts_exactly_one_restart_per_k_objects_delivered_while_more_remain() -> None:
    """One object in flight at a time (`window=1`) and a restart due after every object: each
    delivery leaves no job in flight, and a restart still follows it while objects remain: 4
    for 5 objects (none after the last), each a generation of its own."""
    fake = FakeBackend()
    worker = Worker(fake, 5, seed=4, window=1, restart_every=1, pump=fake_pump(fake, 4))
    worker.run()
    summary = worker.summary(1.0, "fake")
    assert summary.clean and (summary.objects, summary.lost, summary.duplicated) == (5, 0, 0)
    assert summary.restarts == 4
    assert worker.bridge.stats().generation == 4  # (from 0)
