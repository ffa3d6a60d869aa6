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
    BridgeError,
    ComputeError,
    DeviceAllocationError,
    DeviceCopyError,
    InvalidHandleError,
    InvalidSpecError,
    InvalidViewError,
    LifecycleError,
    OutputCopyError,
    OutputNotReadyError,
    RangeError,
    RingFullError,
    StaleHandleError,
)
from devbridge.events import ComputeEvent, CopyEvent, Event
from devbridge.ring import HostRing
from devbridge.types import DeviceHandle, DeviceRange, HostRange, ObjectSpec, TensorViewSpec

__all__ = [
    "Bridge",
    "BridgeError",
    "ComputeError",
    "ComputeEvent",
    "CopyEvent",
    "DeviceAllocationError",
    "DeviceCopyError",
    "DeviceHandle",
    "DeviceRange",
    "Event",
    "HostRange",
    "HostRing",
    "InvalidHandleError",
    "InvalidSpecError",
    "InvalidViewError",
    "LifecycleError",
    "ObjectSpec",
    "OutputCopyError",
    "OutputNotReadyError",
    "RangeError",
    "RingFullError",
    "StaleHandleError",
    "TensorViewSpec",
]
