"""The README-example runner (icml25.kernels.readme_examples): it finds every block, honours its directives
and fails on a broken example."""

import importlib
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from icml25.kernels.readme_examples import missing_extras, readme_examples, run_readme_example

_runner = importlib.import_module("icml25.kernels.readme_examples")

README = """# Demo

Intro.

```python
x = 6 * 7
print(x)
```

## Second part

```python
# readme: continues
assert x == 42
print("continued", x)
```

```bash
echo "not python"
```

### Broken

```python
# readme: slow
raise SystemExit("this example is broken")
```
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_every_python_block_is_found_with_its_heading_and_directives(tmp_path: Path) -> None:
    examples = readme_examples(_write(tmp_path, README))
    assert [e.heading for e in examples] == ["Demo", "Second part", "Broken"]
    assert [e.line for e in examples] == [6, 13, 25]
    assert [e.slow for e in examples] == [False, False, True]
    assert examples[1].code.startswith("x = 6 * 7") and examples[1].source.startswith("# readme: continues")
    assert [e.id for e in examples] == ["demo-L6", "second-part-L13", "broken-L25"]


def test_a_working_block_runs_and_its_continuation_sees_the_previous_state(tmp_path: Path) -> None:
    first, second, _ = readme_examples(_write(tmp_path, README))
    assert run_readme_example(first, tmp_path).stdout == "42\n"
    assert run_readme_example(second, tmp_path).stdout == "42\ncontinued 42\n"


@pytest.mark.parametrize("fresh_process", [False, True])
def test_a_broken_block_fails_with_its_source_and_error(tmp_path: Path, fresh_process: bool) -> None:
    broken = readme_examples(_write(tmp_path, README))[-1]
    with pytest.raises(
        AssertionError, match=r"broken-L25 \(README.md:25\) exited 1(?s:.*)this example is broken"
    ):
        run_readme_example(broken, tmp_path, fresh_process=fresh_process)


def test_a_block_that_raises_fails_with_its_traceback(tmp_path: Path) -> None:
    (example,) = readme_examples(_write(tmp_path, "```python\nx = 1\nundefined_name + x\n```\n"))
    with pytest.raises(AssertionError, match=r"top-L2 \(README.md:2\) raised(?s:.*)NameError"):
        run_readme_example(example, tmp_path)


def test_a_block_runs_in_a_fresh_namespace_from_cwd_and_its_global_changes_are_undone(tmp_path: Path) -> None:
    block = """```python
import os, random, sys
import numpy as np
import torch
assert __name__ == "__main__" and "leaked" not in globals()
assert os.environ["MPLBACKEND"] == "Agg"
open("written.txt", "w").write("here")
leaked = 1
os.environ["ICML25_README_TEST"] = "set"
os.chdir("/")
sys.argv.append("--junk")
random.seed(1); np.random.seed(1); torch.manual_seed(1); torch.set_num_threads(1)
print("ran")
```
"""
    (example,) = readme_examples(_write(tmp_path, block))
    torch.manual_seed(123)
    # the legacy global generators are exactly what a README block may reseed
    numpy_state = np.random.get_state()[1].copy()  # noqa: NPY002
    expected = (random.getstate(), numpy_state, torch.random.get_rng_state())
    cwd, argv, threads = Path.cwd(), list(sys.argv), torch.get_num_threads()
    for _ in range(2):  # a second run sees nothing of the first
        assert run_readme_example(example, tmp_path).stdout == "ran\n"
    assert (tmp_path / "written.txt").read_text() == "here"
    assert Path.cwd() == cwd and sys.argv == argv and torch.get_num_threads() == threads
    assert "ICML25_README_TEST" not in os.environ
    assert random.getstate() == expected[0]
    assert np.array_equal(np.random.get_state()[1], expected[1])  # noqa: NPY002
    assert torch.equal(torch.random.get_rng_state(), expected[2])


def test_a_block_that_imports_torch_first_leaves_its_generator_as_freshly_imported(tmp_path: Path) -> None:
    # Simulate a worker that had not imported torch before the block: hide it from sys.modules on entry.
    (example,) = readme_examples(_write(tmp_path, "```python\nimport torch\ntorch.manual_seed(7)\n```\n"))
    torch.manual_seed(123)
    hidden = sys.modules.pop("torch")
    try:
        with _runner._restored_global_state(tmp_path):
            sys.modules["torch"] = hidden
            exec(example.code, {"__name__": "__main__"})
    finally:
        sys.modules["torch"] = hidden
    assert torch.equal(torch.random.get_rng_state(), torch.Generator().get_state())
    assert torch.initial_seed() == torch.Generator().initial_seed()


def test_a_block_in_a_fresh_process_runs_from_cwd(tmp_path: Path) -> None:
    first = readme_examples(_write(tmp_path, README))[0]
    assert run_readme_example(first, tmp_path, fresh_process=True).stdout == "42\n"


def test_bad_directives_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown '# readme:' directive"):
        readme_examples(_write(tmp_path, "```python\n# readme: sometimes\npass\n```\n"))
    with pytest.raises(ValueError, match="continues' on the first block"):
        readme_examples(_write(tmp_path, "```python\n# readme: continues\npass\n```\n"))
    with pytest.raises(FileNotFoundError, match="path must be a README file"):
        readme_examples(tmp_path / "missing.md")


def test_declared_extras_are_checked_against_the_distribution(tmp_path: Path) -> None:
    (example,) = readme_examples(
        _write(tmp_path, "```python\n# extra: plots\nimport matplotlib\n```\n"), "icml25-kernels"
    )
    assert example.extras == ("plots",)
    assert missing_extras(example) == []  # matplotlib is installed with the test tools
    (unknown,) = readme_examples(
        _write(tmp_path, "```python\n# extra: nonsense\npass\n```\n"), "icml25-kernels"
    )
    with pytest.raises(ValueError, match="has no extra 'nonsense'"):
        missing_extras(unknown)


def test_the_kernels_readme_has_as_many_examples_as_python_fences() -> None:
    readme = Path(__file__).resolve().parents[1] / "README.md"
    assert len(readme_examples(readme)) == readme.read_text(encoding="utf-8").count("```python") > 0


def test_required_modules_are_parsed_and_inherited_by_continuations(tmp_path: Path) -> None:
    text = "```python\n# requires: pandas, polars\npass\n```\n\n```python\n# readme: continues\npass\n```\n"
    first, second = readme_examples(_write(tmp_path, text))
    assert first.requires == second.requires == ("pandas", "polars")


PRINTS = """# Output

