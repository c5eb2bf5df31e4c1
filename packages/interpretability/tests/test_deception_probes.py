"""P52 deception probes: exact checks of the probes, aggregation, calibration and metrics, every bad input of
the paper's failure list, the transformers extraction on a tiny Llama built from a config, the quick gate."""

from __future__ import annotations

import dataclasses
import pickle
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import icml25.interpretability as ip
from icml25.interpretability import (
    DeceptionSimulator,
    LATProbe,
    LDAProbe,
    LogisticProbe,
    MeanDiffProbe,
    TokenActs,
    aggregate_token_scores,
    auroc,
    detection_mask_from_offsets,
    evaluate_probe,
    instructed_pairs,
    score_dialogues,
    split_last_words,
    threshold_at_fpr,
)
from icml25.interpretability.experiments import deception_probes as experiment

SETTINGS = settings(max_examples=30, deadline=None)


def _toy(
    seed: int = 0, n: int = 40, d: int = 6, t: int = 12, shift: float = 1.5, isotropic: bool = False
) -> TokenActs:
    """Dialogues of 1..t tokens, deceptive ones shifted along feature 0, padding filled with 1e6."""
    g = np.random.default_rng(seed)
    lengths = g.integers(1, t + 1, n)
    labels = np.arange(n) % 2
    scales = np.ones(d) if isotropic else np.linspace(0.5, 3.0, d)
    acts = np.full((n, t, d), 1e6, dtype=np.float32)
    mask = np.zeros((n, t), dtype=bool)
    for i, k in enumerate(lengths):
        acts[i, :k] = g.standard_normal((k, d)) * scales + shift * labels[i] * np.eye(d)[0]
        mask[i, :k] = True
    return TokenActs(torch.from_numpy(acts), torch.from_numpy(mask), torch.from_numpy(labels))


# ----------------------------------------------------------------------------- calibration and metrics
def test_threshold_at_one_percent_fpr_on_10k_control_scores():
    scores = np.random.default_rng(0).standard_normal(10_000)
    thr = threshold_at_fpr(scores, 0.01)
    above = float((scores > thr).mean())
    assert 0.009 <= above <= 0.01
    assert thr == pytest.approx(float(torch.quantile(torch.from_numpy(scores), 0.99)), abs=1e-12)
    # ties: deterministic, independent of the order, never more than fpr flagged with method="higher"
    tied = np.repeat(np.arange(100.0), 100)
    perm = np.random.default_rng(1).permutation(tied)
    assert threshold_at_fpr(tied, 0.01) == threshold_at_fpr(perm, 0.01)
    assert float((tied > threshold_at_fpr(tied, 0.01, method="higher")).mean()) <= 0.01


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1), n=st.integers(2, 60), n_values=st.integers(1, 8), frac=st.floats(0.1, 0.9)
)
def test_auroc_equals_sklearn_roc_auc_score(seed, n, n_values, frac):
    g = np.random.default_rng(seed)
    y = (g.random(n) < frac).astype(int)
    y[0], y[1] = 0, 1
    s = g.integers(0, n_values, n).astype(float)  # many ties
    assert auroc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 6), trim=st.floats(0.0, 0.45))
