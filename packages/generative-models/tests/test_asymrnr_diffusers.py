"""P21 AsymRnR on a real diffusers CogVideoXTransformer3DModel (tiny, random init; the [diffusers] extra)."""

from __future__ import annotations

import warnings

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from icml25.generative_models import (  # noqa: E402
    RnRSchedule,
    apply_asymrnr,
    asymrnr_step_callback,
    calibrate_asymrnr,
    remove_asymrnr,
)
from icml25.generative_models.asymrnr import set_step  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    from icml25.kernels import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def model():
    from icml25.kernels.rng import isolated_rng

    with isolated_rng(0):
        m = diffusers.CogVideoXTransformer3DModel(
            num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=8,
            text_embed_dim=16, num_layers=2, sample_width=16, sample_height=16, sample_frames=9, patch_size=2,
            temporal_compression_ratio=4, max_text_seq_length=6,
        ).eval()  # fmt: skip
    return m


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(0)  # latent video 3 frames x 16 x 16 -> token grid (3, 8, 8)
    return {
        "hidden_states": torch.randn(2, 3, 4, 16, 16, generator=g),
        "encoder_hidden_states": torch.randn(2, 6, 16, generator=g),
        "timestep": torch.tensor([10, 10]),
    }


def _sched(q_tier: int, v_tier: int, thresholds) -> RnRSchedule:
    t = {"q": torch.full((2, 4), q_tier), "v": torch.full((2, 4), v_tier)}
    return RnRSchedule(t, thresholds, 2, 4)


def test_ratio_zero_is_bit_identical_and_remove_restores(model, inputs):
    with torch.no_grad():
        ref = model(**inputs).sample
        apply_asymrnr(model, _sched(0, 0, {"q": {5: 0.5}}), generator=torch.Generator().manual_seed(0))
        set_step(model, 0)
        same = model(**inputs).sample
        remove_asymrnr(model)
        back = model(**inputs).sample
    assert torch.equal(same, ref)
    assert torch.equal(back, ref)
    assert not hasattr(model, "_asymrnr_state")


def test_reduction_changes_the_output_a_little_and_more_with_larger_ratios(model, inputs):
    with torch.no_grad():
        ref = model(**inputs).sample
        errs = []
        for rq in (0.3, 0.7):
            apply_asymrnr(
                model, _sched(9, 9, {"q": {5: rq}, "v": {5: 0.3}}), generator=torch.Generator().manual_seed(1)
            )
            set_step(model, 0)
            out = model(**inputs).sample
            errs.append(float((out - ref).norm() / ref.norm()))
            remove_asymrnr(model)
    assert all(torch.isfinite(torch.tensor(errs))) and 0 < errs[0] < errs[1] < 1.0


def test_cache_and_step_callback_and_stuck_step_warning(model, inputs):
    state = apply_asymrnr(model, _sched(9, 9, {"q": {5: 0.5}}), cache_steps=2)

    class Pipe:
        transformer = model

    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(**inputs)
        model(**inputs)  # second forward without set_step -> warn that the schedule is stuck at step 0
    assert any("set_step was never called" in str(w.message) for w in caught)
    state.cache.clear()
    with torch.no_grad():
        for i in range(4):
            if i == 0:
                set_step(model, 0)  # later steps come from the pipeline callback
            model(**inputs)
            asymrnr_step_callback(Pipe, i, None, {})
    remove_asymrnr(model)
    steps = sorted({s for (key, s) in state.cache.recomputed})
    assert steps == [0, 2]  # matching recomputed every 2 steps, for each block's q


def test_calibration_from_a_run_gives_a_schedule_with_every_block_and_step(model, inputs):
    def run():
        with torch.no_grad():
            for i in range(3):
                set_step(model, i)
                model(**inputs)

    sched = calibrate_asymrnr(model, run, 3, {"q": {7: 0.5}})
    assert sched.tiers["q"].shape == (2, 3) and set(sched.tiers) == {"q", "k", "v"}
    assert not hasattr(model, "_asymrnr_state")


def test_bad_inputs(model):
    with pytest.raises(TypeError, match="transformer must be a diffusers CogVideoXTransformer3DModel"):
        apply_asymrnr(torch.nn.Linear(2, 2), _sched(0, 0, {}))
    with pytest.raises(ValueError, match="schedule must have num_blocks = 2"):
        apply_asymrnr(model, RnRSchedule({"q": torch.zeros(3, 4, dtype=torch.long)}))
    with pytest.raises(ValueError, match="transformer is not patched"):
        set_step(model, 1)
