"""A hostile-API fuzzer: random sequences of every public call, in the worker's own pattern
(allocate, upload, compute, view, download, poll, restart) interleaved with calls whose
arguments are anything at all. The one property: no call lets anything but a `BridgeError`
escape, and no call hangs. `tests/model/test_fuzz.py` runs it briefly in CI on the fake and on
tinygrad's CPU device; `scripts/fuzz --minutes 10` runs it for as long as asked.
"""

from __future__ import annotations

import gc
import inspect
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support import F32, U8

from devbridge import (
    Bridge,
    BridgeError,
    ComputeEvent,
    DeviceHandle,
    DeviceRange,
    Event,
    HostRange,
    HostRing,
    ObjectSpec,
    TensorViewSpec,
)
from devbridge.backends.base import Backend
from devbridge.backends.fake import FakeBackend
from devbridge.backends.tinygrad import TinygradBackend

SPECS = [U8, F32, ObjectSpec("flag", "bool", role="data"), ObjectSpec("half", "float16", role="data")]
#: Sizes and offsets around every edge the bridge checks (zero, one past, negative, huge).
NUMBERS = st.one_of(st.integers(0, 80), st.sampled_from([-1, 81, 1 << 40, 2**63]))
JUNK: list[object] = [None, True, 0, -1, 2**64, 1.5, float("nan"), "h", b"\x00", [], (), {}, object(), Bridge]
PUBLIC = ["alloc_device", "free_device", "host_to_device", "device_to_host", "upload", "download", "compute",
          "wrap_for_tinygrad", "poll", "restart", "wait_all", "wait_any", "pins", "state", "stats",
          "check_device_range"]  # fmt: skip


#: Positional parameters of each public method (a call of another arity is Python's TypeError).
ARITY = {
    name: sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in inspect.signature(getattr(Bridge, name)).parameters.values())
    - 1
    for name in PUBLIC
}
ARITY["compute"] = 2  # *handles: any number; two here


