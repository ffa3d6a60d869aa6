"""The product speaks of itself only: no development history in the README, the documentation
site, docstrings, comments, help texts or benchmark output; history belongs in CHANGELOG.md."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Traces of how the code was made, not of what it is: issue numbers ("issue #13", "(#14,",
#: "#16's", "Deliver 4"), numbered sessions, work periods and stops, and commit hashes (a word
#: of 7 to 40 hex digits with a letter and a digit in it). An object's number in a message
#: ("allocation #3", "buffer #0") is the product speaking, and is not matched.
HISTORY = re.compile(
    r"\b[Ii]ssues? #?\d+|\(#\d+|#\d+'s|\bDeliver \d|\b[Ss]ession \d+|\bsession's\b|\b[Ss]top \d+"
    r"|\b[Ww]ork periods?\b|(?<![\w./\"'-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"
)

#: What a user reads: the README and the site (its generated pages included: the command line's
#: help texts and the benchmark page), and every file of the package and its tests (docstrings,
#: comments, help strings, what the benchmarks print).
#: the docs, every package folder (pyproject's package-dir) and the tests
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
PRODUCT_FOLDERS = ("docs", *PACKAGE_DIRS.values(), "tests")


def product_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "mkdocs.yml", ROOT / "pyproject.toml"]
    for folder in PRODUCT_FOLDERS:
        files += sorted(
            f
            for f in (ROOT / folder).rglob("*")
            if f.suffix in (".py", ".md", ".toml") and "__pycache__" not in f.parts
        )
    return [f for f in files if f != Path(__file__).resolve()]  # this file names what it looks for


@pytest.mark.parametrize(
    "text",
    [
        "against the main that issue #13 was filed on",
        "(#14, Deliver 4): the default bound",
        "issue #16's scaling figures",
        "Session 7 changed machine.py",
        "the session's first step",
        "stop 34 did not land",
        "numbered work periods",
        "--old 70c7a16",
        "the commit b043e11 before it",
        "a9f3c2d1e4b5a6c7d8e9f0a1b2c3d4e5f6a7b8c9",
    ],
)
def test_the_history_pattern_finds_each_kind_of_trace(text: str) -> None:
    assert HISTORY.search(text)


@pytest.mark.parametrize(
    "text",
    [
        "allocation #3 (generation 0) is freed",
        "buffer #0 freed twice",
        "pending event #1",
        'b"ab23456789"',
        "1048576 bytes in 12345678 ns",
        "see spec/CONTRACT.md#free-2",
        "0x7f3a9c0b12",
    ],
)
def test_the_history_pattern_leaves_what_the_product_says_alone(text: str) -> None:
    assert not HISTORY.search(text)


def test_no_development_history_in_the_product() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r}"
        for path in product_files()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        for m in HISTORY.finditer(line)
    ]
    assert found == []


def test_the_readme_fits_on_a_screen_and_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    fences = [n for n, line in enumerate(lines) if line.startswith("```")]
    first_code = lines[fences[0] + 1 : fences[1]]
    assert [c.split("#")[0].strip() for c in first_code] == ["bash scripts/demo", "bash scripts/test"]


def test_the_changelog_has_one_entry_per_release() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert releases[-1] == "0.1.0" and "0.2.0" in releases
    assert len(releases) == len(set(releases))
