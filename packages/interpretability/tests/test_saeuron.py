"""P19 SAeUron: score, selection, intervention (identity and error sign), hooks, and the quick reproduction."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import icml25.interpretability as ip
from icml25.interpretability.experiments import saeuron as exp
from icml25.interpretability.saeuron import (
    ActivationCapture,
    DigitsDDPM,
    SAEUnlearningHook,
    UnlearningPlan,
    concept_feature_scores,
    concept_latents,
    ddpm_sample,
    fit_block_sae,
    from_patches,
    intervene,
    select_features,
    to_patches,
    train_ddpm,
)
from icml25.kernels.experiment import torch_threads
from icml25.kernels.testing import snapshot_state, states_equal


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one thread is fastest on the shared 2-core machine (and what the reproduction uses)."""
    with torch_threads(1):
        yield


def _identity_sae(d: int = 4) -> ip.TopKSAE:
    """A TopK SAE with W_enc = W_dec = I, zero biases and k = d: x̂ = ReLU(x), codes are x's entries."""
    sae = ip.TopKSAE(d, d, k=d, seed=0)
    with torch.no_grad():
        sae.W_dec.copy_(torch.eye(d))
        sae.W_enc.copy_(torch.eye(d))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae.eval()


def _latents() -> dict[str, torch.Tensor]:
    # 2 prompts, T = 2 steps, F = 4 features; concept "a" uses feature 0 at t=0 and feature 1 at t=1.
    a = torch.tensor([[[4.0, 0, 1, 1], [0, 4, 1, 1]], [[2.0, 0, 1, 1], [0, 2, 1, 1]]])
    b = torch.tensor([[[0.0, 0, 2, 2], [0, 0, 2, 2]]])
    c = torch.tensor([[[0.0, 1, 1, 2], [1, 0, 2, 1]]])
    return {"a": a, "b": b, "c": c}


# ------------------------------------------------------------------------------------------- score
def test_score_formula_on_hand_made_latents() -> None:
    lat = _latents()
    s = concept_feature_scores(lat, "a", 0)
    mu_a = torch.tensor([3.0, 0, 1, 1])
    mu_o = torch.tensor([0.0, 0.5, 1.5, 2.0])  # "b" and "c" prompts pooled
    expected = mu_a / (5 + 1e-8) - mu_o / (4 + 1e-8)
    torch.testing.assert_close(s, expected, rtol=0, atol=1e-7)
    assert abs(float(s.sum())) < 1e-6  # both proportions sum to 1
    full = concept_feature_scores(lat, "a")
    assert full.shape == (2, 4)
    torch.testing.assert_close(full[0], s)
    # a single concept: the raw mean (official behaviour)
    torch.testing.assert_close(concept_feature_scores({"a": lat["a"]}, "a", 1), torch.tensor([0.0, 3, 1, 1]))


def test_select_features_is_strictly_above_torch_quantile() -> None:
    g = torch.Generator().manual_seed(0)
    for q in (50.0, 90.0, 99.0, 99.9):
        s = torch.randn(2048, generator=g)
        idx = select_features(s, q)
        thr = torch.quantile(s.double(), q / 100)
        assert idx.tolist() == torch.nonzero(s.double() > thr).flatten().tolist()
    # F = 32, q = 97: the quantile sits between the 2nd largest and the largest value -> exactly 1 feature
    s = torch.arange(32.0)
    assert select_features(s, 97.0).tolist() == [31]
    assert select_features(s, 96.0).tolist() == [30, 31]
    assert select_features(torch.ones(10), 50.0).numel() == 0  # constant scores select nothing


def test_select_features_rejects_bad_percentiles() -> None:
    for q in (0.0, 100.0, -1.0, 150.0):
        with pytest.raises(ValueError, match=r"percentile must be a finite float in \(0\.0, 100\.0\)"):
            select_features(torch.arange(4.0), q)


