"""Hostile-input contract of icml25.interpretability (CONTRIBUTING.md, "Bad input contract").

P22 Matryoshka SAE and the other SAEs, P23 triangle-wave ReLU networks, P52 deception probes: every public callable is registered with a
valid example call;
:mod:`icml25.kernels.testing` derives the hostile variants and asserts a clear error or a documented,
finite result; the estimators keep their state after a rejected call.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import icml25.interpretability as ip
from icml25.kernels import testing as kt
from icml25.kernels.testing import Allow, HostileSpec

_g = torch.Generator().manual_seed(0)
_X = torch.randn(6, 8, generator=_g)
CONST_OK = "constant activations are valid: the result is finite"
# seed=0: the models' initial weights come from a local generator (the global random state is untouched).
SAES = {
    "TopKSAE": lambda: ip.TopKSAE(8, 16, k=4, seed=0),
    "BatchTopKSAE": lambda: ip.BatchTopKSAE(8, 16, k=4, seed=0),
    "ReLUSAE": lambda: ip.ReLUSAE(8, 16, seed=0),
    "MatryoshkaKSAE": lambda: ip.MatryoshkaKSAE(8, 16, ks=[2, 4], seed=0),
    "MatryoshkaSAE": lambda: ip.MatryoshkaSAE(8, 16, ks=[2, 4], seed=0),
}


def _method(cls: str, method: str):
    def setup():
        model = SAES[cls]()
        return getattr(model, method), {"x": _X}, model

    return setup


SPECS = []
for _cls in SAES:
    SPECS += [
        HostileSpec(
            f"{_cls}.loss",
            setup=_method(_cls, "loss"),
            arrays=("x",),
            covers=(_cls, "SparseAutoencoder"),
            allow={"constant": CONST_OK},
            known={"huge": "1e30-scaled activations overflow the float32 squared error to Inf (no error)"},
        ),
        HostileSpec(
            f"{_cls}.encode",
            setup=_method(_cls, "encode"),
            arrays=("x",),
            covers=(_cls,),
            allow={
                "constant": CONST_OK,
                "empty:0": "an empty batch encodes to an empty batch",
                "missing_dim": "x [..., d_in]: one sample",
                "huge": "latents of a finite x are finite",
            },
        ),
    ]
SPECS += [
    HostileSpec(
        "ActivationNormalizer.fit",
        lambda X: ip.ActivationNormalizer().fit(X),
        {"X": _X},
        ("X",),
        allow={"huge": "the normaliser rescales any finite spread"},
        covers=("ActivationNormalizer",),
    ),
    HostileSpec(
        "sae_metrics",
        ip.sae_metrics,
        {"x": _X, "x_hat": _X * 0.9, "z": torch.rand(6, 16, generator=_g)},
        ("x", "x_hat", "z"),
        allow={
            "x_hat:constant": CONST_OK,
            "z:constant": CONST_OK,
            "huge": "finite inputs give finite metrics",
        },
        known={"x:constant": "explained_variance_batch of a zero-variance batch is NaN (0/0)"},
    ),
    HostileSpec(
        "pareto_curve",
        lambda X: ip.pareto_curve(SAES["TopKSAE"](), X, [2, 4]),
        {"X": _X},
        ("X",),
        allow={"huge": "finite inputs give finite metrics"},
        known={"constant": "explained_variance_batch of a zero-variance batch is NaN (0/0)"},
    ),
    HostileSpec(
        "train_sae",
        lambda data: ip.train_sae(SAES["TopKSAE"](), data, steps=2, batch_size=3, seed=0, progress=False),
        {"data": _X},
        ("data",),
        allow={"constant": CONST_OK},
        known={"huge": "1e30-scaled activations overflow the float32 squared error to Inf (no error)"},
    ),
    HostileSpec("to_saelens", lambda: ip.to_saelens(SAES["TopKSAE"]()), {}, (), covers=("to_saelens",)),
]
# ------------------------------------------------------------------------------------------ P52
_gp = torch.Generator().manual_seed(1)
_ACTS = torch.randn(6, 5, 4, generator=_gp)
_ACTS[1::2, :, 0] += 2.0  # deceptive dialogues shifted along feature 0
_MASK = torch.ones(6, 5, dtype=torch.bool)
_MASK[:, 4] = False
_LABELS = torch.tensor([0, 1, 0, 1, 0, 1])
_TA = ip.TokenActs(_ACTS, _MASK, _LABELS)
_CTRL = ip.TokenActs(torch.randn(4, 5, 4, generator=_gp), _MASK[:4], torch.full((4,), -1))
_TOKENS = torch.randn(12, 4, generator=_gp)
_TOKENS[6:, 0] += 2.0
_TOKEN_Y = np.r_[np.zeros(6, dtype=np.int64), np.ones(6, dtype=np.int64)]
PROBES = {
    "LogisticProbe": lambda: ip.LogisticProbe(),
    "MeanDiffProbe": lambda: ip.MeanDiffProbe(),
    "LATProbe": lambda: ip.LATProbe(seed=0),
    "LDAProbe": lambda: ip.LDAProbe(),
}
HUGE_FIT = "1e30-scaled activations: the scale-equivariant direction is still finite"
LABELS_AS_STR = "string labels '0'/'1' are valid scikit-learn classes (the greater one is deceptive)"
NO_DTYPE = ("nan", "posinf", "neginf", "empty", "extra_dim", "missing_dim", "constant", "huge")
SMALL_CTRL = "only 4 control dialogues: the documented warning (fewer than 1/fpr), a finite threshold"


def _fit_tokens(cls: str):
    def setup():
        probe = PROBES[cls]()
        return probe.fit, {"X": _TOKENS, "y": _TOKEN_Y}, probe

    return setup


def _fitted(cls: str, method: str):
    def setup():
        probe = PROBES[cls]().fit(_TOKENS, _TOKEN_Y)
        return getattr(probe, method), {"X": _TOKENS}, probe

    return setup


def _fit_dialogues(cls: str):
    def setup():
        probe = PROBES[cls]()
        return probe.fit, {"X": [_ACTS[i, :4] for i in range(6)], "y": _LABELS}, probe

    return setup


for _cls in PROBES:
    SPECS += [
        HostileSpec(
            f"{_cls}.fit",
            setup=_fit_tokens(_cls),
            arrays=("X",),
            covers=(_cls,),
            allow={"huge": HUGE_FIT},
        ),
        # y's dtype variant (string labels) is a valid scikit-learn target: test_string_labels covers it.
        HostileSpec(
            f"{_cls}.fit(y)",
            setup=_fit_tokens(_cls),
            arrays=("y",),
            covers=(_cls,),
            kinds=NO_DTYPE,
            allow={
                "extra_dim": "scikit-learn's convention (its check_supervised_y_2d): a column vector y "
                "(n, 1) is raveled, with a DataConversionWarning"
            },
        ),
        HostileSpec(
            f"{_cls}.fit(dialogues)",
            setup=_fit_dialogues(_cls),
            arrays=(("X", 0),),
            covers=(_cls,),
            allow={"huge": HUGE_FIT, "constant": "one constant dialogue among varying ones is data"},
        ),
        HostileSpec(
            f"{_cls}.fit(dialogues, y)",
            setup=_fit_dialogues(_cls),
            arrays=("y",),
            covers=(_cls,),
            kinds=NO_DTYPE,
        ),
        HostileSpec(
            f"{_cls}.decision_function",
            setup=_fitted(_cls, "decision_function"),
            arrays=("X",),
            covers=(_cls,),
            allow={"constant": CONST_OK, "huge": "a linear score of a finite input is finite"},
        ),
        HostileSpec(
            f"{_cls}.score_tokens",
            setup=_fitted(_cls, "score_tokens"),
            arrays=("X",),
            covers=(_cls,),
            allow={
                "constant": CONST_OK,
                "huge": "a linear score of a finite input is finite",
                "missing_dim": "X [..., d]: one token",
                "extra_dim": "never: the last dimension must be d",
                "empty:0": "no tokens score to an empty array",
            },
        ),
    ]
SPECS += [
    HostileSpec(
        "TokenActs",
        ip.TokenActs,
        {"acts": _ACTS, "mask": _MASK, "labels": _LABELS},
        ("acts", "mask", "labels"),
        allow={
            "acts:constant": CONST_OK,
            "acts:huge": "activations are stored as given",
            "mask:constant": "all-True mask",
            "labels:constant": "one label for all dialogues is valid data (e.g. a control set)",
            "labels:dtype": "integer-valued float labels are accepted as ints",
        },
    ),
    HostileSpec(
        "score_dialogues",
        lambda acts: ip.score_dialogues(ip.MeanDiffProbe().fit(_TA), acts),
        {"acts": _TA},
        (),
    ),
    HostileSpec(
        "aggregate_token_scores",
        ip.aggregate_token_scores,
        {"token_scores": np.arange(6.0), "lengths": np.array([2, 1, 3])},
        ("token_scores", "lengths"),
        allow={
            "lengths:constant": "equal lengths that sum to len(token_scores) are valid",
            "token_scores:constant": CONST_OK,
            "token_scores:huge": "means of finite scores are finite",
        },
    ),
    HostileSpec(
        "threshold_at_fpr",
        ip.threshold_at_fpr,
        {"control_scores": np.linspace(0.0, 1.0, 200), "fpr": 0.01},
        ("control_scores", "fpr"),
        allow={"control_scores:constant": CONST_OK, "control_scores:huge": "a quantile of finite scores"},
    ),
    HostileSpec(
        "auroc",
        ip.auroc,
        {"labels": np.array([0, 1, 0, 1, 1]), "scores": np.array([0.1, 0.9, 0.3, 0.4, 0.8])},
        ("labels", "scores"),
        allow={"scores:constant": "tied scores: AUROC 0.5", "scores:huge": "ranks of finite scores"},
    ),
    HostileSpec(
        "evaluate_probe",
        lambda eval_acts, control_acts: ip.evaluate_probe(
            ip.LogisticProbe().fit(_TA), eval_acts, control_acts
        ),
        {"eval_acts": _TA, "control_acts": _CTRL},
        (),
    ),
    HostileSpec(
        "detection_mask_from_offsets",
        ip.detection_mask_from_offsets,
        {"offsets": np.array([[0, 0], [0, 3], [4, 7], [8, 9]]), "spans": [(4, 9)]},
        ("offsets",),
        allow={
            "offsets:constant": "zero-width tokens: an empty mask",
            "offsets:empty:0": "no tokens: an empty mask",
        },
    ),
    HostileSpec("instructed_pairs", ip.instructed_pairs, {"facts": ["The sky is blue on a clear day."]}, ()),
    HostileSpec(
        "split_last_words", ip.split_last_words, {"text": "one two three four five six", "n_words": 5}, ()
    ),
    HostileSpec(
        "DeceptionSimulator.sample",
        lambda n: ip.DeceptionSimulator(d=8, seed=0).sample(n, "eval", seed=0),
        {"n": 4},
        (),
        covers=("DeceptionSimulator",),
    ),
]
# ------------------------------------------------------------------------------------------ P23
_X23 = torch.linspace(0.05, 0.95, 20, dtype=torch.float64)[:, None]
_PEAKS23 = torch.tensor([0.3, 0.5, 0.7], dtype=torch.float64)
BATCH_AXES = "x (..., 1): extra leading axes are batch axes"
EMPTY_BATCH = "an empty batch maps to an empty batch"


def _tri_method(method: str):
    def setup():
        net = ip.TriangleNet(3, init_peaks=_PEAKS23)
        return getattr(net, method), {"x": _X23}, net

    return setup


def _fit23():
    net = ip.TriangleNet(2)
    x = torch.linspace(0, 1, 20, dtype=torch.float64)
    return (lambda x, y: ip.fit_1d(net, x, y, ("pretrain",), 2)), {"x": x, "y": x**2}, net


SPECS += [
    HostileSpec(
        "TriangleNet",
        ip.TriangleNet,
        {"depth": 3, "init_peaks": _PEAKS23, "init_scale": -0.25, "init_slope": 1.0},
        ("init_peaks", "init_scale", "init_slope"),
        allow={"init_peaks:constant": "equal peaks are valid (0.3 each)"},
    ),
    *(
        HostileSpec(
            f"TriangleNet.{method}",
            setup=_tri_method(method),
            arrays=("x",),
            covers=("TriangleNet",),
            allow={"constant": CONST_OK, "empty:0": EMPTY_BATCH, "extra_dim": BATCH_AXES},
        )
        for method in ("forward", "closed_form")
    ),
    HostileSpec(
        "count_linear_regions_1d",
        lambda lo, hi: ip.count_linear_regions_1d(ip.TriangleNet(3).to_mlp(), lo, hi),
        {"lo": 0.0, "hi": 1.0},
        ("lo", "hi"),
        covers=("count_linear_regions_1d", "RegionCount"),
    ),
    HostileSpec(
        "fit_1d",
        setup=_fit23,
        arrays=("x", "y"),
        covers=("fit_1d", "FitResult"),
        allow={"extra_dim": "x, y of shape (n, 1) are columns", "y:constant": "a constant target is convex"},
    ),
    HostileSpec("kaiming_mlp", ip.kaiming_mlp, {"depth": 3, "width": 4, "seed": 0}, ()),
    HostileSpec(
        "triangle_wave",
        ip.triangle_wave,
        {"u": torch.linspace(0, 1, 10, dtype=torch.float64), "peaks": _PEAKS23},
        ("u", "peaks"),
        allow={
            "u:constant": CONST_OK,
            "u:empty:0": EMPTY_BATCH,
            "u:extra_dim": "u broadcasts against the peaks' leading axes",
            "u:missing_dim": "a scalar u is one point",
            "u:huge": "T_a of a finite u is finite (outside [0, 1] the min form continues linearly)",
            "peaks:constant": "equal peaks are valid",
        },
    ),
    HostileSpec(
        "TriangleActivation.forward",
        lambda x: ip.TriangleActivation(3, depth=3)(x),
        {"x": torch.randn(5, 3, generator=_g)},
        ("x",),
        covers=("TriangleActivation",),
        allow={"constant": CONST_OK, "empty:0": EMPTY_BATCH, "huge": "continued linearly: finite"},
    ),
    HostileSpec(
        "TriangleActivation",
        ip.TriangleActivation,
        {"num_features": 2, "depth": 3, "init_peaks": torch.tensor([[0.3, 0.5, 0.7], [0.4, 0.6, 0.2]])},
        ("init_peaks",),
        allow={"init_peaks:constant": "equal peaks are valid"},
    ),
]
# P34 diversity measures: points (n, p) or a distance matrix (is_distance=True)
_P34_X = np.random.default_rng(0).uniform(size=(6, 2))
_P34_D = ip.pairwise(_P34_X)
DUP_OK = "identical points are a valid multiset (all duplicates): a finite diversity"
DUP_INF = kt.Allow("identical points are duplicates: -inf, as documented", finite=False)
_P34_MEASURES = {
    "APD": ip.APD(),
    "Diameter": ip.Diameter(),
    "Bottleneck": ip.Bottleneck(),
    "NNMean": ip.NNMean(),
    "NumDistinct": ip.NumDistinct(),
    "Circles": ip.Circles(0.5),
    "Energy": ip.Energy(1.0),
    "VendiScore": ip.VendiScore(0.5),
    "Magnitude": ip.Magnitude(2.0),
    "LogDet": ip.LogDet(0.5),
}
SPECS += [
    *(
        HostileSpec(
            f"{_name}.__call__",
            lambda X, _m=_m: _m(X, is_distance=False),
            {"X": _P34_X},
            ("X",),
            covers=(_name, "DiversityMeasure"),
            allow={"constant": DUP_INF if _name in ("Energy", "LogDet") else DUP_OK},
        )
        for _name, _m in _P34_MEASURES.items()
    ),
    HostileSpec(
        "APD(distance matrix)",
        lambda X: ip.APD()(X, is_distance=True),
        {"X": _P34_D},
        ("X",),
        covers=("APD", "distance_matrix"),
        allow={
            "huge": "1e300-scaled distances are a valid metric: their mean is finite",
            "constant": "the constant matrix that passes the metric checks is all zeros: all duplicates",
        },
    ),
    HostileSpec("pairwise", ip.pairwise, {"X": _P34_X}, ("X",), allow={"constant": "all distances 0: valid"}),
    HostileSpec(
        "distance_matrix",
        lambda X: ip.distance_matrix(X, is_distance=False),
        {"X": _P34_X},
        ("X",),
        allow={"constant": "all distances 0: valid"},
    ),
    HostileSpec(
        "max_clique_size",
        ip.max_clique_size,
        {"adjacency": _P34_D >= 0.5},
        (),
    ),
    HostileSpec(
        "vendi_from_kernel",
        ip.vendi_from_kernel,
        {"K": np.eye(4)},
        ("K",),
        allow={"constant": "the constant unit-diagonal kernel is all ones: identical points, Vendi 1"},
    ),
    HostileSpec(
        "metric_push",
        lambda D, delta: ip.metric_push(D, 0, delta),
        {"D": _P34_D, "delta": 0.3},
        ("delta",),
    ),
    HostileSpec(
        "audit",
        lambda n: ip.audit(ip.APD(), n=n, trials=3),
        {"n": 4},
        (),
        covers=("audit", "AxiomResult", "verify_counterexample"),
    ),
    HostileSpec("audit_table", lambda: ip.audit_table([ip.APD()], n=4, trials=3), {}, ()),
]
# ------------------------------------------------------------------------------------------ P51
_ICL_TASKS = ip.make_synthetic_icl_tasks(2, seed=0)
_T5 = {"f0": _ICL_TASKS["f0"]}


def _icl_model() -> ip.TinyICLTransformer:
    return ip.TinyICLTransformer(78, 1, 2, 16, 40, seed=0).eval()


def _ablated_logits(**kw):
    model = _icl_model()
    ids = ip.sample_prompts(_ICL_TASKS["f0"], 2, 3, seed=0)[0].input_ids[None]
    with torch.no_grad(), ip.ablate_heads(model, **kw):
        return model(input_ids=ids).logits


_ATTN = torch.softmax(torch.randn(2, 9, 9, generator=_g).tril(), -1).tril()
HUGE_OVERFLOW = "1e30-scaled activations overflow the float32 forward to non-finite logits (no error)"
SPECS += [
    HostileSpec(
        "induction_score_from_attention",
        ip.induction_score_from_attention,
        {"attn": _ATTN, "n": 4},
        ("attn", "n"),
        allow={"attn:constant": "a constant pattern in [0, 1] has a finite score"},
    ),
    HostileSpec(
        "select_heads",
        ip.select_heads,
        {
            "scores": torch.rand(2, 3, generator=_g),
            "k": 2,
            "exclude_scores": torch.rand(2, 3, generator=_g),
            "exclude_top": 1,
        },
        ("scores", "exclude_scores", "k"),
        allow={"constant": "ties are broken by head order (stable sort)", "huge": "only the ranking matters"},
    ),
    HostileSpec(
        "ablate_heads",
        _ablated_logits,
        {"heads": [(0, 1)], "mean_acts": torch.randn(1, 2, 8, generator=_g)},
        ("mean_acts",),
        allow={"constant": "any finite replacement vector is valid"},
        known={"huge": HUGE_OVERFLOW},
        covers=("ablate_heads", "HeadActivationSite"),
    ),
    HostileSpec(
        "token_loss_difference",
        lambda seqs: ip.token_loss_difference(_icl_model(), seqs, early=3, late=20),
        {"seqs": torch.randint(2, 62, (2, 30), generator=_g)},
        ("seqs",),
        allow={"constant": "a constant token sequence has finite losses"},
    ),
    HostileSpec("random_heads", ip.random_heads, {"shape": (2, 3), "k": 2, "seed": 0}, ("k",)),
    HostileSpec(
        "fv_scores",
        lambda: ip.fv_scores(_icl_model(), _T5, n_shots=3, n_prompts=2),
        {},
        (),
        covers=(
            "fv_scores",
            "FVScores",
            "mean_head_activations",
            "sample_prompts",
            "build_prompt",
            "ICLPrompt",
            "ICLTask",
            "ICLTemplate",
            "make_synthetic_icl_tasks",
            "TinyICLTransformer",
        ),
    ),
    HostileSpec(
        "induction_scores",
        lambda: ip.induction_scores(_icl_model(), n=4, batch=3, tokens=range(2, 62)),
        {},
        (),
    ),
    HostileSpec(
        "random_token_activations",
        lambda: ip.random_token_activations(_icl_model(), 5, tokens=range(2, 62)),
        {},
        (),
    ),
    HostileSpec(
        "icl_accuracy",
        lambda: ip.icl_accuracy(_icl_model(), _ICL_TASKS["f0"], n_shots=3, n_prompts=3),
        {},
        (),
    ),
    HostileSpec(
        "train_synthetic_icl",
        lambda: ip.train_synthetic_icl(
            _icl_model(), list(_ICL_TASKS.values()), range(2, 62), steps=2, batch=4, n=4, n_shots=3
        ),
        {},
        (),
    ),
    HostileSpec(
        "tiny_llama", lambda: ip.tiny_llama(vocab_size=32, n_layers=1, n_heads=2, d_model=16), {}, ()
    ),
    HostileSpec(
        "random_llama",
        lambda vocab_size, hidden_size, n_layers, n_heads: (
            ip.random_llama(vocab_size, hidden_size, n_layers, n_heads)(torch.tensor([[1, 2, 3]])).logits
        ),
        {"vocab_size": 32, "hidden_size": 16, "n_layers": 1, "n_heads": 2},
        ("vocab_size", "hidden_size", "n_layers", "n_heads"),
    ),
]
# P42 GridToM: per-head probes and ITI steering
_P42_RNG = np.random.default_rng(0)
_P42_X = _P42_RNG.standard_normal((40, 2, 4, 8))
_P42_Y = np.arange(40) % 2
_P42_X[:, 1, 2, 0] += 2 * _P42_Y
_P42_IDS = ip.question_prompts(ip.generate_gridtom_lite(2, seed=0))["ids"]


def _p42_model() -> ip.TinyICLTransformer:
    return ip.TinyICLTransformer(len(ip.GRIDTOM_VOCAB), 2, 4, 32, 32, seed=0).eval()


def _p42_steered(directions):
    model = _p42_model()
    ivs = ip.build_interventions(_P42_X, [(0, 1), (1, 2)], directions)
    with torch.no_grad(), ip.steer(model, ivs, 2.0):
        return model(input_ids=_P42_IDS).logits


def _p42_sweep(X):
    model = _p42_model()
    probe = ip.probe_heads(_P42_X, _P42_Y)
    return ip.sweep_alpha_k(model, lambda m: {"n": 1.0}, X, probe, [1], [0.0, 1.0])


P42_CONST = "constant activations are valid: the probe is at chance, the result finite"
SPECS += [
    HostileSpec(
        "probe_heads",
        lambda X, y: ip.probe_heads(X, y),
        {"X": _P42_X, "y": _P42_Y},
        ("X", "y"),
        allow={"X:constant": P42_CONST, "y:dtype": "string class labels are valid (scikit-learn classes)"},
        covers=("probe_heads", "HeadProbeResult"),
    ),
    HostileSpec(
        "build_interventions",
        lambda X, directions: ip.build_interventions(X, [(0, 1), (1, 2)], directions),
        {"X": _P42_X, "directions": _P42_RNG.standard_normal((2, 4, 8))},
        ("X", "directions"),
        allow={
            "X:constant": "sigma of constant activations is 0: a valid (null) shift",
            "directions:constant": "a constant non-zero vector is a valid direction",
            "directions:huge": "directions are normalised",
        },
        covers=("build_interventions", "HeadIntervention"),
    ),
    HostileSpec(
        "steer",
        _p42_steered,
        {"directions": _P42_RNG.standard_normal((2, 4, 8))},
        ("directions",),
        allow={
            "constant": "a constant non-zero vector is a valid direction",
            "huge": "directions are normalised",
        },
    ),
    HostileSpec(
        "sweep_alpha_k",
        _p42_sweep,
        {"X": _P42_X},
        ("X",),
        allow={"constant": P42_CONST},
    ),
    HostileSpec(
        "top_k_heads",
        lambda score: ip.top_k_heads(score, 2),
        {"score": _P42_RNG.random((2, 4))},
        ("score",),
        allow={"constant": "ties are broken by head order", "huge": "only the ranking matters"},
    ),
    HostileSpec(
        "collect_head_activations",
        lambda inputs: ip.collect_head_activations(_p42_model(), inputs),
        {"inputs": _P42_IDS},
        ("inputs",),
        allow={"constant": "a constant token sequence has finite activations"},
    ),
    HostileSpec(
        "last_token_logits",
        lambda ids: ip.last_token_logits(_p42_model(), ids),
        {"ids": _P42_IDS},
        ("ids",),
        allow={"constant": "a constant token sequence has finite logits"},
    ),
    HostileSpec("random_directions", ip.random_directions, {"shape": (2, 4, 8), "seed": 0}, ()),
    HostileSpec(
        "generate_gridtom_lite",
        ip.generate_gridtom_lite,
        {"n_pairs": 3, "seed": 0},
        (),
        covers=("generate_gridtom_lite", "GridToMEpisode"),
    ),
    HostileSpec("statement_prompts", lambda: ip.statement_prompts(ip.generate_gridtom_lite(2)), {}, ()),
    HostileSpec(
        "question_prompts", lambda: ip.question_prompts(ip.generate_gridtom_lite(2), "world"), {}, ()
    ),
    HostileSpec(
        "render_tokens",
        ip.render_tokens,
        {"ids": _P42_IDS[0]},
        ("ids",),
        allow={"constant": "token 0 repeated renders", "empty:0": "no tokens render as ''"},
    ),
    HostileSpec(
        "gridtom_training_batch",
        lambda: ip.gridtom_training_batch(8, torch.Generator().manual_seed(0)),
        {},
        (),
    ),
    HostileSpec(
        "train_gridtom_lm",
        lambda: ip.train_gridtom_lm(_p42_model(), steps=2, batch=4, seed=0),
        {},
        (),
    ),
    HostileSpec("gridtom_gpt2", lambda: ip.gridtom_gpt2(n_layers=1, n_heads=2, d_model=16), {}, ()),
]
# ------------------------------------------------------------------------------------------ P44
_P44_ROLES = torch.tensor([[0, 0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 1, 1, 2]])
_P44_TASK = ip.RoleTask(answer="op")


def _p44_model() -> torch.nn.Module:
    return ip.pft_llama(25, hidden_size=16, n_layers=1, n_heads=2, max_position_embeddings=256).eval()


def _p44_prompt():
    b = _P44_TASK.batch(2, 8, seed=0)
    return b["input_ids"][:, :9], b["position_ids"][:, :9]


P44_ROLES_OK = {
    "missing_dim": "role_ids [L]: one row",
    "constant": "all-system roles: nothing to shift (valid)",
}
SPECS += [
    HostileSpec(
        "pft_position_ids",
        lambda role_ids, gap: ip.pft_position_ids(role_ids, gap),
        {"role_ids": _P44_ROLES, "gap": 4},
        ("role_ids", "gap"),
        allow=P44_ROLES_OK,
        covers=("pft_position_ids", "SYSTEM", "USER", "ASSISTANT"),
    ),
    HostileSpec("role_spans", ip.role_spans, {"role_ids": _P44_ROLES}, ("role_ids",), allow=P44_ROLES_OK),
    HostileSpec(
        "check_position_range",
        lambda position_ids: ip.check_position_range(_p44_model(), position_ids),
        {"position_ids": ip.pft_position_ids(_P44_ROLES, 4)},
        ("position_ids",),
        allow={
            "missing_dim": "any shape of ids is checked",
            "extra_dim": "any shape of ids is checked",
            "constant": "constant ids are in range",
            "empty:0": "no ids: nothing out of range",
            "empty:1": "no ids: nothing out of range",
        },
    ),
    HostileSpec(
        "PFTCollator",
        lambda gap: ip.PFTCollator(gap=gap, pad_token_id=0)(_P44_TASK.sample(2, seed=0)),
        {"gap": 3},
        ("gap",),
    ),
    HostileSpec(
        "pft_generate",
        lambda input_ids, position_ids: ip.pft_generate(_p44_model(), input_ids, position_ids, 2),
        {"input_ids": _p44_prompt()[0], "position_ids": _p44_prompt()[1]},
        ("input_ids", "position_ids"),
        allow={"constant": "constant tokens / ids are a valid (odd) prompt"},
        covers=("pft_generate", "PFTGeneration", "pft_llama"),
    ),
    HostileSpec(
        "hf_generate",
        lambda input_ids: ip.hf_generate(
            _p44_model(), input_ids, max_new_tokens=1, do_sample=False, pad_token_id=0
        ),
        {"input_ids": _p44_prompt()[0]},
        ("input_ids",),
        allow={"constant": "constant tokens are a valid prompt"},
    ),
    HostileSpec(
        "RoleTask",
        lambda n: ip.RoleTask(answer="op", delimiters=False).batch(n, 4, seed=0),
        {"n": 3},
        ("n",),
        covers=("RoleTask", "ROLES"),
    ),
    HostileSpec(
        "train_role_model",
        lambda gap, lr: ip.train_role_model(_p44_model(), _P44_TASK, gap, steps=2, batch_size=4, lr=lr),
        {"gap": 4, "lr": 1e-3},
        ("gap", "lr"),
        global_rng="constructing the model re-initialises weights inside isolated_rng; batches use seed=",
    ),
    HostileSpec(
        "shortcut_suite",
        lambda n: ip.shortcut_suite(_p44_model(), _P44_TASK, 4, n=n, splits=("id", "proximity")),
        {"n": 8},
        ("n",),
        covers=("shortcut_suite", "answer_accuracy"),
    ),
    HostileSpec(
        "role_probe",
        lambda layer: ip.role_probe(_p44_model(), _P44_TASK.batch(8, 4, seed=0), layer),
        {"layer": 1},
        ("layer",),
    ),
]
# ------------------------------------------------------------------------------------------ P19
_P19_G = torch.Generator().manual_seed(19)
_P19_LAT = {"a": torch.rand(3, 2, 16, generator=_P19_G), "b": torch.rand(3, 2, 16, generator=_P19_G)}
_P19_SAE = ip.TopKSAE(4, 16, k=3, seed=0)
_P19_PLAN = ip.UnlearningPlan.build(_P19_LAT, ["a"], 80.0, -1.0)
_P19_ACTS = torch.randn(2, 4, 3, 5, generator=_P19_G)  # [B, C, H, W], H != W
P19_SCORE_CONST = "constant latents give constant proportions: finite scores (all 0 with a contrast)"


def _p19_ddpm() -> ip.DigitsDDPM:
    return ip.DigitsDDPM(hidden=8, n_steps=3, seed=0)


def _p19_capture(x):
    model = _p19_ddpm()
    with ip.ActivationCapture(model, "block", 3, count_calls=True) as cap:
        for t in range(3):
            model(x, torch.full((x.shape[0],), t), torch.zeros(x.shape[0], dtype=torch.long))
    return cap.activations()


def _p19_hooked(x):
    model = _p19_ddpm()
    sae = ip.TopKSAE(8, 16, k=3, seed=0)
    with ip.SAEUnlearningHook(model, "block", sae, _P19_PLAN) as hook:
        hook.set_step(1)
        return model(x, torch.ones(x.shape[0], dtype=torch.long), torch.zeros(x.shape[0], dtype=torch.long))


def _p19_train_ddpm():
    model = _p19_ddpm()
    fn = lambda X, y: ip.train_ddpm(model, X, y, steps=2, batch_size=4)  # noqa: E731
    return fn, {"X": torch.rand(6, 64, generator=_P19_G) * 2 - 1, "y": torch.arange(6)}, model


SPECS += [
    HostileSpec(
        "concept_feature_scores",
        lambda latents, eps: ip.concept_feature_scores(latents, "a", eps=eps),
        {"latents": _P19_LAT, "eps": 1e-8},
        (("latents", "a"), ("latents", "b"), "eps"),
        allow={"constant": P19_SCORE_CONST, "huge": "proportions are scale-free"},
    ),
    HostileSpec(
        "select_features",
        ip.select_features,
        {"scores": torch.randn(16, generator=_P19_G), "percentile": 90.0},
        ("scores", "percentile"),
        allow={"constant": "constant scores select nothing (documented)", "huge": "only the order matters"},
    ),
    HostileSpec(
        "UnlearningPlan.build",
        lambda latents, percentile, multiplier: ip.UnlearningPlan.build(
            latents, ["a"], percentile, multiplier
        ),
        {"latents": _P19_LAT, "percentile": 80.0, "multiplier": -1.0},
        (("latents", "a"), ("latents", "b"), "percentile", "multiplier"),
        allow={"constant": P19_SCORE_CONST, "huge": "finite latents give finite scales"},
        covers=("UnlearningPlan",),
    ),
    HostileSpec(
        "intervene",
        lambda acts, t: ip.intervene(acts, _P19_SAE, _P19_PLAN, t),
        {"acts": _P19_ACTS, "t": 1},
        ("acts", "t"),
        allow={
            "acts:constant": "constant activations are valid: the result is finite",
            "acts:empty:0": "an empty batch is returned as is",
            "acts:empty:2": "an empty map is returned as is",
            "acts:empty:3": "an empty map is returned as is",
            "acts:missing_dim": "[B, C, H] is read as [B, P, d] with d = H = 5 != 4: rejected unless equal",
        },
        known={"acts:huge": "1e30-scaled activations overflow the float32 SAE decode to Inf (no error)"},
    ),
    HostileSpec(
        "to_patches",
        lambda acts: ip.from_patches(*ip.to_patches(acts)),
        {"acts": _P19_ACTS},
        ("acts",),
        allow={
            "constant": "layout only",
            "huge": "layout only",
            "dtype": "layout only: any dtype",
            "missing_dim": "a [B, P, d] layout",
            "empty:0": "layout only",
            "empty:1": "layout only",
            "empty:2": "layout only",
            "empty:3": "layout only",
            "nan": Allow("layout only: values are moved, not checked", finite=False),
            "posinf": Allow("layout only: values are moved, not checked", finite=False),
            "neginf": Allow("layout only: values are moved, not checked", finite=False),
        },
        covers=("to_patches", "from_patches"),
    ),
    HostileSpec(
        "concept_latents",
        lambda acts: ip.concept_latents(_P19_SAE, {"a": acts, "b": acts + 1}),
        {"acts": torch.randn(2, 2, 3, 4, generator=_P19_G)},
        ("acts",),
        allow={"constant": "constant activations are valid: the result is finite"},
        known={"huge": "1e30-scaled activations overflow the float32 encoder to Inf (no error)"},
    ),
    HostileSpec(
        "fit_block_sae",
        lambda acts: ip.fit_block_sae(acts, 16, 2, steps=2, batch_size=8),
        {"acts": torch.randn(2, 8, 4, generator=_P19_G)},
        ("acts",),
        allow={
            "missing_dim": "[N, d]: one input per row",
            "extra_dim": "[..., d] with d = 1 is a valid input",
        },
        known={"huge": "1e30-scaled activations overflow the float32 squared error to Inf (no error)"},
    ),
    HostileSpec(
        "ActivationCapture",
        _p19_capture,
        {"x": torch.rand(3, 64, generator=_P19_G)},
        ("x",),
        allow={"constant": "constant images are valid inputs"},
        known={
            "huge": "1e30 inputs overflow the float32 model to Inf before the hook records them (no error)"
        },
        covers=("ActivationCapture", "DigitsDDPM"),
    ),
    HostileSpec(
        "SAEUnlearningHook",
        _p19_hooked,
        {"x": torch.rand(3, 64, generator=_P19_G)},
        ("x",),
        allow={"constant": "constant images are valid inputs"},
        known={"huge": "1e30 inputs overflow the model itself before the hook"},
    ),
    HostileSpec(
        "train_ddpm",
        setup=_p19_train_ddpm,
        arrays=("X", "y"),
        allow={"X:constant": "constant images are valid training data", "y:constant": "one class is valid"},
    ),
    HostileSpec(
        "ddpm_sample",
        lambda labels: ip.ddpm_sample(_p19_ddpm(), labels, seed=0),
        {"labels": torch.tensor([0, 3, 9])},
        ("labels",),
        allow={"constant": "one class for every sample"},
    ),
]
# ------------------------------------------------------------------------------------------ P00
_P00_IDS = torch.tensor([[5, 6, 10, 7, 6, 11], [5, 6, 12, 7, 6, 13]])
_P00_DATA = ip.ToyTaskData((0, 1), n_shots=2, seed=0)


def _p00_model() -> torch.nn.Module:
    return ip.tiny_llama(vocab_size=20, n_layers=2, n_heads=2, d_model=8, seed=0)


def _p00_batch() -> dict:
    return {"input_ids": _P00_IDS, "position": torch.tensor([4, 4]), "labels": torch.tensor([3, 4])}


def _p00_patch(vector):
    model = _p00_model()
    with torch.no_grad(), ip.patch_task_vector(model, vector, 0, 4):
        return model(input_ids=_P00_IDS).logits


def _p00_toy(pixel_values):
    b = _P00_DATA.icl(0, 2, "image", seed=0)
    return ip.ToyVLM(1, 8, 2, seed=0)(b["input_ids"], pixel_values, b["image_mask"]).logits


SPECS += [
    HostileSpec(
        "find_delimiter_positions",
        lambda input_ids: ip.find_delimiter_positions(input_ids, 6, which=-1),
        {"input_ids": _P00_IDS},
        ("input_ids",),
    ),
    HostileSpec(
        "extract_task_vectors",
        lambda input_ids: ip.extract_task_vectors(_p00_model(), {"input_ids": input_ids}, position=-1),
        {"input_ids": _P00_IDS},
        ("input_ids",),
        allow={"constant": "a constant token sequence has finite states"},
        covers=("extract_task_vectors", "decoder_layers"),
    ),
    HostileSpec(
        "patch_task_vector",
        _p00_patch,
        {"vector": torch.randn(8, generator=_g)},
        ("vector",),
        allow={
            "constant": "a constant vector is a valid state",
            "extra_dim": "[d, 1] is read as [B, d] with B = 8 and d = 1: rejected unless d matches",
        },
        known={"huge": "1e30-scaled states overflow the float32 model to Inf after the patch (no error)"},
        covers=("patch_task_vector", "PatchHandle"),
    ),
    HostileSpec(
        "ensemble",
        lambda vectors: ip.ensemble(*vectors),
        {"vectors": [torch.randn(2, 8, generator=_g), torch.randn(2, 8, generator=_g)]},
        (("vectors", 0), ("vectors", 1)),
        allow={"constant": "a constant vector is valid", "huge": "the mean of finite vectors is finite"},
    ),
    HostileSpec(
        "layer_sweep",
        lambda vectors: ip.layer_sweep(_p00_model(), vectors, _p00_batch()),
        {"vectors": torch.randn(2, 8, generator=_g)},
        ("vectors",),
        allow={
            "constant": "a constant vector is a valid state",
            "huge": "accuracy of any finite patch is finite",
        },
        covers=("layer_sweep", "patched_accuracy", "first_token_correct"),
    ),
    HostileSpec(
        "evaluate_task_vectors",
        lambda vectors: ip.evaluate_task_vectors(_p00_model(), vectors, _p00_batch(), _p00_batch()),
        {"vectors": torch.randn(2, 8, generator=_g)},
        ("vectors",),
        allow={
            "constant": "a constant vector is a valid state",
            "huge": "accuracy of any finite patch is finite",
        },
        covers=("evaluate_task_vectors", "TaskVectorResult"),
    ),
    HostileSpec(
        "cross_model_transfer",
        lambda input_ids: ip.cross_model_transfer(
            _p00_model(), _p00_model(), {"input_ids": input_ids}, position=-1
        ),
        {"input_ids": _P00_IDS},
        ("input_ids",),
        allow={"constant": "a constant token sequence has finite states"},
    ),
    HostileSpec(
        "bottleneck_mask",
        lambda summary: ip.bottleneck_mask(
            torch.ones(2, 6, dtype=torch.bool), summary, torch.zeros(2, dtype=torch.long)
        ),
        {"summary": torch.tensor([3, 4])},
        ("summary",),
        allow={"constant": "one summary position for every prompt"},
    ),
    HostileSpec(
        "ToyVLM",
        _p00_toy,
        {"pixel_values": _P00_DATA.icl(0, 2, "image", seed=0)["pixel_values"]},
        ("pixel_values",),
        allow={"constant": "a constant image is a valid input"},
        known={"huge": "1e30-scaled pixels overflow the float32 model to Inf (no error)"},
        covers=("ToyVLM", "ToyTaskData"),
    ),
    HostileSpec(
        "train_toy_vlm",
        lambda lr: ip.train_toy_vlm(ip.ToyVLM(1, 8, 2, seed=0), _P00_DATA, steps=2, batch_size=4, lr=lr),
        {"lr": 1e-3},
        ("lr",),
    ),
]
# ------------------------------------------------------------------------------------------ P53
_P53_IMG = np.random.default_rng(53).random((12, 10, 3))
_P53_X = torch.rand(3, 24, 24, generator=torch.Generator().manual_seed(53))
P53_IMG_OK = {
    "constant": "a constant image is a valid (blank) input",
    "huge": "pixel scale is the model's business; the views only slice",
    "missing_dim": "image [H, W]: a grey-scale image",
}
P53_X_OK = {
    "constant": "a blank canvas is a valid input",
    "dtype": "integer pixels are cast to float32",
    "huge": "finite large pixels give finite logits (max pooling, no normalisation to overflow)",
}


def _p53_client() -> ip.CallableClient:
    def fn(messages, images):
        last = messages[-1]["content"]
        return "no" if last.startswith("Does the following") else "a cat"

    return ip.CallableClient(fn)


def _p53_model() -> ip.HintCNN:
    return ip.HintCNN(width=8, seed=0).eval()


def _p53_predict(im) -> int:
    return int(np.asarray(im, dtype=float).sum() > 10)


SPECS += [
    HostileSpec(
        "dps_answer",
        lambda image: ip.dps_answer(_p53_client(), image, "What is it?", rng=0),
        {"image": _P53_IMG},
        ("image",),
        allow=P53_IMG_OK,
        covers=(
            "dps_answer",
            "DPSConfig",
            "DPSTrace",
            "CallableClient",
            "VLMClient",
            "CenterCrop",
            "RandomCrop",
            "PartialView",
            "word_count",
        ),
    ),
    HostileSpec(
        "MaskRegions",
        lambda image: ip.MaskRegions(
            ip.vlm_box_proposer(ip.CallableClient(lambda m, i: "[1, 1, 4, 5]"))
        ).render(image),
        {"image": _P53_IMG},
        ("image",),
        allow=P53_IMG_OK,
        covers=("MaskRegions", "vlm_box_proposer", "parse_boxes", "clip_box"),
    ),
    HostileSpec(
        "ObjectCrop",
        lambda image: ip.ObjectCrop(lambda _im: [(1, 1, 6, 7)], mode="mask").render(image),
        {"image": _P53_IMG},
        ("image",),
        allow=P53_IMG_OK,
    ),
    HostileSpec(
        "smooth_vote",
        lambda image: ip.smooth_vote(_p53_predict, image, rng=0),
        {"image": _P53_IMG},
        ("image",),
        allow=P53_IMG_OK,
    ),
    HostileSpec(
        "crop_vote",
        lambda image: ip.crop_vote(_p53_predict, image, [ip.CenterCrop(0.5), ip.RandomCrop()], rng=0),
        {"image": _P53_IMG},
        ("image",),
        allow=P53_IMG_OK,
    ),
    HostileSpec(
        "attack_success_rate",
        ip.attack_success_rate,
        {"preds": np.array([1, 2, 3]), "targets": np.array([1, 0, 3])},
        ("preds", "targets"),
        allow={"constant": "constant labels are valid answers", "dtype": "labels of any dtype compare by =="},
    ),
    HostileSpec(
        "make_canvases",
        lambda digits: ip.make_canvases(digits, np.random.default_rng(0)),
        {"digits": np.random.default_rng(1).random((3, 8, 8))},
        ("digits",),
        allow={"constant": "a constant digit is a valid subject"},
    ),
    HostileSpec(
        "typographic_attack",
        lambda canvases: ip.typographic_attack(canvases, np.ones((3, 8, 8)), np.random.default_rng(0)),
        {"canvases": _P53_X},
        ("canvases",),
        allow=P53_X_OK,
    ),
    HostileSpec(
        "toy_dps",
        lambda x: ip.toy_dps(_p53_model(), x, [ip.CenterCrop(0.5, mode="mask")], np.random.default_rng(0)),
        {"x": _P53_X},
        ("x",),
        allow=P53_X_OK,
        covers=("toy_dps", "toy_hints", "HintCNN", "no_hint"),
    ),
    HostileSpec(
        "train_hint_cnn",
        lambda lr: ip.train_hint_cnn(
            lambda rng: (_P53_X, torch.tensor([0, 1, 2])), epochs=2, lr=lr, width=8, batch_size=2
        ),
        {"lr": 1e-3},
        ("lr",),
    ),
]
EXCLUDED = {
    "answer_match": "compares two strings (no arrays); its bad inputs are tested in test_task_vectors.py",
    "HFVLMClient": "wraps a real transformers image-text-to-text model and processor; exercised in test_dps.py",
    "OpenAICompatClient": "a network client (user-injected base_url); never called in tests",
    "from_saelens": "loads a SAELens state dict + cfg; the dict's tensors are checked by its own tests "
    "(an estimator constructor, not array math)",
}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_hostile_inputs(spec: HostileSpec) -> None:
    print(spec.check().summary())


def test_registry_covers_public_api() -> None:
    print("icml25.interpretability covers", kt.assert_covers(ip, SPECS, EXCLUDED))


def test_matryoshka_k_sae_empty_batch_loss_is_an_error() -> None:
    model = ip.MatryoshkaKSAE(8, 16, ks=[2, 4])
    before = kt.snapshot_state(model)
    with pytest.raises(ValueError, match=r"x must hold at least one sample .* shape \(0, 8\)"):
        model.loss(torch.empty(0, 8))
    assert kt.states_equal(before, kt.snapshot_state(model))  # dead-latent counters untouched


@pytest.mark.parametrize("cls", sorted(SAES))
def test_rejected_loss_keeps_state(cls: str) -> None:
    model = SAES[cls]()
    model.loss(_X)
    before = kt.snapshot_state(model)
    bad = _X.clone()
    bad[0, 0] = float("nan")
    for x in (bad, torch.empty(0, 8)):
        with pytest.raises(ValueError, match="x must"):
            model.loss(x)
    assert kt.states_equal(before, kt.snapshot_state(model))


# ---------------------------------------------------------------------------- issue 81 (bad input round 2)
@pytest.mark.parametrize("cls", ["LogisticProbe", "MeanDiffProbe", "LATProbe", "LDAProbe"])
def test_probe_predict_before_fit_is_sklearns_not_fitted_error(cls: str) -> None:
    from sklearn.exceptions import NotFittedError

    probe = getattr(ip, cls)()
    for method in (probe.predict, probe.decision_function, probe.score_tokens):
        with pytest.raises(NotFittedError, match=f"This {cls} instance is not fitted yet"):
            method(np.ones((3, 4)))


@pytest.mark.parametrize(
    ("height", "width", "bad"), [(-5, 10, "height"), (10, 0, "width"), (10.5, 10, "height")]
)
def test_clip_box_blames_the_image_size_argument(height: object, width: object, bad: str) -> None:
    with pytest.raises((ValueError, TypeError), match=rf"^{bad} must be an int >= 1, got"):
        ip.clip_box((0, 0, 3, 3), height, width)  # type: ignore[arg-type]


def test_saeuron_eps_zero_on_all_zero_latents_is_a_clear_error() -> None:
    """Issue 81, item 11: ``eps=0`` with a step whose latents are all zero would divide 0 by 0."""
    lat = {"a": torch.zeros(2, 2, 4), "b": torch.rand(2, 2, 4, generator=_P19_G) + 0.1}
    with pytest.raises(ValueError, match=r"^eps=0 with all-zero latents: the concept's activations sum to 0"):
        ip.concept_feature_scores(lat, "a", eps=0.0)
    lat["a"][:, 0, 1] = 1.0  # step 0 fires, step 1 is still silent
    with pytest.raises(ValueError, match=r"at steps \[1\]"):
        ip.concept_feature_scores(lat, "a", eps=0.0)
    scores = ip.concept_feature_scores(lat, "a")  # the official eps: the silent step's proportions are 0
    assert torch.isfinite(scores).all()
    mu_o = lat["b"].mean(dim=0)[1]
    torch.testing.assert_close(scores[1], -mu_o / (mu_o.sum() + 1e-8))
    with pytest.raises(ValueError, match=r"the other concepts' activations sum to 0 at steps \[1\]"):
        ip.concept_feature_scores(lat, "b", eps=0.0)
    lat["a"][:, 1, 2] = 1.0  # no silent step left: eps=0 is the exact formula, scores sum to 0 per step
    torch.testing.assert_close(ip.concept_feature_scores(lat, "a", eps=0.0).sum(-1), torch.zeros(2))


def test_saeuron_arguments_go_through_the_shared_checks() -> None:
    """Issue 81: saeuron.py validates with ``icml25.kernels.checks`` (no private validators of its own)."""
    import icml25.interpretability.saeuron as su

    assert not {"_tensor", "_finite", "_real", "_int"} & set(vars(su))
    with pytest.raises(TypeError, match=r"^percentile must be a finite float in \(0\.0, 100\.0\), got bool"):
        ip.select_features(torch.randn(8, generator=_P19_G), True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^eps must be a finite float in \[0\.0, inf\), got -1e-08"):
        ip.concept_feature_scores(_P19_LAT, "a", eps=-1e-8)
    with pytest.raises(ValueError, match=r"^batch_size must be an int >= 1, got 0"):
        ip.concept_latents(_P19_SAE, {"a": torch.randn(1, 2, 3, 4)}, batch_size=0)
    with pytest.raises(TypeError, match=r"^labels must be a int tensor"):
        ip.ddpm_sample(_p19_ddpm(), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"^t must be an int in \[0, 1\], got 2"):
        ip.intervene(_P19_ACTS, _P19_SAE, _P19_PLAN, 2)


def test_gridtom_and_icl_heads_arguments_go_through_the_shared_checks() -> None:
    """Issue 81: P42 (gridtom, gridtom_toy), P51 (icl_heads and its split modules) and the shared head site
    validate with ``icml25.kernels.checks``: no private ``_check_int`` / ``_check_ids`` / ``_check_scores`` /
    ``_check_shots`` / ``_check_X`` of their own, and the shared messages."""
    import importlib

    for name in ("gridtom", "gridtom_toy", "icl_heads", "icl_heads_toy", "icl_heads_prompts", "common.heads"):
        module = importlib.import_module(f"icml25.interpretability.{name}")
        assert not {"_check_int", "_check_ids", "_check_scores", "_check_shots", "_check_X"} & set(
            vars(module)
        )
    with pytest.raises(TypeError, match=r"^n_pairs must be an int >= 1, got float 1\.5"):
        ip.generate_gridtom_lite(1.5)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"^triggers\[1\] must be one of \['leave', 'door', 'both'\], got 'x'"
    ):
        ip.generate_gridtom_lite(2, triggers=("door", "x"))
    with pytest.raises(ValueError, match=r"^lr must be a finite float in \(0\.0, inf\), got nan"):
        ip.train_gridtom_lm(_p42_model(), steps=1, lr=float("nan"))
    with pytest.raises(TypeError, match=r"^inputs must be a int tensor"):
        ip.collect_head_activations(_p42_model(), _P42_IDS.float())
    with pytest.raises(ValueError, match=r"^X must have 4 dimension\(s\)"):
        ip.probe_heads(_P42_X[0], _P42_Y[:2])
    with pytest.raises(ValueError, match=r"^alpha must be a finite float, got inf"):
        with ip.steer(_p42_model(), [], float("inf")):
            pass
    with pytest.raises(ValueError, match=r"^scores must be finite \(no NaN or inf\)"):
        ip.select_heads(torch.tensor([[0.0, float("nan")]]), 1)
    with pytest.raises(ValueError, match=r"^layers\[1\] must be an int in \[0, 1\], got 2"):
        ip.random_heads((2, 3), 1, layers=[0, 2])
    with pytest.raises(ValueError, match=r"^n_shots must be an int >= 2, got 1"):
        ip.fv_scores(_icl_model(), _T5, n_shots=1, n_prompts=2)
    with pytest.raises(ValueError, match=r"^mean_acts must have shape \(1, 2, 8\)"):
        with ip.ablate_heads(_icl_model(), [(0, 1)], torch.zeros(1, 2, 4)):
            pass
    with pytest.raises(TypeError, match=r"^n_tasks must be an int >= 1, got bool True"):
        ip.make_synthetic_icl_tasks(True)  # type: ignore[arg-type]
