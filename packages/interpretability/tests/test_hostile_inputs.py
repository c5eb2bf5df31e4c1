"""Hostile-input contract of icml25.interpretability (CONTRIBUTING.md, "Bad input contract").

P22 Matryoshka SAE and the other SAEs: every public callable is registered with a valid example call;
:mod:`icml25.kernels.testing` derives the hostile variants and asserts a clear error or a documented,
finite result; the estimators keep their state after a rejected call.
"""

from __future__ import annotations

import pytest
import torch

import icml25.interpretability as ip
from icml25.kernels import testing as kt
from icml25.kernels.testing import HostileSpec

_g = torch.Generator().manual_seed(0)
_X = torch.randn(6, 8, generator=_g)
CONST_OK = "constant activations are valid: the result is finite"
# seed=0: the models' initial weights come from a local generator (the global random state is untouched).
SAES = {
    "TopKSAE": lambda: ip.TopKSAE(8, 16, k=4, seed=0),
    "BatchTopKSAE": lambda: ip.BatchTopKSAE(8, 16, k=4, seed=0),
    "ReLUSAE": lambda: ip.ReLUSAE(8, 16, seed=0),
    "MatryoshkaKSAE": lambda: ip.MatryoshkaKSAE(8, 16, ks=[2, 4], seed=0),
    "MatryoshkaSAE": lambda: ip.MatryoshkaSAE(8, 16, ks=[2, 4], seed=0),
}


def _method(cls: str, method: str):
    def setup():
        model = SAES[cls]()
        return getattr(model, method), {"x": _X}, model

    return setup


SPECS = []
for _cls in SAES:
    SPECS += [
        HostileSpec(
            f"{_cls}.loss",
            setup=_method(_cls, "loss"),
            arrays=("x",),
            covers=(_cls, "SparseAutoencoder"),
            allow={"constant": CONST_OK},
            known={"huge": "1e30-scaled activations overflow the float32 squared error to Inf (no error)"},
        ),
        HostileSpec(
            f"{_cls}.encode",
            setup=_method(_cls, "encode"),
            arrays=("x",),
            covers=(_cls,),
            allow={
                "constant": CONST_OK,
                "empty:0": "an empty batch encodes to an empty batch",
                "missing_dim": "x [..., d_in]: one sample",
                "huge": "latents of a finite x are finite",
            },
        ),
    ]
SPECS += [
    HostileSpec(
        "ActivationNormalizer.fit",
        lambda X: ip.ActivationNormalizer().fit(X),
        {"X": _X},
        ("X",),
        allow={"huge": "the normaliser rescales any finite spread"},
        covers=("ActivationNormalizer",),
    ),
    HostileSpec(
        "sae_metrics",
        ip.sae_metrics,
        {"x": _X, "x_hat": _X * 0.9, "z": torch.rand(6, 16, generator=_g)},
        ("x", "x_hat", "z"),
        allow={
            "x_hat:constant": CONST_OK,
            "z:constant": CONST_OK,
            "huge": "finite inputs give finite metrics",
        },
        known={"x:constant": "explained_variance_batch of a zero-variance batch is NaN (0/0)"},
    ),
    HostileSpec(
        "pareto_curve",
        lambda X: ip.pareto_curve(SAES["TopKSAE"](), X, [2, 4]),
        {"X": _X},
        ("X",),
        allow={"huge": "finite inputs give finite metrics"},
        known={"constant": "explained_variance_batch of a zero-variance batch is NaN (0/0)"},
    ),
    HostileSpec(
        "train_sae",
        lambda data: ip.train_sae(SAES["TopKSAE"](), data, steps=2, batch_size=3, seed=0, progress=False),
        {"data": _X},
        ("data",),
        allow={"constant": CONST_OK},
        known={"huge": "1e30-scaled activations overflow the float32 squared error to Inf (no error)"},
    ),
    HostileSpec("to_saelens", lambda: ip.to_saelens(SAES["TopKSAE"]()), {}, (), covers=("to_saelens",)),
]
EXCLUDED = {
    "from_saelens": "loads a SAELens state dict + cfg; the dict's tensors are checked by its own tests "
    "(an estimator constructor, not array math)"
}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_hostile_inputs(spec: HostileSpec) -> None:
    print(spec.check().summary())


def test_registry_covers_public_api() -> None:
    print("icml25.interpretability covers", kt.assert_covers(ip, SPECS, EXCLUDED))


def test_matryoshka_k_sae_empty_batch_loss_is_an_error() -> None:
    model = ip.MatryoshkaKSAE(8, 16, ks=[2, 4])
    before = kt.snapshot_state(model)
    with pytest.raises(ValueError, match=r"x must hold at least one sample .* shape \(0, 8\)"):
        model.loss(torch.empty(0, 8))
    assert kt.states_equal(before, kt.snapshot_state(model))  # dead-latent counters untouched


@pytest.mark.parametrize("cls", sorted(SAES))
def test_rejected_loss_keeps_state(cls: str) -> None:
    model = SAES[cls]()
    model.loss(_X)
    before = kt.snapshot_state(model)
    bad = _X.clone()
    bad[0, 0] = float("nan")
    for x in (bad, torch.empty(0, 8)):
        with pytest.raises(ValueError, match="x must"):
            model.loss(x)
    assert kt.states_equal(before, kt.snapshot_state(model))
