"""Lockstep: the real Bridge (over FakeBackend and a HostRing) and the reference model, side by side.

Every call goes to both; the model predicts the outcome (a result, a refusal
that changes nothing, or a failure), the implementation must match, and
`check()` compares everything observable after each step. The Hypothesis
stateful test and the bounded model checker both drive this one class.

Views: the harness holds every tinygrad tensor that reaches a view (the view
and tensors derived from it) and nothing else does, so dropping one here is
dropping its last reference; CPython collects it at once (no gc needed).

Ordering (ORDER-1): the model says which uses are held back; only submitted
ones can be completed or failed by a test, and `check()` asserts that the
fake's pending events are exactly the submitted uses, settles the events of
uses the model ended on its own (run by a synchronous call's wait, aborted
held uses) and compares each device byte with the model's issue-order bytes.

With `record`, each call also appends the public-API code it ran, with
assertions of the model's predictions, to `script`: a failing sequence becomes
a runnable test. A call is made as data (`Act`: a target, a method, the
arguments), so the code it writes is derived from the call it runs
(`Lockstep.source` names the objects: `h0`, `r1.sub(0, 4)`, `e2`, ...), never
written beside it by hand.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from devbridge.bridge.bridge import Bridge
from devbridge.bridge.events import ComputeEvent, Event
from devbridge.errors import BridgeError
from devbridge.models.reference import VIEW_ALIGNMENT, Fail, ReferenceModel, Reject
from devbridge.ring.host import HostRange, HostRing
from devbridge.statemachine.core import USE_EVENTS, InvariantViolation
from devbridge.statemachine.machine import Step
from devbridge.testing.fake import FakeBackend, FakeEvent, FakeViolation
from devbridge.types import DeviceHandle, DeviceRange, ObjectSpec, TensorViewSpec

U8 = ObjectSpec("blob", "uint8")


#: The lockstep's named checks (besides `refused:RULE` and `error:RULE`, one per rule).
CHECKS = frozenset(
    {
        "raised", "event", "pending", "held", "submitted", "states", "frees", "cursor", "release-status",
        "host-view", "host-bytes", "readonly", "device-bytes", "pins", "poll", "leak", "unchanged", "use-id",
        "alloc", "reserve", "once", "completion",
    }
)  # fmt: skip


class Disagreement(AssertionError):
    """The implementation disagrees with the model, or breaks an invariant: `check` names which
    comparison failed (a seeded bug must be caught by the check it breaks, never by any error):
    `refused:RULE` (a refusal the model predicts did not come), `error:RULE` (another error came),
    `raised` (a call the model says succeeds raised), `event` (an event's end), `pending`,
    `held`, `submitted` (uses in flight), `states`, `frees`, `cursor`, `release-status`,
    `host-view`, `host-bytes`, `readonly`, `device-bytes`, `pins`, `poll`, `leak`, `unchanged`
    (a refused call changed something), `use-id`, `alloc`, `reserve`, `once` (a use ended
    twice), `completion` (a reported completion not applied by the next call)."""

    def __init__(self, check: str, detail: str) -> None:
        assert check in CHECKS or check.partition(":")[0] in ("refused", "error"), check
        super().__init__(f"[{check}] {detail}")
        self.check = check


def ran(event: Event) -> bool:
    """Whether the fake has ended the event's token (it ran, or failed, on the device)."""
    token = event.backend_token
    return isinstance(token, FakeEvent) and not token.pending


def queue_position(event: Event) -> int:
    token = event.backend_token
    assert isinstance(token, FakeEvent)
    return token.id


@contextmanager
def lock_held_elsewhere(bridge: Bridge) -> Iterator[None]:
    """Another thread holds the bridge's lock for the block (as a call in flight there would):
    what the backend reports meanwhile finds it busy."""
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with bridge._lock:
            holding.set()
            done.wait(30)

    thread = threading.Thread(target=hold, name="devbridge-lock-holder")
    thread.start()
    holding.wait(30)
    try:
        yield
    finally:
        done.set()
        thread.join()


def agree(ok: bool, check: str, detail: str) -> None:
    if not ok:
        raise Disagreement(check, detail)


def kill_of(error: BaseException) -> str:
    """What caught a bug: a Disagreement's check, `fake:` and the kind of a FakeViolation, or the
    error's type name (which no seeded bug may be caught by)."""
    if isinstance(error, Disagreement):
        return error.check
    if isinstance(error, FakeViolation):
        return f"fake:{error.kind}"
    if isinstance(error, InvariantViolation):
        return error.invariant
    return type(error).__name__


# Tensors derived from a live tensor `t`, unrealized, each reaching t's view (VIEW-3):
# the source for the script and the same code to run.
DERIVE: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "reshape": ("{t}.reshape(1, -1)", lambda t: t.reshape(1, -1)),  # a movement op
    "lazy": ("{t} + 1", lambda t: t + 1),  # a lazy op, never realized
    "assign": ("{t}.detach().assign({t} + 0)", lambda t: t.detach().assign(t + 0)),  # a new Tensor, assign target
}
PIN_KEYS = ("state", "copies_in", "copies_out", "computes", "views")  # bridge.pins but the time waited

