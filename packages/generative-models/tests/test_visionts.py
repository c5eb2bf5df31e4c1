"""P25 VisionTS: the official slice geometry, render/read-back round trips, the exact keep-set a transformers
ViTMAE receives (with its mask-ratio truncation), equivariances, LayerNorm fine-tuning, periodicity autotune,
the bad inputs, the quick reproduction and a broken read-back that fails it."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.generative_models.forecasting import visionts as vmod
from icml25.generative_models.forecasting.visionts import (
    FacebookMAEAdapter,
    HFViTMAEAdapter,
    VisionTS,
    autotune_periodicity,
    candidate_periods,
    image_to_forecast,
    series_to_image,
    small_vit_mae,
    visionts_geometry,
    visionts_keep_mask,
)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return small_vit_mae(hidden_size=32, num_layers=1, num_heads=2, decoder_hidden_size=32, decoder_layers=1)


def _stripe_adapter(S: int, p: int):
    """An in-painter that continues the last visible pixel column (perfect for horizontal stripes)."""

    class Stripe:
        image_size, patch_size, num_channels = S, p, 3

        def reconstruct(self, images, noise):
            n_in = int((noise[0].reshape(S // p, S // p)[0] == 0).sum())
            out = images.clone()
            out[..., n_in * p :] = images[..., n_in * p - 1 : n_in * p]
            return out, noise

    return Stripe()


# ------------------------------------------------------------------------------------------ geometry
def test_geometry_matches_official_update_config() -> None:
    g = visionts_geometry(2880, 96, 24)  # the long-term benchmark setting
    assert (g.pad_left, g.n_in, g.in_width, g.out_width) == (0, 5, 80, 336)
    g = visionts_geometry(500, 96, 24)  # 500 = 20·24 + 20: 4 replicate steps in front
    ratio = 504 / (504 + 96)
    assert g.pad_left == 4 and g.n_in == int(ratio * 14 * 0.4) == 4
    assert g.in_width == 64 and g.out_width == round(224 * 21 / 64) and g.start == 504
    g = visionts_geometry(100, 30, 24, image_size=64, patch_size=8)
    assert g.pad_left == 20 and g.pad_right == 18 and g.n_periods == 5


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 48), st.integers(2, 40), st.integers(1, 200), st.sampled_from([0.2, 0.4, 0.6]))
def test_geometry_invariants(P: int, periods: int, H: int, c: float) -> None:
    L = P * periods + (periods % P if P > 1 else 0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = visionts_geometry(L, H, P, align_const=c)
    except ValueError as e:
        assert "horizon" in str(e) or "align_const" in str(e)
        return
    assert (g.context_len + g.pad_left) % P == 0 and 0 <= g.pad_left < P
    assert 1 <= g.n_in < g.grid and g.in_width == g.n_in * g.patch_size
    assert g.max_horizon >= H and g.start + H <= P * g.out_width


def test_render_read_back_nearest_is_exact_when_sizes_divide() -> None:
    """64/8 canvas, P = 16, L = 256: one pixel per period, four per phase; nearest resizes are exact."""
    from icml25.generative_models.experiments.visionts import OracleMAE

    model = VisionTS(OracleMAE(64, 8, torch.zeros(1)), finetune="none")
    model.configure(256, 64, 16, interpolation="nearest")
    g = model.geometry_
    assert g.in_width == 16 and g.out_width == 64
    x = torch.randn(3, 16 * 64, dtype=torch.float64)
    ctx_img = series_to_image(((x[:, :256] - 1.0) / 2.0), g)
    assert torch.equal(ctx_img[0, 0, ::4, :16].T.reshape(-1), ((x[0, :256] - 1.0) / 2.0))
    assert torch.all(ctx_img[..., 16:] == 0)

    def canvas(z: torch.Tensor) -> torch.Tensor:  # 1 px per period, 4 rows per phase (nearest, exact)
        grid = z.reshape(z.shape[0], 64, 16).transpose(1, 2)[:, None]
        return torch.nn.functional.interpolate(grid, size=(64, 64), mode="nearest").expand(-1, 3, -1, -1)

    torch.testing.assert_close(image_to_forecast(canvas(x), g), x[:, 256:320], rtol=1e-15, atol=1e-15)
    ctx = x[:, :256]
    mean, std = ctx.mean(1, keepdim=True), (ctx.var(1, keepdim=True, unbiased=False) + 1e-5).sqrt() / 0.4
    model.mae.target = canvas((x - mean) / std)  # a perfect in-painter: the whole pipeline is exact
    torch.testing.assert_close(model(ctx[..., None])[..., 0], x[:, 256:320], rtol=1e-12, atol=1e-12)


def test_bilinear_oracle_error_and_row_major_flatten_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from icml25.generative_models.experiments import visionts as exp

    s = exp.Setting(oracle_configs=((224, 16, 500, 96, 0.4), (64, 8, 256, 64, 0.6)), n_series=8,
                    pretrain_steps=0, transfer_series=0)  # fmt: skip
    assert exp.geometry_test(s, 1)["oracle_rel_mse_max"] < 0.02

    def row_major(images, g):
        grid = vmod._resize(images.mean(1, keepdim=True), (g.periodicity, g.out_width), g.interpolation)[:, 0]
        return grid.reshape(grid.shape[0], -1)[:, g.start : g.start + g.horizon]

    monkeypatch.setattr(vmod, "image_to_forecast", row_major)
    assert exp.geometry_test(s, 1)["oracle_rel_mse_max"] > 0.5


# ---------------------------------------------------------------------------------------- adapters
def test_hf_keep_set_is_exactly_the_left_columns_despite_truncation() -> None:
    """N = 14, n_in = 5: HF's int(196·(1 − 9/14)) keeps 69 patches; the adapter's nudge keeps all 70."""
    assert int(196 * (1 - 126 / 196)) == 69  # the pitfall the adapter guards against
    mae = small_vit_mae(image_size=224, patch_size=16, hidden_size=16, num_layers=1, num_heads=2,
                        decoder_hidden_size=16, decoder_layers=1)  # fmt: skip
    model = VisionTS(mae).configure(2880, 96, 24)
    assert model.geometry_.n_in == 5
    with torch.no_grad():
        y, out = model(torch.randn(2, 2880, 1), return_images=True)
    mask = out["mask"].reshape(2, 14, 14)
    assert torch.all(mask[:, :, :5] == 0) and torch.all(mask[:, :, 5:] == 1)
    assert y.shape == (2, 96, 1) and mae.config.mask_ratio == 0.75  # config restored


def test_facebook_style_adapter_matches_hf(tiny: torch.nn.Module) -> None:
    class FBStyle(torch.nn.Module):  # models_mae signature around the same weights
        def __init__(self, hf):
            super().__init__()
            self.hf = hf

        def forward(self, imgs, mask_ratio, noise):
            self.hf.config.mask_ratio = mask_ratio - 1e-6
            o = self.hf(pixel_values=imgs, noise=noise)
            return o.loss, o.logits, o.mask

        def unpatchify(self, x):
            return self.hf.unpatchify(x)

    x = torch.randn(2, 256, 2)
    with torch.no_grad():
        a = VisionTS(tiny).configure(256, 64, 16)(x)
        b = VisionTS(FacebookMAEAdapter(FBStyle(tiny), 64, 8)).configure(256, 64, 16)(x)
    tiny.config.mask_ratio = 0.75
    torch.testing.assert_close(a, b)


def test_shape_channel_and_affine_equivariance(tiny: torch.nn.Module) -> None:
    model = VisionTS(tiny).configure(256, 64, 16)
    x = torch.randn(3, 256, 4, generator=torch.Generator().manual_seed(0)).double() * 2
    model.double()
    with torch.no_grad():
        y = model(x)
        assert y.shape == (3, 64, 4)
        perm = torch.tensor([2, 0, 3, 1])
        torch.testing.assert_close(model(x[..., perm]), y[..., perm])
        torch.testing.assert_close(model(3.0 * x + 5.0), 3.0 * y + 5.0, rtol=1e-4, atol=1e-4)
    model.float()


def test_ln_finetune_trains_only_norms_and_lowers_the_loss(tiny: torch.nn.Module) -> None:
    import copy

    model = VisionTS(copy.deepcopy(tiny), finetune="ln").configure(256, 64, 16)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    n_norm = sum(1 for n, _ in model.named_parameters() if "norm" in n)
    assert names and all("norm" in n for n in names) and len(names) == n_norm
    assert not [p for p in VisionTS(copy.deepcopy(tiny), finetune="none").parameters() if p.requires_grad]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    t = torch.arange(320.0)
    x = (torch.sin(2 * math.pi * t / 16)[None] * torch.linspace(0.5, 2, 8)[:, None])[..., None]
    opt = torch.optim.Adam(model.trainable_parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = ((model(x[:, :256]) - x[:, 256:]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= set(names)


# -------------------------------------------------------------------------------------- periodicity
def test_candidate_periods_table() -> None:
    assert candidate_periods("H") == [24, 168, 1]
    assert candidate_periods("2H") == [12, 84, 1]
    assert candidate_periods("15min") == [96, 672, 1]
    assert candidate_periods("W-SUN") == [52, 4, 1]
    assert candidate_periods("A") == [1]


def test_autotune_picks_the_true_period() -> None:
    model = VisionTS(_stripe_adapter(64, 8), finetune="none")
    t = torch.arange(1200.0)
    series = torch.sin(2 * math.pi * t / 24) + 0.5 * torch.sin(2 * math.pi * t / 8)
    assert autotune_periodicity(model, series, 48, [7, 24, 1], context_len=480) == 24
    assert model.geometry_ is None


# ----------------------------------------------------------------------------------------- bad input
def test_bad_inputs(tiny: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match=r"context_len.*2 periods.*periodicity=1"):
        visionts_geometry(30, 10, 24)
    with pytest.raises(ValueError, match="norm_const"):
        visionts_geometry(480, 96, 24, norm_const=0.0)
    with pytest.raises(ValueError, match="align_const"):
        visionts_geometry(480, 96, 24, align_const=-1.0)
    with pytest.raises(ValueError, match=r"horizon=700.*at most 624"):  # n_in = 1 holds 13 contexts
        with pytest.warns(UserWarning, match="forced to 1"):
            visionts_geometry(48, 700, 24)
    with pytest.warns(UserWarning, match="forced to 1"):
        assert visionts_geometry(480, 96, 24, align_const=0.05).n_in == 1
    with pytest.raises(ValueError, match=r"align_const.*no masked"):
        visionts_geometry(480, 24, 24, align_const=2.0)
    model = VisionTS(tiny).configure(256, 64, 16)
    x = torch.randn(2, 256, 1)
    x[0, 3, 0] = float("nan")
    with pytest.raises(ValueError, match="x contains NaN"):
        model(x)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 256, C\)"):
        model(torch.randn(2, 200, 1))
    with pytest.raises(TypeError, match="x must be a float tensor"):
        model(torch.ones(2, 256, 1, dtype=torch.long))
    with pytest.raises(RuntimeError, match="configure"):
        VisionTS(tiny)(torch.randn(1, 256, 1))
    cfg = transformers.ViTMAEConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=16, decoder_hidden_size=16,
                                    decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
                                    decoder_intermediate_size=16, norm_pix_loss=True)  # fmt: skip
    with pytest.raises(ValueError, match="norm_pix_loss"):
        VisionTS(transformers.ViTMAEForPreTraining(cfg))
    cfg.norm_pix_loss = False
    with pytest.raises(TypeError, match="ViTMAEForPreTraining"):
        VisionTS(transformers.ViTMAEModel(cfg))
    cfg.patch_size = (8, 4)
    with pytest.raises(ValueError, match="patch_size must be square"):
        _fake_hf(cfg)
    with pytest.raises(ValueError, match="finetune"):
        VisionTS(tiny, finetune="lora")
    with pytest.raises(ValueError, match="freq"):
        candidate_periods("fortnightly")
    with pytest.raises(ValueError, match="too short"):
        autotune_periodicity(VisionTS(tiny), torch.randn(40), 30, [24])


def _fake_hf(cfg):
    class Fake(torch.nn.Module):
        config = cfg
        decoder = None
        vit = None

        def unpatchify(self, x):
            return x

    return HFViTMAEAdapter(Fake())


def test_keep_mask_layout() -> None:
    g = visionts_geometry(480, 96, 24)
    m = visionts_keep_mask(g).reshape(14, 14)
    assert torch.all(m[:, : g.n_in] == 0) and torch.all(m[:, g.n_in :] == 1)
    assert float(visionts_keep_mask(g).mean()) == pytest.approx(g.n_out / 14)


# ------------------------------------------------------------------------------ reproduction gate
def test_quick_reproduction_passes() -> None:
    from icml25.generative_models.experiments import visionts as exp

    report = exp.run(quick=True, seed=0)
    assert report.passed, report
    assert report.metrics["oracle_rel_mse"] < 0.02 < report.metrics["baseline_mean_rel_mse"]


def test_quick_gate_fails_for_wrong_read_back_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: the in-painted image is read back 3 period-columns too wide (a scale-factor bug)."""
    import dataclasses

    from icml25.generative_models.experiments import visionts as exp

    good = vmod.image_to_forecast
    monkeypatch.setattr(
        vmod, "image_to_forecast", lambda img, g: good(img, dataclasses.replace(g, out_width=g.out_width + 3))
    )
    report = exp.evaluate(dataclasses.replace(exp.QUICK, pretrain_steps=5, transfer_series=4), seed=0)
    assert report.passed is False
    assert report.failed_checks == ["oracle forecast MSE / variance <= 0.02 (worst config)"]
    assert report.metrics["oracle_rel_mse"] > 0.02


def test_facebook_adapter_refuses_norm_pix_loss_and_missing_decoder() -> None:
    class FB(torch.nn.Module):
        def __init__(self, norm_pix_loss: bool = False, decoder: bool = True):
            super().__init__()
            self.norm_pix_loss = norm_pix_loss
            self.decoder_pred = torch.nn.Linear(2, 2) if decoder else None

        def unpatchify(self, x):
            return x

    with pytest.raises(ValueError, match="norm_pix_loss"):
        FacebookMAEAdapter(FB(norm_pix_loss=True))
    with pytest.raises(TypeError, match="no pixel decoder"):
        FacebookMAEAdapter(FB(decoder=False))
    with pytest.raises(TypeError, match="unpatchify"):
        FacebookMAEAdapter(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="MAEAdapter"):
        VisionTS(torch.nn.Linear(2, 2))
