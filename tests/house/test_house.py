"""The house a newcomer moves into: a README that stays inside the repository, a set-up that
is quiet when there is nothing to do."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_names_no_path_outside_the_repository() -> None:
    text = (ROOT / "README.md").read_text()
    outside = re.findall(r"(?:\.\./|/work/|/tmp/|/root/|/home/|/opt/)[\w./-]*", text)
    assert outside == []
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not re.match(r"https?://", link):
            assert (ROOT / link).exists(), link


def test_setup_run_again_is_one_quiet_line() -> None:
    setup = ["bash", str(ROOT / "scripts" / "setup")]
    subprocess.run(setup, check=True, capture_output=True, timeout=600)  # whatever the state was
    again = subprocess.run(setup, capture_output=True, text=True, timeout=60)
    assert (again.returncode, again.stdout, again.stderr) == (0, "devbridge setup: up to date\n", "")
