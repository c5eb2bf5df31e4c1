"""SpargeAttn: Accurate Sparse Attention Accelerating Any Model Inference — ICML 2025, P01: the per-head hyper-parameter tuner.

Per-head hyper-parameter search of SpargeAttn (the official ``autotune.py``), vectorised over heads.

For every θ (``sim_threshold``) on a grid of ``2·granularity`` values in [-1, 1): bisect τ
(``cdf_threshold``) for the smallest value whose stage-1 error meets the budget (``l1``), then bisect λ
(``pv_threshold``) for the smallest value whose total error meets ``pv_l1``; record the stage-1 sparsity and
stop raising θ once a head's sparsity drops below 0.1. Candidates accumulate over calibration samples;
:meth:`SpargeTuner.result` bins them by θ (bins of width ``2/granularity``), picks the bin with the largest
summed sparsity and takes max θ, max τ, max λ in it (all three are the "safer" direction); a head whose
mean sparsity is ≤ 0.1 becomes dense (τ = θ = 1).

Differences from the official search (documented choices, not shortcuts): every head is bisected at the
same time with per-head thresholds (one call of the op per step instead of one per head); the value
returned by each bisection is its upper end, which was *measured* to meet the budget (the official code
returns the last midpoint, which may not); and after each sample the combined choice is re-measured, and a
head whose combination misses ``pv_l1`` is made dense, so the result never exceeds its budget on the
calibration data seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from icml25.kernels.checks import check_int
from icml25.kernels.sparse_attention import SpargeStats, sparge_attention
from icml25.kernels.sparse_attention.reference import dense_attention_reference

_RULES = ("l1", "cosine", "rmse")
_SPARSITY_FLOOR = 0.1  # below this a head is not worth a sparse kernel (official constant)


@dataclass
class SpargeHeadParams:
    """Tuned per-head SpargeAttn hyper-parameters (each a float32 ``[H]`` tensor)."""

    sim_threshold: torch.Tensor
    cdf_threshold: torch.Tensor
    pv_threshold: torch.Tensor
    sparsity: torch.Tensor

    def kwargs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for :func:`icml25.kernels.sparse_attention.sparge_attention`."""
        return {
            "sim_threshold": self.sim_threshold,
            "cdf_threshold": self.cdf_threshold,
            "pv_threshold": self.pv_threshold,
        }

    def to_dict(self) -> dict[str, list[float]]:
        """JSON-serialisable form (plain lists)."""
        return {name: getattr(self, name).tolist() for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpargeHeadParams:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, dict):
            raise TypeError(
                f"data must be a dict with keys {list(cls.__dataclass_fields__)}, got {type(data).__name__}"
            )
        missing = [name for name in cls.__dataclass_fields__ if name not in data]
        if missing:
            raise ValueError(f"data must have keys {list(cls.__dataclass_fields__)}, missing {missing}")
        values = {name: torch.as_tensor(data[name], dtype=torch.float32) for name in cls.__dataclass_fields__}
        sizes = {v.numel() for v in values.values()}
        if len(sizes) != 1 or any(v.dim() != 1 for v in values.values()):
            raise ValueError(f"every field of data must be a list of length H, got sizes {sorted(sizes)}")
        return cls(**values)


def head_error(o: torch.Tensor, o_ref: torch.Tensor, rule: str) -> torch.Tensor:
    """Per-head error of ``o`` vs ``o_ref`` (both ``[B, H, L, d]``) under ``rule``: ``[H]``.

    ``l1``: Σ|o−o*|/Σ|o*|; ``cosine``: cosine similarity of the flattened heads; ``rmse``: root mean square.
    """
    o, o_ref = o.float().transpose(0, 1).flatten(1), o_ref.float().transpose(0, 1).flatten(1)
    if rule == "l1":
        return (o - o_ref).abs().sum(1) / o_ref.abs().sum(1).clamp_min(1e-30)
    if rule == "cosine":
        return torch.nn.functional.cosine_similarity(o, o_ref, dim=1)
    return (o - o_ref).pow(2).mean(1).sqrt()


