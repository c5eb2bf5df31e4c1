"""NTPP: Next-Token-Pair Prediction — ICML 2025, P24: interleaving, pair-causal mask, pair loss, statistics.

Wang et al., "NTPP: Generative Speech Language Modeling for Dual-Channel Spoken Dialogue via Next-Token-Pair
Prediction", ICML 2025 (arXiv 2506.00975; official code: github.com/Chaos96/NTPP). The pieces that need
only torch:

* :func:`interleave_pairs` / :func:`deinterleave_pairs`: ``(a, b)`` frame streams ↔ the token sequence
  ``a_0 b_0 a_1 b_1 …`` with position ids that count tokens (``0 … 2T−1``, the official code's) or frames
  (both tokens of frame ``t`` at ``t``, ours);
* :func:`pair_causal_mask`: the ``(2T, 2T)`` additive mask in which a token sees every token of an earlier
  frame and itself, never its same-frame partner (``cross_channel=False``: only its own channel);
* :func:`ntpp_loss`: the pair loss ``-Σ_t [log p(a_t | h_<t) + log p(b_t | h_<t)]`` averaged over the
  valid targets of both channels;
* :func:`swap_channels`: the channel-swap augmentation (our addition; makes the model speaker-symmetric);
* :class:`DualChannelCollator`: pads paired streams of equal length per example;
* :func:`turn_taking_stats`: IPU / pause / gap / overlap event statistics on SIL / non-SIL runs (dGSLM).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from icml25.kernels.checks import check_choice, check_float, check_int, check_tensor
from icml25.kernels.rng import make_generator

__all__ = [
    "DualChannelCollator",
    "deinterleave_pairs",
    "interleave_pairs",
    "ntpp_loss",
    "pair_causal_mask",
    "swap_channels",
    "turn_taking_stats",
]

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)

POSITION_LAYOUTS = ("token", "frame")
"""Position ids of the interleaved sequence: ``"token"`` counts tokens, ``0, 1, …, 2T − 1`` (the official
code's default positions, ``dual_llama.py:1128``); ``"frame"`` counts frames, both tokens of frame ``t`` at
``t`` (ours before the official code was read: the two tokens of a frame are simultaneous)."""


def slot_positions(slots: torch.Tensor, positions: str) -> torch.Tensor:
    """Position ids of the interleaved slots ``slots`` (token indices, ``2t`` = ``a_t``, ``2t + 1`` = ``b_t``)
    under the layout ``positions`` (``"token"`` or ``"frame"``, ``POSITION_LAYOUTS``)."""
    return slots if positions == "token" else slots // 2


# ------------------------------------------------------------------------------------------ validation
# Token-stream validators, shared by this module and the transformers integration (hf.py).
def check_token_stream(x: object, name: str, vocab_size: int | None = None, min_len: int = 1) -> torch.Tensor:
    """A ``(B, T)`` integer tensor of non-negative token ids (``< vocab_size`` when given), as int64."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of token ids of shape (batch, T), got {type(x).__name__}"
        )
    if x.dtype not in _INT_DTYPES:
        raise TypeError(f"{name} must be an integer tensor of token ids, got dtype {x.dtype}")
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] < min_len:
        raise ValueError(
            f"{name} must have shape (batch, T) with batch >= 1 and T >= {min_len}, got {tuple(x.shape)}"
        )
    if bool((x < 0).any()):
        raise ValueError(f"{name} must hold non-negative token ids, got min {int(x.min())}")
    if vocab_size is not None and bool((x >= vocab_size).any()):
        raise ValueError(
            f"{name} must hold token ids < the vocabulary size {vocab_size}, got max {int(x.max())}"
        )
    return x.long()


