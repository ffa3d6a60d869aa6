"""The spec loads, is complete and sound, and the loader refuses broken variants."""

from __future__ import annotations

import copy
import tomllib
from typing import Any

import pytest

from devbridge import errors
from devbridge.spec import SPEC_PATH, SpecError, load, parse


def raw() -> dict[str, Any]:
    with open(SPEC_PATH, "rb") as f:
        return tomllib.load(f)


def test_packaged_spec_has_the_issue_states_and_every_pair_decided() -> None:
    lc = load()
    assert {
        "allocated", "copying", "computing", "copying_computing", "idle",
        "free_pending", "freed", "stale_pending", "stale",
    } == set(lc.states)  # fmt: skip
    assert lc.initial == "allocated"
    assert {s for s, st in lc.states.items() if st.terminal} == {"freed", "stale"}
    for state, event in lc.pairs():
        assert lc.outcomes(state, event), (state, event)
    assert {"INV-NO-FREE-IN-USE", "INV-FREE-ONCE", "INV-CURSOR"} <= set(lc.invariants)


def test_every_rule_names_a_real_error_class_and_a_seed_clause() -> None:
    for rule in load().rules.values():
        assert rule.error is None or issubclass(errors.ERRORS[rule.error], errors.BridgeError), rule.id
        assert rule.seed and rule.text, rule.id


def test_failures_name_a_rule_and_its_error_or_a_subclass_of_it() -> None:
    lc = load()
    assert {w: (f.rule, f.error) for w, f in lc.failures.items()} == {
        "copy_in": ("COPY-F", "DeviceCopyError"),
        "copy_out": ("COPY-F", "OutputCopyError"),
        "compute": ("COMPUTE-F", "ComputeError"),
        "aborted": ("GEN-1", "StaleHandleError"),
        "host_bytes": ("H2D-3", "HostBytesChangedError"),
    }
    for f in lc.failures.values():
        rule_error = lc.rules[f.rule].error
        assert rule_error is not None and issubclass(errors.ERRORS[f.error], errors.ERRORS[rule_error]), f


def test_release_memory_happens_only_on_entering_freed_or_stale() -> None:
    lc = load()
    releasing = {(t.source, t.event, t.dest) for t in lc.transitions if t.action == "release_memory"}
    assert {d for _, _, d in releasing} == {"freed", "stale"}
    assert ("freed", "restart", "stale") not in releasing  # freed memory is never released again


def _broken(mutate: Any) -> dict[str, Any]:
    data = copy.deepcopy(raw())
    mutate(data)
    return data


def _drop_pair(d: dict[str, Any]) -> None:
    d["transitions"] = [t for t in d["transitions"] if not (t["event"] == "free" and "allocated" in t["source"])]


def _unreachable(d: dict[str, Any]) -> None:
    d["states"].append({"name": "limbo", "doc": "never entered", "where": {}})
    d["rejections"].append({"source": "limbo", "event": [e["name"] for e in d["events"]], "rule": "EVENT-1"})


def _dead_end(d: dict[str, Any]) -> None:
    # idle can no longer be left except back to itself: it cannot reach freed or stale
    for t in d["transitions"]:
        if "idle" in t["source"]:
            t["source"] = [s for s in t["source"] if s != "idle"]
    d["transitions"] = [t for t in d["transitions"] if t["source"]]
    d["rejections"].append(
        {"source": "idle", "event": [e["name"] for e in d["events"] if e["name"] not in ("copy_end", "compute_end")],
         "rule": "USE-1"}
    )  # fmt: skip


def _both(d: dict[str, Any]) -> None:
    d["rejections"].append({"source": "idle", "event": "free", "rule": "FREE-2"})


def _counter_break(d: dict[str, Any]) -> None:
    # copy_end out of copying always to idle, even when another copy is still in flight
    d["transitions"] = [t for t in d["transitions"] if not (t["source"] == ["copying"] and t["event"] == "copy_end")]
    d["transitions"].append({"source": "copying", "event": "copy_end", "dest": "idle"})


def _unknown_guard(d: dict[str, Any]) -> None:
    d["transitions"][0]["guards"] = ["lucky"]


