"""A pytest plugin for scripts/mutate's coverage run: each test's lines are recorded under its
node id (coverage.py's own `test_function` context would name Hypothesis' inner `test_function`)."""

from __future__ import annotations

import coverage
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    current = coverage.Coverage.current()
    if current is not None:
        current.switch_context(item.nodeid.split("[", 1)[0])  # per test function: one run covers its cases
