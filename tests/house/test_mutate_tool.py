"""scripts/mutate's mutant maker: exactly the edits it claims, each still Python, keys stable."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mutate.py"


@pytest.fixture(scope="module")
def mutate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutate_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutate_script"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SOURCE = '''"""A docstring is not mutated."""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from x import y

LIMIT: int | None = 3


class Ring:
    """Nor a class docstring."""

    def take(self, n: int, flag: bool = False) -> int:
        if not (n < LIMIT) and flag:
            raise ValueError(f"too big: {n}")
        self.count += n
        self.log(n)
        for _ in range(2):
            break
        return -n
'''


def test_every_mutant_is_one_named_edit_of_the_source(mutate: ModuleType) -> None:
    found = [(m.function, m.kind, m.original, m.mutated, m.line) for m in mutate.mutants_of("x.py", SOURCE)]
    assert found == [
        ("<module>", "number", "3", "4", 7),
        ("Ring", "bool", "False", "True", 13),  # a default: evaluated where `take` is defined
        ("Ring.take", "not", "not (", "(", 14),
        ("Ring.take", "compare", "<", "<=", 14),
        ("Ring.take", "boolean", "and", "or", 14),
        ("Ring.take", "delete", 'raise ValueError(f"too big: {n}")', "pass", 15),
        ("Ring.take", "augassign", "+=", "-=", 16),
        ("Ring.take", "delete", "self.log(n)", "pass", 17),
        ("Ring.take", "number", "2", "3", 18),
        ("Ring.take", "loop", "break", "continue", 19),
        ("Ring.take", "return", "return -n", "return None", 20),
        ("Ring.take", "negate", "-", "", 20),
    ]  # annotations (`int | None`), TYPE_CHECKING imports, docstrings and f-strings are left alone


def test_a_mutant_changes_only_its_own_text(mutate: ModuleType) -> None:
    for m in mutate.mutants_of("x.py", SOURCE):
        mutated = m.apply(SOURCE)
        assert mutated[: m.start] == SOURCE[: m.start] and mutated[m.start + len(m.mutated) :] == SOURCE[m.end :]
        assert mutated.count("\n") == SOURCE.count("\n")  # every other line where it was


def test_keys_survive_edits_elsewhere_and_number_repeats(mutate: ModuleType) -> None:
    keys = [m.key for m in mutate.mutants_of("x.py", SOURCE)]
    moved = [m.key for m in mutate.mutants_of("x.py", "import os\n\n" + SOURCE)]
    assert keys == moved and len(set(keys)) == len(keys)
    twice = mutate.mutants_of("x.py", "def f(a, b):\n    return a < b or a < 2\n")
    assert [m.key for m in twice if m.kind == "compare"] == [
        "x.py::f::compare::< -> <=::0",
        "x.py::f::compare::< -> <=::1",
    ]


def test_a_logged_outcome_is_reused_only_while_its_code_is_unchanged(mutate: ModuleType) -> None:
    """--resume and --again key each logged outcome to a digest of the code its mutant lives in:
    an edit inside one function makes exactly that function's mutants run again."""
    source = SOURCE + "\n\ndef f(a, b):\n    return a < b or a < 2\n"
    edited = source.replace("a < 2", "a < 3")
    before = {m.key: m for m in mutate.mutants_of("x.py", source)}
    after = {m.key: m for m in mutate.mutants_of("x.py", edited)}
    changed = sorted({m.function for k, m in after.items() if k not in before or before[k].code != m.code})
    assert changed == ["f"] and {m.function for m in after.values()} == {"<module>", "Ring", "Ring.take", "f"}
    log = {k: {"outcome": "survived" if m.function == "f" else "killed", "code": m.code} for k, m in before.items()}
    for m in after.values():
        same = m.key in before and before[m.key].code == m.code
        assert mutate.reusable(m, log, resume=True) is same
        assert mutate.reusable(m, log, resume=False) is (same and m.function != "f")
    assert not mutate.reusable(next(iter(after.values())), {}, resume=True)
    # prose, comments and layout are not code: the digests stay
    reworded = source.replace('"""Nor a class docstring."""', '"""Reworded."""').replace(
        "def take(self, n: int, flag: bool = False) -> int:",
        'def take(self, n: int, flag: bool = False) -> int:\n        """Doc."""  # why',
    )
    assert reworded != source
    assert [m.code for m in mutate.mutants_of("x.py", reworded)] == [m.code for m in before.values()]


