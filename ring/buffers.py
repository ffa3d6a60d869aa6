"""A caller's bytes and arrays as the host ring and the transfers take them: any C-contiguous
buffer as one flat run of bytes, and a numpy dtype and shape checked before any array is made.
Anything else is refused with ARG-1; numpy is imported only when an array is asked for."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from devbridge.args import as_count, refuse
from devbridge.errors import short
from devbridge.types import dtype_name

if TYPE_CHECKING:
    import numpy as np


def byte_view(data: object) -> memoryview:
    """The bytes of `data`, a C-contiguous buffer, as one flat run of bytes (no copy); ARG-1 for
    anything else."""
    try:
        view = memoryview(data)  # type: ignore[arg-type]  # anything: what has no buffer is refused
    except (TypeError, ValueError):
        import numpy as np

        if not (isinstance(data, np.ndarray) and data.flags.c_contiguous):
            refuse(f"data must be a C-contiguous buffer (bytes, bytearray, memoryview, numpy array), got {short(data)}")
        view = memoryview(data.view(np.uint8).data)  # a dtype the buffer protocol cannot name
    if not view.c_contiguous:
        refuse(f"data must be C-contiguous, got a {view.format!r} buffer of shape {view.shape}")
    return view.cast("B")


def array_layout(dtype: object, shape: object) -> tuple[np.dtype[Any], list[int], int | None]:
    """A numpy dtype of fixed-size items, the dimensions of `shape` (an int or a sequence of ints
    >= 0) and their size in bytes (None for no shape); ARG-1 for anything else."""
    import numpy as np

    # numpy probes what it is given (its `dtype` attribute, ...): only names, classes and dtypes
    # reach it; a tinygrad dtype goes by its name
    given = dtype if type(dtype) is str or isinstance(dtype, (type, np.dtype)) else dtype_name(dtype)
    if given is None:  # (numpy would take None for float64)
        refuse(f"{short(dtype)} is not a numpy dtype")
    try:
        kind = np.dtype(given)
    except (TypeError, ValueError):
        refuse(f"{short(dtype)} is not a numpy dtype")
    if kind.hasobject or kind.itemsize == 0:
        refuse(f"no array of {kind} lies over raw bytes")
    if shape is None:
        return kind, [], None
    dims: list[int] = []
    for d in shape if isinstance(shape, (list, tuple)) else [shape]:
        n = as_count(d)
        if n is None or n < 0:
            refuse(f"an array's shape is an int or a sequence of ints >= 0, got {short(shape)}")
        dims.append(n)
    return kind, dims, kind.itemsize * math.prod(dims)
