"""Hostile input: every public call, given any argument of any type, returns normally or raises a
BridgeError naming its rule; it never crashes the process; and a call that raises changes nothing
(bridge stats and states, the ring, the fake backend's calls and memory) and reaches no backend.

Three layers:
* one Hypothesis property per entry point, drawing every argument from a broad "anything"
  strategy (plus valid values, foreign and forged handles and ranges);
* targeted tests with the exact error type and rule for each parameter (ARG-1, ALLOC-1, SPEC-1,
  HANDLE-1, RANGE-1, RING-2, VIEW-2), one bad argument at a time;
* forged handles on the fake and on tinygrad's CPU device; the forgeries that could touch memory
  outside the allocation run on tinygrad in a child process, so a regression cannot kill the run.
"""

from __future__ import annotations

import copy
import dataclasses
import decimal
import fractions
import math
import numbers
import operator
import re
import subprocess
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from rules import assert_all_refused, assert_refused
from support import F32, U8, put, read_device, snapshot

from devbridge import (
    Bridge,
    BridgeError,
    DeviceAllocationError,
    DeviceHandle,
    DeviceRange,
    Event,
    HostRange,
    HostRing,
    InvalidArgumentError,
    InvalidHandleError,
    InvalidSpecError,
    InvalidViewError,
    ObjectSpec,
    RangeError,
    RingFullError,
    TensorViewSpec,
)
from devbridge.backends.fake import FakeBackend
from devbridge.backends.faulty import FaultyBackend
from devbridge.backends.tinygrad import TinygradBackend

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
RULE_ID = re.compile(r"[A-Z][A-Z0-9]*-[A-Z0-9]+")
PATTERN = bytes(range(64))  # the forgery target's device bytes
NEIGHBOUR = bytes(range(100, 164))  # the other live allocation's device bytes
BIG = b"\x00" * (1 << 20)  # a 1 MiB argument: its repr must not end up in a message
DTYPES = ["bool", "uint8", "int16", "float16", "bfloat16", "float32", "int64", "float64"]
VIEW = TensorViewSpec((16,), "uint8")

