"""Imagine while Reasoning in Space: Multimodal Visualization-of-Thought — ICML 2025, P12: token discrepancy loss.

A unified autoregressive multimodal LM (Chameleon/Anole: text tokens and VQ image tokens in one vocabulary)
is fine-tuned to interleave verbal reasoning steps with generated images of the intermediate state. Since
the image tokenizer was trained apart from the LM, plain cross-entropy treats every wrong image token as
equally wrong; the *token discrepancy loss* adds the expected codebook distance between the predicted
image-token distribution and the ground-truth code.

Li, Wu, Zhang, Mo, Wu, Kiela, Korhonen, Vulić, Wei, ICML 2025 (arXiv 2501.07542; official code
``chengzu-li/MVoT``, ``utils/trainer/customize_trainer.py::compute_loss`` and
``model_utils/wrapped_visualizer.py``).

* :func:`codebook_distance_matrix` — ``D[i, j] = ‖E_i − E_j‖₂`` (Euclidean, not squared, as the official
  ``pairwise_euclidean_distance``), computed in float64 and returned in float32 (the official code casts to
  bf16, which loses precision at K = 8192).
* :func:`token_discrepancy_loss` — on every position whose *label* is an image token, the logits of the
  preceding position are restricted to the image columns (ordered by codebook id), softmaxed over those
  columns only, and ``ℓ = Σ_j p_j D[k*, j]``; the mean over image-label positions (0 when there is none).
  The LM-id → codebook-id map is built explicitly from ``image_token_ids`` (the official code assumes the
  two orders coincide).
* :class:`MVoTLoss` — ``L = L_CE + λ L_D`` (``λ = 1`` upstream) with next-token CE over the full vocabulary.
* :func:`build_interleaved_example` — token ids and labels of a ``prompt → [text step, image]* → answer`` trace.
* :class:`KMeansVQTokenizer` — a k-means (sklearn) patch codebook, the "separately trained" image tokenizer
  of the small-scale reproduction and the tests.
* :func:`image_block_mask` — the constraint of a fixed-length image block during decoding;
  :mod:`icml25.generative_models.mvot_hf` wraps it as a ``transformers`` ``LogitsProcessor`` and adds the
  ``Trainer`` with the combined loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_fitted, check_float, check_int, check_tensor

__all__ = [
    "KMeansVQTokenizer",
    "MVoTLoss",
    "build_interleaved_example",
    "codebook_distance_matrix",
    "image_block_mask",
    "token_discrepancy_loss",
]


def as_token_tensor(x: object, name: str, ndim: int, *, floating: bool) -> Tensor:
    """``x`` (a tensor, or a numpy array converted) checked by :func:`icml25.kernels.checks.check_tensor`:
    ``ndim`` dimensions, non-empty, and finite floating (``floating=True``) or integer token ids."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    return check_tensor(x, name, ndim=ndim, dtype="float" if floating else "int", non_empty=True)


