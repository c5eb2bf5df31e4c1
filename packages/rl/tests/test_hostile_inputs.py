"""Hostile-input contract of icml25.rl (CONTRIBUTING.md, "Bad input contract").

P05 GAS, P43 SF-LSVI and P46 CD-KF scheduling: every public callable is registered with a valid example call;
:mod:`icml25.kernels.testing` derives the hostile variants and asserts a clear error or a documented,
finite result.
"""

from __future__ import annotations

import numpy as np
import pytest

import icml25.rl as rl
from icml25.kernels import testing as kt
from icml25.kernels.testing import HostileSpec

_rng = np.random.default_rng(0)
_PHI = _rng.normal(size=(12, 3))
_TRAJ = np.cumsum(_rng.normal(size=(10, 3)), 0)
CONST_OK = "identical embeddings are valid: all states are one cluster / one node"
# A tiny dataset and 3-step trainings: the trainers' contract (and the global-RNG check) in milliseconds.
_DATA = rl.generate_stitch_dataset(rl.GridMaze("snake7"), n_trajectories=12, length_range=(4, 6), seed=0)
_DATA_PHI = _rng.normal(size=(len(_DATA["observations"]), 3))
_TDR_CFG = rl.TDRConfig(hidden_dims=(8,), tdr_dim=3, steps=3, batch_size=8)
_POLICY_CFG = rl.PolicyConfig(hidden_dims=(8,), subgoal_steps=2, steps=3, batch_size=8)
CONST_OBS_OK = "a dataset whose observations are all equal is valid (one state): training stays finite"
HUGE_OBS_GAP = "1e30-scaled observations overflow float32 activations in the MLP to NaN weights (no error)"

SPECS = [
    HostileSpec(
        "td_cluster",
        rl.td_cluster,
        {"phi": _PHI, "H": 2.0},
        ("phi", "H"),
        {"constant": CONST_OK, "huge": "a distance threshold on finite embeddings: finite centres"},
    ),
    HostileSpec(
        "te_filter",
        rl.te_filter,
        {"phi_traj": _TRAJ, "H": 2, "thr": 0.5},
        ("phi_traj", "thr"),
        {
            "constant": "a standing-still trajectory is valid (no direction: filtered out)",
            "huge": "cosines are scale-free",
            "empty:0": "an empty trajectory keeps no state",
        },
    ),
    HostileSpec(
        "select_subgoal",
        rl.select_subgoal,
        {"path": _PHI[:4], "phi_s": _PHI[5], "H": 2.0},
        ("path", "phi_s", "H"),
        {"constant": CONST_OK, "huge": "distances of finite points"},
    ),
    HostileSpec(
        "KeyGraph.build",
        lambda nodes, H: rl.KeyGraph().build(nodes, H),
        {"nodes": _PHI, "H": 2.0},
        ("nodes", "H"),
        {"constant": CONST_OK, "huge": "distances of finite points"},
        covers=("KeyGraph",),
    ),
    HostileSpec(
        "te_filter_dataset",
        rl.te_filter_dataset,
        {"phi": _TRAJ, "starts": np.array([0]), "ends": np.array([9]), "H": 2, "thr": 0.5},
        ("phi", "starts", "ends", "thr"),
        {
            "phi:constant": "a standing-still trajectory is valid",
            "phi:huge": "cosines are scale-free",
            "starts:constant": "a one-trajectory dataset: any single valid start is valid",
            "ends:constant": "a one-trajectory dataset: any single valid end is valid",
        },
    ),
    HostileSpec(
        "train_tdr",
        lambda dataset: rl.train_tdr(dataset, _TDR_CFG, seed=0),
        {"dataset": _DATA},
        (("dataset", "observations"),),
        {"constant": CONST_OBS_OK},
        known={"huge": HUGE_OBS_GAP},
    ),
    HostileSpec(
        "train_policy",
        lambda dataset, phi: rl.train_policy(dataset, phi, _POLICY_CFG, seed=0),
        {"dataset": _DATA, "phi": _DATA_PHI},
        (("dataset", "observations"), "phi"),
        {
            "dataset['observations']:constant": CONST_OBS_OK,
            "phi:constant": "identical embeddings give zero directions: plain BC, finite",
        },
        known={"dataset['observations']:huge": HUGE_OBS_GAP},
    ),
    HostileSpec(
        "waystep_indices",
        rl.waystep_indices,
        {"phi": _TRAJ, "traj_end": np.full(10, 9), "way_steps": 2.0},
        ("phi", "traj_end", "way_steps"),
        {
            "phi:constant": "a standing-still trajectory: no later row is far, every cap is the last row",
            "phi:huge": "distances of finite points",
            "traj_end:constant": "one trajectory ending at the last row: the given input",
        },
    ),
]
EXCLUDED = {
    "TDR": "an nn.Module built by train_tdr; its inputs are checked by validate_offline_dataset",
    "DirectionalCritic": "an nn.Module built by train_policy (low_level='critic')",
    "DirectionalPolicy": "an nn.Module built by train_policy",
    "FlatAgent": "wraps a trained TDR + policy",
    "GASAgent": "fit() goes through validate_offline_dataset (registered below via trajectories)",
    "GridMaze": "an environment: layouts are strings, actions are checked by the gymnasium API",
    "PolicyConfig": "a plain config dataclass",
    "TDRConfig": "a plain config dataclass",
    "generate_stitch_dataset": "a simulator: no array input",
    "trajectories": "structure of a dataset validated by validate_offline_dataset",
    "validate_offline_dataset": "the validator itself; exercised by test_gas",
}


