"""Every shell command of the README and the docs, as a user would type it.

Each command line of a ```bash block is either run verbatim (from the checkout's root, with the
virtual environment's programs first on PATH) and must exit 0, or, where CI cannot afford it
(hours, a GPU, CI's own command), has its reason here and is checked against its program: the
program exists and every `--flag` the line uses is one its `--help` names. A new block must be
classified here: an unclassified or vanished line fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BIN = Path(sys.executable).parent

#: Run verbatim: the line -> its timeout in seconds.
RUN = {
    "devbridge docs --check": 120,
    ".venv/bin/python scripts/package_tree.py": 300,
    (
        "devbridge check --tier values --values-depth all --allocations 1 --restarts 1 --in-flight 2 "
        "--spans 0:8 --ring 8"
    ): 300,
    "devbridge check --profile narrow --tier lockstep --depth 4 --test-out test_cx.py": 300,
    "scripts/mutate --list": 120,
    "python bench/queue_latency.py --device CL --busy 1.0 --rounds 6": 300,
    "devbridge demo --device CPU:0,CPU:1": 300,
    "devbridge demo --objects 300 --faults 0.05 --restart-every 50 --trace /tmp/t.json": 300,
}

#: Not run in CI, each for its reason: the line -> (the help that must name its flags, why).
CHECKED = {
    "bash scripts/demo": ("devbridge demo --help", "set-up plus the demo: CI's own set-up runs the first half"),
    "bash scripts/test": ("pytest --help", "CI's own command: .ci/run runs it"),
    "bash scripts/test -k ring": ("pytest --help", "CI's own command, with pytest's arguments"),
    "bash scripts/test -n 0": ("pytest --help", "CI's own command, with pytest's arguments"),
    "devbridge docs": (
        "devbridge docs --help",
        "writes spec/CONTRACT.md and docs/diagrams/ in the checkout: `--check` runs it",
    ),
    "devbridge check": ("devbridge check --help", "the default bound takes a minute per CPU"),
    "scripts/mutate": ("scripts/mutate --help", "two hours"),
    ".venv/bin/python scripts/docs_shots.py --keep": (
        ".venv/bin/python scripts/docs_shots.py --help",
        "needs Chromium, which CI does not install",
    ),
    "scripts/mutate --files ring/host.py": ("scripts/mutate --help", "a quarter of an hour"),
    "scripts/mutate --resume": ("scripts/mutate --help", "continues a run CI never started"),
    "scripts/mutate --again": ("scripts/mutate --help", "reruns a run CI never made"),
    "scripts/fuzz --minutes 10": ("scripts/fuzz --help", "ten minutes"),
    "scripts/fuzz --minutes 10 --backend cpu": ("scripts/fuzz --help", "ten minutes"),
    "bash scripts/gpu_check.sh": ("bash -n scripts/gpu_check.sh", "needs a GPU"),
    "bash scripts/gpu_check.sh NV CUDA": ("bash -n scripts/gpu_check.sh", "needs a GPU"),
    "bash scripts/gpu_check.sh CL": ("bash -n scripts/gpu_check.sh", "minutes of suites on OpenCL"),
    "pip install -e '.[ray]'": ("pip install --help", "installs from the network"),
    "devbridge trace /tmp/t.json --check --png /tmp/t.png": (
        "devbridge trace --help",
        "reads what the demo line above writes: tests/apps/test_timeline.py runs it on a demo's trace",
    ),
    "devbridge fleet --workers 2 --kill-every 200": ("devbridge fleet --help", "Ray actors: test_fleet runs them"),
}


def command_lines() -> list[str]:
    """Every command line of the pages' shell blocks, its trailing comment dropped."""
    lines: list[str] = []
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                command = re.split(r"\s{2,}#", line)[0].strip()
                if command and not command.startswith("#"):
                    lines.append(command)
    return lines


def shell(command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_every_command_line_is_run_or_checked_here() -> None:
    found = set(command_lines())
    assert not RUN.keys() & CHECKED.keys()
    assert found - RUN.keys() - CHECKED.keys() == set(), "classify the new lines in RUN or CHECKED"
    assert RUN.keys() | CHECKED.keys() <= found, "lines no page has any more"


@pytest.mark.parametrize("command", sorted(RUN))
def test_a_command_line_runs_as_written(command: str) -> None:
    run = shell(command, RUN[command])
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]


@pytest.mark.parametrize("command", sorted(CHECKED))
def test_a_command_line_ci_cannot_afford_names_a_real_program_and_real_flags(command: str) -> None:
    helper, reason = CHECKED[command]
    assert reason
    run = shell(helper, 120)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    flags = [word.split("=")[0] for word in shlex.split(command) if word.startswith("-")]
    missing = [flag for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", run.stdout)]
    assert not missing, f"{helper} does not name {missing}"
