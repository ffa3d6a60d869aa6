"""The installed package's tree, laid out from the checkout by pyproject's package-dir.

Each top-level folder (api/, spec/, statemachine/, ...) is one package of the `devbridge`
namespace. Tools that read packages as folders named like their modules (griffe for the API
pages, import-linter for the layers) read this copy; Python itself imports the checkout through
the install (editable or not).

As an MkDocs hook (mkdocs.yml), it lays the tree out under build/docs-package before
mkdocstrings reads it (mkdocs.yml points griffe there), whatever way devbridge is installed.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parent.parent
DOCS_TREE = ROOT / "build" / "docs-package"


def package_tree(into: Path, root: Path = ROOT) -> Path:
    """Copy every package folder of `root` to where its module name puts it under `into`."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items()):
        shutil.copytree(
            root / folder,
            into / package.replace(".", "/"),
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            dirs_exist_ok=True,
        )
    return into


@event_priority(100)  # before mkdocstrings
def on_config(config: Any) -> Any:
    shutil.rmtree(DOCS_TREE, ignore_errors=True)
    package_tree(DOCS_TREE)
    return config


def lint_imports(tree: Path) -> tuple[int, str]:
    """import-linter's verdict on the tree (pyproject's contracts): its exit status and report."""
    import os
    import subprocess
    import sys

    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    run = subprocess.run(
        [str(lint), str(ROOT / "pyproject.toml"), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True
    )
    return run.returncode, run.stdout + run.stderr


if __name__ == "__main__":  # python scripts/package_tree.py: the layer contracts on a fresh tree
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        code, report = lint_imports(package_tree(Path(folder)))
    print(report, end="")
    sys.exit(code)
