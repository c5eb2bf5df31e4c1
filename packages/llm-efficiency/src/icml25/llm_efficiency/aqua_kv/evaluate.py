"""AQUA-KV: Cache Me If You Must: Adaptive Key-Value Quantization for Large Language Models — ICML 2025, P36: evaluation of a compressed KV cache against the uncompressed one.

Sequences are fed to the model in pieces of ``step`` tokens through the cache (as in the official
perplexity script), so later pieces attend to keys/values that were compressed on earlier steps.
Reported: perplexity, mean KL(p_uncompressed || p_compressed) of next-token distributions at positions
``>= min_position``, and the cache's bits per value.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable

import torch

from icml25.kernels.hf_cache import cache_argument

__all__ = ["evaluate_kv_compression", "reconstruction_error"]


@torch.no_grad()
def _logits_with_cache(model: torch.nn.Module, ids: torch.Tensor, cache: object, step: int) -> torch.Tensor:
    pieces = []
    for start in range(0, ids.shape[1], step):
        out = model(input_ids=ids[:, start : start + step], use_cache=True, **{cache_argument(model): cache})
        pieces.append(out.logits.float())
    return torch.cat(pieces, dim=1)


@torch.no_grad()
def evaluate_kv_compression(
    model: torch.nn.Module,
    cache_factory: Callable[[], object],
    data: Iterable[torch.Tensor],
    *,
    step: int = 16,
    min_position: int = 0,
) -> dict[str, float]:
    """Perplexity and KL of ``model`` run with caches from ``cache_factory`` versus ``DynamicCache``.

    Args:
        model: a ``transformers`` causal LM.
        cache_factory: ``() -> Cache``, called once per batch (e.g. ``lambda: AquaKVCache(...)``).
        data: token tensors ``(B, T)``.
        step: tokens per forward call.
        min_position: KL/perplexity are averaged over predicted positions ``>= min_position``.

    Returns:
        ``{"ppl", "ppl_reference", "kl", "bits_per_value", "compressed_bits_per_value"}`` (bits are
        averaged over batches; NaN when the cache does not report them).
    """
    from transformers import DynamicCache

    if not callable(cache_factory):
        raise TypeError(
            f"cache_factory must be a callable returning a Cache, got {type(cache_factory).__name__}"
        )
    for name, value, lo in (("step", step, 1), ("min_position", min_position, 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
    device = next(model.parameters()).device
    nll = nll_ref = kl = 0.0
    count = 0
    bits, cbits = [], []
    for ids in data:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise ValueError(
                f"data must yield token tensors of shape (B, T), got {getattr(ids, 'shape', type(ids))}"
            )
        ids = ids.long().to(device)
        if ids.shape[1] <= min_position + 1:
            raise ValueError(
                f"sequences must be longer than min_position + 1 = {min_position + 1}, got {ids.shape[1]}"
            )
        ref = _logits_with_cache(model, ids, DynamicCache(config=model.config), ids.shape[1])
        cache = cache_factory()
        got = _logits_with_cache(model, ids, cache, step)
        sl = slice(min_position, ids.shape[1] - 1)
        target = ids[:, 1:][:, sl]
        logp_ref = ref[:, sl].log_softmax(-1)
        logp = got[:, sl].log_softmax(-1)
        nll -= logp.gather(-1, target[..., None]).sum().item()
        nll_ref -= logp_ref.gather(-1, target[..., None]).sum().item()
        kl += (logp_ref.exp() * (logp_ref - logp)).sum().item()
        count += target.numel()
        bits.append(cache.bits_per_value() if hasattr(cache, "bits_per_value") else math.nan)
        cbits.append(
            cache.compressed_bits_per_value() if hasattr(cache, "compressed_bits_per_value") else math.nan
        )
    if count == 0:
        raise ValueError("data must yield at least one batch")
    return {
        "ppl": math.exp(nll / count),
        "ppl_reference": math.exp(nll_ref / count),
        "kl": kl / count,
        "bits_per_value": sum(bits) / len(bits),
        "compressed_bits_per_value": sum(cbits) / len(cbits),
    }


@torch.no_grad()
def reconstruction_error(
    captured: list[tuple[list[torch.Tensor], list[torch.Tensor]]],
    predictors: object,
    quantizer: object,
    first_layer_quantizer: object,
) -> tuple[list[float], list[float]]:
    """Per-layer relative MSE of the AQUA-KV reconstructions K^_l, V^_l (pre-RoPE) against the true ones.

    Args:
        captured: pre-RoPE keys/values from :func:`~icml25.llm_efficiency.aqua_kv.calibrate.capture_kv`.
        predictors, quantizer, first_layer_quantizer: as for the cache (same codec chain).

    Returns:
        ``(key_rel_mse, value_rel_mse)``, lists over layers.
    """
    from icml25.llm_efficiency.aqua_kv.predictors import AquaCodec, relative_mse

    codec = AquaCodec(predictors, quantizer, first_layer_quantizer)
    if not isinstance(captured, list) or not captured:
        raise ValueError("captured must be a non-empty list as returned by capture_kv")
    n_layers = len(captured[0][0])
    k_err, v_err, prev = [], [], None
    for layer in range(n_layers):
        k = torch.cat([s[0][layer] for s in captured])
        v = torch.cat([s[1][layer] for s in captured])
        _, prev = codec.encode_layer(layer, k, v, prev)
        k_err.append(relative_mse(prev[0], k))
        v_err.append(relative_mse(prev[1], v))
    return k_err, v_err
