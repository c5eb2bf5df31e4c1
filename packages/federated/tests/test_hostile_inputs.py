"""Hostile-input contract of icml25.federated (CONTRIBUTING.md, "Bad input contract").

P50 FedCEO and P10 FedGO: every public callable is registered with a valid example call; :mod:`icml25.kernels.testing`
derives the hostile variants and asserts a clear error or a documented, finite result.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import icml25.federated as fd
from icml25.kernels import testing as kt
from icml25.kernels.testing import HostileSpec

_g = torch.Generator().manual_seed(0)
_STATES = [{"w": torch.randn(3, 4, generator=_g), "b": torch.randn(4, generator=_g)} for _ in range(3)]
_M = torch.randn(4, 3, generator=_g)
CONST_OK = "constant parameters are valid: the result is finite"
RNG = np.random.default_rng(0)

SPECS = [
    HostileSpec(
        "fedceo_smooth",
        lambda client_states, tau: fd.fedceo_smooth(client_states, tau),
        {"client_states": _STATES, "tau": 0.1},
        (("client_states", 0, "w"), ("client_states", 1, "b"), "tau"),
        allow={
            "constant": CONST_OK,
            "huge": "t-SVT of finite parameters is finite (float64 inside)",
            "dtype": "documented: non-float entries (e.g. BatchNorm counters) are left as uploaded",
        },
    ),
    HostileSpec(
        "check_client_states",
        lambda client_states: fd.check_client_states(client_states),
        {"client_states": _STATES},
        (("client_states", 0, "w"), ("client_states", 2, "b")),
        allow={
            "constant": CONST_OK,
            "huge": "large finite parameters are valid states: returned as given",
            "dtype": "documented: non-float entries (e.g. BatchNorm counters) are not checked for NaN",
        },
    ),
    HostileSpec(
        "check_uploads",
        fd.check_uploads,
        {"uploads": dict(enumerate(_STATES))},
        (("uploads", 1, "w"),),
        allow={
            "constant": CONST_OK,
            "huge": "large finite parameters are valid uploads: returned as given",
            "dtype": "documented: non-float entries (e.g. BatchNorm counters) are not checked for NaN",
        },
    ),
    HostileSpec(
        "tsvt",
        fd.tsvt,
        {"x": torch.randn(3, 4, 2, generator=_g), "tau": 0.1},
        ("x", "tau"),
        allow={
            "constant": CONST_OK,
            "empty": "an empty tensor has nothing to threshold: returned as a copy",
            "huge": "float64 inside: finite",
        },
    ),
    HostileSpec(
        "svt",
        fd.svt,
        {"a": _M, "tau": 0.1},
        ("a", "tau"),
        allow={
            "constant": CONST_OK,
            "empty": "an empty matrix is returned as a copy",
            "extra_dim": "[..., n1, n2]: batched",
            "huge": "finite",
        },
    ),
    HostileSpec(
        "matricize",
        lambda p: fd.matricize(p)[0],
        {"p": _M},
        ("p",),
        allow={
            "nan": kt.Allow("a pure reshape: values are not inspected", False),
            "posinf": kt.Allow("a pure reshape", False),
            "neginf": kt.Allow("a pure reshape", False),
            "empty": "a zero-size parameter is a zero-size matrix",
            "dtype": "any dtype reshapes",
            "extra_dim": "any shape matricizes",
            "missing_dim": "any shape matricizes",
            "constant": CONST_OK,
            "huge": "a pure reshape",
        },
    ),
    HostileSpec(
        "noise_threshold", fd.noise_threshold, {"noise_std": 0.1, "m": 3, "shape": (4, 3)}, ("noise_std",)
    ),
    HostileSpec(
        "tau_schedule",
        fd.tau_schedule,
        {"round_idx": 3, "lam": 0.1, "theta": 1.04, "interval": 2},
        ("lam", "theta"),
    ),
    HostileSpec(
        "FedCEOConfig",
        fd.FedCEOConfig,
        {"lam": 0.1, "theta": 1.04},
        ("lam", "theta"),
        covers=("FedCEOConfig", "FedCEOAggregator", "FedAvgAggregator"),
    ),
    HostileSpec(
        "clip_update",
        fd.clip_update,
        {"delta": {"w": _M}, "clip": 1.0},
        (("delta", "w"), "clip"),
        allow={
            "constant": CONST_OK,
            "empty": "an empty update has norm 0",
            "extra_dim": "any shape",
            "missing_dim": "any shape",
            "huge": "clipping brings it to norm <= clip",
            "dtype": "documented: only float tensors are clipped; integer entries are copied",
            "clip:posinf": "clip = inf: no clipping (the update is returned unchanged)",
        },
    ),
    HostileSpec(
        "DPConfig",
        fd.DPConfig,
        {"mode": "user", "noise_multiplier": 1.0, "clip": 1.0, "delta": 1e-5},
        ("noise_multiplier", "clip", "delta"),
    ),
    HostileSpec(
        "RDPAccountant.step",
        lambda sample_rate: fd.RDPAccountant().step(1.0, sample_rate),
        {"sample_rate": 0.1},
        ("sample_rate",),
        covers=("RDPAccountant",),
    ),
    HostileSpec(
        "dirichlet_split",
        lambda labels, alpha: fd.dirichlet_split(labels, 3, alpha, np.random.default_rng(0)),
        {"labels": RNG.integers(0, 3, 30), "alpha": 0.5},
        ("labels", "alpha"),
        allow={
            "constant": "one class only is a valid (degenerate) label vector",
            "dtype": "string class labels are valid labels",
        },
    ),
    HostileSpec(
        "load_federated_arrays",
        lambda x, y: fd.load_federated_arrays(x, y, n_clients=2),
        {"x": RNG.normal(size=(40, 4)), "y": RNG.integers(0, 2, 40)},
        ("x", "y"),
        allow={
            "y:constant": "one class only is valid",
            "x:constant": "constant features are valid",
            "x:extra_dim": "documented: x [n, *image] is flattened to [n, d]",
        },
    ),
    HostileSpec(
        "iid_split",
        lambda n_samples: fd.iid_split(n_samples, 3, np.random.default_rng(0)),
        {"n_samples": 30},
        (),
    ),
    HostileSpec("make_mlp", fd.make_mlp, {"n_in": 4, "hidden": 8, "n_out": 2, "seed": 0}, ()),
    HostileSpec(
        "per_sample_clipped_sum",
        lambda x, y: fd.per_sample_clipped_sum(
            fd.make_mlp(4, 8, 3, seed=0), torch.nn.functional.cross_entropy, x, y, 1.0
        ),
        {"x": torch.randn(6, 4, generator=_g), "y": torch.tensor([0, 1, 2, 0, 1, 2])},
        ("x", "y"),
        allow={
            "x:constant": "identical samples are a valid batch: finite clipped gradients",
            "y:constant": "one class only is a valid batch",
        },
    ),
]
# ---------------------------------------------------------------------------------------------- P10 FedGO
_K, _B, _C = 3, 5, 4
_LOGITS = torch.randn(_K, _B, _C, generator=_g)
_DISC = torch.randn(_K, _B, generator=_g)
_W = torch.softmax(torch.randn(_K, _B, generator=_g), 0)
_N = torch.tensor([10.0, 20.0, 30.0])
_X = torch.randn(12, 3, generator=_g)
_Y = torch.tensor([0, 1, 2, 3] * 3)
_GEN = fd.GaussianGenerator().fit(torch.randn(40, 3, generator=_g))
FINITE_LOGITS = "any finite logits are valid: the weights/labels are finite (log-space softmax)"
CONST_X = "identical samples are a valid (degenerate) data set: the result is finite"

SPECS += [
    HostileSpec(
        "fedgo_weights",
        fd.fedgo_weights,
        {"disc_logits": _DISC, "n_samples": _N},
        ("disc_logits", "n_samples"),
        allow={
            "disc_logits:constant": "equal logits: the size weights n_k / sum(n)",
            "n_samples:constant": "equal client sizes are valid",
            "disc_logits:huge": FINITE_LOGITS,
            "n_samples:huge": "only relative sizes matter (log n in float64)",
            "n_samples:dtype": "integer client sizes are valid",
        },
    ),
    HostileSpec(
        "ensemble_weights",
        lambda client_logits, disc_logits: fd.ensemble_weights(
            "fedgo", client_logits, _N, disc_logits=disc_logits
        ),
        {"client_logits": _LOGITS, "disc_logits": _DISC},
        ("client_logits", "disc_logits"),
        allow={"constant": FINITE_LOGITS, "huge": FINITE_LOGITS},
    ),
    HostileSpec(
        "ensemble_weights(entropy)",
        lambda client_logits: fd.ensemble_weights("entropy", client_logits, _N),
        {"client_logits": _LOGITS},
        ("client_logits",),
        allow={"constant": FINITE_LOGITS, "huge": FINITE_LOGITS},
    ),
    HostileSpec(
        "ensemble_pseudo_labels",
        fd.ensemble_pseudo_labels,
        {"client_logits": _LOGITS, "weights": _W},
        ("client_logits", "weights"),
        allow={"client_logits:constant": FINITE_LOGITS, "client_logits:huge": FINITE_LOGITS},
    ),
    HostileSpec(
        "weight_entropy",
        fd.weight_entropy,
        {"weights": _W},
        ("weights",),
        allow={"constant": "any non-negative weights have a finite entropy", "huge": "finite (float64)"},
    ),
    HostileSpec(
        "client_moments",
        lambda x: fd.client_moments(x)[1:],
        {"x": _X},
        ("x",),
        allow={"constant": CONST_X, "huge": "float64 sums of 1e30-scale values are finite"},
    ),
    HostileSpec(
        "GaussianGenerator.fit",
        lambda x: fd.GaussianGenerator().fit(x).state_dict(),
        {"x": _X},
        ("x",),
        allow={
            "constant": "constant data: the covariance is the ridge (full support kept)",
            "huge": "centred float64 moments: finite",
        },
        covers=("GaussianGenerator",),
    ),
    HostileSpec(
        "train_discriminator",
        lambda local_x: fd.train_discriminator(
            fd.make_discriminator(3, 8, seed=0), local_x, _GEN, epochs=1
        ).state_dict(),
        {"local_x": _X},
        ("local_x",),
        allow={"constant": CONST_X},
        known={
            "local_x:huge": "1e30 inputs overflow the discriminator's float32 activations (gradients NaN)"
        },
        covers=("train_discriminator", "make_discriminator"),
    ),
    HostileSpec(
        "discriminator_logits",
        lambda x: fd.discriminator_logits([fd.make_discriminator(3, 8, seed=0)], x),
        {"x": _X},
        ("x",),
        allow={"constant": CONST_X, "huge": "a ReLU MLP of finite float32 inputs below 1e38 is finite"},
    ),
    HostileSpec(
        "predict_logits",
        lambda x: fd.predict_logits([fd.make_mlp(3, 8, 4, seed=0)], x),
        {"x": _X},
        ("x",),
        allow={"constant": CONST_X, "huge": "a ReLU MLP of finite float32 inputs below 1e38 is finite"},
    ),
    HostileSpec(
        "fit_classifier",
        lambda x, y: fd.fit_classifier(fd.make_mlp(3, 8, 4, seed=0), x, y, epochs=1).state_dict(),
        {"x": _X, "y": _Y},
        ("x", "y"),
        allow={"x:constant": CONST_X, "y:constant": "one class only is a valid label vector"},
        known={"x:huge": "1e30 inputs overflow the MLP's float32 activations (gradients NaN)"},
    ),
    HostileSpec(
        "distill",
        lambda unlabeled, targets: fd.distill(
            fd.make_mlp(3, 8, 4, seed=0), unlabeled, targets, steps=2
        ).state_dict(),
        {"unlabeled": _X, "targets": torch.softmax(torch.randn(12, 4, generator=_g), -1)},
        ("unlabeled", "targets"),
        allow={"unlabeled:constant": CONST_X, "targets:constant": "uniform soft labels are valid targets"},
        known={"unlabeled:huge": "1e30 inputs overflow the student's float32 activations (gradients NaN)"},
    ),
    HostileSpec(
        "weighted_mean_state",
        lambda n_samples: fd.weighted_mean_state(_STATES, n_samples),
        {"n_samples": [1.0, 2.0, 3.0]},
        (),
    ),
    HostileSpec(
        "FedGOConfig",
        fd.FedGOConfig,
        {"distill_lr": 1e-3, "disc_lr": 1e-3, "disc_weight_decay": 1e-3},
        ("distill_lr", "disc_lr", "disc_weight_decay"),
    ),
    HostileSpec(
        "FedGOAggregator",
        lambda unlabeled: (
            fd.FedGOAggregator(fd.FedGOConfig(), lambda: fd.make_mlp(3, 8, 4), unlabeled).unlabeled
        ),
        {"unlabeled": _X},
        ("unlabeled",),
        allow={"constant": CONST_X, "huge": "stored as given; the distillation is where it is consumed"},
    ),
]


def _p14_layer() -> fd.SelectableLoRALinear:
    torch.manual_seed(0)
    layer = fd.SelectableLoRALinear(torch.nn.Linear(4, 3), r=2, alpha=4)
    layer.add_task("a", seed=0)
    layer.train()
    return layer


def _p14_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


SPECS += [
    # P14 presentative-feature PEFT-block selection
    HostileSpec(
        "routing_weights",
        lambda features, means: fd.routing_weights(features, means, top_k=None),
        {"features": torch.randn(5, 3, generator=_g), "means": torch.randn(4, 3, generator=_g)},
        ("features", "means"),
        allow={
            "constant": "identical features or means are valid: equal distances give uniform / tied weights",
            "huge": "float64 distances of 1e30 are finite and so is their softmax",
            "empty": "no instances (B = 0) route to nothing: a (0, K) result",
        },
    ),
    HostileSpec(
        "masked_mean",
        lambda x: fd.masked_mean(x, torch.ones(2, 4, dtype=torch.bool)),
        {"x": torch.randn(2, 4, 3, generator=_g)},
        ("x",),
        allow={"constant": "the mean of a constant is that constant", "huge": "finite"},
    ),
    HostileSpec(
        "RunningDiagGaussian",
        lambda x: fd.RunningDiagGaussian(3).update(x).mean,
        {"x": torch.randn(6, 3, generator=_g)},
        ("x",),
        allow={"constant": "a constant stream has zero variance: finite", "huge": "float64: finite"},
    ),
    HostileSpec(
        "SelectableLoRALinear",
        lambda h: _p14_layer()(h),
        {"h": torch.randn(2, 5, 4, generator=_g)},
        ("h",),
        allow={
            "constant": "a constant input is a valid input",
            "huge": "float32 of 1e30 through a linear map: finite",
        },
        global_rng="constructing an nn.Module draws from the global generator (PyTorch's convention)",
    ),
    HostileSpec(
        "PresentativeCL",
        lambda temperature, alpha: (
            fd.PresentativeCL(_p14_model(), targets=("0",), temperature=temperature, alpha=alpha).temperature
        ),
        {"temperature": 1.0, "alpha": 32.0},
        ("temperature", "alpha"),
        global_rng="constructing an nn.Module draws from the global generator (PyTorch's convention)",
    ),
]

EXCLUDED = {
    "FedGOServer": "a simulation driver over FederatedData (its aggregator, configs and data are registered)",
    "DPFedAvgServer": "a simulation driver over FederatedData (validated by FederatedData and its configs)",
    "FedCEOServer": "a simulation driver over FederatedData (validated by FederatedData and its configs)",
    "FederatedServer": "a simulation driver over FederatedData (validated by FederatedData and its configs)",
    "FederatedData": "a container; built by the loaders registered above",
    "FederatedPrivacyLedger": "bookkeeping over DPConfig / RDPAccountant, both registered",
    "History": "a result container",
    "LocalTrainConfig": "a plain config dataclass (ints/floats consumed by the server)",
    "load_federated_digits": "no array input (sklearn's bundled digits); its arguments go to load_federated_arrays",
    "load_federated_npz": "reads a path, then calls load_federated_arrays (registered)",
    "load_federated_fashion_mnist": "no array input: reads the verified Fashion-MNIST files (icml25.kernels)",
    "privatize_update": "clip_update (registered) + Gaussian noise on a validated DPConfig",
    "upload_noise_std": "arithmetic on a validated DPConfig and LocalTrainConfig",
}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_hostile_inputs(spec: HostileSpec) -> None:
    print(spec.check().summary())


def test_registry_covers_public_api() -> None:
    print("icml25.federated covers", kt.assert_covers(fd, SPECS, EXCLUDED))


def test_fedceo_smooth_zero_size_parameter_is_kept() -> None:
    states = [{"w": torch.randn(3, 4), "empty": torch.empty(0, 4)} for _ in range(3)]
    smoothed, mean = fd.fedceo_smooth(states, 0.1)
    assert mean["empty"].shape == (0, 4) and all(s["empty"].shape == (0, 4) for s in smoothed)
    assert torch.isfinite(mean["w"]).all()


def test_tsvt_rejects_nan_like_fedceo_smooth() -> None:
    x = torch.randn(3, 4, 2)
    x[0, 1, 1] = float("nan")
    with pytest.raises(
        ValueError,
        match=r"x must be finite \(no NaN or inf\), got 1 NaN and 0 inf values .* shape \(3, 4, 2\)",
    ):
        fd.tsvt(x, 0.1)
    with pytest.raises(ValueError, match="a must be finite"):
        fd.svt(x[..., 1], 0.1)


# ---------------------------------------------------------------------------- issue 81 (bad input round 2)
def test_weighted_mean_state_rejects_nan_and_mismatched_clients() -> None:
    good = [{"w": torch.ones(2, 2), "b": torch.zeros(2)} for _ in range(2)]
    nan = [good[0], {"w": torch.full((2, 2), float("nan")), "b": torch.zeros(2)}]
    with pytest.raises(ValueError, match=r"^states\[1\]\['w'\] contains NaN or Inf"):
        fd.weighted_mean_state(nan, [1.0, 1.0])
    with pytest.raises(ValueError, match=r"^states\[1\] keys differ from states\[0\]: missing \['w'\]"):
        fd.weighted_mean_state([good[0], {"b": torch.zeros(2)}], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"^states\[1\]\['w'\] has shape \(3, 2\), expected \(2, 2\)"):
        fd.weighted_mean_state([good[0], {"w": torch.ones(3, 2), "b": torch.zeros(2)}], [1.0, 1.0])
    out = fd.weighted_mean_state(good, [1.0, 3.0])
    assert torch.equal(out["w"], torch.ones(2, 2))


def test_upload_checks_are_public_and_name_the_bad_client() -> None:
    """Issue 81: FedGO validates its uploads with FedCEO's public checks (no private cross-module helper)."""
    import icml25.federated.fedgo as fedgo_module

    assert fedgo_module.check_client_states is fd.check_client_states
    good = [{"w": torch.ones(2, 2)}, {"w": torch.zeros(2, 2)}]
    assert fd.check_client_states(tuple(good)) == good
    with pytest.raises(
        ValueError, match=r"^uploads must have distinct client ids within a round, got duplicates \['3'\]"
    ):
        fd.check_uploads([(3, good[0]), (3, good[1])])
    with pytest.raises(TypeError, match=r"^uploads\[1\] must be a \(client_id, state\) pair"):
        fd.check_uploads([(0, good[0]), good[1]])
    with pytest.raises(TypeError, match="uploads must be a dict"):
        fd.check_uploads(good[0]["w"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^uploads\[1\]\['w'\] contains NaN or Inf"):
        fd.check_uploads({0: good[0], 1: {"w": torch.full((2, 2), float("inf"))}})
