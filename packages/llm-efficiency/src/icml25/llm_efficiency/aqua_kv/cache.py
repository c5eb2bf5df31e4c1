"""AQUA-KV: Cache Me If You Must: Adaptive Key-Value Quantization for Large Language Models — ICML 2025, P36: ``AquaKVCache``, a drop-in ``transformers`` Cache for ``generate``/``forward``.

Token handling (official defaults): the first ``prefix_size`` tokens (attention sinks) stay in full
precision; new tokens collect in a full-precision buffer; when the buffer holds ``>= buffer_size`` tokens
it is compressed, across all layers in order, into one write-once chunk of AQUA-KV codes; on that step
the original (unquantized) buffer is returned, later steps read the chunk back through the predictor
chain (recomputed on every read; only codes are stored). Keys are stored pre-RoPE and rotated back on
read with their positions, so positions are assumed to be ``0..T-1`` per sequence (no left padding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

try:  # the class subclasses transformers' Cache, so this module needs the [hf] extra
    from transformers.cache_utils import Cache, CacheLayerMixin
except ImportError as err:  # pragma: no cover - exercised only without transformers
    raise ImportError("AquaKVCache needs transformers: pip install 'icml25-llm-efficiency[hf]'") from err

from icml25.kernels.checks import check_int
from icml25.llm_efficiency.aqua_kv.predictors import AquaCodec, AquaPredictors, Quantizer
from icml25.llm_efficiency.aqua_kv.quantizers import stored_bits
from icml25.llm_efficiency.aqua_kv.rope import apply_rope, heads_to_rows, kv_layout, rows_to_heads, undo_rope

__all__ = ["AquaKVCache"]


class _AquaLayer(CacheLayerMixin):
    """Per-layer bookkeeping that transformers' utilities query (lengths, mask sizes); data lives in the cache."""

    is_sliding = False
    supports_early_init = False

    def __init__(self) -> None:
        super().__init__()
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):  # routed through AquaKVCache.update
        raise RuntimeError("AquaKVCache layers are updated through AquaKVCache.update")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0


@dataclass
class _Chunk:
    """One write-once compressed chunk: codes per layer and the transient previous-layer reconstruction."""

    start: int
    length: int
    batch: int
    codes: list[tuple[object, object]] = field(default_factory=list)
    prev: tuple[torch.Tensor, torch.Tensor] | None = None  # reconstruction of the last layer touched


