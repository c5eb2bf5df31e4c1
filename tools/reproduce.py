"""``icml25 reproduce`` from a source checkout, with the repository's ``results/`` folder as the ledger.

The command lives in the icml25-kernels wheel (:mod:`icml25.kernels.reproduce`: discovery through the
``icml25.papers`` entry points, the outcomes PASS / KNOWN-MISS / FAIL / UNEXPECTED-PASS / ERROR from the
catalog's expectations, ``REPORT.md``, the ledger entries); this wrapper only fixes the defaults that belong
to the repository: ``--results`` is ``<repository>/results`` and the ledger's git provenance is read from
the repository, wherever the command is started.

Usage::

    python tools/reproduce.py                                  # quick mode, every installed paper
    python tools/reproduce.py --only P07 --only P54 --full --out reports
    python tools/reproduce.py --only P07 --full --record       # also write results/P07.json
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from icml25.kernels import reproduce as _reproduce

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def main(argv: Sequence[str] | None = None, **kwargs: Any) -> int:
    """:func:`icml25.kernels.reproduce.main` with the repository's ledger folder and git checkout."""
    kwargs.setdefault("results", RESULTS)
    kwargs.setdefault("repo", ROOT)
    kwargs.setdefault("prog", "tools/reproduce.py")
    return _reproduce.main(argv, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
