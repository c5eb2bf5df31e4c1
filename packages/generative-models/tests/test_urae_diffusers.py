"""P28 URAE on a real (tiny) diffusers ``FluxTransformer2DModel``: minor-component adapters on the projections
URAE targets (q, k, v, out of every double-stream block; q, k, v of every single-stream block) leave the
output unchanged, train, and export to a LoRA that peft loads on the original transformer; the guidance check
reads the transformer's ``guidance_embeds`` config."""

from __future__ import annotations

import copy

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
peft = pytest.importorskip("peft")

from icml25.generative_models.urae import (  # noqa: E402
    SVDComponentLinear,
    apply_svd_adapters,
    check_guidance_for_adaptation,
    export_peft_lora_state_dict,
    peft_lora_config,
)
from icml25.kernels import torch_threads  # noqa: E402

TARGETS = r"transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0)|single_transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v)"


def _inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "hidden_states": torch.randn(1, 4, 4, generator=g),
        "encoder_hidden_states": torch.randn(1, 3, 8, generator=g),
        "pooled_projections": torch.randn(1, 8, generator=g),
        "timestep": torch.tensor([0.5]),
        "img_ids": torch.zeros(4, 3),
        "txt_ids": torch.zeros(3, 3),
        "guidance": torch.tensor([1.0]),
    }


def test_flux_minor_adapters_train_and_export_to_peft() -> None:
    with torch_threads(1):
        torch.manual_seed(0)
        flux = diffusers.FluxTransformer2DModel(
            in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
            joint_attention_dim=8, pooled_projection_dim=8, guidance_embeds=True, axes_dims_rope=(2, 2, 4),
        )  # fmt: skip
        original = copy.deepcopy(flux)
        kw = _inputs()
        ref = original(**kw).sample
        params = apply_svd_adapters(flux, TARGETS, rank=2)
        adapted = sorted(n for n, m in flux.named_modules() if isinstance(m, SVDComponentLinear))
        assert len(adapted) == 7 and "single_transformer_blocks.0.attn.to_q" in adapted
        assert torch.allclose(flux(**kw).sample, ref, atol=1e-5)
        opt = torch.optim.Adam(params, lr=0.05)
        for _ in range(5):
            loss = (flux(**kw).sample - 1).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        target = flux(**kw).sample.detach()
        assert not torch.allclose(target, ref, atol=1e-4)
        pm = peft.get_peft_model(copy.deepcopy(original), peft.LoraConfig(**peft_lora_config(flux)))
        res = peft.set_peft_model_state_dict(pm, export_peft_lora_state_dict(flux))
        assert not res.unexpected_keys
        assert torch.allclose(pm(**kw).sample, target, atol=1e-4)
        with pytest.warns(UserWarning, match="guidance=3.5 during adaptation"):
            check_guidance_for_adaptation(flux.config, 3.5)
