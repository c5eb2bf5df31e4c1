"""Hostile-input contract of icml25.llm_efficiency (CONTRIBUTING.md, "Bad input contract").

P01 SpargeAttn, P03 RAPID, P36 AQUA-KV, P38 LaRA and the other papers of the package: every public callable is registered with a valid example call;
:mod:`icml25.kernels.testing` derives the hostile variants and asserts a clear error or a documented,
finite result.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import icml25.llm_efficiency as le
from icml25.kernels import testing as kt
from icml25.kernels.rng import isolated_rng
from icml25.kernels.testing import Allow, HostileSpec

_g = torch.Generator().manual_seed(0)
_QKV = {n: torch.randn(1, 2, 32, 16, generator=_g) for n in ("q", "k", "v")}
_KV = torch.randn(4, 64, generator=_g)
CONST_OK = "constant inputs are valid: the result is finite"
ATTN_OK = {"constant": CONST_OK, "huge": "INT8 Q/K quantization is scale-invariant; the output is finite"}
QUANT_OK = {"constant": CONST_OK, "empty": "no tokens or no channels: an empty result"}
_Z, _ZQ = torch.randn(3, 16, generator=_g), torch.randn(3, 16, generator=_g)
LOGITS_OK = {
    "constant": "constant logits are a uniform distribution: valid",
    "huge": "softmax of huge logits is one-hot; the correction is bounded by eta, so the result is finite",
}
NEGINF_LOGIT = "a single -Inf logit is a masked token (e.g. after top-k): valid"
IDS = torch.randint(0, 16, (20,), generator=_g)

SPECS = [
    HostileSpec(
        "sparge_attention",
        le.sparge_attention,
        {**_QKV, "block_q": 16, "block_k": 16, "backend": "reference"},
        ("q", "k", "v"),
        ATTN_OK,
    ),
    HostileSpec(
        "predict_block_mask",
        le.predict_block_mask,
        {"q": _QKV["q"], "k": _QKV["k"], "block_q": 16, "block_k": 16, "backend": "reference"},
        ("q", "k"),
        ATTN_OK,
    ),
    HostileSpec(
        "block_sparse_attention",
        le.block_sparse_attention,
        {
            **_QKV,
            "block_q": 16,
            "block_k": 16,
            "block_mask": torch.ones(1, 2, 2, 2, dtype=torch.bool),
            "backend": "reference",
        },
        ("q", "k", "v"),
        ATTN_OK,
    ),
    HostileSpec(
        "SpargeTuner.observe",
        lambda q, k, v: le.SpargeTuner(2, granularity=4, block_q=16, block_k=16).observe(q, k, v),
        dict(_QKV),
        ("q", "k", "v"),
        ATTN_OK,
        covers=("SpargeTuner", "SpargeHeadParams"),
    ),
    HostileSpec(
        "UniformQuantizer.quantize_dequantize",
        lambda x: le.UniformQuantizer(2, 64).quantize_dequantize(x),
        {"x": _KV},
        ("x",),
        {**QUANT_OK, "huge": "|x| <= MAX_ABS quantizes finitely"},
        covers=("UniformQuantizer",),
    ),
    HostileSpec(
        "HiggsQuantizer.quantize_dequantize",
        lambda x: le.HiggsQuantizer(2, 16, group=64, grid_samples=2000, grid_iters=3).quantize_dequantize(x),
        {"x": _KV},
        ("x",),
        {"constant": CONST_OK, "empty:1": "no channels: an empty result"},
        known={"empty:0": "zero tokens: a reshape(0, -1) RuntimeError inside; not yet handled"},
        covers=("HiggsQuantizer",),
    ),
    HostileSpec(
        "PassthroughQuantizer.quantize_dequantize",
        lambda x: le.PassthroughQuantizer().quantize_dequantize(x),
        {"x": _KV},
        ("x",),
        {
            **QUANT_OK,
            **dict.fromkeys(
                ("huge", "nan", "posinf", "neginf"),
                kt.Allow(
                    "documented: the no-compression baseline is a float16 cast; "
                    "values pass through (1e30 becomes Inf)",
                    False,
                ),
            ),
        },
        covers=("PassthroughQuantizer",),
    ),
    HostileSpec(
        "make_gaussian_grid", le.make_gaussian_grid, {"d": 2, "n": 16, "n_samples": 500, "iters": 2}, ()
    ),
    HostileSpec(
        "augmented_target",
        le.augmented_target,
        {"p_logits": _Z, "q_logits": _ZQ, "eta": 4.0, "alpha": 0.1},
        ("p_logits", "q_logits", "eta", "alpha"),
        {
            **LOGITS_OK,
            "neginf": kt.Allow(NEGINF_LOGIT + "; it stays -Inf in the result (documented)", False),
            "p_logits:empty:0": "no positions: an empty result",
        },
    ),
    HostileSpec(
        "rapid_verify",
        le.rapid_verify,
        {
            "draft_tokens": torch.tensor([3, 7]),
            "q_logits": _ZQ[:2],
            "p_logits": _Z,
            "eta": 4.0,
            "alpha": 0.1,
            "generator": torch.Generator().manual_seed(0),
        },
        ("draft_tokens", "q_logits", "p_logits", "eta", "alpha"),
        {**LOGITS_OK, "neginf": NEGINF_LOGIT, "draft_tokens:constant": "a repeated draft token is valid"},
    ),
    HostileSpec(
        "RapidGenerator.generate",
        lambda long_ids, rag_ids: le.RapidGenerator(le.InductionLM(16), gamma=2).generate(
            long_ids, rag_ids, 4, seed=0, eos_token_id=[]
        ),
        {"long_ids": IDS, "rag_ids": IDS[-5:]},
        ("long_ids", "rag_ids"),
        {"constant": "a prompt repeating one token is valid"},
        covers=("RapidGenerator", "RapidOutput"),
    ),
    HostileSpec(
        "RapidGenerator",
        lambda eta, alpha: le.RapidGenerator(le.InductionLM(16), eta=eta, alpha=alpha),
        {"eta": 10.0, "alpha": 0.1},
        ("eta", "alpha"),
    ),
    HostileSpec(
        "InductionLM",
        lambda input_ids, tau, smoothing: le.InductionLM(16, tau=tau, smoothing=smoothing)(input_ids).logits,
        {"input_ids": IDS[None], "tau": 10.0, "smoothing": 0.01},
        ("input_ids", "tau", "smoothing"),
        {"input_ids:constant": "a sequence repeating one token is valid"},
    ),
    HostileSpec(
        "select_chunks",
        le.select_chunks,
        {"scores": np.array([0.1, 0.9, 0.2, 0.8, 0.5]), "k": 2, "threshold": 0.3},
        ("scores", "threshold"),
        {
            "constant": "equal scores: the earliest chunks win the ties",
            "huge": "only the order of the scores matters",
            "threshold:posinf": "no chunk passes: the best one is kept (official fallback)",
            "threshold:neginf": "every chunk passes: the top k are kept",
        },
    ),
    HostileSpec(
        "tfidf_scores", le.tfidf_scores, {"documents": [["a", "b"], ["b", "c"]], "query": ["b", "c"]}, ()
    ),
    HostileSpec("bm25_scores", le.bm25_scores, {"documents": [[1, 2], [2, 3]], "query": [2, 3]}, ()),
    HostileSpec(
        "chunk_text", le.chunk_text, {"text": "One. Two three.\n\nFour five six.", "max_tokens": 3}, ()
    ),
    HostileSpec(
        "retrieve",
        le.retrieve,
        {"chunks": ["a key", "b", "key c"], "query": "key", "k": 1, "scorer": "tfidf"},
        (),
    ),
]
# P09 joint MoE scaling law ------------------------------------------------------------------------------
_LAW = le.JointMoEScalingLaw(le.PAPER_COEFFS_UNVERIFIED)
_RUNS_RNG = np.random.default_rng(0)
_RUN_N = np.exp(_RUNS_RNG.uniform(np.log(1e7), np.log(1e9), 12))
_RUN_D = np.exp(_RUNS_RNG.uniform(np.log(1e8), np.log(1e11), 12))
_RUN_E = np.array([1.0, 2, 4, 8] * 3)
_RUN_L = _LAW.loss(_RUN_N, _RUN_D, _RUN_E)
LAW_OK = {
    "extra_dim": "the law is vectorised: broadcastable arrays give the broadcast shape",
    "missing_dim": "a 0-d (scalar) argument broadcasts",
    "constant": CONST_OK,
    "huge": "the law is defined for any positive count: the loss tends to c (or grows finitely)",
}


def _fit_setup():
    law = le.JointMoEScalingLaw()
    return (
        lambda n_act, tokens, experts, losses: law.fit(
            n_act, tokens, experts, losses, n_inits=2, max_iter=20
        ),
        {"n_act": _RUN_N, "tokens": _RUN_D, "experts": _RUN_E, "losses": _RUN_L},
        law,
    )


with isolated_rng(0):
    _FFN = le.MoEFFN(8, 16, n_experts=4)
    _DEC = le.TinyDecoder(16, d_model=8, n_heads=2, max_len=8, d_ff=16, n_experts=2)
_CORPUS = le.TopicBigramCorpus(vocab=16, n_topics=2, successors=3, switch_every=8)
_TOK, _TOP = _CORPUS.sample(40, seed=0)

SPECS += [
    HostileSpec(
        "JointMoEScalingLaw.loss",
        lambda n_act, tokens, experts: _LAW.loss(n_act, tokens, experts),
        {"n_act": _RUN_N[:3], "tokens": _RUN_D[:3], "experts": _RUN_E[:3]},
        ("n_act", "tokens", "experts"),
        LAW_OK,
        covers=("JointMoEScalingLaw", "JointLawParams", "PAPER_COEFFS_UNVERIFIED"),
    ),
    HostileSpec(
        "JointMoEScalingLaw.fit",
        arrays=("n_act", "tokens", "experts", "losses"),
        allow={"huge": "a 1e30 scale is a valid (if odd) unit: the fit stays finite"},
        setup=_fit_setup,
    ),
    HostileSpec(
        "JointMoEScalingLaw.compute_optimal",
        lambda flops, experts: _LAW.compute_optimal(flops, experts),
        {"flops": 1e21, "experts": 4.0},
        ("flops", "experts"),
        covers=("Allocation",),
    ),
    HostileSpec(
        "JointMoEScalingLaw.memory_constrained_optimal",
        lambda flops, max_total_params: _LAW.memory_constrained_optimal(flops, max_total_params),
        {"flops": 1e21, "max_total_params": 2e9},
        ("flops", "max_total_params"),
    ),
    HostileSpec(
        "JointMoEScalingLaw.compare_dense_vs_moe",
        lambda flops, max_total_params: _LAW.compare_dense_vs_moe(flops, max_total_params),
        {"flops": 1e21, "max_total_params": 2e9},
        ("flops", "max_total_params"),
    ),
    HostileSpec(
        "total_params",
        le.total_params,
        {"n_act": 1e8, "experts": 4, "ffn_fraction": 0.5},
        ("n_act", "ffn_fraction"),
    ),
    HostileSpec(
        "lr_rule", le.lr_rule, {"n_act": np.array([1e8, 1e9]), "experts": 4.0}, ("n_act", "experts"), LAW_OK
    ),
    HostileSpec(
        "budget_table",
        le.budget_table,
        {"flops": 1e21, "max_total_params": 2e9},
        ("flops", "max_total_params"),
    ),
    HostileSpec(
        "MoEFFN",
        lambda x: _FFN(x),
        {"x": torch.randn(2, 3, 8, generator=_g)},
        ("x",),
        {
            "constant": CONST_OK,
            "huge": "routing is scale-invariant and the FFN output stays finite in float32",
        },
    ),
    HostileSpec(
        "TinyDecoder",
        lambda ids: _DEC(ids),
        {"ids": torch.randint(0, 16, (2, 8), generator=_g)},
        ("ids",),
        {"constant": "a sequence repeating one token is valid"},
    ),
    HostileSpec(
        "TopicBigramCorpus.reference_losses",
        lambda tokens, topics: _CORPUS.reference_losses(tokens, topics),
        {"tokens": _TOK, "topics": _TOP},
        ("tokens", "topics"),
        covers=("TopicBigramCorpus",),
    ),
]
# P04 MEAP -----------------------------------------------------------------------------------------------
_MEAP_IDS = torch.randint(0, 20, (3, 12), generator=_g)
MEAP_OK = {"constant": "a row repeating one token is valid input"}
with isolated_rng(0):
    _MEAP_LM = torch.nn.Sequential(torch.nn.Embedding(21, 8), torch.nn.Linear(8, 21))


def _meap_lm(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """A tiny causal LM (embedding + linear head) called like an HF model."""
    return _MEAP_LM(input_ids)


_MEAP_COLL = le.MEAPCollator(mask_id=20, ratio=0.25, seed=0)
_MEAP_SFT = le.MEAPSFTCollator(mask_id=20, eos_id=1, pad_id=0, min_answer_len=2, seed=0)

SPECS += [
    HostileSpec(
        "meap_mask_inputs",
        lambda input_ids, protect: le.meap_mask_inputs(input_ids, 20, 0.25, protect=protect, seed=0),
        {"input_ids": _MEAP_IDS, "protect": torch.zeros(3, 12, dtype=torch.bool)},
        ("input_ids", "protect"),
        {"constant": "a constant row (or no protected position) is valid"},
    ),
    HostileSpec(
        "mask_hf_batch",
        lambda input_ids, attention_mask: le.mask_hf_batch(
            input_ids, 20, 0.25, attention_mask=attention_mask, seed=0
        ),
        {"input_ids": _MEAP_IDS, "attention_mask": torch.ones(3, 12, dtype=torch.long)},
        ("input_ids", "attention_mask"),
        {"constant": "a constant row (or no padding) is valid"},
    ),
    HostileSpec(
        "meap_pretrain_loss",
        lambda input_ids: le.meap_pretrain_loss(_meap_lm, input_ids, mask_id=20, ratio=0.25, seed=0),
        {"input_ids": _MEAP_IDS},
        ("input_ids",),
        MEAP_OK,
    ),
    HostileSpec(
        "causal_lm_loss",
        le.causal_lm_loss,
        {"logits": torch.randn(3, 12, 21, generator=_g), "labels": _MEAP_IDS},
        ("logits", "labels"),
        {
            "constant": "constant logits are a uniform prediction: a finite loss",
            "huge": "log-softmax of huge logits is finite",
        },
    ),
    HostileSpec(
        "MEAPCollator",
        lambda features: _MEAP_COLL([{"input_ids": r} for r in features]),
        {"features": _MEAP_IDS},
        ("features",),
        MEAP_OK,
    ),
    HostileSpec(
        "MEAPSFTCollator",
        lambda prompt_ids, answer_ids: _MEAP_SFT([{"prompt_ids": prompt_ids, "answer_ids": answer_ids}]),
        {"prompt_ids": _MEAP_IDS[0, :4], "answer_ids": _MEAP_IDS[1]},
        ("prompt_ids", "answer_ids"),
        {
            "constant": "a constant prompt or answer is valid",
            "empty": "an empty prompt (or answer) is a valid SFT example: the row is the rest plus EOS",
        },
    ),
]
_SLWS_X = torch.randn(2, 5, 4, generator=_g)
_SLWS_LAYER = torch.nn.Linear(4, 4)  # token-wise; an empty feature axis is the layer's error, not SLWS's
_SLWS_OK = {
    "constant": "a constant sequence is valid: a permutation of equal tokens",
    "huge": "a token-wise linear layer on 1e30-scaled tokens stays finite in float32",
    "x:empty:0": "an empty batch: the layer runs on the empty batch",
    "x:empty:1": "no tokens: nothing to permute, the layer runs unchanged (with a warning)",
    "nan": Allow("documented: values are not inspected; a NaN token is permuted and restored", False),
    "posinf": Allow("documented: values are not inspected; an Inf token is permuted and restored", False),
    "neginf": Allow("documented: values are not inspected; an Inf token is permuted and restored", False),
}
_GEN_NOTE = "generator=None draws from torch's global generator, like dropout (PyTorch convention)"
SPECS += [
    HostileSpec(
        "linear_shuffle_schedule",
        le.linear_shuffle_schedule,
        {"depth": 6, "max_rate": 0.5},
        ("depth", "max_rate"),
    ),
    HostileSpec(
        "constant_shuffle_schedule",
        le.constant_shuffle_schedule,
        {"depth": 6, "max_rate": 0.5},
        ("depth", "max_rate"),
    ),
    HostileSpec(
        "shuffle_forward",
        lambda x, prob: le.shuffle_forward(
            _SLWS_LAYER, x, prob=prob, training=True, generator=torch.Generator().manual_seed(0)
        ),
        {"x": _SLWS_X, "prob": 1.0},
        ("x", "prob"),
        _SLWS_OK,
    ),
    HostileSpec(
        "ShuffledLayer",
        lambda x: le.ShuffledLayer(_SLWS_LAYER, 1.0, generator=torch.Generator().manual_seed(0)).train()(x),
        {"x": _SLWS_X},
        ("x",),
        _SLWS_OK,
    ),
    HostileSpec(
        "StochasticLayerShuffle",
        lambda max_rate: le.StochasticLayerShuffle([torch.nn.Identity(), torch.nn.Identity()], max_rate),
        {"max_rate": 0.5},
        ("max_rate",),
    ),
    HostileSpec(
        "apply_slws",
        lambda max_rate: le.apply_slws(
            le.VimTiny(d_model=8, depth=2, d_state=2, drop_path=0.0, seed=0), "layers", max_rate
        ),
        {"max_rate": 0.5},
        ("max_rate",),
    ),
    HostileSpec(
        "VimTiny",
        lambda images: le.VimTiny(d_model=8, depth=2, d_state=2, drop_path=0.0, seed=0).eval()(images),
        {"images": torch.rand(2, 1, 8, 8, generator=_g)},
        ("images",),
        {
            "constant": "a constant image is valid: finite logits",
            "huge": "RMSNorm after the patch embedding keeps 1e30-scaled images finite",
            "nan": Allow("documented: pixel values are not inspected; NaN propagates to the logits", False),
            "posinf": Allow(
                "documented: pixel values are not inspected; Inf propagates to the logits", False
            ),
            "neginf": Allow(
                "documented: pixel values are not inspected; Inf propagates to the logits", False
            ),
        },
    ),
]
# P11 PENCIL ---------------------------------------------------------------------------------------------
_PT = le.PencilTokens(3, 4, 5)
_P_IDS = torch.tensor([9, 1, 3, 7, 4, 8, 5, 6, 2])  # prompt, EOP (1), [CALL] 7 [SEP] 8 [RETURN], 6, EOS (2)
_P_OK = {
    "constant": "a sequence of one repeated word has no marker: returned unchanged",
    "ids:empty:0": "an empty sequence has no [RETURN]: returned unchanged",
    "extra_dim": "never valid",
}
with isolated_rng(0):
    _P_LM = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10))
SPECS += [
    HostileSpec(
        "reduce_once",
        lambda ids: le.reduce_once(ids, _PT),
        {"ids": _P_IDS},
        ("ids",),
        {k: v for k, v in _P_OK.items() if k != "extra_dim"},
        covers=("reduce_once", "PencilTokens", "PencilReductionError"),
    ),
    HostileSpec(
        "reduce_full",
        lambda ids: le.reduce_full(ids, _PT),
        {"ids": _P_IDS},
        ("ids",),
        {k: v for k, v in _P_OK.items() if k != "extra_dim"},
    ),
    HostileSpec(
        "context_profile",
        lambda trace_ids: le.context_profile(trace_ids, _PT),
        {"trace_ids": _P_IDS},
        ("trace_ids",),
        {
            "constant": "a sequence without markers: the profile is 1, 2, ..., T",
            "trace_ids:empty:0": "an empty sequence: an empty profile",
        },
    ),
    HostileSpec(
        "extract_subsequences",
        lambda trace_ids, prompt_end_id: le.extract_subsequences(trace_ids, _PT, prompt_end_id),
        {"trace_ids": _P_IDS, "prompt_end_id": 1},
        ("trace_ids", "prompt_end_id"),
    ),
    HostileSpec(
        "PencilCollator",
        lambda ids: le.PencilCollator(pad_id=0)([{"ids": ids, "loss_start": 2}]),
        {"ids": _P_IDS},
        ("ids",),
        {"constant": "a constant example is valid: padded and labelled like any other"},
    ),
    HostileSpec(
        "pencil_generate",
        lambda prompt_ids, temperature: le.pencil_generate(
            _P_LM, prompt_ids, _PT, eos_id=2, max_new_tokens=4, temperature=temperature, seed=0
        ),
        {"prompt_ids": torch.tensor([9, 1]), "temperature": 0.8},
        ("prompt_ids", "temperature"),
        {
            "constant": "a prompt repeating one token is valid",
            "prompt_ids:extra_dim": "a (T, 1) tensor is a batch of T one-token prompts (documented)",
        },
        covers=("pencil_generate", "GenerateOutput"),
    ),
    HostileSpec(
        "generate_sat",
        lambda clause_ratio: le.generate_sat(2, 3, 4, clause_ratio=clause_ratio, seed=0),
        {"clause_ratio": 4.3},
        ("clause_ratio",),
    ),
    HostileSpec(
        "generate_qbf",
        lambda clause_ratio: le.generate_qbf(2, 2, 3, clause_ratio=clause_ratio, seed=0),
        {"clause_ratio": 2.0},
        ("clause_ratio",),
    ),
    HostileSpec("generate_seqsum", lambda k: le.generate_seqsum(2, k=k, seed=0), {"k": 3}, ("k",)),
    HostileSpec(
        "PencilVocab",
        lambda words: le.PencilVocab(words).encode(words),
        {"words": np.array(["a", "b"])},
        ("words",),
        {
            "constant": "a repeated word is added once and encoded each time",
            "empty:0": "no words: the encoding is <|endofprompt|> alone",
            "dtype": "the variant of a string array is the same strings",
        },
    ),
]
# P24 NTPP -----------------------------------------------------------------------------------------------
_NA, _NB = torch.randint(1, 9, (2, 6), generator=_g), torch.randint(1, 9, (2, 6), generator=_g)
_N_OK = {"constant": "a constant stream (one token repeated) is a valid dialogue channel"}
SPECS += [
    HostileSpec("interleave_pairs", le.interleave_pairs, {"a": _NA, "b": _NB}, ("a", "b"), _N_OK),
    HostileSpec(
        "deinterleave_pairs",
        le.deinterleave_pairs,
        {"x": torch.stack([_NA, _NB], 2).reshape(2, 12)},
        ("x",),
        {
            "constant": "a constant sequence splits into constant slots",
            "dtype": "any dtype is split (ids, logits or hidden states)",
            "extra_dim": "(B, 2T, ...) tensors with trailing dimensions are split along dim 1 (documented)",
        },
    ),
    HostileSpec("pair_causal_mask", le.pair_causal_mask, {"T": 4}, ("T",)),
    HostileSpec(
        "ntpp_loss",
        le.ntpp_loss,
        {
            "logits_a": torch.randn(2, 6, 9, generator=_g),
            "logits_b": torch.randn(2, 6, 9, generator=_g),
            "a": _NA,
            "b": _NB,
        },
        ("logits_a", "logits_b", "a", "b"),
        {
            "constant": "constant logits are a uniform prediction and constant streams valid targets: a finite loss",
            "huge": "log-softmax of huge logits is finite",
        },
    ),
    HostileSpec(
        "swap_channels",
        lambda a, b, p: le.swap_channels(a, b, p, seed=0),
        {"a": _NA, "b": _NB, "p": 0.5},
        ("a", "b", "p"),
        _N_OK,
    ),
    HostileSpec(
        "DualChannelCollator",
        lambda a, b: le.DualChannelCollator(pad_id=0)([{"a": a, "b": b}]),
        {"a": _NA[0], "b": _NB[0]},
        ("a", "b"),
        _N_OK,
    ),
    HostileSpec(
        "turn_taking_stats",
        lambda a, b: le.turn_taking_stats(a, b, silence_id=1),
        {"a": _NA, "b": _NB},
        ("a", "b"),
        {"constant": "a constant channel is one long IPU (or all silence): valid statistics"},
    ),
]
# P38 LaRA -------------------------------------------------------------------------------------------
_LARA_RNG = np.random.default_rng(0)
_RX = _LARA_RNG.normal(size=(40, 3))
_RLC = (_RX[:, 0] > 0).astype(np.int64)
_RRAG = ((_RX[:, 0] <= 0) | (_RX[:, 1] > 1.0)).astype(np.int64)
_RROUTER = le.RagLcRouter().fit(_RX, _RLC, _RRAG)
_MINI = le.make_mini_lara(4, seed=0, questions_per_doc=4)
_LITEM = _MINI.items[0]
_LDOC = _MINI.document(_LITEM)
_LRET = le.HybridRetriever(k=3, chunker=le.Chunker(None, 64, 16))
_LCHUNKS = _LRET(_LDOC, _LITEM.question)
ROUTE_OK = {
    "constant": "constant features are valid: every query goes to the arm with the higher base rate",
    "huge": "tree ensembles only compare feature values: 1e30 routes finitely",
}


class _RouterView(torch.nn.Module):
    """The live fitted state of a RagLcRouter (the identity of its two fitted classifiers and its predicted
    gains on a probe set), so ``state_of`` can compare it exactly (``vars`` compares estimators by identity)."""

    def __init__(self, router: object) -> None:
        super().__init__()
        self.__dict__.update(_router=router)

    def state_dict(self, *args, **kwargs) -> dict:  # type: ignore[override]
        r = self._router
        ids = [id(getattr(r, k, None)) for k in ("lc_model_", "rag_model_")]
        return {"ids": torch.tensor(ids, dtype=torch.float64), "gain": torch.from_numpy(r.predict_gain(_RX))}


def _lara_fit_setup():
    router = le.RagLcRouter().fit(_RX, _RLC, _RRAG)
    return (lambda features: router.fit(features, _RLC, _RRAG)), {"features": _RX}, _RouterView(router)


SPECS += [
    HostileSpec(
        "RagLcRouter.fit",
        arrays=("features",),
        allow=ROUTE_OK,
        setup=_lara_fit_setup,
        covers=("RagLcRouter",),
    ),
    HostileSpec(
        "RagLcRouter.predict",
        lambda features: _RROUTER.predict(features),
        {"features": _RX},
        ("features",),
        ROUTE_OK,
    ),
    HostileSpec(
        "routed_accuracy",
        le.routed_accuracy,
        {"route": _RLC, "lc_correct": _RLC, "rag_correct": _RRAG},
        ("route", "lc_correct", "rag_correct"),
        {"constant": "constant 0/1 outcomes are valid: the accuracy of one arm"},
    ),
    HostileSpec(
        "router_features",
        lambda n_ctx_tokens, model_strength: le.router_features(
            _LITEM, _LCHUNKS, n_ctx_tokens, model_strength
        ),
        {"n_ctx_tokens": 4096, "model_strength": 0.8},
        ("model_strength",),
    ),
    HostileSpec(
        "guideline_route",
        lambda model_strength: le.guideline_route("comp", 4000, model_strength),
        {"model_strength": 0.8},
        ("model_strength",),
    ),
    HostileSpec(
        "HybridRetriever",
        lambda question: _LRET(_LDOC, question),
        {"question": _LITEM.question},
        (),
        covers=("HybridRetriever", "Chunker", "DocIndex", "RetrievedChunk", "TextChunk"),
    ),
    HostileSpec(
        "build_prompt",
        lambda: le.build_prompt(_LITEM, "rag", chunks=_LCHUNKS),
        {},
        (),
        covers=("build_prompt", "LaraItem"),
    ),
    HostileSpec(
        "evaluate_arm",
        lambda: le.score_predictions(
            le.evaluate_arm(
                [_LITEM], lambda m: "12", "rag", None, documents=_MINI.documents, retriever=_LRET
            ),
            le.LexicalJudge(),
        ),
        {},
        (),
        covers=("evaluate_arm", "score_predictions", "LexicalJudge", "MiniLara", "make_mini_lara"),
    ),
    HostileSpec(
        "fit_context", lambda window: le.fit_context("a b c d", window, truncate="middle"), {"window": 3}, ()
    ),
    HostileSpec(
        "LLMJudge",
        lambda: le.LLMJudge(lambda m: "True", model="judge")("q", "a", "p", "location"),
        {},
        (),
    ),
    HostileSpec("is_refusal", lambda: le.is_refusal("It is not mentioned."), {}, ()),
    HostileSpec("normalize_numbers", lambda: le.normalize_numbers("$2,576,340."), {}, ()),
    HostileSpec("question_cues", lambda: le.question_cues("Comparing A and B?"), {}, ()),
    HostileSpec(
        "SimulatedLCReader",
        lambda: le.SimulatedLCReader(le.LCReaderParams("r", 0.1, 0.1, 0.1, 0.2))(_LITEM, _LDOC),
        {},
        (),
        covers=("SimulatedLCReader", "LCReaderParams"),
    ),
    HostileSpec("RagReader", lambda: le.RagReader(_LRET)(_LITEM, _LDOC), {}, ()),
    HostileSpec(
        "LlamaIndexRetriever",
        lambda: le.LlamaIndexRetriever(lambda doc: type("R", (), {"retrieve": lambda self, q: ["node"]})())(
            _LDOC, _LITEM.question
        ),
        {},
        (),
    ),
    HostileSpec("extract_answer", lambda: le.extract_answer(_LITEM.question, _LDOC), {}, ()),
]
EXCLUDED = {
    "HFGenerator": "runs a transformers model on chat messages (extra [hf]); windows and truncation in test_lara.py",
    "load_lara": "reads a LaRA directory; missing files, bad JSON and unknown tasks are tested in test_lara.py",
    "read_document": "reads one file; a missing document is tested in test_lara.py",
    "save_lara": "writes a LaRA directory; round trip tested in test_lara.py",
    "BiMambaMixer": "an nn.Module of the VimTiny backbone (exercised through VimTiny); validates its config",
    "VimBlock": "an nn.Module of the VimTiny backbone (exercised through VimTiny)",
    "add_mask_token": "edits a transformers tokenizer and resizes a model (extra [hf]); no array input",
    "meap_attention_stats": "runs an HF model with output_attentions (extra [hf]); checked in test_meap.py",
    "Chunk": "a result container (text, start offset)",
    "AquaPredictors": "a container of nn.Linear predictors built by calibrate_predictors; checks its config",
    "CalibrationReport": "a result container",
    "SpargeStats": "a result container",
    "SpargeController": "holds validated SpargeAttn hyper-parameters for the HF integration (extra [hf])",
    "register_sparge_attention": "registers an attention function with transformers (extra [hf]); no array input",
    "calibrate_predictors": "runs an HF model over token batches; the KV tensors come from the model",
    "evaluate_kv_compression": "runs an HF model with a cache; the KV tensors come from the model",
}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_hostile_inputs(spec: HostileSpec) -> None:
    print(spec.check().summary())


def test_registry_covers_public_api() -> None:
    print("icml25.llm_efficiency covers", kt.assert_covers(le, SPECS, EXCLUDED))


@pytest.mark.parametrize(
    "shape,match",
    [
        ((1, 2, 0, 16), "k must have every dimension >= 1"),
        ((1, 2, 32, 0), "q must have every dimension >= 1"),
    ],
)
def test_sparge_attention_lk_zero_and_d_zero(shape: tuple[int, ...], match: str) -> None:
    q = torch.randn(1, 2, 32, shape[-1])
    k = torch.randn(*shape)
    with pytest.raises(ValueError, match=match):
        le.sparge_attention(q, k, k, block_q=16, block_k=16)
