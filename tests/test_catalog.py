"""The catalog, README table, entry points and modules agree; the catalog's content is sane."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import catalog
import pytest
from conftest import ROOT


def test_repository_is_consistent() -> None:
    assert catalog.check(ROOT) == []


def test_catalog_lists_all_55_papers_with_p47_out_of_scope() -> None:
    papers = catalog.load()
    assert [p.id for p in papers] == [f"P{i:02d}" for i in range(55)]
    by_id = {p.id: p for p in papers}
    assert by_id["P47"].status == "out-of-scope" and "no algorithm" in by_id["P47"].reason
    assert all(p.status in catalog.STATUSES for p in papers)


@pytest.fixture
def scratch_repo(tmp_path: Path) -> Path:
    """A copy of what catalog.check reads, to break on purpose."""
    for rel in ["README.md", catalog.CATALOG_PATH] + [
        f"{d}/{name}" for d in catalog.PACKAGE_DIRS.values() for name in ("pyproject.toml", "README.md")
    ]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    if (ROOT / "results").is_dir():
        shutil.copytree(ROOT / "results", tmp_path / "results")
    # the sources, whose hash the ledger entries record, and the workspace that says where they live
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copy(ROOT / "shared-kernels" / "pyproject.toml", tmp_path / "shared-kernels" / "pyproject.toml")
    for src in catalog.source_dirs(ROOT):
        shutil.copytree(
            src,
            tmp_path / src.relative_to(ROOT),
            ignore=shutil.ignore_patterns("__pycache__"),
            dirs_exist_ok=True,
        )
    return tmp_path


def test_check_reports_a_stale_readme(scratch_repo: Path) -> None:
    readme = scratch_repo / "README.md"
    readme.write_text(readme.read_text().replace("| P05 |", "| P5 |"))
    assert any("out of date" in line for line in catalog.check(scratch_repo))


# Every in-scope paper is implemented now, so the tests that need a planned paper demote one in a copy.
_DEMOTED = next(
    p for p in reversed(catalog.load()) if p.status == "implemented" and p.package in catalog.PACKAGE_DIRS
)


def _demote(text: str, paper_id: str = _DEMOTED.id) -> str:
    """Catalog ``text`` with ``paper_id`` turned back into a planned paper (only id, slug, package, title kept)."""
    head, anchor, rest = text.partition(f'id = "{paper_id}"\n')
    block, nxt, tail = rest.partition("[[paper]]")
    kept = [
        line
        for line in block.splitlines(keepends=True)
        if line.split(" = ")[0] in ("slug", "package", "title")
    ]
    return head + anchor + "".join(kept) + 'status = "planned"\n\n' + nxt + tail


def _planned_paper(scratch_repo: Path) -> catalog.Paper:
    """Demote one paper in ``scratch_repo``: catalog, entry point, ledger entry and README agree it is planned."""
    cat = scratch_repo / catalog.CATALOG_PATH
    cat.write_text(_demote(cat.read_text()))
    pyproject = scratch_repo / catalog.PACKAGE_DIRS[_DEMOTED.package] / "pyproject.toml"
    lines = pyproject.read_text().splitlines(keepends=True)
    pyproject.write_text("".join(line for line in lines if not line.startswith(f"{_DEMOTED.id} = ")))
    (scratch_repo / "results" / f"{_DEMOTED.id}.json").unlink(missing_ok=True)
    for module in (_DEMOTED.module, _DEMOTED.entry_point):  # a planned paper has no module on disk
        as_file, as_package = catalog._module_path(scratch_repo, _DEMOTED.package, module)
        as_file.unlink(missing_ok=True)
        shutil.rmtree(as_package.parent, ignore_errors=True)
    catalog.write_readme(catalog.load(cat), scratch_repo / "README.md")
    assert not [line for line in catalog.check(scratch_repo) if line.startswith(f"{_DEMOTED.id}:")]
    return next(p for p in catalog.load(cat) if p.id == _DEMOTED.id)


def test_check_reports_an_entry_point_for_a_planned_paper(scratch_repo: Path) -> None:
    paper = _planned_paper(scratch_repo)
    pyproject = scratch_repo / catalog.PACKAGE_DIRS[paper.package] / "pyproject.toml"
    group = '[project.entry-points."icml25.papers"]'
    target = f'{paper.id} = "icml25.{paper.area}.experiments.{paper.slug.replace("-", "_")}"'
    pyproject.write_text(pyproject.read_text().replace(group, f"{group}\n{target}"))
    problems = catalog.check(scratch_repo)
    assert any(line.startswith(f"{paper.id}:") and "registers an entry point" in line for line in problems)


def test_check_reports_an_implemented_paper_without_module(scratch_repo: Path) -> None:
    paper = _planned_paper(scratch_repo)
    cat = scratch_repo / catalog.CATALOG_PATH
    text = cat.read_text()
    at = text.index(f'id = "{paper.id}"')
    name = paper.slug.replace("-", "_") + "_unbuilt"  # the demoted paper's real module exists
    implemented = (
        f'scope = "claim"\nstatus = "implemented"\nmodule = "icml25.{paper.area}.{name}"\n'
        f'entry_point = "icml25.{paper.area}.experiments.{name}"'
    )
    cat.write_text(text[:at] + text[at:].replace('status = "planned"', implemented, 1))
    catalog.write_readme(catalog.load(cat), scratch_repo / "README.md")
    problems = catalog.check(scratch_repo)
    assert any(line.startswith(f"{paper.id}:") and "does not exist" in line for line in problems)
    assert any(line.startswith(f"{paper.id}:") and "pyproject has None" in line for line in problems)


def test_load_rejects_implemented_paper_without_entry_point(tmp_path: Path) -> None:
    text = _demote(catalog.CATALOG.read_text())
    first = _DEMOTED.id
    (tmp_path / "catalog.toml").write_text(text.replace('status = "planned"', 'status = "implemented"', 1))
    with pytest.raises(ValueError, match=f"{first}: an implemented paper needs module"):
        catalog.load(tmp_path / "catalog.toml")


def test_ledger_matches_what_the_installed_experiments_state_now() -> None:
    """Every implemented paper's recorded threshold is the one its experiment states (not stale)."""
    assert catalog.ledger_problems(ROOT) == []


