"""The reproduce command (``icml25 reproduce``, :mod:`icml25.kernels.reproduce`) end to end, with experiments
injected through its discovery function; ``tools/reproduce.py`` is the same command with the repository's
ledger folder."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import catalog
import pytest
from conftest import ROOT

from icml25.kernels import Report, reproduce


@pytest.fixture(autouse=True)
def _figures_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The injected experiments write a fake PNG themselves: figures on, whether matplotlib is here or not."""
    monkeypatch.setattr(reproduce, "figures_available", lambda: True)


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


def _expect(**misses: str):
    """Expectations as the catalog gives them: ``P91="reason"`` marks a known miss in both modes."""
    return lambda: {pid: reproduce.Expectation(("quick", "full"), reason) for pid, reason in misses.items()}


def _report(out: Path) -> str:
    """The REPORT.md of the last run written under ``out`` (``<out>/<run folder>/REPORT.md``)."""
    return max(out.glob("*/REPORT.md"), key=lambda path: path.stat().st_mtime_ns).read_text()


def _main(argv: list[str], experiments: dict, **misses: str) -> int:
    return reproduce.main(argv, discover=lambda: experiments, expectations=_expect(**misses))


def test_pass_and_fail_rows_and_nonzero_exit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = _main(["--out", str(tmp_path)], {"P90": _passing, "P91": _failing})
    out = capsys.readouterr().out
    assert code == 1
    assert "P90 PASS error=0.2 ↓ (baseline 0.5) 0.0s" in out  # lower error is better
    assert "P91 FAIL accuracy=0.61 ↑ (baseline 0.6) 0.0s" in out
    assert "threshold error" not in out and "threshold accuracy" not in out  # in REPORT.md
    report = _report(tmp_path)
    assert "| P90 | PASS | error=0.2 ↓ | baseline_error=0.5 | error <= 0.5 x baseline |" in report
    assert "| P91 | FAIL | accuracy=0.61 ↑ | baseline_accuracy=0.6 | accuracy >= baseline + 0.1 |" in report
    assert "2 papers: 1 PASS, 1 FAIL" in report and "Mode: **quick**" in report
    assert "![P90 curve](P90/curve.png)" in report
    assert "The method halves the error of the baseline." in report


def test_only_and_full_select_and_forward(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = _main(["--only", "P90", "--full", "--out", str(tmp_path)], {"P90": _passing, "P91": _failing})
    out = capsys.readouterr().out
    assert code == 0
    assert "P90 PASS" in out and "P91" not in out
    report = _report(tmp_path)
    assert "Mode: **full**" in report and "| quick | 0 |" in report


def test_an_experiment_that_raises_is_an_error_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _main(["--out", str(tmp_path)], {"P92": _raising, "P90": _passing})
    out = capsys.readouterr().out
    assert code == 1
    assert "P92 ERROR error: RuntimeError: diverged at step 3" in out
    assert "| P92 | ERROR |" in _report(tmp_path)


def test_unknown_only_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["--only", "P99", "--out", str(tmp_path)], {"P90": _passing}) == 2
    assert "--only P99: unknown paper (the catalog lists P00 to P54" in capsys.readouterr().err


def test_nothing_installed_says_so_and_succeeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["--out", str(tmp_path)], {}) == 0
    assert "nothing to reproduce" in capsys.readouterr().out


def test_discovery_finds_the_registered_entry_points() -> None:
    from importlib.metadata import entry_points

    registered = {ep.name for ep in entry_points(group=reproduce.GROUP)}
    assert set(reproduce.discover()) == registered


def test_known_miss_is_reported_with_its_reason_and_exits_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = "accuracy 0.61 vs 0.60 needs +0.1; the small model saturates"
    code = _main(["--out", str(tmp_path)], {"P90": _passing, "P91": _failing}, P91=reason)
    out = capsys.readouterr().out
    assert code == 0
    assert "P91 KNOWN-MISS accuracy=0.61" in out and f"known miss: {reason}" in out
    assert f"known miss P91: {reason}" in out  # the end-of-run summary
    report = _report(tmp_path)
    assert "2 papers: 1 PASS, 1 KNOWN-MISS" in report
    assert f"## Known misses\n\n- **P91**: {reason}" in report


