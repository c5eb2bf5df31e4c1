"""RAPID: Long-Context Inference with Retrieval-Augmented Speculative Decoding — ICML 2025, P03: where the
decoding speed-up pays on CPU (wall clock, paired against greedy decoding of the same target).

Regime. The target is a Llama-architecture causal LM with random weights (cost does not depend on the
weights' values), sized so that one decoding step is bound by reading its weights and KV cache from memory
(printed: weight MB, KV-cache MB at the context length, and the measured cost of a 1-token vs a
``γ+1``-token target forward at that context, which is what speculative verification relies on). Its long
context (2k / 8k; 32k with ``--full``) is a pre-filled random KV cache: prefill is the same for both arms
and is not timed (at 32k it would take hours on one CPU thread). Drafters: ``self`` (RAPID's main setting:
the target's weights with their own short cache of the R = 512 retrieved tokens) and ``small`` (2 layers at
a quarter of the width with the same vocabulary: about 1/9 of the target's bytes at the full size, like a
1B drafter for an 8B target; 1/5 at the quick size, whose embeddings dominate).

Acceptance is measured, not assumed: :class:`~icml25.llm_efficiency.rapid.RapidGenerator` with the
project's :class:`~icml25.llm_efficiency.rapid.InductionLM` on P03's main-regime items (50 items, γ = 5,
η = 10, α = 0.1, the reproduction's quick setting), giving the accepted/drafted fraction ``a``. The timed
RAPID loop then replays RapidGenerator's round structure on the Llama models — γ one-token drafter
forwards, one ``γ+1``-token target forward on the long cache, :func:`~icml25.llm_efficiency.rapid.rapid_verify`
on the real logits, both caches cropped to the accepted prefix — with ``a·γ`` drafts accepted per round on
average (random models do not agree, so their own acceptance says nothing; ``a`` is close to 1 here, so forced
full acceptance would change little). Greedy decoding is one 1-token target forward per token. Both arms decode the
same number of tokens; the ratio is greedy time / RAPID time = RAPID's tokens/s over greedy's (> 1: RAPID
pays), the median over ``--reps`` alternating pairs.

    python packages/llm-efficiency/benchmarks/bench_rapid.py [--quick | --full] [--threads 1] [--reps 5] [--json]
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "shared-kernels" / "benchmarks"))
from _timing import Rows, bench_parser, paired_speedup, parse_bench_args

from icml25.llm_efficiency.rapid import InductionLM, RapidGenerator, rapid_verify

GAMMA, ETA, ALPHA, RAG_LEN = 5, 10.0, 0.1, 512


def measured_acceptance(items: int = 50) -> float:
    """Accepted / drafted drafts of RapidGenerator + InductionLM on P03's main regime (quick setting)."""
    from icml25.llm_efficiency.experiments.rapid import QUICK, make_item, retrieve_ids

    s = QUICK
    model = InductionLM(s.vocab, tau=s.tau_main, smoothing=s.smoothing)
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
    acc = dra = 0
    for _ in range(items):
        item = make_item(s, rng, relevant_last=False)
        out = RapidGenerator(model, model, gamma=GAMMA, eta=ETA, alpha=ALPHA).generate(
            item.long_prompt, item.rag_prompt(retrieve_ids(item, s.top_k)), s.answer_len, generator=gen,
            eos_token_id=[],
        )  # fmt: skip
        acc += sum(out.accepted_per_round)
        dra += sum(out.drafted_per_round)
    return acc / dra


