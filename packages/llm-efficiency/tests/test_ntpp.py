"""Tests of icml25.llm_efficiency.ntpp (NTPP, ICML 2025, P24): the pair-causal mask against its definition,
interleaving round trips, the pair loss against hand-computed cross-entropies, channel swap, causality and
symmetry of a real transformers Llama under the mask, the streaming loops (one pass per frame, KV cache equal
to recomputation, the user channel untouched), turn-taking statistics, bad inputs, and the quick
reproduction's gate with a broken variant (no pair structure) that must fail it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml25.kernels.experiment import torch_threads
from icml25.llm_efficiency.ntpp import (
    DualChannelCollator,
    deinterleave_pairs,
    interleave_pairs,
    ntpp_loss,
    pair_causal_mask,
    swap_channels,
    turn_taking_stats,
)

transformers = pytest.importorskip("transformers")

from icml25.llm_efficiency.experiments import ntpp as experiment  # noqa: E402
from icml25.llm_efficiency.ntpp import NTPPModel, flat_duplex_generate  # noqa: E402

V = 12


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


def _config(max_pos: int = 32, layers: int = 2):
    return transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_pos,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def _streams(B: int = 2, T: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)


# ------------------------------------------------------------------------------------------- layout, mask
@pytest.mark.parametrize("T", [1, 2, 5])
@pytest.mark.parametrize("cross", [True, False])
def test_pair_causal_mask_matches_its_definition(T, cross):
    allowed = pair_causal_mask(T, dtype=torch.bool, cross_channel=cross)
    add = pair_causal_mask(T, cross_channel=cross)
    for i in range(2 * T):
        for j in range(2 * T):
            want = (j // 2 < i // 2 or j == i) and (cross or j % 2 == i % 2)
            assert bool(allowed[i, j]) == want
            assert float(add[i, j]) == (0.0 if want else torch.finfo(torch.float32).min)
    idx = torch.arange(2 * T)
    assert allowed[idx, idx].all()  # the diagonal
    assert not allowed[idx, idx ^ 1].any()  # the same-frame partner


def test_interleave_round_trips_and_positions_count_tokens_or_frames():
    a, b = _streams(3, 5)
    ids, pos, chan = interleave_pairs(a, b)  # default: the official token positions 0 .. 2T - 1
    assert ids[0].tolist()[:4] == [a[0, 0], b[0, 0], a[0, 1], b[0, 1]]
    assert pos[0].tolist() == list(range(10)) and chan[1].tolist() == [0, 1] * 5
    _, pos_f, _ = interleave_pairs(a, b, positions="frame")
    assert pos_f[0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    a2, b2 = deinterleave_pairs(ids)
    assert torch.equal(a2, a) and torch.equal(b2, b)
    with pytest.raises(ValueError, match="positions"):
        interleave_pairs(a, b, positions="time")


# --------------------------------------------------------------------------------------------------- loss
def test_ntpp_loss_is_the_mean_of_both_channels_cross_entropies_and_ignores_pads():
    a, b = _streams(2, 5)
    g = torch.Generator().manual_seed(1)
    la, lb = torch.randn(2, 5, V, generator=g), torch.randn(2, 5, V, generator=g)
    terms = []
    for x, lx in ((a, la), (b, lb)):
        for r in range(2):
            for t in range(4):
                terms.append(-torch.log_softmax(lx[r, t], -1)[x[r, t + 1]])
    torch.testing.assert_close(ntpp_loss(la, lb, a, b), torch.stack(terms).mean())
    pad = V - 1
    a[0, 3:], b[0, 3:] = pad, pad
    keep = []
    for x, lx in ((a, la), (b, lb)):
        for r in range(2):
            for t in range(4):
                if x[r, t + 1] != pad:
                    keep.append(-torch.log_softmax(lx[r, t], -1)[x[r, t + 1]])
    assert len(keep) == 12
    torch.testing.assert_close(ntpp_loss(la, lb, a, b, pad_id=pad), torch.stack(keep).mean())


def test_swap_channels_swaps_whole_rows_and_is_reproducible():
    a, b = _streams(64, 4)
    a2, b2, sw = swap_channels(a, b, 0.5, seed=3)
    assert torch.equal(a2[sw], b[sw]) and torch.equal(b2[sw], a[sw]) and torch.equal(a2[~sw], a[~sw])
    assert 0 < int(sw.sum()) < 64
    assert torch.equal(swap_channels(a, b, 0.5, seed=3)[2], sw)
    assert not swap_channels(a, b, 0.0, seed=3)[2].any() and swap_channels(a, b, 1.0, seed=3)[2].all()


def test_collator_pads_right_and_the_loss_ignores_the_padding():
    coll = DualChannelCollator(pad_id=0)
    out = coll([{"a": [3, 4, 5], "b": [6, 7, 8]}, {"a": [1], "b": [2]}])
    assert out["a"].tolist() == [[3, 4, 5], [1, 0, 0]] and out["frame_mask"].tolist() == [
        [1, 1, 1],
        [1, 0, 0],
    ]
    with pytest.raises(ValueError, match="aligned"):
        coll([{"a": [1, 2], "b": [1]}])


# ----------------------------------------------------------------------------------- a real transformers Llama
def test_causality_under_the_mask_in_a_real_llama():
    """Perturbing b_2 leaves every slot of frames <= 2 unchanged (its partner a_2 included) but b_2's own."""
    model = NTPPModel(_config(), seed=0).eval()
    a, b = _streams(1, 6)
    la, lb = model(a, b)
    b2 = b.clone()
    b2[0, 2] = (b[0, 2] + 1) % V
    la2, lb2 = model(a, b2)
    assert torch.equal(la[:, :3], la2[:, :3]) and torch.equal(lb[:, :2], lb2[:, :2])
    assert not torch.allclose(lb[:, 2], lb2[:, 2]) and not torch.allclose(la[:, 3], la2[:, 3])
    a2 = a.clone()
    a2[0, 4] = (a[0, 4] + 1) % V
    la3, lb3 = model(a2, b)
    assert torch.equal(lb3[:, :5], lb[:, :5]) and torch.equal(la3[:, :4], la[:, :4])


