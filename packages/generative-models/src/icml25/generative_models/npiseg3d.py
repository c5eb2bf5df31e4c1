"""NPISeg3D: Probabilistic Interactive 3D Segmentation with Hierarchical Neural Processes — ICML 2025, P17: the hierarchical neural-process head, an interactive point-cloud segmenter and its evaluation tools.

Liu et al., ICML 2025 (arXiv 2505.01726; official code ``jliu4ai/NPISeg3D``, built on AGILE3D,
``ywyue/AGILE3D``). User clicks are the context set of a neural process and the scene's points its targets:

* :class:`HierarchicalNPHead`: click queries ``q = MLP(LN(query))`` are averaged per object into prototypes
  ``h_o`` (label 0 = background); a scene latent ``z_s ~ N(μ_s, σ_s)`` comes from a transformer block over
  ``[mean(h); h_0; h_1 … h_O]``; object latents ``z_o^{(s)} ~ N(μ_o, σ_o)`` (S samples) from
  ``u_o = w·(z_s ⊙ h_o) + (1 − w)·h_o``; FiLM ``[γ, β] = MLP(z_o)`` modulates every click query of object o and
  the logits are ``ℓ_{p,o}^{(s)} = max_{c ∈ C_o} ⟨f_p, γ ⊙ q_c + β⟩``. With target clicks (training) the
  head also returns ``KL(q_ctx ‖ q_tgt)`` summed over dimensions, objects, background and scene.
* :class:`ClickAttentionHead`: the deterministic AGILE3D mask head (max over click dot products), the baseline.
* :func:`predictive_uncertainty`: the variance over samples of the max softmax probability (official
  ``compute_uncertainty``), or entropy / mutual information.
* :class:`InteractiveSegmenter`: a small pure-torch kNN EdgeConv point backbone, AGILE3D-style click↔scene
  attention rounds and one of the two heads; ``fit`` on scenes with simulated clicks, ``predict`` on numpy
  ``(P, 3)`` points and clicks → labels and per-point uncertainty.
* :func:`simulate_clicks` (the next click at the most interior point of the largest error region, optionally
  weighted by uncertainty), :func:`object_ious`, :func:`noc_at`, :func:`uncertainty_auroc`,
  :func:`expected_calibration_error` (scikit-learn) and :func:`make_scene` (procedural primitive scenes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from sklearn.calibration import calibration_curve
from sklearn.metrics import roc_auc_score
from torch import nn

from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "Click",
    "ClickAttentionHead",
    "HierarchicalNPHead",
    "InteractiveSegmenter",
    "NPOut",
    "expected_calibration_error",
    "make_scene",
    "noc_at",
    "object_ious",
    "predictive_uncertainty",
    "simulate_clicks",
    "uncertainty_auroc",
]

TRAIN_KINDS = ("sphere", "box", "cylinder")
OOD_KINDS = ("torus", "cone")
_KINDS = ("sphere", "box", "cylinder", "torus", "cone")


# ------------------------------------------------------------------------------------------ validation
def _finite_tensor(x: object, name: str, ndim: int | None = None) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(x.shape)}")
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        n_nan = int(torch.isnan(x).sum())
        raise ValueError(
            f"{name} must be finite; got {n_nan} NaN and {int(bad.sum()) - n_nan} Inf values in a tensor of "
            f"shape {tuple(x.shape)}"
        )
    big = float(x.detach().abs().max())
    if big > 1e15:
        raise ValueError(f"{name} must have magnitude <= 1e15, got max |x| = {big:.3g}")
    return x


def _index_tensor(x: object, name: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, (list, tuple)):
        x = torch.as_tensor(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be an integer tensor or array, got {type(x).__name__}")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {x.dtype}")
    if x.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
    return x.long()


def _check_click_objects(click_obj: torch.Tensor, name: str, allow_no_background: bool) -> int:
    """Number of objects O; labels must be 0..O with every object (and, unless allowed, background) clicked."""
    if click_obj.numel() == 0:
        raise ValueError(f"{name} must contain at least one click, got an empty tensor")
    if int(click_obj.min()) < 0:
        raise ValueError(f"{name} must hold labels >= 0 (0 = background), got {int(click_obj.min())}")
    n_obj = int(click_obj.max())
    counts = torch.bincount(click_obj, minlength=n_obj + 1)
    missing = [o for o in range(1, n_obj + 1) if int(counts[o]) == 0]
    if missing:
        raise ValueError(
            f"{name}: every object 1..{n_obj} needs at least one click; objects {missing} have zero clicks"
        )
    if int(counts[0]) == 0 and not allow_no_background:
        raise ValueError(
            f"{name} has no background click (label 0); give one or construct the head with "
            "allow_no_background=True (a learned background prototype)"
        )
    return n_obj


# -------------------------------------------------------------------------------------------- outputs
@dataclass
class NPOut:
    """Output of a mask head.

    ``logits [P, O+1, S]`` (S = 1 for the deterministic head); ``kl`` the summed KL(context ‖ target) or None
    without targets; ``target_logits [P, O+1, S]`` masks of the target clicks modulated by target-latent samples (training
    only, as the official ``NPModulationHead``);
    ``sigma_mean`` the mean object-latent σ (0 for the deterministic head)."""

    logits: torch.Tensor
    kl: torch.Tensor | None = None
    target_logits: torch.Tensor | None = None
    sigma_mean: float = 0.0

    @property
    def labels(self) -> torch.Tensor:
        """``[P]`` argmax of the sample-mean logits."""
        return self.logits.mean(-1).argmax(-1)


@dataclass(frozen=True)
class Click:
    """One user click: the clicked point's index and the object label it marks (0 = background)."""

    index: int
    label: int


def _mlp(d_in: int, d_out: int, hidden: int | None = None) -> nn.Sequential:
    hidden = hidden or d_in
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


