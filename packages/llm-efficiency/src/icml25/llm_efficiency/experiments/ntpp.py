"""NTPP: Next-Token-Pair Prediction — ICML 2025, P24: small-scale reproduction.

Wang et al., "NTPP: Generative Speech Language Modeling for Dual-Channel Spoken Dialogue via Next-Token-Pair
Prediction", ICML 2025 (arXiv 2506.00975; official code github.com/Chaos96/NTPP). Claim: a decoder-only model
trained with next-token-pair prediction on dual-channel dialogue learns cross-channel turn-taking and reactive
content, generating one frame per forward pass, as well as a flattened next-token (NTP) baseline.

Our CPU-scale setting (:class:`Setting` gives each knob's paper value next to ours): synthetic dialogues,
vocabulary {SIL} ∪ 32 content tokens. Speakers alternate turns of U ~ U{4..16} tokens (quick U{3..6}); the
responder starts after a gap of 1–6 silent frames (quick 1–3), or with probability 0.15 1–2 frames before
the other ends (overlap). Turns alternate between an initiation (fresh random content) and a response that
maps the whole initiation token by token, ``Y_k = f(X_{k mod |X|})`` with ``f(t) = t + 7`` mod 32 (a forward
map, so causal even under a 2-frame overlap: ``X_k`` is always heard before ``Y_k``; a response longer than
the initiation wraps around it). Since speakers alternate, one speaker initiates and the other responds in a
dialogue; the fresh initiations keep every response unpredictable from the responder's own channel.
Training crops of T frames, channels swapped with p = 0.5. Arms, each a random-init
``LlamaForCausalLM`` from the same seed: (A) NTPP (the pair-causal mask of the paper's factorisation, which
the official training path skips under SDPA, see the package README's deviations; the official token
positions and channel embedding on queries and keys in full mode, our earlier input embedding and frame
positions in quick mode, see :data:`QUICK`; :class:`Setting`'s ``positions`` and ``channel_embedding``),
(B) flattened NTP on ``a_0 b_0 a_1 …`` with the standard causal mask (full mode only), (C) the deaf control:
NTPP whose tokens see only their own channel.

Evaluation on held-out dialogues, one window per a→b response (a initiates, b responds). Teacher-forced: the
accuracy and NLL of b's second response token (its first after the onset) given the true history, from the
same single pass. Generated (full mode): the history up to 2 frames (:data:`PROMPT_LEAD`) before a's turn
ends is the prompt, channel a is teacher-forced and channel b generated greedily (silence iff
p(SIL) ≥ 1/2); the onset is a hit when b starts within [-2, +3] frames of the frame after a's last token
(the generator's support is [-2, +6]: the onset within it is reported, not gated) and content accuracy is the
fraction of b's generated utterance tokens that follow the rule. The deaf control
cannot hear a's end: the exact Bayes bound of any onset rule that sees only b's own channel
(:func:`deaf_onset_bound`) is reported.

Pass rule (:func:`checks`): full mode (A) onset ≥ 0.85 and content ≥ 0.70, (A) ≥ (B) − 0.05 on both, (C)
onset ≤ the deaf bound + 0.05, (C) content ≤ 0.10 and (A) ≥ (C) + 0.30 on onset and content; quick mode both
training losses decrease and (A)'s teacher-forced onset NLL ≤ 0.9 × (C)'s (turn-taking: b's onset is timed
by hearing a's turn end; what 300 steps learn, see :data:`QUICK`). One pass per frame for NTPP against two for the flattened
baseline in free-running two-channel generation is a property of the decode loops, checked by counting
model calls in the tests, not a gate here.

Run: ``python -m icml25.llm_efficiency.experiments.ntpp [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

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
from icml25.llm_efficiency.ntpp import interleave_pairs, ntpp_loss, swap_channels

PAPER = "P24"
CLAIM = (
    "Next-token-pair prediction lets one decoder-only model learn cross-channel turn-taking and reactive "
    "content in dual-channel dialogue at one forward pass per frame, matching flattened next-token prediction."
)

SIL = 0
N_CONTENT = 32
VOCAB = N_CONTENT + 1  # token 0 is silence, 1..32 content
SHIFT = 7
OVERLAP_P = 0.15
MAX_OVERLAP = 2
"""An overlapping responder starts 1..MAX_OVERLAP frames before the other's turn ends (the plan's 1–2)."""
PROMPT_LEAD = 2
"""Generation starts this many frames before a's last token (the prompt ends there): early enough for an
onset MAX_OVERLAP frames before a's end to be generated, not teacher-forced."""
ONSET_WINDOW = (-2, 3)
"""Allowed onset of b relative to the frame after a's last token (the plan's window; overlap 1–2, gap 1–3)."""


