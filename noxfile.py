"""nox sessions of the icml25 monorepo.

``nox`` with no arguments runs ``lint``, one ``tests-<package>`` session per package, ``integration``,
``quick-gates`` and ``docs``.
Every test session builds the wheels of icml25-kernels and of its package, installs them (with the
package's extras) into a fresh environment, and runs that package's tests against the installed wheel,
never the source tree. ``build``, ``reproduce`` and ``bench`` are run on demand (``nox -s reproduce``).

Pass pytest / tool arguments after ``--``: ``nox -s tests-rl -- -k gas -m slow``,
``nox -s reproduce -- --only P07 --full``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))
import workspace  # noqa: E402 - tools/workspace.py: the one list of distributions, read from the uv workspace

CONSTRAINTS = str(ROOT / "constraints.txt")
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100", "pytest-xdist>=3.5"]


def _xdist_args() -> list[str]:
    """Spread a package's test files over the machine's cores (pytest-xdist, one file per worker, so module
    fixtures are built once), at most 4 workers; ``ICML25_TEST_WORKERS=1`` runs them in one process."""
    workers = int(os.environ.get("ICML25_TEST_WORKERS", min(os.cpu_count() or 1, 4)))
    return ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []


# distribution suffix -> (source folder, extras installed for its tests), from the workspace's pyprojects
_MEMBERS = workspace.members(ROOT)
PACKAGES: dict[str, tuple[str, list[str]]] = {
    name: (m.folder, list(m.test_extras)) for name, m in _MEMBERS.items()
}
# distribution suffix -> test-only requirements ([tool.icml25] test-requires), installed by its test session
TEST_REQUIRES: dict[str, list[str]] = {name: list(m.test_requires) for name, m in _MEMBERS.items()}

# CI budget (CONTRIBUTING.md): `bash .ci/run` <= 40 minutes on the 2-core machine; every session logs its
# duration so the budget can be watched as papers are added.
CI_BUDGET_MINUTES = 40

nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", *(f"tests-{name}" for name in PACKAGES), "integration", "quick-gates", "docs"]
# the API reference's tools (versions pinned in constraints.txt); tomli: docs/build_site.py on Python 3.10
DOCS_TOOLS = ["mkdocs-material", "mkdocstrings[python]", "tomli>=1.1; python_version < '3.11'"]


def _use_local_wheelhouse() -> None:
    """Let uv see the wheels the machine's pip is configured to find (e.g. a local CPU build of torch).

    uv does not read pip's configuration; without this it would download PyPI's (CUDA) torch build.
    """
    if os.environ.get("UV_FIND_LINKS") or not shutil.which("pip"):
        return
    links = os.environ.get("PIP_FIND_LINKS")
    if not links:
        result = subprocess.run(
            ["pip", "config", "get", "global.find-links"], capture_output=True, text=True, check=False
        )
        links = result.stdout.strip() if result.returncode == 0 else ""
    if links:
        os.environ["UV_FIND_LINKS"] = links


_use_local_wheelhouse()
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")


def timed(fn: Callable[..., None]) -> Callable[..., None]:
    """Log the session's wall time when it ends (passed or failed), e.g. ``tests-rl took 212 s``."""

    @functools.wraps(fn)
    def wrapper(session: nox.Session, *args, **kwargs) -> None:
        start = time.perf_counter()
        try:
            fn(session, *args, **kwargs)
        finally:
            session.log(f"{session.name} took {time.perf_counter() - start:.0f} s")

    return wrapper


def _build_wheels(session: nox.Session, names: list[str]) -> dict[str, str]:
    """Build the named distributions' wheels into a fresh folder; ``{name: wheel path}``."""
    out = Path(session.create_tmp()).resolve() / "wheels"
    shutil.rmtree(out, ignore_errors=True)
    for name in names:
        session.run(
            "uv", "build", "--quiet", "--wheel", "--package", f"icml25-{name}", "-o", str(out), external=True
        )
    wheels = {}
    for name in names:
        stem = f"icml25_{name.replace('-', '_')}-"
        (wheel,) = [p for p in out.glob("*.whl") if p.name.startswith(stem)]
        wheels[name] = str(wheel)
    return wheels