def test_deaf_control_never_hears_the_other_channel():
    model = NTPPModel(_config(), attention="own", seed=0).eval()
    a, b = _streams(2, 6)
    a2 = torch.randint(0, V, a.shape, generator=torch.Generator().manual_seed(9))
    assert torch.equal(model(a, b)[1], model(a2, b)[1])


def test_mirrored_logits_without_channel_embedding_and_with_frame_positions():
    """With no channel identity and both tokens of a frame at one position the model is exactly symmetric
    under swapping the channels (token positions alone already tell the slots apart)."""
    model = NTPPModel(_config(), channel_embedding="none", positions="frame", seed=0).eval()
    a, b = _streams(2, 7)
    la, lb = model(a, b)
    lb2, la2 = model(b, a)
    torch.testing.assert_close(la, la2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lb, lb2, atol=1e-5, rtol=1e-5)


def test_input_channel_embedding_with_frame_positions_equals_a_brute_force_llama_call():
    """Our earlier form (the option): a 2-entry embedding added to the token embeddings, frame positions."""
    model = NTPPModel(_config(), channel_embedding="input", positions="frame", seed=0).eval()
    assert model.lm.config._attn_implementation == "sdpa"  # the LM's own attention, untouched
    a, b = _streams(2, 5)
    ids, pos, chan = interleave_pairs(a, b, positions="frame")
    emb = model.lm.get_input_embeddings()(ids) + model.channel(chan)
    mask = pair_causal_mask(5)[None, None].expand(2, 1, 10, 10)
    ref = model.lm(inputs_embeds=emb, attention_mask=mask, position_ids=pos).logits
    la, lb = model(a, b)
    torch.testing.assert_close(la, ref[:, 0::2])
    torch.testing.assert_close(lb, ref[:, 1::2])
    # frame position ids: a token-index layout (2t) gives different logits
    wrong = model.lm(
        inputs_embeds=emb, attention_mask=mask, position_ids=torch.arange(10).expand(2, 10)
    ).logits
    assert not torch.allclose(wrong, ref)


