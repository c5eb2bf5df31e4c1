"""P46 reproduction: the quick gate passes, and the broken variant (time-constant rates) fails it."""

from __future__ import annotations

from pathlib import Path

import pytest

from icml25.rl.experiments import cdkf_scheduling as exp


@pytest.fixture(scope="module")
def quick_report():
    return exp.run(quick=True, seed=0)


def test_quick_run_passes(quick_report) -> None:
    r = quick_report
    assert r.passed, r.failed_checks
    m = r.metrics
    assert m["bound_valid_fraction"] >= 0.95
    assert m["window_bound_opt"] <= 0.85 * m["baseline_window_bound_const"]
    # The optimiser puts the noisy sensor's measurements at the window [6, 8].
    assert m["expected_count_noisy"] > 3 and m["expected_count_accurate"] < 0.5


def test_broken_variant_constant_rates_fails_the_quick_gate() -> None:
    """With the rates tied to one constant per sensor (the time variation removed), the optimiser can only
    match the best constant split: the ratio is about 1, above the 0.85 bar."""
    r = exp.evaluate(exp.QUICK, seed=0, n_pieces=1)
    assert not r.passed
    assert [c for c, ok in r.checks.items() if not ok] == [exp.checks(exp.QUICK)[1].name]
    assert r.metrics["window_bound_ratio"] > 0.95


def test_threshold_texts_and_settings() -> None:
    assert "0.85 x best constant" in exp.threshold(True)
    full = exp.threshold(False)
    assert "0.8 x best constant" in full and "|u(T/2)| < 1" in full and "deterministic" in full
    assert exp.FULL.M == 100 and exp.QUICK.M == 50


@pytest.mark.slow
def test_quick_run_writes_the_figure(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    r = exp.run(quick=True, seed=1, out_dir=tmp_path)
    assert r.passed and r.figures and Path(r.figures[0]).exists()
