"""A written trace (devbridge.bridge.trace) read back: its summary, its check against the spec, and the
same timeline as a PNG for a README or an issue (`devbridge trace FILE --png OUT`, matplotlib)."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devbridge.bridge.trace import MEMORY, check_trace
from devbridge.errors import short
from devbridge.spec import load

#: Rows of allocations drawn at most (the first ones to appear); the rest are counted in the title.
MAX_ROWS = 60
QUEUE_LANES = ("copy_in", "copy_out", "compute", "view")


@dataclass
class Timeline:
    """One bridge's part of a trace, as spans: (start, end, name) in milliseconds."""

    label: str = "bridge"
    states: dict[int, list[tuple[float, float, str]]] = field(default_factory=lambda: defaultdict(list))
    uses: dict[str, list[tuple[float, float, str]]] = field(default_factory=lambda: defaultdict(list))
    faults: list[float] = field(default_factory=list)
    memory: list[tuple[float, int]] = field(default_factory=list)


def read(path: str | Path) -> list[dict[str, Any]]:
    """The events of a trace file (one `close()` ended, or one a killed process left
    unterminated), each of the shape the trace writes; ValueError naming the first that is not
    (a trace is read as untrusted input: the file may be anything)."""
    text = Path(path).read_text().rstrip()
    # (JSON text that ends in "]" and parses is a list)
    events: list[Any] = json.loads(text if text.endswith("]") else text.rstrip(",") + "\n]")
    for n, event in enumerate(events):
        wrong = _wrong(event)
        if wrong:
            raise ValueError(f"event {n} is no trace event: {wrong}")
    return events


def _number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


#: The fields every event has and what each holds; then the fields some have.
_FIELDS = {"ph": str, "name": str, "pid": int, "tid": int}
_OPTIONAL = {"cat": str, "s": str, "bp": str, "args": dict}


def _wrong(event: object) -> str:
    """What is wrong with one event, or "" (the fields the readers here use, by type)."""
    if not isinstance(event, dict):
        return f"{type(event).__name__}, not an object"
    for name, kind in _FIELDS.items():
        if type(event.get(name)) is not kind:
            return f"its {name!r} is {short(event.get(name))}, not {kind.__name__}"
    for name, kind in _OPTIONAL.items():
        if name in event and type(event[name]) is not kind:
            return f"its {name!r} is {short(event[name])}, not {kind.__name__}"
    if not _number(event.get("ts")):
        return f"its 'ts' is {short(event.get('ts'))}, not a finite number"
    if "id" in event and type(event["id"]) not in (int, str, type(None)):
        return f"its 'id' is {short(event['id'])}"
    if event["ph"] in ("b", "e") and "cat" not in event:
        return "an async event with no 'cat'"
    args = event.get("args", {})
    if event["ph"] == "M" and event["name"] == "process_name" and type(args.get("name")) is not str:
        return "a process name with no 'name' in its args"
    if event["ph"] == "C" and event["name"] == MEMORY and type(args.get("bytes")) is not int:
        return "a memory counter with no 'bytes' in its args"
    return ""


def problems(events: list[dict[str, Any]]) -> list[str]:
    """What `check_trace` finds wrong with `events`, against the packaged spec."""
    return check_trace(events, {(t.source, t.dest) for t in load().transitions})


def summary(events: list[dict[str, Any]]) -> str:
    """One line per kind of thing the trace holds."""
    phases = Counter(e.get("ph") for e in events)
    instants = Counter(e["name"].split(":")[0] for e in events if e.get("ph") == "i")
    tracks = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "B"}
    uses = Counter(e.get("cat") for e in events if e.get("ph") == "b")
    return "\n".join(
        [
            f"{len(events)} events; bridges {len({e['pid'] for e in events if 'pid' in e})}, allocations {len(tracks)}",
            "uses: " + ", ".join(f"{kind} {n}" for kind, n in sorted(uses.items())),
            f"restarts {instants['restart']}, failures {instants['failed']}, held copies launched {phases['f']}",
        ]
    )


