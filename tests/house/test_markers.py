"""A `rejects(RULE)` marker counts only if its test asserts the kept breach (tests/rules.py).

Runs a throw-away test file under this suite's own conftest in a child pytest, so each marker
mistake is shown to fail the run, for the reason the audit gives.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]  # the shared conftest and rules

CASES = """
import pytest
from rules import deferred, refused

from devbridge import Bridge, DeviceHandle, DeviceRange, HostRing, InvalidHandleError, ObjectSpec
from devbridge.backends.fake import FakeBackend

U8 = ObjectSpec("blob", "uint8")


def forged() -> DeviceHandle:
    return DeviceHandle(7, 0, 8, U8, owner=0)


@pytest.mark.rejects("HANDLE-1")
def test_raises_but_never_checks_the_rule() -> None:
    with pytest.raises(InvalidHandleError):
        Bridge(FakeBackend()).free_device(forged())


@pytest.mark.rejects("HANDLE-1")
def test_asserts_the_rule() -> None:
    with refused("HANDLE-1"):
        Bridge(FakeBackend()).free_device(forged())


@pytest.mark.rejects("FREE-2")
def test_asserts_another_rule_than_it_is_marked_with() -> None:
    with refused("HANDLE-1"):
        Bridge(FakeBackend()).free_device(forged())


@pytest.mark.rejects("HANDLE-1")
def test_the_call_breaks_a_different_rule() -> None:
    bridge = Bridge(FakeBackend())
    with refused("HANDLE-1"):
        bridge.alloc_device(U8, -1)


@pytest.mark.rejects("H2D-2")
def test_a_rule_refused_as_another() -> None:
    bridge, ring = Bridge(FakeBackend()), HostRing(64)
    h = bridge.alloc_device(U8, 8)
    src = ring.reserve(8)
    bridge.host_to_device(src, DeviceRange(h, 0, 8))
    with refused("H2D-2"):  # released by the sync copy: RING-3 refuses it
        bridge.host_to_device(src, DeviceRange(h, 0, 8))


@pytest.mark.rejects("FREE-1")
def test_a_free_that_was_not_deferred() -> None:
    fake = FakeBackend()
    bridge = Bridge(fake)
    h = bridge.alloc_device(U8, 8)
    with deferred("FREE-1", fake.ops):
        bridge.free_device(h)  # idle: freed at once


@pytest.mark.rejects("HANDLE-1", "RANGE-1")
@pytest.mark.parametrize("rule", ["HANDLE-1", "RANGE-1"])
def test_cases_that_split_their_rules(rule: str) -> None:
    bridge = Bridge(FakeBackend())
    with refused(rule):
        if rule == "HANDLE-1":
            bridge.free_device(forged())
        else:
            DeviceRange(bridge.alloc_device(U8, 8), 4, 8)


@pytest.mark.rejects("HANDLE-1", "RANGE-1")
@pytest.mark.parametrize("k", [1, 2])
def test_cases_that_miss_one_of_their_rules(k: int) -> None:
    with refused("HANDLE-1"):
        Bridge(FakeBackend()).free_device(forged())
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("COLUMNS", "400")  # the child's summary lines whole, not cut at 80
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(rules=(TESTS / "rules.py").read_text(), test_cases=CASES)
    pytester.makeini("[pytest]\nmarkers =\n    holds(*ids): .\n    rejects(*ids): .\n")
    return pytester


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    """{test name: "passed" | "failed: <first line of why>"} from `-rA` output."""
    found: dict[str, str] = {}
    for line in result.outlines:
        for word in ("PASSED", "FAILED"):
            if line.startswith(word + " "):
                name, _, why = line[len(word) + 1 :].partition(" - ")
                found[name.split("::")[-1]] = word.lower() + (f": {why.removeprefix('Failed: ')}" if why else "")
    return found


def test_a_rejects_marker_fails_its_test_unless_the_rule_is_asserted(suite: pytest.Pytester) -> None:
    got = outcomes(suite.runpytest_subprocess("-rA", "-p", "no:cacheprovider", "-q"))
    assert got == {
        "test_raises_but_never_checks_the_rule": (
            "failed: marked rejects(HANDLE-1) but asserts no kept breach of it (tests/rules.py)"
        ),
        "test_asserts_the_rule": "passed",
        "test_asserts_another_rule_than_it_is_marked_with": (
            "failed: marked rejects(FREE-2) but asserts no kept breach of it (tests/rules.py)"
        ),
        "test_the_call_breaks_a_different_rule": (
            "failed: AssertionError: HANDLE-1: expected InvalidHandleError, got RangeError("
            "'[ALLOC-1] extent must be an int in [1, 2**48], got -1 (see spec/CONTRACT.md#alloc-1)')"
        ),
        "test_a_rule_refused_as_another": "passed",
        "test_a_free_that_was_not_deferred": (
            "failed: AssertionError: FREE-1: the backend ran 'free' 1 time(s) instead of deferring it"
        ),
        "test_cases_that_split_their_rules[HANDLE-1]": "passed",
        "test_cases_that_split_their_rules[RANGE-1]": "passed",
        "test_cases_that_miss_one_of_their_rules[1]": "passed",
        "test_cases_that_miss_one_of_their_rules[2]": (
            "failed: marked rejects(RANGE-1) but asserts no kept breach of it (tests/rules.py)"
        ),
    }


def test_a_run_that_selects_some_cases_checks_each_case_alone(suite: pytest.Pytester) -> None:
    """Each selected case must assert one of its function's rules; all of them only when every
    case ran (a -k run cannot see the others)."""
    got = outcomes(suite.runpytest_subprocess("-rA", "-p", "no:cacheprovider", "-q", "-k", "RANGE or miss"))
    assert got == {
        "test_cases_that_split_their_rules[RANGE-1]": "passed",
        "test_cases_that_miss_one_of_their_rules[1]": "passed",
        "test_cases_that_miss_one_of_their_rules[2]": (
            "failed: marked rejects(RANGE-1) but asserts no kept breach of it (tests/rules.py)"
        ),
    }
