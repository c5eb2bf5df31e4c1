"""P50 reproduction — FedCEO (Clients Collaborate, ICML 2025) at small scale on sklearn digits.

Setting (brief §6, with the deviations listed in ``NOTES``): 20 IID clients, m = 10 sampled per round,
bias-free MLP 64-64-10 (like the official EMNIST MLP), 2 local epochs of SGD (batch 32), user-level DP
(client update clipped to C = 1, N(0, σ²C²) added before upload), FedCEO with I = 5, ϑ = 1.04.

σ was calibrated once (seed 0) so that DP-FedAvg loses ≥ 10 points against FedAvg. The FedCEO threshold
follows the brief: τ/m = c · (σC/√m)(√n1 + √n2) for the largest layer, c picked from {0.5, 1, 2} on the
validation split.

Pass rule (mean of 3 seeds): (1) FedCEO ≥ DP-FedAvg + 3 points, (2) at the first smoothing round the
FedCEO global model is ≤ 0.8× as far from the noise-free model as DP-FedAvg's, (3) with DP off FedCEO is
within 1.5 points of FedAvg. ``quick=True``: 10 rounds, 1 seed, c = 1, criterion (2) only.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import numpy as np
import torch

from icml25.federated.data import FederatedData, load_federated_digits
from icml25.federated.dp import DPConfig
from icml25.federated.fedceo import FedCEOConfig
from icml25.federated.server import DPFedAvgServer, FedCEOServer, History
from icml25.federated.training import LocalTrainConfig, make_mlp
from icml25.kernels import Report

N_CLIENTS, CLIENTS_PER_ROUND = 20, 10
HIDDEN = 64
SIGMA = 0.3  # user-level noise multiplier; calibrated on seed 0: FedAvg 93.0% -> DP-FedAvg 81.7%
CLIP = 1.0
INTERVAL, THETA = 5, 1.04
C_GRID = (0.5, 1.0, 2.0)
SIGMA_SAMPLE = 2.0  # report-only sample-level DP-SGD run
TRAIN = LocalTrainConfig(epochs=2, lr=0.1, batch_size=32, momentum=0.5)

CLAIM = (
    "Tensor low-rank proximal smoothing of the DP-noised client models (FedCEO) improves the "
    "utility of DP federated learning at the same privacy cost."
)
NOTES = (
    "Scale: sklearn digits, 20 IID clients, m=10, MLP 64-64-10 without biases; user-level DP "
    f"(clip C={CLIP}, sigma={SIGMA}) - the paper's numbers use per-sample DP-SGD on CIFAR-10/EMNIST. "
    "Deviations from the brief: local SGD lr 0.1 with momentum 0.5 (the official momentum) instead of "
    "lr 0.05, because FedAvg reached only ~85% in 40 rounds with lr 0.05; the denoising distance uses the "
    "noise-free trajectory of the same clipped client updates (the DP-FedAvg and FedCEO runs coincide up to "
    "the first smoothing). epsilon_server: worst client against the server (each upload a Gaussian "
    "mechanism, no amplification); epsilon_aggregate: against observers of the global models only "
    "(sum noise sigma*sqrt(m), Poisson rate m/N). Smoothing is post-processing: epsilon is the same for "
    "DP-FedAvg and FedCEO. At this scale the accumulated DP noise in the weights is much larger than the "
    "learned low-rank signal, and the noisy network still works as a random-feature model; singular value "
    "thresholding removes that noise (criterion 2) but also the random features and part of the signal, "
    "so accuracy criteria 1 and 3 are not reached (measured numbers above)."
)


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (seeds any legacy global-state user, per CONTRIBUTING)
    torch.manual_seed(seed)


def _model_fn() -> torch.nn.Module:
    return make_mlp(64, HIDDEN, 10, bias=False)


def noise_spectral_norm(upload_std: float, m: int, shape: tuple[int, int]) -> float:
    """Expected spectral norm of one round's noise on the client mean: (std/√m)(√n1 + √n2).

    ``upload_std`` is the per-entry noise std of one upload (σC under user-level DP).
    """
    return upload_std / math.sqrt(m) * (math.sqrt(shape[0]) + math.sqrt(shape[1]))


def fedceo_tau0(c: float, upload_std: float = SIGMA * CLIP) -> float:
    """Initial threshold τ0 (on the m-client tensor) with τ0/m = c × the largest layer's noise norm."""
    return c * CLIENTS_PER_ROUND * noise_spectral_norm(upload_std, CLIENTS_PER_ROUND, (64, HIDDEN))


