"""Explicit sharing (CONTRIBUTING.md, "sharing between papers"; issue 82), checked on the source tree's AST.

Three rules:

1. no module imports another module's ``_private`` name (a shared helper is public, in a module named for
   what it is, or in ``icml25.kernels``);
2. no paper's library module imports another paper's library module;
3. an experiment imports only its own paper's modules, common modules and ``icml25.kernels``.

A module belongs to the paper whose catalog ``module`` is its longest dotted prefix (``flex3d_hf`` belongs to
``flex3d``'s paper: the suffix after an underscore counts too); a module no paper claims is common. An
experiment belongs to the paper whose ``entry_point`` it is.

The 46 crossings that existed when the rule was written were listed in ``KNOWN`` and moved out with their
papers' re-records (a move stales their ledger entries); the list is empty since session 13. The test fails
on a crossing not in the list, naming it, and on a listed crossing that no longer exists.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import catalog
from conftest import ROOT

SOURCES = sorted(
    [*ROOT.glob("packages/*/src/icml25/**/*.py"), *ROOT.glob("shared-kernels/src/icml25/**/*.py")]
)

KNOWN: frozenset[str] = frozenset()


def _module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    parts = parts[parts.index("icml25") :]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _owners() -> tuple[dict[str, str], dict[str, str]]:
    """(library module prefix -> paper id, experiment module -> paper id) of the implemented papers."""
    papers = [p for p in catalog.load() if p.status == "implemented"]
    return {p.module: p.id for p in papers}, {p.entry_point: p.id for p in papers}


def paper_of(module: str, libraries: dict[str, str], experiments: dict[str, str]) -> str | None:
    """The paper a module belongs to (its experiment, else the longest catalog-module prefix), or None."""
    if module in experiments:
        return experiments[module]
    best = None
    for prefix in libraries:
        if module == prefix or module.startswith((prefix + ".", prefix + "_")):
            best = prefix if best is None or len(prefix) > len(best) else best
    return libraries[best] if best else None


def _imports(path: Path, module: str) -> list[tuple[str, list[str]]]:
    """(absolute icml25 module, imported names) of each ``from ... import ...`` in ``path``."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target.split(".")[0] == "icml25":
            found.append((target, [alias.name for alias in node.names]))
    return found


def crossings() -> set[str]:
    """Every violation of the three rules in the source tree, one line each."""
    libraries, experiments = _owners()
    modules = {_module_name(p): p for p in SOURCES}
    out: set[str] = set()
    for module, path in modules.items():
        mine = paper_of(module, libraries, experiments)
        for target, names in _imports(path, module):
            for name in names:
                if name.startswith("_") and not name.startswith("__") and target != module:
                    out.add(f"private: {module} imports {name} from {target}")
            if path.name == "__init__.py" or mine is None:
                continue  # area namespaces re-export; common modules may import any paper's public names
            theirs = {paper_of(target, libraries, experiments)}
            theirs |= {
                paper_of(f"{target}.{n}", libraries, experiments) for n in names if f"{target}.{n}" in modules
            }
            theirs.discard(None)
            if theirs and mine not in theirs:
                out.add(f"paper: {module} ({mine}) imports {target} ({'/'.join(sorted(theirs))})")
    return out


def test_the_ownership_rule_on_examples() -> None:
    libraries, experiments = _owners()
    assert paper_of("icml25.generative_models.flex3d_hf", libraries, experiments) == "P16"
    assert paper_of("icml25.generative_models.forecasting.visionts", libraries, experiments) == "P25"
    assert paper_of("icml25.generative_models.forecasting.k2vae", libraries, experiments) == "P06"
    assert paper_of("icml25.interpretability.sae.matryoshka_k", libraries, experiments) == "P22"
    assert paper_of("icml25.interpretability.sae.base", libraries, experiments) is None  # the SAE toolkit
    assert paper_of("icml25.generative_models.common.vit_mae", libraries, experiments) is None
    assert paper_of("icml25.generative_models.experiments.vct", libraries, experiments) == "P37"
    assert paper_of("icml25.federated.server", libraries, experiments) is None


def test_the_scan_sees_a_private_import_and_a_paper_crossing(tmp_path: Path, monkeypatch) -> None:
    """The scan itself: a scratch module that breaks both rules is reported, each by name."""
    area = tmp_path / "src/icml25/interpretability"
    area.mkdir(parents=True)
    bad = area / "gridtom.py"
    bad.write_text("from icml25.interpretability.dps import _private_helper\n")
    monkeypatch.setattr(sys.modules[__name__], "SOURCES", [bad])
    assert crossings() == {
        "private: icml25.interpretability.gridtom imports _private_helper from icml25.interpretability.dps",
        "paper: icml25.interpretability.gridtom (P42) imports icml25.interpretability.dps (P53)",
    }


def test_no_new_crossing_and_the_known_list_only_shrinks() -> None:
    found = crossings()
    new = sorted(found - KNOWN)
    assert not new, "imports that cross a paper's boundary or take a private name:\n" + "\n".join(new)
    gone = sorted(KNOWN - found)
    assert not gone, "fixed, remove from KNOWN in tests/test_sharing.py:\n" + "\n".join(gone)
