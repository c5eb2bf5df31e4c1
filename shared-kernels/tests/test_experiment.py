"""The shared experiment toolkit: named checks, report line, seeding, progress bars, figures, command line."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from icml25.kernels import Report
from icml25.kernels.experiment import (
    Check,
    evaluate_checks,
    experiment_main,
    format_value,
    new_figure,
    progress,
    save_figure,
    seed_everything,
    summary_line,
    threshold_text,
)

CHECKS = [
    Check("error <= 0.5 x baseline", lambda m: m["error"] <= 0.5 * m["baseline_error"]),
    Check("error finite", lambda m: math.isfinite(m["error"])),
]


def test_threshold_text_and_verdict_come_from_the_same_checks() -> None:
    assert threshold_text(CHECKS) == "error <= 0.5 x baseline; error finite"
    good = Report.from_checks(
        paper="P90", claim="c", checks=CHECKS, metrics={"error": 0.2, "baseline_error": 0.5}, headline="error",
        baseline="baseline_error",
    )  # fmt: skip
    assert good.passed and good.threshold == threshold_text(CHECKS) and good.failed_checks == []
    bad = Report.from_checks(
        paper="P90", claim="c", checks=CHECKS, metrics={"error": 0.3, "baseline_error": 0.5}, headline="error"
    )
    assert not bad.passed and bad.checks == {"error <= 0.5 x baseline": False, "error finite": True}
    assert bad.failed_checks == ["error <= 0.5 x baseline"]


def test_checks_must_be_named_uniquely_and_not_empty() -> None:
    with pytest.raises(ValueError, match="unique"):
        evaluate_checks([CHECKS[0], CHECKS[0]], {"error": 0.1, "baseline_error": 1.0})
    with pytest.raises(ValueError, match="at least one"):
        threshold_text([])


def test_a_report_whose_verdict_contradicts_its_checks_is_rejected() -> None:
    with pytest.raises(ValueError, match="contradicts checks"):
        Report(paper="P90", claim="c", threshold="t", passed=True, metrics={"x": 1.0}, headline="x",
               checks={"x > 2": False})  # fmt: skip


def test_report_line_is_formatted_once_for_report_and_duck_typed_reports() -> None:
    report = Report(paper="P90", claim="c", threshold="t", passed=False, metrics={"x": float("nan"), "b": 1 / 3},
                    headline="x", baseline="b")  # fmt: skip
    assert report.summary() == summary_line(report) == "x=nan (baseline 0.3333, threshold t)"
    assert format_value(float("inf")) == "inf" and format_value(12345.678) == "1.235e+04"


def test_seed_everything_makes_all_three_generators_repeat() -> None:
    def draw() -> tuple[float, float, float]:
        return random.random(), float(np.random.rand()), float(torch.rand(()))  # noqa: NPY002

    seed_everything(7)
    first = draw()
    seed_everything(7)
    assert draw() == first
    with pytest.raises(TypeError, match="seed must be an int"):
        seed_everything(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*32\)"):
        seed_everything(-1)


def test_progress_is_quiet_in_ci_and_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    assert progress(range(3)).disable is True
    assert progress(range(3), disable=False).disable is False
    assert list(progress(range(3))) == [0, 1, 2]


def test_save_figure_writes_a_png_without_pyplot_or_a_backend_switch(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the kernels test session installs the [plots] extra")
    code = (
        "import sys, matplotlib\n"
        "before = matplotlib.rcParams._get_backend_or_none()\n"
        "from icml25.kernels.experiment import new_figure, save_figure\n"
        "fig, ax = new_figure()\n"
        "ax.plot([0, 1], [1, 0])\n"
        f"path = save_figure(fig, {str(tmp_path / 'figs')!r}, 'curve')\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'\n"
        "assert matplotlib.rcParams._get_backend_or_none() == before, 'backend switched'\n"
        "print(path)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    path = Path(out.strip())
    assert path == tmp_path / "figs" / "curve.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig, _ = new_figure()
    with pytest.raises(ValueError, match="bare file stem"):
        save_figure(fig, tmp_path, "curve.png")


def test_new_figure_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"\[plots\]"):
        new_figure()


def _fake_run(*, quick: bool, seed: int, out_dir: Path | None) -> Report:
    metrics = {"error": 0.2 if quick else 0.4, "baseline_error": 0.5}
    return Report.from_checks(paper="P90", claim="c", checks=CHECKS, metrics=metrics, headline="error",
                              baseline="baseline_error", notes=f"seed {seed}")  # fmt: skip


def test_experiment_main_runs_prints_checks_and_exits_with_the_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert experiment_main(_fake_run, ["--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert (
        "P90 PASS error=0.2 (baseline 0.5" in out and "[x] error <= 0.5 x baseline" in out and "seed 3" in out
    )
    assert experiment_main(_fake_run, ["--full"]) == 1
    assert "P90 FAIL error=0.4" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        experiment_main(_fake_run, ["--help"], description="P90 toy reproduction.\n\nMore text.")
    assert exc.value.code == 0 and "P90 toy reproduction." in capsys.readouterr().out


def test_out_without_matplotlib_still_prints_the_result_and_names_the_areas_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m icml25.rl.experiments.gas --out figs`` where matplotlib is missing: no traceback, the
    result is printed, and a one-line hint names the area's [plots] extra."""
    from icml25.kernels import experiment

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setattr(experiment, "_matplotlib_available", lambda: False)

    def run(*, quick: bool, seed: int, out_dir: Path | None) -> Report:
        if out_dir is not None:
            new_figure()  # raises ImportError: what crashed the command before
        return _fake_run(quick=quick, seed=seed, out_dir=out_dir)

    run.__module__ = "icml25.causal_discovery.experiments.arrow"
    assert experiment_main(run, ["--out", str(tmp_path / "figs")]) == 0
    captured = capsys.readouterr()
    assert "P90 PASS error=0.2" in captured.out
    (hint,) = captured.err.splitlines()
    assert hint == "figures off: matplotlib is not installed (pip install 'icml25-causal-discovery[plots]')"
    assert not (tmp_path / "figs").exists()


def test_the_headlines_direction_is_stated_or_inferred_from_its_name() -> None:
    from icml25.kernels.report import direction, short_line

    def report(headline: str, **kwargs) -> Report:
        return Report(paper="P90", claim="c", threshold="t", passed=True, metrics={headline: 0.5, "b": 1.0},
                      headline=headline, baseline="b", **kwargs)  # fmt: skip

    assert direction(report("k2vae_crps")) == "lower" and direction(report("gas_success")) == "higher"
    assert direction(report("acc_error")) == "lower"  # an error of an accuracy is still an error
    assert direction(report("text_patch")) is None
    assert direction(report("text_patch", better="higher")) == "higher"
    assert short_line(report("lr_auroc")) == "lr_auroc=0.5 ↑ (baseline 1)"
    assert short_line(report("msae_uw_auc", better="lower")) == "msae_uw_auc=0.5 ↓ (baseline 1)"
    with pytest.raises(ValueError, match="better must be one of"):
        report("x", better="up")
