"""Tests of P17 NPISeg3D: the hierarchical NP head (σ = 0 reduces to FiLM from μ, KL against
torch.distributions, max-over-clicks invariances, shapes, no target stream at inference, reproducibility),
predictive uncertainty, click simulation, metrics, scenes, bad inputs, the quick reproduction and its broken
variant."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.generative_models import (
    Click,
    ClickAttentionHead,
    HierarchicalNPHead,
    InteractiveSegmenter,
    expected_calibration_error,
    make_scene,
    noc_at,
    object_ious,
    predictive_uncertainty,
    simulate_clicks,
    uncertainty_auroc,
)
from icml25.generative_models.experiments import npiseg3d as exp
from icml25.generative_models.npiseg3d import gaussian_kl
from icml25.kernels.rng import isolated_rng


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    from icml25.kernels import torch_threads

    with torch_threads(1):
        yield


D = 16


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _head(**kw) -> HierarchicalNPHead:
    with isolated_rng(0):
        return HierarchicalNPHead(dim=D, n_samples=kw.pop("n_samples", 4), heads=2, **kw)


def _inputs(n_points: int = 30, seed: int = 1):
    g = _gen(seed)
    pf = torch.randn(n_points, D, generator=g)
    cf = torch.randn(6, D, generator=g)
    obj = torch.tensor([0, 1, 1, 2, 0, 2])
    return pf, cf, obj


# ------------------------------------------------------------------------------------------------ head
def test_collapsed_sigma_and_no_scene_weight_is_film_from_mu():
    head = _head(scene_weight=0.0, collapse_sigma=True)
    pf, cf, obj = _inputs()
    out = head(pf, cf, obj, generator=_gen())
    assert out.logits.shape == (30, 3, 4)
    with torch.no_grad():
        q = cf + head.query_mlp(cf)
        protos = torch.stack([q[obj == o].mean(0) for o in range(3)])
        gamma, beta = head.film(head.obj_mu(protos)).chunk(2, -1)
        qm = gamma[obj] * q + beta[obj]
        dots = pf @ qm.T / math.sqrt(D)
        ref = torch.stack([dots[:, obj == o].max(1).values for o in range(3)], 1)
    for s in range(4):
        torch.testing.assert_close(out.logits[..., s], ref, rtol=1e-5, atol=1e-5)
    assert out.sigma_mean == 0.0


def test_gaussian_kl_matches_torch_distributions():
    g = _gen(3)
    mq, mp = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    sq, sp = torch.rand(4, 5, generator=g) + 0.1, torch.rand(4, 5, generator=g) + 0.1
    ref = torch.distributions.kl_divergence(
        torch.distributions.Normal(mq, sq), torch.distributions.Normal(mp, sp)
    )
    torch.testing.assert_close(gaussian_kl(mq, sq, mp, sp), ref.sum())


def test_kl_is_zero_for_identical_context_and_target():
    head = _head(scene_weight=0.0)
    pf, cf, obj = _inputs()
    out = head(pf, cf, obj, cf.clone(), obj.clone(), generator=_gen())
    assert out.kl is not None and abs(float(out.kl.detach())) < 1e-4
    g = _gen(5)
    out2 = head(pf, cf, obj, torch.randn(9, D, generator=g), torch.tensor([0, 1, 2] * 3), generator=_gen())
    assert float(out2.kl.detach()) > 1e-3 and out2.target_logits.shape == out2.logits.shape


def test_permuting_or_duplicating_clicks_within_objects_keeps_logits():
    head = _head()
    pf, cf, obj = _inputs()
    base = head(pf, cf, obj, generator=_gen(7)).logits
    perm = torch.tensor([4, 2, 1, 5, 0, 3])  # permutes clicks, objects keep their own set
    torch.testing.assert_close(
        head(pf, cf[perm], obj[perm], generator=_gen(7)).logits, base, rtol=1e-5, atol=1e-5
    )
    # every click twice: prototypes (means) and maxima unchanged
    dup = torch.cat([torch.arange(6), torch.arange(6)])
    torch.testing.assert_close(
        head(pf, cf[dup], obj[dup], generator=_gen(7)).logits, base, rtol=1e-5, atol=1e-5
    )
    det = ClickAttentionHead(D)
    one = torch.tensor([0, 1, 2, 3, 4, 5, 1])  # a single click duplicated
    torch.testing.assert_close(det(pf, cf[one], obj[one]).logits, det(pf, cf, obj).logits)


def test_shapes_labels_and_no_target_stream_at_inference():
    head = _head(n_samples=5)
    pf, cf, obj = _inputs(n_points=17)
    out = head(pf, cf, obj, generator=_gen())
    assert out.logits.shape == (17, 3, 5) and out.kl is None and out.target_logits is None
    assert torch.equal(out.labels, out.logits.mean(-1).argmax(-1))
    assert ClickAttentionHead(D)(pf, cf, obj).logits.shape == (17, 3, 1)


def test_reproducible_with_a_fixed_generator():
    head = _head()
    pf, cf, obj = _inputs()
    a = head(pf, cf, obj, generator=_gen(11)).logits
    b = head(pf, cf, obj, generator=_gen(11)).logits
    c = head(pf, cf, obj, generator=_gen(12)).logits
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_allow_no_background_uses_a_learned_prototype():
    head = _head(allow_no_background=True)
    pf, cf, _ = _inputs()
    out = head(pf, cf[:3], torch.tensor([1, 2, 2]), generator=_gen())
    assert out.logits.shape == (30, 3, 4) and torch.isfinite(out.logits).all()


# -------------------------------------------------------------------------------------------- uncertainty
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(2, 5), s=st.integers(1, 6), scale=st.floats(0.1, 20.0))
def test_maxprob_variance_is_bounded_and_zero_for_identical_samples(seed, k, s, scale):
    logits = torch.randn(20, k, s, generator=_gen(seed)) * scale
    u = predictive_uncertainty(logits)
    assert u.shape == (20,) and float(u.min()) >= 0.0 and float(u.max()) <= 0.25
    same = logits[..., :1].expand(-1, -1, s)
    for kind in ("maxprob_var", "mutual_info"):
        assert float(predictive_uncertainty(same, kind).abs().max()) < 1e-6
    assert float(predictive_uncertainty(logits, "mutual_info").min()) >= 0.0


def test_maxprob_variance_exact_value():
    # two samples, max probs 1/2 and ~1: variance = ((1 - 1/2)/2)^2
    logits = torch.tensor([[[0.0, 100.0], [0.0, 0.0]]]).double()
    assert float(predictive_uncertainty(logits)) == pytest.approx(0.0625)


# --------------------------------------------------------------------------------------------- metrics
def test_object_ious_and_noc_exact():
    gt = np.array([0, 1, 1, 1, 2, 2])
    pred = np.array([0, 1, 1, 2, 2, 0])
    np.testing.assert_allclose(object_ious(pred, gt), [2 / 3, 1 / 3])
    curve = np.array([[0.5, 0.85, 0.9], [0.9, 0.95, 1.0], [0.1, 0.2, 0.3]])
    assert noc_at(curve, 0.8) == pytest.approx((2 + 1 + 3) / 3)
    assert noc_at(curve, 0.8, max_clicks=20) == pytest.approx((2 + 1 + 20) / 3)


def test_uncertainty_auroc_uses_sklearn_and_is_the_mann_whitney_statistic():
    rng = np.random.default_rng(0)
    u = rng.random(200)
    e = rng.random(200) < 0.3
    pos, neg = u[e], u[~e]
    mw = ((pos[:, None] > neg[None]).sum() + 0.5 * (pos[:, None] == neg[None]).sum()) / (pos.size * neg.size)
    assert uncertainty_auroc(u, e) == pytest.approx(mw)
    assert uncertainty_auroc(e.astype(float), e) == 1.0


def test_expected_calibration_error_exact():
    conf = np.array([0.95, 0.95, 0.55, 0.55])
    correct = np.array([True, True, True, False])
    # bins: 0.95 -> acc 1.0 (gap 0.05, weight 1/2); 0.55 -> acc 0.5 (gap 0.05, weight 1/2)
    assert expected_calibration_error(conf, correct) == pytest.approx(0.05)


def test_simulate_clicks_interior_first_then_errors():
    pts, lab = make_scene(512, seed=3)
    first = simulate_clicks(pts, lab)
    assert sorted(c.label for c in first) == list(range(int(lab.max()) + 1))
    assert all(lab[c.index] == c.label for c in first)
    assert simulate_clicks(pts, lab, lab.copy()) == []  # no error, no click
    pred = lab.copy()
    wrong = np.flatnonzero(lab == 1)[:10]
    pred[wrong] = 0
    nxt = simulate_clicks(pts, lab, pred)
    assert len(nxt) == 1 and nxt[0].label == 1 and nxt[0].index in set(wrong.tolist())
    u = np.zeros(512)
    u[wrong[3]] = 1.0
    weighted = simulate_clicks(pts, lab, pred, u, strategy="uncertainty_weighted")
    assert weighted == [Click(int(wrong[3]), 1)]


def test_make_scene_is_deterministic_with_touching_objects():
    pts, lab = make_scene(1024, seed=5)
    pts2, lab2 = make_scene(1024, seed=5)
    assert pts.shape == (1024, 3) and pts.dtype == np.float32 and np.array_equal(pts, pts2)
    assert (
        np.array_equal(lab, lab2)
        and 3 <= lab.max() <= 6
        and (lab == 0).mean() == pytest.approx(0.3, abs=0.01)
    )
    ood_pts, _ = make_scene(512, kinds=("torus", "cone"), seed=1)
    assert np.isfinite(ood_pts).all()


def test_segmenter_learns_a_scene_from_clicks():
    scenes = [make_scene(256, seed=i) for i in range(4)]
    seg = InteractiveSegmenter(dim=32, rounds=1, n_samples=4, seed=0)
    losses = seg.fit(scenes, steps=25, seed=0)
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    pts, lab = scenes[0]
    labels, unc = seg.predict(pts, simulate_clicks(pts, lab))
    assert labels.shape == unc.shape == (256,) and (unc >= 0).all() and (unc <= 0.25).all()
    assert object_ious(labels, lab).mean() > 0.3


# ------------------------------------------------------------------------------------------ bad inputs
def test_object_without_clicks_or_background_is_rejected():
    head = _head()
    pf, cf, _ = _inputs()
    with pytest.raises(ValueError, match=r"objects \[1\] have zero clicks"):
        head(pf, cf[:3], torch.tensor([0, 2, 2]))
    with pytest.raises(ValueError, match="no background click"):
        head(pf, cf[:3], torch.tensor([1, 2, 2]))


def test_click_indices_out_of_range_or_duplicated_across_objects():
    pts, _ = make_scene(128, seed=0)
    seg = InteractiveSegmenter(dim=16, rounds=1, n_samples=2, heads=2)
    with pytest.raises(ValueError, match=r"click indices must be in \[0, 128\)"):
        seg.predict(pts, [Click(0, 0), Click(500, 1)])
    with pytest.raises(ValueError, match="clicked for two different objects"):
        seg.predict(pts, [Click(3, 0), Click(3, 1)])


def test_nan_points_and_too_few_points_for_knn():
    pts, _ = make_scene(128, seed=0)
    bad = pts.copy()
    bad[4, 1] = np.nan
    seg = InteractiveSegmenter(dim=16, rounds=1, n_samples=2, heads=2, k=16)
    with pytest.raises(ValueError, match=r"points must be finite \(no NaN or inf\), got 1 NaN"):
        seg.predict(bad, [Click(0, 0)])
    with pytest.raises(ValueError, match=r"at least 17 points \(k of the kNN graph\), got 10"):
        seg.predict(pts[:10], [Click(0, 0)])


def test_bad_sample_count_and_scene_weight():
    with pytest.raises(ValueError, match="n_samples must be an int >= 1, got 0"):
        HierarchicalNPHead(D, n_samples=0, heads=2)
    with pytest.raises(ValueError, match=r"scene_weight must be a finite float in \[0.0, 1.0\], got 1.5"):
        HierarchicalNPHead(D, scene_weight=1.5, heads=2)


# ---------------------------------------------------------------------------------------- reproduction
def test_quick_reproduction_passes_and_broken_variant_fails():
    report = exp.run(quick=True, seed=0)
    assert report.passed, report.checks
    m = report.metrics
    broken = exp.evaluate(exp.QUICK, seed=0, variant="collapsed_sigma", baseline_metrics=m)
    assert not broken.passed
    assert not broken.checks[f"NP uncertainty AUROC > {exp.AUROC_QUICK_MIN:g}"]
    assert not broken.checks[f"NP mean per-point variance >= {exp.VAR_MIN:g}"]
    assert broken.metrics["np_auroc_id"] == pytest.approx(0.5)


@pytest.mark.slow
def test_full_reproduction_passes():
    report = exp.run(quick=False, seed=0)
    assert report.passed, report.checks
