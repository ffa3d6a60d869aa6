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


#: The pipeline's transitions, each with why a job takes it (the guide's diagram is drawn from
#: these). SLOT is also where a restart sends every job, and where a copy that failed to start is
#: retried from.
MOVES: dict[tuple[Stage, Stage], str] = {
    (Stage.SLOT, Stage.UPLOAD): "a slot is free",
    (Stage.UPLOAD, Stage.COMPUTE): "MLP submitted",
    (Stage.UPLOAD, Stage.UPLOAD): "upload failed",
    (Stage.UPLOAD, Stage.SLOT): "restart / retry failed to start",
    (Stage.UPLOAD, Stage.REJECTED): "input changed under it",
    (Stage.COMPUTE, Stage.DOWNLOAD): "room in the output ring",
    (Stage.COMPUTE, Stage.SLOT): "restart",
    (Stage.DOWNLOAD, Stage.DELIVERED): "output taken and checked",
    (Stage.DOWNLOAD, Stage.DOWNLOAD): "download failed",
    (Stage.DOWNLOAD, Stage.UPLOAD): "compute failed",
    (Stage.DOWNLOAD, Stage.COMPUTE): "retry failed to start",
    (Stage.DOWNLOAD, Stage.SLOT): "restart / new upload failed to start",
}

#: The stages each stage may move to (MOVES without the reasons).
STAGES: dict[Stage, frozenset[Stage]] = {stage: frozenset(to for at, to in MOVES if at is stage) for stage in Stage}


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