FAST = settings(
    max_examples=200,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
FEWER = settings(FAST, max_examples=80)


# ---------------------------------------------------------------- hostile values


class Hostile:
    """An argument whose every dunder the bridge might touch raises."""

    def _fail(self, *_: object) -> Any:
        raise RuntimeError("Hostile argument touched")

    __repr__ = __str__ = __eq__ = __ne__ = __hash__ = __bool__ = __index__ = __int__ = __float__ = _fail  # type: ignore[assignment]
    __lt__ = __le__ = __gt__ = __ge__ = __len__ = __iter__ = __add__ = __radd__ = __format__ = _fail  # type: ignore[assignment]

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # how Hypothesis prints it
        p.text("Hostile()")


class SneakyInt(int):
    """An int (a subclass) whose repr raises: a message quoting it must still be made."""

    def __repr__(self) -> str:
        raise RuntimeError("SneakyInt.__repr__")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(f"SneakyInt({int.__int__(self)})")


class LyingInt(int):
    """An int whose comparisons all claim it is in range (`x < 0` is False, `x > 0` is True):
    only its value counts."""

    def __lt__(self, other: object) -> bool:
        return False

    __le__ = __lt__

    def __gt__(self, other: object) -> bool:
        return True

    __ge__ = __gt__
    __hash__ = int.__hash__

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(f"LyingInt({int.__int__(self)})")


class Impostor(DeviceHandle):
    """A DeviceHandle subclass carrying a real handle's slots that lies: equal to anything,
    and claiming a 1 TiB extent."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0

    @property  # type: ignore[misc]
    def extent(self) -> int:  # type: ignore[override]
        return 1 << 40


def impostor(h: DeviceHandle) -> DeviceHandle:
    forged = copy.copy(h)
    object.__setattr__(forged, "__class__", Impostor)
    return forged


BOUNDARY_INTS = [0, 1, -1, 7, 8, 16, 63, 64, 65, 2**31, 2**32, 2**47, 2**48, 2**48 + 1]
BOUNDARY_INTS += [2**62, 2**63 - 1, 2**63, 2**64, 2**70, -(2**63), -(2**70)]
NUMPY_VALUES: list[object] = [
    np.int64(8),
    np.int64(-8),
    np.int32(0),
    np.uint8(1),
    np.uint64(2**64 - 1),
    np.int64(2**62),
    np.bool_(True),
    np.bool_(False),
    np.float64(8.0),
    np.float64("nan"),
    np.float32(0.5),
    np.array(8),
    np.array([1, 2]),
    np.zeros(3, dtype=np.uint8),
]
BUILTIN_TYPES = [complex, bytearray, frozenset, range, slice, memoryview, fractions.Fraction, decimal.Decimal]

ANYTHING_BASE: st.SearchStrategy[object] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(BOUNDARY_INTS),
    st.floats(),  # nan, inf, -0.0, huge, subnormal
    st.text(max_size=16),
    st.binary(max_size=32),
    st.lists(st.integers(-2, 70), max_size=4),
    st.lists(st.integers(1, 8), min_size=1, max_size=3).map(tuple),
    st.tuples(st.integers(min_value=-(2**70), max_value=2**70)),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
    st.sampled_from(BUILTIN_TYPES).flatmap(st.from_type),
    st.sampled_from(NUMPY_VALUES),
    st.builds(Hostile),
    st.sampled_from([SneakyInt(-1), SneakyInt(8), LyingInt(-8), LyingInt(1 << 50)]),
    st.builds(object),
    st.sampled_from([int, str, bytes, DeviceHandle, ObjectSpec, FakeBackend]),
)


def ident(value: object) -> str:
    """A test id for any value (a Hostile's repr raises; a 1 MiB one is long; an address differs
    between processes, which pytest-xdist's workers must not see)."""
    text = "Hostile()" if isinstance(value, Hostile) else re.sub(r" at 0x[0-9a-f]+", "", repr(value))
    return text if len(text) <= 40 else f"{type(value).__name__}[{len(text)}]"


def field_id(kwargs: dict[str, object]) -> str:
    return ",".join(f"{k}={ident(v)}" for k, v in kwargs.items())


# ---------------------------------------------------------------- a world with non-trivial state


@dataclass
class World:
    """A fake-backed bridge and ring mid-run, plus a second bridge and ring to be foreign to them."""

    fake: FakeBackend
    bridge: Bridge
    ring: HostRing
    handles: list[DeviceHandle]  # idle, idle (the forgery target, id 1), copying, computing, freed
    src: HostRange  # filled, unreleased, free to copy from
    out: HostRange  # reserved, free to copy into
    reading: HostRange  # read by the pending input copy
    failed: HostRange  # written by a failed output copy
    events: dict[str, Event]
    other_bridge: Bridge
    other_handle: DeviceHandle
    other_ring: HostRing
    other_range: HostRange

    @property
    def h0(self) -> DeviceHandle:
        return self.handles[0]

    @property
    def h1(self) -> DeviceHandle:
        return self.handles[1]

    def snap(self) -> object:
        return snapshot(self.bridge, self.fake, self.ring, self.handles)

    def forgeries(self) -> dict[str, DeviceHandle]:
        return forgeries(self.h1, self.h0, self.other_handle.owner)

    def extras(self) -> list[object]:
        """World-specific values to draw from besides the base ones."""
        enlarged = dataclasses.replace(self.h1, extent=1 << 40)
        return [
            *self.handles,
            self.other_handle,
            *self.forgeries().values(),
            self.src,
            self.out,
            self.reading,
            self.failed,
            self.other_range,
            HostRange(self.ring, 10**6, 16),  # never reserved
            DeviceRange(self.h0, 0, 16),
            DeviceRange(self.h1, 48, 16),
            DeviceRange(self.other_handle, 0, 16),
            DeviceRange(enlarged, 1 << 39, 16),
            smuggled(self.h1, "x"),
            U8,
            F32,
            ObjectSpec("w", "float32", role="weights", view=TensorViewSpec((4,), "float32")),
            VIEW,
            TensorViewSpec((4,), "float32"),
            TensorViewSpec((1 << 40,), "uint8"),
            self.ring,
            self.other_ring,
            self.bridge,
            self.other_bridge,
            self.fake,
            *self.events.values(),
            BIG,
        ]


DONE_EVENTS = ["copy_done", "copy_failed", "compute_done"]


def make_world() -> World:
    fake = FakeBackend(capacity=1 << 20)  # a huge valid extent fails on the backend instead of taking the RAM
    bridge, ring = Bridge(fake), HostRing(4096)
    h0 = bridge.alloc_device(U8, 64)
    bridge.host_to_device(put(ring, NEIGHBOUR), DeviceRange(h0, 0, 64))
    h1 = bridge.alloc_device(U8, 64)
    copy_done = bridge.host_to_device(put(ring, PATTERN), DeviceRange(h1, 0, 64))
    h2 = bridge.alloc_device(F32, 64)
    reading = put(ring, b"r" * 16)
    copy_pending = bridge.host_to_device(reading, DeviceRange(h2, 0, 16), sync=False)
    fake.fail_next("copy_out")
    failed = ring.reserve(8)
    copy_failed = bridge.device_to_host(DeviceRange(h0, 0, 8), failed, sync=False)
    fake.complete(copy_failed)
    h3 = bridge.alloc_device(F32, 32)
    compute_pending = bridge.compute(h3)
    compute_done = bridge.compute(h0)
    fake.complete(compute_done)
    h4 = bridge.alloc_device(U8, 16)
    bridge.free_device(h4)
    src, out = put(ring, b"s" * 16), ring.reserve(16)
    other_bridge, other_ring = Bridge(FakeBackend()), HostRing(1024)
    other_handle = other_bridge.alloc_device(U8, 64)
    handles = [h0, h1, h2, h3, h4]
    assert [bridge.state(h) for h in handles] == ["idle", "idle", "copying", "computing", "freed"]
    assert h1.id == 1 and copy_failed.error is not None
    events: dict[str, Event] = {
        "copy_done": copy_done,
        "copy_pending": copy_pending,
        "copy_failed": copy_failed,
        "compute_pending": compute_pending,
        "compute_done": compute_done,
    }
    return World(
        fake, bridge, ring, handles, src, out, reading, failed, events,
        other_bridge, other_handle, other_ring, put(other_ring, b"o" * 16),
    )  # fmt: skip


def anything(w: World) -> st.SearchStrategy[object]:
    return st.one_of(ANYTHING_BASE, st.sampled_from(w.extras()))


def either(valid: list[object], w: World) -> st.SearchStrategy[object]:
    """A valid value about half the time, else anything: so later checks are reached too."""
    return st.one_of(st.sampled_from(valid), anything(w))


FORGED_FIELDS: dict[str, Callable[[DeviceHandle, DeviceHandle, int], dict[str, object]]] = {
    "id-of-another-live-allocation": lambda h, n, o: {"id": n.id},
    "id-never-issued": lambda h, n, o: {"id": 999},
    "id-negative": lambda h, n, o: {"id": -1},
    "id-float": lambda h, n, o: {"id": float(h.id)},
    "id-bool": lambda h, n, o: {"id": True},  # == 1 == the target's id
    "id-numpy": lambda h, n, o: {"id": np.int64(h.id)},
    "id-str": lambda h, n, o: {"id": "x"},
    "id-none": lambda h, n, o: {"id": None},
    "generation-plus-1": lambda h, n, o: {"generation": h.generation + 1},
    "generation-minus-1": lambda h, n, o: {"generation": h.generation - 1},
    "generation-float": lambda h, n, o: {"generation": float(h.generation)},
    "extent-64KiB": lambda h, n, o: {"extent": 1 << 16},
    "extent-1TiB": lambda h, n, o: {"extent": 1 << 40},
    "extent-smaller": lambda h, n, o: {"extent": h.extent // 2},
    "extent-float": lambda h, n, o: {"extent": float(h.extent)},
    "spec-float64": lambda h, n, o: {"spec": ObjectSpec(h.spec.name, "float64")},
    "spec-other-role": lambda h, n, o: {"spec": ObjectSpec(h.spec.name, h.spec.dtype, role="weights")},
    "spec-none": lambda h, n, o: {"spec": None},
    "owner-other-int": lambda h, n, o: {"owner": h.owner + 1000},
    "owner-of-another-bridge": lambda h, n, o: {"owner": o},
    "owner-float": lambda h, n, o: {"owner": float(h.owner)},
}
FORGERIES = [*FORGED_FIELDS, "hand-built-never-issued", "subclass-claiming-extent-1TiB"]


def forgeries(h: DeviceHandle, neighbour: DeviceHandle, foreign_owner: int) -> dict[str, DeviceHandle]:
    """Copies of `h` with one field changed (value or type), and a handle built by hand."""
    forged = {name: dataclasses.replace(h, **f(h, neighbour, foreign_owner)) for name, f in FORGED_FIELDS.items()}
    forged["hand-built-never-issued"] = DeviceHandle(999, h.generation, h.extent, h.spec, owner=h.owner)
    forged["subclass-claiming-extent-1TiB"] = impostor(h)
    return forged


def smuggled(h: DeviceHandle, handle: object, offset: int = 0, nbytes: int = 16) -> DeviceRange:
    """A DeviceRange holding `handle` (any object), built past DeviceRange's own check
    as a hostile caller can: a frozen dataclass is only frozen to its own __setattr__."""
    r = DeviceRange(h, 0, 16)
    object.__setattr__(r, "handle", handle)
    object.__setattr__(r, "offset", offset)
    object.__setattr__(r, "nbytes", nbytes)
    return r


# ---------------------------------------------------------------- checks


def check_error(e: BridgeError) -> None:
    assert isinstance(e.rule, str) and RULE_ID.fullmatch(e.rule), f"{type(e).__name__} with rule {e.rule!r}"
    assert isinstance(str(e), str)


def attempt(w: World, call: Callable[[], object], *, backend_may_fail: str | None = None) -> BridgeError | None:
    """`call` returns or raises a BridgeError; a refusal changes nothing and reaches no backend.
    `backend_may_fail`: the rule of a backend failure (a real call was made) that is allowed."""
    before, ncalls = w.snap(), len(w.fake.calls)
    try:
        call()
    except BridgeError as e:
        check_error(e)
        if e.rule == backend_may_fail:
            assert isinstance(e, DeviceAllocationError) and w.fake.ops()[ncalls:] == ["alloc"]
            return e
        assert w.fake.ops()[ncalls:] == [], f"refused with {e.rule} after backend calls"
        assert w.snap() == before, f"refused with {e.rule} but changed state"
        return e
    return None


def refused(w: World, call: Callable[[], object], error: type[BridgeError], rule: str) -> BridgeError:
    """`call` raises exactly `error` citing `rule`, changes nothing and reaches no backend."""
    before, ncalls = w.snap(), len(w.fake.calls)
    with pytest.raises(error) as e:
        call()
    assert (type(e.value).__name__, e.value.rule) == (error.__name__, rule)
    assert w.fake.ops()[ncalls:] == []
    assert w.snap() == before
    assert_refused(e.value, rule)
    return e.value


def raises_exactly(call: Callable[[], object], error: type[BridgeError], rule: str) -> BridgeError:
    with pytest.raises(error) as e:
        call()
    assert (type(e.value).__name__, e.value.rule) == (error.__name__, rule)
    assert_refused(e.value, rule)
    return e.value


def outcome(call: Callable[[], object]) -> str:
    """What a call did, in words: for comparing many calls in one assertion."""
    try:
        call()
    except BridgeError as e:
        return f"{type(e).__name__} {e.rule}"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:120]}"
    return "returned"


def refusals(w: World, calls: dict[str, Callable[[], object]]) -> dict[str, str]:
    """Each call's outcome, with any change it made to the world: one assertion shows them all."""
    out = {}
    for op, call in calls.items():
        before, ncalls = w.snap(), len(w.fake.calls)
        out[op] = outcome(call)
        if w.fake.ops()[ncalls:]:
            out[op] += f", after backend calls {w.fake.ops()[ncalls:]}"
        elif w.snap() != before:
            out[op] += ", and changed state"
    return out


def bounded(call: Callable[[], object], seconds: float = 10.0) -> Callable[[], object]:
    """`call`, made on a daemon thread: a wait that never returns fails the test instead of hanging
    the run (a NaN timeout once made wait spin forever)."""

    def run() -> object:
        result: list[object] = []
        error: list[BaseException] = []

        def target() -> None:
            try:
                result.append(call())
            except BaseException as e:
                error.append(e)

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(seconds)
        assert not thread.is_alive(), f"the call did not return within {seconds} s"
        if error:
            raise error[0]
        return result[0]

    return run


def certainly_invalid_timeout(t: object) -> bool:
    """A timeout a correct wait refuses at once (so it cannot block on a pending event)."""
    if t is None or isinstance(t, bool | np.bool_):
        return t is not None
    if not isinstance(t, numbers.Real):
        return True
    f = float(t)
    return math.isnan(f) or f < 0


def mid_sized(v: object) -> bool:
    """An integer a HostRing could really allocate and zero (GiBs): not drawn, it would take the RAM."""
    if isinstance(v, Hostile):
        return False
    try:
        n = operator.index(v)  # type: ignore[arg-type]
    except Exception:
        return False
    return (1 << 22) <= n < (1 << 44)


# ---------------------------------------------------------------- 1. one property per entry point


@FEWER
@given(data=st.data())
def test_any_argument_to_bridge(data: st.DataObject) -> None:
    w = make_world()
    backend = data.draw(either([FakeBackend(), FaultyBackend(FakeBackend()), FakeBackend], w), label="backend")
    attempt(w, lambda: Bridge(backend))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_alloc_device(data: st.DataObject) -> None:
    w = make_world()
    spec = data.draw(either([U8, F32], w), label="spec")
    extent = data.draw(either([8, 64, 1 << 20, 1 << 48, np.int64(8)], w), label="extent")
    attempt(w, lambda: w.bridge.alloc_device(spec, extent), backend_may_fail="ALLOC-2")  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_argument_to_free_device(data: st.DataObject) -> None:
    w = make_world()
    handle = data.draw(either(list(w.handles), w), label="handle")
    attempt(w, lambda: w.bridge.free_device(handle))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_argument_to_state(data: st.DataObject) -> None:
    w = make_world()
    handle = data.draw(either(list(w.handles), w), label="handle")
    attempt(w, lambda: w.bridge.state(handle))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_compute(data: st.DataObject) -> None:
    w = make_world()
    handles = data.draw(st.lists(either(w.handles[:4], w), max_size=3), label="handles")
    attempt(w, lambda: w.bridge.compute(*handles))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_wrap_for_tinygrad(data: st.DataObject) -> None:
    w = make_world()
    handle = data.draw(either(list(w.handles), w), label="handle")
    view = data.draw(either([VIEW, TensorViewSpec((16,), "float32"), TensorViewSpec((4, 4), "uint8", 8)], w))
    attempt(w, lambda: w.bridge.wrap_for_tinygrad(handle, view))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_host_to_device(data: st.DataObject) -> None:
    w = make_world()
    src = data.draw(either([w.src, w.src.sub(0, 8)], w), label="src")
    dst = data.draw(either([DeviceRange(w.h0, 0, 16), DeviceRange(w.h1, 0, 8)], w), label="dst")
    sync = data.draw(either([True, False], w), label="sync")
    release = data.draw(either([True, False], w), label="release")
    attempt(w, lambda: w.bridge.host_to_device(src, dst, sync=sync, release=release))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_device_to_host(data: st.DataObject) -> None:
    w = make_world()
    src = data.draw(either([DeviceRange(w.h0, 0, 16), DeviceRange(w.h1, 8, 8)], w), label="src")
    dst = data.draw(either([w.out, w.out.sub(8, 8)], w), label="dst")
    sync = data.draw(either([True, False], w), label="sync")
    attempt(w, lambda: w.bridge.device_to_host(src, dst, sync=sync))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_upload(data: st.DataObject) -> None:
    w = make_world()
    handle = data.draw(either([w.h0, w.h1], w), label="handle")
    array = data.draw(either([np.arange(4, dtype=np.float32), b"u" * 8, np.zeros((2, 2), np.int16)], w), label="array")
    offset = data.draw(either([0, 8, 60], w), label="offset")
    ring = data.draw(either([None, w.ring], w), label="ring")
    sync = data.draw(either([True, False], w), label="sync")
    attempt(w, lambda: w.bridge.upload(handle, array, offset=offset, ring=ring, sync=sync))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_download(data: st.DataObject) -> None:
    w = make_world()
    handle = data.draw(either([w.h0, w.h1], w), label="handle")
    dtype = data.draw(either([np.float32, "u1", "i2"], w), label="dtype")
    shape = data.draw(either([4, (2, 2), [8], ()], w), label="shape")
    offset = data.draw(either([0, 8, 60], w), label="offset")
    ring = data.draw(either([None, w.ring], w), label="ring")
    attempt(w, lambda: w.bridge.download(handle, dtype, shape, offset=offset, ring=ring))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_the_rings_write_array_and_reserve(data: st.DataObject) -> None:
    w = make_world()
    r = data.draw(either([w.src, w.out, w.src.sub(0, 8)], w), label="range")
    payload = data.draw(either([b"w" * 16, np.ones(4, np.float32), memoryview(bytes(8))], w), label="data")
    dtype = data.draw(either(["f4", np.uint8], w), label="dtype")
    shape = data.draw(either([None, 4, (2, 2)], w), label="shape")
    nbytes = data.draw(either([1, 16, 4096, 5000], w), label="nbytes")
    timeout = data.draw(either([0, 0.0, 0.001], w), label="timeout")
    attempt(w, lambda: w.ring.write(r, payload))  # type: ignore[arg-type]
    attempt(w, lambda: w.ring.array(r, dtype, shape))  # type: ignore[arg-type]
    # only timeouts refused at once or short: a valid long one would wait for a release no one makes
    if timeout is not None and (certainly_invalid_timeout(timeout) or float(timeout) <= 0.01):  # type: ignore[arg-type]
        attempt(w, bounded(lambda: w.ring.reserve(nbytes, timeout=timeout), 5.0))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_timeout_to_event_wait(data: st.DataObject) -> None:
    w = make_world()
    timeout = data.draw(either([None, 0, 0.0, 0.001], w), label="timeout")
    # a pending event only gets timeouts a correct wait refuses; valid ones would block or time out
    name = data.draw(st.sampled_from(sorted(w.events) if certainly_invalid_timeout(timeout) else DONE_EVENTS))
    attempt(w, bounded(lambda: w.events[name].wait(timeout), 5.0))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_wait_any_and_wait_all(data: st.DataObject) -> None:
    w = make_world()
    timeout = data.draw(either([None, 0, 0.001], w), label="timeout")
    # pending events only with timeouts a correct wait refuses; valid ones would block or time out
    names = sorted(w.events) if certainly_invalid_timeout(timeout) else DONE_EVENTS
    valid: list[object] = [[w.events[n]] for n in names] + [
        [w.events[n] for n in names],
        tuple(w.events[n] for n in names),
    ]
    events = data.draw(either(valid, w), label="events")
    call = data.draw(st.sampled_from(["wait_any", "wait_all"]), label="call")
    attempt(w, bounded(lambda: getattr(w.bridge, call)(events, timeout), 5.0))


@FAST
@given(data=st.data())
def test_any_capacity_to_host_ring(data: st.DataObject) -> None:
    w = make_world()
    capacity = data.draw(either([1, 64, 4096], w), label="capacity")
    assume(not mid_sized(capacity))
    attempt(w, lambda: HostRing(capacity))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_size_to_reserve(data: st.DataObject) -> None:
    w = make_world()
    n = data.draw(either([1, 16, 4096], w), label="n")
    attempt(w, lambda: w.ring.reserve(n))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_range_to_ring_view_released_release(data: st.DataObject) -> None:
    w = make_world()
    method = data.draw(st.sampled_from(["view", "released", "release"]), label="method")
    r = data.draw(either([w.src, w.out, w.reading, w.failed, w.src.sub(4, 4)], w), label="r")
    attempt(w, lambda: getattr(w.ring, method)(r))


@FAST
@given(data=st.data())
def test_any_arguments_to_host_range(data: st.DataObject) -> None:
    w = make_world()
    ring = data.draw(either([w.ring], w), label="ring")
    start = data.draw(either([0, 16, 4096], w), label="start")
    nbytes = data.draw(either([1, 16], w), label="nbytes")
    attempt(w, lambda: HostRange(ring, start, nbytes))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_host_range_sub(data: st.DataObject) -> None:
    w = make_world()
    offset = data.draw(either([0, 4, 15], w), label="offset")
    nbytes = data.draw(either([1, 4, 16], w), label="nbytes")
    attempt(w, lambda: w.src.sub(offset, nbytes))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_device_range(data: st.DataObject) -> None:
    w = make_world()
    handle = data.draw(either(list(w.handles), w), label="handle")
    offset = data.draw(either([0, 8, 63], w), label="offset")
    nbytes = data.draw(either([1, 8, 64], w), label="nbytes")
    attempt(w, lambda: DeviceRange(handle, offset, nbytes))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_object_spec(data: st.DataObject) -> None:
    w = make_world()
    name = data.draw(either(["x"], w), label="name")
    dtype = data.draw(either(DTYPES, w), label="dtype")
    role = data.draw(either(["data", "weights"], w), label="role")
    view = data.draw(either([None, TensorViewSpec((4,), "float32")], w), label="view")
    attempt(w, lambda: ObjectSpec(name, dtype, role, view))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_tensor_view_spec(data: st.DataObject) -> None:
    w = make_world()
    shape = data.draw(either([(4,), (2, 3), (1 << 40,)], w), label="shape")
    dtype = data.draw(either(DTYPES, w), label="dtype")
    offset = data.draw(either([0, 8], w), label="offset")
    attempt(w, lambda: TensorViewSpec(shape, dtype, offset))  # type: ignore[arg-type]


@FEWER
@given(data=st.data())
def test_any_capacity_to_fake_backend(data: st.DataObject) -> None:
    w = make_world()
    capacity = data.draw(either([None, 1, 1 << 20], w), label="capacity")
    attempt(w, lambda: FakeBackend(capacity))  # type: ignore[arg-type]


@FAST
@given(data=st.data())
def test_any_arguments_to_fail_next(data: st.DataObject) -> None:
    w = make_world()
    op = data.draw(either(["alloc", "copy_in", "copy_out", "compute", "view", "free", "query"], w), label="op")
    times = data.draw(either([1, 3], w), label="times")
    attempt(w, lambda: w.fake.fail_next(op, times))  # type: ignore[arg-type]


@FEWER
@given(data=st.data())
def test_any_device_to_tinygrad_backend(data: st.DataObject) -> None:
    w = make_world()
    device = data.draw(either(["CPU", None, "NOPE"], w), label="device")
    attempt(w, lambda: TinygradBackend(device))  # type: ignore[arg-type]


# ---------------------------------------------------------------- 2. exact error and rule per parameter

NOT_A_BACKEND: list[object] = [None, 3, "fake", object()]


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("backend", NOT_A_BACKEND, ids=ident)
def test_bridge_refuses_what_is_not_a_backend(backend: object) -> None:
    raises_exactly(lambda: Bridge(backend), InvalidArgumentError, "ARG-1")  # type: ignore[arg-type]


@pytest.mark.rejects("SPEC-1")
@pytest.mark.parametrize("spec", [None, "uint8", 3, VIEW, b"uint8", {"name": "x", "dtype": "uint8"}], ids=ident)
def test_alloc_device_refuses_a_non_spec(spec: object) -> None:
    w = make_world()
    refused(w, lambda: w.bridge.alloc_device(spec, 8), InvalidSpecError, "SPEC-1")  # type: ignore[arg-type]


BAD_EXTENTS: list[object] = [
    0, -8, -(2**70), (1 << 48) + 1, 2**63, 2**64, 2**70, 2.5, 8.0, float("nan"), float("inf"),
    True, False, "8", None, b"8", [8], np.float64(8.0), fractions.Fraction(8), decimal.Decimal(8),
]  # fmt: skip


@pytest.mark.rejects("ALLOC-1")
@pytest.mark.parametrize("extent", BAD_EXTENTS, ids=ident)
def test_alloc_device_refuses_a_bad_extent_without_a_backend_call(extent: object) -> None:
    w = make_world()
    refused(w, lambda: w.bridge.alloc_device(U8, extent), RangeError, "ALLOC-1")  # type: ignore[arg-type]


@pytest.mark.rejects("ALLOC-1")
@pytest.mark.parametrize("extent", [6, 2, (1 << 48) + 4], ids=ident)
def test_alloc_device_refuses_an_extent_out_of_range_or_not_whole_items(extent: int) -> None:
    w = make_world()  # float32: 6 and 2 are not whole items; (1 << 48) + 4 is whole but too large
    refused(w, lambda: w.bridge.alloc_device(F32, extent), RangeError, "ALLOC-1")


@pytest.mark.holds("ALLOC-1")
@pytest.mark.parametrize("extent", [np.int64(8), np.int32(8), np.uint64(8), np.int8(8)], ids=ident)
def test_alloc_device_accepts_numpy_integers(extent: object) -> None:
    w = make_world()
    h = w.bridge.alloc_device(U8, extent)  # type: ignore[arg-type]
    assert (h.extent, w.bridge.state(h)) == (8, "allocated")
    w.bridge.host_to_device(w.src.sub(0, 8), DeviceRange(h, 0, 8))
    assert read_device(w.bridge, w.ring, h, 0, 8) == b"s" * 8


def handle_calls(w: World, h: object) -> dict[str, Callable[[], object]]:
    """Every public call that takes a handle, with `h` in the handle's place and the rest valid."""
    return {
        "free_device": lambda: w.bridge.free_device(h),  # type: ignore[arg-type]
        "state": lambda: w.bridge.state(h),  # type: ignore[arg-type]
        "compute": lambda: w.bridge.compute(h),  # type: ignore[arg-type]
        "compute-beside-a-valid-handle": lambda: w.bridge.compute(w.h0, h),  # type: ignore[arg-type]
        "wrap_for_tinygrad": lambda: w.bridge.wrap_for_tinygrad(h, VIEW),  # type: ignore[arg-type]
        "host_to_device": lambda: w.bridge.host_to_device(w.src, smuggled(w.h0, h)),
        "host_to_device-async": lambda: w.bridge.host_to_device(w.src, smuggled(w.h0, h), sync=False),
        "device_to_host": lambda: w.bridge.device_to_host(smuggled(w.h0, h), w.out),
        "device_to_host-async": lambda: w.bridge.device_to_host(smuggled(w.h0, h), w.out, sync=False),
    }


NON_HANDLES: dict[str, Callable[[World], object]] = {
    "None": lambda w: None,
    "int": lambda w: 3,
    "the-handle's-id": lambda w: w.h1.id,
    "str": lambda w: "x",
    "float": lambda w: 1.0,
    "tuple-of-handle": lambda w: (w.h1,),
    "host-range": lambda w: w.src,
    "object-spec": lambda w: U8,
    "handle-of-another-bridge": lambda w: w.other_handle,
    "hand-built-with-an-unissued-id": lambda w: DeviceHandle(5, 0, 64, U8, owner=w.h1.owner),
}


@pytest.mark.rejects("HANDLE-1")
@pytest.mark.parametrize("value", NON_HANDLES)
def test_every_handle_parameter_refuses_a_non_handle_before_any_backend_call(value: str) -> None:
    w = make_world()
    calls = handle_calls(w, NON_HANDLES[value](w))
    assert_all_refused(refusals(w, calls), "HANDLE-1")


@pytest.mark.rejects("HANDLE-1")
@pytest.mark.parametrize("forgery", FORGERIES)
def test_every_handle_parameter_refuses_a_forged_copy(forgery: str) -> None:
    w = make_world()
    forged = w.forgeries()[forgery]
    before, nbytes = w.snap(), [bytes(w.fake.buffer(i).raw) for i in range(2)]
    calls = handle_calls(w, forged)
    assert_all_refused(refusals(w, calls), "HANDLE-1")
    assert w.snap() == before
    assert [w.bridge.state(h) for h in w.handles[:2]] == ["idle", "idle"]
    assert [bytes(w.fake.buffer(i).raw) for i in range(2)] == nbytes


@pytest.mark.holds("HANDLE-1")
@pytest.mark.parametrize("how", ["copy.copy", "dataclasses.replace"])
def test_an_unchanged_copy_of_a_handle_works_like_the_original(how: str) -> None:
    w = make_world()
    h = copy.copy(w.h1) if how == "copy.copy" else dataclasses.replace(w.h1)
    assert h is not w.h1 and h == w.h1
    assert w.bridge.state(h) == "idle"
    w.bridge.host_to_device(w.src.sub(0, 4), DeviceRange(h, 4, 4))
    assert read_device(w.bridge, w.ring, h, 0, 8) == PATTERN[:4] + b"ssss"
    ev = w.bridge.compute(w.h0, h)
    w.fake.complete(ev)
    t = w.bridge.wrap_for_tinygrad(h, VIEW)
    assert bytes(t.numpy()) == PATTERN[:4] + b"ssss" + PATTERN[8:16]
    del t
    w.bridge.free_device(h)
    assert w.bridge.state(w.h1) == "freed" and w.fake.ops().count("free") == 2  # h4 and this one


@pytest.mark.rejects("HANDLE-1")
@pytest.mark.parametrize("forgery", ["extent-64KiB", "extent-1TiB"])
def test_a_device_range_over_an_enlarged_forged_extent_is_made_but_refused_by_the_bridge(forgery: str) -> None:
    w = make_world()
    forged = w.forgeries()[forgery]
    far = DeviceRange(forged, 1 << 15, 16)  # its own check uses the handle's claimed extent
    assert far.end == (1 << 15) + 16
    refused(w, lambda: w.bridge.host_to_device(w.src, far), InvalidHandleError, "HANDLE-1")
    refused(w, lambda: w.bridge.device_to_host(far, w.out), InvalidHandleError, "HANDLE-1")


def alternatives(value: object) -> list[object]:
    """Values for one handle field that differ from `value` in value or in type."""
    alts: list[object] = [None, "x", -1, 2**64, 1.5]
    if type(value) is int:
        alts += [value + 1, value - 1, float(value), np.int64(value), value ^ (1 << 40), LyingInt(value)]
        alts += [bool(value)] if value in (0, 1) else []
    if isinstance(value, ObjectSpec):
        alts += [dataclasses.replace(value, name=value.name + "2"), ObjectSpec(value.name, "float64")]
    return [a for a in alts if not (type(a) is type(value) and a == value)]


@pytest.mark.rejects("HANDLE-1")
@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(DeviceHandle) if f.init])
def test_changing_any_field_of_a_handle_gets_it_refused(name: str) -> None:
    """Whatever fields DeviceHandle has (today's and any added later), a copy with one changed
    is not a handle this bridge issued."""
    w = make_world()
    results = {}
    for alt in alternatives(getattr(w.h1, name)):
        forged = dataclasses.replace(w.h1, **{name: alt})
        results[ident(alt)] = " | ".join(sorted(set(refusals(w, handle_calls(w, forged)).values())))
    assert_all_refused(results, "HANDLE-1")


