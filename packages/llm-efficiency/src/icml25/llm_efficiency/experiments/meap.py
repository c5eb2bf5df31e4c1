"""Mask-Enhanced Autoregressive Prediction — ICML 2025, P04: small-scale reproduction.

Zhuang et al., "Mask-Enhanced Autoregressive Prediction: Pay Less Attention to Learn More", ICML 2025
(arXiv:2502.07490; official code ``scitix/MEAP``). Claim: masking a small fraction of the *input* tokens
during next-token pre-training (MEAP) improves in-context key-information retrieval over plain NTP at
equal compute (paper: Needle-in-a-Haystack, ~85.8% vs ~52% for 1.1B models on C4) without hurting
language modelling.

Our CPU-scale setting (:class:`Setting` gives each knob's paper value next to ours): a synthetic needle
language (vocabulary 64 + ``[MASK]``): a sparse Markov filler with K key→value pairs inserted at random
positions (keys drawn without replacement); every training sequence ends with ``QUERY KEY_j v_j`` triples.
Two tiny ``LlamaForCausalLM`` models (hidden 64, 2 layers, 4 heads) from the same init and the same data
stream: NTP (ratio 0) and MEAP (ratio 0.15, BOS and the final query tokens protected), AdamW lr 3e-3.
Metrics: retrieval accuracy at the answer position on held-out sequences (by the third of the sequence
where the needle sits) and the validation NLL of filler transitions; report-only: attention entropy at
the answer position over non-masked keys, and the filler NLL right after a masked input.

Pre-condition (:func:`preconditions`): NTP retrieval accuracy ≥ 2 × chance (1/16) on every seed; a run
where the baseline never learns the lookup measures nothing and is *inconclusive* (change the setting).
Pass rule (:func:`checks`): full mode (mean over seeds) MEAP accuracy ≥ NTP + 5 points and MEAP filler
NLL ≤ 1.05 × NTP's; quick mode the mechanics (both losses decrease, exactly ``max(1, floor(T·p))``
inputs masked per row, labels never masked, ratio 0 gives the plain CE bit for bit), the direction
(MEAP accuracy > NTP's, at a shorter sequence where NTP leaves chance) and filler NLL ≤ 1.05 × NTP's.

Run: ``python -m icml25.llm_efficiency.experiments.meap [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icml25.kernels.experiment import (
    Check,
    Report,
    experiment_main,
    new_figure,
    progress,
    save_figure,
    seed_everything,
    threshold_text,
    torch_threads,
)
from icml25.kernels.rng import isolated_rng
from icml25.llm_efficiency.meap import MEAPCollator, causal_lm_loss, mask_hf_batch, meap_attention_stats

PAPER = "P04"
CLAIM = (
    "Masking a small fraction of the input tokens during next-token pre-training (MEAP) improves in-context "
    "key retrieval over plain NTP without hurting language modelling (paper: NIAH ~85.8% vs ~52%, 1.1B on C4)."
)

N_FILLER, N_KEYS, N_VALUES = 38, 8, 16
KEY0 = N_FILLER
VAL0 = KEY0 + N_KEYS
QUERY = VAL0 + N_VALUES
BOS = QUERY + 1
VOCAB = BOS + 1  # 64 language tokens
MASK = VOCAB  # [MASK] is token 64; the models have 65 embeddings


@dataclass(frozen=True)
class Setting:
    """One reproduction scale: data, model, training budget, evaluation and pass bars.

    Calibrated once (as the third review of the plan asks) so that the NTP baseline learns the lookup: at
    T=64 / hidden 128 / lr 1e-3 / 300 steps with half the sequences carrying a query, NTP stayed at chance
    (6.15% vs 6.25%) and the comparison measured nothing. Full: the reviewed calibration point (T=32,
    hidden 64, lr 3e-3, 1,500 steps, every sequence with a query) at the plan's batch 32, where NTP sits
    at 30-77% per seed. Quick: a shorter sequence (T=16) at which NTP leaves chance within a test's
    budget.
    """

    T: int
    """Tokens per sequence (paper: 4,096 packed C4 tokens; ours 32, quick 16)."""
    n_pairs: int
    """Key→value pairs per sequence (paper: one needle in a haystack; ours 2)."""
    n_queries: int
    """``QUERY KEY_j v_j`` triples closing a query row (one needle question in NIAH; ours 2 for a denser
    retrieval signal)."""
    steps: int
    """Optimizer steps per arm (paper: 190k at 256 sequences; ours 1,500 as planned, quick 500)."""
    batch: int
    """Sequences per step (paper 256; ours 32)."""
    n_seeds: int
    """Seeds averaged (paper: one run per model; ours 3, quick 1)."""
    n_eval: int
    """Held-out query sequences (ours 2,000, quick 500)."""
    hidden: int = 64
    """Model width (paper 2,048 for the 1.1B model; ours 64, the reviewed calibration point)."""
    layers: int = 2
    """Decoder layers (paper 24; ours 2)."""
    heads: int = 4
    """Attention heads (paper: 32 query heads in 2 KV groups; ours 4, no GQA)."""
    lr: float = 3e-3
    """AdamW learning rate (paper 4e-4 cosine to 4e-5 with 10% warm-up; ours constant 3e-3)."""
    ratio: float = 0.15
    """MEAP masking ratio of the input tokens (paper pre-training 0.15, as here)."""
    query_fraction: float = 1.0
    """Fraction of training sequences ending in queries (paper: NIAH is evaluated, not trained; ours 1.0:
    at 0.5 NTP never left chance)."""
    full_gates: bool = True
    """Gate on the +5-point accuracy margin (full) or on the mechanics and the direction (quick)."""


FULL = Setting(T=32, n_pairs=2, n_queries=2, steps=1500, batch=32, n_seeds=3, n_eval=2000)
QUICK = Setting(T=16, n_pairs=2, n_queries=2, steps=500, batch=32, n_seeds=1, n_eval=500, full_gates=False)

CHANCE = 1.0 / N_VALUES
"""Retrieval accuracy of a guess among the value tokens."""
ACC_MARGIN = 0.05
"""MEAP retrieval accuracy minus NTP's, at least (our CPU-scale bar: +5 points; the paper's NIAH gap is ~34)."""
NLL_RATIO = 1.05
"""MEAP filler NLL over NTP's, at most (LM ability not destroyed)."""


