"""P16 transformers integration: FlexibleViewReconstructor with a real (tiny, random-init) Dinov2Model as its
per-view tokeniser: shapes, set-invariance, masked views and a few training steps."""

from __future__ import annotations

import pytest
import torch

from icml25.generative_models import flex3d as f
from icml25.generative_models.experiments import flex3d as exp
from icml25.kernels.experiment import torch_threads

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("icml25.generative_models.flex3d_hf")


def test_dinov2_encoder_is_a_transformers_model_and_set_invariant() -> None:
    g = torch.Generator().manual_seed(0)
    images = f.sample_ellipsoid_scenes(2, generator=g).render(cams := exp.random_cameras(2, 4, g), 16)
    m = f._init_reconstructor(0, img_size=16, plane_res=8, dim=32, encoder="dinov2")
    assert isinstance(m.encoder, hf.DinoViewTokens)
    assert isinstance(m.encoder.model, transformers.Dinov2Model)
    with torch.no_grad():
        tokens = m.encoder(torch.randn(3, 9, 16, 16))
        tri = m(images, cams)
        perm = torch.tensor([2, 0, 3, 1])
        tri_p = m(images[:, perm], cams[:, perm])
        mask = torch.tensor([[True, True, False, False], [True] * 4])
        part = m(images, cams, mask)
        alone = m(images[:1, :2], cams[:1, :2])
    assert tokens.shape == (3, 1 + 4, 32)
    assert tri.shape == (2, 3, 16, 8, 8)
    assert torch.allclose(tri, tri_p, atol=1e-5)
    assert torch.allclose(part[:1], alone, atol=1e-5)


def test_dinov2_reconstructor_trains() -> None:
    g = torch.Generator().manual_seed(1)
    images = f.sample_ellipsoid_scenes(4, generator=g).render(cams := exp.random_cameras(4, 6, g), 16)
    m = f._init_reconstructor(0, img_size=16, plane_res=8, dim=32, encoder="dinov2")
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    losses = []
    with torch_threads(1):
        for _ in range(25):
            pred = m.render(m(images[:, :4], cams[:, :4]), cams[:, 4:])
            loss = ((pred - images[:, 4:]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5]), losses
