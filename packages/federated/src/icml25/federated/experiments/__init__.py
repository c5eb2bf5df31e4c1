"""Small-scale reproductions of the papers in ``icml25.federated`` (one module per paper)."""
