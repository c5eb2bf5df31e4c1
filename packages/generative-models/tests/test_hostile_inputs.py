"""Hostile-input contract of icml25.generative_models (CONTRIBUTING.md, "Bad input contract").

P02 Thermalizer and P33 TarFlow: every public callable is registered with a valid example call;
:mod:`icml25.kernels.testing` derives the hostile variants and asserts a clear error or a documented,
finite result. Estimators are also checked to keep their state after a rejected ``fit``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
import torch

import icml25.generative_models as gm
from icml25.generative_models.thermalizer import MLP
from icml25.kernels import testing as kt
from icml25.kernels.rng import isolated_rng
from icml25.kernels.testing import HostileSpec

torch.manual_seed(0)
_g = torch.Generator().manual_seed(0)
_SNAP = torch.randn(16, 8, generator=_g)
_FIT = {"n_iter": 2, "batch_size": 4}


def _thermalizer() -> gm.Thermalizer:
    torch.manual_seed(0)
    return gm.Thermalizer(MLP(8, 8, hidden=16), MLP(8, 10, hidden=16), T=10)


def _fitted_thermalizer():
    th = _thermalizer().fit(_SNAP, **_FIT)
    return th.fit, {"snapshots": _SNAP, **_FIT}, th


def _fitted_emulator():
    torch.manual_seed(0)
    em = gm.ResidualEmulator(MLP(8, 8, hidden=16)).fit(_SNAP.reshape(2, 8, 8), **_FIT)
    return em.fit, {"trajectories": _SNAP.reshape(2, 8, 8), **_FIT}, em


def _noise_level():
    th = _fitted_thermalizer()[2]
    return th.noise_level, {"x": _SNAP[:3]}, th


def _denoise():
    th = _fitted_thermalizer()[2]
    return (
        (lambda x: th.denoise(x, torch.tensor([5, 0, 3]), 1, generator=torch.Generator().manual_seed(0))),
        {"x": _SNAP[:3]},
        th,
    )


def _level_accuracy():
    th = _fitted_thermalizer()[2]
    return (
        (lambda x: th.level_accuracy(x, [0, 3], generator=torch.Generator().manual_seed(0))),
        {"x": _SNAP[:4]},
        th,
    )


def _select_levels():
    th = _fitted_thermalizer()[2]
    em = _fitted_emulator()[2]
    return (
        (
            lambda ics: gm.select_levels(
                em,
                th,
                ics,
                [(3, 1), (5, 2)],
                horizon=3,
                window=2,
                band=(1e-3, 1e3),
                log_ref=np.zeros(5),
                modes=np.arange(1, 5),
                noise_limit=None,
                seed=0,
            )
        ),
        {"ics": _SNAP[:3]},
        None,
    )


_TRAJ = np.random.default_rng(1).normal(size=(2, 5, 8))
UNSTABLE = "a non-finite or out-of-band energy is an unstable rollout: False, the function's purpose"
BLOWN_UP = kt.Allow("a blown-up segment (non-finite or |x| >= 1e6) gets inf, as documented", finite=False)


def _rollout():
    th = _fitted_thermalizer()[2]
    em = _fitted_emulator()[2]
    return (
        (
            lambda x0: gm.thermalized_rollout(
                em,
                th,
                x0,
                2,
                s_init=3,
                s_stop=1,
                noise_limit=None,
                generator=torch.Generator().manual_seed(0),
            )
        ),
        {"x0": _SNAP[:2]},
        None,
    )


def _tarflow():
    return gm.TarFlow(1, 4, 2, width=16, num_blocks=1, layers_per_block=1, head_dim=8, seed=0)


def _coupling_flow():
    return gm.CouplingFlow(1, 4, hidden=8, steps_per_level=1, levels=1, seed=0)


def _train_flow():
    model = _tarflow()
    return (
        lambda x_train: gm.train_flow(model, x_train, steps=2, batch_size=2, noise_std=0.1, seed=0),
        {"x_train": _IMG},
        model,
    )


_IMG = torch.randn(2, 1, 4, 4, generator=_g)
CONST_OK = "constant data is valid here: the result is finite"

SPECS = [
    HostileSpec(
        "Thermalizer.fit",
        setup=_fitted_thermalizer,
        arrays=("snapshots",),
        covers=("Thermalizer",),
        allow={"huge": "fit normalises by the data's mean/std, so the scale is irrelevant"},
    ),
    HostileSpec(
        "Thermalizer.noise_level",
        setup=_noise_level,
        arrays=("x",),
        allow={"constant": CONST_OK, "huge": "a finite state gets a level (the classifier saturates)"},
        covers=("Thermalizer",),
    ),
    HostileSpec(
        "Thermalizer.denoise",
        setup=_denoise,
        arrays=("x",),
        allow={"constant": CONST_OK, "huge": "a finite state denoises to a finite state"},
        covers=("Thermalizer",),
    ),
    HostileSpec(
        "ResidualEmulator.fit",
        setup=_fitted_emulator,
        arrays=("trajectories",),
        allow={"huge": "fit normalises by the data's mean/std, so the scale is irrelevant"},
        covers=("ResidualEmulator",),
    ),
    HostileSpec(
        "thermalized_rollout",
        setup=_rollout,
        arrays=("x0",),
        allow={"constant": CONST_OK, "huge": "a huge state is rolled out and aborted when non-finite"},
    ),
    HostileSpec("cosine_beta_schedule", gm.cosine_beta_schedule, {"T": 10, "s": 0.008}, ("s",)),
    HostileSpec(
        "TarFlow.forward",
        lambda x: _tarflow()(x),
        {"x": _IMG},
        ("x",),
        allow={"constant": CONST_OK, "empty:0": "an empty batch maps to empty latents"},
        known={"huge": "1e30-scaled images overflow the flow to Inf (a warning is given; no error yet)"},
        covers=("TarFlow",),
    ),
    HostileSpec(
        "tarflow_loss",
        lambda x: gm.tarflow_loss(_tarflow(), x),
        {"x": _IMG},
        ("x",),
        allow={"constant": CONST_OK},
        known={"huge": "1e30-scaled images overflow the flow to Inf (a warning is given; no error yet)"},
    ),
    HostileSpec(
        "CouplingFlow.log_prob",
        lambda x: _coupling_flow().log_prob(x),
        {"x": _IMG},
        ("x",),
        allow={"constant": CONST_OK, "empty:0": "an empty batch has an empty log-density"},
        known={"huge": "1e30-scaled images overflow the flow to Inf (no error yet), as for TarFlow"},
        covers=("CouplingFlow",),
    ),
    HostileSpec(
        "train_flow",
        setup=_train_flow,
        arrays=("x_train",),
        allow={"constant": "a constant training set is valid: the flow fits a narrow density"},
    ),
    HostileSpec(
        "energy_spectrum",
        gm.energy_spectrum,
        {"x": np.random.default_rng(0).normal(size=(4, 8))},
        ("x",),
        allow={"constant": CONST_OK, "extra_dim": "(..., T, n): a trailing n = 1 field is valid"},
    ),
    HostileSpec(
        "ks_simulate",
        gm.ks_simulate,
        {
            "n_traj": 1,
            "n_steps": 2,
            "N": 16,
            "spinup": 1,
            "substeps": 1,
            "dt": 0.05,
            "L": 22.0,
            "u0": np.random.default_rng(0).normal(size=(1, 16)),
        },
        ("u0", "dt", "L"),
        allow={"constant": CONST_OK},
    ),
    HostileSpec(
        "lorenz96_simulate",
        gm.lorenz96_simulate,
        {
            "n_traj": 1,
            "n_steps": 2,
            "K": 8,
            "spinup": 1,
            "substeps": 1,
            "dt": 0.01,
            "forcing": 8.0,
            "x0": np.random.default_rng(0).normal(size=(1, 8)),
        },
        ("x0", "forcing", "dt"),
        allow={"constant": CONST_OK},
    ),
    HostileSpec("KSETDRK4", gm.KSETDRK4, {"L": 22.0, "N": 16, "dt": 0.05}, ("L", "dt")),
    HostileSpec(
        "Thermalizer.level_accuracy",
        setup=_level_accuracy,
        arrays=("x",),
        allow={"constant": CONST_OK, "huge": "a finite state gets a level (the classifier saturates)"},
        covers=("Thermalizer",),
    ),
    HostileSpec(
        "stability_band",
        gm.stability_band,
        {"trajectories": _TRAJ},
        ("trajectories",),
        allow={
            "constant": "a constant non-zero field has a constant energy: a valid (narrow) band",
            "extra_dim": "(n_traj, n_steps, *event): a trailing axis of length 1 is a valid event axis",
        },
    ),
    HostileSpec(
        "stable_mask",
        gm.stable_mask,
        {"energy": np.abs(_TRAJ[0]) + 0.5, "band": (0.1, 10.0)},
        ("energy",),
        allow={**dict.fromkeys(("nan", "posinf", "neginf", "huge"), UNSTABLE), "constant": CONST_OK},
    ),
    HostileSpec("spectral_reference", gm.spectral_reference, {"trajectories": _TRAJ}, ("trajectories",)),
    HostileSpec(
        "spectrum_rmse",
        gm.spectrum_rmse,
        {"segments": _TRAJ, "log_ref": np.zeros(5), "modes": np.arange(1, 5)},
        ("segments", "log_ref"),
        allow={
            **{f"segments:{kind}": BLOWN_UP for kind in ("nan", "posinf", "neginf", "huge")},
            "segments:constant": kt.Allow("a constant segment has no power on the modes: inf", finite=False),
            "log_ref:constant": CONST_OK,
        },
    ),
    HostileSpec(
        "choose_levels", gm.choose_levels, {"scores": {(4, 1): (1.0, 0.3, 0.2), (6, 2): (1.0, 0.05, 0.4)}}, ()
    ),
    HostileSpec(
        "select_levels",
        setup=_select_levels,
        arrays=("ics",),
        allow={
            "constant": kt.Allow("constant states are rolled out (and thermalized) like any", finite=False),
            "huge": kt.Allow("huge states blow up: stable 0, spectrum RMSE inf (documented)", finite=False),
        },
    ),
]
# ---- P49 density guidance ----------------------------------------------------------------------------

_S = gm.VPSchedule()
_G = gm.GaussianMixture.power_law(4, 2, _S, seed=0)
_XT = torch.randn(3, 4, generator=_g, dtype=torch.float64)
_SCORE = _G.score
FINITE_OK = "a finite state (constant rows included) is a valid input: the answer is finite"
EVENT_OK = "(N, *event): a trailing event axis of length 1 is a valid event shape for a shape-agnostic map"
_LAP = _G.laplacian


def _dg_specs() -> list[HostileSpec]:
    steps = 3
    return [
        HostileSpec("VPSchedule", gm.VPSchedule, {"beta_min": 0.1, "beta_max": 20.0}, ("beta_min", "beta_max")),
        HostileSpec("EDMSchedule", gm.EDMSchedule, {"sigma_min": 0.002, "sigma_max": 80.0}, ("sigma_min", "sigma_max")),
        HostileSpec("time_grid", lambda n_steps: gm.time_grid(_S, n_steps), {"n_steps": 4}, ()),
        HostileSpec(
            "GaussianMixture",
            lambda means, variances, weights: gm.GaussianMixture(means, variances, weights, _S),
            {"means": _G.means, "variances": _G.variances, "weights": torch.ones(2, dtype=torch.float64)},
            ("means", "variances", "weights"),
            allow={"constant": "equal means, equal variances or equal weights are a valid mixture",
                   "weights:huge": "weights are normalised, so their scale is irrelevant"},
        ),
        HostileSpec("GaussianMixture.score", lambda x, t: _G.score(x, t), {"x": _XT, "t": 0.5}, ("x", "t"),
                    allow={"constant": FINITE_OK}, covers=("GaussianMixture",)),
        HostileSpec("GaussianMixture.log_prob", lambda x: _G.log_prob(x, 0.5), {"x": _XT}, ("x",),
                    allow={"constant": FINITE_OK}, covers=("GaussianMixture",)),
        HostileSpec("GaussianMixture.laplacian", lambda x: _G.laplacian(x, 0.5), {"x": _XT}, ("x",),
                    allow={"constant": FINITE_OK}, covers=("GaussianMixture",)),
        HostileSpec("eps_to_score", lambda x: gm.eps_to_score(lambda y, t: -_S.sigma(t) * _SCORE(y, t), _S)(x, 0.5),
                    {"x": _XT}, ("x",), allow={"constant": FINITE_OK}),
        HostileSpec("denoiser_to_score", lambda x: gm.denoiser_to_score(lambda y, t: 0.5 * y, _S)(x, 0.5),
                    {"x": _XT}, ("x",), allow={"constant": FINITE_OK, "extra_dim": EVENT_OK}),
        HostileSpec("exact_laplacian", lambda x, t: gm.exact_laplacian(_SCORE, x, t), {"x": _XT, "t": 0.5},
                    ("x", "t"), allow={"constant": FINITE_OK}),
        HostileSpec("hutchinson_laplacian", lambda x, t: gm.hutchinson_laplacian(_SCORE, x, t, seed=0),
                    {"x": _XT, "t": 0.5}, ("x", "t"), allow={"constant": FINITE_OK}),
        HostileSpec("pf_ode_drift", lambda x, t: gm.pf_ode_drift(_SCORE, x, t, _S), {"x": _XT, "t": 0.5}, ("x", "t"),
                    allow={"constant": FINITE_OK}),
        HostileSpec(
            "density_guided_drift",
            lambda x, t, q, noise_scale: gm.density_guided_drift(_SCORE, x, t, _S, q, noise_scale, laplacian=_LAP),
            {"x": _XT, "t": 0.5, "q": 0.6, "noise_scale": 0.3},
            ("x", "t", "q", "noise_scale"),
            allow={"constant": FINITE_OK},
            covers=("density_guided_drift", "DriftTerms"),
        ),
        HostileSpec(
            "log_density_rate",
            lambda score, laplacian, x, drift: gm.log_density_rate(score, laplacian, x, 0.5, _S, drift),
            {"score": _SCORE(_XT, 0.5), "laplacian": _LAP(_XT, 0.5), "x": _XT, "drift": _XT * 0.1},
            ("score", "laplacian", "x", "drift"),
            allow={"constant": FINITE_OK},
        ),
        HostileSpec("guidance_offset", lambda q, times: gm.guidance_offset(_S, q, 4, times),
                    {"q": 0.6, "times": np.array([1.0, 0.5, 0.1])}, ("q", "times")),
        HostileSpec("rescale_latents", lambda x_T, quantile: gm.rescale_latents(x_T, _S, quantile),
                    {"x_T": _XT, "quantile": 0.5}, ("x_T", "quantile"),
                    allow={"constant": FINITE_OK, "extra_dim": EVENT_OK}),
        HostileSpec("pf_ode_sample", lambda x_T: gm.pf_ode_sample(_SCORE, x_T, _S, steps, laplacian=_LAP).x,
                    {"x_T": _XT}, ("x_T",), allow={"constant": FINITE_OK}, covers=("pf_ode_sample", "SampleResult")),
        HostileSpec(
            "density_guidance_sample",
            lambda x_T, q: gm.density_guidance_sample(_SCORE, x_T, _S, q, steps, laplacian=_LAP).x,
            {"x_T": _XT, "q": 0.6}, ("x_T", "q"), allow={"constant": FINITE_OK},
        ),
        HostileSpec(
            "prior_guidance_sample",
            lambda x_T, q: gm.prior_guidance_sample(_SCORE, x_T, _S, q, steps).x,
            {"x_T": _XT, "q": 0.6}, ("x_T", "q"), allow={"constant": FINITE_OK},
        ),
        HostileSpec(
            "stochastic_density_guidance_sample",
            lambda x_T, q: gm.stochastic_density_guidance_sample(
                _SCORE, x_T, _S, q, lambda t: 0.3, steps, laplacian=_LAP, seed=0).x,
            {"x_T": _XT, "q": 0.6}, ("x_T", "q"), allow={"constant": FINITE_OK},
        ),
        HostileSpec("pf_ode_log_density", lambda x0: gm.pf_ode_log_density(_SCORE, x0, _S, steps, laplacian=_LAP),
                    {"x0": _XT * 0.3}, ("x0",), allow={"constant": FINITE_OK}),
        HostileSpec("score_alignment", lambda x_T: gm.score_alignment(_SCORE, x_T, _S, steps, laplacian=_LAP),
                    {"x_T": _XT}, ("x_T",), allow={"constant": FINITE_OK}),
        HostileSpec("ScoreMLP", lambda x: _score_mlp()(x, 0.5), {"x": _XT.float()}, ("x",),
                    allow={"constant": FINITE_OK}),
        HostileSpec("train_score_model", setup=_train_score, arrays=("data",)),
    ]  # fmt: skip


def _score_mlp() -> gm.ScoreMLP:
    return gm.ScoreMLP(4, _S, hidden=8, layers=1, seed=0)


def _train_score():
    model = _score_mlp()
    return (
        lambda data: gm.train_score_model(model, data, steps=2, batch_size=4, seed=0),
        {"data": torch.randn(8, 4, generator=torch.Generator().manual_seed(0))},
        model,
    )


SPECS += _dg_specs()


# ---- P06 K2VAE forecasting ---------------------------------------------------------------------------

_K2 = {"patch_len": 8, "latent_dim": 4, "hidden_dim": 8, "hidden_layers": 1, "d_model": 4, "n_heads": 2}
_CTX = torch.randn(2, 16, 2, generator=_g)
_Y6 = torch.randn(2, 6, 2, generator=_g)
_SER = torch.randn(40, 2, generator=_g)
_SAMP = torch.randn(5, 2, 3, generator=_g, dtype=torch.float64)
_TGT = torch.randn(2, 3, generator=_g, dtype=torch.float64)
K2_CONST = "a constant context channel is valid: RevIN divides by eps (a RuntimeWarning says so): finite"
METRIC_OK = "constant or huge samples/targets are valid: the metric is finite (float64)"
INIT_RNG = "nn.Module construction initialises parameters from torch's global generator (PyTorch convention)"


def _k2(**kw) -> gm.K2VAE:
    return gm.K2VAE(2, 16, 6, seed=0, **_K2, **kw).eval()


class _FittedView(torch.nn.Module):
    """The live fitted state of a forecaster holding a network (its ``state_dict`` plus fitted tensors), so
    ``state_of`` can compare it exactly (``vars`` of an object holding an ``nn.Module`` compares by identity)."""

    def __init__(self, est: object, net: str, extra: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.__dict__.update(_est=est, _net=net, _extra=extra)

    def state_dict(self, *args, **kwargs) -> dict:  # type: ignore[override]
        if not hasattr(self._est, self._net):
            return {}
        out = dict(getattr(self._est, self._net).state_dict())
        out.update({k: getattr(self._est, k) for k in self._extra})
        return out


def _k2_forecaster():
    fc = gm.K2VAEForecaster(16, 6, steps=2, batch_size=4, seed=0, **_K2)
    return fc.fit, {"series": _SER}, _FittedView(fc, "model_", ("mean_", "scale_"))


def _k2_predict():
    fc = gm.K2VAEForecaster(16, 6, steps=2, batch_size=4, seed=0, **_K2).fit(_SER)
    return (lambda context: fc.predict(context, num_samples=4)), {"context": _CTX}, _FittedView(fc, "model_")


def _naive_fit():
    sn = gm.SeasonalNaive(4)
    return sn.fit, {"series": _SER}, sn


def _gru_fit():
    gru = gm.GRUForecaster(2, hidden=4, window=8, steps=2, batch_size=4, seed=0)
    return gru.fit, {"series": _SER}, _FittedView(gru, "net_")


def _gru_sample():
    gru = gm.GRUForecaster(2, hidden=4, window=8, steps=2, batch_size=4, seed=0).fit(_SER)
    return (lambda x: gru.sample(x, 3, num_samples=4, seed=0)), {"x": _CTX}, _FittedView(gru, "net_")


def _k2vae_specs() -> list[HostileSpec]:
    return [
        HostileSpec("K2VAE.sample", lambda x: _k2().sample(x, 4, seed=0), {"x": _CTX}, ("x",),
                    allow={"constant": K2_CONST}, covers=("K2VAE",)),
        HostileSpec("K2VAE.loss", lambda x, y: _k2().loss(x, y, generator=torch.Generator().manual_seed(0))["total"],
                    {"x": _CTX, "y": _Y6}, ("x", "y"), allow={"constant": K2_CONST}, covers=("K2VAE",)),
        HostileSpec("K2VAEForecaster.fit", setup=_k2_forecaster, arrays=("series",), covers=("K2VAEForecaster",)),
        HostileSpec("K2VAEForecaster.predict", setup=_k2_predict, arrays=("context",),
                    allow={"constant": K2_CONST}, covers=("K2VAEForecaster",)),
        HostileSpec("KoopmanOperator", lambda Z: gm.KoopmanOperator(3, "both")(Z, 5)[1],
                    {"Z": torch.randn(2, 4, 3, generator=_g)}, ("Z",), global_rng=INIT_RNG,
                    allow={"constant": "constant latents are valid: K falls back to finite values",
                           "huge": "huge latents are valid: the min-norm least squares stays finite"}),
        HostileSpec("DifferentiableKalmanFilter", lambda x0, measurements: gm.DifferentiableKalmanFilter(3)(x0, measurements)[0],
                    {"x0": torch.randn(2, 3, generator=_g), "measurements": torch.randn(2, 4, 3, generator=_g)},
                    ("x0", "measurements"), allow={"constant": "constant states/measurements are valid",
                                                   "huge": "the filter is linear: huge inputs give finite states"}),
        HostileSpec("SeasonalNaive.fit", setup=_naive_fit, arrays=("series",), covers=("SeasonalNaive",),
                    allow={"constant": "a constant series has zero residual std, floored at 1e-8: finite"}),
        HostileSpec("SeasonalNaive.sample", lambda x: gm.SeasonalNaive(4).fit(_SER).sample(x, 5, 3, seed=0),
                    {"x": _CTX}, ("x",), allow={"constant": CONST_OK}, covers=("SeasonalNaive",)),
        HostileSpec("GRUForecaster.fit", setup=_gru_fit, arrays=("series",), covers=("GRUForecaster",),
                    allow={"constant": "a constant series is valid training data: finite"}),
        HostileSpec("GRUForecaster.sample", setup=_gru_sample, arrays=("x",), covers=("GRUForecaster",),
                    allow={"constant": CONST_OK}),
        HostileSpec("climatology_samples", lambda x: gm.climatology_samples(x, 3, 4, seed=0), {"x": _CTX}, ("x",),
                    allow={"constant": "a constant context gives a point mass: finite"}),
        HostileSpec("crps_from_samples", gm.crps_from_samples, {"samples": _SAMP, "y": _TGT}, ("samples", "y"),
                    allow={"constant": METRIC_OK, "huge": METRIC_OK}),
        HostileSpec("gaussian_crps", gm.gaussian_crps, {"mean": _TGT, "std": _TGT.abs() + 0.5, "y": _TGT},
                    ("mean", "std", "y"), allow={"constant": METRIC_OK, "huge": METRIC_OK}),
        HostileSpec("weighted_quantile_loss", gm.weighted_quantile_loss, {"samples": _SAMP, "y": _TGT},
                    ("samples", "y"), allow={"constant": METRIC_OK, "huge": METRIC_OK}),
        HostileSpec("nmae", gm.nmae, {"samples": _SAMP, "y": _TGT}, ("samples", "y"),
                    allow={"constant": METRIC_OK, "huge": METRIC_OK}),
        HostileSpec("interval_coverage", gm.interval_coverage, {"samples": _SAMP, "y": _TGT}, ("samples", "y"),
                    allow={"constant": METRIC_OK, "huge": METRIC_OK}),
    ]  # fmt: skip


SPECS += _k2vae_specs()


# ---- P20 MCMC extrapolation --------------------------------------------------------------------------

_TOY = gm.SequenceDesignToy(6, 4, n_motifs=2, seed=0)
_SEQ = _TOY.sample(3, seed=0)
_SUB = gm.SubstitutionProposal(4, (1, 2))
TOKENS_OK = "constant token sequences are valid sequences"
ONE_SEQ = "(L,) is one sequence (n = 1): a documented valid form"


def _uniform_mlm(X: np.ndarray) -> np.ndarray:
    return np.zeros((*X.shape, 5))


def _p20_fitted() -> gm.ExtrapolatorLM:
    pairs = [(s.tolist(), np.sort(s).tolist()) for s in _SEQ]
    return gm.ExtrapolatorLM(4, 6, n_layer=1, n_embd=8, n_head=2, seed=0).fit(pairs, epochs=1)


def _p20_fit():
    model = gm.ExtrapolatorLM(4, 6, n_layer=1, n_embd=8, n_head=2, seed=0)
    return (lambda src: model.fit(list(zip(src, src)), epochs=1)), {"src": _SEQ}, model.model


def _p20_transform():
    model = _p20_fitted()
    return (
        (lambda x: model.transform(x, 2, guide=lambda X: X.sum(1) * 1.0).sequences),
        {"x": _SEQ},
        model.model,
    )


def _p20_specs() -> list[HostileSpec]:
    chain = [(s.tolist(), float(i)) for i, s in enumerate(_SEQ)]
    return [
        HostileSpec(
            "SequenceDesignToy",
            lambda bonus: gm.SequenceDesignToy(6, 4, bonus=bonus),
            {"bonus": 1.5},
            ("bonus",),
        ),
        HostileSpec(
            "SequenceDesignToy.oracle",
            lambda X: _TOY.oracle(X),
            {"X": _SEQ},
            ("X",),
            allow={"constant": TOKENS_OK},
            covers=("SequenceDesignToy",),
        ),
        HostileSpec(
            "SubstitutionProposal.propose",
            lambda X: _SUB.propose(X, np.random.default_rng(0))[0],
            {"X": _SEQ},
            ("X",),
            allow={"constant": TOKENS_OK, "missing_dim": ONE_SEQ},
            covers=("SubstitutionProposal",),
        ),
        HostileSpec(
            "MaskInfillProposal",
            lambda X, mask_frac: gm.MaskInfillProposal(_uniform_mlm, 4, mask_frac=mask_frac).propose(
                X, np.random.default_rng(0)
            )[0],
            {"X": _SEQ, "mask_frac": 0.3},
            ("X", "mask_frac"),
            allow={"X:constant": TOKENS_OK, "X:missing_dim": ONE_SEQ},
        ),
        HostileSpec(
            "metropolis_hastings",
            lambda x0: gm.metropolis_hastings(x0, lambda X: 0.1 * X.sum(1), _SUB, 3, seed=0)[0].states,
            {"x0": _SEQ},
            ("x0",),
            allow={"constant": TOKENS_OK, "missing_dim": ONE_SEQ},
            covers=("metropolis_hastings", "Chain"),
        ),
        HostileSpec(
            "energy_target",
            lambda x0, beta: gm.energy_target(lambda Y: Y.sum(1) * 1.0, x0, beta=beta)(x0),
            {"x0": _SEQ, "beta": 1.0},
            ("x0", "beta"),
            allow={"x0:constant": TOKENS_OK, "x0:missing_dim": ONE_SEQ},
        ),
        HostileSpec(
            "as_guide",
            lambda X: gm.as_guide(lambda Y: Y.sum(1) * 1.0)(X),
            {"X": _SEQ},
            ("X",),
            allow={"constant": TOKENS_OK, "missing_dim": ONE_SEQ},
        ),
        HostileSpec(
            "select_episode", lambda delta: gm.select_episode(chain, delta=delta), {"delta": 0.5}, ("delta",)
        ),
        HostileSpec(
            "build_pairs",
            lambda episode: gm.build_pairs([episode]),
            {"episode": _SEQ},
            ("episode",),
            allow={"constant": TOKENS_OK},
            kinds=("empty", "dtype", "extra_dim", "constant"),
        ),
        HostileSpec(
            "ExtrapolatorLM.fit",
            setup=_p20_fit,
            arrays=("src",),
            allow={"constant": TOKENS_OK},
            covers=("ExtrapolatorLM",),
        ),
        HostileSpec(
            "ExtrapolatorLM.transform",
            setup=_p20_transform,
            arrays=("x",),
            allow={"constant": TOKENS_OK},
            covers=("ExtrapolatorLM", "TransformResult"),
        ),
    ]


SPECS += _p20_specs()


def _p29_specs() -> list[HostileSpec]:
    """P29 GraphGPT: graphs in (networkx: no array variants; §8's bad graphs have their own tests in
    test_graphgpt.py), token-id tensors and scalars corrupted here."""
    import networkx as nx

    cfg = gm.SerializeConfig(node_scope=16)
    tok = gm.GraphTokenizer(cfg)
    gs = [nx.cycle_graph(4), nx.path_graph(5)]
    ids, _ = tok.batch(gs, seed=0)
    ids_ok = "constant token ids are a valid (if degenerate) sequence"

    def model(causal: bool = False) -> gm.GraphGPTModel:
        return gm.GraphGPTModel(len(tok), 16, 1, 2, causal=causal, seed=0)

    def _fitted():
        clf = gm.GraphGPTClassifier(cfg, hidden=16, layers=1, heads=2, epochs=1, lr=1e-3)
        clf.fit(gs, [0, 1])
        return (lambda y: clf.fit(gs, y).classes_), {"y": np.array([0, 1])}, clf.model_

    return [
        HostileSpec("SerializeConfig", gm.SerializeConfig, {"node_scope": 16}, ("node_scope",)),
        HostileSpec("graph_to_sequence", lambda: gm.graph_to_sequence(gs[0], cfg, seed=0), {}, ()),
        HostileSpec(
            "sequence_to_graph",
            lambda: gm.sequence_to_graph(gm.graph_to_sequence(gs[1], cfg, seed=0), cfg).number_of_edges(),
            {},
            (),
        ),
        HostileSpec(
            "ego_subgraph",
            lambda radius: gm.ego_subgraph(gs[1], 2, radius=radius).number_of_nodes(),
            {"radius": 1},
            ("radius",),
        ),
        HostileSpec(
            "GraphTokenizer",
            lambda ids: tok.decode(ids).number_of_nodes(),
            {"ids": ids[0]},
            ("ids",),
            kinds=("empty", "dtype", "extra_dim"),
        ),
        HostileSpec(
            "smtp_mask",
            lambda ids, power: gm.smtp_mask(ids, tok.mask_id, power=power, seed=0),
            {"ids": ids, "power": 1.0},
            ("ids", "power"),
            allow={"ids:constant": ids_ok},
        ),
        HostileSpec(
            "GraphGPTModel",
            lambda ids: model()(ids, torch.ones_like(ids, dtype=torch.bool)),
            {"ids": ids},
            ("ids",),
            allow={"constant": ids_ok},
        ),
        HostileSpec(
            "smtp_loss",
            lambda ids: gm.smtp_loss(
                model(), ids, torch.ones_like(ids, dtype=torch.bool), tok.mask_id, seed=0
            ),
            {"ids": ids},
            ("ids",),
            allow={"constant": ids_ok},
            global_rng="none: the generator is seeded",
        ),
        HostileSpec(
            "ntp_loss",
            lambda ids: gm.ntp_loss(model(True), ids, torch.ones_like(ids, dtype=torch.bool)),
            {"ids": ids},
            ("ids",),
            allow={"constant": ids_ok},
            kinds=("empty", "dtype", "extra_dim", "missing_dim", "constant"),
        ),
        HostileSpec(
            "pretrain",
            lambda lr: gm.pretrain(model(), tok, gs, 2, batch_size=2, lr=lr, seed=0),
            {"lr": 1e-3},
            ("lr",),
        ),
        HostileSpec(
            "GraphGPTClassifier.fit",
            setup=_fitted,
            arrays=("y",),
            allow={"dtype": "labels may be any hashable values: string classes are valid"},
            covers=("GraphGPTClassifier",),
        ),
    ]


SPECS += _p29_specs()


def _p26_specs() -> list[HostileSpec]:
    """P26 ToMA: tiling, selection, merge plans, the ToMeSD baseline and the diffusers patch."""
    from icml25.kernels.testing import Allow

    g = torch.Generator().manual_seed(26)
    x = torch.randn(2, 16, 4, generator=g)
    tiles = torch.randn(2, 4, 4, 4, generator=g)
    idx = torch.tensor([[0, 3], [5, 1]])
    prop = Allow("documented: merging/tiling is linear and propagates NaN/Inf (no host sync)", False)
    CONST, EMPTY = CONST_OK, "an empty batch gives an empty (exact) result"
    linear = {"nan": prop, "posinf": prop, "neginf": prop, "constant": CONST, "huge": CONST}
    ok = {
        "constant": "constant tokens are valid: every cosine is 1 and the lowest indices win the ties",
        "huge": "cosine similarity is scale-invariant; the merge is linear (finite, scaled result)",
    }

    def _plan_merge():
        plan = gm.toma_fns(x, ratio=0.5, num_tiles=4)
        return plan.merge, {"x": x}, None

    def _plan_unmerge():
        plan = gm.toma_fns(x, ratio=0.5, num_tiles=4)
        return plan.unmerge, {"y": torch.randn(2, 8, 3, generator=g)}, None

    def _patch():
        pytest.importorskip("diffusers")
        from diffusers.models.attention import BasicTransformerBlock

        from icml25.kernels.rng import isolated_rng

        with isolated_rng(0):
            block = BasicTransformerBlock(8, 2, 4)

        def fn(ratio, num_tiles, attention_scale, recompute_every):
            return gm.apply_toma(block, ratio, num_tiles, attention_scale, recompute_every)

        return fn, {"ratio": 0.5, "num_tiles": 4, "attention_scale": 1000.0, "recompute_every": 3}, None

    def _unpatch():
        pytest.importorskip("diffusers")
        from diffusers.models.attention import BasicTransformerBlock

        from icml25.kernels.rng import isolated_rng

        with isolated_rng(0):
            block = BasicTransformerBlock(8, 2, 4)
        gm.apply_toma(block)
        return (lambda model_or_pipe: gm.remove_toma(model_or_pipe) and None), {"model_or_pipe": block}, None

    return [
        HostileSpec(
            "tile_tokens",
            gm.tile_tokens,
            {"x": x, "hw": (4, 4), "num_tiles": 4},
            ("x", "num_tiles"),
            {
                "nan": prop,
                "posinf": prop,
                "neginf": prop,
                "constant": CONST,
                "huge": CONST,
                "x:empty:0": EMPTY,
            },
        ),
        HostileSpec(
            "untile_tokens",
            gm.untile_tokens,
            {"x_tiles": tiles, "perm": gm.tile_tokens(x, None, 4)[1]},
            ("x_tiles", "perm"),
            {
                "nan": prop,
                "posinf": prop,
                "neginf": prop,
                "x_tiles:constant": CONST,
                "huge": CONST,
                "x_tiles:dtype": "integer tokens untile like any other (a permutation)",
                "x_tiles:empty:0": EMPTY,
                "x_tiles:empty:3": EMPTY,
            },
        ),
        HostileSpec(
            "facility_location_select",
            gm.facility_location_select,
            {"x": x, "k": 3},
            ("x", "k"),
            {**ok, "x:empty:0": EMPTY},
        ),
        HostileSpec(
            "toma_merge_matrices",
            gm.toma_merge_matrices,
            {"x": x, "dst_idx": idx, "scale": 10.0},
            ("x", "dst_idx", "scale"),
            {
                **ok,
                "x:empty:0": EMPTY,
                "dst_idx:constant": "a repeated destination is valid (shared members)",
            },
        ),
        HostileSpec(
            "toma_fns",
            lambda x, ratio, num_tiles, scale: (
                gm.toma_fns(x, ratio=ratio, num_tiles=num_tiles, scale=scale).A
            ),
            {"x": x, "ratio": 0.5, "num_tiles": 4, "scale": 1000.0},
            ("x", "ratio", "num_tiles", "scale"),
            {**ok, "x:empty:0": EMPTY},
            covers=("toma_fns",),
        ),
        HostileSpec("ToMAPlan.merge", setup=_plan_merge, arrays=("x",), allow=linear, covers=("ToMAPlan",)),
        HostileSpec(
            "ToMAPlan.unmerge", setup=_plan_unmerge, arrays=("y",), allow=linear, covers=("ToMAPlan",)
        ),
        HostileSpec(
            "tomesd_fns",
            lambda x, ratio: gm.tomesd_fns(x, ratio=ratio, seed=0)[0](x),
            {"x": x, "ratio": 0.5},
            ("x", "ratio"),
            {"x:constant": ok["constant"], "x:huge": ok["huge"], "x:empty:0": EMPTY},
            covers=("tomesd_fns",),
        ),
        HostileSpec(
            "ToMAState", gm.ToMAState, {"recompute_every": 3, "merge_steps": [0, 1]}, ("recompute_every",)
        ),
        HostileSpec(
            "apply_toma", setup=_patch, arrays=("ratio", "num_tiles", "attention_scale", "recompute_every")
        ),
        HostileSpec("remove_toma", setup=_unpatch, arrays=()),
    ]


SPECS += _p26_specs()


def _p21_specs() -> list[HostileSpec]:
    """P21 AsymRnR: split, matching, reduce/restore, asymmetric attention, schedule, calibration, cache."""
    from icml25.kernels.testing import Allow

    g = torch.Generator().manual_seed(21)

    def _g0():
        return torch.Generator().manual_seed(0)

    grid = (2, 4, 4)
    x = torch.randn(2, 32, 3, generator=g)
    split = gm.spatiotemporal_split(grid, (2, 2, 2), generator=torch.Generator().manual_seed(0))
    match = gm.match_tokens(x, split)
    prop = Allow("documented: reduce/restore are gathers and propagate NaN/Inf (no host sync)", False)
    gather = {"nan": prop, "posinf": prop, "neginf": prop, "constant": CONST_OK, "huge": CONST_OK}
    ties = "constant tokens are valid: every distance ties and the lowest destination index wins"
    qkv = {n: torch.randn(1, 2, 37, 4, generator=g) for n in "qkv"}

    def _reduce():
        return (lambda x, ratio: gm.reduce_tokens(x, split, match, ratio)[0]), {"x": x, "ratio": 0.5}, None

    def _restore():
        xr, info = gm.reduce_tokens(x, split, match, 0.5)
        return (lambda y: gm.restore_tokens(y, info)), {"y": xr}, None

    def _rnr():
        return (
            (lambda x, ratio: gm.rnr_apply(x, torch.tanh, split, match, ratio)),
            {"x": x, "ratio": 0.5},
            None,
        )

    def _recorder():
        rec = gm.RedundancyRecorder(1, 1, (2, 2, 2))
        return (lambda x: rec.record("v", 0, 0, x, grid)), {"x": x}, None

    def _cache():
        def fn(x):
            return gm.MatchCache(2, generator=_g0()).get("b0", 0, x, grid, (2, 2, 2))[1].similarity

        return fn, {"x": x}, None

    tiers = {"q": torch.tensor([[3, 7]]), "v": torch.tensor([[9, 1]])}

    def _calibrate():
        def fn(x):
            return gm.calibrate_redundancy(
                lambda rec: rec.record("q", 0, 0, x, grid), 1, 1, {"q": {5: 0.5}}
            ).tiers

        return fn, {"x": x}, None

    return [
        HostileSpec("spatiotemporal_split",
                    lambda grid, stride: gm.spatiotemporal_split(grid, stride, generator=_g0()).dst_idx,
                    {"grid": grid, "stride": (2, 2, 2)}, ()),
        HostileSpec("match_tokens", lambda x: gm.match_tokens(x, split).similarity, {"x": x}, ("x",),
                    {"constant": ties, "x:empty:0": "an empty batch gives an empty matching"}, covers=("match_tokens",)),
        HostileSpec("reduce_tokens", setup=_reduce, arrays=("x", "ratio"),
                    allow={**gather, "x:empty:0": "an empty batch reduces to an empty batch"}),
        HostileSpec("restore_tokens", setup=_restore, arrays=("y",),
                    allow={**gather, "y:empty:0": "an empty batch restores to an empty batch",
                           "y:empty:2": "features are carried along: C = 0 restores to C = 0",
                           "y:dtype": "integer outputs restore like any other (a gather)"}),
        HostileSpec("rnr_apply", setup=_rnr, arrays=("x", "ratio"),
                    allow={**gather, "x:empty:0": "an empty batch reduces to an empty batch"}),
        HostileSpec("asymrnr_attention",
                    lambda q, k, v, ratio_q, ratio_kv: gm.asymrnr_attention(
                        q, k, v, grid, text_len=5, ratio_q=ratio_q, ratio_kv=ratio_kv,
                        generator=torch.Generator().manual_seed(0)),
                    {**qkv, "ratio_q": 0.5, "ratio_kv": 0.3}, ("q", "k", "v", "ratio_q", "ratio_kv"),
                    {"constant": ties, "empty:0": "an empty batch attends to nothing: empty result",
                     "empty:1": "no heads: an empty result"}, covers=("asymrnr_attention",)),
        HostileSpec("reduced_length", gm.reduced_length, {"n": 32, "n_dst": 4, "ratio": 0.5}, ()),
        HostileSpec("tiers_from_statistic", gm.tiers_from_statistic, {"stat": torch.randn(3, 4, generator=g)},
                    ("stat",), {"stat:constant": "constant statistics get distinct decile ranks by index order",
                                "stat:huge": "only the ranks matter",
                                "stat:empty:0": "no entries: an empty tier table",
                                "stat:empty:1": "no entries: an empty tier table",
                                "stat:dtype": "integer statistics rank like any other",
                                "stat:extra_dim": "any shape is ranked as a whole",
                                "stat:missing_dim": "any shape is ranked as a whole",
                                "stat:nan": Allow("documented: NaN sorts last (tier 9); record() never produces it"),
                                "stat:posinf": "+Inf ranks highest",
                                "stat:neginf": "-Inf ranks lowest"}),
        HostileSpec("RnRSchedule", lambda tiers: gm.RnRSchedule(tiers, {"q": {5: 0.4}}).ratios(0, 1),
                    {"tiers": tiers}, (), covers=("RnRSchedule",)),
        HostileSpec("RedundancyRecorder.record", setup=_recorder, arrays=("x",),
                    allow={"constant": "constant tokens: zero distances, statistic 1 - 0 / norm (all redundant)"},
                    covers=("RedundancyRecorder",)),
        HostileSpec("calibrate_redundancy", setup=_calibrate, arrays=("x",),
                    allow={"constant": "constant tokens: zero distances, statistic 1 - 0 / norm"}),
        HostileSpec("MatchCache.get", setup=_cache, arrays=("x",),
                    allow={"constant": ties, "x:empty:0": "an empty batch gives an empty matching"},
                    covers=("MatchCache",)),
    ]  # fmt: skip


SPECS += _p21_specs()


# ---- P30 first-order bilevel diffusion ----------------------------------------------------------------

_P30_MU = torch.tensor([[-1.0, 0.0], [1.0, 0.5]], dtype=torch.float64)
_P30_VAR = torch.tensor([[0.3, 0.2], [0.2, 0.4]], dtype=torch.float64)
_P30_G = gm.GaussianMixture(_P30_MU, _P30_VAR, torch.ones(2, dtype=torch.float64), gm.VPSchedule())
_P30_A = torch.tensor([1.0, 0.3], dtype=torch.float64)
_P30_R2 = gm.QuadraticReward(_P30_A)
_P30_R1 = gm.QuadraticReward.neg_sq_distance(_P30_A)
_P30_X = torch.randn(6, 2, generator=_g, dtype=torch.float64)
P30_FINITE = "a finite input gives a finite, documented answer (constant rows are valid samples)"


def _p30_tuner():
    t = gm.EntropyStrengthTuner(gm.ExactTiltSampler(_P30_G), _P30_R2, _P30_R1, gamma=10.0, n_samples=8)
    return (lambda lam, gamma: t.hypergradient(lam, gamma)["grad"]), {"lam": 1.0, "gamma": 10.0}, None


def _p30_tuner_is():
    return (
        lambda pre_samples, lam0: gm.EntropyStrengthTuner(
            gm.ExactTiltSampler(_P30_G),
            _P30_R2,
            _P30_R1,
            lam0=lam0,
            kl_estimator="is",
            pre_samples=pre_samples,
        ).hypergradient(1.0)["grad"],
        {"pre_samples": _P30_X, "lam0": 2.0},
        None,
    )


class _P30Eps(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x, t):
        return self.lin(torch.cat([x, t.to(x.dtype)[:, None] / 10], 1))


def _p30_schedule_bilevel():
    return (
        lambda data, gamma, delta: gm.NoiseScheduleBilevel(
            _P30Eps, gm.LearnableCosineSchedule(10), lambda m, s: 0.5, data, gamma=gamma, delta=delta,
            batch_size=4, seed=0,
        ).hypergradient(),
        {"data": _P30_X, "gamma": 1.0, "delta": 0.01},
        None,
    )  # fmt: skip


def _p30_specs() -> list[HostileSpec]:
    ab = torch.linspace(0.99, 0.05, 10, dtype=torch.float64)
    lin = torch.nn.Linear(2, 2).double()
    return [
        HostileSpec("QuadraticReward", lambda b, q, c0, x: gm.QuadraticReward(b, q, c0)(x),
                    {"b": _P30_A, "q": 0.5, "c0": 0.1, "x": _P30_X}, ("b", "q", "c0", "x"),
                    allow={"constant": P30_FINITE}),
        HostileSpec("gibbs_tilt", lambda lam: gm.gibbs_tilt(_P30_G, _P30_R2 + _P30_R1, lam).log_partition,
                    {"lam": 0.7}, ("lam",), covers=("gibbs_tilt", "GibbsTilt")),
        HostileSpec("tilt_kl", lambda lam: gm.tilt_kl(_P30_G, _P30_R2, lam), {"lam": 0.7}, ("lam",)),
        HostileSpec("upper_objective", lambda lam: gm.upper_objective(_P30_G, _P30_R2, _P30_R1, lam),
                    {"lam": 0.7}, ("lam",)),
        HostileSpec("gibbs_tilt_kl_is", gm.gibbs_tilt_kl_is, {"scores": _P30_X[:, 0].clone(), "lam": 0.7},
                    ("scores", "lam"), allow={"constant": "equal scores: the tilt is p_pre itself, KL 0"}),
        HostileSpec("girsanov_kl", lambda guidance_drifts, g2, dt: gm.girsanov_kl([guidance_drifts] * 2, g2, dt),
                    {"guidance_drifts": _P30_X, "g2": torch.tensor([1.0, 2.0], dtype=torch.float64),
                     "dt": torch.tensor([0.1, 0.1], dtype=torch.float64)}, ("guidance_drifts", "g2", "dt"),
                    allow={"constant": P30_FINITE,
                           "guidance_drifts:extra_dim": "(N, *event): a trailing event axis is valid"}),
        HostileSpec("ExactTiltSampler", lambda lam, n: gm.ExactTiltSampler(_P30_G)(_P30_R2, lam, n, 0).kl,
                    {"lam": 0.7, "n": 8}, ("lam",), covers=("ExactTiltSampler", "TiltDraw")),
        HostileSpec("GuidedSDESampler", lambda lam: gm.GuidedSDESampler(
                        _P30_G.score, gm.VPSchedule(), 2, 4, "exact", _P30_G)(_P30_R2, lam, 8, 0).kl,
                    {"lam": 0.7}, ("lam",)),
        HostileSpec("EntropyStrengthTuner", setup=_p30_tuner, arrays=("lam", "gamma")),
        HostileSpec("EntropyStrengthTuner(is)", setup=_p30_tuner_is, arrays=("pre_samples", "lam0"),
                    allow={"constant": "identical pre-trained samples are valid: every tilt is then p_pre"},
                    covers=("EntropyStrengthTuner",)),
        HostileSpec("LearnableCosineSchedule", lambda start, end, tau, eps: gm.LearnableCosineSchedule(
                        10, start, end, tau, eps).betas().detach(),
                    {"start": 0.0, "end": 1.0, "tau": 1.0, "eps": 0.008}, ("start", "end", "tau", "eps")),
        HostileSpec("zo_gradient", lambda psi, delta: gm.zo_gradient(lambda v: float((v * v).sum()), psi, delta, seed=0),
                    {"psi": _P30_X[0].clone(), "delta": 0.01}, ("psi", "delta"),
                    allow={"constant": P30_FINITE}),
        HostileSpec("ddim_sample", lambda x_T, alphas_cumprod: gm.ddim_sample(
                        lambda x, t: lin(x), alphas_cumprod, x_T, 3),
                    {"x_T": _P30_X, "alphas_cumprod": ab}, ("x_T", "alphas_cumprod"),
                    allow={"constant": P30_FINITE + "; a constant alpha_bar is a degenerate but valid table"}),
        HostileSpec("sliced_wasserstein", lambda x, y: gm.sliced_wasserstein(x, y, 8),
                    {"x": _P30_X, "y": _P30_X + 1.0}, ("x", "y"), allow={"constant": P30_FINITE}),
        HostileSpec("NoiseScheduleBilevel", setup=_p30_schedule_bilevel, arrays=("data", "gamma", "delta"),
                    global_rng="constructing the nn.Module of make_model runs under isolated_rng; none left"),
        HostileSpec("RewardGuidedDenoiser", lambda sample, lam: gm.RewardGuidedDenoiser(
                        lambda x, t: 0.5 * x, ab, reward=lambda x: _P30_R2(x.reshape(len(x), -1)), lam=lam)(sample, 3),
                    {"sample": _P30_X, "lam": 0.7}, ("sample", "lam"),
                    allow={"constant": P30_FINITE, "extra_dim": "(N, *event): a trailing event axis is valid"}),
    ]  # fmt: skip


SPECS += _p30_specs()


# ---- P37 variational consistency training --------------------------------------------------------------

_P37_X = torch.randn(6, 2, generator=_g)
P37_CONST = "a constant batch is valid data (all points equal)"
with isolated_rng(0):
    _P37_ENC = gm.NoiseEncoder.mlp(2, 8, 1)


def _p37_model() -> gm.ConsistencyModel:
    with isolated_rng(0):
        return gm.ConsistencyModel(gm.ToyMLP(2, 8, 1))


def _p37_trainer(coupling: str = "vae") -> gm.ImprovedConsistencyTraining:
    with isolated_rng(0):
        enc = gm.NoiseEncoder.mlp(2, 8, 1) if coupling == "vae" else None
    return gm.ImprovedConsistencyTraining(_p37_model(), 4, coupling, enc, kl_scale=30.0)


def _p37_fit():
    tr = _p37_trainer()
    return (
        lambda data: tr.fit(data, batch_size=4, lr=1e-3, ema_decay=0.5, seed=0),
        {"data": _P37_X},
        lambda: [p.detach().clone() for p in tr.parameters()],
    )


def _p37_specs() -> list[HostileSpec]:
    return [
        HostileSpec("VEKernel", lambda x, eps: gm.VEKernel()(x, 1.0, eps), {"x": _P37_X, "eps": _P37_X + 1},
                    ("x", "eps"), allow={"constant": P37_CONST, "extra_dim": "(N, *event): an event axis is valid",
                                         "missing_dim": "x and eps lose the axis together? no: shapes differ"}),
        HostileSpec("LinearKernel", lambda x, eps: gm.LinearKernel()(x, 1.0, eps), {"x": _P37_X, "eps": _P37_X + 1},
                    ("x", "eps"), allow={"constant": P37_CONST, "extra_dim": "(N, *event): an event axis is valid"}),
        HostileSpec("ConsistencyModel", lambda x_t, t: _p37_model().denoise(x_t, t).detach(),
                    {"x_t": _P37_X, "t": 1.0}, ("x_t", "t"), allow={"constant": P37_CONST}, covers=("ConsistencyModel", "ToyMLP")),
        HostileSpec("NoiseEncoder", lambda x: _P37_ENC(x)[0].detach(), {"x": _P37_X}, ("x",),
                    allow={"constant": P37_CONST}),
        HostileSpec("ImprovedConsistencyTraining", lambda x, step: _p37_trainer().loss(x, step, generator=torch.Generator().manual_seed(0))[0].detach(),
                    {"x": _P37_X, "step": 1}, ("x", "step"), allow={"constant": P37_CONST}),
        HostileSpec("ImprovedConsistencyTraining.fit", setup=_p37_fit, arrays=("data",), allow={"constant": P37_CONST},
                    covers=("ImprovedConsistencyTraining",)),
        HostileSpec("consistency_sample", lambda steps, mid_t: gm.consistency_sample(_p37_model(), (4, 2), steps, (mid_t,),
                    generator=torch.Generator().manual_seed(0)), {"steps": 2, "mid_t": 0.821}, ("steps", "mid_t")),
        HostileSpec("gaussian_kl", gm.gaussian_kl, {"mu": _P37_X, "sigma": _P37_X.abs() + 0.1}, ("mu", "sigma"),
                    allow={"constant": "a constant mean or scale is a valid Gaussian",
                           "extra_dim": "(N, *event): summed over the event axes"}),
        HostileSpec("pseudo_huber", gm.pseudo_huber, {"delta": _P37_X, "c": 0.01}, ("delta", "c"),
                    allow={"constant": P37_CONST, "extra_dim": "elementwise: any shape (N, *event)"}),
        HostileSpec("karras_sigmas", gm.karras_sigmas, {"n": 11, "sigma_min": 0.002, "sigma_max": 80.0, "rho": 7.0},
                    ("n", "sigma_min", "sigma_max", "rho")),
        HostileSpec("ot_coupling", gm.ot_coupling, {"x": _P37_X, "eps": _P37_X + 1}, ("x", "eps"),
                    allow={"constant": "ties: any optimal permutation is valid",
                           "extra_dim": "(N, *event): flattened per sample"}),
    ]  # fmt: skip


SPECS += _p37_specs()


# ---- P25 VisionTS ------------------------------------------------------------------------------------

P25_HUGE = "statistics in float64: a huge context is forecast in its own (huge, finite) units"
P25_CONST = "a constant context normalises with std sqrt(1e-5)/0.4 and forecasts a finite series around it"


def _p25_model() -> gm.VisionTS:
    mae = gm.small_vit_mae(
        32, 8, hidden_size=8, num_layers=1, num_heads=2, decoder_hidden_size=8, decoder_layers=1
    )
    return gm.VisionTS(mae, finetune="none").configure(32, 8, 4)


def _p25_specs() -> list[HostileSpec]:
    pytest.importorskip("transformers")
    model = _p25_model()
    g = model.geometry_
    x = torch.randn(2, 32, 2, generator=_g)
    return [
        HostileSpec("VisionTS.forward", lambda x: model(x), {"x": x}, ("x",), allow={"constant": P25_CONST, "huge": P25_HUGE},
                    covers=("VisionTS", "HFViTMAEAdapter", "small_vit_mae", "MAEAdapter")),
        HostileSpec("visionts_geometry", gm.visionts_geometry,
                    {"context_len": 48, "horizon": 12, "periodicity": 4, "norm_const": 0.4, "align_const": 0.4},
                    ("context_len", "horizon", "periodicity", "norm_const", "align_const"),
                    covers=("visionts_geometry", "VisionTSGeometry", "visionts_keep_mask")),
        HostileSpec("series_to_image", lambda x_norm: gm.series_to_image(x_norm, g), {"x_norm": x[..., 0]},
                    ("x_norm",), allow={"constant": "a constant row renders as a flat stripe",
                                        "huge": "resizes are linear: huge values stay finite"}),
        HostileSpec("image_to_forecast", lambda images: gm.image_to_forecast(images, g),
                    {"images": torch.randn(2, 3, 32, 32, generator=_g)}, ("images",),
                    allow={"constant": "a flat image reads back as a constant forecast",
                           "huge": "resizes are linear: huge pixels give huge, finite values"}),
        HostileSpec("autotune_periodicity",
                    lambda series: gm.autotune_periodicity(model, series, 8, [4, 1], context_len=32),
                    {"series": torch.randn(64, generator=_g)}, ("series",),
                    allow={"constant": "every candidate forecasts a constant equally well: the first wins",
                           "extra_dim": "(T, 1) is a one-channel series", "huge": P25_HUGE}),
        HostileSpec("candidate_periods", gm.candidate_periods, {"freq": "H"}, ()),
    ]  # fmt: skip


SPECS += _p25_specs()

# ---- P12 MVoT token discrepancy loss -------------------------------------------------------------------

_P12_E = torch.randn(5, 3, generator=_g)
_P12_D = gm.codebook_distance_matrix(_P12_E)
_P12_IDS = torch.tensor([9, 3, 11, 6, 4])
_P12_LOGITS = torch.randn(2, 4, 12, generator=_g)
_P12_LABELS = torch.tensor([[-100, 9, 0, 3], [-100, 4, 11, 2]])
_P12_IMAGES = np.repeat(np.repeat(np.random.default_rng(0).random((6, 2, 2, 3)), 2, 1), 2, 2)
P12_VALID = {
    "logits:constant": "uniform logits are valid: a uniform image softmax",
    "logits:huge": "large logits are valid: the softmax subtracts the maximum",
    "labels:constant": "a constant label row is valid (all unsupervised gives L_D = 0)",
    "distance:constant": "any finite (K, K) cost matrix is accepted",
    "distance:huge": "any finite (K, K) cost matrix is accepted",
}


def _p12_tokenizer() -> gm.KMeansVQTokenizer:
    return gm.KMeansVQTokenizer(3, 2, seed=0).fit(_P12_IMAGES)


def _p12_fit():
    tok = _p12_tokenizer()
    return tok.fit, {"images": _P12_IMAGES}, lambda: tok.codebook_.clone()


def _p12_encode():
    tok = _p12_tokenizer()
    return tok.encode, {"images": _P12_IMAGES}, lambda: tok.codebook_.clone()


def _p12_specs() -> list[HostileSpec]:
    ex = {"logits": _P12_LOGITS, "labels": _P12_LABELS, "image_token_ids": _P12_IDS, "distance": _P12_D}
    return [
        HostileSpec("codebook_distance_matrix", gm.codebook_distance_matrix, {"codebook": _P12_E}, ("codebook",),
                    allow={"constant": "identical codes are valid: D = 0", "huge": "large codes give finite distances"}),
        HostileSpec("token_discrepancy_loss", gm.token_discrepancy_loss, ex,
                    ("logits", "labels", "image_token_ids", "distance"), allow=P12_VALID),
        HostileSpec("MVoTLoss", lambda logits, labels: gm.MVoTLoss(_P12_D, _P12_IDS)(logits, labels)["loss"],
                    {"logits": _P12_LOGITS, "labels": _P12_LABELS}, ("logits", "labels"),
                    allow={k: v for k, v in P12_VALID.items() if not k.startswith("distance")}),
        HostileSpec("build_interleaved_example", gm.build_interleaved_example,
                    {"steps": [([5], torch.tensor([0, 2]))], "image_token_ids": _P12_IDS, "boi_id": 1, "eoi_id": 2},
                    (("steps", 0, 1), "image_token_ids"),
                    allow={"steps[0][1]:constant": "a constant image (one code everywhere) is valid",
                           "image_token_ids:constant": "only the codes used are looked up"}),
        HostileSpec("image_block_mask", lambda input_ids, image_token_ids: gm.image_block_mask(
                    input_ids, 12, image_token_ids, 1, 2, 3), {"input_ids": _P12_LABELS.clamp_min(0), "image_token_ids": _P12_IDS},
                    ("input_ids", "image_token_ids"), allow={"input_ids:constant": "any token history is valid"}),
        HostileSpec("KMeansVQTokenizer.fit", setup=_p12_fit, arrays=("images",), covers=("KMeansVQTokenizer",),
                    allow={"constant": "constant images are valid (k-means repeats centroids)"}),
        HostileSpec("KMeansVQTokenizer.encode", setup=_p12_encode, arrays=("images",), covers=("KMeansVQTokenizer",),
                    allow={"constant": "constant images are valid"}),
        HostileSpec("KMeansVQTokenizer.decode", lambda codes: _p12_tokenizer().decode(codes, (2, 2)),
                    {"codes": torch.tensor([[0, 1, 2, 0]])}, ("codes",), allow={"constant": "a constant code map is valid"}),
    ]  # fmt: skip


SPECS += _p12_specs()

# ---- P28 URAE minor-component adapters and the guidance rule ----------------------------------------------

_P28_W = torch.randn(6, 5, generator=_g)
P28_CONST = "a constant weight is a valid (rank-1) matrix: its SVD split is exact"
P28_HUGE = "a huge finite weight is valid: the split is scale-equivariant and stays finite"


def _p28_linear(weight: torch.Tensor) -> torch.nn.Module:
    with isolated_rng(0):
        lin = torch.nn.Linear(5, 6)
    # any corrupted weight reaches the adapter's own checks
    lin.weight = torch.nn.Parameter(weight.clone(), requires_grad=weight.is_floating_point())
    return torch.nn.Sequential(lin)


def _p28_adapted() -> torch.nn.Module:
    model = _p28_linear(_P28_W)
    gm.apply_svd_adapters(model, ["0"], rank=2)
    return model


class _P28Guided(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = {"guidance_embeds": True}
        self.w = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x, t, c, g):
        return self.w * x + (t * g).reshape(-1, *[1] * (x.dim() - 1))


def _p28_specs() -> list[HostileSpec]:
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    return [
        HostileSpec("SVDComponentLinear", lambda weight: gm.SVDComponentLinear(_p28_linear(weight)[0], 2).delta_weight().detach(),
                    {"weight": _P28_W}, ("weight",), allow={"constant": P28_CONST, "huge": P28_HUGE}),
        HostileSpec("LoRALinear", lambda weight: gm.LoRALinear(_p28_linear(weight)[0], 2, generator=gen()).effective_weight().detach(),
                    {"weight": _P28_W}, ("weight",), allow={"constant": P28_CONST, "huge": P28_HUGE}),
        HostileSpec("apply_svd_adapters", lambda weight, rank: len(gm.apply_svd_adapters(_p28_linear(weight), ["0"], rank)),
                    {"weight": _P28_W, "rank": 2}, ("weight", "rank"), allow={"constant": P28_CONST, "huge": P28_HUGE}),
        HostileSpec("apply_lora_adapters", lambda rank: len(gm.apply_lora_adapters(_p28_linear(_P28_W), ["0"], rank, generator=gen())),
                    {"rank": 2}, ("rank",)),
        HostileSpec("export_peft_lora_state_dict", lambda: gm.export_peft_lora_state_dict(_p28_adapted()), {}, ()),
        HostileSpec("peft_lora_config", lambda: gm.peft_lora_config(_p28_adapted()), {}, ()),
        HostileSpec("merge_adapters", lambda: gm.merge_adapters(_p28_adapted())[0].weight.detach(), {}, ()),
        HostileSpec("check_guidance_for_adaptation", lambda guidance: gm.check_guidance_for_adaptation({"guidance_embeds": True}, guidance),
                    {"guidance": 1.0}, ("guidance",)),
        HostileSpec("flow_matching_finetune_step", lambda x0, guidance: gm.flow_matching_finetune_step(_P28Guided(), x0, None, guidance=guidance,
                    generator=gen()).detach(), {"x0": _P28_W, "guidance": 1.0}, ("x0", "guidance"),
                    allow={"constant": "a constant batch is valid data", "extra_dim": "(N, *event): an event axis is valid"}),
    ]  # fmt: skip


SPECS += _p28_specs()


# ---- P15 SO(3)-averaged flow matching for conformers -----------------------------------------------------


def _p15_specs() -> list[HostileSpec]:
    """P15 AvgFlow: rotations, matrix-Fisher mean, averaged target, EGNN, ConformerFlow, reflow, RDKit I/O."""
    from icml25.kernels.testing import Allow

    g = torch.Generator().manual_seed(15)
    x = gm.centre(torch.randn(2, 5, 3, generator=g))
    x1 = gm.centre(torch.randn(2, 5, 3, generator=g))
    bonds = torch.zeros(2, 5, 5, dtype=torch.int64)
    bonds[:, [0, 1, 2, 3], [1, 2, 3, 4]] = 1
    bonds = bonds + bonds.transpose(1, 2)
    graph = gm.MolGraph(torch.zeros(2, 5, dtype=torch.int64), bonds, torch.ones(2, 5, dtype=torch.bool))
    point = "all atoms at one point: centred to the origin, a valid (zero) configuration"
    empty_batch = "an empty batch gives an empty result"
    prop = Allow("documented: the network's forward propagates NaN/Inf (no host sync)", False)

    def _model():
        with isolated_rng(0):
            return gm.ConformerFlow(gm.EGNN(hidden=8, n_layers=1), "avg")

    def _fit():
        m = _model()
        return (lambda x1: m.fit(x1, graph, 1, batch_size=2, seed=0)), {"x1": x1}, m

    def _pairs(z):
        return gm.ReflowPairs(z, x1, graph)

    def _mol():
        from rdkit import Chem
        from rdkit.Chem import AllChem

        mol = Chem.MolFromSmiles("CCO")
        AllChem.Compute2DCoords(mol)
        return mol

    def _with_conformers():
        mol = _mol()
        return (
            (lambda coords: gm.with_conformers(mol, coords).GetNumConformers()),
            {"coords": x[:, :3].numpy()},
            None,
        )

    return [
        HostileSpec("matrix_fisher_mean", gm.matrix_fisher_mean, {"F": torch.randn(2, 3, 3, generator=g)}, ("F",),
                    {"constant": "a constant F is a valid (rank-1) parameter", "F:empty:0": empty_batch}),
        HostileSpec("proper_svd", lambda F: gm.proper_svd(F)[1], {"F": torch.randn(2, 3, 3, generator=g)}, ("F",),
                    {"constant": "a constant F is a valid (rank-1) matrix", "F:empty:0": empty_batch,
                     "huge": "the SVD is scale-equivariant and finite"}),
        HostileSpec("kabsch_rotation", gm.kabsch_rotation, {"A": x, "B": x1}, ("A", "B"),
                    {"constant": "a cloud collapsed to one point: every rotation is optimal, one proper rotation is returned",
                     "huge": "computed in float64: the rotation is scale-invariant", "empty:0": empty_batch}),
        HostileSpec("check_rotation", gm.check_rotation, {"R": gm.haar_rotations(2, generator=g)}, ("R",),
                    {"R:empty:0": "no rotations to check"}),
        HostileSpec("haar_rotations", lambda n: gm.haar_rotations(n, generator=torch.Generator().manual_seed(0)),
                    {"n": 3}, ()),
        HostileSpec("quaternion_to_matrix", gm.quaternion_to_matrix, {"q": torch.randn(3, 4, generator=g)}, ("q",),
                    {"constant": "equal components are a valid quaternion", "huge": "normalised in float64",
                     "q:empty:0": empty_batch, "q:extra_dim": "(..., 4): any leading batch shape"}),
        HostileSpec("centre", gm.centre, {"x": x}, ("x",), {"constant": point, "x:empty:0": empty_batch}),
        HostileSpec("avgflow_target", lambda x_t, x1, t: gm.avgflow_target(x_t, x1, t), {"x_t": x, "x1": x1, "t": 0.4},
                    ("x_t", "x1", "t"), {"constant": point, "empty:0": empty_batch}),
        HostileSpec("flow_target", lambda x0, x1, t: gm.flow_target(x0, x1, t, "condot", generator=torch.Generator().manual_seed(0))[1],
                    {"x0": x, "x1": x1, "t": 0.4}, ("x0", "x1", "t"), {"constant": point, "empty:0": empty_batch}),
        HostileSpec("EGNN", lambda x: _model().net(x, torch.full((2,), 0.5), graph).detach(), {"x": x}, ("x",),
                    {"nan": prop, "posinf": prop, "neginf": prop, "constant": point,
                     "huge": Allow("documented: the forward does not check magnitudes (no host sync)", False)},
                    covers=("EGNN", "MolGraph")),
        HostileSpec("ConformerFlow.loss", lambda x1: _model().loss(x1, graph, generator=torch.Generator().manual_seed(0)).detach(),
                    {"x1": x1}, ("x1",), {"constant": point}, covers=("ConformerFlow",)),
        HostileSpec("ConformerFlow.fit", setup=_fit, arrays=("x1",), allow={"constant": point}),
        HostileSpec("velocity_loss", lambda pred, target: gm.velocity_loss(pred, target, graph.mask), {"pred": x, "target": x1},
                    ("pred", "target"), {"constant": "a constant prediction or target is a valid velocity field"}),
        HostileSpec("TrainingSchedule", lambda warmup, ema_decay: gm.TrainingSchedule(warmup=warmup, ema_decay=ema_decay).warmup_steps(100),
                    {"warmup": 0.01, "ema_decay": 0.999}, ()),
        HostileSpec("ConformerFlow.sample", lambda x0: _model().sample(graph, 2, x0=x0), {"x0": x}, ("x0",),
                    {"constant": point}),
        HostileSpec("make_reflow_pairs", lambda: gm.make_reflow_pairs(_model(), graph, 2, generator=torch.Generator().manual_seed(0)).x,
                    {}, ()),
        HostileSpec("reflow", lambda z: gm.reflow(_model(), _pairs(z), 1, batch_size=2).t_eps, {"z": x}, ("z",),
                    {"constant": point}, covers=("reflow", "ReflowPairs")),
        HostileSpec("distill", lambda z: gm.distill(_model(), _pairs(z), 1, batch_size=2).t_eps, {"z": x}, ("z",),
                    {"constant": point}),
        HostileSpec("rmsd_matrix", gm.rmsd_matrix, {"gen": x.numpy(), "ref": x1.numpy()}, ("gen", "ref"),
                    {"constant": "identical points: RMSD 0 to a point, the spread of the other cloud",
                     "huge": "computed in float64: finite"}),
        HostileSpec("coverage_amr", lambda gen, delta: gm.coverage_amr(gen, x1.numpy(), delta)["amr_r"],
                    {"gen": x.numpy(), "delta": 0.5}, ("gen", "delta"),
                    {"gen:constant": "identical points: a valid (collapsed) conformer", "gen:huge": "computed in float64: finite"}),
        HostileSpec("with_conformers", setup=_with_conformers, arrays=("coords",),
                    allow={"constant": "coincident atoms are stored as given", "huge": "stored as given (RDKit doubles)",
                           "coords:empty:0": "no conformers to add"}),
        HostileSpec("sample_conformers", lambda n: gm.sample_conformers(_model(), _mol(), n, n_steps=1).GetNumConformers(),
                    {"n": 2}, ()),
        HostileSpec("embed_conformers", lambda n: gm.embed_conformers("CCO", n).GetNumConformers(), {"n": 2}, ()),
        HostileSpec("conformer_coords", lambda: gm.conformer_coords(gm.embed_conformers("CCO", 1)), {}, ()),
        HostileSpec("mols_to_graph", lambda: gm.mols_to_graph([_mol()]).mask, {}, ()),
    ]  # fmt: skip


SPECS += _p15_specs()
# ---- P40 MolJO -----------------------------------------------------------------------------------------


def _p40_specs() -> list[HostileSpec]:
    """P40 MolJO: Bayesian flows, schedule, pocket, BFN network and training, property model, samplers, toy task."""
    g = torch.Generator().manual_seed(40)
    task = gm.ToyPocketTask(seed=0)
    pocket = task.pocket
    mu = pocket.center + torch.randn(2, 5, 3, generator=g)
    theta = torch.softmax(torch.randn(2, 5, 4, generator=g), -1)
    coords, types = task.sample_ligands(6, seed=1)
    y = torch.rand(6, generator=g) * 0.8 + 0.1

    def _g0():
        return torch.Generator().manual_seed(0)

    def _bfn():
        return gm.LigandBFN(4, 3, max_atoms=8, hidden=8, n_layers=1, seed=0)

    def _prop():
        return gm.ParamPropertyModel(4, 3, max_atoms=8, hidden=8, n_layers=1, seed=0)

    def _train():
        net = _bfn()

        def fn(coords, types):
            return gm.train_bfn(net, coords, types, pocket, steps=2, batch_size=3, seed=0)[-1]

        return fn, {"coords": coords, "types": types}, net

    def _train_prop():
        net = _prop()

        def fn(coords, types, y):
            return gm.train_property_model(net, coords, types, y, pocket, steps=2, batch_size=3)[-1]

        return fn, {"coords": coords, "types": types, "y": y}, net

    same = "coincident atoms / one type everywhere are valid (degenerate) inputs with a finite answer"
    anyshape = "the flow acts elementwise on any [B, ...] batch"
    net, prop = _bfn(), _prop()
    score = task.objective(10.0, 10.0)
    return [
        HostileSpec("bayesian_flow_coord", lambda x, t: gm.bayesian_flow_coord(x, t, generator=_g0()),
                    {"x": mu, "t": 0.3}, ("x", "t"),
                    allow={"constant": same, "x:extra_dim": anyshape, "x:missing_dim": anyshape}),
        HostileSpec("bayesian_flow_type", lambda p, t: gm.bayesian_flow_type(p, t, generator=_g0()),
                    {"p": theta, "t": 0.3}, ("p", "t"), allow={"constant": "a constant p is a valid soft estimate"}),
        HostileSpec("BFNSchedule", lambda sigma1, beta1: gm.BFNSchedule(sigma1, beta1, 10).rho(3),
                    {"sigma1": 0.03, "beta1": 1.5}, ("sigma1", "beta1")),
        HostileSpec("Pocket", lambda coords, types: gm.Pocket(coords, types).center, {"coords": pocket.coords,
                    "types": pocket.types}, ("coords", "types"), allow={"constant": same}),
        HostileSpec("LigandBFN.forward", lambda mu, theta: net(mu, theta, 0.3, pocket)[0].detach(),
                    {"mu": mu, "theta": theta}, ("mu", "theta"), allow={"mu:constant": same},
                    covers=("LigandBFN",), global_rng="constructing an nn.Module with seed= is isolated; none here"),
        HostileSpec("LigandBFN.loss", lambda coords, types: net.loss(coords, types, pocket, generator=_g0()).detach(),
                    {"coords": coords, "types": types}, ("coords", "types"), allow={"constant": same},
                    covers=("LigandBFN",)),
        HostileSpec("train_bfn", setup=_train, arrays=("coords", "types"), allow={"constant": same}),
        HostileSpec("ParamPropertyModel.forward", lambda mu, theta: prop(mu, theta, 0.3, pocket).detach(),
                    {"mu": mu, "theta": theta}, ("mu", "theta"), allow={"constant": same}, covers=("ParamPropertyModel",)),
        HostileSpec("train_property_model", setup=_train_prop, arrays=("coords", "types", "y"),
                    allow={"constant": same}),
        HostileSpec("through_network", lambda w: gm.through_network(net, score, pocket)(mu * w, theta, torch.full((2,), 0.3)).detach(),
                    {"w": 1.0}, ()),
        HostileSpec("moljo_sample", lambda w_pos, w_type: gm.moljo_sample(
                        net, gm.through_network(net, score, pocket), pocket, 4, 2, 3, w_pos=w_pos, w_type=w_type,
                        generator=_g0()).coords,
                    {"w_pos": 5.0, "w_type": 5.0}, ("w_pos", "w_type")),
        HostileSpec("bfn_sample", lambda n_atoms: gm.bfn_sample(net, pocket, n_atoms, 2, 3, generator=_g0()).coords,
                    {"n_atoms": 4}, ("n_atoms",)),
        HostileSpec("ToyPocketTask.score", lambda x, p: task.score(x, p), {"x": coords, "p": types}, ("x", "p"),
                    allow={"constant": same}, covers=("ToyPocketTask",)),
        HostileSpec("ToyPocketTask.metrics", lambda coords, types: task.metrics(coords, types, 20.0)["score"],
                    {"coords": coords, "types": types}, ("coords", "types"), allow={"constant": same},
                    covers=("ToyPocketTask",)),
        HostileSpec("ToyPocketTask", lambda radius: gm.ToyPocketTask(radius=radius).pocket.coords, {"radius": 4.0},
                    ("radius",)),
    ]  # fmt: skip


SPECS += _p40_specs()
# ---- P32 ThinkDiff aligner ----------------------------------------------------------------------------

P32_MASK = {"dtype": "an integer 0/1 mask is valid", "constant": "an all-ones mask is valid"}
P32_FEATS = "a constant feature sequence is valid: the aligner's output is finite"


def _p32_specs() -> list[HostileSpec]:
    pytest.importorskip("transformers")
    g = torch.Generator().manual_seed(32)
    t5 = gm.tiny_t5(10, d_model=8, num_layers=1, num_heads=2, seed=0).eval()
    feats = torch.randn(2, 3, 4, generator=g)
    fmask = torch.ones(2, 3)
    ids = torch.tensor([[2, 3, 1], [4, 1, 0]])

    def _aligner() -> gm.FeatureAligner:
        return gm.FeatureAligner(4, 8, seed=0).init_norm_from(t5.encoder.final_layer_norm)

    def _train():
        al = _aligner()

        def fn(feats, feat_mask):
            batch = {"feats": feats, "feat_mask": feat_mask, "token_ids": ids}
            return gm.train_aligner(al, [batch], t5, 2, retokenize=lambda i, m: (i, m), split="random")[
                "loss"
            ]

        return fn, {"feats": feats, "feat_mask": fmask}, al

    class _Unet(torch.nn.Module):
        config: ClassVar[dict] = {"cross_attention_dim": 8}

    class _Pipe:
        components: ClassVar[dict] = {"unet": _Unet(), "text_encoder": t5.encoder}

    vlm = gm.ToyVLM(12, d=8, n_layers=1, n_heads=2, seed=0)
    flow = gm.ToyFlowDecoder(6, 8, hidden=8, n_blocks=1, n_heads=2, seed=0)
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=12,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    with isolated_rng(0):
        llama = transformers.LlamaForCausalLM(cfg).eval()
    return [
        HostileSpec("FeatureAligner", lambda feats: _aligner()(feats).detach(), {"feats": feats}, ("feats",),
                    allow={"constant": P32_FEATS}),
        HostileSpec("aligner_text_loss", lambda feats, feat_mask, target_ids: gm.aligner_text_loss(
                    _aligner(), feats, feat_mask, target_ids, t5).detach(),
                    {"feats": feats, "feat_mask": fmask, "target_ids": ids}, ("feats", "feat_mask", "target_ids"),
                    allow={"feats:constant": P32_FEATS, **{f"feat_mask:{k}": v for k, v in P32_MASK.items()},
                           "target_ids:constant": "a constant target sentence is valid"}),
        HostileSpec("random_split_generated", lambda feats, feat_mask, token_ids: gm.random_split_generated(
                    feats, feat_mask, token_ids, seed=0), {"feats": feats, "feat_mask": fmask, "token_ids": ids},
                    ("feats", "feat_mask", "token_ids"),
                    allow={"feats:constant": P32_FEATS, **{f"feat_mask:{k}": v for k, v in P32_MASK.items()},
                           "token_ids:constant": "any token ids are valid"}),
        HostileSpec("train_aligner", setup=_train, arrays=("feats", "feat_mask"),
                    allow={"feats:constant": P32_FEATS, **{f"feat_mask:{k}": v for k, v in P32_MASK.items()}}),
        HostileSpec("aligned_prompt_embeds", lambda hidden: gm.aligned_prompt_embeds(
                    lambda x: (x, torch.ones(x.shape[:2])), _aligner(), hidden)[0], {"hidden": feats}, ("hidden",),
                    allow={"constant": P32_FEATS}),
        HostileSpec("diffusers_prompt_kwargs", lambda prompt_embeds: gm.diffusers_prompt_kwargs(
                    _Pipe(), prompt_embeds)["prompt_embeds"], {"prompt_embeds": torch.randn(2, 3, 8, generator=g)},
                    ("prompt_embeds",), allow={"constant": "any finite embedding is passed through"}),
        HostileSpec("tiny_t5", lambda d_model: gm.tiny_t5(10, d_model=d_model, num_heads=2).config.d_model,
                    {"d_model": 8}, ("d_model",)),
        HostileSpec("ToyVLM.generate", lambda images: vlm.generate(images, torch.ones(2, 1, dtype=torch.long), 2)["hidden"],
                    {"images": torch.rand(2, 8, 8, generator=g)}, ("images",), covers=("ToyVLM",),
                    allow={"constant": "a blank image is a valid image"}),
        HostileSpec("ToyFlowDecoder.sample", lambda cond: flow.sample(cond, torch.ones(cond.shape[:2]), 2, seed=0),
                    {"cond": torch.randn(2, 3, 8, generator=g)}, ("cond",), covers=("ToyFlowDecoder",),
                    allow={"constant": "a constant condition is valid"}),
        HostileSpec("generated_hidden_states", lambda input_ids: gm.generated_hidden_states(
                    llama, input_ids, 2, do_sample=False)[0], {"input_ids": torch.tensor([[2, 5], [3, 4]])},
                    ("input_ids",), allow={"constant": "a constant prompt is a valid prompt"}),
    ]  # fmt: skip


SPECS += _p32_specs()


def _p27_specs() -> list[HostileSpec]:
    """P27 Geo2Seq: geometry, frame, bonds/stability, canonical orders, encode/decode, tokenizer."""
    sym = ["C", "O", "H", "H", "H", "H"]  # methanol; RDKit only inside the two specs that need it
    pos = np.array([[-0.05, 0.67, 0.00], [-0.05, -0.75, 0.00], [-1.09, 0.98, 0.00],
                    [0.44, 1.07, 0.89], [0.44, 1.07, -0.89], [0.87, -1.06, 0.00]])  # fmt: skip
    bonds = np.array([(0, 1), (0, 2), (0, 3), (0, 4), (1, 5)], dtype=np.int64)
    seq = gm.encode((sym, pos))
    pair = {
        "constant": "all atoms at one point: every tabulated pair is 'bonded'; a finite, documented answer"
    }

    def _mol():
        Chem = pytest.importorskip("rdkit.Chem")
        AllChem = pytest.importorskip("rdkit.Chem.AllChem")
        mol = Chem.AddHs(Chem.MolFromSmiles("CO"))
        AllChem.EmbedMolecule(mol, randomSeed=0)
        return mol

    def _to_mol():
        pytest.importorskip("rdkit")
        return (lambda seq: gm.decode_to_mol(seq).GetNumAtoms()), {"seq": seq}, None

    tok = gm.Geo2SeqTokenizer().fit([seq])
    return [
        HostileSpec("to_spherical", lambda pos: gm.to_spherical(pos), {"pos": pos}, ("pos",)),
        HostileSpec("molecule_frame", lambda pos: gm.molecule_frame(pos)[0], {"pos": pos}, ("pos",)),
        HostileSpec("from_spherical", gm.from_spherical, {"sph": gm.to_spherical(pos)}, ("sph",),
                    {"constant": "equal rows are valid spherical coordinates (coincident atoms)"}),
        HostileSpec("kabsch_rmsd", gm.kabsch_rmsd, {"a": pos, "b": pos + 1.0}, ("a", "b"),
                    {"constant": "a collapsed conformation has a finite RMSD to any other"}),
        HostileSpec("bond_orders", lambda pos: gm.bond_orders(sym, pos), {"pos": pos}, ("pos",), pair),
        HostileSpec("stability", lambda pos: gm.stability(sym, pos), {"pos": pos}, ("pos",), pair),
        HostileSpec("graph_canonical_order", lambda bonds: gm.graph_canonical_order(sym, bonds), {"bonds": bonds},
                    ("bonds",), {"bonds:empty:0": "no bonds: every atom its own component, still an order"}),
        HostileSpec("encode", lambda positions: gm.encode((sym, positions)), {"positions": pos}, ("positions",)),
        HostileSpec("tokenize_molecule", lambda positions: gm.tokenize_molecule((sym, positions)).values,
                    {"positions": pos}, ("positions",)),
        HostileSpec("canonical_order", setup=lambda: (gm.canonical_order, {"mol": _mol()}, None), arrays=()),
        HostileSpec("decode", lambda seq: gm.decode(seq)[1], {"seq": seq}, ()),
        HostileSpec("decode_to_mol", setup=_to_mol, arrays=()),
        HostileSpec("Geo2SeqConfig", lambda collinear_tol_deg: gm.Geo2SeqConfig(collinear_tol_deg=collinear_tol_deg).collinear_tol_deg,
                    {"collinear_tol_deg": 5.0}, ("collinear_tol_deg",)),
        HostileSpec("Geo2SeqTokenizer", lambda: gm.Geo2SeqTokenizer().fit([seq]).batch([seq])[0], {}, ()),
        HostileSpec("Geo2SeqTokenizer.decode", lambda ids: tok.decode(ids), {"ids": np.array(tok.encode(seq))}, ("ids",),
                    {"ids:empty:0": "no ids decode to the empty string",
                     "constant": "a constant id is one repeated token"}, covers=("Geo2SeqTokenizer",)),
    ]  # fmt: skip


SPECS += _p27_specs()
# ---- P31 noise-conditioned graph networks / dynamic message passing --------------------------------------


def _p31_specs() -> list[HostileSpec]:
    """P31 NCGN: schedule, voxel clusters, kNN, DMP graph, layer, network, flow matching, time converters."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(31)
    pos = torch.rand(24, 2, generator=g) * 2 - 1
    clouds = torch.rand(2, 12, 2, generator=g)
    one = "a constant cloud is valid: every point in one voxel, all distances 0 (ties to the lower index)"
    elementwise = {
        "empty:0": "no timesteps: an empty result",
        "extra_dim": "elementwise: any shape",
        "missing_dim": "elementwise: a 0-d timestep",
        "constant": CONST_OK,
        "dtype": "integer timesteps are DDPM's usual form",
    }
    with isolated_rng(0):
        model = gm.NoiseConditionedGNN(2, 8, 2, n_layers=1, k=3).eval()
        layer = gm.DMPLayer(8, 2)
    graph = gm.build_dmp_graph(pos, 0.2, 3)
    xcg = torch.randn(graph.num_clusters, 8, generator=g)
    sched = SimpleNamespace(config=SimpleNamespace(num_train_timesteps=1000))

    def _graph(pos, s):
        gr = gm.build_dmp_graph(pos, s, 3, "exp")
        return gr.pos_cg, gr.edge_attr_cg, gr.member_attr

    return [
        HostileSpec("dmp_schedule", lambda curvature, split: gm.dmp_schedule("relu", curvature=curvature, split=split)(0.7, 4, 96),
                    {"curvature": 10.0, "split": 0.6}, ("curvature", "split")),
        HostileSpec("voxel_clusters", lambda pos: gm.voxel_clusters(pos, 9)[0], {"pos": pos}, ("pos",),
                    {"constant": one}),
        HostileSpec("knn_graph", lambda pos: gm.knn_graph(pos, 3), {"pos": pos}, ("pos",), {"constant": one}),
        HostileSpec("build_dmp_graph", _graph, {"pos": pos, "s": torch.tensor(0.2)}, ("pos", "s"),
                    {"constant": one, "s:extra_dim": "a (1,) s is one data-ness for the single graph"}),
        HostileSpec("DMPLayer", lambda x: layer(x, xcg, pos, graph)[0].detach(), {"x": torch.randn(24, 8, generator=g)},
                    ("x",), {"constant": CONST_OK}),
        HostileSpec("NoiseConditionedGNN", lambda x, pos: model(x, pos, 0.3).detach(), {"x": pos.clone(), "pos": pos},
                    ("x", "pos"), {"constant": one}),
        HostileSpec("ncgn_flow_matching_loss",
                    lambda x1: gm.ncgn_flow_matching_loss(model, x1, generator=torch.Generator().manual_seed(0)).detach(),
                    {"x1": clouds}, ("x1",), {"constant": one}),
        HostileSpec("ncgn_sample", lambda steps: gm.ncgn_sample(model, 2, 10, steps, generator=torch.Generator().manual_seed(0)),
                    {"steps": 2}, ("steps",)),
        HostileSpec("ddpm_timestep_to_s", lambda timestep: gm.ddpm_timestep_to_s(timestep, 1000),
                    {"timestep": torch.tensor([999.0, 10.0])}, ("timestep",), elementwise),
        HostileSpec("scheduler_timestep_to_s", lambda timestep: gm.scheduler_timestep_to_s(sched, timestep),
                    {"timestep": torch.tensor([999.0, 10.0])}, ("timestep",), elementwise),
    ]  # fmt: skip


