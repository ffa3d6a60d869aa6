"""Device memory as one bridge holds it, in the vocabulary PyTorch users know
(`torch.cuda.memory_stats`: allocated bytes current, peak, allocated and freed; allocation
counts the same), in all and per role: `Bridge.memory_stats()` and `reset_peak_stats()`.

Memory is held from the backend's allocation to its backend free: a deferred free
(`free_pending`) and an old generation's memory waiting for its uses (`stale_pending`) still
hold it. A backend free that failed is never retried, so its bytes leave the books then too,
counted as a failed free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from devbridge.bridge.stats import _DictAccess


@dataclass(frozen=True, slots=True)
class MemoryCounts(_DictAccess):
    """Bytes and allocations of one role, or of all: now, at the peak, and in all so far."""

    allocated_bytes_current: int  #: bytes the backend holds for the bridge now
    allocated_bytes_peak: int  #: the most held at once (since the bridge began or `reset_peak_stats`)
    allocated_bytes_allocated: int  #: bytes allocated so far
    allocated_bytes_freed: int  #: bytes the backend freed so far (failed frees included)
    allocation_current: int  #: allocations held now
    allocation_peak: int  #: the most held at once
    allocation_allocated: int  #: allocations made so far
    allocation_freed: int  #: allocations freed on the backend so far (failed frees included)


@dataclass(frozen=True, slots=True)
class MemoryStats(_DictAccess):
    """`Bridge.memory_stats()`: the totals, each role's, and what frees wait for."""

    all: MemoryCounts  #: every role together
    by_role: Mapping[str, MemoryCounts] = field(default_factory=dict)  #: each role (ObjectSpec.role)
    deferred_frees: int = 0  #: free_device calls deferred because the memory was in use (FREE-1)
    waiting_releases: int = 0  #: releases (deferred frees, old generations) waiting for uses now
    longest_wait_s: float = 0.0  #: how long the oldest of those has waited
    held_uses: int = 0  #: copies held back behind earlier uses of their bytes so far (ORDER-1)
    failed_frees: int = 0  #: backend frees that failed, reported once, never retried (FREE-3)
    failed_free_bytes: int = 0  #: their bytes: the device may hold them still
    restarts: int = 0  #: restart calls


class _Tally:
    """One role's account (what was freed is what was allocated less what is held)."""

    __slots__ = ("bytes_in", "bytes_now", "bytes_peak", "count_in", "count_now", "count_peak")

    def __init__(self) -> None:
        self.bytes_now = self.bytes_peak = self.bytes_in = 0
        self.count_now = self.count_peak = self.count_in = 0

    def counts(self) -> MemoryCounts:
        return MemoryCounts(
            self.bytes_now, self.bytes_peak, self.bytes_in, self.bytes_in - self.bytes_now,
            self.count_now, self.count_peak, self.count_in, self.count_in - self.count_now,
        )  # fmt: skip


class MemoryBook:
    """The bridge's running account of device memory (called under the bridge's lock): each
    role's, and what all hold now and at the peak (the rest of the totals are the roles' sums)."""

    def __init__(self) -> None:
        self._roles: dict[str, _Tally] = {}
        self._bytes_now = self._bytes_peak = self._count_now = self._count_peak = 0
        self._failed_bytes = 0
        #: Told the bytes held after each change (a timeline's counter: devbridge.bridge.trace).
        self.observer: Callable[[int], None] | None = None

    def allocated(self, role: str, nbytes: int) -> None:
        """The backend allocated `nbytes` for an object of `role`."""
        if (tally := self._roles.get(role)) is None:
            tally = self._roles[role] = _Tally()
        tally.bytes_now = held = tally.bytes_now + nbytes
        tally.bytes_in += nbytes
        tally.count_now = count = tally.count_now + 1
        tally.count_in += 1
        if held > tally.bytes_peak:
            tally.bytes_peak = held
        if count > tally.count_peak:
            tally.count_peak = count
        self._bytes_now = now = self._bytes_now + nbytes
        self._count_now = count = self._count_now + 1
        if now > self._bytes_peak:
            self._bytes_peak = now
        if count > self._count_peak:
            self._count_peak = count
        if self.observer is not None:
            self.observer(now)

    def released(self, role: str, nbytes: int, failed: bool) -> None:
        """The backend freed (or `failed` to free, for good) an allocation of `role`."""
        tally = self._roles[role]
        tally.bytes_now -= nbytes
        tally.count_now -= 1
        self._bytes_now -= nbytes
        self._count_now -= 1
        if failed:
            self._failed_bytes += nbytes
        if self.observer is not None:
            self.observer(self._bytes_now)

    def reset_peak(self) -> None:
        """Peaks start again from what is held now."""
        self._bytes_peak, self._count_peak = self._bytes_now, self._count_now
        for tally in self._roles.values():
            tally.bytes_peak, tally.count_peak = tally.bytes_now, tally.count_now

    def _totals(self) -> MemoryCounts:
        allocated = sum(t.bytes_in for t in self._roles.values())
        count = sum(t.count_in for t in self._roles.values())
        return MemoryCounts(
            self._bytes_now, self._bytes_peak, allocated, allocated - self._bytes_now,
            self._count_now, self._count_peak, count, count - self._count_now,
        )  # fmt: skip

    def stats(self, waits: list[float], counters: Mapping[str, int]) -> MemoryStats:
        """The account now, with the releases waiting `waits` seconds and the bridge's counters."""
        return MemoryStats(
            all=self._totals(),
            by_role={role: tally.counts() for role, tally in sorted(self._roles.items())},
            deferred_frees=counters["deferred_frees"],
            waiting_releases=len(waits),
            longest_wait_s=max(waits, default=0.0),
            held_uses=counters["held"],
            failed_frees=counters["free_failures"],
            failed_free_bytes=self._failed_bytes,
            restarts=counters["restarts"],
        )
