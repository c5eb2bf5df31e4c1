"""Joint MoE Scaling Laws: Mixture of Experts Can Be Memory Efficient — ICML 2025, P09: the budget-table CLI.

``python -m icml25.llm_efficiency.moe_scaling --flops 1e21 --memory 2e9`` (see :mod:`.table`).
"""

from icml25.llm_efficiency.moe_scaling.table import main

if __name__ == "__main__":  # importing the module (pkgutil.walk_packages, docs tools) must not run the CLI
    raise SystemExit(main())
