"""Detecting Strategic Deception Using Linear Probes — ICML 2025, P52: small-scale reproduction.

Goldowsky-Dill, Chughtai, Heimersheim, Hobbhahn, "Detecting Strategic Deception Using Linear Probes",
ICML 2025 (arXiv 2502.03407; official code ``ApolloResearch/deception-detection``). Claim: a logistic-
regression probe on residual-stream activations, trained on a simple contrastive dataset, scored per
token and averaged over the response, separates deceptive from honest responses (AUROC 0.96–0.999 on
Llama-3.3-70B) and, thresholded at 1% false positives on ordinary chat (Alpaca), catches most of them;
it beats the mean-difference probe, and the token mean beats reading one token.

Our CPU-scale setting (:data:`FULL`; :class:`Setting` gives each knob's paper value next to ours). No
dataset with deception labels fits here, so the activations come from :class:`DeceptionSimulator`: d =
128, anisotropic token noise (eigenvalues log-uniform in [0.05, 20], random rotation), dialogue-level
correlated noise of the token noise's size (ρ = 1, which averaging cannot remove), a deception direction
``u`` with cosine 0.5 to the top-variance eigenvectors carried by 60–100% of a deceptive dialogue's 10–60
tokens, context shifts of whitened norm 3 per split orthogonal to ``u``, and pad activations of whitened
norm 100. 300 training, 300 evaluation and 2,000 control dialogues, 3 seeds. :data:`QUICK`: d = 64,
100/100/500 dialogues.

Methods, all fitted on the training dialogues' tokens: the logistic probe (standardised features,
λ = 10, no intercept, as the official detector), the mean-difference probe (MMS, the baseline), and in
full mode LAT, the covariance-adjusted LDA probe and a random direction. Reference: the *oracle*, the
known Fisher direction ``Σ⁻¹u`` on dialogue means (Bayes-optimal for honest vs deceptive here), with the
same control-threshold procedure.

Pass rule (:func:`checks`), on the mean over seeds, with the gated data free of the two generalisation
nuisances: full: (1) LR AUROC ≥ oracle AUROC − 0.03; (2) LR recall at the 1%-control-FPR threshold ≥
oracle recall − 0.10; (3) LR AUROC ≥ MMS AUROC + 0.10 (whitening matters under anisotropic, correlated
noise); (4) mean-aggregated LR AUROC ≥ last-token LR AUROC + 0.05. Quick: (3) and (4), the claim's
direction against the baseline. Reported, without a bar: the AUROC lost when the training data carry the
instruction cue ``w`` (Instructed-Pairs' "was told to lie") and when half the evaluation dialogues carry a
deception-related nuisance ``v`` in the lowest-variance direction.

Run: ``python -m icml25.interpretability.experiments.deception_probes [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from icml25.interpretability.deception_probes import (
    DeceptionSimulator,
    LATProbe,
    LDAProbe,
    LogisticProbe,
    MeanDiffProbe,
    TokenActs,
    auroc,
    evaluate_probe,
    score_dialogues,
    threshold_at_fpr,
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

PAPER = "P52"
CLAIM = (
    "A logistic-regression probe on activations, trained on contrastive honest/dishonest data and averaged "
    "over the response's tokens, detects deceptive responses (paper: AUROC 0.96-0.999, most caught at 1% "
    "FPR on control chat), beating the mean-difference probe and single-token readout."
)


@dataclass(frozen=True)
class Setting:
    """One reproduction scale: simulator, dataset sizes, seeds and which bars apply."""

    d: int
    """Activation width (paper: 8192, Llama-3.3-70B layer 22; ours 128, quick 64)."""
    n_train: int
    """Training dialogues, half deceptive (paper: Instructed-Pairs, 2 x 306 facts x 80%; ours 300, quick 100)."""
    n_eval: int
    """Evaluation dialogues, half deceptive (paper: Roleplaying 371, Insider Trading, ...; ours 300, quick 100)."""
    n_control: int
    """Control dialogues that set the threshold (paper: 10,000 Alpaca answers; ours 2,000, quick 500)."""
    n_seeds: int = 3
    """Independent simulators (geometry and data) averaged by the checks (ours 3 in both modes)."""
    fpr: float = 0.01
    """Control false-positive rate of the threshold (paper 1%, as here)."""
    rho: float = 1.0
    """Dialogue-level noise relative to token noise (paper: real activations; ours 1)."""
    oracle_checks: bool = True
    """Gate LR against the oracle (ours: full only; the quick run gates the ordering against MMS only)."""
    extra_probes: bool = True
    """Also fit LAT, LDA and a random direction (the paper compares more probes; ours: full only)."""


FULL = Setting(d=128, n_train=300, n_eval=300, n_control=2000)
QUICK = Setting(d=64, n_train=100, n_eval=100, n_control=500, oracle_checks=False, extra_probes=False)

ORACLE_AUROC_GAP = 0.03
"""LR AUROC may trail the oracle's by at most this (full mode)."""
ORACLE_RECALL_GAP = 0.10
"""LR recall at the control threshold may trail the oracle's by at most this (full mode)."""
MMS_MARGIN = 0.10
"""LR AUROC minus MMS AUROC, at least (correlated anisotropic noise: whitening matters)."""
LAST_TOKEN_MARGIN = 0.05
"""Mean-aggregated LR AUROC minus last-token LR AUROC, at least (signal spread over many noisy tokens)."""


