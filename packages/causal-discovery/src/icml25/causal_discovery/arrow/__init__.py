"""ARROW: An Accelerator for Time Series Causal Discovery with Time Weaving — ICML 2025, P54: the public API.

Yao, Dong, Chen, Kuang, Fang, Long, Gao, Li (ICML 2025; OpenReview C3gAIlPhjV). Re-implemented from the
paper's description and the behaviour of the official code (github.com/XiangguanMu/arrow, read only).

ARROW sits in front of a time-series causal discovery algorithm:

1. **time weaving** (:func:`time_weave`): up/down trend bits, overlapping 3-point patches of 2 bits;
2. **XOR lag discovery** (:func:`xor_lag_scores`): for every ordered pair and lag, the fraction of
   identical and mirrored patch shapes between the effect at ``t+τ`` and the cause at ``t``, computed by
   the packed XOR/popcount op :func:`icml25.kernels.xor_lag.xor_lag_counts`;
3. **pruning** (:func:`prune_candidates`): a global ranking, threshold 0.33 and cap ``d²/4``; optionally
   (``ARROW(rescue="dependence")``, our extension) a binned mutual-information screen
   (:func:`rescue_candidates`) adds back dropped pairs with a non-monotone dependence;
4. the base (:class:`ARROW`, PCMCI / VARLiNGAM / Granger / callable) runs on the kept (cause, lag) links.

Exports: :func:`to_networkx` (nodes named by a DataFrame's columns), :func:`to_tigramite_graph` and
:func:`from_tigramite_graph` (tigramite's ``[source, target, lag]`` string layout).

Example::

    from icml25.causal_discovery.arrow import ARROW, simulate_svar
    X, truth = simulate_svar(d=8, T=1000, rng=0)
    model = ARROW(base="pcmci", lag_max=6).fit(X)
    model.graph_.shape, model.timings_["total"]   # (8, 8, 6)
"""

from icml25.causal_discovery.arrow.bases import (
    BASES,
    all_links,
    granger_base,
    links_to_mask,
    pcmci_base,
    varlingam_base,
)
from icml25.causal_discovery.arrow.estimator import ARROW, default_lag_max, feature_names, to_networkx
from icml25.causal_discovery.arrow.interop import from_tigramite_graph, reverse_mark, to_tigramite_graph
from icml25.causal_discovery.arrow.lags import (
    DependenceScores,
    LagScores,
    check_lag_max,
    dependence_scores,
    n_top,
    null_threshold,
    prune_candidates,
    rescue_candidates,
    xor_lag_scores,
)
from icml25.causal_discovery.arrow.simulate import (
    lagged_f1,
    pruning_recall,
    simulate_repository_var,
    simulate_svar,
    summary_rates,
    tau_accuracy,
)
from icml25.causal_discovery.arrow.weaving import check_series, pack_trend_bits, time_weave

__all__ = [
    "ARROW",
    "BASES",
    "DependenceScores",
    "LagScores",
    "all_links",
    "check_lag_max",
    "check_series",
    "default_lag_max",
    "dependence_scores",
    "feature_names",
    "from_tigramite_graph",
    "granger_base",
    "lagged_f1",
    "links_to_mask",
    "n_top",
    "null_threshold",
    "pack_trend_bits",
    "pcmci_base",
    "prune_candidates",
    "pruning_recall",
    "rescue_candidates",
    "reverse_mark",
    "simulate_repository_var",
    "simulate_svar",
    "summary_rates",
    "tau_accuracy",
    "time_weave",
    "to_networkx",
    "to_tigramite_graph",
    "varlingam_base",
    "xor_lag_scores",
]