@pytest.mark.rejects("HANDLE-1")
def test_a_handle_subclass_that_lies_is_refused() -> None:
    w = make_world()
    forged = impostor(w.h1)
    far = DeviceRange(forged, 1 << 39, 16)  # made: the impostor claims 1 TiB
    refused(w, lambda: w.bridge.host_to_device(w.src, far), InvalidHandleError, "HANDLE-1")
    refused(w, lambda: w.bridge.device_to_host(far, w.out), InvalidHandleError, "HANDLE-1")


def changing(base: type, field: str, answer: Callable[[Any, int], int]) -> type:
    """A slotted subclass of the range class `base` whose `field` is a property answering
    `answer(self, n)` at its n-th read (the stored field stays as built; `drift`: a spare slot)."""

    def read(self: Any) -> int:
        object.__setattr__(self, "reads", self.reads + 1)
        return answer(self, self.reads)

    return type(f"Changing{base.__name__}", (base,), {"__slots__": ("reads", "drift"), field: property(read)})


#: `nbytes` says 16 when first read and 1 MiB after (the stored field says 16)
ShiftyRange = changing(HostRange, "nbytes", lambda r, n: 16 if n == 1 else 1 << 20)
#: `offset` says 0 when first read and 1 MiB after (the stored field says 0)
ShiftyDeviceRange = changing(DeviceRange, "offset", lambda r, n: 0 if n == 1 else 1 << 20)
#: `start` says the stored one when first read and `drift` after
DriftingRange = changing(HostRange, "start", lambda r, n: vars(HostRange)["start"].__get__(r) if n == 1 else r.drift)