SPECS += _p31_specs()
# ---- P35 VIMTS -----------------------------------------------------------------------------------------

P35_CONST = "a constant series is valid data: the forecast is finite"


def _p35_batch(values: torch.Tensor | None = None, times: torch.Tensor | None = None,
               query_times: torch.Tensor | None = None, targets: torch.Tensor | None = None) -> gm.IMTSBatch:  # fmt: skip
    g = torch.Generator().manual_seed(3)
    t = torch.rand(2, 5, 3, generator=g) * 24 if times is None else times
    v = torch.randn(2, 5, 3, generator=g) if values is None else values
    qt = 24.5 + torch.rand(2, 4, 3, generator=g) * 23 if query_times is None else query_times
    y = torch.randn(2, 4, 3, generator=g) if targets is None else targets
    return gm.IMTSBatch(t, v, torch.ones(v.shape), qt, torch.ones(2, 4, 3), y)


def _p35_model() -> gm.VIMTS:
    return gm.VIMTS(3, 24.0, 24.0, 4.0, hid_dim=8, gcn_layers=1, seed=0)


def _p35_fit():
    model = _p35_model()
    fn = lambda values, targets: gm.fit_vimts(  # noqa: E731
        model, _p35_batch(values, targets=targets), None, stage="finetune", steps=1, batch_size=2
    )
    b = _p35_batch()
    return fn, {"values": b.values, "targets": b.targets}, model


