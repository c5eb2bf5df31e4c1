"""P53 DPS: the protocol's call sequence with a scripted client, the partial views, the baselines, the bad
inputs, the learned stand-in and the quick reproduction's recorded verdict."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.interpretability import dps, dps_toy
from icml25.interpretability.experiments import dps as exp
from icml25.kernels.experiment import torch_threads

IMG = np.arange(20 * 16, dtype=np.float32).reshape(20, 16) + 1.0  # no zero pixel: masks are visible


class Scripted:
    """A fake VLM that records every call and answers from a script keyed by the stage it recognises."""

    def __init__(
        self, weak="a cat", desc="a small cat on a mat", judge="no", long_analysis=False, final="cat"
    ):
        self.calls: list[tuple[str, list, list | None]] = []
        self.weak, self.desc, self.judge, self.final = weak, desc, judge, final
        self.long_analysis = long_analysis

    def chat(self, messages, images=None):
        last = messages[-1]["content"]
        if messages[0]["content"].startswith("You see only part"):
            stage = "weak" if len(messages) == 2 else "describe"
        elif last.startswith("Condense"):
            stage = "summary"
        elif last.startswith("Does the following"):
            stage = "judge"
        elif last.startswith("Agents that saw"):
            stage = "supervise"
        elif last.startswith("Based on this analysis"):
            stage = "final"
        elif last.startswith("If the following"):
            stage = "checker"
        else:
            stage = "strong"
        self.calls.append((stage, messages, images))
        return {
            "weak": self.weak,
            "describe": self.desc,
            "summary": "short summary",
            "judge": self.judge,
            "supervise": " ".join(["word"] * 30) if self.long_analysis else "the text misled me",
            "final": self.final,
            "checker": "safe text",
            "strong": "a dog",
        }[stage]


def _cfg(**kw):
    return dps.DPSConfig(views=[dps.CenterCrop(0.5), dps.RandomCrop(0.25, 0.5)], **kw)


# ----------------------------------------------------------------------------- protocol (§7)
def test_call_sequence_counts_and_images() -> None:
    vlm, helper = Scripted(), Scripted()
    tr = dps.dps_answer(vlm, IMG, "What animal is this?", _cfg(), assistant=helper, rng=0)
    k = 2
    assert [c[0] for c in vlm.calls] == ["strong"] + ["weak", "describe"] * k + ["supervise", "final"]
    assert tr.vlm_calls == 1 + 2 * k + 2 == len(vlm.calls)
    # the strong and the final turns carry exactly the full image; weak turns only their view; text turns none
    for stage, _msgs, images in vlm.calls:
        if stage in ("strong", "final"):
            assert len(images) == 1 and images[0] is not None and np.array_equal(images[0], IMG)
        elif stage == "weak":
            assert len(images) == 1 and images[0].shape != IMG.shape
        else:
            assert images is None
    weak_imgs = [c[2][0] for c in vlm.calls if c[0] == "weak"]
    assert np.array_equal(weak_imgs[0], IMG[5:15, 4:12]) and np.array_equal(weak_imgs[0], tr.views[0])
    # the final turn continues the strong conversation: r0 and the analysis are in its history
    final_msgs = vlm.calls[-1][1]
    assert [m["content"] for m in final_msgs if m["role"] == "assistant"] == ["a dog", "the text misled me"]
    assert "agent 1: a cat\nagent 2: a cat" in final_msgs[-3]["content"]
    assert [c[0] for c in helper.calls] == ["judge", "judge"] and tr.text_calls == 2  # all texts <= 20 words
    assert tr.answer == "cat" and tr.checked is None


def test_parallel_weak_agents_give_the_same_trace() -> None:
    cfg = dps.DPSConfig(views=[dps.CenterCrop(0.5), dps.RandomCrop(), dps.RandomCrop(), dps.RandomCrop()])
    a = dps.dps_answer(Scripted(), IMG, "q?", cfg, assistant=Scripted(), rng=3)
    b = dps.dps_answer(Scripted(), IMG, "q?", cfg, assistant=Scripted(), rng=3, max_workers=4)
    assert all(np.array_equal(x, y) for x, y in zip(a.views, b.views, strict=True))
    assert (a.observations, a.final, a.vlm_calls, a.text_calls) == (b.observations, b.final, 1 + 2 * 4 + 2, 4)
    with pytest.raises(ValueError, match="max_workers must be an int >= 1, got 0"):
        dps.dps_answer(Scripted(), IMG, "q?", cfg, max_workers=0)


def test_summaries_iff_longer_than_limit_and_fallback_iff_inability() -> None:
    long_w = " ".join(["maybe"] * 21)
    for weak, judge, expect_obs, n_sum in [
        ("a cat", "no", "a cat", 0),
        (long_w, "no", "short summary", 2),  # 21 words: summarised (per view)
        (" ".join(["x"] * 20), "no", " ".join(["x"] * 20), 0),  # exactly 20: kept
        ("I cannot determine this", "Yes.", "a small cat on a mat", 0),  # inability: the description
    ]:
        helper = Scripted(judge=judge)
        tr = dps.dps_answer(Scripted(weak=weak), IMG, "q?", _cfg(), assistant=helper, rng=1)
        assert tr.observations == [expect_obs] * 2
        assert tr.inability == [judge.lower().startswith("yes")] * 2
        assert sum(c[0] == "summary" for c in helper.calls) == n_sum
    helper = Scripted()
    tr = dps.dps_answer(Scripted(long_analysis=True), IMG, "q?", _cfg(), assistant=helper, rng=1)
    assert tr.analysis_summary == "short summary" and sum(c[0] == "summary" for c in helper.calls) == 1


def test_assistant_defaults_to_the_client_and_safety_checker_runs() -> None:
    vlm = Scripted()
    checker = Scripted()
    tr = dps.dps_answer(vlm, IMG, "q?", _cfg(safety_mode=True, checker=checker), rng=0)
    assert sum(c[0] == "judge" for c in vlm.calls) == 2  # the client doubles as the text assistant
    assert tr.answer == "safe text" and tr.final == "cat" and [c[0] for c in checker.calls] == ["checker"]
    assert vlm.calls[-1][1][-1]["content"].endswith(_cfg().safety_suffix)


def test_box_proposer_view_costs_one_more_call_and_masks_boxes() -> None:
    def fn(messages, images):
        if messages[-1]["content"].startswith("List the bounding"):
            return "text at [0,0, 4 ,3] and ( 10, 12,30,40 )"
        return Scripted().chat(messages, images)

    client = dps.CallableClient(fn)
    cfg = dps.DPSConfig(views=[dps.MaskRegions(dps.vlm_box_proposer(client))])
    tr = dps.dps_answer(client, IMG, "q?", cfg, rng=0)
    v = tr.views[0]
    assert (v[0:3, 0:4] == 0).all() and (v[12:20, 10:16] == 0).all()
    keep = np.ones_like(IMG, dtype=bool)
    keep[0:3, 0:4] = keep[12:20, 10:16] = False
    assert np.array_equal(v[keep], IMG[keep])


# ----------------------------------------------------------------------------- views
def test_center_crop_is_the_numpy_slice_and_mask_keeps_geometry() -> None:
    rgb = np.random.default_rng(0).random((21, 17, 3))
    assert np.array_equal(dps.CenterCrop(0.5).render(rgb), rgb[5:15, 4:12])
    m = dps.CenterCrop(0.5, mode="mask").render(rgb)
    assert m.shape == rgb.shape and np.array_equal(m[5:15, 4:12], rgb[5:15, 4:12])
    assert m.sum() == pytest.approx(rgb[5:15, 4:12].sum())


@settings(max_examples=60, deadline=None)
@given(h=st.integers(4, 200), w=st.integers(4, 200), seed=st.integers(0, 10_000))
def test_random_crop_sides_in_range_and_reproducible(h, w, seed) -> None:
    img = np.ones((h, w))
    v = dps.RandomCrop(0.25, 0.5)
    a = v.render(img, np.random.default_rng(seed))
    assert h / 4 - 1 < a.shape[0] <= h / 2 and w / 4 - 1 < a.shape[1] <= w / 2
    box = v.box(img, np.random.default_rng(seed))
    assert box == v.box(img, np.random.default_rng(seed))
    assert 0 <= box[0] < box[2] <= w and 0 <= box[1] < box[3] <= h


@settings(max_examples=60, deadline=None)
@given(x0=st.integers(-30, 40), y0=st.integers(-30, 40), dx=st.integers(1, 40), dy=st.integers(1, 40))
def test_mask_regions_zeroes_exactly_the_clipped_box(x0, y0, dx, dy) -> None:
    box = (x0, y0, x0 + dx, y0 + dy)
    inside = not (x0 + dx <= 0 or y0 + dy <= 0 or x0 >= 16 or y0 >= 20)
    view = dps.MaskRegions(lambda _img: [box])
    if not inside:
        with pytest.raises(ValueError, match="empty after clipping"):
            view.render(IMG)
        return
    out = view.render(IMG)
    expect = IMG.copy()
    expect[max(y0, 0) : y0 + dy, max(x0, 0) : x0 + dx] = 0
    assert np.array_equal(out, expect)


def test_parse_boxes_any_spacing_and_object_crop() -> None:
    assert dps.parse_boxes("a [1,2,3,4] b [ 5.5 , 6,7 , 8 ] c (9, 10, 11, 12)") == [
        (1, 2, 3, 4), (5.5, 6, 7, 8), (9, 10, 11, 12),
    ]  # fmt: skip
    assert dps.parse_boxes("no boxes [1, 2]") == []
    crop = dps.ObjectCrop(lambda _img: [(2, 3, 10, 9)]).render(IMG)
    assert np.array_equal(crop, IMG[3:9, 2:10])


# ----------------------------------------------------------------------------- baselines
def test_smooth_vote_crop_vote_and_asr_exact() -> None:
    calls = []

    def predict(im):
        calls.append(im.copy())
        return int(im.sum() > IMG.sum() * 0.5)

    assert dps.smooth_vote(predict, IMG, n_copies=10, frac=0.0, rng=0) == 1
    assert len(calls) == 10 and all(np.array_equal(c, IMG) for c in calls)
    calls.clear()
    dps.smooth_vote(predict, IMG, n_copies=3, frac=0.2, rng=0)
    zeroed = [float((c == 0).mean()) for c in calls]
    assert all(0.1 < z < 0.3 for z in zeroed)
    # ties go to the first view's answer
    answers = iter(["b", "a"])
    views = [dps.CenterCrop(0.5), dps.CenterCrop(0.9)]
    assert dps.crop_vote(lambda _im: next(answers), IMG, views) == "b"
    answers = iter(["b", "a", "a"])
    assert dps.crop_vote(lambda _im: next(answers), IMG, [*views, dps.CenterCrop(0.3)]) == "a"
    assert dps.attack_success_rate([1, 2, 3, 4], [1, 0, 3, 0]) == 0.5


def test_batched_smooth_predictions_match_the_library_vote() -> None:
    model = dps_toy.HintCNN(width=8, seed=0).eval()
    x = torch.rand(3, 24, 24, generator=torch.Generator().manual_seed(0))
    batched = exp.smooth_predictions(model, x, np.random.default_rng(5)).tolist()
    rng = np.random.default_rng(5)
    with torch.no_grad():
        lib = [
            dps.smooth_vote(lambda im: int(model(torch.as_tensor(im)[None]).argmax()), x[i].numpy(), rng=rng)
            for i in range(3)
        ]
    assert batched == lib


# ----------------------------------------------------------------------------- bad inputs (§8)
def test_bad_inputs_raise_clear_errors() -> None:
    vlm = Scripted()
    with pytest.raises(ValueError, match="question must be a non-empty string"):
        dps.dps_answer(vlm, IMG, "  ", _cfg())
    with pytest.raises(ValueError, match=r"image must be at least 2x2 pixels, got shape \(1, 5\)"):
        dps.dps_answer(vlm, np.ones((1, 5)), "q?", _cfg())
    with pytest.raises(TypeError, match="image must be a PIL image or an array"):
        dps.dps_answer(vlm, "cat.png", "q?", _cfg())
    with pytest.raises(ValueError, match=r"x0 <= x1 and y0 <= y1, got inverted box \(5, 0, 2, 4\)"):
        dps.clip_box((5, 0, 2, 4), 10, 10)
    with pytest.raises(ValueError, match="empty after clipping to the 10x10 image"):
        dps.clip_box((12, 0, 20, 4), 10, 10)
    assert dps.clip_box((-3, 2, 40, 7), 10, 10) == (0, 2, 10, 7)
    with pytest.raises(ValueError, match="views must hold at least one PartialView"):
        dps.DPSConfig(views=[])
    with pytest.raises(ValueError, match=r"mode must be one of \['crop', 'mask'\], got 'blur'"):
        dps.CenterCrop(0.5, mode="blur")
    with pytest.raises(ValueError, match="lo, hi must satisfy"):
        dps.RandomCrop(0.6, 0.5)
    with pytest.warns(UserWarning, match="safety_mode=True without a checker"):
        dps.DPSConfig(safety_mode=True)


@pytest.mark.parametrize("bad", [None, "", "   "])
def test_empty_model_output_names_the_stage(bad) -> None:
    def fn(messages, images):
        return bad if messages[0]["content"].startswith("You see only part") else "fine"

    with pytest.raises(RuntimeError, match="at stage 'weak answer 0'; expected a non-empty string"):
        dps.dps_answer(dps.CallableClient(fn), IMG, "q?", _cfg(), rng=0)


# ----------------------------------------------------------------------------- learned stand-in
def test_canvases_attack_and_toy_dps_shapes() -> None:
    rng = np.random.default_rng(0)
    digits = np.ones((4, 8, 8))
    c = dps_toy.make_canvases(digits, rng, size=12, jitter=0)
    assert c.shape == (4, 24, 24) and torch.equal(c[:, 6:18, 6:18], torch.ones(4, 12, 12))
    assert float(c.sum()) == 4 * 144
    a = dps_toy.typographic_attack(torch.zeros(4, 24, 24), digits, rng, brightness=1.5)
    for i in range(4):
        corners = [a[i, :8, :8], a[i, :8, 16:], a[i, 16:, :8], a[i, 16:, 16:]]
        assert sorted(float(q.sum()) for q in corners) == [0, 0, 0, 96.0]
    model = dps_toy.HintCNN(width=8, seed=0).eval()
    out = dps_toy.toy_dps(model, c, exp.views(), np.random.default_rng(1), use_hint=False)
    assert torch.equal(out["final"], out["r0"]) and out["answers"].shape == (4, 3)
    with torch.no_grad():  # an empty hint is the no-hint call; the seed fixes the weights
        assert torch.equal(model(c), model(c, dps_toy.no_hint(4)))
        assert torch.equal(model(c), dps_toy.HintCNN(width=8, seed=0).eval()(c))
    hint, _answers, confident = dps_toy.toy_hints(
        model, c, exp.views(), np.random.default_rng(1), min_conf=0.0
    )
    assert bool(confident.all()) and torch.allclose(hint[:, :10].sum(1), torch.ones(4))


# ----------------------------------------------------------------------------- reproduction
# The recorded expectation (catalog: a known miss in both modes) is the miss of the two ASR-margin checks; the
# claim-relevant checks below hold with margin over seeds 0-4 (run pins one thread), on the AVX-512 and the plain
# (ATEN_CPU_CAPABILITY=default) vector paths: direction by >= 0.024, clean drop <= 0.043 (bound 0.05), DPS over
# crop_vote by >= 0.15 (bound 0.10), vanilla clean >= 0.917 (bound 0.90), vanilla ASR >= 0.417 (bound 0.35).
QUICK_KNOWN_MISS = {"ASR(DPS) <= 0.7 x ASR(vanilla)", "ASR(DPS) <= ASR(smooth_vote) - 0.15"}
QUICK_CLAIM_CHECKS = (
    "ASR(DPS) < ASR(vanilla) (direction)",
    "vanilla clean accuracy >= 0.9",
    "vanilla ASR >= 0.35",
    "clean(DPS) >= clean(vanilla) - 0.05",
    "clean(DPS) >= clean(crop_vote) + 0.1",
)


def test_quick_reproduction_matches_the_recorded_expectation_and_broken_variant_fails() -> None:
    report = exp.run(quick=True)
    failed = {k for k, ok in report.checks.items() if not ok}
    assert report.passed is False and failed <= QUICK_KNOWN_MISS, report.metrics
    assert all(report.checks[name] for name in QUICK_CLAIM_CHECKS), report.metrics
    m = report.metrics
    assert m["dps_asr"] < m["vanilla_asr"] and m["dps_clean"] >= m["crop_clean"] + exp.CROP_MARGIN
    with torch.random.fork_rng(), torch_threads(1):
        broken = exp.evaluate(exp.QUICK, 0, use_hint=False)
    assert not broken.checks["ASR(DPS) < ASR(vanilla) (direction)"]
    assert broken.metrics["dps_asr"] == broken.metrics["vanilla_asr"] == pytest.approx(m["vanilla_asr"])


# ----------------------------------------------------------------------------- transformers integration
def _tiny_llava():
    """A random-init LLaVA (CLIP vision tower + Llama) with a word-level tokenizer and a chat template."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<pad>", "<unk>", "<s>", "</s>", "<image>", "USER:", "ASSISTANT:", "SYSTEM:"]
    vocab = {t: i for i, t in enumerate(specials + "what is it a cat dog".split())}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    template = (
        "{% for m in messages %}{{ m['role'].upper() + ': ' }}{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}{{ '<image> ' }}{% else %}{{ c['text'] + ' ' }}{% endif %}"
        "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
    )
    image_proc = transformers.CLIPImageProcessor(
        size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}
    )
    proc = transformers.LlavaProcessor(
        image_processor=image_proc, tokenizer=tok, patch_size=8, vision_feature_select_strategy="default",
        chat_template=template, num_additional_image_tokens=1,
    )  # fmt: skip
    cfg = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16,
            patch_size=8,
        ),
        text_config=transformers.LlamaConfig(
            vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
        ),
        image_token_index=vocab["<image>"], vision_feature_select_strategy="default", vision_feature_layer=-1,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.LlavaForConditionalGeneration(cfg).eval()
    return model, proc, vocab["<image>"]