def llama(hidden: int, layers: int, heads: int, kv_heads: int, inter: int, vocab: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=inter, vocab_size=vocab, max_position_embeddings=65536,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


def filled_cache(model, length: int, seed: int):
    """A DynamicCache holding ``length`` random positions in every layer (a pre-filled long context)."""
    from transformers import DynamicCache

    c = model.config
    hd = c.hidden_size // c.num_attention_heads
    g = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    for layer in range(c.num_hidden_layers):
        k = torch.randn(1, c.num_key_value_heads, length, hd, generator=g)
        cache.update(k, torch.randn(1, c.num_key_value_heads, length, hd, generator=g), layer)
    return cache


class Decoder:
    """One model with its cache; ``step(n)`` feeds ``n`` new tokens and returns their logits."""

    def __init__(self, model, length: int, seed: int) -> None:
        self.model, self.base = model, length
        self.cache = filled_cache(model, length, seed)
        self.vocab = model.config.vocab_size

    def length(self) -> int:
        return self.cache.get_seq_length()

    def feed(self, ids: list[int], last_only: bool = False) -> torch.Tensor:
        x = torch.tensor([ids], dtype=torch.int64)
        kw = {"logits_to_keep": 1} if last_only else {}
        return self.model(input_ids=x, past_key_values=self.cache, use_cache=True, **kw).logits[0].float()

    def crop_to(self, length: int) -> None:
        if self.length() > length:
            self.cache.crop(-(self.length() - length))


def greedy(target: Decoder, n: int) -> None:
    tok = 1
    for _ in range(n):
        tok = int(target.feed([tok], last_only=True)[-1].argmax())
    target.crop_to(target.base)


def rapid(target: Decoder, drafter: Decoder, n: int, accept: float) -> None:
    """RapidGenerator's rounds on the Llama caches, ``accept·γ`` drafts accepted per round on average."""
    emitted, r, owed = 0, 0, 0.0
    t_fed, d_fed = 0, 0  # tokens of the generated sequence each cache holds (all but the newest)
    while emitted < n:
        k = min(GAMMA, n - emitted - 1)
        drafts, q_rows = [], []
        pending = list(range(1, 1 + emitted + 1 - d_fed))  # tokens the drafter has not seen (ids arbitrary)
        for _ in range(k):
            q = drafter.feed(pending, last_only=True)[-1]
            drafts.append(int(q.argmax()))
            q_rows.append(q)
            pending = [drafts[-1]]
        d_fed = emitted + 1 + max(k - 1, 0) if k else d_fed
        rows = target.feed([1] * (emitted + 1 - t_fed) + drafts)[-(len(drafts) + 1) :]
        q_mat = torch.stack(q_rows) if q_rows else rows.new_zeros(0, rows.shape[-1])
        rapid_verify(torch.tensor(drafts, dtype=torch.int64), q_mat, rows, eta=ETA, alpha=ALPHA, greedy=True)
        owed += accept * k
        acc = min(k, int(owed))
        owed -= acc
        r += 1
        t_fed = emitted + 1 + acc  # the target cache keeps the pending token and the accepted drafts
        emitted = min(n, emitted + acc + 1)
        target.crop_to(target.base + t_fed)
        d_fed = min(d_fed, t_fed)
        drafter.crop_to(drafter.base + d_fed)
    target.crop_to(target.base)
    drafter.crop_to(drafter.base)


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--full", action="store_true", help="also the 32k context (minutes per row)")
    parser.add_argument(
        "--tokens", type=int, default=None, help="decoded tokens per timed call (quick 8, else 16)"
    )
    args = parse_bench_args(parser, argv)
    rows = Rows("rapid", args)
    torch.set_grad_enabled(False)
    warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
    n = args.tokens or (8 if args.quick else 16)
    if args.quick:
        dims, lengths, drafters = (512, 4, 8, 2, 1408, 32000), [2048, 8192], ["self", "small"]
    else:
        dims = (1024, 8, 16, 4, 2816, 32000)
        lengths = [2048, 8192] + ([32768] if args.full else [])
        drafters = ["self", "small"]
    t0 = time.perf_counter()
    a = measured_acceptance()
    print(f"acceptance (RapidGenerator + InductionLM, P03 main regime, 50 items, gamma={GAMMA}, eta={ETA}): {a:.3f} "
          f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip
    target_model = llama(*dims)
    hidden, layers, heads, kv_heads = dims[:4]
    # a small RAG drafter sharing the vocabulary: 2 layers at a quarter of the width (~1/9 of the target's
    # bytes at the full size, the ratio of a 1B drafter to an 8B target)
    small_model = llama(
        hidden // 4, 2, max(1, heads // 4), max(1, kv_heads // 4), dims[4] // 4, dims[5], seed=1
    )
    w_mb = sum(p.numel() * 4 for p in target_model.parameters()) / 2**20
    w_small = sum(p.numel() * 4 for p in small_model.parameters()) / 2**20
    print(f"target: Llama hidden={hidden} layers={layers} heads={heads} kv_heads={kv_heads} ({w_mb:.0f} MB fp32); "
          f"small drafter: 2 layers, width {hidden // 4} ({w_small:.0f} MB); threads={torch.get_num_threads()} pairs={args.reps} tokens={n}")  # fmt: skip
    print(f"{'L':>6} {'KV MB':>6} {'t1 ms':>7} {'t6 ms':>7} {'t6/t1':>6} {'draft ms':>8} {'drafter':>7} {'accept':>6} | "
          f"{'greedy ms':>9} {'RAPID ms':>9} {'tok/s ratio':>11}")  # fmt: skip
    for L in lengths:
        target = Decoder(target_model, L, seed=L)
        kv_mb = 2 * layers * kv_heads * L * (hidden // heads) * 4 / 2**20
        target.feed([1], last_only=True)  # warm-up
        target.crop_to(L)
        t1s, t6s = [], []
        for _ in range(3):
            s = time.perf_counter()
            target.feed([1], last_only=True)
            t1s.append(time.perf_counter() - s)
            target.crop_to(L)
            s = time.perf_counter()
            target.feed([1] * (GAMMA + 1))
            t6s.append(time.perf_counter() - s)
            target.crop_to(L)
        t1, t6 = statistics.median(t1s), statistics.median(t6s)
        for which in drafters:
            drafter = Decoder(target_model if which == "self" else small_model, RAG_LEN, seed=7)
            tds = []
            for _ in range(3):
                s = time.perf_counter()
                drafter.feed([1], last_only=True)
                tds.append(time.perf_counter() - s)
                drafter.crop_to(RAG_LEN)
            td = statistics.median(tds)
            acc = a
            t_r, t_g, ratio = paired_speedup(
                partial(rapid, target, drafter, n, acc), partial(greedy, target, n), args.reps, cuda=False
            )
            print(
                f"{L:>6} {kv_mb:>6.0f} {t1 * 1e3:>7.1f} {t6 * 1e3:>7.1f} {t6 / t1:>6.2f} {td * 1e3:>8.1f} {which:>7} "
                f"{acc:>6.3f} | {t_g * 1e3:>9.0f} {t_r * 1e3:>9.0f} {ratio:>10.2f}x",
                flush=True,
            )
            rows.add(
                f"context {L}, {which} drafter (R={RAG_LEN}), acceptance {acc:.2f} (measured), gamma {GAMMA}",
                "RAPID decode", "greedy decode (target only)", t_r, t_g, ratio,
                f"wall time for {n} tokens, target {w_mb:.0f} MB weights + {kv_mb:.0f} MB KV (tokens/s ratio)",
                t_target_1tok_ms=t1 * 1e3, t_target_6tok_ms=t6 * 1e3, t_draft_ms=td * 1e3,
            )  # fmt: skip
    rows.note(
        f"RAPID regime: acceptance {a:.2f} is RapidGenerator + InductionLM on P03's items (gamma {GAMMA}); costs are "
        f"a random-weight Llama target ({w_mb:.0f} MB fp32) with a pre-filled KV cache (prefill untimed). A round "
        "costs gamma drafter steps + one (gamma+1)-token target step and emits a*gamma+1 tokens: RAPID pays when "
        "that beats a*gamma+1 greedy steps, i.e. when the (gamma+1)-token verify costs about one step (memory "
        "bound: t6/t1 near 1) and gamma drafter steps are cheap next to a target step (long KV cache, small drafter)."
    )


if __name__ == "__main__":
    main()
