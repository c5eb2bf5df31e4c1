"""P45 Sable: retention forms, the network's train/act consistency, resets, causality, the delayed-cue game,
the PettingZoo integration, the memory probe, bad inputs and the quick reproduction's verdict."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from icml25.kernels import torch_threads
from icml25.kernels.retention import retention, retention_parallel, retention_step
from icml25.rl.experiments import sable as exp
from icml25.rl.sable import (
    DelayedCueEnv,
    IPPOPolicy,
    MultiScaleRetention,
    PPOConfig,
    PPOTrainer,
    SableConfig,
    SableNet,
    forward_peak_bytes,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with torch_threads(1):
        yield


def _qkv(B=2, H=2, T=6, A=3, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T * A, D, generator=g, dtype=torch.float64) for _ in range(3)]


# ------------------------------------------------------------------------------------ retention forms
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk", [1, 2, 6])
def test_parallel_recurrent_chunkwise_agree(causal: bool, chunk: int) -> None:
    T, A = 6, 3
    q, k, v = _qkv(T=T, A=A)
    dones = torch.tensor([[False, False, True, False, False, False], [True, False, False, True, True, False]])
    kappa = torch.tensor([0.9, 0.6], dtype=torch.float64)
    s0 = torch.randn(2, 2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    par, sp = retention_parallel(q, k, v, kappa, n_agents=A, dones=dones, causal_agents=causal, state=s0)
    chk, sc = retention(
        q, k, v, kappa, n_agents=A, dones=dones, causal_agents=causal, chunk_size=chunk, state=s0
    )
    s, outs = s0, []
    for t in range(T):
        sl = slice(t * A, (t + 1) * A)
        o, s = retention_step(
            q[:, :, sl], k[:, :, sl], v[:, :, sl], kappa, s, done=dones[:, t], causal_agents=causal
        )
        outs.append(o)
    rec = torch.cat(outs, dim=2)
    torch.testing.assert_close(chk, par, atol=1e-5, rtol=0)
    torch.testing.assert_close(rec, par, atol=1e-5, rtol=0)
    torch.testing.assert_close(sc, sp, atol=1e-5, rtol=0)
    torch.testing.assert_close(s, sp, atol=1e-5, rtol=0)


def test_kappa_to_zero_keeps_only_the_current_timestep() -> None:
    T, A = 5, 2
    q, k, v = _qkv(B=1, H=1, T=T, A=A)
    out, _ = retention(q, k, v, 1e-30, n_agents=A, chunk_size=2)
    for t in range(T):
        sl = slice(t * A, (t + 1) * A)
        alone, _ = retention(q[:, :, sl], k[:, :, sl], v[:, :, sl], 1e-30, n_agents=A)
        torch.testing.assert_close(out[:, :, sl], alone, atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------------------ network
def _net(memory="rec", A=3, chunk=2, seed=0, n_block=1, n_head=2):
    cfg = SableConfig(A, 7, 3, embed_dim=8, n_head=n_head, n_block=n_block, memory=memory, chunk_size=chunk,
                      decay_scaling_factor=0.9)  # fmt: skip
    net = SableNet(cfg, seed=seed).double()
    g = torch.Generator().manual_seed(seed)
    for head in (net.policy_head, net.value_head):  # non-trivial heads (initialised near zero)
        torch.nn.init.normal_(head[-1].weight, generator=g)
    return net


@pytest.mark.parametrize("memory,chunk", [("rec", 1), ("rec", 2), ("rec", 6), ("ff", 2)])
def test_forward_train_matches_recurrent_acting(memory: str, chunk: int) -> None:
    """Chunkwise training re-evaluates exactly the log-probs and values the recurrent actor produced."""
    net = _net(memory, chunk=chunk, n_block=2)
    B, T, A = 4, 6, 3
    g = torch.Generator().manual_seed(3)
    obs = torch.randn(B, T, A, 7, generator=g, dtype=torch.float64)
    first = torch.zeros(B, T, dtype=torch.bool)
    first[0, 0] = first[1, 3] = first[2, 2] = first[2, 4] = True
    h = net.initial_state(B)
    h = [x + torch.randn(x.shape, generator=g, dtype=x.dtype) * 0.3 for x in h]  # a carried-over state
    h0 = [x.clone() for x in h]
    acts, logps, vals = [], [], []
    for t in range(T):
        a, lp, v, h = net.act(obs[:, t], h, first[:, t], generator=g)
        acts.append(a), logps.append(lp), vals.append(v)
    actions = torch.stack(acts, 1)
    logp, _, value = net.forward_train(obs, actions, first, h0)
    torch.testing.assert_close(logp, torch.stack(logps, 1), atol=1e-8, rtol=0)
    torch.testing.assert_close(value, torch.stack(vals, 1), atol=1e-8, rtol=0)


def test_reset_cuts_all_influence_of_earlier_tokens() -> None:
    net = _net()
    B, T, A = 2, 6, 3
    g = torch.Generator().manual_seed(4)
    obs = torch.randn(B, T, A, 7, generator=g, dtype=torch.float64)
    actions = torch.randint(0, 3, (B, T, A), generator=g)
    dones = torch.zeros(B, T, dtype=torch.bool)
    dones[:, 3] = True
    h0 = [torch.randn(x.shape, generator=g, dtype=x.dtype) for x in net.initial_state(B)]
    lp, _, v = net.forward_train(obs, actions, dones, h0)
    obs2, act2 = obs.clone(), actions.clone()
    obs2[:, :3] += 5.0
    act2[:, :3] = (act2[:, :3] + 1) % 3
    lp2, _, v2 = net.forward_train(obs2, act2, dones, None)  # another pre-reset state too
    torch.testing.assert_close(lp[:, 3:], lp2[:, 3:], atol=1e-10, rtol=0)
    torch.testing.assert_close(v[:, 3:], v2[:, 3:], atol=1e-10, rtol=0)
    assert not torch.allclose(v[:, :3], v2[:, :3])


def test_decoder_is_causal_over_agents() -> None:
    net = _net(A=4)
    g = torch.Generator().manual_seed(5)
    obs = torch.randn(2, 3, 4, 7, generator=g, dtype=torch.float64)
    actions = torch.randint(0, 3, (2, 3, 4), generator=g)
    _, ent, _ = net.forward_train(obs, actions)  # entropy: a function of the logits only
    flipped = actions.clone()
    flipped[:, -1, 0] = (flipped[:, -1, 0] + 1) % 3
    assert not torch.allclose(
        net.forward_train(obs, flipped)[1][:, -1, 1], ent[:, -1, 1]
    )  # agent 1 reads agent 0
    for i in range(4):
        # Within the last timestep agent i sees the actions of agents < i only (earlier timesteps: all).
        other = actions.clone()
        other[:, -1, i:] = torch.randint(0, 3, other[:, -1, i:].shape, generator=g)
        _, ent2, _ = net.forward_train(obs, other)
        torch.testing.assert_close(ent2[:, :, : i + 1], ent[:, :, : i + 1], atol=1e-10, rtol=0)


def test_joint_log_prob_is_the_sum_over_agents() -> None:
    """The autoregressive product of per-agent probabilities is a distribution over joint actions."""
    net = _net(A=3)
    obs = torch.randn(1, 1, 3, 7, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    joints = torch.tensor(list(itertools.product(range(3), repeat=3)))  # [27, 3]
    lp, _, _ = net.forward_train(obs.expand(27, 1, 3, 7), joints[:, None, :])
    assert lp.shape == (27, 1, 3)
    assert abs(float(lp.sum(-1).exp().sum()) - 1.0) < 1e-10


def test_act_memory_is_constant_in_episode_length() -> None:
    net = SableNet(SableConfig(3, 7, 3, embed_dim=8))
    obs = torch.randn(4, 3, 7)
    h = net.initial_state(4)
    sizes = []
    for t in range(40):
        if t in (1, 39):
            sizes.append(forward_peak_bytes(lambda h=h: net.act(obs, h)))
        _, _, _, h = net.act(obs, h)
        assert [x.shape for x in h] == [(4, 1, 8, 8)] * 3
    assert sizes[0] == sizes[1]


def test_memory_probe_linear_for_sable_quadratic_for_attention() -> None:
    mem = exp.measure_memory((32, 128), embed_dim=8, agents_per_chunk=16)
    assert mem["sable"][1] / mem["sable"][0] <= 5.0
    assert mem["attention"][1] / mem["attention"][0] >= 10.0


# --------------------------------------------------------------------------------------- env, PPO
def test_delayed_cue_rewards_only_the_cue_at_the_last_step() -> None:
    env = DelayedCueEnv(6, n_agents=2, episode_length=3, seed=0)
    obs = env.reset()
    cue = obs[:, 0, :2].argmax(1)
    assert obs[:, 1, :2].sum() == 0 and obs[:, 0, :2].sum() == 6
    for _ in range(2):
        obs, r, d, _ = env.step(np.zeros((6, 2), dtype=np.int64))
        assert not d.any() and (r == 0).all() and obs[:, :, :2].sum() == 0
    act = np.stack([cue, cue], 1)
    act[0, 1] = 1 - cue[0]
    _, r, d, info = env.step(act)
    assert d.all() and r.tolist() == [0.0] + [1.0] * 5 and info["success"].tolist() == [False] + [True] * 5


def test_ippo_trains_and_stays_memoryless() -> None:
    env = DelayedCueEnv(32, 2, 3, seed=1)
    res = PPOTrainer(env, IPPOPolicy(env.obs_dim, 2, 2), PPOConfig(lr=3e-3, rollout_length=6), seed=1).train(
        32 * 6 * 8
    )
    assert len(res.episode_returns) == 32 * 2 * 8 and res.last_mean(256) <= 0.65


def test_initialisation_follows_mava() -> None:
    """Retention W_Q/K/V/G/O ~ N(0, (1/E)²); orthogonal(√2) encoders and heads' first layers (zero biases);
    orthogonal(0.01) heads' last layers (Mava's retention.py and sable_network.py)."""
    E = 64
    net = SableNet(SableConfig(3, 7, 5, embed_dim=E, n_block=2), seed=0)
    ret = [*net.enc_ret, *net.dec_ret1, *net.dec_ret2]
    w = torch.cat([m.weight.flatten() for r in ret for m in (r.w_q, r.w_k, r.w_v, r.w_g, r.w_o)])
    assert abs(float(w.std()) * E - 1.0) < 0.02 and abs(float(w.mean())) < 0.1 / E  # 61,440 draws

    def gram(lin: torch.nn.Linear) -> torch.Tensor:  # W Wᵀ or Wᵀ W, whichever is full rank
        W = lin.weight.detach().double()
        return W @ W.T if W.shape[0] <= W.shape[1] else W.T @ W

    for lin, gain in (
        (net.obs_encoder[1], 2**0.5),
        (net.action_encoder[0], 2**0.5),
        (net.value_head[0], 2**0.5),
        (net.policy_head[0], 2**0.5),
        (net.value_head[-1], 0.01),
        (net.policy_head[-1], 0.01),
    ):
        G = gram(lin)
        torch.testing.assert_close(G, gain**2 * torch.eye(len(G), dtype=G.dtype), atol=1e-5 * gain**2, rtol=0)
        assert lin.bias is None or not lin.bias.any()
    # the earlier initialisation stays reachable: W_Q/K/V std E^-1/2, torch's defaults elsewhere
    old = SableNet(SableConfig(3, 7, 5, embed_dim=E, n_block=2, init="torch"), seed=0)
    wq = torch.cat([r.w_q.weight.flatten() for r in (*old.enc_ret, *old.dec_ret1, *old.dec_ret2)])
    assert abs(float(wq.std()) * E**0.5 - 1.0) < 0.05
    bound = E**-0.5  # torch's nn.Linear: uniform(±1/sqrt(fan_in))
    assert (
        float(old.enc_ret[0].w_o.weight.abs().max()) <= bound
        and float(old.value_head[0].bias.abs().max()) > 0
    )
    with pytest.raises(ValueError, match="init"):
        SableConfig(3, 7, 5, init="xavier")


def test_agent_permutation_keeps_the_carried_state_consistent() -> None:
    """The hidden states sum over agents, so the encoder re-evaluated in another agent order (Mava's training
    shuffle) gives the same per-agent values, permuted, from the acting rollout's states."""
    net = _net(n_block=2)
    B, T, A = 3, 5, 3
    g = torch.Generator().manual_seed(8)
    obs = torch.randn(B, T, A, 7, generator=g, dtype=torch.float64)
    actions = torch.randint(0, 3, (B, T, A), generator=g)
    first = torch.zeros(B, T, dtype=torch.bool)
    first[1, 2] = True
    h0 = [torch.randn(x.shape, generator=g, dtype=x.dtype) * 0.3 for x in net.initial_state(B)]
    lp, _, v = net.forward_train(obs, actions, first, h0)
    for perm in ([2, 0, 1], [1, 0, 2]):
        lp_p, _, v_p = net.forward_train(obs[:, :, perm], actions[:, :, perm], first, h0)
        torch.testing.assert_close(v_p, v[:, :, perm], atol=1e-10, rtol=0)
        # the decoder factorises the joint action in the new order: other log-probs, still finite
        assert lp_p.shape == lp.shape and torch.isfinite(lp_p).all()


