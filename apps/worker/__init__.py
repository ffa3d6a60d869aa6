"""The reference worker, in four parts: the workload (shapes, inputs, the MLP, numpy's answers,
the producer), the pipeline (`Worker`: each object's stages as an explicit table), the drivers
(`run_demo`, faults, restarts) and several devices in one process (`run_devices`); an
object's stages and their table are in jobs.py."""

from devbridge.apps.worker.devices import DEVICE_IDLE_S, DeviceRun, DevicesSummary, run_devices
from devbridge.apps.worker.drivers import RANDOM_FAULTS, backend_name, check_demo, device_worker, run_demo
from devbridge.apps.worker.jobs import MOVES, STAGES, Job, Slot, Stage, StageError
from devbridge.apps.worker.pipeline import GIVE_UP_AFTER, IDLE_WAIT_S, Summary, Worker, WorkerStalled
from devbridge.apps.worker.workload import (
    TOLERANCE,
    Producer,
    Shapes,
    jitted_mlp,
    make_input,
    make_weights,
    mlp_step,
    one_blas_thread,
    reference_mlp,
)

__all__ = [
    "DEVICE_IDLE_S",
    "GIVE_UP_AFTER",
    "IDLE_WAIT_S",
    "MOVES",
    "RANDOM_FAULTS",
    "STAGES",
    "TOLERANCE",
    "DeviceRun",
    "DevicesSummary",
    "Job",
    "Producer",
    "Shapes",
    "Slot",
    "Stage",
    "StageError",
    "Summary",
    "Worker",
    "WorkerStalled",
    "backend_name",
    "check_demo",
    "device_worker",
    "jitted_mlp",
    "make_input",
    "make_weights",
    "mlp_step",
    "one_blas_thread",
    "reference_mlp",
    "run_demo",
    "run_devices",
]
