"""Every use of tinygrad internals, in one place (tinygrad 0.14.x); OpenCL's
own commands and events are beside it, in `tinygrad_cl.py`.

0.14 removed `Buffer.copyin/copyout`; the allocator's `_copyin`/`_copyout`
remain, and zero-copy host access to CPU memory is `_as_buffer`. Completion
markers read the device's timeline signal where it has one (HCQ2 devices such
as CPU, HCQ devices such as NV/AMD), an OpenCL event on CL, and fall back to
`synchronize()` elsewhere. `capabilities(device)` says which, per device.
A tinygrad upgrade should touch these files and their tests only.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tinygrad.device import Allocator, Buffer, Device
from tinygrad.dtype import DType, dtypes
from tinygrad.tensor import Tensor
from tinygrad.uop.ops import UOp


@dataclass(frozen=True)
class Capabilities:
    """What a tinygrad device offers the bridge (read from its runtime, not from its name alone)."""

    device: str
    #: device memory is host memory: zero-copy host access, copies by memmove (CPU)
    host_memory: bool
    #: views and copies at an offset inside an allocation (the allocator's `_offset`)
    sub_buffers: bool
    #: the completion primitive: "hcq-timeline" (NV, AMD, QCOM), "hcq2-timeline" (CPU),
    #: "cl-event" (CL: an OpenCL event per command), "synchronize" (CUDA, METAL, PYTHON, ...)
    events: str
    #: when tinygrad's `_copyin` reads the host bytes: "on return" (CPU, PYTHON), "into a staging
    #: buffer before return" (CUDA, NV, AMD), "when the queue runs it" (CL: kept until synchronize)
    copyin_reads: str

    def as_dict(self) -> dict[str, object]:
        return {
            "device": self.device,
            "host_memory": self.host_memory,
            "sub_buffers": self.sub_buffers,
            "events": self.events,
            "copyin_reads": self.copyin_reads,
        }


@functools.cache
def capabilities(device: str) -> Capabilities:
    """The capability record of an opened tinygrad device."""
    dev: Any = Device[device]
    allocator = dev.allocator
    family = device.split(":")[0]
    if hasattr(dev, "timeline_signal") and hasattr(dev, "timeline_value"):
        events = "hcq-timeline"
    elif hasattr(dev, "signal") and hasattr(dev, "_wait_signal"):
        events = "hcq2-timeline"
    elif hasattr(dev, "queue") and hasattr(dev, "pending_copyin"):
        events = "cl-event"
    else:
        events = "synchronize"
    if events == "cl-event":
        reads = "when the queue runs it"
    elif family in ("CPU", "PYTHON"):
        reads = "on return"
    elif family in ("CUDA", "NV", "AMD"):
        reads = "into a staging buffer before return"
    else:
        reads = "unknown: treated as on return"
    return Capabilities(
        device=device,
        host_memory=family == "CPU" and hasattr(allocator, "_as_buffer"),
        sub_buffers=type(allocator)._offset is not Allocator._offset,
        events=events,
        copyin_reads=reads,
    )


def default_device() -> str:
    return str(Device.DEFAULT)


def canonical_device(device: str) -> str:
    return str(Device.canonicalize(device))


def open_device(device: str) -> str:
    """The canonical name of `device`, opened (raises when tinygrad has no such device)."""
    name = canonical_device(device)
    Device[name]
    return name


def dtype_of(name: str) -> DType:
    dtype = getattr(dtypes, name)
    assert isinstance(dtype, DType)
    return dtype


def allocate(device: str, nbytes: int) -> Buffer:
    """`nbytes` bytes of device memory as a uint8 Buffer (tinygrad's LRU cache applies on release)."""
    return Buffer(device, nbytes, dtypes.uint8).allocate()


def _raw_range(buffer: Buffer, offset: int, nbytes: int) -> Any:
    """The allocator's handle on `nbytes` bytes at `offset`: the buffer itself when whole, else
    the allocator's `_offset` (a tinygrad sub-buffer needs it too: a device without one copies
    whole buffers only, and NotImplementedError says so)."""
    if offset == 0 and nbytes == buffer.nbytes:
        return buffer._buf
    return buffer.allocator._offset(buffer._buf, nbytes, offset)


def copy_in(buffer: Buffer, offset: int, src: memoryview) -> None:
    """Host -> device, synchronous (the allocator waits for queued work first)."""
    buffer.allocator._copyin(_raw_range(buffer, offset, len(src)), src)


def copy_out(dst: memoryview, buffer: Buffer, offset: int) -> None:
    """Device -> host, synchronous (the allocator waits for queued work first)."""
    buffer.allocator._copyout(dst, _raw_range(buffer, offset, len(dst)))


def idle_probe(device: str) -> Callable[[], bool] | None:
    """On the CPU device, a probe that is true when the device has no queued work: the check its
    `synchronize` makes first (every worker done with what was put, the timeline reached), so a
    copy may skip the allocator's per-call synchronize (most of a small `_copyin`'s cost: README, Benchmarks).
    None elsewhere (the caller always goes through the allocator)."""
    try:
        from tinygrad.runtime.support.hcq2 import HCQ_RUNTIME_DEV
    except ImportError:
        return None
    dev: Any = Device[device]
    if not device.startswith("CPU") or not hasattr(dev, "workers") or not hasattr(dev, "signal"):
        return None
    timeline, value = _words(dev.signal("timeline")), _words(dev.signal("value", 1, device="CPU"))
    counters: list[tuple[Any, Any]] = []  # (put, done) per worker, read as tinygrad's synchronize reads them

    def idle() -> bool:
        if HCQ_RUNTIME_DEV.value != device:  # its synchronize would synchronize another device first
            return False
        if len(counters) != len(dev.workers):
            counters[:] = [(_words(w.put), _words(w.done)) for w in dev.workers]
        for put, done in counters:
            if done[0] < put[0]:
                return False
        return bool(timeline[0] >= value[0] - 1)

    return idle


def _words(signal: Any) -> Any:
    """A CPU signal's 64-bit words: the memoryview under tinygrad's MMIO view where it has one
    (indexing that is a Python call per read, on every free and small copy)."""
    words = signal._buf.cpu_view().view(fmt="Q")
    return getattr(words, "mv", words)


def move_now(buffer: Buffer, offset: int, host: memoryview, *, into_device: bool) -> bool:
    """Copy between a host-memory device buffer (CPU) at `offset` and writable host bytes with one
    `ctypes.memmove` (the allocator's copy without its synchronize: the caller knows the device
    is idle); False, with nothing copied, where either side has no address."""
    device = getattr(buffer._buf, "va_addr", None) if buffer.device.startswith("CPU") else None
    address = host_address(host)
    if device is None or address is None:
        return False
    if into_device:
        ctypes.memmove(device + offset, address, len(host))
    else:
        ctypes.memmove(address, device + offset, len(host))
    return True


def host_address(view: memoryview) -> int | None:
    """The address of a writable, contiguous host view's first byte; None if it has none."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError, BufferError):
        return None


def host_bytes(buffer: Buffer) -> memoryview | None:
    """The device memory itself as a writable byte view, where the device is host memory (CPU)."""
    allocator = buffer.allocator
    if not hasattr(allocator, "_as_buffer") or not str(buffer.device).startswith("CPU"):
        return None
    view = allocator._as_buffer(buffer._buf)
    assert isinstance(view, memoryview)
    return view.cast("B")


#: Byte alignment of a view's offset that tinygrad's kernels run on. Measured on CPU (clang):
#: 4-byte dtypes at offsets that are not multiples of 16 crash the process in the first
#: vectorized kernel (float4 loads); every dtype ran at multiples of 16 (tests/backends/test_view_alignment.py).
#: GPU renderers vectorize the same way, so 16 is used for every device until measured there.
VIEW_ALIGNMENT = 16


def tensor_view(buffer: Buffer, offset: int, shape: tuple[int, ...], dtype: str) -> Tensor:
    """A Tensor over the buffer's own memory at `offset` (zero-copy on every device)."""
    dt = dtype_of(dtype)
    if offset == 0 and not capabilities(buffer.device).sub_buffers:
        sub = whole_view(buffer, math.prod(shape), dt)
    else:
        sub = buffer.view(math.prod(shape), dt, offset).ensure_allocated()
    return Tensor(UOp.from_buffer(sub)).reshape(shape)


def whole_view(buffer: Buffer, size: int, dtype: DType) -> Buffer:
    """A view Buffer of `size` `dtype` items at offset 0 over the buffer's own device memory (its
    `cl_mem` on CL), for allocators without `_offset`. What `Buffer.allocate` does for a view,
    with the base's handle itself in place of an `_offset` of it: the view keeps its base alive,
    and deallocating it frees nothing."""
    assert size * dtype.itemsize <= buffer.nbytes
    view = Buffer(buffer.device, size, dtype, base=buffer, offset=0)
    view.allocator = buffer.allocator
    buffer.allocated_views += 1
    view._bufs[view.device] = buffer._buf
    return view


def blob_view(address: int, shape: tuple[int, ...], dtype: str) -> Tensor:
    """A CPU Tensor over host memory at `address` that tinygrad does not own (the fake's views)."""
    return Tensor.from_blob(address, shape, dtype=dtype_of(dtype), device="CPU")


def view_anchor(view: Tensor) -> Buffer:
    """The Buffer under a view. Every tinygrad object that can reach the view's memory holds it
    (through its UOp graph: movement ops, lazy ops, assign, load_state_dict(consume=True), TinyJit
    captures), so it is collected exactly when none is left (measured in tests/bridge/test_view_pins.py)."""
    buffer = view.uop.base.buffer
    assert isinstance(buffer, Buffer)
    return buffer


def holders(buffer: Buffer) -> dict[str, int]:
    """Which tinygrad objects can still reach `buffer`'s memory, by kind: `views` (tensors that
    are the memory itself, reshaped or sliced), `derived` (tensors whose lazy graph reads it),
    `grads` (tensors that are some tensor's `.grad` and reach it) and `jit` (TinyJit captures
    whose kernels use it). A census of every live tensor and capture: for diagnosis, not a hot
    path. What holds the memory some other way (a UOp kept by hand) is in none of them."""
    import gc

    from tinygrad.engine.jit import CapturedJit
    from tinygrad.tensor import all_tensors
    from tinygrad.uop import Ops
    from tinygrad.uop.ops import buffers

    def reaches(root: UOp) -> bool:
        return any(u.op is Ops.BUFFER and buffers.get(u) is buffer for u in root.toposort())

    counts = {"views": 0, "derived": 0, "grads": 0}
    live = [t for ref in list(all_tensors) if (t := ref()) is not None]
    grads = {id(t.grad) for t in live if t.grad is not None}
    for t in live:
        base = t.uop.base
        if base.op is Ops.BUFFER and buffers.get(base) is buffer:
            counts["grads" if id(t) in grads else "views"] += 1
        elif reaches(t.uop):
            counts["grads" if id(t) in grads else "derived"] += 1
    counts["jit"] = sum(isinstance(o, CapturedJit) and reaches(o._linear) for o in gc.get_objects())
    return counts


def markers(device: str) -> Callable[[], Callable[[], bool]]:
    """A maker of markers for `device`: each marker is a probe that is true once all work queued on
    the device before it was made has finished. The device's signals are looked up once, here."""
    dev: Any = Device[device]
    if hasattr(dev, "timeline_signal") and hasattr(dev, "timeline_value"):  # HCQ: NV, AMD, QCOM

        def hcq() -> Callable[[], bool]:
            signal, target = dev.timeline_signal, dev.timeline_value - 1
            return lambda: bool(signal.value >= target)

        return hcq
    if hasattr(dev, "signal") and hasattr(dev, "_wait_signal"):  # HCQ2: CPU
        sig = dev.signal("timeline")._buf.cpu_view().view(fmt="Q")
        value = dev.signal("value", 1, device="CPU")._buf.cpu_view().view(fmt="Q")

        def hcq2() -> Callable[[], bool]:
            target = value[0] - 1
            return lambda: bool(sig[0] >= target)

        return hcq2

    def synchronizing() -> Callable[[], bool]:  # CUDA, METAL, ...: no cheap query; synchronize once
        synced = False

        def synchronize() -> bool:
            nonlocal synced
            if not synced:
                dev.synchronize()
                synced = True
            return True

        return synchronize

    return synchronizing


def marker(device: str) -> Callable[[], bool]:
    """A probe that is true once all work queued on `device` so far has finished."""
    return markers(device)()


def synchronize(device: str) -> None:
    dev: Any = Device[device]
    dev.synchronize()


__all__ = [
    "VIEW_ALIGNMENT",
    "Buffer",
    "Capabilities",
    "allocate",
    "blob_view",
    "canonical_device",
    "capabilities",
    "copy_in",
    "copy_out",
    "default_device",
    "dtype_of",
    "host_address",
    "host_bytes",
    "idle_probe",
    "marker",
    "markers",
    "move_now",
    "open_device",
    "synchronize",
    "tensor_view",
    "view_anchor",
    "whole_view",
]
