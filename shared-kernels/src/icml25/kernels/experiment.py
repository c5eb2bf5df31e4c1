"""The experiment toolkit that every paper's reproduction uses, once: the report and its named checks,
seeding, thread pinning, progress bars, figures, and the ``python -m icml25.<area>.experiments.<slug>``
command line.

A reproduction module (``icml25/<area>/experiments/<slug>.py``) reads top to bottom as::

    @dataclass(frozen=True)
    class Setting:                       # one field per knob, docstring says paper value vs CPU value
        ...
    QUICK, FULL = Setting(...), Setting(...)

    def checks(s: Setting) -> list[Check]:          # the pass rule, written once
        return [Check("GAS success >= flat + 0.3", lambda m: m["gas"] >= m["flat"] + 0.3), ...]

    def threshold(quick: bool = True) -> str:       # what the results ledger records
        return threshold_text(checks(QUICK if quick else FULL))

    def run(quick=True, seed=0, out_dir=None) -> Report:
        seed_everything(seed)
        ... measure metrics ...
        return Report.from_checks(paper=..., claim=..., checks=checks(s), metrics=metrics, ...)

    def main(argv=None) -> int:
        return experiment_main(run, argv, description=__doc__)

It lives in ``icml25-kernels`` because that is the one distribution every area package depends on.
Nothing here switches global state behind the caller's back: figures use matplotlib's object API (no
pyplot, no backend switch), threads are restored on exit, and only :func:`seed_everything`, which an
experiment calls on purpose, touches the global random generators.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from icml25.kernels.checks import check_int
from icml25.kernels.report import Report, format_value, summary_line
from icml25.kernels.threads import torch_threads

T = TypeVar("T")

__all__ = [
    "Check",
    "Report",
    "evaluate_checks",
    "experiment_main",
    "format_value",
    "new_figure",
    "progress",
    "save_figure",
    "seed_everything",
    "summary_line",
    "threshold_text",
    "torch_threads",
]


@dataclass(frozen=True)
class Check:
    """One named condition of a reproduction's pass rule.

    ``name`` is the condition in words (it becomes part of the threshold text, e.g.
    ``"GAS success >= flat + 0.3"``); ``holds`` decides it from the run's metrics.
    """

    name: str
    holds: Callable[[Mapping[str, float]], bool]

    def __call__(self, metrics: Mapping[str, float]) -> bool:
        return bool(self.holds(metrics))


def threshold_text(checks: Sequence[Check]) -> str:
    """The pass rule in words: the checks' names joined by ``"; "``."""
    if not checks:
        raise ValueError("checks must name at least one condition, got an empty list")
    return "; ".join(c.name for c in checks)


def evaluate_checks(checks: Sequence[Check], metrics: Mapping[str, float]) -> dict[str, bool]:
    """``{check name: holds}`` for the run's metrics (a missing metric is an error of the experiment)."""
    names = [c.name for c in checks]
    if len(set(names)) != len(names):
        raise ValueError(f"check names must be unique, got {names}")
    return {c.name: c(metrics) for c in checks}


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (CPU and CUDA) for one experiment run.

    Only experiments call this; library code takes ``seed=`` or ``generator=`` and never touches global state.
    """
    seed = check_int(seed, "seed")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - deliberately the global generator, for third-party code
    torch.manual_seed(seed)


def _quiet() -> bool:
    """Progress bars stay off under CI and when stderr is not a terminal (logs, notebooks' captured output)."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        return True
    return not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())


def progress(iterable: Iterable[T] | None = None, *, desc: str | None = None, total: int | None = None,
             leave: bool = False, disable: bool | None = None, **kwargs: Any) -> Any:  # fmt: skip
    """A ``tqdm.auto`` progress bar, on by default in a terminal, quiet in CI or when not a TTY.

    ``disable=False`` forces it on, ``True`` off. Returns the tqdm object (iterate it, or ``update`` it).
    """
    from tqdm.auto import tqdm

    return tqdm(
        iterable,
        desc=desc,
        total=total,
        leave=leave,
        disable=_quiet() if disable is None else disable,
        **kwargs,
    )


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] = (6.0, 4.0), **kwargs: Any):
    """A matplotlib ``Figure`` and its axes, built with the object API (no pyplot, no global backend).

    Returns ``(figure, axes)`` as ``Figure.subplots`` does. matplotlib is imported here, so the library
    works without it; the area packages ship it in their ``[plots]`` extra.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            "matplotlib is needed to draw the reproduction's figures: pip install matplotlib "
            "(the [plots] extra of the icml25 area package, e.g. pip install 'icml25-<area>[plots]')"
        ) from None
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def save_figure(fig: Any, out_dir: str | Path, name: str, *, dpi: int = 120) -> Path:
    """Write ``fig`` to ``out_dir/<name>.png`` (folders created) and return the path."""
    if not name or "/" in name or name.endswith(".png"):
        raise ValueError(f"name must be a bare file stem like 'success_curve', got {name!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def _matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _plots_extra(run: Callable[..., Any]) -> str:
    """``pip install 'icml25-<area>[plots]'`` for the area package that defines ``run``."""
    module = str(getattr(run, "__module__", ""))
    if module == "__main__":  # python -m icml25.<area>.experiments.<slug>
        module = str(getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", ""))
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "icml25" and parts[1] != "kernels":
        return f"pip install 'icml25-{parts[1].replace('_', '-')}[plots]'"
    return "pip install matplotlib"


def experiment_main(
    run: Callable[..., Report], argv: Sequence[str] | None = None, *, description: str | None = None
) -> int:
    """The command line of a reproduction module: ``[--full] [--seed N] [--out DIR]``.

    Prints the report's line, its preconditions, named checks and notes; exits 0 when the threshold holds
    and the run is conclusive, 1 otherwise
    (known misses are the catalog's business: ``icml25 reproduce`` / ``tools/reproduce.py`` read it).
    """
    first_line = (description or "").strip().splitlines()[0] if description else None
    parser = argparse.ArgumentParser(description=first_line)
    parser.add_argument("--full", action="store_true", help="the full small-scale setting (minutes)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the run (default 0)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the figures (default: none)")
    args = parser.parse_args(argv)
    out = args.out
    if out is not None and not _matplotlib_available():
        # the run still reports its result; only the figures need matplotlib
        print(f"figures off: matplotlib is not installed ({_plots_extra(run)})", file=sys.stderr)
        out = None
    report = run(quick=not args.full, seed=args.seed, out_dir=out)
    verdict = "INCONCLUSIVE" if report.inconclusive else "PASS" if report.passed else "FAIL"
    print(f"{report.paper} {verdict} {report.summary()}")
    for name, ok in report.preconditions.items():
        print(f"  [{'x' if ok else ' '}] precondition: {name}")
    for name, ok in report.checks.items():
        print(f"  [{'x' if ok else ' '}] {name}")
    if report.notes:
        print(f"  notes: {report.notes}")
    for fig in report.figures:
        print(f"  figure: {fig}")
    return 0 if report.passed and not report.inconclusive else 1