@dataclass(frozen=True)
class Setting:
    """One reproduction scale: data, models, training budget, evaluation and pass bars.

    FULL is the plan's setting (§11: U{4..16}, gaps 1–6, T = 128; §6: 3 layers, hidden 128, onset window
    [-2, +3], the per-token content rule). QUICK is an easier variant for a ≤ 20 s test (shorter crops and
    turns, 2 layers) gated on turn-taking instead of content: the per-token rule is not learnt in a quick
    budget (measured numbers above :data:`QUICK`). FULL runs NTPP in the official code's form (channel
    embedding on queries and keys, token positions); QUICK keeps our earlier form (input channel embedding,
    frame positions), which learns to hear a's turn end within the quick budget on every CPU path where the
    official form does not (measured numbers above :data:`QUICK`).
    """

    T: int
    """Training crop in frames (paper: minutes of Fisher audio at 12.5 Hz Mimi frames; ours 128, quick 32)."""
    steps: int
    """AdamW steps per arm (paper: two-stage training of a 7–8B LLM; ours 800, quick 300)."""
    batch: int
    """Dialogue crops per step (ours 16, quick 8)."""
    hidden: int
    """Model width (paper: LLaMA-family 7–8B, 4,096; ours 128, quick 64)."""
    layers: int
    """Decoder layers (paper 32; ours 3, quick 2)."""
    heads: int = 4
    """Attention heads (paper 32; ours 4)."""
    lr: float = 3e-3
    """AdamW learning rate, constant after 50 warm-up steps (ours 3e-3, quick 5e-3; the paper's is not given)."""
    n_eval: int = 300
    """Held-out a→b response windows (ours 300, quick 96)."""
    horizon: int = 26
    """Frames generated per response window (PROMPT_LEAD = 2 before a's end + 1 + 6 gap + 16 content + 1)."""
    u_min: int = 4
    """Shortest utterance in frames (ours 4, quick 3)."""
    u_max: int = 16
    """Longest utterance in frames (ours 16: a deaf model cannot time its onset from its own turns; quick 6)."""
    gap_max: int = 6
    """Longest gap before a response, frames (ours 6, quick 3)."""
    channel_embedding: str = "qk"
    """NTPP's channel identity (official code ``"qk"``: a learned vector per channel added to the queries and
    keys of every attention layer; ours before ``"input"``: a 2-entry embedding added to the token embeddings;
    ``icml25.llm_efficiency.ntpp.hf.CHANNEL_EMBEDDINGS``). Full: official; quick: ours (see :data:`QUICK`)."""
    positions: str = "token"
    """NTPP's position ids (official code ``"token"``: 0..2T−1; ours before ``"frame"``: both tokens of frame
    t at t). Full: official; quick: ours (see :data:`QUICK`)."""
    train_flat: bool = True
    """Train the flattened NTP baseline (B) (full mode; quick gates (A) against the deaf control only)."""
    full_gates: bool = True
    """Full pass rule (onset, content, vs flat, vs deaf) or the quick one (losses, onset NLL vs deaf)."""


