"""Detecting Strategic Deception Using Linear Probes — ICML 2025, P52: linear deception probes on model activations.

Goldowsky-Dill, Chughtai, Heimersheim, Hobbhahn (Apollo Research), ICML 2025 (arXiv 2502.03407); official
code ``ApolloResearch/deception-detection``. A linear probe trained on the residual-stream activations
of a contrastive dataset (the same true facts under "be honest" / "be dishonest" instructions) scores
every token of a response; the mean token score is the dialogue's score, and a threshold at 1%
false positives on ordinary chat (Alpaca) flags deceptive responses.

* probes (``probes.py``), scikit-learn estimators: :class:`LogisticProbe` (the paper's), :class:`MeanDiffProbe`
  (MMS), :class:`LATProbe` (RepE), :class:`LDAProbe` (covariance-adjusted MMS);
* data (``data.py``): :class:`TokenActs`, :func:`instructed_pairs`, :func:`split_last_words`,
  :func:`detection_mask_from_offsets`;
* scoring (``scoring.py``): :func:`score_dialogues`, :func:`aggregate_token_scores`,
  :func:`threshold_at_fpr`, :func:`auroc`, :func:`evaluate_probe`;
* :class:`DeceptionSimulator` (``synthetic.py``): synthetic activations with a known optimal probe;
* ``extract_activations``, ``extract_hidden_states``, ``tokenize_dialogue``, ``format_dialogue`` (``hf.py``, extra ``[hf]``,
  imported on first access): activations of transformers models on the detection span.
"""

from __future__ import annotations

from icml25.interpretability.deception_probes.data import (
    CONTROL,
    DECEPTIVE,
    HONEST,
    TokenActs,
    detection_mask_from_offsets,
    instructed_pairs,
    split_last_words,
)
from icml25.interpretability.deception_probes.probes import LATProbe, LDAProbe, LogisticProbe, MeanDiffProbe
from icml25.interpretability.deception_probes.scoring import (
    AGGREGATIONS,
    aggregate_token_scores,
    auroc,
    evaluate_probe,
    score_dialogues,
    threshold_at_fpr,
)
from icml25.interpretability.deception_probes.synthetic import DeceptionSimulator

__all__ = [
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

_HF = ("extract_activations", "extract_hidden_states", "format_dialogue", "tokenize_dialogue")


def __getattr__(name: str) -> object:
    # Lazy: the transformers integration needs the optional dependency (extra [hf]).
    if name in _HF:
        from icml25.interpretability.deception_probes import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
