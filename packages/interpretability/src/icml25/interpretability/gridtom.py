"""From Black Boxes to Transparent Minds (GridToM) — ICML 2025, P42: per-head belief probes and ITI steering.

Li, Liu, Zou, Chen & Ma, "From Black Boxes to Transparent Minds: Evaluating and Enhancing the Theory of
Mind in Multimodal Large Language Models", ICML 2025 (arXiv 2506.14224; official code
``Annaisavailable/GridToM``). A logistic-regression probe is fitted on every attention head's last-token
activation of belief-statement prompts (is the statement the protagonist's belief, or true of the world?);
the top-K heads by validation accuracy are then shifted by ``alpha * sigma * theta`` at inference
(inference-time intervention, Li et al. 2023), ``theta`` the unit probe direction and ``sigma`` the std of
the probing activations along it.

Two sites, because the paper and its code differ:

- ``site="attn_head"`` (the paper's formula, ITI): head ``h``'s ``d_head`` slice of the *input* of the
  attention output projection (``o_proj`` / ``c_proj`` / ``dense``), read and written through
  :class:`~icml25.interpretability.common.heads.HeadActivationSite` (pre-``W_O``).
- official code: activations are the residual stream after each decoder layer cut into ``H`` chunks
  (``collect_head_activations(site="resid_chunks")``), and steering adds to slice ``[hD, (h+1)D)`` of the
  attention block's *output* (``steer(site="attn_out")``, post-``W_O``), at the last position of every
  forward call.

GridToM-lite (the token-level false-belief world standing in for the paper's multigrid videos, its prompt
formats, the biased training stream, the HF GPT-2 builder and its training loop) is in
:mod:`icml25.interpretability.gridtom_toy`; its names are re-exported here.

Shapes: ``N`` samples, ``L`` layers, ``H`` heads, ``D = d_head``, ``T`` positions.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from icml25.interpretability.common.heads import HeadActivationSite, as_head_site, select_heads
from icml25.interpretability.gridtom_toy import (
    GRIDTOM_VOCAB,
    GridToMEpisode,
    generate_gridtom_lite,
    gridtom_gpt2,
    gridtom_training_batch,
    last_token_logits,
    question_prompts,
    render_tokens,
    statement_prompts,
    train_gridtom_lm,
)
from icml25.kernels.checks import check_array, check_choice, check_float, check_int, check_ints, check_tensor

__all__ = [
    "GRIDTOM_VOCAB",
    "GridToMEpisode",
    "HeadIntervention",
    "HeadProbeResult",
    "build_interventions",
    "collect_head_activations",
    "generate_gridtom_lite",
    "gridtom_gpt2",
    "gridtom_training_batch",
    "last_token_logits",
    "probe_heads",
    "question_prompts",
    "random_directions",
    "render_tokens",
    "statement_prompts",
    "steer",
    "sweep_alpha_k",
    "top_k_heads",
    "train_gridtom_lm",
]

COLLECT_SITES = ("attn_head", "resid_chunks")
STEER_SITES = ("attn_head", "attn_out")


# ------------------------------------------------------------------------------------------ activations
def _reader(got: dict[int, Tensor], layer: int, position: int) -> Callable[[Tensor], None]:
    def fn(z: Tensor) -> None:
        got[layer] = z[:, position].detach().float().cpu()

    return fn


@torch.no_grad()
def collect_head_activations(
    model: nn.Module,
    inputs: Tensor | Sequence[Tensor],
    position: int = -1,
    site: str = "attn_head",
    batch_size: int = 256,
) -> np.ndarray:
    """Per-head activations ``X [N, L, H, D]`` (float32) at ``position`` of every row of ``inputs`` (one
    ``[N, T]`` id tensor or a list of them).

    ``site="attn_head"``: head ``h``'s slice of the attention output projection's input (pre-``W_O``, the
    paper's formula). ``site="resid_chunks"``: the residual stream after layer ``l`` (the model's
    ``hidden_states[l + 1]``; for HF models the last one is after the final norm, as in the official
    code) cut into ``H`` chunks of ``D = d_model / H``."""
    st = as_head_site(model)
    check_choice(site, "site", COLLECT_SITES)
    check_int(position, "position")
    batch_size = check_int(batch_size, "batch_size", low=1)
    if isinstance(inputs, Tensor):
        batches = [check_tensor(inputs, "inputs", ndim=2, dtype="int", non_empty=True)]
    elif isinstance(inputs, Sequence) and inputs:
        batches = [
            check_tensor(b, f"inputs[{i}]", ndim=2, dtype="int", non_empty=True) for i, b in enumerate(inputs)
        ]
    else:
        raise ValueError(
            f"inputs must be an integer tensor [N, T] or a non-empty list of them, got {type(inputs).__name__}"
        )
    L, H, D = st.n_layers, st.n_heads, st.d_head
    vocab = getattr(st.model.config, "vocab_size", None)
    dev = next(st.model.parameters()).device
    out: list[np.ndarray] = []
    for b in batches:
        if not -b.shape[1] <= position < b.shape[1]:
            raise ValueError(f"position must index T={b.shape[1]} positions, got {position}")
        if vocab is not None and (b.min() < 0 or b.max() >= vocab):
            raise ValueError(
                f"inputs must hold token ids in [0, {vocab}), got range [{int(b.min())}, {int(b.max())}]"
            )
        for chunk in b.split(batch_size):
            ids = chunk.long().to(dev)
            if site == "attn_head":
                got: dict[int, Tensor] = {}
                handles = [st.hook(layer, _reader(got, layer, position)) for layer in range(L)]
                try:
                    st.model(input_ids=ids)
                finally:
                    for h in handles:
                        h.remove()
                acts = torch.stack([got[layer] for layer in range(L)], 1)  # [B, L, H, D]
            else:
                res = st.model(input_ids=ids, output_hidden_states=True)
                hs = getattr(res, "hidden_states", None)
                if hs is None or len(hs) != L + 1:
                    raise NotImplementedError(
                        f"site='resid_chunks' needs a model returning L + 1 = {L + 1} hidden_states "
                        f"(output_hidden_states=True); {type(st.model).__name__} returned {None if hs is None else len(hs)}"
                    )
                if hs[1].shape[-1] != H * D:
                    raise NotImplementedError(f"residual width {hs[1].shape[-1]} != H * D = {H * D}")
                acts = torch.stack([h[:, position] for h in hs[1:]], 1).float().cpu().reshape(-1, L, H, D)
            out.append(acts.numpy())
    return np.concatenate(out, 0)


# ------------------------------------------------------------------------------------------ probing
@dataclass
class HeadProbeResult:
    """Per-head probes. ``val_acc [L, H]``, ``auc [L, H]`` (one-vs-rest macro AUC for more than two
    classes), ``coef``: unit LR coefficient ``[L, H, D]`` (binary) or ``[L, H, C, D]`` (``C`` classes),
    ``mass_mean``: mean(positive) - mean(negative) ``[L, H, D]`` (binary) or class mean minus overall mean
    ``[L, H, C, D]``, ``val_pred [L, H, n_val]`` (predicted labels on ``val_index``)."""

    val_acc: np.ndarray
    auc: np.ndarray
    coef: np.ndarray
    mass_mean: np.ndarray
    classes: np.ndarray
    train_index: np.ndarray
    val_index: np.ndarray
    val_pred: np.ndarray

    def best(self) -> tuple[int, int]:
        """The ``(layer, head)`` of the highest validation accuracy (first in row-major order on ties)."""
        i = int(np.argmax(self.val_acc))
        return divmod(i, self.val_acc.shape[1])


def _as_activations(X: Any, name: str = "X") -> np.ndarray:
    """``X [N, L, H, D]`` (an array or a tensor) as a finite, non-empty float64 array of magnitude <= 1e15
    (beyond it the probes' float64 arithmetic overflows)."""
    if isinstance(X, Tensor):
        X = X.detach().cpu().numpy()
    X = check_array(X, name, ndim=4, dtype=("float", "int"), non_empty=True)
    if np.abs(X).max() > 1e15:
        raise ValueError(
            f"{name} must hold activations of magnitude <= 1e15, got max |X| = {np.abs(X).max():.3g}"
        )
    return X.astype(np.float64, copy=False)


def probe_heads(
    X: np.ndarray,
    y: Any,
    groups: Any = None,
    C: float = 0.015,
    test_size: float = 0.25,
    seed: int = 42,
    max_iter: int = 400,
) -> HeadProbeResult:
    """Fit ``LogisticRegression(C, max_iter)`` on every head of ``X [N, L, H, D]`` with labels ``y [N]``
    (two or more classes, each with >= 8 samples) and score it on a held-out split.

    ``groups [N]`` given (e.g. the episode id): a stratified split grouped by episode
    (``StratifiedGroupKFold`` with ``round(1 / test_size)`` folds, first fold held out), so the two
    statements of an episode never straddle it. ``groups=None``: the official sample-level
    ``train_test_split(test_size, random_state=seed)``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedGroupKFold, train_test_split

    Xa = _as_activations(X)
    N, L, H, D = Xa.shape
    yv = np.asarray(y.detach().cpu().numpy() if isinstance(y, Tensor) else y)
    if yv.shape != (N,):
        raise ValueError(f"y must be a label vector [N] = [{N}], got shape {yv.shape}")
    if yv.dtype.kind == "f" and not np.isfinite(yv).all():
        raise ValueError("y must be finite labels")
    classes, counts = np.unique(yv, return_counts=True)
    if len(classes) < 2:
        raise ValueError(f"y must hold at least 2 classes, got the single class {classes.tolist()}")
    if counts.min() < 8:
        raise ValueError(
            f"y must hold at least 8 samples per class, got counts {dict(zip(classes.tolist(), counts.tolist()))}"
        )
    check_float(test_size, "test_size", low=0.0, high=1.0, low_open=True, high_open=True)
    check_float(C, "C", low=0.0, low_open=True)
    idx = np.arange(N)
    if groups is not None:
        gv = np.asarray(groups.detach().cpu().numpy() if isinstance(groups, Tensor) else groups)
        if gv.shape != (N,):
            raise ValueError(f"groups must be a vector [N] = [{N}], got shape {gv.shape}")
        k = max(2, round(1 / test_size))
        if len(np.unique(gv)) < k:
            raise ValueError(
                f"groups must hold at least {k} distinct groups for test_size={test_size}, got {len(np.unique(gv))}"
            )
        tr, va = next(StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed).split(idx, yv, gv))
    else:
        tr, va = train_test_split(idx, test_size=test_size, random_state=seed)
    for part, name in ((tr, "training"), (va, "validation")):
        if len(np.unique(yv[part])) != len(classes):
            raise ValueError(
                f"the {name} split misses a class of y: use more samples per class or another seed"
            )
    multi = len(classes) > 2
    val_acc = np.zeros((L, H))
    auc = np.zeros((L, H))
    coef = np.zeros((L, H, len(classes), D) if multi else (L, H, D))
    mass = np.zeros_like(coef)
    val_pred = np.zeros((L, H, len(va)), dtype=yv.dtype)
    for layer in range(L):
        for h in range(H):
            x = Xa[:, layer, h]
            clf = LogisticRegression(C=C, max_iter=max_iter).fit(x[tr], yv[tr])
            pred = clf.predict(x[va])
            val_pred[layer, h] = pred
            val_acc[layer, h] = float((pred == yv[va]).mean())
            if multi:
                auc[layer, h] = roc_auc_score(
                    yv[va], clf.predict_proba(x[va]), multi_class="ovr", labels=clf.classes_
                )
                w = clf.coef_
                mu = x.mean(0)
                mass[layer, h] = np.stack([x[yv == c].mean(0) - mu for c in classes])
            else:
                auc[layer, h] = roc_auc_score(yv[va] == classes[1], clf.decision_function(x[va]))
                w = clf.coef_[0]
                mass[layer, h] = x[yv == classes[1]].mean(0) - x[yv == classes[0]].mean(0)
            n = np.linalg.norm(w, axis=-1, keepdims=True)
            coef[layer, h] = np.divide(w, n, out=np.zeros_like(w), where=n > 0)
    return HeadProbeResult(val_acc, auc, coef, mass, classes, tr, va, val_pred)


def top_k_heads(score: Any, k: int) -> list[tuple[int, int]]:
    """The ``k`` heads ``(layer, head)`` of the highest ``score [L, H]`` (e.g. ``val_acc``), best first;
    ties keep row-major order (:func:`~icml25.interpretability.common.heads.select_heads`)."""
    a = np.asarray(score.detach().cpu() if isinstance(score, Tensor) else score)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"score must be a real-valued [L, H] array, got dtype {a.dtype}")
    s = torch.as_tensor(a).double()
    return select_heads(s, check_int(k, "k"))


# ------------------------------------------------------------------------------------------ interventions
@dataclass(frozen=True)
class HeadIntervention:
    """Shift head ``(layer, head)`` by ``alpha * sigma * direction`` (``direction [D]``, unit norm when
    built with ``normalize=True``)."""

    layer: int
    head: int
    direction: np.ndarray = field(repr=False)
    sigma: float


def build_interventions(
    X: np.ndarray, heads: Sequence[tuple[int, int]], directions: np.ndarray, normalize: bool = True
) -> list[HeadIntervention]:
    """One :class:`HeadIntervention` per head: ``direction = directions[l, h] / |.|`` (``directions
    [L, H, D]``, e.g. ``HeadProbeResult.coef`` or ``mass_mean``) and ``sigma = std_n(X[n, l, h] @
    direction)`` over all ``N`` probing activations (the official ``get_interventions_dict``). A zero
    direction is an error, never a silent no-op."""
    Xa = _as_activations(X)
    _, L, H, D = Xa.shape
    dirs = _as_activations(
        np.asarray(directions)[None] if isinstance(directions, np.ndarray) else directions, "directions"
    )
    if dirs.shape[1:] != (L, H, D):
        raise ValueError(f"directions must be [L, H, D] = {(L, H, D)} like X, got {dirs.shape[1:]}")
    dirs = dirs[0]
    if not isinstance(heads, Sequence) or isinstance(heads, str) or not heads:
        raise ValueError("heads must be a non-empty list of (layer, head) pairs")
    out = []
    for lh in heads:
        if not (isinstance(lh, tuple) and len(lh) == 2 and all(isinstance(v, (int, np.integer)) for v in lh)
                and 0 <= lh[0] < L and 0 <= lh[1] < H):  # fmt: skip
            raise ValueError(f"heads must be (layer, head) pairs in [0, {L}) x [0, {H}), got {lh!r}")
        d = dirs[lh[0], lh[1]]
        n = float(np.linalg.norm(d))
        if n == 0:
            raise ValueError(f"directions[{lh[0]}, {lh[1]}] has zero norm: no direction to steer along")
        if normalize:
            d = d / n
        sigma = float(np.std(Xa[:, lh[0], lh[1]] @ d))
        out.append(HeadIntervention(int(lh[0]), int(lh[1]), d.astype(np.float32), sigma))
    return out


def random_directions(shape: tuple[int, int, int], seed: int = 0) -> np.ndarray:
    """Unit Gaussian directions ``[L, H, D]`` (the official random control)."""
    shape = check_ints(shape, "shape", length=3, low=1)
    d = np.random.default_rng(seed).standard_normal(shape)
    return d / np.linalg.norm(d, axis=-1, keepdims=True)


def _check_interventions(st: HeadActivationSite, interventions: Any) -> list[HeadIntervention]:
    if not isinstance(interventions, Sequence) or not all(
        isinstance(i, HeadIntervention) for i in interventions
    ):
        raise TypeError(
            f"interventions must be a list of HeadIntervention, got {type(interventions).__name__}"
        )
    L, H, D = st.n_layers, st.n_heads, st.d_head
    for iv in interventions:
        if not (0 <= iv.layer < L and 0 <= iv.head < H) or np.shape(iv.direction) != (D,):
            raise ValueError(
                f"interventions must match the model's (L, H, D) = {(L, H, D)}; got head ({iv.layer}, {iv.head}) "
                f"with a direction of shape {np.shape(iv.direction)}"
            )
        if not (np.isfinite(iv.direction).all() and math.isfinite(iv.sigma)):
            raise ValueError(f"intervention ({iv.layer}, {iv.head}) must have a finite direction and sigma")
    return list(interventions)


@contextlib.contextmanager
def steer(
    model: nn.Module,
    interventions: Sequence[HeadIntervention],
    alpha: float,
    site: str = "attn_head",
    positions: str = "last",
    apply_on_decode: bool = True,
) -> Iterator[HeadActivationSite]:
    """Within the block, add ``alpha * sigma * direction`` to every intervened head.

    ``site="attn_head"``: head ``h``'s slice of the output projection's input (pre-``W_O``; the paper,
    ITI). ``site="attn_out"``: slice ``[hD, (h+1)D)`` of the attention block's output (post-``W_O``; the
    official ``attn_hook``; a tuple or a bare tensor output). ``positions``: ``"last"`` (the final
    position of every forward call: the prompt's last token in a prefill, the new token in each cached
    decode step) or ``"all"``. ``apply_on_decode=False`` skips one-token forward calls (cached decode
    steps). Every batch row is steered (the official hook steers row 0 only). Hooks are removed on exit;
    ``alpha = 0`` registers none, so it is exactly the unsteered model."""
    st = as_head_site(model)
    check_choice(site, "site", STEER_SITES)
    check_choice(positions, "positions", ("last", "all"))
    check_float(alpha, "alpha")
    ivs = _check_interventions(st, interventions)
    H, D = st.n_heads, st.d_head
    shifts: dict[int, Tensor] = {}
    for iv in ivs:
        v = shifts.setdefault(iv.layer, torch.zeros(H, D))
        v[iv.head] += alpha * iv.sigma * torch.as_tensor(iv.direction, dtype=torch.float32)
    handles: list[torch.utils.hooks.RemovableHandle] = []

    def skip(T: int) -> bool:
        return not apply_on_decode and T == 1

    def edit(x: Tensor, v: Tensor) -> Tensor:  # x [B, T, H, D] or [B, T, H * D]
        x = x.clone()
        sl = slice(None) if positions == "all" else slice(-1, None)
        x[:, sl] += v.reshape(x.shape[2:]).to(x)
        return x

    if alpha != 0:
        for layer, v in shifts.items():
            if site == "attn_head":

                def fn(z: Tensor, v: Tensor = v) -> Tensor | None:
                    return None if skip(z.shape[1]) else edit(z, v)

                handles.append(st.hook(layer, fn))
            else:

                def post(_m: nn.Module, _a: Any, output: Any, v: Tensor = v) -> Any:
                    out = output[0] if isinstance(output, tuple) else output
                    if not isinstance(out, Tensor) or out.shape[-1] != H * D:
                        raise RuntimeError(
                            f"attention output must be [B, T, {H * D}], got {getattr(out, 'shape', out)!r}"
                        )
                    if skip(out.shape[1]):
                        return None
                    new = edit(out, v)
                    return (new, *output[1:]) if isinstance(output, tuple) else new

                handles.append(st.attention_modules[layer].register_forward_hook(post))
    try:
        yield st
    finally:
        for h in handles:
            h.remove()


def sweep_alpha_k(
    model: nn.Module,
    eval_fn: Callable[[nn.Module], Mapping[str, float]],
    X: np.ndarray,
    probe: HeadProbeResult,
    ks: Sequence[int],
    alphas: Sequence[float],
    site: str = "attn_head",
    directions: np.ndarray | None = None,
) -> list[dict[str, float]]:
    """``eval_fn(model)`` under :func:`steer` for every ``k`` in ``ks`` (top-``k`` heads by
    ``probe.val_acc`` among those with a non-zero direction) and ``alpha`` in ``alphas``; ``directions [L, H, D]`` default to ``probe.coef``
    (binary probes). Returns one row ``{"k", "alpha", **metrics}`` per pair (``pandas.DataFrame(rows)``
    makes it a table)."""
    st = as_head_site(model)
    Xa = _as_activations(X)
    if Xa.shape[1:] != (st.n_layers, st.n_heads, st.d_head):
        raise ValueError(
            f"X must be [N, L, H, D] with (L, H, D) = {(st.n_layers, st.n_heads, st.d_head)} of the model, got {Xa.shape}"
        )
    if not isinstance(probe, HeadProbeResult):
        raise TypeError(f"probe must be a HeadProbeResult, got {type(probe).__name__}")
    dirs = probe.coef if directions is None else directions
    if np.ndim(dirs) != 3:
        raise ValueError(
            f"directions must be [L, H, D] (pick one class of a multinomial probe), got shape {np.shape(dirs)}"
        )
    if not ks or not alphas:
        raise ValueError("ks and alphas must be non-empty")
    # heads with a zero direction (constant activations) cannot be steered: rank them last
    score = np.where(np.linalg.norm(np.asarray(dirs), axis=-1) > 0, probe.val_acc, -1.0)
    rows = []
    for k in ks:
        ivs = build_interventions(Xa, top_k_heads(score, k), dirs)
        for a in alphas:
            with steer(st, ivs, float(a), site=site):
                rows.append({"k": float(k), "alpha": float(a), **eval_fn(st.model)})
    return rows
