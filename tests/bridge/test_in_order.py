"""The Bridge on an in-order queue that reads host bytes late: `FakeBackend(in_order=True)`.

A real device with its own memory runs commands in the order they were queued and reads (or
writes) host bytes when it gets to a command, not when the call returns: completing one event
completes everything queued before it, and a synchronous copy runs only after what is ahead.
`QueueMachine` drives the Bridge over such a device with uploads, downloads, compute blocks,
completions, waits, frees and restarts, reusing released ring bytes as soon as the contract
allows, and checks after every step, by name (`models.lockstep.CHECKS`):

* `device-bytes`: an idle allocation holds exactly the bytes a one-call-at-a-time run would
  (every upload applied in issue order, ORDER-1);
* `host-bytes`: a finished download's host bytes are the device bytes as of its issue;
* `release-status`: an upload's host bytes stay unreleased until its event is done (H2D-3),
  and are released once it is done;
* the fake's own checks (`late-read`: a device read host bytes other than those it was given;
  `order`, `free-in-use`, ...) raise where they happen.

The seeded device bug `reads_sync_late` (a sync copy done at submission, as tinygrad's
`_copyin` on OpenCL) must be caught by one of exactly these checks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from devbridge import (
    Bridge,
    CopyEvent,
    DeviceHandle,
    DeviceRange,
    Event,
    HostRange,
    HostRing,
    ObjectSpec,
    OutputNotReadyError,
    RingFullError,
)
from devbridge.backends.fake import FakeBackend
from devbridge.models.lockstep import agree, kill_of

RING = 32  # small: released bytes are reserved again within a few calls
U8 = ObjectSpec("b", "uint8")
#: What the run did that only an in-order, late-reading queue makes interesting (asserted > 0).
SEEN: Counter[str] = Counter()


def pattern(seed: int, n: int) -> bytes:
    """`n` bytes of a seed, never zero (a fresh allocation is zeros: a copy of them would hide)."""
    return bytes((seed * 31 + 7 * k) % 251 + 1 for k in range(n))


@dataclass
class Live:
    handle: DeviceHandle
    shadow: bytearray  # the bytes a one-call-at-a-time run leaves on the device


@dataclass
class Pending:
    event: Event
    host: HostRange | None = None  # an upload's source or a download's destination
    upload: bool = False
    expected: bytes = b""  # a download: the device bytes as of its issue
    allocs: set[int] = field(default_factory=set)


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fake = FakeBackend(in_order=True)
        self.bridge = Bridge(self.fake)
        self.ring = HostRing(RING)
        self.live: list[Live] = []
        self.pending: list[Pending] = []

    # ------------------------------------------------------------ helpers

    def pick(self, i: int) -> Live:
        return self.live[i % len(self.live)]

    def reserve(self, n: int) -> HostRange | None:
        try:
            return self.ring.reserve(n)
        except RingFullError:
            return None

    def span(self, target: Live, off: int, n: int) -> tuple[int, int]:
        extent = target.handle.extent
        off %= extent
        return off, 1 + n % (extent - off)

    def settle(self) -> None:
        """Check and retire the events that are done: a download's bytes, an upload's release."""
        for p in [p for p in self.pending if p.event.done()]:
            self.pending.remove(p)
            assert p.host is not None or not isinstance(p.event, CopyEvent)
            if p.host is None:
                continue
            if p.event.error is None and not p.upload:
                got = bytes(self.ring.view(p.host))
                agree(got == p.expected, "host-bytes", f"download {p.host}: {got!r}, issue order says {p.expected!r}")
            if p.upload:
                agree(self.ring.released(p.host) == (p.event.error is None), "release-status", f"upload {p.host}")
            elif p.event.error is not None:
                with pytest.raises(OutputNotReadyError):
                    self.ring.view(p.host)  # a failed or aborted output is never readable
            if not self.ring.released(p.host):
                self.ring.release(p.host)

    # ------------------------------------------------------------ rules

    @precondition(lambda self: len(self.live) < 3)
    @rule(extent=st.integers(1, 12))
    def alloc(self, extent: int) -> None:
        handle = self.bridge.alloc_device(U8, extent)
        self.live.append(Live(handle, bytearray(extent)))

    @precondition(lambda self: self.live)
    @rule(
        i=st.integers(0, 2), off=st.integers(0, 23), n=st.integers(0, 23), seed=st.integers(0, 250), sync=st.booleans()
    )
    def upload(self, i: int, off: int, n: int, seed: int, sync: bool) -> None:
        target = self.pick(i)
        off, n = self.span(target, off, n)
        src = self.reserve(n)
        if src is None:
            return
        data = pattern(seed, n)
        SEEN["ring bytes reused"] += src.start >= RING
        self.ring.view(src)[:] = data  # fresh bytes, or bytes a finished copy released: reused at once
        SEEN["sync upload behind queued work"] += sync and bool(self.fake.pending())
        event = self.bridge.host_to_device(src, DeviceRange(target.handle, off, n), sync=sync)
        target.shadow[off : off + n] = data
        if sync:
            agree(event.done() and self.ring.released(src), "release-status", f"sync upload {src} not released")
        else:
            self.pending.append(Pending(event, src, upload=True, allocs={target.handle.id}))

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 2), off=st.integers(0, 11), n=st.integers(0, 11), sync=st.booleans())
    def download(self, i: int, off: int, n: int, sync: bool) -> None:
        target = self.pick(i)
        off, n = self.span(target, off, n)
        out = self.reserve(n)
        if out is None:
            return
        expected = bytes(target.shadow[off : off + n])
        event = self.bridge.device_to_host(DeviceRange(target.handle, off, n), out, sync=sync)
        self.pending.append(Pending(event, out, expected=expected, allocs={target.handle.id}))

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 2), both=st.booleans())
    def compute(self, i: int, both: bool) -> None:
        handles = {self.pick(i).handle, self.pick(i + 1).handle} if both else {self.pick(i).handle}
        with self.bridge.compute(*handles) as event:
            pass
        self.pending.append(Pending(event, allocs={h.id for h in handles}))

    @precondition(lambda self: self.pending)
    @rule(i=st.integers(0, 7))
    def complete(self, i: int) -> None:
        """The device finishes one queued command (and, in order, everything before it)."""
        queued = self.fake.pending()
        if queued:
            SEEN["a completion that ends the work ahead"] += i % len(queued) > 0
            self.fake.complete(queued[i % len(queued)])

    @precondition(lambda self: self.pending)
    @rule(i=st.integers(0, 7))
    def wait(self, i: int) -> None:
        p = self.pending[i % len(self.pending)]
        try:
            p.event.wait(timeout=5)
        except Exception as e:  # an aborted copy raises its error; anything else fails the test
            assert p.event.error is e

    @rule()
    def poll(self) -> None:
        self.bridge.poll()

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 2))
    def free(self, i: int) -> None:
        self.bridge.free_device(self.live.pop(i % len(self.live)).handle)

    @rule()
    def restart(self) -> None:
        SEEN["restart with work queued"] += bool(self.fake.pending())
        self.bridge.restart()
        self.live.clear()

    # ------------------------------------------------------------ invariants

    @invariant()
    def copies_and_bytes(self) -> None:
        self.settle()
        for p in self.pending:  # an upload still in flight keeps its host bytes (H2D-3)
            if p.upload and p.host is not None:
                agree(not self.ring.released(p.host), "release-status", f"upload {p.host} released while in flight")
        for target in self.live:
            if self.bridge.state(target.handle) == "idle":
                got = self.fake.buffer(self.fake_buffer(target)).data.tobytes()
                agree(got == bytes(target.shadow), "device-bytes", f"#{target.handle.id}: {got!r}")

    def fake_buffer(self, target: Live) -> int:
        record = self.bridge._core.allocation(target.handle.id)
        assert record is not None
        buffer = record.memory
        assert isinstance(buffer, int)
        return buffer

    def teardown(self) -> None:
        self.fake.complete_all()
        self.bridge.poll()


RUN = settings(
    derandomize=True,
    database=None,
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)


def test_the_bridge_on_an_in_order_queue_that_reads_late() -> None:
    SEEN.clear()
    run_state_machine_as_test(QueueMachine, settings=RUN)
    assert set(SEEN) == {
        "ring bytes reused", "sync upload behind queued work", "a completion that ends the work ahead",
        "restart with work queued",
    } and min(SEEN.values()) > 0, SEEN  # fmt: skip


#: Seeded bridge bugs of tests/mutants.py on the timing of host bytes and ORDER-1, and the check of
#: this machine that must catch each.
CAUGHT_BY = {
    "release_on_submit": {"release-status", "fake:late-read"},
    "sync_copy_keeps_host_bytes": {"release-status"},
    "missing_waw_edge": {"fake:order"},
    "missing_war_edge": {"fake:order"},
    "missing_raw_edge": {"fake:order"},
    "free_while_in_use": {"fake:free-in-use"},
}


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_a_seeded_bridge_bug_is_caught_on_the_in_order_queue(name: str) -> None:
    from mutants import MUTANTS

    with MUTANTS[name](), pytest.raises(Exception) as caught:
        run_state_machine_as_test(QueueMachine, settings=settings(RUN, report_multiple_bugs=False))
    assert kill_of(caught.value) in CAUGHT_BY[name], caught.value


def test_a_sync_copy_that_only_enqueues_is_caught_by_a_named_check() -> None:
    with mock.patch.object(FakeBackend, "reads_sync_late", True), pytest.raises(Exception) as caught:
        run_state_machine_as_test(QueueMachine, settings=RUN)
    assert kill_of(caught.value) in {"device-bytes", "host-bytes", "fake:late-read"}, caught.value
    print(f"\n{kill_of(caught.value)}: {caught.value}\n" + "\n".join(getattr(caught.value, "__notes__", [])))


def test_the_in_order_fake_completes_what_is_ahead_first() -> None:
    fake = FakeBackend(in_order=True)
    a, b, c = fake.alloc(4, "uint8"), fake.alloc(4, "uint8"), fake.alloc(4, "uint8")
    first = fake.copy_in(a, 0, memoryview(bytearray(b"1111")), sync=False)
    second = fake.copy_in(b, 0, memoryview(bytearray(b"2222")), sync=False)
    third = fake.compute([c])
    fake.complete(second)  # the queue runs `first` before it
    assert (first.pending, second.pending, third.pending) == (False, False, True)
    assert fake.buffer(a).data.tobytes() == b"1111" and fake.buffer(b).data.tobytes() == b"2222"
    host = bytearray(4)
    fake.copy_out(memoryview(host), b, 0, sync=True)  # a sync copy runs after everything ahead
    assert not third.pending and host == b"2222"
    fake.extend(third)  # a compute block exited: its marker moves to the tail, pending again
    assert third.pending and fake.pending() == [third]
    any_order = FakeBackend()
    x, y = any_order.alloc(4, "uint8"), any_order.alloc(4, "uint8")
    e1 = any_order.copy_in(x, 0, memoryview(bytearray(b"aaaa")), sync=False)
    e2 = any_order.compute([y])
    any_order.complete(e2)
    assert e1.pending and not e2.pending
