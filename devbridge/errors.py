"""Typed errors. Each names the spec rule it reports, like a Vulkan VUID.

The rule IDs and their texts live in spec/lifecycle.toml; a test checks that
every rule's `error` is one of these classes and every raise cites a rule.
"""

from __future__ import annotations


class BridgeError(Exception):
    """Base of every devbridge error. `rule` is the spec rule ID it reports."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule
        self.detail = message


class InvalidSpecError(BridgeError, ValueError):
    """An ObjectSpec names no known dtype, or is otherwise malformed."""


class RangeError(BridgeError, ValueError):
    """A host or device range is negative, empty, out of bounds or mismatched."""


class RingFullError(BridgeError):
    """A reservation does not fit in the host ring's free space."""


class DeviceAllocationError(BridgeError):
    """The backend failed to allocate device memory."""


class DeviceCopyError(BridgeError):
    """A copy between host and device failed."""


class OutputCopyError(DeviceCopyError):
    """A device-to-host copy into the output ring failed."""


class OutputNotReadyError(BridgeError):
    """Host bytes were read before their device-to-host copy completed, or after it failed."""


class ComputeError(BridgeError):
    """A compute event failed on the backend."""


class InvalidViewError(BridgeError, ValueError):
    """A tinygrad view's shape, dtype or offset does not fit its allocation."""


class InvalidHandleError(BridgeError):
    """The handle is freed, free-pending, or was made by another Bridge."""


class StaleHandleError(BridgeError):
    """The handle (or event) belongs to a generation that a restart ended."""


class LifecycleError(BridgeError):
    """An event reached the core that no allocation state accepts: a bug, not bad input."""


ERRORS: dict[str, type[BridgeError]] = {
    cls.__name__: cls
    for cls in (
        BridgeError,
        InvalidSpecError,
        RangeError,
        RingFullError,
        DeviceAllocationError,
        DeviceCopyError,
        OutputCopyError,
        OutputNotReadyError,
        ComputeError,
        InvalidViewError,
        InvalidHandleError,
        StaleHandleError,
        LifecycleError,
    )
}