def built_past_checks(cls: type, **fields: object) -> Any:
    """An instance of frozen, slotted `cls` with `fields` stored as given: no check ran."""
    made = object.__new__(cls)
    for name, value in fields.items():
        for klass in cls.__mro__:  # (the slot of the class that declares it: a subclass's property hides it)
            if isinstance(vars(klass).get(name), type(HostRange.start)):
                vars(klass)[name].__set__(made, value)
                break
    return made


@pytest.mark.rejects("RANGE-1")
def test_a_range_whose_fields_change_between_reads_is_copied_as_checked_or_refused() -> None:
    """A copy reads each field of its ranges once and uses what it checked: a subclass's
    property that answers otherwise the next time never reaches the backend. A range built past
    its checks (a ring that is not a HostRing, a float start, a stored field missing) is RANGE-1,
    with no backend call."""
    w = make_world()
    src = built_past_checks(ShiftyRange, ring=w.ring, start=w.src.start, nbytes=16, reads=0)
    ncalls = len(w.fake.calls)
    w.bridge.host_to_device(src, DeviceRange(w.h1, 0, 16))
    (call,) = w.fake.calls[ncalls:]
    assert (call.op, call.offset, call.nbytes) == ("copy_in", 0, 16)
    assert read_device(w.bridge, w.ring, w.h1, 0, 64) == b"s" * 16 + PATTERN[16:]
    dst = built_past_checks(ShiftyDeviceRange, handle=w.h1, offset=0, nbytes=16, reads=0)
    ncalls = len(w.fake.calls)
    w.bridge.device_to_host(dst, w.out)
    (call,) = w.fake.calls[ncalls:]
    assert (call.op, call.offset, call.nbytes) == ("copy_out", 0, 16)
    assert bytes(w.ring.view(w.out)) == b"s" * 16

    class NotARing:
        def check_copy(self, r: object, into_device: bool) -> None:
            pass

        def raw(self, r: object) -> memoryview:
            return memoryview(bytearray(1 << 20))

    w = make_world()
    target = DeviceRange(w.h1, 0, 16)
    for forged in (
        built_past_checks(HostRange, ring=NotARing(), start=0, nbytes=16),
        built_past_checks(HostRange, ring=w.ring, start=float(w.src.start), nbytes=16),
        built_past_checks(HostRange, ring=w.ring, start=w.src.start, nbytes=LyingInt(16)),
        built_past_checks(ShiftyRange, ring=w.ring, start=w.src.start, reads=0),  # no stored size
    ):
        refused(w, lambda f=forged: w.bridge.host_to_device(f, target), RangeError, "RANGE-1")
        refused(w, lambda f=forged: w.bridge.device_to_host(target, f), RangeError, "RANGE-1")