def _p35_specs() -> list[HostileSpec]:
    model = _p35_model()
    b = _p35_batch()
    X = np.where(np.random.default_rng(0).random((2, 8, 2)) < 0.5, np.nan, 1.0)
    X[:, 0], X[:, 5] = 1.0, 2.0
    return [
        HostileSpec("VIMTS.forecast", lambda values, times, query_times: model.forecast(_p35_batch(values, times, query_times)),
                    {"values": b.values, "times": b.times, "query_times": b.query_times}, ("values", "times", "query_times"),
                    allow={"constant": P35_CONST, "times:missing_dim": "(B, L) times are shared by the channels",
                           "query_times:missing_dim": "(B, Q) query times are shared by the channels"},
                    covers=("VIMTS", "IMTSBatch", "TTCN", "AdaptiveGCN", "LearnableTimeEmbedding")),
        HostileSpec("fit_vimts", setup=_p35_fit, arrays=("values", "targets"), allow={"constant": P35_CONST}),
        HostileSpec("patchify_irregular", lambda values, window: tuple(
                    vars(gm.patchify_irregular(_p35_batch(values), window, history=24.0)).values()),
                    {"values": b.values, "window": 4.0}, ("values", "window"),
                    allow={"constant": "constant values are grouped like any others",
                           "huge": "grouping only moves values: huge ones come back unchanged"},
                    covers=("patchify_irregular", "PatchedIMTS")),
        HostileSpec("query_patch_index", lambda query_times: gm.query_patch_index(query_times, 24.0, 4.0, 6),
                    {"query_times": b.query_times}, ("query_times",),
                    allow={"constant": "one window for every query", "huge": "clipped to the last window",
                           "extra_dim": "elementwise: any shape", "missing_dim": "elementwise: any shape"}),
        HostileSpec("imts_masked_mse", lambda pred, target: gm.imts_masked_mse(pred, target, torch.ones(2, 4, 3)),
                    {"pred": b.targets, "target": b.targets * 0.5}, ("pred", "target"),
                    allow={"constant": "a constant prediction has a finite error"}),
        HostileSpec("imts_from_arrays", lambda X: gm.imts_from_arrays(X, np.arange(8.0), 4.0, 4.0).values,
                    {"X": X}, ("X",), allow={"nan": "NaN marks a missing value (the PyPOTS convention)",
                                             "constant": "a constant series is valid data",
                                             "dtype": "any real array is converted to float (PyPOTS arrays are numpy)"}),
        HostileSpec("seq_sincos_pos_embed", lambda dim, n: gm.seq_sincos_pos_embed(dim, n, rows=2),
                    {"dim": 8, "n": 6}, ("dim", "n")),
    ]  # fmt: skip


