"""AsymRnR: Video DiT Acceleration with Asymmetric Reduction and Restoration — ICML 2025, P21: diffusers.
The diffusers integration (CogVideoX).

:func:`apply_asymrnr` replaces the attention processor of every block of a diffusers
``CogVideoXTransformer3DModel`` by :class:`AsymRnRProcessor`: the block's own projections, QK-norm and
rotary embedding, then :func:`~icml25.generative_models.asymrnr.asymrnr_attention` (text tokens first, never
reduced; queries and keys/values reduced by the schedule's ``q`` and ``v`` ratios of this block and step,
the K/V matching computed on V), then the output projection. A forward pre-hook on the transformer reads
the latent video's ``(frames, height, width)`` to get the token grid. The denoising step comes from
:func:`set_step`, e.g. through the pipeline's ``callback_on_step_end=asymrnr_step_callback``; the matching
cache is per block and feature. :func:`calibrate_asymrnr` records the redundancy of Q and V per block
and step in one run of the unmodified model and returns a schedule. The official code
(``wenhao728/AsymRnR``, ``arnr/cogvideox``) also patches processors. Requires
``pip install 'icml25-generative-models[diffusers]'``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

try:
    from diffusers import CogVideoXTransformer3DModel
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the AsymRnR diffusers processors need diffusers: pip install 'icml25-generative-models[diffusers]'"
    ) from exc

from icml25.generative_models.asymrnr import (
    MatchCache,
    RedundancyRecorder,
    RnRSchedule,
    asymrnr_attention,
    warn_stuck_step,
)
from icml25.kernels.checks import check_choice, check_int, check_ints

__all__ = [
    "AsymRnRProcessor",
    "AsymRnRState",
    "apply_asymrnr",
    "asymrnr_step_callback",
    "calibrate_asymrnr",
    "remove_asymrnr",
    "set_step",
]


class AsymRnRState:
    """Shared state of one patched transformer: schedule, grid, step, matching cache, forward count."""

    def __init__(
        self,
        schedule: RnRSchedule | None,
        stride: tuple[int, int, int],
        cache_steps: int,
        mode: str,
        metric: str,
        generator: torch.Generator | None,
        recorder: RedundancyRecorder | None = None,
    ) -> None:
        self.schedule, self.stride, self.mode, self.metric = schedule, stride, mode, metric
        self.cache = MatchCache(cache_steps, generator=generator)
        self.recorder = recorder
        self.grid: tuple[int, int, int] | None = None
        self.step = 0
        self.step_set = False
        self.forwards = 0
        self.warned = False


class AsymRnRProcessor:
    """CogVideoX joint attention (text first) with AsymRnR's asymmetric Q and K/V reduction."""

    def __init__(self, state: AsymRnRState, block: int, original: Any) -> None:
        self.state, self.block, self.original = state, block, original

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        st = self.state
        text_len = encoder_hidden_states.size(1)
        x = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        B, L, _ = x.shape
        if st.grid is None or math.prod(st.grid) != L - text_len:
            raise ValueError(
                f"hidden_states has {L - text_len} video tokens but the grid F*H*W read by the pre-hook is "
                f"{st.grid} ({math.prod(st.grid) if st.grid else 'none'}); call the patched transformer itself"
            )
        q, k, v = attn.to_q(x), attn.to_k(x), attn.to_v(x)
        d = k.shape[-1] // attn.heads
        q, k, v = (t.view(B, -1, attn.heads, d).transpose(1, 2) for t in (q, k, v))
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        if image_rotary_emb is not None:
            from diffusers.models.embeddings import apply_rotary_emb

            q[:, :, text_len:] = apply_rotary_emb(q[:, :, text_len:], image_rotary_emb)
            if not attn.is_cross_attention:
                k[:, :, text_len:] = apply_rotary_emb(k[:, :, text_len:], image_rotary_emb)
        rq = rkv = 0.0
        if st.recorder is not None:
            step = min(st.step, st.recorder.num_steps - 1)
            st.recorder.record("q", self.block, step, q[:, :, text_len:], st.grid)
            st.recorder.record("v", self.block, step, v[:, :, text_len:], st.grid)
        elif st.schedule is not None and attention_mask is None:
            r = st.schedule.ratios(self.block, st.step)
            rq, rkv = r["q"], r["v"]
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, L, B)
            attention_mask = attention_mask.view(B, attn.heads, -1, attention_mask.shape[-1])
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        else:
            out = asymrnr_attention(
                q, k, v, st.grid, ratio_q=rq, ratio_kv=rkv, stride=st.stride, text_len=text_len,
                metric=st.metric, mode=st.mode, cache=st.cache, cache_key=self.block, step=st.step,
            )  # fmt: skip
        out = out.transpose(1, 2).reshape(B, -1, attn.heads * d)
        out = attn.to_out[1](attn.to_out[0](out))
        enc, hid = out.split([text_len, out.size(1) - text_len], dim=1)
        return hid, enc


def _check_model(transformer: object) -> CogVideoXTransformer3DModel:
    if not isinstance(transformer, CogVideoXTransformer3DModel):
        raise TypeError(
            f"transformer must be a diffusers CogVideoXTransformer3DModel (pipe.transformer), got "
            f"{type(transformer).__name__}"
        )
    return transformer


