"""AQUA-KV: Cache Me If You Must: Adaptive Key-Value Quantization for Large Language Models — ICML 2025, P36: small-scale reproduction.

Our CPU-scale setting: a tiny Llama built from a config (quick: 4 layers, random init; full: 6 layers
trained for 300 steps on a synthetic order-2 Markov token stream). Predictors are calibrated on held-in
sequences; on held-out sequences we compare, at ~2 bits per value (HIGGS d=2, n=16, group 128), AQUA-KV
against the same quantizer without predictors and against per-token uniform 2-bit quantization:
per-layer relative MSE of K^/V^ (layers >= 1) and KL(p_fp || p_compressed) of next-token distributions
with prefix 4 and buffer 16 so that most tokens are read back compressed. An ablation fits the
predictors on unquantized inputs (the train/inference mismatch the paper warns about). Calibration is
the official one (every token, the sinks included; the official ridge form); the full run also reports
arms with our earlier choices (``ours_*``: sinks dropped and a centred ridge) and with one alignment each
(``tokens_only_*``, ``ridge_only_*``), to measure what each alignment changes (issue 85).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from icml25.kernels.experiment import (
    Check,
    Report,
    experiment_main,
    new_figure,
    progress,
    save_figure,
    seed_everything,
    threshold_text,
)
from icml25.kernels.rng import isolated_rng
from icml25.llm_efficiency.aqua_kv import (
    AquaPredictors,
    CalibrationReport,
    HiggsQuantizer,
    PassthroughQuantizer,
    UniformQuantizer,
    calibrate_predictors,
    capture_kv,
    evaluate_kv_compression,
    reconstruction_error,
)

PAPER = "P36"
CLAIM = (
    "Predicting each layer's keys/values from the previous layer and quantizing only the residual "
    "(AQUA-KV) is near-lossless at ~2 bits per value and beats quantizing at the same bit width without predictors."
)
VOCAB = 256  # the tiny Llama's vocabulary, also the Markov stream's


@dataclass(frozen=True)
class Setting:
    """One reproduction scale of P36."""

    n_layers: int
    """Decoder layers of the tiny Llama (paper: Llama 3.x / Qwen 2.5 models, 1B–70B; CPU: 4 quick, 6 full)."""
    train_steps: int
    """AdamW steps on the Markov stream before calibration (paper: pretrained models; CPU: 0 quick,
    i.e. random init, 300 full)."""
    n_calibration: int
    """Calibration sequences (paper: a RedPajama calibration set; CPU: 16 quick, 64 full)."""
    calibration_length: int
    """Tokens per calibration sequence (CPU: 128 quick, 256 full)."""
    n_eval: int
    """Held-out evaluation sequences (paper: WikiText-2 / long-context benchmarks; CPU: 4 quick, 16 full)."""
    eval_length: int
    """Tokens per evaluation sequence (CPU: 96 quick, 256 full)."""
    first_layer_n: int | None
    """Layer 0 (no predictor): HIGGS d=2 with this many grid points (official policy n=256, 4 bits; full),
    or None to keep it in 16 bits (official ``--not_quantize_first_layer``; quick, skips building the grid)."""
    gqa_train_steps: int
    """Training steps of a GQA variant (2 KV heads) reported without a threshold (full: 200; quick: 0, none)."""
    train_lr: float = 3e-3
    """AdamW learning rate of that training, weight decay 0 (paper: pretrained models, no training; ours
    3e-3 for a few hundred steps)."""
    higgs_d: int = 2
    """HIGGS vector dimension (paper's ~2-bit setting: d=2, n=16; both modes)."""
    higgs_n: int = 16
    """HIGGS grid points for layers >= 1 (both modes)."""
    group: int = 128
    """Quantization group size (paper: 128; both modes)."""
    uniform_bits: int = 2
    """Bits of the per-token uniform baseline (both modes)."""
    prefix_size: int = 4
    """Attention-sink tokens kept in full precision (official default 4)."""
    buffer_size: int = 16
    """Full-precision buffer before tokens are compressed (official: 128; CPU: 16, so most tokens are read
    back compressed)."""
    calibration_tokens: str = "all"
    """Tokens the predictors are calibrated on (official: ``"all"``, every token of each sequence, the sinks
    included; ours before issue 85: ``"after_prefix"``, without the ``prefix_size`` sinks; both modes: all)."""
    ridge_form: str = "official"
    """Ridge fit (official: ``"official"``, a ones column on the raw inputs, intercept damped too; ours
    before issue 85: ``"centred"``, centred data with an unpenalised intercept; both modes: official)."""
    alignment_arms: bool = False
    """Also calibrate and evaluate the ``ALIGNMENT_ARMS`` (the issue-85 measurement: full only; quick: no,
    the quick test's time budget)."""
    eval_step: int = 16
    """Tokens fed per forward pass in the KL evaluation (both modes)."""
    min_position: int = 20
    """First position whose next-token KL counts (both modes)."""


QUICK = Setting(
    n_layers=4, train_steps=0, n_calibration=16, calibration_length=128, n_eval=4, eval_length=96,
    first_layer_n=None, gqa_train_steps=0,
)  # fmt: skip
FULL = Setting(
    n_layers=6, train_steps=300, n_calibration=64, calibration_length=256, n_eval=16, eval_length=256,
    first_layer_n=256, gqa_train_steps=200, alignment_arms=True,
)  # fmt: skip
ALIGNMENT_ARMS = {
    "ours": ("after_prefix", "centred"),  # neither alignment: our calibration before issue 85
    "tokens_only": ("all", "centred"),  # only the calibration tokens aligned with the official code
    "ridge_only": ("after_prefix", "official"),  # only the ridge form aligned
}
"""Metric prefix -> ``(calibration_tokens, ridge_form)`` of the extra arms of the full run."""


def checks(setting: Setting) -> list[Check]:
    """The pass rule (the same in both modes): predictors halve the K/V error, cut the KL, and fitting them
    on unquantized inputs (the mismatch the paper warns about) is measurably worse."""
    return [
        Check("relMSE(AQUA) <= 0.5 x relMSE(no predictor) for K", lambda m: m["key_ratio"] <= 0.5),
        Check("relMSE(AQUA) <= 0.5 x relMSE(no predictor) for V", lambda m: m["value_ratio"] <= 0.5),
        Check("KL(AQUA) <= 0.6 x KL(no predictor)", lambda m: m["kl_ratio"] <= 0.6),
        Check(
            "relMSE(predictors fitted on unquantized inputs) / relMSE(AQUA) > 1.1",
            lambda m: m["broken_ratio"] > 1.1,
        ),
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    return threshold_text(checks(QUICK if quick else FULL))


def markov_stream(vocab: int, n_seq: int, length: int, *, table_seed: int, sample_seed: int) -> torch.Tensor:
    """Order-2 Markov token sequences ``(n_seq, length)`` with structure a tiny model learns quickly.

    Each previous token ``a = x[t-1]`` allows 4 next tokens ``table[a, :]``; with probability 3/4 the
    choice is ``x[t-2] mod 4`` (the order-2 part), else uniform. The table depends on ``table_seed`` only,
    so training, calibration and evaluation sequences (different ``sample_seed``) come from one process.
    """
    gen = torch.Generator().manual_seed(1234 + table_seed)
    table = torch.randint(0, vocab, (vocab, 4), generator=gen)
    gen_seq = torch.Generator().manual_seed(sample_seed)
    out = torch.empty(n_seq, length, dtype=torch.long)
    out[:, :2] = torch.randint(0, vocab, (n_seq, 2), generator=gen_seq)
    random_choice = torch.randint(0, 4, (n_seq, length), generator=gen_seq)
    use_context = torch.rand(n_seq, length, generator=gen_seq) < 0.75
    for t in range(2, length):
        k = torch.where(use_context[:, t], out[:, t - 2] % 4, random_choice[:, t])
        out[:, t] = table[out[:, t - 1], k]
    return out


def tiny_llama(n_layers: int, kv_heads: int = 4, seed: int = 0) -> torch.nn.Module:
    """Our CPU-scale Llama: hidden 128, 4 heads, MLP 256, vocab 256 (built from a config, no download).

    Initialised under a fork of torch's global generator seeded with ``seed`` (restored afterwards).
    """
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as err:
        raise ImportError(
            "the P36 reproduction builds a transformers Llama: pip install 'icml25-llm-efficiency[hf]'"
        ) from err

    config = LlamaConfig(
        hidden_size=128, num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=kv_heads,
        intermediate_size=256, vocab_size=VOCAB, max_position_embeddings=512,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    with isolated_rng(seed):
        return LlamaForCausalLM(config).eval()


def train_tiny_llama(
    model: torch.nn.Module, steps: int, seed: int, length: int = 128, lr: float = 3e-3
) -> float:
    """``steps`` AdamW steps of next-token training on the Markov stream (batch 16); returns the last loss.

    A fixed step count (not a wall-time budget) keeps the run deterministic across machines.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss_val = math.nan
    bar = progress(range(steps), desc="train tiny Llama", unit="step")
    for step in bar:
        ids = markov_stream(VOCAB, 16, length, table_seed=seed, sample_seed=10_000 + step)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_val = float(loss)
        bar.set_postfix(loss=f"{loss_val:.3f}")
    model.eval()
    return loss_val


def _mean_rel(kv: object, preds: AquaPredictors, quant: object, first: object) -> tuple[float, float]:
    """Mean relative MSE of the reconstructed K and V over layers >= 1 (layer 0 has no predictor)."""
    k, v = reconstruction_error(kv, preds, quant, first)
    return float(np.mean(k[1:])), float(np.mean(v[1:]))


def _gqa_ratios(s: Setting, seed: int, cal_batches: list, eval_batches: list):
    """The GQA variant (2 KV heads): AQUA / no-predictor error ratios of K and V (reported, no threshold).

    Its KV width (2 heads x 32 = 64) is narrower than the main model's group of 128, so its quantizers use
    groups of the KV width: the same bits per value, no padding.
    """
    gqa = tiny_llama(s.n_layers, kv_heads=2, seed=seed)
    train_tiny_llama(gqa, s.gqa_train_steps, seed, lr=s.train_lr)
    group = min(s.group, gqa.config.num_key_value_heads * gqa.config.head_dim)
    quant = HiggsQuantizer(d=s.higgs_d, n=s.higgs_n, group=group, seed=seed)
    first = (
        PassthroughQuantizer()
        if s.first_layer_n is None
        else HiggsQuantizer(d=s.higgs_d, n=s.first_layer_n, group=group, seed=seed)
    )
    g_aqua, _ = calibrate_predictors(
        gqa, cal_batches, quant, first, prefix_size=s.prefix_size, calibration_tokens=s.calibration_tokens,
        ridge_form=s.ridge_form, progress=False,
    )  # fmt: skip
    g_kv = capture_kv(gqa, eval_batches)
    gk, gv = _mean_rel(g_kv, g_aqua, quant, first)
    nk, nv = _mean_rel(g_kv, AquaPredictors.zeros(g_aqua.num_layers, g_aqua.kv_dim), quant, first)
    return {"gqa_key_ratio": gk / nk, "gqa_value_ratio": gv / nv}


def _figure(out_dir: Path, calibration: CalibrationReport, metrics: dict[str, float]) -> Path:
    fig, axes = new_figure(1, 2, figsize=(9, 3.5))
    layers = np.arange(1, len(calibration.key_pred_rel_mse_valid))
    axes[0].plot(layers, calibration.key_pred_rel_mse_valid[1:], "o-", label="K predictor")
    axes[0].plot(layers, calibration.value_pred_rel_mse_valid[1:], "s-", label="V predictor")
    axes[0].set(
        xlabel="layer", ylabel="relative MSE of prediction", yscale="log", title="what is left to quantize"
    )
    axes[0].legend()
    names = ["AQUA-KV", "HIGGS, no predictor", "uniform 2-bit"]
    axes[1].bar(names, [metrics["kl"], metrics["baseline_kl"], metrics["uniform_kl"]])
    axes[1].set(ylabel="KL(fp || compressed)", yscale="log", title="next-token KL")
    fig.tight_layout()
    return save_figure(fig, out_dir, "p36_aqua_kv")


def _calibration_text(s: Setting) -> str:
    tokens = {
        "all": f"every token, the {s.prefix_size} sink tokens included",
        "after_prefix": f"the tokens after the {s.prefix_size} sink tokens",
    }
    forms = {"official": "the official ridge (ones column, intercept damped)", "centred": "a centred ridge"}
    text = f"Calibration fits on {tokens[s.calibration_tokens]}, with {forms[s.ridge_form]}."
    if s.alignment_arms:
        arms = "; ".join(f"{name}_* = {tokens[tok]}, {forms[f]}" for name, (tok, f) in ALIGNMENT_ARMS.items())
        text += f" Extra arms: {arms}."
    return text


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce AQUA-KV's claim at small scale (see the module docstring and :class:`Setting`)."""
    from icml25.llm_efficiency.aqua_kv import AquaKVCache  # transformers (extra [hf]), loaded lazily

    seed_everything(seed)
    s = QUICK if quick else FULL
    t0 = time.perf_counter()
    model = tiny_llama(s.n_layers, seed=seed)
    metrics: dict[str, float] = {}
    if s.train_steps:
        metrics["train_loss"] = train_tiny_llama(model, s.train_steps, seed, lr=s.train_lr)
    cal = markov_stream(VOCAB, s.n_calibration, s.calibration_length, table_seed=seed, sample_seed=1)
    held = markov_stream(VOCAB, s.n_eval, s.eval_length, table_seed=seed, sample_seed=2)
    cal_batches = list(cal.split(8))
    eval_batches = list(held.split(4))

    quant = HiggsQuantizer(d=s.higgs_d, n=s.higgs_n, group=s.group, seed=seed)
    first = (
        PassthroughQuantizer()
        if s.first_layer_n is None
        else HiggsQuantizer(d=s.higgs_d, n=s.first_layer_n, group=s.group, seed=seed)
    )
    uniform = UniformQuantizer(bits=s.uniform_bits, group=s.group)
    # One full-precision pass over every token (prefix_size=0), reused by every fit: calibration_tokens
    # "after_prefix" drops the sinks from it. Evaluation counts only the tokens the cache compresses.
    cal_kv = capture_kv(model, cal_batches, prefix_size=0)
    eval_kv = capture_kv(model, eval_batches, prefix_size=s.prefix_size)

    def fit(tokens: str, form: str, fit_inputs: str = "reconstructed", bar: bool = False) -> tuple:
        return calibrate_predictors(
            model, None, quant, first, prefix_size=s.prefix_size, calibration_tokens=tokens,
            ridge_form=form, fit_inputs=fit_inputs, progress=bar, captured=cal_kv,
        )  # fmt: skip

    aqua, calibration = fit(s.calibration_tokens, s.ridge_form, bar=not quick)
    broken, _ = fit(s.calibration_tokens, s.ridge_form, "original")
    zeros = AquaPredictors.zeros(aqua.num_layers, aqua.kv_dim)

    k_aqua, v_aqua = _mean_rel(eval_kv, aqua, quant, first)
    k_none, v_none = _mean_rel(eval_kv, zeros, quant, first)
    k_unif, v_unif = _mean_rel(eval_kv, zeros, uniform, first)
    k_brok, v_brok = _mean_rel(eval_kv, broken, quant, first)

    def kl(preds: AquaPredictors, q: object) -> dict[str, float]:
        def factory() -> AquaKVCache:
            return AquaKVCache(
                model.config, preds, q, first, prefix_size=s.prefix_size, buffer_size=s.buffer_size
            )

        return evaluate_kv_compression(
            model, factory, eval_batches, step=s.eval_step, min_position=s.min_position
        )

    e_aqua, e_none, e_unif = kl(aqua, quant), kl(zeros, quant), kl(zeros, uniform)
    metrics.update(
        key_rel_mse=k_aqua, value_rel_mse=v_aqua,
        baseline_key_rel_mse=k_none, baseline_value_rel_mse=v_none,
        uniform_key_rel_mse=k_unif, uniform_value_rel_mse=v_unif,
        broken_key_rel_mse=k_brok, broken_value_rel_mse=v_brok,
        key_ratio=k_aqua / k_none, value_ratio=v_aqua / v_none,
        broken_ratio=(k_brok + v_brok) / (k_aqua + v_aqua),
        kl=e_aqua["kl"], baseline_kl=e_none["kl"], uniform_kl=e_unif["kl"], kl_ratio=e_aqua["kl"] / e_none["kl"],
        ppl=e_aqua["ppl"], baseline_ppl=e_none["ppl"], uniform_ppl=e_unif["ppl"], ppl_fp=e_aqua["ppl_reference"],
        bits_per_value=e_aqua["compressed_bits_per_value"], uniform_bits_per_value=e_unif["compressed_bits_per_value"],
        cache_bits_per_value=e_aqua["bits_per_value"], quantizer_bits_per_value=quant.bits_per_value,
        predictor_params=float(aqua.num_parameters()),
    )  # fmt: skip
    t_arms = time.perf_counter()
    for name, (tokens, form) in ALIGNMENT_ARMS.items() if s.alignment_arms else ():
        arm, _ = fit(tokens, form)
        arm_broken, _ = fit(tokens, form, "original")
        ka, va = _mean_rel(eval_kv, arm, quant, first)
        kb, vb = _mean_rel(eval_kv, arm_broken, quant, first)
        e_arm = kl(arm, quant)
        metrics.update({
            f"{name}_key_ratio": ka / k_none, f"{name}_value_ratio": va / v_none,
            f"{name}_kl": e_arm["kl"], f"{name}_kl_ratio": e_arm["kl"] / e_none["kl"],
            f"{name}_broken_ratio": (kb + vb) / (ka + va),
        })  # fmt: skip
    if s.alignment_arms:
        metrics["alignment_arms_seconds"] = time.perf_counter() - t_arms
    if s.gqa_train_steps:
        metrics.update(_gqa_ratios(s, seed, cal_batches, eval_batches))
    metrics["seconds"] = time.perf_counter() - t0

    figures = [_figure(Path(out_dir), calibration, metrics)] if out_dir is not None else []
    notes = (
        f"{'quick: random-init' if not s.train_steps else 'full: trained'} tiny Llama, {s.n_layers} layers, "
        f"c=128; calibration {s.n_calibration}x{s.calibration_length} tokens, eval {s.n_eval}x{s.eval_length}; "
        f"HIGGS d={s.higgs_d} n={s.higgs_n} g={s.group} ({quant.bits_per_value:.3f} b/v) for layers>=1, "
        f"layer 0: {first!r}; compressed chunks average {metrics['bits_per_value']:.3f} b/v incl. layer 0 "
        f"(uniform baseline {s.uniform_bits}-bit g={s.group}: {metrics['uniform_bits_per_value']:.3f}). "
        "Broken variant = predictors fitted on unquantized inputs. " + _calibration_text(s)
    )
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(s),
        metrics=metrics,
        headline="kl",
        baseline="baseline_kl",
        figures=figures,
        notes=notes,
    )


def main(argv: list[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
