"""I Think, Therefore I Diffuse: Enabling Multimodal In-Context Reasoning in Diffusion Models — ICML 2025, P32: the ThinkDiff aligner.

Mi et al., ICML 2025 (arXiv 2502.10458; official code ``MiZhenxing/ThinkDiff``). Diffusion models such as
FLUX and SD3 condition on the outputs of a T5 *encoder*; the T5 *decoder* reads exactly that space. ThinkDiff
trains only a small aligner that maps a vision-language model's features into T5-encoder space, with the
text loss of the frozen T5 decoder on ordinary image-caption data (``encoder_outputs = aligner(H)``); at
inference the aligned features are the diffusion model's ``prompt_embeds``. In the LVLM variant the features
are the final-norm hidden states of the tokens the VLM *generates* (its answer), so its in-context reasoning
is carried into the image.

* :class:`FeatureAligner` — ``RMSNorm(W2 GELU(W1 H))`` (the official ``mlp2x_gelu_t5_norm`` projector), whose
  norm weight is copied from the T5 encoder's ``final_layer_norm`` (:meth:`FeatureAligner.init_norm_from`).
* :func:`aligner_text_loss` — teacher-forced cross-entropy of a frozen ``T5ForConditionalGeneration`` given
  ``encoder_outputs=(aligner(feats),)`` and ``attention_mask=feat_mask`` (pads of the target ignored).
* :func:`random_split_generated` — the shipped LVLM recipe's random split: the first ``s`` generated-token
  states condition, the remaining generated tokens are the target (``s`` uniform in ``[1, n − 1]``).
* :func:`train_aligner` — AdamW (weight decay 0.05), linear warm-up then cosine to 0.8 lr, only the aligner
  trained; the T5 is frozen and in eval mode during the call (restored after).
* :func:`aligned_prompt_embeds` — VLM generate → aligner → ``(prompt_embeds, mask)``, optionally after
  T5-encoded text; :func:`diffusers_prompt_kwargs` hands them to a diffusers pipeline and warns when the
  pipeline's text encoder is not a T5 (the shared-space premise then fails).
* :func:`generated_hidden_states` — a ``transformers`` causal LM's ``generate(output_hidden_states=True)``
  states of the generated tokens (fixed length, EOS ignored), the HF stand-in for the patched vLLM.
* Tiny models of the small-scale reproduction: :class:`ToyVLM` (CNN image tokens + causal transformer),
  :class:`ToyFlowDecoder` (conditional flow-matching MLP with cross-attention to T5 encoder outputs) and
  :func:`tiny_t5` (a random-config ``T5ForConditionalGeneration``).

``transformers`` (the ``hf`` extra) is imported only by :func:`tiny_t5` and :func:`generated_hidden_states`;
``diffusers`` is never imported (pipelines are duck-typed).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "FeatureAligner",
    "ToyFlowDecoder",
    "ToyVLM",
    "aligned_prompt_embeds",
    "aligner_text_loss",
    "diffusers_prompt_kwargs",
    "generated_hidden_states",
    "random_split_generated",
    "tiny_t5",
    "train_aligner",
]


# ----------------------------------------------------------------------------------------- validation
def _float_tensor(name: str, x: object, ndim: int) -> Tensor:
    return check_tensor(x, name, ndim=ndim, non_empty=True, max_abs=1e15)  # a representable scale


def _mask_tensor(name: str, m: object, shape: tuple[int, ...]) -> Tensor:
    """A 0/1 mask of ``shape`` (bool or integer, or a float tensor holding only 0 and 1) as a long tensor."""
    m = check_tensor(m, name, shape=shape, dtype=("bool", "int", "float"), finite=False, binary=True).long()
    if (m.sum(-1) == 0).any():
        rows = torch.nonzero(m.sum(-1) == 0).flatten()[:5].tolist()
        raise ValueError(f"{name} must keep at least one position per row; rows {rows} are all zeros")
    return m


def _id_tensor(name: str, x: object, ndim: int) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(x).__name__}")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (token ids), got dtype {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(x.shape)}")
    return x.long()


def _check_seq2seq(t5: object) -> None:
    """A T5-style encoder-decoder: a ``decoder`` and an ``lm_head`` (``T5EncoderModel`` has neither)."""
    if not isinstance(t5, nn.Module) or getattr(t5, "decoder", None) is None or not hasattr(t5, "lm_head"):
        raise TypeError(
            "t5 must be an encoder-decoder LM with a decoder and an lm_head (a transformers "
            f"T5ForConditionalGeneration); got {type(t5).__name__}, which has no decoder to train through"
        )


def _t5_dim(t5: nn.Module) -> int | None:
    cfg = getattr(t5, "config", None)
    return getattr(cfg, "d_model", None)


# ------------------------------------------------------------------------------------------- aligner
class FeatureAligner(nn.Module):
    """ThinkDiff's aligner ``A(H) = RMSNorm(W2 · GELU(W1 · H))`` (the official ``mlp2x_gelu_t5_norm``).

    Args:
        in_dim: VLM feature width ``d_vlm``.
        out_dim: T5 ``d_model`` (also the hidden width of the two-layer MLP, as upstream).
        eps: RMSNorm epsilon (T5's ``layer_norm_epsilon``, 1e-6).
        seed: seed of the parameter initialisation (``None``: torch's global generator, the PyTorch convention).

    The norm is T5's: no mean subtraction, no bias, variance in float32. Call :meth:`init_norm_from` with the
    T5 encoder's ``final_layer_norm`` so the output scale matches T5 encoder outputs.
    """

    def __init__(self, in_dim: int, out_dim: int, eps: float = 1e-6, seed: int | None = None):
        super().__init__()
        in_dim, out_dim = check_int(in_dim, "in_dim", low=1), check_int(out_dim, "out_dim", low=1)
        eps = check_float(eps, "eps", low=0, high=1, low_open=True, high_open=True)
        self.in_dim, self.out_dim, self.eps = in_dim, out_dim, float(eps)
        with isolated_rng(seed):
            self.fc1 = nn.Linear(in_dim, out_dim)
            self.fc2 = nn.Linear(out_dim, out_dim)
        self.norm_weight = nn.Parameter(torch.ones(out_dim))

    @torch.no_grad()
    def init_norm_from(self, layer_norm: nn.Module) -> FeatureAligner:
        """Copy the weight (and epsilon) of a T5 RMS layer norm, e.g. ``t5.encoder.final_layer_norm``."""
        w = getattr(layer_norm, "weight", None)
        if not isinstance(w, Tensor) or tuple(w.shape) != (self.out_dim,):
            raise ValueError(
                f"layer_norm must carry a weight of shape ({self.out_dim},) (a T5 layer norm of d_model "
                f"{self.out_dim}), got {None if not isinstance(w, Tensor) else tuple(w.shape)}"
            )
        _float_tensor("layer_norm.weight", w.detach().reshape(1, -1), 2)
        self.norm_weight.copy_(w.detach().to(self.norm_weight.dtype))
        eps = getattr(layer_norm, "variance_epsilon", getattr(layer_norm, "eps", None))
        if isinstance(eps, float) and 0 < eps < 1:
            self.eps = eps
        return self

    def forward(self, feats: Tensor) -> Tensor:
        """``(B, L, in_dim)`` VLM features → ``(B, L, out_dim)`` in T5-encoder space."""
        feats = _float_tensor("feats", feats, 3)
        if feats.shape[-1] != self.in_dim:
            raise ValueError(
                f"feats must have last dimension in_dim={self.in_dim} (the aligner's VLM width), got "
                f"shape {tuple(feats.shape)}"
            )
        h = self.fc2(F.gelu(self.fc1(feats.to(self.fc1.weight.dtype))))
        var = h.float().pow(2).mean(-1, keepdim=True)
        return self.norm_weight * (h.float() * torch.rsqrt(var + self.eps)).to(h.dtype)


def _check_aligner_input(aligner: Callable[[Tensor], Tensor], feats: Tensor) -> None:
    in_dim = getattr(aligner, "in_dim", None)
    if isinstance(in_dim, int) and feats.shape[-1] != in_dim:
        raise ValueError(
            f"feats must have last dimension {in_dim} (the aligner's in_dim), got shape {tuple(feats.shape)}"
        )


def aligner_text_loss(
    aligner: Callable[[Tensor], Tensor],
    feats: Tensor,
    feat_mask: Tensor,
    target_ids: Tensor,
    t5: nn.Module,
    target_mask: Tensor | None = None,
) -> Tensor:
    """Teacher-forced cross-entropy of the frozen T5 decoder reading ``aligner(feats)`` as encoder outputs.

    Args:
        aligner: maps ``(B, L, d_vlm)`` → ``(B, L, d_model)`` (a :class:`FeatureAligner`, or any module;
            the T5 encoder applied to embeddings reproduces the T5's own loss).
        feats: ``(B, L, d_vlm)`` VLM features (generated-token hidden states), finite.
        feat_mask: ``(B, L)`` 0/1, 1 = real feature (the T5 cross-attention mask); no row all zeros.
        target_ids: ``(B, T)`` T5 token ids of the text to predict (the official code's re-tokenised VLM
            answer, EOS included); entries equal to ``-100`` are ignored.
        t5: a ``T5ForConditionalGeneration`` (its decoder and ``lm_head`` are used, its encoder is not).
        target_mask: ``(B, T)`` 0/1, 0 = padding (set to ``-100`` in the labels); default: all valid.

    Returns:
        The mean token cross-entropy (nats), a scalar with gradients to whatever in ``aligner`` requires them.
    """
    _check_seq2seq(t5)
    feats = _float_tensor("feats", feats, 3)
    _check_aligner_input(aligner, feats)
    mask = _mask_tensor("feat_mask", feat_mask, tuple(feats.shape[:2]))
    labels = _id_tensor("target_ids", target_ids, 2).clone()
    if labels.shape[0] != feats.shape[0]:
        raise ValueError(
            f"target_ids must have batch size {feats.shape[0]} (as feats), got {tuple(labels.shape)}"
        )
    if target_mask is not None:
        tmask = _mask_tensor("target_mask", target_mask, tuple(labels.shape))
        labels = labels.masked_fill(tmask == 0, -100)
    vocab = getattr(getattr(t5, "config", None), "vocab_size", None)
    valid = labels != -100
    if (labels[valid] < 0).any() or (vocab is not None and (labels[valid] >= vocab).any()):
        raise ValueError(f"target_ids must be token ids in [0, {vocab}) or -100, got range "
                         f"[{int(labels[valid].min())}, {int(labels[valid].max())}]")  # fmt: skip
    if not valid.any(1).all():
        raise ValueError("target_ids must hold at least one target token per row (after target_mask)")
    enc = aligner(feats)
    if not isinstance(enc, Tensor) or enc.shape[:2] != feats.shape[:2]:
        raise ValueError(f"aligner must return (B, L, d_model) = ({feats.shape[0]}, {feats.shape[1]}, ...), got "
                         f"{tuple(enc.shape) if isinstance(enc, Tensor) else type(enc).__name__}")  # fmt: skip
    d = _t5_dim(t5)
    if d is not None and enc.shape[-1] != d:
        raise ValueError(f"aligner output width {enc.shape[-1]} must equal t5's d_model {d}")
    out = t5(encoder_outputs=(enc,), attention_mask=mask, labels=labels)
    return out.loss


def random_split_generated(
    feats: Tensor,
    feat_mask: Tensor,
    token_ids: Tensor,
    max_split: int = 128,
    generator: torch.Generator | None = None,
    seed: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """ThinkDiff-LVLM's random split of each generated sequence into a condition part and a target part.

    For row ``i`` with ``n_i = feat_mask[i].sum()`` valid tokens (at the start of the row), draws ``s_i``
    uniformly in ``[1, min(n_i − 1, max_split)]`` (the official dataset's ``random_split_output_embed``).

    Args:
        feats: ``(B, L, d)`` generated-token hidden states; ``feat_mask``: ``(B, L)`` 0/1 with ``n_i ≥ 2``.
        token_ids: ``(B, L)`` the generated token ids (aligned with ``feats``).
        max_split: upper bound of the split point (official 128).
        generator / seed: randomness of the split points (never the global generator).

    Returns:
        ``(cond_feats (B, S, d), cond_mask (B, S), target_ids (B, T), target_mask (B, T))`` with
        ``S = max s_i``, ``T = max(n_i − s_i)``; padding is zero.
    """
    feats = _float_tensor("feats", feats, 3)
    mask = _mask_tensor("feat_mask", feat_mask, tuple(feats.shape[:2]))
    ids = _id_tensor("token_ids", token_ids, 2)
    if tuple(ids.shape) != tuple(feats.shape[:2]):
        raise ValueError(
            f"token_ids must have shape {tuple(feats.shape[:2])} (as feats), got {tuple(ids.shape)}"
        )
    max_split = check_int(max_split, "max_split", low=1)
    n = mask.sum(1)
    if not torch.equal(mask, (torch.arange(mask.shape[1])[None] < n[:, None]).long()):
        raise ValueError("feat_mask must mark a prefix of each row (valid tokens first, then padding)")
    if (n < 2).any():
        raise ValueError(
            f"feat_mask must keep at least 2 tokens per row to split, got lengths {n.tolist()[:5]}"
        )
    g = make_generator(seed, generator)
    hi = torch.clamp(n - 1, max=max_split)
    s = 1 + (torch.rand(len(n), generator=g) * hi).long().clamp(max=hi - 1)
    S, T = int(s.max()), int((n - s).max())
    cond = feats.new_zeros(len(n), S, feats.shape[2])
    cmask = torch.zeros(len(n), S, dtype=torch.long)
    tgt = torch.zeros(len(n), T, dtype=torch.long)
    tmask = torch.zeros(len(n), T, dtype=torch.long)
    for i, (si, ni) in enumerate(zip(s.tolist(), n.tolist())):
        cond[i, :si], cmask[i, :si] = feats[i, :si], 1
        tgt[i, : ni - si], tmask[i, : ni - si] = ids[i, si:ni], 1
    return cond, cmask, tgt, tmask


def _lr_factor(step: int, steps: int, warmup: int, final_ratio: float) -> float:
    """Linear warm-up from 1% to 1, then cosine from 1 to ``final_ratio`` (official: 1e-6 → 1e-4 → 8e-5)."""
    if step < warmup:
        return 0.01 + 0.99 * step / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * p))


def _check_batch(b: object, k: int, aligned: bool) -> Mapping[str, Tensor]:
    if not isinstance(b, Mapping) or not {"feats", "feat_mask", "token_ids"} <= set(b):
        raise TypeError(
            f"loader must yield mappings with keys 'feats', 'feat_mask', 'token_ids'; batch {k} is "
            f"{type(b).__name__}{'' if not isinstance(b, Mapping) else ' with keys ' + str(sorted(b))}"
        )
    feats = _float_tensor("feats", b["feats"], 3)
    _mask_tensor("feat_mask", b["feat_mask"], tuple(feats.shape[:2]))
    ids = _id_tensor("token_ids", b["token_ids"], 2)
    if aligned and tuple(ids.shape) != tuple(feats.shape[:2]):
        raise ValueError(
            f"token_ids must have shape {tuple(feats.shape[:2])} (as feats) for split='random', got {tuple(ids.shape)}"
        )
    if ids.shape[0] != feats.shape[0]:
        raise ValueError(
            f"token_ids must have batch size {feats.shape[0]} (as feats), got {tuple(ids.shape)}"
        )
    if "token_mask" in b:
        _mask_tensor("token_mask", b["token_mask"], tuple(ids.shape))
    return b


def train_aligner(
    aligner: nn.Module,
    loader: Iterable[Mapping[str, Tensor]],
    t5: nn.Module,
    steps: int,
    lr: float = 1e-4,
    *,
    retokenize: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    split: str = "random",
    max_split: int = 128,
    weight_decay: float = 0.05,
    warmup: int = 0,
    final_lr_ratio: float = 0.8,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Train ``aligner`` through the frozen ``t5`` decoder on batches of VLM generations.

    Args:
        aligner: the trainable module (usually a :class:`FeatureAligner`).
        loader: re-iterable (a list or a ``DataLoader``; cycled until ``steps``) of mappings with
            ``feats (B, L, d_vlm)``, ``feat_mask (B, L)``, ``token_ids (B, n)`` (the generated ids) and
            optionally ``token_mask (B, n)``. With ``split="random"`` the ids must align with the features
            (``n = L``, masks equal); with ``"none"`` any features (e.g. the VLM's input-token states, the
            official ``input_embed``) may condition the whole generated text. A list (any sequence) is
            validated entirely before the first update; other iterables batch by batch.
        t5: a ``T5ForConditionalGeneration``; frozen (``requires_grad`` off, eval mode) during the call and
            restored after; its parameters never change.
        steps: optimiser steps.
        lr: peak learning rate (official 1e-4; AdamW, weight decay ``weight_decay``).
        retokenize: ``(vlm_ids (B, n), mask (B, n)) -> (t5_ids (B, T), t5_mask (B, T))``, the official
            "decode with the VLM tokenizer, encode with the T5 tokenizer (EOS added, max 128)".
        split: ``"random"`` (shipped LVLM recipe: condition on a random prefix of the generated-token
            states, predict the rest, :func:`random_split_generated`) or ``"none"`` (condition on all,
            predict all).
        warmup, final_lr_ratio: linear warm-up steps, then cosine decay to ``final_lr_ratio · lr``.
        seed: seed of the random split points.

    Returns:
        ``{"loss": [per-step CE], "lr": [per-step lr]}``.
    """
    if not isinstance(aligner, nn.Module):
        raise TypeError(f"aligner must be an nn.Module, got {type(aligner).__name__}")
    _check_seq2seq(t5)
    steps = check_int(steps, "steps", low=1)
    lr = check_float(lr, "lr", low=0, low_open=True)
    weight_decay = check_float(weight_decay, "weight_decay", low=0)
    final_lr_ratio = check_float(final_lr_ratio, "final_lr_ratio", low=0)
    warmup = check_int(warmup, "warmup", low=0)
    if split not in ("random", "none"):
        raise ValueError(f"split must be 'random' or 'none', got {split!r}")
    if not callable(retokenize):
        raise TypeError(
            f"retokenize must be callable (vlm ids, mask) -> (t5 ids, mask), got {type(retokenize).__name__}"
        )
    if isinstance(loader, Sequence):
        if len(loader) == 0:
            raise ValueError("loader must yield at least one batch, got an empty sequence")
        for k, b in enumerate(loader):
            _check_batch(b, k, split == "random")
    params = [p for p in aligner.parameters() if p.requires_grad]
    if not params:
        raise ValueError("aligner has no trainable parameters")
    g = make_generator(seed)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    t5_state = [(p, p.requires_grad) for p in t5.parameters()]
    was_training = t5.training
    hist: dict[str, list[float]] = {"loss": [], "lr": []}
    try:
        t5.eval()
        for p, _ in t5_state:
            p.requires_grad_(False)
        aligner.train()
        it = iter(loader)
        k = 0
        for step in range(steps):
            try:
                b = next(it)
            except StopIteration:
                it = iter(loader)
                try:
                    b = next(it)
                except StopIteration:
                    raise ValueError("loader must yield at least one batch, got none") from None
            _check_batch(b, k, split == "random")
            k += 1
            feats, fmask, ids = b["feats"], b["feat_mask"].long(), b["token_ids"].long()
            if split == "random":
                feats, fmask, ids, tmask = random_split_generated(feats, fmask, ids, max_split, generator=g)
            else:
                tmask = b["token_mask"].long() if "token_mask" in b else torch.ones_like(ids)
            t_ids, t_mask = retokenize(ids, tmask)
            cur = lr * _lr_factor(step, steps, warmup, final_lr_ratio)
            for group in opt.param_groups:
                group["lr"] = cur
            loss = aligner_text_loss(aligner, feats, fmask, t_ids, t5, t_mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            hist["loss"].append(float(loss.detach()))
            hist["lr"].append(cur)
    finally:
        for p, req in t5_state:
            p.requires_grad_(req)
        t5.train(was_training)
    aligner.eval()
    return hist


def aligned_prompt_embeds(
    vlm_generate_fn: Callable[[Any], tuple[Tensor, Tensor]],
    aligner: Callable[[Tensor], Tensor],
    inputs: Any,
    text_embeds: Tensor | None = None,
    text_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Prompt embeddings for a T5-conditioned diffusion model from a VLM's generated answer.

    Args:
        vlm_generate_fn: ``inputs -> (hidden (B, L, d_vlm), mask (B, L))``, the final-norm hidden states of
            the generated tokens (e.g. a closure over :func:`generated_hidden_states` or
            :meth:`ToyVLM.generate`).
        aligner: a trained :class:`FeatureAligner`.
        inputs: whatever ``vlm_generate_fn`` takes (the multimodal in-context prompt).
        text_embeds / text_mask: optional ``(B, L_t, d_model)`` T5-encoded text (and its mask) placed
            *before* the aligned tokens (the official ``extra_encoder_outputs_embeds``).

    Returns:
        ``(prompt_embeds (B, L', d_model), mask (B, L'))``; masked positions are zero (FLUX takes no mask).
    """
    if not callable(vlm_generate_fn):
        raise TypeError(f"vlm_generate_fn must be callable, got {type(vlm_generate_fn).__name__}")
    got = vlm_generate_fn(inputs)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise TypeError(f"vlm_generate_fn must return (hidden, mask), got {type(got).__name__}")
    feats = _float_tensor("hidden", got[0], 3)
    _check_aligner_input(aligner, feats)
    mask = _mask_tensor("mask", got[1], tuple(feats.shape[:2]))
    with torch.no_grad():
        emb = aligner(feats) * mask[..., None].to(feats.dtype)
    if text_embeds is not None:
        te = _float_tensor("text_embeds", text_embeds, 3)
        if te.shape[0] != emb.shape[0] or te.shape[2] != emb.shape[2]:
            raise ValueError(
                f"text_embeds must have shape ({emb.shape[0]}, L_t, {emb.shape[2]}), got {tuple(te.shape)}"
            )
        tm = (torch.ones(te.shape[:2], dtype=torch.long) if text_mask is None
              else _mask_tensor("text_mask", text_mask, tuple(te.shape[:2])))  # fmt: skip
        emb = torch.cat([te.to(emb.dtype) * tm[..., None].to(emb.dtype), emb], 1)
        mask = torch.cat([tm, mask], 1)
    return emb, mask


# ---------------------------------------------------------------------------------- integrations
def generated_hidden_states(
    model: nn.Module,
    input_ids: Tensor,
    n_tokens: int,
    attention_mask: Tensor | None = None,
    **generate_kwargs: Any,
) -> tuple[Tensor, Tensor, Tensor]:
    """Final-norm hidden states of the tokens a ``transformers`` causal LM / VLM generates.

    Runs ``model.generate(..., output_hidden_states=True, return_dict_in_generate=True)`` for exactly
    ``n_tokens`` new tokens (``min_new_tokens = max_new_tokens``, EOS ignored, as ThinkDiff's fixed 64-token
    extraction) and keeps, for each generated token, the last layer's state at the position that produced
    it (what vLLM returns). Extra ``generate_kwargs`` (``pixel_values``, ``do_sample``, ``temperature``,
    ``top_p``...) are passed through.

    Returns:
        ``(hidden (B, n_tokens, d), mask (B, n_tokens) all ones, token_ids (B, n_tokens))``.
    """
    try:
        import transformers  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "generated_hidden_states needs transformers: pip install 'icml25-generative-models[hf]'"
        ) from exc
    if not hasattr(model, "generate"):
        raise TypeError(
            f"model must be a transformers generation model (has .generate), got {type(model).__name__}"
        )
    ids = _id_tensor("input_ids", input_ids, 2)
    n_tokens = check_int(n_tokens, "n_tokens", low=1)
    if attention_mask is not None:
        attention_mask = _mask_tensor("attention_mask", attention_mask, tuple(ids.shape))
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    suppress = list(generate_kwargs.pop("suppress_tokens", None) or [])
    if eos is not None:
        suppress += [eos] if isinstance(eos, int) else list(eos)
    out = model.generate(
        input_ids=ids,
        attention_mask=attention_mask,
        max_new_tokens=n_tokens,
        min_new_tokens=n_tokens,
        output_hidden_states=True,
        return_dict_in_generate=True,
        suppress_tokens=suppress or None,
        **generate_kwargs,
    )
    hidden = torch.cat([step[-1][:, -1:, :] for step in out.hidden_states], 1)
    new_ids = out.sequences[:, -n_tokens:]
    return hidden, torch.ones(hidden.shape[:2], dtype=torch.long), new_ids


def _is_t5(module: object) -> bool:
    return isinstance(module, nn.Module) and "T5" in type(module).__name__


def diffusers_prompt_kwargs(
    pipe: Any,
    prompt_embeds: Tensor,
    prompt_mask: Tensor | None = None,
    pooled_prompt_embeds: Tensor | None = None,
) -> dict[str, Tensor]:
    """Keyword arguments that hand aligned embeddings to a diffusers pipeline (FLUX, SD3, ...).

    Checks that the pipeline's denoiser reads ``d_model``-wide text tokens (``transformer.config
    .joint_attention_dim`` or ``unet.config.cross_attention_dim``) and warns (``UserWarning``) when none of its
    text encoders is a T5: ThinkDiff's premise (the aligner targets the space of the *same* T5 encoder the
    diffusion model was trained with) then does not hold (e.g. CLIP-only SD 1.5). Masked positions are zeroed,
    since FLUX and SD3 take no prompt mask.

    Args:
        pipe: a diffusers pipeline (duck-typed: ``components`` and ``transformer`` or ``unet``).
        prompt_embeds: ``(B, L, d_model)`` from :func:`aligned_prompt_embeds`; ``prompt_mask``: ``(B, L)``.
        pooled_prompt_embeds: ``(B, d_pooled)`` for pipelines that need a pooled vector (FLUX, SD3: the CLIP
            pooled output of an empty or real prompt).

    Returns:
        ``{"prompt_embeds": ..., "pooled_prompt_embeds": ...}`` (the second only when given).
    """
    comps = getattr(pipe, "components", None)
    if not isinstance(comps, Mapping):
        raise TypeError(f"pipe must be a diffusers pipeline (with .components), got {type(pipe).__name__}")
    emb = _float_tensor("prompt_embeds", prompt_embeds, 3)
    if prompt_mask is not None:
        emb = emb * _mask_tensor("prompt_mask", prompt_mask, tuple(emb.shape[:2]))[..., None].to(emb.dtype)
    den = comps.get("transformer") or comps.get("unet")
    cfg = getattr(den, "config", None)
    width = None
    for key in ("joint_attention_dim", "cross_attention_dim"):
        v = cfg.get(key) if isinstance(cfg, Mapping) else getattr(cfg, key, None)
        if isinstance(v, int):
            width = v
            break
    if width is not None and emb.shape[-1] != width:
        raise ValueError(
            f"prompt_embeds must have width {width} (the pipeline denoiser's text-token width), got "
            f"shape {tuple(emb.shape)}"
        )
    encoders = [m for k, m in comps.items() if k.startswith("text_encoder") and m is not None]
    if encoders and not any(_is_t5(m) for m in encoders):
        warnings.warn(
            f"pipe's text encoders are {[type(m).__name__ for m in encoders]}, none a T5: ThinkDiff's "
            "shared-space assumption (aligned features live in the diffusion model's own T5-encoder space) "
            "does not hold for this pipeline",
            UserWarning,
            stacklevel=2,
        )
    out = {"prompt_embeds": emb}
    if pooled_prompt_embeds is not None:
        pooled = _float_tensor("pooled_prompt_embeds", pooled_prompt_embeds, 2)
        if pooled.shape[0] != emb.shape[0]:
            raise ValueError(
                f"pooled_prompt_embeds must have batch size {emb.shape[0]}, got {tuple(pooled.shape)}"
            )
        out["pooled_prompt_embeds"] = pooled
    return out


def tiny_t5(
    vocab_size: int, d_model: int = 64, num_layers: int = 2, num_heads: int = 4, seed: int = 0
) -> nn.Module:
    """A random-config ``transformers`` ``T5ForConditionalGeneration`` (pad 0 = decoder start, EOS 1).

    ``d_kv = d_model / num_heads``, ``d_ff = 2 d_model``, no dropout, ``num_layers`` encoder and decoder
    layers. Needs the ``hf`` extra.
    """
    try:
        from transformers import T5Config, T5ForConditionalGeneration
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("tiny_t5 needs transformers: pip install 'icml25-generative-models[hf]'") from exc
    for nm, v in (
        ("vocab_size", vocab_size),
        ("d_model", d_model),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
    ):
        check_int(v, nm, low=1)
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be >= 3 (pad 0, EOS 1 and a word), got {vocab_size}")
    if d_model % num_heads:
        raise ValueError(f"d_model must be divisible by num_heads, got {d_model} and {num_heads}")
    cfg = T5Config(
        vocab_size=vocab_size, d_model=d_model, d_kv=d_model // num_heads, d_ff=2 * d_model,
        num_layers=num_layers, num_decoder_layers=num_layers, num_heads=num_heads, dropout_rate=0.0,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, relative_attention_num_buckets=8,
    )  # fmt: skip
    with isolated_rng(seed):
        return T5ForConditionalGeneration(cfg)


# ----------------------------------------------------------------------------- tiny reproduction models
class _Block(nn.Module):
    """Pre-norm transformer block with optional causal mask (F.scaled_dot_product_attention)."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: Tensor) -> Tensor:
        B, L, d = x.shape
        q, k, v = self.qkv(self.n1(x)).reshape(B, L, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, L, d)
        x = x + self.proj(a)
        return x + self.mlp(self.n2(x))


class ToyVLM(nn.Module):
    """A tiny VLM: a CNN turns an ``(H, W)`` image into ``n_image_tokens`` tokens, a causal transformer reads
    ``[image tokens, prompt tokens, answer tokens]`` and predicts the answer; final LayerNorm before the head.

    Args:
        vocab_size: shared vocabulary of prompt and answer tokens.
        d: width; ``n_layers`` blocks of ``n_heads`` heads; ``image_size``: side of the square image
            (a multiple of 4); the CNN gives ``(image_size / 4)²`` image tokens.
        seed: initialisation seed (``None``: torch's global generator).
    """

    def __init__(self, vocab_size: int, d: int = 64, n_layers: int = 2, n_heads: int = 4, image_size: int = 8,
                 max_len: int = 16, seed: int | None = None):  # fmt: skip
        super().__init__()
        if image_size % 4:
            raise ValueError(f"image_size must be a multiple of 4, got {image_size}")
        self.vocab_size, self.d, self.image_size = vocab_size, d, image_size
        self.n_image_tokens = (image_size // 4) ** 2
        with isolated_rng(seed):
            self.cnn = nn.Sequential(
                nn.Conv2d(1, 32, 3, padding=1), nn.GELU(), nn.Conv2d(32, d, 4, stride=4)
            )  # fmt: skip
            self.tok = nn.Embedding(vocab_size, d)
            self.pos = nn.Parameter(0.02 * torch.randn(self.n_image_tokens + max_len, d))
            self.blocks = nn.ModuleList([_Block(d, n_heads) for _ in range(n_layers)])
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab_size)

    def hidden(self, images: Tensor, tokens: Tensor) -> Tensor:
        """Final-norm states ``(B, n_img + T, d)`` of ``[image tokens, tokens]``; ``images`` is ``(B, H, W)``."""
        img = self.cnn(images[:, None]).flatten(2).transpose(1, 2)
        x = torch.cat([img, self.tok(tokens)], 1)
        x = x + self.pos[: x.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)

    def forward(self, images: Tensor, tokens: Tensor) -> Tensor:
        """Logits ``(B, n_img + T, vocab)``; position ``t`` predicts token ``t + 1``."""
        return self.head(self.hidden(images, tokens))

    @torch.no_grad()
    def generate(self, images: Tensor, prompt: Tensor, n_tokens: int) -> dict[str, Tensor]:
        """Greedy fixed-length generation (no EOS): ``ids (B, n)``, ``hidden (B, n, d)`` = the final-norm
        state that produced each generated token, ``input_hidden (B, n_img + P, d)`` = states of the input
        (image and prompt) positions, ``shifted_hidden (B, n, d)`` = the states one position earlier."""
        images = _float_tensor("images", images, 3)
        prompt = _id_tensor("prompt", prompt, 2)
        n_tokens = check_int(n_tokens, "n_tokens", low=1)
        tokens = prompt
        for _ in range(n_tokens):
            h = self.hidden(images, tokens)
            nxt = self.head(h[:, -1]).argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], 1)
        h = self.hidden(images, tokens)
        start = self.n_image_tokens + prompt.shape[1] - 1
        return {
            "ids": tokens[:, prompt.shape[1]:],
            "hidden": h[:, start : start + n_tokens],
            "input_hidden": h[:, : start + 1],
            "shifted_hidden": h[:, start - 1 : start - 1 + n_tokens],
        }  # fmt: skip


class ToyFlowDecoder(nn.Module):
    """A conditional rectified-flow MLP on flattened images with cross-attention to T5 encoder outputs.

    ``v(x_t, t, c)``: an MLP embeds ``[x_t, t-features]``; ``n_blocks`` cross-attention blocks (queries from
    the running state, keys/values from the condition tokens ``c (B, L, d_cond)`` under their mask) add
    the read-out; a linear head predicts the velocity ``x1 − x0`` (data ``x1``, noise ``x0``).
    """

    def __init__(self, dim: int, d_cond: int, hidden: int = 256, n_blocks: int = 2, n_heads: int = 4,
                 seed: int | None = None):  # fmt: skip
        super().__init__()
        self.dim, self.d_cond, self.hidden, self.n_heads = dim, d_cond, hidden, n_heads
        with isolated_rng(seed):
            self.inp = nn.Sequential(nn.Linear(dim + 16, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
            self.q = nn.ModuleList([nn.Linear(hidden, hidden) for _ in range(n_blocks)])
            self.kv = nn.ModuleList([nn.Linear(d_cond, 2 * hidden) for _ in range(n_blocks)])
            self.o = nn.ModuleList([nn.Linear(hidden, hidden) for _ in range(n_blocks)])
            self.ff = nn.ModuleList(
                [nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
                 for _ in range(n_blocks)]
            )  # fmt: skip
            self.out = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, dim))

    def forward(self, x: Tensor, t: Tensor, cond: Tensor, cond_mask: Tensor) -> Tensor:
        """Velocity ``(B, dim)`` at ``x (B, dim)``, times ``t (B,)`` in [0, 1], condition ``(B, L, d_cond)``."""
        freqs = torch.arange(8, dtype=x.dtype) + 1.0
        tf = torch.cat([torch.sin(math.pi * t[:, None] * freqs), torch.cos(math.pi * t[:, None] * freqs)], 1)
        h = self.inp(torch.cat([x, tf], 1))
        B, L, _ = cond.shape
        dh = self.hidden // self.n_heads
        bias = torch.zeros(B, 1, 1, L, dtype=x.dtype).masked_fill(
            cond_mask[:, None, None, :] == 0, float("-inf")
        )
        for q, kv, o, ff in zip(self.q, self.kv, self.o, self.ff):
            qh = q(h).reshape(B, self.n_heads, 1, dh)
            k, v = kv(cond).reshape(B, L, 2, self.n_heads, dh).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(qh, k, v, attn_mask=bias).reshape(B, self.hidden)
            h = h + o(a)
            h = h + ff(h)
        return self.out(h)

    def loss(self, x1: Tensor, cond: Tensor, cond_mask: Tensor, generator: torch.Generator) -> Tensor:
        """Rectified-flow loss ``‖v(x_t, t, c) − (x1 − x0)‖²`` with ``x_t = (1 − t) x0 + t x1``."""
        x0 = torch.randn(x1.shape, generator=generator)
        t = torch.rand(x1.shape[0], generator=generator)
        xt = (1 - t[:, None]) * x0 + t[:, None] * x1
        return F.mse_loss(self(xt, t, cond, cond_mask), x1 - x0)

    @torch.no_grad()
    def sample(self, cond: Tensor, cond_mask: Tensor, steps: int = 20, generator: torch.Generator | None = None,
               seed: int | None = None) -> Tensor:  # fmt: skip
        """Euler integration of the flow from noise (t = 0) to data (t = 1): ``(B, dim)``."""
        cond = _float_tensor("cond", cond, 3)
        if cond.shape[-1] != self.d_cond:
            raise ValueError(f"cond must have last dimension {self.d_cond}, got shape {tuple(cond.shape)}")
        mask = _mask_tensor("cond_mask", cond_mask, tuple(cond.shape[:2]))
        g = make_generator(seed, generator)
        x = torch.randn(cond.shape[0], self.dim, generator=g)
        for i in range(steps):
            t = torch.full((cond.shape[0],), i / steps)
            x = x + self(x, t, cond, mask) / steps
        return x