def _position_ids_seen(lm) -> list[list[int]]:
    seen: list[list[int]] = []
    lm.register_forward_pre_hook(
        lambda m, args, kw: seen.append(kw["position_ids"][0].tolist()), with_kwargs=True
    )
    return seen


def test_position_ids_are_the_official_token_positions_in_forward_and_generation():
    model = NTPPModel(_config(), seed=0).eval()
    seen = _position_ids_seen(model.lm)
    a, b = _streams(2, 5)
    model(a, b)
    assert seen == [list(range(10))]
    seen.clear()
    model.duplex_generate(a[:, :3], b[:, :3], 3, user=a[:, :3])
    assert seen == [list(range(6)), [6, 7], [8, 9]]  # the prompt, then two new tokens per frame
    frame = NTPPModel(_config(), positions="frame", seed=0).eval()
    seen = _position_ids_seen(frame.lm)
    frame(a, b)
    frame.duplex_generate(a[:, :3], b[:, :3], 2, user=a[:, :2])
    assert seen == [[0, 0, 1, 1, 2, 2, 3, 3, 4, 4], [0, 0, 1, 1, 2, 2], [3, 3]]


# ------------------------------------------------------------------------------- the official channel embedding
def test_qk_channel_embedding_with_zero_vectors_equals_no_embedding():
    model = NTPPModel(_config(), seed=0).eval()  # default: "qk"
    plain = NTPPModel(_config(), channel_embedding="none", seed=0).eval()
    assert model.lm.config._attn_implementation == "ntpp_channel_sdpa"
    assert tuple(model.channel.weight.shape) == (2, 16)  # one vector per channel, of the head size
    a, b = _streams(2, 6)
    la, lb = model(a, b)
    pa, pb = plain(a, b)
    assert not torch.allclose(la, pa) and not torch.allclose(lb, pb)
    with torch.no_grad():
        model.channel.weight.zero_()
    la, lb = model(a, b)
    assert torch.equal(la, pa) and torch.equal(lb, pb)


def test_qk_channel_embedding_is_the_official_attention_in_every_layer():
    """Each layer's attention against a hand-written one: q, k after the rotary embedding plus the official
    channel vector of the token's parity (dual_llama.py:522-536, 889), softmax with the pair-causal mask."""
    model = NTPPModel(_config(layers=2), seed=0).eval()
    with torch.no_grad():
        model.channel.weight.normal_(0.0, 1.0)  # large vectors, so a missed or misplaced add shows
    a, b = _streams(2, 4)
    n, hd, heads = 8, 16, 2
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}

    def keep(i: int):
        def hook(m, args, kw, out) -> None:
            inputs[i], outputs[i] = kw["hidden_states"], out[0]

        return hook

    for i, layer in enumerate(model.lm.model.layers):
        layer.self_attn.register_forward_hook(keep(i), with_kwargs=True)
    model(a, b)
    mask = pair_causal_mask(4)
    cos, sin = model.lm.model.rotary_emb(inputs[0], torch.arange(n)[None].expand(2, n))
    chan = model.channel.weight[torch.arange(n) % 2]  # (n, head_dim): channel = token parity
    for i, layer in enumerate(model.lm.model.layers):
        att, h = layer.self_attn, inputs[i]
        q = att.q_proj(h).view(2, n, heads, hd).transpose(1, 2)
        k = att.k_proj(h).view(2, n, heads, hd).transpose(1, 2)
        v = att.v_proj(h).view(2, n, heads, hd).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        q, k = q + chan, k + chan
        w = torch.softmax(q @ k.transpose(-1, -2) / hd**0.5 + mask, -1)
        ref = att.o_proj((w @ v).transpose(1, 2).reshape(2, n, heads * hd))
        torch.testing.assert_close(outputs[i], ref, atol=1e-5, rtol=1e-5)


