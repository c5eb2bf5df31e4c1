"""FedCEO (Clients Collaborate) — ICML 2025, P50: client-side code (model, local SGD / DP-SGD, upload).

Shared by the plain-python server and the Flower client app. A client receives a start state, runs local SGD
(optionally DP-SGD with per-sample clipping), and uploads its model, privatised with the user-level
Gaussian mechanism when ``dp.mode == "user"`` (:func:`icml25.federated.dp.privatize_update`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from icml25.federated.dp import DPConfig, dp_sgd_gradients_and_loss, privatize_update
from icml25.kernels.optim import Adam  # re-exported: FedGO's fits use it through this module
from icml25.kernels.rng import isolated_rng

__all__ = [
    "Adam",
    "ClientResult",
    "LocalTrainConfig",
    "client_update",
    "evaluate",
    "make_mlp",
    "seed_generator",
    "upload_noise_std",
]

State = dict[str, Tensor]


def make_mlp(
    n_in: int = 64,
    hidden: int = 64,
    n_out: int = 10,
    *,
    bias: bool = True,
    dropout: float = 0.0,
    seed: int | None = None,
) -> nn.Sequential:
    """Two-layer ReLU MLP ``n_in → hidden → n_out`` (keys ``0.weight``, ``0.bias``, ``2.weight``, ``2.bias``).

    With ``dropout > 0`` a ``nn.Dropout`` follows the ReLU (the official FedCEO MLP uses 0.5; the output
    layer's keys become ``3.weight``/``3.bias``). ``seed`` makes the initialisation reproducible without
    touching torch's global generator (:func:`icml25.kernels.rng.isolated_rng`); ``seed=None`` draws from
    the global generator, as every ``nn.Module`` constructor does.
    """
    for name, v in (("n_in", n_in), ("hidden", hidden), ("n_out", n_out)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")

    def build() -> nn.Sequential:
        layers: list[nn.Module] = [nn.Linear(n_in, hidden, bias=bias), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        return nn.Sequential(*layers, nn.Linear(hidden, n_out, bias=bias))

    if seed is None:
        return build()
    with isolated_rng(seed):
        return build()


_SAMPLING = ("shuffle", "poisson")


@dataclass(frozen=True)
class LocalTrainConfig:
    """Local training of one client per round: ``epochs`` passes of (momentum) SGD.

    Attributes:
        epochs: local epochs E.
        lr: learning rate.
        batch_size: batch size B.
        momentum: SGD momentum (the official FedCEO code uses 0.5).
        sampling: ``"shuffle"`` (a permutation per epoch cut into batches of B) or ``"poisson"`` (Opacus's
            DP data loader: ``⌈n/B⌉`` steps per epoch, each sample in a step's batch independently with
            probability ``q = 1/⌈n/B⌉``; DP-SGD then divides by the expected batch size ``q·n``).
    """

    epochs: int = 2
    lr: float = 0.05
    batch_size: int = 32
    momentum: float = 0.0
    sampling: str = "shuffle"

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.sampling not in _SAMPLING:
            raise ValueError(f"sampling must be one of {_SAMPLING}, got {self.sampling!r}")

    def steps(self, n_samples: int) -> int:
        """Number of SGD steps for a client with ``n_samples`` samples."""
        return self.epochs * math.ceil(n_samples / self.batch_size)

    def sample_rate(self, n_samples: int) -> float:
        """Probability that a given sample is in a step's batch (the DP-SGD accountant's q)."""
        if self.sampling == "poisson":
            return 1.0 / math.ceil(n_samples / self.batch_size)
        return min(1.0, self.batch_size / n_samples)


@dataclass
class ClientResult:
    """What a client returns after a round.

    Attributes:
        upload: the state sent to the server (privatised under user-level DP).
        clean: the same upload without the user-level noise (diagnostic only, used to measure denoising).
        num_examples: local dataset size.
        loss: mean training loss.
        steps: number of local SGD steps (for sample-level accounting).
        sample_rate: the probability that a given sample is in a step's batch (for sample-level accounting).
    """

    upload: State
    clean: State
    num_examples: int
    loss: float
    steps: int
    sample_rate: float


def seed_generator(*parts: int) -> torch.Generator:
    """A CPU generator seeded deterministically from integers (seed, round, client id, ...)."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h * 0x100000001B3 ^ (int(p) & 0xFFFFFFFFFFFF)) % (1 << 63)
    return torch.Generator().manual_seed(h)


