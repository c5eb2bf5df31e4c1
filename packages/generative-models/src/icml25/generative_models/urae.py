"""URAE: Ultra-Resolution Adaptation with Ease — ICML 2025, P28: minor-component adapters and the guidance rule.

Yu, Liu, Wang et al., "Ultra-Resolution Adaptation with Ease", ICML 2025 (arXiv 2503.16322; official code
``Huage001/URAE``). Adapting a guidance-distilled text-to-image flow model (FLUX.1-dev) to 2K/4K cheaply:

* **Minor-component adapters** (the 4K stage). Each targeted weight ``W = U diag(S) Vᵀ`` is split into a frozen
  major part ``U[:, :-r] diag(S[:-r]) Vᵀ[:-r]`` and trainable factors ``B = U[:, -r:] diag(√S[-r:])``,
  ``A = diag(√S[-r:]) Vᵀ[-r:]`` holding the ``r`` *smallest* singular components, so the adapted layer equals
  the original one at initialisation (:class:`SVDComponentLinear`, :func:`apply_svd_adapters`; ``component=
  "major"`` gives the PiSSA-style split for comparison). Layers are selected by name like peft's
  ``target_modules``; convolutions are handled with their kernel reshaped to ``out × in·k·k``.
* **Exact export to LoRA.** The adapted model differs from the original by ``ΔW = BA − B₀A₀`` (``B₀, A₀`` the
  initial factors), a rank-``2r`` LoRA with up ``[B, −B₀]``, down ``[A; A₀]`` and scale 1
  (:meth:`SVDComponentLinear.to_lora_factors`, :func:`export_peft_lora_state_dict`); it loads into the
  *original* model through peft (``LoraConfig`` from :func:`peft_lora_config`), the conversion the official
  notebooks perform. A naive save of ``A, B`` alone is wrong on the vanilla model, since its weight was changed.
* **Plain LoRA** (the 2K stage and the baseline): :class:`LoRALinear` / :func:`apply_lora_adapters`, peft's
  ``init_lora_weights="gaussian"`` with ``lora_alpha = r`` (``A ~ N(0, 1/r)``, ``B = 0``).
* **The guidance rule.** A guidance-distilled model takes the guidance scale ``g`` as input and was trained so
  that ``v(x, t, c, g) ≈ v_u + g (v_c − v_u)``; the flow-matching target ``ε − x₀`` is the *unguided
  conditional* velocity, i.e. the ``g = 1`` output, so adaptation must feed ``g = 1``
  (:func:`flow_matching_finetune_step`, checked by :func:`check_guidance_for_adaptation`); sampling afterwards
  uses the usual ``g`` (3.5 for FLUX).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_tensor

__all__ = [
    "LoRALinear",
    "SVDComponentLinear",
    "apply_lora_adapters",
    "apply_svd_adapters",
    "check_guidance_for_adaptation",
    "export_peft_lora_state_dict",
    "flow_matching_finetune_step",
    "merge_adapters",
    "peft_lora_config",
]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _check_layer(base: Any, reshape_conv: bool) -> None:
    if isinstance(base, _CONV):
        if not reshape_conv:
            raise TypeError(
                f"base must be an nn.Linear, or a convolution with reshape_conv=True (its kernel is reshaped to "
                f"out × in·k·k); got {type(base).__name__} with reshape_conv=False"
            )
        if base.groups != 1 or base.padding_mode != "zeros":
            raise ValueError(
                f"base convolution must have groups=1 and padding_mode='zeros', got groups={base.groups}, "
                f"padding_mode={base.padding_mode!r}"
            )
    elif not isinstance(base, nn.Linear):
        raise TypeError(
            f"base must be an nn.Linear or a convolution (nn.Conv1d/2d/3d), got {type(base).__name__}"
        )


def _check_rank(rank: Any, out_f: int, in_f: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"rank must be an int, got {type(rank).__name__} ({rank!r})")
    if not 0 < rank < min(out_f, in_f):
        raise ValueError(
            f"rank must satisfy 0 < rank < min(out, in) = {min(out_f, in_f)} for a {out_f} × {in_f} weight, "
            f"got {rank}"
        )
    return rank


class _FactorAdapter(nn.Module):
    """A frozen base layer plus a trainable rank-``r`` product ``B A`` on its flattened ``out × in·k·k`` weight."""

    base: nn.Module
    A0: Tensor
    B0: Tensor

    def __init__(self, base: nn.Module, rank: int, reshape_conv: bool) -> None:
        super().__init__()
        _check_layer(base, reshape_conv)
        w = base.weight
        want = 2 if isinstance(base, nn.Linear) else 2 + len(base.kernel_size)
        if w.dim() != want or w.numel() == 0:
            raise ValueError(
                f"base.weight must be a non-empty {want}-D tensor for {type(base).__name__}, got shape {tuple(w.shape)}"
            )
        if not w.is_floating_point():
            raise TypeError(f"base.weight must be floating point, got dtype {w.dtype}")
        if not bool(torch.isfinite(w).all()):
            raise ValueError("base.weight must be finite, got NaN or Inf entries")
        self.out_features, self.in_features = w.shape[0], w[0].numel()
        self.rank = _check_rank(rank, self.out_features, self.in_features)
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)

    def _set_factors(self, a: Tensor, b: Tensor) -> None:
        dtype = self.base.weight.dtype
        self.lora_A = nn.Parameter(a.to(dtype).contiguous())
        self.lora_B = nn.Parameter(b.to(dtype).contiguous())
        self.register_buffer("A0", self.lora_A.detach().clone())
        self.register_buffer("B0", self.lora_B.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        if isinstance(self.base, nn.Linear):
            return y + F.linear(F.linear(x, self.lora_A), self.lora_B)
        conv = self.base
        nd = conv.weight.dim() - 2
        fn = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
        a = self.lora_A.reshape(self.rank, *conv.weight.shape[1:])
        h = fn(x, a, None, conv.stride, conv.padding, conv.dilation)
        return y + fn(h, self.lora_B.reshape(self.out_features, self.rank, *([1] * nd)))

    def delta_weight(self) -> Tensor:
        """``W_eff − W_original`` in the base weight's shape: ``B A − B₀ A₀`` (zero at initialisation)."""
        d = self.lora_B @ self.lora_A - self.B0 @ self.A0
        return d.reshape(self.base.weight.shape)

    def effective_weight(self) -> Tensor:
        """The weight the adapted layer applies: frozen base weight + ``B A``."""
        return self.base.weight + (self.lora_B @ self.lora_A).reshape(self.base.weight.shape)

    def to_lora_factors(self) -> tuple[Tensor, Tensor]:
        """``(up, down)`` of shapes ``(out, 2r)`` and ``(2r, in·k·k)`` with ``up @ down == delta_weight()``
        (flattened): up ``[B, −B₀]``, down ``[A; A₀]``, scale 1 — a LoRA relative to the *original* weight."""
        up = torch.cat([self.lora_B, -self.B0], dim=1).detach()
        down = torch.cat([self.lora_A, self.A0], dim=0).detach()
        return up, down


