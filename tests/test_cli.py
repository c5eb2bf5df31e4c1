"""The shipped ``icml25`` command and the installs the README documents, from the built wheels.

* ``icml25 list`` / ``icml25 reproduce`` (and ``python -m icml25.kernels``) in this environment;
* the icml25-kernels wheel ships the catalog and the console script;
* a fresh venv with only icml25-kernels + icml25-rl runs ``icml25 list`` and ``icml25 reproduce --only P05``;
* the README's CPU-only install (CPU torch first, then ``pip install --find-links dist icml25-rl``) pulls no
  CUDA package and no triton; its installed size is printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import CONSTRAINTS, cpu_torch_wheel, find_links, uv, wheel_of

from icml25.kernels import catalog, cli


def test_list_shows_every_paper_with_status_package_installed_and_expectation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    papers = catalog.load()
    assert lines[0].split() == ["id", "status", "package", "installed", "expect", "scope", "title"]
    rows = {line.split()[0]: line.split() for line in lines[1 : 1 + len(papers)]}
    assert list(rows) == [p.id for p in papers]
    installed = cli.installed_papers()
    for p in papers:
        row = rows[p.id]
        assert row[1] == p.status and row[2] == (p.distribution or "—")
        if p.status == "implemented":
            assert row[3] == ("yes" if p.id in installed else "no")
            assert " ".join(row[4:]).startswith(f"{p.expectation()} {p.scope}")
    assert lines[-1].startswith(f"{len(papers)} papers: ")
    miss = next(p for p in papers if p.expect == "miss" and p.miss_in == ("full",))
    assert rows[miss.id][4:6] == ["miss", "(full)"]


def test_list_installed_shows_only_what_this_environment_registers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["list", "--installed"]) == 0
    lines = capsys.readouterr().out.splitlines()
    shown = [line.split()[0] for line in lines[1:] if line.startswith("P")]
    assert shown == sorted(cli.installed_papers())


def test_reproduce_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["reproduce", "--only", "P99", "--out", str(tmp_path)]) == 2
    assert "--only P99: unknown paper" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["reproduce", "--record"])
    assert exc.value.code == 2 and "--full" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2


def test_python_dash_m_is_the_same_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "icml25.kernels", "reproduce", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    for option in ("--only", "--full", "--seed", "--out", "--record", "--results", "--note"):
        assert option in out.stdout


def test_the_kernels_wheel_ships_the_catalog_and_the_icml25_script(wheelhouse: Path) -> None:
    with zipfile.ZipFile(wheel_of(wheelhouse, "kernels")) as zf:
        names = set(zf.namelist())
        (scripts,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = zf.read(scripts).decode()
        shipped = zf.read("icml25/kernels/catalog.toml").decode()
    assert "icml25/kernels/__main__.py" in names
    assert "[console_scripts]" in entry_points and "icml25 = icml25.kernels.cli:main" in entry_points
    assert catalog.load_text(shipped) == catalog.load()


def _install(python: Path, *specs: str | Path) -> None:
    """uv pip install into ``python``'s venv: the local CPU torch when there is one, the test constraints."""
    torch = cpu_torch_wheel()
    links = [arg for folder in find_links() for arg in ("--find-links", str(folder))]
    uv(
        "pip",
        "install",
        "--quiet",
        "--python",
        str(python),
        "-c",
        str(CONSTRAINTS),
        *links,
        *([str(torch)] if torch else []),
        *map(str, specs),
    )


