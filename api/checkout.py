"""The source checkout's development tools (scripts/), for the commands and tests that use them.

The wheel has no scripts/: the contract generator reads tests/, the revision builder runs git.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def package_checkout() -> Path | None:
    """The source checkout this devbridge runs from (an editable install's links resolved), or
    None for an installed wheel."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "scripts").is_dir() else None


def script(name: str) -> ModuleType:
    """The checkout's development tool `scripts/<name>.py` (the contract generator, the revision
    builder: they read tests/ or run git, so the wheel has none), imported once.

    Raises:
        ModuleNotFoundError: this devbridge is installed without a checkout."""
    module_name = f"devbridge_scripts_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    root = package_checkout()
    path = None if root is None else root / "scripts" / f"{name}.py"
    if path is None or not path.is_file():
        raise ModuleNotFoundError(f"scripts/{name}.py is a tool of devbridge's source checkout; this one has none")
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before it runs: its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
