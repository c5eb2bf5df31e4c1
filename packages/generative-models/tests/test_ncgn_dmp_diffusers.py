"""P31 NCGN with real diffusers schedulers (the [diffusers] extra): DDPM and flow-match timesteps become the
data-ness s that sets the DMP graph, and the network runs as the denoiser inside the schedulers' loops."""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from icml25.generative_models import NoiseConditionedGNN, dmp_schedule, scheduler_timestep_to_s  # noqa: E402
from icml25.kernels.rng import isolated_rng  # noqa: E402


def _model() -> NoiseConditionedGNN:
    with isolated_rng(0):
        return NoiseConditionedGNN(2, 16, 2, n_layers=2, k=4).eval()


def test_ddpm_timesteps_map_to_increasing_data_ness_and_coarse_graphs_first():
    sched = diffusers.DDPMScheduler(num_train_timesteps=1000)
    sched.set_timesteps(10)
    s = scheduler_timestep_to_s(sched, sched.timesteps)
    assert float(s[0]) == pytest.approx(1 - 900 / 1000) and bool((s.diff() > 0).all())
    assert float(scheduler_timestep_to_s(sched, 1000)) == 0.0
    # the noisiest step gets the coarse graph, the last one the full-resolution kNN graph
    exp = dmp_schedule("exp")
    assert exp(float(s[0]), 4, 96)[0] < 30 and exp(float(scheduler_timestep_to_s(sched, 0)), 4, 96) == (96, 4)


def test_ncgn_as_epsilon_model_in_a_ddpm_loop():
    sched = diffusers.DDPMScheduler(num_train_timesteps=100)
    sched.set_timesteps(5)
    model = _model()
    g = torch.Generator().manual_seed(0)
    n, b = 24, 2
    x = torch.randn(b, n, 2, generator=g)
    batch = torch.arange(b).repeat_interleave(n)
    with torch.no_grad():
        for t in sched.timesteps:
            s = scheduler_timestep_to_s(sched, t)
            flat = x.reshape(b * n, 2)
            eps = model(flat, flat, s, batch).reshape(b, n, 2)
            x = sched.step(eps, t, x, generator=g).prev_sample
    assert x.shape == (b, n, 2) and torch.isfinite(x).all()


def test_flow_match_scheduler_sigma_is_one_minus_s():
    sched = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000)
    sched.set_timesteps(6)
    s = scheduler_timestep_to_s(sched, sched.timesteps)
    torch.testing.assert_close(s, 1 - sched.sigmas[:-1].float(), rtol=0, atol=1e-5)
    model = _model()
    x = torch.randn(1, 20, 2, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for t in sched.timesteps:
            flat = x.reshape(20, 2)
            # diffusers' flow match integrates d x / d sigma = noise - data = -(velocity in s)
            v = -model(flat, flat, scheduler_timestep_to_s(sched, t)).reshape(1, 20, 2)
            x = sched.step(v, t, x).prev_sample
    assert torch.isfinite(x).all()


def test_scheduler_without_config_is_rejected():
    with pytest.raises(TypeError, match="scheduler must be a diffusers scheduler"):
        scheduler_timestep_to_s(object(), 10)
