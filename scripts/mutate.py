"""Mutation testing: seed one small bug at a time into the core files and run the tests that cover it.

A mutant is one source edit (an operator, a constant, a deleted call or raise, a return value)
made by splicing the file's text at an AST node, so every other byte and line stays put. It is
killed when a test that covers its line fails (or hangs, or is no longer collected: a mutant that
changes which devices open drops their parametrized tests); it survives when they all pass.

Each mutant runs in a copy of the checkout (one per job), imported through PYTHONPATH, so the
checkout itself is never touched. Which tests run: the ones coverage.py saw executing the
mutated lines in one run of the fast subset, fastest first, stopping at the first failure. A
mutant that survives them gets a second chance against the stateful tests (their `mutate`
Hypothesis profile), which cover everything but take seconds each.

Survivors are listed in the report; one that no test can kill (it changes nothing observable)
belongs in scripts/equivalent-mutants.toml with the source line it mutates and a one-line
reason. A listed mutant is run like every other: it counts as equivalent only while it survives
and its line is still the one the reason was written for. One that a test kills, one whose line
changed, and an entry that matches no mutant fail the run (exit 1), so the list cannot go on
excusing what the tests can now tell apart. The score of a file is (killed + timeout) /
(mutants - equivalent); timeouts are counted apart from kills in the report.

    scripts/mutate                       # every file in FILES, 2 jobs; report in scripts/mutation-report.md
    scripts/mutate --files ring/host.py --jobs 1
    scripts/mutate --resume              # go on with a stopped run (its log: scripts/mutation-report.jsonl)
    scripts/mutate --again               # rerun what the last run did not kill (after new tests)

Both reuse a logged outcome only while the code its mutant lives in (its function, or its own
lines outside functions) is unchanged, so a run stopped, then resumed after edits, reruns exactly
the mutants of the functions that changed.
    scripts/mutate --list                # the mutants, without running anything
    scripts/mutate --resume --render     # the report of what the log holds, without running anything
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = (
    "statemachine/records.py",
    "statemachine/ledger.py",
    "statemachine/core.py",
    "statemachine/machine.py",
    "statemachine/runner.py",
    "bridge/engine.py",
    "bridge/bridge.py",
    "ring/host.py",
    "ring/shared.py",
    "ring/segment.py",
    "ring/buffers.py",
    "bridge/events.py",
    "testing/fake.py",
    "backends/tinygrad.py",
    "backends/tinygrad_compat.py",
)
EQUIVALENT = ROOT / "scripts" / "equivalent-mutants.toml"
#: Too slow to run for every mutant: they only see the survivors of the rest.
SLOW = ("tests/model/test_stateful.py", "tests/model/test_checker.py", "tests/model/test_sansio.py")
#: Not run at all: they time the machine or run the bench, the example or pytest in a child
#: process (lines they run are not seen), seed bugs of their own (test_mutants), or test the
#: installed package, a wheel, the set-up or the import graph in child processes (which import
#: the installed package, not the mutated copy).
SKIPPED = (
    "tests/house/test_bench.py",
    "tests/apps/test_example.py",
    "tests/house/test_markers.py",
    "tests/model/test_mutants.py",
    "tests/apps/test_cli.py",
    "tests/house/test_house.py",
    "tests/house/test_layers.py",
    "tests/house/test_wheel.py",
    "tests/apps/test_fleet.py",
    "tests/house/test_shell_blocks.py",
    "tests/house/test_mutate_tool.py",  # the tool's own tests: they copy the checkout with git
)
#: Tests of files run otherwise that are not run either: they run the demo in a child process
#: (coverage sees none of its lines), and the coverage run's load can starve what they wait for.
DESELECTED = (
    "tests/backends/test_cl.py::test_the_demo_on_cl_delivers_every_object_once_with_computes_overlapping_uploads",
)

COMPARE = {
    ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"),
}  # fmt: skip
BINARY = {
    ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "/"), ast.Mod: ("%", "/"), ast.BitAnd: ("&", "|"), ast.BitOr: ("|", "&"),
    ast.BitXor: ("^", "&"), ast.LShift: ("<<", ">>"), ast.RShift: (">>", "<<"),
}  # fmt: skip
BOOLEAN = {ast.And: ("and", "or"), ast.Or: ("or", "and")}


@dataclass(frozen=True)
class Mutant:
    file: str
    function: str  # qualified name of the enclosing def or class ("<module>" at top level)
    kind: str  # compare, binary, augassign, boolean, not, negate, number, bool, return, delete, loop
    original: str
    mutated: str
    line: int
    end_line: int
    start: int  # character offsets of the replaced text in the file
    end: int
    nth: int = 0  # among mutants with the same file, function, kind and texts
    #: a digest of the code it lives in (its function's syntax, docstring aside; its own lines
    #: outside functions):
    #: a stopped run resumed after edits reruns exactly the mutants whose code changed
    code: str = ""

    @property
    def key(self) -> str:
        """Stable across unrelated edits: no line numbers."""
        return f"{self.file}::{self.function}::{self.kind}::{self.original} -> {self.mutated}::{self.nth}"

    def apply(self, source: str) -> str:
        return source[: self.start] + self.mutated + source[self.end :]


# ---------------------------------------------------------------- making mutants


class _Finder(ast.NodeVisitor):
    """Walks one file and yields the mutants of each node, skipping annotations and docstrings."""

    def __init__(self, file: str, source: str) -> None:
        self.file, self.source = file, source
        self.offsets = [0]
        for line in source.splitlines(keepends=True):
            self.offsets.append(self.offsets[-1] + len(line))
        self.scope: list[str] = []
        self.functions: list[str] = []  # the digests of the functions the walk is inside, innermost last
        self.found: list[Mutant] = []

    def pos(self, line: int, col: int) -> int:
        # ast columns are UTF-8 byte offsets
        text = self.source[self.offsets[line - 1] : self.offsets[line]]
        return self.offsets[line - 1] + len(text.encode()[:col].decode())

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            self.pos(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.pos(node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
        )

    def add(self, kind: str, node: ast.AST, start: int, end: int, mutated: str) -> None:
        original = self.source[start:end]
        if original == mutated or "no mutate" in self.source[self.offsets[node.lineno - 1] : self.offsets[node.lineno]]:  # type: ignore[attr-defined]
            return
        line, end_line = node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]
        code = (
            self.functions[-1]
            if self.functions
            else digest(self.source[self.offsets[line - 1] : self.offsets[end_line]])
        )
        self.found.append(
            Mutant(self.file, ".".join(self.scope) or "<module>", kind, original, mutated, line, end_line, start, end,
                   code=code)
        )  # fmt: skip

    def operator_between(self, kind: str, node: ast.AST, left: ast.AST, right: ast.AST, op: str, new: str) -> None:
        """Replace the operator token `op` in the text between two operands (one occurrence)."""
        gap_start, gap_end = self.span(left)[1], self.span(right)[0]
        gap = self.source[gap_start:gap_end]
        code = gap.split("#")[0] if "\n" not in gap else gap
        words = code.replace("(", " ").replace(")", " ").split()
        if " ".join(words) != op:
            return
        at = gap.index(op.split()[0])
        end = gap.rindex(op.split()[-1]) + len(op.split()[-1])
        self.add(kind, node, gap_start + at, gap_start + end, new)

    # scopes
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
            self.visit(default)  # evaluated where the function is defined (at import)
        self.scope.append(node.name)
        self.functions.append(digest(_code_of(node)))
        for stmt in node.body[1:] if _docstring(node.body) else node.body:
            self.visit(stmt)
        self.functions.pop()
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        for stmt in node.body[1:] if _docstring(node.body) else node.body:
            self.visit(stmt)
        self.scope.pop()

    def visit_Module(self, node: ast.Module) -> None:
        for stmt in node.body[1:] if _docstring(node.body) else node.body:
            self.visit(stmt)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_If(self, node: ast.If) -> None:
        if ast.unparse(node.test) == "TYPE_CHECKING":
            return
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        return

    # expressions
    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            old, new = COMPARE[type(op)]
            self.operator_between("compare", node, operands[i], operands[i + 1], old, new)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if type(node.op) in BINARY:
            old, new = BINARY[type(node.op)]
            self.operator_between("binary", node, node.left, node.right, old, new)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        old, new = BOOLEAN[type(node.op)]
        for left, right in zip(node.values, node.values[1:], strict=False):
            self.operator_between("boolean", node, left, right, old, new)
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        start = self.span(node)[0]
        prefix = self.source[start : self.span(node.operand)[0]]  # the operator, then maybe "("
        if isinstance(node.op, ast.Not):
            self.add("not", node, start, start + len(prefix), prefix.removeprefix("not").lstrip())
        elif isinstance(node.op, ast.USub) and not isinstance(node.operand, ast.Constant):
            self.add("negate", node, start, start + len(prefix), prefix.removeprefix("-").lstrip())
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        start, end = self.span(node)
        if isinstance(node.value, bool):
            self.add("bool", node, start, end, str(not node.value))
        elif isinstance(node.value, int):
            self.add("number", node, start, end, str(node.value + 1))
        elif isinstance(node.value, float):
            self.add("number", node, start, end, repr(node.value + 1.0))

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return  # messages: their words are not behaviour (tests that match them are not the point)

    # statements
    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if type(node.op) in BINARY:
            old, new = BINARY[type(node.op)]
            self.operator_between("augassign", node, node.target, node.value, old + "=", new + "=")
        self.generic_visit(node)

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            start, end = self.span(node)
            self.add("return", node, start, end, "return None")
        self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Call):
            start, end = self.span(node)
            self.add("delete", node, start, end, "pass")
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        start, end = self.span(node)
        self.add("delete", node, start, end, "pass")
        self.generic_visit(node)

    def visit_Break(self, node: ast.Break) -> None:
        self.add("loop", node, *self.span(node), "continue")

    def visit_Continue(self, node: ast.Continue) -> None:
        self.add("loop", node, *self.span(node), "break")


def _code_of(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """A function's code as its syntax tree, without its docstring: an edit of prose, comments
    or layout leaves it, and the outcomes logged for its mutants, as they were."""
    body = node.body[1:] if _docstring(node.body) else node.body
    bare = ast.FunctionDef(name=node.name, args=node.args, body=body, decorator_list=node.decorator_list,
                           returns=node.returns, type_comment=None)  # fmt: skip
    return type(node).__name__ + ast.dump(bare)


def digest(code: str) -> str:
    return hashlib.blake2b(code.encode(), digest_size=8).hexdigest()


def _docstring(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)


def mutants_of(file: str, source: str) -> list[Mutant]:
    finder = _Finder(file, source)
    tree = ast.parse(source)
    finder.visit(tree)
    seen: Counter[tuple[str, str, str, str]] = Counter()
    numbered = []
    for m in sorted(finder.found, key=lambda m: (m.start, m.end, m.kind)):
        ident = (m.function, m.kind, m.original, m.mutated)
        numbered.append(Mutant(**{**asdict(m), "nth": seen[ident]}))
        seen[ident] += 1
    lines = source.count("\n")
    for m in numbered:  # every mutant must still be Python
        mutated = m.apply(source)
        first, last, member = _enclosing(tree, m.line, m.end_line)
        last -= lines - mutated.count("\n")  # (a deleted statement may take lines with it)
        region = "".join(mutated.splitlines(keepends=True)[first - 1 : last])
        try:  # the statement it is in, parsed alone (the whole file once per mutant takes seconds)
            ast.parse("class _:\n" + region if member else region)
        except SyntaxError:
            try:
                ast.parse(mutated)
            except SyntaxError as e:
                raise SystemExit(f"a mutant is not Python ({e}): {m}") from e
    return numbered


def _enclosing(tree: ast.Module, line: int, end_line: int) -> tuple[int, int, bool]:
    """The lines [first, last] of the module-level statement holding lines [line, end_line] (or
    of the member of a module-level class that holds them), and whether it is a class member."""
    for node in tree.body:
        first, last = _lines(node)
        if first <= line and end_line <= last:
            for member in node.body if isinstance(node, ast.ClassDef) else ():
                inner_first, inner_last = _lines(member)
                if inner_first <= line and end_line <= inner_last:
                    return inner_first, inner_last, True
            return first, last, False
    return 1, tree.body[-1].end_lineno or 1, False  # (not reached: every line is in a statement)


def _lines(node: ast.stmt) -> tuple[int, int]:
    """A statement's first line (its decorators') and its last."""
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)]), node.end_lineno or node.lineno


# ---------------------------------------------------------------- running them


def checkout_copy(dest: Path) -> Path:
    """The working tree's files (tracked and untracked, not ignored) copied to dest, with the
    package laid out over them as an editable install does (`dest/devbridge`, links to the copy's
    folders by pyproject's package-dir): the tests run in the copy import it (PYTHONPATH), so a
    mutant made in the copy's file is the code they run, and a path resolved from the package
    leads back to the copy as it does to the checkout."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / name.decode()
        if src.is_file():
            (dest / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name.decode())
    for package, folder in sorted(PACKAGE_DIR.items()):  # the root package first: the others go in it
        tree = dest / installed_folder(package)
        if "." not in package:  # links to each of its files, as an editable install lays it out
            tree.mkdir()
            for source in (dest / folder).iterdir():
                (tree / source.name).symlink_to(source)
        else:
            tree.symlink_to(dest / folder, target_is_directory=True)
    return dest


#: pyproject's package-dir: each package of devbridge and the checkout folder it is made from.
PACKAGE_DIR: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def installed_folder(package: str) -> str:
    return package.replace(".", "/")


def installed(file: str) -> str:
    """Where a checkout file (`statemachine/core.py`) is in the installed package's tree
    (`devbridge/statemachine/core.py`): the tests of a copy import it from there."""
    folder, _, rest = file.partition("/")
    for package, source in PACKAGE_DIR.items():
        if source == folder:
            return f"{installed_folder(package)}/{rest}"
    return file


def pytest_cmd(copy: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": str(copy), "HYPOTHESIS_PROFILE": "mutate", "PYTHONDONTWRITEBYTECODE": "1"}
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], env


def coverage_map(base: Path) -> tuple[dict[str, dict[int, set[str]]], dict[str, float]]:
    """{file: {line: {test function node id}}} and {test function node id: seconds}, from one run
    of every test but the skipped ones under coverage.py with per-test contexts."""
    rc = base / ".mutate-coveragerc"
    paths = [base / where for f in FILES for where in (f, installed(f))]  # (as imported, and resolved)
    rc.write_text("[run]\nbranch = false\ninclude =\n" + "".join(f"    {path}\n" for path in paths))
    ignore = [f"--ignore={t}" for t in SKIPPED] + [f"--deselect={t}" for t in DESELECTED]
    cmd, env = pytest_cmd(base, *ignore, "-p", "mutate_context", f"--junitxml={base / 'baseline.xml'}")
    cmd = [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", "-m", *cmd[2:]]
    env["PYTHONPATH"] += os.pathsep + str(base / "scripts")  # the context plugin
    run = run_group(cmd, base, {**env, "COVERAGE_FILE": str(base / ".coverage")}, None)
    if run.returncode != 0:
        sys.exit(f"the unmutated tests fail in the copy; fix that first:\n{run.stdout[-3000:]}{run.stderr[-2000:]}")
    subprocess.run(
        [sys.executable, "-m", "coverage", "json", f"--rcfile={rc}", "--show-contexts", "-o", str(base / "cov.json")],
        cwd=base, env={**env, "COVERAGE_FILE": str(base / ".coverage")}, check=True, capture_output=True,
    )  # fmt: skip
    data = json.loads((base / "cov.json").read_text())
    lines: dict[str, dict[int, set[str]]] = {f: defaultdict(set) for f in FILES}
    of_installed = {installed(f): f for f in FILES}
    for path, info in data["files"].items():
        file = str(Path(path).relative_to(base)) if Path(path).is_absolute() else path
        file = of_installed.get(file, file)
        for line, contexts in info["contexts"].items():
            for context in contexts:
                if context.startswith("tests/"):  # a test's node id (not module import time: "")
                    lines[file][int(line)].add(context)
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(base / "baseline.xml").getroot().iter("testcase"):
        module = case.get("classname", "")
        name = case.get("name", "").split("[")[0]
        seconds[_node_id(f"{module}.{name}", base)] += float(case.get("time", "0"))
    return lines, seconds


def _node_id(context: str, base: Path) -> str:
    """`tests.test_x.Class.test_y` (a coverage context or junit name) -> `tests/test_x.py::Class::test_y`."""
    context = context.removesuffix("|run")
    parts = context.split(".")
    for i in range(len(parts), 0, -1):
        path = Path(*parts[:i]).with_suffix(".py")
        if (base / path).is_file():
            return "::".join([str(path), *parts[i:]])
        if (base / "tests" / path).is_file():
            return "::".join([str(Path("tests") / path), *parts[i:]])
    return context


@dataclass(frozen=True)
class Equivalent:
    """An entry of scripts/equivalent-mutants.toml."""

    key: str
    line: str  # the mutated source line, stripped, as it was when the reason was written
    reason: str


def load_equivalents(path: Path) -> dict[str, Equivalent]:
    entries = tomllib.loads(path.read_text()).get("mutant", []) if path.exists() else []
    return {e["key"]: Equivalent(e["key"], e.get("line", ""), e["reason"]) for e in entries}


def source_line(m: Mutant, root: Path = ROOT) -> str:
    """The line m mutates, stripped, in the checkout at root (a run judges its own copy, so an edit
    made to the working tree while it runs cannot make an entry look stale)."""
    return (root / m.file).read_text().splitlines()[m.line - 1].strip()


def judge(listed: Equivalent | None, m: Mutant, outcome: str, by: str, root: Path = ROOT) -> tuple[str, str]:
    """A run's outcome, given the mutant's entry in the equivalent list (if any)."""
    if listed is None:
        return outcome, by
    line = source_line(m, root)
    if listed.line != line:
        return "stale-equivalent", f"its line is now {line!r}; the reason was written for {listed.line!r}"
    if outcome in ("killed", "timeout"):
        return "killed-equivalent", f"{outcome} by {by}: listed as equivalent ({listed.reason})"
    return "equivalent", listed.reason


#: Outcomes that fail the run: the equivalent list claims what the tests or the code disprove.
WRONG_LIST = ("killed-equivalent", "stale-equivalent")


@dataclass
class Result:
    mutant: Mutant
    outcome: str  # killed, timeout, survived, uncovered, error, equivalent, killed-equivalent, stale-equivalent
    by: str = ""  # the first failing test, or why
    seconds: float = 0.0


#: The process groups of the runs in flight: each run and every process its tests start.
RUNNING: set[int] = set()
#: Set when the run is stopped: a test run it cut short is no outcome.
STOPPING = threading.Event()


class Stopped(Exception):
    """A test run ended by stopping the mutation run."""


def run_group(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float | None
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` in a process group of its own; when it ends, times out (TimeoutExpired) or the
    run is stopped, the whole group goes with it: a test's child processes too, never left behind.
    Its output goes to files, which a process it left behind cannot hold open the way a pipe is."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=out, stderr=err, start_new_session=True)
        RUNNING.add(proc.pid)
        try:
            proc.wait(timeout)
            if STOPPING.is_set():
                raise Stopped(cmd)
        finally:
            kill_group(proc.pid)
            proc.wait()
            RUNNING.discard(proc.pid)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


#: A test of a mutant's run fails once it takes this many times its own time in the coverage run
#: (at least HANG_FLOOR_S): a mutant that makes a test hang is killed by that test, within
#: seconds, instead of holding a job for the whole run's budget (the suite's own per-test
#: timeout is minutes).
HANG_FACTOR, HANG_FLOOR_S = 10, 30.0


def hang_timeout(seconds: Iterable[float]) -> float:
    """The timeout of a test that took `seconds` in the coverage run (the most of them)."""
    return max(HANG_FLOOR_S, HANG_FACTOR * max(seconds, default=1.0))


def tests_cmd(copy: Path, tests: list[str], per_test: dict[str, float]) -> tuple[list[str], dict[str, str]]:
    """The pytest run of `tests` in `copy` for one mutant: stops at the first failure, each test
    past its own timeout (`per_test`; scripts/mutate_timeouts.py) by the thread method."""
    cmd, env = pytest_cmd(
        copy, "-x", "-o", "addopts=--import-mode=importlib", "-o", "timeout_method=thread",
        "-p", "mutate_timeouts", "-rf", *tests,
    )  # fmt: skip
    env["PYTHONPATH"] += os.pathsep + str(copy / "scripts")  # the timeouts plugin
    env["DEVBRIDGE_MUTATE_TIMEOUTS"] = json.dumps(per_test)
    return cmd, env


def run_one(
    m: Mutant, copy: Path, tests: list[str], timeout: float, per_test: dict[str, float] | None = None
) -> tuple[str, str]:
    """Run `tests` against mutant `m` in `copy`: each test fails past its own `per_test` timeout
    (scripts/mutate_timeouts.py; the suite's 300 s for one not named), the run past `timeout`."""
    target = copy / m.file  # (the file the copy's package links to)
    original = target.read_text()
    target.write_text(m.apply(original))
    try:
        cmd, env = tests_cmd(copy, tests, per_test or {})
        run = run_group(cmd, copy, env, timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"no result in {timeout:.0f} s"
    finally:
        target.write_text(original)
    return verdict(run)


_GONE = ("ERROR: not found: ", "found no collectors for ")  # what pytest says of a test id it cannot collect


#: What pytest-timeout's thread method prints before it ends a run whose test ran past its timeout.
TIMED_OUT = "+ Timeout +"


def timed_out_in(output: str) -> str:
    """Which test the timeout's stack dump shows running (its first frame in a test file):
    ": tests/...::test_name", or "" when the dump names none."""
    for path, function in re.findall(r'File "([^"]+)", line \d+, in (\w+)', output.split(TIMED_OUT, 1)[1]):
        if os.path.basename(path).startswith("test_"):
            where = "tests/" + path.split("/tests/", 1)[1] if "/tests/" in path else os.path.basename(path)
            return f": {where}::{function}"
    return ""


def verdict(run: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """A mutant's outcome from its pytest run, and by what."""
    if run.returncode == 0:
        return "survived", ""
    if TIMED_OUT in run.stdout + run.stderr:
        return "timeout", f"a test ran past its own timeout{timed_out_in(run.stdout + run.stderr)}"
    if run.returncode in (1, 2):  # a test failed, or collecting one did (the mutant broke an import)
        failed = [ln.split()[1] for ln in run.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
        return "killed", failed[0] if failed else "a failure"
    if run.returncode < 0 or "Fatal Python error" in run.stderr:  # the mutant crashed the test process
        return "killed", f"crashed ({run.stderr.splitlines()[0] if run.stderr else run.returncode})"
    lines = (run.stdout + run.stderr).splitlines()
    gone = [ln.split(says, 1)[1].strip() for ln in lines for says in _GONE if says in ln]
    if run.returncode == 4 and gone:  # a test covering the line no longer exists: its parameters changed
        return "killed", f"tests gone ({gone[0]})"
    return "error", f"pytest exit {run.returncode}: {(run.stdout + run.stderr)[-300:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="+", default=list(FILES), choices=FILES, metavar="FILE")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--render", action="store_true", help="write the report from the log alone (with --resume)")
    parser.add_argument("--report", type=Path, default=ROOT / "scripts" / "mutation-report.md")
    parser.add_argument("--no-slow", action="store_true", help="skip the stateful second chance")
    parser.add_argument("--again", action="store_true", help="rerun what the last run (its log) did not kill")
    parser.add_argument("--resume", action="store_true", help="run only what the last run (its log) did not reach")
    parser.add_argument(
        "--keys", nargs="+", metavar="KEY", help="run only these mutants (their report keys); other outcomes stand"
    )
    args = parser.parse_args(argv)

    mutants = [m for f in args.files for m in mutants_of(f, (ROOT / f).read_text())]
    log = args.report.with_suffix(".jsonl")  # one line per finished mutant: a stopped run resumes
    kept: list[Result] = []
    if args.again or args.resume:
        before = {row["key"]: row for row in map(json.loads, log.read_text().splitlines())}
        kept = [
            Result(m, before[m.key]["outcome"], before[m.key]["by"])
            for m in mutants
            if reusable(m, before, args.resume)
        ]
        mutants = [m for m in mutants if not reusable(m, before, args.resume)]
    if args.keys:  # these again, whatever the log says of them; every other logged outcome stands
        before = {row["key"]: row for row in map(json.loads, log.read_text().splitlines())} if log.exists() else {}
        every = [m for f in args.files for m in mutants_of(f, (ROOT / f).read_text())]
        kept = [Result(m, before[m.key]["outcome"], before[m.key]["by"]) for m in every
                if m.key not in args.keys and reusable(m, before, True)]  # fmt: skip
        mutants = [m for m in every if m.key in args.keys]
        if len(mutants) != len(set(args.keys)):
            parser.error(f"no mutant of {args.files} has key {sorted(set(args.keys) - {m.key for m in mutants})}")
    if args.render:  # the report of what the log holds for today's code; nothing runs
        # (judged by today's equivalent list: a logged survivor listed since is what a run would call it)
        listed = load_equivalents(EQUIVALENT)
        kept = [Result(r.mutant, *judge(listed.get(r.mutant.key), r.mutant, r.outcome, r.by)) for r in kept]
        args.report.write_text(render(kept, [], 0.0, of=len(kept) + len(mutants)))
        print(args.report.read_text())
        return 0
    if args.list:  # reads the log (with --resume or --again: what is left to run), never writes it
        for m in mutants:
            print(f"{m.file}:{m.line}: {m.kind}: {m.original!r} -> {m.mutated!r}  [{m.function}]")
        print(f"{len(mutants)} mutants")
        return 0
    restart_log(log, args.files, kept)
    listed = load_equivalents(EQUIVALENT)

    work = Path(tempfile.mkdtemp(prefix="devbridge-mutate-"))
    started = time.monotonic()
    print(f"{len(mutants)} mutants in {len(args.files)} files; copies in {work}", flush=True)
    base = checkout_copy(work / "base")
    lines, seconds = coverage_map(base)
    print(f"coverage map: {len(seconds)} test functions, {time.monotonic() - started:.0f} s", flush=True)
    copies: list[Path] = [checkout_copy(work / f"job{k}") for k in range(args.jobs)]
    free: list[Path] = list(copies)
    lock = threading.Lock()

    kills: Counter[tuple[str, str, str]] = Counter()  # (file, function, test) -> mutants of that function it killed

    def tests_for(m: Mutant, slow: bool) -> list[str]:
        hit = set().union(*(lines[m.file].get(n, set()) for n in range(m.line, m.end_line + 1)))
        at_import = m.function == "<module>" or ("." not in m.function and m.function[:1].isupper())  # a class body
        if at_import:  # run at import, by whichever test imported the file first: every test of its code
            hit = set().union(*lines[m.file].values())
        chosen = [t for t in hit if t.startswith(SLOW) == slow]
        # what killed this function's other mutants first (a killed mutant stops at its first
        # failure), then fastest first; the order changes what runs, never the outcome
        return sorted(chosen, key=lambda t: (-kills[m.file, m.function, t], seconds.get(t, 1.0), t))

    def job(m: Mutant) -> Result:
        with lock:
            copy = free.pop()
        try:
            t0 = time.monotonic()
            outcome, by = "uncovered", "no test runs this line"
            for slow in (False, True):
                tests = tests_for(m, slow)
                if not tests or (slow and args.no_slow):
                    continue
                budget = 60 + 5 * sum(seconds.get(t, 1.0) for t in tests)
                per_test = {t: hang_timeout([seconds.get(t, 1.0)]) for t in tests}
                outcome, by = run_one(m, copy, tests, budget, per_test)
                if outcome != "survived":
                    break
            if outcome == "killed" and by.startswith("tests/"):
                with lock:
                    kills[m.file, m.function, by.split("[")[0]] += 1
            outcome, by = judge(listed.get(m.key), m, outcome, by, base)
            result = Result(m, outcome, by, time.monotonic() - t0)
            with lock, log.open("a") as out:
                out.write(_row(result) + "\n")
            if outcome not in ("killed", "timeout", "equivalent"):
                print(f"  {outcome}: {m.file}:{m.line} {m.original!r} -> {m.mutated!r}  key: {m.key}", flush=True)
            return result
        finally:
            with lock:
                free.append(copy)
                finished.append(m)
                if len(finished) % 25 == 0:
                    print(f"  {len(finished)}/{len(mutants)} run, {time.monotonic() - started:.0f} s", flush=True)

    finished: list[Mutant] = []
    with ThreadPoolExecutor(args.jobs) as pool:
        try:
            results = kept + list(pool.map(job, mutants))
        except BaseException:  # stopped (Ctrl-C, SIGTERM): the runs in flight end now, unlogged
            STOPPING.set()
            pool.shutdown(wait=False, cancel_futures=True)
            for group in list(RUNNING):
                kill_group(group)
            raise
    ran = {r.mutant.key for r in results}
    stale = sorted(k for k in listed if k not in ran and k.split("::")[0] in args.files)  # of the files run
    report = render(results, stale, time.monotonic() - started)
    args.report.write_text(report)

    print(report)
    shutil.rmtree(work, ignore_errors=True)
    wrong = [r for r in results if r.outcome in WRONG_LIST]
    if wrong or stale:
        print(f"the equivalent list is wrong: {len(wrong)} entries disproved, {len(stale)} match no mutant")
        return 1
    return 0


def restart_log(log: Path, files: list[str], kept: list[Result]) -> None:
    """The log a run starts from: the rows of the files it does not run, as they are, then the
    reusable rows of the files it runs (`kept`); what it runs is appended as it finishes."""
    lines = log.read_text().splitlines() if log.exists() else []
    others = [line for line in lines if json.loads(line)["file"] not in files]
    log.write_text("".join(line + "\n" for line in others) + "".join(_row(r) + "\n" for r in kept))


def reusable(m: Mutant, log: dict[str, dict[str, str]], resume: bool) -> bool:
    """A logged outcome stands for m while the code m lives in is what it ran on: all of them for
    --resume (a stopped run), kills and timeouts for --again (after new tests)."""
    row = log.get(m.key)
    if row is None or row.get("code") != m.code:
        return False
    return resume or row["outcome"] in ("killed", "timeout")


def _row(r: Result) -> str:
    return json.dumps({**asdict(r.mutant), "key": r.mutant.key, "outcome": r.outcome, "by": r.by})


def scores(results: list[Result]) -> Iterator[tuple[str, Counter[str], float]]:
    by_file: dict[str, Counter[str]] = defaultdict(Counter)
    for r in results:
        by_file[r.mutant.file][r.outcome] += 1
    for file in FILES:
        if file in by_file:
            c = by_file[file]
            killed = c["killed"] + c["timeout"] + c["killed-equivalent"]
            live = sum(c.values()) - c["equivalent"]
            yield file, c, 100.0 * killed / live if live else 100.0


def render(results: list[Result], stale: list[str], seconds: float, of: int | None = None) -> str:
    """The report; `of`: the mutants of today's code, when it is rendered from a log that may hold fewer."""
    done = f"{len(results)} mutants, {seconds / 60:.0f} min."
    if of is not None:
        done = f"{len(results)} of {of} mutants logged."
    out = ["# Mutation run", "", done, ""]
    out += ["| file | mutants | killed | timeout | survived | uncovered | equivalent | disproved | error | score |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for file, c, score in scores(results):
        wrong = sum(c[o] for o in WRONG_LIST)
        cells = [sum(c.values()), c["killed"], c["timeout"], c["survived"], c["uncovered"], c["equivalent"], wrong]
        cells.append(c["error"])
        out.append(f"| `{file}` | " + " | ".join(map(str, cells)) + f" | {score:.1f}% |")
    out += ["", "## Not killed", ""]
    for r in results:
        if r.outcome in ("survived", "uncovered", "error"):
            m = r.mutant
            out.append(f"- `{m.file}:{m.line}` {r.outcome}: `{m.original}` -> `{m.mutated}` in `{m.function}`"
                       f"{f' ({r.by})' if r.by and r.outcome != 'uncovered' else ''}  \n  key: `{m.key}`")  # fmt: skip
    disproved = [r for r in results if r.outcome in WRONG_LIST]
    if disproved:
        out += ["", "## Listed as equivalent, disproved (kill-tested or changed: mend the list)", ""]
        for r in disproved:
            out.append(f"- `{r.mutant.file}:{r.mutant.line}` {r.outcome}: {r.by}  \n  key: `{r.mutant.key}`")
    if stale:
        out += ["", "## Equivalent-list entries that match no mutant (remove them)", ""]
        out += [f"- `{k}`" for k in stale]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # stops as Ctrl-C does
    try:
        sys.exit(main())
    finally:
        STOPPING.set()
        for group in list(RUNNING):  # (the coverage run's, when stopped before the mutants)
            kill_group(group)
