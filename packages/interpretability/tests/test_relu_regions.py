"""Tests of P23 (triangle-wave ReLU networks with exactly 2^d linear regions) in
icml25.interpretability.relu_regions and its reproduction."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from icml25.interpretability.experiments import relu_regions as exp
from icml25.interpretability.relu_regions import (
    TriangleActivation,
    TriangleNet,
    count_linear_regions_1d,
    fit_1d,
    kaiming_mlp,
    triangle_wave,
)
from icml25.kernels import testing as kt
from icml25.kernels.rng import global_rng_state

F64 = torch.float64


def _grid(n: int = 20001, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
    return torch.linspace(lo, hi, n, dtype=F64)[:, None]


def brute_force_regions(model: nn.Module, lo: float, hi: float, n: int = 10**6) -> int:
    """Linear regions by dense sampling: slope changes between neighbouring grid cells, one run of changed
    cells per kink (a kink inside a cell changes the slope on both sides of that cell)."""
    x = torch.linspace(lo, hi, n + 1, dtype=F64)
    with torch.no_grad():
        y = model(x[:, None])[:, 0]
    slopes = torch.diff(y) / torch.diff(x)
    scale = max(1.0, float(slopes.abs().max()))
    change = (torch.diff(slopes).abs() > 1e-7 * scale).numpy()
    runs = int(change[0]) + int(np.count_nonzero(change[1:] & ~change[:-1]))
    return runs + 1


# ------------------------------------------------------------------------------------------ construction
@pytest.mark.parametrize("depth", [1, 2, 4, 6])
def test_yarotsky_special_case_is_the_x2_interpolant(depth: int) -> None:
    net = TriangleNet(depth)  # peaks 1/2, s_1 = -1/4, c1 = 1, c0 = 0
    x = _grid(2**depth * 64 + 1)
    knots = np.linspace(0.0, 1.0, 2**depth + 1)
    interp = torch.from_numpy(np.interp(x[:, 0].numpy(), knots, knots**2))
    with torch.no_grad():
        out = net(x)[:, 0]
    assert float((out - interp).abs().max()) < 1e-12
    assert float((out - x[:, 0] ** 2).abs().max()) == pytest.approx(4.0 ** -(depth + 1), rel=1e-9)


def test_scale_law_quarter_at_half_peaks_and_general_formula() -> None:
    s = TriangleNet(6).scales().detach()
    torch.testing.assert_close(s[1:] / s[:-1], torch.full((5,), 0.25, dtype=F64), rtol=0, atol=1e-15)
    a = torch.tensor([0.2, 0.7, 0.4, 0.9], dtype=F64)
    net = TriangleNet(4, init_peaks=a, init_scale=-0.3, tail_peak=0.6)
    s = net.scales().detach()
    ext = torch.cat([a, torch.tensor([0.6], dtype=F64)])
    for i in range(
        3
    ):  # s_{i+1} = s_i (1 - a_{i+1}) a_{i+2} (1-based), i.e. here s[i+1] = s[i] (1-a[i+1]) a[i+2]
        assert float(s[i + 1]) == pytest.approx(float(s[i] * (1 - ext[i + 1]) * ext[i + 2]), rel=1e-12)
    assert float(s[0]) == pytest.approx(-0.3)
    torch.testing.assert_close(net.peaks().detach(), a, rtol=0, atol=1e-12)


def test_triangle_map_algebra() -> None:
    v = torch.linspace(0, 1, 1001, dtype=F64)
    for a in (0.1, 0.5, 0.83):
        relu_form = torch.relu(v) / a - torch.relu(v - a) / (a * (1 - a))
        piecewise = torch.where(v <= a, v / a, (1 - v) / (1 - a))
        torch.testing.assert_close(relu_form, piecewise, rtol=0, atol=1e-12)
        torch.testing.assert_close(triangle_wave(v, torch.tensor([a], dtype=F64))[0], piecewise)


@settings(max_examples=50, deadline=None)
@given(
    depth=st.integers(1, 8),
    data=st.data(),
    s1=st.floats(0.01, 2.0),
    sign=st.sampled_from([-1.0, 1.0]),
    c0=st.floats(-2.0, 2.0),
    c1=st.floats(-3.0, 3.0),
)
def test_exactly_two_to_the_depth_regions_for_random_parameters(depth, data, s1, sign, c0, c1) -> None:
    peaks = data.draw(st.lists(st.floats(0.05, 0.95), min_size=depth, max_size=depth))
    net = TriangleNet(depth, init_peaks=peaks, init_scale=sign * s1, init_offset=c0, init_slope=c1)
    rc = count_linear_regions_1d(net.to_mlp(), 0.0, 1.0)
    assert rc.activation_regions == rc.linear_regions == 2**depth
    # The kinks are the analytic preimages, and every kink has the sign of -s_1 (convex / concave).
    np.testing.assert_allclose(np.array(rc.breakpoints), net.breakpoints().numpy(), rtol=0, atol=1e-12)
    jumps = np.diff(np.array(rc.slopes, dtype=np.float64))
    assert np.all(np.sign(jumps) == -sign)
    # The realised stack is exact even where partial sums go negative (c1 < 0, concave fits, ...).
    x = _grid(4001)
    with torch.no_grad():
        torch.testing.assert_close(net.to_mlp()(x), net.closed_form(x), rtol=0, atol=1e-10)


def test_forward_to_mlp_and_closed_form_agree_and_gradients_exist() -> None:
    a = torch.tensor([0.3, 0.62, 0.45, 0.71, 0.2], dtype=F64)
    net = TriangleNet(5, domain=(-2.0, 3.0), init_peaks=a, init_scale=0.4, init_offset=-1.0, init_slope=-2.0)
    x = _grid(5001, -2.0, 3.0)
    with torch.no_grad():
        torch.testing.assert_close(net(x), net.closed_form(x), rtol=0, atol=1e-10)
        torch.testing.assert_close(net.to_mlp()(x), net(x), rtol=0, atol=1e-10)
    loss = (net(x) - x**2).pow(2).mean()
    loss.backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
    assert float(net.peak_logits.grad.abs().min()) > 0
    mlp = net.to_mlp()
    assert [type(m) for m in mlp] == [nn.Linear, nn.ReLU] * 5 + [nn.Linear]
    assert (
        sum(p.numel() for p in mlp.parameters()) == sum(p.numel() for p in kaiming_mlp(5).parameters()) == 93
    )
    assert net.breakpoints().shape == (31,) and float(net.breakpoints().min()) > -2.0


def test_free_scales_and_learnable_tail() -> None:
    free = TriangleNet(4, enforce_smoothness=False)
    torch.testing.assert_close(free.scales().detach(), TriangleNet(4).scales().detach())
    assert {n for n, _ in free.named_parameters()} == {"peak_logits", "scales_free", "offset", "slope"}
    tail = TriangleNet(4, tail_peak=None)
    assert "tail_logit" in dict(tail.named_parameters())
    torch.testing.assert_close(tail.scales().detach(), TriangleNet(4).scales().detach())  # sigmoid(0) = 1/2
    assert count_linear_regions_1d(tail, 0.0, 1.0).linear_regions == 16


def test_construction_leaves_global_rng_untouched() -> None:
    before = global_rng_state()
    net = TriangleNet(3, init_peaks=[0.2, 0.5, 0.8])
    net.to_mlp()
    kaiming_mlp(3, seed=1)
    assert global_rng_state() == before
    a, b = kaiming_mlp(3, seed=5), kaiming_mlp(3, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


# ------------------------------------------------------------------------------------------ the counter
def _random_mlp(seed: int) -> nn.Sequential:
    g = torch.Generator().manual_seed(seed)
    depth = 1 + seed % 3
    width = 3 + seed % 4
    mods: list[nn.Module] = []
    fan = 1
    for k in range(depth):
        lin = nn.Linear(fan, width, dtype=F64, device="meta").to_empty(device="cpu")
        with torch.no_grad():
            lin.weight.copy_(torch.randn(width, fan, generator=g, dtype=F64))
            lin.bias.copy_(torch.randn(width, generator=g, dtype=F64))
        mods += [lin, nn.LeakyReLU(0.1) if (seed + k) % 5 == 0 else nn.ReLU()]
        fan = width
    out = nn.Linear(fan, 1, dtype=F64, device="meta").to_empty(device="cpu")
    with torch.no_grad():
        out.weight.copy_(torch.randn(1, fan, generator=g, dtype=F64))
        out.bias.zero_()
    return nn.Sequential(*mods, out)


def test_counter_matches_dense_brute_force_on_random_mlps() -> None:
    lo, hi, n = -3.0, 3.0, 10**6
    h = (hi - lo) / n
    compared = 0
    for seed in range(30):
        model = _random_mlp(seed)
        rc = count_linear_regions_1d(model, lo, hi)
        pts = np.array([lo, *rc.breakpoints, hi])
        jumps = np.abs(np.diff(np.array(rc.slopes, dtype=np.float64)))
        jumps = jumps[jumps > 0]
        if (len(pts) > 2 and np.diff(pts).min() < 3 * h) or (len(jumps) and jumps.min() < 1e-4):
            continue  # the sampling oracle cannot resolve these
        assert brute_force_regions(model, lo, hi, n) == rc.linear_regions, seed
        exact = count_linear_regions_1d(model, lo, hi, exact=True)
        assert (exact.activation_regions, exact.linear_regions) == (rc.activation_regions, rc.linear_regions)
        compared += 1
    assert compared >= 20


def test_counter_exact_mode_is_rational_and_counts_yarotsky() -> None:
    rc = count_linear_regions_1d(TriangleNet(5), 0, 1, exact=True)
    assert rc.activation_regions == rc.linear_regions == 32
    assert rc.breakpoints == tuple(Fraction(k, 32) for k in range(1, 32))


def test_counter_linear_vs_activation_regions() -> None:
    # Two ReLUs whose kinks cancel: relu(x) - relu(x) has 2 activation regions and 1 linear region.
    model = nn.Sequential(nn.Linear(1, 2, dtype=F64), nn.ReLU(), nn.Linear(2, 1, dtype=F64))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0], [1.0]]))
        model[0].bias.zero_()
        model[2].weight.copy_(torch.tensor([[1.0, -1.0]]))
        model[2].bias.zero_()
    rc = count_linear_regions_1d(model, -1.0, 1.0)
    assert (rc.activation_regions, rc.linear_regions, rc.breakpoints) == (2, 1, ())
    assert rc.activation_breakpoints == (0.0,)
    model.append(nn.Dropout(0.5)).eval()  # eval-mode dropout is the identity
    assert count_linear_regions_1d(model, -1.0, 1.0).activation_regions == 2


# ------------------------------------------------------------------------------------------ bad inputs
def test_bad_depth_and_peaks() -> None:
    with pytest.raises(ValueError, match="depth must be an int >= 1, got 0"):
        TriangleNet(0)
    with pytest.raises(TypeError, match="depth"):
        TriangleNet(2.5)
    for bad in (0.0, 1.0, [0.5, 1.2], [0.5, -0.1]):
        with pytest.raises(ValueError, match="init_peaks must lie strictly inside"):
            TriangleNet(2, init_peaks=bad)
    with pytest.raises(ValueError, match="init_peaks must hold depth=3"):
        TriangleNet(3, init_peaks=[0.5, 0.5])
    with pytest.raises(ValueError, match="domain must be finite with lo < hi"):
        TriangleNet(2, domain=(1.0, 1.0))
    with pytest.raises(ValueError, match="tail_peak must lie strictly inside"):
        TriangleNet(2, tail_peak=1.0)


def test_input_outside_domain_warns_once() -> None:
    net = TriangleNet(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net(torch.tensor([[1.5]], dtype=F64))
        net(torch.tensor([[-0.5]], dtype=F64))
    assert len(caught) == 1 and "outside domain" in str(caught[0].message)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 1\)"):
        net(torch.zeros(3, 2, dtype=F64))


@pytest.mark.parametrize(
    "module, match",
    [
        (nn.BatchNorm1d(4, dtype=F64), "BatchNorm1d"),
        (nn.Dropout(0.1), "Dropout in train mode"),
        (nn.GELU(), "GELU"),
    ],
)
def test_counter_rejects_unsupported_modules(module: nn.Module, match: str) -> None:
    model = nn.Sequential(nn.Linear(1, 4, dtype=F64), module, nn.Linear(4, 1, dtype=F64))
    with pytest.raises(TypeError, match=match):
        count_linear_regions_1d(model, 0.0, 1.0)


def test_counter_rejects_multi_input_and_bad_interval() -> None:
    with pytest.raises(TypeError, match="in_features=2"):
        count_linear_regions_1d(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)), 0.0, 1.0)
    with pytest.raises(ValueError, match="lo must be < hi"):
        count_linear_regions_1d(TriangleNet(2), 1.0, 1.0)
    with pytest.raises(TypeError, match=r"model must be an nn\.Sequential"):
        count_linear_regions_1d(nn.Linear(1, 1), 0.0, 1.0)


def test_non_convex_target_warns() -> None:
    x = torch.linspace(0, 1, 50, dtype=F64)
    with pytest.warns(UserWarning, match="neither convex nor concave"):
        fit_1d(TriangleNet(2), x, torch.sin(6 * x), ("pretrain",), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_1d(TriangleNet(2), x, -(x**2), ("pretrain",), 1)  # concave: fine
        fit_1d(TriangleNet(2, enforce_smoothness=False), x, torch.sin(6 * x), ("pretrain",), 1)


def test_fit_rejects_bad_data_without_touching_the_model() -> None:
    net = TriangleNet(3)
    before = kt.snapshot_state(net)
    x = torch.linspace(0, 1, 20, dtype=F64)
    bad = x.clone()
    bad[3] = math.nan
    for kwargs, match in [
        ({"x": bad, "y": x}, "x must be finite"),
        ({"x": x, "y": x[:5]}, "same number of points"),
        ({"x": torch.zeros(20, dtype=F64), "y": x}, "at least 2 distinct points"),
        ({"x": x, "y": x, "steps": -1}, "steps must be ints >= 0"),
        ({"x": x, "y": x, "stages": ("finetune", "pretrain")}, "stages must be"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            fit_1d(net, **kwargs)
    assert kt.states_equal(before, kt.snapshot_state(net))
    with pytest.raises(ValueError, match="'pretrain', which needs TriangleNet"):
        fit_1d(kaiming_mlp(2), x, x, ("pretrain",))


# ------------------------------------------------------------------------------------------ training
def test_pretraining_keeps_exactly_two_to_the_depth_regions_and_fits() -> None:
    x = torch.linspace(0, 1, 200, dtype=F64)
    nets = [TriangleNet(4, init_peaks=p) for p in (0.5, [0.3, 0.6, 0.4, 0.7])]
    res = fit_1d(nets, x, x**3, ("pretrain", "finetune"), (300, 100), log_every=50)
    assert torch.all(res.regions["pretrain"] == 16)
    assert res.loss["pretrain"].shape == (len(res.steps["pretrain"]), 2)
    assert float(res.loss["pretrain"][-1].max()) < float(res.loss["pretrain"][0].min())
    assert all(isinstance(m, nn.Sequential) for m in res.models)
    with torch.no_grad():  # pretrained nets are updated in place and realise exactly
        for net in nets:
            torch.testing.assert_close(
                net.to_mlp()(x[:, None]), net.closed_form(x[:, None]), rtol=0, atol=1e-10
            )
    assert float(res.final_loss.max()) < 1e-3


def test_batched_fit_equals_individual_fits() -> None:
    x = torch.linspace(0, 1, 100, dtype=F64)
    together = fit_1d([kaiming_mlp(3, seed=1), kaiming_mlp(3, seed=2)], x, x**3, steps=50, lr=1e-2)
    alone = [fit_1d(kaiming_mlp(3, seed=s), x, x**3, steps=50, lr=1e-2) for s in (1, 2)]
    for k in range(2):
        assert float(together.final_loss[k]) == pytest.approx(float(alone[k].final_loss[0]), rel=1e-10)
    nets = [TriangleNet(3, init_peaks=p) for p in (0.4, 0.6)]
    tog = fit_1d(nets, x, x**3, ("pretrain",), 40)
    single = fit_1d(TriangleNet(3, init_peaks=0.6), x, x**3, ("pretrain",), 40)
    assert float(tog.final_loss[1]) == pytest.approx(float(single.final_loss[0]), rel=1e-10)
    torch.testing.assert_close(nets[1].peak_logits, single.model.peak_logits)


# ------------------------------------------------------------------------------------------ extension
def test_triangle_activation_blocks() -> None:
    g = torch.Generator().manual_seed(0)
    peaks = 0.2 + 0.6 * torch.rand(3, 4, generator=g, dtype=F64)
    act = TriangleActivation(3, depth=4, domain=(-1.0, 2.0), init_peaks=peaks, init_scale=-0.5, dtype=F64)
    x = torch.linspace(-1.0, 2.0, 301, dtype=F64)[:, None].expand(301, 3)
    with torch.no_grad():
        out = act(x)
        for k in range(3):
            block = act.block(k)
            torch.testing.assert_close(out[:, k : k + 1], block(x[:, k : k + 1]), rtol=0, atol=1e-10)
            assert count_linear_regions_1d(block, -1.0, 2.0).linear_regions == 16
        # Continued linearly outside the domain, continuously.
        xs = torch.tensor([[-1.0 - 1e-9] * 3, [-1.0] * 3, [2.0] * 3, [2.0 + 1e-9] * 3], dtype=F64)
        ys = act(xs)
    assert float((ys[0] - ys[1]).abs().max()) < 1e-6 and float((ys[2] - ys[3]).abs().max()) < 1e-6
    far = act(torch.full((2, 3), 5.0, dtype=F64))
    assert bool(torch.isfinite(far).all())
    y = act(torch.randn(2, 5, 3, generator=g, dtype=F64))
    assert y.shape == (2, 5, 3)
    y.sum().backward()
    assert act.peak_logits.grad is not None and bool(torch.isfinite(act.peak_logits.grad).all())


# ------------------------------------------------------------------------------------------ reproduction
@pytest.fixture(scope="module")
def quick_report():
    return exp.run(quick=True, seed=0)


def test_quick_reproduction_passes(quick_report) -> None:
    r = quick_report
    assert r.passed, r.checks
    m = r.metrics
    assert m["triangle_regions_pretrain_min"] == m["triangle_regions_pretrain_max"] == 16
    assert m["realisation_error_max"] <= 1e-10
    assert m["triangle_mse_median_x3"] <= 1e-4
    assert m["triangle_mse_median_x3"] * 10 <= m["baseline_kaiming_mse_median_x3"]
    assert exp.threshold(False) != exp.threshold(True)


class FoldlessNet(TriangleNet):
    """Broken on purpose: t2's coefficient -1/a instead of -1/(a(1-a)) turns each fold into a clipped
    ramp, so the layers no longer double the number of pieces."""

    def _triangle_coefficients(self, a):
        return 1 / a, -1 / a


def test_broken_variant_fails_the_quick_gate(quick_report) -> None:
    metrics, _ = exp.measure(exp.QUICK, 0, net_cls=FoldlessNet, kaiming=False)
    metrics.update({k: v for k, v in quick_report.metrics.items() if k.startswith("baseline_")})
    results = {c.name: c(metrics) for c in exp.checks(exp.QUICK)}
    assert not all(results.values())
    assert not results["every TriangleNet run has exactly 16 linear regions after pretraining"]
    assert not results["max |to_mlp - closed_form| after pretraining <= 1e-10"]


def test_the_split_modules_are_one_api() -> None:
    """The counter and the training recipe live in their own modules (issue 82); the old path and the area
    namespace give the same objects."""
    import icml25.interpretability as ip
    from icml25.interpretability import relu_regions, relu_regions_count, relu_regions_training

    for name in ("RegionCount", "count_linear_regions_1d"):
        assert getattr(relu_regions, name) is getattr(relu_regions_count, name) is getattr(ip, name)
    for name in ("FitResult", "fit_1d"):
        assert getattr(relu_regions, name) is getattr(relu_regions_training, name) is getattr(ip, name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        relu_regions.nope  # noqa: B018
