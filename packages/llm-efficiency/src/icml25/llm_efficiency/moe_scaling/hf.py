"""Joint MoE Scaling Laws: Mixture of Experts Can Be Memory Efficient — ICML 2025, P09: the law's inputs read off a transformers model.

The joint law is written in active parameters ``N``, the expert count ``E`` and, for the memory budget,
total parameters ``N·(1 + (E − k)·f/k)`` (:func:`~icml25.llm_efficiency.moe_scaling.total_params`).
:func:`hf_moe_shape` measures those quantities on a transformers causal LM (Mixtral, Qwen2/Qwen3-MoE,
OLMoE, ... or any dense model, ``E = 1``) by counting its parameters, so a user can ask the law about the
model they train::

    from transformers import MixtralConfig
    shape = hf_moe_shape(MixtralConfig())          # Mixtral-8x7B, built on the meta device: no memory
    law.loss(shape.n_act, 2e12, shape.experts)

Routed experts are the parameters under a module named ``experts`` (transformers' packed ``(E, ...)``
expert tensors or a ``ModuleList`` of ``E`` experts); a token uses ``k`` of them (``num_experts_per_tok``),
so the active share of expert parameters is ``k/E``. Everything else (attention, routers, norms, shared
experts, dense FFN layers) is active for every token. ``N`` excludes the input and output embeddings by
default, as in the paper's (Chinchilla-style) parameter counts; ``include_embeddings=True`` counts them.

Requires the ``[hf]`` extra (``pip install 'icml25-llm-efficiency[hf]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

try:
    from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("hf_moe_shape needs transformers: pip install 'icml25-llm-efficiency[hf]'") from err

from icml25.kernels.checks import check_int

__all__ = ["MoEShape", "hf_moe_shape"]

# config attributes naming the routed-expert count and the experts per token, across model families
_EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "moe_top_k", "top_k")


@dataclass(frozen=True)
class MoEShape:
    """A model's size in the law's terms.

    ``n_act`` — parameters a token uses (``N`` of the law); ``n_total`` — parameters held in memory;
    ``experts`` — routed experts per MoE layer (``E``, 1 for a dense model); ``top_k`` — experts per
    token (``k``); ``ffn_fraction`` — the routed experts' share of ``n_act`` (``f`` of
    :func:`~icml25.llm_efficiency.moe_scaling.total_params`, so ``total_params(n_act, experts,
    ffn_fraction, top_k) == n_total``); ``n_embedding`` — input + output embedding parameters, counted in
    ``n_act``/``n_total`` only when ``include_embeddings=True``.
    """

    n_act: float
    n_total: float
    experts: int
    top_k: int
    ffn_fraction: float
    n_embedding: int


def _config_int(config: Any, keys: tuple[str, ...], default: int) -> int:
    for key in keys:
        value = getattr(config, key, None)
        if value is not None:
            return check_int(value, f"config.{key}", low=1)
    return default


def _is_expert_parameter(name: str) -> bool:
    # "shared_expert(s)" is its own path component, so shared experts stay dense
    return "experts" in name.split(".")[:-1]


def hf_moe_shape(model_or_config: Any, include_embeddings: bool = False) -> MoEShape:
    """Active/total parameters, expert count and top-k of a transformers causal LM.

    ``model_or_config``: a ``PreTrainedModel`` (counted as is) or a ``PretrainedConfig`` (the model is built
    with ``AutoModelForCausalLM.from_config`` on the meta device, so a 47B-parameter config costs no memory).
    Raises ``TypeError`` for anything else and ``ValueError`` when the config's expert fields disagree with
    the parameters (an ``experts`` module whose leading size is not ``E``, or ``k > E``).
    """
    if not isinstance(include_embeddings, bool):
        raise TypeError(f"include_embeddings must be a bool; got {type(include_embeddings).__name__}")
    if isinstance(model_or_config, PretrainedConfig):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_or_config)
    elif isinstance(model_or_config, PreTrainedModel):
        model = model_or_config
    else:
        raise TypeError(
            "model_or_config must be a transformers PreTrainedModel or PretrainedConfig; "
            f"got {type(model_or_config).__name__}"
        )
    config = model.config
    experts = _config_int(config, _EXPERT_COUNT_KEYS, 1)
    top_k = _config_int(config, _TOP_K_KEYS, 1) if experts > 1 else 1
    if top_k > experts:
        raise ValueError(f"config: num_experts_per_tok = {top_k} exceeds the expert count {experts}")

    embedding_ids = set()
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        if module is not None:
            embedding_ids.update(id(p) for p in module.parameters())
    dense = expert = embedding = 0
    # named_parameters() yields a shared tensor once: tied input/output embeddings count once
    for name, p in model.named_parameters():
        if id(p) in embedding_ids:
            embedding += p.numel()
        elif _is_expert_parameter(name):
            if p.ndim >= 3 and p.shape[0] != experts:
                raise ValueError(
                    f"parameter {name} of shape {tuple(p.shape)} packs {p.shape[0]} experts, "
                    f"but the config says {experts}"
                )
            expert += p.numel()
        else:
            dense += p.numel()
    if experts > 1 and expert == 0:
        raise ValueError(
            f"the config names {experts} experts but no parameter sits under an 'experts' module"
        )
    extra = embedding if include_embeddings else 0
    expert_active = expert * top_k / experts
    n_act = dense + expert_active + extra
    return MoEShape(
        n_act=float(n_act),
        n_total=float(dense + expert + extra),
        experts=experts,
        top_k=top_k,
        ffn_fraction=float(expert_active / n_act) if n_act else 0.0,
        n_embedding=int(embedding),
    )
