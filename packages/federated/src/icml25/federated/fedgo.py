"""Provably Near-Optimal Federated Ensemble Distillation with Negligible Overhead — ICML 2025, P10: FedGO.

Jang, Park and Lee, ICML 2025 (PMLR 267:26896-26924; arXiv 2502.06349; official code named by the paper:
``pupiu45/FedGO``). FedDF-style ensemble distillation (Lin et al., 2020) trains the server model on
unlabelled server data pseudo-labelled by the client models; FedGO weights client ``k`` at ``x`` by
``n_k p_k(x)``, estimating the density ratio ``p_k / p_g`` with a client discriminator ``D_k`` trained
against samples of a generator ``G`` the server distributes once: at the GAN optimum
``D_k = p_k / (p_k + p_g)``, so ``D_k / (1 - D_k) = p_k / p_g`` and, with ``ℓ_k`` the pre-sigmoid logit,
``w_k(x) = softmax_k(ℓ_k(x) + log n_k)`` (``p_g`` cancels in the normalisation).

Framework-free core (the Flower strategy is :mod:`icml25.federated.fedgo_flower`):

* :func:`fedgo_weights`, :func:`ensemble_weights` (``"fedgo"``, and the baselines ``"uniform"`` = FedDF,
  ``"size"``, ``"entropy"``, ``"oracle"`` with the true log-densities), :func:`ensemble_pseudo_labels`.
* :class:`GaussianGenerator`: a full-covariance Gaussian generator (full support), fitted on the server
  set (``fit``) or, without a server dataset, from the clients' first and second moments
  (:func:`client_moments`, ``from_moments``); its samples then also serve as the distillation set.
* :func:`train_discriminator` (BCE: local data -> 1, generator samples -> 0), :func:`discriminator_logits`.
* :func:`distill` (KL from soft labels to the student, Adam), :class:`FedGOAggregator` (the server step:
  FedAvg by ``n_k``, pseudo-labels, distillation) and :class:`FedGOServer` (the plain-python loop of
  :class:`~icml25.federated.server.FederatedServer` with FedGO's pre-FL discriminator stage).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from icml25.federated.aggregation import FedAvgAggregator, check_client_states, check_uploads
from icml25.federated.data import FederatedData
from icml25.federated.server import FederatedServer
from icml25.federated.training import Adam, make_mlp, seed_generator
from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.rng import isolated_rng

__all__ = [
    "WEIGHTINGS",
    "FedGOAggregator",
    "FedGOConfig",
    "FedGOServer",
    "GaussianGenerator",
    "client_moments",
    "discriminator_logits",
    "distill",
    "ensemble_pseudo_labels",
    "ensemble_weights",
    "fedgo_weights",
    "fit_classifier",
    "make_discriminator",
    "predict_logits",
    "train_discriminator",
    "weight_entropy",
    "weighted_mean_state",
]

State = dict[str, Tensor]
WEIGHTINGS = ("fedgo", "uniform", "size", "entropy", "oracle")


# ------------------------------------------------------------------------------------------ validation


def _check_n_samples(n_samples: object, k: int | None = None) -> Tensor:
    n = torch.as_tensor(n_samples) if not isinstance(n_samples, Tensor) else n_samples
    if n.ndim != 1 or n.numel() == 0:
        raise ValueError(
            f"n_samples must be a non-empty 1-D tensor [K] of client sizes, got shape {tuple(n.shape)}"
        )
    if n.dtype == torch.bool or n.is_complex():
        raise TypeError(f"n_samples must be numeric, got dtype {n.dtype}")
    n = n.double()
    if not bool(torch.isfinite(n).all()) or bool((n <= 0).any()):
        raise ValueError(f"n_samples must be finite and > 0 for every client, got {n.tolist()}")
    if k is not None and n.numel() != k:
        raise ValueError(f"n_samples must have one entry per client (K={k}), got {n.numel()}")
    return n


# ----------------------------------------------------------------------------------------- weighting


def fedgo_weights(
    disc_logits: Tensor,
    n_samples: Tensor | Sequence[float],
    *,
    logit_clip: float | None = None,
    from_probs: bool = False,
) -> Tensor:
    """FedGO's client weights ``w_k(x) = n_k D_k(x)/(1 - D_k(x)) / Σ_j n_j D_j(x)/(1 - D_j(x))``.

    Computed in log space: ``softmax_k(ℓ_k(x) + log n_k)`` with ``ℓ_k = log(D_k / (1 - D_k))`` the
    discriminator's pre-sigmoid logit (exact, stable for any finite logit).

    Args:
        disc_logits: ``[K, B]`` pre-sigmoid discriminator outputs of the K participating clients.
        n_samples: ``[K]`` client dataset sizes ``n_k > 0``.
        logit_clip: clip the logits to ``[-c, c]`` (tames overconfident discriminators; off by default).
        from_probs: ``disc_logits`` holds probabilities ``D ∈ [0, 1]`` instead: they are clamped to
            ``[1e-6, 1 - 1e-6]`` (with a warning when a value is clamped) and converted to logits.

    Returns:
        ``[K, B]`` non-negative weights; every column sums to 1.
    """
    ell = check_tensor(disc_logits, "disc_logits", ndim=2, non_empty=True)
    n = _check_n_samples(n_samples, ell.shape[0])
    ell = ell.double()
    if from_probs:
        if bool((ell < 0).any()) or bool((ell > 1).any()):
            raise ValueError("disc_logits must be probabilities in [0, 1] when from_probs=True")
        eps = 1e-6
        if bool(((ell < eps) | (ell > 1 - eps)).any()):
            warnings.warn(
                "disc_logits: discriminator probabilities at 0 or 1 clamped to [1e-6, 1-1e-6]; pass the "
                "pre-sigmoid logits instead",
                RuntimeWarning,
                stacklevel=2,
            )
        ell = torch.logit(ell.clamp(eps, 1 - eps))
    if logit_clip is not None:
        check_float(logit_clip, "logit_clip", low=0.0, low_open=True)
        ell = ell.clamp(-logit_clip, logit_clip)
    return torch.softmax(ell + n.log()[:, None], dim=0).to(disc_logits.dtype)


def _entropy(client_logits: Tensor) -> Tensor:
    logp = torch.log_softmax(client_logits.double(), -1)
    return -(logp.exp() * logp).sum(-1)


def ensemble_weights(
    weighting: str,
    client_logits: Tensor,
    n_samples: Tensor | Sequence[float],
    *,
    disc_logits: Tensor | None = None,
    log_density: Tensor | None = None,
    logit_clip: float | None = None,
) -> Tensor:
    """Per-sample client weights ``[K, B]`` (columns sum to 1) of a weighting rule.

    Args:
        weighting: ``"fedgo"`` (:func:`fedgo_weights` of ``disc_logits``), ``"uniform"`` (FedDF: 1/K),
            ``"size"`` (``n_k / Σ n``), ``"entropy"`` (``softmax_k(-H(p_k(·|x)))``, confident clients
            weigh more), ``"oracle"`` (``n_k p_k(x)`` normalised, from the true ``log_density``).
        client_logits: ``[K, B, C]`` client model logits on the B samples.
        n_samples: ``[K]`` client sizes.
        disc_logits: ``[K, B]`` discriminator logits (``"fedgo"``).
        log_density: ``[K, B]`` true ``log p_k(x)`` (``"oracle"``; ``p_g`` cancels, so it is FedGO with the
            Bayes-optimal discriminators).
        logit_clip: as :func:`fedgo_weights` (``"fedgo"`` only).
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    cl = check_tensor(client_logits, "client_logits", ndim=3, non_empty=True)
    k, b = cl.shape[:2]
    n = _check_n_samples(n_samples, k)
    if weighting in ("fedgo", "oracle"):
        name, extra = ("disc_logits", disc_logits) if weighting == "fedgo" else ("log_density", log_density)
        if extra is None:
            raise ValueError(f"weighting={weighting!r} needs {name} [K, B], got None")
        extra = check_tensor(extra, name, ndim=2, non_empty=True)
        if tuple(extra.shape) != (k, b):
            raise ValueError(
                f"{name} must have shape [K, B] = {(k, b)} like client_logits, got {tuple(extra.shape)}"
            )
        return fedgo_weights(extra, n, logit_clip=logit_clip if weighting == "fedgo" else None).to(cl.dtype)
    if weighting == "uniform":
        return torch.full((k, b), 1.0 / k, dtype=cl.dtype)
    if weighting == "size":
        return (n / n.sum())[:, None].expand(k, b).to(cl.dtype).clone()
    return torch.softmax(-_entropy(cl), dim=0).to(cl.dtype)