def test_plan_scales_thresholds_and_multi_concept_union() -> None:
    lat = _latents()
    plan = UnlearningPlan.build(lat, ["a"], 70.0, -2.0)
    assert plan.indices[0].tolist() == [0] and plan.indices[1].tolist() == [1]
    torch.testing.assert_close(plan.scales[0], torch.tensor([-6.0]))  # γ · μ(0, 0, a) = -2 · 3
    mean_all = (lat["a"].mean(0) + lat["b"].mean(0) + lat["c"].mean(0)) / 3  # the mean over all concepts
    torch.testing.assert_close(plan.thresholds, mean_all)
    both = UnlearningPlan.build(lat, ["a", "b", "a"], 70.0, -1.0)
    assert both.concepts == ("a", "b")
    for t in range(2):
        union = torch.unique(
            torch.cat([select_features(concept_feature_scores(lat, c, t), 70.0) for c in ("a", "b")])
        )
        assert both.indices[t].tolist() == union.tolist()
        assert len(set(both.indices[t].tolist())) == both.indices[t].numel()
    dup = UnlearningPlan.from_features(lat, ["a"], [[0, 0, 2], []], -1.0)
    assert dup.indices[0].tolist() == [0, 2] and dup.n_features == [2, 0]


def test_plan_bad_inputs_name_the_argument() -> None:
    lat = _latents()
    with pytest.raises(
        ValueError, match=r"concepts item 'z' is unknown; available concepts: \['a', 'b', 'c'\]"
    ):
        UnlearningPlan.build(lat, ["z"], 90.0, -1.0)
    with pytest.raises(ValueError, match=r"concept 'z' is unknown"):
        concept_feature_scores(lat, "z")
    with pytest.warns(UserWarning, match="amplifies"):
        UnlearningPlan.build(lat, ["a"], 70.0, 1.0)
    with pytest.raises(ValueError, match=r"has \(T, F\) = \(3, 4\)"):
        concept_feature_scores({**lat, "d": torch.ones(1, 3, 4)}, "a")
    with pytest.raises(ValueError, match="features must be a list of T=2"):
        UnlearningPlan.from_features(lat, ["a"], [[0]], -1.0)


# ------------------------------------------------------------------------------------------- intervene
def test_no_selected_feature_is_the_identity_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    sae = ip.TopKSAE(8, 32, k=4, seed=0)
    lat = {"a": torch.rand(3, 2, 32, generator=g), "b": torch.rand(3, 2, 32, generator=g)}
    empty = UnlearningPlan.from_features(lat, ["a"], [[], []], -1.0)
    for x in (torch.randn(5, 8, generator=g), torch.randn(2, 8, 3, 5, generator=g)):
        out = intervene(x, sae, empty, 1)
        assert out.shape == x.shape and torch.equal(out, x)
        # the official hook returns 2·x̂ − x where nothing is ablated
        legacy = intervene(x, sae, empty, 1, legacy_error_sign=True)
        p, layout = to_patches(x)
        torch.testing.assert_close(legacy, from_patches(2 * sae(p, k=4) - p, layout))
        torch.testing.assert_close(
            intervene(x, sae, empty, 0, preserve_error=False), from_patches(sae(p, k=4), layout)
        )


def test_error_term_sign_and_mask() -> None:
    sae = _identity_sae(4)
    lat = {"a": torch.tensor([[[2.0, 0, 0, 0]]]), "b": torch.tensor([[[0.0, 0, 0, 0]]])}
    plan = UnlearningPlan.from_features(lat, ["a"], [[0]], -1.0)  # scale -2, threshold mean = 1
    x = torch.tensor([[3.0, 1, 2, -1], [0.5, 1, 2, 0.0]])  # row 0 fires (3 > 1); row 1 does not (0.5 < 1)
    out = intervene(x, sae, plan, 0)
    # x̂ = ReLU(x); x̃ = x̂ with entry 0 of row 0 scaled by -2; sign-correct: x + (x̃ − x̂)
    expected = torch.tensor([[3.0 + (-6 - 3), 1, 2, -1], [0.5, 1, 2, 0]])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    legacy = intervene(x, sae, plan, 0, legacy_error_sign=True)  # x̃ + (x̂ − x) = x̃ − (x − x̂)
    recon = x.relu()
    edited = recon.clone()
    edited[0, 0] = -6.0
    torch.testing.assert_close(legacy, edited + (recon - x), rtol=0, atol=0)
    assert not torch.equal(legacy, out)  # the two signs differ exactly where the SAE error is non-zero
    torch.testing.assert_close(intervene(x, sae, plan, 0, preserve_error=False), edited, rtol=0, atol=0)


