"""Small-scale reproductions of the papers in ``icml25.llm_efficiency`` (one module per paper)."""