@pytest.mark.rejects("RANGE-1")
def test_the_rings_methods_read_a_ranges_fields_once_and_refuse_one_built_past_its_checks() -> None:
    """view, write, array, release and commit use a subclass's stored fields, read once: a
    `start` that moves to another reservation after the checks releases nothing of it. A range
    built past its checks (a float start) is RANGE-1 and changes nothing."""
    ring = HostRing(256)
    a, b = ring.reserve(16), ring.reserve(16)

    def drifting(r: HostRange) -> HostRange:
        made: HostRange = built_past_checks(DriftingRange, ring=ring, start=r.start, nbytes=16, reads=0, drift=b.start)
        return made

    ring.write(drifting(a), b"a" * 16)
    assert bytes(ring.view(a)) == b"a" * 16 and bytes(ring.view(b)) == bytes(16)
    assert bytes(ring.view(drifting(a))) == b"a" * 16 and ring.array(drifting(a), np.uint8).tolist() == [97] * 16
    ring.release(drifting(a))
    assert ring.released(a) and not ring.released(drifting(b)) and ring.unreleased() == [b]
    assert ring.commit(drifting(b)) == 0 and ring.take(timeout=0).start == b.start
    forged = built_past_checks(HostRange, ring=ring, start=float(b.start), nbytes=16)
    for call in (ring.view, ring.release, ring.released, ring.commit, lambda r: ring.write(r, bytes(16))):
        raises_exactly(lambda c=call: c(forged), RangeError, "RANGE-1")
    assert ring.unreleased() == [b]


@pytest.mark.rejects("VIEW-2")
def test_a_view_built_past_its_checks_is_checked_again() -> None:
    """A TensorViewSpec whose fields were set past its checks (a negative offset: a tinygrad view
    before the allocation's first byte) gets VIEW-2, with no backend call."""
    w = make_world()
    for shape, offset in (((16,), -64), ((-16,), 0), ((16,), 4.0), ((LyingInt(-1),), 0)):
        view = built_past_checks(TensorViewSpec, shape=shape, dtype="uint8", offset=offset)
        refused(w, lambda v=view: w.bridge.wrap_for_tinygrad(w.h1, v), InvalidViewError, "VIEW-2")


LIARS: dict[str, tuple[Callable[[World], object], type[BridgeError], str]] = {
    "alloc_device-extent": (lambda w: w.bridge.alloc_device(U8, LyingInt(-8)), RangeError, "ALLOC-1"),
    "HostRing-capacity": (lambda w: HostRing(LyingInt(-64)), RangeError, "RANGE-1"),
    "reserve": (lambda w: w.ring.reserve(LyingInt(-1)), RangeError, "RANGE-1"),
    "HostRange-start": (lambda w: HostRange(w.ring, LyingInt(-16), 16), RangeError, "RANGE-1"),
    "HostRange-nbytes": (lambda w: HostRange(w.ring, 0, LyingInt(-16)), RangeError, "RANGE-1"),
    "sub-offset": (lambda w: w.src.sub(LyingInt(-4), 4), RangeError, "RANGE-1"),
    "DeviceRange-offset": (lambda w: DeviceRange(w.h1, LyingInt(-16), 16), RangeError, "RANGE-1"),
    "DeviceRange-nbytes": (lambda w: DeviceRange(w.h1, 0, LyingInt(-16)), RangeError, "RANGE-1"),
    "DeviceRange-past-the-extent": (lambda w: DeviceRange(w.h1, LyingInt(60), 16), RangeError, "RANGE-1"),
    "TensorViewSpec-dim": (lambda w: TensorViewSpec((LyingInt(-1),), "uint8"), InvalidViewError, "VIEW-2"),
    "TensorViewSpec-offset": (lambda w: TensorViewSpec((4,), "uint8", LyingInt(-4)), InvalidViewError, "VIEW-2"),
    "FakeBackend-capacity": (lambda w: FakeBackend(LyingInt(-1)), InvalidArgumentError, "ARG-1"),
    "fail_next-times": (lambda w: w.fake.fail_next("alloc", LyingInt(-1)), InvalidArgumentError, "ARG-1"),
    "wait-timeout": (lambda w: w.events["copy_done"].wait(LyingInt(-1)), InvalidArgumentError, "ARG-1"),
}


@pytest.mark.rejects("ALLOC-1", "RANGE-1", "VIEW-2", "ARG-1")
@pytest.mark.parametrize("case", LIARS)
def test_an_int_subclass_is_judged_by_its_value_not_its_comparisons(case: str) -> None:
    call, error, rule = LIARS[case]
    w = make_world()
    refused(w, bounded(lambda: call(w)), error, rule)


BAD_RANGE_ARGS: dict[str, Callable[[World], object]] = {
    "None": lambda w: None,
    "int": lambda w: 3,
    "str": lambda w: "x",
    "bytes": lambda w: b"ssss",
    "memoryview": lambda w: memoryview(bytearray(16)),
    "tuple": lambda w: (0, 16),
    "handle": lambda w: w.h0,
    "object": lambda w: object(),
}


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize("value", BAD_RANGE_ARGS)
def test_copies_refuse_a_host_or_device_argument_of_the_wrong_type(value: str) -> None:
    w = make_world()
    bad = BAD_RANGE_ARGS[value](w)
    dev = DeviceRange(w.h0, 0, 16)
    calls: list[Callable[[], object]] = [
        lambda: w.bridge.host_to_device(bad, dev),  # type: ignore[arg-type]
        lambda: w.bridge.host_to_device(w.src, bad),  # type: ignore[arg-type]
        lambda: w.bridge.device_to_host(bad, w.out),  # type: ignore[arg-type]
        lambda: w.bridge.device_to_host(dev, bad),  # type: ignore[arg-type]
    ]
    for call in calls:
        refused(w, call, RangeError, "RANGE-1")


@pytest.mark.rejects("RANGE-1")
def test_copies_refuse_swapped_arguments() -> None:
    w = make_world()
    dev = DeviceRange(w.h0, 0, 16)
    refused(w, lambda: w.bridge.host_to_device(dev, w.src), RangeError, "RANGE-1")  # type: ignore[arg-type]
    refused(w, lambda: w.bridge.device_to_host(w.out, dev), RangeError, "RANGE-1")  # type: ignore[arg-type]