SPECS += _p35_specs()


# ---- P16 Flex3D: view curation and a flexible-view reconstructor --------------------------------------------


def _p16_specs() -> list[HostileSpec]:
    """P16 Flex3D: cameras, volume rendering, ellipsoid scenes, reconstructor, curation, imperfect views."""
    from icml25.kernels.testing import Allow

    g = torch.Generator().manual_seed(16)
    scenes = gm.sample_ellipsoid_scenes(2, generator=g)
    cams = gm.orbit_cameras(torch.tensor([0.0, 70.0, 140.0, 210.0]), torch.tensor([10.0, -5.0, 20.0, 30.0]))
    cams = torch.stack([cams, cams.roll(1, 0)])  # (2, 4, 4, 4)
    images = scenes.render(cams, 8)

    def _model():
        with isolated_rng(0):
            return gm.FlexibleViewReconstructor(img_size=8, plane_res=4, dim=16, depth=1)

    def _forward():
        m = _model()
        return (lambda images, cams: m(images, cams).detach()), {"images": images, "cams": cams}, m

    def _render():
        m = _model()
        with torch.no_grad():
            tri = m(images, cams)
        return (lambda triplane, cams: m.render(triplane, cams).detach()), {"triplane": tri, "cams": cams}, m

    def _scores():
        m = _model()
        return (
            (lambda images, cams: gm.consistency_scores(images, cams, m)),
            {"images": images, "cams": cams},
            m,
        )

    dark = "a constant (e.g. black) image is a valid view"
    return [
        HostileSpec("opencv_to_opengl", gm.opencv_to_opengl, {"c2w": cams[0]}, ("c2w",),
                    {"c2w:empty:0": "no cameras: an empty result", "c2w:extra_dim": "(..., 4, 4): any batch shape"}),
        HostileSpec("look_at_cameras", gm.look_at_cameras, {"eye": cams[0, :, :3, 3].clone()}, ("eye",),
                    {"eye:empty:0": "no cameras: an empty result", "constant": "eye (c, c, c), c != 0, is a valid position"}),
        HostileSpec("orbit_cameras", gm.orbit_cameras,
                    {"azimuth_deg": torch.tensor([0.0, 45.0]), "elevation_deg": torch.tensor([5.0, 10.0])},
                    ("azimuth_deg", "elevation_deg"),
                    {"empty:0": "no cameras: an empty result", "azimuth_deg:huge": "angles wrap: finite",
                     "constant": "equal angles give equal cameras"}),
        HostileSpec("camera_rays", lambda c2w: gm.camera_rays(c2w, 4)[1], {"c2w": cams[0]}, ("c2w",),
                    {"c2w:extra_dim": "(..., 4, 4): any batch shape"}),
        HostileSpec("volume_render", lambda density, rgb: gm.volume_render(density, rgb, 0.1)[0],
                    {"density": torch.rand(3, 5, generator=g), "rgb": torch.rand(3, 5, 3, generator=g)},
                    ("density", "rgb"),
                    {"constant": "constant density and colour are a valid medium",
                     "huge": "an opaque sample: exp(-inf) = 0 transmittance, finite",
                     "empty:0": "no rays: an empty result", "density:empty:1": "no samples: black, opacity 0",
                     "rgb:huge": Allow("documented: colours are not range-checked (finite)", True),
                     "density:extra_dim": "(..., S): any batch shape"}),
        HostileSpec("EllipsoidScenes.render", lambda cams: scenes.render(cams, 4), {"cams": cams}, ("cams",),
                    covers=("EllipsoidScenes",)),
        HostileSpec("sample_ellipsoid_scenes", lambda n: gm.sample_ellipsoid_scenes(n, seed=0).centres, {"n": 2}, ()),
        HostileSpec("FlexibleViewReconstructor.forward", setup=_forward, arrays=("images", "cams"),
                    allow={"images:constant": dark}, covers=("FlexibleViewReconstructor",),
                    global_rng="constructing an nn.Module draws its initial weights (isolated here)"),
        HostileSpec("FlexibleViewReconstructor.render", setup=_render, arrays=("triplane", "cams"),
                    allow={"triplane:constant": "a constant tri-plane is a valid (homogeneous) field",
                           "triplane:huge": Allow("documented: densities saturate, colours stay in [0, 1]", True)},
                    covers=("FlexibleViewReconstructor",)),
        HostileSpec("consistency_scores", setup=_scores, arrays=("images", "cams"),
                    allow={"images:constant": "identical views: every score is the median's, finite"}),
        HostileSpec("curate_views", lambda scores: gm.curate_views(scores, 2), {"scores": torch.rand(2, 4, generator=g)},
                    ("scores",), {"posinf": "+inf marks an excluded view: ranked last",
                                  "constant": "ties keep the first views (stable sort)",
                                  "huge": "large scores rank like any others"}),
        HostileSpec("simulate_imperfect_views", lambda images: gm.simulate_imperfect_views(images, 0.5, seed=0)[0],
                    {"images": images}, ("images",),
                    {"constant": dark}),
    ]  # fmt: skip


