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
