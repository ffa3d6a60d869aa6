"""`devbridge docs`: write spec/CONTRACT.md from the spec and the table compiled from it.

Nothing in the document is written by hand: the state diagram and the
transition table are drawn from the compiled table the runtime reads
(`statemachine.Table`, proven equal to the `transitions.Machine`), the rest from the spec,
the contract clauses from spec/SEED.md (each must map to a rule), and the
proving tests from the tests' `holds`/`rejects` markers. `--check` compares
the committed file with what would be written.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

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


def edges(table: Table) -> list[tuple[str, str, str]]:
    """(source, dest, label) for every transition of the table, merged per (source, dest)."""
    labels: dict[tuple[str, str], list[str]] = {}
    for (state, event), steps in table.steps.items():
        for step in steps:
            if step.dest is None:  # a rejection: no edge
                continue
            guards = " and ".join(g if want else "not " + g for g, want in step.guards)
            label = event + (f" [{guards}]" if guards else "") + (" / release" if step.release else "")
            labels.setdefault((state, step.dest), []).append(label)
    return [(s, d, "<br/>".join(ls)) for (s, d), ls in labels.items()]


def folded(table: Table, lc: Lifecycle) -> str:
    """The lifecycle at a glance: one node per state, one edge per pair of distinct states with
    its events (no guards, no self-loops; `/ release` where the memory is released)."""
    events: dict[tuple[str, str], list[str]] = {}
    for (state, event), steps in table.steps.items():
        for step in steps:
            if step.dest is None or step.dest == state:
                continue
            names = events.setdefault((state, step.dest), [])
            if (name := event + (" / release" if step.release else "")) not in names:
                names.append(name)
    lines = ["stateDiagram-v2", f"    [*] --> {lc.initial}"]
    lines += [f"    {s} --> {d} : {', '.join(names)}" for (s, d), names in events.items()]
    lines += [f"    {s} --> [*]" for s in lc.states if s in table.terminal]
    return "\n".join(lines)


def mermaid(table: Table, lc: Lifecycle) -> str:
    lines = ["stateDiagram-v2", f"    [*] --> {lc.initial}"]
    lines += [f"    {s} --> {d} : {label}" for s, d, label in edges(table)]
    lines += [f"    {s} --> [*]" for s in lc.states if s in table.terminal]
    return "\n".join(lines)


def graphviz(table: Table, lc: Lifecycle) -> str:
    lines = ["digraph lifecycle {", "  rankdir=LR; node [shape=box, style=rounded];"]
    lines += [f"  {s} [peripheries=2];" for s in lc.states if s in table.terminal]
    lines += [f'  {s} -> {d} [label="{label.replace("<br/>", chr(92) + "n")}"];' for s, d, label in edges(table)]
    return "\n".join([*lines, "}"]) + "\n"


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
        "```mermaid",
        folded(table, lc),
        "```",
        "",
        "In full: every step of the compiled table, with its guards and the steps that stay in a",
        "state (the counters change).",
        "",
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
    rows = ["Each reservation of a ring is a record with these states (spec/ring.toml):", "", "```mermaid"]
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


# ------------------------------------------------------------ command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devbridge docs", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed file is not what would be written"
    )
    parser.add_argument("--svg", action="store_true", help="also write the diagram as SVG (needs Graphviz's dot)")
    parser.add_argument("--spec", type=Path, default=None, help="lifecycle spec (default: the packaged one)")
    parser.add_argument("--seed", type=Path, default=None, help="the contract (default: spec/SEED.md)")
    parser.add_argument("--tests", type=Path, default=None, help="tests folder (default: the checkout's tests/)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output (default: the checkout's spec/CONTRACT.md; --check: the packaged one)",
    )
    args = parser.parse_args(argv)
    root = checkout()
    if args.out is None and root is None and not args.check:
        print(f"devbridge docs: {NO_CHECKOUT}: pass --out PATH (the package is not written into)", file=sys.stderr)
        return 2
    out = args.out or (root or source_root()) / CONTRACT_PATH
    try:
        text = generate(args.spec, args.seed, args.tests)
    except DocsError as e:
        print(f"devbridge docs: {e}", file=sys.stderr)
        return 2
    if args.check:
        current = out.read_text() if out.exists() else ""
        if current == text:
            print(f"{out} is up to date")
            return 0
        diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(out), "generated", lineterm="", n=1)
        print(f"{out} differs from what `devbridge docs` would write:", file=sys.stderr)
        print("\n".join(list(diff)[:40]), file=sys.stderr)
        return 1
    out.write_text(text)
    print(f"wrote {out}")
    if args.svg:
        dot = shutil.which("dot")
        if dot is None:
            print("Graphviz's dot is not installed: no SVG (the Markdown is complete without it)")
        else:
            svg = out.with_suffix(".svg")
            lc = load(args.spec)
            subprocess.run([dot, "-Tsvg", "-o", str(svg)], input=graphviz(compile_table(lc), lc), text=True, check=True)
            print(f"wrote {svg}")
    return 0
