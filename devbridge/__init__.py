"""devbridge: the device bridge of a GPU worker.

Moves bytes between host ring memory and device memory, exposes them to
tinygrad without copying, and keeps every allocation on the lifecycle of
spec/lifecycle.toml so that nothing is freed while a copy or compute uses it.
"""

import importlib
import os as _os
from typing import TYPE_CHECKING

# In a source checkout run from its root (`python -m devbridge`), this folder
# shadows the installed package, whose subpackages spec/, statemachine/,
# backends/, models/, bench/ are sibling folders (pyproject's package-dir):
# serve those, and nothing else of the checkout.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isdir(_os.path.join(_root, "statemachine")):
    from pathlib import Path as _Path

    from devbridge._checkout import serve as _serve

    _serve(_Path(_root))

if TYPE_CHECKING:
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
        RingCorruptError,
        RingFullError,
        StaleHandleError,
        WaitTimeoutError,
    )
    from devbridge.events import ComputeEvent, CopyEvent, Event
    from devbridge.ring import HostRange, HostRing
    from devbridge.types import DeviceHandle, DeviceRange, ObjectSpec, TensorViewSpec

#: The public names, each from the module that defines it, imported on first use (PEP 562):
#: `import devbridge.spec` loads neither the Bridge nor tinygrad, numpy or transitions.
_HOME = {
    "BackendFailureError": "devbridge.errors",
    "Bridge": "devbridge.bridge",
    "BridgeError": "devbridge.errors",
    "ComputeError": "devbridge.errors",
    "ComputeEvent": "devbridge.events",
    "CopyEvent": "devbridge.events",
    "DeviceAllocationError": "devbridge.errors",
    "DeviceCopyError": "devbridge.errors",
    "DeviceFreeError": "devbridge.errors",
    "DeviceHandle": "devbridge.types",
    "DeviceRange": "devbridge.types",
    "Event": "devbridge.events",
    "HostRange": "devbridge.ring",
    "HostRing": "devbridge.ring",
    "InvalidArgumentError": "devbridge.errors",
    "InvalidHandleError": "devbridge.errors",
    "InvalidSpecError": "devbridge.errors",
    "InvalidViewError": "devbridge.errors",
    "LifecycleError": "devbridge.errors",
    "ObjectSpec": "devbridge.types",
    "OrderingError": "devbridge.errors",
    "OutputCopyError": "devbridge.errors",
    "OutputNotReadyError": "devbridge.errors",
    "RangeError": "devbridge.errors",
    "RingCorruptError": "devbridge.errors",
    "RingFullError": "devbridge.errors",
    "StaleHandleError": "devbridge.errors",
    "TensorViewSpec": "devbridge.types",
    "WaitTimeoutError": "devbridge.errors",
}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'devbridge' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})


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
    "RingCorruptError",
    "RingFullError",
    "StaleHandleError",
    "TensorViewSpec",
    "WaitTimeoutError",
]
