"""icml25.causal_discovery — Causal discovery: MAG listing, time-series causal discovery acceleration, subset selection.

Each paper is one module (its docstring cites the paper and its catalog id); the public API of every
implemented paper is re-exported here, lazily: a name imports its module on first use, so importing the
package imports no paper module and a broken module breaks only its own names (:mod:`icml25.kernels.lazy`).
"""

from importlib.metadata import version as _distribution_version
from typing import TYPE_CHECKING

from icml25.kernels.lazy import lazy_namespace

if TYPE_CHECKING:  # the name -> module map of the lazy namespace (icml25.kernels.lazy)
    from icml25.causal_discovery.arrow import (
        ARROW,
        null_threshold,
        prune_candidates,
        time_weave,
        xor_lag_scores,
    )
    from icml25.causal_discovery.best_subset import (
        OptimalPursuitRegressor,
        best_subset_exhaustive,
        entry_scores,
        exit_scores,
    )
    from icml25.causal_discovery.fair_coreset import (
        ASSIGNMENTS,
        Coreset,
        FairCoreset,
        MetricWarning,
        build_fair_coreset,
        uniform_coreset,
    )
    from icml25.causal_discovery.fair_coreset_cost import fair_cost, proportional_bounds
    from icml25.causal_discovery.fair_coreset_oracles import (
        CORRUPTIONS,
        StrongOracle,
        WeakOracle,
        robust_distance,
    )
    from icml25.causal_discovery.mag_listing import (
        MAG,
        PAG,
        InconsistentBackgroundKnowledge,
        ListingStats,
        apply_background_knowledge,
        is_mag,
        list_mags,
        list_mags_bruteforce,
        markov_equivalent,
        pag_from_mag,
    )
    from icml25.causal_discovery.tfl import (
        PromptImageGenerator,
        TFLClassifier,
        make_tfl,
        mrp_features,
        retrieve_image_prompts,
        retrieve_text_prompts,
        sharpen_prior,
        tfl_rc_loss,
    )
else:
    __getattr__, __dir__ = lazy_namespace(__name__, __file__)

__version__ = _distribution_version("icml25-causal-discovery")

__all__ = [
    "ARROW",
    "ASSIGNMENTS",
    "CORRUPTIONS",
    "MAG",
    "PAG",
    "Coreset",
    "FairCoreset",
    "InconsistentBackgroundKnowledge",
    "ListingStats",
    "MetricWarning",
    "OptimalPursuitRegressor",
    "PromptImageGenerator",
    "StrongOracle",
    "TFLClassifier",
    "WeakOracle",
    "__version__",
    "apply_background_knowledge",
    "best_subset_exhaustive",
    "build_fair_coreset",
    "entry_scores",
    "exit_scores",
    "fair_cost",
    "is_mag",
    "list_mags",
    "list_mags_bruteforce",
    "make_tfl",
    "markov_equivalent",
    "mrp_features",
    "null_threshold",
    "pag_from_mag",
    "proportional_bounds",
    "prune_candidates",
    "retrieve_image_prompts",
    "retrieve_text_prompts",
    "robust_distance",
    "sharpen_prior",
    "tfl_rc_loss",
    "time_weave",
    "uniform_coreset",
    "xor_lag_scores",
]
