"""Geometric Generative Modeling with Noise-Conditioned Graph Networks — ICML 2025, P31: reproduction.

Pao-Huang, Black and Qiu, ICML 2025 (arXiv 2507.09391; official code ``peterpaohuang/ncgn``). Claim: a graph
network whose message-passing graph follows the noise level (dynamic message passing, DMP: coarse clusters
linked long-range at high noise, the plain kNN graph at low noise, ≈ kN coarse edges throughout) generates
geometric graphs closer to the data than the same network on a static kNN graph at the same edge budget
(paper: ModelNet40 point clouds, spatial transcriptomics, DiT images).

Setting (:class:`Setting`): 2-D point clouds from sklearn's 8×8 digits, N = 96 points per image drawn with
probability ∝ pixel intensity, jittered uniformly inside the pixel and scaled to [−1, 1]²; 300 test clouds,
the other 1,497 for training. Conditional flow matching (σ = 0, x₀ ~ N(0, I), linear path) with a
:class:`~icml25.generative_models.ncgn_dmp.NoiseConditionedGNN` velocity network (2 layers, GCN conv, k = 4,
features [x_s, s], hidden 64, batch 32, Adam 1e-3, 9,000 steps); sampling by 30 Euler steps. Arms: (A) DMP,
exp schedule; (B) static kNN (k = 4), same network and parameters. Metrics against the test set, with the Chamfer distance (CD, sum of the two
mean squared nearest-neighbour distances): MMD-CD (mean over test clouds of the nearest generated cloud's CD)
and 1-NNA (leave-one-out 1-NN accuracy of generated vs test, 0.5 ideal); references: training clouds vs
test (the finite-sample floor) and a shapeless "marginal blob" (each point drawn from the pooled points of
all training clouds).

Pass rule (:func:`checks`), written before running from the reproduction plan's second review:
full (mean of 2 seeds), when the precondition 1-NNA(B) ≤ 1-NNA(blob) − 0.03 holds (:func:`preconditions`:
the baseline learned shape, so the comparison means something; the plan: "otherwise raise the step budget
before comparing"; a run where it fails is INCONCLUSIVE): MMD(A) − MMD_ref ≤ 0.85 · (MMD(B) − MMD_ref); 1-NNA(A) ≤ 1-NNA(B) + 0.01; DMP coarse edges
≤ 1.2 × kNN edges at every s of a grid. Quick (100 steps on 200 clouds; a wiring check): at pure noise the
DMP graph's 2-layer receptive field covers ≥ 2× the nodes that the kNN graph's does, at s = 1 the DMP graph
is the kNN graph, the edge budget as in full, and both arms' flow-matching loss decreases. The broken
variant (``variant="inverted"``: the schedule direction of the official ModelNet script) fails the quick
gate. Speeds: one CPU thread.

Run: ``python -m icml25.generative_models.experiments.ncgn_dmp [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from icml25.generative_models.ncgn_dmp import (
    NoiseConditionedGNN,
    build_dmp_graph,
    dmp_schedule,
    ncgn_flow_matching_loss,
    ncgn_sample,
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

PAPER = "P31"
CLAIM = (
    "Noise-conditioned message passing (coarse long-range graph at high noise, local kNN at low noise, "
    "equal edge budget) generates point clouds closer to the data than the same GNN on a static kNN graph "
    "(paper: ModelNet40, spatial transcriptomics, DiT)."
)
MMD_EXCESS_RATIO = 0.85
NNA_SLACK = 0.01
BLOB_MARGIN = 0.03
EDGE_RATIO = 1.2
RF_RATIO = 2.0


@dataclass(frozen=True)
class Setting:
    """One reproduction scale."""

    n_train: int
    """Training clouds (paper: ModelNet40 train split; ours the 1,497 digits outside the test set, quick 200)."""
    n_eval: int
    """Generated and test clouds compared (paper: the test split; ours 300, quick 0: no generation)."""
    steps: int
    """Adam steps (paper 300 epochs at batch 128, lr 1e-4; the plan's 1,500 at lr 1e-3, raised to 9,000 as
    the plan prescribes when the kNN baseline does not leave the blob. Measured (hidden 64, batch 32, seeds 0
    and 1000): kNN's 1-NNA 0.936 at 1,500 steps (twice) and 0.912 at 4,500, against the blob's 0.937 (needs
    ≤ 0.907; DMP was already at 0.892 and 0.843); quick 100)."""
    seeds: int
    """Seeds averaged (the plan's 2; quick 1)."""
    batch_size: int = 32
    """Clouds per step (paper 128; the plan's 32; quick 16: at 64 / 32 the quick gate's two 100-step
    trainings alone took ≈ 18 CPU-s (measured), over the 20 s of a quick test)."""
    hidden: int = 64
    """Width (paper 64; the plan's 64; quick 32, for the same measured reason)."""
    n_layers: int = 2
    """DMP layers (paper 3; ours 2, as planned: 2 kNN hops cannot see the whole digit at high noise)."""
    k: int = 4
    """Final kNN degree (paper 7 on ModelNet; ours 4)."""
    n_points: int = 96
    """Points per cloud (paper 400; ours 96 from an 8×8 digit)."""
    sample_steps: int = 30
    """Euler steps of generation (the plan's 30)."""
    lr: float = 1e-3
    """Adam learning rate (paper 1e-4 with warm-up; the plan's 1e-3)."""


FULL = Setting(n_train=1497, n_eval=300, steps=9000, seeds=2)
QUICK = Setting(n_train=200, n_eval=0, steps=100, seeds=1, batch_size=16, hidden=32)
S_GRID = tuple(i / 20 for i in range(21))


def checks(setting: Setting) -> list[Check]:
    """The pass rule of ``setting`` (see the module docstring)."""
    edges = Check(
        f"DMP coarse edges <= {EDGE_RATIO:g} x kNN edges at every s",
        lambda m: m["max_edge_ratio"] <= EDGE_RATIO,
    )
    if setting.n_eval == 0:
        return [
            Check(
                f"receptive field at s = 0: DMP >= {RF_RATIO:g} x kNN",
                lambda m: m["rf_dmp_s0"] >= RF_RATIO * m["baseline_rf_knn_s0"],
            ),
            Check("DMP graph at s = 1 is the kNN graph", lambda m: m["dmp_equals_knn_s1"] == 1.0),
            edges,
            Check(
                "flow-matching loss decreases for DMP and kNN",
                lambda m: m["loss_drop_dmp"] > 0 and m["loss_drop_knn"] > 0,
            ),
        ]
    return [
        Check(
            f"MMD(DMP) - MMD_ref <= {MMD_EXCESS_RATIO:g} x (MMD(kNN) - MMD_ref)",
            lambda m: (
                m["mmd_dmp"] - m["mmd_ref"] <= MMD_EXCESS_RATIO * (m["baseline_mmd_knn"] - m["mmd_ref"])
            ),
        ),
        Check(
            f"1-NNA(DMP) <= 1-NNA(kNN) + {NNA_SLACK:g}",
            lambda m: m["nna_dmp"] <= m["baseline_nna_knn"] + NNA_SLACK,
        ),
        edges,
    ]


def preconditions(setting: Setting) -> list[Check]:
    """When the full comparison can show the effect at all: the kNN baseline learned digit shapes (the plan's
    gate; quick has none)."""
    if setting.n_eval == 0:
        return []
    return [
        Check(
            f"1-NNA(kNN) <= 1-NNA(blob) - {BLOB_MARGIN:g}",
            lambda m: m["baseline_nna_knn"] <= m["nna_blob"] - BLOB_MARGIN,
        )
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it."""
    return threshold_text(checks(QUICK if quick else FULL))


# ----------------------------------------------------------------------------------------------- data
def digit_clouds(n_points: int = 96, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 sklearn digits as clouds ``[1797, n_points, 2]`` in [−1, 1]² (upright) and their labels."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    p = x / x.sum(1, keepdims=True)
    out = np.empty((len(x), n_points, 2))
    for i in range(len(x)):
        pix = rng.choice(64, size=n_points, p=p[i])
        r, c = np.divmod(pix, 8)
        u = rng.random((n_points, 2))
        out[i, :, 0] = (c + u[:, 0]) / 4.0 - 1.0
        out[i, :, 1] = 1.0 - (r + u[:, 1]) / 4.0
    return torch.tensor(out, dtype=torch.float32), torch.tensor(y)


def blob_clouds(train: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """``n`` shapeless clouds: every point drawn from the pooled points of all training clouds."""
    pool = train.reshape(-1, train.shape[-1])
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(pool), (n, train.shape[1]), generator=g)
    return pool[idx]


# -------------------------------------------------------------------------------------------- metrics
def chamfer_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Chamfer distances ``[len(a), len(b)]`` between clouds ``a [A, N, D]`` and ``b [B, M, D]``."""
    out = torch.empty(len(a), len(b))
    for i in range(len(a)):
        d = torch.cdist(a[i].expand(len(b), -1, -1), b).square()
        out[i] = d.min(2).values.mean(1) + d.min(1).values.mean(1)
    return out


def mmd_and_nna(gen: torch.Tensor, test: torch.Tensor, tt: torch.Tensor) -> tuple[float, float]:
    """MMD-CD (mean over test clouds of the min CD to a generated cloud) and 1-NNA (gen vs test)."""
    gt = chamfer_matrix(gen, test)
    gg = chamfer_matrix(gen, gen)
    n, m = len(gen), len(test)
    full = torch.cat([torch.cat([gg, gt], 1), torch.cat([gt.T, tt], 1)], 0)
    full.fill_diagonal_(float("inf"))
    nn = full.argmin(1)
    label = torch.cat([torch.zeros(n, dtype=torch.bool), torch.ones(m, dtype=torch.bool)])
    nna = float((label[nn] == label).double().mean())
    return float(gt.min(0).values.mean()), nna


def receptive_field(model: NoiseConditionedGNN, pos: torch.Tensor, s: float) -> float:
    """Mean fraction of its cloud that a node can hear after ``n_layers`` DMP layers, at data-ness ``s``.

    Per layer a node hears its cluster's members, the clusters linked to it and their members (coarsen →
    conv → spread), and itself (residual). ``pos [B, N, D]`` are the (noisy) positions the graph is built on.
    """
    fr = []
    for cloud in pos:
        g = model.graph(cloud, s)
        n, c = cloud.shape[0], g.num_clusters
        member = torch.zeros(n, c)
        member[torch.arange(n), g.cluster] = 1.0
        adj = torch.eye(c)
        adj[g.edge_index_cg[1], g.edge_index_cg[0]] = 1.0
        step = ((member @ adj @ member.T) > 0).float() + torch.eye(n)
        reach = torch.eye(n)
        for _ in range(len(model.layers)):
            reach = ((step @ reach) > 0).float()
        fr.append(float(reach.mean()))
    return float(np.mean(fr))


def edge_ratio(
    model: NoiseConditionedGNN, baseline: NoiseConditionedGNN, x1: torch.Tensor, seed: int
) -> float:
    """Max over :data:`S_GRID` of mean DMP coarse edges / mean kNN edges on noisy states of clouds ``x1``."""
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(x1.shape, generator=g)
    B, N, D = x1.shape
    batch = torch.arange(B).repeat_interleave(N)
    worst = 0.0
    for s in S_GRID:
        xs = ((1 - s) * x0 + s * x1).reshape(B * N, D)
        e_a = model.graph(xs, s, batch).num_coarse_edges
        e_b = baseline.graph(xs, s, batch).num_coarse_edges
        worst = max(worst, e_a / e_b)
    return worst


# ------------------------------------------------------------------------------------------- training
def make_model(setting: Setting, arm: str, seed: int) -> NoiseConditionedGNN:
    """The velocity network of an arm (``dmp``, ``knn``, ``inverted``: the broken variant), from ``seed``."""
    from icml25.kernels.rng import isolated_rng

    schedule = dmp_schedule("exp", inverted=arm == "inverted")
    with isolated_rng(seed):
        return NoiseConditionedGNN(
            2, setting.hidden, 2, n_layers=setting.n_layers, k=setting.k, schedule=schedule,
            conv="gcn", static=arm == "knn",
        )  # fmt: skip


def train_arm(
    setting: Setting, arm: str, train: torch.Tensor, seed: int
) -> tuple[NoiseConditionedGNN, list[float]]:
    """Train one arm by flow matching; returns the model and its per-step losses."""
    model = make_model(setting, arm, seed)
    opt = torch.optim.Adam(model.parameters(), lr=setting.lr)
    g = torch.Generator().manual_seed(seed + 17)
    losses = []
    for _ in progress(range(setting.steps), desc=f"P31 {arm} seed {seed}"):
        idx = torch.randint(len(train), (setting.batch_size,), generator=g)
        loss = ncgn_flow_matching_loss(model, train[idx], generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.eval(), losses


def _loss_drop(losses: list[float]) -> float:
    w = max(1, len(losses) // 5)
    return float(np.mean(losses[:w]) - np.mean(losses[-w:]))


def evaluate(
    setting: Setting, seed: int = 0, out_dir: str | Path | None = None, variant: str = "none"
) -> Report:
    """Measure every metric of :func:`checks`; ``variant="inverted"`` trains the inverted schedule as (A)."""
    t0 = time.perf_counter()
    clouds, _ = digit_clouds(setting.n_points, seed=0)
    perm = torch.randperm(len(clouds), generator=torch.Generator().manual_seed(1234))
    test, train = clouds[perm[:300]], clouds[perm[300:]][: setting.n_train]
    arm_a = "inverted" if variant == "inverted" else "dmp"
    metrics: dict[str, float] = {}
    seeds = [seed + 1000 * i for i in range(setting.seeds)]
    acc: dict[str, list[float]] = {}
    samples: dict[str, torch.Tensor] = {}
    tt = None
    if setting.n_eval:
        test_e = test[: setting.n_eval]
        tt = chamfer_matrix(test_e, test_e)
        ref = train[
            torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[: setting.n_eval]
        ]
        metrics["mmd_ref"], metrics["nna_ref"] = mmd_and_nna(ref, test_e, tt)
        blob = blob_clouds(train, setting.n_eval, seed + 5)
        metrics["mmd_blob"], metrics["nna_blob"] = mmd_and_nna(blob, test_e, tt)
    for i, sd in enumerate(seeds):
        for key, arm in (("dmp", arm_a), ("knn", "knn")):
            model, losses = train_arm(setting, arm, train, sd)
            acc.setdefault(f"loss_drop_{key}", []).append(_loss_drop(losses))
            acc.setdefault(f"final_loss_{key}", []).append(
                float(np.mean(losses[-max(1, len(losses) // 5) :]))
            )
            if i == 0:
                rf_pos = torch.randn(8, setting.n_points, 2, generator=torch.Generator().manual_seed(sd + 3))
                metrics[f"rf_{key}_s0"] = receptive_field(model, rf_pos, 0.0)
                metrics[f"rf_{key}_s1"] = receptive_field(model, train[:8], 1.0)
            if key == "dmp" and i == 0:
                base = make_model(setting, "knn", sd)
                metrics["max_edge_ratio"] = edge_ratio(model, base, train[:32], sd)
                g1 = model.graph(train[0], 1.0)
                gk = base.graph(train[0], 1.0)
                same = torch.equal(g1.cluster, torch.arange(setting.n_points)) and torch.equal(
                    g1.edge_index_cg, gk.edge_index_cg
                )
                metrics["dmp_equals_knn_s1"] = float(same)
                metrics["dmp_mean_coarse_edges"] = float(
                    np.mean(
                        [model.graph(train[0] * s + (1 - s) * rf_pos[0], s).num_coarse_edges for s in S_GRID]
                    )
                )
            if setting.n_eval:
                gen = ncgn_sample(
                    model, setting.n_eval, setting.n_points, setting.sample_steps,
                    generator=torch.Generator().manual_seed(sd + 99),
                )  # fmt: skip
                mmd, nna = mmd_and_nna(gen, test_e, tt)
                acc.setdefault(f"mmd_{key}", []).append(mmd)
                acc.setdefault(f"nna_{key}", []).append(nna)
                if i == 0:
                    samples[key] = gen[:8]
    for k, v in acc.items():
        metrics[k] = float(np.mean(v))
    metrics["baseline_rf_knn_s0"] = metrics.pop("rf_knn_s0")
    if setting.n_eval:
        metrics["baseline_mmd_knn"] = metrics.pop("mmd_knn")
        metrics["baseline_nna_knn"] = metrics.pop("nna_knn")
        for key in ("dmp", "knn"):
            mk = "baseline_mmd_knn" if key == "knn" else "mmd_dmp"
            for j, sd_v in enumerate(acc[f"mmd_{key}"]):
                metrics[f"{mk}_seed{j}"] = sd_v
    metrics["total_seconds"] = time.perf_counter() - t0
    figures = []
    if out_dir is not None:
        figures = [plot(out_dir, setting, samples, test[:8], train[0])]
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        preconditions=preconditions(setting),
        metrics=metrics,
        headline="mmd_dmp" if setting.n_eval else "rf_dmp_s0",
        baseline="baseline_mmd_knn" if setting.n_eval else "baseline_rf_knn_s0",
        # MMD-CD to the test set (full); the share of the cloud a node hears at pure noise (quick)
        better="lower" if setting.n_eval else "higher",
        figures=figures,
        seeds=seeds,
        notes=(
            f"8x8 digits as {setting.n_points}-point clouds, {len(train)} training / {setting.n_eval} evaluated "
            f"clouds; flow matching, {setting.steps} Adam steps (lr {setting.lr:g}, batch {setting.batch_size}), "
            f"NoiseConditionedGNN hidden {setting.hidden}, {setting.n_layers} layers, GCN conv, k={setting.k}, "
            f"exp schedule (curvature 10); {setting.sample_steps} Euler steps; Chamfer MMD / 1-NNA; "
            f"{setting.seeds} seed(s); variant: {variant}. The fully connected arm of the plan is not run "
            "(CPU budget)."
        ),
    )


def plot(
    out_dir: str | Path, setting: Setting, samples: dict, test: torch.Tensor, cloud: torch.Tensor
) -> Path:
    """Schedule (clusters and degree vs s) and generated clouds of each arm next to test clouds."""
    rows = [("test", test)] + [(k, v) for k, v in samples.items()]
    fig, axes = new_figure(len(rows) + 1, 6, figsize=(12, 2 * (len(rows) + 1)))
    sch, inv = dmp_schedule("exp"), dmp_schedule("exp", inverted=True)
    ss = np.linspace(0, 1, 101)
    n = setting.n_points
    axes[0, 0].plot(ss, [sch(s, setting.k, n)[0] for s in ss], label="exp (DMP)")
    axes[0, 0].plot(ss, [inv(s, setting.k, n)[0] for s in ss], label="inverted")
    axes[0, 0].set_title("clusters vs s", fontsize=8)
    axes[0, 0].legend(fontsize=6)
    for j, s in enumerate((0.0, 0.8, 0.9, 0.95, 1.0)):
        ax = axes[0, j + 1]
        g = build_dmp_graph(cloud, s, setting.k, sch)
        ax.scatter(cloud[:, 0], cloud[:, 1], c=g.cluster.numpy() % 10, cmap="tab10", s=4)
        e = g.edge_index_cg
        for a, b in zip(e[0].tolist(), e[1].tolist(), strict=True):
            ax.plot(
                *zip(g.pos_cg[a].tolist(), g.pos_cg[b].tolist(), strict=True), color="k", lw=0.2, alpha=0.3
            )
        ax.set_title(f"s={s:g}: {g.num_clusters} cl., {g.num_coarse_edges} edges", fontsize=7)
    for r, (name, clouds) in enumerate(rows, start=1):
        for j in range(6):
            ax = axes[r, j]
            if j < len(clouds):
                ax.scatter(clouds[j][:, 0], clouds[j][:, 1], s=3)
            ax.set_xlim(-1.3, 1.3)
            ax.set_ylim(-1.3, 1.3)
            if j == 0:
                ax.set_ylabel(name)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("P31 NCGN/DMP on digit point clouds")
    fig.tight_layout()
    return save_figure(fig, out_dir, "p31_ncgn_dmp")


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce the DMP-vs-kNN claim at small scale (see the module docstring)."""
    seed_everything(seed)
    with torch_threads(1):
        return evaluate(QUICK if quick else FULL, seed, out_dir=out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
