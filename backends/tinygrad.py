"""TinygradBackend: real device memory through tinygrad (CPU and CL here; CUDA, NV, AMD, METAL where present).

Memory is a tinygrad `Buffer` per allocation; views are Tensors over that
Buffer's own memory (`Tensor(UOp.from_buffer(buf.view(...)))`; on a device
without sub-buffers, CL, a view Buffer at offset 0 over the allocation's own
`cl_mem`), never copies. What each device offers is its capability record
(`tinygrad_compat.capabilities`, `TinygradBackend.capabilities`).

Completion events:
* synchronous copies are done on return: the host bytes are read (input) or
  written (output) by then;
* on devices whose memory is host memory (CPU), asynchronous copies run on a
  copy thread with `ctypes.memmove` (which drops the GIL), so they overlap
  compute; an input copy reads the host bytes when it runs, and the Bridge
  releases them only when the thread has finished (the Bridge never submits
  an output copy while a compute that writes its bytes is in flight, ORDER-1);
* on CL every copy and compute marker is its own OpenCL command with a
  `cl_event` on the device's in-order queue (`tinygrad_cl.py`): an
  asynchronous copy returns once enqueued, its host bytes stay in use until
  its event completes, a query never blocks, and completion is reported
  through `subscribe`; no call drains the queue;
* elsewhere copies are enqueued on the device and complete when its timeline
  signal passes the value taken after them (NV/AMD), or after a
  `synchronize()` (CUDA, METAL, ...);
* a compute marker completes when the device has finished the work queued
  before it (the marker is taken again when a `with bridge.compute(...)`
  block exits).

Synchronous copies on an idle CPU device (no work queued: the check
tinygrad's own `synchronize` makes first) skip the allocator's per-call
synchronize: a slice assignment of the buffer's own bytes up to 1 MiB, a
`ctypes.memmove` on its address above; with work queued they go through
`_copyin`/`_copyout`, which synchronize first.

Issue order of copies: the Bridge never submits a copy while one it
conflicts with is in flight (ORDER-1); on CPU the copy thread runs
asynchronous copies in the order issued, and copies of other bytes may run
beside them; on CL the queue runs commands in the order enqueued. Elsewhere
every copy goes through the allocator's `_copyin`/`_copyout`, which runs in
order on the device's queue before the call returns (an asynchronous copy
only completes its event later). Compute is not ordered against copies by
this backend: the Bridge does that (ORDER-1), holding a conflicting copy
back until the compute event completes and making compute() wait for the
copies in flight on its allocations.

Release and tinygrad's LRU cache: `free` means the bridge gives up its
ownership. The Buffer is parked until the device has finished the work
queued before the free, then dropped (on an idle CPU device, at once; on CL
at once, since every later use of the memory runs behind that work on the
device's in-order queue); tinygrad returns the memory to its LRU
cache only once no tinygrad object (a view, a lazy graph built on one)
refers to it any more. So a reused address is never visible through an old
view, and old handles never reach the backend (the Bridge rejects them).

A Buffer that was never viewed, freed where it would be dropped at once, is
kept instead for the next allocation of its size (a caching allocator, as
PyTorch's: that allocation is a list pop, not a Buffer and the allocator's
calls): a few per size, a bounded total, none across a generation, all given
back to tinygrad before an allocation that fails is tried again. A Buffer
that was viewed is never kept: tinygrad objects built on it may hold state
about it, so it goes back to tinygrad as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from devbridge.backends import tinygrad_compat as tg
from devbridge.backends.base import Backend, BackendError, implements
from devbridge.statemachine.status import OK, PENDING, Status

if TYPE_CHECKING:
    from devbridge.backends.tinygrad_cl import CLQueue, Command
from devbridge.errors import InvalidArgumentError, short

Probe = Callable[[], bool]
MIN_PAUSE_S, MAX_PAUSE_S = 0.00005, 0.002  # waiting on a device marker: the pause grows to 2 ms
#: An asynchronous copy up to this size on an idle CPU device is made at once (done on return):
#: handing it to the copy thread costs more in thread switching than the memmove itself.
INLINE_MAX_BYTES = 64 << 10
#: Freed Buffers kept for reuse: at most this many of one size, and this many bytes in all.
POOL_PER_SIZE = 4
POOL_MAX_BYTES = 64 << 20
#: A direct copy (an idle CPU device) up to this size is a slice assignment of the device's bytes:
#: no ctypes call (a tenth of a 64 B memmove's cost). It holds the GIL; larger ones use memmove,
#: which releases it.
VIEW_COPY_MAX_BYTES = 1 << 20


@dataclass(eq=False)
class TinygradToken:
    """One event: a copy-thread future, an OpenCL command, or a probe on the device's queue."""

    op: str
    future: Future[None] | None = None
    probe: Probe | None = None
    gate: threading.Event | None = None  # while cleared, the event reports pending (hold_copies)
    command: Command | None = None

    def status(self) -> Status:
        if self.gate is not None and not self.gate.is_set():
            return PENDING
        if self.command is not None:
            if not self.command.done():
                return PENDING
            return OK if self.command.error is None else Status(True, self.command.error)
        if self.future is not None:
            if not self.future.done():
                return PENDING
            exc = self.future.exception()
            return OK if exc is None else Status(True, f"{type(exc).__name__}: {exc}")
        assert self.probe is not None
        return OK if self.probe() else PENDING


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