class SVDComponentLinear(_FactorAdapter):
    """Frozen residual + trainable rank-``r`` factors from the minor (or major) singular components of a layer.

    ``W = U diag(S) Vᵀ`` (descending ``S``). ``component="minor"`` (URAE / MiLoRA): the frozen weight becomes
    ``W − W_minor`` and ``B = U[:, -r:] diag(√S[-r:])``, ``A = diag(√S[-r:]) Vᵀ[-r:]``; ``"major"`` (PiSSA)
    takes the ``r`` largest instead. The layer's output is unchanged at initialisation. Half-precision weights
    are decomposed in float32 and cast back (with a warning: the split is then exact only to that precision).
    Convolutions need ``reshape_conv=True`` (kernel reshaped to ``out × in·k·k``; the adapter is a
    ``k × k`` convolution to ``r`` channels followed by a ``1 × 1`` one, as peft's conv LoRA).
    """

    def __init__(
        self, base: nn.Module, rank: int, component: str = "minor", *, reshape_conv: bool = False
    ) -> None:
        if component not in ("minor", "major"):
            raise ValueError(f"component must be 'minor' or 'major', got {component!r}")
        super().__init__(base, rank, reshape_conv)
        self.component = component
        w = base.weight.detach()
        if w.dtype in (torch.float16, torch.bfloat16):
            warnings.warn(
                f"base weight is {w.dtype}: the SVD runs in float32 and the factors are cast back to {w.dtype}, "
                "so W_residual + B A equals W only up to that precision's rounding error",
                stacklevel=2,
            )
        mat = w.reshape(self.out_features, self.in_features).to(
            torch.float64 if w.dtype == torch.float64 else torch.float32
        )
        u, s, vh = torch.linalg.svd(mat, full_matrices=False)
        sl = slice(-rank, None) if component == "minor" else slice(0, rank)
        root = s[sl].sqrt()
        b = u[:, sl] * root
        a = root[:, None] * vh[sl]
        residual = mat - b @ a
        with torch.no_grad():
            base.weight.copy_(residual.reshape(w.shape).to(w.dtype))
        self._set_factors(a, b)
        self.singular_values = s.detach().to(w.dtype)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, component={self.component!r}"


