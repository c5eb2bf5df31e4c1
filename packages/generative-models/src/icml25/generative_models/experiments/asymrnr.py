"""AsymRnR: Video DiT Acceleration with Asymmetric Reduction and Restoration — ICML 2025, P21: reproduction.
Small-scale reproduction.

Sun et al., ICML 2025 (arXiv 2412.11706; official code ``wenhao728/AsymRnR``). Claim: reducing queries and
keys/values separately, by amounts taken from a per-(feature, block, step) redundancy schedule, keeps a video
DiT's output closer to the unreduced model than uniform token reduction at the same speed. On real models
(CogVideoX, HunyuanVideo, Mochi) this is VBench quality at equal latency, which needs a GPU and the weights;
the CPU-checkable core is the approximation error at equal attention cost.

Setting (:class:`Setting`): a synthetic multi-block "video" on an ``(F, H, W)`` token grid, C = 64. Each of
the blocks is a self-attention with fixed random weights (4 heads) over its own field: white noise smoothed
with a block-specific bandwidth σ_b voxels, unit variance per channel, plus a little white noise, so
redundancy varies strongly by block; each block sees several "denoising steps" of the field drifting as
AR(1) with ρ = 0.95. The full outputs are Y_full; the metric is the mean over blocks and steps of
‖Y − Y_full‖ / ‖Y_full‖. Budget: total attention cost Σ N_q′·N_kv′ = 55% of the full cost.

Methods: (a) AsymRnR: tiers calibrated from the full run (deciles of the relative nearest-destination
distance of Q and of V, :class:`~icml25.generative_models.asymrnr.RedundancyRecorder`), ratios
``α · tier / 9`` per feature, block and step (capped at 0.85), α set by bisection to the budget; matching
cache of 2 steps; (b) uniform symmetric: one hidden-state ratio for every block (ToMe-like
reduce-attend-restore on the block input) at the budget; (c) AsymRnR with inverted tiers (9 − tier);
(a2, full only) a second synthetic whose query and key/value streams come from different fields
(σ_q ≠ σ_kv per block) to expose asymmetry: AsymRnR vs the same algorithm forced to ratio_q = ratio_kv
(tiers averaged).

Pass rule (:func:`checks`), written before running from the reproduction plan and its second review:
full: err(a) ≤ 0.8 × err(b); err(c) ≥ 1.2 × err(a); cache raises err(a) by ≤ 10%; err(a2 asym) ≤ 0.9 ×
err(a2 symmetric-adaptive); every method within the budget. Quick (3 blocks, 2 steps, N = 288):
err(a) < err(b) and the budget. The broken variant (``variant="reversed_order"``: the *most* similar
sources are kept and the least similar dropped) fails the quick gate.

Run: ``python -m icml25.generative_models.experiments.asymrnr [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from icml25.generative_models.asymrnr import (
    MatchCache,
    MatchResult,
    RedundancyRecorder,
    asymrnr_attention,
    match_tokens,
    reduced_length,
    rnr_apply,
    spatiotemporal_split,
)
from icml25.kernels.experiment import (
    Check,
    Report,
    experiment_main,
    new_figure,
    progress,
    save_figure,
    seed_everything,
    threshold_text,
    torch_threads,
)

PAPER = "P21"
CLAIM = (
    "Asymmetric, redundancy-scheduled reduction of queries and keys/values (AsymRnR) approximates a video "
    "DiT's attention better than uniform symmetric token reduction at the same attention cost (paper: "
    "~1.2-1.3x speed-ups on CogVideoX/HunyuanVideo/Mochi with VBench on par)."
)
BUDGET = 0.55
A_VS_B = 0.8
C_VS_A = 1.2
CACHE_MAX = 1.10
ASYM_VS_SYM = 0.9
R_MAX = 0.85


@dataclass(frozen=True)
class Setting:
    """One reproduction scale."""

    grid: tuple[int, int, int]
    """Token grid (F, H, W) (paper: CogVideoX-2B latents 13 × 60 × 90; ours 8 × 12 × 12 = 1,152)."""
    sigmas: tuple[float, ...]
    """Smoothing bandwidth σ_b of each block's field, voxels (paper: 30+ trained blocks; ours 6)."""
    steps: int
    """Denoising steps per block (paper 50; ours 4), AR(1) drift ρ between steps."""
    seeds: int
    """Seeds averaged (the operator and fields are fixed random functions of each seed)."""
    asym_check: bool
    """Also run the (a2) Q-vs-KV asymmetry comparison."""
    channels: int = 64
    heads: int = 4
    rho: float = 0.95
    noise: float = 0.05
    stride: tuple[int, int, int] = (2, 2, 2)
    cache_steps: int = 2


