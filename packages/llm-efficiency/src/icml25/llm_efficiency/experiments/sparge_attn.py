"""SpargeAttn: Accurate Sparse Attention Accelerating Any Model Inference — ICML 2025, P01: small-scale reproduction.

Small-scale check of the paper's central claim — a cheap training-free prediction finds most of the
negligible attention tiles, so skipping them costs little accuracy — on synthetic attention with the
locality of image/video tokens (our CPU-scale setting): per head, 16 cluster centres ``c ~ N(0, I_d)``;
the cluster id is piecewise constant along the sequence with segment lengths ``U[128, 512)``;
``q, k = c + 0.35·noise``, ``v = c·W + 0.5·noise`` with ``W ~ N(0, 1/64)``; softmax scale ``1/√d``.

Measured (mean over 3 seeds, the PyTorch path, INT8 Q/K, λ = 20):

* SpargeAttn (τ = 0.95, θ = 0.5): stage-1 sparsity and relative L1 vs dense attention;
* baseline 1: a random block mask with the same number of blocks per Q-block row;
* baseline 2: the oracle mask of the same size (the blocks of largest true attention mass);
* the tuner on diffuse attention (q, k × 0.7): it is tuned on calibration inputs of one head (fixed
  centres and ``W``; fresh segment layout and noise per input) and its chosen parameters are scored on
  *held-out* inputs of the same head, which it never saw, against l1 = 0.07: the tuner runs with the
  official CogVideoX budgets (0.06 for the τ search, 0.07 total for the λ search), so 0.07 bounds its
  total error (the official defaults 0.07 / 0.08 let the λ stage spend up to 0.08).

Pass (named checks, :attr:`Report.checks`): sparsity ≥ 0.5, L1(Sparge) ≤ 0.04, L1(random) ≥ 2.5·L1(Sparge),
L1(Sparge) ≤ 2·L1(oracle) + 0.01, and the tuned error on every held-out input ≤ l1 = 0.07.
``run(mask_predictor=...)`` swaps the stage-1 predictor (the tests pass a broken one, which must fail).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
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
from icml25.kernels.sparse_attention import block_sparse_attention, predict_block_mask, sparge_attention
from icml25.kernels.sparse_attention.reference import dense_attention_reference, relative_l1
from icml25.llm_efficiency.sparge.tuner import SpargeTuner

PAPER = "P01"
CLAIM = (
    "SpargeAttn's training-free block prediction skips most attention tiles with little error: "
    "far better than a random mask of the same size and close to the oracle mask."
)


@dataclass(frozen=True)
class Setting:
    """One reproduction scale of P01."""

    length: int
    """Sequence length L of the mask checks (paper: 4k–128k-token LLM/video workloads; CPU: 2048 in both
    modes). At the planned quick L = 1024 (8 x 16 blocks, 2-8 segments) one input decides a seed's mean:
    data seed 4 gave L1 0.074 against an oracle 0.009, so the quick gate failed on seeds 2 and 3
    (L1 <= 2x oracle + 0.01; seed 3 also random 1.46x < 2.5x). At L = 2048 seeds 0-4 pass with margin
    (L1 0.017-0.020, random 12.9-16.5x); the mask checks cost < 1 s of CPU."""
    tuner_length: int
    """Sequence length of the tuner's diffuse inputs (CPU: 1024 quick, 2048 full; each τ/λ bisection step
    runs attention at this length, the quick run's main cost)."""
    heads: int
    """Attention heads H (paper: all heads of real models; CPU: 1 quick, 2 full)."""
    n_calibration: int
    """Diffuse inputs the tuner is tuned on (paper: a calibration set of real prompts; CPU: 4 quick, 2 full).
    The quick tuner's coarse search (granularity 2) tuned on 2 inputs chose parameters that overshot
    l1 = 0.07 on a held-out input (seed 4: 0.080, calibration max 0.049); its choice is the max τ, λ over
    the inputs seen, so 4 inputs give a choice that holds on held-out inputs (max 0.035-0.040 over 8 of
    them, seeds 0-4). The full run's official grid held at 2 (max 0.065)."""
    n_held_out: int
    """Diffuse inputs of the same head its choice is scored on, never seen by it (CPU: 3 quick, 4 full)."""
    fast_tuner: bool
    """Coarse tuner search (granularity 2, τ tol 0.05, λ tol 5; quick) instead of the official grid (full)."""
    n_seeds: int = 3
    """Seeds the sparsity and the L1 errors are averaged over (both modes)."""
    dim: int = 64
    """Head dimension d (paper: the models' 64/128; CPU: 64)."""
    tau: float = 0.95
    """Stage-1 cumulative-mass threshold τ (paper's plug-and-play range; the same in both modes)."""
    theta: float = 0.5
    """Stage-1 self-similarity threshold θ (both modes)."""
    lam: float = 20.0
    """Stage-2 PV-skip threshold λ in log2 units (both modes)."""
    block_q: int = 128
    """Query block size (paper and official kernel: 128)."""
    block_k: int = 64
    """Key block size (paper and official kernel: 64)."""
    tuner_l1: float = 0.06
    """The tuner's stage-1 (τ search) error budget (official CogVideoX budgets 0.06 / 0.07; defaults 0.07 / 0.08)."""
    tuner_pv_l1: float = 0.07
    """The tuner's total (λ search) error budget: the l1 = 0.07 its choice must not exceed on the held-out
    inputs (with the official defaults 0.07 / 0.08 the λ stage may spend up to 0.08 by design)."""