def _implemented() -> list[catalog.Paper]:
    """Implemented papers whose full run is recorded (a full_run_pending paper has no ledger entry yet)."""
    return [p for p in catalog.load() if p.status == "implemented" and not p.full_run_pending]


def test_a_changed_threshold_makes_the_ledger_entry_stale(scratch_repo: Path) -> None:
    paper = _implemented()[0]
    recorded = json.loads((scratch_repo / "results" / f"{paper.id}.json").read_text())["threshold"]
    current = {p.id: json.loads((scratch_repo / "results" / f"{p.id}.json").read_text())["threshold"]
               for p in _implemented()}  # fmt: skip
    assert catalog.ledger_problems(scratch_repo, thresholds=current) == []
    current[paper.id] = recorded.replace(">=", ">", 1) + " (tightened)"
    problems = catalog.ledger_problems(scratch_repo, thresholds=current)
    assert len(problems) == 1 and problems[0].startswith(f"results/{paper.id}.json is stale")


def test_check_reports_an_implemented_paper_without_a_recorded_full_run(scratch_repo: Path) -> None:
    paper = _implemented()[0]
    (scratch_repo / "results" / f"{paper.id}.json").unlink()
    catalog.write_readme(catalog.load(scratch_repo / catalog.CATALOG_PATH), scratch_repo / "README.md")
    ledger_lines = [line for line in catalog.check(scratch_repo) if "full run" in line or "results/" in line]
    assert ledger_lines == [
        f"{paper.id}: implemented but no full run is recorded "
        f"(python tools/reproduce.py --only {paper.id} --full --record)"
    ]


def test_check_reports_a_ledger_that_disagrees_with_the_expectation(scratch_repo: Path) -> None:
    miss = next(p for p in _implemented() if p.expects_miss("full"))
    path = scratch_repo / "results" / f"{miss.id}.json"
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "passed": True}))
    catalog.write_readme(catalog.load(scratch_repo / catalog.CATALOG_PATH), scratch_repo / "README.md")
    problems = catalog.check(scratch_repo)
    assert any(line.startswith(f"{miss.id}: the catalog expects a known miss") for line in problems)


