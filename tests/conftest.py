"""Shared fixtures: a fresh FakeBackend, a Bridge over it, a HostRing."""

from __future__ import annotations

import os
import sys
from collections.abc import Generator

import pytest
import rules
import tinygrad  # noqa: F401  # imported first: it raises the recursion limit, which Hypothesis would warn about
from hypothesis import HealthCheck, settings
from hypothesis.internal.conjecture import providers

from devbridge import Bridge, HostRing
from devbridge.backends.fake import FakeBackend

# Hypothesis draws, now and then, a literal constant found in the loaded modules of the project
# under test (its "local constants"), so a derandomized run's examples depended on which of our
# modules the process had imported before it: on the tests that ran earlier (importing
# devbridge.cli.main alone took one mutant hunt from 969 machines to 832). No local constants: the
# same examples in every process and order. (Hypothesis is pinned; tests/model/test_reproducible.py checks
# that this hook is still there.)
providers._get_local_constants = lambda: providers.Constants()


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def bridge(fake: FakeBackend) -> Bridge:
    return Bridge(fake)


@pytest.fixture
def ring() -> HostRing:
    return HostRing(1024)


AUDIT = rules.MarkerAudit()


#: The folders whose tests take longest first: with one test at a time to whichever worker is
#: free, a minute-long search that starts last leaves the other workers idle while it runs.
LONGEST_FIRST = ("model", "house", "apps", "ring")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    AUDIT.collect(items, selected=False)  # before -k, -m and --deselect drop any
    rank = {folder: n for n, folder in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.parent.name, len(rank)))  # stable: files keep their order


def pytest_collection_finish(session: pytest.Session) -> None:
    AUDIT.collect(session.items, selected=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """A `rejects(RULE)` marker counts only if the test asserted the kept breach (tests/rules.py)."""
    rules.ASSERTED.clear()
    try:
        result = yield
    finally:
        unasserted = AUDIT.finish(item)
    if unasserted:
        pytest.fail(
            f"marked rejects({', '.join(unasserted)}) but asserts no kept breach of it (tests/rules.py)", pytrace=False
        )
    return result


# Hypothesis profiles: `ci` (derandomized, sized for a few minutes on 2 cores) is the
# default; `thorough` is for long local runs: HYPOTHESIS_PROFILE=thorough pytest tests/model/test_stateful.py
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,  # the same examples on every machine: no replay of local failures
    max_examples=2000,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.register_profile(
    "thorough",
    derandomize=False,
    max_examples=25_000,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the stateful run's spec coverage table when it ran."""
    stateful = sys.modules.get("stateful")
    if stateful is not None and stateful.COVERAGE.hits:
        terminalreporter.write_sep("=", "spec coverage of the stateful run")
        terminalreporter.write_line(stateful.COVERAGE.report())


# `mutate`: scripts/mutate's second chance for a surviving mutant, seconds per run.
settings.register_profile("mutate", settings.get_profile("ci"), max_examples=200, stateful_step_count=30)
# `explore`: like `ci` but randomized, to check that `ci`'s coverage does not hang on one seed.
settings.register_profile("explore", settings.get_profile("ci"), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
