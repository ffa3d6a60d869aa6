"""The shape of the runtime: one Bridge class, a core that returns its decisions as values, and no
module reaching into another class's private methods."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from devbridge import Bridge
from devbridge.bridge.engine import Engine
from devbridge.statemachine import core, ledger, records
from devbridge.statemachine.runner import Runner

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("api", "spec", "statemachine", "ring", "backends", "bridge")
#: (file, receiver) -> why a private method of another object is called there
ALLOWED = {
    ("backends/tinygrad_compat.py", "buffer.allocator"): "tinygrad's internals: this module is their one reader",
    ("backends/tinygrad_compat.py", "allocator"): "tinygrad's internals: this module is their one reader",
    ("ring/host.py", "source"): "the input ring an output commit finishes: another ring of the same class",
    ("ring/shared.py", "source"): "the input ring an output commit finishes: another ring of the same class",
    ("bridge/events.py", "event"): "the module's own class: `settle` is how its engine settles an event",
}


def private_calls(path: Path) -> list[tuple[str, str, int]]:
    """(receiver, method, line) of each call `x._name(...)` whose `x` is not self, cls or super()."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, receiver = node.func.attr, node.func.value
        if not name.startswith("_") or name.startswith("__"):
            continue
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            continue
        if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
            continue
        found.append((ast.unparse(receiver), name, node.lineno))
    return found


def test_the_bridge_is_one_class_built_with_its_engine() -> None:
    assert Bridge.__mro__ == (Bridge, object)
    assert Engine.__mro__ == (Engine, Runner, object)  # composed into the Bridge, not a base of it


def test_no_module_of_the_runtime_calls_a_private_method_of_another_class() -> None:
    calls = {
        f"{path.relative_to(ROOT)}:{line}: {receiver}.{name}()"
        for folder in RUNTIME
        for path in sorted((ROOT / folder).rglob("*.py"))
        for receiver, name, line in private_calls(path)
        if (str(path.relative_to(ROOT)), receiver) not in ALLOWED
    }
    assert calls == set()


def test_a_private_call_is_found_by_the_check() -> None:
    """The check itself: a call on another object is found, one on self or super() is not."""
    source = "class A:\n    def f(self, b):\n        self._g()\n        super()._h()\n        b._i()\n        b.j()\n"
    path = ROOT / "build" / "shape-probe.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(source)
    try:
        assert private_calls(path) == [("b", "_i", 5)]
    finally:
        path.unlink()


def test_the_core_calls_nothing_out() -> None:
    """The core's modules call no backend, ring, host range or event (they return their decisions,
    `Effect`s, instead), and the core's `finish` takes no executor to call back."""
    for module in (core, ledger, records):
        targets = {
            ast.unparse(node.func)
            for node in ast.walk(ast.parse(inspect.getsource(module)))
            if isinstance(node, ast.Call)
        }
        outward = {"backend", "ring", "host", "event"}
        assert targets and not [t for t in targets if outward & set(t.split("."))]
    assert list(inspect.signature(core.LifecycleCore.finish).parameters) == ["self", "use", "status"]
