"""Mark a paper implemented in the catalog (icml25/kernels/catalog.toml) and regenerate the README table.

Usage: python tools/mark_implemented.py P01 icml25.llm_efficiency.sparge icml25.llm_efficiency.experiments.sparge_attn
"""

from __future__ import annotations

import sys

import catalog


def mark(pid: str, module: str, entry_point: str) -> None:
    text = catalog.CATALOG.read_text()
    at = text.index(f'id = "{pid}"')
    end = text.find("[[paper]]", at)
    end = len(text) if end < 0 else end
    block = text[at:end]
    if 'status = "planned"' not in block:
        raise ValueError(f"{pid} is not planned in the catalog")
    block = block.replace(
        'status = "planned"', f'status = "implemented"\nmodule = "{module}"\nentry_point = "{entry_point}"'
    )
    catalog.CATALOG.write_text(text[:at] + block + text[end:])
    catalog.write_readme(catalog.load())


if __name__ == "__main__":
    mark(*sys.argv[1:4])
