"""Program order on device bytes, on real memory (tinygrad's CPU device).

Copies and compute that touch the same device bytes must act as if run in the
order the worker issued them, whatever mix of sync and async copies and
`with bridge.compute(...)` blocks it used: a later write wins (WAW), a later
read sees the earlier write (RAW), an earlier read does not see a later write
(WAR). Each scenario repeats many times because a lost order shows only when
the backend's copy thread and the caller's thread happen to interleave badly;
every test counts the runs that went wrong and asserts there were none.
Copies into disjoint bytes must stay unordered: several in flight at once.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import numpy as np
import pytest
from tinygrad.tensor import Tensor

from devbridge import Bridge, DeviceRange, HostRange, HostRing, ObjectSpec, TensorViewSpec
from devbridge.backends.tinygrad import TinygradBackend
from devbridge.bridge.events import CopyEvent

BLOB = ObjectSpec("blob", "uint8")
RUNS = 2000  # copies only
VIEW_RUNS = 1000  # with a kernel per run; today the race is lost in 1% to 99% of runs, by scheduling
N = 64 * 1024  # bytes per copy


def _setup(ring_bytes: int = 16 * N) -> tuple[TinygradBackend, Bridge, HostRing]:
    backend = TinygradBackend("CPU")
    return backend, Bridge(backend), HostRing(ring_bytes)


def _filled(ring: HostRing, value: int, n: int = N) -> HostRange:
    """A reserved host range of `n` bytes, all `value`."""
    r = ring.reserve(n)
    ring.view(r)[:] = bytes([value]) * n
    return r


def _read(bridge: Bridge, ring: HostRing, dev: DeviceRange) -> bytes:
    """The device bytes of `dev`, by a sync device_to_host; the output range is released."""
    out = ring.reserve(dev.nbytes)
    bridge.device_to_host(dev, out, sync=True)
    data = bytes(ring.view(out))
    ring.release(out)
    return data


def _describe(got: bytes, want: int) -> str:
    values = sorted(set(got))
    return f"expected all {want}, got values {values[:8]}{'...' if len(values) > 8 else ''}"


# ------------------------------------------------------------ copies only


@pytest.mark.holds("ORDER-1")
def test_async_write_then_sync_write_same_bytes_keeps_issue_order() -> None:
    """WAW: a sync write issued after an async write of the same bytes lands last."""
    _, bridge, ring = _setup()
    h = bridge.alloc_device(BLOB, N)
    dev = DeviceRange(h, 0, N)
    wrong, first_bad = 0, ""
    for k in range(RUNS):
        a, b = k % 251, k % 251 + 1
        first = bridge.host_to_device(_filled(ring, a), dev, sync=False)
        bridge.host_to_device(_filled(ring, b), dev, sync=True)
        first.wait(timeout=30)
        got = _read(bridge, ring, dev)
        if got != bytes([b]) * N:
            wrong += 1
            first_bad = first_bad or f"run {k}: {_describe(got, b)}"
    assert wrong == 0, f"{wrong} of {RUNS} runs left the async write's bytes on the device ({first_bad})"


@pytest.mark.holds("ORDER-1")
def test_sync_read_after_async_write_sees_the_write() -> None:
    """RAW: a sync read issued after an async write of the same bytes returns the written bytes."""
    _, bridge, ring = _setup()
    h = bridge.alloc_device(BLOB, N)
    dev = DeviceRange(h, 0, N)
    stale, first_bad = 0, ""
    for k in range(RUNS):
        value = (3 * k) % 256  # differs from the previous run's bytes
        write = bridge.host_to_device(_filled(ring, value), dev, sync=False)
        got = _read(bridge, ring, dev)  # no wait on the write first
        if got != bytes([value]) * N:
            stale += 1
            first_bad = first_bad or f"run {k}: {_describe(got, value)}"
        write.wait(timeout=30)
        bridge.poll()
    assert stale == 0, f"{stale} of {RUNS} sync reads missed the async write before them ({first_bad})"


@pytest.mark.holds("ORDER-1")
def test_async_read_then_async_write_reads_old_bytes() -> None:
    """WAR: an async read issued before an async write of the same bytes reads the old bytes."""
    _, bridge, ring = _setup()
    h = bridge.alloc_device(BLOB, N)
    dev = DeviceRange(h, 0, N)
    wrong_read = wrong_final = 0
    first_bad = ""
    for k in range(RUNS):
        p, q = (5 * k) % 256, (5 * k + 1) % 256
        bridge.host_to_device(_filled(ring, p), dev, sync=True)
        out = ring.reserve(N)
        read = bridge.device_to_host(dev, out, sync=False)
        write = bridge.host_to_device(_filled(ring, q), dev, sync=False)
        read.wait(timeout=30)
        write.wait(timeout=30)
        got = bytes(ring.view(out))
        ring.release(out)
        if got != bytes([p]) * N:
            wrong_read += 1
            first_bad = first_bad or f"run {k}, read: {_describe(got, p)}"
        final = _read(bridge, ring, dev)
        if final != bytes([q]) * N:
            wrong_final += 1
            first_bad = first_bad or f"run {k}, final: {_describe(final, q)}"
    assert (wrong_read, wrong_final) == (0, 0), (
        f"of {RUNS} runs, {wrong_read} async reads saw the later write and "
        f"{wrong_final} final readbacks lacked it ({first_bad})"
    )


@pytest.mark.holds("ORDER-1")
def test_disjoint_async_copies_still_overlap_and_land() -> None:
    """Async copies into disjoint parts of one allocation are all in flight at once (issuing one
    never waits for another) and each part ends with its own bytes."""
    backend, bridge, ring = _setup(ring_bytes=32 * N)
    h = bridge.alloc_device(BLOB, 2 * N)
    part = N // 2
    ranges = [DeviceRange(h, i * part, part) for i in range(4)]  # four disjoint quarters
    wrong, first_bad = 0, ""
    not_overlapped: list[int] = []
    for k in range(RUNS):
        values = [(k + 17 * i) % 256 for i in range(4)]
        events: list[CopyEvent] = []

        def issue(events: list[CopyEvent] = events, values: list[int] = values) -> None:
            for dev, v in zip(ranges, values, strict=True):
                events.append(bridge.host_to_device(_filled(ring, v, part), dev, sync=False))

        if k % 50 == 0:  # with the copy thread held: every copy must be issued and pending together
            with backend.hold_copies():
                issuer = threading.Thread(target=issue)
                issuer.start()
                issuer.join(timeout=10)
                issued = not issuer.is_alive()
                if not (issued and len(events) == 4 and not any(e.done() for e in events)):
                    not_overlapped.append(k)
            issuer.join()  # the hold is over: a blocked issuer finishes now
        else:
            issue()
        for e in events:
            e.wait(timeout=30)
        got = _read(bridge, ring, DeviceRange(h, 0, 2 * N))
        want = b"".join(bytes([v]) * part for v in values)
        if got != want:
            wrong += 1
            first_bad = first_bad or f"run {k}: quarters hold {[got[i * part] for i in range(4)]}, not {values}"
    assert not not_overlapped, f"disjoint async copies were not all in flight at once in runs {not_overlapped}"
    assert wrong == 0, f"{wrong} of {RUNS} runs lost a disjoint copy ({first_bad})"


# ------------------------------------------------------------ copies and compute on a view
# Constants written by kernels come from a set of four, so that tinygrad compiles few kernels.


def _view_setup() -> tuple[Bridge, HostRing, DeviceRange]:
    _, bridge, ring = _setup()
    h = bridge.alloc_device(BLOB, N)
    return bridge, ring, DeviceRange(h, 0, N)


def _compute(bridge: Bridge, dev: DeviceRange, op: Callable[[Tensor], Tensor], assign: bool = True) -> Tensor:
    """One `with bridge.compute(...)` block realizing `op` on a fresh view of `dev`, assigned
    back into the view (`assign`) or not; the result. The view itself is dropped."""
    view = bridge.wrap_for_tinygrad(dev.handle, TensorViewSpec((dev.nbytes,), "uint8", dev.offset))
    with bridge.compute(dev.handle):
        result = (view.assign(op(view)) if assign else op(view)).realize()
    del view
    return result


def _const(value: int) -> Callable[[Tensor], Tensor]:
    """A kernel writing `value` over the whole view (one kernel per value: few values are used)."""
    return lambda v: v * 0 + value


def _settle(bridge: Bridge) -> None:
    """Collect the views dropped this run and apply their end (no view pins the next run)."""
    gc.collect(0)
    bridge.poll()


Run = Callable[[Bridge, HostRing, DeviceRange, int], "str | None"]


def _every_run(wrong_means: str, run: Run) -> None:
    """`run(bridge, ring, dev, k)` for VIEW_RUNS runs k on one view; it says what run k got
    wrong (None: nothing). Asserts that no run went wrong; `wrong_means` reads after "N of M"."""
    bridge, ring, dev = _view_setup()
    wrong = []
    for k in range(VIEW_RUNS):
        if (bad := run(bridge, ring, dev, k)) is not None:
            wrong.append(f"run {k}: {bad}")
        _settle(bridge)
    assert not wrong, f"{len(wrong)} of {VIEW_RUNS} {wrong_means} ({wrong[0]})"


def _unless(got: bytes, want: int) -> str | None:
    """None if every byte of `got` is `want`, else what it holds."""
    return None if got == bytes([want]) * len(got) else _describe(got, want)


def _async_read(bridge: Bridge, ring: HostRing, dev: DeviceRange, before: Callable[[], object] = lambda: None) -> bytes:
    """An async read of `dev`, `before()` issued right after it, then the bytes it read."""
    out = ring.reserve(N)
    read = bridge.device_to_host(dev, out, sync=False)
    before()
    read.wait(timeout=30)
    got = bytes(ring.view(out))
    ring.release(out)
    return got


@pytest.mark.holds("ORDER-1")
def test_compute_after_async_write_sees_the_copied_bytes() -> None:
    """RAW into compute: a kernel on a view, run in a compute block issued right after an async
    write of the same bytes, reads the written bytes (view + 1 == pattern + 1)."""

    def run(bridge: Bridge, ring: HostRing, dev: DeviceRange, k: int) -> str | None:
        value = (7 * k) % 256  # differs from the previous run's result, 7k - 6
        write = bridge.host_to_device(_filled(ring, value), dev, sync=False)
        _compute(bridge, dev, lambda v: v + 1)
        write.wait(timeout=30)
        return _unless(_read(bridge, ring, dev), (value + 1) % 256)

    _every_run("computes did not see the async write before them", run)


@pytest.mark.holds("ORDER-1")
def test_compute_write_after_async_write_lands_last() -> None:
    """WAW with compute: a kernel writing the view, issued right after an async write of the same
    bytes, leaves its own bytes."""

    def run(bridge: Bridge, ring: HostRing, dev: DeviceRange, k: int) -> str | None:
        copied, computed = k % 250, 250 + k % 4
        write = bridge.host_to_device(_filled(ring, copied), dev, sync=False)
        _compute(bridge, dev, _const(computed))
        write.wait(timeout=30)
        return _unless(_read(bridge, ring, dev), computed)

    _every_run("compute writes were undone by the async write before them", run)


@pytest.mark.holds("ORDER-1")
def test_async_read_after_compute_sees_the_computed_bytes() -> None:
    """RAW from compute: an async read issued right after a compute block that wrote the view
    returns the computed bytes."""

    def run(bridge: Bridge, ring: HostRing, dev: DeviceRange, k: int) -> str | None:
        computed = 250 + k % 4
        _compute(bridge, dev, _const(computed))
        return _unless(_async_read(bridge, ring, dev), computed)

    _every_run("async reads did not see the compute before them", run)


@pytest.mark.holds("ORDER-1")
def test_async_read_then_compute_write_reads_old_bytes() -> None:
    """WAR with compute: an async read issued before a compute block that writes the same bytes
    returns the bytes from before the compute."""

    def run(bridge: Bridge, ring: HostRing, dev: DeviceRange, k: int) -> str | None:
        old, computed = k % 250, 250 + k % 4
        bridge.host_to_device(_filled(ring, old), dev, sync=True)
        got = _async_read(bridge, ring, dev, lambda: _compute(bridge, dev, _const(computed)))
        read, final = _unless(got, old), _unless(_read(bridge, ring, dev), computed)
        return None if read is None and final is None else f"read {read}; final {final}"

    _every_run("async reads saw the compute issued after them", run)


@pytest.mark.holds("ORDER-1")
def test_compute_read_then_async_write_reads_old_bytes() -> None:
    """WAR into compute: a kernel reading the view, in a compute block issued before an async write
    of the same bytes, reads the bytes from before the write. (On tinygrad's CPU device realize()
    returns after the kernel ran, so today only an ordering fix that defers compute can break it.)"""

    def run(bridge: Bridge, ring: HostRing, dev: DeviceRange, k: int) -> str | None:
        old, new = k % 250, (k + 128) % 250
        bridge.host_to_device(_filled(ring, old), dev, sync=True)
        result = _compute(bridge, dev, lambda v: v + 1, assign=False)
        bridge.host_to_device(_filled(ring, new), dev, sync=False).wait(timeout=30)
        got = result.numpy().tobytes()
        del result
        computed, final = _unless(got, old + 1), _unless(_read(bridge, ring, dev), new)
        return None if computed is None and final is None else f"compute {computed}; final {final}"

    _every_run("computes read the async write issued after them", run)


def test_view_results_are_exact() -> None:
    """Sanity for the compute tests: a view over copied bytes computes exactly (no race: the copy
    is sync)."""
    bridge, ring, dev = _view_setup()
    pattern = np.arange(N, dtype=np.uint64).astype(np.uint8)
    src = ring.reserve(N)
    ring.view(src)[:] = pattern.tobytes()
    bridge.host_to_device(src, dev, sync=True)
    _compute(bridge, dev, lambda v: v + 1)
    got = np.frombuffer(_read(bridge, ring, dev), dtype=np.uint8)
    np.testing.assert_array_equal(got, pattern + np.uint8(1))
