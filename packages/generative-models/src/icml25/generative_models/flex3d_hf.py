"""Flex3D: feed-forward 3D generation with flexible reconstruction model and input view curation — ICML 2025, P16: Hugging Face DINOv2 view tokeniser.

Han et al., ICML 2025 (arXiv 2410.00890). FlexRM, like LRM / Instant3D, tokenises each input view with a
DINO vision transformer. :func:`dinov2_view_encoder` builds a small random-init ``transformers``
``Dinov2Model`` (patch 8) over the view's image and Plücker-ray channels, used by
``FlexibleViewReconstructor(encoder="dinov2")``. Needs the ``hf`` extra.
"""

from __future__ import annotations

from torch import Tensor, nn

try:
    import transformers
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "Flex3D's DINOv2 view tokeniser needs transformers: pip install 'icml25-generative-models[hf]'"
    ) from exc

__all__ = ["DinoViewTokens", "dinov2_view_encoder"]


class DinoViewTokens(nn.Module):
    """Wraps a ``transformers.Dinov2Model``: views ``(M, C, S, S)`` -> tokens ``(M, 1 + (S/8)², dim)``
    (the CLS token and the patch tokens of the last hidden state)."""

    def __init__(self, model: transformers.Dinov2Model):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(pixel_values=x).last_hidden_state


def dinov2_view_encoder(
    dim: int, img_size: int, n_channels: int = 9, heads: int = 4, depth: int = 2
) -> DinoViewTokens:
    """A random-init ``Dinov2Model`` of width ``dim``, ``depth`` layers, patch 8 on ``img_size`` images with
    ``n_channels`` input channels (RGB + 6 Plücker), wrapped as :class:`DinoViewTokens`."""
    config = transformers.Dinov2Config(
        hidden_size=dim,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        intermediate_size=2 * dim,
        image_size=img_size,
        patch_size=8,
        num_channels=n_channels,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    )
    return DinoViewTokens(transformers.Dinov2Model(config))
