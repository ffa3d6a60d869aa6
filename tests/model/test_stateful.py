"""Hypothesis drives the Bridge and the reference model in lockstep (see stateful.py)."""

from __future__ import annotations

import os
import time

from hypothesis import settings
from stateful import COVERAGE, BridgeMachine, InOrderBridgeMachine


class TestBridgeMachine(BridgeMachine.TestCase):  # type: ignore[misc,valid-type]
    """The machine as Hypothesis runs it, a unittest TestCase, under the active profile (`ci` by
    default, `thorough` for long runs) with three quarters of its examples; then the spec
    coverage the run must have reached. (Sized by what it finds: under `ci` the coverage below
    is complete after about 1,000 of the 1,500 examples; the seeded bugs of test_mutants.py
    have their own, longer hunts.)"""

    settings = settings(max_examples=max(1, settings().max_examples * 3 // 4))

    def runTest(self) -> None:
        start = time.perf_counter()
        super().runTest()
        COVERAGE.seconds = time.perf_counter() - start
        if os.environ.get("HYPOTHESIS_PROFILE") == "mutate":
            return  # scripts/mutate's short runs look for a failure; they are not sized to cover the spec
        assert COVERAGE.missing() == [], "spec candidates the stateful run never exercised"
        assert COVERAGE.missing_edges() == [], "hazard edges (ORDER-1) the stateful run never exercised"
        assert COVERAGE.refusals["ORDER-2"] > 0, "no call was refused for waiting on an open compute event"


class TestInOrderBridgeMachine(InOrderBridgeMachine.TestCase):  # type: ignore[misc,valid-type]
    """The machine on an in-order queue that reads host bytes late, under the active profile with
    a quarter of its examples (the any-order run above covers the spec; this one, the queue)."""

    settings = settings(max_examples=max(1, settings().max_examples // 4))
