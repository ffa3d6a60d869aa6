"""The fleet's old import path: it lives in `devbridge.apps.fleet` now."""

from devbridge.apps.fleet import (
    ATTEMPTS,
    KILL_WAIT_S,
    ActorRun,
    BatchResult,
    DeviceActor,
    FleetSummary,
    FleetUnavailable,
    check_fleet,
    ray_module,
    run_fleet,
)

__all__ = [
    "ATTEMPTS",
    "KILL_WAIT_S",
    "ActorRun",
    "BatchResult",
    "DeviceActor",
    "FleetSummary",
    "FleetUnavailable",
    "check_fleet",
    "ray_module",
    "run_fleet",
]
