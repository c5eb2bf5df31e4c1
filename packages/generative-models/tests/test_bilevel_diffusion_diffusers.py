"""P30 bilevel diffusion on real diffusers schedulers and a diffusers UNet (the [diffusers] extra): the learnable
cosine schedule feeds DDPMScheduler(trained_betas=...), and RewardGuidedDenoiser runs inside its sampling loop."""

from __future__ import annotations

import math

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from icml25.generative_models.bilevel import LearnableCosineSchedule, QuadraticReward, RewardGuidedDenoiser  # noqa: E402
from icml25.kernels import torch_threads  # noqa: E402
from icml25.kernels.rng import isolated_rng  # noqa: E402

MU = torch.tensor([0.5, -1.0])
S2 = 0.5  # p_pre = N(MU, S2 I)
A = torch.tensor([1.0, 0.4])


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with torch_threads(1):
        yield


def _scheduler(T: int):
    sched = LearnableCosineSchedule(T, 0.0, 1.0, 1.0, 0.008)
    betas = sched.betas().detach()
    ddpm = diffusers.DDPMScheduler(num_train_timesteps=T, trained_betas=betas.numpy(), clip_sample=False)
    return sched, ddpm


def test_learnable_schedule_feeds_ddpm_scheduler() -> None:
    sched, ddpm = _scheduler(100)
    assert torch.allclose(ddpm.alphas_cumprod.double(), sched.alphas_cumprod()[1:].detach(), atol=1e-6)


def _exact_eps(ab: torch.Tensor):
    """The ε-prediction of p_pre = N(MU, S2 I) under the discrete schedule ``ab`` (diffusers indexing)."""

    def eps(x: torch.Tensor, t) -> torch.Tensor:
        a = ab[int(t)]
        return (1 - a).sqrt() * (x - a.sqrt() * MU) / (a * S2 + 1 - a)

    return eps


def _sample(model, ddpm, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ddpm.set_timesteps(ddpm.config.num_train_timesteps)
    x = torch.randn(n, 2, generator=g)
    for t in ddpm.timesteps:
        x = ddpm.step(model(x, t), t, x, generator=g).prev_sample
    return x


def test_exact_reward_guidance_under_ddpm_scheduler_samples_the_tilt() -> None:
    _, ddpm = _scheduler(200)
    ab = ddpm.alphas_cumprod
    lam = 0.8

    def doob(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # ∇ log E[e^{a·x0/λ} | x_t], Gaussian p_pre
        a = ab[t.long()][:, None]
        return (a.sqrt() * S2 / (a * S2 + 1 - a)) * A / lam

    guided = RewardGuidedDenoiser(_exact_eps(ab), ab, guidance=doob, lam=lam)
    plain = _sample(_exact_eps(ab), ddpm, 4000, 0)
    tilted = _sample(guided, ddpm, 4000, 0)
    assert torch.allclose(plain.mean(0), MU, atol=0.06)
    assert torch.allclose(tilted.mean(0), MU + S2 * A / lam, atol=0.06)  # the Gibbs tilt's mean shift
    assert torch.allclose(tilted.var(0), torch.full((2,), S2), atol=0.06)


def test_reward_guidance_wraps_a_diffusers_unet() -> None:
    with isolated_rng(0):
        unet = diffusers.UNet2DModel(
            sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16),
            down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
            norm_num_groups=4,
        ).eval()  # fmt: skip
    _, ddpm = _scheduler(50)
    target = torch.randn(64, generator=torch.Generator().manual_seed(1))
    reward = QuadraticReward(target.double())  # r(x) = target · vec(x)
    lam = 2.0
    wrapped = RewardGuidedDenoiser(
        unet, ddpm.alphas_cumprod, reward=lambda x: reward(x.double().flatten(1)), lam=lam
    )
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        base = unet(x, 10).sample
        out = wrapped(x, 10)
    assert isinstance(out, diffusers.models.unets.unet_2d.UNet2DOutput)
    sig = math.sqrt(1 - float(ddpm.alphas_cumprod[10]))
    expected = base - sig * target.reshape(1, 1, 8, 8) / lam
    assert torch.allclose(out.sample, expected, atol=1e-5)
