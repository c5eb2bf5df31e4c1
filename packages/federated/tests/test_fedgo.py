"""Tests of P10 FedGO: the weighting rule, pseudo-labels, generator, discriminators, distillation, the server
step and loop, and the quick reproduction's verdict (with a deliberately broken FedGO)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.federated import (
    FedGOAggregator,
    FedGOConfig,
    FedGOServer,
    GaussianGenerator,
    client_moments,
    discriminator_logits,
    distill,
    ensemble_pseudo_labels,
    ensemble_weights,
    fedgo_weights,
    load_federated_arrays,
    make_discriminator,
    make_mlp,
    predict_logits,
    train_discriminator,
    weighted_mean_state,
)
from icml25.federated.experiments import fedgo as experiment
from icml25.kernels.experiment import Report

torch.set_num_threads(1)


def _gauss_logpdf(x: torch.Tensor, mean: torch.Tensor, std: float) -> torch.Tensor:
    d = x.shape[1]
    return -0.5 * ((x - mean) ** 2).sum(1) / std**2 - d * math.log(std) - 0.5 * d * math.log(2 * math.pi)


# ------------------------------------------------------------------------------------ the weighting rule


def test_bayes_optimal_discriminators_give_the_true_density_weights() -> None:
    """D_k = p_k/(p_k + p_g) from analytic Gaussians: the weights equal n_k p_k / Σ_j n_j p_j (1e-6)."""
    g = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(200, 2, generator=g, dtype=torch.float64)
    means = [torch.tensor([2.0, 0.0]), torch.tensor([-2.0, 1.0]), torch.tensor([0.0, -2.5])]
    log_pk = torch.stack([_gauss_logpdf(x, m.double(), 1.0) for m in means])  # [K, B]
    log_pg = _gauss_logpdf(x, torch.zeros(2, dtype=torch.float64), 3.0)
    d = torch.exp(log_pk) / (torch.exp(log_pk) + torch.exp(log_pg))  # the optimal discriminators
    logits = torch.log(d) - torch.log1p(-d)
    n = torch.tensor([50.0, 120.0, 30.0], dtype=torch.float64)
    expected = n[:, None] * torch.exp(log_pk)
    expected = expected / expected.sum(0)
    w = fedgo_weights(logits, n)
    assert torch.allclose(w, expected, atol=1e-6, rtol=0)
    # the probability (not odds) bug, weights ∝ n_k D_k, is not the density weighting
    wrong = n[:, None] * d / (n[:, None] * d).sum(0)
    assert (wrong - expected).abs().max() > 0.05
    # "oracle" = FedGO with the true log-densities (p_g cancels)
    cl = torch.randn(3, 200, 4, generator=g, dtype=torch.float64)
    assert torch.allclose(ensemble_weights("oracle", cl, n, log_density=log_pk), expected, atol=1e-12)


def test_equal_logits_give_size_weights_and_equal_sizes_give_fedddf() -> None:
    g = torch.Generator().manual_seed(1)
    ell = torch.randn(1, 7, generator=g).expand(4, 7).clone()
    n = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert torch.allclose(fedgo_weights(ell, n), (n / n.sum())[:, None].expand(4, 7), atol=1e-6)
    cl = torch.randn(4, 7, 5, generator=g)
    w = fedgo_weights(ell, torch.full((4,), 9.0))
    uniform = ensemble_weights("uniform", cl, torch.full((4,), 9.0))
    for average in ("prob", "logit"):
        assert torch.allclose(
            ensemble_pseudo_labels(cl, w, average), ensemble_pseudo_labels(cl, uniform, average)
        )
    assert torch.allclose(ensemble_weights("size", cl, n), (n / n.sum())[:, None].expand(4, 7))


def test_extreme_logits_are_finite_and_normalised() -> None:
    ell = torch.tensor([[100.0, -100.0, 100.0], [-100.0, -100.0, 100.0], [0.0, -100.0, -100.0]])
    w = fedgo_weights(ell, torch.tensor([1.0, 1.0, 1.0]))
    assert torch.isfinite(w).all() and (w >= 0).all()
    assert torch.allclose(w.sum(0), torch.ones(3))
    assert torch.allclose(w[:, 1], torch.full((3,), 1 / 3))  # all equal at -100
    clipped = fedgo_weights(ell, torch.ones(3), logit_clip=1.0)
    assert clipped.max() < w.max()  # logit_clip tempers overconfident discriminators


@settings(max_examples=30, deadline=None)
@given(
    k=st.integers(1, 5),
    b=st.integers(1, 6),
    shift=st.floats(-50, 50),
    seed=st.integers(0, 10_000),
)
def test_weights_properties(k: int, b: int, shift: float, seed: int) -> None:
    """Non-negative columns summing to 1; permuting clients permutes the weights; a common shift is void."""
    g = torch.Generator().manual_seed(seed)
    ell = 5 * torch.randn(k, b, generator=g, dtype=torch.float64)
    n = torch.randint(1, 100, (k,), generator=g).double()
    w = fedgo_weights(ell, n)
    assert (w >= 0).all() and torch.allclose(w.sum(0), torch.ones(b, dtype=torch.float64))
    perm = torch.randperm(k, generator=g)
    assert torch.allclose(fedgo_weights(ell[perm], n[perm]), w[perm], atol=1e-12)
    assert torch.allclose(fedgo_weights(ell + shift, n), w, atol=1e-9)
    assert torch.allclose(fedgo_weights(ell, 7 * n), w, atol=1e-12)  # only relative sizes matter


def test_pseudo_labels_are_distributions_for_both_averages() -> None:
    g = torch.Generator().manual_seed(2)
    cl = 4 * torch.randn(3, 10, 6, generator=g)
    w = torch.softmax(torch.randn(3, 10, generator=g), 0)
    for average in ("prob", "logit"):
        q = ensemble_pseudo_labels(cl, w, average)
        assert q.shape == (10, 6) and (q >= 0).all() and torch.allclose(q.sum(1), torch.ones(10))
    one_hot = torch.zeros(3, 10)
    one_hot[1] = 1.0
    assert torch.allclose(ensemble_pseudo_labels(cl, one_hot), torch.softmax(cl[1], -1))
    # entropy weighting favours the confident client
    cl2 = torch.zeros(2, 1, 3)
    cl2[0, 0, 0] = 10.0
    assert ensemble_weights("entropy", cl2, [1.0, 1.0])[0, 0] > 0.5


# ---------------------------------------------------------------------------------- generator, discriminator


def test_gaussian_generator_fit_moments_sampling_and_state() -> None:
    g = torch.Generator().manual_seed(3)
    a = torch.tensor([[2.0, 0.0, 0.0], [0.5, 1.0, 0.0], [0.0, -0.3, 0.5]])
    x = torch.randn(4000, 3, generator=g) @ a.T + torch.tensor([1.0, -2.0, 0.5])
    gen = GaussianGenerator(ridge=1e-6).fit(x)
    ref_cov = torch.cov(x.double().T, correction=0)
    assert torch.allclose(gen.mean, x.double().mean(0), atol=1e-9)
    assert torch.allclose(gen.cov, ref_cov + 1e-6 * torch.eye(3, dtype=torch.float64), atol=1e-9)
    # federated (no server data): the clients' summed moments give the same generator
    fed = GaussianGenerator(ridge=1e-6).from_moments([client_moments(x[:1000]), client_moments(x[1000:])])
    assert torch.allclose(fed.mean, gen.mean, atol=1e-9) and torch.allclose(fed.cov, gen.cov, atol=1e-9)
    mvn = torch.distributions.MultivariateNormal(gen.mean, gen.cov)
    assert torch.allclose(gen.log_prob(x[:20]), mvn.log_prob(x[:20].double()), atol=1e-8)
    s = gen.sample(5000, generator=torch.Generator().manual_seed(0))
    assert s.shape == (5000, 3) and s.dtype == torch.float32
    assert torch.allclose(s.double().mean(0), gen.mean, atol=0.1)
    again = GaussianGenerator.from_state(gen.state_dict())
    assert torch.equal(
        again.sample(5, torch.Generator().manual_seed(1)), gen.sample(5, torch.Generator().manual_seed(1))
    )
    with pytest.raises(ValueError, match="not fitted"):
        GaussianGenerator().sample(3)


def test_trained_discriminator_estimates_the_log_density_ratio() -> None:
    """1-D: p_k = N(2, 0.5²), p_g = N(0, 2²); the trained logit tracks log p_k - log p_g where p_k lives."""
    g = torch.Generator().manual_seed(4)
    x = 2 + 0.5 * torch.randn(800, 1, generator=g)
    gen = GaussianGenerator().set_params(torch.zeros(1), torch.full((1, 1), 4.0))
    disc = train_discriminator(make_discriminator(1, 32, seed=0), x, gen, epochs=40, weight_decay=0.0, seed=0)
    for (lo, hi), max_err, min_corr in (((1.0, 3.0), 0.5, 0.9), ((0.5, 3.5), 1.0, 0.85)):
        grid = torch.linspace(lo, hi, 31)[:, None]
        true = _gauss_logpdf(grid, torch.tensor([2.0]), 0.5) - _gauss_logpdf(grid, torch.tensor([0.0]), 2.0)
        est = discriminator_logits([disc], grid)[0]
        assert (est - true).abs().mean() < max_err
        assert torch.corrcoef(torch.stack([est, true]))[0, 1] > min_corr


def test_distillation_matches_the_teacher() -> None:
    g = torch.Generator().manual_seed(5)
    u = torch.randn(500, 4, generator=g)
    teacher = make_mlp(4, 16, 3, seed=1)
    q = torch.softmax(3 * predict_logits([teacher], u)[0], -1)
    student = distill(make_mlp(4, 16, 3, seed=2), u, q, steps=400, lr=1e-2, seed=0)
    agree = (predict_logits([student], u)[0].argmax(-1) == q.argmax(-1)).float().mean()
    assert agree > 0.9


def test_weighted_mean_state_is_fedavg() -> None:
    a, b = {"w": torch.ones(2, 2), "c": torch.tensor(3)}, {"w": 3 * torch.ones(2, 2), "c": torch.tensor(7)}
    out = weighted_mean_state([a, b], [1, 3])
    assert torch.allclose(out["w"], torch.full((2, 2), 2.5)) and int(out["c"]) == 3


# ------------------------------------------------------------------------------------- server step / loop


def _small_federation(n_clients: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.tensor([[4.0, 0.0], [0.0, 4.0], [-4.0, 0.0], [0.0, -4.0]])
    y = torch.arange(4).repeat_interleave(150)
    x = centers[y] + 0.7 * torch.randn(len(y), 2, generator=g)
    return load_federated_arrays(
        x.numpy(),
        y.numpy(),
        n_clients,
        split="dirichlet",
        alpha=0.05,
        test_size=0.25,
        val_size=0.3,
        seed=seed,
    )


def test_aggregator_validates_before_training_and_names_the_missing_client() -> None:
    data = _small_federation()
    model_fn = lambda: make_mlp(2, 16, 4)  # noqa: E731
    agg = FedGOAggregator(FedGOConfig(distill_steps=5, disc_epochs=2), model_fn, data.x_val)
    st_ = make_mlp(2, 16, 4, seed=0).state_dict()
    with pytest.raises(RuntimeError, match="run pre_fl first"):
        agg.aggregate(0, [(0, st_), (1, st_)])
    gen = GaussianGenerator().fit(data.x_val)
    agg.pre_fl(gen)
    x0 = data.clients[0][0]
    agg.register_client(0, len(x0), train_discriminator(make_discriminator(2, 64, seed=0), x0, gen, epochs=2))
    agg.register_client(1, 10)
    before = {k: v.clone() for k, v in agg._student.state_dict().items()}
    with pytest.raises(KeyError, match=r"\[1\]"):
        agg.aggregate(0, [(0, st_), (1, st_)])
    assert all(torch.equal(before[k], v) for k, v in agg._student.state_dict().items())
    with pytest.raises(ValueError, match="unlabeled must not be empty"):
        FedGOAggregator(FedGOConfig(), model_fn, torch.empty(0, 2))


@pytest.mark.parametrize("server_data", [True, False])
def test_fedgo_server_beats_feddf_on_label_skewed_blobs(server_data: bool) -> None:
    """Two rounds on 4 label-skewed clients, with and without a server dataset: FedGO's global model is
    at least as good as FedDF's and learns the task; its weights concentrate (entropy below uniform's)."""
    data = _small_federation()
    from icml25.federated import LocalTrainConfig

    kw = dict(
        clients_per_round=4,
        train=LocalTrainConfig(epochs=5, lr=0.1),
        seed=0,
        model_fn=lambda: make_mlp(2, 16, 4),
    )
    u = data.x_val if server_data else None
    acc = {}
    for weighting in ("fedgo", "uniform"):
        cfg = FedGOConfig(
            weighting=weighting, distill_steps=200, distill_lr=5e-3, disc_epochs=20, n_synthetic=500
        )
        server = FedGOServer(data, cfg, u, **kw)
        server.pre_fl()
        hist = server.fit(2)
        acc[weighting] = hist.test_acc[-1]
        agg = server.aggregator
        assert len(agg.weight_entropy) == 2 and agg.unlabeled is not None
        if weighting == "fedgo":
            assert set(agg.discriminators) == {0, 1, 2, 3}
            assert agg.weight_entropy[-1] < math.log(4) - 0.3
    assert acc["fedgo"] >= 0.9 and acc["fedgo"] >= acc["uniform"]


# ------------------------------------------------------------------------------------------- bad inputs


def test_bad_inputs_raise_clear_errors() -> None:
    cl, ell = torch.randn(3, 5, 4), torch.randn(3, 5)
    with pytest.raises(ValueError, match="n_samples must have one entry per client"):
        fedgo_weights(ell, [1.0, 2.0])
    with pytest.raises(ValueError, match="disc_logits must have shape"):
        ensemble_weights("fedgo", cl, [1.0, 1.0, 1.0], disc_logits=torch.randn(2, 5))
    with pytest.raises(ValueError, match="weights must have shape"):
        ensemble_pseudo_labels(cl, torch.full((2, 5), 0.5))
    with pytest.raises(ValueError, match="n_samples must be finite and > 0"):
        fedgo_weights(ell, [1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="n_samples must be finite and > 0"):
        fedgo_weights(ell, [1.0, -3.0, 2.0])
    with pytest.raises(ValueError, match="needs disc_logits"):
        ensemble_weights("fedgo", cl, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="weighting must be one of"):
        ensemble_weights("median", cl, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="average must be"):
        ensemble_pseudo_labels(cl, torch.full((3, 5), 1 / 3), "geometric")
    with pytest.raises(ValueError, match="unlabeled must not be empty"):
        distill(make_mlp(4, 8, 3), torch.empty(0, 4), torch.empty(0, 3))
    with pytest.raises(ValueError, match="same number of classes"):
        predict_logits([make_mlp(4, 8, 3, seed=0), make_mlp(4, 8, 5, seed=0)], torch.randn(2, 4))
    gen3 = GaussianGenerator().fit(torch.randn(50, 3))
    with pytest.raises(ValueError, match=r"generator samples must have shape \[m, d\] with d = 4"):
        train_discriminator(make_discriminator(4, seed=0), torch.randn(20, 4), gen3)
    with pytest.raises(ValueError, match="weighting must be one of"):
        FedGOConfig(weighting="oracle")


def test_probabilities_at_zero_and_one_are_clamped_with_a_warning() -> None:
    probs = torch.tensor([[1.0, 0.0, 0.5], [0.0, 0.0, 0.5]])
    with pytest.warns(RuntimeWarning, match="clamped"):
        w = fedgo_weights(probs, [1.0, 1.0], from_probs=True)
    assert torch.isfinite(w).all() and torch.allclose(w.sum(0), torch.ones(3))
    assert w[0, 0] > 0.99 and torch.allclose(w[:, 2], torch.full((2,), 0.5))
    with pytest.raises(ValueError, match="probabilities in"):
        fedgo_weights(torch.tensor([[2.0], [0.5]]), [1.0, 1.0], from_probs=True)


# ------------------------------------------------------------------------------------------ reproduction


def test_quick_reproduction_passes() -> None:
    report = experiment.run(quick=True, seed=0)
    m = report.metrics
    assert report.passed, report.summary() if hasattr(report, "summary") else m
    assert m["fedgo_ens_acc"] >= m["oracle_ens_acc"] - 0.03
    assert m["fedgo_ens_acc"] >= m["baseline_uniform_ens_acc"] + 0.15
    assert m["tv_to_oracle"] < 0.15
    assert m["fedgo_distilled_acc"] > m["baseline_uniform_distilled_acc"]


def test_sign_error_fails_the_quick_gate() -> None:
    """A FedGO with the odds inverted, (1 - D)/D, routes samples to the wrong clients and fails."""
    metrics, _ = experiment.measure(experiment.QUICK, 0, broken="sign")
    report = Report.from_checks(
        paper="P10",
        claim="",
        checks=experiment.checks(experiment.QUICK),
        metrics=metrics,
        headline="fedgo_ens_acc",
        baseline="baseline_uniform_ens_acc",
    )
    assert not report.passed
    assert metrics["fedgo_ens_acc"] < metrics["baseline_uniform_ens_acc"] + 0.15
    assert metrics["tv_to_oracle"] > 0.5


def test_swapped_discriminators_fail_the_quick_gate() -> None:
    """Each client weighted by another client's discriminator: the density ratios no longer match the data."""
    metrics, _ = experiment.measure(experiment.QUICK, 0, broken="swap")
    assert metrics["fedgo_ens_acc"] < metrics["baseline_uniform_ens_acc"] + 0.15
    assert metrics["tv_to_oracle"] > 0.5
