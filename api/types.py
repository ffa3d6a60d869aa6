"""Value types of the public surface. Each validates itself at construction."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from devbridge.args import as_count
from devbridge.errors import (
    InvalidHandleError,
    InvalidSpecError,
    InvalidViewError,
    RangeError,
    short,
)

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


#: tinygrad's names of its dtypes (`dtypes.float32.name == "float"`), by ours.
TINYGRAD_NAMES = {
    "signed char": "int8", "unsigned char": "uint8", "short": "int16", "unsigned short": "uint16",
    "int": "int32", "unsigned int": "uint32", "long": "int64", "unsigned long": "uint64",
    "half": "float16", "__bf16": "bfloat16", "float": "float32", "double": "float64", "bool": "bool",
}  # fmt: skip


def dtype_name(dtype: object) -> str | None:
    """Our name of a dtype given as a name ("float32"), a numpy dtype or scalar type
    (`np.float32`, `np.dtype("f4")`) or a tinygrad dtype (`dtypes.float32`); None for anything
    else. Read from the objects' names: neither numpy nor tinygrad is imported."""
    if type(dtype) is str:
        return dtype if dtype in DTYPE_SIZES else None
    kind = dtype if isinstance(dtype, type) else type(dtype)
    module = getattr(kind, "__module__", "") or ""
    if module.split(".")[0] == "numpy":
        if getattr(dtype, "byteorder", "=") == ">":  # (a dtype's: a scalar type has its own)
            return None  # big-endian: not the bytes a device view reads
        name = getattr(dtype, "__name__" if isinstance(dtype, type) else "name", None)
        name = "bool" if name == "bool_" else name
        return name if type(name) is str and name in DTYPE_SIZES else None
    if module == "tinygrad.dtype" and kind.__name__ == "DType":  # a scalar dtype, not a pointer or vector
        name = TINYGRAD_NAMES.get(str(getattr(dtype, "name", "")))
        return name if name is not None and getattr(dtype, "itemsize", None) == DTYPE_SIZES[name] else None
    return None


#: Largest allocation extent the bridge asks a backend for (256 TiB: beyond any device's memory).
MAX_EXTENT = 1 << 48


@dataclass(frozen=True, slots=True)
class TensorViewSpec:
    """The tensor a role sees over an allocation: shape, dtype, byte offset. The shape may be
    given as a list and the dtype as a numpy or tinygrad dtype: both are kept in the one form
    (a tuple of ints, a name such as "float32"), so equal views compare equal."""

    shape: tuple[int, ...]
    dtype: str
    offset: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.shape, (tuple, list)) or not self.shape:
            raise InvalidViewError("VIEW-2", f"shape must be a non-empty tuple or list, got {short(self.shape)}")
        counts = [as_count(d) for d in self.shape]
        dims = tuple(d for d in counts if d is not None and d > 0)
        if len(dims) != len(counts):
            raise InvalidViewError("VIEW-2", f"shape dimensions must be positive ints, got {short(self.shape)}")
        dtype = dtype_name(self.dtype)
        if dtype is None:
            raise InvalidViewError("VIEW-2", f"unknown dtype {short(self.dtype)}")
        object.__setattr__(self, "dtype", dtype)
        offset = as_count(self.offset)
        if offset is None or offset < 0:
            raise InvalidViewError("VIEW-2", f"offset must be a non-negative int, got {short(self.offset)}")
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "offset", offset)
        if math.prod(dims) * DTYPE_SIZES[self.dtype] > MAX_EXTENT:
            raise InvalidViewError("VIEW-2", f"a view of shape {short(dims)} is larger than any allocation")
        if self.offset % DTYPE_SIZES[self.dtype]:
            raise InvalidViewError(
                "VIEW-2", f"offset {self.offset} is not aligned to {self.dtype} ({DTYPE_SIZES[self.dtype]} B)"
            )

    @property
    def nbytes(self) -> int:
        """The bytes the view covers: its elements times the dtype's size."""
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
        if type(self.name) is not str or not self.name:
            raise InvalidSpecError("SPEC-1", f"object name must be a non-empty str, got {short(self.name)}")
        if type(self.role) is not str or not self.role:
            raise InvalidSpecError("SPEC-1", f"role must be a non-empty str, got {short(self.role)}")
        if type(self.dtype) is not str or self.dtype not in DTYPE_SIZES:
            raise InvalidSpecError("SPEC-1", f"unknown dtype {short(self.dtype)}; known: {sorted(DTYPE_SIZES)}")
        if self.view is not None and not isinstance(self.view, TensorViewSpec):
            raise InvalidSpecError("SPEC-1", f"a role's view must be a TensorViewSpec or None, got {short(self.view)}")
        if self.view is not None and self.view.dtype != self.dtype:
            raise InvalidSpecError("SPEC-1", f"role view dtype {self.view.dtype} is not {self.dtype}")

    @property
    def itemsize(self) -> int:
        """Bytes per item of the dtype."""
        return DTYPE_SIZES[self.dtype]


