"""Small-scale reproductions of the papers in ``icml25.causal_discovery`` (one module per paper)."""