@pytest.mark.parametrize("shuffle", [True, False])
def test_training_shuffles_the_agent_order_every_epoch(shuffle: bool) -> None:
    env = DelayedCueEnv(8, 3, 3, seed=2)
    net = SableNet(SableConfig(3, env.obs_dim, env.n_actions, embed_dim=8, chunk_size=3), seed=0)
    seen: list[torch.Tensor] = []
    train = net.forward_train

    def spy(obs, actions, dones=None, hstate=None):
        seen.append(obs.detach().clone())
        return train(obs, actions, dones, hstate)

    net.forward_train = spy  # type: ignore[method-assign]
    cfg = PPOConfig(rollout_length=3, epochs=4, n_minibatches=1, shuffle_agents=shuffle)
    trainer = PPOTrainer(env, net, cfg)
    trainer._start()
    batch, _ = trainer._rollout(np.zeros(8))
    trainer._update(batch)
    assert len(seen) == 4
    orders = set()
    for obs in seen:  # each epoch sees the agents under one permutation (read from the one-hot agent ids)
        ids = obs[..., 2:5]  # [E, T, A, 3]
        perm = ids[0, 0].argmax(-1)
        assert torch.equal(ids, torch.eye(3)[perm].expand_as(ids)) and sorted(perm.tolist()) == [0, 1, 2]
        assert torch.equal(torch.sort(obs.flatten()).values, torch.sort(batch["obs"].flatten()).values)
        orders.add(tuple(perm.tolist()))
    assert (len(orders) > 1) if shuffle else (orders == {(0, 1, 2)})