def test_a_known_miss_that_passes_is_an_unexpected_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _main(["--out", str(tmp_path)], {"P90": _passing}, P90="was a miss")
    assert code == 1
    assert "P90 UNEXPECTED-PASS error=0.2" in capsys.readouterr().out


def test_a_miss_narrowed_to_full_mode_still_must_pass_quick(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full_only = lambda: {"P91": reproduce.Expectation(("full",), "full-size run misses")}  # noqa: E731
    quick = reproduce.main(
        ["--out", str(tmp_path)], discover=lambda: {"P91": _failing}, expectations=full_only
    )
    full = reproduce.main(
        ["--full", "--out", str(tmp_path)], discover=lambda: {"P91": _failing}, expectations=full_only
    )
    out = capsys.readouterr().out
    assert (quick, full) == (1, 0)
    assert "P91 FAIL" in out and "P91 KNOWN-MISS" in out


def _checked(passed_direction: bool):
    def run(*, quick: bool, seed: int, out_dir: Path) -> Report:
        checks = {"error <= 0.5 x baseline": passed_direction, "error finite": True}
        return Report(
            paper="P93",
            claim="The method halves the error of the baseline.",
            threshold="; ".join(checks),
            passed=all(checks.values()),
            checks=checks,
            metrics={"error": 0.2 if passed_direction else 0.6, "baseline_error": 0.5},
            headline="error",
            baseline="baseline_error",
        )

    return run


def test_breaking_a_passing_paper_fails_the_run_and_names_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main(["--out", str(tmp_path)], {"P93": _checked(True)}) == 0
    assert _main(["--out", str(tmp_path)], {"P93": _checked(False)}) == 1
    out = capsys.readouterr().out
    assert "P93 FAIL error=0.6" in out and "[failed: error <= 0.5 x baseline]" in out
    assert "| error <= 0.5 x baseline | **no** |" in _report(tmp_path)


def test_record_writes_a_ledger_entry_with_provenance(tmp_path: Path) -> None:
    results = tmp_path / "results"
    argv = ["--full", "--record", "--results", str(results), "--out", str(tmp_path), "--note", "1 seed"]
    assert _main(argv, {"P93": _checked(True)}) == 0
    entry = json.loads((results / "P93.json").read_text())
    assert entry["paper"] == "P93" and entry["mode"] == "full" and entry["outcome"] == "PASS"
    assert entry["passed"] is True and entry["checks"] == {
        "error <= 0.5 x baseline": True,
        "error finite": True,
    }
    assert entry["threshold"] == "error <= 0.5 x baseline; error finite"
    assert entry["metrics"] == {"error": 0.2, "baseline_error": 0.5}
    assert entry["headline"] == "error" and entry["baseline"] == "baseline_error"
    assert entry["seed"] == 0 and entry["seeds"] == [0] and entry["note"] == "1 seed"
    assert entry["machine"]["cores"] >= 1 and entry["machine"]["cpu"]
    assert entry["date"].startswith("20") and entry["wall_seconds"] >= 0
    assert set(catalog.LEDGER_FIELDS) <= set(entry)


def test_rejudge_rereads_a_recorded_outcome_from_the_catalog_without_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results"
    argv = ["--full", "--record", "--results", str(results), "--out", str(tmp_path)]
    assert _main(argv, {"P93": _checked(False)}) == 1  # recorded as FAIL: the catalog expected a pass
    before = json.loads((results / "P93.json").read_text())
    assert before["outcome"] == "FAIL" and "miss_reason" not in before

    def never(**kwargs: object) -> Report:
        raise AssertionError("--rejudge must not run the experiment")

    rejudge = ["--only", "p93", "--rejudge", "--results", str(results)]
    assert _main(rejudge, {"P93": never}, P93="error 0.6 > 0.5: too few steps") == 0
    assert "P93: FAIL -> KNOWN-MISS" in capsys.readouterr().out
    after = json.loads((results / "P93.json").read_text())
    assert after["outcome"] == "KNOWN-MISS" and after["miss_reason"] == "error 0.6 > 0.5: too few steps"
    assert after["rejudged"]["was"] == "FAIL" and after["rejudged"]["date"].startswith("20")
    unchanged = {k: v for k, v in after.items() if k not in ("outcome", "miss_reason", "rejudged")}
    assert unchanged == {k: v for k, v in before.items() if k != "outcome"}  # the run itself is as recorded
    assert _main(rejudge, {"P93": never}) == 0  # the catalog expects a pass again: FAIL, no reason
    after = json.loads((results / "P93.json").read_text())
    assert (
        after["outcome"] == "FAIL" and "miss_reason" not in after and after["rejudged"]["was"] == "KNOWN-MISS"
    )


def test_rejudge_needs_only_and_a_recorded_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _main(["--rejudge", "--results", str(tmp_path)], {"P93": _checked(True)})
    assert exc.value.code == 2 and "--only" in capsys.readouterr().err
    assert _main(["--only", "P93", "--rejudge", "--results", str(tmp_path)], {"P93": _checked(True)}) == 2
    assert "no recorded full run" in capsys.readouterr().err


def test_record_needs_full(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _main(["--record", "--out", str(tmp_path)], {"P93": _checked(True)})
    assert exc.value.code == 2 and "--full" in capsys.readouterr().err


def test_a_run_whose_threshold_differs_from_its_module_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = types.ModuleType("p94_experiment")
    module.threshold = lambda quick=True: "error <= 0.4 x baseline"  # the module now states another rule
    module.run = _checked(True)
    monkeypatch.setitem(sys.modules, "p94_experiment", module)
    experiment = reproduce._lazy_run("p94_experiment")
    assert _main(["--out", str(tmp_path)], {"P94": experiment}) == 1
    assert "P94 ERROR" in capsys.readouterr().out


def test_without_matplotlib_the_papers_run_without_figures_and_it_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reproduce, "figures_available", lambda: False)
    seen = []

    def run(*, quick: bool, seed: int, out_dir: Path | None) -> Report:
        seen.append(out_dir)
        return _checked(True)(quick=quick, seed=seed, out_dir=tmp_path)

    assert _main(["--out", str(tmp_path)], {"P93": run}) == 0
    assert seen == [None] and not (tmp_path / "P93").exists()
    captured = capsys.readouterr()
    assert "figures off: matplotlib is not installed (pip install matplotlib)" in captured.err
    assert "P93 PASS" in captured.out


def test_the_expectations_come_from_the_shipped_catalog() -> None:
    expected = reproduce.catalog_expectations()
    papers = catalog.load()
    assert set(expected) == {p.id for p in papers if p.status == "implemented"}
    for p in papers:
        if p.id in expected:
            assert expected[p.id].misses(quick=True) == p.expects_miss("quick")
            assert expected[p.id].misses(quick=False) == p.expects_miss("full")
            assert expected[p.id].reason == p.miss_reason


def test_tools_wrapper_records_into_the_repository_ledger_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tools/reproduce.py`` is ``icml25 reproduce`` with ``--results <repository>/results`` and the
    repository's git provenance; the ledger folder is redirected here so the real one stays untouched."""
    import reproduce as tools_reproduce  # tools/reproduce.py (tools/ is on sys.path, see conftest)

    assert tools_reproduce.RESULTS == ROOT / "results"
    monkeypatch.setattr(tools_reproduce, "RESULTS", tmp_path / "ledger")
    monkeypatch.chdir(tmp_path)  # not the repository: the provenance must still be read from it
    code = tools_reproduce.main(
        ["--full", "--record", "--out", str(tmp_path / "out")],
        discover=lambda: {"P93": _checked(True)},
        expectations=dict,
    )
    assert code == 0
    entry = json.loads((tmp_path / "ledger" / "P93.json").read_text())
    if (ROOT / ".git").exists():
        assert len(entry["git_commit"]) == 40 and isinstance(entry["git_dirty"], bool)


def test_tools_wrapper_help_names_the_repository_ledger(capsys: pytest.CaptureFixture[str]) -> None:
    import reproduce as tools_reproduce

    with pytest.raises(SystemExit) as exc:
        tools_reproduce.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "tools/reproduce.py" in out and "--record" in out


def test_git_dirty_ignores_the_ledger_folder_a_multi_paper_record_writes(tmp_path: Path) -> None:
    from icml25.kernels.reproduce import _dirty

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "P01.json").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    (tmp_path / "results" / "P01.json").write_text('{"new": 1}\n')  # written by the same --record run
    assert _dirty(tmp_path, tmp_path / "results") is False
    assert _dirty(tmp_path, None) is True  # without the ledger folder every tracked change counts
    (tmp_path / "code.py").write_text("x = 2\n")
    assert _dirty(tmp_path, tmp_path / "results") is True


