"""Tests for the affine coupling flow baseline of P33: exact inverse and log-det (brute-force Jacobian),
identity-like initialisation, seeded randomness, bad inputs, and the parameter matching of the reproduction."""

from __future__ import annotations

import math

import pytest
import torch

from icml25.generative_models.coupling_flow import CouplingFlow, _squeeze, _unsqueeze
from icml25.kernels.rng import global_rng_state


def _randomise(flow: CouplingFlow, std: float = 0.05, seed: int = 0) -> CouplingFlow:
    """Random weights in the zero-initialised last conditioner layers and the ActNorms: a non-trivial map."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in flow.named_parameters():
            if "net.4" in name or name.endswith(("bias", "log_scale")):
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)
    return flow


def _tiny(std: float = 0.05, **kw) -> CouplingFlow:
    args = dict(in_channels=1, img_size=4, hidden=8, steps_per_level=2, levels=2, seed=0)
    args.update(kw)
    return _randomise(CouplingFlow(**args).double(), std=std)


def test_squeeze_roundtrip_and_layout() -> None:
    x = torch.arange(2 * 3 * 4 * 6, dtype=torch.float64).view(2, 3, 4, 6)
    s = _squeeze(x)
    assert s.shape == (2, 12, 2, 3)
    assert torch.equal(_unsqueeze(s), x)
    # Channel 4c + 2i + j holds pixel (2h + i, 2w + j) of input channel c.
    assert torch.equal(s[:, 4 * 1 + 2 * 1 + 0], x[:, 1, 1::2, 0::2])


@pytest.mark.parametrize("levels", [1, 2])
def test_inverse_is_exact_both_ways(levels: int) -> None:
    flow = _tiny(img_size=(4, 8), levels=levels, in_channels=2)
    x = torch.rand(5, 2, 4, 8, dtype=torch.float64) * 2 - 1
    z, _ = flow(x)
    assert z.shape == (5, *flow.latent_shape)
    squeezed = x
    for _ in range(levels):
        squeezed = _squeeze(squeezed)
    assert (z - squeezed).abs().max() > 1e-2  # a non-trivial map
    assert (flow.inverse(z) - x).abs().max() < 1e-12
    z2 = torch.randn(3, *flow.latent_shape, dtype=torch.float64)
    assert (flow(flow.inverse(z2))[0] - z2).abs().max() < 1e-12


def test_logdet_matches_bruteforce_jacobian() -> None:
    flow = _tiny(std=0.2)  # 1 x 4 x 4: D = 16
    x = torch.randn(3, 1, 4, 4, dtype=torch.float64) * 0.7
    _, logdet = flow(x)
    assert logdet.abs().min() > 1e-2  # the map is not volume preserving
    for b in range(3):
        jac = torch.autograd.functional.jacobian(
            lambda v: flow(v.view(1, 1, 4, 4))[0].flatten(), x[b].flatten()
        )
        assert jac.shape == (16, 16)
        assert torch.allclose(torch.linalg.slogdet(jac)[1], logdet[b], atol=1e-10)


def test_initial_flow_is_orthogonal_with_standard_normal_density() -> None:
    flow = CouplingFlow(1, 8, hidden=8, steps_per_level=2, levels=2, seed=1).double()
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    z, logdet = flow(x)
    # (The orthogonal 1x1 convolutions are drawn in float32: orthogonal to ~1e-7.)
    assert torch.allclose(logdet, torch.zeros(4, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(z.flatten(1).norm(dim=1), x.flatten(1).norm(dim=1), rtol=1e-6)
    ref = torch.distributions.Normal(0.0, 1.0).log_prob(x).flatten(1).sum(1)
    assert torch.allclose(flow.log_prob(x), ref, atol=1e-4)
    assert torch.allclose(flow.nll_bits_per_dim(x), (-ref / 64 + math.log(128)) / math.log(2), atol=1e-5)


def test_seeded_init_and_sampling_leave_the_global_generators_alone() -> None:
    before = global_rng_state()
    a, b = CouplingFlow(1, 8, 8, 2, 2, seed=3), CouplingFlow(1, 8, 8, 2, 2, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert torch.equal(a.sample(4, seed=0), b.sample(4, generator=torch.Generator().manual_seed(0)))
    assert a.sample(2).shape == (2, 1, 8, 8)
    assert torch.equal(a.sample(3, temperature=0.0), torch.zeros(3, 1, 8, 8))  # orthogonal init: 0 -> 0
    assert global_rng_state() == before
    c = CouplingFlow(1, 8, 8, 2, 2, seed=4)
    assert not torch.equal(a.steps[0][0][1].weight, c.steps[0][0][1].weight)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="divisible by 2\\*\\*levels=4"):
        CouplingFlow(1, 6, 8, 2, 2)
    with pytest.raises(TypeError, match="hidden"):
        CouplingFlow(1, 8, 8.0, 2, 2)
    with pytest.raises(TypeError, match="img_size"):
        CouplingFlow(1, "8", 8, 2, 2)
    flow = CouplingFlow(1, 8, 8, 2, 2, seed=0)
    with pytest.raises(ValueError, match=r"x must have shape \(\*, 1, 8, 8\)"):
        flow.log_prob(torch.zeros(2, 1, 4, 4))
    bad = torch.zeros(2, 1, 8, 8)
    bad[0, 0, 1, 1] = float("nan")
    with pytest.raises(ValueError, match=r"x must be finite \(no NaN or inf\), got 1 NaN"):
        flow.log_prob(bad)
    with pytest.raises(TypeError, match="x must be a float tensor"):
        flow.log_prob(torch.zeros(2, 1, 8, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="z must be"):
        flow.inverse(torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError, match="temperature"):
        flow.sample(2, temperature=-1.0)


def test_matched_coupling_flow_parameter_count() -> None:
    from icml25.generative_models.experiments.tarflow import FULL, _tarflow, matched_coupling_flow

    target = sum(p.numel() for p in _tarflow(FULL, 28, 0).parameters())
    flow = matched_coupling_flow(target, 28, FULL.coupling_steps_per_level, seed=0)
    count = sum(p.numel() for p in flow.parameters())
    assert abs(count - target) / target < 0.01
    for hidden in (flow.hidden - 1, flow.hidden + 1):  # the closest width
        other = CouplingFlow(1, 28, hidden, FULL.coupling_steps_per_level, 2)
        assert abs(sum(p.numel() for p in other.parameters()) - target) >= abs(count - target)
