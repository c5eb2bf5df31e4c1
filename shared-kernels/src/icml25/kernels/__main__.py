"""``python -m icml25.kernels``: the ``icml25`` command (:mod:`icml25.kernels.cli`)."""

from icml25.kernels.cli import main

raise SystemExit(main())