NOT_BOOL: list[object] = ["no", "", 0, 1, 0.0, None, [], np.bool_(True), np.bool_(False)]


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("flag", ["host_to_device-sync", "host_to_device-release", "device_to_host-sync"])
@pytest.mark.parametrize("value", NOT_BOOL, ids=ident)
def test_copy_flags_must_be_exactly_bool(flag: str, value: object) -> None:
    w = make_world()
    dev = DeviceRange(w.h0, 0, 16)
    call = {
        "host_to_device-sync": lambda: w.bridge.host_to_device(w.src, dev, sync=value),  # type: ignore[arg-type]
        "host_to_device-release": lambda: w.bridge.host_to_device(w.src, dev, release=value),  # type: ignore[arg-type]
        "device_to_host-sync": lambda: w.bridge.device_to_host(dev, w.out, sync=value),  # type: ignore[arg-type]
    }[flag]
    refused(w, call, InvalidArgumentError, "ARG-1")


@pytest.mark.rejects("VIEW-2")
@pytest.mark.parametrize("view", [None, (16,), "uint8", U8, 3, {"shape": (16,), "dtype": "uint8"}], ids=ident)
def test_wrap_for_tinygrad_refuses_a_non_view(view: object) -> None:
    w = make_world()
    refused(w, lambda: w.bridge.wrap_for_tinygrad(w.h1, view), InvalidViewError, "VIEW-2")  # type: ignore[arg-type]


@pytest.mark.rejects("VIEW-2")
def test_wrap_for_tinygrad_refuses_what_only_looks_like_a_view() -> None:
    """An object with a view's three fields, all valid, is still no TensorViewSpec; one whose
    field was deleted past its checks is no whole one. Both get VIEW-2, with no backend call."""
    w = make_world()
    lookalike = types.SimpleNamespace(shape=(16,), dtype="uint8", offset=0)
    error = refused(w, lambda: w.bridge.wrap_for_tinygrad(w.h1, lookalike), InvalidViewError, "VIEW-2")  # type: ignore[arg-type]
    assert "needs a TensorViewSpec" in str(error)
    for field in ("shape", "dtype", "offset"):
        torn = TensorViewSpec((16,), "uint8", 0)
        object.__delattr__(torn, field)
        error = refused(w, lambda v=torn: w.bridge.wrap_for_tinygrad(w.h1, v), InvalidViewError, "VIEW-2")
        assert "is not a whole TensorViewSpec" in str(error)
    assert w.bridge.wrap_for_tinygrad(w.h1, TensorViewSpec((16,), "uint8", 0)).shape == (16,)


BAD_TIMEOUTS: list[object] = [True, False, "1", "", [], [1], -1, -0.5, -(2**70), float("nan"), float("-inf")]


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("event", ["copy_pending", "compute_pending", "copy_done", "compute_done"])
@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=ident)
def test_event_wait_refuses_a_bad_timeout(event: str, timeout: object) -> None:
    w = make_world()
    refused(w, bounded(lambda: w.events[event].wait(timeout)), InvalidArgumentError, "ARG-1")  # type: ignore[arg-type]


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("timeout", ["1", -1, float("nan")], ids=ident)
def test_a_refused_wait_leaves_an_open_compute_event_open(timeout: object) -> None:
    w = make_world()
    with w.bridge.compute(w.h0) as ev:
        refused(w, bounded(lambda: ev.wait(timeout)), InvalidArgumentError, "ARG-1")  # type: ignore[arg-type]
        assert ev.open


BAD_CAPACITIES: list[object] = [0, -1, -(2**70), 1.5, 64.0, "64", None, True, False, b"64", [64], np.float64(64)]
TOO_LARGE: list[object] = [2**50, 2**62, 2**63, 2**64, 2**70]


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize("capacity", BAD_CAPACITIES + TOO_LARGE, ids=ident)
def test_host_ring_refuses_a_bad_or_unallocatable_capacity(capacity: object) -> None:
    raises_exactly(lambda: HostRing(capacity), RangeError, "RANGE-1")  # type: ignore[arg-type]


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize("n", [0, -1, -(2**70), 1.5, 4.0, "4", None, True, False, [], b"4"], ids=ident)
def test_reserve_refuses_a_bad_size(n: object) -> None:
    w = make_world()
    refused(w, lambda: w.ring.reserve(n), RangeError, "RANGE-1")  # type: ignore[arg-type]


@pytest.mark.rejects("RING-2")
@pytest.mark.parametrize("extra", [1, 2**64, 2**70], ids=ident)
def test_reserve_refuses_more_than_the_capacity_as_full(extra: int) -> None:
    w = make_world()
    e = refused(w, lambda: w.ring.reserve(w.ring.capacity + extra), RingFullError, "RING-2")
    assert "larger than the ring's capacity" in str(e)
    empty = HostRing(64)
    e = raises_exactly(lambda: empty.reserve(64 + extra), RingFullError, "RING-2")
    assert "larger than the ring's capacity" in str(e) and empty.snapshot() == HostRing(64).snapshot()


NOT_MY_RANGES: dict[str, Callable[[World], object]] = {
    "None": lambda w: None,
    "str": lambda w: "x",
    "int": lambda w: 3,
    "tuple": lambda w: (0, 16),
    "range-of-another-ring": lambda w: w.other_range,
    "device-range": lambda w: DeviceRange(w.h0, 0, 16),
}


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize("method", ["view", "released", "release"])
@pytest.mark.parametrize("value", NOT_MY_RANGES)
def test_ring_methods_refuse_what_is_not_a_range_of_this_ring(method: str, value: str) -> None:
    w = make_world()
    r = NOT_MY_RANGES[value](w)
    other_before = w.other_ring.snapshot()
    refused(w, lambda: getattr(w.ring, method)(r), RangeError, "RANGE-1")
    assert w.other_ring.snapshot() == other_before


BAD_COUNTS: list[object] = [-1, -(2**70), 1.5, 4.0, "4", None, True, False, [4], np.float64(4)]
BAD_SIZES: list[object] = [0, *BAD_COUNTS]


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize("ring", [None, "ring", 3, object(), b"ring"], ids=ident)
def test_host_range_refuses_a_non_ring(ring: object) -> None:
    raises_exactly(lambda: HostRange(ring, 0, 16), RangeError, "RANGE-1")  # type: ignore[arg-type]


@pytest.mark.rejects("RANGE-1")
def test_host_range_refuses_a_bridge_or_a_range_as_its_ring() -> None:
    w = make_world()
    for ring in (w.bridge, w.src, w.fake):
        refused(w, lambda ring=ring: HostRange(ring, 0, 16), RangeError, "RANGE-1")  # type: ignore[misc]


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize("start", BAD_COUNTS, ids=ident)
def test_host_range_refuses_a_bad_start(start: object) -> None:
    w = make_world()
    refused(w, lambda: HostRange(w.ring, start, 16), RangeError, "RANGE-1")  # type: ignore[arg-type]


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize("nbytes", BAD_SIZES, ids=ident)
def test_host_range_refuses_a_bad_size(nbytes: object) -> None:
    w = make_world()
    refused(w, lambda: HostRange(w.ring, 0, nbytes), RangeError, "RANGE-1")  # type: ignore[arg-type]


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize(
    ("offset", "nbytes"),
    [*[(o, 4) for o in BAD_COUNTS], *[(0, n) for n in BAD_SIZES], (8, 9), (16, 1), (0, 17), (2**70, 1)],
    ids=ident,
)
def test_host_range_sub_refuses_a_bad_offset_or_size(offset: object, nbytes: object) -> None:
    w = make_world()
    refused(w, lambda: w.src.sub(offset, nbytes), RangeError, "RANGE-1")  # type: ignore[arg-type]


@pytest.mark.rejects("HANDLE-1")
@pytest.mark.parametrize("handle", [k for k in NON_HANDLES if "handle-of" not in k and "hand-built" not in k])
def test_device_range_refuses_a_non_handle(handle: str) -> None:
    w = make_world()
    h = NON_HANDLES[handle](w)
    refused(w, lambda: DeviceRange(h, 0, 16), InvalidHandleError, "HANDLE-1")  # type: ignore[arg-type]


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize(
    ("offset", "nbytes"),
    [*[(o, 4) for o in BAD_COUNTS], *[(0, n) for n in BAD_SIZES], (60, 8), (0, 65), (64, 1), (2**70, 1)],
    ids=ident,
)
def test_device_range_refuses_a_bad_offset_or_size(offset: object, nbytes: object) -> None:
    w = make_world()
    refused(w, lambda: DeviceRange(w.h1, offset, nbytes), RangeError, "RANGE-1")  # type: ignore[arg-type]


BAD_SPEC_ARGS: list[dict[str, object]] = [
    *[{"name": v} for v in (None, "", 3, b"x", ["x"], Hostile())],
    *[{"role": v} for v in (None, "", 3, b"data")],
    *[{"dtype": v} for v in ("float33", "UINT8", "", None, 3, b"uint8", [], {}, {"uint8"}, Hostile())],
    *[{"view": v} for v in ("x", 3, (4,), U8, TensorViewSpec((4,), "int32"))],
]


@pytest.mark.rejects("SPEC-1")
@pytest.mark.parametrize("bad", BAD_SPEC_ARGS, ids=field_id)
def test_object_spec_refuses_a_bad_field(bad: dict[str, object]) -> None:
    kwargs: dict[str, object] = {"name": "x", "dtype": "float32", "role": "data", "view": None} | bad
    raises_exactly(lambda: ObjectSpec(**kwargs), InvalidSpecError, "SPEC-1")  # type: ignore[arg-type]