# P43 SF-LSVI (Bellman unbiasedness): moment/quantile targets, exact DP, the tabular and linear agents.
_P43_P = np.array([[[0.3, 0.7], [1.0, 0.0]], [[0.5, 0.5], [0.2, 0.8]]])
_P43_PI = np.array([[[1.0, 0.0], [0.4, 0.6]], [[0.9, 0.1], [0.0, 1.0]]])
_P43_RM = np.array(
    [[[0.5, 0.3, 0.2], [0.1, 0.1, 0.1]], [[0.9, 0.85, 0.8], [0.0, 0.0, 0.0]]]
)  # E[r^2] >= E[r]^2
_P43_EPISODE = [(0, 1, 0.5, 1, False), (1, 0, 0.25, 0, False)]
P43_BATCH = "an empty batch gives an empty batch"
P43_VALID = "any finite moments (or rewards) are a valid input: the expansion is exact arithmetic"


def _p43_fit():
    agent = rl.TabularSFLSVI(2, 2, 2, beta=1.0, seed=0)
    return agent.fit, {"episodes": [_P43_EPISODE, _P43_EPISODE[:1]], "weights": np.array([1.0, 2.0])}, None


def _p43_update(cls):
    def setup():
        return cls(2, 2, 2, seed=0).update, {"episode": list(_P43_EPISODE)}, None

    return setup


def _p43_linear_update():
    agent = rl.LinearSFLSVI(lambda s, a: np.concatenate([s, [a, 1.0]]), 4, 2, 2, seed=0)
    return agent.update, {"episode": [(np.array([0.1, 0.2]), 1, 0.5, np.array([0.3, -0.1]), False)]}, None


