"""Write the API reference's sources (``docs/build/``): one page per area, one section per paper.

Each area page is the package's README followed by its API reference: one section per implemented paper of
the catalog (``icml25.kernels.catalog``), rendering the paper's library module and its experiment module
(the ``Setting``, ``checks``, ``run``) from their docstrings with mkdocstrings. The package list comes from
the uv workspace (``tools/workspace.py``), the paper list from the catalog, so a new paper or area appears
without editing anything here. mkdocstrings reads the sources statically (griffe): nothing is imported, so
the docs session needs neither torch nor any extra.

    python docs/build_site.py                            # writes docs/build/mkdocs.yml and its pages
    mkdocs build --strict -f docs/build/mkdocs.yml       # the site, into docs/build/site (nox -s docs)
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from PyPI (the docs session installs it there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import workspace  # noqa: E402 - tools/workspace.py: the one list of distributions

OUT = ROOT / "docs" / "build"
CATALOG = ROOT / "shared-kernels" / "src" / "icml25" / "kernels" / "catalog.toml"
# icml25-kernels modules left out of its page: the command line and the Triton launch wrappers (their
# reference paths and public ops are documented)
HIDDEN_SUFFIXES = (".cli", ".__main__", ".triton")


def _readme(folder: str) -> str:
    """The package README with its headings moved one level down below the page title."""
    text = (ROOT / folder / "README.md").read_text()
    lines = text.splitlines()
    body = lines[1:] if lines and lines[0].startswith("# ") else lines
    out, fence = [], False
    for line in body:
        if line.lstrip().startswith("```"):
            fence = not fence
        out.append("#" + line if not fence and re.match(r"#{1,5} ", line) else line)
    return "\n".join(out).strip() + "\n"


def _directive(module: str, members: bool = True) -> str:
    extra = "" if members else "      members: false\n"
    return f"::: {module}\n    options:\n      heading_level: 4\n      show_root_heading: true\n{extra}"


def _modules(src: Path, package: str) -> list[str]:
    """Every public module below ``package`` (its ``src`` folder given), experiments excluded, sorted."""
    base = src / package.replace(".", "/")
    found = []
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        rel = parts[len(package.split(".")) :]
        if rel and (rel[0] == "experiments" or any(p.startswith("_") for p in rel)):
            continue
        if rel:
            found.append(".".join(parts))
    return found


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _lazy_aliases(src: Path, modules: list[str]) -> dict[str, str]:
    """``{alias path: path of the object}`` for the names a subpackage exports through a PEP 562
    ``__getattr__`` (an optional extra's integration, "one lazy hop away"): a name of its ``__all__`` that it
    does not bind itself, found defined at the top level of one of its submodules. griffe reads sources
    statically, so it cannot see them: ``docs/griffe_rst.py`` points a reference to ``pkg.name`` at the
    object where it is defined."""
    trees = {}
    for module in modules:
        path = src / module.replace(".", "/")
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        trees[module] = ast.parse(path.read_bytes())
    aliases: dict[str, str] = {}
    for module, tree in trees.items():
        bound = _top_level_names(tree)
        if "__getattr__" not in bound:
            continue
        exported = [
            elt.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "__all__" for t in node.targets)
            and isinstance(node.value, (ast.List, ast.Tuple))
            for elt in node.value.elts
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str)
        ]
        for name in (n for n in exported if n not in bound):
            home = next(
                (m for m in modules if m.startswith(module + ".") and name in _top_level_names(trees[m])),
                None,
            )
            if home is not None:
                aliases[f"{module}.{name}"] = f"{home}.{name}"
    return aliases


def _owner(module: str, roots: list[str]) -> str | None:
    """The paper module ``module`` belongs to: the longest paper module that is it, a package above it, or a
    sibling named after it (``flex3d_hf``, ``task_vectors_toy``: the rule of ``tests/test_sharing.py``)."""
    owners = [r for r in roots if module == r or module.startswith((r + ".", r + "_"))]
    return max(owners, key=len) if owners else None


def _area_page(member: workspace.Member, papers: list[dict[str, str]]) -> str:
    package = "icml25." + member.area
    parts = [f"# {member.distribution}\n", "## Overview (the package README)\n", _readme(member.folder)]
    parts.append("## API reference\n")
    parts.append(
        f"One section per paper: its library module(s), then its reproduction (`run`, the `Setting`, the "
        f"checks). `import {package}` re-exports each paper's public names lazily (`icml25.kernels.lazy`).\n"
    )
    modules = _modules(ROOT / member.folder / "src", package)
    parts.append(_directive(package, members=False))
    roots = [p["module"] for p in papers]
    for paper in papers:
        parts.append(f"### {paper['id']} — {paper['title']}\n")
        parts += [_directive(m) for m in modules if _owner(m, roots) == paper["module"]]
        parts.append(_directive(paper["entry_point"]))
    rest = [m for m in modules if _owner(m, roots) is None]
    if rest:
        parts.append("### Shared modules and optional integrations\n")
        parts += [_directive(m) for m in rest]
    return "\n".join(parts)


def build() -> Path:
    """Write ``docs/build/mkdocs.yml`` and ``docs/build/pages/*.md``; return the config's path."""
    members = workspace.members(ROOT)
    papers = [p for p in tomllib.loads(CATALOG.read_text())["paper"] if p.get("status") == "implemented"]
    aliases: dict[str, str] = {}
    for member in members.values():
        package = "icml25." + ("kernels" if member.name == "kernels" else member.area)
        src = ROOT / member.folder / "src"
        aliases.update(_lazy_aliases(src, _modules(src, package)))
    shutil.rmtree(OUT, ignore_errors=True)
    pages = OUT / "pages"
    pages.mkdir(parents=True)
    nav: list[dict[str, str]] = [{"Home": "index.md"}]
    index = [
        "# icml25 API reference\n",
        "Reference-quality implementations of ICML 2025 papers, one package per research area, built on "
        "`icml25-kernels`. Each area page starts with the package README and then documents every "
        "implemented paper: its library module and its reproduction, generated from the docstrings.\n",
        "| package | papers |",
        "|---|---|",
    ]
    for name, member in members.items():
        slug = "kernels" if name == "kernels" else name
        ids = [p["id"] for p in papers if p["package"] == name]
        index.append(f"| [{member.distribution}]({slug}.md) | {', '.join(ids) or 'the shared kernels'} |")
        nav.append({member.distribution: f"{slug}.md"})
        if name == "kernels":
            text = [
                f"# {member.distribution}\n",
                "## Overview (the package README)\n",
                _readme(member.folder),
            ]
            text.append("## API reference\n")
            modules = _modules(ROOT / member.folder / "src", "icml25.kernels")
            text += [_directive("icml25.kernels")] + [
                _directive(m) for m in modules if not m.endswith(HIDDEN_SUFFIXES)
            ]
            (pages / "kernels.md").write_text("\n".join(text))
        else:
            area_papers = sorted((p for p in papers if p["package"] == name), key=lambda p: p["id"])
            (pages / f"{slug}.md").write_text(_area_page(member, area_papers))
    (pages / "index.md").write_text("\n".join(index) + "\n")
    config = {
        "site_name": "icml25",
        "docs_dir": "pages",
        "site_dir": "site",
        "strict": True,
        "theme": {"name": "material", "features": ["navigation.sections", "toc.follow"]},
        "markdown_extensions": ["tables", "admonition", "toc", "pymdownx.superfences"],
        "nav": nav,
        "plugins": [
            "search",
            {
                "mkdocstrings": {
                    "default_handler": "python",
                    "handlers": {
                        "python": {
                            "paths": [str(ROOT / m.folder / "src") for m in members.values()],
                            "options": {
                                "docstring_style": "google",
                                "members_order": "source",
                                "filters": ["!^_"],
                                "show_source": False,
                                "show_submodules": False,
                                "show_signature_annotations": True,
                                "separate_signature": True,
                                "merge_init_into_class": True,
                                "extensions": [{str(ROOT / "docs" / "griffe_rst.py"): {"aliases": aliases}}],
                                # griffe's docstring lint (a parameter documented as "a, b: ...", one without
                                # an annotation, a continuation line it cannot split): 185 warnings in paper
                                # modules, whose edit stales their ledger entries. Off; broken
                                # cross-references (mkdocs-autorefs) still fail the strict build.
                                "docstring_options": {"warnings": False},
                            },
                        }
                    },
                }
            },
        ],
    }
    path = OUT / "mkdocs.yml"
    path.write_text(json.dumps(config, indent=1) + "\n")  # JSON is YAML
    return path


if __name__ == "__main__":
    print(build())
