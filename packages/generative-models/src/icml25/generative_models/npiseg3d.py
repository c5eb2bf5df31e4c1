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
* The interactive evaluation protocol lives in :mod:`icml25.generative_models.npiseg3d_eval` (kNN graph,
  :func:`simulate_clicks`: the next click at the most interior point of the largest error region, optionally
  weighted by uncertainty; :func:`object_ious`, :func:`noc_at`, :func:`uncertainty_auroc`,
  :func:`expected_calibration_error`), the procedural primitive scenes (:func:`make_scene`) in
  :mod:`icml25.generative_models.npiseg3d_toy`; both are re-exported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from icml25.generative_models.npiseg3d_eval import (
    Click,
    check_labels,
    check_points,
    clicks_on_graph,
    expected_calibration_error,
    knn,
    noc_at,
    object_ious,
    simulate_clicks,
    uncertainty_auroc,
)
from icml25.generative_models.npiseg3d_toy import make_scene
from icml25.kernels.checks import check_choice, check_float, check_int, check_tensor
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


# ------------------------------------------------------------------------------------------ validation
def _as_tensor(x: object) -> object:
    """A numpy array, list or tuple as a tensor (the heads take either); anything else unchanged, for
    :func:`~icml25.kernels.checks.check_tensor` to judge."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    return torch.as_tensor(x) if isinstance(x, (list, tuple)) else x


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
        dim = check_int(dim, "dim", low=1)
        self.dim, self.allow_no_background = dim, bool(allow_no_background)
        self.query_mlp = nn.Sequential(nn.LayerNorm(dim), _mlp(dim, dim))
        self.bg_query = nn.Parameter(torch.zeros(dim))

    def _inputs(self, point_feats, click_feats, click_obj):
        point_feats = check_tensor(
            _as_tensor(point_feats), "point_feats", ndim=2, non_empty=True, max_abs=1e15
        )
        click_feats = check_tensor(
            _as_tensor(click_feats), "click_feats", ndim=2, non_empty=True, max_abs=1e15
        )
        click_obj = check_tensor(_as_tensor(click_obj), "click_obj", ndim=1, dtype="int").long()
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
        n_samples = check_int(n_samples, "n_samples", low=1)
        scene_weight = check_float(scene_weight, "scene_weight", low=0.0, high=1.0)
        if check_int(heads, "heads", low=1) and dim % heads:
            raise ValueError(f"heads must be a positive int dividing dim={dim}, got {heads!r}")
        scene_layers = check_int(scene_layers, "scene_layers", low=1)
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
        target_feats = check_tensor(
            _as_tensor(target_feats), "target_feats", ndim=2, non_empty=True, max_abs=1e15
        )
        target_obj = check_tensor(_as_tensor(target_obj), "target_obj", ndim=1, dtype="int").long()
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
    logits = check_tensor(_as_tensor(logits), "logits", ndim=3, non_empty=True, max_abs=1e15)
    check_choice(kind, "kind", ("maxprob_var", "entropy", "mutual_info"))
    probs = logits.double().softmax(1)
    if kind == "maxprob_var":
        return probs.max(1).values.var(-1, unbiased=False).to(logits.dtype)

    def ent(p: torch.Tensor) -> torch.Tensor:
        return -(p * p.clamp_min(1e-300).log()).sum(1)

    mean_ent = ent(probs.mean(-1))
    if kind == "entropy":
        return mean_ent.to(logits.dtype)
    return (mean_ent - ent(probs).mean(-1)).clamp_min(0).to(logits.dtype)


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
        check_choice(head, "head", ("np", "deterministic"))
        rounds, k = check_int(rounds, "rounds", low=1), check_int(k, "k", low=1)
        if check_int(dim, "dim", low=2) % 2:
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
        pts = check_points(points, "points", min_points=self.k + 1)
        idx, obj = self._clicks(clicks, pts.shape[0])
        xyz = self._normalise(pts)
        feats = self.encode(xyz, knn(xyz, self.k))
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
        steps = check_int(steps, "steps", low=1)
        lr = check_float(lr, "lr", low=0.0, high=1.0, low_open=True, high_open=True)
        prepared = []
        for i, sc in enumerate(scenes):
            if not isinstance(sc, (list, tuple)) or len(sc) != 2:
                raise ValueError(f"scenes[{i}] must be a (points, labels) pair")
            pts = check_points(sc[0], f"scenes[{i}] points", min_points=self.k + 1)
            lab = check_labels(sc[1], f"scenes[{i}] labels", pts.shape[0])
            if lab.max() < 1:
                raise ValueError(f"scenes[{i}] labels must contain at least one object (a label >= 1)")
            missing = sorted(set(range(int(lab.max()) + 1)) - set(np.unique(lab).tolist()))
            if missing:
                raise ValueError(
                    f"scenes[{i}] labels must use every label 0..{int(lab.max())} (0 = background); missing {missing}"
                )
            xyz = self._normalise(pts)
            nbr = knn(xyz, self.k)
            prepared.append((pts, torch.from_numpy(lab), xyz, nbr, nbr.numpy()))
        rng = np.random.default_rng(seed)
        gen = make_generator(seed)
        opt = torch.optim.Adam(self.parameters(), lr=float(lr))
        losses = []
        self.train()
        for step in range(steps):
            pts, lab, xyz, nbr, nbr_np = prepared[int(rng.integers(len(prepared)))]
            feats = self.encode(xyz, nbr)
            clicks = clicks_on_graph(pts, lab.numpy(), None, None, nbr_np)
            for _ in range(int(rng.integers(0, max_extra_clicks + 1))):
                idx, obj = self._click_tensors(clicks)
                with torch.no_grad():
                    pred = self.decode(feats.detach(), xyz, idx, obj, generator=gen)[0].labels.numpy()
                new = clicks_on_graph(pts, lab.numpy(), pred, None, nbr_np)
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