SPECS += _p16_specs()

# ---- P41 Playmate --------------------------------------------------------------------------------------


def _p41_specs() -> list[HostileSpec]:
    """P41 Playmate: keypoints, motion codes, normaliser, stage-1 DiT, emotion branch, sampler, training."""
    k, t, a = 20, 6, 4
    faces = gm.SyntheticTalkingFaces(audio_dim=a, n_nuisance=2, seed=0)
    batch = faces.sample(4, t, seed=1)
    m = gm.unpack_motion(batch.codes, k)
    norm = gm.MotionNormalizer(k).fit(batch.codes)

    def _dit():
        return gm.AudioToMotionDiT(3 * k + 7, a, 3 * k, t, width=8, depth=1, heads=2, seed=0)

    dit = _dit()
    branch = gm.EmotionControlBranch(dit, faces.n_emotions, seed=0)
    x = torch.randn(4, t, 3 * k + 7, generator=torch.Generator().manual_seed(41))
    pose = {key: m[key] for key in ("rot", "trans", "scale")}

    def _fit():
        nm = gm.MotionNormalizer(k)
        return nm.fit, {"codes": batch.codes}, nm

    def _train1():
        net = _dit()

        def fn(codes, audio, ref, lr):
            return gm.train_stage1(net, norm, codes, audio, ref, steps=2, batch_size=2, lr=lr)[-1]

        return fn, {"codes": batch.codes, "audio": batch.audio, "ref": batch.ref, "lr": 1e-3}, net

    def _train2():
        net = _dit()
        br = gm.EmotionControlBranch(net, faces.n_emotions, seed=0)

        def fn(codes, audio, ref, emotion):
            return gm.train_stage2(br, net, norm, codes, audio, ref, emotion, steps=2, batch_size=2)[-1]

        return (
            fn,
            {"codes": batch.codes, "audio": batch.audio, "ref": batch.ref, "emotion": batch.emotion},
            br,
        )

    same = "constant keypoints / motion / audio are valid (degenerate) inputs with a finite answer"
    const = {"constant": same}
    return [
        HostileSpec("compose_keypoints", gm.compose_keypoints,
                    {"canonical": batch.ref[0].reshape(k, 3), "exp": m["exp"][0], "rot": m["rot"][0],
                     "trans": m["trans"][0], "scale": m["scale"][0]},
                    ("canonical", "exp", "rot", "trans", "scale"), allow=const),
        HostileSpec("pack_motion", lambda exp, rot, trans, scale: gm.pack_motion(
                        {"exp": exp, "rot": rot, "trans": trans, "scale": scale}),
                    {"exp": m["exp"], "rot": m["rot"], "trans": m["trans"], "scale": m["scale"]},
                    ("exp", "rot", "trans", "scale"), allow=const),
        HostileSpec("unpack_motion", lambda codes: gm.unpack_motion(codes, k), {"codes": batch.codes}, ("codes",),
                    allow=const),
        HostileSpec("mouth_opening", lambda exp: gm.mouth_opening(exp, 11, 12), {"exp": m["exp"]}, ("exp",),
                    allow=const),
        HostileSpec("MotionNormalizer.fit", setup=_fit, arrays=("codes",), covers=("MotionNormalizer",)),
        HostileSpec("MotionNormalizer.transform", norm.transform, {"codes": batch.codes}, ("codes",), allow=const,
                    covers=("MotionNormalizer",)),
        HostileSpec("MotionNormalizer.inverse_transform", norm.inverse_transform, {"z": x}, ("z",), allow=const,
                    covers=("MotionNormalizer",)),
        HostileSpec("AudioToMotionDiT.forward", lambda x, t, audio, ref: dit(x, t, audio, ref).detach(),
                    {"x": x, "t": 0.5, "audio": batch.audio, "ref": batch.ref}, ("x", "t", "audio", "ref"),
                    allow=const, covers=("AudioToMotionDiT",)),
        HostileSpec("guided_velocity", lambda x, audio, ref, emotion, cfg_audio, cfg_emotion: gm.guided_velocity(
                        dit, x, 0.5, audio, ref, branch=branch, emotion=emotion, cfg_audio=cfg_audio,
                        cfg_emotion=cfg_emotion).detach(),
                    {"x": x, "audio": batch.audio, "ref": batch.ref, "emotion": batch.emotion, "cfg_audio": 2.0,
                     "cfg_emotion": 2.0}, ("x", "audio", "ref", "emotion", "cfg_audio", "cfg_emotion"),
                    allow=const, covers=("guided_velocity", "EmotionControlBranch")),
        HostileSpec("sample_motion", lambda audio, ref, pose, steps: gm.sample_motion(
                        dit, audio, ref, normalizer=norm, pose=pose, steps=steps, seed=0),
                    {"audio": batch.audio, "ref": batch.ref, "pose": pose, "steps": 2},
                    ("audio", "ref", ("pose", "rot"), ("pose", "scale"), "steps"), allow=const),
        HostileSpec("train_stage1", setup=_train1, arrays=("codes", "audio", "ref", "lr"), allow=const),
        HostileSpec("train_stage2", setup=_train2, arrays=("codes", "audio", "ref", "emotion"), allow=const),
        HostileSpec("SyntheticTalkingFaces", lambda n: gm.SyntheticTalkingFaces(seed=0).sample(n, 5).codes,
                    {"n": 3}, ("n",)),
    ]  # fmt: skip