class LoRALinear(_FactorAdapter):
    """Plain LoRA (the baseline and the 2K stage): ``B = 0``, ``A ~ N(0, 1/r)`` (peft's ``"gaussian"``
    initialisation), scale ``alpha / r = 1``; the base weight is frozen and unchanged."""

    def __init__(
        self,
        base: nn.Module,
        rank: int,
        *,
        reshape_conv: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(base, rank, reshape_conv)
        a = torch.randn(rank, self.in_features, generator=generator) / rank
        self._set_factors(a, torch.zeros(self.out_features, rank))

    def extra_repr(self) -> str:
        return f"rank={self.rank}, init='gaussian'"


def _adaptable(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, *_CONV)) and n]


def _match(name: str, target: str | Sequence[str]) -> bool:
    if isinstance(target, str):
        return re.fullmatch(target, name) is not None
    return any(name == t or name.endswith("." + t) for t in target)


def _replace(
    model: nn.Module, target_modules: Any, make: Callable[[nn.Module], nn.Module]
) -> list[nn.Parameter]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(target_modules, str):
        targets: str | list[str] = target_modules
    elif (
        isinstance(target_modules, Sequence)
        and target_modules
        and all(isinstance(t, str) for t in target_modules)
    ):
        targets = list(target_modules)
    else:
        raise TypeError(
            "target_modules must be a regex string or a non-empty sequence of module-name suffixes (as peft's "
            f"target_modules), got {target_modules!r}"
        )
    names = [
        n for n, m in model.named_modules() if n and not isinstance(m, _FactorAdapter) and _match(n, targets)
    ]
    names = [n for n in names if not any(n.startswith(o + ".") for o in names if o != n)]
    if not names:
        raise ValueError(
            f"target_modules {target_modules!r} match no module of the model; candidate layers: {_adaptable(model)}"
        )
    built: dict[str, nn.Module] = {}
    for n in names:  # build everything first: a rejected layer leaves the model untouched
        built[n] = make(model.get_submodule(n))
    for p in model.parameters():
        p.requires_grad_(False)
    params: list[nn.Parameter] = []
    for n, new in built.items():
        parent, _, child = n.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
        new.lora_A.requires_grad_(True)
        new.lora_B.requires_grad_(True)
        params += [new.lora_A, new.lora_B]
    return params


def _restore_on_error(model: nn.Module, fn: Callable[[], list[nn.Parameter]]) -> list[nn.Parameter]:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    grads = {k: p.requires_grad for k, p in model.named_parameters()}
    try:
        return fn()
    except Exception:
        model.load_state_dict(state)
        for k, p in model.named_parameters():
            p.requires_grad_(grads[k])
        raise


def apply_svd_adapters(
    model: nn.Module,
    target_modules: str | Sequence[str],
    rank: int = 16,
    component: str = "minor",
    *,
    reshape_conv: bool = False,
) -> list[nn.Parameter]:
    """Wrap every layer named by ``target_modules`` in a :class:`SVDComponentLinear` (in place) and freeze every
    other parameter; return the trainable factors ``[A, B, ...]``.

    ``target_modules``: a list of name suffixes (``["to_q", "to_k"]`` matches ``blocks.0.attn.to_q``) or a regex
    matched against the full name, as peft. The model's outputs are unchanged until the factors are trained.
    """
    return _restore_on_error(
        model,
        lambda: _replace(
            model, target_modules, lambda m: SVDComponentLinear(m, rank, component, reshape_conv=reshape_conv)
        ),
    )


