"""P32 diffusers integration: aligned ThinkDiff tokens as ``prompt_embeds`` of a tiny random FLUX pipeline, and
the shared-space warning when the pipeline's text encoders hold no T5."""

from __future__ import annotations

import warnings

import pytest
import torch

from icml25.generative_models import FeatureAligner, aligned_prompt_embeds, diffusers_prompt_kwargs
from icml25.kernels.experiment import torch_threads
from icml25.kernels.rng import isolated_rng

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")


def _pipe(with_t5: bool):
    with isolated_rng(0):
        tr = diffusers.FluxTransformer2DModel(
            patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8],
        )  # fmt: skip
        vae = diffusers.AutoencoderKL(
            sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
            latent_channels=1, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
            shift_factor=0.0609, scaling_factor=1.5035,
        )  # fmt: skip
        clip = transformers.CLIPTextModel(transformers.CLIPTextConfig(
            vocab_size=50, hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
            projection_dim=32))  # fmt: skip
        t5 = transformers.T5EncoderModel(transformers.T5Config(vocab_size=50, d_model=32, d_kv=16, d_ff=64,
                                                               num_layers=1, num_heads=2)) if with_t5 else None  # fmt: skip
    return diffusers.FluxPipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=clip, tokenizer=None,
        text_encoder_2=t5, tokenizer_2=None, transformer=tr,
    )  # fmt: skip


def test_aligned_tokens_drive_a_flux_pipeline() -> None:
    pipe = _pipe(with_t5=True)
    aligner = FeatureAligner(24, 32, seed=0).init_norm_from(pipe.text_encoder_2.encoder.final_layer_norm)
    feats = torch.randn(2, 5, 24, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    emb, m = aligned_prompt_embeds(lambda x: (x, mask), aligner, feats)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a T5 is present: no shared-space warning
        kw = diffusers_prompt_kwargs(pipe, emb, m, pooled_prompt_embeds=torch.zeros(2, 32))
    assert (kw["prompt_embeds"][1, 3:] == 0).all()
    with torch_threads(1):
        out = pipe(**kw, num_inference_steps=2, height=16, width=16, output_type="pt", guidance_scale=1.0,
                   generator=torch.Generator().manual_seed(0)).images  # fmt: skip
        again = pipe(**kw, num_inference_steps=2, height=16, width=16, output_type="pt", guidance_scale=1.0,
                     generator=torch.Generator().manual_seed(0)).images  # fmt: skip
    assert out.shape == (2, 3, 16, 16) and torch.isfinite(out).all()
    torch.testing.assert_close(out, again)


def test_clip_only_pipeline_warns_and_width_is_checked() -> None:
    pipe = _pipe(with_t5=False)
    emb = torch.randn(1, 4, 32, generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning, match=r"\['CLIPTextModel'\], none a T5"):
        diffusers_prompt_kwargs(pipe, emb)
    with pytest.raises(ValueError, match=r"prompt_embeds must have width 32 .* got shape \(1, 4, 16\)"):
        diffusers_prompt_kwargs(pipe, emb[..., :16])
