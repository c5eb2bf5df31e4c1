"""P39 quick reproduction: the RC learner beats the true-only baseline, the zero-shot scorer and its
pseudo-labels on digits; with the yes/no answers decoupled from the instances (broken) the gate fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from icml25.causal_discovery.experiments import tfl as exp
from icml25.kernels.experiment import evaluate_checks


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory: pytest.TempPathFactory):
    return exp.run(quick=True, seed=0, out_dir=tmp_path_factory.mktemp("p39"))


def test_quick_run_passes_its_gate(quick_report) -> None:
    m = quick_report.metrics
    assert quick_report.passed, quick_report.metrics
    assert m["digits_rc"] >= m["digits_true_only"] + 0.05
    assert m["digits_rc"] >= m["digits_pseudo"] + 0.01
    assert m["digits_rc"] < m["digits_supervised"]  # the supervised upper bound stays above
    assert 0.08 < m["digits_true_fraction"] < 0.14  # about 1/K of the answers are "yes"
    assert m["digits_answer_error"] < 0.06  # the annotator is right with probability 0.97
    assert all(Path(f).exists() for f in quick_report.figures)


def test_broken_variant_fails_the_quick_gate() -> None:
    """RC trained on answers permuted across instances (the TFL information removed) fails the gate."""
    m = exp.measure(exp.QUICK, seed=0, broken=True)
    verdict = evaluate_checks(exp.checks(exp.QUICK), m)
    assert not all(verdict.values())
    assert not verdict["digits: RC accuracy >= pseudo-label + 0.01"]


def test_full_threshold_text_names_every_check() -> None:
    text = exp.threshold(quick=False)
    assert "digits: RC >= true-only + 0.10" in text and "fashion: RC >= pseudo-label" in text


@pytest.mark.slow
def test_full_run_is_the_recorded_known_miss() -> None:
    """The full run (about 1 min of CPU, 3 min on the loaded 2-core machine) misses exactly "RC >= pseudo-label
    + 0.01" on digits (recorded: 0.830 vs 0.822) and holds every other check, the complementary baseline
    included (0.830 vs 0.710)."""
    report = exp.run(quick=False, seed=0)
    assert report.passed is False
    assert [name for name, ok in report.checks.items() if not ok] == ["digits: RC >= pseudo-label + 0.01"]
    assert report.metrics["digits_rc"] >= report.metrics["digits_complementary"] + 0.08
