"""devbridge: the device bridge of a GPU worker.

Moves bytes between host ring memory and device memory, exposes them to
tinygrad without copying, and keeps every allocation on the lifecycle of
spec/lifecycle.toml so that nothing is freed while a copy or compute uses it.
"""

import os as _os

# In a source checkout run from its root (`python -m devbridge`), this folder
# shadows the installed package, whose subpackages are the sibling folders
# spec/, statemachine/, backends/, models/ (pyproject's package-dir): serve them.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isdir(_os.path.join(_root, "statemachine")):
    __path__.append(_root)

from devbridge.bridge import Bridge
from devbridge.errors import (
    BackendFailureError,
    BridgeError,
    ComputeError,
    DeviceAllocationError,
    DeviceCopyError,
    DeviceFreeError,
    InvalidArgumentError,
    InvalidHandleError,
    InvalidSpecError,
    InvalidViewError,
    LifecycleError,
    OrderingError,
    OutputCopyError,
    OutputNotReadyError,
    RangeError,
    RingFullError,
    StaleHandleError,
    WaitTimeoutError,
)
from devbridge.events import ComputeEvent, CopyEvent, Event
from devbridge.ring import HostRing
from devbridge.types import DeviceHandle, DeviceRange, HostRange, ObjectSpec, TensorViewSpec

__all__ = [
    "BackendFailureError",
    "Bridge",
    "BridgeError",
    "ComputeError",
    "ComputeEvent",
    "CopyEvent",
    "DeviceAllocationError",
    "DeviceCopyError",
    "DeviceFreeError",
    "DeviceHandle",
    "DeviceRange",
    "Event",
    "HostRange",
    "HostRing",
    "InvalidArgumentError",
    "InvalidHandleError",
    "InvalidSpecError",
    "InvalidViewError",
    "LifecycleError",
    "ObjectSpec",
    "OrderingError",
    "OutputCopyError",
    "OutputNotReadyError",
    "RangeError",
    "RingFullError",
    "StaleHandleError",
    "TensorViewSpec",
    "WaitTimeoutError",
]
