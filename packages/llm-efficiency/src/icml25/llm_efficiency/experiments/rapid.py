"""RAPID: Long-Context Inference with Retrieval-Augmented Speculative Decoding — ICML 2025, P03: small-scale reproduction.

Chen et al., ICML 2025 (official code: John-AI-Lab/RAPID). Claim: a RAG drafter verified by the
long-context target against the retrieval-augmented target ``p̂ = softmax(z − η·g)`` improves over the
long-context model alone (InfiniteBench, LLaMA-3.1-8B: 39.33 → 42.83) at fewer target calls per token,
while the truncated correction keeps the target's veto when retrieval is wrong.

Our CPU-scale setting replaces the LLMs by :class:`~icml25.llm_efficiency.rapid.InductionLM`, an analytic
induction-head model, so that long-context distraction and retrieval quality are controlled exactly.
Each item: vocabulary 4096; 20 chunks of 40 tokens (a chunk-specific topic token, then filler drawn
without the special tokens); the *relevant* chunk holds ``key a1..a5`` and 8 *distractor* chunks hold
``key`` with other 5-token continuations; the query is ``[topic of the relevant chunk, key]``; the
answer is ``a1..a5``. The target reads all 20 chunks + query; the drafter (the same model class) reads the
chunk retrieved by TF-IDF cosine (top 1) + query. Decoding: 5 tokens, at most γ = 5 drafts per round with
the official confidence stop (0.1), temperature 1.

* **main** (distraction): the relevant chunk is one of the first 12 and the distractors follow it, so the
  recency-weighted target (τ = 100) prefers distractors: exact match (EM) of the target alone, the drafter
  alone and RAPID (η = 10, α = 0.1), and RAPID's target calls per generated token;
* **veto** (τ = 10, relevant chunk nearest the query, the target is right): RAPID with η = 0 must match
  the target's EM (same output distribution); then the drafter is given the *farthest distractor* instead
  of the retrieved chunk on 50% of the items and the first-token accuracy of RAPID (η = 10) must stay
  at the target's, while the same run with the α mask removed (α → 0) must lose it.

Full-answer EM under corrupted retrieval is reported without a threshold: after the first token an
uninformed drafter's ``q`` is flat, every token passes the α mask and RAPID lowers the target's confident
logits by ≈ η·p (the correction is bounded by η, a property of the method).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
from icml25.kernels.rng import make_generator
from icml25.llm_efficiency.rapid import InductionLM, RapidGenerator, select_chunks, tfidf_scores

PAPER = "P03"
CLAIM = (
    "RAPID (RAG drafter + long-context target verified against the retrieval-augmented target) beats the "
    "long-context model alone at fewer target calls per token; eta=0 is exact speculative decoding and the "
    "truncated correction keeps the target's veto against a wrong RAG drafter"
)
NO_MASK_ALPHA = 1e-30
"""α → 0: every token with ``q > 1e-30·max q`` keeps its correction, i.e. the α mask removed."""


@dataclass(frozen=True)
class Setting:
    """One reproduction scale of P03 (the models are analytic; the paper uses 8B–72B LLMs)."""

    items: int
    """Items per seed (paper: InfiniteBench / LongBench v2 tasks; CPU: 50 quick, 400 full)."""
    n_seeds: int
    """Data seeds averaged (paper: one run per benchmark; CPU: 1 quick, 3 full)."""
    draws: int = 2
    """Decoding samples per item and method (ours: variance reduction at temperature 1)."""
    vocab: int = 4096
    """Vocabulary of the analytic model (paper: the LLM's ~128k; CPU: 4096 so answers do not recur by chance)."""
    chunks: int = 20
    """Chunks of the long context (paper: 128k-token contexts in 512-token chunks; CPU: 20 × 40 tokens)."""
    chunk_len: int = 40
    """Tokens per chunk (paper 512; CPU 40)."""
    answer_len: int = 5
    """Answer tokens; also max_new_tokens (CPU 5)."""
    distractors: int = 8
    """Chunks holding the key with another continuation (ours: 8)."""
    top_k: int = 1
    """Retrieved chunks for the drafter (paper: ⌈8192/512⌉ = 16; CPU: top 1 by TF-IDF cosine)."""
    gamma: int = 5
    """The most drafted tokens per round γ (paper examples: 10; CPU: 5)."""
    confidence_threshold: float | None = 0.1
    """The drafter's stop rule: a round ends after a token drafted with probability below it (official: 0.1,
    ``assistant_confidence_threshold`` of the LongBench script). The main regime also reports fixed γ-token
    drafts (``*_fixed_gamma``, this module's rule before the alignment)."""
    eta: float = 10.0
    """RAPID strength η (README: 10 for LLaMA-3.1 self-speculation)."""
    alpha: float = 0.1
    """Truncation α (official ``spec_alpha`` = 0.1)."""
    tau_main: float = 100.0
    """Recency scale τ of InductionLM in the main regime (ours; target log-odds of a1 in (−η, 0))."""
    tau_veto: float = 10.0
    """τ in the veto regime (ours: the target is confident, ≈ 15-nat margin over a far distractor)."""
    smoothing: float = 1e-3
    """Uniform smoothing s of InductionLM (ours)."""
    corrupt_fraction: float = 0.5
    """Items whose drafter sees the farthest distractor in the veto regime (ours: 50%)."""
    eta_sweep: tuple[float, ...] = ()
    """Extra η values measured for the figure (quick: none; full: 0, 2, 5, 20)."""


QUICK = Setting(items=50, n_seeds=1)
FULL = Setting(items=400, n_seeds=3, eta_sweep=(0.0, 2.0, 5.0, 20.0))


def checks(setting: Setting) -> list[Check]:
    """The pass rule (paper's direction, thresholds set before the first run; the same in both modes)."""
    return [
        Check(
            "(a) eta=0: |EM - target EM| <= max(3, 2 SE) points",
            lambda m: abs(m["em_rapid_eta0_corrupt"] - m["veto_em_target"]) <= m["veto_em_tolerance"],
        ),
        Check("(a) eta=0: acceptance < 1", lambda m: m["acceptance_rapid_eta0_corrupt"] < 1.0),
        Check("(b) eta=10: EM >= target EM + 20 points", lambda m: m["em_rapid"] >= m["em_target"] + 20),
        Check("(b) eta=10: EM >= 0.8 x drafter-only EM", lambda m: m["em_rapid"] >= 0.8 * m["em_drafter"]),
        Check("(b) eta=10: target calls per token <= 0.5", lambda m: m["calls_per_token_rapid"] <= 0.5),
        Check(
            "(c) 50% wrong retrieval, eta=10: first-token accuracy >= target - 5 points",
            lambda m: m["first_rapid_corrupt"] >= m["first_target"] - 5,
        ),
        Check(
            "(c) same run with the alpha mask removed: first-token accuracy <= target - 20 points",
            lambda m: m["first_no_alpha_corrupt"] <= m["first_target"] - 20,
        ),
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    return threshold_text(checks(QUICK if quick else FULL))


@dataclass(frozen=True)
class Item:
    """One long-context question: token ids of the chunks, the query and the answer."""

    chunks: tuple[np.ndarray, ...]
    query: np.ndarray
    answer: tuple[int, ...]
    relevant: int
    distractors: tuple[int, ...]

    @property
    def long_prompt(self) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([*self.chunks, self.query]).astype(np.int64))

    def rag_prompt(self, chunk_ids: list[int]) -> torch.Tensor:
        return torch.from_numpy(
            np.concatenate([*(self.chunks[i] for i in chunk_ids), self.query]).astype(np.int64)
        )


def make_item(s: Setting, rng: np.random.Generator, relevant_last: bool) -> Item:
    """One item; ``relevant_last``: the relevant chunk is the last one (veto regime), else one of the first
    ``chunks − distractors`` with the distractors after it (main regime)."""
    n, length, a = s.chunks, s.chunk_len, s.answer_len
    special = rng.choice(s.vocab, n + 1 + a * (1 + s.distractors), replace=False)
    topics, key = special[:n], int(special[n])
    conts = special[n + 1 :].reshape(1 + s.distractors, a)
    filler = np.setdiff1d(np.arange(s.vocab), special)
    if relevant_last:
        rel = n - 1
        dis = np.sort(rng.choice(n - 1, s.distractors, replace=False))
    else:
        rel = int(rng.integers(0, n - s.distractors))
        dis = np.sort(rng.choice(np.arange(rel + 1, n), s.distractors, replace=False))
    chunks = []
    for c in range(n):
        chunk = np.concatenate([[topics[c]], rng.choice(filler, length - 1)])
        holder = 0 if c == rel else (1 + int(np.searchsorted(dis, c)) if c in dis else None)
        if holder is not None:
            at = 1 + int(rng.integers(0, length - a - 1))
            chunk[at] = key
            chunk[at + 1 : at + 1 + a] = conts[holder]
        chunks.append(chunk.astype(np.int64))
    query = np.array([topics[rel], key], dtype=np.int64)
    return Item(tuple(chunks), query, tuple(int(t) for t in conts[0]), rel, tuple(int(d) for d in dis))


def retrieve_ids(item: Item, k: int) -> list[int]:
    """TF-IDF cosine retrieval of the drafter's chunks (query = topic token + key), in context order."""
    return select_chunks(tfidf_scores([c.tolist() for c in item.chunks], item.query.tolist()), k)


def sample_autoregressive(
    model: InductionLM, prompt: torch.Tensor, n: int, gen: torch.Generator
) -> list[int]:
    """Plain ancestral sampling of ``n`` tokens (the target-only and drafter-only baselines)."""
    cache = model.new_cache()
    logits = model(prompt[None], cache=cache, logits_to_keep=1).logits[0, -1]
    out: list[int] = []
    for i in range(n):
        out.append(int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen)))
        if i < n - 1:
            logits = model(torch.tensor([[out[-1]]]), cache=cache).logits[0, -1]
    return out