BAD_VIEW_ARGS: list[dict[str, object]] = [
    *[{"shape": v} for v in ((), [], [0], (-1,), (1.5,), ("4",), (True,), (4, 0), None, 4, "4", (np.float64(4),))],
    *[{"dtype": v} for v in ("float33", "", None, 3, b"uint8", [], {}, Hostile())],
    *[{"offset": v} for v in (-1, -4, 1.5, "0", None, True, 2)],  # 2: not aligned to float32
]


@pytest.mark.rejects("VIEW-2")
@pytest.mark.parametrize("bad", BAD_VIEW_ARGS, ids=field_id)
def test_tensor_view_spec_refuses_a_bad_field(bad: dict[str, object]) -> None:
    kwargs: dict[str, object] = {"shape": (4,), "dtype": "float32", "offset": 0} | bad
    raises_exactly(lambda: TensorViewSpec(**kwargs), InvalidViewError, "VIEW-2")  # type: ignore[arg-type]


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("capacity", [0, -1, 1.5, "64", True, False, [], b"64"], ids=ident)
def test_fake_backend_refuses_a_bad_capacity(capacity: object) -> None:
    raises_exactly(lambda: FakeBackend(capacity), InvalidArgumentError, "ARG-1")  # type: ignore[arg-type]


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize(
    ("op", "times"),
    [
        *[(op, 1) for op in ("nope", "ALLOC", "", None, 3, [], {}, b"alloc", Hostile())],
        *[("alloc", t) for t in (0, -1, 1.5, "1", None, True, False, [])],
    ],
    ids=ident,
)
def test_fail_next_refuses_an_unknown_op_or_bad_times(op: object, times: object) -> None:
    w = make_world()
    refused(w, lambda: w.fake.fail_next(op, times), InvalidArgumentError, "ARG-1")  # type: ignore[arg-type]


@pytest.mark.rejects("ARG-1")
@pytest.mark.parametrize("device", [3, b"CPU", [], object(), True, "NOPE"], ids=ident)
def test_tinygrad_backend_refuses_a_bad_or_unknown_device(device: object) -> None:
    raises_exactly(lambda: TinygradBackend(device), InvalidArgumentError, "ARG-1")  # type: ignore[arg-type]


@pytest.mark.holds("ARG-1")
def test_well_typed_flags_timeouts_backends_and_test_controls_are_accepted() -> None:
    w = make_world()
    dev = DeviceRange(w.h0, 0, 4)
    for sync in (True, False):
        for release in (True, False):
            src = put(w.ring, b"i" * 4)
            ev = w.bridge.host_to_device(src, dev, sync=sync, release=release)
            if not sync:
                w.fake.complete(ev)
            ev.wait(None)
            assert w.ring.released(src) is release
        out = w.ring.reserve(4)
        ev = w.bridge.device_to_host(dev, out, sync=sync)
        if not sync:
            w.fake.complete(ev)
        for timeout in (None, 0, 0.0, 0.5, 1, 10**9):
            ev.wait(timeout)
        assert bytes(w.ring.view(out)) == b"iiii"
    assert w.bridge.stats().copy_failures == 1  # only the world's own failed copy
    assert isinstance(Bridge(FakeBackend()), Bridge) and isinstance(Bridge(FaultyBackend(FakeBackend())), Bridge)
    assert (FakeBackend(None).capacity, FakeBackend(100).capacity) == (None, 100)
    for op in ("alloc", "copy_in", "copy_out", "compute", "view", "free", "query"):
        FakeBackend().fail_next(op)
        FakeBackend().fail_next(op, times=3)
    assert TinygradBackend("CPU").device.startswith("CPU") and isinstance(TinygradBackend(None).device, str)