def _retrieval(method: float, baseline: float):
    """An experiment whose claim needs the baseline above chance (1/16) to say anything."""
    from icml25.kernels.experiment import Check

    def run(*, quick: bool, seed: int, out_dir: Path) -> Report:
        return Report.from_checks(
            paper="P94",
            claim="The method retrieves keys far better than the baseline.",
            checks=[Check("method >= baseline + 0.05", lambda m: m["method"] >= m["baseline"] + 0.05)],
            preconditions=[Check("baseline >= 2 x chance", lambda m: m["baseline"] >= 2 * m["chance"])],
            metrics={"method": method, "baseline": baseline, "chance": 0.0625},
            headline="method",
            baseline="baseline",
        )

    return run


def test_a_failed_precondition_is_inconclusive_exits_one_and_is_never_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results"
    argv = ["--full", "--record", "--results", str(results), "--out", str(tmp_path)]
    # a known miss in the catalog does not make an inconclusive run a miss
    both_at_chance = _retrieval(method=0.061, baseline=0.062)  # the method "misses", but that says nothing
    assert _main(argv, {"P94": both_at_chance}, P94="the gap does not appear at CPU scale") == 1
    out = capsys.readouterr().out
    assert "P94 INCONCLUSIVE method=0.061" in out
    assert "[precondition failed: baseline >= 2 x chance]" in out
    assert "not recorded: an inconclusive run is not a result" in out
    assert not (results / "P94.json").exists()
    report = _report(tmp_path)
    assert "| P94 | INCONCLUSIVE |" in report and "| baseline >= 2 x chance | **no** |" in report
    assert "1 papers: 1 INCONCLUSIVE" in report