def _rapid(
    target: InductionLM,
    drafter: InductionLM,
    s: Setting,
    eta: float,
    alpha: float,
    verify: Callable | None,
    fixed_gamma: bool = False,
) -> RapidGenerator:
    threshold = None if fixed_gamma else s.confidence_threshold
    return RapidGenerator(
        target, drafter, gamma=s.gamma, eta=eta, alpha=alpha, verify=verify, confidence_threshold=threshold
    )


def _pct(hits: list[float]) -> float:
    return 100.0 * float(np.mean(hits))


def measure(s: Setting, seed: int = 0, verify: Callable | None = None) -> dict[str, float]:
    """Every metric of the reproduction (percentages for accuracies), pooled over the setting's seeds."""
    main_model = InductionLM(s.vocab, tau=s.tau_main, smoothing=s.smoothing)
    veto_model = InductionLM(s.vocab, tau=s.tau_veto, smoothing=s.smoothing)
    etas = sorted({s.eta, *s.eta_sweep})
    veto_etas = sorted({0.0, s.eta, *s.eta_sweep})
    rows: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rows.setdefault(key, []).append(float(value))

    bar = progress(total=s.n_seeds * s.items, desc="P03 RAPID")
    for data_seed in seeds_of(s, seed):
        rng = np.random.default_rng(data_seed)
        gen = make_generator(data_seed)
        for i in range(s.items):
            # main regime: distraction in the long context, correct retrieval
            item = make_item(s, rng, relevant_last=False)
            chosen = retrieve_ids(item, s.top_k)
            add("retrieval_hit", item.relevant in chosen)
            long_ids, rag_ids = item.long_prompt, item.rag_prompt(chosen)
            for _ in range(s.draws):
                add(
                    "em_target",
                    sample_autoregressive(main_model, long_ids, s.answer_len, gen) == list(item.answer),
                )
                add(
                    "em_drafter",
                    sample_autoregressive(main_model, rag_ids, s.answer_len, gen) == list(item.answer),
                )
                runs = [(eta, False, "rapid" if eta == s.eta else f"rapid_eta{eta:g}") for eta in etas]
                for eta, fixed, tag in [*runs, (s.eta, True, "rapid_fixed_gamma")]:
                    out = _rapid(main_model, main_model, s, eta, s.alpha, verify, fixed).generate(
                        long_ids, rag_ids, s.answer_len, generator=gen, eos_token_id=[]
                    )
                    add(f"em_{tag}", out.tokens.tolist() == list(item.answer))
                    add(f"calls_per_token_{tag}", out.target_calls_per_token)
                    add(f"acceptance_{tag}", out.acceptance_rate)
            # veto regime: the target is right; the drafter is misled on a fraction of the items
            item = make_item(s, rng, relevant_last=True)
            long_ids, good_ids = item.long_prompt, item.rag_prompt(retrieve_ids(item, s.top_k))
            bad_ids = item.rag_prompt([item.distractors[0]])  # the farthest distractor
            rag_ids = bad_ids if i < round(s.corrupt_fraction * s.items) else good_ids  # items are i.i.d.
            for _ in range(s.draws):
                tokens = sample_autoregressive(veto_model, long_ids, s.answer_len, gen)
                add("veto_em_target", tokens == list(item.answer))
                add("first_target", tokens[0] == item.answer[0])
                runs = [(eta, s.alpha, "rapid" if eta == s.eta else f"rapid_eta{eta:g}") for eta in veto_etas]
                for eta, alpha, name in [*runs, (s.eta, NO_MASK_ALPHA, "no_alpha")]:
                    out = _rapid(veto_model, veto_model, s, eta, alpha, verify).generate(
                        long_ids, rag_ids, s.answer_len, generator=gen, eos_token_id=[]
                    )
                    add(f"first_{name}_corrupt", out.tokens[0].item() == item.answer[0])
                    add(f"em_{name}_corrupt", out.tokens.tolist() == list(item.answer))
                    add(f"acceptance_{name}_corrupt", out.acceptance_rate)
            bar.update(1)
    bar.close()
    metrics = {k: (_pct(v) if k.startswith(("em_", "veto_em", "first_", "retrieval")) else float(np.mean(v)))
               for k, v in rows.items()}  # fmt: skip
    n = len(rows["veto_em_target"])
    pr, pt = metrics["em_rapid_eta0_corrupt"] / 100, metrics["veto_em_target"] / 100
    se = 100.0 * math.sqrt((pr * (1 - pr) + pt * (1 - pt)) / n)
    metrics["veto_em_se"] = se
    metrics["veto_em_tolerance"] = max(3.0, 2.0 * se)
    return metrics


