"""Thermalizer: Stable autoregressive neural emulation of spatiotemporal chaos — ICML 2025, P02: the thermalizer model (DDPM + noise-level classifier).

:class:`Thermalizer` is a DDPM trained on clean snapshots of the invariant measure μ whose level head
classifies the noise level of its input; :meth:`Thermalizer.denoise` is the heterogeneous reverse chain that
the thermalized rollout (:func:`icml25.generative_models.thermalizer.thermalized_rollout`) runs. The schedule
conventions are those of :mod:`icml25.generative_models.thermalizer`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.experiment import progress as progress_bar
from icml25.kernels.rng import make_generator

__all__ = ["Thermalizer", "cosine_beta_schedule"]


# ----------------------------------------------------------------------------------------------------------
# Noise schedule
# ----------------------------------------------------------------------------------------------------------


def cosine_beta_schedule(T: int, s: float = 0.008, max_beta: float = 0.999) -> Tensor:
    """Cosine schedule of Nichol & Dhariwal (2021), as used by the Thermalizer.

    Args:
        T: number of noise levels.
        s: offset that keeps β small near level 0.
        max_beta: clip of β (prevents the singular β = 1 at the last level).

    Returns:
        betas, float64 tensor of shape ``(T,)`` with ``β_k = min(1 − f(k+1)/f(k), max_beta)``.
    """
    T = check_int(T, "T", low=2)
    s = check_float(s, "s", low=0.0)
    max_beta = check_float(max_beta, "max_beta", low=0.0, high=1.0)
    t = torch.arange(T + 1, dtype=torch.float64)
    f = torch.cos(((t / T + s) / (1.0 + s)) * math.pi / 2.0) ** 2
    return torch.clamp(1.0 - f[1:] / f[:-1], 0.0, max_beta)


def _linear_beta_schedule(T: int) -> Tensor:
    # Ho et al. (2020), rescaled so that T levels span the same total noise as their T = 1000 schedule.
    scale = 1000.0 / T
    return torch.linspace(scale * 1e-4, min(scale * 0.02, 0.999), T, dtype=torch.float64)


def _expand(coef: Tensor, like: Tensor) -> Tensor:
    """Index-gathered per-element coefficient ``(B,)`` reshaped to broadcast against ``(B, *event)``."""
    return coef.reshape(coef.shape[0], *([1] * (like.dim() - 1))).to(like.dtype)


# ----------------------------------------------------------------------------------------------------------
# Thermalizer: DDPM ε-network + noise-level classifier
# ----------------------------------------------------------------------------------------------------------


def _head_classes(level_head: nn.Module) -> int | None:
    """The class count of a head whose last registered leaf module is an ``nn.Linear`` (else None)."""
    leaves = [m for m in level_head.modules() if not any(True for _ in m.children())]
    return leaves[-1].out_features if leaves and isinstance(leaves[-1], nn.Linear) else None


class Thermalizer(nn.Module):
    """DDPM on the invariant measure with a noise-level classifier head.

    Args:
        eps_net: ε-predictor on normalised states; called ``eps_net(x_k)`` (paper: no level input) or
            ``eps_net(x_k, k)`` when ``time_conditioned``. Output shape = input shape ``(B, *event)``.
        level_head: classifier ``(B, *event) -> (B, T)`` logits over noise levels. It may share modules
            with ``eps_net`` (e.g. a U-Net bottleneck); parameters are deduplicated by the optimiser.
        T: number of diffusion levels.
        schedule: ``"cosine"`` (paper), ``"linear"``, or a tensor of T betas (e.g. a diffusers
            ``DDPMScheduler(...).betas``).
        lambda_cls: weight of the cross-entropy term in :meth:`loss`.
        time_conditioned: whether ``eps_net`` takes the level as a second argument.
        mean_free: diffuse within the zero-mean subspace of the last axis: every Gaussian draw and ε̂ are
            projected to zero spatial mean, so denoising from level k to ``stop`` only rescales a state's
            (normalised) mean by ``sqrt(ᾱ_stop)`` ≈ 1. Use it when the system conserves its spatial mean
            (KS): μ then lives on that subspace, and an unconstrained ε̂ lets the mean random-walk over
            thousands of thermalizations.
        field_mean, field_std: normalisation of physical states (set from data by :meth:`fit`).
    """

    def __init__(
        self,
        eps_net: nn.Module,
        level_head: nn.Module,
        T: int = 1000,
        schedule: str | Tensor = "cosine",
        lambda_cls: float = 1.0,
        time_conditioned: bool = False,
        mean_free: bool = False,
        field_mean: float = 0.0,
        field_std: float = 1.0,
    ):
        super().__init__()
        for name, mod in (("eps_net", eps_net), ("level_head", level_head)):
            if not isinstance(mod, nn.Module):
                raise TypeError(f"{name} must be an nn.Module, got {type(mod).__name__}")
        T = check_int(T, "T", low=2)  # the number of diffusion levels
        n_classes = _head_classes(level_head)
        if n_classes is not None and n_classes != T:
            raise ValueError(
                f"level_head must output T={T} logits (one per noise level), but its last layer is "
                f"nn.Linear(..., out_features={n_classes})"
            )
        if isinstance(schedule, Tensor):
            betas = schedule.detach().to(torch.float64).flatten()
            if betas.numel() != T or not bool(((betas > 0) & (betas < 1)).all()):
                raise ValueError(
                    f"schedule tensor must hold T={T} betas in (0, 1), got shape {tuple(betas.shape)}"
                )
        elif schedule == "cosine":
            betas = cosine_beta_schedule(T)
        elif schedule == "linear":
            betas = _linear_beta_schedule(T)
        else:
            raise ValueError(f"schedule must be 'cosine', 'linear' or a tensor of betas, got {schedule!r}")
        lambda_cls = check_float(lambda_cls, "lambda_cls", low=0.0)
        self.eps_net = eps_net
        self.level_head = level_head
        self.T = T
        self.lambda_cls = float(lambda_cls)
        self.time_conditioned = bool(time_conditioned)
        self.mean_free = bool(mean_free)
        alphas = 1.0 - betas
        alpha_bar = torch.cumprod(alphas, 0)
        alpha_bar_prev = torch.cat([torch.ones(1, dtype=torch.float64), alpha_bar[:-1]])
        # Posterior std of q(x_{k-1} | x_k, x_0); zero at k = 0 where the step returns the clean estimate.
        post_var = betas * (1.0 - alpha_bar_prev) / (1.0 - alpha_bar)
        post_var[0] = 0.0
        for name, val in {
            "betas": betas,
            "alphas": alphas,
            "alpha_bar": alpha_bar,
            "alpha_bar_prev": alpha_bar_prev,
            "posterior_std": post_var.sqrt(),
        }.items():
            self.register_buffer(name, val.float())
        self.register_buffer("field_mean", torch.tensor(check_float(field_mean, "field_mean")))
        self.register_buffer(
            "field_std", torch.tensor(check_float(field_std, "field_std", low=0.0, low_open=True))
        )

    # -- units ---------------------------------------------------------------------------------------------
    def normalize(self, x: Tensor) -> Tensor:
        return (x - self.field_mean) / self.field_std

    def denormalize(self, x: Tensor) -> Tensor:
        return x * self.field_std + self.field_mean

    # -- DDPM formulas (normalised units) ------------------------------------------------------------------
    def q_sample(self, x0: Tensor, k: Tensor, noise: Tensor) -> Tensor:
        """Forward process ``x_k = sqrt(ᾱ_k)·x0 + sqrt(1 − ᾱ_k)·ε``; ``x0``, ``noise``: ``(B, *event)``."""
        ab = self.alpha_bar[k]
        return _expand(ab.sqrt(), x0) * x0 + _expand((1.0 - ab).sqrt(), x0) * noise

    def posterior(self, x0: Tensor, xk: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Closed-form ``q(x_{k−1} | x_k, x_0)``: mean ``(B, *event)`` and std ``(B, 1, ...)``."""
        ab, abp, beta, alpha = self.alpha_bar[k], self.alpha_bar_prev[k], self.betas[k], self.alphas[k]
        c0 = beta * abp.sqrt() / (1.0 - ab)
        ck = (1.0 - abp) * alpha.sqrt() / (1.0 - ab)
        return _expand(c0, x0) * x0 + _expand(ck, xk) * xk, _expand(self.posterior_std[k], xk)

    def predict_eps(self, xk: Tensor, k: Tensor) -> Tensor:
        """ε̂(x_k) on normalised states; ``k`` (``(B,)``) is passed only to a time-conditioned net."""
        eps = self.eps_net(xk, k) if self.time_conditioned else self.eps_net(xk)
        return self.project(eps)

    def project(self, x: Tensor) -> Tensor:
        """Remove the mean over the last axis when ``mean_free`` (identity otherwise)."""
        return x - x.mean(-1, keepdim=True) if self.mean_free else x

    def reverse_step(self, xk: Tensor, k: Tensor, z: Tensor) -> Tensor:
        """One ancestral step ``x_k -> x_{k−1}`` (normalised units); ``z`` is the injected N(0, I) draw."""
        eps = self.predict_eps(xk, k)
        beta, alpha, ab = self.betas[k], self.alphas[k], self.alpha_bar[k]
        mean = (xk - _expand(beta / (1.0 - ab).sqrt(), xk) * eps) / _expand(alpha.sqrt(), xk)
        return mean + _expand(self.posterior_std[k], xk) * z

    # -- classifier ----------------------------------------------------------------------------------------
    def _check_logits(self, logits: Tensor, b: int) -> Tensor:
        if not isinstance(logits, Tensor) or tuple(logits.shape) != (b, self.T):
            got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise ValueError(f"level_head must return logits of shape (B, T) = ({b}, {self.T}), got {got}")
        return logits

    def level_logits(self, x: Tensor) -> Tensor:
        """Logits ``(B, T)`` of the noise level of physical states ``x`` ``(B, *event)``.

        A state shape that ``level_head`` cannot take (before :meth:`fit` fixes the event shape) is a
        ``ValueError`` naming ``x``."""
        try:
            logits = self.level_head(self.normalize(x))
        except RuntimeError as err:  # a shape mismatch inside level_head (matmul / conv sizes)
            raise ValueError(
                f"x of shape {tuple(x.shape)} does not fit level_head (expected (B, *event) as it was built "
                f"for): {err}"
            ) from None
        return self._check_logits(logits, x.shape[0])

    @torch.no_grad()
    def noise_level(self, x: Tensor) -> Tensor:
        """Detected noise level ``k̂ = argmax logits`` per element, int64 ``(B,)``.

        ``x`` must be finite: a NaN/Inf state has no noise level (``ValueError``; argmax over NaN logits
        would silently report level 0, "clean"). :func:`~icml25.generative_models.thermalizer.thermalized_rollout` aborts such elements instead.
        """
        self._check_event("x", x)
        return self.level_logits(x).argmax(dim=-1)

    @torch.no_grad()
    def level_accuracy(
        self,
        x: Tensor,
        levels: Sequence[int],
        tolerance: int = 2,
        generator: torch.Generator | None = None,
    ) -> dict[int, float]:
        """How well the classifier recovers a known noise level: clean states noised to each level.

        For every ``k`` in ``levels`` the clean states ``x`` are forward-diffused to level k (the same
        ``q(x_k | x)`` that :meth:`loss` trains on, projected when ``mean_free``) and the fraction whose
        detected level :meth:`noise_level` lies within ``±tolerance`` of k is reported. This is the
        classifier the rollout uses to decide when (k̂ > s_init) and how much (k̂ − s_stop steps) to denoise.

        Args:
            x: clean physical states ``(B, *event)``, finite (e.g. held-out snapshots of μ).
            levels: the levels to test, ints in ``[0, T)``.
            tolerance: accepted ``|k̂ − k|`` (int >= 0).
            generator: RNG of the injected noise (one ``(B, *event)`` draw per level, in order).

        Returns:
            ``{k: accuracy in [0, 1]}`` in the order of ``levels``.
        """
        self._check_event("x", x)
        if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence) or not levels:
            raise ValueError(f"levels must be a non-empty sequence of ints in [0, {self.T}), got {levels!r}")
        levels = [check_int(k, f"levels[{i}]", low=0, high=self.T - 1) for i, k in enumerate(levels)]
        tolerance = check_int(tolerance, "tolerance", low=0)
        xn = self.normalize(x)
        out: dict[int, float] = {}
        for k in levels:
            kk = torch.full((x.shape[0],), k, dtype=torch.long, device=x.device)
            noise = self.project(torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device))
            noisy = self.denormalize(self.q_sample(xn, kk, noise))
            out[k] = float(((self.noise_level(noisy) - k).abs() <= tolerance).float().mean())
        return out

    def _check_event(self, name: str, x: Tensor) -> Tensor:
        """States ``(B, *event)``: a finite float tensor, no empty axis; after :meth:`fit`, of the training
        snapshots' event shape."""
        check_tensor(x, name, non_empty=True)
        if x.dim() < 2:
            raise ValueError(f"{name} must have shape (B, *event), got {tuple(x.shape)}")
        event = getattr(self, "_event_shape", None)
        if event is not None and tuple(x.shape[1:]) != event:
            raise ValueError(
                f"{name} must have shape (B, {', '.join(map(str, event))}), got {tuple(x.shape)}"
            )
        return x

    # -- training ------------------------------------------------------------------------------------------
    def loss(
        self, x0: Tensor, level_weights: Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, float]]:
        """DDPM ε-MSE + ``lambda_cls``·cross-entropy of the level head, on clean physical snapshots.

        Args:
            x0: clean snapshots ``(B, *event)`` in physical units.
            level_weights: optional ``(T,)`` non-negative sampling weights of k (default uniform); use it
                to oversample the small levels where the rollout's classifier must be accurate.
            generator: RNG for k and ε.

        Returns:
            the scalar loss and ``{"mse", "ce", "acc"}`` (classifier accuracy on this batch).
        """
        x0 = self.normalize(x0)
        b = x0.shape[0]
        if level_weights is None:
            k = torch.randint(0, self.T, (b,), generator=generator, device=x0.device)
        else:
            k = torch.multinomial(level_weights.to(x0.device, torch.float64), b, True, generator=generator)
        eps = self.project(torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype))
        xk = self.q_sample(x0, k, eps)
        mse = F.mse_loss(self.predict_eps(xk, k), eps)
        logits = self._check_logits(self.level_head(xk), b)
        ce = F.cross_entropy(logits, k)
        acc = (logits.argmax(-1) == k).float().mean()
        return mse + self.lambda_cls * ce, {"mse": mse.item(), "ce": ce.item(), "acc": acc.item()}

    def fit(
        self,
        snapshots: Tensor | np.ndarray,
        n_iter: int = 4000,
        batch_size: int = 128,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        ema_decay: float | None = 0.995,
        level_weights: Tensor | None = None,
        seed: int = 0,
        progress: bool = False,
        augment: Callable[[Tensor, torch.Generator], Tensor] | None = None,
    ) -> Thermalizer:
        """Train on clean snapshots of μ only (never on emulator output), AdamW + grad-clip 1 + EMA.

        Args:
            snapshots: ``(n, *event)`` physical-unit samples of the invariant measure.
            n_iter, batch_size, lr, weight_decay: optimisation (cosine-decayed learning rate).
            ema_decay: decay of the parameter EMA loaded at the end (None: keep the raw weights).
            level_weights: see :meth:`loss`.
            augment: optional symmetry transform of a ``(b, *event)`` batch of snapshots, called with the
                training generator (e.g. :func:`~icml25.generative_models.thermalizer_nets.periodic_symmetry_augment`); μ must be invariant to it.

        Returns:
            self in eval mode, ``field_mean``/``field_std`` set from ``snapshots``.
        """
        # Validate everything before touching any state: a rejected fit leaves the model unchanged.
        if isinstance(snapshots, np.ndarray):
            snapshots = torch.from_numpy(np.ascontiguousarray(snapshots))
        data = check_tensor(snapshots, "snapshots", non_empty=True).float()
        if data.dim() < 2:
            raise ValueError(f"snapshots must have shape (n, *event), got {tuple(data.shape)}")
        std = float(data.std()) if data.numel() > 1 else 0.0
        if not std > 0 or not math.isfinite(std):  # the std sets the normalisation
            raise ValueError(f"snapshots must not be constant, got std={std} over shape {tuple(data.shape)}")
        n_iter, batch_size = check_int(n_iter, "n_iter", low=1), check_int(batch_size, "batch_size", low=1)
        lr = check_float(lr, "lr", low=0.0, low_open=True)
        weight_decay = check_float(weight_decay, "weight_decay", low=0.0)
        if ema_decay is not None:
            ema_decay = check_float(ema_decay, "ema_decay", low=0.0, high=1.0, high_open=True)
        if level_weights is not None:
            lw = torch.as_tensor(level_weights, dtype=torch.float64)
            if lw.shape != (self.T,) or not bool(torch.isfinite(lw).all() & (lw >= 0).all()) or lw.sum() <= 0:
                raise ValueError(
                    f"level_weights must be a ({self.T},) tensor of finite weights >= 0 with a positive sum, "
                    f"got shape {tuple(lw.shape)}"
                )
        mean = float(data.mean())
        self._probe_heads((data[:2] - mean) / std)
        self._event_shape = tuple(data.shape[1:])
        self.field_mean.fill_(mean)
        self.field_std.fill_(std)
        gen = make_generator(seed)
        params = list({id(p): p for p in self.parameters()}.values())
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n_iter)
        ema = copy.deepcopy(self).requires_grad_(False) if ema_decay is not None else None
        self.train()
        for _ in progress_bar(range(n_iter), desc="thermalizer") if progress else range(n_iter):
            batch = data[torch.randint(0, data.shape[0], (batch_size,), generator=gen)]
            if augment is not None:
                batch = augment(batch, gen)
            loss, _ = self.loss(batch, level_weights, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            if ema is not None:
                with torch.no_grad():
                    for pe, p in zip(ema.parameters(), self.parameters()):
                        pe.lerp_(p, 1.0 - ema_decay)
        if ema is not None:
            self.load_state_dict(ema.state_dict())
        return self.eval()

    @torch.no_grad()
    def _probe_heads(self, xn: Tensor) -> None:
        """Check the output shapes of both networks on a normalised batch, in eval mode (no state change)."""
        was_training = self.training
        self.eval()
        try:
            k = torch.zeros(xn.shape[0], dtype=torch.long, device=xn.device)
            try:
                eps = self.eps_net(xn, k) if self.time_conditioned else self.eps_net(xn)
                logits = self.level_head(xn)
            except RuntimeError as exc:
                raise ValueError(
                    f"snapshots of event shape {tuple(xn.shape[1:])} do not fit eps_net/level_head: {exc}"
                ) from exc
            if not isinstance(eps, Tensor) or eps.shape != xn.shape:
                got = tuple(eps.shape) if isinstance(eps, Tensor) else type(eps).__name__
                raise ValueError(f"eps_net must return the shape of its input {tuple(xn.shape)}, got {got}")
            self._check_logits(logits, xn.shape[0])
        finally:
            self.train(was_training)

    # -- inference -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def denoise(
        self,
        x: Tensor,
        levels: Tensor,
        stop: int,
        forward_diffuse: bool = True,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Heterogeneous denoising: element b goes from level ``levels[b]`` down to ``stop``.

        Elements with ``levels[b] ≤ stop`` are returned unchanged (bitwise). The others are (optionally)
        forward-diffused to their level, then take ancestral steps at ``i = levels[b], …, stop + 1``;
        the batch is processed from the highest level down, an element joining once ``i ≤ levels[b]``.

        Args:
            x: physical states ``(B, *event)``.
            levels: int64 ``(B,)`` in ``[0, T)``.
            stop: final level, ``-1 ≤ stop < T`` (−1 ends with the noiseless step at level 0).
            forward_diffuse: add ``q(x_k | x)`` noise first (paper default).
            generator: RNG for the injected noise.
            noise: optional explicit draws ``(k_max + 1, B, *event)``: ``noise[0]`` for the forward
                diffusion, ``noise[i]`` for the reverse step at level i; an element's result then does not
                depend on the rest of the batch (used to test the heterogeneous batching).

        Returns:
            denoised states ``(B, *event)`` and the number of reverse steps per element, int64 ``(B,)``
            (``max(levels − stop, 0)``).
        """
        self._check_event("x", x)
        levels = torch.as_tensor(levels, device=x.device)
        if levels.dtype not in (torch.int64, torch.int32) or levels.shape != x.shape[:1]:
            raise ValueError(
                f"levels must be an integer tensor of shape ({x.shape[0]},), got {levels.dtype} {tuple(levels.shape)}"
            )
        levels = levels.long()
        stop = check_int(stop, "stop", low=-1, high=self.T - 1)
        if levels.numel() and (int(levels.min()) < 0 or int(levels.max()) >= self.T):
            raise ValueError(
                f"levels must lie in [0, {self.T}), got range [{int(levels.min())}, {int(levels.max())}]"
            )
        n_steps = (levels - stop).clamp(min=0)
        touched = n_steps > 0
        out = x.clone()
        if not bool(touched.any()):
            return out, n_steps
        k_max = int(levels.max())
        if noise is not None and (noise.shape[0] < k_max + 1 or noise.shape[1:] != x.shape):
            raise ValueError(
                f"noise must have shape ({k_max + 1}, {tuple(x.shape)}...), got {tuple(noise.shape)}"
            )

        def draw(i: int, mask: Tensor) -> Tensor:
            if noise is not None:
                return self.project(noise[i][mask])
            shape = (int(mask.sum()), *x.shape[1:])
            return self.project(torch.randn(shape, generator=generator, device=x.device, dtype=x.dtype))

        idx = touched.nonzero().squeeze(1)
        lv = levels[idx]
        xn = self.normalize(x[idx])
        if forward_diffuse:
            xn = self.q_sample(xn, lv, draw(0, touched))
        for i in range(k_max, stop, -1):
            sel = lv >= i  # elements whose chain has reached level i
            k = torch.full((int(sel.sum()),), i, dtype=torch.long, device=x.device)
            full_sel = torch.zeros_like(touched)
            full_sel[idx[sel]] = True
            xn[sel] = self.reverse_step(xn[sel], k, draw(i, full_sel))
        out[idx] = self.denormalize(xn)
        return out, n_steps