SPECS += [
    HostileSpec(
        "moment_bellman_target",
        rl.moment_bellman_target,
        {"r": np.array([0.2, 0.7]), "next_moments": np.array([[1.0, 1.5], [0.5, 0.4]])},
        ("r", "next_moments"),
        {
            "constant": P43_VALID,
            "next_moments:huge": "targets of huge moments are finite in float64 and exact",
        },
    ),
    HostileSpec(
        "quantile_bellman_target",
        rl.quantile_bellman_target,
        {
            "r": np.array([0.2, 0.7]),
            "next_atoms": np.array([[0.0, 1.0, 2.0], [0.5, 0.4, 3.0]]),
            "taus": np.array([0.25, 0.5, 0.75]),
        },
        ("r", "next_atoms", "taus"),
        {
            "r:constant": P43_VALID,
            "next_atoms:constant": "identical atoms: a point-mass sketch",
            "taus:constant": "repeated levels give repeated quantiles",
            "r:huge": "sums of finite numbers",
            "next_atoms:huge": "sums of finite numbers",
        },
    ),
    HostileSpec(
        "project_moments",
        rl.project_moments,
        {"moments": np.array([[1.0, 1.5, 2.5], [0.5, 0.4, 0.3]]), "upper": 3.0},
        ("moments", "upper"),
        {
            "constant": "any raw vector is projected onto the moment conditions",
            "huge": "clipped to the support bound upper^n",
            "moments:empty:0": P43_BATCH,
            "moments:extra_dim": "[..., N] with N = 1: each entry is a first moment",
            "moments:missing_dim": "one moment vector (an empty batch shape)",
        },
    ),
    HostileSpec(
        "exact_return_moments",
        rl.exact_return_moments,
        {"P": _P43_P, "R_moments": _P43_RM, "pi": _P43_PI, "H": 2},
        ("P", "R_moments", "pi"),
        {"R_moments:constant": "constant moments c with c >= c^2 (those of a reward in {0, 1}) are valid"},
    ),
    HostileSpec(
        "optimal_policy",
        rl.optimal_policy,
        {"P": _P43_P, "mean_reward": np.array([[0.5, 0.3], [0.9, 0.0]]), "H": 2},
        ("P", "mean_reward"),
        {
            "mean_reward:constant": "equal rewards: every action is optimal (uniform policy)",
            "mean_reward:huge": "H finite rewards add up to a finite value in float64",
        },
    ),
    HostileSpec(
        "return_quantiles",
        rl.return_quantiles,
        {
            "support": np.array([0.0, 1.0, 2.0]),
            "pmf": np.array([[0.2, 0.5, 0.3], [0.0, 0.1, 0.9]]),
            "taus": np.array([0.25, 0.5]),
        },
        ("support", "pmf", "taus"),
        {
            "pmf:empty:0": P43_BATCH,
            "support:constant": "ties in the support are a valid (degenerate) lattice",
            "support:huge": "quantiles are support points",
            "taus:constant": "repeated levels",
        },
    ),
    HostileSpec(
        "TabularMDP",
        rl.TabularMDP,
        {
            "P": _P43_P,
            "reward_values": np.array([[[0.0, 1.0], [0.5, 0.5]], [[0.0, 0.2], [1.0, 0.0]]]),
            "reward_probs": np.array([[[0.7, 0.3], [1.0, 0.0]], [[0.5, 0.5], [0.1, 0.9]]]),
            "init": np.array([1.0, 0.0]),
            "H": 2,
        },
        ("P", "reward_values", "reward_probs", "init"),
        {
            "reward_values:constant": "any finite reward support is a valid model",
            "reward_values:huge": "the model does not bound rewards; the agents check r_max",
        },
    ),
    HostileSpec(
        "exact_return_pmf",
        lambda pi, resolution: rl.exact_return_pmf(rl.two_branch_chain(H=3), pi, resolution),
        {"pi": np.full((3, 8, 2), 0.5), "resolution": 0.5},
        ("pi", "resolution"),
        {"pi:constant": "the uniform policy"},
    ),
    HostileSpec(
        "two_branch_chain",
        rl.two_branch_chain,
        {"H": 4, "p_risky": 0.3, "r_safe": 0.5},
        ("p_risky", "r_safe"),
    ),
    HostileSpec(
        "TabularSFLSVI",
        lambda eval_policy: rl.TabularSFLSVI(2, 2, 2, eval_policy=eval_policy),
        {"eval_policy": _P43_PI},
        ("eval_policy",),
    ),
    HostileSpec(
        "TabularSFLSVI.fit",
        setup=_p43_fit,
        arrays=("weights",),
        allow={"constant": "equal weights: a plain refit", "huge": "weights are relative (averages)"},
        covers=("TabularSFLSVI",),
    ),
    HostileSpec(
        "TabularSFLSVI.update",
        setup=_p43_update(rl.TabularSFLSVI),
        arrays=(("episode", 0, 2), ("episode", 1, 2)),
        covers=("TabularSFLSVI",),
    ),
    HostileSpec(
        "EpsilonGreedyQLearning.update",
        setup=_p43_update(rl.EpsilonGreedyQLearning),
        arrays=(("episode", 0, 2),),
        covers=("EpsilonGreedyQLearning",),
    ),
    HostileSpec(
        "LinearSFLSVI.update",
        setup=_p43_linear_update,
        arrays=(("episode", 0, 0), ("episode", 0, 2), ("episode", 0, 3)),
        allow={"constant": "a constant observation is a valid state"},
        covers=("LinearSFLSVI",),
    ),
]
EXCLUDED.update(
    {
        "EpisodeBatch": "a container built by EpisodeBatch.from_episodes; validated by TabularSFLSVI.fit",
        "Transition": "a NamedTuple of one step; validated by the agents' update (registered above)",
        "TabularMDPEnv": "an environment: gymnasium checks actions (test_sf_lsvi runs check_env)",
        "random_tabular_mdp": "a simulator: integer sizes and a seed only (checked by check_int)",
        "run_episode": "drives an env and an agent (objects); the agents validate the episode",
        "tabular_mdp_from_gym": "reads a toy-text model (TypeError on other envs); tested on FrozenLake",
    }
)