def test_intervene_only_changes_masked_latents() -> None:
    g = torch.Generator().manual_seed(1)
    sae = ip.TopKSAE(6, 24, k=5, seed=0)
    x = torch.randn(200, 6, generator=g)
    z = sae.encode(x)
    lat = {"a": z[:100].reshape(100, 1, 24), "b": z[100:].reshape(100, 1, 24)}
    feats = torch.arange(0, 24, 3)
    plan = UnlearningPlan.from_features(lat, ["a"], [feats], -1.0)
    out = intervene(x, sae, plan, 0, preserve_error=False)
    thr = plan.thresholds[0]
    fire = torch.zeros_like(z, dtype=torch.bool)
    fire[:, feats] = z[:, feats] > thr[feats]
    z_edit = torch.where(fire, z * torch.zeros(24).index_put((feats,), plan.scales[0]), z)
    torch.testing.assert_close(out, sae.decode(z_edit), rtol=1e-5, atol=1e-5)
    untouched = ~fire.any(dim=1)
    assert 0 < int(untouched.sum()) < 200
    full = intervene(x, sae, plan, 0)
    assert torch.equal(full[untouched], x[untouched])


def test_layout_round_trip_with_non_square_maps() -> None:
    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)  # B, C, H=4, W=5
    p, layout = to_patches(x)
    assert p.shape == (40, 3)
    assert torch.equal(p[6], x[0, :, 1, 1])  # position (h=1, w=1) of image 0 is row 1·5 + 1
    assert torch.equal(from_patches(p, layout), x)
    y = torch.randn(2, 7, 3)
    assert torch.equal(from_patches(*to_patches(y)), y)


def test_intervene_bad_inputs() -> None:
    sae = ip.TopKSAE(4, 8, k=2, seed=0)
    lat = {"a": torch.rand(2, 3, 8), "b": torch.rand(2, 3, 8)}
    plan = UnlearningPlan.build(lat, ["a"], 80.0, -1.0)
    with pytest.raises(ValueError, match=r"acts have 5 channels .* sae has d_in=4"):
        intervene(torch.randn(2, 5, 3, 3), sae, plan, 0)
    with pytest.raises(ValueError, match=r"t must be an int in \[0, 2\], got 3"):
        intervene(torch.randn(2, 4), sae, plan, 3)
    with pytest.raises(ValueError, match="plan has d_sae=8 features, sae has d_sae=16"):
        intervene(torch.randn(2, 4), ip.TopKSAE(4, 16, k=2, seed=0), plan, 0)
    half = intervene(torch.randn(2, 4, 2, 2).half(), sae, plan, 0)  # fp16 in, cast explicitly, fp16 out
    assert half.dtype == torch.float16 and half.shape == (2, 4, 2, 2)


