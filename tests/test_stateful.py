"""Hypothesis drives the Bridge and the reference model in lockstep (see stateful.py)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from stateful import COVERAGE, BridgeMachine


def test_bridge_agrees_with_the_reference_model_and_covers_the_spec() -> None:
    run_state_machine_as_test(BridgeMachine, settings=settings())
    assert COVERAGE.missing() == [], "spec candidates the stateful run never exercised"
