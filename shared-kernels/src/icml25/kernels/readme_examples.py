"""README examples as tests: every ```python block of a README runs, as written, in a fresh namespace.

Each package's test suite parametrizes one test over :func:`readme_examples` of its own README, so the
blocks run in that package's test session, against its installed wheel and with its extras. A block may
carry directives in comment lines of its own:

* ``# extra: flower`` (or ``# extras: hf, plots``): the block needs these extras of the README's
  distribution; where one of their requirements is not installed the test skips, naming the extra.
* ``# requires: pandas``: the block imports a module that no extra brings (a user's own choice of
  library, e.g. a DataFrame); the test skips, naming it, where it is not installed.
* ``# readme: continues``: the block continues the previous one (it is run after it, in one process),
  like the cells of a notebook.
* ``# readme: slow``: the block takes longer than a quick test (the test marks it ``slow``).
* ``# prints: TEXT`` (after a statement, or on a line of its own): the block's output has a line ``TEXT``
  (surrounding spaces ignored; ``...`` matches anything, as doctest's ELLIPSIS), after the lines the
  earlier ``# prints:`` of the block matched. A documented number that the code no longer prints fails the
  test, naming the line it expected and the output it got.

A block runs as the ``__main__`` module of a fresh namespace inside the test's interpreter, from the test's
temporary folder, with the interpreter's global state (working directory, environment, ``sys.argv``, the
random generators of Python, NumPy and PyTorch, PyTorch's thread count, warning filters) restored afterwards.
A fresh process per block would also prove that nothing else was imported before it, at the price of importing
torch (and transformers) again for every one of the ~70 blocks, about 10 s each on the 2-core CI machine;
``run_readme_example(..., fresh_process=True)`` still does that. A block that raises or exits non-zero fails
its test with the block's source and its error. pytest is imported only by :func:`readme_params` and
:func:`check_readme_example`; :func:`run_readme_example` raises ``AssertionError``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as metadata
import importlib.util
import io
import os
import random
import re
import subprocess
import sys
import traceback
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ReadmeExample",
    "check_printed",
    "check_readme_example",
    "missing_extras",
    "readme_examples",
    "readme_params",
    "run_readme_example",
]

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*$", re.M)
_EXTRA = re.compile(r"^[ \t]*#[ \t]*extras?:[ \t]*(.+?)[ \t]*$", re.M)
_REQUIRES = re.compile(r"^[ \t]*#[ \t]*requires:[ \t]*(.+?)[ \t]*$", re.M)
_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*readme:[ \t]*(\w+)", re.M)
_DIRECTIVES = {"continues", "slow"}
_PRINTS = re.compile(r"#[ \t]*prints:[ \t]?(.*?)[ \t]*$", re.M)
_REQ_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class ReadmeExample:
    """One runnable ```python block of a README.

    ``code`` is what runs: the block itself, preceded by the blocks it continues. ``id`` names it for
    pytest (``<heading slug>-L<line>``).
    """

    path: Path
    line: int
    heading: str
    source: str
    code: str
    extras: tuple[str, ...]
    requires: tuple[str, ...]
    slow: bool
    distribution: str | None

    @property
    def expected(self) -> tuple[str, ...]:
        """The output lines the ``# prints:`` comments of :attr:`code` document, in order."""
        return tuple(m.group(1).strip() for m in _PRINTS.finditer(self.code))

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")[:40] or "top"
        return f"{slug}-L{self.line}"


def readme_examples(path: str | os.PathLike[str], distribution: str | None = None) -> list[ReadmeExample]:
    """Every ```python block of the Markdown file ``path``, in order (see the module docstring).

    ``distribution`` names the wheel whose extras the ``# extra:`` directives refer to
    (e.g. ``"icml25-federated"``). Raises ``FileNotFoundError`` when the README is missing and
    ``ValueError`` on an unknown ``# readme:`` directive or a ``continues`` block with nothing before it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path must be a README file, got {str(path)!r} (not found)")
    text = path.read_text(encoding="utf-8")
    examples: list[ReadmeExample] = []
    for match in _FENCE.finditer(text):
        source = match.group(1)
        line = text.count("\n", 0, match.start()) + 2  # the block's first line (after the fence)
        directives = set(_DIRECTIVE.findall(source))
        unknown = directives - _DIRECTIVES
        if unknown:
            raise ValueError(
                f"{path.name}:{line}: unknown '# readme:' directive(s) {sorted(unknown)}; "
                f"expected one of {sorted(_DIRECTIVES)}"
            )
        extras = tuple(e.strip() for m in _EXTRA.finditer(source) for e in m.group(1).split(",") if e.strip())
        requires = tuple(
            r.strip() for m in _REQUIRES.finditer(source) for r in m.group(1).split(",") if r.strip()
        )
        code = source
        if "continues" in directives:
            if not examples:
                raise ValueError(f"{path.name}:{line}: '# readme: continues' on the first block")
            previous = examples[-1]
            code = previous.code + "\n" + source
            extras = tuple(dict.fromkeys(previous.extras + extras))
            requires = tuple(dict.fromkeys(previous.requires + requires))
        heading = _heading_before(text, match.start())
        examples.append(
            ReadmeExample(
                path, line, heading, source, code, extras, requires, "slow" in directives, distribution
            )
        )
    return examples