@implements(Backend)
class TinygradBackend:
    """Real device memory through tinygrad: one `Buffer` per allocation, views as tensors over
    it, copies and compute markers completed by the device's own primitive (the module's
    docstring; `tinygrad_compat.capabilities(device)` says what each device offers)."""

    name = "tinygrad"

    def __init__(self, device: str | None = None) -> None:
        """Open `device` (tinygrad's default when None).

        Raises:
            InvalidArgumentError: ARG-1, for a name that is not a string, or a device tinygrad
                cannot open here."""
        if device is not None and (type(device) is not str or not device):
            raise InvalidArgumentError("ARG-1", f"device must be None or a device name, got {short(device)}")
        try:
            self.device = tg.open_device(device or tg.default_device())
        except Exception as e:  # tinygrad raises ImportError, RuntimeError, ... for a device it cannot open
            raise InvalidArgumentError("ARG-1", f"tinygrad cannot open device {short(device)}: {e}") from e
        self.generation = 0
        self._lock = threading.RLock()
        self._copies = ThreadPoolExecutor(max_workers=1, thread_name_prefix="devbridge-copy")
        self._listeners: list[Callable[[object], None]] = []
        self._parked: list[tuple[Probe, tg.Buffer]] = []  # freed, waiting for the device to finish
        self._pool: dict[int, list[tg.Buffer]] = {}  # freed, never viewed: for the next allocation of their size
        self._pooled_bytes = 0
        # ids of Buffers a view was made over, until their free (an id a collected Buffer left and a
        # new one took only keeps that one from the pool: never the other way round)
        self._viewed: set[int] = set()
        self._gate = threading.Event()
        self._gate.set()
        self.capabilities = tg.capabilities(self.device)
        self._idle = tg.idle_probe(self.device)  # CPU: synchronous copies skip an idle device's synchronize
        self._markers = tg.markers(self.device)
        self._queue: CLQueue | None = None  # CL: OpenCL commands with their own events
        if self.capabilities.events == "cl-event":
            from devbridge.backends.tinygrad_cl import CLQueue

            self._queue = CLQueue(self.device)
        self.direct_copies = 0  # synchronous copies made at once on an idle CPU device
        #: id(Buffer) -> its memory as bytes, while the Buffer lives (a plain dict: read per copy)
        self._host_views: dict[int, memoryview] = {}

    # ------------------------------------------------------------ Backend protocol

    def begin_generation(self, generation: int) -> None:
        self.generation = generation
        self.trim()  # a new generation (often after a fault) starts from tinygrad's own memory

    def alloc(self, nbytes: int, dtype: str) -> object:
        self._lock.acquire()  # (not `with`: half its cost, on the per-call path)
        try:
            if pooled := self._pool.get(nbytes):
                self._pooled_bytes -= nbytes
                return pooled.pop()
        finally:
            self._lock.release()
        self._reap()
        try:
            buf = tg.allocate(self.device, nbytes)
        except Exception as e:  # tinygrad raises RuntimeError, MemoryError or OSError here
            if not self.trim():
                raise BackendError(f"{self.device}: cannot allocate {nbytes} B: {e}") from e
            try:  # once more, with the kept Buffers given back to tinygrad
                buf = tg.allocate(self.device, nbytes)
            except Exception as e:
                raise BackendError(f"{self.device}: cannot allocate {nbytes} B: {e}") from e
        if self._idle is not None and nbytes <= VIEW_COPY_MAX_BYTES:
            self._device_bytes(buf)  # made with the Buffer: its first direct copy costs what the next do
        return buf

    def free(self, buffer: object) -> None:
        buf = buffer
        assert isinstance(buf, tg.Buffer), buf
        if self._idle is not None and self._idle():
            self._keep(buf)  # nothing queued can still use it: kept or dropped now
            return
        if self._queue is not None:
            # kept or dropped now: whatever reuses the memory (an allocation of ours, or
            # tinygrad's LRU cache handing the cl_mem to a later Buffer) is enqueued on the same
            # in-order queue, after the work queued before
            self._keep(buf)
            return
        probe = self._marker()
        with self._lock:
            self._parked.append((probe, buf))
        self._reap()

    def copy_in(self, buffer: object, offset: int, src: memoryview, *, sync: bool) -> object:
        buf = buffer
        assert isinstance(buf, tg.Buffer), buf
        if self._queue is not None:
            queue = self._queue
            return self._command(
                "copy_in", sync, lambda: queue.copy(src, buf._buf, offset, into_device=True, blocking=sync)
            )
        if (sync or self._at_once(len(src))) and self._direct(buf, offset, src, into_device=True):
            return _DONE_IN
        memory = None if sync else tg.host_bytes(buf)
        if memory is not None:
            return self._on_copy_thread("copy_in", lambda: self._move(memory, offset, src, into_device=True))
        try:
            tg.copy_in(buf, offset, src)
        except Exception as e:
            raise BackendError(f"{self.device}: copy_in failed: {e}") from e
        # the device queue holds the copy until its timeline passes the value taken now
        return _DONE_IN if sync else TinygradToken("copy_in", probe=self._marker(), gate=self._gate)

    def copy_out(self, dst: memoryview, buffer: object, offset: int, *, sync: bool) -> object:
        buf = buffer
        assert isinstance(buf, tg.Buffer), buf
        if self._queue is not None:
            queue = self._queue
            return self._command(
                "copy_out", sync, lambda: queue.copy(dst, buf._buf, offset, into_device=False, blocking=sync)
            )
        if (sync or self._at_once(len(dst))) and self._direct(buf, offset, dst, into_device=False):
            return _DONE_OUT
        memory = None if sync else tg.host_bytes(buf)
        if memory is not None:
            return self._on_copy_thread("copy_out", lambda: self._move(memory, offset, dst, into_device=False))
        try:
            tg.copy_out(dst, buf, offset)  # blocking on every device: it synchronizes first
        except Exception as e:
            raise BackendError(f"{self.device}: copy_out failed: {e}") from e
        return _DONE_OUT if sync else TinygradToken("copy_out", probe=lambda: True, gate=self._gate)

    def compute(self, buffers: Sequence[object]) -> object:
        if self._queue is not None:
            return self._command("compute", False, self._enqueue_marker)
        return TinygradToken("compute", probe=self._marker())

    def extend(self, token: object) -> None:
        """The compute work behind `token` now includes everything queued so far."""
        assert isinstance(token, TinygradToken)
        if token.command is not None:
            token.command = self._enqueue_marker()
            self._report(token)
        else:
            token.probe = self._marker()

    def view(self, buffer: object, offset: int, shape: tuple[int, ...], dtype: str) -> Any:
        buf = buffer
        assert isinstance(buf, tg.Buffer), buf
        self._viewed.add(id(buf))  # never kept for reuse once freed
        try:
            return tg.tensor_view(buf, offset, shape, dtype)
        except Exception as e:
            raise BackendError(f"{self.device}: cannot view {shape} {dtype} at {offset}: {e}") from e

    def view_anchor(self, view: Any) -> object:
        try:
            return tg.view_anchor(view)
        except Exception as e:  # not a view this backend made: tinygrad's internals moved
            raise BackendError(f"{self.device}: no buffer under the view: {e}") from e

    def holders(self, anchor: object) -> dict[str, int]:
        """What still reaches a view's memory, by kind (`Bridge.pins(h, holders=True)`)."""
        try:
            return tg.holders(anchor)  # type: ignore[arg-type]  # an anchor this backend made
        except Exception as e:  # tinygrad's internals moved
            raise BackendError(f"{self.device}: cannot tell what holds the view: {e}") from e

    def view_alignment(self, dtype: str) -> int:
        return tg.VIEW_ALIGNMENT if self.capabilities.sub_buffers else 0  # 0: views at offset 0 only

    def query(self, token: object) -> Status:
        assert isinstance(token, TinygradToken)
        return token.status()

    def wait(self, token: object, timeout: float | None) -> bool:
        assert isinstance(token, TinygradToken)
        if token.command is not None:  # blocks on the event the queue's watcher sets
            token.command.wait(timeout)
            return token.status().done
        if token.future is not None:
            with contextlib.suppress(Exception):
                token.future.exception(timeout=timeout)
            return token.status().done
        # A device marker: tinygrad's own device wait spins a core (HCQ signals, the CPU device's
        # workers), and no OS primitive signals a marker; query with a growing pause instead.
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = MIN_PAUSE_S
        while not token.status().done:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            time.sleep(pause if deadline is None else min(pause, deadline - now))
            pause = min(2 * pause, MAX_PAUSE_S)
        return True

    def subscribe(self, callback: Callable[[object], None]) -> bool:
        with self._lock:
            self._listeners.append(callback)
        return True

    # ------------------------------------------------------------ extras

    def preflight(self) -> None:
        """What the worker needs, tried once on 64 bytes: a synchronous upload, a view, a kernel
        on it, a synchronous download, a free. BackendError naming the step that failed (a device
        that opens but has no copies, views or kernels: NULL, NPY, DISK, ...)."""
        values = np.arange(16, dtype=np.float32)
        step = "allocate"
        try:
            buffer = self.alloc(values.nbytes, "float32")
            step = "upload"
            self.copy_in(buffer, 0, memoryview(bytearray(values.tobytes())), sync=True)  # writable, as a ring's
            step = "make a view"
            view = self.view(buffer, 0, (16,), "float32")
            step = "run a kernel on a view"
            got = (view + 1).numpy()
            step = "download"
            out = bytearray(values.nbytes)
            self.copy_out(memoryview(out), buffer, 0, sync=True)
            del view
            self.free(buffer)
        except Exception as e:
            raise BackendError(f"{self.device} cannot {step}: {short(e)}") from e
        if got.tolist() != (values + 1).tolist() or bytes(out) != values.tobytes():
            raise BackendError(f"{self.device} computes or copies wrong bytes")

    def unusable(self) -> str | None:
        """Why the device cannot run the worker (the preflight's failure, one line), or None."""
        try:
            self.preflight()
        except BackendError as e:
            return f"device {e}: the worker needs copies, views and kernels"
        return None

    @contextlib.contextmanager
    def hold_copies(self) -> Iterator[None]:
        """Until the block exits, the copy thread starts no copy and no asynchronous copy
        reports completion (tests and diagnostics: it makes release points observable). On CL the
        device itself runs nothing queued meanwhile: a synchronous copy there would wait forever."""
        self._gate.clear()
        with self._queue.held() if self._queue is not None else contextlib.nullcontext():
            try:
                yield
            finally:
                self._gate.set()  # before the device runs what was held: it reports done once it is

    def synchronize(self) -> None:
        """Wait for every copy and all device work; drop parked buffers."""
        self._copies.submit(lambda: None).result()
        tg.synchronize(self.device)
        self._reap()

    @property
    def parked(self) -> int:
        """Freed buffers still waiting for the device to finish with them."""
        return len(self._parked)

    # ------------------------------------------------------------ mechanics

    def _marker(self) -> Probe:
        try:
            return self._markers()
        except Exception as e:
            raise BackendError(f"{self.device}: cannot mark the end of queued work: {e}") from e

    def _enqueue_marker(self) -> Command:
        assert self._queue is not None
        try:
            return self._queue.marker()
        except Exception as e:
            raise BackendError(f"{self.device}: cannot mark the end of queued work: {e}") from e

    def _command(self, op: str, sync: bool, enqueue: Callable[[], Command]) -> TinygradToken:
        """An OpenCL command as an event token (done already when synchronous: OpenCL's blocking
        write or read returns when the host bytes may be reused or hold the data)."""
        try:
            command = enqueue()
        except BackendError:
            raise
        except Exception as e:  # CLCommandError, or ctypes refusing an argument
            raise BackendError(f"{self.device}: {op} failed: {e}") from e
        if sync:
            if not command.wait(None) or command.error is not None:
                raise BackendError(f"{self.device}: {op} failed: {command.error}")
            return _DONE_IN if op == "copy_in" else _DONE_OUT
        token = TinygradToken(op, command=command, gate=self._gate)
        self._report(token)
        return token

    def _report(self, token: TinygradToken) -> None:
        """Tell the subscribers when the token's command completes (on OpenCL's thread)."""
        assert token.command is not None
        token.command.on_done(lambda: self._notify(token))

    def _move(self, memory: memoryview, offset: int, host: memoryview, *, into_device: bool) -> None:
        """A copy on the copy thread: `len(host)` bytes between the device memory at `offset` and
        `host`, by memmove (which releases the GIL)."""
        self._gate.wait()
        device = _address(memory) + offset
        if into_device:
            ctypes.memmove(device, _address(host), len(host))
        else:
            ctypes.memmove(_address(host), device, len(host))

    def _on_copy_thread(self, op: str, work: Callable[[], None]) -> TinygradToken:
        with self._lock:
            future = self._copies.submit(work)
        token = TinygradToken(op, future=future, gate=self._gate)
        future.add_done_callback(lambda _: self._notify(token))
        return token

    def _at_once(self, nbytes: int) -> bool:
        """Whether to try an asynchronous copy now (a synchronous one always is): small, while
        copies are not held (hold_copies keeps asynchronous events pending)."""
        return nbytes <= INLINE_MAX_BYTES and self._gate.is_set()

    def _direct(self, buf: tg.Buffer, offset: int, host: memoryview, *, into_device: bool) -> bool:
        """A copy between host bytes and the device's own, where the device is host memory with no
        work queued (so the allocator's synchronize would return at once); False to go through
        the allocator or the copy thread. Copies in flight on the copy thread touch other bytes:
        the Bridge orders conflicting ones (ORDER-1)."""
        if self._idle is None or not self._idle():
            return False
        nbytes = len(host)
        if (
            nbytes <= VIEW_COPY_MAX_BYTES
            and host.format == "B"
            and (
                (memory := self._host_views.get(id(buf))) is not None or (memory := self._device_bytes(buf)) is not None
            )
        ):
            if into_device:
                memory[offset : offset + nbytes] = host
            else:
                host[:] = memory[offset : offset + nbytes]
        elif not tg.move_now(buf, offset, host, into_device=into_device):
            return False
        self.direct_copies += 1
        return True

    def _device_bytes(self, buf: tg.Buffer) -> memoryview | None:
        """A CPU Buffer's memory as bytes, made on its first direct copy and kept while it lives."""
        if (memory := tg.host_bytes(buf)) is not None:
            self._host_views[id(buf)] = memory
            weakref.finalize(buf, self._host_views.pop, id(buf), None)  # before its id can be reused
        return memory

    def _notify(self, token: TinygradToken) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(token)

    def trim(self) -> int:
        """Give every kept Buffer back to tinygrad (its LRU cache); how many there were."""
        with self._lock:
            kept = [buf for pooled in self._pool.values() for buf in pooled]
            self._pool.clear()
            self._pooled_bytes = 0
        return len(kept)

    def pooled(self) -> dict[int, int]:
        """How many freed Buffers are kept for reuse, by size in bytes."""
        with self._lock:
            return {nbytes: len(pooled) for nbytes, pooled in sorted(self._pool.items()) if pooled}

    def _keep(self, buf: tg.Buffer) -> None:
        """Keep a freed Buffer no work uses any more for the next allocation of its size, while
        the bounds allow and no view was ever made over it; else drop it (to tinygrad)."""
        nbytes = buf.size  # a uint8 Buffer (tg.allocate): its size is its bytes
        self._lock.acquire()  # (not `with`: half its cost, on the per-call path)
        try:
            if id(buf) in self._viewed:
                self._viewed.discard(id(buf))
                return
            pooled = self._pool.setdefault(nbytes, [])
            if len(pooled) < POOL_PER_SIZE and self._pooled_bytes + nbytes <= POOL_MAX_BYTES:
                pooled.append(buf)
                self._pooled_bytes += nbytes
        finally:
            self._lock.release()

    def _reap(self) -> None:
        if not self._parked:  # (a racy read: a buffer parked meanwhile waits for the next call)
            return
        with self._lock:
            self._parked = [(probe, buf) for probe, buf in self._parked if not probe()]


def _done(op: str) -> TinygradToken:
    return TinygradToken(op, probe=lambda: True)


_DONE_IN, _DONE_OUT = _done("copy_in"), _done("copy_out")  # a synchronous copy's token: done already