SCRIPT_HEADER = [
    "import pytest",
    "from devbridge import *",
    "from devbridge.testing import FakeBackend",
    "from devbridge.models.lockstep import lock_held_elsewhere",
    "",
    "",
    "def pins(bridge, h):",
    "    return {k: v for k, v in bridge.pins(h).as_dict().items() if k not in ('waiting_s', 'holders', 'uses')}",
    "",
    "",
]


class Act:
    """One call of the public API, kept as its parts: running it and writing it into the
    rendered test are the same thing (`Lockstep.act` names its objects)."""

    __slots__ = ("args", "code", "kwargs", "method", "target")

    def __init__(
        self, target: Any, method: str | None, args: tuple[object, ...], kwargs: dict[str, object], code: str
    ) -> None:
        self.target, self.method, self.args, self.kwargs, self.code = target, method, args, kwargs, code

    def __call__(self) -> Any:
        call = self.target if self.method is None else getattr(self.target, self.method)
        return call(*self.args, **self.kwargs)

    @classmethod
    def of(cls, call: Callable[[], Any], code: str) -> Act:
        """What is not one call of the API (a write through a view, a read of one): its source
        written by hand."""
        return cls(call, None, (), {}, code)


class Lockstep:
    """Drives the real Bridge (over the fake and a HostRing) and the reference model with the
    same calls and compares what they do; with `record`, writes the calls as a pytest test."""

    def __init__(
        self,
        ring_capacity: int,
        observer: Callable[[str, str, Step], None] | None = None,
        record: bool = False,
        edges: Callable[[str, str, str], None] | None = None,
        refusals: Counter[str] | None = None,
        in_order: bool = False,
    ) -> None:
        """`observer` sees every spec step, `edges` every hazard edge the core finds (earlier
        kind, later kind, hazard), `refusals` counts the rules of the refusals the model predicts.
        `in_order`: the fake is one in-order queue (`FakeBackend(in_order=True)`): what it runs
        ahead of a use a call asked for ends in the model as the Bridge learns of it (`reconcile`)."""
        self.record = record
        self.fake = FakeBackend(in_order=in_order)
        self.bridge = Bridge(self.fake)
        self.ring = HostRing(ring_capacity)
        self.model = ReferenceModel(ring_capacity)
        self.bridge._core.observer = observer
        self.bridge._core.edge_observer = edges
        self.refusals: Counter[str] = refusals if refusals is not None else Counter()
        self.handles: list[DeviceHandle] = []
        self.reservations: list[HostRange] = []
        self.pending: dict[int, Event] = {}  # model use id -> bridge event, for copies and computes
        self.tensors: dict[int, Any] = {}  # model tensor id -> a live tensor reaching a view (held only here)
        self.derived: dict[int, str] = {}  # model tensor id -> "view" or how it was derived
        assert self.fake.view_alignment("uint8") == VIEW_ALIGNMENT, "the model's alignment is the fake's"
        self.cursor = 0
        #: While True, calls skip the comparisons (a checker replaying a path it already checked).
        self.replaying = False
        self.script = [
            "def test_counterexample():",
            f"    fake = FakeBackend({'in_order=True' if in_order else ''})",
            "    bridge = Bridge(fake)",
            f"    ring = HostRing({ring_capacity})",
        ]

    # ------------------------------------------------------------ mechanics

    def emit(self, *lines: str) -> None:
        if self.record:
            self.script += [f"    {line}" for line in lines]

    def source(self, value: object) -> str:
        """How the rendered test names `value`: the test's own objects by name, values it built
        by the expression that builds them, anything else by repr."""
        named = {
            id(self.bridge): "bridge",
            id(self.ring): "ring",
            id(self.fake): "fake",
            id(self.bridge._core): "bridge._core",
        }
        if id(value) in named:
            return named[id(value)]
        if isinstance(value, DeviceHandle):
            h = f"h{value.id}"
            if any(value is issued for issued in self.handles):
                return h
            return f"DeviceHandle({h}.id, {h}.generation, {h}.extent, {h}.spec, owner={value.owner!r})"  # forged
        if isinstance(value, HostRange):
            return (
                self.rname(value)
                if value.ring is self.ring and self._reserved(value)
                else (f"HostRange(ring, {value.start}, {value.nbytes})")
            )
        if isinstance(value, DeviceRange):
            return f"DeviceRange(h{value.handle.id}, {value.offset}, {value.nbytes})"
        if isinstance(value, TensorViewSpec):
            return f"TensorViewSpec({value.shape!r}, {value.dtype!r}, {value.offset})"
        if isinstance(value, ObjectSpec):
            return f"ObjectSpec({value.name!r}, {value.dtype!r})"
        if isinstance(value, Event):
            return f"e{value.use_id}"
        if isinstance(value, type):
            return value.__name__
        return repr(value)

    def act(self, target: Any, method: str | None, *args: object, **kwargs: object) -> Act:
        """`target.method(*args, **kwargs)` (`target(...)` without a method), to run and to render."""
        head = self.source(target) + ("" if method is None else f".{method}")
        parts = [self.source(a) for a in args] + [f"{k}={self.source(v)}" for k, v in kwargs.items()]
        return Act(target, method, args, kwargs, f"{head}({', '.join(parts)})")

    def snapshot(self) -> object:
        return (
            self.bridge.stats(),
            [self.bridge.state(h) for h in self.handles],
            self.ring.snapshot(),
            self.fake.snapshot(),
        )

    def expect(self, outcome: object, act: Act, unchanged: bool = True, then: str | None = "{}") -> Any:
        """Run `act`; a model refusal must raise its error and change nothing (but what a
        synchronous call ran before it was refused: `unchanged` is then False). The rendered test
        gets `then` with the call in it when the model says it succeeds (None: no line), and a
        `pytest.raises` block when it says it fails."""
        call, code = act, act.code
        if self.replaying:  # this step was compared when first taken: run it, skip the comparisons
            try:
                return call()
            except BridgeError:
                if isinstance(outcome, Reject | Fail):
                    return None
                raise
        if isinstance(outcome, Reject):
            self.refusals[outcome.rule] += 1
        if isinstance(outcome, Reject | Fail):
            self.emit(f"with pytest.raises({outcome.error}, match=r'\\[{outcome.rule}\\]'):", f"    {code}")
            before = self.snapshot() if isinstance(outcome, Reject) and unchanged else None
            try:
                call()
            except BridgeError as e:
                ok = (type(e).__name__, e.rule) == (outcome.error, outcome.rule)
                agree(ok, f"error:{outcome.rule}", f"{e!r}, not {outcome}")
            else:
                raise Disagreement(f"refused:{outcome.rule}", f"expected {outcome}, the call succeeded")
            if before is not None:
                agree(self.snapshot() == before, "unchanged", "a rejected call changed something")
            return None
        if then is not None:  # not str.format: the line may quote bytes with braces in them
            head, _, tail = then.partition("{}")
            self.emit(head + code + tail)
        try:
            return call()
        except BridgeError as e:
            raise Disagreement("raised", f"{code} raised {e!r}; the model says it succeeds") from e

    @staticmethod
    def span(r: HostRange) -> range:
        return range(r.start, r.end)

    def _reserved(self, r: HostRange) -> bool:
        return any(res.start <= r.start and r.end <= res.end for res in self.reservations)

    def rname(self, r: HostRange) -> str:
        """Source code naming `r` as a sub-range of one of the reservations."""
        k = next(i for i, res in enumerate(self.reservations) if res.start <= r.start and r.end <= res.end)
        whole = self.reservations[k]
        return f"r{k}" if whole == r else f"r{k}.sub({r.start - whole.start}, {r.nbytes})"

    def stray_end(self, alloc_id: int, event: str) -> bool:
        """Whether `event` (copy_end or compute_end) would end no use in flight: the core must refuse it."""
        kinds = {kind for kind, (_, end) in USE_EVENTS.items() if end == event}
        return not kinds & {self.model.uses[u].kind for u in self.model.allocs[alloc_id].uses}

    def track(self, use: int, event: Event) -> None:
        """The event a call returned: pending exactly when the model has its use in flight."""
        agree(event.use_id == use, "use-id", f"event of use #{event.use_id}, the model's #{use}")
        done, in_flight = event.done(), use in self.model.uses
        self.emit(f"assert {'not ' if in_flight else ''}e{use}.done()")
        agree(done != in_flight, "pending", f"use #{use} returned {'done' if done else 'pending'}, the model says "
              f"{'in flight' if in_flight else 'ended'}")  # fmt: skip
        if not done:
            self.pending[use] = event

    def submitted(self) -> list[int]:
        """The pending uses on the backend (not held back), oldest first: a test may end these."""
        return [u for u in sorted(self.pending) if u in self.model.uses and self.model.uses[u].submitted]

    def reconcile(self) -> None:
        """Settle the events of uses the model ended on its own: run by a synchronous call's
        wait (the fake's wait runs the work), or held back past a restart and aborted; on an
        in-order queue also those the queue ran ahead of another (`ran_ahead`)."""
        self.ran_ahead()
        for u in sorted(self.pending):
            if u not in self.model.uses:
                self.settled(u, self.pending.pop(u), self.model.outcomes[u])

    def ran_ahead(self) -> None:
        """In order: the uses the fake's queue ran ahead of one a call or a test asked for (a
        synchronous copy runs what is ahead of it; completing or waiting for an event, what is
        ahead of that) end in the model too, in queue order, as armed; again for uses that
        launched meanwhile. An open compute's marker is re-queued when its block exits: it stays."""
        while self.fake.in_order:
            done = sorted(
                (queue_position(event), u)
                for u, event in self.pending.items()
                if ran(event) and u in self.model.uses and self.model.uses[u].submitted and not self.model.uses[u].open
            )
            if not done:
                return
            for _, u in done:
                if u in self.model.uses:
                    self.model.finish(u)

    # ------------------------------------------------------------ calls

    def alloc(self, extent: int, fails: bool) -> DeviceHandle | None:
        outcome = self.model.alloc(extent, fails)
        if fails:
            self.fake.fail_next("alloc")  # alloc always reaches the backend
            self.emit('fake.fail_next("alloc")')
        act = self.act(self.bridge, "alloc_device", U8, extent)
        h: DeviceHandle | None = self.expect(outcome, act, then=f"h{outcome} = {{}}")
        if h is not None:
            agree(h.id == outcome == len(self.handles), "alloc", f"handle #{h.id}, the model's #{outcome}")
            self.handles.append(h)
        return h

    def free(self, h: DeviceHandle) -> None:
        self.expect(self.model.free(h.id), self.act(self.bridge, "free_device", h))

    def restart(self) -> None:
        self.expect(self.model.restart(), self.act(self.bridge, "restart"))

    def arm_free_fault(self) -> None:
        """The next backend free fails (whichever allocation it is for, whenever it happens)."""
        self.emit('fake.fail_next("free")')
        self.fake.fail_next("free")
        self.model.arm_free_faults()

    def poll(self, finished: int) -> None:
        """bridge.poll() after `finished` uses ended since the last bridge call (views dropped,
        events failed by a query): returns that count, or reports deferred frees that failed."""
        outcome = self.model.poll(finished)
        got = self.expect(outcome, self.act(self.bridge, "poll"), then=f"assert {{}} == {outcome}")
        if isinstance(outcome, int):
            agree(got == outcome, "poll", f"bridge.poll() processed {got} uses, the model says {outcome}")

    def reserve(self, n: int) -> HostRange | None:
        outcome = self.model.reserve(n)
        r = self.expect(outcome, self.act(self.ring, "reserve", n), then=f"r{len(self.reservations)} = {{}}")
        if r is not None:
            ok = isinstance(outcome, range) and (r.start, r.end) == (outcome.start, outcome.stop)
            agree(ok, "reserve", f"reserved {r}, the model says {outcome}")
            self.reservations.append(r)
        return r  # type: ignore[no-any-return]

    def fill(self, r: HostRange, data: bytes) -> None:
        """The producer writes through ring.view; while an input copy reads any of the bytes the
        view is read-only (H2D-3): writing through it fails and changes nothing."""
        outcome = self.model.view_rejection(self.span(r))
        if outcome is None and self.model.view_readonly(self.span(r)):
            self.emit(
                f"assert ring.view({self.rname(r)}).readonly",
                "with pytest.raises(TypeError):",
                f"    ring.view({self.rname(r)})[:] = {data!r}",
            )
            view = self.ring.view(r)
            agree(view.readonly is True, "readonly", f"host bytes {r} under an input copy are writable")
            before = self.snapshot()
            try:
                view[:] = data
            except TypeError:
                pass
            else:
                raise Disagreement("readonly", f"wrote through a read-only view of {r}")
            agree(self.snapshot() == before, "unchanged", "a refused write changed something")
            return
        code = f"ring.view({self.rname(r)})[:] = {data!r}"

        def write() -> None:
            view = self.ring.view(r)
            agree(view.readonly is False, "readonly", f"host bytes {r} no input copy reads are read-only")
            view[:] = data

        self.expect(outcome, Act.of(write, code))
        if outcome is None:
            self.model.write_host(self.span(r), data)

    def read(self, r: HostRange) -> None:
        outcome = self.model.view_rejection(self.span(r))
        code = f"bytes(ring.view({self.rname(r)}))"
        expected = self.model.read_host(self.span(r)) if outcome is None else b""
        got = self.expect(outcome, Act.of(lambda: bytes(self.ring.view(r)), code), then=f"assert {{}} == {expected!r}")
        if outcome is None:
            agree(got == expected, "host-bytes", f"{code} is {got!r}, the model says {expected!r}")

    def released(self, start: int, n: int) -> None:
        """ring.released of any range, reserved or not (bytes never reserved: RING-1)."""
        outcome = self.model.released(range(start, start + n))
        act = self.act(self.ring, "released", HostRange(self.ring, start, n))
        got = self.expect(outcome, act, then=f"assert {{}} is {outcome}")
        if isinstance(outcome, bool):
            agree(got is outcome, "release-status", f"{act.code} is {got}, the model says {outcome}")

    def release(self, r: HostRange) -> None:
        self.expect(self.model.release(self.span(r)), self.act(self.ring, "release", r))

    def host_to_device(
        self,
        src: HostRange,
        h: DeviceHandle,
        d_off: int,
        sync: bool,
        fails: bool,
        release: bool = True,
        lost: bool = False,
        at_once: bool = False,
    ) -> None:
        outcome = self.model.host_to_device(self.span(src), h.id, d_off, sync, fails, release, at_once)
        act = self.act(
            self.bridge, "host_to_device", src, DeviceRange(h, d_off, src.nbytes), sync=sync, release=release
        )
        self._copy("copy_in", outcome, act, sync, lost, at_once)

    def device_to_host(
        self,
        h: DeviceHandle,
        d_off: int,
        dst: HostRange,
        sync: bool,
        fails: bool,
        lost: bool = False,
        at_once: bool = False,
    ) -> None:
        outcome = self.model.device_to_host(h.id, d_off, self.span(dst), sync, fails, at_once)
        act = self.act(self.bridge, "device_to_host", DeviceRange(h, d_off, dst.nbytes), dst, sync=sync)
        self._copy("copy_out", outcome, act, sync, lost, at_once)

    def _copy(self, op: str, outcome: object, act: Act, sync: bool, lost: bool, at_once: bool) -> None:
        """With `lost`, the backend's query of an accepted asynchronous copy, right after it is
        submitted, fails: the copy returns an event that is already done and failed (a held copy
        is queried only once launched: nothing is lost then). With `at_once`, the fake finishes
        an asynchronous copy at submission (unless it fails): it ends as a synchronous one."""
        if self.model.armed:  # the call reaches the backend at once: arm the fault
            self.fake.fail_next(op)
            self.emit(f'fake.fail_next("{op}")')
        lost = lost and isinstance(outcome, int) and not sync and self.model.uses[outcome].submitted
        if lost:
            self.emit('fake.fail_next("query")')
            self.fake.fail_next("query")
        if at_once:
            self.emit("fake.finish_at_once = True")
            self.fake.finish_at_once = True
        try:
            event = self.expect(outcome, act, unchanged=not self.model.ran, then=f"e{outcome} = {{}}")
        finally:
            self.fake.finish_at_once = False
        if at_once:
            self.emit("fake.finish_at_once = False")
        if isinstance(outcome, int):
            if lost:
                agree(event.use_id == outcome, "use-id", f"event of use #{event.use_id}, the model's #{outcome}")
                self.settled(outcome, event, self.model.finish(outcome, failed=True))
            else:
                self.track(outcome, event)

    def compute(self, handles: list[DeviceHandle], fails: bool) -> int | None:
        """bridge.compute(*handles); the model's use id of its event, if made."""
        outcome = self.model.compute([h.id for h in handles], fails)
        if self.model.armed:
            self.fake.fail_next("compute")
            self.emit('fake.fail_next("compute")')
        act = self.act(self.bridge, "compute", *handles)
        event = self.expect(outcome, act, unchanged=not self.model.ran, then=f"e{outcome} = {{}}")
        if not isinstance(outcome, int):
            return None
        self.track(outcome, event)
        return outcome

    def open_compute(self, use: int) -> None:
        """Enter the compute event's `with` block: until it exits, the event cannot end, and a
        call that would wait for it is refused (ORDER-2)."""
        event = self.pending[use]
        assert isinstance(event, ComputeEvent)
        self.emit(f"e{use}.__enter__()")
        event.__enter__()
        self.model.uses[use].open = True

    def close_compute(self, use: int) -> None:
        event = self.pending[use]
        assert isinstance(event, ComputeEvent)
        self.emit(f"e{use}.__exit__(None, None, None)")
        event.__exit__(None, None, None)
        self.model.uses[use].open = False

    def wrap(self, h: DeviceHandle, d_off: int, d_n: int, fails: bool = False) -> int | None:
        """A view of `d_n` bytes at `d_off` (refused past the extent or at an unaligned offset:
        VIEW-2; the backend failing to make it, `fails`: VIEW-1); the model's id of its tensor."""
        outcome = self.model.wrap(h.id, d_off, d_n, fails)
        if isinstance(outcome, Fail):  # the call reaches the backend: arm its fault
            self.fake.fail_next("view")
            self.emit('fake.fail_next("view")')
        act = self.act(self.bridge, "wrap_for_tinygrad", h, TensorViewSpec((d_n,), "uint8", d_off))
        tensor = self.expect(outcome, act, then=f"t{outcome} = {{}}")
        if not isinstance(outcome, int):
            return None
        self.tensors[outcome] = tensor
        self.derived[outcome] = "view"
        return outcome

    def derive(self, t: int, kind: str) -> int:
        """A tensor derived from live tensor `t` (see DERIVE): it reaches the same view, so the
        view's use lasts while it lives (VIEW-3); the model's id of the new tensor."""
        source, make = DERIVE[kind]
        d = self.model.derive(t)
        self.emit(f"t{d} = {source.format(t=f't{t}')}")
        self.tensors[d] = make(self.tensors[t])
        self.derived[d] = kind
        return d

    def drop(self, t: int) -> None:
        """Drop tensor `t`: the last one reaching its view ends the view's use. The finalizer only
        queues the end: no backend free happens before the next bridge call (here a poll, which
        counts it); an earlier tensor dropped ends nothing."""
        ended = self.model.drop(t)
        frees = [c.buffer for c in self.fake.calls if c.op == "free"]
        self.emit(f"del t{t}")
        del self.tensors[t], self.derived[t]
        if ended:
            self.emit(f"assert [c.buffer for c in fake.calls if c.op == 'free'] == {frees!r}")
            now = [c.buffer for c in self.fake.calls if c.op == "free"]
            agree(now == frees, "frees", "freed before the next bridge call")
        self.poll(ended)

    def complete(self, use: int, failed: bool) -> None:
        event = self.pending.pop(use)
        expected = self.model.finish(use, failed)
        if failed:
            self.emit(f"fake.fail(e{use})")
            self.fake.fail(event, "failed by the test")
        else:
            self.emit(f"fake.complete(e{use})")
            self.fake.complete(event)
        self.settled(use, event, expected)

    def complete_while_busy(self, use: int) -> None:
        """The fake completes pending event `use` while another thread holds the bridge's lock:
        the completion waits in the core's queue, and the next bridge call applies it (and
        launches what it held back). Any-order queue only."""
        event = self.pending.pop(use)
        expected = self.model.finish(use)
        self.emit("with lock_held_elsewhere(bridge):", f"    fake.complete(e{use})")
        with lock_held_elsewhere(self.bridge):
            self.fake.complete(event)
        self.emit(f"assert bridge.stats().inflight_uses == {len(self.model.uses)}  # the next call applied it")
        in_flight = self.bridge.stats().inflight_uses
        agree(in_flight == len(self.model.uses), "completion",
              f"after the next call {in_flight} uses are in flight, the model says {len(self.model.uses)}: "
              f"a completion reported while the lock was busy was not applied")  # fmt: skip
        self.settled(use, event, expected)

    def poll_finds(self, use: int) -> None:
        """The fake finishes pending event `use` without reporting it (a marker the Bridge must
        query) and bridge.poll() finds it. The held copies its end launches finish at submission
        (an idle device) as the poll runs, ending in turn: the poll must end each once, and
        counts the one it found. Any-order queue only."""
        event = self.pending.pop(use)
        held = {u for u, x in self.model.uses.items() if not x.submitted}
        expected = self.model.finish(use)
        while launched := sorted(u for u in held if u in self.model.uses and self.model.uses[u].submitted):
            for u in launched:  # (one armed to fail stays pending: it fails at completion)
                held.discard(u)
                if not self.model.uses[u].fails:
                    self.model.finish(u)
        self.emit(f"fake.complete(e{use}, report=False)", "fake.finish_at_once = True")
        self.fake.complete(event, report=False)
        self.fake.finish_at_once = True
        try:
            self.poll(1)
        except Disagreement as e:
            cause = e.__cause__
            if isinstance(cause, BridgeError) and cause.rule == "EVENT-1":  # the core refused a second end
                raise Disagreement("once", f"bridge.poll() ended a use twice: {cause}") from cause
            raise
        finally:
            self.fake.finish_at_once = False
        self.emit("fake.finish_at_once = False")
        self.settled(use, event, expected)

    def query_fails(self, use: int, via_poll: bool) -> None:
        """The backend's query of pending event `use` fails: the device gave up the work, and the
        bridge settles the event as failed (an abort, if a restart ended its generation). The
        query comes from event.done(), or from bridge.poll() (which queries the oldest first)."""
        event = self.pending.pop(use)
        self.emit('fake.fail_next("query")')
        self.fake.fail_next("query")
        expected = self.model.finish(use, failed=True)
        if via_poll:
            agree(use == min([use, *self.submitted()]), "poll", "poll queries the oldest submitted event first")
            self.poll(1)
        else:
            self.emit(f"assert e{use}.done()")
            agree(event.done(), "event", f"use #{use} is not done after its query failed")
        self.settled(use, event, expected)

    def wait_fails(self, use: int) -> None:
        """The backend's wait on pending event `use` fails (its query does not): the event
        fails as for a failed completion, and wait raises the event's error."""
        event = self.pending.pop(use)
        self.emit('fake.fail_next("wait")')
        self.fake.fail_next("wait")
        expected = self.model.finish(use, failed=True)
        assert expected is not None
        self.expect(Fail(*expected), self.act(event, "wait", timeout=1))
        self.settled(use, event, expected)

    def wait(self, use: int) -> None:
        """event.wait() on a pending event: the bridge waits for the oldest use in its chain (the
        fake's wait runs it) until the event is done; it raises the event's error, if any."""
        event = self.pending[use]
        while use in self.model.uses:
            self.model._run_before_use(use)
        expected = self.model.outcomes[use]  # it runs what it follows, oldest first, then itself
        self.expect(None if expected is None else Fail(*expected), self.act(event, "wait", timeout=5))
        self.settled(use, self.pending.pop(use), expected)

    def wait_times_out(self, use: int) -> None:
        """Waiting no time on a pending event: WaitTimeoutError (WAIT-1), nothing changes."""
        event = self.pending[use]
        self.expect(Reject("WaitTimeoutError", "WAIT-1"), self.act(event, "wait", timeout=0))

    def settled(self, use: int, event: Event, expected: tuple[str, str] | None) -> None:
        agree(event.done(), "event", f"use #{use} is not done; the model ended it (ORDER-1: waited for, or aborted)")
        error = event.error
        if expected is None:
            self.emit(f"assert e{use}.done() and e{use}.error is None")
        else:
            self.emit(f"assert isinstance(e{use}.error, {expected[0]}) and e{use}.error.rule == {expected[1]!r}")
        got = None if error is None else (type(error).__name__, error.rule)
        agree(got == expected, "event", f"use #{use} ended with {got}, the model says {expected}")

    # ------------------------------------------------------------ invariants

    def check(self) -> None:
        """Everything observable agrees with the model, and the spec's invariants hold: each
        invariant's checks in the spec's order (`INVARIANT_CHECKS`)."""
        for invariant in INVARIANT_CHECKS:
            self.check_invariant(invariant)

    def check_invariant(self, invariant: str) -> None:
        """The checks of one spec invariant (INV-*), after settling what the model ended."""
        self.reconcile()
        INVARIANT_CHECKS[invariant](self)

    def check_counts(self) -> None:
        """INV-COUNTS: the uses in flight, each allocation's state and its pins are the model's."""
        inflight = sorted(u for u, use in self.model.uses.items() if use.kind != "view")
        if inflight:
            self.emit(f"assert not any(e.done() for e in [{', '.join(f'e{u}' for u in inflight)}])")
        agree(sorted(self.pending) == inflight, "pending", "events pending differ from the model's uses in flight")
        on_backend = {u for u in self.pending if self.model.uses[u].submitted}
        for u, event in self.pending.items():
            agree((event.backend_token is not None) == (u in on_backend), "held", f"use #{u} held back: ORDER-1")
        # in order, an open compute's marker may have run; its block's exit queues it again
        ran_open = {u for u in on_backend if self.fake.in_order and self.model.uses[u].open and ran(self.pending[u])}
        tokens = {id(self.pending[u].backend_token) for u in on_backend - ran_open}
        running = sum(1 for use in self.model.uses.values() if use.submitted and use.kind != "view") - len(ran_open)
        self.emit(f"assert len(fake.pending()) == {running}")
        running_ok = {id(ev) for ev in self.fake.pending()} == tokens and len(tokens) == running
        agree(running_ok, "submitted", "the fake runs exactly the uses the model submitted")
        states = [self.model.state(h.id) for h in self.handles]
        self.emit(f"assert [bridge.state(h) for h in [{', '.join(f'h{h.id}' for h in self.handles)}]] == {states!r}")
        got = [self.bridge.state(h) for h in self.handles]
        agree(got == states, "states", f"states {got} differ from the model's {states}")
        for h in self.handles:
            self.check_pins(h)

    def check_no_free_in_use(self) -> None:
        """INV-NO-FREE-IN-USE (and INV-FREE-ONCE's at most once): the backend frees are the
        model's, each after the last use; the fake's own checks never fired."""
        freed = self.model.frees
        self.emit(f"assert [c.buffer for c in fake.calls if c.op == 'free'] == {freed!r}")
        now = [c.buffer for c in self.fake.calls if c.op == "free"]
        agree(now == freed, "frees", f"backend frees {now}, the model's {freed} (never in use, each once)")
        self.raise_swallowed("INV-NO-FREE-IN-USE")

    def check_free_once(self) -> None:
        """INV-FREE-ONCE: the backend's free counts (successful and failed) are the model's."""
        frees = {"backend_frees": len(self.model.frees) - self.model.free_failures}
        frees["free_failures"] = self.model.free_failures
        self.emit(f"assert {{k: getattr(bridge.stats(), k) for k in {sorted(frees)!r}}} == {frees!r}")
        stats = self.bridge.stats()
        agree({k: getattr(stats, k) for k in frees} == frees, "frees", "backend free counts differ")
        # memory_stats() is what the device holds: the fake's live buffers (a failed free's stay)
        memory = self.bridge.memory_stats()
        held = memory.all.allocated_bytes_current + memory.failed_free_bytes
        agree(held == self.fake.bytes_in_use, "frees", f"memory_stats: {held} B, the fake: {self.fake.bytes_in_use}")
        count = memory.all.allocation_current + memory.failed_frees
        agree(count == self.fake.live_allocations, "frees", f"memory_stats holds {count} allocations")
        self.raise_swallowed("INV-FREE-ONCE")

    def check_quiescent(self) -> None:
        """INV-QUIESCENT: with nothing in flight, the backend holds exactly the buffers the model
        says (live ones, and dead ones whose free failed): everything freed was released."""
        if not self.model.uses:
            held = self.model.held()
            self.emit(f"assert fake.live_allocations == {held}")
            assert self.model.quiescent_leaks() == [], "the model itself leaks"
            agree(self.fake.live_allocations == held, "leak", "a freed allocation is still held at quiescence")

    def check_cursor(self) -> None:
        """INV-CURSOR: the cursor is monotone and stops at the first unreleased byte; every
        reservation's released status is the model's."""
        cursor = self.model.cursor()
        self.emit(f"assert ring.cursor == {cursor}")
        agree(self.ring.cursor >= self.cursor, "cursor", "cursor moved backwards")
        agree(self.ring.cursor == cursor, "cursor", "cursor passed an unreleased byte or stopped early")
        self.cursor = self.ring.cursor
        for k, r in enumerate(self.reservations):
            released = self.model.released(self.span(r))
            assert isinstance(released, bool), "a reservation's bytes were reserved"
            self.emit(f"assert ring.released(r{k}) is {released}")
            agree(self.ring.released(r) == released, "release-status", f"release status of {r}")

    def check_output(self) -> None:
        """INV-OUTPUT: host bytes are readable exactly when the model says, holding its bytes."""
        for k, r in enumerate(self.reservations):
            if set(self.span(r)) <= self.model.unreleased:
                self.probe_view(k, r)

    def check_exact(self) -> None:
        """INV-EXACT: every live allocation's device bytes are the model's issue-order bytes."""
        for h in self.handles:
            if not self.model.allocs[h.id].released:
                expected = self.model.device_bytes(h.id)
                self.emit(f"assert fake.device_bytes({h.id}) == {expected!r}")
                ok = self.fake.device_bytes(h.id) == expected
                agree(ok, "device-bytes", f"device bytes of #{h.id} differ from the issue order's")
        self.raise_swallowed("INV-EXACT")

    def check_generation(self) -> None:
        """INV-GENERATION: the fake refuses a touch of old (or freed) memory where it happens
        (FakeViolation `old-generation`, `freed-buffer`); none was swallowed."""
        self.raise_swallowed("INV-GENERATION")

    def raise_swallowed(self, invariant: str) -> None:
        """A violation of the fake's own checks that `invariant` owns (FAKE_CHECKS), raised where it
        happened but caught before it reached the harness: raised again here."""
        for violation in self.fake.violations:
            if violation.kind in FAKE_CHECKS[invariant]:
                raise violation

    def check_pins(self, h: DeviceHandle) -> None:
        """bridge.pins agrees with the model's uses in flight (a view counts while any tensor
        reaches it); it has waited only while a release is deferred. The fake's live views of the
        buffer (anchors any tensor still reaches) are the model's views."""
        expected = self.model.pins(h.id)
        self.emit(f"assert pins(bridge, h{h.id}) == {expected!r}")
        got = self.bridge.pins(h).as_dict()
        waited = got.pop("waiting_s")
        agree(got.pop("holders") == {}, "pins", "holders named without a census")
        uses = got.pop("uses")
        named = Counter(use["kind"] for use in uses)
        by_kind = {"copy_in": "copies_in", "copy_out": "copies_out", "compute": "computes", "view": "views"}
        agree(
            all(named[kind] == expected[field] for kind, field in by_kind.items()) and len(uses) == sum(named.values()),
            "pins", f"pins of #{h.id} name {[use['kind'] for use in uses]}, the model counts {expected}",
        )  # fmt: skip
        distinct = len({use["use_id"] for use in uses}) == len(uses)
        agree(distinct and all(use["held"] == bool(use["follows"]) for use in uses), "pins", f"#{h.id}: uses {uses}")
        agree(list(got) == list(PIN_KEYS), "pins", f"pins keys {list(got)}")
        agree(got == expected, "pins", f"pins of #{h.id}: {got}, the model says {expected}")
        agree(type(waited) is float and waited >= 0, "pins", f"waited {waited!r}")
        agree(
            waited == 0.0 or str(expected["state"]).endswith("_pending"), "pins", f"#{h.id} waited {waited} s unpinned"
        )
        views = self.fake.live_views(h.id)
        agree(views == expected["views"], "pins", f"the fake sees {views} live views, the model {expected['views']}")

    def probe_view(self, k: int, r: HostRange) -> None:
        """Host bytes are readable exactly when the model says so, and hold the model's bytes."""
        refused = self.model.view_rejection(self.span(r))
        if refused is not None:
            self.emit(f"with pytest.raises({refused.error}):", f"    ring.view(r{k})")
            try:
                self.ring.view(r)
            except BridgeError as e:
                agree((type(e).__name__, e.rule) == (refused.error, refused.rule), "host-view", f"{e!r}, not {refused}")
            else:
                raise Disagreement("host-view", f"host bytes {r} are readable; the model says {refused}")
        else:
            expected = self.model.read_host(self.span(r))
            readonly = self.model.view_readonly(self.span(r))
            self.emit(
                f"assert bytes(ring.view(r{k})) == {expected!r}", f"assert ring.view(r{k}).readonly is {readonly}"
            )
            view = self.ring.view(r)
            agree(bytes(view) == expected, "host-bytes", f"host bytes of {r} differ from the model's")
            agree(view.readonly is readonly, "readonly", f"view of {r} readonly={view.readonly}, the model: {readonly}")

    def test_source(self) -> str:
        return "\n".join([*SCRIPT_HEADER, *self.script]) + "\n"


