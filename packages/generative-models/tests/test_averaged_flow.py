"""Tests of P15 AvgFlow: the matrix-Fisher mean (zero, large-κ and Monte-Carlo limits, convex hull), the
averaged target (variance-reduction identity and equal expected gradients, equivariance, Kabsch limit,
chirality), Kabsch, the EGNN's symmetries, reflow/distillation plumbing, RDKit I/O and COV/AMR, bad
inputs, the quick reproduction and its broken variant."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.generative_models import (
    EGNN,
    ConformerFlow,
    MolGraph,
    TrainingSchedule,
    avgflow_target,
    centre,
    check_rotation,
    coverage_amr,
    distill,
    flow_target,
    haar_rotations,
    kabsch_rotation,
    make_reflow_pairs,
    matrix_fisher_mean,
    proper_svd,
    reflow,
    rmsd_matrix,
    velocity_loss,
)
from icml25.generative_models.experiments import averaged_flow as exp


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    from icml25.kernels import torch_threads

    with torch_threads(1):
        yield


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _cloud(b: int, n: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    return centre(torch.randn(b, n, 3, generator=_gen(seed), dtype=dtype))


def _graph(b: int, n: int) -> MolGraph:
    bonds = torch.zeros(b, n, n, dtype=torch.int64)
    idx = torch.arange(n - 1)
    bonds[:, idx, idx + 1] = 1
    bonds[:, idx + 1, idx] = 1
    return MolGraph(torch.arange(n).remainder(3).repeat(b, 1), bonds, torch.ones(b, n, dtype=torch.bool))


# ------------------------------------------------------------------------------------ matrix Fisher
def test_matrix_fisher_mean_limits():
    zero = matrix_fisher_mean(torch.zeros(2, 3, 3, dtype=torch.float64))
    assert torch.equal(zero, torch.zeros(2, 3, 3, dtype=torch.float64))
    big = matrix_fisher_mean(1e7 * torch.eye(3, dtype=torch.float64))
    torch.testing.assert_close(big, torch.eye(3, dtype=torch.float64), atol=1e-6, rtol=0)
    # large F: E[R] -> the mode U Vᵀ (the Kabsch rotation)
    F = 1e6 * torch.randn(4, 3, 3, generator=_gen(1), dtype=torch.float64)
    U, _, V = proper_svd(F)
    torch.testing.assert_close(matrix_fisher_mean(F), U @ V.transpose(1, 2), atol=1e-5, rtol=0)


def test_matrix_fisher_mean_matches_haar_monte_carlo():
    F = 2.0 * torch.randn(3, 3, 3, generator=_gen(2), dtype=torch.float64)
    F[0] = torch.diag(torch.tensor([3.0, 1.0, -0.5], dtype=torch.float64))  # det < 0: s3 negative
    quad = matrix_fisher_mean(F)
    mc = matrix_fisher_mean(F, method="grid", n_grid=1_000_000, generator=_gen(3))
    torch.testing.assert_close(quad, mc, atol=1e-2, rtol=0)


def _so3_exp(w: torch.Tensor) -> torch.Tensor:
    th = w.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    k = w / th
    K = torch.zeros(*w.shape[:-1], 3, 3, dtype=w.dtype)
    K[..., 0, 1], K[..., 0, 2], K[..., 1, 2] = -k[..., 2], k[..., 1], -k[..., 0]
    K = K - K.transpose(-1, -2)
    th = th[..., None]
    return torch.eye(3, dtype=w.dtype) + th.sin() * K + (1 - th.cos()) * (K @ K)


@pytest.mark.parametrize("scale", [20.0, 200.0])
def test_large_concentration_matches_importance_sampling_around_the_mode(scale):
    """κ‖S‖ > 50: the quadrature agrees with 10⁶ importance samples from a tangent Gaussian at R* to 1e-3."""
    s = scale * torch.tensor([3.0, 2.0, 1.2], dtype=torch.float64)
    F = torch.diag(s)
    n = 1_000_000
    # proposal: ω ~ N(0, diag(σ²)) with σ_i² = 2 / (s_j + s_k) (twice the Laplace variance)
    sig = torch.sqrt(2.0 / torch.stack([s[1] + s[2], s[0] + s[2], s[0] + s[1]]))
    w = torch.randn(n, 3, generator=_gen(4), dtype=torch.float64) * sig
    th = w.norm(dim=-1)
    keep = th < math.pi
    w, th = w[keep], th[keep]
    R = _so3_exp(w)
    log_target = (F * R).sum((-1, -2)) - s.sum() + torch.log((2 - 2 * th.cos()) / th.clamp_min(1e-12) ** 2)
    log_q = -0.5 * ((w / sig) ** 2).sum(-1)
    p = torch.softmax(log_target - log_q, 0)
    est = (p[:, None, None] * R).sum(0)
    torch.testing.assert_close(matrix_fisher_mean(F), est, atol=1e-3, rtol=0)


def test_a_fixed_rotation_grid_collapses_at_large_concentration():
    from icml25.generative_models.conformers.so3 import fisher_effective_sample_size

    F = torch.randn(3, 3, generator=_gen(40), dtype=torch.float64)
    assert float(fisher_effective_sample_size(0.1 * F, n_grid=20000)) > 10000
    assert float(fisher_effective_sample_size(1e4 * F, n_grid=20000)) < 3  # why the quadrature is the default


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), log_scale=st.floats(-3.0, 6.0))
def test_mean_lies_in_the_convex_hull_of_so3(seed, log_scale):
    F = 10**log_scale * torch.randn(3, 3, generator=_gen(seed), dtype=torch.float64)
    E = matrix_fisher_mean(F)
    assert torch.isfinite(E).all()
    assert float(torch.linalg.svdvals(E).max()) <= 1 + 1e-9
    # same proper-SVD frame as F: Uᵀ E V is diagonal with d1 >= d2 >= |d3|
    U, _, V = proper_svd(F)
    D = U.transpose(0, 1) @ E @ V
    torch.testing.assert_close(D, torch.diag(torch.diagonal(D)), atol=1e-9, rtol=0)
    d = torch.diagonal(D)
    assert d[0] >= d[1] - 1e-9 and d[1] >= d[2].abs() - 1e-9


def test_kabsch_recovers_a_rotation_and_stays_proper():
    B = _cloud(5, 6, 5)
    Q = haar_rotations(5, generator=_gen(6), dtype=torch.float64)
    A = B @ Q.transpose(1, 2)
    torch.testing.assert_close(kabsch_rotation(A, B), Q, atol=1e-9, rtol=0)
    P = torch.diag(torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64))
    R = kabsch_rotation(B @ P, B)  # a mirror image: the best *proper* rotation, never the reflection
    assert torch.allclose(torch.linalg.det(R), torch.ones(5, dtype=torch.float64))
    check_rotation(R)


# ---------------------------------------------------------------------------------- averaged target
def test_variance_reduction_identity_and_equal_expected_gradients():
    """For a fixed model, E[L_condot] − E[L_avg] = E‖u_R − v*‖² and E[∇L_condot] = E[∇L_avg] (4096 samples)."""
    n, N = 4096, 6
    x1 = _cloud(1, N, 7).expand(n, N, 3) * 1.5
    x0 = _cloud(n, N, 8)
    t = torch.rand(n, generator=_gen(9), dtype=torch.float64) * 0.96 + 0.02
    x_t, u = flow_target(x0, x1, t, "condot", generator=_gen(10))
    x1r = x_t + (1 - t)[:, None, None] * u
    v_star = avgflow_target(x_t, x1r, t)
    theta = -0.7  # a fixed model v = θ·x_t; per-sample gradients dL/dθ = 2⟨v − target, x_t⟩
    v = theta * x_t
    l_c = ((v - u) ** 2).sum((1, 2))
    l_a = ((v - v_star) ** 2).sum((1, 2))
    gap = ((u - v_star) ** 2).sum((1, 2))
    resid = l_c - l_a - gap
    assert abs(float(resid.mean())) <= 4 * float(resid.std()) / math.sqrt(n)
    assert float(gap.mean()) > 0.2 * float(l_c.mean())  # the reduction is large, not a rounding effect
    diff = 2 * ((v - u) * x_t).sum((1, 2)) - 2 * ((v - v_star) * x_t).sum((1, 2))
    assert abs(float(diff.mean())) <= 4 * float(diff.std()) / math.sqrt(n)  # equal expected gradients
    # ... while a wrong average (E[R] = 0) breaks the identity by many standard errors
    wrong = -x_t / (1 - t)[:, None, None]
    bad = l_c - ((v - wrong) ** 2).sum((1, 2)) - ((u - wrong) ** 2).sum((1, 2))
    assert abs(float(bad.mean())) > 4 * float(bad.std()) / math.sqrt(n)


def test_target_limits_small_t_and_kabsch_at_large_t():
    x_t, x1 = _cloud(3, 7, 11), _cloud(3, 7, 12)
    torch.testing.assert_close(avgflow_target(x_t, x1, 0.0), -x_t)
    t = 1 - 1e-4
    R = kabsch_rotation(x_t, x1)
    kabsch = (x1 @ R.transpose(1, 2) - x_t) / (1 - t)
    torch.testing.assert_close(avgflow_target(x_t, x1, t), kabsch, atol=1e-3, rtol=0)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), t=st.floats(0.05, 0.95))
def test_target_is_equivariant_in_x_t_and_invariant_to_rotating_x1(seed, t):
    x_t, x1 = _cloud(2, 5, seed), _cloud(2, 5, seed + 1)
    Q, Q2 = haar_rotations(2, generator=_gen(seed + 2), dtype=torch.float64)
    base = avgflow_target(x_t, x1, t)
    torch.testing.assert_close(avgflow_target(x_t @ Q.T, x1 @ Q2.T, t), base @ Q.T, atol=1e-8, rtol=1e-8)


def test_mirror_image_is_not_averaged_away():
    x_t, x1 = _cloud(4, 6, 13), _cloud(4, 6, 14)
    P = torch.diag(torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64))
    for t in (0.3, 0.7, 0.95):
        a, b = avgflow_target(x_t, x1, t), avgflow_target(x_t, x1 @ P, t)
        assert float((a - b).norm(dim=(1, 2)).min()) > 0.05  # SO(3), not O(3): chirality is kept


def test_padding_mask_matches_the_unpadded_target():
    x_t, x1 = _cloud(2, 5, 15), _cloud(2, 5, 16)
    pad = lambda x: torch.cat([x, torch.full((2, 3, 3), 7.0, dtype=x.dtype)], 1)  # noqa: E731
    mask = torch.tensor([[True] * 5 + [False] * 3] * 2)
    full = avgflow_target(pad(x_t), pad(x1), 0.6, mask)
    torch.testing.assert_close(full[:, :5], avgflow_target(x_t, x1, 0.6))
    assert torch.equal(full[:, 5:], torch.zeros(2, 3, 3, dtype=torch.float64))


# --------------------------------------------------------------------------------------------- model
def test_egnn_is_rotation_equivariant_translation_invariant_and_ignores_padding():
    torch.manual_seed(0)
    net = EGNN(hidden=16, n_layers=2)
    g = _graph(3, 6)
    x = torch.randn(3, 6, 3, generator=_gen(17))
    t = torch.rand(3, generator=_gen(18))
    Q = haar_rotations(1, generator=_gen(19))[0]
    v = net(x, t, g)
    torch.testing.assert_close(net(x @ Q.T + 3.0, t, g), v @ Q.T, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(v.sum(1), torch.zeros(3, 3), atol=1e-5, rtol=0)
    mask = g.mask.clone()
    mask[:, 4:] = False
    gp = MolGraph(g.atom_types, g.bond_types * mask[:, :, None] * mask[:, None, :], mask)
    xp = x.clone()
    xp[:, 4:] = 100.0
    sub = MolGraph(g.atom_types[:, :4], gp.bond_types[:, :4, :4], mask[:, :4])
    torch.testing.assert_close(net(xp, t, gp)[:, :4], net(x[:, :4], t, sub), atol=1e-5, rtol=1e-4)


def test_fit_sample_reflow_and_distill_plumbing():
    g = _graph(8, 4)
    x1 = centre(torch.randn(8, 4, 3, generator=_gen(20)))
    torch.manual_seed(0)
    model = ConformerFlow(EGNN(hidden=8, n_layers=1), "avg")
    losses = model.fit(x1, g, 3, batch_size=4, seed=1)
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    pairs = make_reflow_pairs(model, g, 5, generator=_gen(21))
    torch.testing.assert_close(pairs.x, model.sample(g, 5, x0=pairs.z))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rf = reflow(model, pairs, 2, batch_size=4)
    st_ = distill(rf, pairs, 2, batch_size=4)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the base is untouched
    assert torch.isfinite(st_.sample(g, 1, generator=_gen(22))).all()
    out = model.sample(g, 4, generator=_gen(23))
    torch.testing.assert_close(out.sum(1), torch.zeros(8, 3), atol=1e-5, rtol=0)  # CoM stays removed


def test_velocity_loss_per_molecule_matches_a_hand_computation():
    pred = torch.zeros(2, 3, 3, dtype=torch.float64)
    target = torch.zeros(2, 3, 3, dtype=torch.float64)
    target[0, 0] = torch.tensor([1.0, 2.0, 2.0])  # molecule 0, 3 real atoms: squared errors 9, 4, 0
    target[0, 1] = torch.tensor([0.0, 2.0, 0.0])
    target[1, 0] = torch.tensor([3.0, 0.0, 0.0])  # molecule 1, 2 real atoms: squared errors 9, 1
    target[1, 1] = torch.tensor([0.0, 0.0, 1.0])
    target[1, 2] = torch.tensor([5.0, 5.0, 5.0])  # padding: ignored
    mask = torch.tensor([[True, True, True], [True, True, False]])
    per_molecule = (13 / 3 + 10 / 2) / 2  # the official FlowMatcher.loss_fn
    per_coordinate = (13 + 10) / (3 * 5)
    assert float(velocity_loss(pred, target, mask)) == pytest.approx(per_molecule, rel=1e-12)
    assert float(velocity_loss(pred, target, mask, "coordinate")) == pytest.approx(per_coordinate, rel=1e-12)
    same = torch.ones(2, 3, dtype=torch.bool)  # equal atom counts: per molecule = 3 x per coordinate
    a, b = _cloud(2, 3, 40), _cloud(2, 3, 41)
    torch.testing.assert_close(velocity_loss(a, b, same), 3 * velocity_loss(a, b, same, "coordinate"))
    with pytest.raises(ValueError, match="normalisation must be one of"):
        velocity_loss(a, b, same, "atom")


def test_schedule_warmup_end_and_last_step_learning_rates():
    sched = TrainingSchedule(warmup=0.1, lr_floor=0.1)
    w = torch.nn.Parameter(torch.zeros(1))
    opt, lrs = sched.make_optimizer([w], 1e-3, 100)
    seen = []
    for _ in range(100):
        seen.append(opt.param_groups[0]["lr"])
        w.grad = torch.ones(1)
        opt.step()
        lrs.step()
    assert sched.warmup_steps(100) == 10
    assert seen[0] == pytest.approx(1e-4) and seen[5] == pytest.approx(1e-4 + 0.5 * 9e-4)  # linear warmup
    assert seen[10] == pytest.approx(1e-3)  # the peak at the end of the warmup
    k = 50  # cosine from the peak to the floor over steps 10..99
    assert seen[k] == pytest.approx(1e-4 + 9e-4 * (1 + math.cos(math.pi * (k - 10) / 89)) / 2)
    assert seen[99] == pytest.approx(1e-4)  # the floor at the last step
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["weight_decay"] == 1e-4
    const = TrainingSchedule.constant()
    opt, lrs = const.make_optimizer([w], 1e-3, 20)
    for _ in range(20):
        assert opt.param_groups[0]["lr"] == 1e-3
        opt.step()
        lrs.step()
    assert type(opt) is torch.optim.Adam
    with pytest.raises(ValueError, match="weight_decay must be 0 with optimizer='adam'"):
        TrainingSchedule(optimizer="adam")
    with pytest.raises(ValueError, match="ema_decay must be a finite float in"):
        TrainingSchedule(ema_decay=1.0)


def test_fit_ends_with_the_exponential_average_of_its_weights():
    g = _graph(8, 4)
    x1 = centre(torch.randn(8, 4, 3, generator=_gen(42)))
    decay, snaps = 0.5, []

    def fresh() -> ConformerFlow:
        torch.manual_seed(3)
        return ConformerFlow(EGNN(hidden=8, n_layers=1), "avg")

    raw = fresh()
    ema = [p.detach().clone() for p in raw.parameters()]  # the average starts at the initial weights
    raw.fit(x1, g, 3, batch_size=4, seed=1, schedule=TrainingSchedule(ema_decay=None),
            callback=lambda *_: snaps.append([p.detach().clone() for p in raw.parameters()]))  # fmt: skip
    for step in snaps:  # the hand-rolled average over the 3 steps
        ema = [decay * e + (1 - decay) * p for e, p in zip(ema, step)]
    averaged = fresh()
    averaged.fit(x1, g, 3, batch_size=4, seed=1, schedule=TrainingSchedule(ema_decay=decay))
    for e, p in zip(ema, averaged.parameters()):
        torch.testing.assert_close(p.detach(), e)
    assert not all(torch.equal(e, p) for e, p in zip(ema, snaps[-1]))  # the average is not the last iterate


# ---------------------------------------------------------------------------------------- RDKit, metrics
def test_rdkit_round_trip_and_symmetry_aware_rmsd():
    from rdkit import Chem

    from icml25.generative_models import embed_conformers, mols_to_graph, sample_conformers, with_conformers
    from icml25.generative_models.conformers import conformer_coords

    mol = embed_conformers("CC(C)CO", 4, seed=0)
    X = conformer_coords(mol)
    assert X.shape == (4, 5, 3)
    g = mols_to_graph([mol, Chem.MolFromSmiles("CO")])
    assert (
        g.mask.sum(1).tolist() == [5, 2]
        and int(g.bond_types[0, 0, 1]) == 1
        and int(g.bond_types[0, 0, 2]) == 0
    )
    # isobutanol's two methyls (atoms 0 and 2) are interchangeable: the relabelled conformer is the same one
    Y = X[:, [2, 1, 0, 3, 4]].copy()
    sym = rmsd_matrix(Y, X, mol)
    plain = rmsd_matrix(Y, X)
    np.testing.assert_allclose(np.diag(sym), 0.0, atol=1e-6)
    assert float(np.diag(plain).min()) > 0.1
    res = coverage_amr(Y, X, 0.3, mol)
    assert res == {
        "cov_r": 1.0,
        "amr_r": pytest.approx(0.0, abs=1e-6),
        "cov_p": 1.0,
        "amr_p": pytest.approx(0.0, abs=1e-6),
    }
    withh = with_conformers(mol, X[:2], add_hs=True)
    assert withh.GetNumConformers() == 2 and withh.GetNumAtoms() == 15
    torch.manual_seed(0)
    model = ConformerFlow(EGNN(hidden=8, n_layers=1), "avg")
    out = sample_conformers(model, mol, 3, n_steps=2)
    assert out.GetNumConformers() == 3 and Chem.MolToSmiles(out) == Chem.MolToSmiles(mol)


def test_coverage_amr_exact_on_a_constructed_example():
    ref = _cloud(2, 4, 24).numpy()
    gen = np.stack([ref[0], ref[0] + 0.0, ref[1] * 1.0])
    gen[1] = gen[1] + np.array([[0.3, 0, 0], [-0.3, 0, 0], [0.3, 0, 0], [-0.3, 0, 0]])
    d = rmsd_matrix(gen, ref)
    assert d.shape == (3, 2) and d[0, 0] < 1e-6 and d[2, 1] < 1e-6
    res = coverage_amr(gen, ref, 0.5)
    assert res["cov_r"] == 1.0 and res["amr_r"] < 1e-6
    assert res["amr_p"] == pytest.approx(d.min(1).mean())


# ------------------------------------------------------------------------------------------- bad inputs
def test_bad_inputs_are_rejected_with_named_arguments():
    x = _cloud(2, 5, 25)
    with pytest.raises(ValueError, match=r"t must lie in \[0, 1\)"):
        avgflow_target(x, x, 1.0)
    with pytest.raises(ValueError, match="x_t must have at least one atom"):
        avgflow_target(torch.zeros(2, 0, 3), torch.zeros(2, 0, 3), 0.5)
    with pytest.raises(ValueError, match="x_t and x1 must have the same shape"):
        avgflow_target(x, x[:, :4], 0.5)
    bad = x.clone()
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"x1 must be finite \(no NaN or inf\), got 1 NaN"):
        avgflow_target(x, bad, 0.5)
    with pytest.raises(ValueError, match="mask must keep at least one atom"):
        avgflow_target(x, x, 0.5, torch.tensor([[True] * 5, [False] * 5]))
    refl = torch.diag(torch.tensor([1.0, 1.0, -1.0]))
    with pytest.raises(ValueError, match=r"R must be a proper rotation \(det = \+1\)"):
        check_rotation(refl)
    with pytest.raises(ValueError, match="F must have shape"):
        matrix_fisher_mean(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="kind must be one of"):
        flow_target(x, x, 0.5, "o3")


def test_non_centred_coordinates_warn_or_raise_when_strict():
    x, x1 = _cloud(2, 5, 26), _cloud(2, 5, 27)
    with pytest.warns(UserWarning, match="x_t was not centred"):
        shifted = avgflow_target(x + 2.0, x1, 0.4)
    torch.testing.assert_close(shifted, avgflow_target(x, x1, 0.4))
    with pytest.raises(ValueError, match="x_t must be centred"):
        avgflow_target(x + 2.0, x1, 0.4, strict=True)


def test_degenerate_geometries_are_finite():
    line = torch.zeros(1, 4, 3, dtype=torch.float64)
    line[0, :, 0] = torch.tensor([-1.5, -0.5, 0.5, 1.5])
    two = _cloud(1, 2, 28)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for a, b in ((line, _cloud(1, 4, 29)), (two, _cloud(1, 2, 30)), (_cloud(1, 1, 31), _cloud(1, 1, 32))):
            assert torch.isfinite(avgflow_target(a, b, 0.5)).all()


def test_fit_rejects_bad_data_and_keeps_state():
    from icml25.kernels import testing as kt

    torch.manual_seed(0)
    model = ConformerFlow(EGNN(hidden=8, n_layers=1), "avg")
    before = kt.snapshot_state(model)
    bad = centre(torch.randn(4, 3, 3))
    bad[1, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="x1 must be finite"):
        model.fit(bad, _graph(4, 3), 2)
    with pytest.raises(ValueError, match=r"x1 must hold one conformer per molecule of graph \(3\), got 4"):
        model.fit(centre(torch.randn(4, 3, 3)), _graph(3, 3), 2)
    assert kt.states_equal(before, kt.snapshot_state(model))


# ----------------------------------------------------------------------------------------- reproduction
def test_quick_reproduction_matches_its_recorded_expectation():
    report = exp.run(quick=True, seed=0)
    assert report.passed, report.summary()
    assert report.metrics["heldout_loss_avg"] < report.metrics["baseline_heldout_loss_condot"]
    assert abs(report.metrics["vr_identity_z"]) <= exp.Z_MAX
    assert report.metrics["vr_removed_fraction"] > 0.2


def test_broken_variant_uniform_weights_fails_the_quick_gate():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = exp.evaluate(exp.QUICK, 0, variant="uniform_weights")
    assert not report.passed
    assert report.checks["held-out AvgFlow loss: avg-trained < condot-trained"] is False
    assert report.metrics["heldout_loss_avg"] > 10 * report.metrics["baseline_heldout_loss_condot"]
    assert "0.9 x AMR-R(condot)" in exp.threshold(quick=False)


@pytest.mark.slow
def test_full_reproduction_matches_its_recorded_known_miss():
    """The catalog records a known miss in full: only the AMR-R(avg) <= 0.9 x condot margin fails (with the
    official optimisation AvgFlow and CondOT are on par in AMR-R)."""
    report = exp.run(quick=False, seed=0)
    assert report.passed is False
    failed = [name for name, ok in report.checks.items() if not ok]
    assert failed == ["AMR-R(avg) <= 0.9 x AMR-R(condot)"]