def _max_over_clicks(point_feats: torch.Tensor, queries: torch.Tensor, click_obj: torch.Tensor, n_cls: int):
    """``max_{c ∈ C_o} ⟨f_p, q_c^{(s)}⟩ / √D``: point_feats ``[P, D]``, queries ``[C, S, D]`` → ``[P, n_cls, S]``."""
    dots = torch.einsum("pd,csd->pcs", point_feats, queries) / math.sqrt(point_feats.shape[1])  # [P, C, S]
    member = click_obj[None, :] == torch.arange(n_cls, device=click_obj.device)[:, None]  # [n_cls, C]
    masked = dots[:, None].masked_fill(~member[None, :, :, None], float("-inf"))  # [P, n_cls, C, S]
    return masked.amax(2)


def _prototypes(q: torch.Tensor, click_obj: torch.Tensor, n_cls: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean click query per label: ``q [C, D]`` → ``[n_cls, D]`` and a presence mask ``[n_cls]``."""
    sums = q.new_zeros(n_cls, q.shape[1]).index_add(0, click_obj, q)
    counts = torch.bincount(click_obj, minlength=n_cls).to(q.dtype)
    return sums / counts.clamp_min(1).unsqueeze(1), counts > 0


class ClickAttentionHead(nn.Module):
    """The deterministic AGILE3D mask head (the baseline): ``q = MLP(LN(query))`` and
    ``ℓ_{p,o} = max_{c ∈ C_o} ⟨f_p, q_c⟩``; returns logits ``[P, O+1, 1]``."""

    def __init__(self, dim: int = 128, allow_no_background: bool = False) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        self.dim, self.allow_no_background = dim, bool(allow_no_background)
        self.query_mlp = nn.Sequential(nn.LayerNorm(dim), _mlp(dim, dim))
        self.bg_query = nn.Parameter(torch.zeros(dim))

    def _inputs(self, point_feats, click_feats, click_obj):
        point_feats = _finite_tensor(point_feats, "point_feats", 2)
        click_feats = _finite_tensor(click_feats, "click_feats", 2)
        click_obj = _index_tensor(click_obj, "click_obj")
        for name, t in (("point_feats", point_feats), ("click_feats", click_feats)):
            if t.shape[1] != self.dim:
                raise ValueError(f"{name} must have {self.dim} features (dim), got shape {tuple(t.shape)}")
        if click_obj.shape[0] != click_feats.shape[0]:
            raise ValueError(
                f"click_obj must have one label per click ({click_feats.shape[0]}), got {click_obj.shape[0]}"
            )
        n_obj = _check_click_objects(click_obj, "click_obj", self.allow_no_background)
        return point_feats, click_feats, click_obj, n_obj

    def _query(self, feats: torch.Tensor) -> torch.Tensor:
        """``q = f + MLP(LN(f))`` (a residual around the official ``MLP(LN(query))``: keeps the positional part
        of the query, so ⟨f_p, q_c⟩ starts as a distance kernel)."""
        return feats + self.query_mlp(feats)

    def _with_background(self, q: torch.Tensor, click_obj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if bool((click_obj == 0).any()):
            return q, click_obj
        return torch.cat([q, self.bg_query[None]]), torch.cat([click_obj, click_obj.new_zeros(1)])

    def forward(self, point_feats: torch.Tensor, click_feats: torch.Tensor, click_obj: torch.Tensor, *args,
                **kwargs) -> NPOut:  # fmt: skip
        """point_feats ``[P, D]``, click_feats ``[C, D]``, click_obj ``[C]`` (0 = background, 1..O) → NPOut."""
        point_feats, click_feats, click_obj, n_obj = self._inputs(point_feats, click_feats, click_obj)
        q, obj = self._with_background(self._query(click_feats), click_obj)
        return NPOut(_max_over_clicks(point_feats, q[:, None], obj, n_obj + 1))


class _SceneEncoder(nn.Module):
    """``[mean; h_0..h_O]`` → LN → ``layers`` residual transformer blocks → LN(first token) → μ_s, σ_s."""

    def __init__(self, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.ln_in = nn.LayerNorm(dim)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.ln_out = nn.LayerNorm(dim)
        self.mu, self.sigma = _mlp(dim, dim), _mlp(dim, dim)

    def forward(self, protos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.ln_in(torch.cat([protos.mean(0, keepdim=True), protos])[None])
        for blk in self.blocks:
            tokens = blk(tokens)
        t = self.ln_out(tokens[0, 0])
        return self.mu(t), F.softplus(self.sigma(t))


class HierarchicalNPHead(ClickAttentionHead):
    """The NPISeg3D hierarchical neural-process mask head.

    ``dim`` feature width; ``n_samples`` S object-latent samples (paper 10); ``scene_weight`` w of the scene
    latent in ``u_o = w·(z_s ⊙ h_o) + (1−w)·h_o`` (paper 0.2); ``scene_layers``/``heads`` of the scene
    transformer (paper 1 / 8); ``collapse_sigma=True`` forces every σ to 0 (deterministic FiLM from μ: the
    ablation / broken variant); ``allow_no_background`` uses a learned background query when no background
    click is given (the official code requires one).
    """

    def __init__(self, dim: int = 128, n_samples: int = 10, scene_weight: float = 0.2, scene_layers: int = 1,
                 heads: int = 8, collapse_sigma: bool = False, allow_no_background: bool = False) -> None:  # fmt: skip
        if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
            raise ValueError(f"n_samples must be an int >= 1, got {n_samples!r}")
        if not isinstance(scene_weight, (int, float)) or not 0.0 <= float(scene_weight) <= 1.0:
            raise ValueError(f"scene_weight must be in [0, 1], got {scene_weight!r}")
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or dim % heads:
            raise ValueError(f"heads must be a positive int dividing dim={dim}, got {heads!r}")
        if isinstance(scene_layers, bool) or not isinstance(scene_layers, int) or scene_layers < 1:
            raise ValueError(f"scene_layers must be an int >= 1, got {scene_layers!r}")
        super().__init__(dim, allow_no_background)
        self.n_samples, self.scene_weight = n_samples, float(scene_weight)
        self.collapse_sigma = bool(collapse_sigma)
        self.scene = _SceneEncoder(dim, heads, scene_layers)
        self.obj_mu, self.obj_sigma = _mlp(dim, dim), _mlp(dim, dim)
        self.film = _mlp(dim, 2 * dim)

    def latents(self, q: torch.Tensor, click_obj: torch.Tensor, n_cls: int, gen: torch.Generator | None):
        """Scene and object posteriors from click queries ``q [C, D]``: returns ``(μ_s, σ_s), (μ_o, σ_o)``
        with object tensors ``[n_cls, D]`` (the scene sample is drawn inside, one per call)."""
        protos, _ = _prototypes(q, click_obj, n_cls)
        mu_s, sig_s = self.scene(protos)
        if self.collapse_sigma:
            sig_s = torch.zeros_like(sig_s)
        z_s = mu_s + sig_s * torch.randn(mu_s.shape, generator=gen, dtype=mu_s.dtype)
        u = self.scene_weight * (z_s * protos) + (1.0 - self.scene_weight) * protos
        mu_o, sig_o = self.obj_mu(u), F.softplus(self.obj_sigma(u))
        if self.collapse_sigma:
            sig_o = torch.zeros_like(sig_o)
        return (mu_s, sig_s), (mu_o, sig_o)

    def _modulated_logits(self, point_feats, q, click_obj, mu_o, sig_o, gen):
        eps = torch.randn((self.n_samples, *mu_o.shape), generator=gen, dtype=mu_o.dtype)
        z = mu_o[None] + sig_o[None] * eps  # [S, n_cls, D]
        gamma, beta = self.film(z).chunk(2, dim=-1)
        qs = gamma[:, click_obj].transpose(0, 1) * q[:, None] + beta[:, click_obj].transpose(
            0, 1
        )  # [C, S, D]
        return _max_over_clicks(point_feats, qs, click_obj, mu_o.shape[0])

    def forward(self, point_feats: torch.Tensor, click_feats: torch.Tensor, click_obj: torch.Tensor,
                target_feats: torch.Tensor | None = None, target_obj: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> NPOut:  # fmt: skip
        """point_feats ``[P, D]``, click_feats ``[C, D]``, click_obj ``[C]`` (0 = background, 1..O); optional
        target (ground-truth) clicks ``target_feats [T, D]``, ``target_obj [T]`` covering the same labels.
        Returns NPOut with logits ``[P, O+1, S]``, and ``kl``/``target_logits`` only when targets are given."""
        point_feats, click_feats, click_obj, n_obj = self._inputs(point_feats, click_feats, click_obj)
        if (target_feats is None) != (target_obj is None):
            raise ValueError("target_feats and target_obj must be given together (or both None)")
        n_cls = n_obj + 1
        q, obj = self._with_background(self._query(click_feats), click_obj)
        (mu_s, sig_s), (mu_o, sig_o) = self.latents(q, obj, n_cls, generator)
        logits = self._modulated_logits(point_feats, q, obj, mu_o, sig_o, generator)
        out = NPOut(logits, sigma_mean=float(sig_o.detach().mean()))
        if target_feats is None:
            return out
        target_feats = _finite_tensor(target_feats, "target_feats", 2)
        target_obj = _index_tensor(target_obj, "target_obj")
        if target_feats.shape[1] != self.dim or target_obj.shape[0] != target_feats.shape[0]:
            raise ValueError(
                f"target_feats must be [T, {self.dim}] with one target_obj label per row; got "
                f"{tuple(target_feats.shape)} and {tuple(target_obj.shape)}"
            )
        if _check_click_objects(target_obj, "target_obj", self.allow_no_background) != n_obj:
            raise ValueError(f"target_obj must cover the same objects 0..{n_obj} as click_obj")
        qt, tobj = self._with_background(self._query(target_feats), target_obj)
        (mu_st, sig_st), (mu_ot, sig_ot) = self.latents(qt, tobj, n_cls, generator)
        out.kl = gaussian_kl(mu_o, sig_o, mu_ot, sig_ot) + gaussian_kl(mu_s, sig_s, mu_st, sig_st)
        out.target_logits = self._modulated_logits(point_feats, qt, tobj, mu_ot, sig_ot, generator)
        return out


def gaussian_kl(
    mu_q: torch.Tensor, sig_q: torch.Tensor, mu_p: torch.Tensor, sig_p: torch.Tensor
) -> torch.Tensor:
    """``Σ KL(N(μ_q, σ_q²) ‖ N(μ_p, σ_p²))`` over all entries (σ floored at 1e-6)."""
    sig_q, sig_p = sig_q.clamp_min(1e-6), sig_p.clamp_min(1e-6)
    return (torch.log(sig_p / sig_q) + (sig_q**2 + (mu_q - mu_p) ** 2) / (2 * sig_p**2) - 0.5).sum()


# -------------------------------------------------------------------------------------------- uncertainty
def predictive_uncertainty(
    logits: torch.Tensor, kind: Literal["maxprob_var", "entropy", "mutual_info"] = "maxprob_var"
) -> torch.Tensor:
    """Per-point uncertainty from sample logits ``[P, K, S]`` → ``[P]``.

    ``maxprob_var``: variance over the S samples of each sample's max softmax probability (the official
    ``compute_uncertainty``; in [0, 0.25]); ``entropy``: entropy of the sample-mean probabilities;
    ``mutual_info``: that entropy minus the mean per-sample entropy (≥ 0). All are 0 for identical samples."""
    logits = _finite_tensor(logits, "logits", 3)
    if kind not in ("maxprob_var", "entropy", "mutual_info"):
        raise ValueError(f"kind must be 'maxprob_var', 'entropy' or 'mutual_info', got {kind!r}")
    probs = logits.double().softmax(1)
    if kind == "maxprob_var":
        return probs.max(1).values.var(-1, unbiased=False).to(logits.dtype)

    def ent(p: torch.Tensor) -> torch.Tensor:
        return -(p * p.clamp_min(1e-300).log()).sum(1)

    mean_ent = ent(probs.mean(-1))
    if kind == "entropy":
        return mean_ent.to(logits.dtype)
    return (mean_ent - ent(probs).mean(-1)).clamp_min(0).to(logits.dtype)


# ------------------------------------------------------------------------------------------------- scenes
def _surface(kind: str, n: int, size: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` points on a primitive of footprint radius ≈ ``size`` resting on z = 0, centred at the origin."""
    if kind == "sphere":
        v = rng.normal(size=(n, 3))
        return v / np.linalg.norm(v, axis=1, keepdims=True) * size + [0, 0, size]
    if kind == "box":
        ext = size * rng.uniform(0.55, 0.7, 3) * [1, 1, 1.3]
        areas = np.array([ext[1] * ext[2], ext[0] * ext[2], ext[0] * ext[1]])
        face = rng.choice(6, size=n, p=np.repeat(areas, 2) / (2 * areas.sum()))
        p = rng.uniform(-1, 1, size=(n, 3))
        ax, sign = face // 2, np.where(face % 2 == 0, 1.0, -1.0)
        p[np.arange(n), ax] = sign
        p = p * ext + [0, 0, ext[2]]
    elif kind == "cylinder":
        r, h = size * 0.85, size * rng.uniform(1.2, 2.0)
        side = 2 * np.pi * r * h
        cap = np.pi * r * r
        part = rng.choice(3, size=n, p=np.array([side, cap, cap]) / (side + 2 * cap))
        th = rng.uniform(0, 2 * np.pi, n)
        rad = np.where(part == 0, r, r * np.sqrt(rng.uniform(0, 1, n)))
        z = np.where(part == 0, rng.uniform(0, h, n), np.where(part == 1, h, 0.0))
        p = np.stack([rad * np.cos(th), rad * np.sin(th), z], 1)
    elif kind == "torus":
        R, r = size * 0.7, size * 0.3
        u, v = rng.uniform(0, 2 * np.pi, n), rng.uniform(0, 2 * np.pi, n)
        keep = rng.uniform(0, 1, n) < (R + r * np.cos(v)) / (R + r)  # area-uniform by rejection
        u, v = u[keep], v[keep]
        while u.size < n:
            u2, v2 = rng.uniform(0, 2 * np.pi, n), rng.uniform(0, 2 * np.pi, n)
            k2 = rng.uniform(0, 1, n) < (R + r * np.cos(v2)) / (R + r)
            u, v = np.concatenate([u, u2[k2]]), np.concatenate([v, v2[k2]])
        u, v = u[:n], v[:n]
        p = np.stack([(R + r * np.cos(v)) * np.cos(u), (R + r * np.cos(v)) * np.sin(u), r * np.sin(v) + r], 1)
    elif kind == "cone":
        r, h = size * 0.9, size * rng.uniform(1.4, 2.2)
        slant = np.pi * r * math.hypot(r, h)
        cap = np.pi * r * r
        on_side = rng.uniform(0, 1, n) < slant / (slant + cap)
        th = rng.uniform(0, 2 * np.pi, n)
        t = np.sqrt(rng.uniform(0, 1, n))
        rad = np.where(on_side, r * t, r * np.sqrt(rng.uniform(0, 1, n)))
        z = np.where(on_side, h * (1 - t), 0.0)
        p = np.stack([rad * np.cos(th), rad * np.sin(th), z], 1)
    else:
        raise ValueError(f"kinds must be among {_KINDS}, got {kind!r}")
    if kind in ("box",):
        a = rng.uniform(0, 2 * np.pi)
        rot = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
        p = p @ rot.T
    return p


