"""Every spec rule has a test proving it holds and one proving that breaking it is rejected.

Found by reading the tests' `holds`/`rejects` markers from their source, so
the check does not depend on which tests a run selected.
"""

from __future__ import annotations

import ast
from pathlib import Path

from devbridge.spec import load

TESTS = Path(__file__).parent


def marked_rules() -> dict[str, dict[str, list[str]]]:
    """{"holds"|"rejects": {rule id: [test names]}} from every test module."""
    found: dict[str, dict[str, list[str]]] = {"holds": {}, "rejects": {}}
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                if (
                    isinstance(deco, ast.Call)
                    and isinstance(deco.func, ast.Attribute)
                    and deco.func.attr in found
                    and ast.unparse(deco.func.value) == "pytest.mark"
                ):
                    for arg in deco.args:
                        rule = ast.literal_eval(arg)
                        found[deco.func.attr].setdefault(rule, []).append(f"{path.name}::{node.name}")
    return found


def test_every_rule_is_proven_and_its_violation_rejected() -> None:
    rules = set(load().rules)
    found = marked_rules()
    missing = {kind: sorted(rules - set(found[kind])) for kind in found}
    assert missing == {"holds": [], "rejects": []}
    unknown = {kind: sorted(set(found[kind]) - rules) for kind in found}
    assert unknown == {"holds": [], "rejects": []}