def apply_lora_adapters(
    model: nn.Module,
    target_modules: str | Sequence[str],
    rank: int = 16,
    *,
    reshape_conv: bool = False,
    generator: torch.Generator | None = None,
) -> list[nn.Parameter]:
    """Wrap the named layers in :class:`LoRALinear` (plain LoRA, the baseline) and freeze everything else."""
    return _restore_on_error(
        model,
        lambda: _replace(
            model,
            target_modules,
            lambda m: LoRALinear(m, rank, reshape_conv=reshape_conv, generator=generator),
        ),
    )


def _adapters(model: nn.Module) -> dict[str, _FactorAdapter]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    found = {n: m for n, m in model.named_modules() if isinstance(m, _FactorAdapter)}
    if not found:
        raise ValueError("model has no SVDComponentLinear/LoRALinear adapters: call apply_svd_adapters first")
    return found


def export_peft_lora_state_dict(model: nn.Module, prefix: str = "base_model.model.") -> dict[str, Tensor]:
    """The adapters' exact change of the model as a rank-``2r`` LoRA *relative to the original weights*.

    Keys ``f"{prefix}{name}.lora_A.weight"`` / ``.lora_B.weight`` (peft's layout: Linear ``(2r, in)`` and
    ``(out, 2r)``; convolutions ``(2r, in, *k)`` and ``(out, 2r, 1, ...)``). Load it into the unadapted model with
    ``peft.get_peft_model(original, LoraConfig(**peft_lora_config(model)))`` and
    ``peft.set_peft_model_state_dict`` (``prefix="transformer."`` gives the diffusers key layout).
    """
    out: dict[str, Tensor] = {}
    for name, ad in _adapters(model).items():
        up, down = ad.to_lora_factors()
        shape = ad.base.weight.shape
        if len(shape) > 2:
            down = down.reshape(2 * ad.rank, *shape[1:])
            up = up.reshape(shape[0], 2 * ad.rank, *([1] * (len(shape) - 2)))
        out[f"{prefix}{name}.lora_A.weight"] = down.clone()
        out[f"{prefix}{name}.lora_B.weight"] = up.clone()
    return out


def peft_lora_config(model: nn.Module) -> dict[str, Any]:
    """Keyword arguments of the ``peft.LoraConfig`` matching :func:`export_peft_lora_state_dict`: rank ``2r``,
    ``lora_alpha = 2r`` (scale 1) and the adapted module names (``rank_pattern`` when ranks differ)."""
    ads = _adapters(model)
    ranks = {n: 2 * a.rank for n, a in ads.items()}
    r = max(ranks.values())
    cfg: dict[str, Any] = {"r": r, "lora_alpha": r, "target_modules": sorted(ads), "lora_dropout": 0.0}
    other = {f"^{re.escape(n)}$": k for n, k in ranks.items() if k != r}
    if other:
        cfg["rank_pattern"] = other
        cfg["alpha_pattern"] = dict(other)
    return cfg


def merge_adapters(model: nn.Module) -> nn.Module:
    """Fuse every adapter into its layer (weight ``W_residual + B A``) and put the plain layer back, in place;
    the way the 2K LoRA is fused before the 4K minor-component adapters are added. Returns ``model``."""
    for name, ad in _adapters(model).items():
        base = ad.base
        with torch.no_grad():
            base.weight.copy_(ad.effective_weight())
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, base)
    return model


def _guidance_embeds(model_config: Any) -> bool:
    if isinstance(model_config, Mapping):
        flag = model_config.get("guidance_embeds", None)
    else:
        flag = getattr(model_config, "guidance_embeds", None)
    if flag is None:
        raise TypeError(
            "model_config must be a mapping or object with a boolean 'guidance_embeds' (as FluxTransformer2DModel's "
            f"config), got {type(model_config).__name__} without it"
        )
    return bool(flag)