def seeds_of(s: Setting, seed: int) -> list[int]:
    """The data seeds of a run with seed ``seed``."""
    return [1000 * seed + k for k in range(s.n_seeds)]


def _figure(m: dict[str, float], s: Setting, out_dir: Path) -> Path:
    fig, (ax1, ax2) = new_figure(1, 2, figsize=(10, 3.8))
    etas = sorted({s.eta, *s.eta_sweep})

    def key(prefix: str, eta: float, suffix: str = "") -> str:
        return f"{prefix}{'' if eta == s.eta else f'_eta{eta:g}'}{suffix}"

    ax1.plot(etas, [m[key("em_rapid", e)] for e in etas], "o-", label="RAPID")
    ax1.axhline(m["em_target"], color="C3", ls="--", label="long-context target alone")
    ax1.axhline(m["em_drafter"], color="C2", ls=":", label="RAG drafter alone")
    ax1.set_xlabel("η")
    ax1.set_ylabel("exact match of the answer [%]")
    ax1.set_title("main: distractors near the query (τ = 100)")
    ax1.legend(fontsize=8)
    ax2.plot(etas, [m[key("first_rapid", e, "_corrupt")] for e in etas], "o-", label="RAPID (α = 0.1)")
    ax2.plot([s.eta], [m["first_no_alpha_corrupt"]], "s", color="C1", label="α mask removed")
    ax2.plot(etas, [m[key("em_rapid", e, "_corrupt")] for e in etas], "^:", color="C0", alpha=0.6,
             label="RAPID, full-answer EM")  # fmt: skip
    ax2.axhline(m["first_target"], color="C3", ls="--", label="target alone")
    ax2.set_xlabel("η")
    ax2.set_ylabel("first-token accuracy [%]")
    ax2.set_title(f"veto: {s.corrupt_fraction:.0%} wrong retrieval (τ = 10)")
    ax2.legend(fontsize=8)
    fig.suptitle("P03 RAPID on the analytic copying model (γ = 5, temperature 1)")
    fig.tight_layout()
    return save_figure(fig, out_dir, "p03_rapid")


