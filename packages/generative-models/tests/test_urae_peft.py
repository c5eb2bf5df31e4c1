"""P28 URAE with the real peft (a test requirement of the package; the module never imports it): the rank-2r LoRA exported from trained minor-component
adapters loads into the *original* model through ``peft.get_peft_model`` + ``set_peft_model_state_dict`` and
reproduces the adapted model's outputs (Linear and Conv2d layers), and merging it with peft gives the same
weights as fusing the adapters."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

peft = pytest.importorskip("peft")

from icml25.generative_models.urae import (  # noqa: E402
    apply_lora_adapters,
    apply_svd_adapters,
    export_peft_lora_state_dict,
    merge_adapters,
    peft_lora_config,
)
from icml25.kernels import torch_threads  # noqa: E402


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.to_q = nn.Linear(8, 12)
        self.to_k = nn.Linear(8, 12)
        self.proj = nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).mean((2, 3))
        return self.proj(self.to_q(h) * torch.sigmoid(self.to_k(h)))


@pytest.mark.parametrize("kind", ["minor", "major", "lora"])
def test_exported_adapter_loads_in_peft_on_the_original_model(kind) -> None:
    with torch_threads(1):
        torch.manual_seed(0)
        original = Block()
        model = copy.deepcopy(original)
        targets = ["conv", "to_q", "to_k"]
        if kind == "lora":
            params = apply_lora_adapters(
                model, targets, rank=2, reshape_conv=True, generator=torch.Generator().manual_seed(1)
            )
        else:
            params = apply_svd_adapters(model, targets, rank=2, component=kind, reshape_conv=True)
        x = torch.randn(6, 3, 5, 5, generator=torch.Generator().manual_seed(2))
        opt = torch.optim.Adam(params, lr=0.02)
        for _ in range(10):
            loss = (model(x) - 1).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        target = model(x).detach()
        assert not torch.allclose(original(x), target, atol=1e-3)
        pm = peft.get_peft_model(copy.deepcopy(original), peft.LoraConfig(**peft_lora_config(model)))
        res = peft.set_peft_model_state_dict(pm, export_peft_lora_state_dict(model))
        assert not res.unexpected_keys
        assert torch.allclose(pm(x), target, atol=1e-5)
        merged = pm.merge_and_unload()
        fused = merge_adapters(model)
        for name in targets:
            assert torch.allclose(
                merged.get_submodule(name).weight, fused.get_submodule(name).weight, atol=1e-5
            )
