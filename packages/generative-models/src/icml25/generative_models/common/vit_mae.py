"""Image masked autoencoders from ``transformers`` for the vision-model forecasters: a small random ViT-MAE, a local pretrained one.

VisionTS (P25) forecasts with a frozen or fine-tuned image MAE and VIMTS (P35) adapts one to irregular
multivariate series; both take any ``transformers`` ``ViTMAEForPreTraining``. :func:`small_vit_mae` builds a
randomly initialised one of CPU size for the reproductions and tests, :func:`load_vit_mae` reads a
pretrained one (e.g. a saved ``facebook/vit-mae-base``) from a local directory: nothing downloads.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from icml25.kernels.checks import check_int
from icml25.kernels.rng import isolated_rng

__all__ = ["load_vit_mae", "small_vit_mae"]


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - the [hf] extra
        raise ImportError(
            "the ViTMAE helpers need transformers: pip install 'icml25-generative-models[hf]' "
            "(or pip install transformers)"
        ) from exc
    return transformers


def small_vit_mae(
    image_size: int = 64,
    patch_size: int = 8,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    decoder_hidden_size: int = 64,
    decoder_layers: int = 2,
    mask_ratio: float = 0.75,
    seed: int = 0,
) -> nn.Module:
    """A randomly initialised ``transformers`` ``ViTMAEForPreTraining`` (3 channels, no ``norm_pix_loss``)."""
    tf = _transformers()
    cfg = tf.ViTMAEConfig(
        image_size=check_int(image_size, "image_size", low=1), patch_size=check_int(patch_size, "patch_size", low=1),
        num_channels=3, hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
        intermediate_size=4 * hidden_size, decoder_hidden_size=decoder_hidden_size,
        decoder_num_hidden_layers=decoder_layers, decoder_num_attention_heads=num_heads,
        decoder_intermediate_size=4 * decoder_hidden_size, mask_ratio=mask_ratio, norm_pix_loss=False,
    )  # fmt: skip
    with isolated_rng(seed):
        return tf.ViTMAEForPreTraining(cfg).eval()


def load_vit_mae(path: str) -> nn.Module:
    """A pretrained ``ViTMAEForPreTraining`` from a local directory (e.g. a saved ``facebook/vit-mae-base``)."""
    if not isinstance(path, str):
        raise TypeError(f"path must be a str naming a local model directory, got {type(path).__name__}")
    return _transformers().ViTMAEForPreTraining.from_pretrained(path).eval()