# P46 CD-KF sensor scheduling: models, the filter, the bound, the optimiser, schedules and Monte Carlo.
_P46_SDE = rl.LinearSDE.matern32()
_P46_SENS = [rl.Sensor([1.0, 0.0], 0.01, cost=1.0), rl.Sensor([1.0, 0.0], 0.2, cost=0.1)]
_P46_T = np.linspace(0.0, 1.0, 5)
_P46_RATES = np.array([[0.5, 2.0], [1.0, 0.0], [0.2, 3.0], [0.0, 1.0]])
_P46_P0 = np.diag([1.0, 3.0])
P46_CONST = "a matrix with equal entries is a valid (rank-one PSD / drift / weight) matrix"
P46_RATES_OK = {"rates:constant": "equal rates are valid (constant Poisson rates)"}
P46_MODEL = {"sde": _P46_SDE, "sensors": _P46_SENS}

SPECS += [
    HostileSpec(
        "LinearSDE",
        rl.LinearSDE,
        {"A": np.array([[0.0, 1.0], [-2.0, -0.5]]), "L": np.eye(2), "Qc": np.diag([0.1, 0.5])},
        ("A", "L", "Qc"),
        {"constant": P46_CONST},
    ),
    HostileSpec(
        "Sensor",
        rl.Sensor,
        {"H": np.array([[1.0, 0.0]]), "R": np.array([[0.05]]), "cost": 0.5},
        ("H", "R", "cost"),
        {
            "H:constant": "H = [1, 1] measures the sum of the states",
            "R:constant": "one entry: the same R",
            "H:missing_dim": "a (n,) vector is one measurement row (here n = 1)",
            "R:missing_dim": "a length-1 R is the scalar noise of a 1-D measurement",
        },
    ),
    HostileSpec(
        "kalman_update",
        rl.kalman_update,
        {"P": _P46_P0, "H": np.array([[1.0, 0.5]]), "R": np.array([[0.3]])},
        ("P", "H", "R"),
        {
            "P:constant": P46_CONST,
            "H:constant": "H = [1, 1] measures the sum of the states",
            "R:constant": "one entry: the same R",
            "R:missing_dim": "a length-1 R is the scalar noise of a 1-D measurement",
        },
    ),
    HostileSpec(
        "mean_cov_bound",
        lambda rates, t_grid, P0: rl.mean_cov_bound(_P46_SDE, _P46_SENS, rates, t_grid, P0),
        {"rates": _P46_RATES, "t_grid": _P46_T, "P0": _P46_P0},
        ("rates", "t_grid", "P0"),
        {**P46_RATES_OK, "P0:constant": P46_CONST},
    ),
    HostileSpec(
        "control_objective",
        lambda rates, t_grid, W, time_weight: rl.control_objective(
            _P46_SDE, _P46_SENS, rates, t_grid, _P46_P0, W=W, W_T=np.eye(2), time_weight=time_weight
        ),
        {
            "rates": _P46_RATES,
            "t_grid": _P46_T,
            "W": np.diag([1.0, 0.0]),
            "time_weight": np.linspace(0.1, 1, 5),
        },
        ("rates", "t_grid", "W", "time_weight"),
        {
            **P46_RATES_OK,
            "W:constant": P46_CONST,
            "time_weight:constant": "a constant weight is the plain integral",
        },
    ),
    HostileSpec(
        "optimize_rates",
        lambda T, lam_max, time_weight: rl.optimize_rates(
            _P46_SDE, _P46_SENS, T, lam_max, M=4, steps=2, time_weight=time_weight
        ),
        {"T": 1.0, "lam_max": 5.0, "time_weight": np.linspace(0.1, 1, 5)},
        ("T", "lam_max", "time_weight"),
        {"time_weight:constant": "a constant weight is the plain integral"},
    ),
    HostileSpec(
        "deterministic_schedule",
        rl.deterministic_schedule,
        {"rates": _P46_RATES, "t_grid": _P46_T, "offset": 0.5},
        ("rates", "t_grid", "offset"),
        {**P46_RATES_OK, "rates:missing_dim": "(M,) is one sensor's rates"},
    ),
    HostileSpec(
        "poisson_schedule",
        lambda rates, t_grid: rl.poisson_schedule(rates, t_grid, seed=0),
        {"rates": _P46_RATES, "t_grid": _P46_T},
        ("rates", "t_grid"),
        {**P46_RATES_OK, "rates:missing_dim": "(M,) is one sensor's rates"},
    ),
    HostileSpec(
        "cdkf_filter",
        lambda times, ys, m0, P0: rl.cdkf_filter(_P46_SDE, _P46_SENS[:1], times, ys, m0, P0),
        {
            "times": [np.array([0.1, 0.4, 0.9])],
            "ys": [np.array([0.2, -0.1, 0.3])],
            "m0": np.zeros(2),
            "P0": _P46_P0,
        },
        (("times", 0), ("ys", 0), "m0", "P0"),
        {
            "times[0]:constant": "simultaneous measurements are valid (processed one after the other)",
            "ys[0]:constant": "any finite measurements",
            "ys[0]:extra_dim": "(k, 1) is the (k_i, m_i) form of 1-D measurements",
            "m0:constant": "any finite prior mean",
            "P0:constant": P46_CONST,
        },
    ),
    HostileSpec(
        "monte_carlo",
        lambda rates, t_grid, P0: rl.monte_carlo(_P46_SDE, _P46_SENS, rates, t_grid, P0, n_runs=3, seed=0),
        {"rates": _P46_RATES, "t_grid": _P46_T, "P0": _P46_P0},
        ("rates", "t_grid", "P0"),
        {**P46_RATES_OK, "P0:constant": P46_CONST},
    ),
    HostileSpec(
        "aux_trajectory",
        lambda controls, t_grid: rl.aux_trajectory(rl.AuxDynamics.integrator([2.0]), controls, t_grid),
        {"controls": np.array([[0.5], [-1.0], [0.0], [2.0]]), "t_grid": _P46_T},
        ("controls", "t_grid"),
        {"controls:constant": "a constant control", "controls:missing_dim": "(M,) is a 1-D control"},
    ),
    HostileSpec(
        "AuxDynamics.integrator",
        rl.AuxDynamics.integrator,
        {"u0": np.array([2.0]), "control_cost": 0.1},
        ("u0", "control_cost"),
        {"u0:constant": "one entry: the same start", "u0:missing_dim": "a scalar start of a 1-D state"},
        covers=("AuxDynamics",),
    ),
]
EXCLUDED.update(
    {
        "AuxPath": "a NamedTuple built by RateSchedule.aux_path from validated arrays",
        "FilterResult": "the NamedTuple returned by cdkf_filter",
        "MonteCarloResult": "the container returned by monte_carlo",
        "ObjectiveTerms": "the NamedTuple returned by control_objective",
        "RateSchedule": "the container returned by optimize_rates",
    }
)