def test_icml25_list_and_reproduce_from_the_installed_wheels(
    wheelhouse: Path, venv_factory, tmp_path: Path
) -> None:
    """``pip install icml25-rl`` alone (no extras): the console script lists the catalog and reproduces P05
    in quick mode (figures off: matplotlib is the [plots] extra)."""
    python = venv_factory("cli-rl")
    _install(python, wheel_of(wheelhouse, "kernels"), wheel_of(wheelhouse, "rl"))
    icml25 = python.parent / "icml25"
    listed = subprocess.run([str(icml25), "list"], capture_output=True, text=True, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines() if line.startswith("P")}
    assert rows["P05"][1:5] == ["implemented", "icml25-rl", "yes", "pass"]
    assert rows["P07"][1:4] == ["implemented", "icml25-causal-discovery", "no"]
    run = subprocess.run(
        [str(icml25), "reproduce", "--only", "P05"], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "P05 PASS " in run.stdout and "1 papers: 1 PASS" in run.stdout
    assert "figures off: matplotlib is not installed (pip install 'icml25-rl[plots]')" in run.stderr
    (path,) = (tmp_path / "reports").glob("*-quick/REPORT.md")
    assert f"report: {path.relative_to(tmp_path)} " in run.stdout
    report = path.read_text()
    assert "| P05 | PASS |" in report and "Mode: **quick**" in report
    module = subprocess.run(
        [str(python), "-m", "icml25.kernels", "list", "--installed"], capture_output=True, text=True
    )
    assert module.returncode == 0 and [line.split()[0] for line in module.stdout.splitlines()[1:2]] == ["P05"]


def _site_packages_bytes(python: Path) -> int:
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return sum(f.stat().st_size for f in Path(purelib).rglob("*") if f.is_file() and not f.is_symlink())


def test_cpu_only_install_from_a_source_checkout_pulls_no_cuda_and_no_triton(
    wheelhouse: Path, tmp_path: Path
) -> None:
    """The README's flow with plain pip: CPU torch first (here the local CPU wheel stands for
    ``pip install torch --index-url https://download.pytorch.org/whl/cpu``), then
    ``pip install --find-links dist icml25-rl`` (``dist`` = the built wheels)."""
    torch = cpu_torch_wheel()
    if torch is None:
        pytest.skip(
            "no CPU-only torch wheel for this interpreter in the local find-links folders "
            f"({[str(f) for f in find_links()] or 'none configured'}): the CPU install is checked offline only"
        )
    venv = tmp_path / "cpu-venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True)
    if made.returncode != 0:  # a Python without ensurepip: let uv put pip in
        uv("venv", "--quiet", "--seed", "--clear", "--python", sys.executable, str(venv))
    python = venv / "bin" / "python"

    def pip(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(python), "-m", "pip", "--disable-pip-version-check", *args],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    pip("install", "--quiet", str(torch))
    pip("install", "--quiet", "--find-links", str(wheelhouse), "icml25-rl")
    installed = {d["name"].lower(): d["version"] for d in json.loads(pip("list", "--format=json").stdout)}
    assert {"icml25-rl", "icml25-kernels", "torch"} <= set(installed)
    assert installed["torch"].endswith("+cpu")
    cuda = sorted(name for name in installed if name.startswith("nvidia-") or name.startswith("cuda-"))
    assert cuda == [] and "triton" not in installed, (cuda, installed.get("triton"))
    probe = subprocess.run(
        [str(python), "-c", "import icml25.rl, icml25.kernels; print(icml25.kernels.triton_available())"],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0 and probe.stdout.strip() == "False", probe.stderr
    size = _site_packages_bytes(python)
    print(
        f"\nCPU-only install of icml25-rl: {size / 2**20:.0f} MiB in site-packages, {len(installed)} distributions"
    )


def test_cite_prints_the_papers_bibtex_and_every_implemented_paper_has_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    entries = cli.citations()
    implemented = [p.id for p in catalog.load() if p.status == "implemented"]
    assert sorted(entries) == sorted(implemented), "citations.bib needs one entry per implemented paper"
    for pid, entry in entries.items():
        assert entry.startswith(f"@inproceedings{{icml25:{pid},\n") and entry.endswith("\n}"), pid
        assert entry.count("{") == entry.count("}"), f"{pid}: unbalanced braces"
        assert "year      = {2025}" in entry or "year          = {2025}" in entry, pid
        assert f"icml25 {pid} (" in entry, pid
    assert cli.main(["cite", "p05"]) == 0  # case-insensitive
    assert capsys.readouterr().out.strip() == entries["P05"]
    assert cli.main(["cite", "--all"]) == 0
    assert capsys.readouterr().out.count("@inproceedings{") == len(implemented)


def test_cite_tells_an_unknown_id_from_an_unimplemented_paper(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cite", "P99"]) == 2
    assert "P99: unknown paper" in capsys.readouterr().err
    unimplemented = [p for p in catalog.load() if p.status != "implemented"]
    if unimplemented:
        assert cli.main(["cite", unimplemented[0].id]) == 2
        assert "no citation" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["cite"])
    assert exc.value.code == 2


def test_the_kernels_wheel_ships_the_citations(wheelhouse: Path) -> None:
    with zipfile.ZipFile(wheel_of(wheelhouse, "kernels")) as zf:
        shipped = zf.read("icml25/kernels/citations.bib").decode()
    assert shipped.count("@inproceedings{") == len(cli.citations())


def test_list_footer_names_the_install_that_works_from_a_checkout(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    footer = capsys.readouterr().out.splitlines()[-1]
    assert "pip install ./shared-kernels ./packages/<area>" in footer and "once it is on PyPI" in footer
