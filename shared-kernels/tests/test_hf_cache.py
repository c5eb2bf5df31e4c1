"""icml25.kernels.hf_cache: the transformers-version shims for the KV-cache keyword, output and crop.

The real transformers models are exercised where the papers use them (PENCIL's crop-and-re-encode test,
RAPID, NTPP, AQUA-KV, role separation); here both spellings of each call are checked with stand-ins that
have exactly the two signatures, so each branch is tested whichever transformers is installed.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from icml25.kernels.hf_cache import cache_argument, crop_cache, output_cache


class _NewModel:  # transformers >= 5.2x
    def forward(self, input_ids, cache=None, use_cache=True):
        return None


class _OldModel:  # transformers 4.x and early 5
    def forward(self, input_ids, past_key_values=None, use_cache=True):
        return None


class _Cache:
    """A cache of ``n`` tokens whose ``crop`` takes the length to keep (4.x) or the tokens to remove (5)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def get_seq_length(self) -> int:
        return self.n


class _Cache4(_Cache):
    def crop(self, max_length: int) -> None:
        assert max_length >= 0
        self.n = max_length


class _Cache5(_Cache):
    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove >= 0:
            raise ValueError("transformers 5 removes tokens with a negative argument")
        self.n += tokens_to_remove


def test_cache_argument_follows_the_forward_signature() -> None:
    assert cache_argument(_NewModel()) == "cache"
    assert cache_argument(_OldModel()) == "past_key_values"
    assert cache_argument(object()) == "past_key_values"  # no forward: the long-standing spelling


def test_output_cache_reads_either_attribute() -> None:
    c = object()
    assert output_cache(SimpleNamespace(cache=c)) is c
    assert output_cache(SimpleNamespace(past_key_values=c)) is c
    assert output_cache(SimpleNamespace(cache=None, past_key_values=c)) is c
    assert output_cache(SimpleNamespace()) is None


@pytest.mark.parametrize("cls", [_Cache4, _Cache5])
@pytest.mark.parametrize(("keep", "left"), [(0, 0), (3, 3), (10, 10), (12, 10)])
def test_crop_cache_keeps_the_first_tokens_in_both_conventions(
    cls: type[_Cache], keep: int, left: int
) -> None:
    cache = cls(10)
    crop_cache(cache, keep)
    assert cache.get_seq_length() == left


@pytest.mark.parametrize(
    ("keep", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError), (None, TypeError)]
)
def test_crop_cache_rejects_a_bad_keep_and_leaves_the_cache(keep: object, error: type[Exception]) -> None:
    cache = _Cache5(10)
    with pytest.raises(error, match="keep must be an int"):
        crop_cache(cache, keep)  # type: ignore[arg-type]
    assert cache.get_seq_length() == 10
