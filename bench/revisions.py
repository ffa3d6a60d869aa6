"""An older revision of devbridge beside the current one, in one process: `devbridge_old`.

Benchmarks that compare before and after (`order_overhead.py`, `checker_speed.py`) build the
older revision from git as the package `devbridge_old`, laid out as pyproject's package-dir
lays out `devbridge`, with its imports of itself rewritten, and import both side by side.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

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


def short_rev(rev: str) -> str:
    """`rev` as git's short hash."""
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True, capture_output=True, text=True
    ).stdout.strip()
