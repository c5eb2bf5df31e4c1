"""SAELens interchange: export any SAE of the zoo to SAELens v6 and import SAELens SAEs.

SAELens (v6) stores an SAE as a state dict ``{W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in],
b_dec [d_in]}`` (+ ``threshold`` [d_sae] for JumpReLU) and a cfg dict with ``architecture``, ``d_in``,
``d_sae``, ``dtype``, ``device``, ``apply_b_dec_to_input``, ``normalize_activations``,
``reshape_activations``, ``metadata`` and, for ``"topk"``, ``k`` and ``rescale_acts_by_decoder_norm``.

Export (:func:`to_saelens`):

* TopK SAE → ``"topk"`` with its k; MSAE / ReLU SAE → ``"standard"`` (uncapped ReLU, MSAE's default
  inference), or ``"topk"`` when a cap ``k`` is given; BatchTopK → ``"jumprelu"`` with its learned threshold.
* An :class:`ActivationNormalizer` ``x_n = (x − μ)·s`` is folded into the weights so the exported SAE takes
  raw activations (``normalize_activations="none"``): ``W_enc·s``, ``W_dec/s``, ``b_dec/s + μ`` — exact,
  since then ``(x − b_dec')·W_enc' = (x_n − b_dec)·W_enc``.
* ``metadata`` names the model (``icml25_model``) and, for an MSAE, its nesting levels ``msae_ks``, its
  weighting and level weights, so :func:`from_saelens` rebuilds a :class:`MatryoshkaKSAE` with the same
  levels. It also carries ``sae_lens_version`` (:data:`SAELENS_FORMAT_VERSION`): SAELens' loaders
  (``handle_config_defaulting``) treat a cfg without a version as pre-6.0 and rebuild ``metadata`` from
  their own LLM keys only, which would drop ours on ``SAE.load_from_disk``.

Import (:func:`from_saelens`) accepts the v6 layout and the legacy ``activation_fn_str``/``activation_fn_kwargs``
keys, ``apply_b_dec_to_input=False`` (folded into ``b_enc``), and ``"expected_average_only_in"`` when the
scaling factor is given. sae-lens itself is only needed by :func:`to_saelens_sae`
(``pip install 'icml25-interpretability[saelens]'``).
"""

from __future__ import annotations

from typing import Any

import torch

from icml25.interpretability.sae.base import BatchTopKSAE, ReLUSAE, SparseAutoencoder, TopKSAE
from icml25.interpretability.sae.matryoshka_k import WEIGHTINGS, MatryoshkaKSAE
from icml25.interpretability.sae.preprocessing import ActivationNormalizer
from icml25.interpretability.sae.serialization import dtype_from_name, dtype_name

#: The SAELens cfg layout :func:`to_saelens` writes (v6), recorded as ``metadata["sae_lens_version"]``.
SAELENS_FORMAT_VERSION = "6.0.0"