def _install_packages(session: nox.Session, names: list[str]) -> None:
    """Install the named wheels and icml25-kernels, each with its test extras; the kernels' include
    ``triton`` (no hard dependency: the CPU torch builds lack it), so the Triton kernels run in the
    interpreter (``TRITON_INTERPRET=1``) in every session."""
    wheels = _build_wheels(session, sorted(set(["kernels", *names])))
    specs = []
    for name, wheel in wheels.items():
        extras = PACKAGES[name][1]
        specs.append(f"icml25-{name}[{','.join(extras)}] @ {Path(wheel).as_uri()}" if extras else wheel)
    session.install("-c", CONSTRAINTS, *specs)


@nox.session
@timed
def lint(session: nox.Session) -> None:
    """ruff check + ruff format --check over the whole tree, and ``uv lock --check``: the lock file matches
    every pyproject (a stale lock makes ``uv sync`` rewrite it, and every recorded run then reports a dirty
    tree)."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("uv", "lock", "--check", external=True)


def _tests(session: nox.Session, name: str) -> None:
    folder = PACKAGES[name][0]
    _install_packages(session, [name])
    session.install("-c", CONSTRAINTS, *TEST_TOOLS, *TEST_REQUIRES[name])
    area = "kernels" if name == "kernels" else name.replace("-", "_")
    # the tests must exercise the installed wheel, not src/: fail loudly if the import resolves elsewhere
    session.run(
        "python", "-c", f"import icml25.{area} as m, sys; sys.exit('site-packages' not in m.__file__)"
    )
    args = session.posargs or ["-m", "not slow"]
    xdist = _xdist_args()
    if xdist:  # one BLAS/OpenMP thread per worker: the workers already fill the cores; more threads contend
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            session.env.setdefault(var, "1")
    # --durations: the slowest tests, so a quick test that grew past its 20 s budget is visible in CI logs
    session.run("pytest", f"{folder}/tests", "-p", "no:cacheprovider", "--durations=10", *xdist, *args)


for _name in PACKAGES:

    @nox.session(name=f"tests-{_name}")
    @timed
    def _package_tests(session: nox.Session, _name: str = _name) -> None:
        _tests(session, _name)

    _package_tests.__doc__ = f"Tests of icml25-{_name} against its built wheel in a fresh environment."


@nox.session
@timed
def integration(session: nox.Session) -> None:
    """Cross-package checks (tests/): isolation, namespace, dependencies, catalog + results ledger, downstream,
    reproduce. Every wheel is installed (no extras) so the ledger check can ask each experiment module for the
    threshold it states now."""
    wheels = _build_wheels(session, list(PACKAGES))
    session.install("-c", CONSTRAINTS, *TEST_TOOLS, "mypy>=1.10", "tqdm>=4.60", *wheels.values())
    session.env["ICML25_WHEELHOUSE"] = str(Path(next(iter(wheels.values()))).parent)
    session.env["UV_CONSTRAINT"] = CONSTRAINTS
    session.run(
        "pytest", "tests", "--ignore=tests/quick_gates", "-p", "no:cacheprovider", "--durations=10",
        *_xdist_args(), *session.posargs,
    )  # fmt: skip


def _all_test_requirements() -> list[str]:
    return sorted({req for reqs in TEST_REQUIRES.values() for req in reqs})


@nox.session(name="quick-gates")
@timed
def quick_gates(session: nox.Session) -> None:
    """Every paper's quick reproduction on another CPU's arithmetic: ``ATEN_CPU_CAPABILITY=default``
    (PyTorch's scalar kernels instead of this machine's AVX2/AVX-512 ones) and two threads, where the package
    sessions use the native kernels and one thread. A gate that holds only on the machine it was tuned on
    fails here (tests/quick_gates)."""
    _install_packages(session, list(PACKAGES))
    session.install("-c", CONSTRAINTS, *TEST_TOOLS, *_all_test_requirements())
    session.env.update({"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"})
    session.run(
        "pytest", "tests/quick_gates", "-p", "no:cacheprovider", "--durations=10", *_xdist_args(),
        *session.posargs,
    )  # fmt: skip


@nox.session
@timed
def docs(session: nox.Session) -> None:
    """The API reference (mkdocs-material + mkdocstrings): one page per area, the package README then one
    section per paper (its library modules and its experiment module), generated from the docstrings by
    ``docs/build_site.py`` into ``docs/build/site``. ``--strict``: any warning fails, a broken cross-reference
    included. The sources are read statically (griffe), so no package is installed. ``-- --clean`` etc. pass
    on to ``mkdocs build``."""
    session.install("-c", CONSTRAINTS, *DOCS_TOOLS)
    session.env["NO_MKDOCS_2_WARNING"] = "1"  # mkdocs-material's notice about a future MkDocs, not a warning
    session.run("python", "docs/build_site.py")
    session.run("mkdocs", "build", "--strict", "-f", "docs/build/mkdocs.yml", *session.posargs)


@nox.session
@timed
def slow(session: nox.Session) -> None:
    """The ``@pytest.mark.slow`` tests of every package (each paper's full-run expectation, the Flower
    Ray/gRPC runs), against the built wheels; not part of ``nox``'s default sessions (they take an hour or
    more on 2 cores): run it before recording full runs. ``-- -k P05`` narrows it."""
    _install_packages(session, list(PACKAGES))
    session.install("-c", CONSTRAINTS, *TEST_TOOLS, *_all_test_requirements())
    folders = [f"{folder}/tests" for folder, _ in PACKAGES.values()]
    session.run(
        "pytest", *folders, "-m", "slow", "-p", "no:cacheprovider", "--durations=20", *session.posargs
    )


@nox.session
@timed
def build(session: nox.Session) -> None:
    """All wheels and sdists into dist/."""
    shutil.rmtree(ROOT / "dist", ignore_errors=True)
    session.run("uv", "build", "--all-packages", "-o", str(ROOT / "dist"), external=True)
    built = sorted(p.name for p in (ROOT / "dist").iterdir() if p.suffix in (".whl", ".gz"))
    session.log("built:\n  " + "\n  ".join(built))


@nox.session
@timed
def reproduce(session: nox.Session) -> None:
    """Run every paper's reproduction (quick; ``-- --full`` for full size) and write reports/<run>/REPORT.md;
    ``-- --full --record`` also writes the results ledger (results/<id>.json). tools/reproduce.py is the
    installed ``icml25 reproduce`` with the repository's results/ as its ledger folder."""
    _install_packages(session, list(PACKAGES))
    session.install("-c", CONSTRAINTS, "tqdm>=4.60")
    session.run("python", "tools/reproduce.py", *session.posargs)


@nox.session
@timed
def bench(session: nox.Session) -> None:
    """Every benchmark script (shared-kernels/benchmarks, packages/*/benchmarks) with ``--quick`` on the current
    device, one process each (warm-up, median of >= 5 paired method/baseline runs, 1 thread), collected by
    tools/bench_all.py into benchmarks/RESULTS.md (machine, load, date, one row per benchmark and setting).
    Not in the default sessions. ``-- --only bench_rapid`` runs a subset, ``-- --threads 2`` pins 2 threads."""
    _install_packages(session, list(PACKAGES))
    # the integration points the RAPID / ToMA / ARROW benchmarks drive (the packages' hf, diffusers, tigramite extras)
    session.install("-c", CONSTRAINTS, "transformers>=5.0", "diffusers", "accelerate", "tigramite")
    session.run("python", "tools/bench_all.py", *session.posargs)
