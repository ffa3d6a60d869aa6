"""What a Bridge can say about itself: an allocation's state and pins, its counters, the device
memory it holds. Each answer is a frozen dataclass (devbridge.bridge.stats, devbridge.bridge.memory)."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

from devbridge.args import flag
from devbridge.backends.base import BackendError
from devbridge.bridge.engine import Engine, holder
from devbridge.bridge.memory import MemoryStats
from devbridge.bridge.stats import COUNTED, Pins, Stats
from devbridge.errors import (
    BackendFailureError,
    short,
)
from devbridge.types import (
    DeviceHandle,
)


class Introspection(Engine):
    """The Bridge's answers about itself."""

    def pins(self, handle: DeviceHandle, *, holders: bool = False) -> Pins:
        """What keeps the allocation in use (PIN-1): its state, its uses in flight by kind
        (input and output copies, compute events, live views: a view counts while any tinygrad
        object can reach its memory) and each of them by name (`uses`: kind, use_id, byte
        range, the uses a held copy waits for, an open compute block), and how long a deferred
        release has waited.

        Args:
            handle: a handle this bridge issued (freed or of an old generation included).
            holders: also say what still reaches the views' memory, by kind: tensors that are
                the views themselves, tensors derived from them, gradients, TinyJit captures
                (a census of tinygrad's live objects: for diagnosis, not a hot path). Only a
                backend that can tell fills it (tinygrad's); otherwise it stays empty.

        Returns:
            A `Pins` (devbridge.bridge.stats), field by field.

        Raises:
            InvalidHandleError: HANDLE-1, for a handle this bridge did not issue.
            InvalidArgumentError: ARG-1, for holders other than a bool.
            BackendFailureError: FAULT-1, when the backend cannot make the census."""
        census = flag("holders", holders) and callable(getattr(self._backend, "holders", None))
        with self._lock:
            self._drain()
            key, _ = self._resolve(handle)
            uses = self._core.dependents(key[0])
            kinds = Counter(use.kind for use in uses)
            anchors = [a for u in uses if u.kind == "view" and (a := self._anchors.get(u.id)) is not None]
            pins = Pins(
                state=self._core.state(*key),
                copies_in=kinds["copy_in"],
                copies_out=kinds["copy_out"],
                computes=kinds["compute"],
                views=kinds["view"],
                waiting_s=self._core.waited(key[0], time.monotonic()),
                uses=tuple(holder(use) for use in sorted(uses, key=lambda use: use.id)),
            )
        if not census:
            return pins
        total: Counter[str] = Counter()
        for anchor in anchors:  # without the lock: a census walks every live tensor
            try:
                total.update(self._backend.holders(anchor))  # type: ignore[attr-defined]
            except BackendError as e:
                raise BackendFailureError("FAULT-1", f"{short(handle)}: {e}") from e
        return dataclasses.replace(pins, holders=dict(total))

    def state(self, handle: DeviceHandle) -> str:
        """The allocation's lifecycle state, a state name of the spec.

        Args:
            handle: a handle this bridge issued (freed or of an old generation included).

        Raises:
            InvalidHandleError: HANDLE-1, for a handle this bridge did not issue."""
        with self._lock:
            self._drain()
            key, _ = self._resolve(handle)
            return self._core.state(*key)

    def stats(self) -> Stats:
        """The bridge's counters and what is live now: a `Stats` (devbridge.bridge.stats), field by
        field. Never raises."""
        with self._lock:
            self._drain()
            live = list(self._core.allocations())
            traffic = {
                "copies_in": self._copies_in,
                "bytes_in": self._bytes_in,
                "copies_out": self._copies_out,
                "bytes_out": self._bytes_out,
            }
            counts = {name: traffic.get(name, self._counts[name]) for name in COUNTED}
            return Stats(
                generation=self._core.generation,
                live_allocations=len(live),
                live_bytes=sum(r.extent for r in live),
                pending_events=sum(1 for use in self._core.inflight() if use.event is not None),
                inflight_uses=sum(1 for _ in self._core.inflight()),
                **counts,
            )

    def memory_stats(self) -> MemoryStats:
        """Device memory as this bridge holds it: bytes and allocations now, at the peak, and
        allocated and freed so far, in all and per role (the names of PyTorch's
        `memory_stats()` where the meaning is the same), with the deferred frees, the releases
        waiting for uses now and how long the oldest has waited, held copies, failed frees and
        restarts: a `MemoryStats` (devbridge.bridge.memory), field by field. Never raises. It applies
        nothing (unlike `stats()`): the memory it counts is what the backend holds right now."""
        with self._lock:
            return self._memory.stats(self._core.waits(time.monotonic()), self._counts)

    def reset_peak_stats(self) -> None:
        """Start the peaks of `memory_stats()` again from what is held now."""
        with self._lock:
            self._memory.reset_peak()
