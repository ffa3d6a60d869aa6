"""`devbridge trace FILE`: a written trace read back, summarized, checked against the spec and
drawn as a PNG; the picture the docs show is one such drawing of a demo with faults and restarts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devbridge.apps import timeline
from devbridge.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "t.json"
    argv = ["demo", "--backend", "fake", "--objects", "120", "--faults", "0.05", "--restart-every", "40"]
    assert main([*argv, "--no-progress", "--trace", str(path)]) == 0
    return path


def test_a_trace_reads_back_into_each_bridges_spans(trace: Path) -> None:
    events = timeline.read(trace)
    (line,) = timeline.timelines(events).values()
    assert line.label == f"bridge #{events[0]['pid']} (faulty(fake))"
    spans = [s for states in line.states.values() for s in states]
    assert spans and all(start <= end for start, end, _ in spans)
    assert {"copy_in", "copy_out", "compute"} <= set(line.uses) and line.faults and line.memory
    assert min(b for _, b in line.memory) >= 0


def test_the_trace_command_summarizes_checks_and_draws(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.png"
    assert main(["trace", str(trace), "--check", "--png", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{len(timeline.read(trace))} events; bridges 1, allocations ")
    assert "restarts 2," in text and f"wrote {out}" in text and "follows the spec" in text
    assert out.read_bytes().startswith(PNG) and out.stat().st_size > 10_000


def test_a_trace_a_killed_process_left_unterminated_still_reads(trace: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.json"
    text = trace.read_text()
    cut.write_text(text[: text.rindex("\n]")] + ",")  # as the writer leaves it mid-run
    assert timeline.read(cut) == json.loads(text)


def test_the_check_exits_1_naming_what_breaks_the_spec(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [e for e in timeline.read(trace) if e["ph"] != "E"]  # no span ever ends
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(events))
    assert main(["trace", str(broken), "--check"]) == 1
    assert "never end" in capsys.readouterr().out
    assert main(["trace", str(tmp_path / "missing.json")]) == 2


def test_the_docs_show_a_drawing_of_a_demo_with_faults_and_restarts() -> None:
    page = (ROOT / "docs" / "guides" / "tracing.md").read_text()
    assert "![" in page and "(tracing.png)" in page
    assert (ROOT / "docs" / "guides" / "tracing.png").read_bytes().startswith(PNG)


GOOD = {"ph": "b", "name": "copy_in", "cat": "copy_in", "id": 3, "pid": 7, "tid": 1001, "ts": 5.0}


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ([1, 2], "event 0 is no trace event: int, not an object"),
        ("[" * 100_000 + "]" * 100_000, "maximum recursion depth exceeded"),
        ({"traceEvents": []}, "Extra data"),  # (a trace is a list: its closing bracket is looked for)
        ([GOOD, {**GOOD, "name": 5}], "event 1 is no trace event: its 'name' is 5, not str"),
        ([{**GOOD, "pid": []}], "its 'pid' is [], not int"),
        ([{**GOOD, "tid": True}], "its 'tid' is True, not int"),
        ([{**GOOD, "ts": "later"}], "its 'ts' is 'later', not a finite number"),
        ([{**GOOD, "id": [1]}], "its 'id' is [1]"),
        ([{k: v for k, v in GOOD.items() if k != "cat"}], "an async event with no 'cat'"),
        ([{**GOOD, "args": 4}], "its 'args' is 4, not dict"),
        ([{**GOOD, "ph": "M", "name": "process_name", "args": {}}], "a process name with no 'name' in its args"),
        (
            [{**GOOD, "ph": "C", "name": "device bytes in use", "args": {"bytes": "x"}}],
            "memory counter with no 'bytes'",
        ),
    ],
)
def test_a_file_of_other_events_is_refused_naming_the_first_wrong_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: object, why: str
) -> None:
    """A trace file is read as untrusted input: every command exits 2 with one line, never a
    Python error from deep in the summary, the check or the drawing."""
    path = tmp_path / "t.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    for flags in ([], ["--check"], ["--png", str(tmp_path / "t.png")]):
        assert main(["trace", str(path), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"devbridge trace: cannot read {path}: ") and why in err[0], err
    assert not (tmp_path / "t.png").exists()
