"""An older revision of devbridge beside the current one, in one process: `devbridge_old`.

Benchmarks that compare before and after (`order_overhead.py`, `checker_speed.py`) build the
older revision from git as the package `devbridge_old`, laid out as pyproject's package-dir
lays out `devbridge`, with its imports of itself rewritten, and import both side by side.
"""

from __future__ import annotations

import importlib
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
OLD = "devbridge_old"
# absolute imports of the package, at the start of a line: `from devbridge.x import`, `from devbridge import`, ...
IMPORT = re.compile(r"^(\s*(?:from|import)\s+)devbridge(?=[.\s])", re.MULTILINE)


def build_old(rev: str, root: Path) -> tuple[Path, int]:
    """Extract `rev` and lay it out under root/pkg as the package `devbridge_old`, mirroring
    pyproject's package-dir (devbridge/ is the package, spec/ is devbridge.spec, ...).
    Returns the folder to put on sys.path and the number of import lines rewritten."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    src = root / "src"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(src, filter="data")
    package_dir: dict[str, str] = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    pkg = root / "pkg"
    for name, folder in sorted(package_dir.items()):  # "devbridge" before "devbridge.spec", ...
        parts = name.split(".")
        assert parts[0] == "devbridge", name
        shutil.copytree(src / folder, pkg.joinpath(OLD, *parts[1:]), ignore=shutil.ignore_patterns("__pycache__"))
    rewritten = 0
    for py in (pkg / OLD).rglob("*.py"):
        text, n = IMPORT.subn(rf"\1{OLD}", py.read_text())
        py.write_text(text)
        rewritten += n
    return pkg, rewritten


_on_path: set[str] = set()  # the folders import_revision put on sys.path


def import_revision(pkg: Path, *modules: str) -> dict[str, ModuleType]:
    """`modules` (dotted names inside the package) of the revision built at `pkg`, as `devbridge_old.*`.

    A revision imported earlier in the process (another benchmark, another test) is forgotten
    first: its modules would otherwise answer for this one, from a folder that may be gone."""
    for name in [n for n in sys.modules if n == OLD or n.startswith(f"{OLD}.")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if p not in _on_path]
    _on_path.add(str(pkg))
    sys.path.insert(0, str(pkg))
    importlib.invalidate_caches()
    found = {m: importlib.import_module(f"{OLD}.{m}") for m in modules}
    for name, mod in sorted(sys.modules.items()):
        if name == OLD or name.startswith(f"{OLD}."):
            path = getattr(mod, "__file__", None)
            assert path is not None and Path(path).is_relative_to(pkg), (name, path)
    return found


def short_rev(rev: str) -> str:
    """`rev` as git's short hash."""
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True, capture_output=True, text=True
    ).stdout.strip()
