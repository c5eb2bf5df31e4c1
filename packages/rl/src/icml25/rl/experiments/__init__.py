"""Small-scale reproductions of the papers in ``icml25.rl`` (one module per paper)."""