def check_token_pair(
    a: object, b: object, vocab_size: int | None = None, min_len: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two aligned streams ``a, b`` of the same shape (:func:`check_token_stream` each)."""
    a = check_token_stream(a, "a", vocab_size, min_len)
    b = check_token_stream(b, "b", vocab_size, min_len)
    if a.shape != b.shape:
        raise ValueError(
            f"a and b must have the same shape (batch, T) (aligned frames; pad the shorter stream with an "
            f"explicit pad_id), got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    return a, b


# ------------------------------------------------------------------------------------------ layout
def interleave_pairs(
    a: torch.Tensor, b: torch.Tensor, positions: str = "token"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Interleave two aligned streams into one token sequence with its position and channel ids.

    Args:
        a, b: ``(B, T)`` token ids of channel a and channel b (frame ``t`` of both is one pair).
        positions: ``"token"`` (the official code's default): ``position_ids = 0, 1, …, 2T − 1``;
            ``"frame"`` (ours before): ``position_ids[:, 2t] = position_ids[:, 2t+1] = t``.

    Returns:
        ``(ids, position_ids, channel_ids)``, each ``(B, 2T)`` int64: ``ids = a_0 b_0 a_1 b_1 …``, the
        position ids of ``positions`` and ``channel_ids`` 0 at the a slots, 1 at the b slots (the token's
        parity, as the official channel embedding reads it).
    """
    a, b = check_token_pair(a, b)
    check_choice(positions, "positions", POSITION_LAYOUTS)
    B, T = a.shape
    ids = torch.stack([a, b], dim=2).reshape(B, 2 * T)
    pos = slot_positions(torch.arange(2 * T, device=a.device), positions).expand(B, 2 * T).clone()
    chan = torch.tensor([0, 1], device=a.device).repeat(T).expand(B, 2 * T).clone()
    return ids, pos, chan


def deinterleave_pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split an interleaved ``(B, 2T, ...)`` tensor (ids, logits or hidden states) into its a and b slots.

    Returns ``(x[:, 0::2], x[:, 1::2])``, each ``(B, T, ...)``: the inverse of :func:`interleave_pairs`.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape (batch, 2T, ...), got {type(x).__name__}")
    if x.dim() < 2 or x.shape[0] == 0 or x.shape[1] == 0 or x.shape[1] % 2:
        raise ValueError(
            f"x must have shape (batch, 2T, ...) with batch >= 1 and an even length >= 2, got {tuple(x.shape)}"
        )
    return x[:, 0::2], x[:, 1::2]


def pair_causal_mask(
    T: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    cross_channel: bool = True,
) -> torch.Tensor:
    """The pair-causal attention mask of an interleaved sequence of ``T`` frames.

    Entry ``(i, j)`` (query token ``i``, key token ``j`` of ``a_0 b_0 a_1 b_1 …``) is allowed iff
    ``time(j) < time(i)`` or ``j == i``: a token sees both channels' past and itself, never its same-frame
    partner, so ``a_t`` and ``b_t`` are predicted in parallel from the same history. With
    ``cross_channel=False`` (the deaf negative control) a token sees only its own channel's past and itself.

    Args:
        T: number of frames (>= 1).
        device, dtype: of the result; ``dtype=torch.bool`` returns the boolean "allowed" matrix.

    Returns:
        ``(2T, 2T)``: 0 where allowed and ``torch.finfo(dtype).min`` where blocked (a float dtype, additive
        mask; add ``[None, None]`` for the ``(B, 1, q, k)`` form transformers takes), or bool ``allowed``.
    """
    T = check_int(T, "T", low=1)
    if not isinstance(dtype, torch.dtype) or not (dtype.is_floating_point or dtype == torch.bool):
        raise TypeError(f"dtype must be a floating-point torch.dtype or torch.bool, got {dtype!r}")
    if not isinstance(cross_channel, bool):
        raise TypeError(f"cross_channel must be a bool, got {type(cross_channel).__name__}")
    idx = torch.arange(2 * T, device=device)
    t, c = idx // 2, idx % 2
    allowed = (t[None, :] < t[:, None]) | (idx[None, :] == idx[:, None])
    if not cross_channel:
        allowed &= c[None, :] == c[:, None]
    if dtype == torch.bool:
        return allowed
    return torch.zeros(2 * T, 2 * T, device=device, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


# ------------------------------------------------------------------------------------------ loss
def ntpp_loss(
    logits_a: torch.Tensor,
    logits_b: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    pad_id: int | None = None,
) -> torch.Tensor:
    """The next-token-pair loss: mean cross-entropy of both channels' next tokens.

    Args:
        logits_a, logits_b: ``(B, T, V)``; ``logits_x[:, t]`` is the model's distribution of ``x_{t+1}``
            given the frames ``<= t`` (the output at ``x_t``'s slot, as :class:`NTPPModel` returns it).
        a, b: ``(B, T)`` token ids; frames ``1..T-1`` are the targets (frame 0 has no history).
        pad_id: targets equal to it are ignored (right-padded streams); None keeps every target.

    Returns:
        scalar ``(Σ CE_a + Σ CE_b) / (n_a + n_b)`` over the valid targets of both channels.
    """
    a, b = check_token_pair(a, b, min_len=2)
    shape = (*a.shape, None)  # (B, T, V)
    la = check_tensor(logits_a, "logits_a", shape=shape, non_empty=True)
    lb = check_tensor(logits_b, "logits_b", shape=shape, non_empty=True)
    if la.shape != lb.shape:
        raise ValueError(
            f"logits_a and logits_b must have the same shape, got {tuple(la.shape)} and {tuple(lb.shape)}"
        )
    V = la.shape[-1]
    if pad_id is not None:
        pad_id = check_int(pad_id, "pad_id", low=0)
    for name, x in (("a", a), ("b", b)):
        bad = (x >= V) & (x != (pad_id if pad_id is not None else -1))
        if bool(bad.any()):
            raise ValueError(
                f"{name} must hold token ids < V={V} (the logits' last dimension), got max {int(x.max())}"
            )
    ta, tb = a[:, 1:], b[:, 1:]
    ignore = -100
    if pad_id is not None:
        ta, tb = ta.masked_fill(ta == pad_id, ignore), tb.masked_fill(tb == pad_id, ignore)
    logits = torch.cat([la[:, :-1], lb[:, :-1]], 1).reshape(-1, V).float()
    targets = torch.cat([ta, tb], 1).reshape(-1)
    if not bool((targets != ignore).any()):
        raise ValueError(f"a and b have no valid target (every frame after the first is pad_id={pad_id})")
    return F.cross_entropy(logits, targets, ignore_index=ignore)


# ------------------------------------------------------------------------------------------ data
def swap_channels(
    a: torch.Tensor,
    b: torch.Tensor,
    p: float = 0.5,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Channel-swap augmentation: exchange the two streams of each row with probability ``p``.

    Args:
        a, b: ``(B, T)`` token ids.
        p: swap probability in ``[0, 1]`` (ours 0.5; an addition to the paper that makes the model
            speaker-symmetric).
        seed, generator: randomness of the draw (a local generator; global RNG untouched).

    Returns:
        ``(a', b', swapped)``: new ``(B, T)`` tensors and the ``(B,)`` bool tensor of swapped rows.
    """
    a, b = check_token_pair(a, b)
    p = check_float(p, "p", low=0.0, high=1.0)
    gen = make_generator(seed, generator)
    swapped = (torch.rand(a.shape[0], generator=gen) < p).to(a.device)
    m = swapped[:, None]
    return torch.where(m, b, a), torch.where(m, a, b), swapped


class DualChannelCollator:
    """Collate paired streams ``{"a": ids, "b": ids}`` (equal length per example) into a padded batch.

    Rows are right-padded with ``pad_id`` to the longest example (or truncated to ``max_frames``); the
    result is ``{"a": (B, T), "b": (B, T), "frame_mask": (B, T)}`` int64 tensors, ``frame_mask`` 1 on real
    frames. Pass ``pad_id`` to :func:`ntpp_loss` so that the padded targets are ignored; right padding
    needs no attention mask under the pair-causal mask (real frames never see later ones).
    """

    def __init__(self, pad_id: int, max_frames: int | None = None) -> None:
        self.pad_id = check_int(pad_id, "pad_id", low=0)
        self.max_frames = None if max_frames is None else check_int(max_frames, "max_frames", low=1)

    @staticmethod
    def _row(v: Any, name: str) -> list[int]:
        if isinstance(v, torch.Tensor):
            if v.dim() != 1 or v.dtype not in _INT_DTYPES:
                raise TypeError(
                    f"{name} must be a 1-D integer tensor or list of ints, got {v.dtype} of shape {tuple(v.shape)}"
                )
            v = v.tolist()
        if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
            raise TypeError(f"{name} must be a sequence of int token ids, got {type(v).__name__}")
        out = []
        for x in v:
            if isinstance(x, bool) or not isinstance(x, numbers.Integral) or int(x) < 0:
                raise ValueError(f"{name} must hold non-negative int token ids, got {x!r}")
            out.append(int(x))
        if not out:
            raise ValueError(f"{name} must have at least one frame, got an empty stream")
        return out

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        """Collate ``features`` (a non-empty sequence of ``{"a": ids, "b": ids}``)."""
        if isinstance(features, (str, bytes, Mapping)) or not isinstance(features, Sequence) or not features:
            raise ValueError(
                f"features must be a non-empty sequence of {{'a', 'b'}} examples, got {type(features).__name__}"
            )
        rows = []
        for i, f in enumerate(features):
            if not isinstance(f, Mapping) or "a" not in f or "b" not in f:
                raise TypeError(
                    f"features[{i}] must be a dict with 'a' and 'b' token streams, got {type(f).__name__}"
                )
            ra, rb = self._row(f["a"], f"features[{i}]['a']"), self._row(f["b"], f"features[{i}]['b']")
            if len(ra) != len(rb):
                raise ValueError(
                    f"features[{i}] has streams of {len(ra)} and {len(rb)} frames: a and b must be aligned "
                    "(pad the shorter one with an explicit pad_id)"
                )
            if self.max_frames is not None:
                ra, rb = ra[: self.max_frames], rb[: self.max_frames]
            rows.append((ra, rb))
        T = max(len(r[0]) for r in rows)
        out = {k: torch.full((len(rows), T), self.pad_id, dtype=torch.long) for k in ("a", "b")}
        out["frame_mask"] = torch.zeros(len(rows), T, dtype=torch.long)
        for i, (ra, rb) in enumerate(rows):
            out["a"][i, : len(ra)] = torch.tensor(ra)
            out["b"][i, : len(rb)] = torch.tensor(rb)
            out["frame_mask"][i, : len(ra)] = 1
        return out


# ------------------------------------------------------------------------------------------ statistics
def _runs(x: list[bool]) -> list[tuple[int, int]]:
    """``(start, length)`` of the maximal runs of True."""
    out, start = [], None
    for i, v in enumerate([*x, False]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            out.append((start, i - start))
            start = None
    return out


def turn_taking_stats(a: torch.Tensor, b: torch.Tensor, silence_id: int) -> dict[str, float]:
    """Turn-taking event statistics of dual-channel token streams (dGSLM's events, in frames).

    A frame is speech in a channel when its token is not ``silence_id``. Events, summed over rows:

    * ``ipu``: maximal speech runs of each channel (inter-pausal units);
    * ``overlap``: runs of frames where both channels speak;
    * ``pause`` / ``gap``: runs of frames where both are silent, bounded by speech on both sides; a pause
      when a channel that spoke in the frame before also speaks in the frame after (same speaker
      continues), a gap otherwise (turn change).

    Args:
        a, b: ``(B, T)`` token ids (a ``(T,)`` stream is one row).
        silence_id: the silence token.

    Returns:
        ``{"<event>_count", "<event>_mean"}`` for the four events (mean duration in frames, 0.0 when the
        event never occurs) and ``"speech_fraction"`` (speech frames over all frames of both channels).
    """
    if isinstance(a, torch.Tensor) and a.dim() == 1:
        a = a[None]
    if isinstance(b, torch.Tensor) and b.dim() == 1:
        b = b[None]
    a, b = check_token_pair(a, b)
    sil = check_int(silence_id, "silence_id", low=0)
    sa, sb = (a != sil).cpu(), (b != sil).cpu()
    durs: dict[str, list[int]] = {"ipu": [], "pause": [], "gap": [], "overlap": []}
    for ra, rb in zip(sa.tolist(), sb.tolist()):
        for s in (ra, rb):
            durs["ipu"] += [n for _, n in _runs(s)]
        durs["overlap"] += [n for _, n in _runs([x and y for x, y in zip(ra, rb)])]
        for start, n in _runs([not (x or y) for x, y in zip(ra, rb)]):
            end = start + n
            if start == 0 or end == len(ra):
                continue  # leading / trailing silence is neither a pause nor a gap
            before = {c for c, s in ((0, ra), (1, rb)) if s[start - 1]}
            after = {c for c, s in ((0, ra), (1, rb)) if s[end]}
            durs["pause" if before & after else "gap"].append(n)
    out: dict[str, float] = {}
    for k, v in durs.items():
        out[f"{k}_count"] = float(len(v))
        out[f"{k}_mean"] = float(sum(v) / len(v)) if v else 0.0
    out["speech_fraction"] = float((sa.sum() + sb.sum()).item() / (2 * sa.numel()))
    return out