def test_a_held_precondition_leaves_the_verdict_to_the_checks(tmp_path: Path) -> None:
    results = tmp_path / "results"
    argv = ["--full", "--record", "--results", str(results), "--out", str(tmp_path)]
    assert _main(argv, {"P94": _retrieval(method=0.36, baseline=0.22)}) == 0
    entry = json.loads((results / "P94.json").read_text())
    assert entry["outcome"] == "PASS" and entry["preconditions"] == {"baseline >= 2 x chance": True}


def _long_report(*, quick: bool, seed: int, out_dir: Path | None) -> Report:
    checks = {
        f"check {i}: a long condition in words, as the real experiments name theirs": i != 2 for i in range(6)
    }
    return Report(
        paper="P95",
        claim="A claim.",
        threshold="; ".join(checks),
        passed=False,
        metrics={"a_rather_long_headline_metric_name_error": 0.123456, "baseline_a_rather_long_name": 0.5},
        headline="a_rather_long_headline_metric_name_error",
        baseline="baseline_a_rather_long_name",
        checks=checks,
    )


def test_result_lines_are_short_and_the_report_has_the_full_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = "a known miss whose reason runs on " + "and on " * 60 + "to its cause"
    assert _main(["--out", str(tmp_path)], {"P95": _long_report}, P95=reason) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip()]
    assert max(len(line) for line in lines if not line.startswith("report:")) <= reproduce.LINE_WIDTH
    (result,) = [line for line in lines if line.startswith("P95 ")]
    assert result.startswith(
        "P95 KNOWN-MISS a_rather_long_headline_metric_name_error=0.1235 ↓ (baseline 0.5)"
    )
    assert "[failed: check 2" in result and "…" in result
    report = _report(tmp_path)
    assert reason in report and "check 5: a long condition in words" in report


