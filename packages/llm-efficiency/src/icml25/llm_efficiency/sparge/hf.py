"""SpargeAttn: Accurate Sparse Attention Accelerating Any Model Inference — ICML 2025, P01: the Hugging Face transformers integration.

Hugging Face transformers integration: ``register_sparge_attention()`` registers an attention
implementation (``AttentionInterface``) so that any transformers model built with
``attn_implementation="sparge"`` runs SpargeAttn, per layer and per head, with a tune mode.

* Sparse path: self-attention with no explicit mask (causal or bidirectional), ``Lq == Lk >= block_q``
  (prefill / encoding). Everything else — decoding with a KV cache, padding masks, short prompts — falls back
  to transformers' own SDPA attention (SpargeAttn needs whole query blocks; official limit Lq ≥ 128).
* Tune mode (``with controller.tune(): model(calibration_batch)``): each layer feeds its q, k, v to a
  per-layer :class:`SpargeTuner` and returns *dense* output, so calibration sees the unmodified model.
* Parameters are per layer (``module.layer_idx``) and serialisable (:meth:`SpargeController.state_dict`).

Requires the ``[hf]`` extra (``pip install 'icml25-llm-efficiency[hf]'``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from icml25.kernels.sparse_attention import SpargeStats, sparge_attention
from icml25.llm_efficiency.sparge.tuner import SpargeHeadParams, SpargeTuner

_MODES = ("sparse", "tune", "dense")


def _import_transformers():
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "the transformers integration of SpargeAttn needs transformers>=4.45: "
            "pip install 'icml25-llm-efficiency[hf]'"
        ) from err
    return AttentionInterface, AttentionMaskInterface, sdpa_attention_forward, sdpa_mask


class SpargeController:
    """Per-layer SpargeAttn settings, tuners and statistics behind one registered attention name.

    Args:
        cdf_threshold, topk, sim_threshold, pv_threshold: defaults for layers without tuned parameters
            (official plug-and-play CDF API: τ=0.98, θ=0.6; λ=50 almost never skips).
        block_q, block_k, quantize_qk, smooth_k, backend: passed to the op.
        tuner_kwargs: keyword arguments of :class:`SpargeTuner` used in tune mode.
        collect_stats: record :class:`SpargeStats` of every sparse call (for :meth:`sparsity`); this reads
            counts back from the device, i.e. one host sync per call on a GPU — pass ``False`` to serve.
        tuned_attention_sink: layers with tuned parameters always keep K block 0 (the attention sink), as
            the official tuned inference does (``autotune.py``: "only keep True when inference"); tuning
            itself runs without it. ``False`` serves tuned layers without the sink.
    """

    def __init__(
        self,
        *,
        cdf_threshold: float | None = 0.98,
        topk: float | None = None,
        sim_threshold: float = 0.6,
        pv_threshold: float | None = 50.0,
        block_q: int = 128,
        block_k: int = 64,
        quantize_qk: bool = True,
        smooth_k: bool = True,
        backend: str | None = None,
        tuner_kwargs: dict[str, Any] | None = None,
        collect_stats: bool = True,
        tuned_attention_sink: bool = True,
    ) -> None:
        self.defaults: dict[str, Any] = {
            "cdf_threshold": cdf_threshold, "topk": topk, "sim_threshold": sim_threshold,
            "pv_threshold": pv_threshold,
        }  # fmt: skip
        self.op_kwargs: dict[str, Any] = {
            "block_q": block_q, "block_k": block_k, "quantize_qk": quantize_qk, "smooth_k": smooth_k,
            "backend": backend,
        }  # fmt: skip
        self.tuner_kwargs = {"block_q": block_q, "block_k": block_k, "quantize_qk": quantize_qk,
                             "smooth_k": smooth_k, "backend": backend, **(tuner_kwargs or {})}  # fmt: skip
        self.mode = "sparse"
        self.params: dict[int, SpargeHeadParams] = {}
        self.tuners: dict[int, SpargeTuner] = {}
        self.stats: dict[int, SpargeStats] = {}  # last sparse call of each layer
        self.dense_calls = 0  # calls that fell back to dense attention
        self.collect_stats = bool(collect_stats)
        if not isinstance(tuned_attention_sink, bool):
            raise TypeError(f"tuned_attention_sink must be a bool, got {type(tuned_attention_sink).__name__}")
        self.tuned_attention_sink = tuned_attention_sink
        # Per-head parameters copied to the device once per (layer, device) and parameter object.
        self._on_device: dict[tuple[int, torch.device], tuple[SpargeHeadParams, dict[str, Any]]] = {}

    # ---------------------------------------------------------------------------------------- modes

    @contextlib.contextmanager
    def tune(self) -> Iterator[SpargeController]:
        """Tune mode: forwards inside the block calibrate per-layer tuners and return dense outputs;
        on exit the tuned parameters are installed (:meth:`finish_tuning`)."""
        previous, self.mode = self.mode, "tune"
        try:
            yield self
        finally:
            self.mode = previous
            self.finish_tuning()

    def finish_tuning(self) -> None:
        """Install every tuner's current result as its layer's parameters."""
        for layer, tuner in self.tuners.items():
            self.params[layer] = tuner.result()
        self._on_device.clear()

    def set_mode(self, mode: str) -> None:
        """``"sparse"`` (default), ``"tune"`` or ``"dense"`` (always fall back; for A/B comparisons)."""
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        self.mode = mode

    def sparsity(self) -> float:
        """Mean stage-1 sparsity of the last sparse call of each layer (0 when none ran)."""
        if not self.stats:
            return 0.0
        return sum(s.sparsity for s in self.stats.values()) / len(self.stats)

    # -------------------------------------------------------------------------------- serialisation

    def state_dict(self) -> dict[str, Any]:
        """Tuned parameters per layer, JSON-serialisable (``json.dumps`` works on it)."""
        return {"params": {str(layer): p.to_dict() for layer, p in sorted(self.params.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Install parameters saved by :meth:`state_dict` (tune once, save, reuse)."""
        if not isinstance(state, dict) or not isinstance(state.get("params"), dict):
            raise ValueError(
                f"state must be a SpargeController.state_dict() with a 'params' dict, got {state!r:.80}"
            )
        self.params = {int(layer): SpargeHeadParams.from_dict(p) for layer, p in state["params"].items()}
        self._on_device.clear()

    # ---------------------------------------------------------------------------- attention function

    def attention(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        dense_fn,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """transformers attention function: ``query [B, H, Lq, d]``, ``key/value [B, Hkv, Lk, d]`` ->
        ``(out [B, Lq, H, d], None)``."""
        lq, lk = query.shape[-2], key.shape[-2]
        is_causal = kwargs.get("is_causal")
        is_causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
        eligible = (
            self.mode != "dense"
            and attention_mask is None
            and lq == lk
            and lq >= self.op_kwargs["block_q"]
            and not (module.training and dropout > 0)
        )
        if not eligible:
            self.dense_calls += 1
            return dense_fn(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        layer = int(getattr(module, "layer_idx", 0) or 0)
        if self.mode == "tune":
            tuner = self.tuners.get(layer)
            if tuner is None:
                tuner = self.tuners[layer] = SpargeTuner(query.shape[1], **self.tuner_kwargs)
            tuner.observe(query, key, value, is_causal=is_causal, scale=scaling)
            return dense_fn(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        hyper = self._hyper(layer, query.device)
        out = sparge_attention(
            query,
            key,
            value,
            is_causal=is_causal,
            scale=scaling,
            return_stats=self.collect_stats,
            **hyper,
            **self.op_kwargs,
        )
        if self.collect_stats:
            out, self.stats[layer] = out
        return out.transpose(1, 2).contiguous(), None

    def _hyper(self, layer: int, device: torch.device) -> dict[str, Any]:
        """The layer's hyper-parameters; tuned per-head tensors are moved to ``device`` once, not per call."""
        params = self.params.get(layer)
        if params is None:
            return dict(self.defaults)
        cached = self._on_device.get((layer, device))
        if cached is None or cached[0] is not params:
            moved = {n: t.to(device) for n, t in params.kwargs().items()}
            moved |= {"topk": None, "attention_sink": self.tuned_attention_sink}
            cached = self._on_device[(layer, device)] = (params, moved)
        return cached[1]


def register_sparge_attention(
    name: str = "sparge", controller: SpargeController | None = None, **kwargs: Any
):
    """Register SpargeAttn with transformers as ``attn_implementation=name``.

    Args:
        name: the implementation name to register (``"sparge"``).
        controller: an existing :class:`SpargeController`; else one is built from ``kwargs``.
        **kwargs: :class:`SpargeController` arguments (``cdf_threshold``, ``block_q``, ``tuner_kwargs`` ...).

    Returns:
        The :class:`SpargeController` that holds the per-layer parameters, tune mode and statistics.

    Example:
        >>> ctrl = register_sparge_attention(block_q=64, block_k=32)
        >>> model = LlamaForCausalLM._from_config(config, attn_implementation="sparge")
        >>> with ctrl.tune():
        ...     model(calibration_ids)
        >>> model(ids); ctrl.sparsity()
    """
    if not isinstance(name, str) or not name or name in ("eager", "sdpa"):
        raise ValueError(f"name must be a new attention implementation name, got {name!r}")
    if controller is not None and kwargs:
        raise ValueError(f"pass either controller or SpargeController kwargs, got both ({sorted(kwargs)})")
    attention_interface, mask_interface, sdpa_forward, sdpa_mask = _import_transformers()
    ctrl = controller if controller is not None else SpargeController(**kwargs)

    def sparge_attention_forward(module, query, key, value, attention_mask, **kw):
        return ctrl.attention(module, query, key, value, attention_mask, dense_fn=sdpa_forward, **kw)

    attention_interface.register(name, sparge_attention_forward)
    # SDPA's mask builder returns None for plain causal (or full) attention, which is the sparse case;
    # padding masks and decoding steps come through as tensors or short queries and run densely.
    mask_interface.register(name, sdpa_mask)
    return ctrl