def test_qk_channel_embedding_is_one_trained_module_and_leaves_the_bare_lm_unchanged():
    model = NTPPModel(_config(layers=3), seed=0)
    names = [n for n, _ in model.named_parameters() if "channel" in n]
    assert names == ["channel.weight"]  # one module shared by all layers
    a, b = _streams(2, 5)
    ntpp_loss(*model(a, b), a, b).backward()
    assert float(model.channel.weight.grad.abs().sum()) > 0
    # the wrapped LM called on its own (no channel vectors) computes what the unwrapped one does
    with torch.random.fork_rng():
        torch.manual_seed(0)
        lm = transformers.LlamaForCausalLM(_config())
        twin = transformers.LlamaForCausalLM(_config())
    twin.load_state_dict(lm.state_dict())
    NTPPModel(lm, seed=0)
    assert lm.config._attn_implementation == "ntpp_channel_sdpa"
    ids = interleave_pairs(a, b)[0]
    assert torch.equal(lm(input_ids=ids).logits, twin(input_ids=ids).logits)


def _count_calls(lm) -> list[int]:
    calls: list[int] = []
    lm.register_forward_hook(lambda m, i, o: calls.append(1))
    return calls


def test_duplex_generate_one_pass_per_frame_cache_equals_recompute_and_user_untouched():
    model = NTPPModel(_config(), seed=0).eval()
    pa, pb = _streams(2, 4)
    user = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(4))
    keep = user.clone()
    calls = _count_calls(model.lm)
    a, b = model.duplex_generate(pa, pb, 6, user=user)
    assert len(calls) == 6 and a.shape == b.shape == (2, 10)
    assert torch.equal(user, keep) and torch.equal(a[:, 4:], user) and torch.equal(a[:, :4], pa)
    a2, b2 = model.duplex_generate(pa, pb, 6, user=user, use_cache=False)
    assert torch.equal(a2, a) and torch.equal(b2, b)
    # greedy b equals the argmax of the full forward on the result (frame f from frames < f)
    assert torch.equal(model(a[:, :-1], b[:, :-1])[1].argmax(-1)[:, 3:], b[:, 4:])
    calls.clear()
    ab, bb = model.duplex_generate(pa, pb, 5, sample_channels=("a", "b"), temperature=1.0, seed=0)
    assert len(calls) == 5 and ab.shape == (2, 9)
    ab2, bb2 = model.duplex_generate(
        pa, pb, 5, sample_channels=("a", "b"), temperature=1.0, seed=0, use_cache=False
    )
    assert torch.equal(ab, ab2) and torch.equal(bb, bb2)


def test_flat_baseline_needs_two_passes_per_frame_when_both_channels_are_generated():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        lm = transformers.LlamaForCausalLM(_config(max_pos=64)).eval()
    pa, pb = _streams(2, 4)
    calls = _count_calls(lm)
    a, b = flat_duplex_generate(lm, pa, pb, 5, temperature=1.0, seed=0)
    assert len(calls) == 10 and a.shape == (2, 9)
    calls.clear()
    user = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(2))
    a, b = flat_duplex_generate(lm, pa, pb, 5, user=user)
    assert len(calls) == 5 and torch.equal(a[:, 4:], user)
    # b_t is read after a_t: the greedy b equals the full-sequence argmax at a_t's slot
    ids = interleave_pairs(a, b)[0]
    assert torch.equal(lm(input_ids=ids).logits[:, 0::2].argmax(-1)[:, 4:], b[:, 4:])


def test_silence_aware_greedy_speaks_when_speech_is_more_likely_than_silence():
    model = NTPPModel(_config(), seed=0).eval()
    with torch.no_grad():
        model.lm.lm_head.weight.zero_()
        model.lm.lm_head.bias = None
    pa, pb = _streams(1, 3)
    # uniform logits: p(SIL) = 1/12 < 1/2, so a token other than SIL=0 is emitted; plain argmax picks 0
    _, b = model.duplex_generate(pa, pb, 3, user=torch.zeros(1, 3, dtype=torch.long), silence_id=0)
    assert (b[:, 3:] != 0).all()
    _, b = model.duplex_generate(pa, pb, 3, user=torch.zeros(1, 3, dtype=torch.long))
    assert (b[:, 3:] == 0).all()