def to_saelens(
    model: SparseAutoencoder, *, k: int | None = None, normalizer: ActivationNormalizer | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Export ``model`` as a SAELens ``(state_dict, cfg)`` pair.

    Args:
        model: a trained SAE of this package.
        k: inference cap; ``None`` keeps the model's own activation (TopK: its k; MSAE/ReLU: uncapped).
        normalizer: the fitted input normalisation the model was trained behind; folded into the weights.

    Returns:
        ``(state_dict, cfg)``; ``sae_lens.SAE.from_dict(cfg).load_state_dict(state_dict)`` rebuilds it.
    """
    if not isinstance(model, SparseAutoencoder):
        raise TypeError(f"model must be a SparseAutoencoder, got {type(model).__name__}")
    k = model._check_k(k)
    W_enc, b_enc = model.W_enc.detach().clone(), model.b_enc.detach().clone()
    W_dec, b_dec = model.W_dec.detach().clone(), model.b_dec.detach().clone()
    if normalizer is not None:
        if not isinstance(normalizer, ActivationNormalizer):
            raise TypeError(f"normalizer must be an ActivationNormalizer, got {type(normalizer).__name__}")
        normalizer._check_fitted()
        s, mu = normalizer.scale_, normalizer.mean_.to(W_enc)
        if mu.numel() != model.d_in:
            raise ValueError(f"normalizer was fitted on d={mu.numel()} features, model has d_in={model.d_in}")
        W_enc, W_dec, b_dec = W_enc * s, W_dec / s, b_dec / s + mu
    state = {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "b_dec": b_dec}
    cfg: dict[str, Any] = {
        "d_in": model.d_in,
        "d_sae": model.d_sae,
        "dtype": dtype_name(W_enc.dtype),
        "device": str(W_enc.device),
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": {"sae_lens_version": SAELENS_FORMAT_VERSION, "icml25_model": type(model).__name__},
    }
    if k is None and isinstance(model, TopKSAE):
        k = model.k
    if k is not None:
        cfg.update(architecture="topk", k=k, rescale_acts_by_decoder_norm=False)
    elif isinstance(model, BatchTopKSAE):
        theta = float(model.threshold)
        if theta < 0:
            raise ValueError("model is a BatchTopKSAE without a learned threshold: train it or pass k")
        state["threshold"] = torch.full((model.d_sae,), theta, dtype=W_enc.dtype)
        cfg["architecture"] = "jumprelu"
    elif isinstance(model, (MatryoshkaKSAE, ReLUSAE)):
        cfg["architecture"] = "standard"
    else:
        raise TypeError(f"no SAELens architecture for {type(model).__name__} without k")
    if isinstance(model, MatryoshkaKSAE):
        cfg["metadata"].update(
            msae_ks=list(model.ks), msae_weighting=model.weighting, msae_level_weights=list(model.weights)
        )
    return state, cfg


def from_saelens(
    state_dict: dict[str, torch.Tensor], cfg: dict[str, Any], *, norm_scaling_factor: float | None = None
) -> SparseAutoencoder:
    """Build a model of this package from a SAELens ``(state_dict, cfg)`` (v6 or legacy keys).

    ``"topk"`` → :class:`TopKSAE`, ``"standard"`` → :class:`ReLUSAE` (MSAE metadata → :class:`MatryoshkaKSAE`
    with the exported levels and weighting), ``"jumprelu"`` with a constant threshold → :class:`BatchTopKSAE`
    in eval mode. ``cfg`` may be the exported dict, a ``cfg.json`` read back, or ``sae.cfg.to_dict()`` of a
    SAELens SAE.
    """
    if not isinstance(cfg, dict) or not isinstance(state_dict, dict):
        raise TypeError("state_dict and cfg must be dicts (SAELens layout)")
    missing = [key for key in ("W_enc", "b_enc", "W_dec", "b_dec") if key not in state_dict]
    if missing:
        raise ValueError(f"state_dict must hold W_enc, b_enc, W_dec, b_dec; missing {missing}")
    for key in ("d_in", "d_sae"):
        if key not in cfg:
            raise ValueError(f"cfg must hold {key!r}, got keys {sorted(cfg)}")
    d_in, d_sae = int(cfg["d_in"]), int(cfg["d_sae"])
    arch = cfg.get("architecture")
    kwargs = cfg.get("activation_fn_kwargs") or {}
    k = cfg.get("k", kwargs.get("k"))
    if arch is None:  # legacy (< v6) configs name the activation instead
        arch = "topk" if cfg.get("activation_fn_str", cfg.get("activation_fn")) == "topk" else "standard"
    W_enc = state_dict["W_enc"].detach().clone().float()
    b_enc = state_dict["b_enc"].detach().clone().float()
    W_dec = state_dict["W_dec"].detach().clone().float()
    b_dec = state_dict["b_dec"].detach().clone().float()
    if W_enc.shape != (d_in, d_sae) or W_dec.shape != (d_sae, d_in):
        raise ValueError(
            f"W_enc must be [d_in={d_in}, d_sae={d_sae}] and W_dec [d_sae, d_in], got "
            f"{tuple(W_enc.shape)} and {tuple(W_dec.shape)}"
        )
    if cfg.get("rescale_acts_by_decoder_norm", False):
        raise ValueError(
            "cfg rescale_acts_by_decoder_norm=True is not supported (fold the decoder norms first)"
        )
    norm = cfg.get("normalize_activations", "none") or "none"
    if norm == "expected_average_only_in":
        if norm_scaling_factor is None:
            raise ValueError(
                "cfg normalize_activations='expected_average_only_in' needs norm_scaling_factor (a float), got None"
            )
        s = float(norm_scaling_factor)
        W_enc, W_dec, b_dec = W_enc * s, W_dec / s, b_dec / s  # SAELens' fold_activation_norm_scaling_factor
    elif norm != "none":
        raise ValueError(
            f"cfg normalize_activations must be 'none' or 'expected_average_only_in', got {norm!r}"
        )
    if not cfg.get("apply_b_dec_to_input", True):
        # pre = x·W_enc + b_enc = (x − b_dec)·W_enc + (b_enc + b_dec·W_enc)
        b_enc = b_enc + b_dec @ W_enc
    meta = cfg.get("metadata") or {}
    # Every weight is overwritten below: the fixed seed only keeps construction off the global generator.
    model: SparseAutoencoder
    if arch == "topk":
        if k is None:
            raise ValueError("cfg architecture 'topk' must give k (or activation_fn_kwargs={'k': ...})")
        model = TopKSAE(d_in, d_sae, int(k), seed=0)
    elif arch == "standard" and "msae_ks" in meta:
        weighting = meta.get("msae_weighting", "UW")
        if str(weighting).upper() not in WEIGHTINGS:  # "custom": the exported level weights
            weighting = meta.get("msae_level_weights", "UW")
        model = MatryoshkaKSAE(d_in, d_sae, list(meta["msae_ks"]), weighting, seed=0)
    elif arch == "standard":
        model = ReLUSAE(d_in, d_sae, seed=0)
    elif arch == "jumprelu":
        theta = state_dict.get("threshold")
        if theta is None or not bool((theta == theta.flatten()[0]).all()):
            raise ValueError(
                "only jumprelu SAEs with one shared threshold (exported BatchTopK) are supported"
            )
        model = BatchTopKSAE(d_in, d_sae, int(k) if k is not None else 1, seed=0)
        model.threshold.fill_(float(theta.flatten()[0]))
    else:
        raise ValueError(f"cfg architecture must be 'topk', 'standard' or 'jumprelu', got {arch!r}")
    with torch.no_grad():
        model.W_enc.copy_(W_enc)
        model.b_enc.copy_(b_enc)
        model.W_dec.copy_(W_dec)
        model.b_dec.copy_(b_dec)
    return model.to(dtype_from_name(cfg.get("dtype", "float32"), default=torch.float32)).eval()


def to_saelens_sae(
    model: SparseAutoencoder, *, k: int | None = None, normalizer: ActivationNormalizer | None = None
) -> Any:
    """A ``sae_lens.SAE`` holding ``model`` (needs ``pip install 'icml25-interpretability[saelens]'``)."""
    try:
        from sae_lens import SAE
    except ImportError as err:  # optional extra
        raise ImportError(
            "to_saelens_sae needs sae-lens: pip install 'icml25-interpretability[saelens]'"
        ) from err
    state, cfg = to_saelens(model, k=k, normalizer=normalizer)
    sae = SAE.from_dict(cfg)
    sae.load_state_dict(state)
    return sae