FULL = Setting(grid=(8, 12, 12), sigmas=(0.5, 0.8, 1.2, 2.0, 3.0, 4.0), steps=4, seeds=3, asym_check=True)
QUICK = Setting(grid=(2, 12, 12), sigmas=(0.5, 1.2, 3.0), steps=2, seeds=1, asym_check=False)


def checks(setting: Setting) -> list[Check]:
    """The pass rule of ``setting`` (see the module docstring)."""
    budget = Check(
        f"every method's attention cost <= {BUDGET:g} of full",
        lambda m: max(m["cost_a"], m["cost_b"], m["cost_c"]) <= BUDGET + 1e-9,
    )
    if not setting.asym_check:
        return [
            Check("err(a) AsymRnR < err(b) uniform symmetric", lambda m: m["err_a"] < m["baseline_err_b"]),
            budget,
        ]
    return [
        Check(
            f"err(a) <= {A_VS_B:g} x err(b) uniform symmetric",
            lambda m: m["err_a"] <= A_VS_B * m["baseline_err_b"],
        ),
        Check(f"err(c) inverted tiers >= {C_VS_A:g} x err(a)", lambda m: m["err_c"] >= C_VS_A * m["err_a"]),
        Check(
            f"cache raises err(a) by <= {CACHE_MAX - 1:.0%}",
            lambda m: m["err_a"] <= CACHE_MAX * m["err_a_nocache"],
        ),
        Check(
            f"err(a2 asymmetric) <= {ASYM_VS_SYM:g} x err(a2 symmetric-adaptive)",
            lambda m: m["err_a2_asym"] <= ASYM_VS_SYM * m["err_a2_sym"],
        ),
        budget,
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it."""
    return threshold_text(checks(QUICK if quick else FULL))


# ------------------------------------------------------------------------------------------ synthetic
def _smooth(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian smoothing of ``x [C, F, H, W]`` (reflect padding), σ in voxels."""
    r = max(1, math.ceil(3 * sigma))
    t = torch.arange(-r, r + 1, dtype=x.dtype)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    k = k / k.sum()
    out = x
    for axis in (1, 2, 3):
        moved = out.movedim(axis, -1)
        shape = moved.shape
        flat = moved.reshape(-1, 1, shape[-1])
        pad = min(r, shape[-1] - 1)
        kk = k[r - pad : r + pad + 1] if pad < r else k
        kk = kk / kk.sum()
        flat = F.conv1d(F.pad(flat, (pad, pad), mode="reflect") if pad else flat, kk.view(1, 1, -1))
        out = flat.reshape(shape).movedim(-1, axis)
    return out


def make_fields(setting: Setting, sigma: float, gen: torch.Generator) -> list[torch.Tensor]:
    """Tokens ``[N, C]`` of one block at every step: an AR(1) sequence of σ-smoothed noise fields."""
    C, (Fr, H, W) = setting.channels, setting.grid

    def field() -> torch.Tensor:
        return _smooth(torch.randn(C, Fr, H, W, generator=gen), sigma)

    z = field()
    out = []
    for _ in range(setting.steps):
        x = z.reshape(C, -1).T
        x = (x - x.mean(0)) / x.std(0).clamp_min(1e-8)
        out.append(x + setting.noise * torch.randn(x.shape, generator=gen))
        z = setting.rho * z + math.sqrt(1 - setting.rho**2) * field()
    return out


class Block:
    """Self-attention with fixed random weights (``heads`` heads); queries and keys/values may read
    different token streams (the a2 setting)."""

    def __init__(self, setting: Setting, gen: torch.Generator) -> None:
        C = setting.channels
        self.h, self.d = setting.heads, C // setting.heads
        self.w = [torch.randn(C, C, generator=gen) / math.sqrt(C) for _ in range(4)]

    def heads(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).reshape(-1, self.h, self.d).transpose(0, 1)[None]  # [1, H, N, d]

    def out(self, o: torch.Tensor) -> torch.Tensor:
        return o[0].transpose(0, 1).reshape(-1, self.h * self.d) @ self.w[3]

    def qkv(self, xq: torch.Tensor, xkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.heads(xq, self.w[0]), self.heads(xkv, self.w[1]), self.heads(xkv, self.w[2])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _reverse(m: MatchResult) -> MatchResult:
    return MatchResult(m.nearest_dst, m.order.flip(-1), m.similarity)


class _ReversedCache(MatchCache):
    """The broken variant's cache: the order of every matching reversed (keeps the most similar sources)."""

    def get(self, *args, **kwargs):
        split, m = super().get(*args, **kwargs)
        return split, _reverse(m)


def _cost(n: int, n_dst: int, rq: np.ndarray, rkv: np.ndarray) -> float:
    lq = np.vectorize(lambda r: reduced_length(n, n_dst, float(r)))(rq)
    lkv = np.vectorize(lambda r: reduced_length(n, n_dst, float(r)))(rkv)
    return float((lq * lkv).sum() / (n * n * rq.size))


def allocate(tq: np.ndarray, tkv: np.ndarray, n: int, n_dst: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Ratios ``min(R_MAX, α·tier/9)`` with the largest α (bisection) whose total cost is ≤ the budget."""

    def ratios(alpha: float) -> tuple[np.ndarray, np.ndarray]:
        return np.minimum(R_MAX, alpha * tq / 9.0), np.minimum(R_MAX, alpha * tkv / 9.0)

    lo, hi = 0.0, 20.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if _cost(n, n_dst, *ratios(mid)) <= BUDGET:
            hi = mid
        else:
            lo = mid
    rq, rkv = ratios(hi)
    return rq, rkv, _cost(n, n_dst, rq, rkv)


def uniform_ratio(n: int, n_dst: int) -> tuple[float, float]:
    """The smallest uniform hidden-state ratio whose cost ``(N′/N)²`` is ≤ the budget."""
    lo, hi = 0.0, R_MAX
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if (reduced_length(n, n_dst, mid) / n) ** 2 <= BUDGET:
            hi = mid
        else:
            lo = mid
    return hi, (reduced_length(n, n_dst, hi) / n) ** 2


def _run_asym(blocks, xs_q, xs_kv, setting, rq, rkv, cache_steps, seed, variant="none") -> tuple[float, list]:
    """Mean relative error of AsymRnR with per-(block, step) ratios ``rq, rkv [B, S]``."""
    cls = _ReversedCache if variant == "reversed_order" else MatchCache
    cache = cls(cache_steps, generator=torch.Generator().manual_seed(seed + 7))
    errs = np.zeros((len(blocks), setting.steps))
    for s in range(setting.steps):
        for b, blk in enumerate(blocks):
            q, k, v = blk.qkv(xs_q[b][s], xs_kv[b][s])
            o = asymrnr_attention(
                q, k, v, setting.grid, ratio_q=float(rq[b, s]), ratio_kv=float(rkv[b, s]),
                stride=setting.stride, cache=cache, cache_key=b, step=s,
            )  # fmt: skip
            errs[b, s] = _rel(blk.out(o), blk.ref[s])
    return float(errs.mean()), errs.mean(1).tolist()


def _run_uniform(blocks, xs, setting, ratio, seed) -> tuple[float, list]:
    gen = torch.Generator().manual_seed(seed + 11)
    errs = np.zeros((len(blocks), setting.steps))
    for s in range(setting.steps):
        for b, blk in enumerate(blocks):
            x = xs[b][s]
            split = spatiotemporal_split(setting.grid, setting.stride, generator=gen)
            m = match_tokens(x, split)

            def attend(xr: torch.Tensor, blk=blk) -> torch.Tensor:
                q, k, v = blk.qkv(xr, xr)
                return blk.out(F.scaled_dot_product_attention(q, k, v))

            errs[b, s] = _rel(rnr_apply(x, attend, split, m, ratio), blk.ref[s])
    return float(errs.mean()), errs.mean(1).tolist()


def _world(setting: Setting, seed: int, sig_q, sig_kv):
    gen = torch.Generator().manual_seed(seed)
    blocks = [Block(setting, gen) for _ in sig_q]
    xs_q = [make_fields(setting, s, gen) for s in sig_q]
    xs_kv = xs_q if sig_kv is None else [make_fields(setting, s, gen) for s in sig_kv]
    rec = RedundancyRecorder(len(blocks), setting.steps, setting.stride, seed=seed)
    for b, blk in enumerate(blocks):
        blk.ref = []
        for s in range(setting.steps):
            q, k, v = blk.qkv(xs_q[b][s], xs_kv[b][s])
            blk.ref.append(blk.out(F.scaled_dot_product_attention(q, k, v)))
            rec.record("q", b, s, q, setting.grid)
            rec.record("v", b, s, v, setting.grid)
    sched = rec.schedule({})
    return (
        blocks,
        xs_q,
        xs_kv,
        sched.tiers["q"].numpy().astype(float),
        sched.tiers["v"].numpy().astype(float),
        rec,
    )


def evaluate(
    setting: Setting, seed: int = 0, out_dir: str | Path | None = None, variant: str = "none"
) -> Report:
    """Measure every metric of :func:`checks` (``variant="reversed_order"``: the broken variant)."""
    t0 = time.perf_counter()
    n = math.prod(setting.grid)
    n_dst = spatiotemporal_split(setting.grid, setting.stride).n_dst
    keys = ("err_a", "err_a_nocache", "baseline_err_b", "err_c", "err_a2_asym", "err_a2_sym")
    acc: dict[str, list[float]] = {k: [] for k in keys}
    per_block: dict[str, list] = {"a": [], "b": [], "c": []}
    costs: dict[str, float] = {}
    ratio_b, cost_b = uniform_ratio(n, n_dst)
    seeds = [seed + 1000 * i for i in range(setting.seeds)]
    for sd in progress(seeds, desc="P21 seeds"):
        blocks, xs_q, xs_kv, tq, tv, rec = _world(setting, sd, setting.sigmas, None)
        rq, rkv, costs["cost_a"] = allocate(tq, tv, n, n_dst)
        e, pb = _run_asym(blocks, xs_q, xs_kv, setting, rq, rkv, setting.cache_steps, sd, variant)
        acc["err_a"].append(e)
        per_block["a"].append(pb)
        if setting.asym_check:
            acc["err_a_nocache"].append(_run_asym(blocks, xs_q, xs_kv, setting, rq, rkv, 1, sd, variant)[0])
        e, pb = _run_uniform(blocks, xs_q, setting, ratio_b, sd)
        acc["baseline_err_b"].append(e)
        per_block["b"].append(pb)
        rqc, rkvc, costs["cost_c"] = allocate(9 - tq, 9 - tv, n, n_dst)
        e, pb = _run_asym(blocks, xs_q, xs_kv, setting, rqc, rkvc, setting.cache_steps, sd, variant)
        acc["err_c"].append(e)
        per_block["c"].append(pb)
        if setting.asym_check:
            perm = torch.randperm(len(setting.sigmas), generator=torch.Generator().manual_seed(sd + 3))
            sig_kv = [setting.sigmas[int(i)] for i in perm]
            blocks2, xq2, xkv2, tq2, tv2, _ = _world(setting, sd + 1, setting.sigmas, sig_kv)
            r2q, r2kv, costs["cost_a2_asym"] = allocate(tq2, tv2, n, n_dst)
            acc["err_a2_asym"].append(
                _run_asym(blocks2, xq2, xkv2, setting, r2q, r2kv, setting.cache_steps, sd)[0]
            )
            tsym = np.round((tq2 + tv2) / 2.0)
            r2s, _, costs["cost_a2_sym"] = allocate(tsym, tsym, n, n_dst)
            acc["err_a2_sym"].append(
                _run_asym(blocks2, xq2, xkv2, setting, r2s, r2s, setting.cache_steps, sd)[0]
            )
    metrics: dict[str, float] = {k: float(np.mean(v)) for k, v in acc.items() if v}
    metrics.update(costs)
    metrics["cost_b"] = cost_b
    metrics["ratio_b"] = ratio_b
    metrics["tokens"] = float(n)
    for b in range(len(setting.sigmas)):
        metrics[f"ratio_q_block{b}"] = float(rq[b].mean())
        metrics[f"ratio_kv_block{b}"] = float(rkv[b].mean())
        metrics[f"redundancy_q_block{b}"] = float(rec.stats["q"][b].mean())
    metrics["total_seconds"] = time.perf_counter() - t0
    figures = []
    if out_dir is not None:
        figures = [plot(out_dir, setting, metrics, {k: np.mean(v, axis=0) for k, v in per_block.items()})]
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        metrics=metrics,
        headline="err_a",
        baseline="baseline_err_b",
        figures=figures,
        seeds=seeds,
        notes=(
            f"Synthetic video: grid {setting.grid} (N={n}), C={setting.channels}, {len(setting.sigmas)} random "
            f"{setting.heads}-head attention blocks over fields smoothed with sigma={list(setting.sigmas)}, "
            f"{setting.steps} AR(1) steps (rho={setting.rho}), stride {setting.stride} (n_dst={n_dst}), "
            f"{setting.seeds} seed(s). Budget {BUDGET:g} of the full attention cost; uniform h ratio "
            f"{ratio_b:.3f}; AsymRnR ratios min({R_MAX}, alpha*tier/9) by bisection; cache {setting.cache_steps} "
            f"steps. Tiers: deciles of 1 - mean nearest-destination sq. distance / mean sq. norm (the official "
            f"statistic is not published). Variant: {variant}. Speed and VBench (the paper's headline) need a GPU "
            "and the video models."
        ),
    )


def plot(out_dir: str | Path, setting: Setting, metrics: dict[str, float], per_block: dict) -> Path:
    """Error per block for (a), (b), (c) and AsymRnR's q / kv ratios per block."""
    fig, (ax, ax2) = new_figure(1, 2, figsize=(11, 4))
    nb = len(setting.sigmas)
    x = np.arange(nb)
    for i, (key, label) in enumerate([("a", "AsymRnR"), ("b", "uniform symmetric"), ("c", "inverted tiers")]):
        ax.bar(x + (i - 1) * 0.27, per_block[key], 0.27, label=label)
    ax.set_xticks(x, [f"σ={s:g}" for s in setting.sigmas])
    ax.set_ylabel("relative output error")
    ax.set_title(f"P21 AsymRnR at {BUDGET:.0%} attention cost")
    ax.legend(fontsize=8)
    ax2.bar(x - 0.2, [metrics[f"ratio_q_block{b}"] for b in range(nb)], 0.4, label="ratio q")
    ax2.bar(x + 0.2, [metrics[f"ratio_kv_block{b}"] for b in range(nb)], 0.4, label="ratio kv")
    ax2.axhline(metrics["ratio_b"], color="k", lw=1, ls="--", label="uniform h ratio")
    ax2.set_xticks(x, [f"σ={s:g}" for s in setting.sigmas])
    ax2.set_title("reduction ratios from the calibrated tiers")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_dir, "p21_asymrnr")


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce the AsymRnR comparison at small scale (see the module docstring)."""
    seed_everything(seed)
    with torch_threads(1), torch.no_grad():
        return evaluate(QUICK if quick else FULL, seed, out_dir=out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
