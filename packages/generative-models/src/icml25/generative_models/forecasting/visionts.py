"""VisionTS: visual masked autoencoders are free-lunch zero-shot time series forecasters — ICML 2025, P25: series↔image rendering and the MAE forecaster.

Chen et al., "VisionTS: Visual Masked Autoencoders Are Free-Lunch Zero-Shot Time Series Forecasters",
ICML 2025 (arXiv 2408.17253; official code ``Keytoyze/VisionTS``, ``visionts/model.py``). A univariate
context is normalised (std scaled to ``norm_const`` = 0.4), left-padded to whole periods, folded into a
``P × n_periods`` grid (rows = phase, columns = period), resized into the left ``n_in`` patch columns of
a square image, and an image MAE in-paints the masked right part; the grey in-painted image is resized back
to ``P`` rows, flattened column-major, and the forecast window sliced out and de-normalised.

The slice geometry follows the official ``update_config``: ``pad_left = (−L) mod P``,
``n_in = max(1, int(ratio · N · align_const))`` with ``ratio = (L+pad_L)/(L+pad_L+H+pad_H)``, input width
``int(S · n_in / N)``, read-back width ``round(S · scale_x)`` with ``scale_x = n_periods / in_width``.
Resizes are bilinear without antialiasing (torchvision ``Resize(antialias=False)`` on tensors).

Any MAE works through :class:`MAEAdapter`: :class:`HFViTMAEAdapter` wraps ``transformers``'
``ViTMAEForPreTraining`` (the fixed keep-set goes in as its ``noise`` argument; its ``config.mask_ratio``
is set per call because HF truncates ``seq_len · (1 − mask_ratio)``), :class:`FacebookMAEAdapter` wraps a
``models_mae``-style module (``forward(imgs, mask_ratio, noise) -> (loss, pred, mask)`` + ``unpatchify``).
An MAE trained with ``norm_pix_loss`` is refused: its masked patches cannot be un-normalised.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.generative_models.common.vit_mae import load_vit_mae, small_vit_mae
from icml25.kernels.checks import check_float, check_int, check_tensor

__all__ = [
    "FacebookMAEAdapter",
    "HFViTMAEAdapter",
    "MAEAdapter",
    "VisionTS",
    "VisionTSGeometry",
    "autotune_periodicity",
    "candidate_periods",
    "image_to_forecast",
    "load_vit_mae",
    "series_to_image",
    "small_vit_mae",
    "visionts_geometry",
    "visionts_keep_mask",
]

FinetuneMode = Literal["none", "ln", "bias", "mlp", "attn", "full"]
_INTERP = ("bilinear", "nearest", "bicubic")


# ------------------------------------------------------------------------------------------- geometry
@dataclass(frozen=True)
class VisionTSGeometry:
    """Every size of one (context, horizon, periodicity, image) configuration (official ``update_config``)."""

    context_len: int
    horizon: int
    periodicity: int
    image_size: int
    patch_size: int
    norm_const: float
    align_const: float
    interpolation: str
    pad_left: int
    """Replicate-padding in front of the context so that ``L + pad_left`` is a multiple of ``P``."""
    pad_right: int
    """``(−H) mod P``: only enters the visible ratio."""
    n_in: int
    """Visible patch columns (left); the other ``n_out`` columns are masked."""
    in_width: int
    """Pixel width of the rendered context, ``int(S · n_in / N)``."""
    out_width: int
    """Periods read back from the whole image, ``round(S · n_periods / in_width)``."""

    @property
    def grid(self) -> int:
        """Patches per side ``N = S / p``."""
        return self.image_size // self.patch_size

    @property
    def n_out(self) -> int:
        return self.grid - self.n_in

    @property
    def n_periods(self) -> int:
        """Columns of the context grid, ``(L + pad_left) / P``."""
        return (self.context_len + self.pad_left) // self.periodicity

    @property
    def max_horizon(self) -> int:
        """Longest horizon the read-back image holds: ``P · out_width − pad_left − L``."""
        return self.periodicity * self.out_width - self.pad_left - self.context_len

    @property
    def start(self) -> int:
        """First forecast position in the flattened read-back sequence."""
        return self.pad_left + self.context_len


def visionts_geometry(
    context_len: int,
    horizon: int,
    periodicity: int = 1,
    *,
    image_size: int = 224,
    patch_size: int = 16,
    norm_const: float = 0.4,
    align_const: float = 0.4,
    interpolation: str = "bilinear",
) -> VisionTSGeometry:
    """Validate a configuration and compute its :class:`VisionTSGeometry`.

    Raises ``ValueError`` for a context shorter than two periods, a non-positive ``norm_const`` /
    ``align_const``, ``image_size`` not a multiple of ``patch_size``, no masked column left, or a horizon
    beyond :attr:`VisionTSGeometry.max_horizon`; warns when ``n_in`` is forced up to one column.
    """
    L = check_int(context_len, "context_len", low=1)
    H = check_int(horizon, "horizon", low=1)
    P = check_int(periodicity, "periodicity", low=1)
    S = check_int(image_size, "image_size", low=1)
    p = check_int(patch_size, "patch_size", low=1)
    r = check_float(norm_const, "norm_const", low=0, low_open=True)
    c = check_float(align_const, "align_const", low=0, low_open=True)
    if not isinstance(interpolation, str) or interpolation not in _INTERP:
        raise ValueError(f"interpolation must be one of {_INTERP}, got {interpolation!r}")
    if S % p:
        raise ValueError(f"image_size must be a multiple of patch_size (square patches), got {S} and {p}")
    N = S // p
    if N < 2:
        raise ValueError(f"image_size / patch_size must be >= 2 patches per side, got {S}/{p}")
    if L < 2 * P:
        raise ValueError(
            f"context_len must hold at least 2 periods of periodicity={P} (>= {2 * P}), got {L}: "
            "use a longer context or periodicity=1"
        )
    pad_l, pad_r = (-L) % P, (-H) % P
    ratio = (L + pad_l) / (L + pad_l + H + pad_r)
    raw = int(ratio * N * c)
    if raw < 1:
        warnings.warn(
            f"align_const={c} gives int(ratio·N·align_const) = int({ratio:.3f}·{N}·{c}) = 0 visible patch "
            "columns; forced to 1 (the official code does the same)",
            stacklevel=2,
        )
    n_in = max(1, raw)
    if n_in >= N:
        raise ValueError(
            f"align_const={c} leaves no masked patch column (n_in = {n_in} of {N}); use align_const < "
            f"{N / (ratio * N):.3g}"
        )
    in_width = int(S * n_in / N)
    out_width = round(S * ((L + pad_l) // P) / in_width)
    geom = VisionTSGeometry(L, H, P, S, p, r, c, interpolation, pad_l, pad_r, n_in, in_width, out_width)
    if H > geom.max_horizon:
        raise ValueError(
            f"horizon={H} needs more periods than the masked region holds: at most {geom.max_horizon} steps "
            f"for context_len={L}, periodicity={P}, align_const={c} (lower align_const or shorten the horizon)"
        )
    return geom


def _resize(x: Tensor, size: tuple[int, int], mode: str) -> Tensor:
    if mode == "nearest":
        return F.interpolate(x, size=size, mode="nearest")
    return F.interpolate(x, size=size, mode=mode, align_corners=False, antialias=False)


def series_to_image(x_norm: Tensor, geometry: VisionTSGeometry, channels: int = 3) -> Tensor:
    """Render normalised contexts ``(B, L)`` into images ``(B, channels, S, S)`` (right part zero)."""
    g = geometry
    x_norm = check_tensor(x_norm, "x_norm", shape=(None, g.context_len), non_empty=True)
    x = F.pad(x_norm[:, None, :], (g.pad_left, 0), mode="replicate")[:, 0] if g.pad_left else x_norm
    grid = x.reshape(x.shape[0], g.n_periods, g.periodicity).transpose(1, 2)  # rows = phase
    img = _resize(grid[:, None], (g.image_size, g.in_width), g.interpolation)
    img = F.pad(img, (0, g.image_size - g.in_width))
    return img.expand(-1, channels, -1, -1).contiguous()


def image_to_forecast(images: Tensor, geometry: VisionTSGeometry) -> Tensor:
    """Forecast window ``(B, H)`` (normalised units) from full images ``(B, C, S, S)``."""
    g = geometry
    images = check_tensor(images, "images", shape=(None, None, g.image_size, g.image_size), non_empty=True)
    grey = images.mean(1, keepdim=True)
    grid = _resize(grey, (g.periodicity, g.out_width), g.interpolation)[:, 0]
    seq = grid.transpose(1, 2).reshape(grid.shape[0], -1)  # column-major: period by period
    return seq[:, g.start : g.start + g.horizon]


def visionts_keep_mask(geometry: VisionTSGeometry) -> Tensor:
    """``(N·N,)`` noise for the MAE: 0 (keep) for the left ``n_in`` patch columns of every row, else 1."""
    N = geometry.grid
    m = torch.ones(N, N)
    m[:, : geometry.n_in] = 0.0
    return m.reshape(-1)


# --------------------------------------------------------------------------------------------- adapters
@runtime_checkable
class MAEAdapter(Protocol):
    """What VisionTS needs from an MAE: square images, square patches, a forced keep-set, full pixels."""

    image_size: int
    patch_size: int
    num_channels: int

    def reconstruct(self, images: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Full reconstructed images ``(B, C, S, S)`` and the ``(B, N·N)`` mask used (1 = masked)."""
        ...


