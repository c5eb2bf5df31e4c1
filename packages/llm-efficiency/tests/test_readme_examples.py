"""Every ```python block of this package's README runs as written, against the installed wheel and its extras
(directives: `# extra: X`, `# readme: continues`, `# readme: slow`; see icml25.kernels.readme_examples)."""

from pathlib import Path

import pytest

from icml25.kernels.readme_examples import check_readme_example, readme_params

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("example", readme_params(README, "icml25-llm-efficiency"))
def test_readme_example_runs(example, tmp_path: Path) -> None:
    check_readme_example(example, tmp_path)
