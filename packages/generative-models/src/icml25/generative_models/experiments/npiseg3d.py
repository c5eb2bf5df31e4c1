"""NPISeg3D: Probabilistic Interactive 3D Segmentation with Hierarchical Neural Processes — ICML 2025, P17: reproduction.
Small-scale reproduction.

Liu et al., ICML 2025 (arXiv 2505.01726; official code ``jliu4ai/NPISeg3D``). Claim: a hierarchical neural
process over scene and object latents (clicks = context, points = targets) segments point clouds from clicks
at least as well as the deterministic AGILE3D click-attention head, and its latent samples give per-point
uncertainty that concentrates on the errors, in domain and on unseen object types.

Setting (:class:`Setting`): procedural scenes (:func:`~icml25.generative_models.npiseg3d_toy.make_scene`): a
ground plane and 3-6 touching or nearly touching primitives; training and in-domain test objects are spheres,
boxes and cylinders, the out-of-domain test objects tori and cones. Both models share the network (pure-torch
kNN EdgeConv backbone, width 64, AGILE3D decoder rounds) and training recipe; only the last round's mask head
differs: :class:`~icml25.generative_models.npiseg3d.HierarchicalNPHead` (S samples) vs the deterministic
:class:`~icml25.generative_models.npiseg3d.ClickAttentionHead`. Evaluation is iterative: one click per label
at its most interior point, then one click per label at the most interior point of its largest error region,
up to ``max_clicks`` clicks per object; mIoU@k over objects, NoC@80 (capped at ``max_clicks``), the AUROC of
the per-point uncertainty for detecting errors (pooled over scenes and click counts 1..5; the baseline's is
1 − max softmax probability) and ECE of the (sample-mean) probabilities.

Pass rule (:func:`checks`), written before running from the reproduction plan and its second review. Full:
both models mIoU@5 ≥ 0.80; NP uncertainty AUROC ≥ 0.75 in domain and ≥ 0.70 out of domain; mean per-point
variance ≥ 1e-4 and mean σ ≥ 1e-3; NP AUROC ≥ baseline AUROC − 0.03; NP mIoU@1 and @3 ≥ baseline − 0.04
(one seed per model). Quick (60 scenes of 384 points, 1 decoder round): the training loss decreases, the KL
is finite, NP AUROC > 0.6, the variance floor, and NP mIoU@1 and @3 ≥ baseline − 0.04 (the claim's
direction: no accuracy cost). The broken variant (``variant="collapsed_sigma"``: every latent σ forced to
0, so the samples agree) fails the quick gate.

Run: ``python -m icml25.generative_models.experiments.npiseg3d [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from icml25.generative_models.npiseg3d import InteractiveSegmenter
from icml25.generative_models.npiseg3d_eval import (
    clicks_on_graph,
    expected_calibration_error,
    knn,
    noc_at,
    object_ious,
    uncertainty_auroc,
)
from icml25.generative_models.npiseg3d_toy import OOD_KINDS, TRAIN_KINDS, make_scene
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
from icml25.kernels.rng import make_generator

PAPER = "P17"
CLAIM = (
    "A hierarchical neural-process mask head (NPISeg3D) segments point clouds from clicks as well as the "
    "deterministic AGILE3D click-attention head and adds per-point uncertainty that detects its errors, in "
    "domain and on unseen object types (paper: higher IoU@k / fewer NoC than AGILE3D on ScanNet, S3DIS, "
    "Replica, KITTI-360, PartNet)."
)
MIOU5_MIN = 0.80
AUROC_ID_MIN = 0.75
AUROC_OOD_MIN = 0.70
AUROC_QUICK_MIN = 0.6
VAR_MIN = 1e-4
SIGMA_MIN = 1e-3
AUROC_VS_BASE = 0.03
MIOU_VS_BASE = 0.04


@dataclass(frozen=True)
class Setting:
    """One reproduction scale."""

    n_train: int
    """Training scenes (paper: ScanNet40 train split; ours 600)."""
    n_test: int
    """In-domain test scenes (ours 100); the out-of-domain set has the same size when ``ood``."""
    n_points: int
    """Points per scene (paper: full ScanNet scenes; ours 1,024 to fit the CPU budget)."""
    rounds: int
    """Decoder rounds; the NP head runs in the last (paper 4 rounds, NP from round 3; ours 2)."""
    steps: int
    """Training steps, one scene each (paper 600 epochs, batch 6; ours 600: NP ≈ 110 s, baseline ≈ 40 s)."""
    max_clicks: int
    """Clicks per object in the iterative evaluation and the NoC cap (paper 20; ours 6)."""
    ood: bool
    """Also evaluate on the out-of-domain (tori and cones) scenes."""
    dim: int = 64
    """Feature and head width (paper 128; ours 64)."""
    n_samples: int = 8
    """Object-latent samples S (paper 10; ours 8)."""
    lr: float = 1e-3
    """Adam learning rate (paper AdamW 5e-4)."""


FULL = Setting(n_train=600, n_test=100, n_points=1024, rounds=2, steps=600, max_clicks=6, ood=True)
QUICK = Setting(n_train=50, n_test=10, n_points=384, rounds=1, steps=45, max_clicks=3, ood=False)


def checks(setting: Setting) -> list[Check]:
    """The pass rule of ``setting`` (see the module docstring)."""
    var_floor = Check(f"NP mean per-point variance >= {VAR_MIN:g}", lambda m: m["np_mean_var"] >= VAR_MIN)
    no_cost = Check(
        f"NP mIoU@1 and @3 >= baseline - {MIOU_VS_BASE:g}",
        lambda m: (
            min(m["np_miou1_id"] - m["baseline_miou1_id"], m["np_miou3_id"] - m["baseline_miou3_id"])
            >= -MIOU_VS_BASE
        ),
    )
    if not setting.ood:
        return [
            Check("training loss decreases", lambda m: m["np_loss_last"] < m["np_loss_first"]),
            Check("KL finite", lambda m: math.isfinite(m["np_kl_last"])),
            Check(
                f"NP uncertainty AUROC > {AUROC_QUICK_MIN:g}", lambda m: m["np_auroc_id"] > AUROC_QUICK_MIN
            ),
            var_floor,
            no_cost,
        ]
    return [
        Check(
            f"both mIoU@5 >= {MIOU5_MIN:g}",
            lambda m: min(m["np_miou5_id"], m["baseline_miou5_id"]) >= MIOU5_MIN,
        ),
        Check(f"NP AUROC in domain >= {AUROC_ID_MIN:g}", lambda m: m["np_auroc_id"] >= AUROC_ID_MIN),
        Check(f"NP AUROC out of domain >= {AUROC_OOD_MIN:g}", lambda m: m["np_auroc_ood"] >= AUROC_OOD_MIN),
        Check(f"NP mean sigma >= {SIGMA_MIN:g}", lambda m: m["np_mean_sigma"] >= SIGMA_MIN),
        var_floor,
        Check(
            f"NP AUROC >= baseline softmax AUROC - {AUROC_VS_BASE:g}",
            lambda m: m["np_auroc_id"] >= m["baseline_auroc_id"] - AUROC_VS_BASE,
        ),
        no_cost,
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it."""
    return threshold_text(checks(QUICK if quick else FULL))