def make_scene(
    n_points: int = 2048,
    n_objects: tuple[int, int] = (3, 6),
    kinds: tuple[str, ...] = TRAIN_KINDS,
    noise: float = 0.01,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """A procedural scene: a ground plane (label 0) and ``n_objects`` (inclusive range) primitives of the
    given ``kinds`` with random sizes and poses, touching or nearly touching (gaps in [0, 0.05]).

    Returns ``points [n_points, 3]`` (float32, Gaussian noise σ = ``noise``) and ``labels [n_points]``
    (int64, 0 = ground, objects 1..O). Points are split area-proportionally, ~30% on the ground."""
    if isinstance(n_points, bool) or not isinstance(n_points, (int, np.integer)) or n_points < 64:
        raise ValueError(f"n_points must be an int >= 64, got {n_points!r}")
    lo, hi = n_objects
    if not (1 <= int(lo) <= int(hi) <= 12):
        raise ValueError(f"n_objects must be (lo, hi) with 1 <= lo <= hi <= 12, got {n_objects!r}")
    if not kinds or any(k not in _KINDS for k in kinds):
        raise ValueError(f"kinds must be a non-empty tuple from {_KINDS}, got {kinds!r}")
    if not (isinstance(noise, (int, float)) and 0.0 <= float(noise) <= 0.2):
        raise ValueError(f"noise must be in [0, 0.2], got {noise!r}")
    rng = np.random.default_rng(seed)
    n_obj = int(rng.integers(int(lo), int(hi) + 1))
    sizes = rng.uniform(0.15, 0.3, n_obj)
    centres = np.zeros((n_obj, 2))
    for i in range(1, n_obj):
        for _ in range(200):
            j = int(rng.integers(i))
            a = rng.uniform(0, 2 * np.pi)
            c = centres[j] + (sizes[i] + sizes[j] + rng.uniform(0.0, 0.05)) * np.array([np.cos(a), np.sin(a)])
            d = np.linalg.norm(centres[:i] - c, axis=1) - sizes[:i] - sizes[i]
            if d.min() >= -1e-9:
                break
        centres[i] = c
    n_ground = int(0.3 * n_points)
    weights = sizes**2
    counts = np.floor(weights / weights.sum() * (n_points - n_ground)).astype(int)
    counts[: (n_points - n_ground - counts.sum())] += 1
    pts, labels = [], []
    for i in range(n_obj):
        kind = kinds[int(rng.integers(len(kinds)))]
        p = _surface(kind, int(counts[i]), float(sizes[i]), rng)
        pts.append(p + np.array([centres[i, 0], centres[i, 1], 0.0]))
        labels.append(np.full(int(counts[i]), i + 1))
    lo_xy = (centres - sizes[:, None]).min(0) - 0.25
    hi_xy = (centres + sizes[:, None]).max(0) + 0.25
    g = np.concatenate([rng.uniform(lo_xy, hi_xy, size=(n_ground, 2)), np.zeros((n_ground, 1))], 1)
    pts.insert(0, g)
    labels.insert(0, np.zeros(n_ground, dtype=int))
    points = np.concatenate(pts) + rng.normal(scale=float(noise), size=(n_points, 3))
    points[:, :2] -= points[:, :2].mean(0)
    perm = rng.permutation(n_points)
    return points[perm].astype(np.float32), np.concatenate(labels)[perm].astype(np.int64)


# ------------------------------------------------------------------------------------------- geometry
def _points_array(points: object, name: str = "points", min_points: int = 1) -> np.ndarray:
    if isinstance(points, torch.Tensor):
        points = points.detach().cpu().numpy()
    if not isinstance(points, np.ndarray):
        raise TypeError(f"{name} must be a numpy array of shape (P, 3), got {type(points).__name__}")
    if points.dtype.kind != "f":
        raise TypeError(f"{name} must be a floating-point array, got dtype {points.dtype}")
    if points.ndim != 2 or points.shape[1] != 3:
        raise ValueError(f"{name} must have shape (P, 3), got {points.shape}")
    if points.shape[0] < min_points:
        raise ValueError(
            f"{name} must have at least {min_points} points (k of the kNN graph), got {points.shape[0]}"
        )
    if not np.isfinite(points).all():
        raise ValueError(f"{name} must be finite; got {int(np.isnan(points).sum())} NaN and "
                         f"{int(np.isinf(points).sum())} Inf values in an array of shape {points.shape}")  # fmt: skip
    if np.abs(points).max() > 1e6:
        raise ValueError(f"{name} must have coordinates of magnitude <= 1e6, got {np.abs(points).max():.3g}")
    if points.shape[0] > 1 and float(np.ptp(points, axis=0).max()) == 0.0:
        raise ValueError(f"{name} must not be a single repeated point (all coordinates equal)")
    return points


def _labels_array(labels: object, name: str, n: int) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    if not isinstance(labels, np.ndarray):
        raise TypeError(f"{name} must be a numpy integer array of shape ({n},), got {type(labels).__name__}")
    if labels.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {labels.dtype}")
    if labels.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {labels.shape}")
    if n and labels.min() < 0:
        raise ValueError(f"{name} must hold labels >= 0, got {labels.min()}")
    return labels.astype(np.int64)


def _knn(points: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``[P, k]`` of each point's k nearest neighbours (itself excluded)."""
    d = torch.cdist(points, points)
    d.fill_diagonal_(float("inf"))
    return d.topk(k, largest=False).indices


def _interior_point(points: np.ndarray, region: np.ndarray, weight: np.ndarray | None = None) -> int:
    """Index of the region point farthest from every point outside the region (optionally × weight)."""
    idx = np.flatnonzero(region)
    outside = points[~region]
    if outside.shape[0] == 0:
        dist = np.ones(idx.size)
    else:
        dist = torch.cdist(torch.from_numpy(points[idx]), torch.from_numpy(outside))
        dist = dist.min(1).values.numpy()
    if weight is not None and float(weight[idx].max()) > 0:
        dist = dist * weight[idx]
    return int(idx[int(np.argmax(dist))])


def _largest_component(region: np.ndarray, neighbors: np.ndarray) -> np.ndarray:
    n = region.size
    rows = np.repeat(np.arange(n), neighbors.shape[1])
    cols = neighbors.reshape(-1)
    keep = region[rows] & region[cols]
    adj = coo_matrix((np.ones(int(keep.sum())), (rows[keep], cols[keep])), shape=(n, n))
    _, comp = connected_components(adj, directed=False)
    sizes = np.bincount(comp[region], minlength=comp.max() + 1)
    return region & (comp == int(np.argmax(sizes)))


def simulate_clicks(
    points: np.ndarray,
    gt_labels: np.ndarray,
    pred_labels: np.ndarray | None = None,
    uncertainty: np.ndarray | None = None,
    strategy: Literal["center_of_largest_error", "uncertainty_weighted"] = "center_of_largest_error",
    k: int = 16,
) -> list[Click]:
    """The next simulated clicks, one per label (background 0 and every object) that still has errors.

    Without ``pred_labels`` (first round) each label's click is the most interior point of its ground-truth
    region; otherwise the most interior point of the largest connected (kNN, ``k``) error region
    ``gt == o ∧ pred ≠ o``. ``strategy="uncertainty_weighted"`` multiplies the interior distance by the
    min-max-normalised ``uncertainty`` (official ``seg_new.py``). ``points [P, 3]``, labels ``[P]``."""
    points = _points_array(points, "points", min_points=k + 1)
    n = points.shape[0]
    gt = _labels_array(gt_labels, "gt_labels", n)
    pred = None if pred_labels is None else _labels_array(pred_labels, "pred_labels", n)
    if strategy not in ("center_of_largest_error", "uncertainty_weighted"):
        raise ValueError(
            f"strategy must be 'center_of_largest_error' or 'uncertainty_weighted', got {strategy!r}"
        )
    weight = None
    if strategy == "uncertainty_weighted":
        if uncertainty is None:
            raise ValueError("uncertainty is required for strategy='uncertainty_weighted'")
        u = np.asarray(uncertainty, dtype=np.float64)
        if u.shape != (n,) or not np.isfinite(u).all():
            raise ValueError(f"uncertainty must be a finite array of shape ({n},), got shape {u.shape}")
        span = u.max() - u.min()
        weight = (u - u.min()) / span if span > 0 else np.ones(n)
    return _simulate(points, gt, pred, weight, _knn(torch.from_numpy(points), k).numpy())


def _simulate(points, gt, pred, weight, neighbors) -> list[Click]:
    clicks = []
    for o in np.unique(gt):
        region = gt == o if pred is None else (gt == o) & (pred != o)
        if not region.any():
            continue
        comp = _largest_component(region, neighbors)
        clicks.append(Click(_interior_point(points, comp, weight), int(o)))
    return clicks


# -------------------------------------------------------------------------------------------- metrics
def object_ious(pred_labels: np.ndarray, gt_labels: np.ndarray) -> np.ndarray:
    """IoU of every object ``1..O`` of ``gt_labels`` (background 0 excluded) → ``[O]``."""
    n = (
        int(gt_labels.shape[0])
        if isinstance(gt_labels, (np.ndarray, torch.Tensor)) and gt_labels.ndim
        else -1
    )
    gt = _labels_array(gt_labels, "gt_labels", n)
    if gt.size == 0:
        raise ValueError("gt_labels must be non-empty, got shape (0,)")
    pred = _labels_array(pred_labels, "pred_labels", gt.shape[0])
    n_obj = int(gt.max())
    if n_obj < 1:
        raise ValueError("gt_labels must contain at least one object (a label >= 1)")
    missing = sorted(set(range(1, n_obj + 1)) - set(np.unique(gt).tolist()))
    if missing:
        raise ValueError(f"gt_labels must use every object label 1..{n_obj}; missing {missing}")
    out = np.empty(n_obj)
    for o in range(1, n_obj + 1):
        a, b = gt == o, pred == o
        union = (a | b).sum()
        out[o - 1] = (a & b).sum() / union if union else 1.0
    return out


def noc_at(iou_curve: np.ndarray, threshold: float = 0.8, max_clicks: int | None = None) -> float:
    """Mean number of clicks per object to reach ``threshold`` IoU: ``iou_curve [N, K]`` holds the IoU after
    1..K clicks; a curve that never reaches it counts ``max_clicks`` (default K)."""
    curve = iou_curve.detach().cpu().numpy() if isinstance(iou_curve, torch.Tensor) else np.asarray(iou_curve)
    if curve.dtype.kind != "f":
        raise TypeError(f"iou_curve must be a floating-point array, got dtype {curve.dtype}")
    if curve.ndim != 2 or curve.size == 0:
        raise ValueError(f"iou_curve must be a non-empty (N, K) array, got shape {curve.shape}")
    if not np.isfinite(curve).all() or curve.min() < 0 or curve.max() > 1:
        raise ValueError("iou_curve must hold finite IoUs in [0, 1]")
    if not (isinstance(threshold, (int, float)) and 0.0 < float(threshold) <= 1.0):
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    cap = curve.shape[1] if max_clicks is None else int(max_clicks)
    hit = curve >= threshold
    first = np.where(hit.any(1), hit.argmax(1) + 1, cap)
    return float(first.mean())


def uncertainty_auroc(uncertainty: np.ndarray, errors: np.ndarray) -> float:
    """ROC AUC of ``uncertainty [N]`` for detecting misclassified points ``errors [N]`` (bool), via
    :func:`sklearn.metrics.roc_auc_score`; 0.5 = uninformative."""
    u = np.asarray(uncertainty.detach().cpu() if isinstance(uncertainty, torch.Tensor) else uncertainty)
    e = np.asarray(errors.detach().cpu() if isinstance(errors, torch.Tensor) else errors)
    if u.ndim != 1 or e.shape != u.shape or u.size == 0:
        raise ValueError(
            f"uncertainty and errors must be 1-D of equal non-zero length, got {u.shape}, {e.shape}"
        )
    if u.dtype.kind not in "fiu" or not np.isfinite(u).all():
        raise ValueError("uncertainty must be a finite numeric array")
    if e.dtype != bool:
        raise TypeError(f"errors must be a boolean array, got dtype {e.dtype}")
    if e.all() or not e.any():
        raise ValueError("errors must contain both correct (False) and wrong (True) points")
    return float(roc_auc_score(e, u))


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 10) -> float:
    """ECE: Σ_b (n_b/N)·|acc_b − conf_b| over ``n_bins`` uniform bins, bin means from
    :func:`sklearn.calibration.calibration_curve`. ``confidence [N]`` in [0, 1], ``correct [N]`` bool."""
    c = np.asarray(confidence)
    y = np.asarray(correct)
    if c.dtype.kind != "f":
        raise TypeError(f"confidence must be a floating-point array, got dtype {c.dtype}")
    if c.ndim != 1 or y.shape != c.shape or c.size == 0:
        raise ValueError(
            f"confidence and correct must be 1-D of equal non-zero length, got {c.shape}, {y.shape}"
        )
    if not np.isfinite(c).all() or c.min() < 0 or c.max() > 1:
        raise ValueError("confidence must hold finite probabilities in [0, 1]")
    if y.dtype != bool:
        raise TypeError(f"correct must be a boolean array, got dtype {y.dtype}")
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be an int >= 1, got {n_bins!r}")
    if y.all() or not y.any():
        return float(abs(y.mean() - c.mean()))
    acc, conf = calibration_curve(y, c, n_bins=n_bins, strategy="uniform")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    counts = np.bincount(
        np.clip(np.searchsorted(edges[1:-1], c, side="right"), 0, n_bins - 1), minlength=n_bins
    )
    counts = counts[counts > 0]
    return float((counts / c.size * np.abs(acc - conf)).sum())


# ------------------------------------------------------------------------------------------- segmenter
class _EdgeConv(nn.Module):
    """DGCNN EdgeConv ``h_i' = h_i + W_o · max_j ReLU(Θ [h_i, h_j − h_i])``, with Θ split per point so
    only a gather and a max run per edge."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.theta_i = nn.Linear(dim, dim)
        self.theta_j = nn.Linear(dim, dim, bias=False)
        self.out = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor, nbr: torch.Tensor) -> torch.Tensor:
        b = self.theta_j(h)
        a = self.theta_i(h) - b  # Θ[h_i, h_j − h_i] = (Θ_i − Θ_j) h_i + Θ_j h_j
        return h + self.out(F.relu(a[:, None] + b[nbr]).max(1).values)


class _DecoderRound(nn.Module):
    """AGILE3D round: click→scene cross-attention, FFN, click self-attention, scene→click cross-attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.c2s = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.self_attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.s2c = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ffn = _mlp(dim, dim, 2 * dim)
        self.ln = nn.ModuleList(nn.LayerNorm(dim) for _ in range(4))

    def queries(
        self, q: torch.Tensor, scene: torch.Tensor, pe_c: torch.Tensor, pe_p: torch.Tensor
    ) -> torch.Tensor:
        q = self.ln[0](q + self.c2s((q + pe_c)[None], (scene + pe_p)[None], scene[None])[0][0])
        q = self.ln[1](q + self.ffn(q))
        return self.ln[2](q + self.self_attn((q + pe_c)[None], (q + pe_c)[None], q[None])[0][0])

    def scene(
        self, scene: torch.Tensor, q: torch.Tensor, pe_c: torch.Tensor, pe_p: torch.Tensor
    ) -> torch.Tensor:
        return self.ln[3](scene + self.s2c((scene + pe_p)[None], (q + pe_c)[None], q[None])[0][0])


class InteractiveSegmenter(nn.Module):
    """Click-based multi-object point-cloud segmenter: a pure-torch kNN backbone (3-layer point MLP + 2
    EdgeConv rounds, k = ``k``), ``rounds`` AGILE3D-style decoder rounds and a mask head. ``head="np"``
    uses :class:`HierarchicalNPHead` in the last round (earlier rounds use the deterministic head, as the
    official ``np_start_layer``), ``head="deterministic"`` the AGILE3D :class:`ClickAttentionHead`.

    ``predict(points [P, 3], clicks)`` → ``labels [P]``, ``uncertainty [P]`` (numpy); ``fit(scenes)``
    trains on ``[(points, labels), ...]`` with simulated clicks."""

    def __init__(self, dim: int = 64, head: Literal["np", "deterministic"] = "np", rounds: int = 2,
                 n_samples: int = 8, scene_weight: float = 0.2, k: int = 16, heads: int = 4,
                 collapse_sigma: bool = False, seed: int = 0) -> None:  # fmt: skip
        super().__init__()
        if head not in ("np", "deterministic"):
            raise ValueError(f"head must be 'np' or 'deterministic', got {head!r}")
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
            raise ValueError(f"dim must be an even int >= 2, got {dim!r}")
        self.dim, self.k, self.head_kind, self.rounds = dim, k, head, rounds
        with isolated_rng(seed):
            self.register_buffer("fourier", torch.randn(3, dim // 2))
            self.point_mlp = nn.Sequential(
                nn.Linear(3 + dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim)
            )
            self.edge = nn.ModuleList(_EdgeConv(dim) for _ in range(2))
            self.decoder = nn.ModuleList(_DecoderRound(dim, heads) for _ in range(rounds))
            self.aux_head = ClickAttentionHead(dim)
            self.head = (
                HierarchicalNPHead(dim, n_samples, scene_weight, 1, heads, collapse_sigma)
                if head == "np"
                else ClickAttentionHead(dim)
            )

    # -- building blocks ---------------------------------------------------------------------------
    def _pe(self, xyz: torch.Tensor) -> torch.Tensor:
        a = 2 * math.pi * xyz @ self.fourier
        return torch.cat([a.sin(), a.cos()], -1)

    def encode(self, xyz: torch.Tensor, nbr: torch.Tensor) -> torch.Tensor:
        """Backbone point features ``[P, D]`` from normalised coordinates ``[P, 3]`` and kNN ``[P, k]``."""
        h = self.point_mlp(torch.cat([xyz, self._pe(xyz)], -1))
        for conv in self.edge:
            h = conv(h, nbr)
        return h

    def decode(self, feats: torch.Tensor, xyz: torch.Tensor, click_idx: torch.Tensor, click_obj: torch.Tensor,
               target_idx: torch.Tensor | None = None, target_obj: torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> tuple[NPOut, list[NPOut]]:  # fmt: skip
        """Decoder rounds on backbone features; returns the final head output and the auxiliary ones."""
        pe_p = self._pe(xyz)
        pe_c = pe_p[click_idx]
        q, scene = feats[click_idx] + pe_c, feats
        qt = None if target_idx is None else feats[target_idx] + pe_p[target_idx]
        aux = []
        for r, layer in enumerate(self.decoder):
            q = layer.queries(q, scene, pe_c, pe_p)
            if qt is not None:
                qt = layer.queries(qt, scene, pe_p[target_idx], pe_p)
            scene = layer.scene(scene, q, pe_c, pe_p)
            if r < self.rounds - 1:
                aux.append(self.aux_head(scene + pe_p, q + pe_c, click_obj))
        scene, q = scene + pe_p, q + pe_c
        if qt is not None:
            qt = qt + pe_p[target_idx]
        if self.head_kind == "np":
            out = self.head(scene, q, click_obj, qt, target_obj, generator=generator)
        else:
            out = self.head(scene, q, click_obj)
        return out, aux

    @staticmethod
    def _normalise(points: np.ndarray) -> torch.Tensor:
        p = torch.from_numpy(np.asarray(points, dtype=np.float32))
        p = p - p.mean(0)
        return p / p.norm(dim=1).max().clamp_min(1e-6)

    def _clicks(self, clicks: object, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(clicks, (list, tuple)) or not clicks:
            raise ValueError(f"clicks must be a non-empty list of Click(index, label), got {clicks!r}")
        if not all(isinstance(c, Click) for c in clicks):
            raise TypeError("clicks must hold Click(index, label) objects")
        idx = torch.tensor([c.index for c in clicks], dtype=torch.long)
        obj = torch.tensor([c.label for c in clicks], dtype=torch.long)
        if int(idx.min()) < 0 or int(idx.max()) >= n:
            raise ValueError(
                f"clicks: click indices must be in [0, {n}), got range [{int(idx.min())}, {int(idx.max())}]"
            )
        seen: dict[int, int] = {}
        for i, o in zip(idx.tolist(), obj.tolist()):
            if seen.setdefault(i, o) != o:
                raise ValueError(
                    f"clicks: point {i} is clicked for two different objects ({seen[i]} and {o})"
                )
        _check_click_objects(obj, "clicks", False)
        return idx, obj

    # -- public API --------------------------------------------------------------------------------
    @torch.no_grad()
    def predict(
        self, points: np.ndarray, clicks: list[Click], seed: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Labels ``[P]`` (0 = background, 1..O) and per-point uncertainty ``[P]`` (max-prob variance over the
        NP samples; ``1 − max prob`` for the deterministic head) for ``points [P, 3]`` and ``clicks``."""
        pts = _points_array(points, "points", min_points=self.k + 1)
        idx, obj = self._clicks(clicks, pts.shape[0])
        xyz = self._normalise(pts)
        feats = self.encode(xyz, _knn(xyz, self.k))
        out, _ = self.decode(feats, xyz, idx, obj, generator=make_generator(seed))
        return out.labels.numpy(), self.uncertainty(out).numpy()

    def uncertainty(self, out: NPOut) -> torch.Tensor:
        """Per-point uncertainty of a head output ``[P]``."""
        if self.head_kind == "np":
            return predictive_uncertainty(out.logits)
        return 1.0 - out.logits[..., 0].softmax(-1).max(-1).values

    def loss(self, out: NPOut, aux: list[NPOut], gt: torch.Tensor, kl_weight: float) -> torch.Tensor:
        """CE (1.0) + Dice (2.0) over the S samples for context (and target) masks, aux rounds at 0.5, plus
        ``kl_weight · KL`` (the official criterion, without AGILE3D's click-distance weights)."""

        def mask_loss(logits: torch.Tensor) -> torch.Tensor:
            S = logits.shape[-1]
            lg = logits.permute(2, 0, 1).reshape(-1, logits.shape[1])  # [S·P, K]
            tgt = gt.repeat(S)
            ce = F.cross_entropy(lg, tgt)
            prob = lg.softmax(-1)
            onehot = F.one_hot(tgt, logits.shape[1]).to(prob.dtype)
            dice = 1 - (2 * (prob * onehot).sum(0) + 1) / (prob.sum(0) + onehot.sum(0) + 1)
            return ce + 2.0 * dice.mean()

        total = mask_loss(out.logits) + sum(0.5 * mask_loss(a.logits) for a in aux)
        if out.target_logits is not None:
            total = total + mask_loss(out.target_logits)
        if out.kl is not None:
            total = total + kl_weight * out.kl
        return total

    def fit(self, scenes: list[tuple[np.ndarray, np.ndarray]], steps: int = 600, lr: float = 1e-3,
            max_extra_clicks: int = 4, n_target_clicks: int = 10, kl_weight: tuple[float, float] = (5e-4, 5e-3),
            seed: int = 0, log_every: int = 0) -> list[float]:  # fmt: skip
        """Train on ``scenes`` (``(points [P, 3], labels [P])`` pairs): each step one scene, clicks simulated
        iteratively (first at each label's most interior point, then 0..``max_extra_clicks`` rounds at the
        largest error regions of the current model), ``n_target_clicks`` random ground-truth clicks per label
        for the NP target path, Adam(``lr``), KL weight ramped linearly over ``kl_weight``. Returns the
        per-step losses."""
        if not isinstance(scenes, (list, tuple)) or not scenes:
            raise ValueError("scenes must be a non-empty list of (points, labels) pairs")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        if not (isinstance(lr, (int, float)) and 0 < float(lr) < 1):
            raise ValueError(f"lr must be in (0, 1), got {lr!r}")
        prepared = []
        for i, sc in enumerate(scenes):
            if not isinstance(sc, (list, tuple)) or len(sc) != 2:
                raise ValueError(f"scenes[{i}] must be a (points, labels) pair")
            pts = _points_array(sc[0], f"scenes[{i}] points", min_points=self.k + 1)
            lab = _labels_array(sc[1], f"scenes[{i}] labels", pts.shape[0])
            if lab.max() < 1:
                raise ValueError(f"scenes[{i}] labels must contain at least one object (a label >= 1)")
            missing = sorted(set(range(int(lab.max()) + 1)) - set(np.unique(lab).tolist()))
            if missing:
                raise ValueError(
                    f"scenes[{i}] labels must use every label 0..{int(lab.max())} (0 = background); missing {missing}"
                )
            xyz = self._normalise(pts)
            nbr = _knn(xyz, self.k)
            prepared.append((pts, torch.from_numpy(lab), xyz, nbr, nbr.numpy()))
        rng = np.random.default_rng(seed)
        gen = make_generator(seed)
        opt = torch.optim.Adam(self.parameters(), lr=float(lr))
        losses = []
        self.train()
        for step in range(steps):
            pts, lab, xyz, nbr, nbr_np = prepared[int(rng.integers(len(prepared)))]
            feats = self.encode(xyz, nbr)
            clicks = _simulate(pts, lab.numpy(), None, None, nbr_np)
            for _ in range(int(rng.integers(0, max_extra_clicks + 1))):
                idx, obj = self._click_tensors(clicks)
                with torch.no_grad():
                    pred = self.decode(feats.detach(), xyz, idx, obj, generator=gen)[0].labels.numpy()
                new = _simulate(pts, lab.numpy(), pred, None, nbr_np)
                if not new:
                    break
                clicks = clicks + [c for c in new if c.index not in {d.index for d in clicks}]
            idx, obj = self._click_tensors(clicks)
            tidx = tobj = None
            if self.head_kind == "np":
                tidx, tobj = self._target_clicks(lab, n_target_clicks, rng)
            out, aux = self.decode(feats, xyz, idx, obj, tidx, tobj, generator=gen)
            w = kl_weight[0] + (kl_weight[1] - kl_weight[0]) * step / max(1, steps - 1)
            loss = self.loss(out, aux, lab, w)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        self.eval()
        return losses

    @staticmethod
    def _click_tensors(clicks: list[Click]) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.tensor([c.index for c in clicks], dtype=torch.long),
            torch.tensor([c.label for c in clicks], dtype=torch.long),
        )

    @staticmethod
    def _target_clicks(
        lab: torch.Tensor, n: int, rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        idx, obj = [], []
        for o in torch.unique(lab).tolist():
            members = np.flatnonzero(lab.numpy() == o)
            pick = rng.choice(members, size=min(n, members.size), replace=False)
            idx.append(pick)
            obj.append(np.full(pick.size, o))
        return torch.from_numpy(np.concatenate(idx)).long(), torch.from_numpy(np.concatenate(obj)).long()