@dataclass(frozen=True, slots=True, init=False)
class DeviceHandle:
    """A device allocation as the worker sees it: a capability only a Bridge makes.

    The Bridge never trusts these fields: it resolves the handle to its own record
    of the allocation and uses only the record. `seal` binds the fields to the
    Bridge that issued them, so an altered or hand-built handle is refused (HANDLE-1).
    """

    id: int
    generation: int
    extent: int
    spec: ObjectSpec
    owner: int = field(repr=False)  # the Bridge that made it
    seal: int = field(default=0, repr=False, compare=False)

    def __init__(  # the generated one, through the slots' setters (made per allocation)
        self, id: int, generation: int, extent: int, spec: ObjectSpec, owner: int, seal: int = 0
    ) -> None:
        _set_id(self, id)
        _set_generation(self, generation)
        _set_extent(self, extent)
        _set_spec(self, spec)
        _set_owner(self, owner)
        _set_seal(self, seal)


def slot_setters(cls: type, *names: str) -> tuple[Callable[[object, object], None], ...]:
    """The setters of a slotted class's fields, which fill a frozen instance without its
    `__setattr__` (the fastest way to build one whose fields are known valid)."""
    return tuple(vars(cls)[name].__set__ for name in names)


_set_id, _set_generation, _set_extent, _set_spec, _set_owner, _set_seal = slot_setters(
    DeviceHandle, "id", "generation", "extent", "spec", "owner", "seal"
)


def range_fields(what: str, offset: object, nbytes: object) -> tuple[int, int]:
    """Offset and size as ints: offset >= 0, size > 0 (RANGE-1)."""
    o = offset if type(offset) is int else as_count(offset)
    n = nbytes if type(nbytes) is int else as_count(nbytes)
    if o is None or n is None:
        raise RangeError("RANGE-1", f"{what} offset and size must be ints, got {short(offset)}, {short(nbytes)}")
    if o < 0 or n <= 0:
        raise RangeError("RANGE-1", f"{what} needs offset >= 0 and size > 0, got {o}, {n}")
    return o, n


@dataclass(frozen=True, slots=True)
class DeviceRange:
    """`nbytes` bytes of an allocation starting at byte `offset`. Checked here against the
    handle's extent; the Bridge checks it again against its own record of the allocation."""

    handle: DeviceHandle
    offset: int
    nbytes: int

    def __post_init__(self) -> None:
        if not isinstance(self.handle, DeviceHandle):
            raise InvalidHandleError("HANDLE-1", f"a device range needs a DeviceHandle, got {short(self.handle)}")
        offset, nbytes = range_fields("device range", self.offset, self.nbytes)
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "nbytes", nbytes)
        extent = self.handle.extent if type(self.handle.extent) is int else as_count(self.handle.extent)
        if extent is None:
            raise InvalidHandleError("HANDLE-1", f"{short(self.handle)} has no integer extent")
        if offset + nbytes > extent:
            raise RangeError("RANGE-1", f"device range [{offset}, {offset + nbytes}) exceeds extent {extent}")

    @property
    def end(self) -> int:
        """The byte offset just past the range."""
        return self.offset + self.nbytes
