"""TensorViewSpec takes a shape as a list and a dtype as a numpy or tinygrad dtype, and keeps
the one form (a tuple, our name), so equal views compare equal (VIEW-1, VIEW-2)."""

from __future__ import annotations

import numpy as np
import pytest
from rules import refused
from tinygrad import dtypes

from devbridge import Bridge, ObjectSpec, TensorViewSpec
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.types import DTYPE_SIZES

#: Every dtype by our name, with numpy's and tinygrad's (numpy has no bfloat16).
NAMES = sorted(DTYPE_SIZES)


@pytest.mark.holds("VIEW-1")
@pytest.mark.parametrize("name", NAMES)
def test_numpy_and_tinygrad_dtypes_become_our_names(name: str) -> None:
    tiny = getattr(dtypes, name)
    given: list[object] = [name, tiny]
    if name != "bfloat16":
        given += [np.dtype(name), np.dtype(name).type, np.dtype(name).newbyteorder("<") if name != "bool" else np.bool_]
    specs = {TensorViewSpec([2, np.int64(3)], d, 0) for d in given}
    assert specs == {TensorViewSpec((2, 3), name, 0)}
    assert all(s.dtype == name and type(s.dtype) is str and s.shape == (2, 3) for s in specs)


@pytest.mark.rejects("VIEW-2")
@pytest.mark.parametrize(
    "dtype",
    [np.dtype(">f4"), np.dtype(">i2"), np.complex64, np.dtype("U4"), np.dtype([("a", "<f4")]), "float", "f4", float,
     int, 4, None, dtypes.float32.name, b"float32"],
    ids=repr,
)  # fmt: skip
def test_a_dtype_we_cannot_view_is_refused(dtype: object) -> None:
    with refused("VIEW-2"):
        TensorViewSpec((4,), dtype)  # type: ignore[arg-type]


@pytest.mark.rejects("VIEW-2")
@pytest.mark.parametrize("shape", [[], [0], [2, -1], [2.0], ["2"], {2: 2}, range(2), np.array([2, 2]), [True]])
def test_a_shape_that_is_not_a_tuple_or_list_of_positive_ints_is_refused(shape: object) -> None:
    with refused("VIEW-2"):
        TensorViewSpec(shape, "float32")  # type: ignore[arg-type]


@pytest.mark.holds("VIEW-1")
def test_a_view_made_from_numpy_names_is_the_same_zero_copy_tensor() -> None:
    bridge = Bridge(TinygradBackend("CPU"))
    h = bridge.alloc_device(ObjectSpec("w", "float32", view=TensorViewSpec((2, 2), "float32")), 16)
    bridge.upload(h, np.arange(4, dtype=np.float32))
    t = bridge.wrap_for_tinygrad(h, TensorViewSpec([2, 2], np.float32))  # the role's view, given otherwise
    assert t.dtype == dtypes.float32 and t.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    t.assign(t + 1).realize()
    assert bridge.download(h, np.float32, 4).tolist() == [1.0, 2.0, 3.0, 4.0]