def check_guidance_for_adaptation(model_config: Any, guidance: float | None) -> None:
    """Check the guidance value fed during adaptation (fine-tuning with the flow-matching loss).

    A guidance-distilled model (``guidance_embeds=True``) must be fed ``g = 1``: the target ``ε − x₀`` is the
    unguided conditional velocity, which the distilled model produces at ``g = 1``; another value trains the
    ``g`` pathway to drop its guidance (a ``UserWarning``). ``guidance`` must be ``None`` for a model without a
    guidance input and a finite value ``>= 0`` otherwise (``ValueError``).
    """
    embeds = _guidance_embeds(model_config)
    if guidance is None:
        if embeds:
            raise ValueError(
                "guidance must be a number (1.0) for a model with guidance_embeds=True, got None"
            )
        return
    if isinstance(guidance, bool) or not isinstance(guidance, (int, float)):
        raise TypeError(f"guidance must be a float or None, got {type(guidance).__name__}")
    if not math.isfinite(guidance) or guidance < 0:
        raise ValueError(f"guidance must be a finite value >= 0, got {guidance!r}")
    if not embeds:
        raise ValueError(
            f"guidance must be None for a model without a guidance embedding (guidance_embeds=False), got {guidance!r}"
        )
    if guidance != 1.0:
        warnings.warn(
            f"guidance={guidance!r} during adaptation of a guidance-distilled model: the flow-matching target is the "
            "unguided velocity (the g = 1 output), so training with g != 1 erases the distilled guidance; feed "
            "guidance=1.0 and use the usual scale only at sampling time",
            UserWarning,
            stacklevel=3,
        )


def _check_x0(x: Any, name: str) -> Tensor:
    x = check_tensor(x, name, non_empty=True)
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (N, *event) with N >= 1, got {tuple(x.shape)}")
    return x


def flow_matching_finetune_step(
    model: nn.Module,
    x0: Tensor,
    cond: Any,
    *,
    guidance: float | None = 1.0,
    optimizer: torch.optim.Optimizer | None = None,
    sigma_sampler: Callable[[int, torch.Generator | None], Tensor] | None = None,
    generator: torch.Generator | None = None,
    max_grad_norm: float | None = None,
) -> Tensor:
    """One rectified-flow fine-tuning step: ``x_t = (1−σ) x₀ + σ ε``, loss ``‖v_θ(x_t, σ, c[, g]) − (ε − x₀)‖²``.

    ``model(x_t, sigma, cond, guidance_tensor)`` is called when ``model.config`` (or ``model``) has
    ``guidance_embeds=True`` — the guidance tensor is filled with ``guidance`` (checked by
    :func:`check_guidance_for_adaptation`: 1 for adaptation) — else ``model(x_t, sigma, cond)``. ``σ`` is drawn by
    ``sigma_sampler(n, generator)`` (default uniform on [0, 1], ``weighting_scheme="none"``). With an
    ``optimizer`` the step backpropagates, clips to ``max_grad_norm`` and updates, returning the detached loss;
    without one it returns the loss with its graph.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    x0 = _check_x0(x0, "x0")
    config = getattr(model, "config", model)
    check_guidance_for_adaptation(config, guidance)
    n = x0.shape[0]
    sigma = (sigma_sampler or (lambda k, g: torch.rand(k, generator=g)))(n, generator)
    if not isinstance(sigma, Tensor) or sigma.shape != (n,):
        raise ValueError(
            f"sigma_sampler must return a tensor of shape ({n},), got {getattr(sigma, 'shape', sigma)}"
        )
    sigma = sigma.to(x0)
    eps = torch.randn(x0.shape, generator=generator).to(x0)
    s = sigma.reshape(n, *([1] * (x0.dim() - 1)))
    x_t = (1 - s) * x0 + s * eps
    if guidance is None:
        pred = model(x_t, sigma, cond)
    else:
        pred = model(x_t, sigma, cond, torch.full((n,), float(guidance), dtype=x0.dtype))
    loss = ((pred.float() - (eps - x0).float()) ** 2).mean()
    if not bool(torch.isfinite(loss)):
        raise ValueError(
            f"the flow-matching loss is not finite ({float(loss.detach())}): x0 (max |value| {float(x0.abs().max()):.3g}) "
            "or the model's output overflowed; nothing was updated"
        )
    if optimizer is None:
        return loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(
            [p for g in optimizer.param_groups for p in g["params"]], max_grad_norm
        )
    optimizer.step()
    return loss.detach()