```python
import math
print(round(math.pi, 4))  # prints: 3.1416
print("ratio", 2 / 3)
# prints: ratio 0.66...
```

```python
# readme: continues
print("done")  # prints: done
```
"""


def test_documented_output_is_compared_with_what_the_block_prints(tmp_path: Path) -> None:
    first, second = readme_examples(_write(tmp_path, PRINTS))
    assert first.expected == ("3.1416", "ratio 0.66...") and second.expected[-1] == "done"
    assert run_readme_example(first, tmp_path).stdout.splitlines()[0] == "3.1416"
    run_readme_example(second, tmp_path)
    run_readme_example(second, tmp_path, fresh_process=True)


@pytest.mark.parametrize("fresh_process", [False, True])
def test_a_changed_number_fails_the_readme_test(tmp_path: Path, fresh_process: bool) -> None:
    """The doc says 3.1416; the code now prints 3.1415: the README test fails, naming both."""
    (example, _) = readme_examples(
        _write(tmp_path, PRINTS.replace("round(math.pi, 4)", "math.floor(math.pi * 1e4) / 1e4"))
    )
    with pytest.raises(AssertionError, match=r"documents '# prints: 3.1416'[^\n]*\n3.1415\n"):
        run_readme_example(example, tmp_path, fresh_process=fresh_process)


def test_documented_lines_must_come_in_order(tmp_path: Path) -> None:
    text = "```python\nprint('b')\nprint('a')  # prints: a\n# prints: b\n```\n"
    (example,) = readme_examples(_write(tmp_path, text))
    with pytest.raises(AssertionError, match="# prints: b"):
        run_readme_example(example, tmp_path)


def test_comment_lines_of_other_code_blocks_are_no_headings(tmp_path: Path) -> None:
    text = "# Package\n\n```bash\n# from a checkout:\npip install .\n```\n\n```python\nx = 1\n```\n"
    (example,) = readme_examples(_write(tmp_path, text))
    assert example.heading == "Package"
