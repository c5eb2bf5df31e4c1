"""Which source files a paper's reproduction runs, and one content hash of them (the results ledger's
``source_hash``).

A ledger entry (``results/<id>.json``) is only true of the code it ran. ``icml25 reproduce --full --record``
stores :func:`source_hash` of the experiment module's *source closure*: the experiment module and every
``icml25`` module it imports, transitively (the paper's library module, its area's common modules, the
kernels it calls), found by reading the import statements (``ast``), without importing anything.
``tools/catalog.py`` recomputes the hash from the source tree and names every entry whose code changed after
it was recorded, so a stale number cannot stay in the ledger unnoticed.

Two kinds of module are left out of the closure, on purpose:

- **area and kernels roots** (``icml25.rl``, ``icml25.kernels``): they re-export every paper of the area, so
  hashing them would mark all papers stale whenever one paper is added. ``from icml25.rl import X`` is
  followed to the submodule the root binds ``X`` from. An area root is a lazy namespace
  (:mod:`icml25.kernels.lazy`): its bindings are the ``from ... import ...`` statements of its
  ``if TYPE_CHECKING:`` block, which the import scan below reads like any other import statement, so the
  binding followed is the one the lazy ``__getattr__`` resolves at run time.
- **reporting plumbing** (:data:`PLUMBING`: the report, the named checks, the reproduce command, the
  catalog): it formats and judges the metrics an experiment computes, is tested on its own, and a change
  there (a new outcome, a new column) does not change any paper's numbers. Argument validation
  (:mod:`icml25.kernels.checks`) counts as plumbing for the same reason: it raises on bad input and hands
  valid input back unchanged, so every paper's validation can share it without one edit staling all. The
  lazy-namespace helper (:mod:`icml25.kernels.lazy`) too: it resolves names, it computes nothing.

Modules are hashed by content only (not path), so an installed wheel and the source checkout agree.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "PLUMBING",
    "Finder",
    "ModuleSource",
    "candidate_files",
    "closure_hash",
    "find_in_tree",
    "find_installed",
    "source_closure",
    "source_hash",
]

# (is_package, source bytes) of a module, or None when the module is not icml25 code that can be found
ModuleSource = tuple[bool, bytes]
Finder = Callable[[str], "ModuleSource | None"]

PLUMBING = frozenset(
    f"icml25.kernels.{name}"
    for name in ("report", "experiment", "reproduce", "catalog", "cli", "provenance", "readme_examples",
                 "testing", "checks", "lazy", "__main__")
)  # fmt: skip


def _is_root(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 2 and parts[0] == "icml25"


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module name an ``ImportFrom`` names (relative imports resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@functools.lru_cache(maxsize=4096)
def _imports(source: bytes, module: str, is_package: bool) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``[(module, names)]`` of every import statement anywhere in the file (lazy imports included);
    ``names`` is empty for ``import x.y`` and lists the imported names for ``from x import a, b``."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((_resolve(node, module, is_package), tuple(a.name for a in node.names)))
    return tuple(found)


def source_closure(module: str, find: Finder) -> dict[str, bytes]:
    """``{module name: source}`` of ``module`` and every icml25 module it imports, transitively, less the
    roots and :data:`PLUMBING` (see the module docstring). ``find`` returns a module's source (or None)."""
    if find(module) is None:
        raise ValueError(f"module must be an icml25 module that can be found, got {module!r}")
    closure: dict[str, bytes] = {}
    # (module, names wanted from it: None = the whole module)
    todo: list[tuple[str, tuple[str, ...] | None]] = [(module, None)]
    seen_root_names: set[tuple[str, str]] = set()
    while todo:
        name, wanted = todo.pop()
        if not name.startswith("icml25.") or name in PLUMBING:
            continue
        found = find(name)
        if found is None:
            continue
        is_package, source = found
        if _is_root(name):
            # a root: follow only the bindings of the names asked for, never hash the root itself
            for target, names in _imports(source, name, is_package):
                for wanted_name in wanted or ():
                    if wanted_name in names and (target, wanted_name) not in seen_root_names:
                        seen_root_names.add((target, wanted_name))
                        todo.append((target, (wanted_name,)))
                        todo.append((f"{target}.{wanted_name}", None))  # a submodule of that name
            for wanted_name in wanted or ():
                todo.append((f"{name}.{wanted_name}", None))
            continue
        if name in closure:
            continue
        closure[name] = source
        for target, names in _imports(source, name, is_package):
            todo.append((target, names or None))
            todo += [(f"{target}.{n}", None) for n in names]  # `from pkg import submodule`
        # a module's parent packages run on import: a subpackage's __init__ is part of the paper's code
        parent = name.rpartition(".")[0]
        if parent and not _is_root(parent):
            todo.append((parent, None))
    return closure


def source_hash(module: str, find: Finder | None = None) -> str:
    """:func:`closure_hash` of :func:`source_closure` of ``module``; ``find`` defaults to
    :func:`find_installed` (the modules this interpreter would import)."""
    return closure_hash(source_closure(module, find or find_installed))


def closure_hash(closure: dict[str, bytes]) -> str:
    """SHA-256 (hex) over the sorted module names and contents of a :func:`source_closure`."""
    digest = hashlib.sha256()
    for name in sorted(closure):
        digest.update(name.encode() + b"\0" + hashlib.sha256(closure[name]).digest())
    return digest.hexdigest()


def find_installed(name: str) -> ModuleSource | None:
    """The source of module ``name`` as this interpreter would import it (parents are imported to find it)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return bool(spec.submodule_search_locations), Path(spec.origin).read_bytes()


def candidate_files(name: str) -> tuple[tuple[str, bool], ...]:
    """Where module ``name`` can live below a source folder, as ``(relative posix path, is_package)``."""
    rel = "/".join(name.split("."))
    return (f"{rel}/__init__.py", True), (f"{rel}.py", False)


def find_in_tree(src_dirs: list[Path]) -> Finder:
    """A finder over source folders (each holding ``icml25/...``), e.g. every package's ``src/``; it reads
    each file once (make a new finder to see later edits)."""

    @functools.cache
    def find(name: str) -> ModuleSource | None:
        for src in src_dirs:
            for rel, is_package in candidate_files(name):
                if (src / rel).is_file():
                    return is_package, (src / rel).read_bytes()
        return None

    return find