class SpargeTuner:
    """Search per-head θ, τ, λ of one attention layer against an error budget (state_dict-serialisable).

    Args:
        num_heads: query heads H of the layer.
        rule: ``"l1"`` (relative L1 < ``l1``), ``"cosine"`` (cosine > ``cos_sim``) or ``"rmse"`` (< ``rmse``)
            for the τ search; the λ search always uses relative L1 < ``pv_l1``.
        l1, pv_l1: budgets (official defaults 0.07 / 0.08; ``pv_l1 > l1`` is required).
        cos_sim, rmse: budgets of the other rules.
        granularity: θ grid ``{-1, -1 + 1/g, …, 1 - 1/g}`` and bins of width ``2/g``.
        tune_pv: also search λ (else λ = 20).
        tau_tol, pv_tol: bisection tolerances of τ (official 0.001) and λ (official 0.1); coarser ones tune
            faster at a small cost in sparsity.
        block_q, block_k, quantize_qk, smooth_k, backend: passed to the op.
        progress: show a tqdm bar over the θ grid in :meth:`observe`.

    Example:
        >>> tuner = SpargeTuner(num_heads=2, granularity=4, tau_tol=0.02, pv_tol=2.0, block_q=64, block_k=32)
        >>> q = k = v = torch.randn(1, 2, 256, 32)
        >>> tuner.observe(q, k, v)
        >>> params = tuner.result()  # SpargeHeadParams; params.kwargs() goes to sparge_attention
    """

    def __init__(
        self,
        num_heads: int,
        rule: str = "l1",
        l1: float = 0.07,
        pv_l1: float = 0.08,
        cos_sim: float = 0.98,
        rmse: float = 0.07,
        granularity: int = 16,
        *,
        tune_pv: bool = True,
        tau_tol: float = 1e-3,
        pv_tol: float = 0.1,
        block_q: int = 128,
        block_k: int = 64,
        quantize_qk: bool = True,
        smooth_k: bool = True,
        backend: str | None = None,
        progress: bool = False,
    ) -> None:
        check_int(num_heads, "num_heads", low=1)
        if rule not in _RULES:
            raise ValueError(f"rule must be one of {_RULES}, got {rule!r}")
        if not (0 < l1 < pv_l1):
            raise ValueError(f"budgets must satisfy 0 < l1 < pv_l1, got l1={l1}, pv_l1={pv_l1}")
        if not (-1 < cos_sim <= 1) or rmse <= 0:
            raise ValueError(
                f"cos_sim must lie in (-1, 1] and rmse be > 0, got cos_sim={cos_sim}, rmse={rmse}"
            )
        check_int(granularity, "granularity", low=1)
        if not (0 < tau_tol < 1) or not (0 < pv_tol < 50):
            raise ValueError(f"tau_tol must lie in (0, 1) and pv_tol in (0, 50), got {tau_tol}, {pv_tol}")
        self.num_heads, self.rule, self.l1, self.pv_l1 = num_heads, rule, l1, pv_l1
        self.cos_sim, self.rmse, self.granularity, self.tune_pv = cos_sim, rmse, granularity, tune_pv
        self.tau_tol, self.pv_tol, self.progress = tau_tol, pv_tol, progress
        self.op_kwargs = {
            "block_q": block_q, "block_k": block_k, "quantize_qk": quantize_qk, "smooth_k": smooth_k,
            "backend": backend,
        }  # fmt: skip
        # candidates[h] = list of (θ, τ, λ, sparsity) over all samples observed
        self.candidates: list[list[tuple[float, float, float, float]]] = [[] for _ in range(num_heads)]
        self.forced_dense = torch.zeros(num_heads, dtype=torch.bool)
        self.num_samples = 0

    # ------------------------------------------------------------------------------------------ search

    def _run(self, q, k, v, *, is_causal, scale, theta, tau, lam) -> tuple[torch.Tensor, SpargeStats]:
        return sparge_attention(
            q, k, v, is_causal=is_causal, scale=scale, cdf_threshold=tau, sim_threshold=theta,
            pv_threshold=lam, return_stats=True, **self.op_kwargs,
        )  # fmt: skip

    def _meets(self, o: torch.Tensor, o_ref: torch.Tensor, rule: str, budget: float) -> torch.Tensor:
        err = head_error(o, o_ref, rule)
        return err > budget if rule == "cosine" else err < budget

    def _bisect(
        self, evaluate, lo: float, hi: float, start: float, tol: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head bisection for the smallest value meeting the budget; returns (verified hi, its sparsity)."""
        H = self.num_heads
        lo_t, hi_t = torch.full((H,), lo), torch.full((H,), hi)
        cur = torch.full((H,), start)
        sparsity_hi = torch.zeros(H)  # sparsity measured at hi (overwritten when hi is first verified)
        verified = torch.zeros(H, dtype=torch.bool)
        while bool(((hi_t - lo_t) > tol).any()):
            open_ = (hi_t - lo_t) > tol
            ok, sparsity = evaluate(torch.where(open_, cur, hi_t))
            ok, sparsity = ok.cpu(), sparsity.cpu()
            good, bad = open_ & ok, open_ & ~ok
            hi_t = torch.where(good, cur, hi_t)
            sparsity_hi = torch.where(good, sparsity, sparsity_hi)
            verified |= good
            lo_t = torch.where(bad, cur, lo_t)
            cur = torch.where(good, (cur + lo_t) / 2, torch.where(bad, (cur + hi_t) / 2, cur))
        return hi_t, torch.where(verified, sparsity_hi, torch.zeros(H))

    @torch.no_grad()
    def observe(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> None:
        """Search θ/τ/λ on one calibration sample and accumulate the candidates.

        Args:
            q: ``[B, H, Lq, d]`` (HND), ``H == num_heads``.
            k, v: ``[B, Hkv, Lk, d]``.
            is_causal: causal attention.
            scale: softmax scale (default ``1/√d``).
        """
        if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[1] != self.num_heads:
            got = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
            raise ValueError(f"q must be a [B, H={self.num_heads}, L, d] tensor, got {got}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
                raise TypeError(f"{name} must be a floating-point torch.Tensor, got {got}")
            if t.dim() != 4 or t.numel() == 0:
                raise ValueError(
                    f"{name} must be a 4-D [B, H, L, d] tensor with no empty axis, got {tuple(t.shape)}"
                )
        if (
            k.shape != v.shape
            or k.shape[0] != q.shape[0]
            or k.shape[-1] != q.shape[-1]
            or q.shape[1] % k.shape[1]
        ):
            raise ValueError(
                f"k and v must both be [B={q.shape[0]}, Hkv, Lk, d={q.shape[-1]}] with H % Hkv == 0, got "
                f"{tuple(k.shape)} and {tuple(v.shape)}"
            )
        sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        o_ref = dense_attention_reference(q, k, v, is_causal=is_causal, scale=sc)
        H = self.num_heads
        active = ~self.forced_dense.clone()
        thetas = [i / self.granularity for i in range(-self.granularity, self.granularity)]
        for theta in tqdm(thetas, desc="SpargeTuner θ grid", leave=False, disable=not self.progress):
            if not bool(active.any()):
                break
            theta_t = torch.full((H,), theta)

            def eval_tau(tau: torch.Tensor, theta_t=theta_t):
                o, st = self._run(q, k, v, is_causal=is_causal, scale=sc, theta=theta_t, tau=tau, lam=None)
                budget = {"l1": self.l1, "cosine": self.cos_sim, "rmse": self.rmse}[self.rule]
                return self._meets(o, o_ref, self.rule, budget), st.head_sparsity

            tau, sparsity = self._bisect(eval_tau, 0.0, 1.0, 0.1, self.tau_tol)
            if self.tune_pv:

                def eval_lam(lam: torch.Tensor, theta_t=theta_t, tau=tau):
                    o, st = self._run(q, k, v, is_causal=is_causal, scale=sc, theta=theta_t, tau=tau, lam=lam)
                    return self._meets(o, o_ref, "l1", self.pv_l1), st.head_sparsity

                lam, _ = self._bisect(eval_lam, 0.0, 50.0, 20.0, self.pv_tol)
            else:
                lam = torch.full((H,), 20.0)
            for h in torch.nonzero(active).flatten().tolist():
                self.candidates[h].append((theta, float(tau[h]), float(lam[h]), float(sparsity[h])))
            active &= sparsity >= _SPARSITY_FLOOR  # raising θ only forces more blocks dense
        self.num_samples += 1
        # Re-measure the combined choice; a head that misses the final budget falls back to dense.
        params = self.result()
        o, _ = self._run(
            q, k, v, is_causal=is_causal, scale=sc, theta=params.sim_threshold, tau=params.cdf_threshold,
            lam=params.pv_threshold,
        )  # fmt: skip
        self.forced_dense |= ~self._meets(o, o_ref, "l1", self.pv_l1).cpu()

    def result(self) -> SpargeHeadParams:
        """The chosen per-head parameters (dense τ=θ=1, λ=50 for heads without a sparse choice)."""
        H = self.num_heads
        theta, tau, lam, sparsity = torch.ones(H), torch.ones(H), torch.full((H,), 50.0), torch.zeros(H)
        width = 2.0 / self.granularity
        for h, cands in enumerate(self.candidates):
            if not cands or bool(self.forced_dense[h]):
                continue
            bins: dict[int, list[tuple[float, float, float, float]]] = {}
            for c in cands:
                bins.setdefault(int((c[0] + 1.0 + 1e-9) // width), []).append(c)
            best = max(bins.values(), key=lambda group: sum(c[3] for c in group))
            mean_sparsity = sum(c[3] for c in best) / len(best)
            if mean_sparsity <= _SPARSITY_FLOOR:
                continue
            theta[h] = max(c[0] for c in best)
            tau[h] = max(c[1] for c in best)
            lam[h] = max(c[2] for c in best)
            sparsity[h] = mean_sparsity
        return SpargeHeadParams(sim_threshold=theta, cdf_threshold=tau, pv_threshold=lam, sparsity=sparsity)

    # ------------------------------------------------------------------------------------ serialisation

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue tuning or to read the result (JSON-serialisable)."""
        return {
            "num_heads": self.num_heads,
            "candidates": [[list(c) for c in cands] for cands in self.candidates],
            "forced_dense": self.forced_dense.tolist(),
            "num_samples": self.num_samples,
            "result": self.result().to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (the tuner's own budgets/settings are kept)."""
        if not isinstance(state, dict) or state.get("num_heads") != self.num_heads:
            got = state.get("num_heads") if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"state must be a SpargeTuner.state_dict() with num_heads={self.num_heads}, got {got}"
            )
        self.candidates = [[tuple(float(x) for x in c) for c in cands] for cands in state["candidates"]]
        self.forced_dense = torch.tensor(state["forced_dense"], dtype=torch.bool)
        self.num_samples = int(state["num_samples"])