def test_readme_table_shows_claim_measured_baseline_and_status_from_the_ledger() -> None:
    table = catalog.render_table(catalog.load(), catalog.load_ledger(ROOT / "results"))
    for paper in (p for p in catalog.load() if p.status == "implemented"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {paper.id} |"))
        if paper.full_run_pending:  # its current full run is not recorded: the row says so, no stale numbers
            assert f"full run pending ({paper.full_run_pending})" in row and "reproduced" not in row
            continue
        entry = json.loads((ROOT / "results" / f"{paper.id}.json").read_text())
        assert f"{entry['headline']} = " in row and f"results/{paper.id}.json" in row
        assert ("known miss" in row) == paper.expects_miss("full")
        assert ("reproduced" in row) == (not paper.expects_miss("full"))
    for paper in (p for p in catalog.load() if p.expect == "miss"):
        assert f"- **{paper.id}**" in table and paper.miss_reason in table


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ('expect = "miss"', "expect = 'miss' needs an implemented paper and a miss_reason"),
        ('expect = "maybe"', "expect must be one of"),
        ('miss_reason = "x"', "miss_reason given but expect = 'pass'"),
        ('scope_note = "x"', "scope_note is for a 'mechanism' or 'partial' scope, got scope 'claim'"),
        (
            'expect = "miss"\nmiss_reason = "AUROC 0.91"\noff_ledger_numbers = ["0.5"]',
            r"off_ledger_numbers must be quoted in miss_reason, \['0.5'\] are not",
        ),
    ],
)
def test_load_rejects_a_malformed_expectation(tmp_path: Path, fields: str, message: str) -> None:
    text = catalog.CATALOG.read_text()
    anchor = 'entry_point = "icml25.rl.experiments.gas"'
    (tmp_path / "catalog.toml").write_text(text.replace(anchor, f"{anchor}\n{fields}"))
    with pytest.raises(ValueError, match=f"P05: {message}"):
        catalog.load(tmp_path / "catalog.toml")


def test_the_installed_icml25_kernels_ships_this_catalog() -> None:
    """``icml25.kernels.catalog.load()`` reads the package data of the installed wheel (importlib.resources):
    the same papers as the repository's file, which the tools validate against the workspace's areas."""
    from icml25.kernels import catalog as shipped

    assert shipped.load() == catalog.load()
    assert shipped.load(catalog.CATALOG) == catalog.load()


def test_the_tools_reject_a_package_the_workspace_does_not_have(tmp_path: Path) -> None:
    from icml25.kernels import catalog as shipped

    text = _demote(catalog.CATALOG.read_text())
    planned = _DEMOTED
    block = f'id = "{planned.id}"\nslug = "{planned.slug}"\npackage = "{planned.package}"'
    assert block in text
    text = text.replace(block, block.replace(f'package = "{planned.package}"', 'package = "robotics"'))
    (tmp_path / "catalog.toml").write_text(text)
    assert shipped.load(tmp_path / "catalog.toml")  # a well-formed area name, valid on its own
    with pytest.raises(ValueError, match=f"{planned.id}: package must be one of"):
        catalog.load(tmp_path / "catalog.toml")


def test_full_run_pending_is_only_for_implemented_papers(tmp_path: Path) -> None:
    text = _demote(catalog.CATALOG.read_text())
    planned = _DEMOTED
    anchor = f'id = "{planned.id}"\nslug = "{planned.slug}"'
    assert anchor in text
    (tmp_path / "catalog.toml").write_text(text.replace(anchor, f'{anchor}\nfull_run_pending = "x"'))
    with pytest.raises(ValueError, match=f"{planned.id}: full_run_pending is only for implemented papers"):
        catalog.load(tmp_path / "catalog.toml")


def test_check_reports_a_ledger_outcome_that_is_not_the_expected_one(scratch_repo: Path) -> None:
    """``passed`` agrees with the expectation, but the recorded outcome does not (a FAIL recorded before the
    catalog was changed to a known miss): the entry has to be re-recorded under the current expectation."""
    miss = next(p for p in _implemented() if p.expects_miss("full"))
    path = scratch_repo / "results" / f"{miss.id}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "outcome": "FAIL"}))
    problems = catalog.check(scratch_repo)
    assert (
        f"results/{miss.id}.json: records outcome 'FAIL' but the catalog's expectation makes a full run "
        f"'KNOWN-MISS' (re-record: python tools/reproduce.py --only {miss.id} --full --record)" in problems
    )


