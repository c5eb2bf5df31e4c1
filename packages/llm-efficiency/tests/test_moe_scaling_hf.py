"""P09 on transformers models: hf_moe_shape counts the law's N, E, k and total parameters exactly."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from icml25.llm_efficiency.moe_scaling import (  # noqa: E402
    PAPER_COEFFS_UNVERIFIED,
    JointMoEScalingLaw,
    hf_moe_shape,
    total_params,
)

TINY = dict(
    vocab_size=101,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def _mixtral(**kw):
    return transformers.MixtralConfig(
        **{**TINY, "intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2, **kw}
    )


def _qwen2_moe():
    return transformers.Qwen2MoeConfig(
        **TINY,
        intermediate_size=64,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        num_experts=4,
        num_experts_per_tok=2,
    )


def test_mixtral_8x7b_matches_its_published_size() -> None:
    # Mixtral-8x7B: 46.7B parameters in memory, 12.9B used per token (Jiang et al., 2024)
    shape = hf_moe_shape(transformers.MixtralConfig(), include_embeddings=True)
    assert shape.n_total == 46_702_792_704
    assert shape.n_act == pytest.approx(12.9e9, rel=0.005)
    assert (shape.experts, shape.top_k) == (8, 2)
    assert shape.n_embedding == 2 * 32_000 * 4096


def test_tiny_mixtral_counts_by_hand() -> None:
    cfg = _mixtral()
    model = transformers.MixtralForCausalLM(cfg)
    shape = hf_moe_shape(model, include_embeddings=True)
    assert shape.n_total == sum(p.numel() for p in model.parameters())
    d, ff, layers, experts, k = 32, 48, 2, 4, 2
    per_expert = 3 * d * ff  # gate, up, down
    assert shape.n_total - shape.n_act == layers * (experts - k) * per_expert
    assert shape.ffn_fraction * shape.n_act == pytest.approx(layers * k * per_expert)
    # without embeddings: both counts drop by exactly the (untied) input and output embeddings
    bare = hf_moe_shape(model)
    assert shape.n_act - bare.n_act == shape.n_total - bare.n_total == 2 * 101 * 32 == bare.n_embedding


@pytest.mark.parametrize("make", [_mixtral, _qwen2_moe], ids=["mixtral", "qwen2_moe"])
def test_total_params_formula_reproduces_the_count(make) -> None:
    cfg = make()
    shape = hf_moe_shape(cfg)
    assert total_params(shape.n_act, shape.experts, shape.ffn_fraction, shape.top_k) == pytest.approx(
        shape.n_total, rel=1e-12
    )
    # the meta-device build from a config counts what the instantiated model holds
    model_cls = {"mixtral": transformers.MixtralForCausalLM, "qwen2_moe": transformers.Qwen2MoeForCausalLM}
    assert hf_moe_shape(model_cls[cfg.model_type](cfg)) == shape


def test_shared_expert_is_active_for_every_token() -> None:
    shape = hf_moe_shape(_qwen2_moe())
    d, routed_ff, layers, experts, k = 32, 16, 2, 4, 2
    assert shape.n_total - shape.n_act == layers * (experts - k) * 3 * d * routed_ff


def test_dense_model_is_one_expert_and_tied_embeddings_count_once() -> None:
    cfg = transformers.LlamaConfig(**TINY, intermediate_size=64, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg)
    shape = hf_moe_shape(model, include_embeddings=True)
    assert (shape.experts, shape.top_k, shape.ffn_fraction) == (1, 1, 0.0)
    assert shape.n_act == shape.n_total == sum(p.numel() for p in model.parameters())
    assert shape.n_embedding == 101 * 32


def test_law_reads_a_user_model() -> None:
    law = JointMoEScalingLaw(PAPER_COEFFS_UNVERIFIED)
    moe, dense = hf_moe_shape(transformers.MixtralConfig()), hf_moe_shape(transformers.MistralConfig())
    assert dense.experts == 1 and moe.experts == 8
    # same active size and data: the law predicts the MoE lower (E-hat > 1 with the shipped signs)
    assert law.loss(dense.n_act, 1e12, moe.experts) < law.loss(dense.n_act, 1e12, dense.experts)


def test_bad_inputs() -> None:
    with pytest.raises(TypeError, match="model_or_config must be a transformers PreTrainedModel"):
        hf_moe_shape({"num_local_experts": 8})
    with pytest.raises(TypeError, match="include_embeddings must be a bool"):
        hf_moe_shape(_mixtral(), include_embeddings="yes")
    with pytest.raises(ValueError, match="num_experts_per_tok = 5 exceeds the expert count 4"):
        hf_moe_shape(_mixtral(num_experts_per_tok=5))