def checks(setting: Setting) -> list[Check]:
    """The pass rule of ``setting`` on seed-averaged metrics: LR near the oracle (full), LR above MMS, mean
    aggregation above the last token."""
    out = []
    if setting.oracle_checks:
        out += [
            Check(
                f"LR AUROC >= oracle AUROC - {ORACLE_AUROC_GAP:g}",
                lambda m: m["lr_auroc"] >= m["oracle_auroc"] - ORACLE_AUROC_GAP,
            ),
            Check(
                f"LR recall at {setting.fpr:g} control FPR >= oracle recall - {ORACLE_RECALL_GAP:g}",
                lambda m: m["lr_recall"] >= m["oracle_recall"] - ORACLE_RECALL_GAP,
            ),
        ]
    out += [
        Check(
            f"LR AUROC >= MMS AUROC + {MMS_MARGIN:g}",
            lambda m: m["lr_auroc"] >= m["baseline_mms_auroc"] + MMS_MARGIN,
        ),
        Check(
            f"LR mean-aggregation AUROC >= last-token AUROC + {LAST_TOKEN_MARGIN:g}",
            lambda m: m["lr_auroc"] >= m["lr_last_token_auroc"] + LAST_TOKEN_MARGIN,
        ),
    ]
    return out


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    return threshold_text(checks(QUICK if quick else FULL))


# ----------------------------------------------------------------------------------------- measurement
@dataclass
class SeedData:
    """One simulator and its splits: the gated (clean) splits and the two nuisance variants."""

    sim: DeceptionSimulator
    train: TokenActs
    train_cue: TokenActs
    eval: TokenActs
    eval_nuisance: TokenActs
    control: TokenActs


def make_data(setting: Setting, seed: int) -> SeedData:
    """The splits of one seed; the cue / nuisance variants share every random draw with the clean ones."""
    sim = DeceptionSimulator(d=setting.d, seed=seed, rho=setting.rho)
    return SeedData(
        sim=sim,
        train=sim.sample(setting.n_train, "train", seed=1, cue=0.0),
        train_cue=sim.sample(setting.n_train, "train", seed=1),
        eval=sim.sample(setting.n_eval, "eval", seed=2, nuisance=0.0),
        eval_nuisance=sim.sample(setting.n_eval, "eval", seed=2),
        control=sim.sample(setting.n_control, "control", seed=3),
    )


def oracle_metrics(data: SeedData, fpr: float) -> tuple[float, float]:
    """AUROC and recall at the control threshold of the Fisher direction ``Σ⁻¹u`` on dialogue means."""
    y = data.eval.labels.numpy()
    s_eval = data.sim.oracle_scores(data.eval)
    thr = threshold_at_fpr(data.sim.oracle_scores(data.control), fpr)
    return auroc(y, s_eval), float((s_eval[y == 1] > thr).mean())


class RandomDirectionProbe:
    """A random unit direction (the chance-level reference): token score ``x · r``."""

    def __init__(self, d: int, seed: int) -> None:
        r = np.random.default_rng(seed).standard_normal(d)
        self.coef_ = r / np.linalg.norm(r)

    def score_tokens(self, x: Any) -> np.ndarray:
        return np.asarray(x, dtype=np.float64) @ self.coef_


def measure_seed(setting: Setting, seed: int, make_lr: Callable[[], Any] = LogisticProbe) -> dict[str, float]:
    """All metrics of one seed. ``make_lr`` builds the LR probe (a broken variant in the tests)."""
    data = make_data(setting, seed)
    fpr = setting.fpr
    m: dict[str, float] = {}
    m["oracle_auroc"], m["oracle_recall"] = oracle_metrics(data, fpr)
    lr = make_lr().fit(data.train)
    r = evaluate_probe(lr, data.eval, data.control, fpr)
    m.update(lr_auroc=r["auroc"], lr_recall=r["recall"], lr_auroc_control=r["auroc_control"])
    m["lr_fpr_honest"] = r["fpr_honest"]
    m["lr_last_token_auroc"] = evaluate_probe(lr, data.eval, data.control, fpr, aggregation="last")["auroc"]
    mms = MeanDiffProbe().fit(data.train)
    r = evaluate_probe(mms, data.eval, data.control, fpr)
    m.update(baseline_mms_auroc=r["auroc"], mms_recall=r["recall"])
    lr_cue = make_lr().fit(data.train_cue)
    m["lr_auroc_drop_cue"] = m["lr_auroc"] - evaluate_probe(lr_cue, data.eval, data.control, fpr)["auroc"]
    m["lr_auroc_drop_nuisance"] = (
        m["lr_auroc"] - evaluate_probe(lr, data.eval_nuisance, data.control, fpr)["auroc"]
    )
    if setting.extra_probes:
        for name, probe in (
            ("lat", LATProbe(seed=seed)),
            ("lda", LDAProbe()),
        ):
            r = evaluate_probe(probe.fit(data.train), data.eval, data.control, fpr)
            m[f"{name}_auroc"], m[f"{name}_recall"] = r["auroc"], r["recall"]
        y = data.eval.labels.numpy()
        m["random_auroc"] = auroc(y, score_dialogues(RandomDirectionProbe(setting.d, seed), data.eval))
    return m