def test_editing_a_papers_source_makes_its_ledger_entry_stale(scratch_repo: Path) -> None:
    """The ledger records a hash of the sources each full run ran; a later edit of the paper's library
    module (not its experiment, not a threshold) is caught, and only that paper is named."""
    assert [line for line in catalog.check(scratch_repo) if "is stale" in line] == []
    gas = next(p for p in _implemented() if p.id == "P05")
    policy = scratch_repo / "packages/rl/src/icml25/rl/gas/policy.py"
    policy.write_text(policy.read_text() + "\nTEMPERATURE = 0.5  # a change after the run was recorded\n")
    stale = [line for line in catalog.check(scratch_repo) if "is stale" in line]
    assert len(stale) == 1 and stale[0].startswith(
        f"results/{gas.id}.json is stale: the paper's sources changed"
    )


def test_editing_the_reporting_plumbing_or_another_paper_stales_nothing_else(scratch_repo: Path) -> None:
    report = scratch_repo / "shared-kernels/src/icml25/kernels/report.py"
    report.write_text(report.read_text() + "\n# a new column in REPORT.md changes no paper's numbers\n")
    assert [line for line in catalog.check(scratch_repo) if "is stale" in line] == []


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('scope = "claim"\n', "", "an implemented paper needs scope, one of"),
        ('scope = "claim"\n', 'scope = "mechanism"\n', "scope 'mechanism' needs a scope_note"),
        ('scope = "claim"\n', 'scope = "headline"\n', "an implemented paper needs scope"),
    ],
)
def test_every_implemented_paper_states_what_its_gate_tests(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    text = catalog.CATALOG.read_text()
    at = text.index('id = "P05"')
    (tmp_path / "catalog.toml").write_text(text[:at] + text[at:].replace(old, new, 1))
    with pytest.raises(ValueError, match=f"P05: {message}"):
        catalog.load(tmp_path / "catalog.toml")


def test_the_readme_counts_claims_mechanisms_partial_and_misses_from_the_ledger() -> None:
    papers, ledger = catalog.load(), catalog.load_ledger(ROOT / "results")
    recorded = [p for p in papers if p.status == "implemented" and not p.full_run_pending and p.id in ledger]
    claims = sum(ledger[p.id]["passed"] and p.scope == "claim" for p in recorded)
    mechanisms = sum(ledger[p.id]["passed"] and p.scope == "mechanism" for p in recorded)
    misses = sum(not ledger[p.id]["passed"] for p in recorded)
    sentence = catalog.ledger_counts(papers, ledger)
    noun = {1: "mechanism"}.get(mechanisms, "mechanisms")
    assert f"**{claims} claims reproduced**, {mechanisms} {noun} reproduced" in sentence
    assert f"{misses} known misses" in sentence
    assert sentence in (ROOT / "README.md").read_text()
    assert {p.id for p in papers if p.scope == "partial"} >= {"P34"}


def test_a_miss_reason_may_quote_metrics_their_differences_and_ratios_thresholds_and_listed_numbers() -> None:
    entry = {
        "metrics": {"method": 0.20596, "baseline": 0.21408, "seed_gap": -0.0081, "accuracy": 0.93148},
        "checks": {"method <= 0.9 x baseline": False},
    }
    paper = dataclasses.replace(
        _DEMOTED,
        expect="miss",
        miss_in=("full",),
        miss_reason=(
            "method 0.206 vs baseline 0.214 (ratio 0.96, gap 0.008; needs <= 0.9), accuracy 93.1%, 2e-3 "
            "(paper: 0.55); an earlier run gave 0.932"
        ),
        off_ledger_numbers=("0.55",),
    )
    assert catalog.miss_reason_numbers_off_ledger(paper, entry) == ["2e-3", "0.932"]


def test_check_reports_a_miss_reason_number_that_the_ledger_does_not_hold(scratch_repo: Path) -> None:
    cat = scratch_repo / catalog.CATALOG_PATH
    miss = next(
        p
        for p in _implemented()
        if p.expects_miss("full") and not p.full_run_pending and "0." in p.miss_reason
    )
    entry = json.loads((scratch_repo / "results" / f"{miss.id}.json").read_text())
    assert not catalog.miss_reason_numbers_off_ledger(miss, entry)
    wrong = "0.123456"
    assert not catalog.miss_reason_numbers_off_ledger(
        dataclasses.replace(miss, miss_reason=wrong), {"metrics": {"x": 0.1234561}}
    )
    cat.write_text(cat.read_text().replace(miss.miss_reason, miss.miss_reason + f" (and {wrong})"))
    problems = catalog.check(scratch_repo)
    assert any(line.startswith(f"{miss.id}: miss_reason quotes ['{wrong}']") for line in problems), problems
