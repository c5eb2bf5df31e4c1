"""icml25.kernels.lazy: the lazy area namespaces (PEP 562), on a small fake package written to tmp_path."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from icml25.kernels.lazy import lazy_exports, lazy_namespace

ROOT = '''"""A fake area root."""
from typing import TYPE_CHECKING

from icml25.kernels.lazy import lazy_namespace

if TYPE_CHECKING:
    from fakearea.good import fit_good, Good
    from .broken import fit_broken
    from fakearea.extra import helper as renamed
else:
    __getattr__, __dir__ = lazy_namespace(__name__, __file__)

EAGER = 1
__all__ = ["EAGER", "Good", "fit_broken", "fit_good"]
'''

FILES = {
    "__init__.py": ROOT,
    "good.py": "class Good: ...\ndef fit_good():\n    return 'good'\n",
    "broken.py": "raise ImportError('broken on purpose')\ndef fit_broken(): ...\n",
    "extra.py": "def helper():\n    return 'helper'\n",
    "plain.py": "VALUE = 3\n",
}


@pytest.fixture
def fakearea(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    package = tmp_path / "fakearea"
    package.mkdir()
    for name, text in FILES.items():
        (package / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("fakearea")
    for name in [m for m in sys.modules if m == "fakearea" or m.startswith("fakearea.")]:
        del sys.modules[name]


def test_importing_the_root_imports_no_submodule(fakearea: object) -> None:
    assert sorted(m for m in sys.modules if m.startswith("fakearea.")) == []


def test_a_name_imports_its_module_on_first_use_and_is_cached(fakearea: object) -> None:
    assert fakearea.fit_good() == "good"  # type: ignore[attr-defined]
    assert "fakearea.good" in sys.modules and "fakearea.extra" not in sys.modules
    assert "fit_good" in vars(fakearea)  # cached: the next look-up does not reach __getattr__
    assert fakearea.renamed() == "helper"  # type: ignore[attr-defined]


def test_a_broken_module_breaks_only_its_own_names(fakearea: object) -> None:
    with pytest.raises(ImportError, match="broken on purpose"):
        fakearea.fit_broken  # type: ignore[attr-defined]  # noqa: B018
    assert fakearea.Good.__name__ == "Good"  # type: ignore[attr-defined]
    from fakearea import fit_good  # type: ignore[import-not-found]

    assert fit_good() == "good"


def test_unknown_names_raise_attribute_error_and_submodules_import_on_access(fakearea: object) -> None:
    with pytest.raises(AttributeError, match="module 'fakearea' has no attribute 'nope'"):
        fakearea.nope  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(fakearea, "__wrapped__")
    assert fakearea.plain.VALUE == 3  # type: ignore[attr-defined]  # a submodule not in the map


def test_dir_lists_the_lazy_names_and_the_eager_ones(fakearea: object) -> None:
    names = dir(fakearea)
    assert {"EAGER", "Good", "fit_broken", "fit_good", "renamed", "__all__"} <= set(names)
    assert names == sorted(names)


def test_lazy_exports_resolves_relative_imports_and_aliases() -> None:
    assert lazy_exports(ROOT, "fakearea") == {
        "fit_good": ("fakearea.good", "fit_good"),
        "Good": ("fakearea.good", "Good"),
        "fit_broken": ("fakearea.broken", "fit_broken"),
        "renamed": ("fakearea.extra", "helper"),
    }
    assert lazy_exports("import os\nX = 1\n", "pkg") == {}  # no TYPE_CHECKING block: nothing lazy


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("    import os\n", "only `from ... import ...` statements"),
        ("    from pkg.a import *\n", "must name its imports"),
        ("    from pkg.a import x\n    from pkg.b import x\n", "binds 'x' twice"),
    ],
)
def test_lazy_exports_rejects_what_a_type_checker_would_read_differently(block: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lazy_exports(f"import typing\nif typing.TYPE_CHECKING:\n{block}", "pkg")


def test_bad_arguments_raise_type_errors_naming_them(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="package must be"):
        lazy_exports("", "")
    with pytest.raises(TypeError, match="source must be"):
        lazy_exports(None, "pkg")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        lazy_namespace("pkg", tmp_path / "missing.py")
