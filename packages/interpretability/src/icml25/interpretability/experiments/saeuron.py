"""SAeUron: Interpretable Concept Unlearning in Diffusion Models with Sparse Autoencoders — ICML 2025, P19: small-scale reproduction.

Cywiński & Deja, ICML 2025 (arXiv 2501.18052; official code ``cywinski/SAeUron``). Claim: SAE features of one
diffusion-model block, selected per timestep by the contrastive importance score and scaled by a negative
factor where they fire above their cross-concept mean, remove a concept from the samples (high unlearning
accuracy) while the other concepts are generated as before (retain accuracy near the original model); random
features of the same count do not remove it.

:data:`FULL` (the paper's UnlearnCanvas setting on SD-v1.5 does not fit a CPU; the plan's §11 regime): a tiny
class-conditional ``diffusers.UNet2DModel`` (``num_class_embeds=10``, ``block_out_channels=(32, 64)``, one
ResNet layer per block) trained with a 50-step ``DDPMScheduler`` on sklearn's 8×8 digits upsampled to 16×16,
"concept = digit class". The hooked block is ``up_blocks.0``, whose output ``[B, 64, 16, 16]`` gives one
64-d SAE input per spatial position (256 per image), as in the paper; the hook encodes every patch with
per-patch top-k, scales the masked selected latents and adds the SAE error back. Activations over all 50
steps of 100 samples per class train a BatchTopK SAE (1,024 latents = expansion 16, k = 16); the plan
removes "3" with q = 99.9 and γ = −2. 200 "3" samples and 50 of each other class are drawn with the same
noise under each arm: no intervention, SAeUron, random features (same count and scaling), random features
among those active on "3", and the top features by raw mean activation on "3" (no contrast). Samples are
2×2-average-pooled back to 8×8 for a logistic regression on real digits (the evaluator) and the
nearest-real-digit distance. Mean over 2 seeds. Precondition (else INCONCLUSIVE): the unhooked samples are
classified as their prompt ≥ 80% of the time (the generator draws recognisable digits). Pass rule
(:func:`checks`): UA ≥ 0.75; IRA drop ≤ 0.10; random-feature UA ≤ 0.35; random-active UA ≤ UA − 0.3; UA ≥
raw-mean UA or IRA ≥ raw-mean IRA + 0.05; a quality gate on the intervened "3" samples (mean distance to the
nearest held-out real digit ≤ 1.5 × that of the unintervened samples; evaluator's mean max-probability ≥
0.7). A γ sweep {−0.5, −1, −2, −5} of UA and that distance is reported. Needs ``diffusers``.

:data:`MLP_DIGITS` (the plan's §6 setting, the full run recorded before the §11 regime; same arms, checks and
precondition): a class-conditional MLP DDPM (:class:`~icml25.interpretability.saeuron.DigitsDDPM`, T = 50,
hidden 256, 2,500 Adam steps at batch 128) on the 8×8 digits, hooked where time and class embeddings enter
(one SAE input per image); BatchTopK SAE with 2,048 latents, k = 16, 1,500 steps.

:data:`QUICK`: synthetic block activations with 5 planted concepts (each carried by one dictionary atom in the
first half of the steps and another in the second half, so per-timestep selection is needed) over shared
background atoms, 4 patches per sample, and an SAE whose dictionary is the known one. Pass rule: the selected
features are the planted ones (precision ≥ 0.9); after :func:`~icml25.interpretability.saeuron.intervene` a
least-squares linear probe's score for the target concept drops by ≥ 80%, the other concepts' scores change by
≤ 5%, and the drop beats random features of the same count and scaling by ≥ 0.5.

Run: ``python -m icml25.interpretability.experiments.saeuron [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icml25.interpretability.sae import TopKSAE
from icml25.interpretability.saeuron import (
    ActivationCapture,
    DigitsDDPM,
    SAEUnlearningHook,
    UnlearningPlan,
    concept_feature_scores,
    concept_latents,
    ddpm_sample,
    fit_block_sae,
    intervene,
    select_features,
    train_ddpm,
)
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
from icml25.kernels.rng import isolated_rng, make_generator

PAPER = "P19"
CLAIM = (
    "Scaling the contrastively selected SAE features of one diffusion block by a negative factor, per timestep, "
    "removes the target concept from the samples (high unlearning accuracy) while other concepts are kept "
    "(retain accuracy near the unhooked model); random features of the same count do not remove it."
)


@dataclass(frozen=True)
class Setting:
    """One reproduction scale."""

    kind: str
    """``"unet"`` (a diffusers UNet2DModel on 16×16 digits, one SAE input per spatial position), ``"digits"``
    (an MLP DDPM on 8×8 digits, one SAE input per image) or ``"synthetic"`` (planted concepts, known SAE
    dictionary)."""
    n_seeds: int = 2
    """Seeds averaged (ours 2, as planned; the paper reports one run per class)."""
    percentile: float = 99.9
    """Selection percentile q (paper 99.999 of 20,480 features, about 1–2 per step; ours 99.9 of 2,048, quick 97 of 32: exactly one)."""
    multiplier: float = -2.0
    """γ (paper −1 for styles, tuned in {−1, …, −30} for objects; ours −2, quick −1)."""
    n_steps: int = 50
    """Sampling steps T (paper 100 DDIM steps at guidance 9.0; ours 50 DDPM steps, no CFG; quick 6)."""
    ddpm_train_steps: int = 2500
    """Denoiser training steps (paper: SD-v1.5 fine-tuned on UnlearnCanvas; planned 4,000 at batch 256 for the
    MLP; MLP ours 2,500 at batch 128: the CPU budget, 95% of its samples are classified as their prompt; UNet
    1,500 at batch 64: measured on seed 0, 400 steps gave 67% and 1,000 steps 90% of unhooked samples classified
    as their prompt, against the 80% precondition)."""
    ddpm_batch: int = 128
    """Denoiser training batch (MLP 128; UNet 64: a UNet step at batch 64 costs 0.8 s on one core)."""
    ddpm_lr: float = 2e-3
    """Denoiser learning rate (Adam, cosine decay)."""
    block: str = "block"
    """The hooked module (paper ``up_blocks.1.attentions.1`` of SD-v1.5; UNet ``up_blocks.0``, MLP ``block``)."""
    hidden: int = 256
    """The hooked block's channels d (paper 1,280 in up_blocks.1.attentions.1; MLP width 256; UNet: up_blocks.0
    has 64, fixed by the architecture)."""
    collect_per_class: int = 100
    """Samples per concept whose activations train the SAE and give the statistics (paper: 80 prompts per
    object / style; ours 100)."""
    d_sae: int = 2048
    """SAE latents (paper expansion 16, 20,480; UNet 16× of 64 channels, 1,024; MLP 8×, 2,048; quick the known
    32-atom dictionary)."""
    sae_k: int = 16
    """Active latents per input (paper 32; ours 16, quick 4)."""
    sae_steps: int = 1500
    """SAE training steps (paper 5 epochs at batch 4,096; MLP 1,500 at batch 256, about 8 epochs; UNet 2,000 at
    batch 4,096 over a 2^20-patch subsample of the 12.8M captured patches)."""
    sae_batch: int = 256
    """SAE training batch (paper 4,096; MLP 256, UNet 4,096)."""
    sae_lr: float = 1e-3
    """SAE learning rate (paper 4e-4 with linear decay; ours 1e-3 with linear decay: far fewer steps)."""
    n_target: int = 200
    """Evaluation samples of the target concept "3" (ours 200)."""
    n_other: int = 50
    """Evaluation samples of every other class (ours 50)."""
    gammas: tuple[float, ...] = (-0.5, -1.0, -2.0, -5.0)
    """γ sweep reported next to the gate (ours; the paper tunes γ per object)."""
    n_concepts: int = 5
    """Quick: planted concepts."""
    n_per_concept: int = 40
    """Quick: samples per concept (4 patches each)."""


FULL = Setting(
    kind="unet", ddpm_train_steps=1500, ddpm_batch=64, block="up_blocks.0", hidden=64, d_sae=1024,
    sae_steps=2000, sae_batch=4096,
)  # fmt: skip
MLP_DIGITS = Setting(kind="digits")
QUICK = Setting(kind="synthetic", n_seeds=2, percentile=97.0, multiplier=-1.0, n_steps=6, sae_k=4)

TARGET = "3"
MIN_UA = 0.75
MAX_IRA_DROP = 0.10
MAX_RANDOM_UA = 0.35
RANDOM_ACTIVE_MARGIN = 0.3
RAW_IRA_MARGIN = 0.05
MAX_NN_RATIO = 1.5
MIN_MAXPROB = 0.7
MIN_UNHOOKED_ACC = 0.8
SAE_MAX_PATCHES = 1 << 20
UNET_CHUNK = 128
MIN_PRECISION = 0.9
MIN_PROBE_DROP = 0.8
MAX_OTHER_CHANGE = 0.05
PROBE_MARGIN = 0.5


def checks(setting: Setting) -> list[Check]:
    """The pass rule of ``setting`` (see the module docstring)."""
    if setting.kind == "synthetic":
        return [
            Check(f"selection precision >= {MIN_PRECISION:g}", lambda m: m["precision"] >= MIN_PRECISION),
            Check(f"target probe drop >= {MIN_PROBE_DROP:g}", lambda m: m["probe_drop"] >= MIN_PROBE_DROP),
            Check(f"other concepts' probe change <= {MAX_OTHER_CHANGE:g}",
                  lambda m: m["other_probe_change"] <= MAX_OTHER_CHANGE),
            Check(f"target probe drop >= random-feature drop + {PROBE_MARGIN:g}",
                  lambda m: m["probe_drop"] >= m["baseline_probe_drop_random"] + PROBE_MARGIN),
        ]  # fmt: skip
    return [
        Check(f"UA >= {MIN_UA:g}", lambda m: m["ua"] >= MIN_UA),
        Check(f"IRA drop <= {MAX_IRA_DROP:g}", lambda m: m["ira_none"] - m["ira"] <= MAX_IRA_DROP),
        Check(f"random-feature UA <= {MAX_RANDOM_UA:g}", lambda m: m["baseline_ua_random"] <= MAX_RANDOM_UA),
        Check(f"random-active-feature UA <= UA - {RANDOM_ACTIVE_MARGIN:g}",
              lambda m: m["ua_random_active"] <= m["ua"] - RANDOM_ACTIVE_MARGIN),
        Check(f"UA >= raw-mean UA or IRA >= raw-mean IRA + {RAW_IRA_MARGIN:g}",
              lambda m: m["ua"] >= m["ua_raw_mean"] or m["ira"] >= m["ira_raw_mean"] + RAW_IRA_MARGIN),
        Check(f"nearest-real distance of unlearned samples <= {MAX_NN_RATIO:g} x unhooked",
              lambda m: m["nn_dist_ratio"] <= MAX_NN_RATIO),
        Check(f"evaluator max-probability on unlearned samples >= {MIN_MAXPROB:g}",
              lambda m: m["maxprob"] >= MIN_MAXPROB),
    ]  # fmt: skip


def preconditions(setting: Setting) -> list[Check]:
    """When the comparison can show the effect at all: the unhooked generator draws digits the evaluator reads
    as their prompt (else unlearning accuracy would measure a broken generator; quick has none)."""
    if setting.kind == "synthetic":
        return []
    return [
        Check(
            f"unhooked samples classified as their prompt >= {MIN_UNHOOKED_ACC:g}",
            lambda m: m["acc_none"] >= MIN_UNHOOKED_ACC,
        )
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    return threshold_text(checks(QUICK if quick else FULL))


# ----------------------------------------------------------------------------------------- selections
Selector = Callable[[Mapping[str, torch.Tensor], str, float, int], list[torch.Tensor]]


def contrastive_features(
    latents: Mapping[str, torch.Tensor], concept: str, percentile: float, seed: int
) -> list[torch.Tensor]:
    """SAeUron's selection: per step, the features scoring above the percentile."""
    scores = concept_feature_scores(latents, concept)
    return [select_features(s, percentile) for s in scores]