@pytest.mark.filterwarnings("ignore:.*requires torchvision")
def test_hf_client_renders_every_turns_images_and_runs_dps() -> None:
    model, proc, image_id = _tiny_llava()
    seen = []
    generate = model.generate

    def recording_generate(**kw):
        seen.append(kw)
        return generate(**kw)

    model.generate = recording_generate
    client = dps.HFVLMClient(model, proc, max_new_tokens=3)
    img = (np.random.default_rng(0).random((20, 20, 3)) * 255).astype(np.uint8)
    conv = [{"role": "user", "content": "what is it", "images": [img]}]
    first = client.chat(conv, [img])
    assert first.strip() and seen[0]["pixel_values"].shape[0] == 1
    assert int((seen[0]["input_ids"] == image_id).sum()) == 4  # (16 / 8)^2 patches, CLS dropped
    # greedy decoding: the same conversation gives the same text; a second image turn adds its tokens
    assert client.chat(conv, [img]) == first
    conv += [{"role": "assistant", "content": first}, {"role": "user", "content": "a cat", "images": [img]}]
    client.chat(conv, [img])
    assert seen[-1]["pixel_values"].shape[0] == 2 and int((seen[-1]["input_ids"] == image_id).sum()) == 8
    seen.clear()
    tr = dps.dps_answer(client, img, "what is it", _cfg(), assistant=Scripted(), rng=0)
    assert tr.vlm_calls == len(seen) == 1 + 2 * 2 + 2 and tr.final
    # every call carries its conversation's images: one per weak conversation (the description turn keeps
    # the view of the answer turn), one for the strong turns, two in the final turn (the image re-attached)
    assert [s["pixel_values"].shape[0] for s in seen] == [1, 1, 1, 1, 1, 1, 2]