# ------------------------------------------------------------------------------------------- hooks
class _ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(2, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_hooks_on_a_conv_block_capture_restore_and_identity() -> None:
    with ip_rng(0):
        net = _ConvNet()
    x = torch.randn(3, 2, 4, 6, generator=torch.Generator().manual_seed(0))  # H != W
    ref = net(x)
    with ActivationCapture(net, "a", 2) as cap:
        for t in range(2):
            cap.set_step(t)
            net(x)
    acts = cap.activations()
    assert acts.shape == (3, 2, 24, 4)
    assert torch.equal(acts[:, 0].reshape(3, 4, 6, 4).permute(0, 3, 1, 2), net.a(x).detach())
    sae = ip.TopKSAE(4, 16, k=3, seed=0)
    lat = concept_latents(sae, {"p": acts, "q": acts.flip(0) * 0.5})
    assert lat["p"].shape == (3, 2, 16)
    empty = UnlearningPlan.from_features(lat, ["p"], [[], []], -1.0)
    with SAEUnlearningHook(net, "a", sae, empty) as hook:
        assert torch.equal(net(x), ref)  # nothing selected: the hooked model is the unhooked one
    plan = UnlearningPlan.build(lat, ["p"], 50.0, -5.0)
    with SAEUnlearningHook(net, "a", sae, plan) as hook:
        hook.set_step(0)
        changed = net(x)
    assert not torch.equal(changed, ref)
    assert torch.equal(net(x), ref)  # hook removed on exit
    with pytest.raises(ValueError, match="block 'zz' is not a submodule"):
        ActivationCapture(net, "zz", 2)


def ip_rng(seed: int):
    from icml25.kernels.rng import isolated_rng

    return isolated_rng(seed)


def test_hook_step_counting_reset_and_step_mismatch() -> None:
    model = DigitsDDPM(hidden=16, n_steps=4, seed=0)
    sae = ip.TopKSAE(16, 32, k=4, seed=0)
    lat = {"a": torch.rand(2, 4, 32), "b": torch.rand(2, 4, 32)}
    plan = UnlearningPlan.build(lat, ["a"], 90.0, -1.0)
    labels = torch.tensor([0, 1, 2])
    with SAEUnlearningHook(model, "block", sae, plan, count_calls=True) as hook:
        x = torch.zeros(3, 64)
        for t in range(4):
            model(x, torch.full((3,), t), labels)
        assert hook.step == 4
        with pytest.raises(ValueError, match="covers n_steps=4 sampling steps, got a call at step 4"):
            model(x, torch.zeros(3, dtype=torch.long), labels)
    hook = SAEUnlearningHook(model, "block", sae, plan)
    kw = {"latents": 1}
    for i in range(4):
        assert hook.callback_on_step_end(None, i, None, kw) is kw
    assert hook.step == 0  # reset after the last step of a generation

    class Pipe:
        num_timesteps = 7

    with pytest.raises(ValueError, match="covers n_steps=4 sampling steps, but the sampler runs 7"):
        hook.callback_on_step_end(Pipe(), 0, None, kw)
    with pytest.raises(ValueError, match="but the sampler runs 5"):
        ddpm_sample(DigitsDDPM(hidden=16, n_steps=5, seed=0), labels, hooks=[hook])
    with hook:  # an empty-plan hook in the sampler gives the unhooked samples exactly
        pass
    empty = UnlearningPlan.from_features(lat, ["a"], [[]] * 4, -1.0)
    ref = ddpm_sample(model, labels, seed=3)
    with SAEUnlearningHook(model, "block", sae, empty) as h:
        assert torch.equal(ddpm_sample(model, labels, seed=3, hooks=[h]), ref)
        assert torch.equal(ddpm_sample(model, labels, seed=3, hooks=[h]), ref)  # a second generation too


def test_ddpm_and_sae_training_reject_bad_input_without_changing_state() -> None:
    model = DigitsDDPM(hidden=16, n_steps=4, seed=0)
    before = snapshot_state(model)
    X = torch.rand(10, 64) * 2 - 1
    with pytest.raises(ValueError, match=r"y must be labels in \[0, 10\)"):
        train_ddpm(model, X, torch.full((10,), 10), steps=2)
    bad = X.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"X must be finite \(no NaN or inf\), got 1 NaN"):
        train_ddpm(model, bad, torch.zeros(10, dtype=torch.long), steps=2)
    after = snapshot_state(model)
    assert states_equal(before, after)
    losses = train_ddpm(model, X, torch.arange(10), steps=3, batch_size=4, seed=0)
    assert len(losses) == 3
    with pytest.raises(ValueError, match="acts must vary across inputs"):
        fit_block_sae(torch.ones(20, 8), 16, 2, steps=2)
    sae = fit_block_sae(
        torch.randn(64, 8, generator=torch.Generator().manual_seed(0)), 16, 2, steps=3, batch_size=16
    )
    assert isinstance(sae, ip.BatchTopKSAE) and not sae.training


