"""A minimal external project depends on icml25-causal-discovery by range, installs it from the built
wheels (resolving icml25-kernels through the range), imports the public API, and type-checks with mypy."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from conftest import DISTRIBUTIONS, ROOT, uv


def test_downstream_project_installs_imports_and_typechecks(
    wheelhouse: Path, venv_factory, tmp_path: Path
) -> None:
    project = tmp_path / "downstream"
    shutil.copytree(ROOT / "tests" / "downstream", project)
    python = venv_factory("downstream")
    # --find-links: the icml25 wheels are found by name and version range, like from an index.
    # Every local build carries the same version, so uv's cache would serve an earlier build of the
    # same name and version: refresh the icml25 distributions.
    refresh = [arg for name in DISTRIBUTIONS for arg in ("--refresh-package", f"icml25-{name}")]
    uv(
        "pip",
        "install",
        "--quiet",
        "--python",
        str(python),
        *refresh,
        "--find-links",
        str(wheelhouse),
        str(project),
        "mypy>=1.10",
    )
    run = subprocess.run(
        [str(python), "-c", "import downstream_app as d; print(d.backend_name())"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "reference"
    typed = subprocess.run(
        [str(python), "-m", "mypy", "--strict", str(project / "src" / "downstream_app")],
        capture_output=True,
        text=True,
        cwd=project,
    )
    assert typed.returncode == 0, typed.stdout + typed.stderr
    assert "Success" in typed.stdout
