"""A timeline of every allocation's life, as Chrome Trace Event JSON (Perfetto, chrome://tracing).

`Bridge(backend, trace=path)` writes one: per bridge a process, in it one track per allocation
with its lifecycle states as spans (the spec's names, a terminal state as an instant), one
device-queue track with each copy, compute and view as an async span from its begin to its end
(kind, allocations, byte range, bytes; a held use's args name what it follows, and flow arrows
run from those to its launch, drawn as it launches: a held use a restart aborts has none),
synchronous copies that finished on submission as instants, restarts as global instants,
failures marked, and device bytes in use and each ring's occupied bytes as counters.
Timestamps are microseconds of one monotonic clock since the trace opened.

The writer streams: each event is written as it happens, and nothing is kept but the state of
each live allocation and the held uses, so a run of any length traces in flat memory. The file
is a JSON array; `close()` ends it (a file left unclosed still opens in Perfetto, which accepts
an unterminated array). One Trace may serve several bridges (the multi-device demo). Off (the
default), the bridge pays one `is None` test where a state changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

from devbridge.errors import InvalidArgumentError, short
from devbridge.statemachine.records import Allocation, InFlight

QUEUE_TID = 1  # the device queue's track in each bridge's process
MEMORY = "device bytes in use"
PHASES = frozenset("BEbeisfCMn")  # the Trace Event phases this writer uses
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode  # one encoder, made once


def _boot_id() -> str | None:
    """This machine's boot (Linux): processes that share it share one monotonic clock."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


_BOOT = _boot_id()