# P45 Sable: tiny networks; obs arrays of the network, the IPPO baseline, the attention encoder and the env.
import torch  # noqa: E402

_P45_CFG = rl.SableConfig(2, 5, 3, embed_dim=8, chunk_size=2)
_P45_NET = rl.SableNet(_P45_CFG, seed=0)
_P45_OBS = torch.randn(3, 2, 5, generator=torch.Generator().manual_seed(0))
_P45_SEQ = torch.randn(2, 3, 2, 5, generator=torch.Generator().manual_seed(1))
_P45_ACT = torch.zeros(2, 3, 2, dtype=torch.long)
P45_CONST = "identical observations are valid: the network's outputs are finite"
P45_HUGE = "RMSNorm on the input rescales 1e30 observations: finite outputs"
SPECS += [
    HostileSpec(
        "SableNet.act",
        lambda obs: _P45_NET.act(obs, generator=torch.Generator().manual_seed(0)),
        {"obs": _P45_OBS},
        ("obs",),
        {"constant": P45_CONST, "huge": P45_HUGE},
        covers=("SableNet", "SableConfig"),
    ),
    HostileSpec(
        "SableNet.forward_train",
        lambda obs: _P45_NET.forward_train(obs, _P45_ACT),
        {"obs": _P45_SEQ},
        ("obs",),
        {"constant": P45_CONST, "huge": P45_HUGE},
    ),
    HostileSpec(
        "MultiScaleRetention",
        lambda kappa: rl.MultiScaleRetention(8, 2, kappa, causal_agents=True),
        {"kappa": torch.tensor([0.9, 0.5])},
        ("kappa",),
        {"constant": "equal decays for all heads are valid"},
        global_rng="constructing an nn.Module draws its initial weights from torch's global generator",
    ),
    HostileSpec(
        "IPPOPolicy.act",
        lambda obs: rl.IPPOPolicy(5, 3, 2).act(obs, generator=torch.Generator().manual_seed(0)),
        {"obs": _P45_OBS},
        ("obs",),
        {"constant": P45_CONST, "huge": "a tanh MLP saturates on 1e30 inputs: finite logits"},
        covers=("IPPOPolicy",),
    ),
    HostileSpec(
        "SoftmaxAttentionEncoder",
        lambda obs: rl.SoftmaxAttentionEncoder(5, 8)(obs),
        {"obs": _P45_OBS},
        ("obs",),
        {"constant": P45_CONST},
        known={"obs:huge": "LayerNorm's variance of 1e30 float32 inputs overflows to NaN (no error)"},
    ),
    HostileSpec(
        "DelayedCueEnv.step",
        lambda actions: (lambda e: (e.reset(), e.step(actions)))(rl.DelayedCueEnv(3, 2, 4)),
        {"actions": np.zeros((3, 2), dtype=np.int64)},
        ("actions",),
        {"constant": "every agent taking the same action is a valid joint action"},
        covers=("DelayedCueEnv",),
    ),
    HostileSpec(
        "PPOTrainer.train",
        lambda total_steps: rl.PPOTrainer(
            rl.DelayedCueEnv(2, 2, 2), rl.IPPOPolicy(6, 2, 2), rl.PPOConfig(rollout_length=2, epochs=1)
        ).train(total_steps),
        {"total_steps": 4},
        (),
        covers=("PPOTrainer", "PPOConfig"),
    ),
    HostileSpec(
        "forward_peak_bytes",
        rl.forward_peak_bytes,
        {"fn": lambda: torch.ones(3, 4) * 2},
        (),
    ),
]
EXCLUDED.update({"TrainResult": "the container returned by PPOTrainer.train"})


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_hostile_inputs(spec: HostileSpec) -> None:
    print(spec.check().summary())


