"""Value types of the public surface. Each validates itself at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from devbridge.errors import InvalidSpecError, InvalidViewError, RangeError

if TYPE_CHECKING:
    from devbridge.ring import HostRing

#: tinygrad dtype names the bridge accepts, with their item sizes in bytes.
DTYPE_SIZES: dict[str, int] = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
}


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class TensorViewSpec:
    """The tensor a role sees over an allocation: shape, dtype, byte offset."""

    shape: tuple[int, ...]
    dtype: str
    offset: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple) or not self.shape:
            raise InvalidViewError("VIEW-2", f"shape must be a non-empty tuple, got {self.shape!r}")
        if not all(_is_count(d) and d > 0 for d in self.shape):
            raise InvalidViewError("VIEW-2", f"shape dimensions must be positive ints, got {self.shape!r}")
        if self.dtype not in DTYPE_SIZES:
            raise InvalidViewError("VIEW-2", f"unknown dtype {self.dtype!r}")
        if not _is_count(self.offset) or self.offset < 0:
            raise InvalidViewError("VIEW-2", f"offset must be a non-negative int, got {self.offset!r}")
        if self.offset % DTYPE_SIZES[self.dtype]:
            raise InvalidViewError(
                "VIEW-2", f"offset {self.offset} is not aligned to {self.dtype} ({DTYPE_SIZES[self.dtype]} B)"
            )

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


@dataclass(frozen=True, slots=True)
class ObjectSpec:
    """What an allocation holds: a named object of one dtype, used under a role.

    `view`, when given, is the TensorViewSpec the role uses; wrap_for_tinygrad
    then accepts exactly that view.
    """

    name: str
    dtype: str
    role: str = "data"
    view: TensorViewSpec | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidSpecError("SPEC-1", f"object name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.role, str) or not self.role:
            raise InvalidSpecError("SPEC-1", f"role must be a non-empty str, got {self.role!r}")
        if self.dtype not in DTYPE_SIZES:
            raise InvalidSpecError("SPEC-1", f"unknown dtype {self.dtype!r}; known: {sorted(DTYPE_SIZES)}")
        if self.view is not None and self.view.dtype != self.dtype:
            raise InvalidSpecError("SPEC-1", f"role view dtype {self.view.dtype} is not {self.dtype}")

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]


@dataclass(frozen=True, slots=True)
class DeviceHandle:
    """A device allocation as the worker sees it. Only a Bridge makes these."""

    id: int
    generation: int
    extent: int
    spec: ObjectSpec
    owner: int = field(repr=False)  # the Bridge that made it


def _check_range(what: str, offset: object, nbytes: object) -> None:
    if not _is_count(offset) or not _is_count(nbytes):
        raise RangeError("RANGE-1", f"{what} offset and size must be ints, got {offset!r}, {nbytes!r}")
    assert isinstance(offset, int) and isinstance(nbytes, int)
    if offset < 0 or nbytes <= 0:
        raise RangeError("RANGE-1", f"{what} needs offset >= 0 and size > 0, got {offset}, {nbytes}")


@dataclass(frozen=True, slots=True)
class DeviceRange:
    """`nbytes` bytes of an allocation starting at byte `offset`."""

    handle: DeviceHandle
    offset: int
    nbytes: int

    def __post_init__(self) -> None:
        _check_range("device range", self.offset, self.nbytes)
        if self.offset + self.nbytes > self.handle.extent:
            raise RangeError(
                "RANGE-1",
                f"device range [{self.offset}, {self.offset + self.nbytes}) exceeds extent {self.handle.extent}",
            )

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True, slots=True)
class HostRange:
    """`nbytes` bytes of a HostRing at stream offset `start` (stream offsets never wrap)."""

    ring: HostRing = field(repr=False)
    start: int
    nbytes: int

    def __post_init__(self) -> None:
        _check_range("host range", self.start, self.nbytes)

    @property
    def end(self) -> int:
        return self.start + self.nbytes

    def sub(self, offset: int, nbytes: int) -> HostRange:
        """The part of this range at `offset` (relative), `nbytes` long."""
        _check_range("host sub-range", offset, nbytes)
        if offset + nbytes > self.nbytes:
            raise RangeError("RANGE-1", f"sub-range [{offset}, {offset + nbytes}) exceeds {self.nbytes} bytes")
        return HostRange(self.ring, self.start + offset, nbytes)
