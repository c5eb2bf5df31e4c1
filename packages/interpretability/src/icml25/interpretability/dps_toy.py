"""Defending LVLMs Against Vision Attacks through Partial-Perception Supervision — ICML 2025, P53: the learned digits stand-in.

The CPU mechanism test's model and data (the protocol itself is :mod:`icml25.interpretability.dps`): 24x24
canvases with an sklearn digit as the subject (:func:`make_canvases`), a bright 8x8 digit of another class in a
corner as the "typographic" attack (:func:`typographic_attack`), and :class:`HintCNN`, a small CNN that takes a
text-free "hint" (the counts of the confident observers' answers, :func:`toy_hints`, or a no-hint flag,
:func:`no_hint`), trained on clean canvases only (:func:`train_hint_cnn`); :func:`toy_dps` runs the DPS steps
with it (observers on masked views, answers with confidence < 0.5 dropped as "cannot determine", final answer
on the full image given the hint).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from icml25.interpretability.dps import CenterCrop, PartialView, RandomCrop

__all__ = [
    "CANVAS",
    "HINT_DIM",
    "N_CLASSES",
    "HintCNN",
    "make_canvases",
    "no_hint",
    "toy_dps",
    "toy_hints",
    "train_hint_cnn",
    "typographic_attack",
]


# ------------------------------------------------------------------------------------------------ learned toy
CANVAS = 24
N_CLASSES = 10
HINT_DIM = N_CLASSES + 1


def _float_batch(
    x: Any, name: str, shape: str, tail: tuple[int, ...] | None = None, lo: int = 1
) -> torch.Tensor:
    """``x`` as a float32 tensor ``[N, ...]`` (N >= 1, finite); ``tail`` fixes the trailing sizes, ``lo`` bounds
    them from below."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
    else:
        a = np.asarray(x)
        if a.dtype.kind not in "biuf":
            raise TypeError(f"{name} must be a numeric array {shape}, got dtype {a.dtype}")
        t = torch.as_tensor(a)
    if t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must be a real numeric array {shape}, got dtype {t.dtype}")
    t = t.to(torch.float32)
    ok = t.ndim == 3 and t.shape[0] >= 1 and min(t.shape[1:]) >= lo
    if tail is not None:
        ok = ok and tuple(t.shape[1:]) == tail
    if not ok:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} must be finite, got NaN or Inf values")
    return t


def _resize(digits: torch.Tensor, size: int) -> torch.Tensor:
    return torch.nn.functional.interpolate(
        digits[:, None], size=(size, size), mode="bilinear", align_corners=False
    )[:, 0]


def make_canvases(
    digits: np.ndarray | torch.Tensor,
    rng: np.random.Generator,
    size: int | tuple[int, int] = 12,
    jitter: int = 2,
    center: bool = True,
    canvas: int = CANVAS,
) -> torch.Tensor:
    """Place 8x8 digits (values in [0, 1]) on ``canvas x canvas`` black canvases.

    ``size``: the subject's side (an int, or ``(lo, hi)`` drawn per digit); ``center=True``: at the centre
    with ``+-jitter`` px, else at a uniform random position. Returns ``[N, canvas, canvas]`` float32."""
    d = _float_batch(digits, "digits", "[N, 8, 8] with N >= 1", tail=(8, 8))
    if d.min() < 0 or d.max() > 1:
        raise ValueError(f"digits must lie in [0, 1], got values in [{float(d.min()):g}, {float(d.max()):g}]")
    out = torch.zeros(d.shape[0], canvas, canvas)
    sizes = (
        rng.integers(size[0], size[1] + 1, d.shape[0])
        if isinstance(size, tuple)
        else [int(size)] * d.shape[0]
    )
    for i, s in enumerate(sizes):
        s = int(s)
        if not 1 <= s <= canvas:
            raise ValueError(f"size must be in [1, {canvas}], got {s}")
        if center:
            off = (canvas - s) // 2
            y, x = off + rng.integers(-jitter, jitter + 1, 2)
            y, x = int(np.clip(y, 0, canvas - s)), int(np.clip(x, 0, canvas - s))
        else:
            y, x = (int(v) for v in rng.integers(0, canvas - s + 1, 2))
        out[i, y : y + s, x : x + s] = _resize(d[i : i + 1], s)[0]
    return out.clamp(0, 1)


