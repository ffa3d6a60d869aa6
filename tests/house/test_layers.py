"""The import graph: layers that point one way, no cycle (pyproject's import-linter contracts).

The contracts run on the package as it is installed: a tree laid out from the checkout by
pyproject's package-dir (api/ as devbridge/, spec/ as devbridge/spec, ...). Each seeded break must
break exactly the contract it is meant to, and the tree as it is must keep both."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from devbridge.checkout import script

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
LAYERS, ACYCLIC = "layers point one way", "no import cycle"
PURE, INDEPENDENT = "the spec and the core are pure", "the backends are independent"
CONTRACTS = (LAYERS, PURE, INDEPENDENT, ACYCLIC)
KEPT = dict.fromkeys(CONTRACTS, "KEPT")
#: the installed package's tree, laid out from the checkout by pyproject's package-dir
package_tree, lint_imports = script("package_tree").package_tree, script("package_tree").lint_imports


def verdicts(output: str) -> dict[str, str]:
    return {name: word for line in output.splitlines() for name in CONTRACTS for word in ("KEPT", "BROKEN")
            if line.startswith(f"{name} {word}")}  # fmt: skip


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    code, output = lint_imports(package_tree(tmp_path))
    assert (code, verdicts(output)) == (0, KEPT), output


SEEDED = {
    # the bottom importing the top, if only for type hints (and the bridge imports errors: a cycle)
    "errors imports the bridge for a type hint": (
        "devbridge/errors.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from devbridge.bridge.bridge import Bridge\n",
        KEPT | {LAYERS: "BROKEN", ACYCLIC: "BROKEN", PURE: "BROKEN"},  # the core imports errors: numpy via the bridge
    ),
    # the core reaching up into the Bridge (whose ring uses numpy for its arrays: impure too; and
    # the Bridge imports the core: a cycle between the folders)
    "the core imports the events": (
        "devbridge/statemachine/core.py",
        "from devbridge.bridge.events import Event\n",
        KEPT | {LAYERS: "BROKEN", PURE: "BROKEN", ACYCLIC: "BROKEN"},
    ),
    # a value type reaching up to the backend protocol: the layers contract alone
    "the value types import the backend protocol": (
        "devbridge/types.py",
        "from devbridge.backends.base import Backend\n",
        KEPT | {LAYERS: "BROKEN"},
    ),
    # ring <-> events: upward, and a cycle between siblings
    "the ring imports the events": (
        "devbridge/ring/host.py",
        "import devbridge.bridge.events\n",
        KEPT | {LAYERS: "BROKEN", ACYCLIC: "BROKEN"},
    ),
    # inside one layer (models/): only the cycle contract sees it
    "the reference model imports the checker": (
        "devbridge/models/reference.py",
        "import devbridge.models.checker\n",
        KEPT | {ACYCLIC: "BROKEN"},
    ),
    # the core loading the Machine again (the oracle is verification's), or numpy through a
    # module it imports: the purity contract alone
    "the core imports transitions": (
        "devbridge/statemachine/machine.py",
        "from transitions import Machine\n",
        KEPT | {PURE: "BROKEN"},
    ),
    "the argument checks import numpy": (
        "devbridge/args.py",
        "import numpy\n",
        KEPT | {PURE: "BROKEN"},
    ),
    # one backend using another: the independence contract alone
    "the faulty wrapper imports the fake": (
        "devbridge/testing/faulty.py",
        "from devbridge.testing.fake import FakeBackend\n",
        KEPT | {INDEPENDENT: "BROKEN"},
    ),
}


@pytest.mark.parametrize("seeded", SEEDED, ids=list(SEEDED))
def test_a_seeded_break_breaks_its_contract(tmp_path: Path, seeded: str) -> None:
    path, line, expected = SEEDED[seeded]
    tree = package_tree(tmp_path)
    module = tree / path
    module.write_text(module.read_text() + "\n" + line)
    code, output = lint_imports(tree)
    assert (code, verdicts(output)) == (1, expected), output


def test_run_from_the_checkout_devbridge_is_the_installed_package_and_nothing_shadows_it() -> None:
    """From the checkout's root, `devbridge` and each of its packages are the folders pyproject
    maps (no folder of the root is named devbridge, and no import hook serves one), and no other
    folder of the checkout (tests/, scripts/) is importable through it."""
    mapping = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-dir"]
    probe = (
        "import importlib, json, pathlib\n"
        "out = {}\n"
        f"for name in {[*mapping, 'devbridge.tests', 'devbridge.scripts']!r}:\n"
        "    try:\n"
        "        out[name] = str(pathlib.Path(importlib.import_module(name).__file__).resolve())\n"
        "    except ModuleNotFoundError as e:\n"
        "        out[name] = type(e).__name__\n"
        "print(json.dumps(out))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert json.loads(run.stdout) == {
        **{name: str(ROOT / folder / "__init__.py") for name, folder in mapping.items()},
        "devbridge.tests": "ModuleNotFoundError",
        "devbridge.scripts": "ModuleNotFoundError",
    }, run.stderr
    assert not (ROOT / "devbridge").exists()
    version = subprocess.run(
        [sys.executable, "-m", "devbridge", "--version"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (version.returncode, version.stdout.split()[0]) == (0, "devbridge"), version.stderr


def test_the_layers_page_of_the_docs_lists_the_contracts_layers() -> None:
    """docs/development/layers.md shows the layers as pyproject.toml states them, top first."""
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["name"] == LAYERS)
    page = (ROOT / "docs" / "development" / "layers.md").read_text()
    assert "```text\n" + "\n".join(layers) + "\n```" in page