MESSAGE_CASES: dict[str, tuple[Callable[[World], object], type[BridgeError], str]] = {
    "Bridge": (lambda w: Bridge(BIG), InvalidArgumentError, "ARG-1"),  # type: ignore[arg-type]
    "alloc_device-spec": (lambda w: w.bridge.alloc_device(BIG, 8), InvalidSpecError, "SPEC-1"),  # type: ignore[arg-type]
    "alloc_device-extent": (lambda w: w.bridge.alloc_device(U8, BIG), RangeError, "ALLOC-1"),  # type: ignore[arg-type]
    "free_device": (lambda w: w.bridge.free_device(BIG), InvalidHandleError, "HANDLE-1"),  # type: ignore[arg-type]
    "state": (lambda w: w.bridge.state(BIG), InvalidHandleError, "HANDLE-1"),  # type: ignore[arg-type]
    "compute": (lambda w: w.bridge.compute(w.h0, BIG), InvalidHandleError, "HANDLE-1"),  # type: ignore[arg-type]
    "wrap-handle": (lambda w: w.bridge.wrap_for_tinygrad(BIG, VIEW), InvalidHandleError, "HANDLE-1"),  # type: ignore[arg-type]
    "wrap-view": (lambda w: w.bridge.wrap_for_tinygrad(w.h1, BIG), InvalidViewError, "VIEW-2"),  # type: ignore[arg-type]
    "host_to_device-src": (
        lambda w: w.bridge.host_to_device(BIG, DeviceRange(w.h0, 0, 16)),  # type: ignore[arg-type]
        RangeError,
        "RANGE-1",
    ),
    "host_to_device-dst": (lambda w: w.bridge.host_to_device(w.src, BIG), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "host_to_device-sync": (
        lambda w: w.bridge.host_to_device(w.src, DeviceRange(w.h0, 0, 16), sync=BIG),  # type: ignore[arg-type]
        InvalidArgumentError,
        "ARG-1",
    ),
    "host_to_device-release": (
        lambda w: w.bridge.host_to_device(w.src, DeviceRange(w.h0, 0, 16), release=BIG),  # type: ignore[arg-type]
        InvalidArgumentError,
        "ARG-1",
    ),
    "host_to_device-smuggled-handle": (
        lambda w: w.bridge.host_to_device(w.src, smuggled(w.h0, BIG)),
        InvalidHandleError,
        "HANDLE-1",
    ),
    "device_to_host-src": (lambda w: w.bridge.device_to_host(BIG, w.out), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "device_to_host-dst": (
        lambda w: w.bridge.device_to_host(DeviceRange(w.h0, 0, 16), BIG),  # type: ignore[arg-type]
        RangeError,
        "RANGE-1",
    ),
    "device_to_host-sync": (
        lambda w: w.bridge.device_to_host(DeviceRange(w.h0, 0, 16), w.out, sync=BIG),  # type: ignore[arg-type]
        InvalidArgumentError,
        "ARG-1",
    ),
    "wait-pending": (
        lambda w: bounded(lambda: w.events["copy_pending"].wait(BIG))(),  # type: ignore[arg-type]
        InvalidArgumentError,
        "ARG-1",
    ),
    "wait-done": (lambda w: w.events["copy_done"].wait(BIG), InvalidArgumentError, "ARG-1"),  # type: ignore[arg-type]
    "HostRing": (lambda w: HostRing(BIG), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "reserve": (lambda w: w.ring.reserve(BIG), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "view": (lambda w: w.ring.view(BIG), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "released": (lambda w: w.ring.released(BIG), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "release": (lambda w: w.ring.release(BIG), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "HostRange-ring": (lambda w: HostRange(BIG, 0, 16), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "HostRange-start": (lambda w: HostRange(w.ring, BIG, 16), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "HostRange-nbytes": (lambda w: HostRange(w.ring, 0, BIG), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "sub-offset": (lambda w: w.src.sub(BIG, 4), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "sub-nbytes": (lambda w: w.src.sub(0, BIG), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "DeviceRange-handle": (lambda w: DeviceRange(BIG, 0, 16), InvalidHandleError, "HANDLE-1"),  # type: ignore[arg-type]
    "DeviceRange-offset": (lambda w: DeviceRange(w.h0, BIG, 16), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "DeviceRange-nbytes": (lambda w: DeviceRange(w.h0, 0, BIG), RangeError, "RANGE-1"),  # type: ignore[arg-type]
    "ObjectSpec-name": (lambda w: ObjectSpec(BIG, "uint8"), InvalidSpecError, "SPEC-1"),  # type: ignore[arg-type]
    "ObjectSpec-dtype": (lambda w: ObjectSpec("x", BIG), InvalidSpecError, "SPEC-1"),  # type: ignore[arg-type]
    "ObjectSpec-role": (lambda w: ObjectSpec("x", "uint8", BIG), InvalidSpecError, "SPEC-1"),  # type: ignore[arg-type]
    "ObjectSpec-view": (lambda w: ObjectSpec("x", "uint8", "data", BIG), InvalidSpecError, "SPEC-1"),  # type: ignore[arg-type]
    "TensorViewSpec-shape": (lambda w: TensorViewSpec(BIG, "uint8"), InvalidViewError, "VIEW-2"),  # type: ignore[arg-type]
    "TensorViewSpec-dim": (lambda w: TensorViewSpec((BIG,), "uint8"), InvalidViewError, "VIEW-2"),  # type: ignore[arg-type]
    "TensorViewSpec-dtype": (lambda w: TensorViewSpec((4,), BIG), InvalidViewError, "VIEW-2"),  # type: ignore[arg-type]
    "TensorViewSpec-offset": (lambda w: TensorViewSpec((4,), "uint8", BIG), InvalidViewError, "VIEW-2"),  # type: ignore[arg-type]
    "FakeBackend": (lambda w: FakeBackend(BIG), InvalidArgumentError, "ARG-1"),  # type: ignore[arg-type]
    "fail_next-op": (lambda w: w.fake.fail_next(BIG), InvalidArgumentError, "ARG-1"),  # type: ignore[arg-type]
    "fail_next-times": (lambda w: w.fake.fail_next("alloc", BIG), InvalidArgumentError, "ARG-1"),  # type: ignore[arg-type]
    "TinygradBackend": (lambda w: TinygradBackend(BIG), InvalidArgumentError, "ARG-1"),  # type: ignore[arg-type]
}


@pytest.mark.rejects("ARG-1", "SPEC-1", "ALLOC-1", "HANDLE-1", "RANGE-1", "VIEW-2")
@pytest.mark.parametrize("case", MESSAGE_CASES)
def test_a_1_mib_argument_gets_a_short_message(case: str) -> None:
    call, error, rule = MESSAGE_CASES[case]
    w = make_world()
    e = refused(w, lambda: call(w), error, rule)
    assert len(str(e)) < 500


@pytest.mark.rejects("RANGE-1")
@pytest.mark.parametrize(("offset", "nbytes"), [(-16, 16), (56, 16), (1 << 39, 16)], ids=ident)
def test_a_device_range_corrupted_after_construction_is_refused(offset: int, nbytes: int) -> None:
    """Past the brief's list, in its spirit: a DeviceRange whose offset was overwritten after its
    own check would make tinygrad's memmove write outside the allocation."""
    w = make_world()
    bad = smuggled(w.h1, w.h1, offset, nbytes)
    refused(w, lambda: w.bridge.host_to_device(w.src, bad), RangeError, "RANGE-1")
    refused(w, lambda: w.bridge.device_to_host(bad, w.out), RangeError, "RANGE-1")


# ---------------------------------------------------------------- 3. forged handles on every backend


@dataclass
class Rig:
    """A Bridge over FaultyBackend (which records every backend op) around the fake or tinygrad-CPU,
    with two 64-byte allocations holding known bytes."""

    backend: FaultyBackend
    fake: FakeBackend | None
    bridge: Bridge
    ring: HostRing
    h0: DeviceHandle
    h1: DeviceHandle

    def observe(self) -> object:
        """All a refused call must leave as it was (device bytes are read back separately)."""
        fake = None if self.fake is None else self.fake.snapshot()
        states = [self.bridge.state(h) for h in (self.h0, self.h1)]
        return (self.bridge.stats(), states, self.ring.snapshot(), tuple(self.backend.ops), fake)

    def device_bytes(self) -> list[bytes | str]:
        """Both allocations' bytes, read back through their valid handles."""
        out: list[bytes | str] = []
        for h in (self.h0, self.h1):
            try:
                out.append(read_device(self.bridge, self.ring, h, 0, 64))
            except Exception as e:
                out.append(f"unreadable: {type(e).__name__}")
        return out


def make_rig(backend: str) -> Rig:
    fake = FakeBackend() if backend == "fake" else None
    faulty = FaultyBackend(fake if fake is not None else TinygradBackend(backend.removeprefix("tinygrad-")))
    bridge, ring = Bridge(faulty), HostRing(1 << 17)
    h0 = bridge.alloc_device(U8, 64)
    bridge.host_to_device(put(ring, NEIGHBOUR), DeviceRange(h0, 0, 64))
    h1 = bridge.alloc_device(U8, 64)
    bridge.host_to_device(put(ring, PATTERN), DeviceRange(h1, 0, 64))
    assert h1.id == 1
    return Rig(faulty, fake, bridge, ring, h0, h1)


def foreign_owner() -> int:
    return Bridge(FakeBackend()).alloc_device(U8, 8).owner


BACKENDS = ["fake", "tinygrad-CPU"]


@pytest.mark.rejects("HANDLE-1")
@pytest.mark.parametrize("forgery", FORGERIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_forged_handles_reach_no_backend(backend: str, forgery: str) -> None:
    """Every call with a forged handle is refused with HANDLE-1; no backend op happens, the real
    allocations keep their states and their device bytes. (Ranges stay inside the real allocation
    here, so a regression cannot touch foreign memory; the enlarged-extent reads and writes are below.)"""
    rig = make_rig(backend)
    forged = forgeries(rig.h1, rig.h0, foreign_owner())[forgery]
    src, out = put(rig.ring, b"f" * 16), rig.ring.reserve(16)
    bytes_before = rig.device_bytes()
    before = rig.observe()
    calls = {
        "free_device": lambda: rig.bridge.free_device(forged),
        "state": lambda: rig.bridge.state(forged),
        "compute": lambda: rig.bridge.compute(forged),
        "compute-beside-a-valid-handle": lambda: rig.bridge.compute(rig.h0, forged),
        "wrap_for_tinygrad": lambda: rig.bridge.wrap_for_tinygrad(forged, VIEW),
        "host_to_device": lambda: rig.bridge.host_to_device(src, DeviceRange(forged, 0, 16)),
        "host_to_device-async": lambda: rig.bridge.host_to_device(src, DeviceRange(forged, 0, 16), sync=False),
        "device_to_host": lambda: rig.bridge.device_to_host(DeviceRange(forged, 0, 16), out),
        "device_to_host-async": lambda: rig.bridge.device_to_host(DeviceRange(forged, 0, 16), out, sync=False),
    }
    outcomes = {}
    for op, call in calls.items():
        snap = rig.observe()
        outcomes[op] = outcome(call) + ("" if rig.observe() == snap else ", and changed state")
    assert_all_refused(outcomes, "HANDLE-1")
    assert rig.observe() == before
    assert [rig.bridge.state(h) for h in (rig.h0, rig.h1)] == ["idle", "idle"]
    assert rig.device_bytes() == bytes_before == [NEIGHBOUR, PATTERN]


#: (claimed extent, offset, size, direction): forged ranges past the real 64-byte allocation.
ENLARGED: dict[str, tuple[int, int, int, str]] = {
    "read-64KiB-from-extent-64KiB": (1 << 16, 0, 1 << 16, "read"),
    "read-far-from-extent-1TiB": (1 << 40, 1 << 39, 64, "read"),
    "write-far-into-extent-1TiB": (1 << 40, 1 << 39, 64, "write"),
    "write-just-past-the-end-of-extent-1TiB": (1 << 40, 64, 64, "write"),
}
ENLARGED_REFUSED = ["range constructed", "refused: InvalidHandleError HANDLE-1", "nothing changed", "device bytes kept"]


def enlarged_extent_outcome(backend: str, case: str) -> list[str]:
    """Run one enlarged-extent forgery; what happened, line by line (also run in a child process)."""
    extent, offset, nbytes, direction = ENLARGED[case]
    rig = make_rig(backend)
    forged = dataclasses.replace(rig.h1, extent=extent)
    try:
        device = DeviceRange(forged, offset, nbytes)  # its own check uses the claimed extent
    except BridgeError as e:
        return [f"DeviceRange refused: {type(e).__name__} {e.rule}"]
    lines = ["range constructed"]
    host = rig.ring.reserve(nbytes) if direction == "read" else put(rig.ring, b"\x5a" * nbytes)
    bytes_before = rig.device_bytes()
    before = rig.observe()
    if direction == "read":
        result = outcome(lambda: rig.bridge.device_to_host(device, host))
    else:
        result = outcome(lambda: rig.bridge.host_to_device(host, device))
    lines.append(f"refused: {result}" if result != "returned" else "accepted")
    lines.append("nothing changed" if rig.observe() == before else "state changed")
    lines.append("device bytes kept" if rig.device_bytes() == bytes_before == [NEIGHBOUR, PATTERN] else "bytes changed")
    return lines


CHILD = """
import sys
sys.path[:0] = [{here!r}, {tests!r}]
import tinygrad  # first, as in conftest
import test_hostile
print("\\n".join(test_hostile.enlarged_extent_outcome({backend!r}, {case!r})), flush=True)
"""


@pytest.mark.rejects("HANDLE-1")
@pytest.mark.parametrize("case", ENLARGED)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forged_enlarged_extent_neither_reads_nor_writes_past_the_allocation(backend: str, case: str) -> None:
    """On the fake in-process (it checks bounds itself); on tinygrad in a child process, where a
    regression is an out-of-bounds memmove (SIGSEGV) that must not take the test run with it."""
    if backend == "fake":
        lines = enlarged_extent_outcome(backend, case)
    else:
        code = CHILD.format(here=str(HERE), tests=str(TESTS), backend=backend, case=case)
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert child.returncode == 0, f"child exited {child.returncode}; stderr tail:\n{child.stderr[-2000:]}"
        lines = child.stdout.splitlines()[-len(ENLARGED_REFUSED) :]
    assert lines == ENLARGED_REFUSED
    assert_all_refused({case: lines[1].removeprefix("refused: ")}, "HANDLE-1")


def test_a_test_id_is_the_same_in_every_process() -> None:
    """pytest-xdist runs only if every worker collects the same ids: no memory address in one."""
    assert ident(object()) == "<object object>" and ident(object()) == ident(object())