def test_aggregations_are_exact(seed, k, trim):
    g = np.random.default_rng(seed)
    lengths = g.integers(1, 9, g.integers(1, 7))
    s = g.standard_normal(int(lengths.sum()))
    parts = np.split(s, np.cumsum(lengths)[:-1])
    np.testing.assert_allclose(aggregate_token_scores(s, lengths, "mean"), [p.mean() for p in parts], 1e-12)
    np.testing.assert_array_equal(aggregate_token_scores(s, lengths, "max"), [p.max() for p in parts])
    np.testing.assert_array_equal(aggregate_token_scores(s, lengths, "last"), [p[-1] for p in parts])
    np.testing.assert_allclose(
        aggregate_token_scores(s, lengths, "topk_mean", k=k), [np.sort(p)[-k:].mean() for p in parts], 1e-12
    )
    trimmed = []
    for p in parts:
        c = min(int(np.floor(trim * p.size)), (p.size - 1) // 2)
        trimmed.append(np.sort(p)[c : p.size - c].mean())
    np.testing.assert_allclose(aggregate_token_scores(s, lengths, "trimmed_mean", trim=trim), trimmed, 1e-12)


def test_mean_aggregation_reads_only_masked_tokens():
    acts = _toy()
    probe = LogisticProbe().fit(acts)
    ref = score_dialogues(probe, acts)
    for pad in (0.0, -1e8):
        padded = acts.acts.clone()
        padded[~acts.mask] = pad
        again = score_dialogues(probe, TokenActs(padded, acts.mask, acts.labels))
        np.testing.assert_array_equal(again, ref)
    brute = [float(np.mean(probe.score_tokens(acts[i]))) for i in range(len(acts))]
    np.testing.assert_allclose(ref, brute, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(probe.decision_function(acts), ref, rtol=1e-12, atol=1e-12)


def test_evaluate_probe_matches_its_definition():
    sim = DeceptionSimulator(d=16, seed=3)
    train, ev, ctrl = sim.sample(60, "train", 1), sim.sample(60, "eval", 2), sim.sample(200, "control", 3)
    probe = LogisticProbe().fit(train)
    m = evaluate_probe(probe, ev, ctrl)
    s, c, y = score_dialogues(probe, ev), score_dialogues(probe, ctrl), ev.labels.numpy()
    thr = float(np.quantile(c, 0.99))
    assert m["threshold"] == pytest.approx(thr, abs=1e-12)
    assert m["auroc"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert m["auroc_control"] == pytest.approx(
        roc_auc_score(np.r_[np.zeros(200), np.ones(30)], np.r_[c, s[y == 1]]), abs=1e-12
    )
    assert m["recall"] == float((s[y == 1] > thr).mean())
    assert m["fpr_control"] <= 0.01 and m["fpr_honest"] == float((s[y == 0] > thr).mean())


# ----------------------------------------------------------------------------- probes
def test_logistic_probe_equals_sklearn_standardised_lr_without_intercept():
    acts = _toy(seed=1)
    x, _ = acts.tokens()
    y = np.repeat(acts.labels.numpy(), acts.lengths.numpy())
    probe = LogisticProbe(reg_coeff=10.0).fit(acts)
    # the official detector: scikit-learn's defaults (lbfgs, max_iter 100, tol 1e-4)
    ref = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, fit_intercept=False))
    ref.fit(x.double().numpy(), y)
    np.testing.assert_allclose(probe.score_tokens(x), ref.decision_function(x.double().numpy()), atol=1e-8)
    np.testing.assert_allclose(probe.lr_coef_, ref[-1].coef_[0], atol=1e-10)
    # the tighter solver stays reachable through the parameters
    tight = LogisticProbe(reg_coeff=10.0, max_iter=1000, tol=1e-6).fit(acts)
    ref_tight = make_pipeline(
        StandardScaler(), LogisticRegression(C=0.1, fit_intercept=False, tol=1e-6, max_iter=1000)
    )
    ref_tight.fit(x.double().numpy(), y)
    np.testing.assert_allclose(tight.lr_coef_, ref_tight[-1].coef_[0], atol=1e-10)
    # the same probe through the plain scikit-learn token-matrix interface
    flat = LogisticProbe().fit(x.numpy(), y)
    np.testing.assert_allclose(flat.coef_, probe.coef_, atol=1e-10)


def test_logistic_probe_with_normalize_is_invariant_to_feature_rescaling():
    acts = _toy(seed=2)
    scale = torch.tensor([1e-3, 1.0, 7.0, 0.2, 50.0, 3.0])
    scaled = TokenActs(acts.acts * scale, acts.mask, acts.labels)
    a = LogisticProbe().fit(acts).decision_function(acts)
    b = LogisticProbe().fit(scaled).decision_function(scaled)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert (np.argsort(a, kind="stable") == np.argsort(b, kind="stable")).mean() > 0.95


def test_mean_diff_direction_is_the_exact_mean_difference():
    acts = _toy(seed=3)
    x, idx = acts.tokens()
    y = acts.labels.numpy()[idx.numpy()]
    x = x.double().numpy()
    probe = MeanDiffProbe().fit(acts)
    np.testing.assert_allclose(probe.coef_, x[y == 1].mean(0) - x[y == 0].mean(0), rtol=1e-12, atol=1e-12)
    # balance="dialogue": the mean of the dialogue means
    by_dialogue = np.stack([acts[i].double().numpy().mean(0) for i in range(len(acts))])
    lab = acts.labels.numpy()
    balanced = MeanDiffProbe(balance="dialogue").fit(acts)
    want = by_dialogue[lab == 1].mean(0) - by_dialogue[lab == 0].mean(0)
    np.testing.assert_allclose(balanced.coef_, want, rtol=1e-10, atol=1e-12)


def test_lat_is_sign_oriented_and_seeded():
    for seed in range(5):
        # deceptive tokens *lower* along feature 0; isotropic noise, so the shift is the top component
        acts = _toy(seed=seed, shift=-3.0, isotropic=True)
        probe = LATProbe(seed=seed).fit(acts)
        s = probe.decision_function(acts)
        y = acts.labels.numpy()
        assert s[y == 1].mean() > s[y == 0].mean()
        assert abs(probe.coef_[0]) > 0.9  # unit direction, along the shift
        np.testing.assert_array_equal(LATProbe(seed=seed).fit(acts).coef_, probe.coef_)


def test_lda_recovers_inverse_covariance_times_mean_difference():
    g = np.random.default_rng(0)
    d = 8
    a = g.standard_normal((d, d))
    cov = a @ a.T + 0.5 * np.eye(d)
    delta = g.standard_normal(d)
    chol = np.linalg.cholesky(cov)
    n = 20_000
    y = np.r_[np.zeros(n // 2), np.ones(n // 2)].astype(int)
    x = g.standard_normal((n, d)) @ chol.T + np.outer(y, delta)
    coef = LDAProbe().fit(x, y).coef_
    want = np.linalg.solve(cov, delta)
    assert coef @ want / np.linalg.norm(coef) / np.linalg.norm(want) > 0.99


def test_seeded_determinism_and_pickle_round_trip():
    sim = DeceptionSimulator(d=12, seed=5)
    a, b = sim.sample(20, "eval", seed=4), DeceptionSimulator(d=12, seed=5).sample(20, "eval", seed=4)
    assert torch.equal(a.acts, b.acts) and torch.equal(a.mask, b.mask)
    for probe in (LogisticProbe(), MeanDiffProbe(), LATProbe(seed=2), LDAProbe()):
        probe.fit(a).calibrate(sim.sample(150, "control", seed=1))
        again = pickle.loads(pickle.dumps(probe))
        np.testing.assert_array_equal(again.decision_function(a), probe.decision_function(a))
        assert again.threshold_ == probe.threshold_
        np.testing.assert_array_equal(type(probe)(**probe.get_params()).fit(a).coef_, probe.coef_)


def test_scikit_learn_integration_cross_val_score_and_pipeline():
    acts = _toy(seed=4, n=60, shift=2.0)
    scores = cross_val_score(LogisticProbe(), acts, acts.labels.numpy(), cv=3, scoring="roc_auc")
    assert scores.shape == (3,) and scores.min() > 0.8
    x, idx = acts.tokens()
    y = acts.labels.numpy()[idx.numpy()]
    pipe = make_pipeline(StandardScaler(), MeanDiffProbe()).fit(x.numpy(), y)
    assert roc_auc_score(y, pipe.decision_function(x.numpy())) > 0.7
    # a token-level pipeline scores dialogues through score_dialogues too
    assert auroc(acts.labels.numpy(), score_dialogues(pipe, acts)) > 0.9


def test_string_labels_greater_class_is_positive():
    acts = _toy(seed=6)
    x, idx = acts.tokens()
    y = np.where(acts.labels.numpy()[idx.numpy()] == 1, "b_deceptive", "a_honest")
    probe = MeanDiffProbe().fit(x.numpy(), y)
    assert list(probe.classes_) == ["a_honest", "b_deceptive"]
    np.testing.assert_allclose(probe.coef_, MeanDiffProbe().fit(acts).coef_, atol=1e-12)


# ----------------------------------------------------------------------------- data helpers
def test_instructed_pairs_drop_the_last_five_words():
    dialogues, labels = instructed_pairs(["The Eiffel Tower is located in Paris, France today."])
    assert labels == [0, 1]
    assert "honest" in dialogues[0][0]["content"] and "dishonest" in dialogues[1][0]["content"]
    head, tail = dialogues[0][1], dialogues[0][2]
    assert head == {"role": "assistant", "content": "The Eiffel Tower is", "detect": True}
    assert tail == {"role": "assistant", "content": " located in Paris, France today.", "detect": False}
    assert split_last_words("a b c", 5) == ("", "a b c")


def test_detection_mask_from_offsets_excludes_zero_width_and_outside_tokens():
    offsets = [(0, 0), (0, 5), (5, 6), (6, 9), (9, 13), (13, 13)]
    mask = detection_mask_from_offsets(offsets, [(5, 13)])
    assert mask.tolist() == [False, False, True, True, True, False]


# ----------------------------------------------------------------------------- bad inputs (paper's list)
def test_bad_input_only_one_training_class():
    acts = _toy()
    one = TokenActs(acts.acts, acts.mask, torch.zeros(len(acts), dtype=torch.long))
    for probe in (LogisticProbe(), MeanDiffProbe(), LATProbe(), LDAProbe()):
        with pytest.raises(ValueError, match=r"y must hold two classes .* got 1 class"):
            probe.fit(one)


def test_bad_input_dialogue_with_zero_masked_tokens_names_its_index():
    acts = _toy()
    mask = acts.mask.clone()
    mask[3] = False
    with pytest.raises(ValueError, match=r"dialogue 3 has zero masked tokens"):
        TokenActs(acts.acts, mask, acts.labels)
    with pytest.raises(ValueError, match=r"dialogues\[2\] has zero tokens"):
        TokenActs.from_list([torch.ones(2, 3), torch.ones(1, 3), torch.ones(0, 3)], [0, 1, 0])
    with pytest.raises(ValueError, match=r"lengths must be >= 1: dialogue 1"):
        aggregate_token_scores(np.ones(3), np.array([3, 0]))


def test_bad_input_feature_count_mismatch_between_fit_and_score():
    acts = _toy(d=6)
    probe = LogisticProbe().fit(acts)
    narrow = _toy(d=5)
    with pytest.raises(ValueError, match=r"X has 5 features, but LogisticProbe was fitted with 6"):
        probe.decision_function(narrow)
    with pytest.raises(ValueError, match=r"X must have 6 features"):
        probe.score_tokens(torch.ones(4, 5))
    with pytest.raises(ValueError, match=r"X must have 6 features"):
        score_dialogues(probe, narrow)


def test_bad_input_control_set_smaller_than_one_over_fpr_warns():
    with pytest.warns(UserWarning, match=r"control_scores holds 50 scores, fewer than 1/fpr = 100"):
        thr = threshold_at_fpr(np.arange(50.0), 0.01)
    assert thr == pytest.approx(np.quantile(np.arange(50.0), 0.99))


@pytest.mark.parametrize("bad", [-1, "ambiguous", "skip"])
def test_bad_input_control_or_ambiguous_labels_in_fit(bad):
    x = np.random.default_rng(0).standard_normal((9, 3))
    if bad == -1:
        y = np.array([0, 1, -1] * 3)
        with pytest.raises(ValueError, match=r"y contains -1, which marks control dialogues"):
            LogisticProbe().fit(x, y)
        with pytest.raises(ValueError, match=r"y contains -1"):
            LogisticProbe().fit(TokenActs.from_list([torch.ones(2, 3) * i for i in range(3)], [0, 1, -1]))
    else:
        y = np.array(["honest", "deceptive", bad] * 3)
        with pytest.raises(ValueError, match=rf"y contains \['{bad}'\]: drop unlabelled"):
            MeanDiffProbe().fit(x, y)


def test_bad_input_half_precision_activations_are_cast_to_float32():
    acts = _toy(seed=7)
    for dtype in (torch.float16, torch.bfloat16):
        half = TokenActs(acts.acts.clamp(-1e4, 1e4).to(dtype), acts.mask, acts.labels)
        assert half.acts.dtype == torch.float32
        probe = LogisticProbe().fit(half)
        ref = LogisticProbe().fit(TokenActs(half.acts.clone(), acts.mask, acts.labels))
        np.testing.assert_array_equal(probe.coef_, ref.coef_)
        assert probe.score_tokens(acts[0].to(dtype)).dtype == np.float64


def test_bad_input_scalar_parameters():
    acts = _toy()
    with pytest.raises(ValueError, match=r"reg_coeff must be a finite float in \(0.0, inf\), got 0.0"):
        LogisticProbe(reg_coeff=0).fit(acts)
    with pytest.raises(ValueError, match=r"aggregation must be one of"):
        MeanDiffProbe(aggregation="median").fit(acts)
    with pytest.raises(ValueError, match=r"fpr must be in \(0, 1\), got 1.5"):
        threshold_at_fpr(np.arange(200.0), 1.5)
    with pytest.raises(NotFittedError, match=r"This MeanDiffProbe instance is not fitted yet"):
        MeanDiffProbe().decision_function(acts)


# ----------------------------------------------------------------------------- transformers (extra [hf])
def _tiny_llama_and_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = (
        "pretend you're an honest dishonest person making statements about the world . the sky is blue on a "
        "clear day water boils at 100 degrees celsius sea level"
    ).split()
    specials = ["<pad>", "<unk>", "<bos>", "<|user|>", "<|assistant|>", "<|end|>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(set(words) | {"'", "re", "you"}))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        additional_special_tokens=specials[3:],
    )
    tok.chat_template = (
        "<bos>{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] | trim }} <|end|>{% endfor %}"
    )
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval(), tok


def test_extract_activations_equal_output_hidden_states_at_the_detection_span():
    model, tok = _tiny_llama_and_tokenizer()
    facts = ["The sky is blue on a clear day.", "Water boils at 100 degrees celsius at sea level."]
    dialogues, labels = instructed_pairs(facts)
    texts = [ip.tokenize_dialogue(tok, d) for d in dialogues]
    for layer in (0, 1, 2):
        acts = ip.extract_activations(model, tok, dialogues, labels, layer=layer, batch_size=3)
        assert acts.acts.dtype == torch.float32 and acts.n_features == 32
        assert acts.labels.tolist() == labels
        for i, (ids, mask) in enumerate(texts):
            with torch.no_grad():
                ref = model(input_ids=ids[None], output_hidden_states=True).hidden_states[layer][0]
            torch.testing.assert_close(acts[i], ref[mask], atol=1e-5, rtol=1e-5)
            if layer == 0:  # hidden_states[0] is the embedding output
                torch.testing.assert_close(acts[i], model.get_input_embeddings()(ids)[mask], atol=0, rtol=0)
    # the span is the fact without its last five words; no template token is in it
    ids, mask = texts[0]
    assert tok.convert_ids_to_tokens(ids[mask].tolist()) == ["the", "sky", "is"]
    ids, mask = texts[3]
    assert tok.convert_ids_to_tokens(ids[mask].tolist()) == ["water", "boils", "at", "100"]
    with pytest.raises(ValueError, match=r"layer must be in \[0, 2\] \(0 = embeddings\), got 3"):
        ip.extract_activations(model, tok, dialogues, labels, layer=3)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 2\]"):
        ip.extract_activations(model, tok, dialogues, labels, layer=-1)


def test_extract_hidden_states_on_integer_inputs_with_right_padding():
    model, _ = _tiny_llama_and_tokenizer()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (3, 9), generator=g)
    attn = torch.ones(3, 9, dtype=torch.long)
    attn[1, 6:] = 0
    attn[2, 4:] = 0
    mask = attn.bool().clone()
    mask[:, 0] = False  # e.g. BOS
    acts = ip.extract_hidden_states(model, ids, mask, [0, 1, -1], layer=2, attention_mask=attn)
    assert acts.lengths.tolist() == [8, 5, 3]
    for i in range(3):
        n = int(attn[i].sum())
        with torch.no_grad():
            ref = model(input_ids=ids[i : i + 1, :n], output_hidden_states=True).hidden_states[2][0]
        torch.testing.assert_close(acts[i], ref[mask[i, :n]], atol=1e-5, rtol=1e-5)
    half = ip.extract_hidden_states(
        model.to(torch.bfloat16), ids, mask, [0, 1, -1], layer=1, attention_mask=attn
    )
    assert half.acts.dtype == torch.float32
    with pytest.raises(ValueError, match=r"layer must be in \[0, 2\]"):
        ip.extract_hidden_states(model, ids, mask, [0, 1, -1], layer=5, attention_mask=attn)
    with pytest.raises(ValueError, match=r"detection_mask must not select padding"):
        ip.extract_hidden_states(model, ids, torch.ones(3, 9, dtype=torch.bool), [0, 1, 0], 1, attn)
    with pytest.raises(TypeError, match=r"input_ids must hold integer token ids"):
        ip.extract_hidden_states(model, ids.float(), mask, [0, 1, 0], 1, attn)


# ----------------------------------------------------------------------------- the reproduction
def test_simulator_oracle_is_the_fisher_direction():
    sim = DeceptionSimulator(d=16, seed=0)
    want = np.linalg.solve(sim.cov, sim.u)
    cos = sim.oracle_direction @ want / np.linalg.norm(sim.oracle_direction) / np.linalg.norm(want)
    assert cos == pytest.approx(1.0, abs=1e-10)
    ev = sim.sample(200, "eval", seed=0)
    y = ev.labels.numpy()
    assert auroc(y, sim.oracle_scores(ev)) > 0.9
    # the cue / nuisance overrides reuse every random draw
    assert torch.equal(sim.sample(10, "train", 1, cue=0.0).mask, sim.sample(10, "train", 1).mask)


def test_quick_gate_passes_against_the_mms_baseline():
    t0 = time.perf_counter()
    report = experiment.run(quick=True, seed=0)
    elapsed = time.perf_counter() - t0
    print(report.metrics, f"{elapsed:.1f}s")
    assert report.passed is True and all(report.checks.values())
    assert list(report.checks) == [c.name for c in experiment.checks(experiment.QUICK)]
    m = report.metrics
    assert m["lr_auroc"] >= m["baseline_mms_auroc"] + 0.10
    assert m["lr_auroc"] >= m["lr_last_token_auroc"] + 0.05
    assert m["oracle_auroc"] > m["lr_auroc"] > 0.8
    assert elapsed < 20


class _SignFlippedLR(LogisticProbe):
    """Broken: the direction's sign is flipped after fitting (deceptive scores lower)."""

    def fit(self, X, y=None):
        super().fit(X, y)
        self.coef_, self.intercept_ = -self.coef_, -self.intercept_
        return self


def test_sign_flipped_probe_fails_the_quick_gate():
    quick = dataclasses.replace(experiment.QUICK, n_seeds=1)
    report = experiment.evaluate(quick, seed=0, make_lr=_SignFlippedLR)
    assert report.passed is False
    assert not any(report.checks.values())
    assert report.metrics["lr_auroc"] < 0.2


@pytest.mark.slow
def test_full_run_is_a_known_miss_of_the_oracle_checks():
    report = experiment.run(quick=False, seed=0)
    print(report.metrics)
    checks = list(report.checks.items())
    assert [ok for _, ok in checks] == [False, False, True, True]
    assert report.passed is False
