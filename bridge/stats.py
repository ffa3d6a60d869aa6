"""What the Bridge reports about itself: `Bridge.stats()` and `Bridge.pins(handle)`.

Both are frozen dataclasses, documented field by field, with `as_dict()` for JSON. They were
dicts: `stats().allocs`, `dict(stats())` and `.keys()`/`.items()` still work for one release,
with a DeprecationWarning naming the attribute to read instead.
"""

from __future__ import annotations

import warnings
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from dataclasses import dataclass, field, fields
from typing import Any


def _plain(value: Any) -> Any:
    """`value` as `dataclasses.asdict` copies a field: dataclasses as dicts, containers copied."""
    if type(value) is tuple:
        return tuple(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(type(value), "__dataclass_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    return value


class _DictAccess:
    """The old dict reads, each warning once per call site (Python's default filter)."""

    def as_dict(self) -> dict[str, Any]:
        """Every field by name (a plain dict: JSON-ready): what `dataclasses.asdict` gives, made
        directly (the fields hold numbers, strings, tuples, mappings and dataclasses only)."""
        return _plain(self)  # type: ignore[no-any-return]

    def _deprecated(self, how: str) -> None:
        kind = type(self).__name__
        warnings.warn(
            f"{kind} is a dataclass now: {how} is deprecated; read its attributes or call as_dict()",
            DeprecationWarning,
            stacklevel=3,
        )

    def __getitem__(self, key: str) -> Any:
        self._deprecated(f"[{key!r}]")
        if not isinstance(key, str) or key not in {f.name for f in fields(self)}:  # type: ignore[arg-type]
            raise KeyError(key)
        return getattr(self, key)

    def keys(self) -> KeysView[str]:
        self._deprecated(".keys()")
        return self.as_dict().keys()

    def items(self) -> ItemsView[str, Any]:
        self._deprecated(".items()")
        return self.as_dict().items()

    def values(self) -> ValuesView[Any]:
        self._deprecated(".values()")
        return self.as_dict().values()

    def get(self, key: str, default: Any = None) -> Any:
        self._deprecated(f".get({key!r})")
        return self.as_dict().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._deprecated("`in`")
        return key in self.as_dict()

    def __iter__(self) -> Iterator[str]:
        self._deprecated("iterating")
        return iter(self.as_dict())

    def __len__(self) -> int:
        self._deprecated("len()")
        return len(self.as_dict())


@dataclass(frozen=True, slots=True)
class Stats(_DictAccess):
    """The Bridge's counters. Calls are counted once each, successes and failures apart."""

    generation: int  #: restarts so far: the generation new allocations belong to
    live_allocations: int  #: allocations not yet released to the backend (deferred frees included)
    live_bytes: int  #: their extents, summed
    pending_events: int  #: copies and computes whose events have not completed
    inflight_uses: int  #: uses still holding an allocation: pending events, live views, held copies
    allocs: int  #: alloc_device calls that succeeded
    backend_frees: int  #: allocations released to the backend (FREE-1, FREE-2)
    deferred_frees: int  #: free_device calls deferred because the allocation was in use (FREE-1)
    copies_in: int  #: host_to_device copies issued
    copies_out: int  #: device_to_host copies issued
    bytes_in: int  #: bytes those copies moved to the device
    bytes_out: int  #: bytes those copies moved to the host
    computes: int  #: compute events issued
    views: int  #: tinygrad views made (wrap_for_tinygrad)
    copy_failures: int  #: copies that failed, at the call or at completion (COPY-F)
    compute_failures: int  #: compute events that failed
    alloc_failures: int  #: alloc_device calls the backend refused (ALLOC-2)
    free_failures: int  #: backend frees that failed, reported once (FREE-3)
    restarts: int  #: restart calls
    aborted: int  #: uses a restart aborted (copies held or in flight, views collected after it)
    held: int  #: copies held back behind earlier uses of their bytes (ORDER-1)
    waits: int  #: synchronous calls that waited for an earlier use first (ORDER-1)
    host_bytes_changed: int  #: (checking mode) copies whose host bytes changed under them (H2D-3, D2H-3)


@dataclass(frozen=True, slots=True)
class Holder:
    """One use that holds an allocation (PIN-1): an event in flight, a copy held back behind
    earlier uses, or a live view. `str()` names it in one phrase, as the PIN-1 warning does."""

    kind: str  #: "copy_in", "copy_out", "compute" or "view"
    use_id: int  #: the use's number: its event's `use_id` (a view has none of its own to show)
    range: tuple[int, int] | None  #: the allocation's bytes [start, stop) a copy touches; None: all
    held: bool  #: a copy held back behind the uses in `follows` (ORDER-1): not on the device yet
    follows: tuple[int, ...]  #: the use_ids a held copy waits for, oldest first
    open: bool  #: a compute whose `with` block is still open

    def __str__(self) -> str:
        where = "" if self.range is None else f" bytes {self.range[0]}..{self.range[1]}"
        behind = f" held behind {', '.join(f'#{n}' for n in self.follows)}" if self.held else ""
        return f"{self.kind} #{self.use_id}{where}{behind}{' (block open)' if self.open else ''}"


@dataclass(frozen=True, slots=True)
class Pins(_DictAccess):
    """What keeps one allocation in use (PIN-1)."""

    state: str  #: its lifecycle state (a state name of the spec)
    copies_in: int  #: host_to_device copies into it in flight
    copies_out: int  #: device_to_host copies from it in flight
    computes: int  #: compute events naming it in flight
    views: int  #: live views: a view counts while any tinygrad object can still reach its memory
    waiting_s: float  #: seconds a deferred free has waited for these uses (0.0 when none)
    #: with `pins(h, holders=True)`, on a backend that can tell: what still reaches the views'
    #: memory, by kind ("views", "derived", "grads", "jit"); empty otherwise
    holders: Mapping[str, int] = field(default_factory=dict)
    #: each use that holds it, oldest first: kind, use_id, byte range, held behind what, block open
    uses: tuple[Holder, ...] = ()


#: Stats' fields that read the bridge's state now; the others are counters it keeps.
LIVE = ("generation", "live_allocations", "live_bytes", "pending_events", "inflight_uses")
COUNTED = tuple(f.name for f in fields(Stats) if f.name not in LIVE)
