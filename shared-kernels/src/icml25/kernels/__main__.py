"""``python -m icml25.kernels``: the ``icml25`` command (:mod:`icml25.kernels.cli`)."""

from icml25.kernels.cli import main

if __name__ == "__main__":  # importing the module (pkgutil.walk_packages, docs tools) must not run the CLI
    raise SystemExit(main())
