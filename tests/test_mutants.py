"""The stateful test has teeth: every seeded bug is caught, with a shrunk counterexample."""

from __future__ import annotations

import re
from unittest import mock

import pytest
import stateful
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from mutants import KILLS, MUTANTS
from stateful import BridgeMachine

from devbridge.backends.fake import VIOLATION_KINDS
from devbridge.models.coverage import Coverage
from devbridge.models.lockstep import CHECKS, kill_of
from devbridge.spec import load as load_spec
from devbridge.statemachine import default_table

#: The lockstep checks each invariant of the stateful machine runs (models.lockstep.INVARIANT_CHECKS).
RUNS = {
    "inv1_counts": ("pending", "held", "submitted", "states", "pins"),
    "inv2_no_free_in_use": ("frees",),
    "inv3_free_once": ("frees", "leak"),
    "inv4_cursor": ("cursor", "release-status"),
    "inv5_output": ("host-view", "host-bytes", "readonly"),
    "inv6_exact": ("device-bytes",),
}

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
    # caught by anything here; then it must be one of the checks the bug names (KILLS)
    with mock.patch.object(stateful, "COVERAGE", scratch), MUTANTS[name](), pytest.raises(Exception) as caught:
        run_state_machine_as_test(BridgeMachine, settings=HUNT)
    trace = "\n".join(getattr(caught.value, "__notes__", []))
    assert "state = BridgeMachine()" in trace, trace
    kill = kill_of(caught.value)
    assert kill in KILLS[name], f"{name} was caught by {kill}, not by {sorted(KILLS[name])}: {caught.value}"
    steps = [line for line in trace.splitlines() if line.startswith("state.")]
    calls = [line for line in steps if not re.match(r"state\.(inv\d_\w+|teardown)\(", line)]
    last = steps[-1].removeprefix("state.").removesuffix("()")
    if re.fullmatch(r"inv\d_\w+", last):  # caught by an invariant after a step: the one running the check
        assert kill in RUNS.get(last, ()), (kill, steps[-1])
    # shrunk to a handful of calls: how far depends on the process's history (double_backend_free
    # shrinks to 2 calls alone and to 10 after the checker's tests in one pytest run)
    assert 1 <= len(calls) <= 12, trace
    print(f"\n{name}: {type(caught.value).__name__}: {caught.value}\n" + "\n".join(calls))


def test_every_seeded_bug_names_checks_that_exist() -> None:
    """A kill names a lockstep check, a refusal or error of a spec rule, a kind of the fake's
    own checks, or a spec invariant: nothing a typo or an unrelated failure could match."""
    spec = load_spec()
    rules, invariants = set(spec.rules), set(spec.invariants)
    for name, kills in KILLS.items():
        for kill in kills:
            kind, _, rule = kill.partition(":")
            known = (
                kill in CHECKS
                or (kind in ("refused", "error") and rule in rules)
                or (kind == "fake" and rule in VIOLATION_KINDS)
                or kill in invariants
            )
            assert known, f"{name}: {kill}"


@pytest.mark.parametrize("name", sorted(MUTANTS))
@pytest.mark.parametrize(
    "unrelated",
    [TypeError("begin() got an unexpected keyword argument"), AssertionError("x"), KeyError(1), RuntimeError("x")],
    ids=type,
)
def test_an_unrelated_failure_does_not_count_as_the_kill(name: str, unrelated: BaseException) -> None:
    assert kill_of(unrelated) not in KILLS[name]
