"""Small-scale reproductions of the papers in ``icml25.generative_models`` (one module per paper)."""
