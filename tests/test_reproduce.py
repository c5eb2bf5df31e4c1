"""The reproduce command end to end, with experiments injected through its discovery function."""

from __future__ import annotations

from pathlib import Path

import pytest
import reproduce

from icml25.kernels import Report


def _passing(*, quick: bool, seed: int, out_dir: Path) -> Report:
    figure = out_dir / "curve.png"
    figure.write_bytes(b"\x89PNG\r\n\x1a\n")
    return Report(
        paper="P90",
        claim="The method halves the error of the baseline.",
        threshold="error <= 0.5 x baseline",
        passed=True,
        metrics={"error": 0.2, "baseline_error": 0.5, "quick": float(quick)},
        headline="error",
        baseline="baseline_error",
        figures=[figure],
    )


def _failing(*, quick: bool, seed: int, out_dir: Path) -> Report:
    return Report(
        paper="P91",
        claim="The method beats the baseline.",
        threshold="accuracy >= baseline + 0.1",
        passed=False,
        metrics={"accuracy": 0.61, "baseline_accuracy": 0.6},
        headline="accuracy",
        baseline="baseline_accuracy",
    )


def _raising(*, quick: bool, seed: int, out_dir: Path) -> Report:
    raise RuntimeError("diverged at step 3")


def test_pass_and_fail_rows_and_nonzero_exit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = reproduce.main(["--out", str(tmp_path)], discover=lambda: {"P90": _passing, "P91": _failing})
    out = capsys.readouterr().out
    assert code == 1
    assert "P90 PASS error=0.2 (baseline 0.5, threshold error <= 0.5 x baseline)" in out
    assert "P91 FAIL accuracy=0.61 (baseline 0.6, threshold accuracy >= baseline + 0.1)" in out
    report = (tmp_path / "REPORT.md").read_text()
    assert "| P90 | PASS | error=0.2 | baseline_error=0.5 | error <= 0.5 x baseline |" in report
    assert "| P91 | FAIL | accuracy=0.61 | baseline_accuracy=0.6 |" in report
    assert "1/2 passed" in report and "Mode: **quick**" in report
    assert "![P90 curve](P90/curve.png)" in report
    assert "The method halves the error of the baseline." in report


def test_only_and_full_select_and_forward(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = reproduce.main(
        ["--only", "P90", "--full", "--out", str(tmp_path)],
        discover=lambda: {"P90": _passing, "P91": _failing},
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "P90 PASS" in out and "P91" not in out
    report = (tmp_path / "REPORT.md").read_text()
    assert "Mode: **full**" in report and "| quick | 0 |" in report


def test_an_experiment_that_raises_is_an_error_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = reproduce.main(["--out", str(tmp_path)], discover=lambda: {"P92": _raising, "P90": _passing})
    out = capsys.readouterr().out
    assert code == 1
    assert "P92 ERROR error: RuntimeError: diverged at step 3" in out
    assert "| P92 | ERROR |" in (tmp_path / "REPORT.md").read_text()


def test_unknown_only_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert reproduce.main(["--only", "P99", "--out", str(tmp_path)], discover=lambda: {"P90": _passing}) == 2
    assert "P99 not installed" in capsys.readouterr().err


def test_nothing_installed_says_so_and_succeeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert reproduce.main(["--out", str(tmp_path)], discover=dict) == 0
    assert "nothing to reproduce" in capsys.readouterr().out


def test_discovery_finds_the_registered_entry_points() -> None:
    from importlib.metadata import entry_points

    registered = {ep.name for ep in entry_points(group=reproduce.GROUP)}
    assert set(reproduce.discover()) == registered
