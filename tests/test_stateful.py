"""Hypothesis drives the Bridge and the reference model in lockstep (see stateful.py)."""

from __future__ import annotations

import os
import time

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from stateful import COVERAGE, BridgeMachine


def test_bridge_agrees_with_the_reference_model_and_covers_the_spec() -> None:
    """Runs under the active Hypothesis profile (`ci` by default, `thorough` for long runs)."""
    start = time.perf_counter()
    run_state_machine_as_test(BridgeMachine, settings=settings())
    COVERAGE.seconds = time.perf_counter() - start
    if os.environ.get("HYPOTHESIS_PROFILE") == "mutate":
        return  # scripts/mutate's short runs look for a failure; they are not sized to cover the spec
    assert COVERAGE.missing() == [], "spec candidates the stateful run never exercised"
    assert COVERAGE.missing_edges() == [], "hazard edges (ORDER-1) the stateful run never exercised"
    assert COVERAGE.refusals["ORDER-2"] > 0, "no call was refused for waiting on an open compute event"