#: The fake's own checks (FakeViolation kinds) each invariant owns: one the bridge swallowed is
#: still found, by the invariant it breaks (a test holds them to VIOLATION_KINDS, each once).
FAKE_CHECKS: dict[str, tuple[str, ...]] = {
    "INV-NO-FREE-IN-USE": ("free-in-use", "free-under-view"),
    "INV-FREE-ONCE": ("double-free", "unknown-buffer"),
    # "order": issue-order bytes; "late-read": the bytes an input copy read were not those it was given
    "INV-EXACT": ("out-of-bounds", "guard-bytes", "unaligned-view", "order", "late-read"),
    "INV-GENERATION": ("old-generation", "freed-buffer"),
}

#: Each spec invariant's checks, in the spec's order (a test asserts they are the spec's).
INVARIANT_CHECKS: dict[str, Callable[[Lockstep], None]] = {
    "INV-COUNTS": Lockstep.check_counts,
    "INV-NO-FREE-IN-USE": Lockstep.check_no_free_in_use,
    "INV-FREE-ONCE": Lockstep.check_free_once,
    "INV-CURSOR": Lockstep.check_cursor,
    "INV-OUTPUT": Lockstep.check_output,
    "INV-EXACT": Lockstep.check_exact,
    "INV-GENERATION": Lockstep.check_generation,
    "INV-QUIESCENT": Lockstep.check_quiescent,
}