FULL = Setting(T=128, steps=800, batch=16, hidden=128, layers=3)
# Quick (≤ 20 s): shorter crops and turns, two layers, 300 steps, and the turn-taking gate instead of the
# plan's content gate. Measured on this machine, the per-token content rule is not learnt in a quick budget:
# the reactive-token NLL of NTPP / deaf (chance ln 32 = 3.47) is 3.495-3.692 / 3.486-3.512 after 100 steps at
# 1 layer (seeds 0-2; 3.476 / 3.485 even with 2-token turns), 3.455-3.540 / 3.460-3.509 after 300 steps at
# 1 layer (seeds 0-4) and 3.503-3.601 / 3.451-3.502 at 2 layers (seeds 0-2). The onset NLL (nats per response)
# separates: at 1 layer only on the native vector path (300 steps, seed 1: 1.80 / 2.56 native, 2.19 / 2.28
# under ATEN_CPU_CAPABILITY=default); at 2 layers and 200 steps native seed 3 did not learn to hear a
# (2.26 / 2.22); at 2 layers and 300 steps the ratio is 0.74-0.83 native and 0.74-0.76 default (seeds 0-4).
# Those numbers are of our earlier NTPP form, which QUICK keeps (channel_embedding="input", positions="frame"):
# the official form (channel vectors on queries and keys, token positions) at the same budget gives onset NLL
# NTPP / deaf 1.943 / 2.280, 1.781 / 2.238, 1.990 / 2.363 native (seeds 0-2, ratio 0.80-0.85) but 2.103 /
# 2.247, 1.892 / 2.234, 2.095 / 2.313, 2.016 / 2.227 under ATEN_CPU_CAPABILITY=default (seeds 0-3, ratio
# 0.85-0.94: seeds 0, 2 and 3 miss the 0.9 bar), so a quick gate on it would depend on the CPU's vector path.
QUICK = Setting(
    T=32,
    steps=300,
    batch=8,
    hidden=64,
    layers=2,
    lr=5e-3,
    n_eval=96,
    u_min=3,
    u_max=6,
    gap_max=3,
    channel_embedding="input",
    positions="frame",
    train_flat=False,
    full_gates=False,
)

MIN_ONSET = 0.85
"""(A) response-onset accuracy, at least (our CPU-scale bar)."""
MIN_CONTENT = 0.70
"""(A) content accuracy of b's generated utterances, at least (our CPU-scale bar)."""
FLAT_MARGIN = 0.05
"""(A) at most this far below the flattened NTP baseline (B) on onset and content."""
DEAF_SLACK = 0.05
"""(C) onset accuracy at most the deaf Bayes bound plus this."""
DEAF_CONTENT = 0.10
"""(C) content accuracy, at most (chance is 1/32)."""
HEAR_MARGIN = 0.30
"""(A) minus (C), at least, on onset and content (full mode)."""
QUICK_NLL_RATIO = 0.9
"""Quick: NTPP's teacher-forced onset NLL (:func:`onset_nll`) over the deaf control's, at most (our bar for what
a 20-second run learns: the onset is timed from a's turn end, which only NTPP hears)."""


