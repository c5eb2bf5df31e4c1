"""AQUA-KV: Cache Me If You Must: Adaptive Key-Value Quantization for Large Language Models — ICML 2025, P36: one-shot calibration of the inter-layer predictors.

For each layer in order: inputs are the previous layer's *reconstructed* (quantized) pre-RoPE keys,
exactly as the cache will see them, targets the true keys; a closed-form ridge regression gives
``f^K_l``; the layer's keys are then compressed with it, and ``f^V_l`` is fitted on
``[K^_l ; V^_{l-1}] -> V_l``. The keys/values are captured from one full-precision forward pass per
batch (the official code runs the model layer by layer to bound GPU memory; the math is the same).
By default the fit is the official one (``train_predictors.py``, ``get_predictor``): every token of each
calibration sequence, the attention sinks included, and the ridge form of ``fit_linear_regression``;
``calibration_tokens="after_prefix"`` and ``ridge_form="centred"`` keep our earlier choices.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import torch

from icml25.kernels.checks import check_choice, check_int
from icml25.kernels.experiment import progress as progress_bar
from icml25.kernels.hf_cache import cache_argument
from icml25.llm_efficiency.aqua_kv.predictors import (
    RIDGE_FORMS,
    AquaCodec,
    AquaPredictors,
    Quantizer,
    equivalent_bits,
    fit_ridge,
    relative_mse,
)
from icml25.llm_efficiency.aqua_kv.rope import heads_to_rows, kv_layout, undo_rope

__all__ = ["CalibrationReport", "CapturedKV", "calibrate_predictors", "capture_kv"]

CALIBRATION_TOKENS = ("all", "after_prefix")
"""The token sets :func:`calibrate_predictors` can fit on (``calibration_tokens``)."""

logger = logging.getLogger(__name__)


def _check_batch(batch: object, prefix_size: int) -> torch.Tensor:
    if not isinstance(batch, torch.Tensor) or batch.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"batches must yield integer token tensors (B, T), got {getattr(batch, 'dtype', type(batch))}"
        )
    if batch.dim() == 1:
        batch = batch[None]
    if batch.dim() != 2:
        raise ValueError(f"batches must yield token tensors of shape (B, T), got {tuple(batch.shape)}")
    if batch.shape[1] <= prefix_size:
        raise ValueError(
            f"calibration sequences must be longer than prefix_size={prefix_size} "
            f"(the prefix is never compressed), got length {batch.shape[1]}"
        )
    return batch.long()


class CapturedKV(list):
    """What :func:`capture_kv` returns: a list with one ``(keys, values)`` entry per sequence, each a list
    over layers of float32 ``(T - prefix_size, c)`` rows, plus ``prefix_size``, the number of leading
    tokens that were dropped (so :func:`calibrate_predictors` can tell which tokens it was given)."""

    def __init__(self, sequences: Iterable = (), prefix_size: int = 0) -> None:
        super().__init__(sequences)
        self.prefix_size = check_int(prefix_size, "prefix_size", low=0)


@torch.no_grad()
def capture_kv(model: torch.nn.Module, batches: Iterable[torch.Tensor], prefix_size: int = 4) -> CapturedKV:
    """Run ``model`` in full precision and return each sequence's pre-RoPE keys and values per layer.

    Args:
        model: a Llama/Qwen-style ``transformers`` causal LM.
        batches: token tensors ``(B, T)`` with ``T > prefix_size``.
        prefix_size: leading tokens to drop (default 4: the attention sinks, which the cache never
            compresses, as evaluation wants; 0 keeps every token, what the official calibration fits on).

    Returns:
        a :class:`CapturedKV`: one entry per sequence, ``(keys, values)``, lists over layers of float32
        ``(T - prefix_size, c)`` rows; its ``prefix_size`` attribute records the tokens dropped.
    """
    prefix_size = check_int(prefix_size, "prefix_size", low=0)
    from transformers import DynamicCache

    layout = kv_layout(model.config)
    device = next(model.parameters()).device
    out = CapturedKV(prefix_size=prefix_size)
    for batch in batches:
        batch = _check_batch(batch, prefix_size).to(device)
        # Full-length layers (no config): a sliding-window config (Mistral) would make DynamicCache keep
        # only the last `sliding_window` keys; the model's own mask still applies the window.
        cache = DynamicCache()
        model(input_ids=batch, use_cache=True, **{cache_argument(model): cache})
        per_seq_k = [[] for _ in range(batch.shape[0])]
        per_seq_v = [[] for _ in range(batch.shape[0])]
        for layer in range(layout.num_layers):
            keys, values = (
                cache.layers[layer].keys,
                cache.layers[layer].values,
            )  # (B, H, T, d), keys post-RoPE
            if keys.shape[-2] != batch.shape[1]:  # positions 0..T-1 are assumed below
                raise RuntimeError(
                    f"layer {layer} cached {keys.shape[-2]} of {batch.shape[1]} tokens: the model's cache "
                    "dropped keys (capture needs every token)"
                )
            k = undo_rope(keys, layout, 0)[..., prefix_size:, :]
            v = values.float()[..., prefix_size:, :]
            for i in range(batch.shape[0]):
                per_seq_k[i].append(heads_to_rows(k[i : i + 1]).cpu())
                per_seq_v[i].append(heads_to_rows(v[i : i + 1]).cpu())
        out.extend(zip(per_seq_k, per_seq_v))
        logger.debug("captured KV of a batch %s (%d sequences so far)", tuple(batch.shape), len(out))
    return out


@dataclass
class CalibrationReport:
    """Per-layer fit quality (index = layer; layer 0 has no predictor and holds NaN for predictor metrics).

    ``*_pred_rel_mse``: ||f(X^) - Y||^2 / ||Y||^2 of the predictor alone (what is left to quantize);
    ``*_recon_rel_mse``: relative error of the final reconstruction K^ / V^ after residual quantization.
    ``*_equiv_bits``: -log4(predictor relMSE), the bits the prediction is "worth".
    """

    key_pred_rel_mse_train: list[float] = field(default_factory=list)
    key_pred_rel_mse_valid: list[float] = field(default_factory=list)
    value_pred_rel_mse_train: list[float] = field(default_factory=list)
    value_pred_rel_mse_valid: list[float] = field(default_factory=list)
    key_recon_rel_mse_valid: list[float] = field(default_factory=list)
    value_recon_rel_mse_valid: list[float] = field(default_factory=list)
    n_train_tokens: int = 0
    n_valid_tokens: int = 0

    @property
    def key_equiv_bits_valid(self) -> list[float]:
        return [equivalent_bits(x) if not math.isnan(x) else math.nan for x in self.key_pred_rel_mse_valid]

    @property
    def value_equiv_bits_valid(self) -> list[float]:
        return [equivalent_bits(x) if not math.isnan(x) else math.nan for x in self.value_pred_rel_mse_valid]

    def summary(self) -> str:
        """One line per layer."""
        lines = [f"train tokens {self.n_train_tokens}, valid tokens {self.n_valid_tokens}"]
        for i in range(len(self.key_recon_rel_mse_valid)):
            lines.append(
                f"layer {i}: K pred {self.key_pred_rel_mse_valid[i]:.4f} recon {self.key_recon_rel_mse_valid[i]:.4f} | "
                f"V pred {self.value_pred_rel_mse_valid[i]:.4f} recon {self.value_recon_rel_mse_valid[i]:.4f}"
            )
        return "\n".join(lines)


def calibrate_predictors(
    model: torch.nn.Module,
    batches: Iterable[torch.Tensor],
    quantizer: Quantizer,
    first_layer_quantizer: Quantizer | None = None,
    ridge: float = 1e-3,
    valid_fraction: float = 0.125,
    *,
    prefix_size: int = 4,
    calibration_tokens: Literal["all", "after_prefix"] = "all",
    ridge_form: Literal["official", "centred"] = "official",
    fit_inputs: Literal["reconstructed", "original"] = "reconstructed",
    progress: bool | None = None,
    captured: CapturedKV | None = None,
) -> tuple[AquaPredictors, CalibrationReport]:
    """Fit AQUA-KV's key and value predictors for every layer ``>= 1`` of ``model``.

    Args:
        model: a Llama/Qwen-style ``transformers`` causal LM (eval mode).
        batches: token tensors ``(B, T)`` (``T > prefix_size`` for ``calibration_tokens="after_prefix"``).
        quantizer: the residual quantizer that the cache will use (its noise is part of the fit).
        first_layer_quantizer: layer-0 quantizer (required; ``PassthroughQuantizer()`` keeps 16 bits).
        ridge: relative ridge damping (official ``percdamp`` = 1e-3).
        valid_fraction: fraction of sequences held out for the report (at least one when > 0).
        prefix_size: the cache's full-precision prefix (attention sinks); only
            ``calibration_tokens="after_prefix"`` uses it.
        calibration_tokens: ``"all"`` (default, official: every token of each sequence, the sinks
            included) or ``"after_prefix"`` (ours before the alignment: drop the first ``prefix_size``
            tokens, which the cache never compresses, so the fit sees only tokens it will predict).
        ridge_form: :func:`~icml25.llm_efficiency.aqua_kv.predictors.fit_ridge`'s form: ``"official"``
            (default: a ones column on the raw inputs, the intercept damped too) or ``"centred"`` (ours
            before the alignment: centred data, an unpenalised intercept).
        fit_inputs: ``"reconstructed"`` (the method) or ``"original"`` (ablation: fit on unquantized
            previous layers, a train/inference mismatch that lets errors accumulate).
        progress: a progress bar over layers; ``None`` (default): only in a terminal, never in CI or when
            stderr is not a terminal (``icml25.kernels.experiment.progress``). Each layer's fit is logged
            at INFO level on the ``icml25.llm_efficiency.aqua_kv.calibrate`` logger.
        captured: the output of :func:`capture_kv` for ``batches`` (reuse one capture across fits;
            ``batches`` is then ignored). It must hold the tokens the fit needs: captured with
            ``prefix_size=0`` for ``"all"``; for ``"after_prefix"`` any capture prefix up to
            ``prefix_size`` (the rest is dropped here), so one ``prefix_size=0`` capture serves both.

    Returns:
        ``(predictors, report)``.
    """
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None, got {type(progress).__name__} {progress!r}")
    if fit_inputs not in ("reconstructed", "original"):
        raise ValueError(f"fit_inputs must be 'reconstructed' or 'original', got {fit_inputs!r}")
    if not isinstance(valid_fraction, (int, float)) or not 0 <= valid_fraction < 1:
        raise ValueError(f"valid_fraction must be a float in [0, 1), got {valid_fraction!r}")
    if isinstance(prefix_size, bool) or not isinstance(prefix_size, numbers.Integral) or prefix_size < 0:
        raise ValueError(f"prefix_size must be an int >= 0, got {prefix_size!r}")
    check_choice(calibration_tokens, "calibration_tokens", CALIBRATION_TOKENS)
    check_choice(ridge_form, "ridge_form", RIDGE_FORMS)
    start = 0 if calibration_tokens == "all" else int(prefix_size)  # first calibration token
    if captured is not None and not isinstance(captured, CapturedKV):
        raise TypeError(
            "captured must be the CapturedKV that capture_kv returns (it records the tokens it dropped), "
            f"got {type(captured).__name__}"
        )
    if captured is not None and captured.prefix_size > start:
        raise ValueError(
            f"captured dropped the first {captured.prefix_size} tokens but calibration_tokens="
            f"{calibration_tokens!r} fits from token {start}: capture with capture_kv(..., prefix_size=0)"
        )
    layout = kv_layout(model.config)
    predictors = AquaPredictors.zeros(layout.num_layers, layout.kv_dim)
    codec = AquaCodec(predictors, quantizer, first_layer_quantizer)  # validates the quantizers first

    seqs = capture_kv(model, batches, start) if captured is None else _drop_tokens(captured, start)
    if not seqs:
        raise ValueError("batches must yield at least one sequence")
    n_valid = min(len(seqs) - 1, math.ceil(valid_fraction * len(seqs))) if valid_fraction > 0 else 0
    train, valid = seqs[: len(seqs) - n_valid], seqs[len(seqs) - n_valid :]

    def stack(part: list, kind: int, layer: int) -> torch.Tensor:
        return torch.cat([s[kind][layer] for s in part]) if part else torch.zeros(0, layout.kv_dim)

    report = CalibrationReport(n_train_tokens=sum(s[0][0].shape[0] for s in train),
                               n_valid_tokens=sum(s[0][0].shape[0] for s in valid))  # fmt: skip
    logger.info(
        "AQUA-KV calibration: %d layers, c=%d, %d train / %d valid tokens (%s), %s ridge, fit on %s inputs",
        layout.num_layers, layout.kv_dim, report.n_train_tokens, report.n_valid_tokens, calibration_tokens,
        ridge_form, fit_inputs,
    )  # fmt: skip
    prev = {"train": None, "valid": None}
    nan = math.nan
    disable = None if progress is None else not progress
    for layer in progress_bar(range(layout.num_layers), desc="AQUA-KV calibration", disable=disable):
        k = {"train": stack(train, 0, layer), "valid": stack(valid, 0, layer)}
        v = {"train": stack(train, 1, layer), "valid": stack(valid, 1, layer)}
        if layer > 0:
            # Key predictor: previous layer's keys (reconstructed, or original for the ablation) -> keys.
            x_train = prev["train"][0] if fit_inputs == "reconstructed" else stack(train, 0, layer - 1)
            w, b = fit_ridge(x_train, k["train"], ridge, ridge_form=ridge_form)
            _set(predictors.key[layer], w, b)
        recon = {}
        for split in ("train", "valid"):
            if k[split].shape[0] == 0:
                continue
            if layer > 0:
                # Encode keys first so the value predictor can be fitted on this layer's reconstructed keys.
                k_pred = codec._predict(predictors.key[layer], prev[split][0])
                k_hat = k_pred + quantizer.dequantize(quantizer.quantize(k[split] - k_pred)).float()
                recon[split] = k_hat
            else:
                recon[split] = None
        if layer > 0:
            if fit_inputs == "reconstructed":
                xv = torch.cat([recon["train"], prev["train"][1]], dim=-1)
            else:
                xv = torch.cat([k["train"], stack(train, 1, layer - 1)], dim=-1)
            w, b = fit_ridge(xv, v["train"], ridge, ridge_form=ridge_form)
            _set(predictors.value[layer], w, b)
        for split in ("train", "valid"):
            if k[split].shape[0] == 0:
                continue
            # The chain exactly as the cache runs it (same codec, same quantizer draws are deterministic).
            _, (k_hat, v_hat) = codec.encode_layer(layer, k[split], v[split], prev[split])
            if layer > 0:
                k_pred = codec._predict(predictors.key[layer], prev[split][0])
                v_pred = codec._predict(predictors.value[layer], torch.cat([k_hat, prev[split][1]], dim=-1))
                getattr(report, f"key_pred_rel_mse_{split}").append(relative_mse(k_pred, k[split]))
                getattr(report, f"value_pred_rel_mse_{split}").append(relative_mse(v_pred, v[split]))
            else:
                getattr(report, f"key_pred_rel_mse_{split}").append(nan)
                getattr(report, f"value_pred_rel_mse_{split}").append(nan)
            if split == "valid":
                report.key_recon_rel_mse_valid.append(relative_mse(k_hat, k[split]))
                report.value_recon_rel_mse_valid.append(relative_mse(v_hat, v[split]))
            prev[split] = (k_hat, v_hat)
        logger.info(
            "layer %d: K pred relMSE train %.4g valid %.4g | V pred relMSE train %.4g valid %.4g",
            layer, report.key_pred_rel_mse_train[-1],
            report.key_pred_rel_mse_valid[-1] if report.key_pred_rel_mse_valid else nan,
            report.value_pred_rel_mse_train[-1],
            report.value_pred_rel_mse_valid[-1] if report.value_pred_rel_mse_valid else nan,
        )  # fmt: skip
    predictors.meta.update(
        ridge=float(ridge), fit_inputs=fit_inputs, prefix_size=int(prefix_size),
        calibration_tokens=calibration_tokens, ridge_form=ridge_form,
    )  # fmt: skip
    return predictors, report


def _drop_tokens(captured: CapturedKV, start: int) -> list:
    """The sequences of ``captured`` from token ``start`` on (``captured`` already lacks its prefix)."""
    drop = start - captured.prefix_size
    if drop == 0:
        return list(captured)
    out = []
    for keys, values in captured:
        if keys[0].shape[0] <= drop:
            raise ValueError(
                f"calibration sequences must be longer than prefix_size={start} (the prefix is never "
                f"compressed), got length {captured.prefix_size + keys[0].shape[0]}"
            )
        out.append(([k[drop:] for k in keys], [v[drop:] for v in values]))
    return out


def _set(lin: torch.nn.Linear, w: torch.Tensor, b: torch.Tensor) -> None:
    with torch.no_grad():
        lin.weight.copy_(w.T)
        lin.bias.copy_(b)