def test_each_run_writes_its_own_report_folder_and_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """P90 then P91 into the same --out: the second run does not overwrite the first run's report."""
    assert _main(["--only", "P90", "--out", str(tmp_path)], {"P90": _passing, "P91": _failing}) == 0
    first = capsys.readouterr().out
    assert _main(["--only", "p91", "--out", str(tmp_path)], {"P90": _passing, "P91": _failing}) == 1
    second = capsys.readouterr().out
    reports = sorted(tmp_path.glob("*/REPORT.md"))
    assert len(reports) == 2
    texts = {path.read_text().count("| P90 | PASS"): path for path in reports}
    assert set(texts) == {0, 1}
    for printed, path in ((first, texts[1]), (second, texts[0])):
        assert f"report: {path} " in printed
    assert (texts[1].parent / "P90" / "curve.png").is_file()  # the figures sit beside their report


def test_run_folders_are_timestamped_and_never_reused(tmp_path: Path) -> None:
    import datetime as dt

    now = dt.datetime(2026, 1, 2, 3, 4, 5)
    first = reproduce.run_folder(tmp_path, quick=True, now=now)
    second = reproduce.run_folder(tmp_path, quick=True, now=now)
    assert first.name == "20260102-030405-quick" and second.name == "20260102-030405-quick-2"
    assert reproduce.run_folder(tmp_path, quick=False, now=now).name == "20260102-030405-full"


def test_paper_ids_are_case_insensitive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["--only", "p90", "--out", str(tmp_path)], {"P90": _passing, "P91": _failing}) == 0
    out = capsys.readouterr().out
    assert "P90 PASS" in out and "P91" not in out


def test_a_known_paper_that_is_not_installed_names_its_package_and_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    papers = {p.id: p for p in catalog.load()}
    implemented = next(p for p in papers.values() if p.status == "implemented")
    planned = [p for p in papers.values() if p.status != "implemented"]
    argv = ["--only", implemented.id.lower(), "--out", str(tmp_path)]
    assert _main(argv, {"P90": _passing}) == 2
    err = capsys.readouterr().err
    assert (
        f"--only {implemented.id}: {implemented.title} is in {implemented.distribution}, which is not" in err
    )
    assert f"pip install '{implemented.distribution}[plots]'" in err
    if planned:
        assert _main(["--only", planned[0].id, "--out", str(tmp_path)], {"P90": _passing}) == 2
        assert f"--only {planned[0].id}: {planned[0].title}: not implemented" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # a usage error writes no report


def test_without_matplotlib_the_hint_names_the_areas_being_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reproduce, "figures_available", lambda: False)
    monkeypatch.setitem(sys.modules, "p93_experiment", types.SimpleNamespace(run=_checked(True)))
    experiment = reproduce._lazy_run("p93_experiment", "icml25-causal-discovery", "0.1.0")
    assert _main(["--out", str(tmp_path)], {"P93": experiment}) == 0
    err = capsys.readouterr().err
    assert "pip install 'icml25-causal-discovery[plots]'" in err and "icml25-rl" not in err


def test_the_report_shows_each_papers_deviations_from_its_official_code(tmp_path: Path) -> None:
    """REPORT.md carries the paper's list from the shipped deviations.toml, as its package README does."""
    from icml25.kernels import catalog as shipped

    assert _main(["--out", str(tmp_path)], {"P05": _passing}) == 0
    report = _report(tmp_path)
    review = shipped.load_deviations()["P05"]
    assert review.deviations and review.markdown() in report
    assert "**Low-level policy.**" in report
