"""The stateful test has teeth: every seeded bug is caught, with a shrunk counterexample."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable
from unittest import mock

import pytest
import stateful
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from mutants import KILLS, MUTANTS
from stateful import BridgeMachine

from devbridge.backends.fake import VIOLATION_KINDS, FakeViolation
from devbridge.models.coverage import Coverage
from devbridge.models.lockstep import CHECKS, FAKE_CHECKS, INVARIANT_CHECKS, Lockstep, kill_of
from devbridge.spec import load as load_spec
from devbridge.statemachine import default_table


def checks_run_by(method: Callable[..., None], seen: frozenset[str] = frozenset()) -> set[str]:
    """The lockstep checks a Lockstep method can fail with, read from its code: the check names in
    its `agree(...)` and `Disagreement(...)` calls and in those of the Lockstep methods it calls."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    found: set[str] = set()
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        f = call.func
        named = [a for a in call.args if isinstance(a, ast.Constant) and a.value in CHECKS]
        if isinstance(f, ast.Name) and f.id in ("agree", "Disagreement"):
            found |= {str(a.value) for a in named}
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
            callee = getattr(Lockstep, f.attr, None)
            if inspect.isfunction(callee) and f.attr not in seen:
                found |= checks_run_by(callee, seen | {f.attr})
    return found


#: Each invariant of the stateful machine -> the lockstep checks it runs (INVARIANT_CHECKS).
INVARIANTS = {
    name: method.spec_invariant
    for name, method in sorted(vars(BridgeMachine).items())
    if re.fullmatch(r"inv\d_\w+", name) and hasattr(method, "spec_invariant")
}
RUNS = {name: checks_run_by(INVARIANT_CHECKS[spec_id]) for name, spec_id in INVARIANTS.items()}


def test_one_invariant_per_spec_invariant_in_the_spec_order() -> None:
    """The lockstep's checks and the stateful machine's invariants are the spec's, in its order
    (Hypothesis runs invariants sorted by name), so a failure names the invariant it broke."""
    spec_order = list(load_spec().invariants)
    assert list(INVARIANT_CHECKS) == spec_order
    assert list(INVARIANTS.values()) == spec_order
    assert [int(name[3]) for name in INVARIANTS] == list(range(1, len(spec_order) + 1))


def test_the_checks_each_invariant_runs_are_read_from_the_code() -> None:
    assert {
        "inv1_counts": {"pending", "held", "submitted", "states", "pins"},
        "inv2_no_free_in_use": {"frees"},
        "inv3_free_once": {"frees"},
        "inv4_cursor": {"cursor", "release-status"},
        "inv5_output": {"host-view", "host-bytes", "readonly"},
        "inv6_exact": {"device-bytes"},
        "inv7_generation": set(),  # the fake raises its own `old-generation` where it happens
        "inv8_quiescent": {"leak"},
    } == RUNS


HUNT = settings(
    derandomize=True,
    database=None,
    max_examples=5000,
    stateful_step_count=30,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],  # not `explain`: it traces
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
    # a step is a call on the machine, maybe naming what it added to a bundle (`handles_0 = state.alloc(...)`)
    lines = [line for line in trace.splitlines() if re.match(r"([\w, ]+ = )?state\.", line)]
    steps = [re.sub(r"^[\w, ]+ = ", "", line) for line in lines]
    calls = [line for line in steps if not re.match(r"state\.(inv\d_\w+|teardown)\(", line)]
    last = steps[-1].removeprefix("state.").removesuffix("()")
    if re.fullmatch(r"inv\d_\w+", last):  # caught by an invariant after a step: the one running the check
        assert kill in RUNS.get(last, ()), (kill, steps[-1])
    # shrunk to a handful of calls (the same in any process and order: tests/conftest.py keeps
    # Hypothesis from drawing constants of whichever of our modules earlier tests loaded)
    assert 1 <= len(calls) <= 16, trace
    named = [line for line in lines if not re.search(r"state\.(inv\d_\w+|teardown)\(", line)]
    print(f"\n{name}: {type(caught.value).__name__}: {caught.value}\n" + "\n".join(named))


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


def test_each_kind_of_the_fakes_own_checks_belongs_to_one_invariant() -> None:
    owned = [kind for kinds in FAKE_CHECKS.values() for kind in kinds]
    assert sorted(owned) == sorted(VIOLATION_KINDS) and set(FAKE_CHECKS) <= set(INVARIANT_CHECKS)


@pytest.mark.parametrize("kind", VIOLATION_KINDS)
def test_a_swallowed_violation_of_the_fake_is_found_by_the_invariant_that_owns_it(kind: str) -> None:
    """The fake raises where a breach happens; if the bridge caught it, the invariant owning its
    kind raises it again after the step (and only that invariant)."""
    s = Lockstep(64)
    s.alloc(8, fails=False)
    with pytest.raises(FakeViolation):
        s.fake._violate(kind, "swallowed")
    raised = []
    for invariant in INVARIANT_CHECKS:
        try:
            s.check_invariant(invariant)
        except FakeViolation as e:
            assert kill_of(e) == f"fake:{kind}"
            raised.append(invariant)
    assert raised == [inv for inv, kinds in FAKE_CHECKS.items() if kind in kinds]
