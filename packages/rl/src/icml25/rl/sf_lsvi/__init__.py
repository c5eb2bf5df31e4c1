"""Bellman Unbiasedness (SF-LSVI) — ICML 2025, P43: distributional RL with moment functionals.

Cho, Han, Ju, Kim, Lee, Lee, "Bellman Unbiasedness: Toward Provably Efficient Distributional Reinforcement
Learning with General Value Function Approximation", ICML 2025 (arXiv 2407.21260; no official code
released). Among statistical functionals of the return, only moments are both Bellman-closed and
Bellman-unbiased: a moment Bellman target built from one sampled transition is unbiased, a quantile target
is not. SF-LSVI regresses the first ``N`` moments with least-squares value iteration and acts on an
optimistic mean, with regret ``O~(d_E H^{3/2} sqrt(K))``.

* :mod:`~icml25.rl.sf_lsvi.moments`: :func:`moment_bellman_target`, :func:`quantile_bellman_target`,
  :func:`project_moments`;
* :mod:`~icml25.rl.sf_lsvi.agents`: :class:`TabularSFLSVI`, :class:`LinearSFLSVI` (``n_moments=1`` is
  LSVI-UCB), :class:`EpsilonGreedyQLearning`, :class:`Transition`, :class:`EpisodeBatch`;
* :mod:`~icml25.rl.sf_lsvi.mdp`: :class:`TabularMDP` and exact dynamic programming
  (:func:`exact_return_moments`, :func:`exact_return_pmf`, :func:`optimal_policy`);
* :mod:`~icml25.rl.sf_lsvi.envs`: gymnasium adapters (:class:`TabularMDPEnv`,
  :func:`tabular_mdp_from_gym`, :func:`run_episode`).
"""

from icml25.rl.sf_lsvi.agents import (
    EpisodeBatch,
    EpsilonGreedyQLearning,
    LinearSFLSVI,
    TabularSFLSVI,
    Transition,
)
from icml25.rl.sf_lsvi.envs import TabularMDPEnv, run_episode, tabular_mdp_from_gym
from icml25.rl.sf_lsvi.mdp import (
    TabularMDP,
    exact_return_moments,
    exact_return_pmf,
    optimal_policy,
    random_tabular_mdp,
    return_quantiles,
    two_branch_chain,
)
from icml25.rl.sf_lsvi.moments import moment_bellman_target, project_moments, quantile_bellman_target

__all__ = [
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
]
