"""P31 NCGN / dynamic message passing: schedules, voxel clusters, DMP graph, network, reproduction."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.generative_models import (
    NoiseConditionedGNN,
    build_dmp_graph,
    ddpm_timestep_to_s,
    dmp_schedule,
    knn_graph,
    ncgn_flow_matching_loss,
    ncgn_sample,
    voxel_clusters,
)
from icml25.generative_models.experiments import ncgn_dmp as exp
from icml25.kernels.rng import isolated_rng

KINDS = ("linear", "exp", "log", "relu")


def _cloud(n: int = 40, d: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, d, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _model(**kw) -> NoiseConditionedGNN:
    with isolated_rng(0):
        return NoiseConditionedGNN(2, 16, 2, n_layers=2, k=4, **kw).eval()


# ---------------------------------------------------------------------------------------------- schedule
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(KINDS), st.integers(1, 8), st.integers(10, 500))
def test_schedule_endpoints_monotonicity_and_budget(kind, k, n):
    if k >= n:
        return
    sch = dmp_schedule(kind)
    c0 = math.ceil(math.sqrt(k * n))
    assert sch(1.0, k, n) == (n, k)
    c, e = sch(0.0, k, n)
    assert c == c0
    # exp/log divide by the unrounded sqrt(kN), linear/relu by the rounded count (official schedules.py).
    assert e == (c0 if kind in ("exp", "log") else math.ceil(k * n / c0))
    prev = 0
    for i in range(51):
        c, e = sch(i / 50, k, n)
        assert c >= prev and 1 <= c <= n
        assert k * n <= c * e <= k * n + c + e  # ceil rounding only
        prev = c


def test_exp_schedule_values_and_inverted_is_evaluated_at_one_minus_s():
    sch, inv = dmp_schedule("exp"), dmp_schedule("exp", inverted=True)
    # n = (96 - sqrt(384)) (e^{10 s} - 1)/(e^{10} - 1) + sqrt(384), degree ceil(384 / n)
    assert sch(0.9, 4, 96) == (48, 9)
    assert sch(0.5, 4, 96) == (21, 20)
    for s in (0.0, 0.3, 0.95, 1.0):
        assert inv(s, 4, 96) == sch(1.0 - s, 4, 96)
    assert dmp_schedule("relu", split=0.6)(0.6, 4, 96) == (20, 20)


def test_ddpm_timestep_converter_direction():
    s = ddpm_timestep_to_s(torch.tensor([1000.0, 999.0, 500.0, 0.0]), 1000)
    torch.testing.assert_close(s, torch.tensor([0.0, 0.001, 0.5, 1.0]))


# -------------------------------------------------------------------------------------------- clustering
@settings(max_examples=40, deadline=None)
@given(st.integers(2, 60), st.integers(1, 80), st.integers(1, 3), st.integers(0, 10_000))
def test_voxel_clusters_assign_everyone_consecutively_within_the_request(n, req, d, seed):
    pos = _cloud(n, d, seed)
    cl, count = voxel_clusters(pos, req)
    assert cl.shape == (n,) and cl.dtype == torch.long
    assert torch.equal(torch.unique(cl), torch.arange(count))
    if req >= n:
        assert torch.equal(cl, torch.arange(n))  # identity
    else:
        assert count <= math.floor(req ** (1 / d) + 1e-9) ** d <= req


def test_cluster_positions_are_member_means_and_batched_clustering_matches_per_cloud():
    a, b = _cloud(30, seed=1), _cloud(50, seed=2) + 3.0
    pos = torch.cat([a, b])
    batch = torch.tensor([0] * 30 + [1] * 50)
    g = build_dmp_graph(pos, torch.tensor([0.0, 0.5]), 3, "exp", batch)
    for i in range(g.num_clusters):
        torch.testing.assert_close(g.pos_cg[i], pos[g.cluster == i].mean(0))
    ga = build_dmp_graph(a, 0.0, 3, "exp")
    gb = build_dmp_graph(b, 0.5, 3, "exp")
    ca = ga.num_clusters
    assert torch.equal(g.cluster, torch.cat([ga.cluster, gb.cluster + ca]))
    assert torch.equal(g.edge_index_cg, torch.cat([ga.edge_index_cg, gb.edge_index_cg + ca], 1))
    assert g.n_clusters_realised.tolist() == [ca, gb.num_clusters]


def test_zero_extent_dimension_is_one_voxel_wide():
    pos = torch.stack([torch.linspace(-1, 1, 20), torch.zeros(20)], 1)
    cl, count = voxel_clusters(pos, 16)  # 4 voxels per dim; y has zero extent
    assert count == 4
    assert torch.equal(cl, torch.arange(20) // 5)


def test_knn_graph_equals_brute_force():
    pos = _cloud(25, 3, seed=4)
    ei = knn_graph(pos, 5)
    d = torch.cdist(pos, pos)
    d.fill_diagonal_(float("inf"))
    want = d.topk(5, largest=False).indices
    for i in range(25):
        assert set(ei[0][ei[1] == i].tolist()) == set(want[i].tolist())
    assert ei.shape == (2, 125)


def test_realised_degree_is_recomputed_and_the_edge_budget_holds():
    pos = torch.randn(96, 2, generator=torch.Generator().manual_seed(3))
    for s in [i / 20 for i in range(21)]:
        g = build_dmp_graph(pos, s, 4, "exp")
        c = g.num_clusters
        want = 4 if c == 96 else min(c - 1, math.ceil(4 * 96 / c))
        assert g.n_edges.tolist() == [want]
        assert g.num_coarse_edges == c * want <= 1.2 * 4 * 96


# ------------------------------------------------------------------------------------------------ network
def test_static_model_and_dmp_at_s1_are_the_plain_knn_gnn():
    pos = _cloud(40, seed=5)
    dmp, static = _model(), _model(static=True)
    static.load_state_dict(dmp.state_dict())
    g1 = dmp.graph(pos, 1.0)
    assert torch.equal(g1.cluster, torch.arange(40))
    assert torch.equal(g1.edge_index_cg, knn_graph(pos, 4))
    for s in (0.0, 0.4):
        gs = static.graph(pos, s)
        assert torch.equal(gs.cluster, torch.arange(40)) and torch.equal(gs.edge_index_cg, knn_graph(pos, 4))
    x = pos.clone()
    torch.testing.assert_close(dmp(x, pos, 1.0), static(x, pos, 1.0), rtol=0, atol=0)
    assert not torch.allclose(dmp(x, pos, 0.2), static(x, pos, 0.2))


@pytest.mark.parametrize("conv", ["gcn", "gat", "mlp"])
def test_permutation_equivariance(conv):
    pos = _cloud(50, seed=6)
    m = _model(conv=conv)
    perm = torch.randperm(50, generator=torch.Generator().manual_seed(0))
    for s in (0.0, 0.85, 1.0):
        out = m(pos, pos, s)
        torch.testing.assert_close(m(pos[perm], pos[perm], s), out[perm], rtol=1e-5, atol=1e-5)


def test_translation_invariance_of_graph_and_relative_features():
    pos = _cloud(50, seed=7)
    shift = torch.tensor([0.5, -0.25])
    m = _model()
    x = torch.ones(50, 2)
    for s in (0.0, 0.9, 1.0):
        g, gt = m.graph(pos, s), m.graph(pos + shift, s)
        assert torch.equal(g.cluster, gt.cluster) and torch.equal(g.edge_index_cg, gt.edge_index_cg)
        torch.testing.assert_close(g.edge_attr_cg, gt.edge_attr_cg)
        torch.testing.assert_close(m(x, pos, s), m(x, pos + shift, s), rtol=1e-5, atol=1e-5)


def test_batched_forward_equals_per_sample_forward():
    m = _model()
    clouds = [_cloud(n, seed=10 + n) for n in (30, 45, 38)]
    s = torch.tensor([0.0, 0.7, 0.97])
    pos = torch.cat(clouds)
    batch = torch.cat([torch.full((len(c),), i) for i, c in enumerate(clouds)])
    out = m(pos, pos, s, batch)
    each = torch.cat([m(c, c, float(si)) for c, si in zip(clouds, s, strict=True)])
    torch.testing.assert_close(out, each, rtol=1e-5, atol=1e-5)


def test_flow_matching_trains_and_samples_are_finite():
    m = _model().train()
    x1 = _cloud(32 * 4, seed=11).reshape(4, 32, 2) * 0.5
    opt = torch.optim.Adam(m.parameters(), 3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(30):
        loss = ncgn_flow_matching_loss(m, x1, generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < sum(losses[:5])
    out = ncgn_sample(m.eval(), 3, 32, steps=4, generator=torch.Generator().manual_seed(1))
    assert out.shape == (3, 32, 2) and torch.isfinite(out).all()


# ----------------------------------------------------------------------------------------------- bad inputs
def test_s_outside_unit_interval_is_rejected():
    with pytest.raises(ValueError, match=r"s must be a data-ness level in \[0, 1\].*ddpm_timestep_to_s"):
        build_dmp_graph(_cloud(), 1.5, 4)
    with pytest.raises(ValueError, match="s must be"):
        _model()(_cloud(), _cloud(), torch.tensor(-0.1))
    with pytest.raises(ValueError, match="timestep must lie in"):
        ddpm_timestep_to_s(1001.0, 1000)


def test_k_at_least_n_is_rejected():
    with pytest.raises(ValueError, match="k must be < N"):
        build_dmp_graph(_cloud(4), 0.5, 4)
    with pytest.raises(ValueError, match="k must be < N"):
        dmp_schedule("exp")(0.5, 10, 10)


def test_fewer_than_two_nodes_is_rejected():
    with pytest.raises(ValueError, match="N >= 2"):
        build_dmp_graph(_cloud(1), 0.5, 1)
    with pytest.raises(ValueError, match="N >= 2"):
        build_dmp_graph(_cloud(5), 0.5, 1, batch=torch.tensor([0, 0, 0, 0, 1]))


def test_zero_extent_positions_give_a_finite_result():
    pos = torch.zeros(20, 2)
    g = build_dmp_graph(pos, 0.0, 4)
    assert g.num_clusters == 1 and torch.isfinite(g.pos_cg).all()
    assert torch.isfinite(_model()(pos, pos, 0.0)).all()


def test_nan_positions_are_rejected():
    pos = _cloud()
    pos[3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"pos must be finite .*got 1 NaN"):
        build_dmp_graph(pos, 0.5, 4)
    with pytest.raises(ValueError, match="x must be finite"):
        _model()(pos, _cloud(), 0.5)


def test_mismatched_batch_vectors_are_rejected():
    pos = _cloud(10)
    with pytest.raises(ValueError, match=r"batch must have shape \(10,\)"):
        build_dmp_graph(pos, 0.5, 2, batch=torch.zeros(9, dtype=torch.long))
    with pytest.raises(ValueError, match="batch must be sorted graph ids"):
        build_dmp_graph(pos, 0.5, 2, batch=torch.tensor([0] * 5 + [2] * 5))
    with pytest.raises(TypeError, match="batch must be an int64"):
        build_dmp_graph(pos, 0.5, 2, batch=torch.zeros(10))
    with pytest.raises(ValueError, match=r"s must be a scalar or have shape \(2,\)"):
        build_dmp_graph(pos, torch.tensor([0.1, 0.2, 0.3]), 2, batch=torch.tensor([0] * 5 + [1] * 5))


def test_schedule_returning_too_many_clusters_is_rejected():
    with pytest.raises(ValueError, match="schedule must return 1 <= n_clusters <= N=10, got 11"):
        build_dmp_graph(_cloud(10), 0.5, 2, lambda s, k, n: (n + 1, k))


# ---------------------------------------------------------------------------------------------- reproduction
def test_quick_reproduction_passes():
    report = exp.run(quick=True, seed=0)
    assert report.passed, report.summary() if hasattr(report, "summary") else report
    m = report.metrics
    assert m["rf_dmp_s0"] == 1.0  # the coarse graph at pure noise is all-to-all after 2 layers
    assert m["baseline_rf_knn_s0"] < 0.2


def test_broken_variant_inverted_schedule_fails_the_quick_gate():
    report = exp.evaluate(exp.QUICK, seed=0, variant="inverted")
    assert not report.passed
    # full resolution at pure noise and coarse clusters at s = 1: both resolution checks fail
    assert report.failed_checks == [
        "receptive field at s = 0: DMP >= 2 x kNN",
        "DMP graph at s = 1 is the kNN graph",
    ]
    assert report.metrics["rf_dmp_s0"] == report.metrics["baseline_rf_knn_s0"]


@pytest.mark.slow
def test_full_reproduction_passes():
    # catalog: no expected miss; at the plan's width 64 and batch 32, with the step budget raised to 9,000 (the
    # plan's rule when the kNN baseline stays at the blob level, as it did at 1,500 steps)
    report = exp.run(quick=False, seed=0)
    assert not report.inconclusive, report.preconditions
    assert report.passed, report.failed_checks
    m = report.metrics
    assert m["mmd_dmp"] < m["baseline_mmd_knn"]
    assert m["nna_dmp"] < m["baseline_nna_knn"]
