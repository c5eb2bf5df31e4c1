"""URAE: Ultra-Resolution Adaptation with Ease — ICML 2025, P28: reproduction of the guidance rule.

Yu et al., ICML 2025 (arXiv 2503.16322; official code ``Huage001/URAE``). Claim checked: when a
guidance-distilled flow model (it takes the guidance scale ``g`` as input) is adapted to a new data distribution
with the plain flow-matching loss, feeding ``g = 1`` during adaptation keeps the distilled guidance, while feeding
the sampling scale (``g = 3.5``, the diffusers default) teaches the ``g = 3.5`` pathway to output unguided
velocities and so destroys guidance at inference.

2-D stand-in for the resolution change: K = 8 Gaussian classes (σ = 0.7) on a circle of radius 2. (i) A teacher
flow MLP (3 × 128, SiLU; class dropout 0.2 for the unconditional branch); (ii) a guidance-embedded student
``v(x, t, c, g)`` distilled to the teacher's CFG velocity ``v_u + g (v_c − v_u)`` for ``g ~ U[1, 5]``;
(iii) the "new resolution": the circle's radius becomes 3; two copies of the student are fine-tuned on 2,000
new samples with :func:`~icml25.generative_models.urae.flow_matching_finetune_step`, one fed ``g = 1`` (the
rule), one fed ``g = 3.5`` (the baseline); (iv) the reference is a teacher retrained on the new data and
sampled with CFG ``g = 3.5``. Metrics at inference ``g = 3.5`` (Euler, 50 steps): sliced W1 to the reference,
class precision (share of samples the Bayes classifier of the new data assigns to the requested class), mean
radius (CFG pushes samples outwards), and, directly on a grid of ``(x, t, c)``, the share of the student's
guidance gap ``‖v(·, 3.5) − v(·, 1)‖²`` that survives fine-tuning (the quick gate).

Part B (full only): minor-component adapters vs LoRA when a fully-convolutional flow pretrained on 8x8 sklearn
digits is adapted to 16x16 (bilinearly upsampled) digits from 300 clean or noisy (noise 0.15, random blur) images;
MMD (RBF, pixel space) of generated samples to held-out clean digits. Gated: every adapted model beats the
unadapted one, and clean-data training beats noisy-data training; minor vs LoRA is reported (paired ratio, sign
count), not gated.

Run: ``python -m icml25.generative_models.experiments.urae [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from icml25.generative_models.common.metrics import sliced_wasserstein
from icml25.generative_models.urae import apply_lora_adapters, apply_svd_adapters, flow_matching_finetune_step
from icml25.kernels.experiment import (
    Check,
    Report,
    experiment_main,
    new_figure,
    progress,
    save_figure,
    seed_everything,
    threshold_text,
    torch_threads,
)

PAPER = "P28"
CLAIM = (
    "Adapting a guidance-distilled flow model with the flow-matching loss must feed guidance g = 1: the g = 1 "
    "rule keeps the distilled guidance (samples at g = 3.5 closer to the CFG reference, higher class precision), "
    "while training with g = 3.5 pulls the guided pathway onto unguided velocities."
)
INFER_G = 3.5


@dataclass(frozen=True)
class Setting:
    """One reproduction scale (planned: part A teacher 3,000 steps, student 1,500, fine-tune 400, 4,000 samples,
    3 seeds; part B 600 adaptation steps, 1,000 samples, 5 seeds)."""

    name: str
    n_seeds: int
    teacher_steps: int
    student_steps: int
    finetune_steps: int
    sample: bool
    """Draw samples and compare with a retrained reference (full only; quick gates the grid measurement)."""
    n_samples: int = 4000
    n_classes: int = 8
    blob_std: float = 0.7
    radius_old: float = 2.0
    radius_new: float = 3.0
    n_new: int = 2000
    hidden: int = 128
    batch_size: int = 512
    lr: float = 1e-3
    swd_ratio: float = 0.75
    """SWD(g = 1 rule) <= swd_ratio × SWD(g = 3.5 rule) (mean over seeds)."""
    precision_gap: float = 0.03
    """precision(g = 1 rule) >= precision(g = 3.5 rule) + precision_gap (mean over seeds)."""
    retained_ratio: float = 0.8
    """retained guidance gap of the g = 3.5 rule <= retained_ratio × that of the g = 1 rule."""
    part_b_seeds: int = 0
    """Seeds of part B, minor components vs LoRA on upsampled digits (plan: 5; 0: skipped, as in quick)."""
    part_b_steps: int = 600
    """Part B adaptation steps per arm and learning rate (plan: 600)."""
    part_b_samples: int = 1000
    """Part B generated 16x16 samples per model for the MMD (plan: 1,000)."""


QUICK = Setting("quick", n_seeds=1, teacher_steps=300, student_steps=300, finetune_steps=100, sample=False)
FULL = Setting(
    "full", n_seeds=3, teacher_steps=3000, student_steps=1500, finetune_steps=400, sample=True, part_b_seeds=5
)


def checks(setting: Setting) -> list[Check]:
    """The pass rule: the grid mechanism (both scales) and, in full, the sample-level criteria and part B's two
    sanity checks."""
    out = [
        Check(
            f"g = 3.5 rule erases the guidance pathway: retained guidance gap <= {setting.retained_ratio:g} x "
            "that of the g = 1 rule (grid of x, t, c; mean over seeds)",
            lambda m: m["retained_gap_g35"] <= setting.retained_ratio * m["retained_gap_g1"],
        )
    ]
    if setting.sample:
        out += [
            Check(
                f"SWD to the CFG reference at g = 3.5: g = 1 rule <= {setting.swd_ratio:g} x g = 3.5 rule "
                "(mean over seeds)",
                lambda m: m["swd_g1"] <= setting.swd_ratio * m["swd_g35"],
            ),
            Check(
                f"class precision at g = 3.5: g = 1 rule >= g = 3.5 rule + {setting.precision_gap:g} (mean over seeds)",
                lambda m: m["precision_g1"] >= m["precision_g35"] + setting.precision_gap,
            ),
        ]
    if setting.part_b_seeds:
        out += [
            Check(
                "part B: every adapted model (minor and LoRA, clean and noisy data, every seed) has a lower MMD "
                "to clean 16x16 digits than the unadapted one",
                lambda m: m["b_adapted_beat_unadapted"] == 1.0,
            ),
            Check(
                "part B: clean-data training reaches a lower MMD than noisy-data training at equal steps, for "
                "minor and LoRA (mean over seeds)",
                lambda m: all(m[f"b_mmd_{a}_clean"] < m[f"b_mmd_{a}_noisy"] for a in ("minor", "lora")),
            ),
        ]
    return out


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    return threshold_text(checks(QUICK if quick else FULL))


class FlowMLP(nn.Module):
    """``v(x, t, c[, g])`` for 2-D data: one-hot class (index K = null), 3 SiLU layers."""

    def __init__(self, n_classes: int, hidden: int = 128, guidance: bool = False) -> None:
        super().__init__()
        self.k = n_classes
        self.config = {"guidance_embeds": guidance}
        d = 2 + 1 + n_classes + 1 + int(guidance)
        self.net = nn.Sequential(
            nn.Linear(d, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
            nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 2),
        )  # fmt: skip

    def forward(self, x: Tensor, t: Tensor, c: Tensor, g: Tensor | None = None) -> Tensor:
        parts = [x, t.reshape(-1, 1).expand(len(x), 1), nn.functional.one_hot(c, self.k + 1).to(x)]
        if self.config["guidance_embeds"]:
            parts.append(g.reshape(-1, 1).expand(len(x), 1).to(x) / 5.0)
        return self.net(torch.cat(parts, 1))


def centres(setting: Setting, radius: float) -> Tensor:
    ang = 2 * math.pi * torch.arange(setting.n_classes) / setting.n_classes
    return radius * torch.stack([ang.cos(), ang.sin()], 1)


def blobs(setting: Setting, n: int, radius: float, g: torch.Generator) -> tuple[Tensor, Tensor]:
    c = torch.randint(setting.n_classes, (n,), generator=g)
    return centres(setting, radius)[c] + setting.blob_std * torch.randn(n, 2, generator=g), c


def cfg_velocity(teacher: FlowMLP, x: Tensor, t: Tensor, c: Tensor, g: Tensor | float) -> Tensor:
    vc = teacher(x, t, c)
    vu = teacher(x, t, torch.full_like(c, teacher.k))
    g = torch.as_tensor(g, dtype=x.dtype).reshape(-1, 1)
    return vu + g * (vc - vu)


def train_teacher(setting: Setting, x_all: Tensor, c_all: Tensor, gen: torch.Generator) -> FlowMLP:
    model = FlowMLP(setting.n_classes, setting.hidden)
    opt = torch.optim.Adam(model.parameters(), setting.lr)
    for _ in range(setting.teacher_steps):
        idx = torch.randint(len(x_all), (setting.batch_size,), generator=gen)
        c = torch.where(torch.rand(setting.batch_size, generator=gen) < 0.2, setting.n_classes, c_all[idx])
        flow_matching_finetune_step(model, x_all[idx], c, guidance=None, optimizer=opt, generator=gen)
    return model


def distil_student(setting: Setting, teacher: FlowMLP, gen: torch.Generator) -> FlowMLP:
    student = FlowMLP(setting.n_classes, setting.hidden, guidance=True)
    opt = torch.optim.Adam(student.parameters(), setting.lr)
    for _ in range(setting.student_steps):
        x0, c = blobs(setting, setting.batch_size, setting.radius_old, gen)
        t = torch.rand(setting.batch_size, generator=gen)
        x_t = (1 - t[:, None]) * x0 + t[:, None] * torch.randn(x0.shape, generator=gen)
        g = 1 + 4 * torch.rand(setting.batch_size, generator=gen)
        with torch.no_grad():
            target = cfg_velocity(teacher, x_t, t, c, g)
        loss = ((student(x_t, t, c, g) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return student


def finetune(
    setting: Setting, student: FlowMLP, x_new: Tensor, c_new: Tensor, guidance: float, seed: int
) -> FlowMLP:
    model = copy.deepcopy(student)
    opt = torch.optim.Adam(model.parameters(), setting.lr)
    gen = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings():  # the g = 3.5 arm is the deliberate misuse the warning is about
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(setting.finetune_steps):
            idx = torch.randint(len(x_new), (min(256, len(x_new)),), generator=gen)
            flow_matching_finetune_step(
                model, x_new[idx], c_new[idx], guidance=guidance, optimizer=opt, generator=gen
            )
    return model


def _grid(setting: Setting) -> tuple[Tensor, Tensor, Tensor]:
    lin = torch.linspace(-4.5, 4.5, 13)
    xy = torch.cartesian_prod(lin, lin)
    ts = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9])
    cs = torch.arange(setting.n_classes)
    ix, it, ic = torch.meshgrid(torch.arange(len(xy)), torch.arange(len(ts)), cs, indexing="ij")
    return xy[ix.flatten()], ts[it.flatten()], ic.flatten()


def guidance_gap(model: FlowMLP, grid: tuple[Tensor, Tensor, Tensor]) -> float:
    """Mean ``‖v(x, t, c, 3.5) − v(x, t, c, 1)‖²`` over the grid: how much guidance the model still applies."""
    x, t, c = grid
    with torch.no_grad():
        hi = model(x, t, c, torch.full((len(x),), INFER_G))
        lo = model(x, t, c, torch.ones(len(x)))
    return float(((hi - lo) ** 2).sum(1).mean())


def sample(velocity, setting: Setting, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Euler, 50 steps from t = 1 (noise) to 0; classes balanced."""
    n = setting.n_samples
    c = torch.arange(n) % setting.n_classes
    x = torch.randn(n, 2, generator=gen)
    ts = torch.linspace(1, 0, 51)
    with torch.no_grad():
        for t0, t1 in itertools.pairwise(ts):
            x = x + (t1 - t0) * velocity(x, t0.expand(n), c)
    return x, c


