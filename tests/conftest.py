"""Fixtures of the cross-package integration tests (run by ``nox -s integration``)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import workspace  # noqa: E402 - tools/workspace.py, the one list of distributions

CONSTRAINTS = ROOT / "constraints.txt"
AREAS = workspace.areas(ROOT)
DISTRIBUTIONS = ["kernels", *AREAS]
VERSION = workspace.version(ROOT)


def uv(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run uv, failing with its output on error."""
    result = subprocess.run(["uv", *args], capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"uv {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder with the seven built wheels: ``$ICML25_WHEELHOUSE`` (set by nox) or built here."""
    given = os.environ.get("ICML25_WHEELHOUSE")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("wheels")
    uv("build", "--quiet", "--all-packages", "--wheel", "-o", str(out), cwd=ROOT)
    return out


def wheel_of(wheelhouse: Path, name: str) -> Path:
    stem = f"icml25_{name.replace('-', '_')}-"
    matches = [p for p in wheelhouse.glob("*.whl") if p.name.startswith(stem)]
    assert len(matches) == 1, f"expected one wheel for icml25-{name} in {wheelhouse}, found {matches}"
    return matches[0]


@pytest.fixture(scope="session")
def venv_factory(tmp_path_factory: pytest.TempPathFactory):
    """Create a fresh virtual environment and return its python executable."""

    def make(name: str) -> Path:
        path = tmp_path_factory.mktemp(name) / ".venv"
        uv("venv", "--quiet", "--python", sys.executable, str(path))
        return path / "bin" / "python"

    return make


def find_links() -> list[Path]:
    """The local wheel folders the machine's installers are configured to read (``$UV_FIND_LINKS``, which nox
    sets from pip's configuration, or ``$PIP_FIND_LINKS``), e.g. one holding a CPU build of torch."""
    links = os.environ.get("UV_FIND_LINKS") or os.environ.get("PIP_FIND_LINKS") or ""
    folders = [Path(link.removeprefix("file://")) for link in re.split(r"[\s,]+", links) if link]
    return [folder for folder in folders if folder.is_dir()]


def cpu_torch_wheel() -> Path | None:
    """A local CPU-only torch wheel (``torch-<version>+cpu-...``) this interpreter can install, or None."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    machine = platform.machine()
    for folder in find_links():
        wheels = sorted(folder.glob(f"torch-*+cpu-{tag}-{tag}-*.whl"))
        wheels = [w for w in wheels if w.name.endswith(f"_{machine}.whl")]
        if wheels:
            return wheels[-1]
    return None