# ------------------------------------------------------------------------------------------- diffusers
def _tiny_unet():
    diffusers = pytest.importorskip("diffusers")
    with ip_rng(0):
        return diffusers.UNet2DModel(
            sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16),
            down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
            norm_num_groups=4, num_class_embeds=10,
        ).eval()  # fmt: skip


@torch.no_grad()
def test_diffusers_unet_capture_and_intervention() -> None:
    diffusers = pytest.importorskip("diffusers")
    unet = _tiny_unet()
    sched = diffusers.DDPMScheduler(num_train_timesteps=20)
    sched.set_timesteps(4)
    labels = torch.tensor([3, 5])

    def sample(hooks=()):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 1, 8, 8, generator=g)
        for i, t in enumerate(sched.timesteps):
            for h in hooks:
                h.set_step(i)
            eps = unet(x, t, class_labels=labels).sample
            x = sched.step(eps, t, x, generator=g).prev_sample
        return x

    ref = sample()
    with ActivationCapture(unet, "up_blocks.0", 4) as cap:
        sample([cap])
    acts = cap.activations()  # up_blocks.0 outputs [B, 16, 8, 8] (upsampled): one SAE input per position
    assert acts.shape == (2, 4, 64, 16)
    sae = fit_block_sae(acts, 64, 4, steps=20, batch_size=128, seed=0)
    lat = concept_latents(sae, {"3": acts[:1], "5": acts[1:]})
    empty = UnlearningPlan.from_features(lat, ["3"], [[]] * 4, -1.0)
    with SAEUnlearningHook(unet, "up_blocks.0", sae, empty) as hook:
        assert torch.equal(sample([hook]), ref)
    plan = UnlearningPlan.build(lat, ["3"], 90.0, -5.0)
    assert sum(plan.n_features) > 0
    with SAEUnlearningHook(unet, "up_blocks.0", sae, plan) as hook:
        unlearned = sample([hook])
    assert not torch.equal(unlearned, ref) and torch.isfinite(unlearned).all()
    assert torch.equal(sample(), ref)  # removed


def test_concept_latents_chunks_whole_images() -> None:
    """Chunking by whole images (any ``batch_size``) gives the same space-averaged latents."""
    g = torch.Generator().manual_seed(5)
    sae = ip.TopKSAE(4, 16, k=3, seed=0)
    acts = {"a": torch.randn(3, 2, 5, 4, generator=g), "b": torch.randn(2, 2, 5, 4, generator=g)}
    ref = concept_latents(sae, acts)
    assert ref["a"].shape == (3, 2, 16)
    for bs in (1, 7, 64):
        out = concept_latents(sae, acts, batch_size=bs)
        for c in acts:
            torch.testing.assert_close(out[c], ref[c], rtol=0, atol=1e-6)