def scenes(
    setting: Setting, kinds: tuple[str, ...], count: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` procedural scenes with objects of ``kinds`` (seeds ``seed, seed+1, ...``)."""
    return [make_scene(setting.n_points, kinds=kinds, seed=seed + i) for i in range(count)]


@torch.no_grad()
def evaluate_model(
    model: InteractiveSegmenter, test: list[tuple[np.ndarray, np.ndarray]], max_clicks: int, seed: int
) -> dict[str, float | np.ndarray]:
    """Iterative click evaluation: IoU curves ``[objects, max_clicks]``, pooled uncertainty/errors over click
    counts 1..min(5, max_clicks), confidences, mean variance and σ."""
    curves, unc, err, conf, sigmas = [], [], [], [], []
    gen = make_generator(seed)
    for pts, lab in test:
        xyz = model._normalise(pts)
        nbr = knn(xyz, model.k)
        feats = model.encode(xyz, nbr)
        clicks = clicks_on_graph(pts, lab, None, None, nbr.numpy())
        curve = []
        for c in range(max_clicks):
            idx = torch.tensor([k.index for k in clicks])
            obj = torch.tensor([k.label for k in clicks])
            out, _ = model.decode(feats, xyz, idx, obj, generator=gen)
            pred = out.labels.numpy()
            curve.append(object_ious(pred, lab))
            if c < 5:
                u = model.uncertainty(out).numpy()
                probs = out.logits.softmax(1).mean(-1)
                unc.append(u)
                err.append(pred != lab)
                conf.append(probs.max(1).values.numpy())
                sigmas.append(out.sigma_mean)
            new = clicks_on_graph(pts, lab, pred, None, nbr.numpy())
            taken = {k.index for k in clicks}
            clicks = clicks + [k for k in new if k.index not in taken]
        curves.append(np.stack(curve, 1))
    iou = np.concatenate(curves)
    u, e, cf = np.concatenate(unc), np.concatenate(err), np.concatenate(conf)
    out_m: dict[str, float | np.ndarray] = {"curve": iou.mean(0)}
    for k in (1, 3, 5):
        out_m[f"miou{k}"] = float(iou[:, min(k, max_clicks) - 1].mean())
    out_m["noc80"] = noc_at(iou, 0.8)
    out_m["auroc"] = uncertainty_auroc(u, e) if 0 < e.sum() < e.size else 0.5
    out_m["ece"] = expected_calibration_error(cf, ~e)
    out_m["mean_var"] = float(u.mean())
    out_m["mean_sigma"] = float(np.mean(sigmas))
    out_m["error_rate"] = float(e.mean())
    return out_m


def evaluate(setting: Setting, seed: int = 0, out_dir: str | Path | None = None, variant: str = "none",
             baseline_metrics: dict[str, float] | None = None) -> Report:  # fmt: skip
    """Train both models and measure every metric of :func:`checks` (``variant="collapsed_sigma"``: broken).
    ``baseline_metrics`` (the ``baseline_*`` metrics of an earlier run with the same setting and seed) skips
    retraining the baseline, which the variant does not change."""
    t0 = time.perf_counter()
    train = scenes(setting, TRAIN_KINDS, setting.n_train, 10_000 * seed)
    test = {"id": scenes(setting, TRAIN_KINDS, setting.n_test, 10_000 * seed + 5_000)}
    if setting.ood:
        test["ood"] = scenes(setting, OOD_KINDS, setting.n_test, 10_000 * seed + 7_000)
    metrics: dict[str, float] = {}
    curves: dict[str, np.ndarray] = {}
    models = [("np", "np"), ("baseline", "deterministic")]
    if baseline_metrics is not None:
        metrics.update({k: v for k, v in baseline_metrics.items() if k.startswith("baseline_")})
        models = models[:1]
    for name, head in progress(models, desc="P17 models"):
        model = InteractiveSegmenter(
            setting.dim, head, setting.rounds, setting.n_samples, collapse_sigma=variant == "collapsed_sigma",
            seed=seed,
        )  # fmt: skip
        t1 = time.perf_counter()
        losses = model.fit(train, steps=setting.steps, lr=setting.lr, seed=seed)
        metrics[f"{name}_train_seconds"] = time.perf_counter() - t1
        w = max(1, len(losses) // 5)
        metrics[f"{name}_loss_first"] = float(np.mean(losses[:w]))
        metrics[f"{name}_loss_last"] = float(np.mean(losses[-w:]))
        if name == "np":
            pts, lab = train[0]
            xyz = model._normalise(pts)
            with torch.no_grad():
                feats = model.encode(xyz, knn(xyz, model.k))
                clicks = clicks_on_graph(pts, lab, None, None, knn(xyz, model.k).numpy())
                idx = torch.tensor([c.index for c in clicks])
                obj = torch.tensor([c.label for c in clicks])
                tidx, tobj = model._target_clicks(torch.from_numpy(lab), 10, np.random.default_rng(seed))
                out, _ = model.decode(feats, xyz, idx, obj, tidx, tobj, generator=make_generator(seed))
            metrics["np_kl_last"] = float(out.kl)
        for split, data in test.items():
            res = evaluate_model(model, data, setting.max_clicks, seed)
            curves[f"{name}_{split}"] = res.pop("curve")
            for key, val in res.items():
                metrics[f"{name}_{key}_{split}"] = float(val)
        metrics[f"{name}_mean_var"] = metrics[f"{name}_mean_var_id"]
        metrics[f"{name}_mean_sigma"] = metrics[f"{name}_mean_sigma_id"]
    if setting.ood:
        metrics["np_minus_baseline_miou1_ood"] = metrics["np_miou1_ood"] - metrics["baseline_miou1_ood"]
    metrics["total_seconds"] = time.perf_counter() - t0
    figures = [plot(out_dir, setting, metrics, curves)] if out_dir is not None and len(models) == 2 else []
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        metrics=metrics,
        headline="np_auroc_id",
        baseline="baseline_auroc_id",
        figures=figures,
        seeds=[seed],
        notes=(
            f"Procedural scenes: {setting.n_train} train / {setting.n_test} test"
            f"{' + ' + str(setting.n_test) + ' out-of-domain (tori, cones)' if setting.ood else ''}, "
            f"{setting.n_points} points each; width {setting.dim}, {setting.rounds} decoder round(s), S = "
            f"{setting.n_samples}, {setting.steps} Adam steps (lr {setting.lr:g}) per model, one seed per model; "
            f"clicks up to {setting.max_clicks} per object (NoC cap). Variant: {variant}."
        ),
    )


def plot(
    out_dir: str | Path, setting: Setting, metrics: dict[str, float], curves: dict[str, np.ndarray]
) -> Path:
    """mIoU against clicks per object for both heads (in and out of domain) and the AUROCs."""
    fig, (ax, ax2) = new_figure(1, 2, figsize=(11, 4))
    k = np.arange(1, setting.max_clicks + 1)
    for key, curve in curves.items():
        ax.plot(k, curve, marker="o", ls="-" if key.startswith("np") else "--", label=key.replace("_", " "))
    ax.set_xlabel("clicks per object")
    ax.set_ylabel("mIoU")
    ax.set_title("P17 NPISeg3D: interactive segmentation")
    ax.legend(fontsize=8)
    splits = ["id", "ood"] if setting.ood else ["id"]
    x = np.arange(len(splits))
    ax2.bar(x - 0.2, [metrics[f"np_auroc_{s}"] for s in splits], 0.4, label="NP max-prob variance")
    ax2.bar(x + 0.2, [metrics[f"baseline_auroc_{s}"] for s in splits], 0.4, label="baseline 1 - max prob")
    ax2.axhline(0.5, color="k", lw=1, ls=":")
    ax2.set_xticks(x, ["in domain", "out of domain"][: len(splits)])
    ax2.set_ylabel("error-detection AUROC")
    ax2.set_ylim(0.4, 1.0)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_dir, "p17_npiseg3d")


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce the NPISeg3D comparison at small scale (see the module docstring)."""
    seed_everything(seed)
    with torch_threads(1):
        return evaluate(QUICK if quick else FULL, seed, out_dir=out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
