"""Tests of icml25.llm_efficiency.meap (MEAP, ICML 2025, P04): masking counts and exclusions, the
pre-training loss, the SFT masked copy, the tokenizer helper, attention statistics, bad inputs, the
transformers integration (a real Trainer on a tiny random-init Llama, an offline tokenizer) and the quick
reproduction's gate with broken variants that must fail it."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.kernels.experiment import torch_threads
from icml25.llm_efficiency.experiments import meap as experiment
from icml25.llm_efficiency.meap import (
    MEAPCollator,
    MEAPSFTCollator,
    add_mask_token,
    causal_lm_loss,
    mask_hf_batch,
    meap_attention_stats,
    meap_mask_inputs,
    meap_pretrain_loss,
)

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

MASK = 30


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


def _ids(b: int = 4, t: int = 20, seed: int = 0, vocab: int = 30) -> torch.Tensor:
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


def _llama(vocab: int = 31, seed: int = 0):
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def _tokenizer():
    """A word-level fast tokenizer built offline (nothing downloads)."""
    words = ["[PAD]", "[BOS]", "[EOS]"] + [f"w{i}" for i in range(27)]
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[PAD]")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]"
    )


# ------------------------------------------------------------------------------------------- masking
def test_ratio_zero_leaves_inputs_unchanged_and_loss_is_plain_causal_lm_loss():
    ids = _ids()
    masked, pos = meap_mask_inputs(ids, MASK, 0.0, seed=0)
    assert torch.equal(masked, ids) and not pos.any()
    model = _llama()
    loss = meap_pretrain_loss(model, ids, mask_id=MASK, ratio=0.0, seed=0)
    assert torch.equal(loss, model(input_ids=ids, labels=ids).loss)


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 5),
    t=st.integers(2, 40),
    ratio=st.floats(0.05, 0.95),
    shared=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_exact_count_in_range_and_only_mask_token_written(b, t, ratio, shared, seed):
    ids = _ids(b, t, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        masked, pos = meap_mask_inputs(ids, MASK, ratio, shared_across_batch=shared, seed=seed)
    want = min(max(1, math.floor(t * ratio + 1e-9)), t - 1)
    assert (pos.sum(1) == want).all()
    assert not pos[:, t - 1].any()  # drawn from [0, T-2]
    assert (masked[pos] == MASK).all() and torch.equal(masked[~pos], ids[~pos])
    if shared:
        assert (pos == pos[:1]).all()


def test_padding_and_protected_positions_are_never_masked():
    ids = _ids(3, 24)
    att = torch.ones_like(ids)
    att[1, 15:] = 0
    att[2, 5:] = 0
    protect = torch.zeros_like(ids, dtype=torch.bool)
    protect[:, :3] = True
    _, pos = meap_mask_inputs(ids, MASK, 0.5, protect=protect, attention_mask=att, seed=1)
    assert not (pos & (att == 0)).any() and not (pos & protect).any()
    assert pos.sum(1).tolist() == [
        12,
        7,
        1,
    ]  # floor(n * 0.5) within the free [3, n-2] range: 24→12, 15→7, 5→1 (clipped)
    assert not pos[1, 14] and not pos[2, 4]  # each row's last real token is excluded


def test_same_generator_state_same_mask_and_fresh_draws_differ():
    ids = _ids(4, 30)
    a = meap_mask_inputs(ids, MASK, 0.2, generator=torch.Generator().manual_seed(7))[1]
    b = meap_mask_inputs(ids, MASK, 0.2, generator=torch.Generator().manual_seed(7))[1]
    assert torch.equal(a, b)
    g = torch.Generator().manual_seed(7)
    c1 = meap_mask_inputs(ids, MASK, 0.2, generator=g)[1]
    c2 = meap_mask_inputs(ids, MASK, 0.2, generator=g)[1]
    assert not torch.equal(c1, c2)


def test_hf_batch_masks_the_official_block_and_keeps_labels():
    # L = T + 1 = 21: positions drawn from [0, T-2] = [0, 18]; count floor(20 * 0.15) = 3
    ids = _ids(8, 21)
    _, pos = mask_hf_batch(ids, MASK, 0.15, seed=3)
    assert (pos.sum(1) == 3).all() and not pos[:, 19:].any()
    batch = MEAPCollator(mask_id=MASK, ratio=0.15, seed=3)([{"input_ids": r} for r in ids.tolist()])
    assert torch.equal(batch["labels"], ids) and not (batch["labels"] == MASK).any()
    assert ((batch["input_ids"] == MASK).sum(1) == 3).all()


def test_pretrain_loss_is_ce_on_unmasked_targets_with_corrupted_inputs():
    model = _llama()
    ids = _ids(2, 16)
    loss = meap_pretrain_loss(model, ids, mask_id=MASK, ratio=0.25, seed=5)
    masked, _ = mask_hf_batch(ids, MASK, 0.25, seed=5)
    logits = model(input_ids=masked).logits
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 31), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, ref)
    assert torch.equal(causal_lm_loss(logits, ids), model(input_ids=masked, labels=ids).loss)


# ------------------------------------------------------------------------------------------------- SFT
def test_sft_masked_copy_labels_only_at_masked_answer_positions():
    prompt, answer = list(range(3, 13)), [(i % 20) + 3 for i in range(60)]
    coll = MEAPSFTCollator(mask_id=MASK, eos_id=2, pad_id=0, ratio=0.1, seed=0)
    out = coll([{"prompt_ids": prompt, "answer_ids": answer}])
    assert out["input_ids"].shape == (2, 71)
    ids, lab = out["input_ids"], out["labels"]
    assert lab[0].tolist() == [-100] * 10 + answer + [2] and ids[0].tolist() == prompt + answer + [2]
    m = ids[1] == MASK
    assert int(m.sum()) == 6 and not m[:10].any() and not m[-1]  # floor(60 * 0.1); prompt and EOS kept
    assert ids[1, :10].tolist() == prompt
    full = prompt + answer + [2]
    assert lab[1][m].tolist() == [full[i] for i in torch.nonzero(m).flatten().tolist()]
    assert (lab[1][~m] == -100).all()


def test_sft_short_answers_get_no_copy_and_concat_joins_rows():
    coll = MEAPSFTCollator(mask_id=MASK, eos_id=2, pad_id=0)
    out = coll([{"prompt_ids": [3, 4], "answer_ids": [5] * 50}])  # exactly 50 tokens: no copy
    assert out["input_ids"].shape[0] == 1
    cat = MEAPSFTCollator(mask_id=MASK, eos_id=2, pad_id=0, concat=True)
    out = cat([{"prompt_ids": [3, 4], "answer_ids": [5] * 51}, {"prompt_ids": [3], "answer_ids": [6]}])
    assert out["input_ids"].shape == (2, 108) and int((out["input_ids"][0] == MASK).sum()) == 5
    assert out["labels"][1, 3:].eq(-100).all() and out["attention_mask"][1].sum() == 3


def test_sft_prompt_filling_max_length_is_skipped_and_counted():
    coll = MEAPSFTCollator(mask_id=MASK, eos_id=2, pad_id=0, max_length=8)
    out = coll(
        [{"prompt_ids": [3] * 8, "answer_ids": [4, 5]}, {"prompt_ids": [3] * 3, "answer_ids": [4] * 9}]
    )
    assert coll.n_skipped == 1 and out["input_ids"].shape == (1, 8)
    assert out["input_ids"][0, -1] == 2  # truncated as the official code: ... + [EOS]
    with pytest.raises(ValueError, match="max_length"):
        coll([{"prompt_ids": [3] * 9, "answer_ids": [4]}])
    assert coll.n_skipped == 2


# ------------------------------------------------------------------------------- tokenizer, inference
def test_add_mask_token_grows_vocabulary_and_embeddings_by_one():
    tok = _tokenizer()
    model = _llama(vocab=len(tok))
    before = model.get_input_embeddings().weight.shape[0]
    mid = add_mask_token(tok, model)
    assert tok.mask_token == "[MASK]" and tok.convert_tokens_to_ids("[MASK]") == mid == 30
    assert model.get_input_embeddings().weight.shape[0] == before + 1
    assert model.get_output_embeddings().weight.shape[0] == before + 1
    assert add_mask_token(tok, model) == mid and model.get_input_embeddings().weight.shape[0] == before + 1


def test_generate_never_sees_mask():
    model = _llama().eval()
    seen = []
    model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].clone()))
    out = model.generate(
        torch.tensor([[1, 5, 6, 7]]), max_new_tokens=5, do_sample=False, bad_words_ids=[[MASK]]
    )
    assert seen and not any((s == MASK).any() for s in seen) and not (out == MASK).any()
    coll = MEAPCollator(mask_id=MASK, ratio=0.5)
    coll.apply_mask = False
    assert not (coll([[1, 5, 6, 7, 8]])["input_ids"] == MASK).any()


def test_attention_stats_match_brute_force_and_drop_masked_keys():
    model = _llama()
    model.set_attn_implementation("eager")
    ids = _ids(2, 12)
    ids[:, 3] = MASK
    q = torch.tensor([11, 8])
    stats = meap_attention_stats(model, ids, mask_id=MASK, query_positions=q)
    attn = model(input_ids=ids, output_attentions=True).attentions
    ent = torch.zeros(2, 2)
    for layer in range(2):
        for h in range(2):
            vals = []
            for b in range(2):
                p = attn[layer][b, h, q[b], : q[b] + 1].clone()
                p[3] = 0
                p = p / p.sum()
                vals.append(-(p[p > 0] * p[p > 0].log()).sum())
            ent[layer, h] = torch.stack(vals).mean()
    torch.testing.assert_close(stats["entropy"], ent)
    assert float(stats["n_keys"]) == pytest.approx((11 + 8) / 2)
    assert (stats["variance"] >= 0).all()


# -------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5, float("nan")])
def test_bad_ratio_raises_naming_it(ratio):
    with pytest.raises(ValueError, match="ratio"):
        meap_mask_inputs(_ids(), MASK, ratio)
    with pytest.raises(ValueError, match="ratio"):
        MEAPCollator(mask_id=MASK, ratio=ratio)


def test_tiny_ratio_warns_and_masks_one_token():
    with pytest.warns(UserWarning, match=r"ratio \* T < 1"):
        _, pos = meap_mask_inputs(_ids(2, 10), MASK, 0.05, seed=0)
    assert (pos.sum(1) == 1).all()


def test_mask_id_outside_vocabulary_or_missing_mask_token_raises_with_hint():
    with pytest.raises(ValueError, match=r"mask_id.*add_mask_token"):
        meap_pretrain_loss(_llama(vocab=30), _ids(), mask_id=30)
    with pytest.raises(ValueError, match=r"mask_id.*add_mask_token"):
        meap_mask_inputs(_ids(), 40, vocab_size=31)
    with pytest.raises(ValueError, match=r"mask token.*add_mask_token"):
        MEAPCollator(_tokenizer())
    with pytest.raises(ValueError, match=r"mask token.*add_mask_token"):
        MEAPSFTCollator(_tokenizer())


def test_protect_or_attention_mask_shape_mismatch_raises():
    with pytest.raises(ValueError, match="protect"):
        meap_mask_inputs(_ids(4, 20), MASK, protect=torch.zeros(4, 19, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_mask"):
        meap_mask_inputs(_ids(4, 20), MASK, attention_mask=torch.ones(3, 20, dtype=torch.long))


# ----------------------------------------------------------------------------- transformers integration
def test_collator_in_a_real_trainer_on_a_tiny_llama(tmp_path):
    tok = _tokenizer()
    model = _llama(vocab=len(tok))
    add_mask_token(tok, model)
    texts = [" ".join(f"w{(i * 7 + j) % 27}" for j in range(5 + i % 6)) for i in range(16)]
    train = [{"input_ids": tok("[BOS] " + t)["input_ids"]} for t in texts]
    coll = MEAPCollator(tok, ratio=0.3, seed=0)
    calls = []

    def spy(features):
        batch = coll(features)
        calls.append(batch)
        return batch

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train, data_collator=spy)
    result = trainer.train()
    assert result.global_step == 3 and math.isfinite(result.training_loss)
    b = calls[0]
    assert (b["input_ids"] == tok.mask_token_id).any() and not (b["labels"] == tok.mask_token_id).any()
    pad = b["attention_mask"] == 0
    assert (b["labels"][pad] == -100).all() and (b["input_ids"][pad] == tok.pad_token_id).all()
    assert not (b["input_ids"][:, 0] == tok.mask_token_id).any()  # BOS protected
    sft = MEAPSFTCollator(tok)([{"prompt": "[BOS] w1 w2", "answer": " ".join(["w3"] * 60)}])
    assert sft["input_ids"].shape[0] == 2 and int((sft["input_ids"][1] == tok.mask_token_id).sum()) == 6


# ------------------------------------------------------------------------------------ the reproduction
DIRECTION = "MEAP accuracy > NTP accuracy"
MARGIN = "MEAP accuracy >= NTP accuracy + 0.05"
NLL = "MEAP filler NLL <= 1.05 x NTP filler NLL"


def test_quick_reproduction_is_the_recorded_known_miss():
    """NTP learns the lookup (the run is conclusive); MEAP does not beat it, as the catalog records, while
    the mechanics hold. The no-harm NLL bar is not asserted either way: on seeds 0-4 with
    ``ATEN_CPU_CAPABILITY=default`` MEAP's filler NLL is 0.95-1.08 x NTP's, and misses the 1.05 bar on seeds
    1 and 2 (issue 77: a known-miss gate asserts the claim's check, not the exact set that fails)."""
    report = experiment.run(quick=True, seed=0)
    assert not report.inconclusive, report.failed_preconditions
    assert report.metrics["baseline_ntp_accuracy_min_seed"] >= 2 / 16
    assert report.passed is False
    assert DIRECTION in report.failed_checks
    assert set(report.failed_checks) <= {DIRECTION, NLL}, report.failed_checks


def test_quick_gate_fails_when_labels_are_masked_too():
    """The broken variant (``[MASK]`` written into the labels too) also fails the no-harm NLL bar."""
    report = experiment.run(quick=True, seed=0, _mask_labels=True)
    assert not report.passed
    assert NLL in report.failed_checks


@pytest.mark.slow
def test_quick_gate_fails_with_mask_rate_zero():
    """Masking nothing makes the MEAP arm the NTP arm: a tie, not MEAP ahead."""
    report = experiment.run(quick=True, seed=0, _meap_ratio=0.0)
    assert report.metrics["meap_accuracy"] == report.metrics["baseline_ntp_accuracy"]
    assert DIRECTION in report.failed_checks


@pytest.mark.slow
def test_full_reproduction_is_the_recorded_known_miss():
    """The catalog records a conclusive full-mode miss: NTP learns the lookup on every seed, MEAP does not
    lead it by 5 points, filler NLL holds."""
    report = experiment.run(quick=False, seed=0)
    assert not report.inconclusive, report.failed_preconditions
    assert report.failed_checks == [MARGIN]
