"""The reference worker and `devbridge demo`: every object delivered exactly once, right, under faults and restarts."""

from __future__ import annotations

import json

import numpy as np
import pytest
from harness import COMPUTE_DEVICES

from devbridge import worker as worker_module
from devbridge.cli import main
from devbridge.worker import Producer, run_demo


@pytest.mark.parametrize(("backend", "device"), COMPUTE_DEVICES, ids=lambda v: str(v))
def test_demo_survives_faults_and_restarts_with_nothing_lost(backend: str, device: str | None) -> None:
    summary = run_demo(objects=60, backend=backend, device=device, faults=0.1, restart_every=15, seed=3)
    assert (summary.delivered, summary.lost, summary.duplicated, summary.wrong) == (60, 0, 0, 0)
    assert summary.restarts >= 3 and summary.faults_injected > 0
    assert summary.faults_recovered > 0  # failed frees: see the deterministic test below
    assert summary.unreleased_input_bytes == summary.unreleased_output_bytes == 0
    assert (summary.bytes_in, summary.bytes_out) == (60 * 16 * 64 * 4, 60 * 16 * 32 * 4)
    assert summary.clean


def test_device_memory_is_pooled_per_generation() -> None:
    """20 objects reuse the window's 4 slots (x and y each): no allocation or free per object; the
    next object's upload into a slot follows the last one's download by ORDER-1, not by waiting."""
    summary = run_demo(objects=20, backend="fake", seed=1)
    # weights + one slot (x and y) per object in the window at once: at most 4, fewer if the
    # producer fell behind (a loaded machine); never one per object, and none freed mid-run
    slots, odd = divmod(summary.allocations - 4, 2)
    assert summary.clean and odd == 0 and 1 <= slots <= 4 and summary.deferred_frees == 0
    assert summary.overlapped_computes > 0  # the upload of a later object was in flight meanwhile
    assert summary.peak_live_allocations == summary.allocations
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
    from devbridge.backends.fake import FakeBackend
    from devbridge.backends.faulty import FaultyBackend
    from devbridge.worker import Worker, fake_pump

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
    from devbridge.backends.fake import FakeBackend
    from devbridge.backends.faulty import FaultyBackend
    from devbridge.worker import Worker, fake_pump

    fake = FakeBackend()
    backend = FaultyBackend(fake)  # no random faults: exactly the armed ones
    backend.fail_next("free", 3)
    worker = Worker(backend, 30, seed=2, restart_every=10, pump=fake_pump(fake, 2))
    worker.run()
    summary = worker.summary(1.0, "fake")
    assert summary.clean and summary.restarts >= 2
    assert backend.injected["free"] == 3 and worker.bridge.stats()["free_failures"] == 3
    assert 1 <= summary.free_failures <= 3  # a restart reports all its failed frees at once
