"""The wheel as a user gets it: built from the checkout, installed alone into a fresh virtual
environment, used from a folder outside the checkout. Its dependencies come from this
environment's site-packages (a path, not an install: the test needs no network)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", *PACKAGE_DIRS.values())
TIMEOUT_S = 300


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ folder of a fresh venv holding only the wheel (and a path to the dependencies)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy: building writes build/, where the editable install lives
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    built = run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        tmp / "dist",
        source,
        cwd=tmp,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("devbridge-*.whl")
    venv = tmp / "venv"
    assert run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp).returncode == 0
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp).stdout.strip())
    # the dependencies: this environment's site-packages, after the venv's own (the wheel's
    # devbridge comes first; the editable install's finder is a .pth this path does not run)
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = run(
        sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp
    )
    assert pip.returncode == 0, pip.stderr
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert "devbridge/spec/lifecycle.toml" in names and "devbridge/spec/CONTRACT.md" in names
    assert not any(n.startswith("tests/") for n in names)
    # nothing that needs a checkout: the contract generator reads tests/, the revision builder runs git
    assert not [n for n in names if n.endswith(("/docs.py", "/revisions.py"))], names
    return venv / "bin"


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    return tmp_path  # outside the checkout: nothing of it is on the path


def test_import_comes_from_the_wheel(installed: Path, elsewhere: Path) -> None:
    got = run(
        installed / "python", "-c", "import devbridge, sys; print(devbridge.__file__, devbridge.Bridge)", cwd=elsewhere
    )
    assert got.returncode == 0, got.stderr
    path, _ = got.stdout.split(" ", 1)
    assert path.startswith(str(installed.parent)) and "site-packages" in path, path


def test_demo_runs(installed: Path, elsewhere: Path) -> None:
    got = run(
        installed / "devbridge", "demo", "--objects", "40", "--faults", "0.05", "--restart-every", "10", cwd=elsewhere
    )
    assert got.returncode == 0, got.stderr
    assert "40/40 objects" in got.stdout and "lost: 0  duplicated: 0  wrong: 0" in got.stdout


def test_check_runs(installed: Path, elsewhere: Path) -> None:
    got = run(installed / "devbridge", "check", "--profile", "narrow", "--depth", "2", "--jobs", "1", cwd=elsewhere)
    assert got.returncode == 0, got.stderr
    assert got.stdout.count("violations: none") == 2  # the sans-I/O checker and the lockstep one


@pytest.mark.parametrize("args", [["docs", "--check"], ["docs"], ["docs", "--check", "--tests", str(ROOT / "tests")]])
def test_docs_is_a_tool_of_the_checkout_and_says_so_in_one_line(
    installed: Path, elsewhere: Path, args: list[str]
) -> None:
    got = run(installed / "devbridge", *args, cwd=elsewhere)
    says = (
        "devbridge docs: CONTRACT.md is generated in devbridge's source checkout (from the spec and the tests' "
        "markers); this devbridge is installed without one"
    )
    assert (got.returncode, got.stdout, got.stderr.strip().splitlines()) == (2, "", [says])
