"""icml25.interpretability — Interpretability: sparse autoencoders, probes, attention-head analysis.

Each paper is one module (its docstring cites the paper and its catalog id); the public API of every
implemented paper is re-exported here.
"""

from importlib.metadata import version as _distribution_version
from typing import Any

from icml25.interpretability.deception_probes import (
    AGGREGATIONS,
    CONTROL,
    DECEPTIVE,
    HONEST,
    DeceptionSimulator,
    LATProbe,
    LDAProbe,
    LogisticProbe,
    MeanDiffProbe,
    TokenActs,
    aggregate_token_scores,
    auroc,
    detection_mask_from_offsets,
    evaluate_probe,
    instructed_pairs,
    score_dialogues,
    split_last_words,
    threshold_at_fpr,
)
from icml25.interpretability.diversity import (
    APD,
    Bottleneck,
    Circles,
    Diameter,
    DiversityMeasure,
    Energy,
    LogDet,
    Magnitude,
    NNMean,
    NumDistinct,
    VendiScore,
    distance_matrix,
    max_clique_size,
    pairwise,
    vendi_from_kernel,
)
from icml25.interpretability.diversity_axioms import (
    AxiomResult,
    audit,
    audit_table,
    metric_push,
    verify_counterexample,
)
from icml25.interpretability.icl_heads import (
    ABLATION_MODES,
    FVScores,
    HeadActivationSite,
    ICLPrompt,
    ICLTask,
    ICLTemplate,
    TinyICLTransformer,
    ablate_heads,
    build_prompt,
    fv_scores,
    icl_accuracy,
    induction_score_from_attention,
    induction_scores,
    make_synthetic_icl_tasks,
    mean_head_activations,
    random_heads,
    random_token_activations,
    sample_prompts,
    select_heads,
    tiny_llama,
    token_loss_difference,
    train_synthetic_icl,
)
from icml25.interpretability.relu_regions import (
    FitResult,
    RegionCount,
    TriangleActivation,
    TriangleNet,
    count_linear_regions_1d,
    fit_1d,
    kaiming_mlp,
    triangle_wave,
)
from icml25.interpretability.sae import (
    ActivationNormalizer,
    BatchTopKSAE,
    MatryoshkaKSAE,
    MatryoshkaSAE,
    ReLUSAE,
    SparseAutoencoder,
    TopKSAE,
    from_saelens,
    pareto_curve,
    sae_metrics,
    to_saelens,
    train_sae,
)

__version__ = _distribution_version("icml25-interpretability")

# The transformers integration of P52 (extra `[hf]`) is one lazy hop away, so that `import
# icml25.interpretability` never imports transformers; its names are left out of __all__ so that
# `from icml25.interpretability import *` works without it.
_HF = ("extract_activations", "extract_hidden_states", "format_dialogue", "tokenize_dialogue")


def __getattr__(name: str) -> Any:
    if name in _HF:
        from icml25.interpretability.deception_probes import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [  # noqa: RUF022 (grouped by paper)
    "__version__",
    # P22 Matryoshka SAE
    "ActivationNormalizer",
    "BatchTopKSAE",
    "MatryoshkaKSAE",
    "MatryoshkaSAE",
    "ReLUSAE",
    "SparseAutoencoder",
    "TopKSAE",
    "from_saelens",
    "pareto_curve",
    "sae_metrics",
    "to_saelens",
    "train_sae",
    # P23 ReLU networks with exactly 2^d linear regions
    "FitResult",
    "RegionCount",
    "TriangleActivation",
    "TriangleNet",
    "count_linear_regions_1d",
    "fit_1d",
    "kaiming_mlp",
    "triangle_wave",
    # P34 diversity measures and their axiom audit
    "APD",
    "AxiomResult",
    "Bottleneck",
    "Circles",
    "Diameter",
    "DiversityMeasure",
    "Energy",
    "LogDet",
    "Magnitude",
    "NNMean",
    "NumDistinct",
    "VendiScore",
    "audit",
    "audit_table",
    "distance_matrix",
    "max_clique_size",
    "metric_push",
    "pairwise",
    "vendi_from_kernel",
    "verify_counterexample",
    # P51 induction heads vs function-vector heads
    "ABLATION_MODES",
    "FVScores",
    "HeadActivationSite",
    "ICLPrompt",
    "ICLTask",
    "ICLTemplate",
    "TinyICLTransformer",
    "ablate_heads",
    "build_prompt",
    "fv_scores",
    "icl_accuracy",
    "induction_score_from_attention",
    "induction_scores",
    "make_synthetic_icl_tasks",
    "mean_head_activations",
    "random_heads",
    "random_token_activations",
    "sample_prompts",
    "select_heads",
    "tiny_llama",
    "token_loss_difference",
    "train_synthetic_icl",
    # P52 deception probes
    "AGGREGATIONS",
    "CONTROL",
    "DECEPTIVE",
    "HONEST",
    "DeceptionSimulator",
    "LATProbe",
    "LDAProbe",
    "LogisticProbe",
    "MeanDiffProbe",
    "TokenActs",
    "aggregate_token_scores",
    "auroc",
    "detection_mask_from_offsets",
    "evaluate_probe",
    "instructed_pairs",
    "score_dialogues",
    "split_last_words",
    "threshold_at_fpr",
]
