"""Client-side code shared by the plain-python server and the Flower client: model, local SGD, upload.

Part of the FedCEO implementation (ICML 2025, P50). A client receives a start state, runs local SGD
(optionally DP-SGD with per-sample clipping), and uploads its model, privatised with the user-level
Gaussian mechanism when ``dp.mode == "user"`` (:func:`icml25.federated.dp.privatize_update`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from icml25.federated.dp import DPConfig, dp_sgd_gradients, privatize_update

__all__ = [
    "ClientResult",
    "LocalTrainConfig",
    "client_update",
    "evaluate",
    "make_mlp",
    "seed_generator",
    "upload_noise_std",
]

State = dict[str, Tensor]


def make_mlp(n_in: int = 64, hidden: int = 64, n_out: int = 10, *, bias: bool = True) -> nn.Sequential:
    """Two-layer ReLU MLP ``n_in → hidden → n_out`` (keys ``0.weight``, ``0.bias``, ``2.weight``, ``2.bias``)."""
    for name, v in (("n_in", n_in), ("hidden", hidden), ("n_out", n_out)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    return nn.Sequential(nn.Linear(n_in, hidden, bias=bias), nn.ReLU(), nn.Linear(hidden, n_out, bias=bias))


@dataclass(frozen=True)
class LocalTrainConfig:
    """Local training of one client per round: ``epochs`` passes of SGD with the given batch size."""

    epochs: int = 2
    lr: float = 0.05
    batch_size: int = 32
    momentum: float = 0.0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")

    def steps(self, n_samples: int) -> int:
        """Number of SGD steps for a client with ``n_samples`` samples."""
        return self.epochs * math.ceil(n_samples / self.batch_size)


@dataclass
class ClientResult:
    """What a client returns after a round.

    Attributes:
        upload: the state sent to the server (privatised under user-level DP).
        clean: the same upload without the user-level noise (diagnostic only, used to measure denoising).
        num_examples: local dataset size.
        loss: mean training loss.
        steps: number of local SGD steps (for sample-level accounting).
    """

    upload: State
    clean: State
    num_examples: int
    loss: float
    steps: int


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

    ``dp.mode == "sample"`` uses DP-SGD (per-sample clipping + noise) for every step;
    ``dp.mode == "user"`` trains normally, then clips the update and adds noise.
    """
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x must be [n, d] and y [n] with n >= 1, got {tuple(x.shape)} and {tuple(y.shape)}")
    model.load_state_dict(start)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    # Plain (momentum) SGD written out: torch.optim would pull in torch._dynamo at import (slow, unused).
    bufs = [torch.zeros_like(p) for p in params]
    loss_fn = nn.functional.cross_entropy
    n, losses, steps = x.shape[0], [], 0
    for _ in range(train.epochs):
        perm = torch.randperm(n, generator=generator)
        for i in range(0, n, train.batch_size):
            idx = perm[i : i + train.batch_size]
            xb, yb = x[idx], y[idx]
            if dp.mode == "sample":
                named = dp_sgd_gradients(model, loss_fn, xb, yb, dp, generator)
                grads = [named[k] for k, p in model.named_parameters() if p.requires_grad]
                with torch.no_grad():
                    losses.append(float(loss_fn(model(xb), yb)))
            else:
                loss = loss_fn(model(xb), yb)
                grads = torch.autograd.grad(loss, params)
                losses.append(float(loss.detach()))
            with torch.no_grad():
                for p, g, b in zip(params, grads, bufs):
                    if train.momentum > 0:
                        b.mul_(train.momentum).add_(g)
                        g = b
                    p.sub_(train.lr * g)
            steps += 1
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    upload, clean = privatize_update(start, trained, dp, generator)
    return ClientResult(upload, clean, n, sum(losses) / len(losses), steps)


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
    * ``"sample"``: DP-SGD adds N(0, σ²C²)/B to each of the S mini-batch gradients; with learning rate
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
    return sigma_c * train.lr * math.sqrt(steps) / (train.batch_size * (1.0 - train.momentum))
