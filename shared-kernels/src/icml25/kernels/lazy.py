"""Lazy area namespaces (PEP 562): ``import icml25.<area>`` imports no paper module.

Every area root (``icml25.rl``, ``icml25.generative_models``, ...) re-exports the public API of each of its
papers. Importing them all eagerly would make one broken or slow module break or slow the import of every
other paper of the area. A root therefore lists its re-exports once, as ordinary ``from ... import ...``
statements inside ``if TYPE_CHECKING:`` (so type checkers, IDEs and :mod:`icml25.kernels.provenance` see them
exactly as before), and hands the module-level ``__getattr__`` / ``__dir__`` of PEP 562 to
:func:`lazy_namespace`, which reads that block once into a *name → module* map::

    from typing import TYPE_CHECKING

    from icml25.kernels.lazy import lazy_namespace

    if TYPE_CHECKING:
        from icml25.rl.gas import GASAgent, train_tdr
        from icml25.rl.sable import SableNet
    else:
        __getattr__, __dir__ = lazy_namespace(__name__, __file__)

    __all__ = ["GASAgent", "SableNet", "train_tdr"]

``icml25.rl.GASAgent`` then imports ``icml25.rl.gas`` on first access (and caches the name in the root), and a
module that fails to import breaks only the names bound from it. ``__all__`` stays a literal list (mypy and
``from ... import *`` read it); a name bound for users but left out of ``__all__`` (an optional extra's, e.g.
the Flower integration) is imported ``as`` itself so that strict type checkers see it as re-exported. A
submodule not named in the block (``icml25.rl.maze``) is imported on attribute access, as an eager root did.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["lazy_exports", "lazy_namespace"]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def lazy_exports(source: str | bytes, package: str) -> dict[str, tuple[str, str]]:
    """``{name: (module, attribute)}`` of the ``from ... import ...`` statements in the top-level
    ``if TYPE_CHECKING:`` blocks of the root ``package``'s ``source`` (relative imports resolved against
    ``package``). Raises ``ValueError`` for a statement of another form in the block (``import x``, a star
    import) and for a name bound twice, so the map cannot silently differ from what a type checker sees."""
    if not isinstance(package, str) or not package:
        raise TypeError(f"package must be a non-empty module name (str), got {package!r}")
    if not isinstance(source, (str, bytes)):
        raise TypeError(f"source must be the root's source text (str or bytes), got {type(source).__name__}")
    exports: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for stmt in node.body:
            if not isinstance(stmt, ast.ImportFrom):
                raise ValueError(
                    f"the TYPE_CHECKING block of {package} must hold only `from ... import ...` statements, "
                    f"got {ast.unparse(stmt)!r} (line {stmt.lineno})"
                )
            if stmt.level:
                base = package.split(".")[: len(package.split(".")) - (stmt.level - 1)]
                module = ".".join(base + ([stmt.module] if stmt.module else []))
            else:
                module = stmt.module or ""
            for alias in stmt.names:
                if alias.name == "*":
                    raise ValueError(f"the TYPE_CHECKING block of {package} must name its imports, got a *")
                bound = alias.asname or alias.name
                if bound in exports:
                    raise ValueError(
                        f"{package} binds {bound!r} twice in its TYPE_CHECKING block: from "
                        f"{exports[bound][0]} and from {module}"
                    )
                exports[bound] = (module, alias.name)
    return exports


def lazy_namespace(package: str, file: str | Path) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the root ``package`` whose source is ``file`` (pass ``__name__`` and
    ``__file__``): its names import their module on first access, per :func:`lazy_exports` of the file."""
    exports = lazy_exports(Path(file).read_bytes(), package)

    def __getattr__(name: str) -> Any:
        target = exports.get(name)
        if target is not None:
            value = getattr(importlib.import_module(target[0]), target[1])
            setattr(sys.modules[package], name, value)  # later look-ups skip __getattr__
            return value
        if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