def precision(setting: Setting, x: Tensor, c: Tensor) -> float:
    """Share of samples the Bayes classifier of the new data (nearest centre) assigns to the requested class."""
    return float((torch.cdist(x, centres(setting, setting.radius_new)).argmin(1) == c).double().mean())


# ---- Part B (reported, not gated): minor components vs LoRA when adapting 8x8 digits to 16x16 --------------


class ConvFlow(nn.Module):
    """A fully-convolutional flow ``v(x, t)`` (time as an extra channel), so one model runs at 8x8 and 16x16."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.config = {"guidance_embeds": False}
        self.net = nn.Sequential(
            nn.Conv2d(2, width, 3, padding=1), nn.SiLU(), nn.Conv2d(width, width, 3, padding=1), nn.SiLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.SiLU(), nn.Conv2d(width, 1, 3, padding=1),
        )  # fmt: skip

    def forward(self, x: Tensor, t: Tensor, cond: object = None) -> Tensor:
        return self.net(torch.cat([x, t.reshape(-1, 1, 1, 1).expand(len(x), 1, *x.shape[2:])], 1))


def _digits() -> Tensor:
    from sklearn.datasets import load_digits

    return torch.tensor(load_digits().images, dtype=torch.float32)[:, None] / 8.0 - 1.0


def _train_flow(
    model: nn.Module, params, data: Tensor, steps: int, lr: float, gen: torch.Generator
) -> nn.Module:
    opt = torch.optim.Adam(params, lr)
    for _ in range(steps):
        idx = torch.randint(len(data), (32,), generator=gen)
        flow_matching_finetune_step(model, data[idx], None, guidance=None, optimizer=opt, generator=gen)
    return model


def _sample_images(model: nn.Module, n: int, size: int, gen: torch.Generator) -> Tensor:
    x = torch.randn(n, 1, size, size, generator=gen)
    ts = torch.linspace(1, 0, 21)
    with torch.no_grad():
        for t0, t1 in itertools.pairwise(ts):
            x = x + (t1 - t0) * model(x, t0.expand(n))
    return x


def mmd_rbf(x: Tensor, y: Tensor) -> float:
    """Unbiased MMD² with an RBF kernel (median-heuristic bandwidth on the pooled samples), pixel space."""
    x, y = x.flatten(1).double(), y.flatten(1).double()
    z = torch.cat([x, y])
    d = torch.cdist(z, z) ** 2
    k = torch.exp(-d / d[d > 0].median())
    n, m = len(x), len(y)
    kxx, kyy, kxy = k[:n, :n], k[n:, n:], k[:n, n:]
    return float(
        (kxx.sum() - kxx.trace()) / (n * (n - 1)) + (kyy.sum() - kyy.trace()) / (m * (m - 1)) - 2 * kxy.mean()
    )


def part_b(setting: Setting, seed: int, m: dict[str, float]) -> None:
    """Pretrain on 8x8 digits; adapt to 16x16 (bilinear) on 300 clean or noisy images (noise 0.15, random blur),
    rank 4 on the three hidden convs (the output conv has one channel), ``setting.part_b_steps`` steps, lr in
    {1e-3, 3e-3} per arm (the better MMD is kept); MMD of ``setting.part_b_samples`` samples to the 297 held-out
    clean 16x16 digits."""
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    digits = _digits()[torch.randperm(1797, generator=gen)]
    base = ConvFlow()
    _train_flow(base, list(base.parameters()), digits[:1200], 600, 2e-3, gen)
    up = F.interpolate(digits, size=16, mode="bilinear", align_corners=False)
    train, held = up[1200:1500], up[1500:1800]
    blur = F.avg_pool2d(F.pad(train, (1, 1, 1, 1), mode="replicate"), 3, 1)
    w = torch.rand(len(train), 1, 1, 1, generator=gen)
    noisy = (1 - w) * train + w * blur + 0.15 * torch.randn(train.shape, generator=gen)
    targets = ["net.0", "net.2", "net.4"]
    n = setting.part_b_samples
    m[f"b_mmd_unadapted_s{seed}"] = mmd_rbf(
        _sample_images(base, n, 16, torch.Generator().manual_seed(seed)), held
    )
    for regime, data in (("clean", train), ("noisy", noisy)):
        for arm in ("minor", "lora"):
            best = math.inf
            for lr in (1e-3, 3e-3):
                model = copy.deepcopy(base)
                if arm == "minor":
                    params = apply_svd_adapters(model, targets, rank=4, reshape_conv=True)
                else:
                    params = apply_lora_adapters(model, targets, rank=4, reshape_conv=True, generator=gen)
                _train_flow(
                    model, params, data, setting.part_b_steps, lr, torch.Generator().manual_seed(seed + 1)
                )
                x = _sample_images(model, n, 16, torch.Generator().manual_seed(seed))
                best = min(best, mmd_rbf(x, held))
            m[f"b_mmd_{arm}_{regime}_s{seed}"] = best


def evaluate(
    setting: Setting, seed: int = 0, out_dir: str | Path | None = None, broken: bool = False
) -> Report:
    """Run the toy for ``setting.n_seeds`` seeds; ``broken=True`` is the deliberately broken variant (the
    guidance argument is ignored: both arms train with the diffusers default 3.5)."""
    t_start = time.perf_counter()
    m: dict[str, float] = {}
    seeds = [seed + s for s in range(setting.n_seeds)]
    grid = _grid(setting)
    store: dict[str, tuple[Tensor, Tensor]] = {}
    for s in progress(seeds, desc="P28 guidance rule"):
        gen = torch.Generator().manual_seed(s)
        torch.manual_seed(s)
        x_old, c_old = blobs(setting, 20_000, setting.radius_old, gen)
        teacher = train_teacher(setting, x_old, c_old, gen)
        student = distil_student(setting, teacher, gen)
        x_new, c_new = blobs(setting, setting.n_new, setting.radius_new, gen)
        gap0 = guidance_gap(student, grid)
        arms = {"g1": 1.0 if not broken else INFER_G, "g35": INFER_G}
        tuned = {k: finetune(setting, student, x_new, c_new, g, 1000 + s) for k, g in arms.items()}
        m[f"gap_student_s{s}"] = gap0
        for k, mod in tuned.items():
            m[f"retained_gap_{k}_s{s}"] = guidance_gap(mod, grid) / gap0
        if setting.sample:
            x_ref_data, c_ref_data = blobs(setting, 20_000, setting.radius_new, gen)
            ref = train_teacher(setting, x_ref_data, c_ref_data, gen)
            xr, cr = sample(
                lambda x, t, c, ref=ref: cfg_velocity(ref, x, t, c, INFER_G),
                setting,
                torch.Generator().manual_seed(7 + s),
            )
            xu, cu = sample(
                lambda x, t, c, ref=ref: ref(x, t, c), setting, torch.Generator().manual_seed(7 + s)
            )
            m[f"precision_reference_s{s}"] = precision(setting, xr, cr)
            m[f"precision_reference_unguided_s{s}"] = precision(setting, xu, cu)
            m[f"radius_reference_s{s}"] = float(xr.norm(dim=1).mean())
            if s == seeds[0]:
                store["reference (CFG g = 3.5)"] = (xr, cr)
            for k, mod in tuned.items():
                xs, cs = sample(
                    lambda x, t, c, mod=mod: mod(x, t, c, torch.full((len(x),), INFER_G)),
                    setting, torch.Generator().manual_seed(7 + s),
                )  # fmt: skip
                m[f"swd_{k}_s{s}"] = sliced_wasserstein(xs.double(), xr.double(), 200, seed=s)
                m[f"precision_{k}_s{s}"] = precision(setting, xs, cs)
                m[f"radius_{k}_s{s}"] = float(xs.norm(dim=1).mean())
                if s == seeds[0]:
                    store[f"adapted with g = {arms[k]:g}, sampled at 3.5"] = (xs, cs)
    b_seeds = [seed + s for s in range(setting.part_b_seeds)]
    for s in progress(b_seeds, desc="P28 part B: minor vs LoRA"):
        part_b(setting, s, m)
    if b_seeds:
        ratios = [m[f"b_mmd_minor_noisy_s{s}"] / m[f"b_mmd_lora_noisy_s{s}"] for s in b_seeds]
        m["b_ratio_minor_over_lora_noisy"] = float(np.mean(ratios))
        m["b_minor_wins_noisy"] = float(sum(r <= 1 for r in ratios))
        m["b_adapted_beat_unadapted"] = float(
            all(
                m[f"b_mmd_{a}_{r}_s{s}"] < m[f"b_mmd_unadapted_s{s}"]
                for a in ("minor", "lora")
                for r in ("clean", "noisy")
                for s in b_seeds
            )
        )
        m["b_clean_beats_noisy_every_seed"] = float(
            all(
                m[f"b_mmd_{a}_clean_s{s}"] < m[f"b_mmd_{a}_noisy_s{s}"]
                for a in ("minor", "lora")
                for s in b_seeds
            )
        )
    keys = {k.rsplit("_s", 1)[0] for k in m if "_s" in k and k.rsplit("_s", 1)[1].isdigit()}
    for key in sorted(keys):
        vals = [m[f"{key}_s{s}"] for s in (b_seeds if key.startswith("b_") else seeds)]
        m[key] = float(np.mean(vals))
        if len(vals) > 1:
            m[f"{key}_std"] = float(np.std(vals))
    m["total_seconds"] = time.perf_counter() - t_start
    figures = [plot(out_dir, store)] if out_dir is not None and store else []
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        metrics=m,
        headline="swd_g1" if setting.sample else "retained_gap_g1",
        baseline="swd_g35" if setting.sample else "retained_gap_g35",
        figures=figures,
        seeds=seeds,
        notes=(
            f"K = {setting.n_classes} blobs, std {setting.blob_std:g}, radius {setting.radius_old:g} -> "
            f"{setting.radius_new:g}; teacher {setting.teacher_steps}, student {setting.student_steps}, fine-tune "
            f"{setting.finetune_steps} steps (Adam {setting.lr:g}, full fine-tuning); inference g = {INFER_G:g}"
            + ("; broken variant: the guidance argument ignored (both arms fed 3.5)" if broken else "")
        ),
    )


def plot(out_dir: str | Path, store: dict[str, tuple[Tensor, Tensor]]) -> Path:
    """Samples at inference g = 3.5 of the reference and of the two adaptation rules, coloured by class."""
    fig, axes = new_figure(1, len(store), figsize=(4.2 * len(store), 4.2))
    for ax, (title, (x, c)) in zip(np.atleast_1d(axes), store.items(), strict=True):
        ax.scatter(x[:, 0], x[:, 1], c=c, s=1, cmap="tab10", alpha=0.4)
        ax.set_xlim(-6, 6)
        ax.set_ylim(-6, 6)
        ax.set_aspect("equal")
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out_dir, "p28_guidance_rule")


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce the guidance rule at small scale (see the module docstring)."""
    seed_everything(seed)
    with torch_threads(1):
        return evaluate(QUICK if quick else FULL, seed, out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