SPECS += _p41_specs()


def _p17_specs() -> list[HostileSpec]:
    """P17 NPISeg3D: NP and deterministic heads, uncertainty, segmenter predict/fit, clicks, metrics, scenes."""
    g = torch.Generator().manual_seed(17)
    with isolated_rng(0):
        head = gm.HierarchicalNPHead(dim=8, n_samples=3, heads=2)
        det = gm.ClickAttentionHead(dim=8)
    obj = torch.tensor([0, 1, 2, 1])
    feats = {"point_feats": torch.randn(12, 8, generator=g), "click_feats": torch.randn(4, 8, generator=g)}
    pts, lab = gm.make_scene(96, seed=0)
    clicks = gm.simulate_clicks(pts, lab, k=8)
    pred = lab.copy()
    pred[np.flatnonzero(lab == 1)[:5]] = 0
    rng = np.random.default_rng(17)
    const_feats = "constant features are valid: every point ties and gets a finite logit"

    def _seg():
        with isolated_rng(0):
            return gm.InteractiveSegmenter(dim=8, rounds=1, n_samples=2, k=8, heads=2)

    def _predict():
        seg = _seg()
        return (lambda points: seg.predict(points, clicks)[1]), {"points": pts}, None

    def _fit():
        seg = _seg()
        scenes = [(pts, lab)]
        return (lambda scenes: seg.fit(scenes, steps=1)), {"scenes": scenes}, seg

    return [
        HostileSpec("HierarchicalNPHead", lambda point_feats, click_feats: head(
                    point_feats, click_feats, obj, generator=torch.Generator().manual_seed(0)).logits.detach(),
                    feats, ("point_feats", "click_feats"), allow={"constant": const_feats}),
        HostileSpec("ClickAttentionHead", lambda point_feats, click_feats: det(
                    point_feats, click_feats, obj).logits.detach(),
                    feats, ("point_feats", "click_feats"), allow={"constant": const_feats}),
        HostileSpec("predictive_uncertainty", gm.predictive_uncertainty,
                    {"logits": torch.randn(5, 3, 4, generator=g)}, ("logits",),
                    allow={"constant": "identical samples: zero uncertainty"}),
        HostileSpec("InteractiveSegmenter.predict", setup=_predict, arrays=("points",),
                    covers=("InteractiveSegmenter",)),
        HostileSpec("InteractiveSegmenter.fit", setup=_fit, arrays=(("scenes", 0, 0), ("scenes", 0, 1))),
        HostileSpec("simulate_clicks", lambda points, gt_labels, pred_labels: [
                    (c.index, c.label) for c in gm.simulate_clicks(points, gt_labels, pred_labels, k=8)],
                    {"points": pts, "gt_labels": lab, "pred_labels": pred}, ("points", "gt_labels", "pred_labels"),
                    allow={"gt_labels:constant": "one label: one click at its most interior point",
                           "pred_labels:constant": "a constant prediction is a valid prediction"}),
        HostileSpec("object_ious", gm.object_ious, {"pred_labels": pred, "gt_labels": lab},
                    ("pred_labels", "gt_labels"),
                    allow={"pred_labels:constant": "a constant prediction is a valid prediction"}),
        HostileSpec("noc_at", gm.noc_at, {"iou_curve": rng.uniform(0.3, 1.0, (4, 5))}, ("iou_curve",),
                    allow={"constant": "constant IoUs: every object needs the same clicks"}),
        HostileSpec("uncertainty_auroc", gm.uncertainty_auroc,
                    {"uncertainty": rng.random(30), "errors": rng.random(30) < 0.4}, ("uncertainty", "errors"),
                    allow={"uncertainty:constant": "constant uncertainty ranks nothing: AUROC 0.5",
                           "uncertainty:huge": "only the ranks matter"}),
        HostileSpec("expected_calibration_error", gm.expected_calibration_error,
                    {"confidence": rng.uniform(0.3, 1.0, 30), "correct": rng.random(30) < 0.7},
                    ("confidence", "correct"),
                    allow={"confidence:constant": "one confidence level: a single bin",
                           "correct:constant": "all right or all wrong: |accuracy - mean confidence|"}),
        HostileSpec("make_scene", lambda n_points: gm.make_scene(n_points, seed=0)[0], {"n_points": 128}, ()),
    ]  # fmt: skip