_ANY_FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.S | re.M)


def _heading_before(text: str, offset: int) -> str:
    # the last Markdown heading above the block, ignoring '#' comment lines inside earlier code blocks of any
    # language (a bash block's '# comment' is no heading)
    outside = _ANY_FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text[:offset])
    found = _HEADING.findall(outside)
    return found[-1] if found else ""


def missing_extras(example: ReadmeExample) -> list[str]:
    """The extras an example declares whose requirements are not all installed here."""
    if not example.extras:
        return []
    if example.distribution is None:
        raise ValueError(
            f"{example.id}: the block declares extras {example.extras} but no distribution was given"
        )
    requires = metadata.requires(example.distribution) or []
    provided = metadata.metadata(example.distribution).get_all("Provides-Extra") or []
    missing = []
    for extra in example.extras:
        if extra not in provided:
            raise ValueError(
                f"{example.id}: {example.distribution} has no extra {extra!r} (it has {provided})"
            )
        marker = re.compile(r"extra\s*==\s*['\"]" + re.escape(extra) + r"['\"]")
        names = [
            _REQ_NAME.match(r).group(0) for r in requires if ";" in r and marker.search(r.split(";", 1)[1])
        ]
        for name in names:
            try:
                metadata.version(name)
            except metadata.PackageNotFoundError:
                missing.append(extra)
                break
    return missing


