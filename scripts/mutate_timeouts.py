"""A pytest plugin for scripts/mutate's run of a mutant's tests: each test fails once it runs past
its own timeout (DEVBRIDGE_MUTATE_TIMEOUTS: {test function id: seconds}), not the slowest one's,
and by pytest-timeout's thread method, which ends the run: a mutant can make a test loop where
the signal method's exception is caught and the loop goes on."""

from __future__ import annotations

import json
import os

import pytest

TIMEOUTS: dict[str, float] = json.loads(os.environ.get("DEVBRIDGE_MUTATE_TIMEOUTS", "{}"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        seconds = TIMEOUTS.get(item.nodeid.split("[", 1)[0])
        if seconds is not None:  # first: it wins over a test's own timeout mark
            item.add_marker(pytest.mark.timeout(seconds, method="thread"), append=False)
