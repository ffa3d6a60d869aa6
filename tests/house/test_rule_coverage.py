"""Every spec rule has a test proving it holds and one proving that breaking it is rejected.

Found by reading the tests' `holds`/`rejects` markers from their source (the same
reader CONTRACT.md's generator uses), so the check does not depend on which tests
a run selected.
"""

from __future__ import annotations

from pathlib import Path

from devbridge.checkout import script
from devbridge.spec import load

rule_tests = script("docs").rule_tests


def test_every_rule_is_proven_and_its_violation_rejected() -> None:
    rules = set(load().rules)
    found = rule_tests(Path(__file__).resolve().parents[1])
    missing = {kind: sorted(rules - set(found[kind])) for kind in found}
    assert missing == {"holds": [], "rejects": []}
    unknown = {kind: sorted(set(found[kind]) - rules) for kind in found}
    assert unknown == {"holds": [], "rejects": []}