def evaluate(
    setting: Setting,
    seed: int = 0,
    out_dir: str | Path | None = None,
    make_lr: Callable[[], Any] = LogisticProbe,
) -> Report:
    """Measure ``setting.n_seeds`` simulators (seeds ``seed, seed + 1, ...``), average, apply :func:`checks`."""
    t0 = time.perf_counter()
    seeds = [seed + k for k in range(setting.n_seeds)]
    per_seed = [measure_seed(setting, s, make_lr) for s in progress(seeds, desc="P52 seeds")]
    metrics = {k: float(np.mean([p[k] for p in per_seed])) for k in per_seed[0]}
    for k in ("lr_auroc", "lr_recall", "oracle_auroc", "baseline_mms_auroc", "lr_last_token_auroc"):
        metrics[f"{k}_min"] = float(min(p[k] for p in per_seed))
        metrics[f"{k}_max"] = float(max(p[k] for p in per_seed))
    metrics["seconds"] = time.perf_counter() - t0
    figures = [plot_scores(out_dir, setting, seed, make_lr)] if out_dir is not None else []
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        metrics=metrics,
        headline="lr_auroc",
        baseline="baseline_mms_auroc",
        figures=figures,
        seeds=seeds,
        notes=(
            f"DeceptionSimulator, d={setting.d}, rho={setting.rho:g}, {setting.n_train}/{setting.n_eval}/"
            f"{setting.n_control} train/eval/control dialogues of 10-60 tokens, {setting.n_seeds} seeds "
            f"(metrics: means over seeds; _min/_max their range). Threshold at {setting.fpr:g} FPR on control. "
            "Gated data carry neither the training cue w nor the evaluation nuisance v; lr_auroc_drop_cue and "
            "lr_auroc_drop_nuisance report what they cost. Synthetic activations stand in for Llama-3.3-70B "
            "residuals: this checks the method, not the paper's empirical numbers."
        ),
    )


def plot_scores(
    out_dir: str | Path, setting: Setting, seed: int, make_lr: Callable[[], Any] = LogisticProbe
) -> Path:
    """LR dialogue scores of honest, deceptive and control dialogues with the 1%-FPR threshold, and the
    AUROC of each method (seed ``seed``)."""
    data = make_data(setting, seed)
    lr = make_lr().fit(data.train)
    s_eval, s_ctrl = score_dialogues(lr, data.eval), score_dialogues(lr, data.control)
    thr = threshold_at_fpr(s_ctrl, setting.fpr)
    y = data.eval.labels.numpy()
    fig, (ax, bx) = new_figure(1, 2, figsize=(11, 4))
    bins = np.histogram_bin_edges(np.r_[s_eval, s_ctrl], bins=40)
    ax.hist(s_ctrl, bins=bins, density=True, alpha=0.5, color="tab:gray", label="control")
    ax.hist(s_eval[y == 0], bins=bins, density=True, alpha=0.6, color="tab:blue", label="honest")
    ax.hist(s_eval[y == 1], bins=bins, density=True, alpha=0.6, color="tab:red", label="deceptive")
    ax.axvline(thr, color="k", ls="--", lw=1, label=f"{setting.fpr:g} control FPR")
    ax.set_xlabel("LR probe score (mean over response tokens)")
    ax.set_ylabel("density")
    ax.set_title("P52: LR dialogue scores")
    ax.legend(fontsize=8)
    oracle_auc, _ = oracle_metrics(data, setting.fpr)
    aucs = {
        "oracle": oracle_auc,
        "LR mean": auroc(y, s_eval),
        "LR last": auroc(y, score_dialogues(lr, data.eval, "last")),
        "MMS": auroc(y, score_dialogues(MeanDiffProbe().fit(data.train), data.eval)),
        "LAT": auroc(y, score_dialogues(LATProbe(seed=seed).fit(data.train), data.eval)),
        "LDA": auroc(y, score_dialogues(LDAProbe().fit(data.train), data.eval)),
    }
    bx.bar(
        list(aucs),
        list(aucs.values()),
        color=["k", "tab:red", "tab:orange", "tab:blue", "tab:cyan", "tab:green"],
    )
    bx.axhline(0.5, color="gray", lw=0.8, ls=":")
    bx.set_ylim(0.4, 1.0)
    bx.set_ylabel("AUROC honest vs deceptive")
    bx.set_title(f"P52: probes (d={setting.d}, seed {seed})")
    fig.tight_layout()
    return save_figure(fig, out_dir, "p52_deception_probes")


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce the deception-probe claim at small scale (see the module docstring)."""
    seed_everything(seed)
    with torch_threads(1):  # small GEMMs and lbfgs: one thread is fastest on 2 cores and reproducible
        return evaluate(QUICK if quick else FULL, seed, out_dir=out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