def codebook_distance_matrix(
    codebook: Tensor, squared: bool = False, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Pairwise Euclidean distances of the VQ codebook rows, ``(K, K)``, symmetric with a zero diagonal.

    Args:
        codebook: ``(K, d)`` code embeddings, finite.
        squared: return ``‖E_i − E_j‖²`` instead (the official ``"mse"`` setting uses the square root).
        dtype: output dtype (computed in float64 first).
    """
    e = as_token_tensor(codebook, "codebook", 2, floating=True).detach().to(torch.float64)
    if not isinstance(squared, bool):
        raise TypeError(f"squared must be a bool, got {type(squared).__name__}")
    sq = (e * e).sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2.0 * e @ e.T).clamp_min(0.0)
    d2 = 0.5 * (d2 + d2.T)
    d2.fill_diagonal_(0.0)
    return (d2 if squared else d2.sqrt()).to(dtype)


def _check_mapping(image_token_ids: object, distance: object) -> tuple[Tensor, Tensor]:
    ids = as_token_tensor(image_token_ids, "image_token_ids", 1, floating=False).long()
    if ids.unique().numel() != ids.numel():
        raise ValueError(
            "image_token_ids must be distinct LM token ids (one per codebook entry); got duplicates"
        )
    if (ids < 0).any():
        raise ValueError(f"image_token_ids must be non-negative token ids, got min {int(ids.min())}")
    dist = as_token_tensor(distance, "distance", 2, floating=True)
    if dist.shape[0] != dist.shape[1]:
        raise ValueError(f"distance must be a square (K, K) matrix, got shape {tuple(dist.shape)}")
    if dist.shape[0] != ids.numel():
        raise ValueError(
            f"distance must be (K, K) with K = len(image_token_ids) = {ids.numel()}, got shape {tuple(dist.shape)}"
        )
    return ids, dist


def _check_logits_labels(logits: object, labels: object, ignore_index: int) -> tuple[Tensor, Tensor]:
    lg = as_token_tensor(logits, "logits", 3, floating=True)
    lb = as_token_tensor(labels, "labels", 2, floating=False).long()
    if lg.shape[:2] != lb.shape:
        raise ValueError(
            f"logits must be (B, T, V) with (B, T) = labels.shape {tuple(lb.shape)}, got {tuple(lg.shape)}"
        )
    bad = (lb != ignore_index) & ((lb < 0) | (lb >= lg.shape[-1]))
    if bad.any():
        raise ValueError(
            f"labels must be token ids in [0, {lg.shape[-1]}) or ignore_index={ignore_index}, "
            f"got {int(lb[bad][0])}"
        )
    return lg, lb


def token_discrepancy_loss(
    logits: Tensor,
    labels: Tensor,
    image_token_ids: Tensor,
    distance: Tensor,
    ignore_index: int = -100,
    shift: bool = True,
) -> Tensor:
    """Expected codebook distance under the image-restricted softmax, averaged over image-label positions.

    Args:
        logits: ``(B, T, V)`` LM logits.
        labels: ``(B, T)`` target ids (``ignore_index`` where unsupervised).
        image_token_ids: ``(K,)`` LM id of codebook entry ``k`` at position ``k`` (distinct).
        distance: ``(K, K)`` codebook distance matrix (:func:`codebook_distance_matrix`), rows and columns
            in codebook order.
        ignore_index: label value of unsupervised positions.
        shift: pair the logits at ``t − 1`` with the label at ``t`` (causal LM convention, as upstream).

    Returns:
        A scalar; exactly 0 (with a graph) when no label is an image token.
    """
    ids, dist = _check_mapping(image_token_ids, distance)
    lg, lb = _check_logits_labels(logits, labels, ignore_index)
    if int(ids.max()) >= lg.shape[-1]:
        raise ValueError(
            f"image_token_ids must index the vocabulary of size {lg.shape[-1]}, got max {int(ids.max())}"
        )
    if shift:
        lg, lb = lg[:, :-1], lb[:, 1:]
    mask = torch.isin(lb, ids.to(lb.device))
    if not mask.any():
        return lg.sum() * 0.0
    lm_to_code = torch.full((lg.shape[-1],), -1, dtype=torch.long, device=lb.device)
    lm_to_code[ids.to(lb.device)] = torch.arange(ids.numel(), device=lb.device)
    p = torch.softmax(lg[mask][:, ids.to(lg.device)].float(), dim=-1)  # columns in codebook order
    rows = dist.to(p.device, torch.float32)[lm_to_code[lb[mask]]]
    return (p * rows).sum(-1).mean()


def _next_token_ce(logits: Tensor, labels: Tensor, ignore_index: int) -> Tensor:
    lg, lb = logits[:, :-1], labels[:, 1:]
    if not (lb != ignore_index).any():
        return lg.sum() * 0.0
    return F.cross_entropy(lg.reshape(-1, lg.shape[-1]).float(), lb.reshape(-1), ignore_index=ignore_index)


class MVoTLoss(nn.Module):
    """``L = L_CE + λ L_D``: next-token cross-entropy over the full vocabulary plus the token discrepancy loss.

    Args:
        distance: ``(K, K)`` codebook distance matrix (kept as a float32 buffer).
        image_token_ids: ``(K,)`` LM ids of the codebook entries, in codebook order.
        weight: ``λ ≥ 0`` (1 in the official code; 0 gives the cross-entropy-only baseline).
        ignore_index: label value of unsupervised positions.

    ``forward(logits, labels)`` returns ``{"loss", "ce", "discrepancy"}``.
    """

    def __init__(
        self, distance: Tensor, image_token_ids: Tensor, weight: float = 1.0, ignore_index: int = -100
    ):
        super().__init__()
        ids, dist = _check_mapping(image_token_ids, distance)
        weight = check_float(weight, "weight", low=0)  # the lambda of L_CE + lambda L_D
        ignore_index = check_int(ignore_index, "ignore_index")
        self.register_buffer("distance", dist.detach().float().clone())
        self.register_buffer("image_token_ids", ids.clone())
        self.weight = float(weight)
        self.ignore_index = ignore_index

    def forward(self, logits: Tensor, labels: Tensor) -> dict[str, Tensor]:
        lg, lb = _check_logits_labels(logits, labels, self.ignore_index)
        ce = _next_token_ce(lg, lb, self.ignore_index)
        ld = token_discrepancy_loss(lg, lb, self.image_token_ids, self.distance, self.ignore_index)
        return {"loss": ce + self.weight * ld, "ce": ce, "discrepancy": ld}


def _segment_ids(name: str, seg: object, vocab: Mapping[str, int] | None) -> list[int]:
    if isinstance(seg, str):
        if vocab is None:
            raise TypeError(f"{name} is a string ({seg!r}) but no vocab mapping words to ids was given")
        missing = [w for w in seg.split() if w not in vocab]
        if missing:
            raise ValueError(f"{name} has words missing from vocab: {missing}")
        return [int(vocab[w]) for w in seg.split()]
    if isinstance(seg, Tensor):
        seg = seg.tolist()
    if not isinstance(seg, Sequence) or not all(isinstance(t, int) and not isinstance(t, bool) for t in seg):
        raise TypeError(f"{name} must be a str or a sequence of int token ids, got {type(seg).__name__}")
    return list(seg)


def build_interleaved_example(
    steps: Sequence[tuple[Any, Tensor | None]],
    *,
    image_token_ids: Tensor,
    boi_id: int,
    eoi_id: int,
    prompt: Sequence[Any] = (),
    answer: Any = None,
    vocab: Mapping[str, int] | None = None,
    bos_id: int | None = None,
    eos_id: int | None = None,
    ignore_index: int = -100,
) -> dict[str, Tensor]:
    """Token ids and labels of one interleaved MVoT trace.

    The sequence is ``[bos] prompt… (text_i [boi image_i eoi])… [answer] [eos]``. Prompt segments (the task
    image and question) get ``ignore_index`` labels; every step's text and image tokens, the answer and the
    EOS are supervised (the model learns to write both the verbal step and its visualisation).

    Args:
        steps: ``(text, codes)`` pairs; ``text`` is a str (words looked up in ``vocab``) or token ids,
            ``codes`` a 1-D tensor of codebook ids (or ``None`` for a text-only step).
        image_token_ids: ``(K,)`` LM id of each codebook entry.
        boi_id, eoi_id: begin/end-of-image token ids.
        prompt: unsupervised segments: text (a str or a list of token ids) or an image (a 1-D tensor of
            codebook ids).
        answer: optional final text.
        vocab, bos_id, eos_id, ignore_index: as named.

    Returns:
        ``{"input_ids", "labels", "attention_mask"}`` (1-D long tensors of one length).
    """
    ids = as_token_tensor(image_token_ids, "image_token_ids", 1, floating=False).long()
    boi_id, eoi_id = check_int(boi_id, "boi_id", low=0), check_int(eoi_id, "eoi_id", low=0)
    if isinstance(steps, (str, Tensor)) or not isinstance(steps, Sequence):
        raise TypeError(f"steps must be a sequence of (text, codes) pairs, got {type(steps).__name__}")

    def image(name: str, codes: object) -> list[int]:
        c = as_token_tensor(codes, name, 1, floating=False).long()
        if (c < 0).any() or (c >= ids.numel()).any():
            raise ValueError(
                f"{name} must hold codebook ids in [0, {ids.numel()}), got range [{int(c.min())}, {int(c.max())}]"
            )
        return [boi_id, *ids[c].tolist(), eoi_id]

    tokens: list[int] = [] if bos_id is None else [bos_id]
    labels: list[int] = [ignore_index] * len(tokens)
    for i, seg in enumerate(prompt):
        part = (
            image(f"prompt[{i}]", seg)
            if isinstance(seg, Tensor)
            else _segment_ids(f"prompt[{i}]", seg, vocab)
        )
        tokens += part
        labels += [ignore_index] * len(part)
    for i, pair in enumerate(steps):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"steps[{i}] must be a (text, codes) pair, got {type(pair).__name__}")
        text, codes = pair
        part = _segment_ids(f"steps[{i}] text", text, vocab) + (
            [] if codes is None else image(f"steps[{i}] codes", codes)
        )
        tokens += part
        labels += part
    tail = ([] if answer is None else _segment_ids("answer", answer, vocab)) + (
        [] if eos_id is None else [eos_id]
    )
    tokens += tail
    labels += tail
    t = torch.tensor(tokens, dtype=torch.long)
    return {
        "input_ids": t,
        "labels": torch.tensor(labels, dtype=torch.long),
        "attention_mask": torch.ones_like(t),
    }


def image_block_mask(input_ids: Tensor, vocab_size: int, image_token_ids: Tensor, boi_id: int, eoi_id: int,
                     n_tokens: int) -> Tensor:  # fmt: skip
    """``(B, V)`` bool mask of the tokens allowed next: inside an open image block (a BOI after the last EOI)
    only image tokens until ``n_tokens`` were emitted, then only EOI; everywhere else, every token."""
    ids = as_token_tensor(input_ids, "input_ids", 2, floating=False).long()
    img = as_token_tensor(image_token_ids, "image_token_ids", 1, floating=False).long()
    if img.unique().numel() != img.numel() or (img < 0).any():
        raise ValueError(
            "image_token_ids must be distinct non-negative LM token ids; got duplicates or negatives"
        )
    n_tokens = check_int(n_tokens, "n_tokens", low=1)  # tokens per image
    if int(img.max()) >= vocab_size:
        raise ValueError(
            f"image_token_ids must index the vocabulary of size {vocab_size}, got max {int(img.max())}"
        )
    b, t = ids.shape
    pos = torch.arange(t, device=ids.device).expand(b, t)
    last_boi = torch.where(ids == boi_id, pos, -1).amax(1)
    last_eoi = torch.where(ids == eoi_id, pos, -1).amax(1)
    open_block = last_boi > last_eoi
    emitted = t - 1 - last_boi
    allowed = torch.ones(b, vocab_size, dtype=torch.bool, device=ids.device)
    image_cols = torch.zeros(vocab_size, dtype=torch.bool, device=ids.device)
    image_cols[img.to(ids.device)] = True
    eoi_cols = torch.zeros(vocab_size, dtype=torch.bool, device=ids.device)
    eoi_cols[eoi_id] = True
    allowed[open_block & (emitted < n_tokens)] = image_cols
    allowed[open_block & (emitted >= n_tokens)] = eoi_cols
    return allowed


class KMeansVQTokenizer:
    """A VQ image tokenizer whose codebook is the k-means centroids of non-overlapping ``p × p`` patches.

    Args:
        n_codes: codebook size ``K``.
        patch: patch side ``p`` (images must be multiples of it).
        seed: k-means seed; ``n_init`` restarts.

    ``fit(images)`` takes ``(N, H, W, C)`` floats; ``encode`` returns ``(N, (H/p)(W/p))`` codes (row-major
    patches), ``decode(codes, grid)`` the centroid images; ``codebook_`` is the ``(K, p·p·C)`` tensor.
    """

    def __init__(self, n_codes: int = 64, patch: int = 4, seed: int = 0, n_init: int = 1):
        n_codes, patch = check_int(n_codes, "n_codes", low=1), check_int(patch, "patch", low=1)
        n_init = check_int(n_init, "n_init", low=1)
        self.n_codes, self.patch, self.seed, self.n_init = n_codes, patch, seed, n_init

    def _patches(self, images: object) -> tuple[np.ndarray, tuple[int, int]]:
        x = images.detach().cpu().numpy() if isinstance(images, Tensor) else images
        if not isinstance(x, np.ndarray):
            raise TypeError(f"images must be a (N, H, W, C) array or tensor, got {type(images).__name__}")
        if x.ndim != 4 or x.size == 0:
            raise ValueError(f"images must be a non-empty (N, H, W, C) array, got shape {x.shape}")
        if not np.issubdtype(x.dtype, np.floating):
            raise TypeError(f"images must be floating, got dtype {x.dtype}")
        if not np.isfinite(x).all():
            raise ValueError("images must be finite (no NaN/inf)")
        if np.abs(x).max() > 1e6:
            raise ValueError(
                f"images must be pixel intensities with |value| <= 1e6, got max {np.abs(x).max():.3g}"
            )
        n, h, w, c = x.shape
        p = self.patch
        if h % p or w % p:
            raise ValueError(f"images must have H and W divisible by patch={p}, got shape {x.shape}")
        gh, gw = h // p, w // p
        pt = x.reshape(n, gh, p, gw, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(n * gh * gw, p * p * c)
        return pt.astype(np.float64), (gh, gw)

    def fit(self, images: object) -> KMeansVQTokenizer:
        from sklearn.cluster import KMeans

        pt, _ = self._patches(images)
        if pt.shape[0] < self.n_codes:
            raise ValueError(f"images must hold at least n_codes={self.n_codes} patches, got {pt.shape[0]}")
        km = KMeans(self.n_codes, n_init=self.n_init, random_state=self.seed).fit(pt)
        self.kmeans_ = km
        self.codebook_ = torch.as_tensor(km.cluster_centers_, dtype=torch.float32)
        self.channels_ = int(images.shape[-1])
        return self

    def encode(self, images: object) -> Tensor:
        check_fitted(self, "codebook_")
        pt, (gh, gw) = self._patches(images)
        if pt.shape[1] != self.codebook_.shape[1]:
            raise ValueError(
                f"images must have {self.channels_} channels (as fitted), got {images.shape[-1]}"
            )
        return torch.as_tensor(self.kmeans_.predict(pt), dtype=torch.long).reshape(-1, gh * gw)

    def decode(self, codes: Tensor, grid: tuple[int, int]) -> Tensor:
        check_fitted(self, "codebook_")
        c = as_token_tensor(codes, "codes", 2, floating=False).long()
        gh, gw = grid
        if c.shape[1] != gh * gw:
            raise ValueError(f"codes must be (N, {gh * gw}) for grid {grid}, got {tuple(c.shape)}")
        if (c < 0).any() or (c >= self.n_codes).any():
            raise ValueError(
                f"codes must be in [0, {self.n_codes}), got range [{int(c.min())}, {int(c.max())}]"
            )
        p, ch = self.patch, self.channels_
        pt = self.codebook_[c].reshape(-1, gh, gw, p, p, ch).permute(0, 1, 3, 2, 4, 5)
        return pt.reshape(-1, gh * p, gw * p, ch)
