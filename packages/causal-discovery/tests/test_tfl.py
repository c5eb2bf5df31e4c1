"""P39 True-False Labels: the RC loss (exact unbiasedness, reductions, weights), TFL generation, the
scikit-learn estimator (clone, pipelines, cross_val_score) and the model-agnostic MRP module."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from icml25.causal_discovery import tfl
from icml25.causal_discovery.tfl import (
    PromptImageGenerator,
    TFLClassifier,
    make_tfl,
    mrp_features,
    retrieve_image_prompts,
    retrieve_text_prompts,
    sharpen_prior,
    tfl_rc_loss,
)
from icml25.kernels import testing as kt
from icml25.kernels.experiment import torch_threads
from icml25.kernels.rng import global_rng_state, isolated_rng


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):  # tiny tensors: more threads only contend on the shared 2-core machine
        yield


def _dirichlet(n: int, K: int, seed: int) -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(seed).dirichlet(np.ones(K), size=n), dtype=torch.float64)


def _blobs(n: int = 300, K: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, n)
    centres = 4.0 * np.eye(K, 4)
    return centres[y] + rng.normal(size=(n, 4)), y


# ------------------------------------------------------------------------------------------ RC loss
@settings(max_examples=10, deadline=None)
@given(K=st.integers(2, 6), seed=st.integers(0, 10_000))
def test_rc_risk_is_exactly_unbiased_over_all_tfl_outcomes(K: int, seed: int) -> None:
    """E over ȳ ~ U{K} and s ~ Bernoulli(p_ȳ) of the per-sample RC loss = Σ_i p_i CE_i (enumerated exactly)."""
    p = _dirichlet(4, K, seed)
    logits = torch.as_tensor(np.random.default_rng(seed + 1).normal(size=(4, K)) * 3)
    ce = -torch.log_softmax(logits, 1)
    expected = (p * ce).sum(1)
    total = torch.zeros(4, dtype=torch.float64)
    for yb, s in itertools.product(range(K), (True, False)):
        ybar = torch.full((4,), yb)
        sv = torch.full((4,), s)
        prob = p[:, yb] if s else 1 - p[:, yb]
        total += prob / K * tfl_rc_loss(logits, ybar, sv, p, reduction="none")
    torch.testing.assert_close(total, expected, rtol=1e-9, atol=1e-9)


def test_rc_risk_monte_carlo_within_three_standard_errors_and_official_form_is_biased() -> None:
    K, n_draws = 5, 40_000
    rng = np.random.default_rng(3)
    p = _dirichlet(1, K, 7).repeat(n_draws, 1)
    logits = torch.as_tensor(rng.normal(size=(1, K)) * 2).repeat(n_draws, 1)
    target = float((p[0] * -torch.log_softmax(logits[0], 0)).sum())
    y = torch.as_tensor(np.array([rng.choice(K, p=p[0].numpy()) for _ in range(n_draws)]))
    ybar = torch.as_tensor(rng.integers(0, K, n_draws))
    s = y == ybar
    per = tfl_rc_loss(logits, ybar, s, p, reduction="none")
    se = float(per.std()) / np.sqrt(n_draws)
    assert abs(float(per.mean()) - target) < 3 * se
    raw = tfl_rc_loss(logits, ybar, s, p, normalize=False, reduction="none")
    assert abs(float(raw.mean()) - target) > 10 * se  # the unnormalised weights are not risk-consistent


def test_all_true_reduces_to_cross_entropy() -> None:
    logits = torch.randn(7, 4, generator=torch.Generator().manual_seed(0))
    ybar = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    prior = _dirichlet(7, 4, 0).float()
    for normalize in (True, False):
        got = tfl_rc_loss(logits, ybar, torch.ones(7, dtype=torch.bool), prior, normalize=normalize)
        torch.testing.assert_close(got, F.cross_entropy(logits, ybar))


def _false_weights(prior: torch.Tensor, ybar: torch.Tensor, normalize: bool) -> torch.Tensor:
    """The weights w recovered from the gradient at zero logits: d/dz (-Σ w_i log_softmax_i) = Σw/K − w."""
    n, K = prior.shape
    z = torch.zeros(n, K, dtype=torch.float64, requires_grad=True)
    tfl_rc_loss(
        z, ybar, torch.zeros(n, dtype=torch.bool), prior, normalize=normalize, reduction="sum"
    ).backward()
    loss_per = tfl_rc_loss(z.detach(), ybar, torch.zeros(n, dtype=torch.bool), prior, normalize=normalize,
                           reduction="none")  # fmt: skip
    total = loss_per / np.log(K)  # at zero logits every CE_i = log K
    return total[:, None] / K - z.grad


def test_normalised_false_weights_sum_to_one_and_skip_the_candidate() -> None:
    prior = _dirichlet(6, 5, 1)
    ybar = torch.tensor([0, 1, 2, 3, 4, 0])
    w = _false_weights(prior, ybar, True)
    torch.testing.assert_close(w.sum(1), torch.ones(6, dtype=torch.float64))
    torch.testing.assert_close(
        w[torch.arange(6), ybar], torch.zeros(6, dtype=torch.float64), atol=1e-12, rtol=0
    )
    expected = prior.clone()
    expected[torch.arange(6), ybar] = 0
    torch.testing.assert_close(w, expected / expected.sum(1, keepdim=True))
    w_raw = _false_weights(prior, ybar, False)  # the official RC_loss: w_i = p_i, i != ȳ
    torch.testing.assert_close(w_raw, expected)


def test_certain_prior_on_a_false_answer_is_clipped_not_nan() -> None:
    logits = torch.randn(3, 4, requires_grad=True)
    prior = F.one_hot(torch.tensor([2, 0, 1]), 4).float()
    loss = tfl_rc_loss(logits, torch.tensor([2, 0, 1]), torch.zeros(3, dtype=torch.bool), prior)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()


def test_gradients_flow_through_logits_only() -> None:
    logits = torch.randn(5, 3, requires_grad=True)
    prior = torch.full((5, 3), 1 / 3, requires_grad=True)
    tfl_rc_loss(logits, torch.tensor([0, 1, 2, 0, 1]), torch.tensor([1, 0, 0, 1, 0]), prior).backward()
    assert prior.grad is None and logits.grad is not None and logits.grad.abs().sum() > 0


def test_official_reduction_is_mean_true_plus_sum_false() -> None:
    logits = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    ybar, s = torch.tensor([0, 1, 2, 0, 1, 2]), torch.tensor([1, 1, 0, 0, 0, 0]).bool()
    prior = _dirichlet(6, 3, 2).float()
    per = tfl_rc_loss(logits, ybar, s, prior, normalize=False, reduction="none")
    got = tfl_rc_loss(logits, ybar, s, prior, normalize=False, reduction="official")
    torch.testing.assert_close(got, per[s].mean() + per[~s].sum())
    # the official RC_loss expression: Σ_i p_i CE_i − p_ȳ CE_ȳ
    ce = -torch.log_softmax(logits, 1)
    official = (prior * ce).sum(1) - prior[torch.arange(6), ybar] * ce[torch.arange(6), ybar]
    torch.testing.assert_close(per[~s], official[~s])


def test_sharpen_prior_identity_one_hot_and_distance_temperature() -> None:
    d = torch.tensor([[1.0, 2.0, 4.0], [3.0, 0.5, 0.7]], dtype=torch.float64)
    p = torch.softmax(-d, 1)
    torch.testing.assert_close(sharpen_prior(p, 1.0), p)
    torch.testing.assert_close(sharpen_prior(p, 0.25), torch.softmax(-d / 0.25, 1))
    assert sharpen_prior(p, 0.0).tolist() == [[1, 0, 0], [0, 1, 0]]


# ------------------------------------------------------------------------------------------ make_tfl
def test_make_tfl_from_labels_and_from_scoring_callables() -> None:
    y = np.random.default_rng(0).integers(0, 4, 20_000)
    ybar, s = make_tfl(y, 4, seed=1)
    assert ybar.dtype == np.int64 and s.dtype == bool
    assert np.array_equal(s, y == ybar)
    assert np.allclose(np.bincount(ybar) / len(y), 0.25, atol=0.02)
    _, s_noisy = make_tfl(y, 4, annotator_acc=0.9, seed=1)
    assert abs(np.mean(s_noisy != s) - 0.1) < 0.01
    assert np.array_equal(make_tfl(y, 4, seed=5)[0], make_tfl(y, 4, seed=5)[0])
    X = y[:, None].astype(float)
    yb2, s2 = make_tfl(lambda X_, yb: X_[:, 0] == yb, 4, X, seed=1)  # a yes/no callable
    assert np.array_equal(yb2, ybar) and np.array_equal(s2, s)
    clf = LogisticRegression(max_iter=500).fit(*_blobs(600))
    Xb, _ = _blobs(50, seed=1)
    yb3, s3 = make_tfl(lambda X_, yb: clf.predict_proba(X_)[np.arange(len(X_)), yb], 3, Xb, seed=0)
    assert np.array_equal(s3, clf.predict_proba(Xb)[np.arange(50), yb3] >= 0.5)


# ------------------------------------------------------------------------------------------ complementary baselines
def test_complementary_losses_match_their_formulas() -> None:
    """SCL-NL is CE on True plus −log(1 − q_ȳ) on False; Ishida's unbiased form is the mean of
    ``Σ_j CE_j − (K − 1) CE_ȳ`` on False; the non-negative form clips its per-class terms at 0."""
    g = torch.Generator().manual_seed(0)
    K = 5
    logits = 3 * torch.randn(40, K, generator=g, dtype=torch.float64)
    ybar = torch.randint(0, K, (40,), generator=g)
    s = torch.rand(40, generator=g) < 0.25
    log_q = torch.log_softmax(logits, 1)
    ce_bar = -log_q[torch.arange(40), ybar]
    scl = torch.where(s, ce_bar, -torch.log1p(-log_q.exp()[torch.arange(40), ybar])).mean()
    torch.testing.assert_close(tfl._complementary_loss(logits, ybar, s, "scl_nl"), scl)
    ure = torch.where(s, ce_bar, -log_q.sum(1) - (K - 1) * ce_bar).mean()
    torch.testing.assert_close(tfl._complementary_loss(logits, ybar, s, "unbiased"), ure)
    f = ~s
    terms = torch.stack(
        [(-log_q[f, k]).sum() - (K - 1) * (-log_q[f & (ybar == k), k]).sum() for k in range(K)]
    )
    assert bool((terms < 0).any())  # the example exercises the correction
    nn_risk = (ce_bar[s].sum() + terms.clamp(min=0).sum()) / 40
    torch.testing.assert_close(tfl._complementary_loss(logits, ybar, s, "non_negative"), nn_risk)
    assert float(nn_risk) > float(ure)
    only_true = torch.ones(40, dtype=torch.bool)
    for form in ("scl_nl", "unbiased", "non_negative"):
        torch.testing.assert_close(tfl._complementary_loss(logits, ybar, only_true, form), ce_bar.mean())


def test_complementary_estimators_learn_from_false_answers() -> None:
    X, y = _blobs(400)
    ybar, s = make_tfl(y, 3, seed=0)
    Xt, yt = _blobs(300, seed=9)
    for loss in ("complementary", "complementary_nn"):
        assert TFLClassifier((16,), loss=loss, epochs=30, seed=0).fit(X, ybar, s).score(Xt, yt) > 0.9, loss


# ------------------------------------------------------------------------------------------ estimator
def test_estimator_learns_from_tfl_and_all_true_equals_supervised() -> None:
    X, y = _blobs(400)
    ybar, s = make_tfl(y, 3, seed=0)
    prior = np.full((400, 3), 1 / 3)
    model = TFLClassifier((16,), epochs=30, seed=0).fit(X, ybar, s, prior=prior)
    Xt, yt = _blobs(300, seed=9)
    assert model.score(Xt, yt) > 0.9
    assert model.predict_proba(Xt).shape == (300, 3)
    np.testing.assert_allclose(model.predict_proba(Xt).sum(1), 1.0)
    assert list(model.classes_) == [0, 1, 2] and model.n_features_in_ == 4 and len(model.loss_curve_) == 30
    ones = np.ones(400, dtype=bool)
    a = TFLClassifier((16,), epochs=5, seed=3).fit(X, y, ones, prior=prior)
    b = TFLClassifier((16,), epochs=5, seed=3, prior_weight=0.0, normalize=False).fit(X, y, ones)
    np.testing.assert_allclose(a.decision_function(Xt), b.decision_function(Xt), rtol=1e-5, atol=1e-6)


def test_two_column_target_equals_separate_answers_and_is_deterministic() -> None:
    X, y = _blobs(200)
    ybar, s = make_tfl(y, 3, seed=0)
    a = TFLClassifier((8,), epochs=5, seed=1).fit(X, ybar, s)
    b = TFLClassifier((8,), epochs=5, seed=1).fit(X, np.column_stack([ybar, s]))
    np.testing.assert_array_equal(a.decision_function(X), b.decision_function(X))
    agree = a.score(X, np.column_stack([ybar, s]))
    assert agree == np.mean((a.predict(X) == ybar) == s)


def test_sklearn_clone_pipeline_and_cross_val_score() -> None:
    X, y = _blobs(300)
    ybar, s = make_tfl(y, 3, annotator_acc=0.97, seed=0)
    Y = np.column_stack([ybar, s])
    zero_shot = LogisticRegression(max_iter=500).fit(*_blobs(30, seed=5))  # a weak "VLM" prior
    est = TFLClassifier((16,), epochs=20, seed=0, n_classes=3)
    twin = clone(est)
    assert twin.get_params() == est.get_params() and not hasattr(twin, "coefs_")
    pipe = make_pipeline(StandardScaler(), est).fit(X, Y, tflclassifier__prior=zero_shot.predict_proba(X))
    assert pipe.score(*_blobs(200, seed=8)) > 0.8
    # The prior as a fitted sklearn classifier: evaluated on each fold's training rows.
    scores = cross_val_score(clone(est), X, Y, cv=3, params={"prior": zero_shot})
    # TFL agreement on held-out folds (a constant predictor agrees about 5/9 of the time at K = 3)
    assert scores.shape == (3,) and scores.mean() > 0.75


def test_rejected_fit_keeps_state_and_not_fitted_error() -> None:
    X, y = _blobs(100)
    ybar, s = make_tfl(y, 3, seed=0)
    model = TFLClassifier((8,), epochs=2)
    with pytest.raises(ValueError, match="This TFLClassifier instance is not fitted yet"):
        model.predict(X)
    model.fit(X, ybar, s)
    before = kt.snapshot_state(model)
    with pytest.raises(ValueError, match="prior"):
        model.fit(X, ybar, s, prior=np.full((100, 3), 0.5))
    assert kt.states_equal(before, kt.snapshot_state(model))
    model.set_params(lr=-1.0)
    before = kt.snapshot_state(model)
    with pytest.raises(ValueError, match="lr"):
        model.fit(X, ybar, s)
    assert kt.states_equal(before, kt.snapshot_state(model))


def test_fit_leaves_global_rng_untouched() -> None:
    X, y = _blobs(100)
    ybar, s = make_tfl(y, 3, seed=0)
    before = global_rng_state()
    TFLClassifier((8,), epochs=2, seed=4).fit(X, ybar, s)
    assert global_rng_state() == before


# ------------------------------------------------------------------------------------------ bad inputs (§8)
def test_ybar_outside_range_is_rejected() -> None:
    logits, prior = torch.zeros(3, 3), torch.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match=r"ybar must hold class indices in \[0, 3\)"):
        tfl_rc_loss(logits, torch.tensor([0, 3, 1]), torch.tensor([1, 0, 1]), prior)
    X, _ = _blobs(10)
    with pytest.raises(ValueError, match=r"ybar.*\[0, 3\)"):
        TFLClassifier(epochs=1).fit(X, np.arange(10) % 4, np.ones(10), prior=np.full((10, 3), 1 / 3))


def test_s_not_boolean_is_rejected() -> None:
    logits, prior = torch.zeros(3, 3), torch.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match="s must be boolean or 0/1"):
        tfl_rc_loss(logits, torch.tensor([0, 1, 2]), torch.tensor([0.5, 1.0, 0.0]), prior)
    with pytest.raises(ValueError, match="s must be boolean or 0/1"):
        TFLClassifier(epochs=1).fit(*_blobs(10), s=np.full(10, 2))


def test_prior_not_summing_to_one_or_wrong_shape_is_rejected() -> None:
    logits = torch.zeros(3, 3)
    args = (torch.tensor([0, 1, 2]), torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="prior rows must sum to 1"):
        tfl_rc_loss(logits, *args, torch.full((3, 3), 0.5))
    with pytest.raises(ValueError, match=r"prior must have shape \(3, 3\)"):
        tfl_rc_loss(logits, *args, torch.full((3, 4), 0.25))
    with pytest.raises(ValueError, match="prior must be non-negative"):
        tfl_rc_loss(logits, *args, torch.tensor([[1.5, -0.5, 0.0]] * 3))


def test_all_false_without_prior_warns() -> None:
    X, _ = _blobs(30)
    with pytest.warns(RuntimeWarning, match="complementary-label learning"):
        TFLClassifier((4,), epochs=1, n_classes=3).fit(X, np.arange(30) % 3, np.zeros(30, dtype=bool))


def test_single_class_is_rejected() -> None:
    with pytest.raises(ValueError, match="logits must have K >= 2"):
        tfl_rc_loss(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long), torch.ones(3), torch.ones(3, 1))
    with pytest.raises(ValueError, match="n_classes must be an int >= 2"):
        make_tfl(np.zeros(5, dtype=int), 1)
    with pytest.raises(ValueError, match="n_classes must be >= 2"):
        TFLClassifier(epochs=1).fit(np.ones((4, 2)), np.zeros(4, dtype=int), np.ones(4))


# ------------------------------------------------------------------------------------------ MRP
def test_retrieval_matches_brute_force_cosine_ranking() -> None:
    g = torch.Generator().manual_seed(0)
    e, T = torch.randn(8, generator=g), torch.randn(40, 8, generator=g)
    idx = retrieve_text_prompts(e, T, n_prompts=15)
    cos = [float(F.cosine_similarity(e, t, dim=0)) for t in T]
    assert idx.tolist() == sorted(range(40), key=lambda i: -cos[i])[:15]
    assert (
        len(retrieve_text_prompts(e, T[:10], n_prompts=15)) == 2
    )  # n >= K: int(0.2 K), as the official code
    assert len(retrieve_text_prompts(e, T[:20], n_prompts=15)) == 12  # capped by the top 60% of classes
    E = torch.randn(3000, 8, generator=g)
    pick = retrieve_image_prompts(e, E, n_prompts=5, pool=1000, seed=1)
    pool = torch.randperm(3000, generator=torch.Generator().manual_seed(1))[:1000]
    cos_pool = F.cosine_similarity(E[pool], e[None].expand(1000, -1), dim=1)
    assert pick.tolist() == pool[cos_pool.argsort(descending=True)[:5]].tolist()
    assert len(retrieve_image_prompts(e, E[:200], n_prompts=5, seed=0)) == 5  # pool = 10% of a small set


def test_mrp_features_shape_and_prompt_generator_gets_gradients() -> None:
    with isolated_rng(0):
        gen = PromptImageGenerator(size=8)
        encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 6))  # any image encoder
        for p in encoder.parameters():
            p.requires_grad_(False)
    assert gen().shape == (1, 3, 8, 8)
    images = torch.randn(10, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    img_emb = encoder(images)
    e_p = encoder(gen())[0]
    text = torch.randn(12, 6, generator=torch.Generator().manual_seed(3))
    t_idx = retrieve_text_prompts(e_p, text, n_prompts=4)
    i_idx = retrieve_image_prompts(e_p, img_emb, n_prompts=2, pool=10, seed=0)
    feats = mrp_features(img_emb, e_p, text[t_idx], img_emb[i_idx])
    assert feats.shape == (10, 6 * (2 + 4 + 2))
    torch.testing.assert_close(feats[:, :6], img_emb)
    torch.testing.assert_close(feats[3, 6:12], e_p)
    head = torch.nn.Linear(feats.shape[1], 4, bias=False)
    loss = tfl_rc_loss(
        head(feats), torch.arange(10) % 4, torch.arange(10) % 3 == 0, torch.full((10, 4), 0.25)
    )
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gen.parameters() if p.ndim > 1)


def test_mrp_bad_inputs_name_the_argument() -> None:
    e = torch.randn(4)
    with pytest.raises(ValueError, match="class_text_emb must have embedding dimension 4"):
        retrieve_text_prompts(e, torch.randn(5, 3))
    with pytest.raises(ValueError, match="n_prompts must be <= the pool size"):
        retrieve_image_prompts(e, torch.randn(20, 4), n_prompts=50, pool=10)
    with pytest.raises(TypeError, match=r"image_emb must be a torch\.Tensor, got numpy\.ndarray"):
        mrp_features(np.ones((2, 4)), e, torch.randn(1, 4), torch.randn(1, 4))
    with pytest.raises(TypeError, match=r"image_emb must be a float tensor, got .*torch\.int64"):
        mrp_features(torch.ones(2, 4, dtype=torch.long), e, torch.randn(1, 4), torch.randn(1, 4))


def test_public_names() -> None:
    assert set(tfl.__all__) >= {"TFLClassifier", "make_tfl", "tfl_rc_loss"}