def run(
    quick: bool = True, seed: int = 0, out_dir: str | Path | None = None, *, verify: Callable | None = None
) -> Report:
    """Reproduce RAPID's claims at small scale (see the module docstring).

    ``verify`` replaces :func:`~icml25.llm_efficiency.rapid.rapid_verify` in every RAPID run (the tests pass
    broken variants, which must fail the gate).
    """
    seed_everything(seed)
    setting = QUICK if quick else FULL
    with torch_threads(1):
        metrics = measure(setting, seed, verify)
    figures = [_figure(metrics, setting, Path(out_dir))] if out_dir is not None else []
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        metrics=metrics,
        headline="em_rapid",
        baseline="em_target",
        figures=figures,
        seeds=seeds_of(setting, seed),
        notes=(
            "Analytic InductionLM as target and drafter (vocab 4096, 20x40-token chunks, 8 distractors, "
            f"TF-IDF top-1 retrieval), at most gamma=5 drafts per round with the official confidence stop "
            f"({setting.confidence_threshold:g}; '*_fixed_gamma': always gamma drafts), temperature 1, "
            "residual='exact'; EM and accuracies in percent, "
            f"{setting.draws} decoding draws per item. Main regime tau=100 (relevant chunk far, distractors "
            "near the query); veto regime tau=10 (relevant chunk nearest the query), the drafter given the "
            "farthest distractor on 50% of its items; 'alpha mask removed' = alpha 1e-30. Target calls per "
            "token count verification forwards (target-only decoding: 1.0)."
        ),
    )


def main(argv: list[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
