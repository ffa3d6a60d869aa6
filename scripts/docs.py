"""`devbridge docs`: write spec/CONTRACT.md, and the docs' state graphs as SVG pictures
(docs/diagrams/), from the spec and the table compiled from it.

Nothing in them is written by hand: the state diagrams and the transition table are drawn
from the compiled table the runtime reads (`statemachine.Table`, proven equal to the
`transitions.Machine`), the rest from the spec, the contract clauses from spec/SEED.md (each
must map to a rule), and the proving tests from the tests' `holds`/`rejects` markers. The
pictures need Graphviz. `--check` compares the committed contract with what would be written
and each picture's stamp with the digest of what it would be drawn from (no Graphviz needed).
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import hashlib
import inspect
import json
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devbridge.errors import CONTRACT_PATH
from devbridge.spec import SEED_PATH, SPEC_PATH, Lifecycle, Rule, load
from devbridge.spec.ring import RingProtocol, load_ring
from devbridge.statemachine.machine import Table, compile_table

MARKERS = ("holds", "rejects")


class DocsError(Exception):
    """The spec, the contract and the tests do not line up; the message says where."""


def source_root() -> Path:
    """The checkout the packaged spec comes from (links resolved); for an installed wheel, the
    folder holding the package (see `checkout`)."""
    return SPEC_PATH.resolve().parent.parent


def checkout() -> Path | None:
    """The source checkout the packaged spec comes from, or None for an installed wheel (which
    has neither the tests nor a CONTRACT.md to write into)."""
    root = source_root()
    return root if (root / "pyproject.toml").is_file() and (root / "tests").is_dir() else None


NO_CHECKOUT = "devbridge is installed, not run from its checkout"


def anchor(rule_id: str) -> str:
    """The heading anchor of a rule in CONTRACT.md (GitHub's slug of the heading)."""
    return rule_id.lower()


#: The pictures of the docs, by file name, with their alt text.
TITLES = {
    "lifecycle": "The lifecycle at a glance",
    "lifecycle-full": "The lifecycle in full",
    "ring-records": "A ring reservation's record",
    "worker-stages": "A job's stages in the reference worker",
}


def picture(name: str) -> str:
    """The mark before a Mermaid block of CONTRACT.md: the site shows docs/diagrams/{name}.svg in
    its place (scripts/site_diagrams.py's `MARKED` reads this mark), GitHub renders the Mermaid."""
    return f"<!-- diagram: {name}: {TITLES[name]} -->"


# ------------------------------------------------------------ inputs


def seed_bullets(path: Path) -> list[tuple[str, str]]:
    """(section, bullet) for every bullet of the contract, whitespace folded."""
    bullets: list[tuple[str, str]] = []
    section = ""
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("- "):
            bullets.append((section, line[2:].strip()))
        elif line.startswith("  ") and bullets and line.strip():
            bullets[-1] = (bullets[-1][0], f"{bullets[-1][1]} {line.strip()}")
    return bullets


def rule_tests(tests_dir: Path) -> dict[str, dict[str, list[str]]]:
    """{"holds"|"rejects": {rule id: ["tests/layer/test_x.py::name", ...]}} from the markers in tests_dir."""
    found: dict[str, dict[str, list[str]]] = {kind: {} for kind in MARKERS}
    for path in sorted(tests_dir.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                if (
                    isinstance(deco, ast.Call)
                    and isinstance(deco.func, ast.Attribute)
                    and deco.func.attr in MARKERS
                    and ast.unparse(deco.func.value) == "pytest.mark"
                ):
                    for arg in deco.args:
                        where = f"{tests_dir.name}/{path.relative_to(tests_dir).as_posix()}::{node.name}"
                        found[deco.func.attr].setdefault(ast.literal_eval(arg), []).append(where)
    return found


# ------------------------------------------------------------ the graph


#: (source, dest, the label's lines): one edge of a picture.
Edge = tuple[str, str, list[str]]


def edge_lines(table: Table) -> list[Edge]:
    """(source, dest, labels) for every transition of the table, merged per (source, dest)."""
    labels: dict[tuple[str, str], list[str]] = {}
    for (state, event), steps in table.steps.items():
        for step in steps:
            if step.dest is None:  # a rejection: no edge
                continue
            guards = " and ".join(g if want else "not " + g for g, want in step.guards)
            label = event + (f" [{guards}]" if guards else "") + (" / release" if step.release else "")
            labels.setdefault((state, step.dest), []).append(label)
    return [(s, d, ls) for (s, d), ls in labels.items()]


def edges(table: Table) -> list[tuple[str, str, str]]:
    """`edge_lines` with each edge's labels as one Mermaid label."""
    return [(s, d, "<br/>".join(ls)) for s, d, ls in edge_lines(table)]


def fold(table: Table) -> dict[tuple[str, str], list[str]]:
    """The events that lead from one state to another, per pair of distinct states (no guards;
    `/ release` where the memory is released)."""
    events: dict[tuple[str, str], list[str]] = {}
    for (state, event), steps in table.steps.items():
        for step in steps:
            if step.dest is None or step.dest == state:
                continue
            names = events.setdefault((state, step.dest), [])
            if (name := event + (" / release" if step.release else "")) not in names:
                names.append(name)
    return events


def folded(table: Table, lc: Lifecycle) -> str:
    """The lifecycle at a glance: one node per state, one edge per pair of distinct states with
    its events (no guards, no self-loops; `/ release` where the memory is released)."""
    lines = ["stateDiagram-v2", f"    [*] --> {lc.initial}"]
    lines += [f"    {s} --> {d} : {', '.join(names)}" for (s, d), names in fold(table).items()]
    lines += [f"    {s} --> [*]" for s in lc.states if s in table.terminal]
    return "\n".join(lines)


def mermaid(table: Table, lc: Lifecycle) -> str:
    lines = ["stateDiagram-v2", f"    [*] --> {lc.initial}"]
    lines += [f"    {s} --> {d} : {label}" for s, d, label in edges(table)]
    lines += [f"    {s} --> [*]" for s in lc.states if s in table.terminal]
    return "\n".join(lines)


def generate(spec_path: Path | None = None, seed_path: Path | None = None, tests_dir: Path | None = None) -> str:
    """CONTRACT.md's text; `tests_dir`: the tests whose markers name the proofs (default: the
    checkout's tests/)."""
    if tests_dir is None:
        if (root := checkout()) is None:
            raise DocsError(f"{NO_CHECKOUT}: no tests folder to read the proofs from; pass --tests PATH")
        tests_dir = root / "tests"
    if not tests_dir.is_dir():
        raise DocsError(f"no tests folder at {tests_dir}")
    lc = load(spec_path)
    table = compile_table(lc)
    bullets = seed_bullets(seed_path or SEED_PATH)
    tests = rule_tests(tests_dir)
    _check_alignment(lc, bullets, tests)

    out: list[str] = [
        "# devbridge contract",
        "",
        "<!-- Generated by `devbridge docs` from spec/lifecycle.toml, spec/SEED.md and the tests' markers."
        " Do not edit: change the spec and regenerate. -->",
        "",
        "Every device allocation follows the lifecycle below. Each rule has an ID; every error the",
        "bridge raises names one (`[FREE-2] ...`) and links to its section here.",
        "",
        "## Lifecycle",
        "",
        "At a glance: each state, and the events that lead from one to another.",
        "",
        picture("lifecycle"),
        "```mermaid",
        folded(table, lc),
        "```",
        "",
        "In full: every step of the compiled table, with its guards and the steps that stay in a",
        "state (the counters change).",
        "",
        picture("lifecycle-full"),
        "```mermaid",
        mermaid(table, lc),
        "```",
        "",
        "| state | meaning | counters |",
        "|---|---|---|",
    ]
    for st in lc.states.values():
        where = ", ".join(f"{k} {v}" for k, v in st.where.items()) or "any"
        out.append(f"| `{st.name}`{' (terminal)' if st.terminal else ''} | {st.doc} | {where} |")
    out += ["", "| event | meaning | counter |", "|---|---|---|"]
    for ev in lc.events.values():
        counter = f"{ev.counter} {ev.delta:+d}" if ev.counter else ""
        out.append(f"| `{ev.name}` | {ev.doc} | {counter} |")
    out += ["", "Guards read the counters before the event:", ""]
    out += [f"- `{name}`: {doc}" for name, doc in lc.guards.items()]

    out += [
        "",
        "## Transition table",
        "",
        "Every (state, event) pair. Candidates are tried in order; the first whose guards hold is taken.",
        "A rejected event changes nothing.",
        "",
        "| state | event | guard | outcome |",
        "|---|---|---|---|",
    ]
    for (state, event), steps in table.steps.items():
        for step in steps:
            guard = ", ".join(g if want else f"not {g}" for g, want in step.guards) or "—"
            if step.rule is not None:
                outcome = f"rejected: [{step.rule}](#{anchor(step.rule)}) `{lc.rules[step.rule].error}`"
            else:
                outcome = f"→ `{step.dest}`" + (" + backend free" if step.release else "")
            out.append(f"| `{state}` | `{event}` | {guard} | {outcome} |")

    out += [
        "",
        "When a use does not succeed, it reports (a call that fails at once raises it; otherwise its event's `error`):",
        "",
        "| the use | rule | error |",
        "|---|---|---|",
    ]
    for f in lc.failures.values():
        what = "aborted by a restart" if f.when == "aborted" else f"`{f.when}` failed by the backend"
        out.append(f"| {what} | [{f.rule}](#{anchor(f.rule)}) | `{f.error}` |")

    sections: dict[str, list[str]] = {}
    for rule in lc.rules.values():
        sections.setdefault(rule.section, []).append(rule.id)
    out += ["", "## Rules", ""]
    for section, ids in sections.items():
        out += [f"### {section}", ""]
        if section.startswith("Generations"):
            out += _restart_summary(table)
        if section == "Ordering":
            out += _ordering_summary(lc)
        if section == "The ring across processes":
            out += _ring_summary(load_ring())
        for rid in ids:
            out += _rule_block(lc, rid, tests)
    out += ["## Invariants", "", "Checked after every step of the stateful tests:", ""]
    out += [f"- **{inv.id}**: {inv.text}" for inv in lc.invariants.values()]
    out += [
        "",
        "## Contract clauses",
        "",
        "Each clause of the user's contract (spec/SEED.md) and the rules that implement it.",
    ]
    current = None
    for section, bullet in bullets:
        if section != current:
            out += ["", f"**{section}**", ""]
            current = section
        rules = [r.id for r in lc.rules.values() if bullet in r.seed]
        out.append(f"- {bullet} — " + ", ".join(f"[{r}](#{anchor(r)})" for r in rules))
    return "\n".join(out).rstrip() + "\n"


def _restart_summary(table: Table) -> list[str]:
    rows = ["What `restart()` does to an allocation in each state:", "", "| state | becomes |", "|---|---|"]
    for (state, event), steps in table.steps.items():
        for step in steps:
            if event == "restart" and step.dest is not None:
                rows.append(f"| `{state}` | `{step.dest}`" + (" + backend free |" if step.release else " |"))
    return [*rows, ""]


def _ordering_summary(lc: Lifecycle) -> list[str]:
    rows = ["What each use does to device bytes (`range`: the copy's device range; `whole`: every byte):", ""]
    rows += ["| use | reads | writes | |", "|---|---|---|---|"]
    for a in lc.accesses.values():
        rows.append(f"| `{a.use}` | {a.reads or '—'} | {a.writes or '—'} | {a.doc} |")
    rows += [
        "",
        "Hazards: a later use follows an earlier one still in flight that touches an overlapping byte when",
        "",
    ]
    rows += [f"- **{h.name}**: the earlier {h.earlier}, the later {h.later} ({h.doc})." for h in lc.hazards]
    pairs = ", ".join(f"`{a}` then `{b}`" for a, b in sorted(lc.device_ordered))
    rows += ["", f"No edge for {pairs}: {lc.ordering_doc}", ""]
    uses = list(lc.accesses)
    rows += ["| earlier \\ later | " + " | ".join(f"`{u}`" for u in uses) + " |", "|---" * (len(uses) + 1) + "|"]
    for earlier in uses:
        rows.append(f"| `{earlier}` | " + " | ".join(lc.hazard(earlier, later) or "—" for later in uses) + " |")
    return [*rows, ""]


def _ring_summary(ring: RingProtocol) -> list[str]:
    """The records of a ring, from spec/ring.toml: each reservation's states and transitions."""
    rows = ["Each reservation of a ring is a record with these states (spec/ring.toml):", "", picture("ring-records")]
    rows += ["```mermaid"]
    rows += ["stateDiagram-v2", f"    [*] --> {ring.initial}"]
    rows += [f"    {t.source} --> {t.dest}: {t.event}" for t in ring.transitions]
    rows += [f"    {s.name} --> [*]" for s in ring.states.values() if s.terminal]
    rows += ["```", "", "| state | meaning |", "|---|---|"]
    rows += [f"| `{s.name}`{' (terminal)' if s.terminal else ''} | {s.doc} |" for s in ring.states.values()]
    rows += ["", "| state | event | to | rule | by |", "|---|---|---|---|---|"]
    rows += [
        f"| `{t.source}` | `{t.event}` | `{t.dest}` | [{t.rule}](#{anchor(t.rule)}) | {t.doc} |"
        for t in ring.transitions
    ]
    return [*rows, ""]


def _rule_block(lc: Lifecycle, rid: str, tests: dict[str, dict[str, list[str]]]) -> list[str]:
    rule = lc.rules[rid]
    block = [f"#### {rid}", "", rule.text, "", f"- Reported by: {_reported(lc, rule)}"]
    block += [f"- Contract: {clause}" for clause in rule.seed]
    for kind, title in (("holds", "Proved by"), ("rejects", "Breach refused or deferred in")):
        block.append(f"- {title}: " + ", ".join(f"`{t}`" for t in sorted(tests[kind].get(rid, []))))
    return [*block, ""]


def _reported(lc: Lifecycle, rule: Rule) -> str:
    """How a breach of `rule` is kept, in words (the spec's `error` or `kept_by`)."""
    if rule.error is not None:
        return f"`{rule.error}`"
    if rule.kept_by == "deferring":
        return "nothing: a breach is kept by deferring the backend work, never by failing a call"
    if rule.kept_by == "logging":
        return "a WARNING on the `devbridge` logger naming what holds the allocation; its release is deferred"
    keeper = lc.rules[str(rule.kept_by)]
    return f"`{keeper.error}` of [{keeper.id}](#{anchor(keeper.id)}), which refuses a breach"


def _check_alignment(lc: Lifecycle, bullets: list[tuple[str, str]], tests: dict[str, dict[str, list[str]]]) -> None:
    known = {b for _, b in bullets}
    for rule in lc.rules.values():
        if unknown := [c for c in rule.seed if c not in known]:
            raise DocsError(f"rule {rule.id} cites a clause that is not in the contract: {unknown[0]!r}")
    if orphans := [b for _, b in bullets if not any(b in r.seed for r in lc.rules.values())]:
        raise DocsError(f"contract clause implemented by no rule: {orphans[0]!r}")
    for kind in MARKERS:
        if missing := [r for r in lc.rules if r not in tests[kind]]:
            raise DocsError(f"rule {missing[0]} has no test marked @pytest.mark.{kind}")


# ------------------------------------------------------------ the pictures

#: Where the pictures go in the checkout: beside the pages that show them (MkDocs copies them).
DIAGRAMS_DIR = Path("docs") / "diagrams"
FONT = "Helvetica,Arial,sans-serif"
#: The first line after the SVG's XML declaration: the digest of what it was drawn from.
STAMP_PREFIX = "<!-- drawn by devbridge docs from sha256:"
STAMP = STAMP_PREFIX + "{} -->"


@dataclass(frozen=True)
class Diagram:
    """One state graph of the docs (drawn to `{name}.svg`): its states, the initial and the
    terminal ones, and its edges with their labels' lines."""

    name: str  # a key of TITLES
    states: tuple[str, ...]
    initial: str
    terminal: tuple[str, ...]
    moves: tuple[Edge, ...]
    rankdir: str = "LR"

    @property
    def digest(self) -> str:
        """Of the graph and of how this module draws it (`state_graph`'s code, the font): a
        picture is stale when either changed. No library's spelling of it is read, so a machine
        with another Graphviz tells a stale picture the same."""
        drawing = [self.name, self.states, self.initial, self.terminal, self.moves, self.rankdir, FONT]
        return hashlib.sha256((json.dumps(drawing) + inspect.getsource(state_graph)).encode()).hexdigest()

    @property
    def dot(self) -> str:
        """Its Graphviz source."""
        return state_graph(self.name, self.states, self.initial, self.terminal, self.moves, self.rankdir)


def state_graph(
    name: str, states: Sequence[str], initial: str, terminal: Sequence[str], moves: Sequence[Edge], rankdir: str
) -> str:
    """The Graphviz source of a state graph, built by `transitions`' GraphMachine (the design
    card's state-machine library; Graphviz's `dot` lays it out and draws it): one edge per
    (source, dest) with its label's lines, a start point before `initial`, and the terminal states
    ringed twice."""
    from transitions.extensions import GraphMachine

    styles: dict[str, Any] = copy.deepcopy(GraphMachine.style_attributes)
    styles["node"]["active"] = styles["node"]["default"]  # the model's state is not the picture's
    styles["node"]["default"]["fontname"] = styles["edge"]["default"]["fontname"] = FONT
    model: Any = types.SimpleNamespace()
    machine = GraphMachine(
        model=model,
        states=list(states),
        initial=initial,
        transitions=[
            {"trigger": f"move{i}", "source": s, "dest": d, "label": "\\n".join(lines)}
            for i, (s, d, lines) in enumerate(moves)
        ],
        auto_transitions=False,
        title="",
        graph_engine="graphviz",
    )
    machine.style_attributes = styles
    machine.machine_attributes = {**machine.machine_attributes, "rankdir": rankdir}
    graph = model.get_graph()
    graph.name = name  # the SVG's <title>
    graph.node("start", label="", shape="point", width="0.12")
    graph.edge("start", initial)
    for state in terminal:
        graph.node(state, peripheries="2")
    return str(graph.source)


def diagrams(lc: Lifecycle, table: Table, ring: RingProtocol) -> list[Diagram]:
    """Every state graph the docs show, from the spec the runtime reads (and the reference
    worker's stages from its own table, `MOVES`)."""
    from devbridge.apps.worker.jobs import MOVES, Stage

    states, terminal = tuple(lc.states), tuple(s for s in lc.states if s in table.terminal)
    folded = tuple((s, d, [", ".join(names)]) for (s, d), names in fold(table).items())
    records: dict[tuple[str, str], list[str]] = {}
    for t in ring.transitions:
        records.setdefault((t.source, t.dest), []).append(t.event)
    stages = tuple(s.name for s in Stage)
    ends = tuple(s.name for s in Stage if not any(at is s for at, _ in MOVES))
    return [
        Diagram("lifecycle", states, lc.initial, terminal, folded, "TB"),
        Diagram("lifecycle-full", states, lc.initial, terminal, tuple(edge_lines(table)), "TB"),
        Diagram(
            "ring-records",
            tuple(ring.states),
            ring.initial,
            tuple(s.name for s in ring.states.values() if s.terminal),
            tuple((s, d, events) for (s, d), events in records.items()),
        ),
        Diagram(
            "worker-stages",
            stages,
            Stage.SLOT.name,
            ends,
            tuple((a.name, b.name, [why]) for (a, b), why in MOVES.items()),
            "TB",
        ),
    ]


def draw(diagram: Diagram) -> str:
    """The SVG of `diagram`, stamped with its digest (needs Graphviz's `dot`)."""
    import graphviz

    svg = graphviz.Source(diagram.dot).pipe(format="svg", encoding="utf-8")
    head, sep, rest = svg.partition("\n")
    if not head.startswith("<?xml"):
        head, sep, rest = "", "", svg
    return f"{head}{sep}{STAMP.format(diagram.digest)}\n{rest}"


def stale_pictures(folder: Path, wanted: Sequence[Diagram]) -> dict[Path, str]:
    """The pictures in `folder` to draw again or remove, each with why: missing, not drawn from
    what `wanted` holds now (its stamp, or an SVG cut short), or drawn by this command from a
    diagram that is gone (other SVGs in the folder are not ours and are left alone)."""
    problems = {}
    for d in wanted:
        path = folder / f"{d.name}.svg"
        lines = path.read_text().splitlines() if path.is_file() else []
        if not lines:
            problems[path] = "is missing"
        elif STAMP.format(d.digest) not in lines[:2] or not lines[-1].endswith("</svg>"):
            problems[path] = "was not drawn from the spec as it is"
    names = {f"{d.name}.svg" for d in wanted}
    for path in sorted(folder.glob("*.svg")):
        if path.name not in names and STAMP_PREFIX in "".join(path.read_text().splitlines()[:2]):
            problems[path] = "is drawn from nothing"
    return problems


# ------------------------------------------------------------ command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devbridge docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file is not what would be written")
    parser.add_argument("--spec", type=Path, default=None, help="lifecycle spec (default: the packaged one)")
    parser.add_argument("--seed", type=Path, default=None, help="the contract (default: spec/SEED.md)")
    parser.add_argument("--tests", type=Path, default=None, help="tests folder (default: the checkout's tests/)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output (default: the checkout's spec/CONTRACT.md; --check: the packaged one)",
    )
    parser.add_argument(
        "--diagrams",
        type=Path,
        default=None,
        help="where the SVG pictures go (default: the checkout's docs/diagrams, or a diagrams/ folder beside "
        "an --out elsewhere)",
    )
    args = parser.parse_args(argv)
    root = checkout()
    if args.out is None and root is None and not args.check:
        print(f"devbridge docs: {NO_CHECKOUT}: pass --out PATH (the package is not written into)", file=sys.stderr)
        return 2
    out = args.out or (root or source_root()) / CONTRACT_PATH
    folder = args.diagrams or pictures_folder(out, root)
    try:
        text = generate(args.spec, args.seed, args.tests)
        lc = load(args.spec)
        pictures = diagrams(lc, compile_table(lc), load_ring()) if folder is not None else []
    except DocsError as e:
        print(f"devbridge docs: {e}", file=sys.stderr)
        return 2
    if args.check:
        return check(out, text, folder, pictures)
    out.write_text(text)
    print(f"wrote {out}")
    return 0 if folder is None else write_pictures(folder, pictures)


def pictures_folder(out: Path, root: Path | None) -> Path | None:
    """Where the pictures of a contract written to `out` go: the checkout's docs/diagrams for its
    own CONTRACT.md; a diagrams/ folder beside any other; none for an installed wheel's."""
    if root is not None and out.resolve() == (root / CONTRACT_PATH).resolve():
        return root / DIAGRAMS_DIR
    if root is None and out.resolve() == (source_root() / CONTRACT_PATH).resolve():
        return None
    return out.parent / "diagrams"


def check(out: Path, text: str, folder: Path | None, pictures: Sequence[Diagram]) -> int:
    """0 when `out` holds `text` and every picture in `folder` is drawn from `pictures`; else 1,
    with a diff or the stale pictures (an installed wheel, with no folder, checks the text only).
    Draws nothing: it reads the pictures' stamps."""
    current = out.read_text() if out.exists() else ""
    stale = stale_pictures(folder, pictures) if folder is not None else {}
    if current == text and not stale:
        print(f"{out} is up to date" + (f", and the pictures in {folder}" if folder is not None else ""))
        return 0
    if current != text:
        diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(out), "generated", lineterm="", n=1)
        print(f"{out} differs from what `devbridge docs` would write:", file=sys.stderr)
        print("\n".join(list(diff)[:40]), file=sys.stderr)
    for path, why in stale.items():
        print(f"{path} {why}: run `devbridge docs`", file=sys.stderr)
    return 1


def write_pictures(folder: Path, pictures: Sequence[Diagram]) -> int:
    """Draw each stale picture into `folder` and remove the ones no diagram draws any more
    (only SVGs this command drew); 1 when Graphviz is not installed."""
    try:
        import graphviz

        graphviz.version()
    except (ImportError, RuntimeError, OSError) as e:  # graphviz.ExecutableNotFound is a RuntimeError
        print(
            f"devbridge docs: the pictures need Graphviz (apt install graphviz; pip install graphviz): {e}",
            file=sys.stderr,
        )
        return 1
    folder.mkdir(parents=True, exist_ok=True)
    by_path = {folder / f"{d.name}.svg": d for d in pictures}
    for path in stale_pictures(folder, pictures):
        if (d := by_path.get(path)) is not None:
            path.write_text(draw(d))
            print(f"wrote {path}")
        else:
            path.unlink()
            print(f"removed {path} (drawn from nothing)")
    return 0
