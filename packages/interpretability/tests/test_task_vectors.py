"""P00 cross-modal task vectors: exact checks of extraction and patching on tiny transformers models
(own-state patch is the identity, a last-layer patch moves the next-token distribution, prefill-only editing
under ``generate``), delimiter positions with padding and offsets, the layer resolver on offline VLM configs,
the bad inputs, the toy VLM's bottleneck mask, and the quick reproduction's verdict with its broken variant."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.interpretability import task_vectors as tv
from icml25.interpretability import task_vectors_toy as tvt
from icml25.interpretability.experiments import task_vectors as exp
from icml25.interpretability.icl_heads import tiny_llama
from icml25.kernels.experiment import seed_everything, torch_threads


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return tiny_llama(vocab_size=40, n_layers=3, n_heads=4, d_model=32, seed=0)


def _ids(B: int = 2, T: int = 9, seed: int = 0) -> torch.Tensor:
    return torch.randint(2, 40, (B, T), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- layer resolution
def test_decoder_layers_resolve_llama_gpt2_llava_idefics2_and_a_language_model_wrapper(llama) -> None:
    from transformers import (
        CLIPVisionConfig,
        GPT2Config,
        GPT2LMHeadModel,
        Idefics2Config,
        Idefics2ForConditionalGeneration,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    assert tv.decoder_layers(llama) == list(llama.model.layers)
    text = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    with torch.device("meta"):
        gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=16, n_head=2, vocab_size=50))
        vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, image_size=28, patch_size=14)  # fmt: skip
        llava = LlavaForConditionalGeneration(
            LlavaConfig(vision_config=vision, text_config=text, image_token_index=60)
        )
        idefics = Idefics2ForConditionalGeneration(
            Idefics2Config(
                text_config=text.to_dict(),
                vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
                perceiver_config={"hidden_size": 16, "resampler_n_latents": 4, "resampler_depth": 1,
                                  "resampler_n_heads": 2, "resampler_head_dim": 8, "num_key_value_heads": 2},
                image_token_id=60,
            )
        )  # fmt: skip
    assert tv.decoder_layers(gpt2) == list(gpt2.transformer.h)
    assert tv.decoder_layers(llava) == list(llava.model.language_model.layers)
    assert tv.decoder_layers(idefics) == list(idefics.model.text_model.layers)
    assert len(tv.decoder_layers(llava)) == 2 and tv._hidden_size(llava) == 16  # the text config's width
    toy = tvt.ToyVLM(2, 16, 2, seed=0)
    assert tv.decoder_layers(toy) == list(toy.language_model.model.layers)
    with pytest.raises(TypeError, match="no resolvable decoder layers"):
        tv.decoder_layers(torch.nn.Linear(3, 3))
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        tv.decoder_layers("llama")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- patching (exact)
@settings(max_examples=12, deadline=None)
@given(layer=st.integers(0, 2), pos=st.integers(0, 8), seed=st.integers(0, 10))
def test_patching_a_prompts_own_state_reproduces_its_logits_exactly(llama, layer, pos, seed) -> None:
    ids = _ids(seed=seed)
    with torch.no_grad():
        ref = llama(input_ids=ids).logits
        own = tv.extract_task_vectors(llama, {"input_ids": ids}, layers=[layer], position=pos, keep_all=True)
        with tv.patch_task_vector(llama, own[:, 0], layer, pos) as h:
            out = llama(input_ids=ids).logits
        assert h.edits == 1
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
        # a different vector changes exactly the positions >= pos (causality), nothing before
        with tv.patch_task_vector(llama, own[:, 0] + 1.0, layer, pos):
            moved = llama(input_ids=ids).logits
    assert torch.equal(moved[:, :pos], ref[:, :pos])
    assert float((moved[:, pos] - ref[:, pos]).abs().max()) > 1e-4


def test_last_layer_patch_gives_the_source_next_token_distribution(llama) -> None:
    src, tgt = _ids(1, 7, seed=1), _ids(3, 9, seed=2)
    with torch.no_grad():
        h = tv.extract_task_vectors(llama, {"input_ids": src}, layers=[2], position=-1)[0]
        src_logits = llama(input_ids=src).logits[0, -1]
        with tv.patch_task_vector(llama, h, 2, 4):
            out = llama(input_ids=tgt).logits
    for b in range(3):  # the final norm and head are shared: the patched position predicts as the source
        torch.testing.assert_close(out[b, 4], src_logits, atol=1e-5, rtol=1e-5)


def test_replace_not_add_and_per_prompt_vectors(llama) -> None:
    ids = _ids(2, 6, seed=3)
    v = torch.randn(2, 32, generator=torch.Generator().manual_seed(0))
    got = {}

    def rec(_m, _a, out):
        got["h"] = (out[0] if isinstance(out, tuple) else out).detach()

    with torch.no_grad(), tv.patch_task_vector(llama, v, 1, torch.tensor([2, 4])):
        handle = llama.model.layers[1].register_forward_hook(rec)  # runs after the patch hook
        llama(input_ids=ids)
        handle.remove()
    assert torch.equal(got["h"][0, 2], v[0]) and torch.equal(got["h"][1, 4], v[1])


def test_generate_is_edited_in_prefill_only(llama) -> None:
    ids = _ids(1, 6, seed=4)
    v = torch.randn(32, generator=torch.Generator().manual_seed(1)) * 5
    with torch.no_grad():
        with tv.patch_task_vector(llama, v, 0, -1) as h:
            out = llama.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=1, eos_token_id=None)
        assert (h.calls, h.edits) == (4, 1)  # prefill + 3 cached one-token decode steps; only prefill edited
        with tv.patch_task_vector(llama, v, 0, -1):
            first = llama(input_ids=ids).logits[0, -1].argmax()
        plain = llama.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=1, eos_token_id=None)
    assert int(out[0, 6]) == int(first)
    assert not torch.equal(out, plain)


# ----------------------------------------------------------------------------- positions
def test_find_delimiter_positions_hand_tokenized_with_padding_offset_and_multi_token() -> None:
    # vocabulary: 0 pad, 5 "Q", 6 ":", 7 "A", 9.. content; "Q:x\nA:y\n\nQ:x\nA:"
    row = [5, 6, 10, 7, 6, 11, 5, 6, 12, 7, 6]
    right = torch.tensor([row, row[:6] + [0] * 5])
    mask_r = (right != 0).long()
    assert tv.find_delimiter_positions(right, 6, attention_mask=mask_r).tolist() == [10, 4]
    assert tv.find_delimiter_positions(right[:1], 6, which=-3).tolist() == [4]  # the official source position
    assert tv.find_delimiter_positions(right[:1], [7, 6], which=0).tolist() == [4]  # "A:" as two tokens
    left = torch.tensor([row, [0] * 5 + row[:6]])
    assert tv.find_delimiter_positions(left, 6, attention_mask=(left != 0).long()).tolist() == [10, 9]
    assert tv.find_delimiter_positions(right[:1], 6, offset=575).tolist() == [585]  # LLaVA-1.5's 576 patches
    with pytest.raises(ValueError, match="prompt 1 of input_ids has 0 occurrence"):
        tv.find_delimiter_positions(torch.tensor([row, [5, 10, 11] + [0] * 8]), [7, 6], which=-1)
    with pytest.raises(ValueError, match="pad_token_id=0 but no attention_mask"):
        tv.find_delimiter_positions(right, 6, pad_token_id=0)
    # a padded prompt's negative source position counts from its last real token
    batch = {"input_ids": left, "attention_mask": (left != 0).long()}
    assert tv._batch_positions(batch, -1, 2, 11).tolist() == [10, 10]
    batch_r = {"input_ids": right, "attention_mask": mask_r}
    assert tv._batch_positions(batch_r, -2, 2, 11).tolist() == [9, 4]


# ----------------------------------------------------------------------------- extraction, ensemble
def test_extracted_mean_equals_the_manual_mean_of_hidden_states(llama) -> None:
    batches = [{"input_ids": _ids(2, 8, seed=s), "position": torch.tensor([3, 7])} for s in (5, 6)]
    vec = tv.extract_task_vectors(llama, batches)
    allv = tv.extract_task_vectors(llama, batches, keep_all=True)
    assert vec.shape == (3, 32) and allv.shape == (4, 3, 32)
    rows = []
    with torch.no_grad():
        for b in batches:
            hs = llama(input_ids=b["input_ids"], output_hidden_states=True).hidden_states
            rows += [
                torch.stack([hs[layer + 1][i, int(b["position"][i])] for layer in range(2)]) for i in range(2)
            ]
    manual = torch.stack(rows).mean(0)  # hidden_states[l + 1] = output of layer l (the last one is normed)
    torch.testing.assert_close(vec[:2], manual, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(allv.mean(0), vec)
    assert torch.equal(tv.extract_task_vectors(llama, batches, layers=[2, 0]), vec[[2, 0]])


def test_ensemble_identity_and_weights() -> None:
    v, w = torch.randn(3, 8), torch.randn(3, 8)
    assert torch.equal(tv.ensemble(v, v, v), v)
    torch.testing.assert_close(tv.ensemble(v, w), (v + w) / 2)
    torch.testing.assert_close(tv.ensemble(v, w, weights=[3, 1]), 0.75 * v + 0.25 * w)


def test_answer_match_prefix_and_exact() -> None:
    assert tv.answer_match(" Par", "Paris\n") and tv.answer_match("Paris is", "Paris")
    assert not tv.answer_match("", "Paris") and not tv.answer_match("Rome", "Paris")
    assert not tv.answer_match(" Par", "Paris", mode="exact") and tv.answer_match("Paris ", "Paris", "exact")


def test_layer_sweep_and_result_choose_the_validation_layer(llama) -> None:
    ids = _ids(4, 6, seed=7)
    with torch.no_grad():
        src = llama(input_ids=ids).logits[:, -1].argmax(-1)
    vecs = tv.extract_task_vectors(llama, {"input_ids": ids}, position=-1, keep_all=True)
    # patch every prompt's own last-layer state into itself: accuracy against its own prediction is 1
    batch = {"input_ids": ids, "position": torch.full((4,), 5), "labels": src}
    sweep = {layer: tv.patched_accuracy(llama, vecs[:, layer], layer, batch) for layer in range(3)}
    assert sweep == {0: 1.0, 1: 1.0, 2: 1.0}
    res = tv.TaskVectorResult(0.1, None, {0: 0.4, 1: 0.9, 2: 0.9}, {0: 0.95, 1: 0.7, 2: 0.8})
    assert (res.layer, res.patch) == (1, 0.7)  # the best validation layer, never the best test layer
    out = tv.evaluate_task_vectors(llama, vecs.mean(0), batch, batch, prompt_batches=batch)
    assert out.prompt == 1.0 and out.no_context == 1.0 and set(out.test) == {0, 1, 2}


# ----------------------------------------------------------------------------- bad inputs
def test_bad_inputs_raise_naming_the_argument(llama) -> None:
    ids = _ids(2, 5)
    v = torch.zeros(32)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 3\)"):
        with tv.patch_task_vector(llama, v, 3, 0):
            pass
    with pytest.raises(ValueError, match=r"vector must have shape \[d\] or \[B, d\] with d = 32"):
        with tv.patch_task_vector(llama, torch.zeros(16), 0, 0):
            pass
    with pytest.raises(ValueError, match="position must index a sequence of length 5"):
        with tv.patch_task_vector(llama, v, 0, 7):
            llama(input_ids=ids)
    with pytest.raises(ValueError, match="position must lie within the sequence of length 5"):
        with tv.patch_task_vector(llama, v, 0, torch.tensor([1, 9])):
            llama(input_ids=ids)
    with pytest.raises(
        ValueError, match=r"^vector must be finite \(no NaN or inf\), got 32 NaN and 0 inf values"
    ):
        with tv.patch_task_vector(llama, torch.full((32,), float("nan")), 0, 0):
            pass
    with pytest.raises(
        TypeError, match=r"^vector must be a float tensor, got .* dtype torch.int64"
    ):  # shared checks
        with tv.patch_task_vector(llama, torch.zeros(32, dtype=torch.long), 0, 0):
            pass
    with pytest.raises(
        ValueError, match=r"^vector must have 1 or 2 dimension\(s\), got .* shape \(1, 1, 32\)"
    ):
        with tv.patch_task_vector(llama, torch.zeros(1, 1, 32), 0, 0):
            pass
    other = tiny_llama(vocab_size=40, n_layers=2, n_heads=4, d_model=32)
    with pytest.raises(
        ValueError, match=r"share the layer count and hidden size.*3 layers x 32.*2 layers x 32"
    ):
        tv.cross_model_transfer(llama, other, {"input_ids": ids}, position=-1)
    same = tiny_llama(vocab_size=40, n_layers=3, n_heads=4, d_model=32, seed=1)
    assert tv.cross_model_transfer(llama, same, {"input_ids": ids}, position=-1).shape == (3, 32)
    with pytest.raises(ValueError, match="vectors must have shape \\[L, d\\] with L = 3"):
        tv.layer_sweep(llama, torch.zeros(2, 32), {"input_ids": ids, "position": torch.zeros(2)})
    with pytest.raises(ValueError, match="position is None, so each batch must carry a 'position'"):
        tv.extract_task_vectors(llama, {"input_ids": ids})
    with pytest.raises(ValueError, match="weights must be 2 finite non-negative"):
        tv.ensemble(v, v, weights=[1.0, float("nan")])


# ----------------------------------------------------------------------------- toy VLM
def test_bottleneck_mask_matches_the_brute_force_rule() -> None:
    valid = torch.tensor([[False, True, True, True, True, True, True]])  # PAD BOS x y S xq ->
    m = tvt.bottleneck_mask(valid, torch.tensor([4]), torch.tensor([1]))[0, 0] == 0
    for i in range(7):
        for j in range(7):
            if i == 0:
                want = j == 0
            elif i > 4:
                want = j <= i and (j in (1, 4) or j > 4)
            else:
                want = 1 <= j <= i
            assert bool(m[i, j]) == want, (i, j)


def test_toy_data_layout_and_the_image_path_of_the_toy_model() -> None:
    data = tvt.ToyTaskData((0, 3), n_shots=2, seed=0)
    b = data.icl(3, 4, "image", "test", query_modality="text", seed=1)
    assert b["input_ids"].shape == (4, 1 + 8 + 3) and bool((b["position"] == 9).all())
    assert bool((b["input_ids"][:, [1, 5]] == tvt.IMG).all()) and bool(b["image_mask"][:, [1, 5]].all())
    assert torch.equal(b["labels"], 38 + 9 - b["entity"]) and int(b["image_mask"].sum()) == 8
    assert torch.equal(data.relabel(b, 0), 16 + (b["entity"] + 1) % 10)
    toy = tvt.ToyVLM(1, 16, 2, seed=0)
    with torch.no_grad():
        out = toy(**tv._model_inputs(b)).logits
        b2 = dict(b, pixel_values=b["pixel_values"] + 0.5 * b["image_mask"][..., None])
        out2 = toy(**tv._model_inputs(b2)).logits
    # images change the outputs at and after the first image; before it (BOS) nothing changes
    assert torch.equal(out[:, 0], out2[:, 0]) and float((out[:, 1] - out2[:, 1]).abs().max()) > 0
    # the free-attention toy: the same prompts with a plain causal mask, equal to no mask at all
    free_data = tvt.ToyTaskData((0, 3), n_shots=2, seed=0, bottleneck=False)
    free = free_data.icl(3, 4, "image", "test", query_modality="text", seed=1)
    assert torch.equal(free["input_ids"], b["input_ids"])
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    assert torch.equal(free["attention_mask"][:, 0] == 0, causal.expand(4, 12, 12))
    with torch.no_grad():
        plain = toy(**{k: v for k, v in tv._model_inputs(free).items() if k != "attention_mask"}).logits
        torch.testing.assert_close(toy(**tv._model_inputs(free)).logits, plain, atol=1e-5, rtol=1e-5)
    assert float((plain[:, -1] - out[:, -1]).abs().max()) > 1e-4  # the bottleneck hides the demos


# ----------------------------------------------------------------------------- reproduction
@pytest.fixture(scope="module")
def quick_reports():
    seed_everything(0)
    with torch_threads(1):
        good = exp.evaluate(exp.QUICK, 0)
        bad = exp.evaluate(exp.QUICK, 0, broken="position")
    return good, bad


def test_quick_reproduction_passes_and_the_wrong_position_fails(quick_reports) -> None:
    good, bad = quick_reports
    assert good.passed, good.metrics
    m = good.metrics
    assert m["text_patch"] >= m["no_context"] + 0.25 and m["g2_f_b"] >= 0.5
    assert m["layer"] < exp.QUICK.n_layers - 1  # the last layer's output is read by no later position
    # patching the query's final "->" instead of S erases the query entity: (c) and (g2) fail
    assert not bad.passed
    failed = {k for k, ok in bad.checks.items() if not ok}
    assert failed == {"(c) text->image patch >= (a) no context + 0.25", "(g2) ... and f_B >= 0.5"}
    assert bad.metrics["text_patch"] < good.metrics["no_context"]


def test_random_direction_control_patches_norm_matched_random_vectors(monkeypatch) -> None:
    seen = []

    def fake(model, vector, layer, queries):
        seen.append((vector.clone(), layer, queries))
        return 0.25 * len(seen)

    monkeypatch.setattr(exp, "patched_accuracy", fake)
    v = torch.randn(16, generator=torch.Generator().manual_seed(123)) * 7.0
    q = {"input_ids": torch.zeros(2, 3, dtype=torch.long)}
    got = exp.random_direction_accuracy(None, v, 2, q, 4, torch.Generator().manual_seed(0))
    assert got == pytest.approx((0.25 + 0.5 + 0.75 + 1.0) / 4)  # the mean over draws
    assert len(seen) == 4 and all(layer == 2 and queries is q for _, layer, queries in seen)
    for r, _, _ in seen:  # same norm as the task vector, a random direction
        assert float(r.norm()) == pytest.approx(float(v.norm()), rel=1e-5)
        assert abs(float(torch.nn.functional.cosine_similarity(r, v, dim=0))) < 0.9
    assert not torch.equal(seen[0][0], seen[1][0])


@pytest.mark.slow
def test_full_reproduction_passes() -> None:
    """The full run (about 4 min of CPU) passes every check, the (g1) norm-matched random-direction control
    included (recorded in the results ledger)."""
    report = exp.run(quick=False, seed=0)
    assert report.passed, report.checks