def checks(setting: Setting) -> list[Check]:
    """The pass rule of ``setting`` (see the module docstring)."""
    if not setting.full_gates:
        return [
            Check("training losses decrease (NTPP, deaf)", lambda m: m["loss_decreased"] == 1.0),
            Check(
                f"NTPP onset NLL <= {QUICK_NLL_RATIO:g} x deaf's",
                lambda m: m["ntpp_onset_nll"] <= QUICK_NLL_RATIO * m["deaf_onset_nll"],
            ),
        ]
    content_gap = Check(
        f"NTPP content >= deaf content + {HEAR_MARGIN:g}",
        lambda m: m["ntpp_content"] >= m["deaf_content"] + HEAR_MARGIN - 1e-9,
    )
    return [
        Check(f"NTPP onset >= {MIN_ONSET:g}", lambda m: m["ntpp_onset"] >= MIN_ONSET),
        Check(f"NTPP content >= {MIN_CONTENT:g}", lambda m: m["ntpp_content"] >= MIN_CONTENT),
        Check(
            f"NTPP onset >= flat NTP onset - {FLAT_MARGIN:g}",
            lambda m: m["ntpp_onset"] >= m["baseline_flat_onset"] - FLAT_MARGIN - 1e-9,
        ),
        Check(
            f"NTPP content >= flat NTP content - {FLAT_MARGIN:g}",
            lambda m: m["ntpp_content"] >= m["baseline_flat_content"] - FLAT_MARGIN - 1e-9,
        ),
        Check(
            f"deaf onset <= deaf Bayes bound + {DEAF_SLACK:g}",
            lambda m: m["deaf_onset"] <= m["deaf_bayes_bound"] + DEAF_SLACK + 1e-9,
        ),
        Check(f"deaf content <= {DEAF_CONTENT:g}", lambda m: m["deaf_content"] <= DEAF_CONTENT),
        Check(
            f"NTPP onset >= deaf onset + {HEAR_MARGIN:g}",
            lambda m: m["ntpp_onset"] >= m["deaf_onset"] + HEAR_MARGIN - 1e-9,
        ),
        content_gap,
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    return threshold_text(checks(QUICK if quick else FULL))


# ------------------------------------------------------------------------------------------------ data
def respond(heard: Sequence[int], k: int) -> int:
    """The responder's k-th token (``k >= 0``; content ids 1..32) answering the utterance ``heard``:
    ``f(heard[k mod len(heard)])`` with ``f(t) = t + 7`` mod 32 (token by token; a longer response wraps)."""
    return (int(heard[k % len(heard)]) - 1 + SHIFT) % N_CONTENT + 1


def simulate_dialogues(
    n: int, frames: int, setting: Setting, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """``n`` synthetic dialogues of ``frames`` frames: ``a (n, frames)``, ``b (n, frames)`` and the turn events.

    Each event is a dict ``row, speaker (0 = a, 1 = b), start, end`` (inclusive frame of the last token),
    ``tokens``, ``response`` (whether it answers the previous utterance) and ``prev`` (the index of the
    previous event in the row or -1). The first speaker is random and initiates; turns alternate between an
    initiation (fresh random tokens) and a response that maps the initiation by :func:`respond`.
    """
    out = np.full((2, n, frames), SIL, dtype=np.int64)
    events: list[dict[str, Any]] = []
    for r in range(n):
        spk = int(rng.integers(2))
        start = int(rng.integers(0, 4))
        prev_tokens: list[int] = []
        prev_idx = -1
        response = False
        while start < frames:
            L = int(rng.integers(setting.u_min, setting.u_max + 1))
            toks = [int(v) for v in rng.integers(1, N_CONTENT + 1, size=L)]
            if response:  # token k answers the initiation's token k, heard at an earlier frame
                toks = [respond(prev_tokens, k) for k in range(L)]
            end = start + L - 1
            span = toks[: max(0, min(L, frames - start))]
            out[spk, r, start : start + len(span)] = span
            events.append(
                {
                    "row": r,
                    "speaker": spk,
                    "start": start,
                    "end": end,
                    "tokens": toks,
                    "response": response,
                    "prev": prev_idx,
                }
            )
            prev_idx = len(events) - 1
            prev_tokens = toks
            response = not response
            if rng.random() < OVERLAP_P:
                start = end + 1 - int(rng.integers(1, MAX_OVERLAP + 1))
            else:
                start = end + 1 + int(rng.integers(1, setting.gap_max + 1))
            spk = 1 - spk
    return out[0], out[1], events


def deaf_onset_bound(setting: Setting) -> float:
    """Exact best onset accuracy of a responder that cannot hear the other channel.

    It knows its own last turn end ``E``; the other starts at ``E+1+g`` (gap ``g`` in ``1..gap_max``,
    probability ``(1-0.15)/gap_max`` each) or ``E+1-o`` (overlap ``o`` in ``1..MAX_OVERLAP``, 0.075 each) and
    speaks ``L`` ~ U{u_min..u_max} frames, ending at ``e``. The responder picks the onset ``E + d`` that
    maximises ``P(e + 1 - 2 <= E + d <= e + 1 + 3)`` (:data:`ONSET_WINDOW`); the bound is that maximum.
    """
    starts = {1 + g: (1 - OVERLAP_P) / setting.gap_max for g in range(1, setting.gap_max + 1)}
    for o in range(1, MAX_OVERLAP + 1):
        starts[1 - o] = starts.get(1 - o, 0.0) + OVERLAP_P / MAX_OVERLAP
    lengths = range(setting.u_min, setting.u_max + 1)
    ends: dict[int, float] = {}
    for s, ps in starts.items():
        for L in lengths:
            ends[s + L - 1] = ends.get(s + L - 1, 0.0) + ps / len(lengths)
    lo, hi = ONSET_WINDOW
    best = 0.0
    for d in range(min(ends) + lo, max(ends) + hi + 2):
        best = max(best, sum(p for e, p in ends.items() if e + 1 + lo <= d <= e + 1 + hi))
    return best


def response_windows(
    a: np.ndarray, b: np.ndarray, events: list[dict[str, Any]], setting: Setting, n_max: int
) -> dict[str, Any]:
    """Evaluation windows, one per a→b response: a ``(W, T - horizon)`` prompt, the ``(W, horizon)`` user
    stream, and per window (``meta``) the frame ``t0`` where generation starts, a's end, b's true onset (all
    relative to the window) and a's utterance."""
    C = setting.T - setting.horizon
    frames = a.shape[1]
    nxt = {ev["prev"]: ev for ev in events if ev["prev"] >= 0}
    pa, pb, user, true_b, meta = [], [], [], [], []
    for idx, ev in enumerate(events):
        e, r = ev["end"], ev["row"]
        t0 = e - PROMPT_LEAD
        if (
            ev["speaker"] != 0
            or idx not in nxt
            or not nxt[idx]["response"]
            or t0 - C < 0
            or t0 + setting.horizon > frames
            or b[r, t0] != SIL
        ):
            continue
        w0 = t0 - C
        pa.append(a[r, w0:t0])
        pb.append(b[r, w0:t0])
        user.append(a[r, t0 : t0 + setting.horizon])
        true_b.append(b[r, t0 : t0 + setting.horizon])
        meta.append((t0 - w0, e - w0, nxt[idx]["start"] - w0, tuple(ev["tokens"])))
        if len(meta) == n_max:
            break
    return {
        "prompt_a": torch.from_numpy(np.stack(pa)),
        "prompt_b": torch.from_numpy(np.stack(pb)),
        "user": torch.from_numpy(np.stack(user)),
        "true_b": torch.from_numpy(np.stack(true_b)),
        "meta": meta,
    }


def score(gen_b: torch.Tensor, windows: dict[str, Any], setting: Setting) -> dict[str, float]:
    """Onset hit rate in :data:`ONSET_WINDOW` (and, reported, within the generator's support
    ``[-MAX_OVERLAP, gap_max]``) and content accuracy of b's first generated utterance.

    ``gen_b`` is ``(W, horizon)``; content scores every token of the utterance against :func:`respond` on
    a's utterance (0 when b never speaks).
    """
    lo, hi = ONSET_WINDOW
    slo, shi = -MAX_OVERLAP, setting.gap_max
    hits, support, content = [], [], []
    for row, (t0, e, _, heard) in zip(gen_b.tolist(), windows["meta"]):
        speech = [i for i, v in enumerate(row) if v != SIL]
        if not speech:
            hits.append(0.0)
            support.append(0.0)
            content.append(0.0)
            continue
        i = speech[0]
        hits.append(float(lo <= t0 + i - (e + 1) <= hi))
        support.append(float(slo <= t0 + i - (e + 1) <= shi))
        utt = []
        for v in row[i:]:
            if v == SIL or len(utt) == setting.u_max:
                break
            utt.append(v)
        content.append(float(np.mean([v == respond(heard, k) for k, v in enumerate(utt)])))
    return {
        "onset": float(np.mean(hits)),
        "onset_in_support": float(np.mean(support)),
        "content": float(np.mean(content)),
    }


# ---------------------------------------------------------------------------------------------- models
def _config(setting: Setting, max_positions: int) -> Any:
    try:
        from transformers import LlamaConfig
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "the P24 reproduction builds a transformers Llama: pip install 'icml25-llm-efficiency[hf]'"
        ) from err
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=setting.hidden,
        num_hidden_layers=setting.layers,
        num_attention_heads=setting.heads,
        num_key_value_heads=setting.heads,
        intermediate_size=2 * setting.hidden,
        max_position_embeddings=max_positions,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=True,
    )