def preconditions(setting: Setting) -> list[Check]:
    """When the comparison can show the effect at all: the NTP baseline learned the lookup on every seed."""
    del setting  # the same condition in both modes
    return [
        Check(
            "NTP accuracy >= 2 x chance (1/16) on every seed",
            lambda m: m["baseline_ntp_accuracy_min_seed"] >= 2 * CHANCE,
        )
    ]


def checks(setting: Setting) -> list[Check]:
    """The pass rule of ``setting`` (see the module docstring)."""
    nll = Check(
        f"MEAP filler NLL <= {NLL_RATIO:g} x NTP filler NLL",
        lambda m: m["meap_filler_nll"] <= NLL_RATIO * m["baseline_ntp_filler_nll"],
    )
    if setting.full_gates:
        return [
            Check(
                f"MEAP accuracy >= NTP accuracy + {ACC_MARGIN:g}",
                lambda m: m["meap_accuracy"] >= m["baseline_ntp_accuracy"] + ACC_MARGIN - 1e-9,
            ),
            nll,
        ]
    return [
        Check("both training losses decrease", lambda m: m["loss_decreased"] == 1.0),
        Check("exactly max(1, floor(T*p)) inputs masked per row", lambda m: m["mask_count_exact"] == 1.0),
        Check("labels never masked", lambda m: m["labels_clean"] == 1.0),
        Check("ratio 0 loss == plain causal-LM loss", lambda m: m["ratio0_identical"] == 1.0),
        Check("MEAP accuracy > NTP accuracy", lambda m: m["meap_accuracy"] > m["baseline_ntp_accuracy"]),
        nll,
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    return threshold_text(checks(QUICK if quick else FULL))


# ------------------------------------------------------------------------------------------------ data
class NeedleLanguage:
    """The synthetic needle language: sparse Markov filler with inserted ``KEY_k v_k`` pairs.

    ``sample(n, T, n_pairs, n_queries, query_fraction, rng)`` returns ``ids (n, T)``, ``has_query (n,)``,
    ``answer (n, n_queries)`` (value tokens, -1 in rows without queries) and ``needle_pos (n, n_queries)``
    (haystack position of each queried key, -1 likewise). Layout: ``BOS``, a haystack of filler with
    ``n_pairs`` non-overlapping pairs in ``[1, H)`` where ``H = T - 3·n_queries``, then ``n_queries``
    triples ``QUERY KEY_j v_j`` for distinct queried pairs (query rows; filler otherwise). Keys are drawn
    without replacement, values with replacement.
    """

    def __init__(self, seed: int = 1234, successors: int = 3) -> None:
        rng = np.random.default_rng(seed)
        P = np.zeros((N_FILLER, N_FILLER))
        for a in range(N_FILLER):
            nxt = rng.choice(N_FILLER, size=successors, replace=False)
            P[a, nxt] = rng.dirichlet(np.ones(successors) * 2.0)
        self.P = P
        self.cum = P.cumsum(1)

    def sample(
        self, n: int, T: int, n_pairs: int, n_queries: int, query_fraction: float, rng: np.random.Generator
    ) -> dict[str, np.ndarray]:
        H = T - 3 * n_queries
        if n_queries > n_pairs or H - 1 < 2 * n_pairs + 1:
            raise ValueError(f"T={T} too short for {n_pairs} pairs and {n_queries} queries")
        # Filler Markov chain everywhere; pairs and queries overwrite positions afterwards.
        state = rng.integers(0, N_FILLER, size=n)
        u = rng.random((n, T))
        ids = np.zeros((n, T), dtype=np.int64)
        for t in range(T):
            ids[:, t] = state
            state = np.minimum((self.cum[state] < u[:, t : t + 1]).sum(1), N_FILLER - 1)
        ids[:, 0] = BOS
        # Pair starts: K sorted distinct c in [1, H-K-1], pos_i = c_i + i (gaps >= 2, last pair ends <= H-1).
        span = H - 1 - n_pairs
        c = np.sort(np.argsort(rng.random((n, span)), axis=1)[:, :n_pairs] + 1, axis=1)
        pos = c + np.arange(n_pairs)
        keys = np.argsort(rng.random((n, N_KEYS)), axis=1)[:, :n_pairs] + KEY0
        vals = rng.integers(0, N_VALUES, size=(n, n_pairs)) + VAL0
        rows = np.arange(n)[:, None]
        ids[rows, pos] = keys
        ids[rows, pos + 1] = vals
        has_q = rng.random(n) < query_fraction
        j = np.argsort(rng.random((n, n_pairs)), axis=1)[:, :n_queries]  # distinct queried pairs
        answer = np.where(has_q[:, None], vals[rows, j], -1)
        needle = np.where(has_q[:, None], pos[rows, j], -1)
        q = np.flatnonzero(has_q)
        for i in range(n_queries):
            ids[q, H + 3 * i] = QUERY
            ids[q, H + 3 * i + 1] = keys[q, j[q, i]]
            ids[q, H + 3 * i + 2] = vals[q, j[q, i]]
        return {"ids": ids, "has_query": has_q, "answer": answer, "needle_pos": needle}


def filler_targets(ids: torch.Tensor) -> torch.Tensor:
    """``(B, L)`` bool: positions ``t >= 1`` whose token and previous token are both filler (Markov)."""
    f = ids < N_FILLER
    out = torch.zeros_like(f)
    out[:, 1:] = f[:, 1:] & f[:, :-1]
    return out


# ---------------------------------------------------------------------------------------------- model
def make_model(setting: Setting, seed: int) -> Any:
    """A random-init ``LlamaForCausalLM`` with 65 embeddings (64 tokens + ``[MASK]``)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "the P04 reproduction builds a transformers Llama: pip install 'icml25-llm-efficiency[hf]'"
        ) from err
    cfg = LlamaConfig(
        vocab_size=VOCAB + 1,
        hidden_size=setting.hidden,
        num_hidden_layers=setting.layers,
        num_attention_heads=setting.heads,
        num_key_value_heads=setting.heads,
        intermediate_size=2 * setting.hidden,
        max_position_embeddings=2 * setting.T,
        bos_token_id=BOS,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    with isolated_rng(seed):
        return LlamaForCausalLM(cfg)


def protect_mask(ids: torch.Tensor, n_queries: int) -> torch.Tensor:
    """BOS and the final query region (``3·n_queries`` positions) are never masked."""
    p = torch.zeros_like(ids, dtype=torch.bool)
    p[:, 0] = True
    p[:, ids.shape[1] - 3 * n_queries :] = True
    return p


def train_arm(
    setting: Setting, ratio: float, seed: int, lang: NeedleLanguage, mask_labels: bool = False
) -> tuple[Any, list[float]]:
    """Train one arm on the seed's data stream; returns the model and its per-step losses.

    ``mask_labels=True`` is the broken variant: the labels get ``[MASK]`` at the masked positions too.
    """
    model = make_model(setting, seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=setting.lr, weight_decay=0.0)
    rng = np.random.default_rng(seed + 1)
    collate = MEAPCollator(mask_id=MASK, ratio=ratio, protect_ids=[BOS, QUERY], seed=seed + 2)
    prot = protect_mask(torch.zeros(1, setting.T, dtype=torch.long), setting.n_queries)[0].long().tolist()
    losses = []
    for _ in progress(range(setting.steps), desc=f"ratio={ratio:g} seed={seed}"):
        data = lang.sample(
            setting.batch, setting.T, setting.n_pairs, setting.n_queries, setting.query_fraction, rng
        )
        batch = collate([{"input_ids": row, "meap_protect": prot} for row in data["ids"].tolist()])
        ids, labels = batch["input_ids"], batch["labels"]
        if mask_labels:
            labels = labels.masked_fill(ids == MASK, MASK)
        loss = causal_lm_loss(model(input_ids=ids).logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return model, losses


@torch.no_grad()
def evaluate_arm(model: Any, setting: Setting, data: dict[str, np.ndarray], seed: int) -> dict[str, float]:
    """Retrieval accuracy (overall, by third), clean and masked-context filler NLL, answer-row attention
    entropy over non-masked keys."""
    ids = torch.from_numpy(data["ids"])
    T = setting.T
    logits = torch.cat([model(input_ids=c).logits for c in ids.split(256)])
    H = T - 3 * setting.n_queries
    at = [H + 3 * i + 1 for i in range(setting.n_queries)]  # each query's KEY_j predicts v_j
    pred = logits[:, at].argmax(-1).numpy()
    hit = pred == data["answer"]
    thirds = np.minimum(data["needle_pos"] * 3 // H, 2)
    out = {"accuracy": float(hit.mean())}
    for i in range(setting.n_queries):
        out[f"accuracy_query{i + 1}"] = float(hit[:, i].mean())
    for k, name in enumerate(("first", "middle", "last")):
        sel = thirds == k
        out[f"accuracy_{name}"] = float(hit[sel].mean()) if sel.any() else math.nan
    fill = filler_targets(ids)
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    nll = -logp.gather(-1, ids[:, 1:, None])[..., 0]
    out["filler_nll"] = float(nll[fill[:, 1:]].mean())
    prot = protect_mask(ids, setting.n_queries)
    masked, _ = mask_hf_batch(ids, MASK, setting.ratio, protect=prot, seed=seed + 99)
    mlog = torch.cat([model(input_ids=c).logits for c in masked.split(256)])
    mnll = -torch.log_softmax(mlog[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    # Filler targets x_t right after a masked input x_{t-1} (with x_{t-2} -> x_{t-1} -> x_t filler
    # transitions): predicting through the hole needs the two-step Markov kernel from x_{t-2}.
    hole = torch.zeros_like(fill)
    hole[:, 2:] = fill[:, 2:] & fill[:, 1:-1] & (masked[:, 1:-1] == MASK)
    out["masked_nll"] = float(mnll[hole[:, 1:]].mean())
    return out


def attention_entropy(model: Any, setting: Setting, data: dict[str, np.ndarray]) -> float:
    """Mean (over layers and heads) attention entropy at the answer position over non-masked keys."""
    n = min(256, len(data["ids"]))
    ids = torch.from_numpy(data["ids"][:n])
    model.set_attn_implementation("eager")
    try:
        q = torch.full((n,), setting.T - 3 * setting.n_queries + 1, dtype=torch.long)
        stats = meap_attention_stats(model, ids, mask_id=MASK, query_positions=q)
    finally:
        model.set_attn_implementation("sdpa")
    return float(stats["entropy"].mean())


def mechanics(setting: Setting, seed: int) -> dict[str, float]:
    """Quick-mode checks of the masking itself on a fresh batch."""
    lang = NeedleLanguage()
    data = lang.sample(
        setting.batch, setting.T, setting.n_pairs, setting.n_queries, 1.0, np.random.default_rng(seed)
    )
    collate = MEAPCollator(mask_id=MASK, ratio=setting.ratio, protect_ids=[BOS, QUERY], seed=seed)
    batch = collate([{"input_ids": r} for r in data["ids"].tolist()])
    n_mask = (batch["input_ids"] == MASK).sum(1)
    want = max(1, math.floor((setting.T - 1) * setting.ratio))
    model = make_model(setting, seed)
    ids = torch.from_numpy(data["ids"])
    plain = causal_lm_loss(model(input_ids=ids).logits, ids)
    zero = MEAPCollator(mask_id=MASK, ratio=0.0)([{"input_ids": r} for r in data["ids"].tolist()])
    z = causal_lm_loss(model(input_ids=zero["input_ids"]).logits, zero["labels"])
    return {
        "mask_count_exact": float(bool((n_mask == want).all())),
        "labels_clean": float(bool((batch["labels"] == ids).all())),
        "ratio0_identical": float(bool(torch.equal(plain, z))),
    }


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None, _mask_labels: bool = False,
        _meap_ratio: float | None = None) -> Report:  # fmt: skip
    """Train NTP and MEAP on the needle language and compare retrieval and filler NLL (module docstring).

    ``_mask_labels`` / ``_meap_ratio`` build the broken variants used by the tests (labels masked too,
    another masking ratio for the MEAP arm).
    """
    setting = QUICK if quick else FULL
    seed_everything(seed)
    t0 = time.perf_counter()
    lang = NeedleLanguage()
    per_seed: list[dict[str, float]] = []
    curves: dict[str, list[float]] = {}
    with torch_threads(1):  # tiny models: one thread is fastest on 2 cores and bit-identical across machines
        for s in range(seed, seed + setting.n_seeds):
            eval_data = lang.sample(
                setting.n_eval,
                setting.T,
                setting.n_pairs,
                setting.n_queries,
                1.0,
                np.random.default_rng(10_000 + s),
            )
            row: dict[str, float] = {}
            for arm, ratio in (("ntp", 0.0), ("meap", setting.ratio if _meap_ratio is None else _meap_ratio)):
                model, losses = train_arm(setting, ratio, s, lang, mask_labels=_mask_labels and arm == "meap")
                res = evaluate_arm(model, setting, eval_data, s)
                res["attn_entropy"] = attention_entropy(model, setting, eval_data)
                k = max(1, len(losses) // 10)
                res["loss_decreased"] = float(np.mean(losses[-k:]) < np.mean(losses[:k]))
                row.update({f"{arm}_{name}": v for name, v in res.items()})
                if s == seed:
                    curves[arm] = losses
            per_seed.append(row)
        mech = mechanics(setting, seed)
    mean = {k: float(np.nanmean([r[k] for r in per_seed])) for k in per_seed[0]}
    metrics: dict[str, float] = {}
    for k, v in mean.items():
        arm, name = k.split("_", 1)
        metrics[f"baseline_ntp_{name}" if arm == "ntp" else f"meap_{name}"] = v
    metrics["loss_decreased"] = float(
        mean["ntp_loss_decreased"] == 1.0 and mean["meap_loss_decreased"] == 1.0
    )
    metrics.pop("meap_loss_decreased")
    metrics.pop("baseline_ntp_loss_decreased")
    metrics.update(mech)
    metrics["baseline_ntp_accuracy_min_seed"] = min(r["ntp_accuracy"] for r in per_seed)
    for i, r in enumerate(per_seed):
        metrics[f"seed{i}_meap_accuracy"] = r["meap_accuracy"]
        metrics[f"seed{i}_ntp_accuracy"] = r["ntp_accuracy"]
    metrics["total_seconds"] = time.perf_counter() - t0
    figures = [plot(out_dir, curves, metrics)] if out_dir is not None else []
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        preconditions=preconditions(setting),
        metrics=metrics,
        headline="meap_accuracy",
        baseline="baseline_ntp_accuracy",
        figures=figures,
        notes=(
            f"Needle language T={setting.T}, {setting.n_pairs} key-value pairs, {setting.n_queries} query "
            f"triple(s) on {setting.query_fraction:.0%} of the training sequences, vocab 64 + [MASK]; "
            f"LlamaForCausalLM hidden {setting.hidden}, {setting.layers} layers, {setting.heads} heads; "
            f"{setting.steps} AdamW steps (lr {setting.lr:g}) at batch {setting.batch} per arm, same init and "
            f"data stream; {setting.n_seeds} seed(s); {setting.n_eval} held-out query sequences. MEAP ratio "
            f"{setting.ratio:g} per row (independent positions, not the official shared 51-step cycle), "
            "BOS and the final query tokens protected; equal steps and tokens for both arms."
        ),
    )


def plot(out_dir: str | Path, curves: dict[str, list[float]], m: dict[str, float]) -> Path:
    """Training losses of both arms and retrieval accuracy by needle third."""
    fig, (a1, a2) = new_figure(1, 2, figsize=(10, 4))
    for arm, c in curves.items():
        k = max(1, len(c) // 20)
        sm = np.convolve(c, np.ones(k) / k, mode="valid")
        a1.plot(sm, label="MEAP (p=0.15)" if arm == "meap" else "NTP")
    a1.set_xlabel("step")
    a1.set_ylabel("training loss")
    a1.legend()
    x = np.arange(4)
    names = ("first", "middle", "last")
    ntp = [m[f"baseline_ntp_accuracy_{n}"] for n in names] + [m["baseline_ntp_accuracy"]]
    meap = [m[f"meap_accuracy_{n}"] for n in names] + [m["meap_accuracy"]]
    a2.bar(x - 0.2, ntp, 0.4, label="NTP")
    a2.bar(x + 0.2, meap, 0.4, label="MEAP")
    a2.set_xticks(x, ["first third", "middle third", "last third", "overall"])
    a2.set_ylabel("retrieval accuracy")
    a2.legend()
    fig.suptitle("P04 MEAP vs NTP on the synthetic needle language")
    fig.tight_layout()
    return save_figure(fig, out_dir, "p04_meap")


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