def ensemble_pseudo_labels(client_logits: Tensor, weights: Tensor, average: str = "prob") -> Tensor:
    """Soft labels of the weighted ensemble.

    Args:
        client_logits: ``[K, B, C]`` logits of the K client models on B samples.
        weights: ``[K, B]`` per-sample client weights (non-negative, columns summing to 1).
        average: ``"prob"``: ``Σ_k w_k softmax(f_k(x))`` (a mixture of the client predictives);
            ``"logit"``: ``softmax(Σ_k w_k f_k(x))``.

    Returns:
        ``[B, C]`` probability vectors.
    """
    if average not in ("prob", "logit"):
        raise ValueError(f"average must be 'prob' or 'logit', got {average!r}")
    cl = check_tensor(client_logits, "client_logits", ndim=3, non_empty=True)
    w = check_tensor(weights, "weights", ndim=2, non_empty=True)
    if tuple(w.shape) != tuple(cl.shape[:2]):
        raise ValueError(
            f"weights must have shape [K, B] = {tuple(cl.shape[:2])} like client_logits, got {tuple(w.shape)}"
        )
    if bool((w < 0).any()) or not torch.allclose(
        w.double().sum(0), torch.ones(w.shape[1], dtype=torch.float64), atol=1e-4
    ):
        raise ValueError("weights must be non-negative with every column [:, b] summing to 1")
    w = w.to(cl.dtype)
    if average == "prob":
        return (w[..., None] * torch.softmax(cl, -1)).sum(0)
    return torch.softmax((w[..., None] * cl).sum(0), -1)


