"""Small-scale reproductions of the papers in ``icml25.interpretability`` (one module per paper)."""
