"""The README-example runner (icml25.kernels.readme_examples): it finds every block, honours its directives
and fails on a broken example."""

from pathlib import Path

import pytest

from icml25.kernels.readme_examples import missing_extras, readme_examples, run_readme_example

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


def test_a_broken_block_fails_with_its_source_and_error(tmp_path: Path) -> None:
    broken = readme_examples(_write(tmp_path, README))[-1]
    with pytest.raises(
        AssertionError, match=r"broken-L25 \(README.md:25\) exited 1(?s:.*)this example is broken"
    ):
        run_readme_example(broken, tmp_path)


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
