"""Each wheel requires exactly what it imports: its ``Requires-Dist`` against the imports of its own source.

Read from the built wheels (METADATA and the ``.py`` files they ship), with the AST:

* a **core** requirement (no ``extra ==`` marker) is imported somewhere in the wheel, and every import a
  core module runs when it is imported (module level, outside ``if TYPE_CHECKING:``) is the standard
  library, ``icml25`` or a core requirement: ``pip install icml25-<area>`` alone imports every core module;
* an **extra**'s module is one whose module-level ``try: import ... except ImportError:`` names the extra
  (``pip install 'icml25-<area>[<extra>]'``); its imports are core requirements or that extra's. A lazy
  import (inside a function) guarded the same way belongs to the extra its message names. In icml25-kernels
  the ``<family>/triton.py`` modules belong to ``[triton]`` (imported only when the Triton backend runs);
* every requirement of an extra is imported under that extra, or forwards the icml25-kernels extra of the
  same name (an area's ``[plots]`` brings the matplotlib that ``icml25.kernels.experiment`` draws with);
* a lazy import of a library that no requirement names must be guarded by ``except ImportError`` (an
  optional tool the user installs by hand, e.g. torchvision for ``download=True``).
"""

from __future__ import annotations

import ast
import re
import sys
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

import pytest
from conftest import DISTRIBUTIONS, wheel_of

# distribution name -> import name, where they differ (the default replaces "-" by "_")
IMPORT_NAMES = {
    "scikit-learn": "sklearn",
    "causal-learn": "causallearn",
    "sae-lens": "sae_lens",
    "pyyaml": "yaml",
    "pillow": "PIL",
    "icml25-kernels": "icml25.kernels",
}


def import_name(requirement: str) -> str:
    name = re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0].lower()
    name = re.sub(r"[-_.]+", "-", name)
    return IMPORT_NAMES.get(name, name.replace("-", "_"))


def requirements(wheel: Path) -> tuple[set[str], dict[str, set[str]]]:
    """``(core import names, {extra: import names})`` from the wheel's ``Requires-Dist``."""
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(zf.read(meta).decode())
    core: set[str] = set()
    extras: dict[str, set[str]] = {e: set() for e in message.get_all("Provides-Extra") or []}
    for req in message.get_all("Requires-Dist") or []:
        found = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", req)
        (extras.setdefault(found.group(1), set()) if found else core).add(import_name(req))
    return core, extras


@dataclass
class Import:
    module: str  # the wheel module doing the import (icml25.rl.gas.agent)
    name: str  # the imported top-level library, or icml25.<area>
    line: int
    lazy: bool  # inside a function
    extra: str | None  # the extra named by the surrounding ``except ImportError`` (or the module's)
    guarded: bool  # inside ``try: ... except ImportError``


@dataclass
class Source:
    """The imports of one wheel, and which of its modules belong to an extra."""

    area: str
    imports: list[Import] = field(default_factory=list)
    module_extra: dict[str, str] = field(default_factory=dict)


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        if node.level:  # relative: the wheel's own package
            return []
        names = [node.module or ""]
    else:
        names = [a.name for a in node.names]
    out = []
    for n in names:
        parts = n.split(".")
        out.append(".".join(parts[:2]) if parts[0] == "icml25" and len(parts) > 1 else parts[0])
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = []
    if handler.type is None:
        return True
    for node in ast.walk(handler.type):
        if isinstance(node, ast.Name):
            names.append(node.id)
    return bool({"ImportError", "ModuleNotFoundError", "Exception"} & set(names))


def _extra_named(node: ast.AST, constants: dict[str, str], dist: str) -> str | None:
    """The extra a handler's message names: ``pip install 'icml25-<area>[<extra>]'``."""
    texts = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            texts.append(sub.value)
        elif isinstance(sub, ast.Name) and sub.id in constants:
            texts.append(constants[sub.id])
    found = re.search(rf"{re.escape(dist)}\[([a-z0-9-]+)\]", " ".join(texts))
    return found.group(1) if found else None


def scan_module(text: str, module: str, dist: str) -> tuple[list[Import], str | None]:
    """The imports of one module's source and the extra the module belongs to (None: core)."""
    tree = ast.parse(text)
    constants = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    found: list[Import] = []
    module_extra: list[str] = []

    def visit(node: ast.AST, lazy: bool, extra: str | None, guarded: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in _imported(node):
                found.append(Import(module, name, node.lineno, lazy, extra, guarded))
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, lazy, extra, guarded)
            return
        if isinstance(node, ast.Try):
            handlers = [h for h in node.handlers if _catches_import_error(h)]
            if handlers:
                named = next((e for h in handlers if (e := _extra_named(h, constants, dist))), None)
                if named and not lazy:
                    module_extra.append(named)
                for child in node.body:
                    visit(child, lazy, named or extra, True)
                for child in [*node.handlers, *node.orelse, *node.finalbody]:
                    visit(child, lazy, extra, guarded)
                return
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner, extra, guarded)

    visit(tree, False, None, False)
    if len(set(module_extra)) > 1:
        raise AssertionError(f"{module}: module-level guards name several extras {sorted(set(module_extra))}")
    return found, (module_extra[0] if module_extra else None)