def run_readme_example(
    example: ReadmeExample,
    cwd: str | os.PathLike[str],
    timeout: float = 600.0,
    fresh_process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``example.code`` inside ``cwd`` (files it writes land there); ``AssertionError`` with its source and
    error when it raises or exits non-zero.

    By default the block runs in this interpreter, as ``__main__`` of a fresh namespace, with the global state
    restored afterwards (module docstring). ``fresh_process=True`` runs it with this interpreter in a new
    process instead, killed after ``timeout`` seconds (``timeout`` applies only there). The result carries the
    block's printed output in ``stdout``/``stderr``.
    """
    if fresh_process:
        return _run_in_fresh_process(example, cwd, timeout)
    code = compile(example.code, f"<{example.path.name}:{example.line}>", "exec")
    out, err = io.StringIO(), io.StringIO()
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    failure = None
    with _restored_global_state(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.modules["__main__"] = main  # restored by _restored_global_state
        try:
            exec(code, main.__dict__)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                failure = f"exited {exc.code if isinstance(exc.code, int) else 1}\n{exc.code}"
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            failure = "raised\n" + "".join(traceback.format_exception(exc))
        finally:
            main.__dict__.clear()  # free the block's tensors and models before the next test
    if failure is not None:
        raise _failed(example, failure, err.getvalue())
    check_printed(example, out.getvalue())
    return subprocess.CompletedProcess(["<in-process>"], 0, out.getvalue(), err.getvalue())


def _line_matches(expected: str, line: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, line.strip(), re.S) is not None


def check_printed(example: ReadmeExample, stdout: str) -> None:
    """``AssertionError`` unless every ``# prints:`` line of ``example`` matches a line of ``stdout``, in
    order (module docstring)."""
    lines = stdout.splitlines()
    at = 0
    for expected in example.expected:
        hit = next((i for i in range(at, len(lines)) if _line_matches(expected, lines[i])), None)
        if hit is None:
            raise AssertionError(
                f"README example {example.id} ({example.path.name}:{example.line}) documents "
                f"'# prints: {expected}', but after the lines matched before it printed:\n"
                + "\n".join(lines[at:])[-4000:]
                + f"\n--- code ---\n{example.code}"
            )
        at = hit + 1


@contextlib.contextmanager
def _restored_global_state(cwd: str | os.PathLike[str]) -> Iterator[None]:
    """Run the body from ``cwd`` with ``MPLBACKEND=Agg``; afterwards put back what a block may have changed."""
    saved_cwd, saved_env, saved_argv = os.getcwd(), dict(os.environ), list(sys.argv)
    saved_main, saved_path = sys.modules.get("__main__"), list(sys.path)
    saved_random = random.getstate()
    numpy = sys.modules.get("numpy")
    saved_numpy = numpy.random.get_state() if numpy is not None else None
    torch = sys.modules.get("torch")
    saved_torch = (torch.random.get_rng_state(), torch.get_num_threads()) if torch is not None else None
    os.environ["MPLBACKEND"] = "Agg"
    sys.argv = [f"<{Path(str(cwd)).name}>"]
    try:
        with warnings.catch_warnings():
            os.chdir(cwd)
            yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv, sys.path[:] = saved_argv, saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        random.setstate(saved_random)
        if saved_numpy is not None:
            numpy.random.set_state(saved_numpy)
        if saved_torch is not None:
            torch.random.set_rng_state(saved_torch[0])
            torch.set_num_threads(saved_torch[1])
        elif (torch := sys.modules.get("torch")) is not None:
            # The block imported torch first: leave its global generator as a fresh import has it,
            # not at whatever seed the block chose, so the next test in this worker cannot lean on it.
            torch.random.set_rng_state(torch.Generator().get_state())


def _run_in_fresh_process(
    example: ReadmeExample, cwd: str | os.PathLike[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONHASHSEED="0")
    try:
        result = subprocess.run(
            [sys.executable, "-c", example.code],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"README example {example.id} ({example.path.name}:{example.line}) ran past {timeout} s"
        ) from exc
    if result.returncode != 0:
        raise _failed(example, f"exited {result.returncode}", result.stderr)
    check_printed(example, result.stdout)
    return result


def _failed(example: ReadmeExample, what: str, stderr: str) -> AssertionError:
    return AssertionError(
        f"README example {example.id} ({example.path.name}:{example.line}) {what}\n"
        f"--- code ---\n{example.code}\n--- stderr (tail) ---\n{stderr[-4000:]}"
    )


def readme_params(path: str | os.PathLike[str], distribution: str | None = None) -> list[Any]:
    """:func:`readme_examples` as ``pytest.param``s (id = the example's id, ``slow`` marked) for
    ``@pytest.mark.parametrize("example", readme_params(README, "icml25-rl"))``."""
    pytest = _pytest()
    return [
        pytest.param(e, id=e.id, marks=[pytest.mark.slow] if e.slow else [])
        for e in readme_examples(path, distribution)
    ]


def check_readme_example(example: ReadmeExample, cwd: str | os.PathLike[str]) -> None:
    """The body of a package's README test: skip (naming the install command) when a declared extra is
    missing (or a ``# requires:`` module is absent), else :func:`run_readme_example`."""
    pytest = _pytest()
    missing = missing_extras(example)
    if missing:
        pytest.skip(
            f"needs the extra(s) {missing}: pip install '{example.distribution}[{','.join(missing)}]'"
        )
    absent = [m for m in example.requires if importlib.util.find_spec(m) is None]
    if absent:
        pytest.skip(f"needs the module(s) {absent}, which no extra of {example.distribution} brings")
    run_readme_example(example, cwd)


def _pytest() -> Any:
    try:
        import pytest
    except ImportError as err:
        raise ImportError(
            "readme_params / check_readme_example run under pytest: pip install pytest"
        ) from err
    return pytest
