"""The hostile-API fuzzer (tests/fuzz.py), briefly: no public call lets anything but a
BridgeError escape, on the fake and on tinygrad's CPU device. `scripts/fuzz` runs it for minutes."""

from __future__ import annotations

import pytest
from fuzz import APIFuzz, TinygradCPUFuzz
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from devbridge import Bridge, LifecycleError


def test_no_call_on_the_fake_lets_anything_but_a_bridge_error_escape() -> None:
    run_state_machine_as_test(APIFuzz, settings=settings(max_examples=60, stateful_step_count=30))


def test_no_call_on_tinygrad_cpu_lets_anything_but_a_bridge_error_escape() -> None:
    run_state_machine_as_test(TinygradCPUFuzz, settings=settings(max_examples=20, stateful_step_count=20))


def poll_before_the_fix(self: Bridge) -> int:
    """Bridge.poll as it was: its loop finished again an event that an earlier finish in the same
    loop had launched and the device had ended at once (then a KeyError out of a public call; now
    the core refuses to end a use twice, EVENT-1)."""
    with self._lock:
        finished = self._drain()
        for use in list(self._core.inflight()):
            if (event := use.event) is not None and self._ready(event):
                status = self._query(event.backend_token)
                if status.done:
                    self._finish(event, status)
                    finished += 1
        return finished


def test_the_fuzzer_finds_the_double_finish_in_poll_on_tinygrad_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test of the fuzzer: with poll's old loop put back it finds the double finish (`scripts/fuzz`
    shrinks it to one object the worker's way: upload, compute not waited for, download held
    behind it, poll)."""
    monkeypatch.setattr(Bridge, "poll", poll_before_the_fix)
    with pytest.raises(LifecycleError, match=r"^\[EVENT-1\] use #\d+ is not in flight"):
        found = settings(max_examples=200, stateful_step_count=10, phases=[Phase.generate])  # found, not shrunk
        run_state_machine_as_test(TinygradCPUFuzz, settings=found)