QUICK = Setting(length=2048, tuner_length=1024, heads=1, n_calibration=4, n_held_out=3, fast_tuner=True)
FULL = Setting(length=2048, tuner_length=2048, heads=2, n_calibration=2, n_held_out=4, fast_tuner=False)


def checks(setting: Setting) -> list[Check]:
    """The pass rule as named checks on :func:`run`'s metrics (sparsity and L1s: mean of the seeds)."""
    budget = setting.tuner_pv_l1
    return [
        Check("sparsity >= 0.5", lambda m: m["sparsity"] >= 0.5),
        Check("L1 <= 0.04", lambda m: m["l1"] <= 0.04),
        Check("L1(random same-size mask) >= 2.5x L1", lambda m: m["baseline_random_l1"] >= 2.5 * m["l1"]),
        Check("L1 <= 2x L1(oracle same-size mask) + 0.01", lambda m: m["l1"] <= 2 * m["oracle_l1"] + 0.01),
        Check(
            f"tuned L1 <= l1 ({budget:g}) on each of {setting.n_held_out} held-out diffuse inputs "
            f"(tuned on {setting.n_calibration} others)",
            lambda m: m["tuned_heldout_l1_max"] <= budget,
        ),
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    return threshold_text(checks(QUICK if quick else FULL))


def clustered_qkv(
    batch: int,
    heads: int,
    length: int,
    dim: int,
    *,
    generator: torch.Generator,
    qk_gain: float = 1.0,
    head_generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Synthetic attention inputs with block locality (module docstring). Returns q, k, v ``[B, H, L, d]``.

    The head's parameters (cluster centres, value map ``W``) are drawn from ``head_generator`` when given,
    else from ``generator``; the segment layout and the noise always come from ``generator``. A fixed
    ``head_generator`` seed with different ``generator`` seeds gives different inputs to the same head.
    """
    shape = (batch, heads, length, dim)
    head_gen = generator if head_generator is None else head_generator
    centres = torch.randn(batch, heads, 16, dim, generator=head_gen)
    ids = torch.empty(batch, heads, length, dtype=torch.long)
    for b in range(batch):
        for h in range(heads):
            pos = 0
            while pos < length:
                seg = int(torch.randint(128, 512, (1,), generator=generator))
                ids[b, h, pos : pos + seg] = int(torch.randint(0, 16, (1,), generator=generator))
                pos += seg
    c = torch.gather(centres, 2, ids[..., None].expand(shape))
    w = torch.randn(batch, heads, dim, dim, generator=head_gen) / math.sqrt(dim)
    q = qk_gain * (c + 0.35 * torch.randn(shape, generator=generator))
    k = qk_gain * (c + 0.35 * torch.randn(shape, generator=generator))
    v = c @ w + 0.5 * torch.randn(shape, generator=generator)
    return q, k, v


def block_mass(q: torch.Tensor, k: torch.Tensor, block_q: int, block_k: int) -> torch.Tensor:
    """True attention mass of every tile, averaged over the tile's query rows: ``[B, H, nq, nk]``."""
    probs = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(dim=-1)
    B, H, L, M = probs.shape
    nq, nk = L // block_q, M // block_k
    return probs.view(B, H, nq, block_q, nk, block_k).sum(dim=-1).mean(dim=3)


def same_budget_masks(mask: torch.Tensor, mass: torch.Tensor, generator: torch.Generator):
    """Random and oracle masks keeping, in every Q-block row, as many blocks as ``mask`` does."""
    count = mask.sum(dim=-1, keepdim=True)
    nk = mask.shape[-1]
    rank_random = torch.rand(mask.shape, generator=generator).argsort(dim=-1).argsort(dim=-1)
    rank_oracle = mass.argsort(dim=-1, descending=True).argsort(dim=-1)
    return rank_random < count, rank_oracle < count.clamp(max=nk)


def sparge_mask(q: torch.Tensor, k: torch.Tensor, setting: Setting = QUICK) -> torch.Tensor:
    """SpargeAttn's stage-1 block mask at the setting's τ, θ and block sizes (reference path)."""
    return predict_block_mask(
        q, k, cdf_threshold=setting.tau, sim_threshold=setting.theta, block_q=setting.block_q,
        block_k=setting.block_k, backend="reference",
    )  # fmt: skip


def measure_masks(
    setting: Setting, seed: int, mask_predictor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> list[dict[str, float]]:
    """Per seed: the predicted mask's sparsity and L1, and the L1 of the same-size random and oracle masks."""
    s = setting
    kw = {"pv_threshold": s.lam, "block_q": s.block_q, "block_k": s.block_k, "backend": "reference"}
    rows: list[dict[str, float]] = []
    for data_seed in progress(range(seed, seed + s.n_seeds), desc="P01 seeds"):
        gen = torch.Generator().manual_seed(data_seed)
        q, k, v = clustered_qkv(1, s.heads, s.length, s.dim, generator=gen)
        dense = dense_attention_reference(q, k, v, is_causal=False, scale=1 / math.sqrt(s.dim))
        # Stage 1 (mask prediction) then stage 2 (INT8, λ skip): with the default predictor this is exactly
        # sparge_attention(q, k, v, cdf_threshold=τ, sim_threshold=θ, pv_threshold=λ).
        mask = mask_predictor(q, k)
        o, stats = block_sparse_attention(q, k, v, mask, return_stats=True, **kw)
        rand_mask, oracle_mask = same_budget_masks(mask, block_mass(q, k, s.block_q, s.block_k), gen)
        rows.append(
            {
                "sparsity": stats.sparsity,
                "l1": relative_l1(o, dense),
                "pv_skip_fraction": stats.pv_skip_fraction,
                "baseline_random_l1": relative_l1(block_sparse_attention(q, k, v, rand_mask, **kw), dense),
                "oracle_l1": relative_l1(block_sparse_attention(q, k, v, oracle_mask, **kw), dense),
            }
        )
    return rows


def measure_tuner(setting: Setting, seed: int) -> dict[str, float]:
    """Tune on diffuse inputs (q, k x 0.7) of one head; score the choice on held-out inputs of that head
    (same centres and W, new segments and noise)."""
    s = setting
    blocks = {"block_q": s.block_q, "block_k": s.block_k, "backend": "reference"}
    fast = {"granularity": 2, "tau_tol": 0.05, "pv_tol": 5.0} if s.fast_tuner else {}
    tuner = SpargeTuner(
        s.heads, l1=s.tuner_l1, pv_l1=s.tuner_pv_l1, **blocks, **fast, progress=not s.fast_tuner
    )

    def diffuse_input(i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return clustered_qkv(
            1, s.heads, s.tuner_length, s.dim, generator=torch.Generator().manual_seed(seed + 200 + i), qk_gain=0.7,
            head_generator=torch.Generator().manual_seed(seed + 100),
        )  # fmt: skip

    def tuned_error(inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> tuple[float, float]:
        q, k, v = inputs
        # Tuned inference keeps the attention sink (K block 0), as the official one does.
        o, st = sparge_attention(
            q, k, v, **tuner.result().kwargs(), attention_sink=True, return_stats=True, **blocks
        )
        dense = dense_attention_reference(q, k, v, is_causal=False, scale=1 / math.sqrt(s.dim))
        return relative_l1(o, dense), st.sparsity

    calibration = [diffuse_input(i) for i in range(s.n_calibration)]
    for inputs in calibration:
        tuner.observe(*inputs)
    seen = [tuned_error(inputs) for inputs in calibration]
    held_out = [tuned_error(diffuse_input(100 + i)) for i in range(s.n_held_out)]
    return {
        "tuned_heldout_l1": float(np.mean([e for e, _ in held_out])),
        "tuned_heldout_l1_max": max(e for e, _ in held_out),
        "tuned_heldout_sparsity": float(np.mean([sp for _, sp in held_out])),
        "tuned_calibration_l1_max": max(e for e, _ in seen),
        "tuner_budget_pv_l1": tuner.pv_l1,
    }


def _figure(rows: list[dict[str, float]], metrics: dict[str, float], out_dir: Path) -> Path:
    fig, ax = new_figure(figsize=(5, 3.2))
    names = ["SpargeAttn", "random mask", "oracle mask"]
    keys = ["l1", "baseline_random_l1", "oracle_l1"]
    ax.bar(names, [metrics[k] for k in keys], color=["tab:blue", "tab:gray", "tab:green"])
    for i, key in enumerate(keys):
        ax.scatter([i] * len(rows), [r[key] for r in rows], color="k", s=10, zorder=3)
    ax.set_ylabel("relative L1 vs dense")
    ax.set_title(f"P01: same block budget, sparsity {metrics['sparsity']:.2f}")
    fig.tight_layout()
    return save_figure(fig, out_dir, "p01_sparge_l1")


def run(
    quick: bool = True,
    seed: int = 0,
    out_dir: str | Path | None = None,
    *,
    mask_predictor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> Report:
    """Reproduce P01 at small scale (quick: L=2048, H=1, tuner at L=1024; full: L=2048, H=2; 3 seeds each).

    ``mask_predictor(q, k) -> [B, H, nq, nk]`` bool mask is the stage-1 prediction under test (default:
    SpargeAttn's, :func:`sparge_mask`); the random and oracle baselines keep as many blocks per row as it.
    """
    seed_everything(seed)
    s = QUICK if quick else FULL
    predictor = mask_predictor or functools.partial(sparge_mask, setting=s)
    rows = measure_masks(s, seed, predictor)
    metrics = {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}
    metrics["random_over_sparge"] = metrics["baseline_random_l1"] / max(metrics["l1"], 1e-12)
    metrics.update(measure_tuner(s, seed))
    figures = [_figure(rows, metrics, Path(out_dir))] if out_dir is not None else []
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(s),
        metrics=metrics,
        headline="l1",
        baseline="baseline_random_l1",
        figures=figures,
        seeds=list(range(seed, seed + s.n_seeds)),
        notes=(
            f"Sparsity and L1s are means over {s.n_seeds} seeds. "
            f"Synthetic clustered attention, B=1, H={s.heads}, L={s.length}, d={s.dim}, blocks "
            f"{s.block_q}/{s.block_k}, τ={s.tau}, θ={s.theta}, λ={s.lam}, INT8 Q/K with K smoothing, "
            "PyTorch path (backend='reference': batched stage 2). "
            "Random/oracle masks keep the same number of blocks per Q-block row as SpargeAttn's mask. "
            f"Tuner (L={s.tuner_length}): {s.n_calibration} calibration and {s.n_held_out} held-out diffuse "
            "inputs (q, k x 0.7) of "
            "one head (same centres and W; new segment layout and noise); the budget is checked on the "
            "held-out ones. "
            + (
                "Quick tuner: granularity 2, τ tol 0.05, λ tol 5."
                if s.fast_tuner
                else "Tuner: official grid."
            )
        ),
    )


def main(argv: list[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