def test_registry_covers_public_api() -> None:
    print("icml25.rl covers", kt.assert_covers(rl, SPECS, EXCLUDED))


# ---------------------------------------------------------------------------- issue 81 (bad input round 2)
def test_grid_maze_step_rejects_non_integer_actions_and_needs_reset() -> None:
    import gymnasium as gym

    env = rl.GridMaze("snake7")
    with pytest.raises(gym.error.ResetNeeded, match=r"step\(\) called before reset\(\)"):
        env.step(0)
    env.reset(seed=0)
    for bad in (1.5, True, np.array([1]), "1"):
        with pytest.raises(TypeError, match=r"^action must be an int in \[0, 3\], got"):
            env.step(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^action must be an int in \[0, 3\], got 4"):
        env.step(4)
    env.step(np.int64(1))
    env.step(np.array(2))  # a 0-d integer array, as Discrete(4).contains accepts


def test_multi_scale_retention_checks_its_form_and_documents_nan() -> None:
    kappa = torch.tensor([0.9, 0.5])
    with pytest.raises(ValueError, match=r"^embed_dim must be an int >= 1, got 0"):
        rl.MultiScaleRetention(0, 2, kappa, causal_agents=True)
    m = rl.MultiScaleRetention(8, 2, kappa, causal_agents=True)
    x = torch.randn(2, 6, 8)
    with pytest.raises(ValueError, match=r"^key must have shape \(\*, \*, 8\)"):
        m(torch.randn(2, 6, 4), x, x, n_agents=3)
    with pytest.raises(TypeError, match=r"^key must be a torch.float32 tensor .* got torch.float64"):
        m(x.double(), x, x, n_agents=3)
    with pytest.raises(ValueError, match=r"^value must have the shape of key"):
        m(x, x, x[:, :3], n_agents=3)
    bad = x.clone()
    bad[0, 0, 0] = float("nan")
    y, _state = m(bad, bad, bad, n_agents=3)  # documented: values are not checked, NaN propagates
    assert torch.isnan(y[0]).any() and torch.isfinite(y[1]).all()


def test_delayed_cue_actions_out_of_range_name_the_values() -> None:
    env = rl.DelayedCueEnv(2, 3, 4)
    env.reset()
    with pytest.raises(ValueError, match=r"^actions must be integers in \{0, 1\}, got values in \[0, 7\]"):
        env.step(np.array([[0, 7, 0], [0, 0, 0]]))
    with pytest.raises(TypeError, match=r"^actions must be an integer array"):
        env.step(np.zeros((2, 3)))
    assert "Not a ``gymnasium.Env``" in (rl.DelayedCueEnv.__doc__ or "")
    pytest.importorskip("pettingzoo")
    from icml25.rl.sable.pettingzoo_env import DelayedCueParallelEnv

    par = DelayedCueParallelEnv(2, 3)
    par.reset(seed=0)
    with pytest.raises(ValueError, match=r"^actions\['agent_0'\] must be an int in \[0, 1\], got 7"):
        par.step({"agent_0": 7, "agent_1": 0})
    with pytest.raises(TypeError, match=r"^actions\['agent_1'\] must be an int in \[0, 1\], got float 1.0"):
        par.step({"agent_0": 0, "agent_1": 1.0})


def test_exact_return_moments_rejects_impossible_reward_moments() -> None:
    rm = np.zeros((2, 2, 2))
    rm[..., 0], rm[..., 1] = 0.5, 0.1  # E[r^2] = 0.1 < E[r]^2 = 0.25
    with pytest.raises(
        ValueError, match=r"^R_moments must be moments of a real reward \(E\[r\^2\] >= E\[r\]\^2\)"
    ):
        rl.exact_return_moments(np.full((2, 2, 2), 0.5), rm, np.zeros((2, 2), dtype=np.int64), 2)
