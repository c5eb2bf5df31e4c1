"""The uv workspace, read once: which icml25 distributions exist, where, with which extras, at which version.

The noxfile, the catalog tool and the integration tests all ask this module instead of keeping their own
lists. The members come from ``[tool.uv.workspace] members`` of the root ``pyproject.toml``; each member's
own ``pyproject.toml`` gives its name, version and extras. A member may narrow the extras its test session
installs with ``[tool.icml25] test-extras = [...]`` (default: all of them), and name test-only requirements with
``test-requires = [...]`` (installed by its test session, never required by its wheel).

Usage::

    python tools/workspace.py                 # list the distributions, folders, versions, test extras
    python tools/workspace.py bump 0.2.0      # set every version and the icml25-kernels ranges, then uv lock
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from PyPI (nox and icml25-kernels depend on it there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "icml25-"


@dataclass(frozen=True)
class Member:
    """One workspace distribution: ``name`` is the suffix after ``icml25-`` (``"rl"``, ``"kernels"``)."""

    name: str
    folder: str
    version: str
    extras: tuple[str, ...]
    test_extras: tuple[str, ...]
    test_requires: tuple[str, ...] = ()

    @property
    def distribution(self) -> str:
        return PREFIX + self.name

    @property
    def area(self) -> str:
        """The import name below ``icml25.`` (``llm_efficiency``)."""
        return self.name.replace("-", "_")


def members(root: Path = ROOT) -> dict[str, Member]:
    """``{name: Member}``, icml25-kernels first, then the areas in folder order."""
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    found: dict[str, Member] = {}
    for pattern in meta["tool"]["uv"]["workspace"]["members"]:
        for folder in sorted(root.glob(pattern)):
            project_file = folder / "pyproject.toml"
            if not project_file.is_file():
                continue
            data = tomllib.loads(project_file.read_text())
            project = data["project"]
            if not project["name"].startswith(PREFIX):
                raise ValueError(
                    f"{project_file}: workspace members must be named icml25-*, got {project['name']!r}"
                )
            extras = tuple(project.get("optional-dependencies", {}))
            test_extras = tuple(data.get("tool", {}).get("icml25", {}).get("test-extras", extras))
            if set(test_extras) - set(extras):
                raise ValueError(f"{project_file}: test-extras {test_extras} name extras it does not define")
            # test-only requirements (e.g. accelerate, which transformers.Trainer needs in a test): installed by
            # the package's test session, never in the wheel's Requires-Dist
            test_requires = tuple(data.get("tool", {}).get("icml25", {}).get("test-requires", ()))
            name = project["name"][len(PREFIX) :]
            found[name] = Member(
                name,
                folder.relative_to(root).as_posix(),
                project["version"],
                extras,
                test_extras,
                test_requires,
            )
    if "kernels" not in found:
        raise ValueError("the workspace has no icml25-kernels member")
    return {"kernels": found.pop("kernels"), **found}


def areas(root: Path = ROOT) -> list[str]:
    """The area distributions' names (every member but kernels)."""
    return [name for name in members(root) if name != "kernels"]


def version(root: Path = ROOT) -> str:
    """The one version of every distribution (ValueError when they disagree)."""
    versions = {m.distribution: m.version for m in members(root).values()}
    if len(set(versions.values())) != 1:
        raise ValueError(f"the workspace's versions disagree: {versions}")
    return next(iter(versions.values()))


def kernels_range(v: str) -> str:
    """The icml25-kernels requirement range compatible with version ``v`` (same minor series)."""
    major, minor = (int(x) for x in v.split(".")[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


_VERSION_LINE = re.compile(r'^version = "[^"]+"$', re.MULTILINE)
_KERNELS_REQ = re.compile(r'"icml25-kernels>=[0-9.]+,<[0-9.]+"')
_AREA_REQ = re.compile(r'"(icml25-[a-z-]+)>=[0-9.]+,<[0-9.]+"')


def version_problems(root: Path = ROOT) -> list[str]:
    """Every place whose version disagrees with the workspace version."""
    try:
        v = version(root)
    except ValueError as err:
        return [str(err)]
    problems = []
    wanted = f'"icml25-kernels{kernels_range(v)}"'
    root_meta = tomllib.loads((root / "pyproject.toml").read_text())
    if root_meta["project"]["version"] != v:
        problems.append(f"pyproject.toml: workspace version {root_meta['project']['version']} != {v}")
    for m in members(root).values():
        text = (root / m.folder / "pyproject.toml").read_text()
        for req in _KERNELS_REQ.findall(text):
            if req != wanted:
                problems.append(f"{m.folder}/pyproject.toml: {req} does not admit {v} (want {wanted})")
        init = root / m.folder / "src" / "icml25" / m.area / "__init__.py"
        if re.search(r'^__version__ = "', init.read_text(), re.MULTILINE):
            problems.append(f"{init.relative_to(root)}: __version__ is a literal; read it from the metadata")
    return problems


def bump(new: str, root: Path = ROOT, lock: bool = True) -> list[Path]:
    """Set every distribution's version to ``new`` and every icml25 requirement range to its minor series."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", new):
        raise ValueError(f"version must look like 1.2.3, got {new!r}")
    rng = kernels_range(new)
    files = [root / "pyproject.toml", root / "tests" / "downstream" / "pyproject.toml"]
    files += [root / m.folder / "pyproject.toml" for m in members(root).values()]
    changed = []
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text()
        updated = _AREA_REQ.sub(lambda match: f'"{match.group(1)}{rng}"', text)
        if path.parent.name != "downstream":
            updated = _VERSION_LINE.sub(f'version = "{new}"', updated, count=1)
        if updated != text:
            path.write_text(updated)
            changed.append(path)
    if lock:
        subprocess.run(["uv", "lock"], cwd=root, check=True)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    bump_cmd = sub.add_parser("bump", help="set every version (and the icml25 ranges), then uv lock")
    bump_cmd.add_argument("version")
    args = parser.parse_args(argv)
    if args.command == "bump":
        for path in bump(args.version):
            print(f"updated {path.relative_to(ROOT)}")
        return 0
    for m in members().values():
        print(
            f"{m.distribution:28} {m.folder:30} {m.version:8} test extras: {','.join(m.test_extras) or '-'}"
        )
    problems = version_problems()
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