def scan_wheel(wheel: Path, name: str) -> Source:
    dist = f"icml25-{name}"
    source = Source(area=f"icml25.{name.replace('-', '_')}")
    with zipfile.ZipFile(wheel) as zf:
        for path in sorted(n for n in zf.namelist() if n.endswith(".py")):
            module = path[: -len(".py")].replace("/", ".").removesuffix(".__init__")
            imports, extra = scan_module(zf.read(path).decode(), module, dist)
            if name == "kernels" and path.endswith("/triton.py"):
                extra = "triton"  # the Triton backend, imported only when it is selected
            if extra:
                source.module_extra[module] = extra
            source.imports += imports
    return source


def problems(wheel: Path, name: str, kernels_wheel: Path) -> list[str]:
    """Every requirement the wheel's code does not import and every import its requirements do not cover."""
    core, extras = requirements(wheel)
    _, kernels_extras = requirements(kernels_wheel)
    source = scan_wheel(wheel, name)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    own = {source.area}
    out = []
    used: dict[str | None, set[str]] = {}
    for imp in source.imports:
        if imp.name in stdlib or imp.name in own:
            continue
        module_extra = source.module_extra.get(imp.module)
        extra = imp.extra or module_extra
        used.setdefault(extra, set()).add(imp.name)
        where = f"{imp.module} line {imp.line}: import {imp.name}"
        if extra is not None:
            if extra not in extras:
                out.append(f"{where} belongs to the extra [{extra}], which icml25-{name} does not define")
            elif imp.name not in core | extras[extra]:
                out.append(f"{where} runs under [{extra}], whose requirements do not include it")
        elif not imp.lazy:
            if imp.name not in core:
                out.append(f"{where} runs when the module is imported but is not a core requirement")
        elif imp.name not in core | set().union(*extras.values()) and not imp.guarded:
            out.append(f"{where} is required by nothing and not guarded by `except ImportError`")
    everything = set().union(*used.values()) if used else set()
    for req in sorted(core - everything):
        out.append(f"core requirement {req!r} is never imported by icml25-{name}")
    for extra, reqs in sorted(extras.items()):
        for req in sorted(reqs - used.get(extra, set()) - everything):
            if req not in kernels_extras.get(extra, set()) or name == "kernels":
                out.append(f"[{extra}] requires {req!r}, which icml25-{name} never imports")
    return out


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_wheel_requires_what_it_imports_and_nothing_else(wheelhouse: Path, name: str) -> None:
    assert problems(wheel_of(wheelhouse, name), name, wheel_of(wheelhouse, "kernels")) == []


# --- the checker itself, on a small made-up wheel -------------------------------------------------------


def _fake_wheel(tmp_path: Path, name: str, requires: list[str], files: dict[str, str]) -> Path:
    wheel = tmp_path / f"icml25_{name.replace('-', '_')}-0.1.0-py3-none-any.whl"
    extras = sorted({m.group(1) for r in requires if (m := re.search(r'extra == "([^"]+)"', r))})
    meta = [f"Name: icml25-{name}", *(f"Provides-Extra: {e}" for e in extras)]
    meta += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"icml25_{name.replace('-', '_')}-0.1.0.dist-info/METADATA", "\n".join(meta) + "\n")
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


_KERNELS = {"icml25/kernels/__init__.py": "import torch\n"}
_GUARDED = (
    "try:\n    import flwr\nexcept ImportError as err:\n"
    "    raise ImportError(\"pip install 'icml25-toy[flower]'\") from err\n"
)


def test_the_checker_flags_unused_and_uncovered_requirements(tmp_path: Path) -> None:
    kernels = _fake_wheel(tmp_path, "kernels", ["torch", 'matplotlib; extra == "plots"'], _KERNELS)
    wheel = _fake_wheel(
        tmp_path,
        "toy",
        [
            "icml25-kernels>=0.1,<0.2",
            "torch",
            "scikit-learn>=1.3",  # never imported
            'matplotlib; extra == "plots"',  # forwards kernels' [plots]
            'flwr; extra == "flower"',
        ],
        {
            "icml25/toy/__init__.py": "import torch\nimport networkx\nfrom icml25.kernels import Report\n",
            "icml25/toy/flower.py": _GUARDED + "import pandas\n",
            "icml25/toy/lazy.py": "def f():\n    import tigramite\n",
            "icml25/toy/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import scipy\n",
        },
    )
    found = problems(wheel, "toy", kernels)
    assert found == [
        "icml25.toy line 2: import networkx runs when the module is imported but is not a core requirement",
        "icml25.toy.flower line 5: import pandas runs under [flower], whose requirements do not include it",
        "icml25.toy.lazy line 2: import tigramite is required by nothing and not guarded by `except ImportError`",
        "core requirement 'sklearn' is never imported by icml25-toy",
    ]


def test_an_extra_library_imported_at_top_level_of_a_core_module_is_flagged(tmp_path: Path) -> None:
    kernels = _fake_wheel(tmp_path, "kernels", ["torch"], _KERNELS)
    wheel = _fake_wheel(
        tmp_path,
        "toy",
        ["icml25-kernels", "torch", 'flwr; extra == "flower"'],
        {"icml25/toy/__init__.py": "import torch\nimport icml25.kernels\nimport flwr\n"},
    )
    assert problems(wheel, "toy", kernels) == [
        "icml25.toy line 3: import flwr runs when the module is imported but is not a core requirement"
    ]
