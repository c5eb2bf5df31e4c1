"""P37 VCT on a real diffusers ``UNet2DModel`` (the [diffusers] extra): the wrapped UNet is the consistency
network of image iCT with the variational coupling (a UNet encoder with 2·C output channels), the boundary
condition holds exactly, a training step moves both networks, and one/two-step sampling returns images."""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from icml25.generative_models.vct import (  # noqa: E402
    ConsistencyModel,
    DiffusersUNetNet,
    ImprovedConsistencyTraining,
    NoiseEncoder,
    consistency_sample,
)
from icml25.kernels import torch_threads  # noqa: E402
from icml25.kernels.rng import isolated_rng  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with torch_threads(1):
        yield


def _unet(out_channels: int) -> torch.nn.Module:
    return diffusers.UNet2DModel(
        sample_size=8, in_channels=1, out_channels=out_channels, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=4,
    )  # fmt: skip


def test_unet_consistency_training_with_variational_coupling() -> None:
    with isolated_rng(0):
        model = ConsistencyModel(DiffusersUNetNet(_unet(1)), "linear")
        enc = NoiseEncoder(DiffusersUNetNet(_unet(2)))
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0)) - 0.5
    assert torch.equal(model.denoise(x, model.sigma_min), x)
    mu, sigma = enc(x)
    assert mu.shape == x.shape and bool((sigma > 0).all())
    tr = ImprovedConsistencyTraining(model, 2, "vae", enc, kl_scale=30.0)
    before = [p.clone() for p in tr.parameters()]
    tr.fit(x, batch_size=4, lr=1e-3, ema_decay=0.5, grad_clip=200.0, seed=0)
    moved_model = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=False))
    moved_enc = any(
        not torch.equal(a, b)
        for a, b in zip(before[-len(list(enc.parameters())) :], enc.parameters(), strict=True)
    )
    assert moved_model and moved_enc
    out = consistency_sample(model, (3, 1, 8, 8), 2, encoder=enc, generator=torch.Generator().manual_seed(1))
    assert out.shape == (3, 1, 8, 8) and bool(torch.isfinite(out).all())


def test_unet_encoder_with_wrong_channels_is_rejected() -> None:
    enc = NoiseEncoder(DiffusersUNetNet(_unet(1)))
    with pytest.raises(ValueError, match=r"encoder output must have shape \(N, 2\*C"):
        enc(torch.zeros(2, 1, 8, 8))