def random_features(
    latents: Mapping[str, torch.Tensor], concept: str, percentile: float, seed: int, active_only: bool = False
) -> list[torch.Tensor]:
    """Random features, as many per step as SAeUron selects (``active_only``: among those with μ(i,t,c) > 0)."""
    counts = [len(f) for f in contrastive_features(latents, concept, percentile, seed)]
    mu = latents[concept].mean(dim=0)
    g = make_generator(seed + 17)
    out = []
    for t, n in enumerate(counts):
        pool = torch.nonzero(mu[t] > 0).flatten() if active_only else torch.arange(mu.shape[1])
        out.append(pool[torch.randperm(len(pool), generator=g)[: min(n, len(pool))]])
    return out


def raw_mean_features(
    latents: Mapping[str, torch.Tensor], concept: str, percentile: float, seed: int
) -> list[torch.Tensor]:
    """The top features by raw mean activation on the concept (no contrast), as many per step as SAeUron."""
    counts = [len(f) for f in contrastive_features(latents, concept, percentile, seed)]
    mu = latents[concept].mean(dim=0)
    return [torch.topk(mu[t], n).indices for t, n in enumerate(counts)]


# ----------------------------------------------------------------------------------------- quick: synthetic
def planted_activations(
    setting: Setting, seed: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, list[int]]]:
    """Block activations ``{concept: [n, T, 4, d]}`` with planted concepts, the dictionary ``[F, d]`` (orthonormal,
    ``F = d = 32``) and each concept's planted atom per step.

    Concept c is atom c in the first half of the steps and atom ``n_concepts + c`` in the second half, on 3 of 4
    patches on average, with a step-dependent amplitude; every patch also carries 2 of the remaining background
    atoms (shared by all concepts) and 1% noise.
    """
    g = make_generator(seed)
    d, C, T, n, P = 32, setting.n_concepts, setting.n_steps, setting.n_per_concept, 4
    D = torch.linalg.qr(torch.randn(d, d, generator=g))[0].T.contiguous()  # rows: orthonormal atoms
    background = torch.arange(2 * C, d)
    acts, atoms = {}, {}
    ramp = torch.linspace(1.5, 0.75, T)
    for c in range(C):
        atom = [c if t < T // 2 else C + c for t in range(T)]
        coef = torch.zeros(n, T, P, d)
        on = torch.rand(n, T, P, generator=g) < 0.75
        amp = (1 + torch.rand(n, T, P, generator=g)) * ramp[None, :, None] * on
        for t in range(T):
            coef[:, t, :, atom[t]] = amp[:, t]
        bg = background[torch.randint(0, len(background), (n, T, P, 2), generator=g)]
        coef.scatter_add_(-1, bg, 0.5 + torch.rand(n, T, P, 2, generator=g))
        x = coef @ D
        acts[str(c)] = x + 0.01 * torch.randn(x.shape, generator=g)
        atoms[str(c)] = atom
    return acts, D, atoms


def dictionary_sae(D: torch.Tensor, k: int) -> TopKSAE:
    """A TopK SAE whose decoder is the dictionary ``D`` [F, d] (orthonormal rows) and encoder its transpose."""
    sae = TopKSAE(D.shape[1], D.shape[0], k, seed=0)
    with torch.no_grad():
        sae.W_dec.copy_(D)
        sae.W_enc.copy_(D.T)
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae.eval()


def measure_synthetic(setting: Setting, seed: int, select: Selector) -> dict[str, float]:
    """Selection precision and linear-probe effects of SAeUron vs random features, averaged over concepts."""
    acts, D, atoms = planted_activations(setting, seed)
    sae = dictionary_sae(D, setting.sae_k)
    latents = concept_latents(sae, acts)
    names = list(acts)
    pooled = {c: a.mean(dim=2) for c, a in acts.items()}  # [n, T, d]
    X = torch.cat([pooled[c].reshape(-1, D.shape[1]) for c in names]).double()
    Y = torch.zeros(X.shape[0], len(names), dtype=torch.float64)
    rows = torch.cat([torch.full((pooled[c].shape[0] * setting.n_steps,), i) for i, c in enumerate(names)])
    Y[torch.arange(X.shape[0]), rows] = 1.0
    W = torch.linalg.lstsq(X, Y).solution  # [d, C]: the concept probe

    def probe(c: str, x: torch.Tensor) -> float:
        return float((x.mean(dim=2).double() @ W[:, names.index(c)]).mean())

    def edited(x: torch.Tensor, plan: UnlearningPlan) -> torch.Tensor:
        return torch.stack([intervene(x[:, t], sae, plan, t) for t in range(x.shape[1])], dim=1)

    out: dict[str, list[float]] = {
        k: [] for k in ("precision", "probe_drop", "other", "rand_drop", "rand_other", "n_sel")
    }
    for c in names:
        arms = {
            "method": select(latents, c, setting.percentile, seed),
            "random": random_features(latents, c, setting.percentile, seed),
        }
        for arm, feats in arms.items():
            plan = UnlearningPlan.from_features(latents, [c], feats, setting.multiplier)
            drop = 1 - probe(c, edited(acts[c], plan)) / probe(c, acts[c])
            other = max(abs(probe(o, edited(acts[o], plan)) / probe(o, acts[o]) - 1) for o in names if o != c)
            out["probe_drop" if arm == "method" else "rand_drop"].append(drop)
            out["other" if arm == "method" else "rand_other"].append(other)
        hits = [int(i) == atoms[c][t] for t, f in enumerate(arms["method"]) for i in f]
        out["precision"].append(float(np.mean(hits)) if hits else 0.0)
        out["n_sel"].append(float(np.mean([len(f) for f in arms["method"]])))
    return {
        "precision": float(np.mean(out["precision"])),
        "probe_drop": float(np.mean(out["probe_drop"])),
        "other_probe_change": float(np.max(out["other"])),
        "baseline_probe_drop_random": float(np.mean(out["rand_drop"])),
        "random_other_probe_change": float(np.max(out["rand_other"])),
        "features_per_step": float(np.mean(out["n_sel"])),
    }


# ----------------------------------------------------------------------------------------- full: digits
def digits_data(seed: int) -> dict[str, Any]:
    """sklearn's bundled digits as ``[N, 64]`` float32 in [-1, 1]: a 70% train split (DDPM and evaluator) and a
    30% held-out split (the nearest-real-digit reference)."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    perm = np.random.default_rng(seed).permutation(len(X))
    X = (X[perm] / 8.0 - 1.0).astype(np.float32)
    y = y[perm]
    n = int(0.7 * len(X))
    return {"X": X[:n], "y": y[:n], "X_ref": X[n:], "y_ref": y[n:]}


def nearest_distance(samples: np.ndarray, reference: np.ndarray) -> float:
    """Mean L2 distance of each sample ``[n, 64]`` to its nearest reference image ``[m, 64]``."""
    d2 = (samples**2).sum(1)[:, None] - 2 * samples @ reference.T + (reference**2).sum(1)[None, :]
    return float(np.sqrt(np.maximum(d2.min(axis=1), 0)).mean())


Generator = Callable[[torch.Tensor, int, Sequence[Any]], np.ndarray]
"""``(labels [B], seed, hooks) -> samples [B, 64]`` (8×8 images in [-1, 1]) of a trained denoiser."""


def _mlp_generator(
    setting: Setting, seed: int, data: Mapping[str, Any]
) -> tuple[torch.nn.Module, Generator, float]:
    """The plan's §6 MLP DDPM, trained: (model, sampler, final loss)."""
    model = DigitsDDPM(hidden=setting.hidden, n_steps=setting.n_steps, seed=seed)
    losses = train_ddpm(
        model, torch.from_numpy(data["X"]), torch.from_numpy(data["y"]), steps=setting.ddpm_train_steps,
        batch_size=setting.ddpm_batch, lr=setting.ddpm_lr, seed=seed,
    )  # fmt: skip

    def generate(labels: torch.Tensor, s: int, hooks: Sequence[Any]) -> np.ndarray:
        return ddpm_sample(model, labels, seed=s, hooks=hooks).numpy()

    return model, generate, float(np.mean(losses[-100:]))


def digits_unet(seed: int = 0) -> torch.nn.Module:
    """The plan's §11 denoiser: a class-conditional ``diffusers.UNet2DModel`` for 16×16 one-channel digits
    (``block_out_channels=(32, 64)``, one ResNet layer per block, ``num_class_embeds=10``); weights from
    ``isolated_rng(seed)``. ``up_blocks.0`` outputs ``[B, 64, 16, 16]``."""
    try:
        from diffusers import UNet2DModel
    except ImportError as err:  # pragma: no cover - exercised only without diffusers
        raise ImportError(
            "P19's full run needs diffusers: pip install 'icml25-interpretability[diffusers]'"
        ) from err
    with isolated_rng(seed):
        return UNet2DModel(
            sample_size=16, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(32, 64),
            down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
            norm_num_groups=8, num_class_embeds=10,
        )  # fmt: skip


def digits_scheduler(n_steps: int) -> Any:
    """A ``diffusers.DDPMScheduler`` with ``n_steps`` training and sampling steps and the linear β schedule of
    :class:`~icml25.interpretability.saeuron.DigitsDDPM` (1e-4·1000/T to 0.02·1000/T), posterior variance."""
    from diffusers import DDPMScheduler

    return DDPMScheduler(
        num_train_timesteps=n_steps,
        beta_start=1e-4 * 1000 / n_steps,
        beta_end=min(0.02 * 1000 / n_steps, 0.5),
    )


def upsample_digits(X: np.ndarray) -> torch.Tensor:
    """8×8 digits ``[N, 64]`` → ``[N, 1, 16, 16]`` (each pixel a 2×2 block; :func:`pool_digits` inverts it)."""
    x = torch.as_tensor(X, dtype=torch.float32).reshape(-1, 1, 8, 8)
    return torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest")


def pool_digits(x: torch.Tensor) -> torch.Tensor:
    """16×16 images ``[N, 1, 16, 16]`` → 8×8 ``[N, 64]`` by 2×2 average pooling (the evaluator's input)."""
    return torch.nn.functional.avg_pool2d(x, 2).reshape(x.shape[0], 64)


def train_unet(
    unet: torch.nn.Module, scheduler: Any, X: torch.Tensor, y: torch.Tensor, *, steps: int, batch_size: int,
    lr: float, seed: int,
) -> list[float]:  # fmt: skip
    """ε-prediction DDPM training of ``unet`` in place (Adam, cosine decay) on images ``X`` ``[N, 1, 16, 16]``
    with labels ``y`` ``[N]``; batches, times and noise from a local generator. Returns the losses."""
    g = make_generator(seed)
    T = scheduler.config.num_train_timesteps
    opt = torch.optim.Adam(unet.parameters(), lr=lr)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    unet.train()
    losses = []
    with torch.enable_grad():
        for _ in progress(range(steps), desc="P19 UNet"):
            i = torch.randint(0, X.shape[0], (batch_size,), generator=g)
            t = torch.randint(0, T, (batch_size,), generator=g)
            noise = torch.randn((batch_size, *X.shape[1:]), generator=g)
            pred = unet(scheduler.add_noise(X[i], noise, t), t, class_labels=y[i]).sample
            loss = torch.nn.functional.mse_loss(pred, noise)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            cos.step()
            losses.append(float(loss.detach()))
    unet.eval()
    return losses


@torch.no_grad()
def unet_sample(
    unet: torch.nn.Module, scheduler: Any, labels: torch.Tensor, *, seed: int, hooks: Sequence[Any] = ()
) -> torch.Tensor:
    """Ancestral sampling with ``scheduler`` (all its training steps) of 16×16 digits for ``labels`` ``[B]``, in
    chunks of 128, pooled to 8×8 ``[B, 64]`` in [-1, 1]. Before step ``i`` every hook is set to step ``i``."""
    T = scheduler.config.num_train_timesteps
    for h in hooks:
        h.check_steps(T)
    scheduler.set_timesteps(T)
    g = make_generator(seed)
    out = []
    for chunk in labels.long().split(UNET_CHUNK):
        x = torch.randn(chunk.shape[0], 1, 16, 16, generator=g)
        for i, t in enumerate(scheduler.timesteps):
            for h in hooks:
                h.set_step(i)
            eps = unet(x, t, class_labels=chunk).sample
            x = scheduler.step(eps, t, x, generator=g).prev_sample
        out.append(pool_digits(x.clamp(-1, 1)))
    return torch.cat(out)


def _unet_generator(
    setting: Setting, seed: int, data: Mapping[str, Any]
) -> tuple[torch.nn.Module, Generator, float]:
    """The plan's §11 UNet, trained: (model, sampler, final loss)."""
    unet = digits_unet(seed)
    scheduler = digits_scheduler(setting.n_steps)
    losses = train_unet(
        unet, scheduler, upsample_digits(data["X"]), torch.from_numpy(data["y"]).long(),
        steps=setting.ddpm_train_steps, batch_size=setting.ddpm_batch, lr=setting.ddpm_lr, seed=seed,
    )  # fmt: skip

    def generate(labels: torch.Tensor, s: int, hooks: Sequence[Any]) -> np.ndarray:
        return unet_sample(unet, scheduler, labels, seed=s, hooks=hooks).numpy()

    return unet, generate, float(np.mean(losses[-100:]))


def sae_training_patches(acts: Mapping[str, torch.Tensor], max_patches: int, seed: int) -> torch.Tensor:
    """The SAE's training inputs ``[N, d]``: every captured patch of every concept, or, beyond ``max_patches``,
    the same random fraction of each concept's patches."""
    flat = [a.reshape(-1, a.shape[-1]) for a in acts.values()]
    total = sum(f.shape[0] for f in flat)
    if total <= max_patches:
        return torch.cat(flat)
    g = make_generator(seed + 29)
    return torch.cat(
        [f[torch.randperm(f.shape[0], generator=g)[: max_patches * f.shape[0] // total]] for f in flat]
    )


def measure_digits(setting: Setting, seed: int, select: Selector) -> tuple[dict[str, float], dict[str, Any]]:
    """Train the denoiser and SAE, build the plans and score every arm on fresh samples (one seed)."""
    from sklearn.linear_model import LogisticRegression

    t0 = time.perf_counter()
    data = digits_data(seed)
    clf = LogisticRegression(max_iter=3000).fit(data["X"], data["y"])
    m: dict[str, float] = {"evaluator_acc": float(clf.score(data["X_ref"], data["y_ref"]))}
    build = _unet_generator if setting.kind == "unet" else _mlp_generator
    model, generate, m["ddpm_final_loss"] = build(setting, seed, data)
    m["denoiser_seconds"] = time.perf_counter() - t0
    T = setting.n_steps
    acts = {}
    for c in progress(range(10), desc="P19 activations"):
        with ActivationCapture(model, setting.block, T) as cap:
            generate(torch.full((setting.collect_per_class,), c), seed * 1000 + c, [cap])
        acts[str(c)] = cap.activations()  # [n, T, P, d]: P = 1 (MLP) or 256 positions (UNet)
    m["patches_per_image"] = float(next(iter(acts.values())).shape[2])
    sae = fit_block_sae(
        sae_training_patches(acts, SAE_MAX_PATCHES, seed), setting.d_sae, setting.sae_k,
        steps=setting.sae_steps, batch_size=setting.sae_batch, lr=setting.sae_lr, seed=seed,
    )  # fmt: skip
    latents = concept_latents(sae, acts)
    del acts
    m["train_seconds"] = time.perf_counter() - t0

    labels = torch.cat(
        [torch.full((setting.n_target,), int(TARGET))]
        + [torch.full((setting.n_other,), c) for c in range(10) if str(c) != TARGET]
    )
    is_target = (labels == int(TARGET)).numpy()
    eval_seed = seed * 1000 + 999
    arms = {
        "saeuron": select(latents, TARGET, setting.percentile, seed),
        "random": random_features(latents, TARGET, setting.percentile, seed),
        "random_active": random_features(latents, TARGET, setting.percentile, seed, active_only=True),
        "raw_mean": raw_mean_features(latents, TARGET, setting.percentile, seed),
    }
    m["features_per_step"] = float(np.mean([len(f) for f in arms["saeuron"]]))

    def sample(plan: UnlearningPlan | None, lab: torch.Tensor) -> np.ndarray:
        if plan is None:
            return generate(lab, eval_seed, [])
        with SAEUnlearningHook(model, setting.block, sae, plan) as hook:
            return generate(lab, eval_seed, [hook])

    def scores(x: np.ndarray, lab: torch.Tensor) -> tuple[float, float]:
        pred = clf.predict(x)
        tgt = lab.numpy() == int(TARGET)
        return float((pred[tgt] != int(TARGET)).mean()), float((pred[~tgt] == lab.numpy()[~tgt]).mean())

    samples = {"none": sample(None, labels)}
    m["ua_none"], m["ira_none"] = scores(samples["none"], labels)
    m["acc_none"] = float((clf.predict(samples["none"]) == labels.numpy()).mean())
    for arm, feats in progress(list(arms.items()), desc="P19 arms"):
        samples[arm] = sample(
            UnlearningPlan.from_features(latents, [TARGET], feats, setting.multiplier), labels
        )
        ua, ira = scores(samples[arm], labels)
        key = "ua" if arm == "saeuron" else f"ua_{arm}"
        m["baseline_ua_random" if arm == "random" else key] = ua
        m["ira" if arm == "saeuron" else f"ira_{arm}"] = ira
    ref = data["X_ref"]
    nn_none = nearest_distance(samples["none"][is_target], ref)
    m["nn_dist_none"] = nn_none
    m["nn_dist_ratio"] = nearest_distance(samples["saeuron"][is_target], ref) / nn_none
    m["maxprob"] = float(clf.predict_proba(samples["saeuron"][is_target]).max(axis=1).mean())
    tgt_labels = labels[torch.from_numpy(is_target)]
    sweep = {}
    for gamma in setting.gammas:
        if gamma == setting.multiplier:
            x = samples["saeuron"][is_target]
        else:
            x = sample(UnlearningPlan.from_features(latents, [TARGET], arms["saeuron"], gamma), tgt_labels)
        sweep[gamma] = x
        m[f"ua_gamma{gamma:g}"] = float((clf.predict(x) != int(TARGET)).mean())
        m[f"nn_ratio_gamma{gamma:g}"] = nearest_distance(x, ref) / nn_none
    extra = {"none": samples["none"][is_target][:10], "saeuron": samples["saeuron"][is_target][:10],
             "random": samples["random"][is_target][:10], "sweep": sweep}  # fmt: skip
    return m, extra


# ----------------------------------------------------------------------------------------- report
def evaluate(
    setting: Setting,
    seed: int = 0,
    out_dir: str | Path | None = None,
    select: Selector = contrastive_features,
) -> Report:
    """Measure ``setting`` over its seeds (``select``: the method's feature selection; a broken one in tests)."""
    t0 = time.perf_counter()
    per_seed, extra = [], None
    for s in range(seed, seed + setting.n_seeds):
        if setting.kind == "synthetic":
            per_seed.append(measure_synthetic(setting, s, select))
        else:
            m, e = measure_digits(setting, s, select)
            per_seed.append(m)
            extra = extra or e
    metrics = {k: float(np.mean([m[k] for m in per_seed])) for k in per_seed[0]}
    metrics["seconds"] = time.perf_counter() - t0
    figures = []
    if out_dir is not None:
        figures = [
            plot_digits(out_dir, extra, setting) if extra is not None else plot_synthetic(out_dir, metrics)
        ]
    synthetic = setting.kind == "synthetic"
    denoiser = (
        f"UNet2DModel (32, 64) on 16x16 digits, DDPMScheduler T={setting.n_steps}, {setting.ddpm_train_steps} "
        f"steps at batch {setting.ddpm_batch}; hooked {setting.block} (every spatial position an SAE input)"
        if setting.kind == "unet"
        else f"DigitsDDPM T={setting.n_steps}, hidden {setting.hidden}, {setting.ddpm_train_steps} steps"
    )
    notes = (
        f"synthetic block activations: {setting.n_concepts} planted concepts over {setting.n_steps} steps, known "
        f"32-atom dictionary SAE (k={setting.sae_k}), q={setting.percentile:g}, gamma={setting.multiplier:g}"
        if synthetic
        else f"{denoiser}; BatchTopK "
        f"SAE {setting.d_sae} latents, k={setting.sae_k}, {setting.sae_steps} steps; concept '{TARGET}', "
        f"q={setting.percentile:g}, gamma={setting.multiplier:g}; {setting.n_target} target and {setting.n_other} "
        "samples of each other class per arm, same noise across arms; logistic-regression evaluator"
    ) + f"; mean over seeds {list(range(seed, seed + setting.n_seeds))}."
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        metrics=metrics,
        headline="probe_drop" if synthetic else "ua",
        baseline="baseline_probe_drop_random" if synthetic else "baseline_ua_random",
        better="higher",  # relative probe-score drop of the target concept; unlearning accuracy on "3"
        preconditions=preconditions(setting),
        figures=figures,
        seeds=list(range(seed, seed + setting.n_seeds)),
        notes=notes,
    )


def plot_synthetic(out_dir: str | Path, m: Mapping[str, float]) -> Path:
    """Probe-score drop of the target concept: SAeUron vs random features, and the other concepts' change."""
    fig, ax = new_figure(figsize=(5, 3.5))
    names = ["SAeUron drop", "random drop", "others' change"]
    ax.bar(names, [m["probe_drop"], m["baseline_probe_drop_random"], m["other_probe_change"]],
           color=["tab:red", "tab:gray", "tab:blue"])  # fmt: skip
    ax.axhline(MIN_PROBE_DROP, ls="--", color="k", lw=0.8)
    ax.set_ylabel("relative probe-score change")
    ax.set_title("P19 quick: planted concepts")
    fig.tight_layout()
    return save_figure(fig, out_dir, "p19_saeuron_quick")


def plot_digits(out_dir: str | Path, extra: Mapping[str, Any], setting: Setting) -> Path:
    """'3'-prompted samples without intervention, with SAeUron and with random features; one row per γ."""
    rows = [("none", extra["none"]), ("SAeUron", extra["saeuron"]), ("random", extra["random"])]
    rows += [(f"γ={g:g}", x[:10]) for g, x in extra["sweep"].items()]
    fig, axes = new_figure(len(rows), 10, figsize=(10, 1.1 * len(rows)))
    for r, (name, imgs) in enumerate(rows):
        for j in range(10):
            ax = axes[r, j]
            if j < len(imgs):
                ax.imshow(imgs[j].reshape(8, 8), cmap="gray_r", vmin=-1, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r, 0].set_ylabel(name, fontsize=8)
    fig.suptitle(f"P19: samples prompted '{TARGET}' (seed 0)")
    return save_figure(fig, out_dir, "p19_saeuron_samples")


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce SAeUron's unlearning claim at small scale (see the module docstring)."""
    seed_everything(seed)
    with torch_threads(1):  # tiny networks: one thread is fastest on 2 shared cores and reproducible
        return evaluate(QUICK if quick else FULL, seed, out_dir=out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
