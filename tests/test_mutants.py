"""The stateful test has teeth: every seeded bug is caught, with a shrunk counterexample."""

from __future__ import annotations

from unittest import mock

import pytest
import stateful
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from mutants import MUTANTS
from stateful import BridgeMachine

from devbridge.models.coverage import Coverage
from devbridge.statemachine import default_table

HUNT = settings(
    derandomize=True,
    database=None,
    max_examples=2000,
    stateful_step_count=30,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_seeded_bug_is_caught_with_a_shrunk_counterexample(name: str) -> None:
    scratch = Coverage(default_table())  # mutant runs do not count towards the spec coverage
    with mock.patch.object(stateful, "COVERAGE", scratch), MUTANTS[name](), pytest.raises(Exception) as caught:
        run_state_machine_as_test(BridgeMachine, settings=HUNT)
    trace = "\n".join(getattr(caught.value, "__notes__", []))
    assert "state = BridgeMachine()" in trace, trace
    invariants = {"agrees_with_the_model", "teardown"}
    calls = [
        line for line in trace.splitlines()
        if line.startswith("state.") and line[6:].split("(")[0] not in invariants
    ]  # fmt: skip
    # shrunk to a handful of calls: how far depends on the process's history (double_backend_free
    # shrinks to 2 calls alone and to 10 after the checker's tests in one pytest run)
    assert 1 <= len(calls) <= 12, trace
    print(f"\n{name}: {type(caught.value).__name__}: {caught.value}\n" + "\n".join(calls))