SPECS += _p17_specs()


EXCLUDED = {
    "Geo2SeqDecodeError": "an exception class (raised by decode), not a user entry point",
    "Geo2SeqEncoding": "a result container built by tokenize_molecule, not a user entry point",
    "MatchResult": "a result container built by match_tokens, not a user entry point",
    "RestoreInfo": "a result container built by reduce_tokens, not a user entry point",
    "TokenSplit": "a result container built by spatiotemporal_split, not a user entry point",
    "apply_asymrnr": "needs diffusers: its bad inputs are tested with a real CogVideoX in test_asymrnr_diffusers.py",
    "remove_asymrnr": "needs diffusers: exercised with a real CogVideoX in test_asymrnr_diffusers.py",
    "asymrnr_step_callback": "needs diffusers: exercised with a real CogVideoX in test_asymrnr_diffusers.py",
    "calibrate_asymrnr": "needs diffusers: exercised with a real CogVideoX in test_asymrnr_diffusers.py",
    "DiffusersUNetNet": "needs diffusers: exercised with a real UNet2DModel in test_vct_diffusers.py",
    "RolloutResult": "a result container built by thermalized_rollout, not a user entry point",
    "TrainResult": "a result container returned by train_flow, not a user entry point",
    "K2VAEOutput": "a result container returned by K2VAE.forward, not a user entry point",
    "FacebookMAEAdapter": "wraps a user's models_mae module: exercised in test_visionts.py",
    "load_vit_mae": "loads a local transformers checkpoint directory: no arrays to corrupt",
    "MolJOSample": "a result container returned by moljo_sample / bfn_sample, not a user entry point",
    "DMPGraph": "a result container built by build_dmp_graph, not a user entry point",
    "imts_from_long": "reads a pandas DataFrame's columns: its bad inputs are tested in test_vimts.py",
    "Click": "a frozen (index, label) record built by simulate_clicks or the user, not an entry point",
    "NPOut": "a result container returned by the NPISeg3D heads, not a user entry point",
}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_hostile_inputs(spec: HostileSpec) -> None:
    print(spec.check().summary())


def test_registry_covers_public_api() -> None:
    print("icml25.generative_models covers", kt.assert_covers(gm, SPECS, EXCLUDED))


# ---- the issue's cases (one test each) and "a rejected fit loses nothing" -----------------------------


