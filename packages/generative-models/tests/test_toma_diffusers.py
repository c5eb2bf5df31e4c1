"""P26 ToMA on a real diffusers model (the [diffusers] extra) and against the tomesd package (test-only)."""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from icml25.generative_models import ToMAState, apply_toma, remove_toma  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    from icml25.kernels import torch_threads

    with torch_threads(1):  # tiny ops: one thread is fastest on the shared 2-core machine
        yield


@pytest.fixture(scope="module")
def unet():
    from icml25.kernels.rng import isolated_rng

    with isolated_rng(0):
        model = diffusers.UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
        ).eval()  # fmt: skip
    return model


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 4, 16, 16, generator=g), torch.tensor([10, 10]), torch.randn(2, 5, 32, generator=g)


def _out(model, inputs):
    with torch.no_grad():
        return model(*inputs).sample


def test_apply_then_remove_restores_bit_identical_outputs(unet, inputs):
    y0 = _out(unet, inputs)
    state = apply_toma(unet, ratio=0.5, num_tiles=16)
    y1 = _out(unet, inputs)
    assert y1.shape == y0.shape and bool(torch.isfinite(y1).all())
    assert 0 < float((y1 - y0).norm() / y0.norm()) < 0.5
    assert {key[0] for _, key in state.recomputes} == {256, 64}  # one plan per resolution, shared by blocks
    remove_toma(unet)
    assert torch.equal(_out(unet, inputs), y0)
    assert not hasattr(unet, "_toma_state")


def test_ratio_zero_is_exactly_the_unpatched_model_and_apply_is_idempotent(unet, inputs):
    y0 = _out(unet, inputs)
    apply_toma(unet, ratio=0.0)
    assert torch.equal(_out(unet, inputs), y0)
    apply_toma(unet, ratio=0.5, num_tiles=4)
    y_once = _out(unet, inputs)
    apply_toma(unet, ratio=0.5, num_tiles=4)  # re-applying replaces, never stacks, the patch
    assert torch.equal(_out(unet, inputs), y_once)
    remove_toma(unet)
    assert torch.equal(_out(unet, inputs), y0)


def test_plans_are_reused_between_scheduled_steps(unet, inputs):
    state = apply_toma(unet, ratio=0.5, num_tiles=4, recompute_every=2)
    for _ in range(5):
        _out(unet, inputs)
    remove_toma(unet)
    assert isinstance(state, ToMAState) and state.step == 4
    assert sorted({s for s, _ in state.recomputes}) == [0, 2, 4]


def test_proportional_attention_and_merge_steps_options(unet, inputs):
    y0 = _out(unet, inputs)
    apply_toma(unet, ratio=0.5, num_tiles=4)
    y_plain = _out(unet, inputs)
    apply_toma(unet, ratio=0.5, num_tiles=4, proportional_attention=True)
    y_prop = _out(unet, inputs)
    assert bool(torch.isfinite(y_prop).all()) and not torch.equal(y_prop, y_plain)
    apply_toma(unet, ratio=0.5, num_tiles=4, merge_steps={5})  # step 0 is not a merge step
    assert torch.equal(_out(unet, inputs), y0)
    remove_toma(unet)


def test_toma_is_comparable_to_the_tomesd_package_on_the_same_unet(unet, inputs):
    tomesd = pytest.importorskip("tomesd")
    y0 = _out(unet, inputs)
    tomesd.apply_patch(unet, ratio=0.5, sx=2, sy=2, max_downsample=1, use_rand=False)
    y_tome = _out(unet, inputs)
    tomesd.remove_patch(unet)
    apply_toma(unet, ratio=0.5, num_tiles=16, min_tokens=256)  # the top resolution only, as ToMeSD
    y_toma = _out(unet, inputs)
    remove_toma(unet)
    assert torch.equal(_out(unet, inputs), y0)
    e_tome = float((y_tome - y0).norm() / y0.norm())
    e_toma = float((y_toma - y0).norm() / y0.norm())
    assert 0 < e_tome < 0.5 and 0 < e_toma < 0.5


def test_unsupported_model_is_rejected_with_the_supported_blocks():
    with pytest.raises(TypeError, match="BasicTransformerBlock"):
        apply_toma(torch.nn.Linear(3, 3))
    with pytest.raises(TypeError, match="model_or_pipe"):
        apply_toma(object())
