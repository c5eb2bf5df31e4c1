"""What several interpretability papers share: public modules named for what they hold.

* :mod:`~icml25.interpretability.common.heads`: :class:`HeadActivationSite`, the per-head activation hook site
  on a model's attention output projections (Llama / Mistral / Qwen2, GPT-2, GPT-NeoX), and head selection
  (:func:`select_heads`, top-k by a score; :func:`random_heads`, the random baselines). Used by P42 (GridToM
  belief probes and steering) and P51 (induction vs function-vector heads).
* :mod:`~icml25.interpretability.common.llama`: :func:`random_llama`, a small random-init Llama causal LM
  built offline (extra ``[hf]``). The toy model of P00 (task vectors), P44 (role separation) and P51.

A paper's module imports only its own files, these common modules and :mod:`icml25.kernels`, never another
paper's module; the names are re-exported here and by :mod:`icml25.interpretability`, lazily
(:mod:`icml25.kernels.lazy`).
"""

from typing import TYPE_CHECKING

from icml25.kernels.lazy import lazy_namespace

if TYPE_CHECKING:  # the name -> module map of the lazy namespace (icml25.kernels.lazy)
    from icml25.interpretability.common.heads import (
        HeadActivationSite,
        as_head_site,
        head_hooks,
        random_heads,
        select_heads,
    )
    from icml25.interpretability.common.llama import random_llama
else:
    __getattr__, __dir__ = lazy_namespace(__name__, __file__)

__all__ = ["HeadActivationSite", "as_head_site", "head_hooks", "random_heads", "random_llama", "select_heads"]