class APIFuzz(RuleBasedStateMachine):
    """One bridge over `make_backend()`, a ring, and everything the calls handed out so far."""

    make_backend: ClassVar[Any] = FakeBackend
    runs: ClassVar[int] = 0  # examples finished, and the calls they made (scripts/fuzz reports them)
    calls_made: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        self.backend: Backend = self.make_backend()
        self.bridge = Bridge(self.backend, pending_warning_s=0.0)
        self.ring = HostRing(1024)
        self.handles: list[DeviceHandle] = []
        self.ranges: list[HostRange] = []
        self.events: list[Event] = []
        self.open: list[ComputeEvent] = []  # compute events entered as a `with` block, not exited
        self.views: list[object] = []
        self.calls = 0

    def attempt(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """Make the call; a BridgeError is an answer, anything else escapes and fails the run, and
        so does EVENT-1 (a use ended that was not in flight: the bridge's own bookkeeping, which
        no call a caller makes can cause)."""
        self.calls += 1
        try:
            return call(*args, **kwargs)
        except BridgeError as e:
            if e.rule == "EVENT-1":
                raise
            return None

    def pick(self, data: st.DataObject, items: list[Any]) -> Any:
        pool = items + JUNK if items else JUNK
        return data.draw(st.sampled_from(pool))

    def handle_or_junk(self, data: st.DataObject) -> Any:
        return self.pick(data, self.handles)

    def device_range(self, data: st.DataObject) -> Any:
        if not self.handles or data.draw(st.integers(0, 9)) == 0:
            return self.pick(data, [])
        h, offset, nbytes = data.draw(st.sampled_from(self.handles)), data.draw(NUMBERS), data.draw(NUMBERS)
        made = self.attempt(DeviceRange, h, offset, nbytes)  # a range past its extent is refused as it is made
        return made if made is not None else (h, offset, nbytes)

    # ------------------------------------------------------------ the worker's pattern

    @rule(spec=st.sampled_from(SPECS), extent=NUMBERS)
    def alloc(self, spec: ObjectSpec, extent: int) -> None:
        if (h := self.attempt(self.bridge.alloc_device, spec, extent)) is not None:
            self.handles.append(h)

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self.attempt(self.bridge.free_device, self.handle_or_junk(data))

    @rule(n=st.integers(1, 96), fill=st.integers(0, 255))
    def reserve(self, n: int, fill: int) -> None:
        r = self.attempt(self.ring.reserve, n)
        if r is not None:
            self.ring.view(r)[:] = bytes([fill]) * n
            self.ranges.append(r)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.attempt(self.ring.release, self.pick(data, self.ranges))

    def copy_ranges(self, data: st.DataObject, fill: int | None) -> tuple[Any, Any]:
        """A device range and a host range for one copy: mostly a well-formed pair (a range that
        fits an allocation, freshly reserved host bytes of its size, filled for an upload), else
        whatever the run has seen or junk."""
        if self.handles and data.draw(st.integers(0, 4)) > 0:
            h = data.draw(st.sampled_from(self.handles))
            offset = data.draw(st.integers(0, h.extent - 1))
            nbytes = data.draw(st.integers(1, h.extent - offset))
            host = self.attempt(self.ring.reserve, nbytes)
            if host is not None:
                self.ranges.append(host)
                if fill is not None:
                    self.ring.view(host)[:] = bytes([fill]) * nbytes
                return DeviceRange(h, offset, nbytes), host
        return self.device_range(data), self.pick(data, self.ranges)

    @rule(data=st.data(), sync=st.booleans(), release=st.booleans(), fill=st.integers(0, 255))
    def upload(self, data: st.DataObject, sync: bool, release: bool, fill: int) -> None:
        dst, src = self.copy_ranges(data, fill)
        if (ev := self.attempt(self.bridge.host_to_device, src, dst, sync=sync, release=release)) is not None:
            self.events.append(ev)

    @rule(data=st.data(), sync=st.booleans())
    def download(self, data: st.DataObject, sync: bool) -> None:
        src, dst = self.copy_ranges(data, None)
        if (ev := self.attempt(self.bridge.device_to_host, src, dst, sync=sync)) is not None:
            self.events.append(ev)

    @rule(data=st.data(), block=st.booleans())
    def compute(self, data: st.DataObject, block: bool) -> None:
        handles = data.draw(st.lists(st.sampled_from(self.handles + JUNK[:3]), max_size=3))
        if (ev := self.attempt(self.bridge.compute, *handles)) is not None:
            self.events.append(ev)
            if block:
                self.open.append(ev.__enter__())

    @rule(data=st.data(), sync_up=st.booleans(), then=st.sampled_from(["poll", "done", "wait", "wait_any", "none"]))
    def worker_object(self, data: st.DataObject, sync_up: bool, then: str) -> None:
        """One object the worker's way on an allocation of the run: upload, compute (not waited
        for), download behind it (held by ORDER-1), then whatever comes next."""
        if not self.handles:
            self.alloc(U8, 8)
        h = data.draw(st.sampled_from(self.handles))
        (dst, src), (back, out) = self.copy_ranges(data, 7), self.copy_ranges(data, None)
        steps = [
            self.attempt(self.bridge.host_to_device, src, dst, sync=sync_up),
            self.attempt(self.bridge.compute, h),
            self.attempt(self.bridge.device_to_host, back, out, sync=False),
        ]
        events = [e for e in steps if e is not None]
        self.events += events
        if then == "poll":
            self.attempt(self.bridge.poll)
        elif then == "done" and events:
            self.attempt(events[-1].done)
        elif then == "wait" and events:
            self.attempt(events[-1].wait, 0.001)
        elif then == "wait_any" and events:
            self.attempt(self.bridge.wait_any, events[::-1], timeout=0.001)

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data())
    def close_block(self, data: st.DataObject) -> None:
        ev = self.open.pop(data.draw(st.integers(0, len(self.open) - 1)))
        self.attempt(ev.__exit__, None, None, None)

    @rule(data=st.data(), n=st.integers(0, 20), offset=st.sampled_from([0, 0, 4, 3]))
    def view(self, data: st.DataObject, n: int, offset: int) -> None:
        h = self.handle_or_junk(data)
        dtype = h.spec.dtype if isinstance(h, DeviceHandle) else "uint8"
        view = self.attempt(lambda: self.bridge.wrap_for_tinygrad(h, TensorViewSpec((n,), dtype, offset)))
        if view is not None:
            self.views.append(view if data.draw(st.booleans()) else view.reshape(n))  # a derived tensor pins too

    @precondition(lambda self: bool(self.views))
    @rule(data=st.data())
    def drop_view(self, data: st.DataObject) -> None:
        del self.views[data.draw(st.integers(0, len(self.views) - 1))]
        gc.collect()

    @rule(data=st.data(), timeout=st.sampled_from([0, 0.0, 0.001, -1, float("nan"), "1"]))
    def wait(self, data: st.DataObject, timeout: object) -> None:
        ev = self.pick(data, self.events)
        if isinstance(ev, Event):
            self.attempt(ev.wait, timeout)
            self.attempt(ev.done)
            self.attempt(lambda: ev.error)

    @rule(data=st.data(), any_=st.booleans())
    def wait_many(self, data: st.DataObject, any_: bool) -> None:
        events = data.draw(st.lists(st.sampled_from(self.events + JUNK[:2]), max_size=3))
        self.attempt(self.bridge.wait_any if any_ else self.bridge.wait_all, events, timeout=0.001)

    @rule()
    def poll(self) -> None:
        self.attempt(self.bridge.poll)

    @rule()
    def restart(self) -> None:
        self.attempt(self.bridge.restart)

    @precondition(lambda self: isinstance(self.backend, FakeBackend))
    @rule(data=st.data(), how=st.sampled_from(["complete", "fail", "all"]))
    def device_finishes(self, data: st.DataObject, how: str) -> None:
        fake = self.backend
        assert isinstance(fake, FakeBackend)
        pending = fake.pending()
        if how == "all" or not pending:
            fake.complete_all()
        elif how == "complete":
            fake.complete(data.draw(st.sampled_from(pending)))
        else:
            fake.fail(data.draw(st.sampled_from(pending)))

    @rule(data=st.data())
    def look(self, data: st.DataObject) -> None:
        h = self.handle_or_junk(data)
        self.attempt(self.bridge.pins, h)
        self.attempt(self.bridge.state, h)
        self.attempt(self.bridge.stats)
        r = self.pick(data, self.ranges)
        self.attempt(self.ring.view, r)
        self.attempt(self.ring.released, r)

    # ------------------------------------------------------------ anything at all

    @rule(data=st.data())
    def hostile_call(self, data: st.DataObject) -> None:
        """A public method with arguments drawn from everything the run has seen and junk."""
        name = data.draw(st.sampled_from(PUBLIC))
        method = getattr(self.bridge, name)
        known: list[object] = [*self.handles, *self.ranges, *self.events, *SPECS, self.ring]
        args = [data.draw(st.sampled_from(known + JUNK)) for _ in range(ARITY[name])]  # calls Python accepts
        flags = {"host_to_device": ("sync", "release"), "device_to_host": ("sync",), "upload": ("sync",)}.get(name, ())
        kwargs = {flag: data.draw(st.sampled_from([True, False, *JUNK])) for flag in flags}
        self.attempt(method, *args, **kwargs)

    @invariant()
    def counts_are_whole(self) -> None:
        stats = self.bridge.stats()
        assert all(type(v) is int and v >= 0 for v in stats.as_dict().values()), stats

    def teardown(self) -> None:
        for ev in self.open:
            self.attempt(ev.__exit__, None, None, None)
        self.views.clear()
        gc.collect()
        if isinstance(self.backend, FakeBackend):
            self.backend.complete_all()
        self.attempt(self.bridge.poll)
        APIFuzz.runs += 1
        APIFuzz.calls_made += self.calls


class TinygradCPUFuzz(APIFuzz):
    make_backend: ClassVar[Any] = staticmethod(lambda: TinygradBackend("CPU"))