# ------------------------------------------------------------------------------------------- bad inputs
def test_bad_inputs_raise_naming_the_argument():
    model = NTPPModel(_config(max_pos=8), seed=0).eval()
    a, b = _streams(2, 6)
    with pytest.raises(ValueError, match="same shape"):
        model(a, b[:, :5])
    with pytest.raises(ValueError, match="same shape"):
        model(a, b[:1])
    with pytest.raises(ValueError, match="vocabulary size"):
        model(a + V, b)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(*_streams(1, 5))  # token positions: 2T = 10 > 8
    model(*_streams(1, 4))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        NTPPModel(_config(max_pos=8), positions="frame", seed=0)(*_streams(1, 9))
    with pytest.raises(ValueError, match="user stream is given"):
        model.duplex_generate(a[:, :2], b[:, :2], 2, user=a[:, :2], sample_channels=("a", "b"))
    with pytest.raises(ValueError, match="sample_channels"):
        model.duplex_generate(a[:, :2], b[:, :2], 2)
    with pytest.raises(ValueError, match="user must have shape"):
        model.duplex_generate(a[:, :2], b[:, :2], 2, user=a[:, :3])
    with pytest.raises(ValueError, match="attention"):
        NTPPModel(_config(), attention="causal")
    with pytest.raises(ValueError, match="channel_embedding"):
        NTPPModel(_config(), channel_embedding=True)
    with pytest.raises(ValueError, match="positions"):
        NTPPModel(_config(), positions="time")
    with pytest.raises(ValueError, match="temperature"):
        model.duplex_generate(a[:, :2], b[:, :2], 2, user=a[:, :2], temperature=float("nan"))
    with pytest.raises(ValueError, match="silence_id"):
        model.duplex_generate(a[:, :2], b[:, :2], 2, user=a[:, :2], silence_id=V)


def test_old_transformers_raises_with_a_version_hint():
    from icml25.llm_efficiency.ntpp import hf

    with pytest.raises(ImportError, match=r"4\.40"):
        hf._check_transformers_version("4.36.2")
    hf._check_transformers_version("5.24.0")


# ------------------------------------------------------------------------------------------- statistics
def test_turn_taking_stats_on_a_hand_made_dialogue():
    S = 0
    a = torch.tensor([1, 1, 1, S, S, S, S, S, S, 1, 1, S])
    b = torch.tensor([S, S, S, S, 2, 2, S, 2, 2, 2, S, S])
    st = turn_taking_stats(a, b, silence_id=S)
    # IPUs a: [0,3) 3, [9,11) 2; b: [4,6) 2, [7,10) 3; gap [3,4) (a -> b); pause [6,7) (b continues);
    # overlap [9,10) 1 frame; trailing silence not counted
    assert st["ipu_count"] == 4 and st["ipu_mean"] == 2.5
    assert (st["gap_count"], st["gap_mean"]) == (1, 1.0)
    assert (st["pause_count"], st["pause_mean"]) == (1, 1.0)
    assert (st["overlap_count"], st["overlap_mean"]) == (1, 1.0)
    assert st["speech_fraction"] == pytest.approx(10 / 24)


# -------------------------------------------------------------------------------------------- the generator
def test_generator_follows_the_reactive_rule_and_deaf_bound_is_exact():
    s = experiment.FULL
    a, b, events = experiment.simulate_dialogues(20, 200, s, np.random.default_rng(0))
    streams = (a, b)
    checked = 0
    for ev in events:
        if ev["prev"] < 0:
            assert not ev["response"]  # the first speaker initiates
            continue
        init = events[ev["prev"]]
        assert ev["response"] != init["response"]  # initiations and responses alternate
        if not ev["response"] or ev["end"] >= 200:
            continue
        # the response maps the initiation token by token (wrapping), f(t) = t + 7 mod 32 on ids 1..32 ...
        want = [(init["tokens"][k % len(init["tokens"])] - 1 + 7) % 32 + 1 for k in range(len(ev["tokens"]))]
        assert ev["tokens"] == want
        assert streams[ev["speaker"]][ev["row"], ev["start"] : ev["end"] + 1].tolist() == want
        # ... and is causal: X_k is emitted before Y_k, even under overlap
        assert init["start"] < ev["start"] <= init["end"] + 1 + s.gap_max
        checked += 1
    assert checked > 100
    # the bound is a probability, above chance, below 1 at the full scale (the plan's review: about 45%)
    bound = experiment.deaf_onset_bound(s)
    assert 0.4 < bound < 0.5
    print("deaf Bayes bound (full setting):", bound)


