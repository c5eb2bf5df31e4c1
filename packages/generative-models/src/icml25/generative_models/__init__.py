"""icml25.generative_models — Generative models: diffusion, flows, emulators, token reduction for DiTs.

Each paper is one module (its docstring cites the paper and its catalog id); the public API of every
implemented paper is re-exported here.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
