"""Packaging rules: PEP 420 namespace, dependency direction, and each area wheel installing alone."""

from __future__ import annotations

import re
import subprocess
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from conftest import AREAS, DISTRIBUTIONS, ROOT, VERSION, uv, wheel_of


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(zf.read(name).decode())


def test_no_package_source_ships_a_namespace_init() -> None:
    offenders = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("*/**/src/icml25/__init__.py"))
    assert offenders == []


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_wheel_has_no_namespace_init_and_ships_py_typed(wheelhouse: Path, name: str) -> None:
    with zipfile.ZipFile(wheel_of(wheelhouse, name)) as zf:
        files = set(zf.namelist())
    area = name.replace("-", "_")
    assert "icml25/__init__.py" not in files
    assert f"icml25/{area}/__init__.py" in files
    assert f"icml25/{area}/py.typed" in files
    assert all(f.startswith((f"icml25/{area}/", "icml25_")) for f in files), "a wheel ships only its own area"


@pytest.mark.parametrize("name", AREAS)
def test_area_depends_on_kernels_by_range_and_on_no_other_area(wheelhouse: Path, name: str) -> None:
    meta = _metadata(wheel_of(wheelhouse, name))
    assert meta["Version"] == VERSION
    requires = meta.get_all("Requires-Dist") or []
    icml = [r for r in requires if re.match(r"icml25-", r)]
    assert len(icml) == 1, f"icml25 requirements of icml25-{name}: {icml}"
    assert re.fullmatch(r"icml25-kernels(<0\.2,>=0\.1|>=0\.1,<0\.2)", icml[0].replace(" ", "")), icml[0]
    assert not any(r.startswith("icml25-kernels @") or "file:" in r for r in requires)


def test_kernels_needs_triton_only_through_its_triton_extra_on_linux(wheelhouse: Path) -> None:
    """triton (1 GB) is no hard dependency: PyTorch's CUDA builds bring it, ``[triton]`` adds it for the
    CPU interpreter."""
    meta = _metadata(wheel_of(wheelhouse, "kernels"))
    requires = [r.replace("'", '"') for r in meta.get_all("Requires-Dist") or []]
    triton = [r for r in requires if r.startswith("triton")]
    assert "triton" in (meta.get_all("Provides-Extra") or [])
    assert len(triton) == 1 and 'sys_platform == "linux"' in triton[0] and 'extra == "triton"' in triton[0]


@pytest.mark.parametrize("name", AREAS)
def test_area_wheel_installs_alone(wheelhouse: Path, venv_factory, name: str) -> None:
    """Only the area and icml25-kernels (plus PyPI deps): the area imports, no other area does."""
    python = venv_factory(f"alone-{name}")
    uv(
        "pip",
        "install",
        "--quiet",
        "--python",
        str(python),
        str(wheel_of(wheelhouse, "kernels")),
        str(wheel_of(wheelhouse, name)),
    )
    area = name.replace("-", "_")
    others = [a.replace("-", "_") for a in AREAS if a != name]
    probe = (
        "import importlib, importlib.util, sys\n"
        f"m = importlib.import_module('icml25.{area}')\n"
        f"assert m.__version__ == {VERSION!r}\n"
        "import icml25.kernels\n"
        f"present = [o for o in {others!r} if importlib.util.find_spec('icml25.' + o) is not None]\n"
        "assert not present, present\n"
        "assert len(list(importlib.import_module('icml25').__path__)) >= 1\n"
        # matplotlib is only the [plots] extra: every module, the experiments included, imports without it
        "assert importlib.util.find_spec('matplotlib') is None, 'matplotlib installed by the core wheel'\n"
        "import pkgutil\n"
        f"for info in pkgutil.walk_packages(m.__path__, 'icml25.{area}.'):\n"
        "    try:\n"
        "        importlib.import_module(info.name)\n"
        "    except ImportError as err:  # an extra's integration module: it must say which extra to install\n"
        f'        assert "pip install \'icml25-{name}[" in str(err), (info.name, err)\n'
    )
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_long_description_has_no_relative_links(wheelhouse: Path, name: str) -> None:
    """The README is the wheel's long description (PyPI's project page): a link relative to the repository
    (``../../README.md``) is dead there."""
    body = _metadata(wheel_of(wheelhouse, name)).get_payload()
    targets = re.findall(r"\]\(([^)\s]+)\)", body)
    relative = [t for t in targets if not re.match(r"(https?://|mailto:|#)", t)]
    assert body.strip() and relative == [], relative


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_every_wheel_ships_the_mit_license(wheelhouse: Path, name: str) -> None:
    """The repository's LICENSE (MIT) is copied into each package folder (PEP 639 license files must lie
    inside the project) and shipped in its wheel's ``.dist-info/licenses/``."""
    folder = ROOT / ("shared-kernels" if name == "kernels" else f"packages/{name}")
    assert (folder / "LICENSE").read_text() == (ROOT / "LICENSE").read_text(), f"{folder}/LICENSE differs"
    meta = _metadata(wheel_of(wheelhouse, name))
    assert meta["License-Expression"] == "MIT" and meta.get_all("License-File") == ["LICENSE"]
    with zipfile.ZipFile(wheel_of(wheelhouse, name)) as zf:
        (shipped,) = [n for n in zf.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert zf.read(shipped).decode() == (ROOT / "LICENSE").read_text()
    assert "MIT License" in (ROOT / "LICENSE").read_text()