def client_update(
    model: nn.Module,
    start: Mapping[str, Tensor],
    x: Tensor,
    y: Tensor,
    train: LocalTrainConfig,
    dp: DPConfig,
    generator: torch.Generator,
) -> ClientResult:
    """Train from ``start`` on ``(x [n, d], y [n])`` and build the upload.

    ``dp.mode == "sample"`` uses DP-SGD (per-sample clipping + noise,
    :func:`~icml25.federated.dp.dp_sgd_gradients`) for every step; ``dp.mode == "user"`` trains normally,
    then clips the update and adds noise. Every call starts a fresh optimiser (zero momentum), as the
    official code builds a new optimiser and privacy engine each round. Randomness (batches, noise, and
    dropout masks, drawn under a fork of torch's generator seeded from ``generator``) comes from
    ``generator`` only.
    """
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x must be [n, d] and y [n] with n >= 1, got {tuple(x.shape)} and {tuple(y.shape)}")
    model.load_state_dict(start)
    model.train()
    stochastic = any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())
    # dropout draws from torch's global generator: run it under a fork seeded from the client's generator
    fork = isolated_rng(int(torch.randint(2**62, (1,), generator=generator))) if stochastic else nullcontext()
    with fork:
        losses, steps = _local_sgd(model, x, y, train, dp, generator)
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    upload, clean = privatize_update(start, trained, dp, generator)
    n = x.shape[0]
    loss = sum(losses) / len(losses) if losses else math.nan
    return ClientResult(upload, clean, n, loss, steps, train.sample_rate(n))


def _local_sgd(
    model: nn.Module, x: Tensor, y: Tensor, train: LocalTrainConfig, dp: DPConfig, generator: torch.Generator
) -> tuple[list[float], int]:
    params = [p for p in model.parameters() if p.requires_grad]
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    # Plain (momentum) SGD written out: torch.optim would pull in torch._dynamo at import (slow, unused).
    bufs = [torch.zeros_like(p) for p in params]
    loss_fn = nn.functional.cross_entropy
    n, losses, steps = x.shape[0], [], 0
    poisson = train.sampling == "poisson"
    n_batches = math.ceil(n / train.batch_size)
    expected = train.sample_rate(n) * n if poisson else None
    for _ in range(train.epochs):
        if poisson:
            q = train.sample_rate(n)
            batches = [
                torch.nonzero(torch.rand(n, generator=generator) < q).squeeze(1) for _ in range(n_batches)
            ]
        else:
            perm = torch.randperm(n, generator=generator)
            batches = [perm[i : i + train.batch_size] for i in range(0, n, train.batch_size)]
        for idx in batches:
            xb, yb = x[idx], y[idx]
            if dp.mode == "sample":
                named, loss_value = dp_sgd_gradients_and_loss(
                    model, loss_fn, xb, yb, dp, generator, expected_batch_size=expected
                )
                grads = [named[k] for k in names]
            elif idx.numel() == 0:
                steps += 1  # an empty Poisson batch: nothing to learn from
                continue
            else:
                loss = loss_fn(model(xb), yb)
                grads = list(torch.autograd.grad(loss, params))
                loss_value = float(loss.detach())
            if not math.isnan(loss_value):
                losses.append(loss_value)
            with torch.no_grad():
                for p, g, b in zip(params, grads, bufs):
                    if train.momentum > 0:
                        b.mul_(train.momentum).add_(g)
                        g = b
                    p.sub_(train.lr * g)
            steps += 1
    return losses, steps


@torch.no_grad()
def evaluate(model: nn.Module, state: Mapping[str, Tensor], x: Tensor, y: Tensor) -> float:
    """Accuracy in [0, 1] of ``state`` on ``(x [n, d], y [n])`` (nan when n = 0)."""
    if x.shape[0] == 0:
        return float("nan")
    model.load_state_dict(state)
    model.eval()
    return float((model(x).argmax(-1) == y).float().mean())


def upload_noise_std(dp: DPConfig, train: LocalTrainConfig, n_examples: int) -> float:
    """Per-entry std of the DP noise carried by one upload (the scale FedCEO's threshold is tied to).

    * ``"none"``: 0.
    * ``"user"``: σC, added once to the clipped update (exact).
    * ``"sample"``: DP-SGD adds N(0, σ²C²)/B to each of the S mini-batch gradients (B: the batch size, or
      the expected batch size q·n under Poisson sampling); with learning rate
      η and momentum μ each noise draw reaches the weights with gain ≈ η/(1 − μ), so the upload
      carries ≈ σC·η·√S / (B(1 − μ)) (an estimate: it ignores the loss curvature's contraction).

    Args:
        dp: privacy mechanism.
        train: local training configuration.
        n_examples: the client's number of training samples.
    """
    if not isinstance(dp, DPConfig):
        raise TypeError(f"dp must be a DPConfig, got {type(dp).__name__}")
    if isinstance(n_examples, bool) or not isinstance(n_examples, int) or n_examples < 1:
        raise ValueError(f"n_examples must be an int >= 1, got {n_examples!r}")
    sigma_c = dp.noise_multiplier * dp.clip
    if dp.mode == "none":
        return 0.0
    if dp.mode == "user":
        return sigma_c
    steps = train.steps(n_examples)
    divisor = train.sample_rate(n_examples) * n_examples if train.sampling == "poisson" else train.batch_size
    return sigma_c * train.lr * math.sqrt(steps) / (divisor * (1.0 - train.momentum))