def test_listing_what_is_left_leaves_the_log_of_a_stopped_run_alone(
    mutate: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--list --resume` prints what a resumed run would run; the log it read stays byte for byte."""
    file = "bridge/events.py"
    first = mutate.mutants_of(file, (SCRIPT.parent.parent / file).read_text())[0]
    report = tmp_path / "report.md"
    log = report.with_suffix(".jsonl")
    row = mutate._row(mutate.Result(first, "killed", "tests/bridge/test_wait.py::test_x", 1.0)) + "\n"
    log.write_text(row)
    for extra in ([], ["--resume"], ["--again"]):
        assert mutate.main(["--list", "--files", file, "--report", str(report), *extra]) == 0
        assert log.read_text() == row
    listed = capsys.readouterr().out.splitlines()
    total = len(mutate.mutants_of(file, (SCRIPT.parent.parent / file).read_text()))
    assert listed.count(f"{total} mutants") == 1 and listed.count(f"{total - 1} mutants") == 2


def test_keys_pick_the_mutants_to_run_and_an_unknown_key_is_refused(
    mutate: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--keys` runs the named mutants only, whatever the log says of them; a key no mutant of
    the files has is a usage error."""
    file = "bridge/events.py"
    mutants = mutate.mutants_of(file, (SCRIPT.parent.parent / file).read_text())
    report = tmp_path / "report.md"
    report.with_suffix(".jsonl").write_text(mutate._row(mutate.Result(mutants[1], "killed", "t", 1.0)) + "\n")
    chosen = [mutants[1].key, mutants[3].key]
    assert mutate.main(["--list", "--files", file, "--report", str(report), "--keys", *chosen]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[-1] == "2 mutants" and [line.split(": ")[0] for line in listed[:-1]] == [
        f"{m.file}:{m.line}" for m in (mutants[1], mutants[3])
    ]
    with pytest.raises(SystemExit) as usage:
        mutate.main(["--list", "--files", file, "--report", str(report), "--keys", "bridge/events.py::nothing"])
    assert usage.value.code == 2 and "has key ['bridge/events.py::nothing']" in capsys.readouterr().err


def test_the_core_files_give_hundreds_of_mutants_and_every_listed_equivalent_is_one_on_its_line(
    mutate: ModuleType,
) -> None:
    """Every core file gives mutants, all still Python (mutants_of checks each), over a thousand
    in all. The equivalent list checked without a mutation run: an entry whose mutant is gone, or
    whose line changed since its reason was written, is an excuse for code it never read. (One
    test: making every mutant of every file takes most of its time.)"""
    root = SCRIPT.parent.parent
    made = {f: mutate.mutants_of(f, (root / f).read_text()) for f in mutate.FILES}
    counts = {f: len(ms) for f, ms in made.items()}
    assert all(n >= 5 for n in counts.values()) and sum(counts.values()) >= 1000, counts
    mutants = {m.key: m for ms in made.values() for m in ms}
    listed = mutate.load_equivalents(mutate.EQUIVALENT)
    assert listed and sorted(set(listed) - set(mutants)) == []
    assert {k: e.line for k, e in listed.items() if e.line != mutate.source_line(mutants[k])} == {}


def test_a_listed_mutant_counts_as_equivalent_only_while_it_survives_on_its_line(mutate: ModuleType) -> None:
    root = SCRIPT.parent.parent
    m = next(m for m in mutate.mutants_of("bridge/events.py", (root / "bridge/events.py").read_text()))
    here = mutate.source_line(m)
    entry = mutate.Equivalent(m.key, here, "nothing observes it")
    assert mutate.judge(None, m, "survived", "") == ("survived", "")
    assert mutate.judge(entry, m, "survived", "") == ("equivalent", "nothing observes it")
    assert mutate.judge(entry, m, "uncovered", "no test runs this line") == ("equivalent", "nothing observes it")
    killed = mutate.judge(entry, m, "killed", "tests/bridge/test_wait.py::test_x")
    assert killed[0] == "killed-equivalent" and "tests/bridge/test_wait.py::test_x" in killed[1]
    assert mutate.judge(entry, m, "timeout", "no result in 60 s")[0] == "killed-equivalent"
    moved = mutate.Equivalent(m.key, here + "  # changed", "nothing observes it")
    assert mutate.judge(moved, m, "survived", "")[0] == "stale-equivalent"
    assert mutate.judge(moved, m, "killed", "t")[0] == "stale-equivalent"
    assert {"killed-equivalent", "stale-equivalent"} == set(mutate.WRONG_LIST)


def test_a_mutants_outcome_is_read_from_its_pytest_run(mutate: ModuleType) -> None:
    import subprocess

    def run(code: int, out: str = "", err: str = "") -> tuple[str, str]:
        return mutate.verdict(subprocess.CompletedProcess([], code, out, err))  # type: ignore[no-any-return]

    assert run(0) == ("survived", "")
    failed = "FAILED tests/ring/test_ring.py::test_wraps - AssertionError\n"
    assert run(1, failed) == ("killed", "tests/ring/test_ring.py::test_wraps")
    assert run(-11, err="Fatal Python error: Segmentation fault\n") == (
        "killed",
        "crashed (Fatal Python error: Segmentation fault)",
    )
    gone = "ERROR: not found: /w/tests/backends/test_cl.py::test_x[CL]\n(no match in any of [<Module test_cl.py>])\n"
    assert run(4, out=gone) == ("killed", "tests gone (/w/tests/backends/test_cl.py::test_x[CL])")
    older = "ERROR: found no collectors for /w/tests/backends/test_cl.py::test_x[CL]\n"
    assert run(4, err=older) == ("killed", "tests gone (/w/tests/backends/test_cl.py::test_x[CL])")
    outcome, why = run(4, err="ERROR: usage: pytest [options]\n")  # any other usage error is the tool's own
    assert outcome == "error" and why.startswith("pytest exit 4: ")
    assert run(3)[0] == "error"
    dump = (
        "+++++++ Timeout +++++++\n~~~ Stack of MainThread ~~~\n"
        '  File "/v/lib/python3.11/site-packages/_pytest/python.py", line 159, in pytest_pyfunc_call\n'
        '  File "/tmp/m/job1/tests/ring/test_kill.py", line 88, in test_consumers_killed\n'
        '  File "/tmp/m/job1/tests/ring/support.py", line 9, in drain\n'
    )
    assert run(1, err=dump) == (
        "timeout",
        "a test ran past its own timeout: tests/ring/test_kill.py::test_consumers_killed",
    )
    assert run(1, err="+ Timeout +\n") == ("timeout", "a test ran past its own timeout")


def test_a_mutant_that_makes_a_test_hang_is_killed_by_that_test_at_its_own_timeout(
    mutate: ModuleType, tmp_path: Path
) -> None:
    """A hanging test fails at the per-test timeout (a few times its own time, at least 30 s),
    not at the run's budget: the mutant is killed by it."""
    assert mutate.hang_timeout([0.2, 1.5]) == 30.0 and mutate.hang_timeout([4.0, 0.1]) == 40.0
    (tmp_path / "test_hangs.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    cmd, env = mutate.pytest_cmd(tmp_path, "-x", "-o", "timeout=1", "-rf", "test_hangs.py")
    start = time.monotonic()
    run = mutate.run_group(cmd, tmp_path, env, 50.0)
    assert time.monotonic() - start < 30
    assert mutate.verdict(run) == ("killed", "test_hangs.py::test_hangs")


def test_a_test_that_swallows_its_timeout_is_ended_at_its_own_timeout_not_the_slowest_one_s(
    mutate: ModuleType, tmp_path: Path
) -> None:
    """A mutant can make a test loop where the signal method's exception is caught and the loop
    goes on: the thread method ends the run. Each test has its own timeout: a fast one listed
    beside a slow one is not given the slow one's."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT.parent / "mutate_timeouts.py", tmp_path / "scripts")
    (tmp_path / "test_loops.py").write_text(
        "import time\n\n"
        "def test_swallows():\n    while True:\n        try:\n            time.sleep(0.01)\n"
        "        except BaseException:\n            pass\n\n"
        "def test_slow():\n    time.sleep(0.1)\n"
    )
    per_test = {"test_loops.py::test_swallows": 1.0, "test_loops.py::test_slow": 60.0}
    cmd, env = mutate.tests_cmd(tmp_path, ["test_loops.py::test_swallows", "test_loops.py::test_slow"], per_test)
    start = time.monotonic()
    run = mutate.run_group(cmd, tmp_path, env, 50.0)
    assert time.monotonic() - start < 30
    assert mutate.verdict(run) == ("timeout", "a test ran past its own timeout: test_loops.py::test_swallows")


def test_the_readme_quotes_the_mutation_report_as_the_tool_wrote_it(mutate: ModuleType) -> None:
    """The README's mutation figures are the tool's own output: its summary line and per-file rows
    are lines of scripts/mutation-report.md (every row of it, in its order), and the run left
    no listed equivalent disproved."""
    root = SCRIPT.parent.parent
    report = (root / "scripts" / "mutation-report.md").read_text().splitlines()
    readme = (root / "README.md").read_text().splitlines()

    def file_rows(lines: list[str]) -> list[str]:
        return [line for line in lines if line.startswith("| `") and line.split("`")[1] in mutate.FILES]

    rows = file_rows(readme)
    assert rows and rows == file_rows(report)
    header = next(line for line in report if line.startswith("| file | mutants |"))
    assert readme[readme.index(rows[0]) - 2] == header
    summary = report[2]  # "1324 mutants, 95 min." or, rendered from a log, "305 of 1324 mutants logged."
    assert summary.split()[1] in ("mutants,", "of") and any(summary in line for line in readme)
    assert not any(line.startswith("## Listed as equivalent, disproved") for line in report)


def test_a_copy_imports_its_own_package_where_its_mutants_are_made(mutate: ModuleType, tmp_path: Path) -> None:
    """The copy a mutant is made in lays the package out over its folders as an editable install
    does (no folder of the checkout is named `devbridge`): its tests import the copy's files, so a
    mutant made there is the code they run, and the package finds the copy as its checkout."""
    import os
    import subprocess

    assert mutate.installed("statemachine/core.py") == "devbridge/statemachine/core.py"
    assert mutate.installed("api/types.py") == "devbridge/types.py"
    copy = mutate.checkout_copy(tmp_path / "copy")
    target = copy / "statemachine" / "runner.py"  # where a mutant is made
    target.write_text(target.read_text() + "\nMUTATED = True\n")
    probe = (
        "import devbridge.statemachine.runner as r, devbridge.checkout as c, pathlib; "
        "print(pathlib.Path(r.__file__).resolve(), r.MUTATED, c.package_checkout())"
    )
    env = {**os.environ, "PYTHONPATH": str(copy)}
    run = subprocess.run([sys.executable, "-c", probe], cwd=copy, env=env, capture_output=True, text=True)
    assert run.stdout.split() == [str(target.resolve()), "True", str(copy.resolve())], run.stderr


def _gone(pid: int) -> bool:
    """Whether process `pid` has ended (gone, or a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.mark.parametrize("times_out", [False, True])
def test_a_test_run_ends_every_process_it_started(mutate: ModuleType, tmp_path: Path, times_out: bool) -> None:
    """A mutant's tests start processes (the ring's kill tests do): when its run ends, or times
    out, those end with it, so a run never leaves work behind to slow the next."""
    pidfile = tmp_path / "grandchild"
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); "
        f"time.sleep({60 if times_out else 0})"
    )
    if times_out:  # (time enough to start both processes on a loaded machine, then it runs out)
        with pytest.raises(subprocess.TimeoutExpired):
            mutate.run_group([sys.executable, "-c", code], tmp_path, dict(os.environ), 5.0)
    else:
        assert mutate.run_group([sys.executable, "-c", code], tmp_path, dict(os.environ), 60.0).returncode == 0
    pid = int(pidfile.read_text())
    for _ in range(100):  # (a killed process is gone a moment after its signal)
        if _gone(pid):
            break
        time.sleep(0.05)
    assert _gone(pid), f"process {pid} outlived its run"
    assert not mutate.RUNNING


def test_a_run_of_some_files_keeps_the_logged_rows_of_the_others(mutate: ModuleType, tmp_path: Path) -> None:
    """`--files F --resume` starts its log from F's reusable rows and every other file's rows as
    they were: a run of one file never loses another's outcomes."""
    root = SCRIPT.parent.parent
    events, ring = (mutate.mutants_of(f, (root / f).read_text())[:2] for f in ("bridge/events.py", "ring/host.py"))
    log = tmp_path / "log.jsonl"
    rows = [mutate.Result(m, "killed", "tests/x.py::test_y") for m in (*events, *ring)]
    log.write_text("".join(mutate._row(r) + "\n" for r in rows))
    mutate.restart_log(log, ["bridge/events.py"], rows[:1])
    after = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["file"], r["key"]) for r in after] == [
        ("ring/host.py", ring[0].key),
        ("ring/host.py", ring[1].key),
        ("bridge/events.py", events[0].key),
    ]