def _unknown_rule(d: dict[str, Any]) -> None:
    d["rejections"][0]["rule"] = "NOPE-1"


def _uncovered_guard(d: dict[str, Any]) -> None:
    d["transitions"] = [
        t for t in d["transitions"]
        if not (t["source"] == ["copying"] and t["event"] == "copy_end" and t.get("guards") == ["!last_copy"])
    ]  # fmt: skip


def _rule(d: dict[str, Any], rid: str) -> dict[str, Any]:
    return next(r for r in d["rules"] if r["id"] == rid)


def _error_and_kept_by(d: dict[str, Any]) -> None:
    _rule(d, "FREE-1")["error"] = "InvalidHandleError"  # a rule is refused or kept another way, not both


def _neither(d: dict[str, Any]) -> None:
    del _rule(d, "VIEW-3")["kept_by"]


def _kept_by_a_rule_without_an_error(d: dict[str, Any]) -> None:
    _rule(d, "H2D-2")["kept_by"] = "FREE-1"


def _kept_by_nothing_known(d: dict[str, Any]) -> None:
    _rule(d, "PIN-1")["kept_by"] = "hoping"


def _a_failure_without_a_rule(d: dict[str, Any]) -> None:
    d["failures"] = [f for f in d["failures"] if f["when"] != "compute"]


def _a_failure_of_an_unknown_rule(d: dict[str, Any]) -> None:
    d["failures"][0]["rule"] = "COPY-X"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_error_and_kept_by, "rule FREE-1 needs exactly one of `error` and `kept_by`"),
        (_neither, "rule VIEW-3 needs exactly one of `error` and `kept_by`"),
        (_kept_by_a_rule_without_an_error, "rule H2D-2: kept_by must be one of"),
        (_kept_by_nothing_known, "rule PIN-1: kept_by must be one of"),
        (_a_failure_without_a_rule, "failures must name a known rule for each of "),
        (_a_failure_of_an_unknown_rule, "failures must name a known rule for each of"),
        (_drop_pair, "(allocated, free) is neither a transition nor a rejection"),
        (_unreachable, "unreachable"),
        (_dead_end, "cannot reach a terminal state"),
        (_both, "(idle, free): only its last candidate may be unguarded"),
        (_counter_break, "breaks the counters' invariant"),
        (_unknown_guard, "unknown guard"),
        (_unknown_rule, "unknown state, event or rule"),
        (_uncovered_guard, "(copying, copy_end) has no outcome"),
    ],
)
def test_loader_refuses_an_unsound_spec(mutate: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(_broken(mutate))


def test_load_reads_a_spec_file(tmp_path: Any) -> None:
    path = tmp_path / "lifecycle.toml"
    path.write_bytes(SPEC_PATH.read_bytes())
    assert load(path) == load()


ERRORS = sorted(
    (c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.BridgeError)),
    key=lambda c: c.__name__,
)


@pytest.mark.parametrize("kind", ERRORS, ids=lambda c: c.__name__)
def test_every_error_pickles_to_another_process_as_itself(kind: type[errors.BridgeError]) -> None:
    """An error crosses to another process (a multiprocessing pipe, a Ray task's failure) as the
    same class with the same rule, detail, message and notes: an Exception pickles as
    `cls(*args)`, and a BridgeError is made from a rule and a detail, not its one message."""
    import pickle

    from devbridge import HostRing

    error = kind("ARG-1", "what went wrong")
    error.add_note("a note")
    if isinstance(error, errors.HostBytesChangedError):  # its fields; a range of a ring goes as its repr
        error = kind("H2D-3", "changed", copy="the copy", range=HostRing(16).reserve(8), offset=3)  # type: ignore[call-arg]
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is kind and (back.rule, back.detail, str(back)) == (error.rule, error.detail, str(error))
    assert getattr(back, "__notes__", None) == getattr(error, "__notes__", None)
    if isinstance(error, errors.HostBytesChangedError):
        assert (back.copy, back.range, back.offset) == ("the copy", "HostRange(start=0, nbytes=8)", 3)
