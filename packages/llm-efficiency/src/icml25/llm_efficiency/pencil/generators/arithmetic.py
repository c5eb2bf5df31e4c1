"""PENCIL: Long Thoughts with Short Memory — ICML 2025, P11: a sequential-sum task with scratch work.

A CPU-scale stand-in for the paper's long-trace tasks (Yang et al., ICML 2025; the official code has no
such generator): the prompt lists ``#i d_i`` for ``i = 1..k`` (digits), and step ``i`` is one frame
``[CALL] #i d_i s_{i-1} <S scratch tokens> [SEP] #i s_i [RETURN]`` with ``s_0 = 0`` and ``s_i = (s_{i-1} + d_i)
mod 10``; the ``S`` (default 27) deterministic scratch tokens compute the sum in unary, ``S/3 >= 9`` triples
``m_j u_j v_j`` (step marker, remaining count, running value), so every token is a local function of the
last few. With reduction every
finished frame shrinks to ``#i s_i``, so the context never exceeds ``2k+1 + 2(k-1) + S+8`` tokens; a plain
chain of thought must copy ``d_i`` from about ``(S+8)·i`` tokens back.
"""

from __future__ import annotations

import random
from typing import Any

from icml25.llm_efficiency.pencil.generators._common import check_count, check_seed
from icml25.llm_efficiency.pencil.vocab import CALL, EOP, RETURN, SEP

__all__ = ["generate_seqsum", "seqsum_geometry", "seqsum_words"]


def seqsum_words(k: int, scratch: int) -> list[str]:
    """Every non-special word of the task (for a fixed vocabulary across ``k``)."""
    k, scratch = _check(k, scratch)
    return (
        [str(d) for d in range(10)]
        + [f"u{d}" for d in range(10)]
        + [f"#{i}" for i in range(1, k + 1)]
        + [f"m{j}" for j in range(1, scratch // 3 + 1)]
    )


def _scratch(d: int, s: int, steps: int) -> list[str]:
    """Unary addition ``s + d`` as ``steps`` triples ``m_j u_j v_j``: the count ``u`` goes down to 0 while the
    value ``v`` goes up by one per step (mod 10)."""
    out, u, v = [], d, s
    for j in range(1, steps + 1):
        if u > 0:
            u, v = u - 1, (v + 1) % 10
        out += [f"m{j}", f"u{u}", str(v)]
    return out


def _check(k: object, scratch: object) -> tuple[int, int]:
    k = check_count(k, "k")
    if k > 99:
        raise ValueError(f"k must be <= 99, got {k}")
    scratch = check_count(scratch, "scratch", lowest=27)
    if scratch % 3:
        raise ValueError(f"scratch must be a multiple of 3 (triples m_j u_j v_j), got {scratch}")
    return k, scratch


def generate_seqsum(n_instances: int, k: int = 12, scratch: int = 27, seed: int = 0) -> list[dict[str, Any]]:
    """``n_instances`` examples ``{"prompt", "trace", "label", "digits"}`` (word lists; ``label = s_k``).

    Seeded and pure Python (``random.Random(seed)``); the digits are uniform in ``0..9``.
    """
    check_count(n_instances, "n_instances")
    k, scratch = _check(k, scratch)
    rng = random.Random(check_seed(seed))
    out = []
    for _ in range(n_instances):
        digits = [rng.randrange(10) for _ in range(k)]
        prompt = [w for i, d in enumerate(digits, start=1) for w in (f"#{i}", str(d))]
        trace: list[str] = []
        s = 0
        for i, d in enumerate(digits, start=1):
            new = (s + d) % 10
            trace += [
                CALL,
                f"#{i}",
                str(d),
                str(s),
                *_scratch(d, s, scratch // 3),
                SEP,
                f"#{i}",
                str(new),
                RETURN,
            ]
            s = new
        out.append({"prompt": prompt, "trace": trace, "label": s, "digits": digits})
    return out


def seqsum_geometry(k: int, scratch: int, window: int) -> dict[str, int]:
    """The task's context geometry, measured on one generated trace (word positions, ``EOS`` included).

    ``prompt_len`` (``<|endofprompt|>`` included), ``cot_len`` (full unreduced sequence),
    ``pencil_max_context`` (the longest reduced state, reached at a ``[RETURN]``), ``cot_max_backref``
    (the largest distance from a header's ``d_i`` to its source in the prompt: a sliding window of
    ``window`` tokens sees the source iff distance ``<= window``), ``cot_lost_digits`` (headers whose source
    is outside the window) and ``cot_first_lost`` (the first such ``i``, 0 when none).
    """
    k, scratch = _check(k, scratch)
    window = check_count(window, "window")
    ex = generate_seqsum(1, k, scratch, seed=0)[0]
    seq = ex["prompt"] + [EOP] + ex["trace"] + ["[EOS]"]
    prompt_len = len(ex["prompt"]) + 1
    frame = scratch + 8
    peak, state = 0, prompt_len
    for _ in range(k):
        peak = max(peak, state + frame)
        state += 2
    backrefs = []
    for i in range(1, k + 1):
        header = seq.index(f"#{i}", prompt_len)  # the first #i after the prompt opens frame i
        src = 2 * i - 1
        assert seq[header + 1] == seq[src]
        backrefs.append(header + 1 - src)
    lost = [i for i, b in enumerate(backrefs, start=1) if b > window]
    return {
        "prompt_len": prompt_len,
        "cot_len": len(seq),
        "pencil_max_context": peak,
        "cot_max_backref": max(backrefs),
        "cot_lost_digits": len(lost),
        "cot_first_lost": lost[0] if lost else 0,
    }
