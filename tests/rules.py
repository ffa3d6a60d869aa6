"""What backs a `rejects(RULE)` marker: the test asserts that the breach was kept the way the spec says.

A rule with an `error` (or a `kept_by` naming another rule) is kept by refusing the call:
`refused(rule)` checks the error's type and the rule it cites. A rule kept by deferring is
kept by a call that succeeds while the backend work waits: `deferred(rule, ops)` checks that
the backend op did not happen. A rule kept by logging: `logged(rule, records)`.

Each helper records the rule once its check passed; conftest fails a test whose `rejects`
markers name a rule it did not record, so CONTRACT.md's "Breach refused or deferred in" lists only
tests that assert the rule.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import pytest

from devbridge import errors
from devbridge.spec import load

RULES = load().rules

#: The rules the running test asserted a kept breach of (cleared by conftest before each test).
ASSERTED: set[str] = set()


def _keeper(rule: str, kept_by: str | None) -> None:
    want = RULES[rule].kept_by if RULES[rule].error is None else None
    assert want == kept_by, f"{rule} is kept by {RULES[rule].kept_by or 'refusing'}, not {kept_by or 'refusing'}"


def _cited(rule: str) -> str:
    """The rule a refused breach of `rule` cites (itself, or the rule its `kept_by` names)."""
    cited = RULES[rule].refused_as
    assert cited is not None, f"{rule} is kept by {RULES[rule].kept_by}, not by refusing"
    return cited


def assert_refused(error: BaseException | None, rule: str, kind: type[errors.BridgeError] | None = None) -> None:
    """`error` is the spec's refusal of a breach of `rule`: its error type (and `kind`, a
    narrower one), citing the refusing rule."""
    cited = _cited(rule)
    expected: type[errors.BridgeError] = getattr(errors, str(RULES[cited].error))
    assert isinstance(error, expected), f"{rule}: expected {expected.__name__}, got {error!r}"
    assert kind is None or isinstance(error, kind), f"{rule}: expected {kind.__name__}, got {error!r}"
    assert error.rule == cited, f"{rule}: expected an error citing {cited}, got {error.rule}: {error}"
    ASSERTED.add(rule)


@contextmanager
def refused(
    rule: str, kind: type[errors.BridgeError] | None = None, match: str | None = None
) -> Iterator[pytest.ExceptionInfo[errors.BridgeError]]:
    """The block raises the spec's refusal of a breach of `rule` (see `assert_refused`)."""
    with pytest.raises(errors.BridgeError, match=match) as info:
        yield info
    assert_refused(info.value, rule, kind)


@contextmanager
def deferred(rule: str, ops: Callable[[], Sequence[str]], held: str = "free") -> Iterator[None]:
    """The block returns normally and the backend op `held` (a free, a held-back copy) does not
    happen in it: the breach waits instead of happening."""
    _keeper(rule, "deferring")
    before = list(ops()).count(held)
    yield
    after = list(ops()).count(held)
    assert after == before, f"{rule}: the backend ran {held!r} {after - before} time(s) instead of deferring it"
    ASSERTED.add(rule)


def logged(rule: str, records: Sequence[logging.LogRecord], *, like: str) -> list[str]:
    """A WARNING on the `devbridge` logger reports the held allocation; returns the messages."""
    _keeper(rule, "logging")
    messages = [r.getMessage() for r in records if r.name == "devbridge" and r.levelno == logging.WARNING]
    assert any(like in m for m in messages), f"{rule}: no devbridge WARNING containing {like!r} in {messages}"
    ASSERTED.add(rule)
    return messages


def assert_each_refused(
    rule: str,
    calls: Sequence[Callable[[], object]],
    state: Callable[[], object],
    kind: type[errors.BridgeError] | None = None,
) -> list[errors.BridgeError]:
    """Each call raises the spec's refusal of a breach of `rule` (see `assert_refused`) and
    leaves `state()` as it was: nothing changed, no backend call (the fake's snapshot holds its
    call log). The errors, in order, for what a test checks beyond that."""
    before = state()
    raised = []
    for call in calls:
        with refused(rule, kind) as info:
            call()
        raised.append(info.value)
        assert state() == before, f"{rule}: a refused call changed something ({call})"
    return raised


def assert_all_refused(outcomes: Mapping[str, str], rule: str) -> None:
    """Every outcome, written "ErrorType RULE", is the refusal of a breach of `rule`."""
    cited = _cited(rule)
    assert dict(outcomes) == dict.fromkeys(outcomes, f"{RULES[cited].error} {cited}")
    ASSERTED.add(rule)


class MarkerAudit:
    """Checks each test's `rejects` markers against the rules it asserted.

    A marker sits on the test function; a parametrized function may split its rules among its
    cases (one case per rule). So each case must assert at least one of the marked rules, and the
    cases together all of them: checked at the function's last case, when the run selected
    every case of it.
    """

    def __init__(self) -> None:
        self.collected: Counter[str] = Counter()
        self.selected: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.asserted: dict[str, set[str]] = {}

    def collect(self, items: Sequence[pytest.Item], *, selected: bool) -> None:
        (self.selected if selected else self.collected).update(_function(i) for i in items)

    def finish(self, item: pytest.Item) -> list[str]:
        """The marked rules that `item` (with its function's earlier cases) failed to assert."""
        name = _function(item)
        asserted = self.asserted.setdefault(name, set())
        asserted |= ASSERTED
        self.finished[name] += 1
        marked = {rule for mark in item.iter_markers("rejects") for rule in mark.args}
        if marked and not marked & ASSERTED:
            return sorted(marked)
        whole = self.finished[name] == self.selected[name] == self.collected[name]
        return sorted(marked - asserted) if whole else []


def _function(item: pytest.Item) -> str:
    return item.nodeid.split("[", 1)[0]
