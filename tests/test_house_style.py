"""The house style (CONTRIBUTING.md, "House style: one way per concern"), checked on the source tree.

Every paper's reproduction module has the same shape, so the 55th reads like the first: a frozen
``Setting`` with ``QUICK``/``FULL``, the pass rule written once as ``checks(setting)``, ``threshold``,
``run``, ``main`` and a ``__main__`` block; no module outside the experiment toolkit touches pyplot or
matplotlib's global backend; library docstrings cite the paper, never the internal briefs.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SOURCES = sorted(
    [*ROOT.glob("packages/*/src/icml25/**/*.py"), *ROOT.glob("shared-kernels/src/icml25/**/*.py")]
)
EXPERIMENTS = sorted(
    p for p in ROOT.glob("packages/*/src/icml25/*/experiments/*.py") if p.name != "__init__.py"
)
TOOLKIT = ROOT / "shared-kernels/src/icml25/kernels/experiment.py"


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def test_there_are_experiments_and_sources() -> None:
    assert len(EXPERIMENTS) >= 9 and len(SOURCES) > 50


@pytest.mark.parametrize("path", EXPERIMENTS, ids=_ids(EXPERIMENTS))
def test_experiment_has_the_house_shape(path: Path) -> None:
    tree = ast.parse(path.read_text())
    top = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assigned = {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
    }

    setting = top.get("Setting")
    assert isinstance(setting, ast.ClassDef), "a frozen dataclass `Setting` holds the run's knobs"
    frozen = [
        kw
        for d in setting.decorator_list
        if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "dataclass"
        for kw in d.keywords
        if kw.arg == "frozen" and getattr(kw.value, "value", None) is True
    ]
    assert frozen, "Setting must be @dataclass(frozen=True)"
    assert {"QUICK", "FULL"} <= assigned, "module-level QUICK and FULL settings"
    for name in ("checks", "threshold", "run", "main"):
        assert isinstance(top.get(name), ast.FunctionDef), f"the module defines {name}()"
    run = top["run"]
    args = [a.arg for a in run.args.args]
    defaults = [ast.literal_eval(d) for d in run.args.defaults]
    assert args[:3] == ["quick", "seed", "out_dir"] and defaults[:3] == [True, 0, None], (
        "run(quick=True, seed=0, out_dir=None)"
    )
    mains = [
        n
        for n in tree.body
        if isinstance(n, ast.If)
        and isinstance(n.test, ast.Compare)
        and getattr(n.test.left, "id", None) == "__name__"
    ]
    assert mains, 'an `if __name__ == "__main__": raise SystemExit(main())` block'
    source = path.read_text()
    assert "Report.from_checks(" in source, "the verdict and the threshold text come from the same checks"
    assert "experiment_main(" in source


@pytest.mark.parametrize("path", SOURCES, ids=_ids(SOURCES))
def test_no_pyplot_and_no_global_backend_switch(path: Path) -> None:
    if path == TOOLKIT:
        return
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.module != "matplotlib.pyplot" and not (
                node.module == "matplotlib" and any(a.name == "pyplot" for a in node.names)
            ), f"line {node.lineno}: use icml25.kernels.experiment.new_figure/save_figure, not pyplot"
        if isinstance(node, ast.Import):
            assert all(a.name != "matplotlib.pyplot" for a in node.names), f"line {node.lineno}: pyplot"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "use":
            assert getattr(node.func.value, "id", None) != "matplotlib", (
                f"line {node.lineno}: matplotlib.use switches the caller's backend"
            )


@pytest.mark.parametrize("path", SOURCES, ids=_ids(SOURCES))
def test_sources_cite_the_paper_not_the_internal_briefs(path: Path) -> None:
    hits = [i + 1 for i, line in enumerate(path.read_text().splitlines()) if "brief" in line.lower()]
    assert not hits, (
        f"lines {hits} mention 'brief' (not in the repository): cite the paper or describe the setting"
    )


HEADER = re.compile(r"^\S.* — ICML 2025, P\d\d: \S")


@pytest.mark.parametrize("path", SOURCES, ids=_ids(SOURCES))
def test_paper_module_docstring_header(path: Path) -> None:
    """A module that cites an ICML 2025 paper (every experiment does) opens with one header form."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    if path not in EXPERIMENTS and "ICML 2025" not in doc:
        return  # shared plumbing (data splits, mazes, dispatch) belongs to no single paper
    first = doc.splitlines()[0] if doc else ""
    assert HEADER.match(first), (
        f"first docstring line must read '<title> — ICML 2025, Pxx: <what>', got {first!r}"
    )


def _module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    return ".".join(parts[parts.index("icml25") :])


# `python -m <module> --help` for every experiment, in one interpreter: runpy.run_module with
# run_name="__main__" is what `python -m` does, and one start-up (torch, sklearn...) instead of one per
# module keeps this at seconds, not minutes, as papers are added.
_HELP_ALL = """
import contextlib, io, json, runpy, sys, traceback
results = {}
for module in sys.argv[1:]:
    out, err, code = io.StringIO(), io.StringIO(), None
    sys.argv = [module, "--help"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            code = stop.code or 0
        except BaseException:
            code = "raised: " + traceback.format_exc()[-2000:]
    results[module] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()[-2000:]}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def help_outputs() -> dict[str, dict]:
    modules = [_module_name(p) for p in EXPERIMENTS]
    out = subprocess.run(
        [sys.executable, "-c", _HELP_ALL, *modules], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", EXPERIMENTS, ids=_ids(EXPERIMENTS))
def test_experiment_command_line_help(path: Path, help_outputs: dict[str, dict]) -> None:
    result = help_outputs[_module_name(path)]
    # None: the module ran to the end without parsing --help (no `if __name__ == "__main__"` block)
    assert result["code"] == 0, f"exit {result['code']!r}: {result['stderr']}"
    stdout = result["stdout"]
    assert "--full" in stdout and "--seed" in stdout and "--out" in stdout


def test_toolkit_is_the_one_figure_path() -> None:
    from icml25.kernels import experiment

    assert "matplotlib.figure" in inspect.getsource(experiment.new_figure)