def _pre_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    st: AsymRnRState = module._asymrnr_state
    hs = kwargs.get("hidden_states", args[0] if args else None)
    p, pt = module.config.patch_size, module.config.patch_size_t or 1
    frames = hs.shape[1] // pt
    st.grid = (frames, hs.shape[3] // p, hs.shape[4] // p)
    st.forwards += 1
    if st.forwards > 1 and not st.step_set and st.recorder is None and not st.warned:
        st.warned = True  # once per patched transformer
        warn_stuck_step()


def _install(transformer: CogVideoXTransformer3DModel, state: AsymRnRState) -> None:
    if hasattr(transformer, "_asymrnr_state"):
        remove_asymrnr(transformer)
    originals = transformer.attn_processors
    procs = {}
    for name, proc in originals.items():
        block = int(name.split(".")[1])
        procs[name] = AsymRnRProcessor(state, block, proc)
    transformer._asymrnr_originals = originals
    transformer._asymrnr_state = state
    transformer._asymrnr_hook = transformer.register_forward_pre_hook(_pre_hook, with_kwargs=True)
    transformer.set_attn_processor(procs)


def apply_asymrnr(
    transformer: CogVideoXTransformer3DModel,
    schedule: RnRSchedule,
    stride: tuple[int, int, int] = (2, 2, 2),
    cache_steps: int = 5,
    mode: str = "replace",
    metric: str = "euclidean",
    generator: torch.Generator | None = None,
) -> AsymRnRState:
    """Patch every attention processor of ``transformer`` with AsymRnR (defaults: the official CogVideoX
    settings, stride (2, 2, 2), matching reused for 5 steps, ``replace``). Returns the shared state.

    Raises:
        TypeError: not a CogVideoX transformer, or ``schedule`` not an :class:`RnRSchedule`.
        ValueError: the schedule's block count differs from the transformer's, or it asks for hidden-state
            (``h``) reduction, which needs the whole block on the reduced sequence (not a processor).
    """
    transformer = _check_model(transformer)
    if not isinstance(schedule, RnRSchedule):
        raise TypeError(f"schedule must be an RnRSchedule, got {type(schedule).__name__}")
    n_blocks = len(transformer.transformer_blocks)
    if schedule.num_blocks != n_blocks:
        raise ValueError(
            f"schedule must have num_blocks = {n_blocks} (the transformer's blocks), got {schedule.num_blocks}"
        )
    if schedule.thresholds.get("h"):
        raise ValueError("schedule thresholds must not include 'h': the processor reduces q and k/v only")
    stride = check_ints(stride, "stride", length=3)
    mode = check_choice(mode, "mode", ("replace", "mean"))
    state = AsymRnRState(schedule, stride, cache_steps, mode, metric, generator)
    _install(transformer, state)
    return state


def remove_asymrnr(transformer: CogVideoXTransformer3DModel) -> None:
    """Restore the original attention processors and remove the hook."""
    transformer = _check_model(transformer)
    if not hasattr(transformer, "_asymrnr_state"):
        return
    transformer._asymrnr_hook.remove()
    transformer.set_attn_processor(transformer._asymrnr_originals)
    for attr in ("_asymrnr_state", "_asymrnr_hook", "_asymrnr_originals"):
        delattr(transformer, attr)


def set_step(transformer: CogVideoXTransformer3DModel, step_index: int) -> None:
    """Set the denoising step the schedule and the matching cache use."""
    state = getattr(_check_model(transformer), "_asymrnr_state", None)
    if state is None:
        raise ValueError("transformer is not patched: call apply_asymrnr (or calibrate_asymrnr) first")
    check_int(step_index, "step_index", low=0)
    state.step, state.step_set = step_index, True


def asymrnr_step_callback(pipe: Any, step_index: int, timestep: Any, callback_kwargs: Mapping) -> Mapping:
    """``callback_on_step_end`` for diffusers pipelines: advance the step after each denoising step."""
    set_step(pipe.transformer, step_index + 1)
    return callback_kwargs


def calibrate_asymrnr(
    transformer: CogVideoXTransformer3DModel,
    run: Callable[[], Any],
    num_steps: int,
    thresholds: Mapping[str, Mapping[int, float]],
    stride: tuple[int, int, int] = (2, 2, 2),
    seed: int = 0,
) -> RnRSchedule:
    """Record Q and V redundancy per block and step during ``run()`` (one generation with the unmodified
    attention, advancing :func:`set_step`, e.g. through :func:`asymrnr_step_callback`) and return the
    decile schedule (:class:`~icml25.generative_models.asymrnr.RedundancyRecorder`)."""
    transformer = _check_model(transformer)
    rec = RedundancyRecorder(len(transformer.transformer_blocks), num_steps, stride, seed)
    state = AsymRnRState(
        None, check_ints(stride, "stride", length=3), 1, "replace", "euclidean", None, recorder=rec
    )
    _install(transformer, state)
    try:
        run()
    finally:
        remove_asymrnr(transformer)
    return rec.schedule(thresholds)
