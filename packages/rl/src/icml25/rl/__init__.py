"""icml25.rl — Reinforcement learning: offline hierarchical RL, distributional RL, MARL.

Each paper is one module (its docstring cites the paper and its catalog id); the public API of every
implemented paper is re-exported here, lazily: a name imports its module on first use, so importing the
package imports no paper module and a broken module breaks only its own names (:mod:`icml25.kernels.lazy`).
Importing the package registers the grid mazes with gymnasium (``gymnasium.make("icml25/GridMaze-v0")``, ids
in ``icml25.rl.maze.ENV_IDS``): :mod:`icml25.rl.maze`, the environment module, is its one eager import.
"""

from importlib.metadata import version as _distribution_version
from typing import TYPE_CHECKING

from icml25.kernels.lazy import lazy_namespace
from icml25.rl.maze import register_envs

if TYPE_CHECKING:  # the name -> module map of the lazy namespace (icml25.kernels.lazy)
    from icml25.rl.cdkf import kalman_update, mean_cov_bound
    from icml25.rl.cdkf_control import ObjectiveTerms, RateSchedule, control_objective, optimize_rates
    from icml25.rl.cdkf_models import AuxDynamics, AuxPath, LinearSDE, Sensor, aux_trajectory
    from icml25.rl.cdkf_schedules import (
        FilterResult,
        MonteCarloResult,
        cdkf_filter,
        deterministic_schedule,
        monte_carlo,
        poisson_schedule,
    )
    from icml25.rl.datasets import trajectories, validate_offline_dataset
    from icml25.rl.gas import (
        TDR,
        DirectionalCritic,
        DirectionalPolicy,
        FlatAgent,
        GASAgent,
        KeyGraph,
        PolicyConfig,
        TDRConfig,
        select_subgoal,
        td_cluster,
        te_filter,
        te_filter_dataset,
        train_policy,
        train_tdr,
        waystep_indices,
    )
    from icml25.rl.maze import GridMaze, generate_stitch_dataset
    from icml25.rl.sable import (
        DelayedCueEnv,
        IPPOPolicy,
        MultiScaleRetention,
        PPOConfig,
        PPOTrainer,
        SableConfig,
        SableNet,
        SoftmaxAttentionEncoder,
        TrainResult,
        forward_peak_bytes,
    )
    from icml25.rl.sf_lsvi import (
        EpisodeBatch,
        EpsilonGreedyQLearning,
        LinearSFLSVI,
        TabularMDP,
        TabularMDPEnv,
        TabularSFLSVI,
        Transition,
        exact_return_moments,
        exact_return_pmf,
        moment_bellman_target,
        optimal_policy,
        project_moments,
        quantile_bellman_target,
        random_tabular_mdp,
        return_quantiles,
        run_episode,
        tabular_mdp_from_gym,
        two_branch_chain,
    )
else:
    __getattr__, __dir__ = lazy_namespace(__name__, __file__)

__version__ = _distribution_version("icml25-rl")

# the one eager import: importing icml25.rl registers the grid mazes with gymnasium (icml25.rl.maze,
# the P05 environment: numpy and gymnasium only)
register_envs()

__all__ = [  # noqa: RUF022 (grouped by paper)
    "__version__",
    # P05 GAS
    "TDR",
    "DirectionalCritic",
    "DirectionalPolicy",
    "FlatAgent",
    "GASAgent",
    "GridMaze",
    "KeyGraph",
    "PolicyConfig",
    "TDRConfig",
    "generate_stitch_dataset",
    "select_subgoal",
    "td_cluster",
    "te_filter",
    "te_filter_dataset",
    "train_policy",
    "train_tdr",
    "trajectories",
    "validate_offline_dataset",
    "waystep_indices",
    # P43 SF-LSVI (Bellman unbiasedness)
    "EpisodeBatch",
    "EpsilonGreedyQLearning",
    "LinearSFLSVI",
    "TabularMDP",
    "TabularMDPEnv",
    "TabularSFLSVI",
    "Transition",
    "exact_return_moments",
    "exact_return_pmf",
    "moment_bellman_target",
    "optimal_policy",
    "project_moments",
    "quantile_bellman_target",
    "random_tabular_mdp",
    "return_quantiles",
    "run_episode",
    "tabular_mdp_from_gym",
    "two_branch_chain",
    # P45 Sable (the PettingZoo integration: icml25.rl.sable.DelayedCueParallelEnv / ParallelEnvVectorizer)
    "DelayedCueEnv",
    "IPPOPolicy",
    "MultiScaleRetention",
    "PPOConfig",
    "PPOTrainer",
    "SableConfig",
    "SableNet",
    "SoftmaxAttentionEncoder",
    "TrainResult",
    "forward_peak_bytes",
    # P46 CD-KF sensor scheduling
    "AuxDynamics",
    "AuxPath",
    "FilterResult",
    "LinearSDE",
    "MonteCarloResult",
    "ObjectiveTerms",
    "RateSchedule",
    "Sensor",
    "aux_trajectory",
    "cdkf_filter",
    "control_objective",
    "deterministic_schedule",
    "kalman_update",
    "mean_cov_bound",
    "monte_carlo",
    "optimize_rates",
    "poisson_schedule",
]