def sample_level_upload_std(sigma: float, n_local: int) -> float:
    """Approximate per-entry noise std of one upload under DP-SGD: σC·lr/B·√steps/(1 − momentum)."""
    return sigma * CLIP * TRAIN.lr / TRAIN.batch_size * math.sqrt(TRAIN.steps(n_local)) / (1 - TRAIN.momentum)


def _run(
    data: FederatedData,
    rounds: int,
    seed: int,
    dp: DPConfig,
    c: float | None,
    theta: float = THETA,
    upload_std: float = SIGMA * CLIP,
) -> History:
    _seed_all(seed)
    kw = dict(clients_per_round=CLIENTS_PER_ROUND, train=TRAIN, dp=dp, seed=seed, model_fn=_model_fn)
    if c is None:
        return DPFedAvgServer(data, **kw).fit(rounds)
    cfg = FedCEOConfig.from_tau(fedceo_tau0(c, upload_std), theta=theta, interval=INTERVAL)
    return FedCEOServer(data, cfg, **kw).fit(rounds)


def _plot(curves: dict[str, np.ndarray], eps: list[float], smooth_rounds: list[int], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, acc in curves.items():
        ax1.plot(np.arange(1, len(acc) + 1), 100 * acc, label=name)
    for r in smooth_rounds:
        ax1.axvline(r + 1, color="grey", lw=0.5, ls=":")
    ax1.set(xlabel="round", ylabel="test accuracy (%)", title="P50 FedCEO on digits (dotted: smoothing)")
    ax1.legend(fontsize=8)
    ax2.plot(np.arange(1, len(eps) + 1), eps)
    ax2.set(
        xlabel="round", ylabel="epsilon (delta=1e-5)", title=f"user-level DP, sigma={SIGMA}", yscale="log"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce P50 at small scale; returns the :class:`~icml25.kernels.Report`."""
    # The matrices are tiny: one intra-op thread is fastest and makes results thread-count independent.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_experiment(quick, seed, out_dir)
    finally:
        torch.set_num_threads(threads)


def _run_experiment(quick: bool, seed: int, out_dir: str | Path | None) -> Report:
    from tqdm.auto import tqdm

    t0 = time.time()
    rounds = 10 if quick else 40
    seeds = [seed] if quick else [seed, seed + 1, seed + 2]
    grid = (1.0,) if quick else C_GRID
    dp = DPConfig("user", SIGMA, CLIP)
    nodp = DPConfig("none")
    first_smooth = INTERVAL - 1

    jobs = [("fedavg", None), ("dpfedavg", None)] + [("fedceo", c) for c in grid]
    bar = tqdm(total=len(seeds) * len(jobs), desc="P50", leave=False)
    hist: dict[tuple[str, float | None, int], History] = {}
    datasets = {s: load_federated_digits(N_CLIENTS, val_size=0.2, seed=s) for s in seeds}
    for s in seeds:
        for name, c in jobs:
            hist[(name, c, s)] = _run(datasets[s], rounds, s, nodp if name == "fedavg" else dp, c)
            bar.update()
    bar.close()

    def final(name: str, c: float | None, key: str = "test_acc") -> float:
        return float(np.mean([getattr(hist[(name, c, s)], key)[-1] for s in seeds]))

    # λ (through c) chosen on the validation split, mean over seeds.
    best_c = max(grid, key=lambda c: final("fedceo", c, "val_acc"))
    ratios = [
        hist[("fedceo", best_c, s)].dist_global[first_smooth]
        / hist[("fedceo", best_c, s)].dist_mean[first_smooth]
        for s in seeds
    ]
    h_dp = hist[("dpfedavg", None, seeds[0])]
    m: dict[str, float] = {
        "sigma": SIGMA,
        "clip": CLIP,
        "rounds": rounds,
        "n_seeds": len(seeds),
        "c_selected": best_c,
        "tau0": fedceo_tau0(best_c),
        "lambda": 1.0 / (2.0 * fedceo_tau0(best_c)),
        "fedavg_acc": final("fedavg", None),
        "baseline_dpfedavg_acc": final("dpfedavg", None),
        "fedceo_acc": final("fedceo", best_c),
        "denoise_ratio": float(np.mean(ratios)),
        "epsilon_server": h_dp.epsilon[-1],
        "epsilon_aggregate": h_dp.epsilon_aggregate[-1],
    }
    m["fedceo_gain_points"] = 100 * (m["fedceo_acc"] - m["baseline_dpfedavg_acc"])
    m["dp_loss_points"] = 100 * (m["fedavg_acc"] - m["baseline_dpfedavg_acc"])
    for c in grid:
        m[f"fedceo_acc_c{c:g}"] = final("fedceo", c)
        m[f"fedceo_val_acc_c{c:g}"] = final("fedceo", c, "val_acc")
    ok2 = m["denoise_ratio"] <= 0.8
    if quick:
        passed = ok2
        threshold = (
            "quick: at the first smoothing round ||FedCEO - noise-free|| <= 0.8 ||DP-FedAvg - noise-free||"
        )
    else:
        nodp_runs = [
            _run(datasets[s], rounds, s, nodp, best_c) for s in tqdm(seeds, desc="P50 no-DP", leave=False)
        ]
        m["fedceo_nodp_acc"] = float(np.mean([h.test_acc[-1] for h in nodp_runs]))
        m["nodp_gap_points"] = 100 * (m["fedavg_acc"] - m["fedceo_nodp_acc"])
        # Report-only variants (one seed): fixed threshold, and sample-level DP-SGD.
        m["fedceo_theta1_acc"] = _run(datasets[seed], rounds, seed, dp, best_c, theta=1.0).test_acc[-1]
        dps = DPConfig("sample", SIGMA_SAMPLE, CLIP)
        h_s = _run(datasets[seed], rounds, seed, dps, None)
        n_local = int(np.mean([len(y) for _, y in datasets[seed].clients]))
        m["sample_dpfedavg_acc"] = h_s.test_acc[-1]
        m["sample_fedceo_acc"] = _run(
            datasets[seed],
            rounds,
            seed,
            dps,
            best_c,
            upload_std=sample_level_upload_std(SIGMA_SAMPLE, n_local),
        ).test_acc[-1]
        m["sample_epsilon_server"] = h_s.epsilon[-1]
        ok1 = m["fedceo_gain_points"] >= 3.0
        ok3 = m["nodp_gap_points"] <= 1.5
        m["criterion1_pass"], m["criterion2_pass"], m["criterion3_pass"] = float(ok1), float(ok2), float(ok3)
        passed = ok1 and ok2 and ok3
        threshold = (
            "mean of 3 seeds: FedCEO >= DP-FedAvg + 3 points; denoise ratio at the first smoothing <= 0.8; "
            "without DP, FedCEO within 1.5 points of FedAvg"
        )
    m["wall_s"] = time.time() - t0

    figures = []
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        curves = {
            "FedAvg": np.mean([hist[("fedavg", None, s)].test_acc for s in seeds], 0),
            f"DP-FedAvg (sigma={SIGMA})": np.mean([hist[("dpfedavg", None, s)].test_acc for s in seeds], 0),
        }
        for c in grid:
            curves[f"FedCEO c={c:g}" + (" (selected)" if c == best_c else "")] = np.mean(
                [hist[("fedceo", c, s)].test_acc for s in seeds], 0
            )
        figures.append(
            _plot(curves, h_dp.epsilon, list(range(first_smooth, rounds, INTERVAL)), out / "p50_fedceo.png")
        )

    return Report(
        paper="P50",
        claim=CLAIM,
        threshold=threshold,
        passed=passed,
        metrics=m,
        headline="fedceo_acc",
        baseline="baseline_dpfedavg_acc",
        figures=figures,
        notes=NOTES
        + f" Numbers refer to user-level DP (mode='user'); epsilon at delta=1e-5 after {rounds} rounds.",
    )


if __name__ == "__main__":  # pragma: no cover
    import sys

    rep = run(quick="--full" not in sys.argv, out_dir="reports/P50")
    print(rep.summary())
    for k, v in rep.metrics.items():
        print(f"  {k}: {v:.4g}")