@torch.no_grad()
def test_unet_full_variant_hooks_every_spatial_position() -> None:
    """The plan's §11 regime: the UNet's up_blocks.0 output gives one SAE input per position; the hook with an
    empty plan is the identity, a real plan changes the samples, a step mismatch is an error."""
    pytest.importorskip("diffusers")
    X = exp.digits_data(0)["X"][:4]
    up = exp.upsample_digits(X)
    assert up.shape == (4, 1, 16, 16)
    assert torch.equal(exp.pool_digits(up), torch.from_numpy(X))
    unet, sched = exp.digits_unet(0).eval(), exp.digits_scheduler(3)
    labels = torch.tensor([3, 5])
    with ActivationCapture(unet, exp.FULL.block, 3) as cap:
        ref = exp.unet_sample(unet, sched, labels, seed=0, hooks=[cap])
    assert ref.shape == (2, 64) and float(ref.abs().max()) <= 1
    acts = cap.activations()
    assert acts.shape == (2, 3, 256, exp.FULL.hidden)  # 16 x 16 positions of 64 channels
    assert torch.equal(exp.unet_sample(unet, sched, labels, seed=0), ref)  # capture changes nothing
    by_concept = {"3": acts[:1], "5": acts[1:]}
    pool = exp.sae_training_patches(by_concept, 300, 0)
    assert pool.shape == (300, 64)
    assert exp.sae_training_patches(by_concept, 10**6, 0).shape == (2 * 3 * 256, 64)
    sae = fit_block_sae(pool, 128, 4, steps=3, batch_size=64, seed=0)
    lat = concept_latents(sae, by_concept)
    empty = UnlearningPlan.from_features(lat, ["3"], [[]] * 3, -1.0)
    with SAEUnlearningHook(unet, exp.FULL.block, sae, empty) as hook:
        assert torch.equal(exp.unet_sample(unet, sched, labels, seed=0, hooks=[hook]), ref)
    plan = UnlearningPlan.build(lat, ["3"], 50.0, -5.0)
    with SAEUnlearningHook(unet, exp.FULL.block, sae, plan) as hook:
        assert not torch.equal(exp.unet_sample(unet, sched, labels, seed=0, hooks=[hook]), ref)
        with pytest.raises(ValueError, match="covers n_steps=3 sampling steps, but the sampler runs 4"):
            exp.unet_sample(unet, exp.digits_scheduler(4), labels, seed=0, hooks=[hook])


def test_full_setting_is_the_unet_regime_with_an_unhooked_quality_precondition() -> None:
    full = exp.FULL
    assert (full.kind, full.block, full.n_steps, full.n_seeds) == ("unet", "up_blocks.0", 50, 2)
    assert (exp.FULL.collect_per_class, exp.FULL.n_target, exp.FULL.n_other) == (100, 200, 50)
    (pre,) = exp.preconditions(exp.FULL)
    assert pre({"acc_none": 0.8}) and not pre({"acc_none": 0.79})
    assert exp.preconditions(exp.QUICK) == []


# ------------------------------------------------------------------------------------------- reproduction
def test_quick_reproduction_passes_within_budget() -> None:
    t0 = time.perf_counter()
    report = exp.run(quick=True, seed=0)
    elapsed = time.perf_counter() - t0
    assert report.passed is True, report.checks
    m = report.metrics
    assert m["precision"] == 1.0 and m["features_per_step"] == 1.0
    assert m["other_probe_change"] == 0.0
    assert m["probe_drop"] > 1.5 and m["baseline_probe_drop_random"] < 0.2
    assert elapsed < 20, elapsed


def test_broken_variant_random_features_fails_the_quick_gate() -> None:
    report = exp.evaluate(exp.QUICK, 0, select=exp.random_features)
    assert report.passed is False
    assert not report.checks["selection precision >= 0.9"]
    assert not report.checks["target probe drop >= 0.8"]


def test_full_threshold_text_and_digits_pieces() -> None:
    text = exp.threshold(quick=False)
    assert "UA >= 0.75" in text and "random-feature UA <= 0.35" in text and "IRA drop <= 0.1" in text
    data = exp.digits_data(0)
    assert data["X"].shape == (1257, 64) and data["X_ref"].shape == (540, 64)
    assert data["X"].min() == -1.0 and data["X"].max() == 1.0
    assert exp.nearest_distance(data["X_ref"][:5], data["X_ref"]) == 0.0
