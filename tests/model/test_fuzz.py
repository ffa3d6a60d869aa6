"""The hostile-API fuzzer (tests/model/fuzz.py), briefly: no public call lets anything but a
BridgeError escape, on the fake and on tinygrad's CPU device. `scripts/fuzz` runs it for minutes."""

from __future__ import annotations

import pytest
from fuzz import APIFuzz, TinygradCPUFuzz
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from devbridge import LifecycleError
from devbridge.statemachine.core import LifecycleCore


def test_no_call_on_the_fake_lets_anything_but_a_bridge_error_escape() -> None:
    run_state_machine_as_test(APIFuzz, settings=settings(max_examples=60, stateful_step_count=30))


def test_no_call_on_tinygrad_cpu_lets_anything_but_a_bridge_error_escape() -> None:
    run_state_machine_as_test(TinygradCPUFuzz, settings=settings(max_examples=20, stateful_step_count=20))


def test_the_fuzzer_finds_the_double_finish_in_poll_on_tinygrad_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test of the fuzzer: with the core's exactly-once guard gone (poll's loop, as it once was,
    ends again a use that an earlier settle in the same loop launched and the device ended at
    once) it finds the double finish (`scripts/fuzz` shrinks it to one object the worker's way:
    upload, compute not waited for, download held behind it, poll)."""
    monkeypatch.setattr(LifecycleCore, "ended", lambda self, use: False)
    with pytest.raises(LifecycleError, match=r"^\[EVENT-1\] use #\d+ is not in flight"):
        found = settings(max_examples=200, stateful_step_count=10, phases=[Phase.generate])  # found, not shrunk
        run_state_machine_as_test(TinygradCPUFuzz, settings=found)
