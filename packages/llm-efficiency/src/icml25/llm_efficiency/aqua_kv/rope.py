"""AQUA-KV: Cache Me If You Must: Adaptive Key-Value Quantization for Large Language Models — ICML 2025, P36: model-config checks and RoPE undo/redo for keys stored pre-RoPE.

``transformers`` hands the cache post-RoPE keys; AQUA-KV predicts keys *before* RoPE (post-RoPE keys
rotate with position, which breaks linear prediction across layers), so the cache rotates back by
``-theta`` on write and forward again on read, with angles recomputed from the config for the tokens'
positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Decoders whose attention is Llama's: RoPE on (B, H, T, d) keys in transformers' rotate-half layout, GQA
# through num_key_value_heads. Mistral differs only by an optional sliding window, which its attention mask
# applies: the cache keeps every token (no eviction) and the mask hides those outside the window.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_POSITION_DEPENDENT_ROPE = ("dynamic", "longrope")


@dataclass(frozen=True)
class KVLayout:
    """What the cache needs from a model config."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    inv_freq: torch.Tensor  # (head_dim // 2,) float32
    attention_scaling: float

    @property
    def kv_dim(self) -> int:
        """``c = num_key_value_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim


def kv_layout(config: object) -> KVLayout:
    """Read layers, kv heads, head_dim and RoPE frequencies from a Llama/Mistral/Qwen-style config.

    Raises:
        ValueError: not a supported RoPE decoder (model_type not in ``SUPPORTED_MODEL_TYPES``), or a RoPE
            variant whose frequencies depend on the sequence length.
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"config must be a Llama/Mistral/Qwen-style RoPE decoder (model_type in {SUPPORTED_MODEL_TYPES}), "
            f"got model_type={model_type!r}"
        )
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(
        getattr(config, "head_dim", None) or config.hidden_size // heads
    )  # Qwen configs may lack it
    params = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", "default")
    if rope_type in _POSITION_DEPENDENT_ROPE:
        raise ValueError(f"rope_type must not depend on the sequence length, got {rope_type!r}")
    if rope_type == "default":
        theta = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        scaling = 1.0
    else:
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    return KVLayout(int(config.num_hidden_layers), kv_heads, head_dim, inv_freq.float(), float(scaling))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _angles(
    layout: KVLayout, start: int, length: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(start, start + length, device=device, dtype=torch.float32)
    freqs = pos[:, None] * layout.inv_freq.to(device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, head_dim), same layout as transformers' rotary embedding
    return emb.cos(), emb.sin()


def undo_rope(keys: torch.Tensor, layout: KVLayout, start: int) -> torch.Tensor:
    """Post-RoPE keys ``(B, H, T, d)`` at positions ``start..start+T-1`` -> pre-RoPE keys (float32)."""
    cos, sin = _angles(layout, start, keys.shape[-2], keys.device)
    k = keys.float()
    # The model applies a * R(theta); the inverse is R(-theta) / a, i.e. cos and -sin.
    return (k * cos - _rotate_half(k) * sin) / layout.attention_scaling


def apply_rope(keys: torch.Tensor, layout: KVLayout, start: int) -> torch.Tensor:
    """Pre-RoPE keys ``(B, H, T, d)`` -> post-RoPE keys at positions ``start..start+T-1`` (float32)."""
    cos, sin = _angles(layout, start, keys.shape[-2], keys.device)
    k = keys.float()
    return (k * cos + _rotate_half(k) * sin) * layout.attention_scaling


def heads_to_rows(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, d)`` -> ``(B * T, H * d)``: one row per token, heads concatenated."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b * t, h * d)


def rows_to_heads(x: torch.Tensor, batch: int, heads: int) -> torch.Tensor:
    """Inverse of :func:`heads_to_rows`."""
    bt, c = x.shape
    return x.reshape(batch, bt // batch, heads, c // heads).transpose(1, 2)
