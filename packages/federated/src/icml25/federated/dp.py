"""FedCEO (Clients Collaborate) — ICML 2025, P50: differential privacy for the clients (clipping, noise, RDP).

Part of the FedCEO implementation (Li et al., "Clients Collaborate: Flexible Differentially Private Federated
Learning with Guaranteed Improvement of Utility-Privacy Trade-off"), reusable by any federated method in
this package.

Two mechanisms (``DPConfig.mode``):

* ``"user"`` — user-level: the client clips its model update Δ to L2 norm C (over all parameters jointly)
  and adds N(0, σ²C²I) before uploading. Each upload is a Gaussian mechanism with noise multiplier σ
  with respect to the whole client dataset.
* ``"sample"`` — sample-level DP-SGD inside local training: per-sample gradients (``torch.func``),
  each clipped to C, summed, plus N(0, σ²C²I), divided by the batch size. The official FedCEO code does
  this with Opacus, with a fresh PrivacyEngine every round and no accounting across rounds.

:class:`RDPAccountant` composes Rényi DP of the (Poisson-)subsampled Gaussian mechanism (Mironov, Talwar
& Zhang 2019, integer orders) and converts to (ε, δ) with the conversion of Balle et al. 2020 (the one
Opacus uses).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from icml25.kernels.checks import check_tensor

__all__ = [
    "DEFAULT_ORDERS",
    "DPConfig",
    "FederatedPrivacyLedger",
    "RDPAccountant",
    "add_gaussian_noise",
    "clip_update",
    "dp_sgd_gradients",
    "dp_sgd_gradients_and_loss",
    "per_sample_clipped_sum",
    "privatize_update",
    "rdp_subsampled_gaussian",
    "rdp_to_epsilon",
]

State = dict[str, Tensor]
_MODES = ("none", "user", "sample")


@dataclass(frozen=True)
class DPConfig:
    """Privacy mechanism of a federated run.

    Attributes:
        mode: ``"none"``, ``"user"`` (clip + noise the client update) or ``"sample"`` (DP-SGD).
        noise_multiplier: σ ≥ 0; the noise std is σ·C.
        clip: C > 0, the L2 bound on the update (user) or on each per-sample gradient (sample).
        delta: δ of the reported (ε, δ).
    """

    mode: str = "none"
    noise_multiplier: float = 0.0
    clip: float = 1.0
    delta: float = 1e-5

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {self.mode!r}")
        _check_nonneg("noise_multiplier", self.noise_multiplier)
        if not _is_real(self.clip) or not (self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError(f"clip must be a finite number > 0, got {self.clip!r}")
        if not _is_real(self.delta) or not (0 < self.delta < 1):
            raise ValueError(f"delta must be a number in (0, 1), got {self.delta!r}")

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_nonneg(name: str, x: object) -> None:
    if not _is_real(x) or not (x >= 0 and math.isfinite(x)):  # type: ignore[operator]
        raise ValueError(f"{name} must be a finite number >= 0, got {x!r}")


# --------------------------------------------------------------------------------------------------
# User-level mechanism
# --------------------------------------------------------------------------------------------------


def _float_keys(state: Mapping[str, Tensor]) -> list[str]:
    return [k for k, v in state.items() if v.is_floating_point()]


def clip_update(delta: Mapping[str, Tensor], clip: float) -> tuple[State, float]:
    """Scale an update so that its global L2 norm (all float tensors jointly) is at most ``clip``.

    Returns:
        ``(clipped update, norm before clipping)``.
    """
    if not _is_real(clip) or not clip > 0:
        raise ValueError(f"clip must be a number > 0, got {clip!r}")
    keys = _float_keys(delta)
    for k in keys:
        if not bool(torch.isfinite(delta[k]).all()):
            raise ValueError(
                f"delta[{k!r}] must be finite, got NaN/Inf entries in shape {tuple(delta[k].shape)}"
            )
    norm = math.sqrt(sum(float(delta[k].double().pow(2).sum()) for k in keys))
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return {k: (v * scale if k in keys else v.clone()) for k, v in delta.items()}, norm


def add_gaussian_noise(state: Mapping[str, Tensor], std: float, generator: torch.Generator) -> State:
    """Add i.i.d. N(0, std²) to every float tensor (in key order, so a seeded generator is reproducible)."""
    _check_nonneg("std", std)
    out: State = {}
    for k, v in state.items():
        if v.is_floating_point() and std > 0:
            noise = torch.randn(v.shape, generator=generator, dtype=v.dtype, device=v.device)
            out[k] = v + std * noise
        else:
            out[k] = v.clone()
    return out


def privatize_update(
    start: Mapping[str, Tensor], trained: Mapping[str, Tensor], config: DPConfig, generator: torch.Generator
) -> tuple[State, State]:
    """User-level Gaussian mechanism on a client's update.

    ``upload = start + clip(trained − start, C) + N(0, σ²C²I)`` when ``config.mode == "user"``;
    otherwise ``upload = trained`` (sample-level noise, if any, was added during training).

    Returns:
        ``(upload, noise-free upload)``; the second is a diagnostic (same update without noise),
        never sent anywhere.
    """
    if config.mode != "user":
        clean = {k: v.clone() for k, v in trained.items()}
        return clean, clean
    delta = {k: trained[k] - start[k] if trained[k].is_floating_point() else trained[k] for k in trained}
    clipped, _ = clip_update(delta, config.clip)
    clean = {
        k: start[k] + clipped[k] if trained[k].is_floating_point() else trained[k].clone() for k in trained
    }
    noisy = add_gaussian_noise(clean, config.noise_multiplier * config.clip, generator)
    return noisy, clean


# --------------------------------------------------------------------------------------------------
# Sample-level mechanism (DP-SGD with per-sample gradients)
# --------------------------------------------------------------------------------------------------


_ELEMENTWISE = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.Dropout,
    nn.Identity,
    nn.Flatten,
)
_METHODS = ("auto", "linear", "vmap")


def _linear_stack(model: nn.Module) -> list[nn.Linear] | None:
    """The ``nn.Linear`` layers of an ``nn.Sequential`` made only of Linear layers and per-sample
    (elementwise or flattening) modules, else ``None``: there, per-sample gradients have a closed form."""
    if not isinstance(model, nn.Sequential):
        return None
    linears = []
    for mod in model:
        if isinstance(mod, nn.Linear):
            linears.append(mod)
        elif not isinstance(mod, _ELEMENTWISE) or any(True for _ in mod.parameters()):
            return None
    return linears or None


def _clipped_sum_linear(
    model: nn.Module,
    linears: list[nn.Linear],
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    clip: float,
) -> tuple[dict[str, Tensor], Tensor, float] | None:
    """Closed-form per-sample clipping for a stack of Linear layers (``None`` if an input is not 2-D).

    The per-sample gradient of ``W`` is ``δ_i a_iᵀ`` (δ: gradient of sample i's loss with respect to the
    layer's output, a: its input), so ``‖g_i‖² = Σ_layers ‖δ_i‖²‖a_i‖² (+ ‖δ_i‖² for a bias)`` and the
    clipped sum is ``Σ_i c_i δ_i a_iᵀ = (c ⊙ δ)ᵀ a``: two matrix products per layer, no per-sample tensor.
    """
    inputs: dict[int, Tensor] = {}
    outputs: dict[int, Tensor] = {}

    def hook(mod: nn.Module, inp: tuple[Tensor, ...], out: Tensor) -> None:
        inputs[id(mod)], outputs[id(mod)] = inp[0], out

    handles = [m.register_forward_hook(hook) for m in linears]
    try:
        with torch.enable_grad():
            logits = model(x)
            loss = loss_fn(logits, y)
            if any(inputs[id(m)].ndim != 2 for m in linears):
                return None
            b = x.shape[0]
            # losses average over the batch: b * loss is the sum of the per-sample losses, and sample i's
            # loss depends on sample i only, so d(sum)/d(out_i) is sample i's own δ_i.
            deltas = torch.autograd.grad(loss * b, [outputs[id(m)] for m in linears])
    finally:
        for h in handles:
            h.remove()
    sq = torch.zeros(x.shape[0], dtype=logits.dtype)
    for m, d in zip(linears, deltas):
        d2 = d.pow(2).sum(1)
        sq = sq + d2 * inputs[id(m)].pow(2).sum(1)
        if m.bias is not None:
            sq = sq + d2
    norms = sq.sqrt()
    factor = torch.clamp(clip / (norms + 1e-6), max=1.0)  # Opacus's clip factor
    names = {id(p): k for k, p in model.named_parameters()}
    sums: dict[str, Tensor] = {}
    for m, d in zip(linears, deltas):
        scaled = d * factor[:, None]
        sums[names[id(m.weight)]] = (scaled.T @ inputs[id(m)]).detach()
        if m.bias is not None:
            sums[names[id(m.bias)]] = scaled.sum(0).detach()
    order = [k for k, p in model.named_parameters() if p.requires_grad]
    return {k: sums[k] for k in order}, norms.detach(), float(loss.detach())


def _clipped_sum_vmap(
    model: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor, clip: float
) -> tuple[dict[str, Tensor], Tensor, float]:
    """Per-sample gradients from ``torch.func.vmap(grad(...))``, clipped and summed (any model)."""
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def sample_loss(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0), randomness="different")(params, x, y)
    b = x.shape[0]
    norms = torch.sqrt(sum(g.reshape(b, -1).pow(2).sum(1) for g in per_sample.values()))  # [B]
    factor = torch.clamp(clip / (norms + 1e-6), max=1.0)
    sums = {k: (g * factor.view(b, *([1] * (g.ndim - 1)))).sum(0) for k, g in per_sample.items()}
    with torch.no_grad():
        loss = float(loss_fn(model(x), y))
    return sums, norms, loss


def per_sample_clipped_sum(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    clip: float,
    *,
    method: str = "auto",
) -> tuple[dict[str, Tensor], Tensor]:
    """``Σ_i clip_C(∇ℓ_i)`` over a batch, and the per-sample gradient norms ``‖∇ℓ_i‖`` (before clipping).

    Each per-sample gradient (over all trainable parameters jointly) is scaled by
    ``min(1, C / (‖∇ℓ_i‖ + 1e-6))`` (Opacus's factor) and the scaled gradients are summed.

    Args:
        model: the module; its parameters are read, not modified.
        loss_fn: ``loss_fn(logits [B, K], y [B]) -> scalar``, the **mean** over the batch of per-sample
            losses (the default reduction of torch's losses); no sample may influence another's loss.
        x: ``[B, ...]`` inputs; y: ``[B]`` targets (B >= 1).
        clip: C > 0.
        method: ``"vmap"`` (``torch.func.vmap(grad(...))``: per-sample gradients materialised, any model),
            ``"linear"`` (closed form for an ``nn.Sequential`` of ``nn.Linear`` layers and elementwise
            modules: ``δ_i a_iᵀ``, no per-sample tensors, about as fast as plain backpropagation), or
            ``"auto"`` (``"linear"`` when the model qualifies, else ``"vmap"``). Both give the same result.

    Returns:
        ``({param name: clipped sum}, norms [B])`` for every trainable parameter.
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if not isinstance(clip, (int, float)) or isinstance(clip, bool) or not (clip > 0 and math.isfinite(clip)):
        raise ValueError(f"clip must be a finite number > 0, got {clip!r}")
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(
            f"x must be a floating-point tensor [B, ...], got {getattr(x, 'dtype', type(x).__name__)}"
        )
    if not isinstance(y, Tensor) or y.is_floating_point() or y.is_complex():
        raise TypeError(
            f"y must be an integer tensor of class ids [B], got {getattr(y, 'dtype', type(y).__name__)}"
        )
    if x.ndim < 2 or x.numel() == 0 or tuple(y.shape) != (x.shape[0],):
        raise ValueError(
            f"x must be a non-empty [B, ...] batch and y [B] (B >= 1), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    check_tensor(x, "x", dtype=None)
    try:
        sums, norms, _ = _clipped_sum(model, loss_fn, x, y, float(clip), method)
    except (RuntimeError, IndexError) as err:
        raise ValueError(
            f"x of shape {tuple(x.shape)} and y of shape {tuple(y.shape)} do not fit the model: {err}"
        ) from None
    if not bool(torch.isfinite(norms).all()):
        raise ValueError(
            "the per-sample gradients are not finite (inputs too large for the model?): "
            f"max |x| = {float(x.abs().max()):.3g}"
        )
    return sums, norms


def _clipped_sum(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    clip: float,
    method: str,
) -> tuple[dict[str, Tensor], Tensor, float]:
    linears = _linear_stack(model) if method != "vmap" else None
    if method == "linear" and linears is None:
        raise ValueError(
            "method='linear' needs an nn.Sequential of nn.Linear layers and elementwise modules, got "
            f"{type(model).__name__}; use method='vmap'"
        )
    if linears is not None:
        out = _clipped_sum_linear(model, linears, loss_fn, x, y, clip)
        if out is not None:
            return out
        if method == "linear":
            raise ValueError("method='linear' needs 2-D inputs to every nn.Linear layer; use method='vmap'")
    return _clipped_sum_vmap(model, loss_fn, x, y, clip)


def dp_sgd_gradients(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    config: DPConfig,
    generator: torch.Generator,
    *,
    expected_batch_size: float | None = None,
    method: str = "auto",
) -> dict[str, Tensor]:
    """Privatised mini-batch gradient ``(Σ_i clip_C(∇ℓ_i) + N(0, σ²C²I)) / B`` (DP-SGD).

    ``B`` is the batch size, or ``expected_batch_size`` under Poisson sampling (``q·n``, as Opacus divides
    by it); an empty Poisson batch yields noise only. The per-sample clipping is
    :func:`per_sample_clipped_sum` (``method`` as there).

    Args:
        model: the module; its parameters are read, not modified.
        loss_fn: ``loss_fn(logits [B, K], y [B]) -> scalar``, the mean over the batch.
        x: ``[B, ...]`` inputs; y: ``[B]`` targets.
        config: clip and noise multiplier.
        generator: noise source.
        expected_batch_size: the divisor under Poisson sampling (default: ``B``).
        method: per-sample gradient method.

    Returns:
        ``{param name: gradient}`` for every trainable parameter.
    """
    return dp_sgd_gradients_and_loss(
        model, loss_fn, x, y, config, generator, expected_batch_size=expected_batch_size, method=method
    )[0]


def dp_sgd_gradients_and_loss(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    config: DPConfig,
    generator: torch.Generator,
    *,
    expected_batch_size: float | None = None,
    method: str = "auto",
) -> tuple[dict[str, Tensor], float]:
    """:func:`dp_sgd_gradients` and the batch's mean (unclipped) loss, from the same per-sample pass.

    A DP-SGD training loop logs the loss without a second forward pass (the local loop of
    :func:`icml25.federated.training.client_update` does). Arguments as :func:`dp_sgd_gradients`.

    Returns:
        ``({param name: gradient}, mean loss)``; the loss is nan for an empty Poisson batch.
    """
    b = x.shape[0]
    denom = float(expected_batch_size) if expected_batch_size is not None else float(b)
    if not denom > 0:
        raise ValueError(f"expected_batch_size must be > 0 (or the batch non-empty), got {denom!r}")
    if b > 0:
        sums, _, loss = _clipped_sum(model, loss_fn, x, y, config.clip, method)
    else:
        sums = {k: torch.zeros_like(p) for k, p in model.named_parameters() if p.requires_grad}
        loss = math.nan
    std = config.noise_multiplier * config.clip
    out = {}
    for k, summed in sums.items():
        noise = torch.randn(summed.shape, generator=generator, dtype=summed.dtype) * std
        out[k] = (summed + noise) / denom
    return out, loss


# --------------------------------------------------------------------------------------------------
# Rényi DP accountant
# --------------------------------------------------------------------------------------------------

DEFAULT_ORDERS: tuple[float, ...] = (*range(2, 64), 80, 96, 128, 192, 256, 384, 512)


def _log_add(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    hi, lo = max(a, b), min(a, b)
    return hi + math.log1p(math.exp(lo - hi))


def _log_a_int(q: float, sigma: float, alpha: int) -> float:
    """log E[(μ_1/μ_0)^α] of the sampled Gaussian for integer α (binomial expansion, Mironov et al. 2019)."""
    log_a = -math.inf
    for k in range(alpha + 1):
        log_binom = math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
        term = log_binom + k * math.log(q) + (alpha - k) * math.log1p(-q) + (k * k - k) / (2 * sigma**2)
        log_a = _log_add(log_a, term)
    return log_a


def rdp_subsampled_gaussian(
    sample_rate: float, noise_multiplier: float, orders: Sequence[float]
) -> list[float]:
    """RDP ε(α) of one step of the Poisson-subsampled Gaussian mechanism (sensitivity 1, std σ).

    ``sample_rate == 1`` is the plain Gaussian mechanism, ``α / (2σ²)`` for any real α > 1. For
    ``0 < q < 1`` only integer orders are supported (the exact binomial formula); other orders get +inf,
    which the ε conversion ignores.
    """
    if not _is_real(sample_rate) or not 0 <= sample_rate <= 1:
        raise ValueError(f"sample_rate must be a number in [0, 1], got {sample_rate!r}")
    _check_nonneg("noise_multiplier", noise_multiplier)
    out = []
    for a in orders:
        if not _is_real(a) or not a > 1:
            raise ValueError(f"orders must be numbers > 1, got {a!r}")
        if sample_rate == 0:
            out.append(0.0)
        elif noise_multiplier == 0:
            out.append(math.inf)
        elif sample_rate == 1:
            out.append(a / (2 * noise_multiplier**2))
        elif float(a).is_integer():
            out.append(_log_a_int(sample_rate, noise_multiplier, int(a)) / (a - 1))
        else:
            out.append(math.inf)
    return out


def rdp_to_epsilon(orders: Sequence[float], rdp: Sequence[float], delta: float) -> tuple[float, float]:
    """(ε, best order) from RDP values: ``min_α rdp(α) + log((α−1)/α) − (log δ + log α)/(α − 1)``.

    This is Proposition 12 of Canonne, Kamath & Steinke (2020) / Balle et al. (2020), as in Opacus.
    """
    if not _is_real(delta) or not 0 < delta < 1:
        raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
    if len(orders) != len(rdp):
        raise ValueError(f"orders and rdp must have the same length, got {len(orders)} and {len(rdp)}")
    if all(r == 0 for r in rdp):
        return 0.0, math.nan  # nothing released yet
    best, best_order = math.inf, math.nan
    for a, r in zip(orders, rdp):
        if not math.isfinite(r):
            continue
        eps = r - (math.log(delta) + math.log(a)) / (a - 1) + math.log((a - 1) / a)
        if eps < best:
            best, best_order = eps, float(a)
    return max(best, 0.0), best_order


class RDPAccountant:
    """Composes RDP of subsampled Gaussian steps; reports (ε, δ).

    Example::

        acc = RDPAccountant()
        acc.step(noise_multiplier=1.1, sample_rate=256 / 60000, num_steps=14060)
        eps = acc.get_epsilon(delta=1e-5)
    """

    def __init__(self, orders: Sequence[float] = DEFAULT_ORDERS) -> None:
        if len(orders) == 0:
            raise ValueError("orders must be a non-empty list of numbers > 1, got []")
        self.orders = tuple(float(a) for a in orders)
        self._rdp = [0.0] * len(self.orders)
        self.history: list[tuple[float, float, int]] = []

    def step(self, noise_multiplier: float, sample_rate: float = 1.0, num_steps: int = 1) -> None:
        """Record ``num_steps`` applications of the Gaussian mechanism (std σ·sensitivity), subsampled at q."""
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 0:
            raise ValueError(f"num_steps must be an int >= 0, got {num_steps!r}")
        per_step = rdp_subsampled_gaussian(sample_rate, noise_multiplier, self.orders)
        self._rdp = [r + num_steps * s for r, s in zip(self._rdp, per_step)]
        self.history.append((float(noise_multiplier), float(sample_rate), num_steps))

    @property
    def rdp(self) -> list[float]:
        """Accumulated RDP ε(α) at ``self.orders``."""
        return list(self._rdp)

    def get_epsilon(self, delta: float) -> float:
        """ε of the composition so far at the given δ (0 before any step)."""
        return rdp_to_epsilon(self.orders, self._rdp, delta)[0]

    def get_privacy_spent(self, delta: float) -> tuple[float, float]:
        """``(ε, best order)``."""
        return rdp_to_epsilon(self.orders, self._rdp, delta)


class FederatedPrivacyLedger:
    """Per-client privacy bookkeeping of a federated run; ε is the worst client's.

    Participation is known to the server, so each client's guarantee composes only over the rounds it
    took part in. Two views:

    * :meth:`epsilon` — against the server, which sees every upload. ``"user"``: one Gaussian mechanism
      with multiplier σ per participation (no subsampling amplification). ``"sample"``: the client's
      DP-SGD steps with sampling rate B/n_k (shuffled batches accounted as Poisson sampling, the usual
      approximation).
    * :meth:`epsilon_aggregate` (``"user"`` only) — against observers of the global models only: the sum
      of m uploads carries noise σ√m·C for sensitivity C, clients sampled at rate q = m/N (Poisson
      approximation of fixed-size sampling, as in DP-FedAvg).

    FedCEO's smoothing is post-processing and does not enter either.
    """

    def __init__(
        self, dp: DPConfig, n_clients: int, clients_per_round: int, orders: Sequence[float] = DEFAULT_ORDERS
    ):
        if not isinstance(dp, DPConfig):
            raise TypeError(f"dp must be a DPConfig, got {type(dp).__name__}")
        if not 1 <= clients_per_round <= n_clients:
            raise ValueError(
                f"clients_per_round must be in [1, n_clients={n_clients}], got {clients_per_round}"
            )
        self.dp, self.n_clients, self.m = dp, n_clients, clients_per_round
        self.orders = tuple(float(a) for a in orders)
        self._client_rdp: dict[object, list[float]] = {}
        self._aggregate = RDPAccountant(self.orders)
        self._cache: dict[tuple[float, float], list[float]] = {}
        self.rounds = 0

    def _per_step(self, sigma: float, q: float) -> list[float]:
        key = (sigma, q)
        if key not in self._cache:
            self._cache[key] = rdp_subsampled_gaussian(q, sigma, self.orders)
        return self._cache[key]

    def record_round(self, participants: Mapping[object, tuple[int, float]]) -> None:
        """Record one round: ``{client_id: (local DP-SGD steps, their sampling rate B/n_k)}``.

        Under ``"user"`` DP the step counts are ignored (one Gaussian release per participant).
        """
        self.rounds += 1
        if not self.dp.enabled:
            return
        sigma = self.dp.noise_multiplier
        for cid, (steps, q) in participants.items():
            if self.dp.mode == "user":
                add = self._per_step(sigma, 1.0)
            else:
                add = [steps * r for r in self._per_step(sigma, min(1.0, float(q)))]
            acc = self._client_rdp.setdefault(cid, [0.0] * len(self.orders))
            self._client_rdp[cid] = [a + b for a, b in zip(acc, add)]
        if self.dp.mode == "user":
            self._aggregate.step(sigma * math.sqrt(self.m), self.m / self.n_clients, 1)

    def epsilon(self) -> float:
        """Worst-client ε at ``dp.delta`` (inf when DP is off or σ = 0, 0 before the first round)."""
        if self.rounds == 0:
            return 0.0
        if not self.dp.enabled:
            return math.inf
        eps = [rdp_to_epsilon(self.orders, r, self.dp.delta)[0] for r in self._client_rdp.values()]
        return max(eps, default=0.0)

    def epsilon_aggregate(self) -> float:
        """ε against observers of the global models (user-level mode), nan otherwise."""
        if self.dp.mode != "user":
            return math.nan
        return self._aggregate.get_epsilon(self.dp.delta)