# ---------------------------------------------------------------------------------------- bad input
def test_embed_dim_not_divisible_by_heads() -> None:
    with pytest.raises(ValueError, match=r"embed_dim.*n_head"):
        SableConfig(2, 4, 2, embed_dim=10, n_head=3)


def test_sequence_not_divisible_by_n_agents() -> None:
    layer = MultiScaleRetention(8, 1, torch.tensor([0.9]), causal_agents=False)
    x = torch.randn(1, 7, 8)
    with pytest.raises(ValueError, match=r"N = 7.*n_agents = 3"):
        layer(x, x, x, n_agents=3)


def test_agents_not_divisible_by_agent_chunk() -> None:
    with pytest.raises(ValueError, match=r"n_agents = 6.*agents_per_chunk = 4"):
        SableConfig(6, 4, 2, memory="ff", agents_per_chunk=4)


def test_dones_must_be_team_level() -> None:
    net = _net(A=2)
    dones = torch.zeros(1, 3, 2, dtype=torch.bool)
    dones[0, 1, 0] = True
    with pytest.raises(ValueError, match="dones must be equal across the 2 agents"):
        net.forward_train(
            torch.zeros(1, 3, 2, 7, dtype=torch.float64), torch.zeros(1, 3, 2, dtype=torch.long), dones
        )