def make_arm(arm: str, setting: Setting, seed: int) -> Any:
    """``"ntpp"`` / ``"deaf"``: an :class:`~icml25.llm_efficiency.ntpp.NTPPModel`; ``"flat"``: a plain Llama."""
    from transformers import LlamaForCausalLM

    from icml25.llm_efficiency.ntpp import NTPPModel

    if arm == "flat":
        with isolated_rng(seed):
            return LlamaForCausalLM(_config(setting, 2 * setting.T))
    n_positions = 2 * setting.T if setting.positions == "token" else setting.T
    return NTPPModel(
        _config(setting, n_positions),
        attention="pair" if arm == "ntpp" else "own",
        channel_embedding=setting.channel_embedding,
        positions=setting.positions,
        seed=seed,
    )


def arm_loss(model: Any, arm: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """NTPP pair loss, or the flattened NTP loss on the interleaved sequence."""
    if arm != "flat":
        return ntpp_loss(*model(a, b), a, b)
    ids = interleave_pairs(a, b)[0]
    logits = model(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def train_arm(arm: str, setting: Setting, seed: int, unpaired: bool = False) -> tuple[Any, list[float]]:
    """Train one arm on the seed's stream of random dialogue crops (channels swapped with p = 0.5).

    ``unpaired=True`` is the broken variant: channel b is taken from another dialogue of the batch, so the
    two streams carry no pair structure.
    """
    model = make_arm(arm, setting, seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=setting.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    rng = np.random.default_rng(seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    losses = []
    for _ in progress(range(setting.steps), desc=f"{arm} seed={seed}"):
        a_np, b_np, _ = simulate_dialogues(setting.batch, setting.T + 40, setting, rng)
        off = int(rng.integers(0, 41))
        a, b = (
            torch.from_numpy(a_np[:, off : off + setting.T]),
            torch.from_numpy(b_np[:, off : off + setting.T]),
        )
        if unpaired:
            b = b.roll(1, 0)
        a, b, _ = swap_channels(a, b, 0.5, generator=gen)
        loss = arm_loss(model, arm, a, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.eval()
    return model, losses


@torch.no_grad()
def evaluate_arm(model: Any, arm: str, windows: dict[str, Any], setting: Setting) -> dict[str, float]:
    """Teacher-forced reactive-token accuracy and NLL (:func:`reactive_token`) and, in full mode, greedy b
    on every response window (a teacher-forced), scored by :func:`score`."""
    from icml25.llm_efficiency.ntpp import flat_duplex_generate

    res: dict[str, float] = {}
    logits = b_logits(model, arm, windows)  # one teacher-forced pass serves both scores
    res["reactive_accuracy"], res["reactive_nll"] = reactive_token(logits, windows)
    res["onset_nll"] = onset_nll(logits, windows)
    if not setting.full_gates:
        return res
    outs = []
    for sl in torch.arange(len(windows["meta"])).split(128):
        pa, pb, u = windows["prompt_a"][sl], windows["prompt_b"][sl], windows["user"][sl]
        if arm == "flat":
            _, gb = flat_duplex_generate(model, pa, pb, setting.horizon, user=u, silence_id=SIL)
        else:
            _, gb = model.duplex_generate(pa, pb, setting.horizon, user=u, silence_id=SIL)
        outs.append(gb[:, pa.shape[1] :])
    res.update(score(torch.cat(outs), windows, setting))
    return res


@torch.no_grad()
def b_logits(model: Any, arm: str, windows: dict[str, Any]) -> torch.Tensor:
    """One teacher-forced pass on the true windows (prompt + user for a, prompt + true b for b): the
    ``(W, frames, V)`` logits of b's token at each frame, ``[:, t]`` the prediction of ``b_t`` from the
    frames before ``t`` (row 0 of NTPP's is padding: nothing predicts frame 0)."""
    a = torch.cat([windows["prompt_a"], windows["user"]], 1)
    b = torch.cat([windows["prompt_b"], windows["true_b"]], 1)
    if arm == "flat":  # a_t's slot predicts b_t
        return model(input_ids=interleave_pairs(a, b)[0]).logits[:, 0::2]
    return torch.nn.functional.pad(model(a, b)[1], (0, 0, 1, 0))  # b_{t-1}'s slot predicts b_t


@torch.no_grad()
def reactive_token(logits: torch.Tensor, windows: dict[str, Any]) -> tuple[float, float]:
    """Teacher-forced accuracy and NLL of b's second response token (its first after the onset).

    ``logits`` are :func:`b_logits`: the prediction of b's token one frame after its true onset, from the
    true history of both channels, is compared with the rule: accuracy of the argmax among content tokens (a
    deaf model's chance: 1/32) and the NLL of the rule's token.
    """
    rows = [i for i, m in enumerate(windows["meta"]) if m[2] + 1 < logits.shape[1]]
    s = torch.tensor([windows["meta"][i][2] for i in rows])  # b's true onset in the window
    pred = logits[torch.tensor(rows, dtype=torch.long), s + 1]  # advanced indexing: a copy
    want = torch.tensor([respond(windows["meta"][i][3], 1) for i in rows])
    nll = float(torch.nn.functional.cross_entropy(pred.float(), want))
    pred[:, SIL] = float("-inf")
    return float((pred.argmax(-1) == want).float().mean()), nll


@torch.no_grad()
def onset_nll(logits: torch.Tensor, windows: dict[str, Any]) -> float:
    """Teacher-forced NLL of b's true onset frame, in nats per response window.

    ``logits`` are :func:`b_logits` (the true history of both channels fed); from the window's first
    generated frame ``t0`` (:data:`PROMPT_LEAD` frames before a's last token) to b's true onset ``s``, each
    frame's speech-or-silence outcome is scored by ``p(SIL)`` (silent before ``s``, speech at ``s``); the
    window's NLL is their sum, ``-log p(onset = s)`` under the model's hazard. Hearing a's turn end sharpens
    it; the deaf control times b from its own turns.
    """
    log_sil = torch.log_softmax(logits.float(), -1)[..., SIL]
    log_speech = torch.log((-torch.expm1(log_sil)).clamp_min(1e-30))
    total = 0.0
    for i, (t0, _, s, _) in enumerate(windows["meta"]):
        total -= float(log_sil[i, t0:s].sum() + log_speech[i, s])
    return total / len(windows["meta"])


def run(
    quick: bool = True, seed: int = 0, out_dir: str | Path | None = None, _unpaired: bool = False
) -> Report:
    """Train NTPP, the deaf control (and in full mode the flattened NTP baseline) and compare (module docstring).

    ``_unpaired`` builds the broken variant used by the tests (NTPP trained on streams from different
    dialogues: no pair structure).
    """
    setting = QUICK if quick else FULL
    seed_everything(seed)
    t0 = time.perf_counter()
    arms = ["ntpp", "deaf"] + (["flat"] if setting.train_flat else [])
    a_np, b_np, events = simulate_dialogues(
        4 * setting.n_eval, 3 * setting.T, setting, np.random.default_rng(10_000 + seed)
    )
    windows = response_windows(a_np, b_np, events, setting, setting.n_eval)
    metrics: dict[str, float] = {
        "deaf_bayes_bound": deaf_onset_bound(setting),
        "n_windows": float(len(windows["meta"])),
    }
    curves: dict[str, list[float]] = {}
    with torch_threads(1):  # tiny models: one thread is fastest on 2 cores and bit-identical across machines
        for arm in arms:
            model, losses = train_arm(arm, setting, seed, unpaired=_unpaired and arm == "ntpp")
            res = evaluate_arm(model, arm, windows, setting)
            k = max(1, len(losses) // 10)
            res["loss_decreased"] = float(np.mean(losses[-k:]) < np.mean(losses[:k]))
            res["final_loss"] = float(np.mean(losses[-k:]))
            name = "baseline_flat" if arm == "flat" else arm
            metrics.update({f"{name}_{key}": v for key, v in res.items()})
            curves[arm] = losses
    metrics["loss_decreased"] = float(
        metrics["ntpp_loss_decreased"] == 1.0 and metrics["deaf_loss_decreased"] == 1.0
    )
    metrics["total_seconds"] = time.perf_counter() - t0
    figures = [plot(out_dir, curves, metrics)] if out_dir is not None else []
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        metrics=metrics,
        headline="ntpp_content" if setting.full_gates else "ntpp_onset_nll",
        baseline="baseline_flat_content" if setting.train_flat else "deaf_onset_nll",
        better="higher" if setting.full_gates else "lower",  # content accuracy; onset NLL, nats per response
        figures=figures,
        notes=(
            f"Synthetic dual-channel dialogues, vocab SIL + {N_CONTENT}, utterances U{{{setting.u_min}..{setting.u_max}}}, "
            f"gaps 1-{setting.gap_max}, overlap p={OVERLAP_P}; crops of T={setting.T} frames, channel swap p=0.5. "
            f"LlamaForCausalLM hidden {setting.hidden}, {setting.layers} layers, {setting.heads} heads; "
            f"NTPP channel embedding {setting.channel_embedding!r}, positions {setting.positions!r}; "
            f"{setting.steps} AdamW steps (lr {setting.lr:g}) at batch {setting.batch} per arm, same init seed "
            f"and data stream; arms {', '.join(arms)}; {len(windows['meta'])} held-out response windows, a "
            f"teacher-forced, b greedy for {setting.horizon} frames; onset window {list(ONSET_WINDOW)} (reported: "
            f"[-{MAX_OVERLAP}, {setting.gap_max}]); response Y_k = X_k + {SHIFT} mod {N_CONTENT} over a's initiation."
        ),
    )


def plot(out_dir: str | Path, curves: dict[str, list[float]], m: dict[str, float]) -> Path:
    """Training losses of the arms, and onset / content accuracy per arm with the deaf Bayes bound."""
    fig, (a1, a2) = new_figure(1, 2, figsize=(10, 4))
    labels = {"ntpp": "NTPP (pair-causal)", "deaf": "deaf control", "flat": "flattened NTP"}
    for arm, c in curves.items():
        k = max(1, len(c) // 20)
        a1.plot(np.convolve(c, np.ones(k) / k, mode="valid"), label=labels[arm])
    a1.set_xlabel("step")
    a1.set_ylabel("training loss")
    a1.legend()
    arms = list(curves)
    x = np.arange(len(arms))
    key = {"ntpp": "ntpp", "deaf": "deaf", "flat": "baseline_flat"}
    bars = [("reactive_accuracy", "reactive token (teacher-forced)")]
    if "ntpp_onset" in m:
        bars += [("onset", "onset accuracy"), ("content", "content accuracy")]
        a2.axhline(m["deaf_bayes_bound"], ls="--", c="gray", label="deaf Bayes bound (onset)")
    w = 0.8 / len(bars)
    for i, (name, label) in enumerate(bars):
        a2.bar(x + (i - (len(bars) - 1) / 2) * w, [m[f"{key[a]}_{name}"] for a in arms], w, label=label)
    a2.set_xticks(x, [labels[a] for a in arms])
    a2.set_ylim(0, 1.05)
    a2.legend()
    fig.suptitle("P24 NTPP on synthetic dual-channel dialogues")
    fig.tight_layout()
    return save_figure(fig, out_dir, "p24_ntpp")


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
