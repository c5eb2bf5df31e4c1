"""The shared random-init Llama builder (icml25.interpretability.common.llama) and its three callers."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import icml25.interpretability as ip
from icml25.interpretability.common.llama import random_llama


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(b), strict=True))


def test_seeded_weights_are_reproducible_and_leave_the_global_stream_alone() -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b = random_llama(32, 16, 1, 2, seed=5), random_llama(32, 16, 1, 2, seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    assert _same(a, b)
    assert not _same(a, random_llama(32, 16, 1, 2, seed=6))


def test_seed_none_draws_from_and_advances_the_callers_stream() -> None:
    torch.manual_seed(5)
    a = random_llama(32, 16, 1, 2, seed=None)
    after_a = torch.get_rng_state()
    assert _same(a, random_llama(32, 16, 1, 2, seed=5))  # the same draws as seeding 5 inside
    b = random_llama(32, 16, 1, 2, seed=None)
    assert not torch.equal(after_a, torch.get_rng_state()) and not _same(a, b)


def test_config_fields_pass_through_and_the_callers_keep_their_models() -> None:
    m = random_llama(32, 16, 2, 2, max_position_embeddings=99, rope_theta=500.0, tie_word_embeddings=False)
    cfg = m.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size) == (32, 16, 32)
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 2, 2)
    assert cfg.max_position_embeddings == 99 and m.lm_head.weight is not m.model.embed_tokens.weight
    assert m.training
    tiny = ip.tiny_llama(vocab_size=32, n_layers=1, n_heads=2, d_model=16)
    assert not tiny.training and tiny.config._attn_implementation == "eager"
    pft = ip.pft_llama(25, hidden_size=16, n_layers=1, n_heads=2, rope_theta=77.0)
    assert pft.config.bos_token_id is None and pft.config.pad_token_id == 0
    assert pft.lm_head.weight is not pft.model.embed_tokens.weight
    toy = ip.ToyVLM(1, 16, 2, seed=0)
    assert toy.config is toy.language_model.config and toy.config.max_position_embeddings == 64


def test_bad_sizes_name_the_callers_argument() -> None:
    with pytest.raises(ValueError, match=r"hidden_size must be a multiple of 2 \* n_heads = 4, got 6"):
        random_llama(32, 6, 1, 2)
    with pytest.raises(ValueError, match=r"d_model must be a multiple of 2 \* n_heads = 8, got 12"):
        ip.tiny_llama(vocab_size=32, n_layers=1, n_heads=4, d_model=12)
    with pytest.raises(ValueError, match=r"d_model must be an int >= 1, got 0"):
        ip.ToyVLM(1, 0, 2)
    with pytest.raises(ValueError, match=r"n_layers must be an int >= 1, got 0"):
        ip.pft_llama(25, n_layers=0)
    with pytest.raises(ValueError, match=r"rope_theta must be a finite float in \(1, inf\), got 1.0"):
        ip.pft_llama(25, rope_theta=1.0)
    with pytest.raises(TypeError, match=r"vocab_size must be an int"):
        random_llama(32.0, 16, 1, 2)