def weight_entropy(weights: Tensor) -> float:
    """Mean over samples of the entropy (nats) of the client weights ``[K, B]`` (0: one client per sample)."""
    w = check_tensor(weights, "weights", ndim=2, non_empty=True).double().clamp_min(1e-300)
    return float(-(w * w.log()).sum(0).mean())


# ----------------------------------------------------------------------------------------- generator


def client_moments(x: Tensor) -> tuple[int, Tensor, Tensor]:
    """What a client uploads for a federated Gaussian generator: ``(n, Σ x [d], Σ x xᵀ [d, d])`` (float64)."""
    x = check_tensor(x, "x", ndim=2, non_empty=True).double()
    return int(x.shape[0]), x.sum(0), x.T @ x


class GaussianGenerator:
    """Full-covariance Gaussian generator ``N(μ, Σ + ridge·I)``: cheap, with full support.

    ``fit(x)`` uses the server's unlabelled set; ``from_moments`` builds it without a server dataset from
    the clients' :func:`client_moments` (summed). ``sample(n, generator=)`` draws ``[n, d]`` float32.

    Attributes:
        mean: ``[d]``; cov: ``[d, d]`` (both float64), set by ``fit`` / ``from_moments``.
    """

    def __init__(self, ridge: float = 1e-3) -> None:
        check_float(ridge, "ridge", low=0.0, low_open=True)
        self.ridge = float(ridge)
        self.mean: Tensor | None = None
        self.cov: Tensor | None = None
        self._chol: Tensor | None = None

    def __repr__(self) -> str:
        d = None if self.mean is None else int(self.mean.numel())
        return f"GaussianGenerator(d={d}, ridge={self.ridge:g})"

    def fit(self, x: Tensor) -> GaussianGenerator:
        """Maximum-likelihood mean and covariance of ``x [n, d]`` (n >= 2)."""
        x = check_tensor(x, "x", ndim=2, non_empty=True).double()
        if x.shape[0] < 2:
            raise ValueError(f"x must hold at least 2 samples to fit a covariance, got {x.shape[0]}")
        mean = x.mean(0)
        cov = (x - mean).T @ (x - mean) / x.shape[0]  # centred: no cancellation at large magnitudes
        cov = 0.5 * (cov + cov.T) + self.ridge * torch.eye(mean.numel(), dtype=torch.float64)
        try:
            return self.set_params(mean, cov)
        except ValueError as err:
            raise ValueError(f"x gives a covariance that is not positive definite ({err})") from err

    def from_moments(self, moments: Sequence[tuple[int, Tensor, Tensor]]) -> GaussianGenerator:
        """Fit from summed client moments ``[(n_k, Σ x, Σ x xᵀ), ...]`` (no server data needed)."""
        if not isinstance(moments, Sequence) or len(moments) == 0:
            raise ValueError("moments must be a non-empty list of (n, sum [d], outer sum [d, d]) triples")
        n = sum(int(m[0]) for m in moments)
        s = sum(m[1].double() for m in moments)
        ss = sum(m[2].double() for m in moments)
        if n < 2:
            raise ValueError(f"moments must cover at least 2 samples, got {n}")
        mean = s / n
        cov = ss / n - torch.outer(mean, mean)
        cov = 0.5 * (cov + cov.T) + self.ridge * torch.eye(mean.numel(), dtype=torch.float64)
        self.set_params(mean, cov)
        return self

    def set_params(self, mean: Tensor, cov: Tensor) -> GaussianGenerator:
        """Set ``mean [d]`` and a symmetric positive-definite ``cov [d, d]`` (e.g. received over the wire)."""
        mean = check_tensor(mean, "mean", ndim=1, non_empty=True).double()
        cov = check_tensor(cov, "cov", ndim=2, non_empty=True).double()
        if tuple(cov.shape) != (mean.numel(), mean.numel()):
            raise ValueError(f"cov must be [d, d] with d={mean.numel()}, got {tuple(cov.shape)}")
        chol, info = torch.linalg.cholesky_ex(cov)
        if int(info) != 0:
            raise ValueError("cov must be symmetric positive definite (its Cholesky factorisation failed)")
        self.mean, self.cov, self._chol = mean, cov, chol
        return self

    def _fitted(self) -> tuple[Tensor, Tensor]:
        if self.mean is None or self._chol is None:
            raise ValueError("GaussianGenerator is not fitted: call fit(...) first")
        return self.mean, self._chol

    @property
    def dim(self) -> int:
        return int(self._fitted()[0].numel())

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``[n, d]`` float32 samples (``generator=None`` draws from torch's global generator)."""
        check_int(n, "n", low=1)
        mean, chol = self._fitted()
        z = torch.randn(n, mean.numel(), generator=generator, dtype=torch.float64)
        return (mean + z @ chol.T).float()

    def __call__(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        return self.sample(n, generator)

    def log_prob(self, x: Tensor) -> Tensor:
        """``[n]`` log-density of ``x [n, d]``."""
        mean, chol = self._fitted()
        x = check_tensor(x, "x", ndim=2, non_empty=True)
        if x.shape[1] != mean.numel():
            raise ValueError(f"x must have d={mean.numel()} features, got {x.shape[1]}")
        z = torch.linalg.solve_triangular(chol, (x.double() - mean).T, upper=False)
        half_logdet = torch.log(torch.diagonal(chol)).sum()
        return -0.5 * (z**2).sum(0) - half_logdet - 0.5 * mean.numel() * math.log(2 * math.pi)

    def state_dict(self) -> State:
        """``{"mean": [d], "cov": [d, d]}`` (what the server sends to the clients)."""
        mean, _ = self._fitted()
        return {"mean": mean.clone(), "cov": self.cov.clone()}  # type: ignore[union-attr]

    @classmethod
    def from_state(cls, state: Mapping[str, Tensor]) -> GaussianGenerator:
        """Rebuild from :meth:`state_dict`."""
        if not isinstance(state, Mapping) or set(state) != {"mean", "cov"}:
            raise ValueError(
                f"state must be a dict with keys 'mean' and 'cov', got {sorted(state) if isinstance(state, Mapping) else type(state).__name__}"
            )
        return cls().set_params(state["mean"], state["cov"])


# ------------------------------------------------------------------------------------- client models


def make_discriminator(n_in: int, hidden: int = 64, *, seed: int | None = None) -> nn.Sequential:
    """The small discriminator MLP ``n_in → hidden → 1`` (ReLU; one pre-sigmoid logit per sample)."""
    return make_mlp(n_in, hidden, 1, seed=seed)


def _check_xy(x: object, y: object | None = None) -> None:
    check_tensor(x, "x", ndim=2, non_empty=True)
    if y is not None:
        if not isinstance(y, Tensor) or y.ndim != 1 or y.shape[0] != x.shape[0] or y.is_floating_point():  # type: ignore[union-attr]
            raise ValueError(
                f"y must be an integer tensor [n] with n = {x.shape[0]}, got {getattr(y, 'shape', type(y).__name__)}"
            )  # type: ignore[union-attr]


def _batches(n: int, batch_size: int, g: torch.Generator) -> list[Tensor]:
    perm = torch.randperm(n, generator=g)
    return [perm[i : i + batch_size] for i in range(0, n, batch_size)]


def fit_classifier(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    epochs: int = 40,
    lr: float = 1e-3,
    batch_size: int = 32,
    seed: int = 0,
) -> nn.Module:
    """Train ``model`` in place on ``(x [n, d], y [n])`` with Adam and cross-entropy (a client's local fit)."""
    _check_xy(x, y)
    check_int(epochs, "epochs", low=1)
    check_int(batch_size, "batch_size", low=1)
    check_float(lr, "lr", low=0.0, low_open=True)
    g = seed_generator(seed)
    opt = Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        for idx in _batches(x.shape[0], batch_size, g):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    model.eval()
    return model


def train_discriminator(
    disc: nn.Module,
    local_x: Tensor,
    generator: Callable[..., Tensor],
    *,
    epochs: int = 30,
    lr: float = 1e-3,
    weight_decay: float = 1e-3,
    batch_size: int = 32,
    seed: int = 0,
) -> nn.Module:
    """Train a client discriminator in place: BCE with local samples → 1 and generator samples → 0.

    Every epoch draws ``n`` fresh generator samples (balanced classes, so the optimum is
    ``D = p_k / (p_k + p_g)``). Adam with L2 ``weight_decay`` (small local sets overfit otherwise).

    Args:
        disc: module mapping ``[B, d]`` to ``[B, 1]`` or ``[B]`` logits.
        local_x: ``[n, d]`` the client's samples.
        generator: ``generator(m, generator=torch.Generator) -> [m, d]`` (e.g. :class:`GaussianGenerator`).
        epochs, lr, weight_decay, batch_size: optimiser settings.
        seed: seeds the batches and the generator draws.
    """
    x = check_tensor(local_x, "local_x", ndim=2, non_empty=True)
    check_int(epochs, "epochs", low=1)
    check_int(batch_size, "batch_size", low=1)
    check_float(lr, "lr", low=0.0, low_open=True)
    check_float(weight_decay, "weight_decay", low=0.0)
    if not callable(generator):
        raise TypeError(
            f"generator must be callable (m, generator=) -> [m, d], got {type(generator).__name__}"
        )
    g = seed_generator(seed, 1)
    probe = generator(2, generator=g)
    if not isinstance(probe, Tensor) or tuple(probe.shape) != (2, x.shape[1]):
        raise ValueError(
            f"generator samples must have shape [m, d] with d = {x.shape[1]} (local_x's features), got "
            f"{tuple(probe.shape) if isinstance(probe, Tensor) else type(probe).__name__}"
        )
    opt = Adam(disc.parameters(), lr=lr, weight_decay=weight_decay)
    n = x.shape[0]
    disc.train()
    for _ in range(epochs):
        fake = generator(n, generator=g).to(x.dtype)
        for idx in _batches(n, batch_size, g):
            inp = torch.cat([x[idx], fake[idx]])
            target = torch.cat([torch.ones(len(idx)), torch.zeros(len(idx))]).to(x.dtype)
            opt.zero_grad()
            out = disc(inp).reshape(-1)
            nn.functional.binary_cross_entropy_with_logits(out, target).backward()
            opt.step()
    disc.eval()
    return disc


@torch.no_grad()
def discriminator_logits(discriminators: Sequence[nn.Module], x: Tensor) -> Tensor:
    """``[K, B]`` pre-sigmoid outputs of K discriminators on ``x [B, d]`` (eval mode)."""
    x = check_tensor(x, "x", ndim=2, non_empty=True)
    if len(discriminators) == 0:
        raise ValueError("discriminators must hold at least one module, got 0")
    out = []
    for k, d in enumerate(discriminators):
        d.eval()
        o = d(x)
        if o.numel() != x.shape[0]:
            raise ValueError(
                f"discriminators[{k}] must output one logit per sample ([B] or [B, 1]), got {tuple(o.shape)}"
            )
        out.append(o.reshape(-1))
    return torch.stack(out)


@torch.no_grad()
def predict_logits(models: Sequence[nn.Module], x: Tensor) -> Tensor:
    """``[K, B, C]`` logits of K classifiers on ``x [B, d]`` (eval mode); they must agree on C."""
    x = check_tensor(x, "x", ndim=2, non_empty=True)
    if len(models) == 0:
        raise ValueError("models must hold at least one client model, got 0")
    out = []
    for m in models:
        m.eval()
        out.append(m(x))
    shapes = sorted({tuple(o.shape) for o in out})
    if len(shapes) != 1:
        raise ValueError(
            f"client models must all output [B, C] with the same number of classes C, got {shapes}"
        )
    return torch.stack(out)


# ------------------------------------------------------------------------------------------ distillation


def distill(
    student: nn.Module,
    unlabeled: Tensor,
    targets: Tensor,
    *,
    steps: int = 300,
    lr: float = 1e-3,
    batch_size: int = 64,
    seed: int = 0,
) -> nn.Module:
    """Ensemble distillation: minimise ``KL(q(x) ‖ softmax(f(x)))`` over the server set, in place.

    Args:
        student: the server model (FedGO starts it from the FedAvg average).
        unlabeled: ``[n, d]`` the server's unlabelled (or synthesised) samples.
        targets: ``[n, C]`` soft labels ``q`` (:func:`ensemble_pseudo_labels`).
        steps, lr, batch_size: Adam steps on random mini-batches (FedDF's optimiser).
        seed: seeds the mini-batches.
    """
    u = check_tensor(unlabeled, "unlabeled", ndim=2, non_empty=True)
    q = check_tensor(targets, "targets", ndim=2, non_empty=True)
    if q.shape[0] != u.shape[0]:
        raise ValueError(f"targets must be [n, C] with n = {u.shape[0]} (unlabeled), got {tuple(q.shape)}")
    if bool((q < 0).any()) or not torch.allclose(
        q.double().sum(1), torch.ones(q.shape[0], dtype=torch.float64), atol=1e-4
    ):
        raise ValueError("targets must be probability vectors (non-negative rows summing to 1)")
    check_int(steps, "steps", low=1)
    check_int(batch_size, "batch_size", low=1)
    check_float(lr, "lr", low=0.0, low_open=True)
    g = seed_generator(seed, 2)
    opt = Adam(student.parameters(), lr=lr)
    student.train()
    n = u.shape[0]
    for _ in range(steps):
        idx = torch.randint(n, (min(batch_size, n),), generator=g)
        logp = torch.log_softmax(student(u[idx]), -1)
        if logp.shape != q[idx].shape:
            raise ValueError(f"student outputs {tuple(logp.shape)} but targets are [n, {q.shape[1]}]")
        loss = nn.functional.kl_div(logp, q[idx], reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        opt.step()
    student.eval()
    return student


def weighted_mean_state(states: Sequence[Mapping[str, Tensor]], n_samples: Sequence[float]) -> State:
    """FedAvg ``Σ n_k θ_k / Σ n_k`` of every floating tensor (non-float buffers from client 0).

    Raises ``ValueError`` when the clients' states differ in keys or shapes or hold NaN/Inf (a client's
    non-finite parameter would make the average non-finite), ``TypeError`` for a non-tensor entry.
    """
    check_client_states(states, name="states")  # same keys and shapes in every client, finite floats
    n = _check_n_samples(torch.as_tensor([float(v) for v in n_samples]), len(states))
    w = n / n.sum()
    out: State = {}
    for key, v0 in states[0].items():
        if v0.is_floating_point():
            out[key] = sum(float(wk) * st[key].double() for wk, st in zip(w, states)).to(v0.dtype)  # type: ignore[union-attr]
        else:
            out[key] = v0.clone()
    return out


# ----------------------------------------------------------------------------------------- the server


@dataclass(frozen=True)
class FedGOConfig:
    """Server-side FedGO / FedDF settings.

    Attributes:
        weighting: one of :data:`WEIGHTINGS` (``"fedgo"``; ``"uniform"`` is FedDF).
        average: pseudo-labels from averaged probabilities (``"prob"``) or logits (``"logit"``).
        distill_steps, distill_lr, distill_batch: Adam distillation from the FedAvg model (FedDF's
            optimiser; the paper's values are not given here).
        logit_clip: optional clip of the discriminator logits (off by default).
        n_synthetic: size of the generated distillation set when the server has no dataset.
        disc_hidden, disc_epochs, disc_lr, disc_weight_decay: the clients' discriminator training.
    """

    weighting: str = "fedgo"
    average: str = "prob"
    distill_steps: int = 300
    distill_lr: float = 1e-3
    distill_batch: int = 64
    logit_clip: float | None = None
    n_synthetic: int = 2000
    disc_hidden: int = 64
    disc_epochs: int = 30
    disc_lr: float = 1e-3
    disc_weight_decay: float = 1e-3

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS or self.weighting == "oracle":
            raise ValueError(f"weighting must be one of {WEIGHTINGS[:4]}, got {self.weighting!r}")
        if self.average not in ("prob", "logit"):
            raise ValueError(f"average must be 'prob' or 'logit', got {self.average!r}")
        for name in ("distill_steps", "distill_batch", "n_synthetic", "disc_hidden", "disc_epochs"):
            check_int(getattr(self, name), name, low=1)
        for name in ("distill_lr", "disc_lr"):
            check_float(getattr(self, name), name, low=0.0, low_open=True)
        check_float(self.disc_weight_decay, "disc_weight_decay", low=0.0)
        if self.logit_clip is not None:
            check_float(self.logit_clip, "logit_clip", low=0.0, low_open=True)


class FedGOAggregator(FedAvgAggregator):
    """FedGO's server step (same interface as the FedCEO aggregators, so the plain-python
    :class:`~icml25.federated.server.FederatedServer` and the Flower strategy both drive it).

    ``aggregate``: FedAvg by ``n_k``, then pseudo-labels on the server set from the uploaded client models
    weighted by ``config.weighting``, then distillation from the FedAvg model. Clients are registered
    once with :meth:`register_client` (their size and, for FedGO, their discriminator).

    Args:
        config: FedGO settings.
        model_fn: builds the classifier (loads uploads for prediction; the student).
        unlabeled: ``[n, d]`` server set; ``None`` (no server dataset): ``config.n_synthetic`` samples of
            the generator given to :meth:`pre_fl`.
        disc_fn: builds a discriminator (loads the uploaded discriminator states); default
            :func:`make_discriminator` with ``config.disc_hidden``.
        seed: seeds the synthetic set and the distillation batches.

    Attributes:
        generator: set by :meth:`pre_fl`. n_samples, discriminators: per client id.
        last_weights: ``[K, n]`` weights of the last round; weight_entropy: their mean entropy per round.
    """

    def __init__(
        self,
        config: FedGOConfig,
        model_fn: Callable[[], nn.Module],
        unlabeled: Tensor | None = None,
        *,
        disc_fn: Callable[[], nn.Module] | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(config, FedGOConfig):
            raise TypeError(f"config must be a FedGOConfig, got {type(config).__name__}")
        if not callable(model_fn):
            raise TypeError(f"model_fn must be callable () -> nn.Module, got {type(model_fn).__name__}")
        if unlabeled is not None:
            check_tensor(unlabeled, "unlabeled", ndim=2, non_empty=True)
        self.config, self.model_fn, self.seed = config, model_fn, seed
        self.unlabeled = unlabeled
        self.disc_fn = disc_fn
        self.generator: GaussianGenerator | None = None
        self.n_samples: dict[Hashable, int] = {}
        self.discriminators: dict[Hashable, nn.Module] = {}
        self.last_weights: Tensor | None = None
        self.weight_entropy: list[float] = []
        with isolated_rng(seed):
            self._student = model_fn()
            self._teacher = model_fn()

    def pre_fl(self, generator: GaussianGenerator) -> None:
        """Store the generator (sent to the clients); without a server set, synthesise it from ``generator``."""
        if not callable(generator):
            raise TypeError(f"generator must be a fitted GaussianGenerator, got {type(generator).__name__}")
        self.generator = generator
        if self.unlabeled is None:
            self.unlabeled = generator(self.config.n_synthetic, generator=seed_generator(self.seed, 3))

    def register_client(
        self,
        client_id: Hashable,
        n_samples: int,
        discriminator: nn.Module | Mapping[str, Tensor] | None = None,
    ) -> None:
        """Record a client's size and (once) its discriminator, a module or a state dict for ``disc_fn``."""
        check_int(n_samples, "n_samples", low=1)
        self.n_samples[client_id] = int(n_samples)
        if discriminator is None:
            return
        if isinstance(discriminator, Mapping):
            dim = self._dim()
            disc = (
                self.disc_fn()
                if self.disc_fn is not None
                else make_discriminator(dim, self.config.disc_hidden, seed=0)
            )
            disc.load_state_dict(discriminator)
            discriminator = disc
        if not isinstance(discriminator, nn.Module):
            raise TypeError(
                f"discriminator must be an nn.Module or a state dict, got {type(discriminator).__name__}"
            )
        self.discriminators[client_id] = discriminator.eval()

    def _dim(self) -> int:
        if self.unlabeled is not None:
            return int(self.unlabeled.shape[1])
        if self.generator is not None:
            return self.generator.dim
        raise RuntimeError("run pre_fl first: the feature dimension is unknown")

    def needs_discriminator(self, client_id: Hashable) -> bool:
        """Whether ``client_id`` still has to train and upload its discriminator (FedGO only)."""
        return self.config.weighting == "fedgo" and client_id not in self.discriminators

    def pseudo_labels(self, states: Sequence[Mapping[str, Tensor]], client_ids: Sequence[Hashable]) -> Tensor:
        """``[n, C]`` soft labels of the participating clients' ensemble on the server set."""
        if self.unlabeled is None:
            raise RuntimeError("run pre_fl first: the server has no unlabelled set and no generator")
        if self.config.weighting == "fedgo":
            if not self.discriminators:
                raise RuntimeError("run pre_fl first: no client discriminator is stored")
            missing = [c for c in client_ids if c not in self.discriminators]
            if missing:
                raise KeyError(f"no stored discriminator for participating client(s) {missing}")
        for c in client_ids:
            if c not in self.n_samples:
                raise KeyError(f"client {c!r} is not registered (register_client(cid, n_samples) first)")
        u = self.unlabeled
        logits = []
        for st in states:
            self._teacher.load_state_dict(st)
            logits.append(predict_logits([self._teacher], u)[0])
        cl = torch.stack(logits)
        n = torch.tensor([float(self.n_samples[c]) for c in client_ids])
        disc = (
            discriminator_logits([self.discriminators[c] for c in client_ids], u)
            if self.config.weighting == "fedgo"
            else None
        )
        w = ensemble_weights(
            self.config.weighting, cl, n, disc_logits=disc, logit_clip=self.config.logit_clip
        )
        self.last_weights = w
        self.weight_entropy.append(weight_entropy(w))
        return ensemble_pseudo_labels(cl, w, self.config.average)

    def aggregate(
        self, round_idx: int, uploads: Mapping[Hashable, State] | Sequence[tuple[Hashable, State]]
    ) -> State:
        """FedAvg by ``n_k``, pseudo-label the server set, distil from the average; the new global state."""
        items = check_uploads(uploads)
        ids = [cid for cid, _ in items]
        states = [st for _, st in items]
        q = self.pseudo_labels(states, ids)  # validates pre_fl / registration before any training
        avg = weighted_mean_state(states, [self.n_samples[c] for c in ids])
        self._student.load_state_dict(avg)
        c = self.config
        distill(
            self._student,
            self.unlabeled,  # type: ignore[arg-type]
            q,
            steps=c.distill_steps,
            lr=c.distill_lr,
            batch_size=c.distill_batch,
            seed=self.seed * 100_003 + round_idx,
        )
        return {k: v.detach().clone() for k, v in self._student.state_dict().items()}


class FedGOServer(FederatedServer):
    """The plain-python federated loop with FedGO's (or FedDF's) server step and its pre-FL stage.

    Args:
        data: client partitions and test set.
        config: FedGO settings (``weighting="uniform"`` is FedDF).
        unlabeled: ``[n, d]`` server set; ``None``: no server dataset (the generator is fitted from the
            clients' moments and its samples are the distillation set).
        **kwargs: as :class:`~icml25.federated.server.FederatedServer` (``clients_per_round``, ``train``,
            ``model_fn``, ``seed``; ``dp`` must stay off).

    Call :meth:`pre_fl` once, then :meth:`fit` / :meth:`run_round`.
    """

    def __init__(
        self, data: FederatedData, config: FedGOConfig, unlabeled: Tensor | None = None, **kwargs: object
    ) -> None:
        seed = int(kwargs.get("seed", 0))  # type: ignore[call-overload]
        model_fn = kwargs.get("model_fn") or (lambda: make_mlp(data.n_features, 64, data.n_classes))
        kwargs["model_fn"] = model_fn
        agg = FedGOAggregator(config, model_fn, unlabeled, seed=seed)  # type: ignore[arg-type]
        super().__init__(data, agg, **kwargs)  # type: ignore[arg-type]

    def pre_fl(self, generator: GaussianGenerator | None = None) -> GaussianGenerator:
        """The one-time stage: the generator (fitted on the server set, or from the clients' moments), then
        every client trains its discriminator against it and uploads it with its size."""
        agg: FedGOAggregator = self.aggregator  # type: ignore[assignment]
        if generator is None:
            generator = (
                GaussianGenerator().fit(agg.unlabeled)
                if agg.unlabeled is not None
                else GaussianGenerator().from_moments([client_moments(x) for x, _ in self.data.clients])
            )
        agg.pre_fl(generator)
        c = agg.config
        for cid, (x, _) in enumerate(self.data.clients):
            disc = None
            if c.weighting == "fedgo":
                disc = make_discriminator(x.shape[1], c.disc_hidden, seed=self.seed * 1000 + cid)
                train_discriminator(
                    disc,
                    x,
                    generator,
                    epochs=c.disc_epochs,
                    lr=c.disc_lr,
                    weight_decay=c.disc_weight_decay,
                    seed=self.seed * 1000 + cid,
                )
            agg.register_client(cid, x.shape[0], disc)
        return generator
