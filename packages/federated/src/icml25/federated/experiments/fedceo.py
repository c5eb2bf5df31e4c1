"""P50 reproduction — FedCEO (Clients Collaborate, ICML 2025) at small scale on sklearn digits.

Setting — the official code's setup in miniature (brief §6; deviations in ``NOTES``): 20 IID clients,
m = 10 sampled per round without replacement, bias-free MLP 64-64-10 (the official EMNIST MLP has
hidden width 64 and no biases), local SGD with momentum 0.5 (official) for 10 epochs of batch 16 at
lr 0.05 (official: 30 epochs of batch 64 at lr 0.01 on ~1000 samples per client; digits clients hold
~50), 40 rounds, FedCEO with I = 5 and ϑ = 1.04 (the official CIFAR-10 ratio).

Privacy: user-level DP (primary; the paper's framing): each client clips its update to C = 0.5 (about
the median unclipped update norm of this setting, the usual DP-FedAvg calibration) and adds
N(0, σ²C²) before upload. σ = 0.6 was calibrated once on seed 0 so that DP-FedAvg loses >= 10 points.

Threshold: tied to the noise (``FedCEOConfig(noise_std=σC)``): for every parameter matricised as
``[n1, n2]`` the k-th smoothing uses ``τ = c·ϑ^k·σC√m(√n1 + √n2)``, i.e. c times the expected spectral
norm of a Fourier slice of the stacked upload noise (at frequency 0: τ/m is c times the spectral norm of
one round's mean noise, as in the brief). c (= 1/(2λ)) is picked from {0.5, 1, 2} on a validation split.
Without DP the noise is 0, so τ = 0 and FedCEO is exactly FedAvg.

Pass rule (mean of 3 seeds): (1) FedCEO >= DP-FedAvg + 3 points, (2) at the first smoothing round the
FedCEO global model is <= 0.8x as far from the noise-free model as DP-FedAvg's, (3) with DP off FedCEO is
within 1.5 points of FedAvg. ``quick=True``: 10 rounds, 1 seed, c = 0.5, criteria (1) and (2) (the
accuracy ordering with the brief's 3-point margin is gated in both modes). Each criterion is a named check
of the report (``Report.checks``); the threshold text is built from the same names.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from icml25.federated.data import FederatedData, load_federated_digits, load_federated_npz
from icml25.federated.dp import DPConfig
from icml25.federated.fedceo import FedCEOConfig
from icml25.federated.server import DPFedAvgServer, FedCEOServer, History
from icml25.federated.training import LocalTrainConfig, make_mlp, upload_noise_std
from icml25.kernels import Report, torch_threads

N_CLIENTS, CLIENTS_PER_ROUND = 20, 10
HIDDEN = 64
SIGMA = 0.6  # user-level noise multiplier; calibrated on seed 0: FedAvg 96.7% -> DP-FedAvg 82.8%
CLIP = 0.5  # ~ median unclipped update norm (0.3-1.2 over training) of TRAIN on these clients
INTERVAL, THETA = 5, 1.04
C_GRID = (0.5, 1.0, 2.0)
C_QUICK = 0.5
# The pass rule as named checks (brief §6); the threshold text is built from these names.
ACC_MARGIN_POINTS = 3.0
DENOISE_MAX_RATIO = 0.8
NODP_MAX_GAP_POINTS = 1.5
CHECK_ACCURACY = f"FedCEO test accuracy >= DP-FedAvg + {ACC_MARGIN_POINTS:g} points"
CHECK_DENOISE = (
    f"denoising: at the first smoothing round ||FedCEO - noise-free|| <= {DENOISE_MAX_RATIO:g} "
    "||DP-FedAvg - noise-free||"
)
CHECK_NODP = f"without DP, FedCEO within {NODP_MAX_GAP_POINTS:g} points of FedAvg"
SIGMA_SAMPLE = 1.0  # report-only sample-level DP-SGD run (the official code's mechanism), clip 1.0
TRAIN = LocalTrainConfig(epochs=10, lr=0.05, batch_size=16, momentum=0.5)

CLAIM = (
    "Tensor low-rank proximal smoothing of the DP-noised client models (FedCEO) improves the "
    "utility of DP federated learning at the same privacy cost."
)
NOTES = (
    "Scale: sklearn digits, 20 IID clients, m=10, MLP 64-64-10 without biases, 10 local epochs (batch 16, "
    f"lr 0.05, momentum 0.5), 40 rounds; user-level DP (clip C={CLIP}, sigma={SIGMA}) - the official code "
    "uses un-accounted per-sample DP-SGD on CIFAR-10/EMNIST (report-only here). FedCEO threshold tied to the "
    "noise: tau = c * theta^k * sigma*C*sqrt(m)*(sqrt(n1)+sqrt(n2)) per parameter (the official code uses "
    "one absolute tau=theta^k/(2*lambda) for all parameters); c chosen on a validation split. The denoising "
    "distance uses the noise-free trajectory of the same clipped client updates (DP-FedAvg and FedCEO "
    "coincide up to the first smoothing). epsilon_server: worst client against the server (each upload a "
    "Gaussian mechanism, no amplification); epsilon_aggregate: against observers of the global models only "
    "(sum noise sigma*sqrt(m), Poisson rate m/N). Smoothing is post-processing: epsilon is the same for "
    "DP-FedAvg and FedCEO. Why the accuracy claim fails here: thresholding at the noise level does remove "
    "noise (criterion 2), but soft-thresholding also subtracts tau/m from every singular value of the "
    "learned weights at each smoothing, and at this scale (clipped updates of norm <= C per round) training "
    "does not rebuild the signal between smoothings as fast; every c in the grid, and gentler c=0.25, "
    "restart on/off and excluding either layer, stayed below DP-FedAvg in calibration runs. Criterion 3 "
    "holds by construction (tau is 0 without noise). Other regimes tried (package README): hidden width "
    "256/1024, digits upsampled to 16x16 and 28x28 (EMNIST-sized input), 100 clients with m=50, sample-level "
    "DP-SGD with c down to 0.1; none put FedCEO above DP-FedAvg by more than a point."
)


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (seeds any legacy global-state user, per CONTRIBUTING)
    torch.manual_seed(seed)


def model_fn_for(data: FederatedData) -> Callable[[], torch.nn.Module]:
    """The bias-free MLP ``n_features → HIDDEN → n_classes`` of the official EMNIST setup, for ``data``."""
    return lambda: make_mlp(data.n_features, HIDDEN, data.n_classes, bias=False)


def mean_client_size(data: FederatedData) -> int:
    """Average number of training samples per client (for the sample-level noise estimate)."""
    return round(float(np.mean([len(y) for _, y in data.clients])))


def fedceo_config(c: float, dp: DPConfig, data: FederatedData, theta: float = THETA) -> FedCEOConfig:
    """FedCEO with a threshold of c × the expected spectral norm of the stacked upload noise."""
    noise = upload_noise_std(dp, TRAIN, mean_client_size(data))
    return FedCEOConfig(lam=1.0 / (2.0 * c), theta=theta, interval=INTERVAL, noise_std=noise)


def _run(
    data: FederatedData, rounds: int, seed: int, dp: DPConfig, c: float | None, theta: float = THETA
) -> History:
    _seed_all(seed)
    kw = dict(clients_per_round=CLIENTS_PER_ROUND, train=TRAIN, dp=dp, seed=seed, model_fn=model_fn_for(data))
    if c is None:
        return DPFedAvgServer(data, **kw).fit(rounds)
    return FedCEOServer(data, fedceo_config(c, dp, data, theta), **kw).fit(rounds)


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


def _rounds_and_seeds(quick: bool, seed: int) -> tuple[int, list[int]]:
    return (10, [seed]) if quick else (40, [seed, seed + 1, seed + 2])


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    rounds, seeds = _rounds_and_seeds(quick, 0)
    names = [CHECK_ACCURACY, CHECK_DENOISE] + ([] if quick else [CHECK_NODP])
    scope = (
        f"quick ({rounds} rounds, 1 seed, c={C_QUICK:g})"
        if quick
        else f"full (mean of {len(seeds)} seeds, {rounds} rounds)"
    )
    return f"{scope}: " + " and ".join(names)


def run(
    quick: bool = True,
    seed: int = 0,
    out_dir: str | Path | None = None,
    data_path: str | Path | None = None,
) -> Report:
    """Reproduce P50 at small scale; returns the :class:`~icml25.kernels.Report`.

    ``data_path``: run the same protocol on a local ``.npz`` dataset instead of sklearn digits (arrays
    ``x``, ``y`` and optionally ``x_test``, ``y_test``; see :func:`~icml25.federated.data.load_federated_npz`),
    e.g. EMNIST as in the paper. The MLP adapts to its feature and class counts; σ and C stay those
    calibrated on digits (change ``SIGMA``/``CLIP`` to recalibrate).
    """
    # The matrices are tiny: one intra-op thread is fastest and makes results thread-count independent.
    with torch_threads(1):
        return _run_experiment(quick, seed, out_dir, data_path)


def _load(data_path: str | Path | None, seed: int) -> FederatedData:
    if data_path is None:
        return load_federated_digits(N_CLIENTS, val_size=0.2, seed=seed)
    return load_federated_npz(data_path, N_CLIENTS, val_size=0.2, seed=seed)


def _run_experiment(
    quick: bool, seed: int, out_dir: str | Path | None, data_path: str | Path | None
) -> Report:
    from tqdm.auto import tqdm

    t0 = time.time()
    rounds, seeds = _rounds_and_seeds(quick, seed)
    grid = (C_QUICK,) if quick else C_GRID
    dp = DPConfig("user", SIGMA, CLIP)
    nodp = DPConfig("none")
    first_smooth = INTERVAL - 1

    jobs = [("fedavg", None), ("dpfedavg", None)] + [("fedceo", c) for c in grid]
    bar = tqdm(total=len(seeds) * len(jobs), desc="P50", leave=False)
    hist: dict[tuple[str, float | None, int], History] = {}
    datasets = {s: _load(data_path, s) for s in seeds}
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
        "lambda": 1.0 / (2.0 * best_c),
        # thresholds of the first smoothing (k = 1), per parameter: c·ϑ·σC√m(√n1 + √n2)
        **{
            f"tau_first_{k}": v
            for k, v in hist[("fedceo", best_c, seeds[0])].layer_taus[first_smooth].items()
        },
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
    checks = {
        CHECK_ACCURACY: m["fedceo_gain_points"] >= ACC_MARGIN_POINTS,
        CHECK_DENOISE: m["denoise_ratio"] <= DENOISE_MAX_RATIO,
    }
    if quick:
        scope = f"quick ({rounds} rounds, 1 seed, c={C_QUICK:g})"
    else:
        nodp_runs = [
            _run(datasets[s], rounds, s, nodp, best_c) for s in tqdm(seeds, desc="P50 no-DP", leave=False)
        ]
        m["fedceo_nodp_acc"] = float(np.mean([h.test_acc[-1] for h in nodp_runs]))
        # τ ∝ noise: without DP every threshold is 0 and FedCEO must retrace FedAvg exactly
        m["nodp_identical_to_fedavg"] = float(
            all(h.test_acc == hist[("fedavg", None, s)].test_acc for h, s in zip(nodp_runs, seeds))
        )
        m["nodp_gap_points"] = 100 * (m["fedavg_acc"] - m["fedceo_nodp_acc"])
        # Report-only variants (one seed): fixed threshold, and sample-level DP-SGD.
        m["fedceo_theta1_acc"] = _run(datasets[seed], rounds, seed, dp, best_c, theta=1.0).test_acc[-1]
        dps = DPConfig("sample", SIGMA_SAMPLE, 1.0)  # the official per-sample clip C = 1
        h_s = _run(datasets[seed], rounds, seed, dps, None)
        m["sample_dpfedavg_acc"] = h_s.test_acc[-1]
        m["sample_fedceo_acc"] = _run(datasets[seed], rounds, seed, dps, best_c).test_acc[-1]
        m["sample_epsilon_server"] = h_s.epsilon[-1]
        checks[CHECK_NODP] = m["nodp_gap_points"] <= NODP_MAX_GAP_POINTS
        for i, ok in enumerate(checks.values(), start=1):
            m[f"criterion{i}_pass"] = float(ok)
        scope = f"full (mean of {len(seeds)} seeds, {rounds} rounds)"
    if f"{scope}: " + " and ".join(checks) != threshold(quick):
        raise AssertionError("P50: the checks and threshold() disagree")  # one pass rule, stated twice
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
        threshold=threshold(quick),
        passed=all(checks.values()),
        checks=checks,
        metrics=m,
        headline="fedceo_acc",
        baseline="baseline_dpfedavg_acc",
        figures=figures,
        notes=NOTES
        + f" Numbers refer to user-level DP (mode='user'); epsilon at delta=1e-5 after {rounds} rounds.",
    )


if __name__ == "__main__":  # pragma: no cover
    import argparse

    parser = argparse.ArgumentParser(description="P50 FedCEO reproduction")
    parser.add_argument("--full", action="store_true", help="40 rounds, 3 seeds, the c grid")
    parser.add_argument("--data", default=None, help="local .npz dataset (x, y[, x_test, y_test])")
    args = parser.parse_args()
    rep = run(quick=not args.full, out_dir="reports/P50", data_path=args.data)
    print(rep.summary())
    for k, v in rep.metrics.items():
        print(f"  {k}: {v:.4g}")