def test_score_uses_the_plans_onset_window_and_the_per_token_rule():
    s = experiment.FULL
    heard = (1, 2, 3, 32)  # a's initiation; the rule answers 8, 9, 10, 7, then wraps to 8
    meta = [(2, 4, 6, heard)] * 3  # generation starts 2 frames before a's last token (frame 4 of the window)
    rows = torch.zeros(3, s.horizon, dtype=torch.long)
    rows[0, 6:11] = torch.tensor([8, 9, 10, 7, 8])  # frame 8 = the frame after a's end (5) + 3: a hit
    rows[1, 7:11] = torch.tensor([8, 9, 11, 7])  # onset +4: outside [-2, +3], inside the support [-2, +6]
    got = experiment.score(rows, {"meta": meta}, s)  # row 2 never speaks: a miss, content 0
    assert got["onset"] == pytest.approx(1 / 3)
    assert got["onset_in_support"] == pytest.approx(2 / 3)
    assert got["content"] == pytest.approx((1.0 + 0.75 + 0.0) / 3)


def test_evaluation_runs_one_teacher_forced_pass_per_arm():
    """The reactive-token and onset scores read the same logits (one pass, not one each)."""
    s = experiment.QUICK
    a_np, b_np, events = experiment.simulate_dialogues(40, 3 * s.T, s, np.random.default_rng(0))
    windows = experiment.response_windows(a_np, b_np, events, s, 8)
    for arm in ("ntpp", "flat"):
        model = experiment.make_arm(arm, s, 0).eval()
        lm = model.lm if arm == "ntpp" else model
        calls = _count_calls(lm)
        res = experiment.evaluate_arm(model, arm, windows, s)
        assert len(calls) == 1 and set(res) == {"reactive_accuracy", "reactive_nll", "onset_nll"}
        logits = experiment.b_logits(model, arm, windows)
        assert res["onset_nll"] == experiment.onset_nll(logits, windows)


# ------------------------------------------------------------------------------------------ the reproduction
def test_quick_reproduction_passes():
    # the full run gates the official NTPP form; the quick one our earlier form (QUICK's measured reason)
    assert (experiment.FULL.channel_embedding, experiment.FULL.positions) == ("qk", "token")
    assert (experiment.QUICK.channel_embedding, experiment.QUICK.positions) == ("input", "frame")
    report = experiment.run(quick=True, seed=0)
    assert report.passed, report
    m = report.metrics
    assert m["ntpp_onset_nll"] < m["deaf_onset_nll"]


def test_quick_gate_fails_without_pair_structure():
    report = experiment.run(quick=True, seed=0, _unpaired=True)
    assert not report.passed
    assert report.failed_checks == ["NTPP onset NLL <= 0.9 x deaf's"]


@pytest.mark.slow
def test_full_reproduction_is_the_recorded_known_miss():
    """The plan's full setting (26-68 min on the loaded 2-core machine): the onset window [-2, +3] is
    missed by every arm (greedy decoding waits out the gaps of up to 6 frames) and the per-token content
    rule is not learnt in 800 steps; NTPP still matches the flattened baseline and the deaf control holds."""
    report = experiment.run(quick=False, seed=0)
    assert report.failed_checks == [
        "NTPP onset >= 0.85",
        "NTPP content >= 0.7",
        "NTPP onset >= deaf onset + 0.3",
        "NTPP content >= deaf content + 0.3",
    ]