def timelines(events: list[dict[str, Any]]) -> dict[int, Timeline]:
    """Each bridge's spans, per process of the trace."""
    out: dict[int, Timeline] = defaultdict(Timeline)
    open_states: dict[tuple[int, int], tuple[float, str]] = {}
    open_uses: dict[tuple[int, str, object], float] = {}
    for e in events:
        ph, pid, ms = e.get("ph"), e.get("pid", 0), e.get("ts", 0.0) / 1000.0
        line = out[pid]
        if ph == "M" and e.get("name") == "process_name":
            line.label = e["args"]["name"]
        elif ph == "B":
            open_states[pid, e["tid"]] = (ms, e["name"])
        elif ph == "E" and (start := open_states.pop((pid, e["tid"]), None)) is not None:
            line.states[e["tid"] - 1000].append((start[0], ms, start[1]))
        elif ph == "b":
            open_uses[pid, e["cat"], e["id"]] = ms
        elif ph == "e" and (began := open_uses.pop((pid, e["cat"], e["id"]), None)) is not None:
            line.uses[e["cat"]].append((began, ms, "ok" if e.get("args", {}).get("ok", True) else "failed"))
        elif ph == "i" and e.get("name", "").startswith("failed"):
            line.faults.append(ms)
        elif ph == "C" and e.get("name") == MEMORY:
            line.memory.append((ms, e["args"]["bytes"]))
    return dict(out)


def render_png(events: list[dict[str, Any]], out: str | Path) -> None:
    """Draw each bridge's allocations (state spans), device queue (uses by kind, failures) and
    device bytes in use, restarts as lines across all, into the PNG `out`."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    lines = timelines(events)
    restarts = [e["ts"] / 1000.0 for e in events if e.get("ph") == "i" and e.get("cat") == "restart"]
    names = list(load().states)
    colors = {name: plt.get_cmap("tab10")(n % 10) for n, name in enumerate(names)}
    heights = []
    for line in lines.values():
        heights += [min(len(line.states), MAX_ROWS) * 0.12 + 0.6, len(QUEUE_LANES) * 0.3 + 0.4, 1.2]
    fig, axes = plt.subplots(len(heights), 1, figsize=(12, sum(heights) + 1), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": heights})  # fmt: skip
    rows = iter(axes[:, 0])
    for line in lines.values():
        ax = next(rows)
        shown = sorted(line.states)[:MAX_ROWS]
        for row, alloc in enumerate(shown):
            for start, end, state in line.states[alloc]:
                ax.broken_barh([(start, max(end - start, 0.05))], (row - 0.4, 0.8), color=colors.get(state, "grey"))
        more = len(line.states) - len(shown)
        ax.set_title(f"{line.label}: allocations by state" + (f" (first {len(shown)}; {more} more)" if more else ""))
        ax.set_yticks([])
        ax.invert_yaxis()
        ax = next(rows)
        for lane, kind in enumerate(QUEUE_LANES):
            for start, end, how in line.uses.get(kind, []):
                ax.broken_barh([(start, max(end - start, 0.05))], (lane - 0.35, 0.7),
                               color="tab:red" if how == "failed" else "tab:blue")  # fmt: skip
        ax.plot(line.faults, [len(QUEUE_LANES) - 0.5] * len(line.faults), "rx", markersize=4)
        ax.set_yticks(range(len(QUEUE_LANES)), QUEUE_LANES)
        ax.set_title("device queue (red: failed)")
        ax = next(rows)
        if line.memory:
            ax.step([t for t, _ in line.memory], [b / 2**20 for _, b in line.memory], where="post")
        ax.set_ylabel("MiB on device")
    for ax in axes[:, 0]:
        for t in restarts:
            ax.axvline(t, color="black", linewidth=0.6, linestyle="--")
    axes[-1, 0].set_xlabel("ms since the trace opened (dashed: restarts)")
    handles = [Rectangle((0, 0), 1, 1, color=colors[name]) for name in names]
    fig.legend(handles, names, loc="upper center", ncol=min(len(names), 9), fontsize="small")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=100)
    plt.close(fig)


def command(path: str, *, check: bool = False, png: str | None = None) -> int:
    """`devbridge trace FILE`: its summary; `check`: its problems against the spec (exit 1 if
    any); `png`: its picture. Exit 2 when the file cannot be read or matplotlib is missing."""
    try:
        events = read(path)
    except (OSError, ValueError, RecursionError) as e:  # (JSON nested past the parser's depth)
        print(f"devbridge trace: cannot read {path}: {e}", file=sys.stderr)
        return 2
    print(summary(events))
    if png is not None:
        try:
            render_png(events, png)
        except ImportError as e:
            print(f"devbridge trace: --png needs matplotlib (pip install 'devbridge[plot]'): {e}", file=sys.stderr)
            return 2
        print(f"wrote {png}")
    if check:
        found = problems(events)
        for problem in found:
            print(problem)
        print(f"{len(found)} problems" if found else "follows the spec: every span closes, no counter below 0")
        return 1 if found else 0
    return 0