def typographic_attack(
    canvases: torch.Tensor,
    attack_digits: np.ndarray | torch.Tensor,
    rng: np.random.Generator,
    brightness: float = 1.5,
    where: str = "corner",
) -> torch.Tensor:
    """Paste an 8x8 digit (scaled by ``brightness``) into a random corner (``where="corner"``) or inside the
    centre window (``"overlap"``: no partial view removes it). Pixel-wise max with the canvas; no clamp
    (brightness > 1 makes the attack the brightest thing in the image)."""
    if where not in ("corner", "overlap"):
        raise ValueError(f"where must be 'corner' or 'overlap', got {where!r}")
    canvases = _float_batch(canvases, "canvases", "[N, C, C] with C >= 8", lo=8)
    if canvases.shape[1] != canvases.shape[2]:
        raise ValueError(f"canvases must be square [N, C, C], got shape {tuple(canvases.shape)}")
    a = _float_batch(attack_digits, "attack_digits", "[N, 8, 8]", tail=(8, 8)) * float(brightness)
    if a.shape[0] != canvases.shape[0]:
        raise ValueError(
            f"attack_digits must have one digit per canvas ({canvases.shape[0]}), got {a.shape[0]}"
        )
    out = canvases.clone()
    c = canvases.shape[-1]
    for i in range(out.shape[0]):
        if where == "corner":
            y, x = [(0, 0), (0, c - 8), (c - 8, 0), (c - 8, c - 8)][int(rng.integers(0, 4))]
        else:
            y, x = (int(v) for v in (c // 2 - 4 + rng.integers(-3, 4, 2)))
        out[i, y : y + 8, x : x + 8] = torch.maximum(out[i, y : y + 8, x : x + 8], a[i])
    return out


class HintCNN(nn.Module):
    """A small CNN with global max pooling whose head also reads a hint vector ``[N, 11]``: the
    normalised counts of the confident observers' answers (10) and a "no hint" flag (1). The counts enter the
    head and are also added to the logits times a learned gain (``hint_gain``)."""

    def __init__(self, width: int = 32, seed: int = 0, hint_gain: float = 2.0) -> None:
        super().__init__()
        with torch.random.fork_rng():  # weights from the seed; the global generator is untouched
            torch.manual_seed(int(seed))
            self._build(width, hint_gain)

    def _build(self, width: int, hint_gain: float) -> None:
        self.features = nn.Sequential(
            nn.Conv2d(1, width // 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width // 2, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.AdaptiveMaxPool2d(1), nn.Flatten(),
        )  # fmt: skip
        self.head = nn.Sequential(nn.Linear(2 * width + HINT_DIM, 64), nn.ReLU(), nn.Linear(64, N_CLASSES))
        self.hint_gain = nn.Parameter(torch.tensor(float(hint_gain)))

    def forward(self, x: torch.Tensor, hint: torch.Tensor | None = None) -> torch.Tensor:
        x = _float_batch(
            x[:, 0] if x.ndim == 4 and x.shape[1] == 1 else x, "x", "[N, H, W] with H, W >= 4", lo=4
        )
        x = x[:, None]
        if hint is None:
            hint = no_hint(x.shape[0])
        # the observers' counts also vote directly in logit space with a learned gain: a confident image
        # (large logit margin) keeps its answer, an unsure one defers to the observers
        return self.head(torch.cat([self.features(x), hint], dim=1)) + self.hint_gain * hint[:, :N_CLASSES]


def no_hint(n: int) -> torch.Tensor:
    """``n`` empty hints: zero counts and the "no hint" flag set."""
    h = torch.zeros(n, HINT_DIM)
    h[:, -1] = 1
    return h


def _mask_batch(
    x: torch.Tensor, views: Sequence[PartialView], rng: np.random.Generator
) -> list[torch.Tensor]:
    """Each view rendered with ``mode="mask"`` per image (a fresh random window per image)."""
    out = []
    for v in views:
        m = torch.zeros_like(x)
        for i in range(x.shape[0]):
            x0, y0, x1, y1 = v.box(x[i].numpy(), rng)
            m[i, y0:y1, x0:x1] = x[i, y0:y1, x0:x1]
        out.append(m)
    return out


@torch.no_grad()
def toy_hints(
    model: HintCNN,
    x: torch.Tensor,
    views: Sequence[PartialView],
    rng: np.random.Generator,
    min_conf: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The weak agents of the toy: ``model`` (no hint) on each masked view. An observer whose max-softmax is
    below ``min_conf`` says "cannot determine" and is dropped. Returns ``(hint [N, 11], answers [N, K],
    confident [N, K])``; the hint is the confident answers' counts divided by K (flag 0)."""
    answers, conf = [], []
    for v in _mask_batch(x, views, rng):
        p = model(v).softmax(-1)
        c, a = p.max(-1)
        answers.append(a), conf.append(c >= min_conf)
    answers, confident = torch.stack(answers, 1), torch.stack(conf, 1)
    hint = torch.zeros(x.shape[0], HINT_DIM)
    hint[:, :N_CLASSES].scatter_add_(1, answers, confident.float())
    hint[:, :N_CLASSES] /= len(views)
    return hint, answers, confident


def train_hint_cnn(
    canvases_fn: Callable[[np.random.Generator], tuple[torch.Tensor, torch.Tensor]],
    epochs: int = 10,
    views: Sequence[PartialView] | None = None,
    p_hint: float = 0.4,
    p_augment: float = 0.3,
    warmup: int = 1,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    width: int = 32,
    hint_gain: float = 2.0,
    callback: Callable[[int, float], None] | None = None,
) -> HintCNN:
    """Train :class:`HintCNN` on clean canvases only. ``canvases_fn(rng) -> (x [N, 24, 24], y [N])`` draws a
    fresh epoch. Per sample: a hint with probability ``p_hint`` (after ``warmup`` epochs), built by
    :func:`toy_hints` from the model's *own* answers on the views of the clean canvas; otherwise no hint.
    ``p_augment`` of the full images get occlusion (a 6-12 px black square centred inside the subject's bounding box) plus Gaussian noise (sd 0.3)
    and always a hint — that is where the hints carry information. No attacked image is ever seen."""
    if int(epochs) < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float, np.floating, np.integer)):
        raise TypeError(f"lr must be a positive float, got {type(lr).__name__} {lr!r}")
    if not (np.isfinite(float(lr)) and float(lr) > 0):
        raise ValueError(f"lr must be a positive finite number, got {lr}")
    for name, p in (("p_hint", p_hint), ("p_augment", p_augment)):
        if not 0 <= float(p) <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {p}")
    views = (
        list(views)
        if views is not None
        else [CenterCrop(0.5, "mask"), RandomCrop(mode="mask"), RandomCrop(mode="mask")]
    )
    rng = np.random.default_rng(seed)
    model = HintCNN(width, seed=seed, hint_gain=hint_gain)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(int(seed) + 1)
    for ep in range(int(epochs)):
        x, y = canvases_fn(rng)
        perm = torch.randperm(x.shape[0], generator=g)
        total = 0.0
        for s in range(0, x.shape[0], batch_size):
            idx = perm[s : s + batch_size]
            xb, yb = x[idx], y[idx]
            n = xb.shape[0]
            hint = no_hint(n)
            aug = torch.rand(n, generator=g) < p_augment
            if ep >= warmup and p_hint > 0:
                # every augmented sample gets its observers' hint (that is where hints inform), the rest with
                # the probability that makes the overall hinted share p_hint
                rest = max(0.0, (p_hint - p_augment) / max(1e-9, 1 - p_augment))
                use = aug | (torch.rand(n, generator=g) < rest)
                if use.any():
                    model.eval()
                    hint[use] = toy_hints(model, xb[use], views, rng)[0]
                    model.train()
            xa = xb.clone()
            for i in torch.nonzero(aug).flatten().tolist():
                # the occluder lands on the subject (its centre inside the subject's bounding box)
                s_ = int(rng.integers(6, 13))
                ys, xs = torch.nonzero(xb[i] > 0.1, as_tuple=True)
                cy = int(rng.integers(int(ys.min()), int(ys.max()) + 1)) if len(ys) else CANVAS // 2
                cx = int(rng.integers(int(xs.min()), int(xs.max()) + 1)) if len(xs) else CANVAS // 2
                y0, x0 = (
                    int(np.clip(cy - s_ // 2, 0, CANVAS - s_)),
                    int(np.clip(cx - s_ // 2, 0, CANVAS - s_)),
                )
                xa[i, y0 : y0 + s_, x0 : x0 + s_] = 0
                xa[i] = xa[i] + 0.3 * torch.randn(CANVAS, CANVAS, generator=g)
            loss = nn.functional.cross_entropy(model(xa, hint), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * n
        if callback is not None:
            callback(ep, total / x.shape[0])
    return model.eval()


@torch.no_grad()
def toy_dps(
    model: HintCNN,
    x: torch.Tensor,
    views: Sequence[PartialView],
    rng: np.random.Generator,
    min_conf: float = 0.5,
    use_hint: bool = True,
) -> dict[str, torch.Tensor]:
    """DPS with the toy: r0 = f(I, none); weak answers on the masked views, unconfident ones dropped
    ("cannot determine"); final = f(I, hint). ``use_hint=False`` is the broken variant (the supervision is
    ignored: final = r0). Returns ``r0``, ``final``, ``answers``, ``confident``, ``conf0`` (r0's max-softmax)."""
    views = list(views)
    if not views:
        raise ValueError("views must hold at least one PartialView, got an empty list")
    x = _float_batch(x, "x", "[N, H, W] with H, W >= 4", lo=4)
    p0 = model(x).softmax(-1)
    hint, answers, confident = toy_hints(model, x, views, rng, min_conf)
    final = model(x, hint).argmax(-1) if use_hint else p0.argmax(-1)
    return {
        "r0": p0.argmax(-1),
        "final": final,
        "answers": answers,
        "confident": confident,
        "conf0": p0.max(-1).values,
    }
