"""The KV-cache calls that differ between transformers versions, shared by every paper that decodes with a
cache, in any area.

transformers renamed the cache keyword of a causal LM's ``forward`` (``past_key_values`` → ``cache`` in
5.2x) and the meaning of ``Cache.crop``'s argument (the length to keep in 4.x, the tokens to remove, as a
negative number, in 5). RAPID's decoding (P03), PENCIL's generation with reduction (P11), NTPP's speculative
decoding (P24), AQUA-KV's calibration and evaluation passes (P36) and the role-separation generation (P44)
call these instead of either spelling, so one model works with both. Nothing here imports transformers.
"""

from __future__ import annotations

import inspect
from typing import Any

from icml25.kernels.checks import check_int

__all__ = ["cache_argument", "crop_cache", "output_cache"]


def cache_argument(model: Any) -> str:
    """The keyword a transformers model takes its KV cache by: ``cache`` (transformers >= 5.2x) or
    ``past_key_values`` (earlier)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out: Any) -> Any:
    """The KV cache of a transformers model output or ``generate`` result (``cache`` or ``past_key_values``)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def crop_cache(cache: Any, keep: int) -> None:
    """Crop a transformers KV cache in place to its first ``keep`` tokens.

    transformers 5 removes tokens with ``crop(-n)`` (a positive argument raises); 4.x took the length to keep.
    ``keep`` >= the cached length leaves the cache as it is.
    """
    keep = check_int(keep, "keep", low=0)
    cur = int(cache.get_seq_length())
    if keep >= cur:
        return
    params = inspect.signature(cache.crop).parameters
    if "tokens_to_remove" in params:
        cache.crop(-(cur - keep))
    else:  # transformers 4.x: crop(max_length)
        cache.crop(keep)
