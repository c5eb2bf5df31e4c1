"""SpargeAttn: Accurate Sparse Attention Accelerating Any Model Inference — ICML 2025 — P01 (reproduction).

Small-scale check of the paper's central claim — a cheap training-free prediction finds most of the
negligible attention tiles, so skipping them costs little accuracy — on synthetic attention with the
locality of image/video tokens (brief §6): per head, 16 cluster centres ``c ~ N(0, I_d)``; the cluster id
is piecewise constant along the sequence with segment lengths ``U[128, 512)``; ``q, k = c + 0.35·noise``,
``v = c·W + 0.5·noise`` with ``W ~ N(0, 1/64)``; softmax scale ``1/√d``.

Measured (mean over 3 seeds, reference path, INT8 Q/K, λ = 20):

* SpargeAttn (τ = 0.95, θ = 0.5): stage-1 sparsity and relative L1 vs dense attention;
* baseline 1: a random block mask with the same number of blocks per Q-block row;
* baseline 2: the oracle mask of the same size (the blocks of largest true attention mass);
* the tuner on diffuse attention (q, k × 0.7): it is tuned on calibration inputs of one head (fixed
  centres and ``W``; fresh segment layout and noise per input) and its chosen parameters are scored on
  *held-out* inputs of the same head, which it never saw, against its ``pv_l1`` budget.

Pass (named checks, :attr:`Report.checks`): sparsity ≥ 0.5, L1(Sparge) ≤ 0.04, L1(random) ≥ 2.5·L1(Sparge),
L1(Sparge) ≤ 2·L1(oracle) + 0.01, and the tuned error on every held-out input ≤ the tuner's budget.
``run(mask_predictor=...)`` swaps the stage-1 predictor (the tests pass a broken one, which must fail).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from icml25.kernels import Report
from icml25.kernels.experiment import Check, threshold_text
from icml25.kernels.sparse_attention import block_sparse_attention, predict_block_mask, sparge_attention
from icml25.kernels.sparse_attention.reference import dense_attention_reference, relative_l1
from icml25.llm_efficiency.sparge.tuner import SpargeTuner

TAU, THETA, LAMBDA = 0.95, 0.5, 20.0
BLOCK_Q, BLOCK_K = 128, 64
TUNER_L1, TUNER_PV_L1 = 0.07, 0.08  # the tuner's budgets (official defaults)
TUNER_INPUTS = {True: (2, 3), False: (2, 4)}  # quick/full: (calibration, held-out) inputs


def checks(quick: bool = True) -> list[Check]:
    """The pass rule as named checks on :func:`run`'s metrics (sparsity and L1s: mean of 3 seeds)."""
    n_cal, n_held = TUNER_INPUTS[bool(quick)]
    return [
        Check("sparsity >= 0.5", lambda m: m["sparsity"] >= 0.5),
        Check("L1 <= 0.04", lambda m: m["l1"] <= 0.04),
        Check("L1(random same-size mask) >= 2.5x L1", lambda m: m["baseline_random_l1"] >= 2.5 * m["l1"]),
        Check("L1 <= 2x L1(oracle same-size mask) + 0.01", lambda m: m["l1"] <= 2 * m["oracle_l1"] + 0.01),
        Check(
            f"tuned L1 <= pv_l1 budget ({TUNER_PV_L1:g}) on each of {n_held} held-out diffuse inputs "
            f"(tuned on {n_cal} others)",
            lambda m: m["tuned_heldout_l1_max"] <= TUNER_PV_L1,
        ),
    ]