def test_varying_agent_count_is_not_implemented() -> None:
    net = _net(A=3)
    with pytest.raises(NotImplementedError, match="n_agents = 3"):
        net.act(torch.zeros(2, 4, 7, dtype=torch.float64))
    env = DelayedCueEnv(2, n_agents=2)
    with pytest.raises(NotImplementedError, match="agent count is fixed"):
        PPOTrainer(env, SableNet(SableConfig(3, env.obs_dim, 2)))


# -------------------------------------------------------------------------------------- PettingZoo
def test_pettingzoo_parallel_api_and_simple_spread() -> None:
    pytest.importorskip("pettingzoo")
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3
    from pettingzoo.test import parallel_api_test

    from icml25.rl.sable import DelayedCueParallelEnv, ParallelEnvVectorizer, simple_spread

    parallel_api_test(DelayedCueParallelEnv(3, 5), num_cycles=20)
    vec = simple_spread(n_envs=2, n_agents=3, max_cycles=5, seed=0)
    assert (vec.n_agents, vec.obs_dim, vec.n_actions) == (3, 18, 5)
    net = SableNet(SableConfig(3, vec.obs_dim, vec.n_actions, embed_dim=8, chunk_size=2))
    before = [p.detach().clone() for p in net.parameters()]
    res = PPOTrainer(vec, net, PPOConfig(rollout_length=10, epochs=1, n_minibatches=1)).train(20)
    assert len(res.episode_returns) == 4 and np.isfinite(res.episode_returns).all()
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    # the game through the vectoriser equals the numpy game's interface
    cue = ParallelEnvVectorizer(lambda: DelayedCueParallelEnv(2, 4), n_envs=3)
    assert cue.reset(seed=0).shape == (3, 2, 8)
    with pytest.raises(NotImplementedError, match="Gaussian head"):
        ParallelEnvVectorizer(lambda: simple_spread_v3.parallel_env(continuous_actions=True))
    for bad, error in (({"n_agents": 0}, ValueError), ({"max_cycles": 2.5}, TypeError)):
        with pytest.raises(error, match=rf"{next(iter(bad))} must be an int >= 1, got"):
            simple_spread(**bad)


# --------------------------------------------------------------------------------- reproduction gate
@pytest.fixture(scope="module")
def quick_report():
    return exp.run(quick=True, seed=0)


def test_quick_reproduction_passes(quick_report) -> None:
    assert quick_report.passed, quick_report


def test_quick_gate_fails_without_temporal_memory(quick_report) -> None:
    """The mechanism removed (ff-Sable as the method: no memory over time) fails the quick gate."""
    del quick_report
    base = {m: exp.train_method(exp.QUICK, m, 0) for m in ("ff", "ippo")}
    rep = exp.evaluate(exp.QUICK, 0, method="ff", baselines=base)
    assert not rep.passed
    assert rep.metrics["rec_sable_success"] <= 0.6


@pytest.mark.slow
def test_full_run_is_a_known_miss_of_the_success_checks() -> None:
    """At the official defaults (Mava's initialisation and per-epoch agent shuffle) rec-Sable does not learn
    the delayed cue within the full run's budget: the two success checks miss, the rest hold."""
    report = exp.run(quick=False, seed=0)
    assert [ok for _, ok in report.checks.items()] == [False, False, True, True, True, True]
    assert report.passed is False
    assert report.metrics["rec_sable_success"] < 0.9
