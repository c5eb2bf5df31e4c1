"""P16 Flex3D: cameras, volume rendering, set-invariant tri-plane reconstructor, view curation, imperfect
views, the quick reproduction and its broken variant."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.generative_models import flex3d as f
from icml25.generative_models.experiments import flex3d as exp
from icml25.kernels.experiment import torch_threads


def _views(b: int = 2, n: int = 5, size: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scenes = f.sample_ellipsoid_scenes(b, generator=g)
    cams = exp.random_cameras(b, n, g)
    return scenes.render(cams, size), cams


def _model(**kw) -> f.FlexibleViewReconstructor:
    return f._init_reconstructor(0, img_size=16, plane_res=8, dim=32, **kw)


# ------------------------------------------------------------------------------------------ cameras
def test_opencv_opengl_round_trip_and_look_at() -> None:
    cams = f.orbit_cameras(torch.tensor([0.0, 90.0, 200.0]), torch.tensor([10.0, -30.0, 45.0]), radius=2.0)
    assert torch.allclose(f.opencv_to_opengl(f.opencv_to_opengl(cams)), cams)
    gl = f.opencv_to_opengl(cams)
    # OpenCV looks along +z, OpenGL along -z: both point at the origin from the camera centre.
    to_origin = -cams[:, :3, 3] / cams[:, :3, 3].norm(dim=-1, keepdim=True)
    assert torch.allclose(cams[:, :3, 2], to_origin, atol=1e-6)
    assert torch.allclose(-gl[:, :3, 2], to_origin, atol=1e-6)
    # world up (z) appears upwards: the camera's y (down) axis has a negative world-z component.
    assert (cams[:, 2, 1] < 0).all()
    assert torch.allclose(cams[:, :3, 3].norm(dim=-1), torch.full((3,), 2.0))


def test_camera_rays_project_back_to_their_pixels() -> None:
    cams = f.orbit_cameras(torch.tensor([30.0, 250.0]), torch.tensor([15.0, -10.0]))
    o, d = f.camera_rays(cams, 8, fov_deg=50.0)
    assert torch.allclose(d.norm(dim=-1), torch.ones(2, 8, 8), atol=1e-6)
    pts = (o + 1.7 * d).reshape(2, 64, 3)
    uv, ok = f._project(pts, cams[:, None], 8, 50.0)  # each camera projects its own points
    assert ok.all()
    centres = (torch.arange(8) + 0.5) / 8 * 2 - 1
    v, u = torch.meshgrid(centres, centres, indexing="ij")
    want = torch.stack([u, v], -1).reshape(1, 64, 2).expand(2, -1, -1)
    assert torch.allclose(uv[:, 0], want, atol=1e-5)


# ----------------------------------------------------------------------------------------- rendering
def test_volume_render_matches_closed_form() -> None:
    dens = torch.full((3, 10), 2.0)
    rgb = torch.ones(3, 10, 3) * torch.tensor([0.2, 0.5, 1.0])
    col, alpha = f.volume_render(dens, rgb, 0.1)
    assert torch.allclose(alpha, torch.full((3,), 1 - math.exp(-2.0)), atol=1e-6)
    assert torch.allclose(col, alpha[:, None] * torch.tensor([0.2, 0.5, 1.0]), atol=1e-6)
    # an opaque first sample hides everything behind it
    dens = torch.tensor([[1e4, 5.0]])
    rgb = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    col, _ = f.volume_render(dens, rgb, 0.1)
    assert torch.allclose(col, torch.tensor([[1.0, 0.0, 0.0]]), atol=1e-6)


def test_sphere_renders_to_analytic_silhouette() -> None:
    r = 0.6
    scene = f.EllipsoidScenes(torch.zeros(1, 1, 3), torch.full((1, 1, 3), r), torch.ones(1, 1, 3),
                              torch.ones(1, 1, dtype=torch.bool), sigma_max=50.0, sharpness=200.0)  # fmt: skip
    cams = f.orbit_cameras(torch.tensor([0.0, 123.0]), torch.tensor([0.0, 37.0]))[None]
    img = scene.render(cams, size=48, n_samples=96)
    o, d = f.camera_rays(cams, 48)
    # analytic: a ray hits the sphere iff its distance to the centre is below r
    b = (o * d).sum(-1)
    hit = ((o**2).sum(-1) - b**2) < r**2
    pred = img[:, :, 0] > 0.5
    iou = (pred & hit).sum() / (pred | hit).sum()
    assert iou >= 0.95, float(iou)


# ------------------------------------------------------------------------------------ reconstructor
def test_view_permutation_leaves_triplane_unchanged() -> None:
    images, cams = _views(n=5)
    m = _model()
    with torch.no_grad():
        tri = m(images, cams)
        perm = torch.tensor([3, 0, 4, 2, 1])
        tri_p = m(images[:, perm], cams[:, perm])
    assert torch.allclose(tri, tri_p, atol=1e-5)


def test_masked_views_have_no_effect() -> None:
    images, cams = _views(n=6)
    m = _model()
    mask = torch.tensor([[True, True, False, True, False, False], [True] * 6])
    garbage = images.clone()
    garbage[0, [2, 4, 5]] = torch.rand(3, 3, 16, 16)
    with torch.no_grad():
        full = m(garbage, cams, mask)
        alone = m(images[:1, [0, 1, 3]], cams[:1, [0, 1, 3]])
        other = m(images[1:], cams[1:])
    assert torch.allclose(full[:1], alone, atol=1e-5)
    assert torch.allclose(full[1:], other, atol=1e-5)


def test_render_shapes_and_gradients() -> None:
    images, cams = _views(n=3)
    m = _model()
    out = m.render(m(images, cams), cams[:, :2])
    assert out.shape == (2, 2, 3, 16, 16)
    assert ((out >= 0) & (out <= 1)).all()
    out.mean().backward()
    assert m.queries.grad is not None and m.queries.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------- curation
@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=12), st.data())
def test_curate_views_keeps_the_k_lowest(values: list[float], data: st.DataObject) -> None:
    k = data.draw(st.integers(1, len(values)))
    scores = torch.tensor([values], dtype=torch.float64)
    idx = f.curate_views(scores, k)[0]
    assert idx.tolist() == sorted(idx.tolist()) and len(set(idx.tolist())) == k
    kept = scores[0, idx]
    dropped = scores[0, [i for i in range(len(values)) if i not in set(idx.tolist())]]
    assert dropped.numel() == 0 or kept.max() <= dropped.min()


def test_curate_views_fraction_and_excluded() -> None:
    scores = torch.tensor([[0.3, float("inf"), 0.1, 0.2]])
    assert f.curate_views(scores, 0.5).tolist() == [[2, 3]]
    assert f.curate_views(scores, 3).tolist() == [[0, 2, 3]]


def test_simulate_imperfect_views() -> None:
    images, _ = _views(n=4)
    before = images.clone()
    same, hit = f.simulate_imperfect_views(images, 0.0, seed=0)
    assert torch.equal(same, images) and not hit.any()
    out, hit = f.simulate_imperfect_views(images, 1.0, ("shift",), seed=0)
    assert hit.all() and torch.equal(images, before)
    # a shift of >= 4 px zero-fills a border of >= 4 rows or columns
    for b in range(2):
        for n in range(4):
            img = out[b, n]
            border = [img[..., :4], img[..., -4:], img[..., :4, :], img[..., -4:, :]]
            assert any(float(x.abs().max()) == 0.0 for x in border)
    a, _ = f.simulate_imperfect_views(images, 0.5, seed=3)
    b2, _ = f.simulate_imperfect_views(images, 0.5, seed=3)
    assert torch.equal(a, b2)
    blur, _ = f.simulate_imperfect_views(images, 1.0, ("blur",), seed=0)
    assert (f._high_frequency_energy(blur) < 0.5 * f._high_frequency_energy(images)).all()
    swap, _ = f.simulate_imperfect_views(images, 1.0, ("swap",), seed=0)
    assert torch.equal(swap[0], images[1]) and torch.equal(swap[1], images[0])


def test_consistency_scores_shape_mask_and_quality_term() -> None:
    images, cams = _views(n=4)
    images[:, 3] = f.simulate_imperfect_views(images[:, 3:], 1.0, ("blur",), seed=0)[0][:, 0]
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    m = _model()
    s = f.consistency_scores(images, cams, m, view_mask=mask)
    assert s.shape == (2, 4) and torch.isinf(s[1, 3]) and torch.isfinite(s[0]).all()
    s0 = f.consistency_scores(images, cams, m, quality_weight=0.0)
    s1 = f.consistency_scores(images, cams, m, quality_weight=1.0)
    assert ((s1 - s0)[:, 3] > 0.3).all()  # the blurred view is penalised by the quality term
    assert torch.allclose(s0.median(dim=1).values, s0.new_ones(2), atol=0.6)


# ------------------------------------------------------------------------------ bad inputs
def test_rejects_images_and_cameras_with_different_n() -> None:
    images, cams = _views(n=4)
    with pytest.raises(ValueError, match="cams must have one camera per image"):
        _model()(images, cams[:, :3])


def test_rejects_zero_views() -> None:
    images, cams = _views(n=4)
    with pytest.raises(ValueError, match="N = 0 views"):
        _model()(images[:, :0], cams[:, :0])
    with pytest.raises(ValueError, match="view_mask must keep at least one view"):
        _model()(images, cams, torch.zeros(2, 4, dtype=torch.bool))


def test_rejects_non_square_images() -> None:
    images, cams = _views(n=2)
    with pytest.raises(ValueError, match="images must be square"):
        _model()(images[..., :12], cams)


def test_rejects_non_rigid_cameras() -> None:
    images, cams = _views(n=2)
    scaled = cams.clone()
    scaled[0, 0, :3, :3] *= 1.5
    with pytest.raises(ValueError, match="cams must be rigid"):
        _model()(images, scaled)
    mirrored = cams.clone()
    mirrored[0, 0, :3, 0] *= -1  # det -1: a reflection
    with pytest.raises(ValueError, match="rigid"):
        f.camera_rays(mirrored, 8)


def test_rejects_wrong_image_size_and_fov() -> None:
    images, cams = _views(n=2, size=24)
    with pytest.raises(ValueError, match="images must be 16x16"):
        _model()(images, cams)
    with pytest.raises(ValueError, match="fov_deg"):
        f.camera_rays(cams, 8, fov_deg=180.0)


# --------------------------------------------------------------------------------- reproduction
@pytest.fixture(scope="module")
def trained() -> exp.Trained:
    with torch_threads(1):
        return exp.train(exp.QUICK, seed=0)


def test_quick_reproduction_passes(trained: exp.Trained) -> None:
    with torch_threads(1):
        report = exp.evaluate(trained)
    print(report.summary() if hasattr(report, "summary") else report)
    assert report.passed, report.checks
    m = report.metrics
    assert m["curated_psnr"] > m["baseline_all_psnr"] and m["mask_max_diff"] <= exp.MASK_TOL


def test_broken_variant_random_curation_fails(trained: exp.Trained) -> None:
    with torch_threads(1):
        report = exp.evaluate(trained, scorer=exp.random_scorer)
    assert not report.passed
    assert not report.checks[f"corrupted-view recall >= {exp.QUICK_MIN_RECALL:g}"]


def test_several_seeds_are_reported_per_seed_and_gated_on_their_means(trained: exp.Trained) -> None:
    second = dataclasses.replace(trained, seed=1)  # the same model on seed 1's held-out objects
    with torch_threads(1):
        report = exp.evaluate([trained, second])
        alone = exp.evaluate(second)
    m = report.metrics
    assert report.seeds == [0, 1]
    assert m["recall_all_s1"] == alone.metrics["recall_all"]
    for key in ("curated_psnr", "baseline_all_psnr", "random_psnr", "recall_all", "loss_late"):
        assert m[key] == pytest.approx((m[f"{key}_s0"] + m[f"{key}_s1"]) / 2)
    assert m["mask_max_diff"] == max(m["mask_max_diff_s0"], m["mask_max_diff_s1"])
    mean_recall = m["recall_all"] >= exp.QUICK_MIN_RECALL
    assert report.checks[f"corrupted-view recall >= {exp.QUICK_MIN_RECALL:g}"] == mean_recall
    with pytest.raises(ValueError, match="trained"):
        exp.evaluate([])


def test_full_mode_trains_two_seeds_and_names_the_mean_in_each_check() -> None:
    assert exp.FULL.n_seeds == 2 and exp.QUICK.n_seeds == 1
    names = [c.name for c in exp.checks(exp.FULL)]
    assert names and all(name.endswith(" (mean of 2 seeds)") for name in names)
    assert not any("seeds" in c.name for c in exp.checks(exp.QUICK))


def test_full_threshold_text_lists_the_plan_checks() -> None:
    text = exp.threshold(quick=False)
    for part in ("PSNR(8) >= PSNR(1) + 1 dB", "best constant image + 3 dB", "recall of blur views >= 0.75",
                 "imperfect-input model <= 0.7 x clean model", "curated 8 PSNR >= random 8 PSNR + 0.5 dB"):  # fmt: skip
        assert part in text, text


@pytest.mark.slow
def test_full_run_misses_only_the_blur_recall_at_its_bar() -> None:
    """The recorded expectation of the full run (two seeds of each model, 16 minutes of wall time recorded on
    the shared 2-core machine): every check holds on the means over seeds 0 and 1 but the recall of blurred
    views, which stays under its 0.75 bar (0.715 recorded on an Intel Xeon: 0.732 and 0.698)."""
    report = exp.run(quick=False, seed=0)
    assert report.seeds == [0, 1]
    failed = [name for name, ok in report.checks.items() if not ok]
    assert failed == ["recall of blur views >= 0.75 (mean of 2 seeds)"], report.checks
    assert 0.70 < report.metrics["recall_blur"] < 0.75