def test_thermalizer_fit_rejects_nan_and_keeps_state() -> None:
    th = _thermalizer().fit(_SNAP, **_FIT)
    before = kt.snapshot_state(th)
    bad = _SNAP.clone()
    bad[3, 2] = float("nan")
    with pytest.raises(
        ValueError,
        match=r"snapshots must be finite \(no NaN or inf\), got 1 NaN and 0 inf values .* shape \(16, 8\)",
    ):
        th.fit(bad, **_FIT)
    assert kt.states_equal(before, kt.snapshot_state(th))


def test_thermalizer_fit_rejects_constant_data() -> None:
    th = _thermalizer()
    before = kt.snapshot_state(th)
    with pytest.raises(ValueError, match=r"snapshots must not be constant, got std=0.0"):
        gm.Thermalizer(MLP(8, 8), MLP(8, 10), T=10).fit(torch.ones(16, 8), n_iter=3, batch_size=4)
    with pytest.raises(ValueError, match="snapshots must not be constant"):
        th.fit(torch.ones(16, 8), n_iter=3, batch_size=4)
    assert kt.states_equal(before, kt.snapshot_state(th))


def test_thermalizer_fit_rejects_empty_data() -> None:
    with pytest.raises(ValueError, match=r"snapshots must not be empty, got .* shape \(0, 8\)"):
        _thermalizer().fit(torch.empty(0, 8), **_FIT)


def test_thermalizer_level_head_class_count_is_checked() -> None:
    with pytest.raises(ValueError, match=r"level_head must output T=10 logits .* out_features=7"):
        gm.Thermalizer(MLP(8, 8), MLP(8, 7), T=10)

    class Head(torch.nn.Module):  # last layer not an nn.Linear: caught at fit time, before any change
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 7)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(x))

        def extra_repr(self) -> str:
            return ""

    head = Head()
    head.act = torch.nn.Tanh()  # the last registered leaf is not a Linear: the constructor cannot tell
    th = gm.Thermalizer(MLP(8, 8), head, T=10)
    before = kt.snapshot_state(th)
    with pytest.raises(
        ValueError, match=r"level_head must return logits of shape \(B, T\) = \(2, 10\), got \(2, 7\)"
    ):
        th.fit(_SNAP, **_FIT)
    assert kt.states_equal(before, kt.snapshot_state(th))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_thermalizer_noise_level_rejects_non_finite_states(value: float) -> None:
    th = _thermalizer().fit(_SNAP, **_FIT)
    x = _SNAP[:3].clone()
    x[1, 4] = value
    with pytest.raises(ValueError, match="x must be finite"):
        th.noise_level(x)
    assert th.noise_level(_SNAP[:3]).shape == (3,)


def test_emulator_rejected_fit_keeps_state() -> None:
    _, _, em = _fitted_emulator()
    before = kt.snapshot_state(em)
    with pytest.raises(ValueError, match="trajectories must not be constant"):
        em.fit(torch.ones(2, 8, 8), **_FIT)
    assert kt.states_equal(before, kt.snapshot_state(em))


def test_tarflow_rejected_loss_keeps_parameters() -> None:
    model = _tarflow()
    before = kt.snapshot_state(model)
    bad = _IMG.clone()
    bad[0, 0, 1, 1] = float("nan")
    with pytest.raises(ValueError, match="x must be finite"):
        gm.tarflow_loss(model, bad)
    assert kt.states_equal(before, kt.snapshot_state(model))


# ---- P18 CM² copula fusion ----------------------------------------------------------------------------

_LU = torch.tensor([-0.5, -1.2, -0.1, -3.0], dtype=torch.float64)
_LV = torch.tensor([-0.2, -2.0, -0.7, -0.05], dtype=torch.float64)
_H3 = torch.randn(4, 3, generator=_g)
_CM_X = np.random.default_rng(0).normal(size=(24, 5))
_CM_X[::3, 2:] = np.nan  # B missing in every third row
_CM_Y = np.arange(24) % 2
CLAMPED = "log u = -inf (u = 0) and huge negative log u are clamped to [-50, -1e-7] by design: finite"
CONST_CM = "constant inputs are valid: the density/embedding is finite"


def _cm_joint() -> gm.CopulaJoint:
    return gm.CopulaJoint(3, 3, n_components=2, seed=0)


def _cm_net_forward():
    torch.manual_seed(0)
    net = gm.CopulaFusionNet(torch.nn.Linear(3, 4), torch.nn.Linear(2, 4), 4, seed=0)
    b_p = torch.tensor([True, False, True, True])
    return (lambda x_a, x_b: net(x_a, x_b, None, b_p)["logits"]), {"x_a": _H3, "x_b": _H3[:, :2]}, None


def _cm_classifier() -> gm.CopulaFusionClassifier:
    return gm.CopulaFusionClassifier(
        n_features_a=2, embed_dim=3, hidden=4, n_layers=1, epochs=2, batch_size=8
    )


def _cm_fit():
    est = _cm_classifier()
    return est.fit, {"X": _CM_X, "y": _CM_Y}, _FittedView(est, "net_", ("mean_", "scale_"))


def _cm_predict():
    est = _cm_classifier().fit(_CM_X, _CM_Y)
    return est.predict_proba, {"X": _CM_X}, _FittedView(est, "net_", ("mean_", "scale_"))


def _p18_specs() -> list[HostileSpec]:
    log_uv = {"neginf": CLAMPED, "huge": CLAMPED, "constant": CONST_CM}
    return [
        HostileSpec("copula_log_density", lambda log_u, log_v: gm.copula_log_density("gumbel", log_u, log_v, 2.0),
                    {"log_u": _LU, "log_v": _LV}, ("log_u", "log_v"), allow=log_uv),
        HostileSpec("copula_log_cdf", lambda log_u, log_v: gm.copula_log_cdf("clayton", log_u, log_v, 1.5),
                    {"log_u": _LU, "log_v": _LV}, ("log_u", "log_v"), allow=log_uv),
        HostileSpec("BivariateCopula.log_density",
                    lambda log_u, log_v: gm.BivariateCopula("frank", 4.0).log_density(log_u, log_v),
                    {"log_u": _LU, "log_v": _LV}, ("log_u", "log_v"), allow=log_uv, covers=("BivariateCopula",)),
        HostileSpec("sample_gumbel_copula", gm.sample_gumbel_copula, {"n": 5, "theta": 2.0, "seed": 0},
                    ("theta",)),
        HostileSpec("GaussianMixtureMarginal.log_prob",
                    lambda h: gm.GaussianMixtureMarginal(3, 2, seed=0).log_prob(h), {"h": _H3}, ("h",),
                    allow={"constant": CONST_CM}, covers=("GaussianMixtureMarginal",)),
        HostileSpec("CopulaJoint.forward", lambda h_a, h_b: _cm_joint()(h_a, h_b), {"h_a": _H3, "h_b": _H3 + 1},
                    ("h_a", "h_b"), allow={"constant": CONST_CM}, covers=("CopulaJoint",)),
        HostileSpec("CopulaJoint.impute", lambda h_obs: _cm_joint().impute(h_obs, "B"), {"h_obs": _H3},
                    ("h_obs",), allow={"constant": CONST_CM}, covers=("CopulaJoint",)),
        HostileSpec("CopulaFusionNet.forward", setup=_cm_net_forward, arrays=("x_a", "x_b"),
                    allow={"constant": CONST_CM}, covers=("CopulaFusionNet",)),
        HostileSpec("CopulaFusionClassifier.fit", setup=_cm_fit, arrays=("X",),
                    allow={"constant": "constant features are valid: standardisation falls back to scale 1"},
                    covers=("CopulaFusionClassifier",)),
        HostileSpec("CopulaFusionClassifier.predict_proba", setup=_cm_predict, arrays=("X",),
                    allow={"constant": "constant features get finite probabilities"},
                    covers=("CopulaFusionClassifier",)),
    ]  # fmt: skip


SPECS += _p18_specs()  # extends the registry in place: pytest reads it at collection time


def test_copula_classifier_rejected_fit_keeps_state() -> None:
    est = _cm_classifier().fit(_CM_X, _CM_Y)
    view = _FittedView(est, "net_", ("mean_", "scale_"))
    before = kt.snapshot_state(view)
    bad = _CM_X.copy()
    bad[1, 0] = np.inf
    with pytest.raises(ValueError, match="Input X contains infinity"):
        est.fit(bad, _CM_Y)
    assert kt.states_equal(before, kt.snapshot_state(view))


# ---------------------------------------------------------------------------- issue 81 (bad input round 2)
def test_thermalizer_noise_level_on_a_wrongly_shaped_state_names_x() -> None:
    th = _thermalizer()  # not fitted: no event shape recorded yet, the level head decides
    with pytest.raises(ValueError, match=r"^x of shape \(3, 5\) does not fit level_head"):
        th.noise_level(torch.randn(3, 5))
    fitted = _fitted_thermalizer()[2]
    with pytest.raises(ValueError, match=r"^x must have shape \(B, 8\), got \(3, 5\)"):
        fitted.noise_level(torch.randn(3, 5))


@pytest.mark.parametrize("simulate", [gm.ks_simulate, gm.lorenz96_simulate])
def test_simulators_reject_a_negative_or_fractional_spinup(simulate) -> None:
    # lorenz96_simulate used to run range(spinup * substeps) unchecked: -1 silently skipped the spin-up
    with pytest.raises(ValueError, match=r"^spinup must be an int >= 0, got -1$"):
        simulate(n_steps=2, n_traj=1, spinup=-1)
    with pytest.raises(TypeError, match=r"^spinup must be an int >= 0, got float 1.5$"):
        simulate(n_steps=2, n_traj=1, spinup=1.5)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_field_std_must_be_positive_and_finite(bad: float) -> None:
    with pytest.raises(ValueError, match=r"^field_std must be a finite float in \(0.0, inf\)"):
        gm.Thermalizer(MLP(8, 8, hidden=16), MLP(8, 10, hidden=16), T=10, field_std=bad)
    with pytest.raises(ValueError, match=r"^field_std must be a finite float in \(0.0, inf\)"):
        gm.ResidualEmulator(MLP(8, 8, hidden=16), field_std=bad)
    with pytest.raises(ValueError, match=r"^field_mean must be a finite float"):
        gm.Thermalizer(MLP(8, 8, hidden=16), MLP(8, 10, hidden=16), T=10, field_mean=float("nan"))


def test_copula_classifier_predict_before_fit_is_sklearns_not_fitted_error() -> None:
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError, match="This CopulaFusionClassifier instance is not fitted yet"):
        gm.CopulaFusionClassifier().predict(_CM_X)


# ---- issue 81, round 2: the silent results and confusing crashes of flex3d, geo2seq and the SO(3) helpers


@pytest.mark.parametrize("delta", [-0.1, 0.0, float("nan"), float("inf")])
def test_volume_render_rejects_a_non_positive_or_non_finite_spacing(delta: float) -> None:
    density, rgb = torch.rand(3, 5), torch.rand(3, 5, 3)
    with pytest.raises(ValueError, match=r"delta must be a finite float in \(0, inf\)"):
        gm.volume_render(density, rgb, delta)


def test_volume_render_checks_a_tensor_spacing() -> None:
    density, rgb = torch.rand(3, 5), torch.rand(3, 5, 3)
    with pytest.raises(
        ValueError, match=r"delta must broadcast to density's shape \(3, 5\), got shape \(4,\)"
    ):
        gm.volume_render(density, rgb, torch.full((4,), 0.1))
    with pytest.raises(ValueError, match="delta must be non-negative"):
        gm.volume_render(density, rgb, torch.tensor([0.1, 0.1, -0.1, 0.1, 0.1]))
    with pytest.raises(ValueError, match="delta must be finite"):
        gm.volume_render(density, rgb, torch.tensor(float("nan")))
    # A per-sample spacing that broadcasts is the documented form: the same as the float.
    colour, opacity = gm.volume_render(density, rgb, torch.full((5,), 0.1))
    ref_colour, ref_opacity = gm.volume_render(density, rgb, 0.1)
    assert torch.allclose(colour, ref_colour) and torch.allclose(opacity, ref_opacity)


@pytest.mark.parametrize("tol", [float("nan"), -5.0, 90.0, float("inf")])
def test_to_spherical_rejects_a_collinearity_tolerance_outside_0_90(tol: float) -> None:
    pos = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    with pytest.raises(ValueError, match=r"collinear_tol_deg must be a finite float in \[0, 90\)"):
        gm.to_spherical(pos, collinear_tol_deg=tol)
    with pytest.raises(ValueError, match=r"collinear_tol_deg must be a finite float in \[0, 90\)"):
        gm.molecule_frame(pos, collinear_tol_deg=tol)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32"])
def test_haar_rotations_refuses_a_non_floating_dtype(dtype: object) -> None:
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch\.dtype"):
        gm.haar_rotations(2, dtype=dtype)


def test_kabsch_rotation_checks_its_mask() -> None:
    A = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"mask must have shape \(2, 5\)"):
        gm.kabsch_rotation(A, A, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        gm.kabsch_rotation(A, A, torch.ones(2, 5))
    R = gm.kabsch_rotation(A, A, torch.ones(2, 5, dtype=torch.bool))
    assert torch.allclose(R, torch.eye(3).expand(2, 3, 3), atol=1e-5)


@pytest.mark.parametrize("bad", [0.5, -1.0, 2.0, float("nan")])
def test_imts_masked_mse_refuses_a_mask_that_is_not_0_or_1(bad: float) -> None:
    """Issue 81 items 4-5: a 0.5 mask weighted the error and a -1 mask gave -0.0; both are refused now."""
    pred, target = torch.ones(2, 4, 3), torch.zeros(2, 4, 3)
    mask = torch.ones(2, 4, 3)
    mask[0, 0, 0] = bad
    with pytest.raises(ValueError, match="mask must be boolean or hold only 0 and 1"):
        gm.imts_masked_mse(pred, target, mask)
    # 0/1 floats, ints and bools give the same value
    ok = torch.ones(2, 4, 3)
    ok[0, 0, 0] = 0.0
    ref = gm.imts_masked_mse(pred, target, ok)
    assert torch.equal(gm.imts_masked_mse(pred, target, ok.bool()), ref)
    assert torch.equal(gm.imts_masked_mse(pred, target, ok.long()), ref)


def test_imts_masked_mse_names_the_argument_of_a_wrong_kind_or_shape() -> None:
    """Through icml25.kernels.checks: a wrong kind names its argument (was one message for all three)."""
    pred, target, mask = torch.ones(2, 4, 3), torch.zeros(2, 4, 3), torch.ones(2, 4, 3)
    with pytest.raises(TypeError, match=r"^target must be a torch\.Tensor, got numpy\.ndarray"):
        gm.imts_masked_mse(pred, target.numpy(), mask)
    with pytest.raises(TypeError, match=r"^mask must be a torch\.Tensor, got list"):
        gm.imts_masked_mse(pred, target, mask.tolist())
    with pytest.raises(
        ValueError, match=r"^pred, target and mask must share a shape, got \(2, 4, 3\), \(2, 4\), "
    ):
        gm.imts_masked_mse(pred, target[..., 0], mask)
    with pytest.raises(TypeError, match=r"^mask must be a bool or int or float tensor, got .*complex64"):
        gm.imts_masked_mse(pred, target, mask.to(torch.complex64))


@pytest.mark.parametrize("ratio", [1.0, -0.1, float("nan")])
def test_vimts_mask_ratio_outside_0_1_is_refused_with_its_range(ratio: float) -> None:
    with pytest.raises(ValueError, match=r"^mask_ratio must be a finite float in \[0\.0, 1\.0\), got "):
        _p35_model().ssl_loss(_p35_batch(), ratio)
