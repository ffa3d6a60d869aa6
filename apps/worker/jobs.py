"""One object's way through the pipeline: its stages, the only transitions between them, and the
job that carries it (with the slot of pooled device memory it runs in)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from devbridge.bridge.events import Event
from devbridge.ring.host import HostRange
from devbridge.types import DeviceHandle, DeviceRange


class Stage(enum.Enum):
    """Where a batch of objects is in the pipeline."""

    SLOT = "slot"  # waiting for device memory, or to start its upload (again)
    UPLOAD = "upload"  # its input is being copied to the slot's x
    COMPUTE = "compute"  # the MLP was issued; its download waits for room in the output ring
    DOWNLOAD = "download"  # the slot's y is being copied to the output ring (after the compute)
    DELIVERED = "delivered"  # its output was taken and checked; the slot went back to the pool
    REJECTED = "rejected"  # its input changed under its upload (the host-bytes check): not delivered


#: The pipeline's transitions: every stage change a job makes is one of these. SLOT is also where
#: a restart sends every job, and where a copy that failed to start is retried from.
STAGES: dict[Stage, frozenset[Stage]] = {
    Stage.SLOT: frozenset({Stage.UPLOAD}),
    # a failed upload is redone; one whose input changed under it is rejected
    Stage.UPLOAD: frozenset({Stage.UPLOAD, Stage.COMPUTE, Stage.SLOT, Stage.REJECTED}),
    Stage.COMPUTE: frozenset({Stage.DOWNLOAD, Stage.SLOT}),
    # a failed download is redone; after a failed compute the object starts over from its upload
    Stage.DOWNLOAD: frozenset({Stage.DOWNLOAD, Stage.COMPUTE, Stage.UPLOAD, Stage.SLOT, Stage.DELIVERED}),
    Stage.DELIVERED: frozenset(),
    Stage.REJECTED: frozenset(),
}


class StageError(RuntimeError):
    """A job was moved by a transition that STAGES does not have (a bug in the worker)."""


@dataclass
class Slot:
    """Device memory for one batch in flight, reused by batch after batch in a generation."""

    x: DeviceHandle
    y: DeviceHandle
    xv: Any  # zero-copy views, passed to the jitted MLP as arguments (they pin x and y)
    yv: Any
    xr: DeviceRange  # all of x and all of y: what a full batch's copies move
    yr: DeviceRange


@dataclass
class Job:
    """A batch of objects on their way together: one upload, one compute and one download for all."""

    ks: list[int]  # the objects, in the order of their inputs in `src`
    src: HostRange
    answers: Any = None  # numpy's outputs for them, one per object (what delivery checks)
    record: HostRange | None = None  # the input record `src` is part of, if more than its inputs
    slot: Slot | None = None
    out: HostRange | None = None
    out_record: HostRange | None = None  # the output record `out` is part of, if more than its outputs
    stage: Stage = Stage.SLOT
    event: Event | None = None
    computed: Event | None = None  # the compute event the download follows (ORDER-1)
    old: list[Event] = field(default_factory=list)  # events of an older generation still on the device
    moves: list[tuple[Stage, Stage]] | None = None  # every transition taken, when a test records them
    spoiled: bool = False  # (--inject-late-writes) its input was written into under its upload

    def move(self, to: Stage) -> None:
        if to not in STAGES[self.stage]:
            objects = ", ".join(map(str, self.ks))
            raise StageError(f"object {objects}: no transition {self.stage.value} -> {to.value}")
        if self.moves is not None:
            self.moves.append((self.stage, to))
        self.stage = to