class AquaKVCache(Cache):
    """KV cache storing AQUA-KV codes (quantized inter-layer prediction residuals).

    Args:
        config: the model's config (Llama/Qwen-style RoPE decoder; ``head_dim`` inferred when absent).
        predictors: :class:`AquaPredictors` fitted for this config (``calibrate_predictors``).
        quantizer: residual quantizer for layers ``>= 1`` (e.g. ``HiggsQuantizer(d=2, n=16, group=128)``).
        first_layer_quantizer: quantizer of layer 0 (required: the layer-0 policy; the paper uses HIGGS
            d=2, n=256, i.e. 4 bits; ``PassthroughQuantizer()`` keeps it in 16 bits).
        prefix_size: leading tokens kept in full precision (attention sinks).
        buffer_size: recent tokens kept in full precision; a full buffer is compressed as one chunk.

    Example::

        cache = AquaKVCache(model.config, predictors, HiggsQuantizer(2, 16, 128), PassthroughQuantizer())
        out = model.generate(input_ids, past_key_values=cache, max_new_tokens=32, do_sample=False)
        cache.memory_bits(), cache.bits_per_value()
    """

    def __init__(
        self,
        config: object,
        predictors: AquaPredictors,
        quantizer: Quantizer,
        first_layer_quantizer: Quantizer | None = None,
        prefix_size: int = 4,
        buffer_size: int = 128,
    ) -> None:
        self.layout = kv_layout(config)
        if not isinstance(predictors, AquaPredictors):
            raise TypeError(f"predictors must be AquaPredictors, got {type(predictors).__name__}")
        predictors.check_config(self.layout.num_layers, self.layout.kv_dim)
        self.codec = AquaCodec(predictors, quantizer, first_layer_quantizer)
        self.prefix_size = check_int(prefix_size, "prefix_size", low=0)
        self.buffer_size = check_int(buffer_size, "buffer_size", low=1)
        n = self.layout.num_layers
        super().__init__(layers=[_AquaLayer() for _ in range(n)])
        self._clear()

    def _clear(self) -> None:
        n = self.layout.num_layers
        self.prefix: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n
        self.buffer: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n
        self.chunks: list[_Chunk] = []
        self._writing: _Chunk | None = None
        self._next_layer = 0

    # -- transformers interface ------------------------------------------------------------------------
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new post-RoPE keys/values ``(B, H_kv, T, d)`` of ``layer_idx``; return all keys/values so far."""
        if layer_idx not in (0, self._next_layer):
            raise RuntimeError(
                f"AquaKVCache must be updated layer by layer (0, 1, ...): expected {self._next_layer}, got {layer_idx}"
            )
        self._next_layer = (layer_idx + 1) % self.layout.num_layers
        layer = self.layers[layer_idx]
        layer.length += key_states.shape[-2]
        layer.is_initialized = True

        # 1) the first prefix_size tokens go to the full-precision prefix
        n_prefix_old = 0 if self.prefix[layer_idx] is None else self.prefix[layer_idx][0].shape[-2]
        take = max(0, min(self.prefix_size - n_prefix_old, key_states.shape[-2]))
        if take:
            self.prefix[layer_idx] = _cat(
                self.prefix[layer_idx], (key_states[..., :take, :], value_states[..., :take, :])
            )
        rest_k, rest_v = key_states[..., take:, :], value_states[..., take:, :]

        # 2) the rest goes to the buffer; a full buffer (decided at layer 0) is compressed layer by layer
        if rest_k.shape[-2]:
            self.buffer[layer_idx] = _cat(self.buffer[layer_idx], (rest_k, rest_v))
        buf = self.buffer[layer_idx]
        if layer_idx == 0 and buf is not None and buf[0].shape[-2] >= self.buffer_size:
            self._writing = _Chunk(
                start=layer.length - buf[0].shape[-2], length=buf[0].shape[-2], batch=buf[0].shape[0]
            )

        # 3) read every stored chunk of this layer (predictor chain recomputed from the previous layer)
        out_k = [] if self.prefix[layer_idx] is None else [self.prefix[layer_idx][0]]
        out_v = [] if self.prefix[layer_idx] is None else [self.prefix[layer_idx][1]]
        for chunk in self.chunks:
            k, v = self._read(chunk, layer_idx, key_states.dtype)
            out_k.append(k)
            out_v.append(v)

        # 4) this step's buffer is returned as is (the originals, even when it is being compressed now)
        if buf is not None:
            out_k.append(buf[0])
            out_v.append(buf[1])
            if self._writing is not None:
                self._write(self._writing, layer_idx, buf)
                self.buffer[layer_idx] = None
                if layer_idx == self.layout.num_layers - 1:
                    self._writing.prev = None
                    self.chunks.append(self._writing)
                    self._writing = None
        return torch.cat(out_k, dim=-2), torch.cat(out_v, dim=-2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].length if layer_idx < len(self.layers) else 0

    def reset(self) -> None:
        super().reset()
        self._clear()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError(
            "AquaKVCache does not support beam search (its chunks are write-once codes)"
        )

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("AquaKVCache is write-once and cannot be cropped")

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return any(layer.length for layer in self.layers)

    # -- write / read of one chunk ---------------------------------------------------------------------
    def _write(self, chunk: _Chunk, layer_idx: int, buf: tuple[torch.Tensor, torch.Tensor]) -> None:
        k_rows = heads_to_rows(undo_rope(buf[0], self.layout, chunk.start))
        v_rows = heads_to_rows(buf[1].float())
        prev = chunk.prev if layer_idx > 0 else None
        codes, chunk.prev = self.codec.encode_layer(layer_idx, k_rows, v_rows, prev)
        chunk.codes.append(codes)

    def _read(self, chunk: _Chunk, layer_idx: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        prev = chunk.prev if layer_idx > 0 else None
        k_hat, v_hat = self.codec.decode_layer(layer_idx, chunk.codes[layer_idx], prev)
        chunk.prev = (k_hat, v_hat)
        heads = self.layout.num_kv_heads
        k = apply_rope(rows_to_heads(k_hat, chunk.batch, heads), self.layout, chunk.start)
        return k.to(dtype), rows_to_heads(v_hat, chunk.batch, heads).to(dtype)

    def read_chunks(self) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Decode every stored chunk: ``[chunk][layer] -> (K^ pre-RoPE (B*T, c), V^ (B*T, c))`` in float32."""
        out = []
        for chunk in self.chunks:
            prev, per_layer = None, []
            for layer in range(self.layout.num_layers):
                prev = self.codec.decode_layer(layer, chunk.codes[layer], prev)
                per_layer.append(prev)
            out.append(per_layer)
        return out

    # -- memory accounting -----------------------------------------------------------------------------
    def memory_bits(self) -> int:
        """Bits actually stored: packed codes + scales of every chunk, full-precision prefix and buffer."""
        bits = 0
        for chunk in self.chunks:
            for ck, cv in chunk.codes:
                bits += stored_bits(ck) + stored_bits(cv)
        for part in (*self.prefix, *self.buffer):
            if part is not None:
                bits += sum(8 * t.numel() * t.element_size() for t in part)
        return bits

    def num_values(self) -> int:
        """Number of key and value scalars held (2 * layers * batch * tokens * c)."""
        total = 0
        for layer_idx, layer in enumerate(self.layers):
            part = self.prefix[layer_idx] or self.buffer[layer_idx]
            batch = part[0].shape[0] if part is not None else (self.chunks[0].batch if self.chunks else 0)
            total += 2 * batch * layer.length * self.layout.kv_dim
        return total

    def bits_per_value(self) -> float:
        """``memory_bits() / num_values()``: includes scales, layer 0 and the full-precision prefix/buffer."""
        return self.memory_bits() / max(1, self.num_values())

    def compressed_bits_per_value(self) -> float:
        """Bits per value of the compressed chunks only (layer 0 included, prefix/buffer excluded)."""
        values = sum(2 * c.batch * c.length * self.layout.kv_dim * len(c.codes) for c in self.chunks)
        bits = sum(stored_bits(ck) + stored_bits(cv) for c in self.chunks for ck, cv in c.codes)
        return bits / max(1, values)


def _cat(
    old: tuple[torch.Tensor, torch.Tensor] | None, new: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    if old is None:
        return new[0].clone(), new[1].clone()
    return torch.cat([old[0], new[0]], dim=-2), torch.cat([old[1], new[1]], dim=-2)