def _check_mask(mask: Tensor, noise: Tensor) -> None:
    if not torch.equal(mask.to(noise.dtype), noise):
        kept, want = int((mask == 0).sum(-1).min()), int((noise == 0).sum(-1).min())
        raise RuntimeError(f"the MAE kept {kept} patches instead of the requested {want} (left columns)")


class HFViTMAEAdapter(nn.Module):
    """A ``transformers`` ``ViTMAEForPreTraining`` as an :class:`MAEAdapter` (``noise`` + ``unpatchify``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        cfg = getattr(model, "config", None)
        if cfg is None or not hasattr(model, "unpatchify") or not hasattr(model, "decoder"):
            raise TypeError(
                f"model must be a transformers ViTMAEForPreTraining (encoder + decoder + unpatchify), got "
                f"{type(model).__name__}; a ViTMAEModel or an encoder-only checkpoint has no pixel decoder"
            )
        if getattr(cfg, "norm_pix_loss", False):
            raise ValueError(
                "model was trained with norm_pix_loss=True: its masked patches are per-patch normalised and "
                "cannot be un-normalised, so it cannot forecast; use an MAE trained on raw pixels"
            )
        size, patch = cfg.image_size, cfg.patch_size
        for name, v in (("image_size", size), ("patch_size", patch)):
            if isinstance(v, (tuple, list)):
                if len(set(v)) != 1:
                    raise ValueError(f"model config {name} must be square, got {tuple(v)}")
        self.model = model
        self.image_size = int(size[0] if isinstance(size, (tuple, list)) else size)
        self.patch_size = int(patch[0] if isinstance(patch, (tuple, list)) else patch)
        self.num_channels = int(cfg.num_channels)

    def reconstruct(self, images: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        cfg = self.model.config
        old = cfg.mask_ratio
        # HF keeps int(n · (1 − mask_ratio)) patches (truncation): nudge the ratio so no kept patch is lost.
        cfg.mask_ratio = float(noise[0].mean()) - 1e-6
        try:
            out = self.model(pixel_values=images, noise=noise)
        finally:
            cfg.mask_ratio = old
        _check_mask(out.mask, noise)
        return self.model.unpatchify(out.logits), out.mask


class FacebookMAEAdapter(nn.Module):
    """A ``models_mae``-style MAE (``forward(imgs, mask_ratio, noise) -> (loss, pred, mask)``, ``unpatchify``)."""

    def __init__(self, model: nn.Module, image_size: int = 224, patch_size: int = 16, num_channels: int = 3):
        super().__init__()
        if not hasattr(model, "unpatchify") or not callable(model):
            raise TypeError(
                f"model must have forward(imgs, mask_ratio, noise) and unpatchify, got {type(model)}"
            )
        if getattr(model, "norm_pix_loss", False):
            raise ValueError(
                "model was trained with norm_pix_loss=True: masked patches cannot be un-normalised"
            )
        if getattr(model, "decoder_pred", True) is None:
            raise TypeError(
                "model has no pixel decoder (an mae_pretrain_* checkpoint); use a *visualize* MAE"
            )
        self.model = model
        self.image_size = check_int(image_size, "image_size", low=1)
        self.patch_size = check_int(patch_size, "patch_size", low=1)
        self.num_channels = check_int(num_channels, "num_channels", low=1)

    def reconstruct(self, images: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        _, pred, mask = self.model(images, mask_ratio=float(noise[0].mean()), noise=noise)
        _check_mask(mask, noise)
        return self.model.unpatchify(pred), mask


def as_mae_adapter(mae: Any) -> Any:
    """Wrap ``mae``: an :class:`MAEAdapter` passes through, an HF ``ViTMAEForPreTraining`` is wrapped."""
    if isinstance(mae, (HFViTMAEAdapter, FacebookMAEAdapter)) or (
        isinstance(mae, MAEAdapter) and not hasattr(mae, "config")
    ):
        return mae
    if hasattr(mae, "config") and hasattr(mae, "vit"):
        return HFViTMAEAdapter(mae)
    raise TypeError(
        "mae must be an MAEAdapter (image_size, patch_size, num_channels, reconstruct) or a transformers "
        f"ViTMAEForPreTraining, got {type(mae).__name__}"
    )


# ---------------------------------------------------------------------------------------------- model
_FINETUNE_PATTERNS = {
    "ln": r"norm",
    "bias": r"bias",
    "mlp": r"mlp|intermediate|layers?\.\d+\.output\.",
    "attn": r"attn|attention",
}


class VisionTS(nn.Module):
    """Zero-shot (or lightly fine-tuned) forecaster that in-paints rendered series with an image MAE.

    ``mae``: an :class:`MAEAdapter` or a ``transformers`` ``ViTMAEForPreTraining``. ``finetune`` selects
    the trainable parameters (``"ln"``: names containing "norm", the paper's one-epoch setting; ``"none"``
    freezes all, ``"full"`` trains all). Call :meth:`configure` before :meth:`forward`.
    """

    def __init__(self, mae: Any, finetune: FinetuneMode = "ln") -> None:
        super().__init__()
        if finetune not in ("none", "full", *_FINETUNE_PATTERNS):
            raise ValueError(f"finetune must be one of none/ln/bias/mlp/attn/full, got {finetune!r}")
        self.mae = as_mae_adapter(mae)
        self.finetune = finetune
        for name, prm in self.mae.named_parameters() if isinstance(self.mae, nn.Module) else ():
            prm.requires_grad_(
                finetune == "full"
                or (
                    finetune in _FINETUNE_PATTERNS
                    and re.search(_FINETUNE_PATTERNS[finetune], name) is not None
                )
            )
        self.geometry_: VisionTSGeometry | None = None

    def configure(
        self,
        context_len: int,
        horizon: int,
        periodicity: int = 1,
        norm_const: float = 0.4,
        align_const: float = 0.4,
        interpolation: str = "bilinear",
    ) -> VisionTS:
        """Fix the geometry (see :func:`visionts_geometry`) for this MAE's image and patch size."""
        self.geometry_ = visionts_geometry(
            context_len, horizon, periodicity, image_size=self.mae.image_size, patch_size=self.mae.patch_size,
            norm_const=norm_const, align_const=align_const, interpolation=interpolation,
        )  # fmt: skip
        return self

    def forward(self, x: Tensor, return_images: bool = False) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        """Forecast ``(B, H, C)`` from contexts ``x`` ``(B, L, C)``; channels are forecast independently.

        With ``return_images``, also the rendered inputs, reconstructions and MAE masks (channels in batch).
        """
        g = self.geometry_
        if g is None:
            raise RuntimeError("call configure(context_len, horizon, periodicity) before forward")
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(
                f"x must be a float tensor (B, L, C), got {getattr(x, 'dtype', type(x).__name__)}"
            )
        if x.dim() != 3 or x.shape[1] != g.context_len or x.shape[0] == 0 or x.shape[2] == 0:
            raise ValueError(
                f"x must have shape (B, {g.context_len}, C) with B, C >= 1, got {tuple(x.shape)}"
            )
        if not torch.isfinite(x).all():
            raise ValueError("x contains NaN or inf: VisionTS has no missing-value handling; impute first")
        B, L, C = x.shape
        x64 = x.to(torch.float64)
        mean = x64.mean(1, keepdim=True)
        std = torch.sqrt(x64.var(1, keepdim=True, unbiased=False) + 1e-5) / g.norm_const
        if not torch.isfinite(std).all():
            raise ValueError("x is too large: its variance overflows float64")
        dtype = (
            next((p.dtype for p in self.mae.parameters()), x.dtype)
            if isinstance(self.mae, nn.Module)
            else x.dtype
        )
        z = ((x64 - mean) / std).permute(0, 2, 1).reshape(B * C, L).to(dtype)
        images = series_to_image(z, g, channels=self.mae.num_channels)
        noise = visionts_keep_mask(g).to(images.device, dtype).expand(B * C, -1).contiguous()
        recon, mask = self.mae.reconstruct(images, noise)
        y = image_to_forecast(recon, g).to(torch.float64).reshape(B, C, g.horizon).permute(0, 2, 1)
        out = (y * std + mean).to(x.dtype)
        if return_images:
            return out, {"input": images, "reconstruction": recon, "mask": mask}
        return out

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters :attr:`finetune` leaves trainable."""
        return [p for p in self.parameters() if p.requires_grad]


# ---------------------------------------------------------------------------------------- periodicity
_SEASONALITY = {
    "S": [3600], "T": [1440, 10080], "H": [24, 168], "D": [7, 30, 365], "W": [52, 4],
    "M": [12, 6, 3], "B": [5], "Q": [4, 2], "A": [1], "Y": [1],
}  # fmt: skip
_ALIASES = {"MIN": "T", "ME": "M", "MS": "M", "QE": "Q", "QS": "Q", "YE": "Y", "YS": "Y", "BH": "H", "L": "S"}


def candidate_periods(freq: str) -> list[int]:
    """Periodicities to try for a pandas-style frequency (``"H"``, ``"15min"``, ``"W-SUN"``), always with 1.

    The base table is the official one (hourly 24/168, daily 7/30/365, ...); a multiple ``k`` divides
    each base period (``"2H"`` → 12, 84), keeping those that stay whole and > 1.
    """
    if not isinstance(freq, str):
        raise TypeError(
            f"freq must be a pandas-style frequency string such as 'H', got {type(freq).__name__}"
        )
    m = re.fullmatch(r"\s*(\d*)\s*([A-Za-z]+)(?:-[A-Za-z]+)?\s*", freq)
    if m is None:
        raise ValueError(f"freq must look like 'H', '15min', 'W-SUN', got {freq!r}")
    k = int(m.group(1)) if m.group(1) else 1
    unit = m.group(2).upper()
    unit = _ALIASES.get(unit, unit)
    if unit not in _SEASONALITY or k < 1:
        raise ValueError(f"freq unit must be one of {sorted(_SEASONALITY)} (or min/ME/MS/...), got {freq!r}")
    out = [b // k for b in _SEASONALITY[unit] if b % k == 0 and b // k > 1]
    return [*dict.fromkeys(out), 1]


def autotune_periodicity(
    model: VisionTS,
    series: Tensor | np.ndarray,
    horizon: int,
    candidates: Sequence[int],
    context_len: int = 1000,
    **configure_kwargs: Any,
) -> int:
    """Pick the periodicity with the lowest validation MAE on the last ``horizon`` steps of ``series``.

    Per candidate ``P`` the context is rounded to a multiple of ``P`` (``round(L/P)·P``, as the official
    evaluation does; 300 steps for ``P = 1`` when ``context_len`` is 1000) and clipped to what ``series``
    holds before the validation window. ``series``: ``(T,)`` or ``(T, C)``. Candidates that do not fit
    are skipped; ``ValueError`` when none fits. Restores the model's previous geometry.
    """
    s = torch.as_tensor(np.asarray(series) if not isinstance(series, Tensor) else series)
    if not s.is_floating_point():
        raise TypeError(f"series must be a float array (T,) or (T, C), got dtype {s.dtype}")
    if s.dim() == 1:
        s = s[:, None]
    if s.dim() != 2 or s.shape[1] == 0:
        raise ValueError(f"series must be (T,) or (T, C) with C >= 1, got shape {tuple(s.shape)}")
    if not torch.isfinite(s).all():
        raise ValueError("series must be finite (no NaN/inf): VisionTS has no missing-value handling")
    H = check_int(horizon, "horizon", low=1)
    L0 = check_int(context_len, "context_len", low=1)
    if len(candidates) == 0:
        raise ValueError("candidates must list at least one periodicity, got none")
    avail = s.shape[0] - H
    old = model.geometry_
    best, best_err = None, math.inf
    try:
        for i, P in enumerate(candidates):
            P = check_int(P, f"candidates[{i}]", low=1)
            L = 300 if P == 1 and L0 == 1000 else max(round(L0 / P), 1) * P
            L = min(L, (avail // P) * P)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model.configure(L, H, P, **configure_kwargs)
            except ValueError:
                continue
            with torch.no_grad():
                pred = model(s[avail - L : avail][None].to(torch.float32))[0]
            err = float((pred.double() - s[avail:].double()).abs().mean())
            if err < best_err:
                best, best_err = P, err
    finally:
        model.geometry_ = old
    if best is None:
        raise ValueError(
            f"series of length {s.shape[0]} is too short for horizon={horizon} and every candidate "
            f"periodicity {list(candidates)} (each needs >= 2 periods of context)"
        )
    return int(best)
