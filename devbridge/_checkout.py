"""Imports from a source checkout run at its root (`python -m devbridge`, pytest, PYTHONPATH).

There `devbridge/` shadows the installed package, whose subpackages `devbridge.spec`,
`devbridge.statemachine`, ... are sibling folders of the checkout (pyproject's package-dir).
This finder serves exactly those, read from pyproject: nothing else in the checkout (tests/,
scripts/) becomes importable as part of devbridge.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType


class SiblingFolders(importlib.abc.MetaPathFinder):
    """`devbridge.<name>` from the checkout folder pyproject maps it to."""

    def __init__(self, root: Path) -> None:
        mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
        self.folders = {name: root / folder for name, folder in mapping.items() if name != "devbridge"}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


def serve(root: Path) -> None:
    """Install the finder for the checkout at root (once per process)."""
    if not any(isinstance(f, SiblingFolders) for f in sys.meta_path):
        sys.meta_path.insert(0, SiblingFolders(root))


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
