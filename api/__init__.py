"""devbridge: the device bridge of a GPU worker.

Moves bytes between host ring memory and device memory, exposes them to
tinygrad without copying, and keeps every allocation on the lifecycle of
spec/lifecycle.toml so that nothing is freed while a copy or compute uses it.
"""

from devbridge.bridge.bridge import Bridge as Bridge
from devbridge.bridge.events import ComputeEvent as ComputeEvent
from devbridge.bridge.events import CopyEvent as CopyEvent
from devbridge.bridge.events import Event as Event
from devbridge.errors import BackendFailureError as BackendFailureError
from devbridge.errors import BridgeError as BridgeError
from devbridge.errors import ComputeError as ComputeError
from devbridge.errors import DeviceAllocationError as DeviceAllocationError
from devbridge.errors import DeviceCopyError as DeviceCopyError
from devbridge.errors import DeviceFreeError as DeviceFreeError
from devbridge.errors import HostBytesChangedError as HostBytesChangedError
from devbridge.errors import InvalidArgumentError as InvalidArgumentError
from devbridge.errors import InvalidHandleError as InvalidHandleError
from devbridge.errors import InvalidSpecError as InvalidSpecError
from devbridge.errors import InvalidViewError as InvalidViewError
from devbridge.errors import LifecycleError as LifecycleError
from devbridge.errors import OrderingError as OrderingError
from devbridge.errors import OutputCopyError as OutputCopyError
from devbridge.errors import OutputNotReadyError as OutputNotReadyError
from devbridge.errors import RangeError as RangeError
from devbridge.errors import RingCorruptError as RingCorruptError
from devbridge.errors import RingFullError as RingFullError
from devbridge.errors import StaleHandleError as StaleHandleError
from devbridge.errors import WaitTimeoutError as WaitTimeoutError
from devbridge.ring.host import HostRange as HostRange
from devbridge.ring.host import HostRing as HostRing
from devbridge.types import DeviceHandle as DeviceHandle
from devbridge.types import DeviceRange as DeviceRange
from devbridge.types import ObjectSpec as ObjectSpec
from devbridge.types import TensorViewSpec as TensorViewSpec
