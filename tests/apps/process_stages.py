"""A worker process that kills itself (SIGKILL) at one stage of an object's way, once: the
process demo's tests start it through `run_processes(work_target=...)` (`spawn`: importable)."""

from __future__ import annotations

import os
import signal
from typing import Any

from devbridge.apps.worker.jobs import Job, Stage
from devbridge.apps.worker.processes import RingFeed, RingWorker, work
from devbridge.backends.base import Backend

#: Where an object may be when its worker dies, in the order it goes through them.
STAGES = ("taken", "uploading", "computing", "downloading", "committed", "released")
#: The input record (sequence number) at whose stage the worker dies, by stage: records before
#: it are in flight or delivered.
VICTIMS = {stage: 5 + 8 * i for i, stage in enumerate(STAGES)}


def dying_work(markers: str, spec: Any, counters: Any, stop: Any) -> None:
    """`work`, with a worker that dies at each stage of STAGES in turn, at that stage of its
    victim record (VICTIMS), once: a file named after the stage in folder `markers`, made just
    before it dies, says it did (the replacement goes through)."""

    def make(backend: Backend, feed: RingFeed, **options: Any) -> RingWorker:
        return Dying(markers, backend, feed, **options)

    work(spec, counters, stop, make=make)


class Dying(RingWorker):
    def __init__(self, markers: str, backend: Backend, feed: RingFeed, **options: Any) -> None:
        self.markers = markers
        super().__init__(backend, feed, **options)

    def due(self, stage: str, job: Job) -> bool:
        victim = job.record is not None and job.record.seq == VICTIMS[stage]
        return victim and not os.path.exists(os.path.join(self.markers, stage))

    def die(self, stage: str, job: Job) -> None:
        if self.due(stage, job):
            with open(os.path.join(self.markers, stage), "w") as f:
                f.write(f"{os.getpid()}\n")
            os.kill(os.getpid(), signal.SIGKILL)

    def upload(self, job: Job) -> None:
        self.die("taken", job)  # taken; nothing issued for it yet
        super().upload(job)
        if job.stage is Stage.UPLOAD:
            self.die("uploading", job)

    def download(self, job: Job) -> None:
        if job.stage is Stage.COMPUTE:
            self.die("computing", job)  # the compute issued, its download not yet
        super().download(job)
        if job.stage is Stage.DOWNLOAD:
            self.die("downloading", job)

    def deliver(self, job: Job) -> None:
        if self.due("committed", job):
            inputs, release = self.feed.inputs, self.feed.inputs._release_slot

            def released(index: int) -> bool:  # the output is committed; the input's release is next
                self.die("committed", job)
                return release(index)

            inputs._release_slot = released  # type: ignore[method-assign]
        super().deliver(job)
        self.die("released", job)
