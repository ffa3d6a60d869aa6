"""The suite's own plugin (tests/plain_reports.py): a failure pytest cannot render is reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

UNRENDERABLE = """
import pytest

def test_unrenderable():
    def broken(self, excinfo):  # what a frame without a line number makes pytest do
        raise TypeError("unsupported operand type(s) for -: 'NoneType' and 'int'")
    pytest.Function.repr_failure = broken
    raise ValueError("the real failure")

def test_after_it():
    pass
"""


def run(tmp_path: Path, *plugin: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_unrenderable.py").write_text(UNRENDERABLE)
    args = ["-p", "no:cacheprovider", "-p", "no:randomly", "-n", "2", "-o", "addopts=", *plugin]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT / "tests"), "PATH": "/usr/bin:/bin"},
    )


def test_a_failure_pytest_cannot_render_is_reported_and_the_run_goes_on(tmp_path: Path) -> None:
    without = run(tmp_path)  # control: pytest alone stops the worker with an internal error
    assert "INTERNALERROR" in without.stdout + without.stderr and "1 failed" not in without.stdout
    got = run(tmp_path, "-p", "plain_reports")
    assert got.returncode == 1, got.stdout + got.stderr
    assert "INTERNALERROR" not in got.stdout + got.stderr
    assert "ValueError: the real failure" in got.stdout
    assert "(pytest could not render this failure: TypeError(" in got.stdout
    assert "1 failed, 1 passed" in got.stdout
