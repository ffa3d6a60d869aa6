"""A derandomized Hypothesis run draws the same examples whatever the process imported before it.

Hypothesis draws, now and then, a literal constant from the loaded modules of the project under
test; tests/conftest.py turns that off, so the mutant hunts and the stateful run do not depend on
which tests ran earlier in the same process (pytest-xdist hands tests out in any order)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def draws() -> list[int]:
    seen: list[int] = []

    @settings(derandomize=True, database=None, max_examples=400)
    @given(st.integers(0, 1 << 16))
    def record(x: int) -> None:
        seen.append(x)

    record()
    return seen


def test_importing_a_module_full_of_constants_changes_no_draw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = draws()
    constants = ", ".join(str(40_000 + 7 * i) for i in range(200))
    (tmp_path / "constants_for_hypothesis.py").write_text(f"VALUES = [{constants}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("constants_for_hypothesis")
    after = draws()
    assert after == before
    assert not {40_000 + 7 * i for i in range(200)} & set(after)