@dataclass(frozen=True)
class TraceClock:
    """When a trace opened, on the clocks that align it with another process's trace: the
    monotonic clock (exact between processes of one boot) and the wall clock (across machines)."""

    boot: str | None
    monotonic_ns: int
    wall_ns: int

    @classmethod
    def now(cls) -> TraceClock:
        """This moment on both clocks. The wall clock is read between two monotonic readings,
        and the closest of three pairs is kept: a thread preempted between two readings would
        otherwise shift every included event by the time it waited."""
        pairs = []
        for _ in range(3):
            before, wall, after = time.monotonic_ns(), time.time_ns(), time.monotonic_ns()
            pairs.append((after - before, (before + after) // 2, wall))
        _, monotonic, wall = min(pairs)
        return cls(_BOOT, monotonic, wall)

    def shift_us(self, other: TraceClock) -> float:
        """Microseconds from this clock's start to `other`'s: by the monotonic clock where both
        come from one boot, by the wall clock otherwise."""
        if self.boot is not None and self.boot == other.boot:
            return (other.monotonic_ns - self.monotonic_ns) / 1000.0
        return (other.wall_ns - self.wall_ns) / 1000.0


def traceable(target: object) -> bool:
    """Whether `target` is what a Trace writes to: a path, or a text file open for writing."""
    return isinstance(target, str | os.PathLike) or callable(getattr(target, "write", None))


class Trace:
    """A Chrome Trace Event JSON file being written (see the module's docstring).

    Args:
        target: a path to create (or overwrite), or a text file open for writing (left open by
            `close`, which only ends the JSON array in it).

    Raises:
        InvalidArgumentError: ARG-1, for anything else, or a path that cannot be created."""

    def __init__(self, target: str | os.PathLike[str] | IO[str]) -> None:
        if not traceable(target):
            raise InvalidArgumentError("ARG-1", f"trace needs a path or a text file, got {short(target)}")
        if isinstance(target, str | os.PathLike):
            try:
                self._out: IO[str] = open(target, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
            except OSError as e:
                raise InvalidArgumentError("ARG-1", f"trace: cannot create {short(target)}: {e}") from e
            self._owned = True
        else:
            self._out, self._owned = target, False
        self._lock = threading.Lock()
        self._bridges: list[BridgeTrace] = []
        self.clock = TraceClock.now()  # its start: traces of several processes align by it
        self._t0 = self.clock.monotonic_ns  # (read on every event)
        self._first = True
        self._closed = False
        self.events = 0  # written so far
        self._out.write("[\n")

    @property
    def wall_ns(self) -> int:
        """The wall clock when the trace opened."""
        return self.clock.wall_ns

    def now(self) -> float:
        """Microseconds since the trace opened (the monotonic clock)."""
        return (time.monotonic_ns() - self._t0) / 1000.0

    def emit(self, event: dict[str, Any]) -> None:
        """Write one event (its `ts` stamped now unless given)."""
        event.setdefault("ts", self.now())
        line = _encode(event)
        with self._lock:
            if self._closed:
                return
            try:
                self._out.write(line if self._first else ",\n" + line)
            except (OSError, ValueError):  # the caller's file was closed under it: tracing ends
                self._closed = True
                return
            self._first = False
            self.events += 1

    def include(
        self,
        events: Iterable[dict[str, Any]],
        *,
        pid: int,
        label: str,
        clock: TraceClock | None = None,
        wall_ns: int | None = None,
    ) -> None:
        """Write another process's trace into this one (the fleet's actors): its events, as
        `json.load` reads them, moved to process `pid` (named `label`, after what the other
        trace called it), their async and flow ids made that process's own, and their times
        moved onto this trace's clock by the other trace's start: its `Trace.clock` (exact on
        one machine, by the wall clock across machines), or only its `Trace.wall_ns`.

        Raises:
            InvalidArgumentError: ARG-1, with neither `clock` nor `wall_ns`, or both."""
        if (clock is None) == (wall_ns is None):
            raise InvalidArgumentError("ARG-1", "include needs the other trace's clock or its wall_ns, one of them")
        if clock is None:
            if type(wall_ns) is not int:
                raise InvalidArgumentError("ARG-1", f"include: wall_ns must be an int, got {short(wall_ns)}")
            clock = TraceClock(None, 0, wall_ns)  # no boot: aligned by the wall clock
        elif not isinstance(clock, TraceClock):
            raise InvalidArgumentError("ARG-1", f"include: clock must be a TraceClock, got {short(clock)}")
        shift = self.clock.shift_us(clock)
        for event in events:
            moved = {**event, "pid": pid, "ts": event.get("ts", 0.0) + shift}
            if "id" in moved:
                moved["id"] = f"{pid}:{moved['id']}"
            if moved.get("ph") == "M" and moved.get("name") == "process_name":
                moved["args"] = {"name": f"{label}: {moved.get('args', {}).get('name', '')}"}
            self.emit(moved)

    def bridge(self, pid: int, label: str, terminal: Iterable[str]) -> BridgeTrace:
        """The tracks of one bridge (process `pid`, named `label`)."""
        self.emit({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        self.emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": QUEUE_TID, "args": {"name": "device queue"}})
        tracks = BridgeTrace(self, pid, frozenset(terminal))
        self._bridges.append(tracks)
        return tracks

    def close(self) -> None:
        """End what is still open (each live allocation's state, each use in flight), then the
        JSON array, and close the file the trace opened. Idempotent; never raises (a caller's
        file closed already ends the trace as it is)."""
        for tracks in list(self._bridges):
            tracks.end_all()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(OSError, ValueError):  # a caller's file closed already
                self._out.write("\n]\n")
                self._out.flush()
            if self._owned:
                self._out.close()

    @property
    def closed(self) -> bool:
        return self._closed


class BridgeTrace:
    """One bridge's tracks in a Trace: what its lifecycle core and its memory book report
    (the core's `tracer`)."""

    def __init__(self, trace: Trace, pid: int, terminal: frozenset[str]) -> None:
        self.trace, self.pid, self.terminal = trace, pid, terminal
        self._states: dict[int, str] = {}  # live allocation -> its state's open span
        self._held: dict[int, tuple[tuple[int, ...], float]] = {}  # held use -> (what it follows, when it began)
        self._open: dict[int, str] = {}  # use in flight -> its kind

    def _emit(self, tid: int, **event: Any) -> None:
        self.trace.emit({"pid": self.pid, "tid": tid, **event})

    # ------------------------------------------------------------ what the core reports

    def state(self, record: Allocation, event: str, state: str) -> None:
        """The allocation's `state` after `event` (a state unchanged draws nothing)."""
        tid = 1000 + record.id
        before = self._states.get(record.id)
        if before == state:
            return
        now = self.trace.now()
        if before is None:
            name = f"#{record.id} {getattr(record.spec, 'name', '?')} (gen {record.generation})"
            self._emit(tid, ph="M", name="thread_name", args={"name": name}, ts=now)
        else:
            self._emit(tid, ph="E", name=before, ts=now)
        if state in self.terminal:
            self._states.pop(record.id, None)
            self._emit(tid, ph="i", s="t", name=state, args={"event": event}, ts=now)
        else:
            self._states[record.id] = state
            self._emit(tid, ph="B", name=state, args={"event": event}, ts=now)

    def began(self, use: InFlight) -> None:
        """A use in flight begins (a held one's args say what it follows)."""
        args: dict[str, Any] = {"allocations": list(use.allocations)}
        if use.span is not None:
            args["range"], args["bytes"] = list(use.span), use.span[1] - use.span[0]
        now = self.trace.now()
        if use.after:
            args["follows"] = sorted(use.after)
            self._held[use.id] = (tuple(args["follows"]), now)  # its arrows are drawn as it launches
        self._open[use.id] = use.kind
        self._emit(QUEUE_TID, ph="b", id=use.id, cat=use.kind, name=f"{use.kind} #{use.id}", args=args, ts=now)
        self._ring(use)

    def submitted(self, use: InFlight) -> None:
        """A use reached the backend: a held one is launched now."""
        follows, began = self._held.pop(use.id, ((), 0.0))
        now = self.trace.now()
        for earlier in follows:  # an arrow from each use it followed, from when it began to now
            self._emit(QUEUE_TID, ph="s", id=f"{earlier}>{use.id}", name="follows", cat="order", ts=began)
            self._emit(QUEUE_TID, ph="f", bp="e", id=f"{earlier}>{use.id}", name="follows", cat="order", ts=now)
        if use.after is not None:
            self._emit(QUEUE_TID, ph="n", id=use.id, cat=use.kind, name="launched", ts=now)

    def ended(self, use: InFlight, ok: bool) -> None:
        """A use ended, or failed (marked)."""
        self._held.pop(use.id, None)
        self._open.pop(use.id, None)
        self._emit(QUEUE_TID, ph="e", id=use.id, cat=use.kind, name=f"{use.kind} #{use.id}", args={"ok": ok})
        if not ok:
            self._emit(QUEUE_TID, ph="i", s="t", name=f"failed: {use.kind} #{use.id}", cat="fault")
        self._ring(use)

    def instant(self, kind: str, record: Allocation, nbytes: int) -> None:
        """A copy the backend finished as it was submitted (synchronous, nothing ahead of it)."""
        args = {"allocations": [record.id], "bytes": nbytes}
        self._emit(QUEUE_TID, ph="i", s="t", name=f"{kind} (done on submission)", cat=kind, args=args)

    def restarted(self, generation: int) -> None:
        self._emit(0, ph="i", s="g", name=f"restart: generation {generation}", cat="restart")

    # ------------------------------------------------------------ what the bridge reports

    def end_all(self) -> None:
        """The trace closes: end each open state span and each use in flight."""
        now = self.trace.now()
        for alloc_id, state in list(self._states.items()):
            self._emit(1000 + alloc_id, ph="E", name=state, ts=now)
        for use_id, kind in list(self._open.items()):
            self._emit(QUEUE_TID, ph="e", id=use_id, cat=kind, name=f"{kind} #{use_id}", args={"open": True}, ts=now)
        self._states.clear()
        self._open.clear()

    def memory(self, in_use: int) -> None:
        self._emit(0, ph="C", name=MEMORY, args={"bytes": in_use})

    def fault(self, what: str) -> None:
        self._emit(QUEUE_TID, ph="i", s="t", name=f"failed: {what}", cat="fault")

    def _ring(self, use: InFlight) -> None:
        ring = getattr(use.host, "ring", None)
        if ring is not None:
            self._emit(0, ph="C", name=f"ring {id(ring):#x} occupied bytes", args={"bytes": ring.head - ring.cursor})


def read_cut(text: str) -> list[dict[str, Any]]:
    """The events of a trace whose writer may have died mid-write (SIGKILL): one event per line,
    read up to the first line that is not a whole event."""
    events = []
    for line in text.splitlines():
        line = line.strip().removesuffix(",")
        if line in ("[", "]", ""):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            break  # the line its writer was cut in
        if not isinstance(event, dict):
            break
        events.append(event)
    return events


def ends_of_open(events: list[dict[str, Any]], ts: float) -> list[dict[str, Any]]:
    """The events that end, at `ts`, every span `events` leaves open (a writer that died): each
    state span and each async span, in the order a living writer's `close` would end them."""
    stacks: dict[tuple[Any, Any], list[str]] = defaultdict(list)
    async_open: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for e in events:
        ph, track = e.get("ph"), (e.get("pid"), e.get("tid"))
        if ph == "B":
            stacks[track].append(e.get("name", ""))
        elif ph == "E" and stacks[track]:
            stacks[track].pop()
        elif ph in ("b", "e"):
            key = (e.get("pid"), e.get("cat", ""), e.get("id"))
            if ph == "b":
                async_open[key] = e
            else:
                async_open.pop(key, None)
    ends = [
        {"ph": "e", "name": e.get("name", ""), "cat": e.get("cat", ""), "id": e.get("id"), "pid": e.get("pid"),
         "tid": e.get("tid"), "ts": ts}
        for e in async_open.values()
    ]  # fmt: skip
    for (pid, tid), names in stacks.items():
        ends += [{"ph": "E", "name": name, "pid": pid, "tid": tid, "ts": ts} for name in reversed(names)]
    return ends


def check_trace(events: list[dict[str, Any]], transitions: set[tuple[str, str]]) -> list[str]:
    """What is wrong with a written trace (empty: nothing): an unknown phase or a missing field,
    a span that never closes or closes what it did not open, an allocation's states in an order
    the spec has no transition for (`transitions`: its (source, dest) pairs), a counter below 0."""
    problems: list[str] = []
    stacks: dict[tuple[int, int], list[str]] = defaultdict(list)
    last: dict[tuple[int, int], str] = {}
    async_open: dict[tuple[int, str, object], int] = {}
    for n, e in enumerate(events):
        ph = e.get("ph")
        if ph not in PHASES or not isinstance(e.get("ts"), int | float) or "pid" not in e or "tid" not in e:
            problems.append(f"event {n}: not a trace event this writer makes: {e}")
            continue
        track = (e["pid"], e["tid"])
        if ph == "B":
            if track in last and (last[track], e["name"]) not in transitions:
                problems.append(f"event {n}: {track} goes {last[track]} -> {e['name']}, no transition of the spec")
            stacks[track].append(e["name"])
            last[track] = e["name"]
        elif ph == "E":
            if not stacks[track] or stacks[track].pop() != e["name"]:
                problems.append(f"event {n}: {track} ends {e['name']}, which is not open")
        elif ph == "i" and e.get("tid", 0) >= 1000 and track in last:
            if (last[track], e["name"]) not in transitions:
                problems.append(f"event {n}: {track} ends {last[track]} -> {e['name']}, no transition of the spec")
        elif ph in "be":
            key = (e["pid"], e.get("cat", ""), e.get("id"))
            if ph == "b":
                async_open[key] = n
            elif async_open.pop(key, None) is None:
                problems.append(f"event {n}: ends async {key}, which is not open")
        elif ph == "C" and any(not isinstance(v, int | float) or v < 0 for v in e.get("args", {}).values()):
            problems.append(f"event {n}: counter {e['name']} below zero: {e['args']}")
    problems += [f"{track}: {names} never end" for track, names in stacks.items() if names]
    problems += [f"async {key} (event {n}) never ends" for key, n in async_open.items()]
    return problems