def threshold(quick: bool = True) -> str:
    """The threshold text of :func:`run` (the names of :func:`checks`)."""
    return threshold_text(checks(quick))


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
    """Synthetic attention inputs with block locality (brief §6). Returns q, k, v ``[B, H, L, d]``.

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


def sparge_mask(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """SpargeAttn's stage-1 block mask at this reproduction's τ, θ and block sizes (reference path)."""
    return predict_block_mask(
        q, k, cdf_threshold=TAU, sim_threshold=THETA, block_q=BLOCK_Q, block_k=BLOCK_K, backend="reference"
    )


def run(
    quick: bool = True,
    seed: int = 0,
    out_dir: str | Path | None = None,
    *,
    mask_predictor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = sparge_mask,
) -> Report:
    """Reproduce P01 at small scale (quick: L=1024, H=1; full: L=2048, H=2; 3 seeds each).

    ``mask_predictor(q, k) -> [B, H, nq, nk]`` bool mask is the stage-1 prediction under test (default:
    SpargeAttn's, :func:`sparge_mask`); the random and oracle baselines keep as many blocks per row as it.
    """
    length, heads = (1024, 1) if quick else (2048, 2)
    n_calibration, n_held_out = TUNER_INPUTS[bool(quick)]
    seeds = [seed, seed + 1, seed + 2]
    rows: list[dict[str, float]] = []
    for s in tqdm(seeds, desc="P01 seeds", leave=False):
        torch.manual_seed(s)
        np.random.seed(s)  # noqa: NPY002 - the convention: seed every generator
        random.seed(s)
        gen = torch.Generator().manual_seed(s)
        q, k, v = clustered_qkv(1, heads, length, 64, generator=gen)
        dense = dense_attention_reference(q, k, v, is_causal=False, scale=1 / 8)
        # Stage 1 (mask prediction) then stage 2 (INT8, λ skip): with the default predictor this is exactly
        # sparge_attention(q, k, v, cdf_threshold=TAU, sim_threshold=THETA, pv_threshold=LAMBDA).
        mask = mask_predictor(q, k)
        kw = {"pv_threshold": LAMBDA, "block_q": BLOCK_Q, "block_k": BLOCK_K, "backend": "reference"}
        o, stats = block_sparse_attention(q, k, v, mask, return_stats=True, **kw)
        rand_mask, oracle_mask = same_budget_masks(mask, block_mass(q, k, BLOCK_Q, BLOCK_K), gen)
        o_rand = block_sparse_attention(q, k, v, rand_mask, **kw)
        o_oracle = block_sparse_attention(q, k, v, oracle_mask, **kw)
        rows.append(
            {
                "sparsity": stats.sparsity,
                "l1": relative_l1(o, dense),
                "pv_skip_fraction": stats.pv_skip_fraction,
                "baseline_random_l1": relative_l1(o_rand, dense),
                "oracle_l1": relative_l1(o_oracle, dense),
            }
        )
    metrics = {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}
    metrics["random_over_sparge"] = metrics["baseline_random_l1"] / max(metrics["l1"], 1e-12)

    # Tuner on diffuse attention (q, k x 0.7): tuned on calibration inputs of one head, its choice is
    # scored on held-out inputs of the same head (same centres and W, new segments and noise).
    tuner_kwargs = {
        "l1": TUNER_L1, "pv_l1": TUNER_PV_L1, "block_q": BLOCK_Q, "block_k": BLOCK_K, "backend": "reference",
    }  # fmt: skip
    if quick:
        tuner_kwargs.update(granularity=2, tau_tol=0.05, pv_tol=5.0)
    tuner = SpargeTuner(heads, **tuner_kwargs, progress=not quick)

    def diffuse_input(i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return clustered_qkv(
            1, heads, length, 64, generator=torch.Generator().manual_seed(seed + 200 + i), qk_gain=0.7,
            head_generator=torch.Generator().manual_seed(seed + 100),
        )  # fmt: skip

    def tuned_error(inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> tuple[float, float]:
        q, k, v = inputs
        o, st = sparge_attention(
            q, k, v, **tuner.result().kwargs(), return_stats=True, block_q=BLOCK_Q, block_k=BLOCK_K,
            backend="reference",
        )  # fmt: skip
        return relative_l1(o, dense_attention_reference(q, k, v, is_causal=False, scale=1 / 8)), st.sparsity

    calibration = [diffuse_input(i) for i in range(n_calibration)]
    for inputs in calibration:
        tuner.observe(*inputs)
    seen = [tuned_error(inputs) for inputs in calibration]
    held_out = [tuned_error(diffuse_input(100 + i)) for i in range(n_held_out)]
    metrics["tuned_heldout_l1"] = float(np.mean([e for e, _ in held_out]))
    metrics["tuned_heldout_l1_max"] = max(e for e, _ in held_out)
    metrics["tuned_heldout_sparsity"] = float(np.mean([s for _, s in held_out]))
    metrics["tuned_calibration_l1_max"] = max(e for e, _ in seen)
    metrics["tuner_budget_pv_l1"] = tuner.pv_l1

    figures: list[Path] = []
    if out_dir is not None:
        figures.append(_plot(rows, metrics, Path(out_dir)))
    return Report.from_checks(
        paper="P01",
        claim=(
            "SpargeAttn's training-free block prediction skips most attention tiles with little error: "
            "far better than a random mask of the same size and close to the oracle mask."
        ),
        checks=checks(quick),
        metrics=metrics,
        headline="l1",
        baseline="baseline_random_l1",
        figures=figures,
        notes=(
            "Sparsity and L1s are means over 3 seeds. "
            f"Synthetic clustered attention, B=1, H={heads}, L={length}, d=64, blocks {BLOCK_Q}/{BLOCK_K}, "
            f"τ={TAU}, θ={THETA}, λ={LAMBDA}, INT8 Q/K with K smoothing, reference (PyTorch) path. "
            "Random/oracle masks keep the same number of blocks per Q-block row as SpargeAttn's mask. "
            f"Tuner: {n_calibration} calibration and {n_held_out} held-out diffuse inputs (q, k x 0.7) of one "
            "head (same centres and W; new segment layout and noise); the budget is checked on the held-out "
            "ones. "
            + ("Quick tuner: granularity 2, τ tol 0.05, λ tol 5." if quick else "Tuner: official grid.")
        ),
    )


def _plot(rows: list[dict[str, float]], metrics: dict[str, float], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    names = ["SpargeAttn", "random mask", "oracle mask"]
    keys = ["l1", "baseline_random_l1", "oracle_l1"]
    ax.bar(names, [metrics[k] for k in keys], color=["tab:blue", "tab:gray", "tab:green"])
    for i, key in enumerate(keys):
        ax.scatter([i] * len(rows), [r[key] for r in rows], color="k", s=10, zorder=3)
    ax.set_ylabel("relative L1 vs dense")
    ax.set_title(f"P01: same block budget, sparsity {metrics['sparsity']:.2f}")
    fig.tight_layout()
    path = out_dir / "p01_sparge_l1.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
