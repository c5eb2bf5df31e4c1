"""P50 FedCEO, the official protocol's pieces: per-sample DP-SGD, Poisson batches, a fresh privacy engine
per round, the RDP accountant against Opacus, forking runs at the first smoothing, Fashion-MNIST clients."""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import pytest
import torch

from icml25.federated import (
    DPConfig,
    DPFedAvgServer,
    FedCEOConfig,
    FedCEOServer,
    FederatedPrivacyLedger,
    LocalTrainConfig,
    RDPAccountant,
    load_federated_digits,
    make_mlp,
)
from icml25.federated.dp import DEFAULT_ORDERS, dp_sgd_gradients, per_sample_clipped_sum
from icml25.federated.fedceo import FedAvgAggregator, FedCEOAggregator
from icml25.federated.training import client_update, upload_noise_std

torch.set_num_threads(1)
CE = torch.nn.functional.cross_entropy


def _per_sample_grads_loop(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Test oracle: one backward pass per sample, flattened over all parameters."""
    out = []
    for i in range(x.shape[0]):
        grads = torch.autograd.grad(CE(model(x[i : i + 1]), y[i : i + 1]), list(model.parameters()))
        out.append(torch.cat([g.flatten() for g in grads]))
    return out


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("method", ["linear", "vmap"])
def test_per_sample_clipping_matches_a_loop_over_samples(bias: bool, method: str) -> None:
    model = make_mlp(12, 7, 4, bias=bias, seed=0).double()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(9, 12, generator=g, dtype=torch.float64), torch.randint(0, 4, (9,), generator=g)
    per_sample = _per_sample_grads_loop(model, x, y)
    norms_ref = torch.stack([p.norm() for p in per_sample])
    clip = float(norms_ref.median())  # about half the samples are clipped
    ref = sum(p * min(1.0, clip / (float(p.norm()) + 1e-6)) for p in per_sample)
    sums, norms = per_sample_clipped_sum(model, CE, x, y, clip, method=method)
    assert torch.allclose(norms, norms_ref, atol=1e-10)
    assert torch.allclose(torch.cat([s.flatten() for s in sums.values()]), ref, atol=1e-10)
    # the bound DP-SGD needs: each sample contributes at most C
    one, _ = per_sample_clipped_sum(model, CE, x[:1], y[:1], clip / 10, method=method)
    assert math.sqrt(sum(float(v.pow(2).sum()) for v in one.values())) <= clip / 10 + 1e-12


def test_linear_and_vmap_paths_agree_on_the_official_mlp_and_auto_picks_linear() -> None:
    model = make_mlp(784, 64, 10, bias=False, dropout=0.5, seed=0).eval()  # eval: same dropout in both
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(33, 784, generator=g), torch.randint(0, 10, (33,), generator=g)
    a, na = per_sample_clipped_sum(model, CE, x, y, 1.0, method="linear")
    b, nb = per_sample_clipped_sum(model, CE, x, y, 1.0, method="vmap")
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a) and torch.allclose(na, nb, rtol=1e-5)
    with pytest.raises(ValueError, match=r"method='linear' needs an nn\.Sequential"):
        per_sample_clipped_sum(
            torch.nn.Sequential(torch.nn.LayerNorm(784), model), CE, x, y, 1.0, method="linear"
        )
    with pytest.raises(ValueError, match="method must be one of"):
        per_sample_clipped_sum(model, CE, x, y, 1.0, method="ghost")


def test_dp_sgd_noise_scale_uses_the_expected_batch_size_under_poisson_sampling() -> None:
    """Zero inputs through a bias-free MLP: every clipped gradient is 0, so the step is pure noise,
    N(0, σ²C²) divided by the expected batch size q·n (Opacus) — not by the drawn batch size."""
    model = make_mlp(20, 300, 10, bias=False, seed=0)
    x, y = torch.zeros(5, 20), torch.arange(5)
    dp = DPConfig("sample", 1.5, 2.0)
    grads = dp_sgd_gradients(model, CE, x, y, dp, torch.Generator().manual_seed(0), expected_batch_size=60.0)
    noise = torch.cat([v.flatten() for v in grads.values()])
    assert float(noise.std()) == pytest.approx(1.5 * 2.0 / 60.0, rel=0.03)
    empty = dp_sgd_gradients(
        model, CE, x[:0], y[:0], dp, torch.Generator().manual_seed(0), expected_batch_size=60.0
    )
    assert torch.equal(torch.cat([v.flatten() for v in empty.values()]), noise)  # an empty batch: noise only


def test_poisson_local_training_steps_rate_and_upload_noise() -> None:
    train = LocalTrainConfig(epochs=3, lr=0.05, batch_size=64, momentum=0.5, sampling="poisson")
    assert train.steps(480) == 24 and train.sample_rate(480) == pytest.approx(1 / 8)
    model = make_mlp(40, 50, 10, bias=False, seed=0)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x, y = torch.zeros(480, 40), torch.arange(480) % 10
    dp = DPConfig("sample", 2.0, 1.0)
    res = client_update(model, start, x, y, train, dp, torch.Generator().manual_seed(0))
    assert res.steps == 24 and res.sample_rate == pytest.approx(1 / 8)
    moved = torch.cat([(res.upload[k] - start[k]).flatten() for k in start])
    assert float(moved.std()) == pytest.approx(upload_noise_std(dp, train, 480), rel=0.05)
    with pytest.raises(ValueError, match="sampling"):
        LocalTrainConfig(sampling="uniform")


def test_a_fresh_privacy_engine_every_round() -> None:
    """Nothing carries over between rounds: a client's round depends only on its start state and its seed
    (fresh optimiser, zero momentum), and each round's ε is the same one-round DP-SGD ε; the ledger
    composes a client's rounds."""
    model = make_mlp(64, 16, 10, bias=False, dropout=0.5, seed=0)
    data = load_federated_digits(4, seed=0)
    x, y = data.clients[0]
    train = LocalTrainConfig(epochs=2, lr=0.05, batch_size=32, momentum=0.5, sampling="poisson")
    dp = DPConfig("sample", 1.0, 1.0)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    first = client_update(model, start, x, y, train, dp, torch.Generator().manual_seed(7))
    client_update(model, start, x, y, train, dp, torch.Generator().manual_seed(8))  # another round in between
    again = client_update(model, start, x, y, train, dp, torch.Generator().manual_seed(7))
    assert all(torch.equal(first.upload[k], again.upload[k]) for k in start)
    one_round = RDPAccountant()
    one_round.step(1.0, first.sample_rate, first.steps)
    ledger = FederatedPrivacyLedger(dp, n_clients=4, clients_per_round=2)
    for _ in range(3):
        ledger.record_round({0: (first.steps, first.sample_rate), 1: (first.steps, first.sample_rate)})
    three = RDPAccountant()
    three.step(1.0, first.sample_rate, 3 * first.steps)
    assert ledger.epsilon() == pytest.approx(three.get_epsilon(1e-5), rel=1e-12)
    assert one_round.get_epsilon(1e-5) < ledger.epsilon()


# ε of S DP-SGD steps at q = 1/8 (the full setting's per-round protocol: 480 samples, batch 64), δ = 1e-5,
# computed with opacus 1.6.0: opacus.accountants.analysis.rdp.compute_rdp(q, σ, S, DEFAULT_ORDERS) then
# get_privacy_spent(orders=DEFAULT_ORDERS, rdp=..., delta=1e-5).
OPACUS_EPS = {
    (1.0, 80): 8.895031361534503,
    (1.0, 480): 22.84378261697764,
    (1.5, 80): 4.469712486185862,
    (1.5, 480): 11.524960013953944,
    (2.0, 80): 2.939948243218553,
    (2.0, 480): 7.642005721643483,
}


@pytest.mark.parametrize(("sigma", "steps"), sorted(OPACUS_EPS))
def test_rdp_accountant_matches_opacus_on_the_protocol(sigma: float, steps: int) -> None:
    acc = RDPAccountant()
    acc.step(sigma, 1 / 8, steps)
    assert acc.get_epsilon(1e-5) == pytest.approx(OPACUS_EPS[(sigma, steps)], rel=1e-10)


@pytest.mark.skipif(importlib.util.find_spec("opacus") is None, reason="opacus not installed (values above)")
def test_rdp_accountant_matches_installed_opacus() -> None:
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    for (sigma, steps), _ in OPACUS_EPS.items():
        rdp = compute_rdp(q=1 / 8, noise_multiplier=sigma, steps=steps, orders=list(DEFAULT_ORDERS))
        eps, _ = get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=rdp, delta=1e-5)
        acc = RDPAccountant()
        acc.step(sigma, 1 / 8, steps)
        assert acc.get_epsilon(1e-5) == pytest.approx(float(eps), rel=1e-10)


def test_fork_at_the_first_smoothing_round_equals_a_fresh_fedceo_run() -> None:
    data = load_federated_digits(6, seed=0)
    train = LocalTrainConfig(epochs=1, batch_size=32, sampling="poisson")
    kw = dict(clients_per_round=3, dp=DPConfig("sample", 1.0, 1.0), seed=2, train=train)
    cfg = FedCEOConfig(lam=0.5, theta=1.06, interval=3)
    fresh = FedCEOServer(data, cfg, **kw).fit(6)
    shared = DPFedAvgServer(data, **kw)
    shared.fit(2)
    forked = shared.fork(FedCEOAggregator(cfg))
    assert isinstance(forked, FedCEOServer) and shared.round == 2
    assert forked.fit(4).test_acc == fresh.test_acc and forked.history.epsilon == fresh.epsilon
    plain = shared.fork(FedAvgAggregator()).fit(4)
    assert plain.test_acc[:2] == fresh.test_acc[:2] and plain.test_acc != fresh.test_acc
    assert len(shared.history.test_acc) == 2  # the shared prefix is untouched by its forks
    shared.fit(1)
    with pytest.raises(ValueError, match="fork it from round <= that"):
        shared.fork(FedCEOAggregator(cfg))
    with pytest.raises(ValueError, match="plain-mean"):
        forked.fork(FedAvgAggregator())


def _fashion_available() -> bool:
    from icml25.kernels.datasets import load_fashion_mnist

    try:
        load_fashion_mnist(split="test", verify=False)
    except FileNotFoundError:
        return False
    return True


needs_fashion = pytest.mark.skipif(
    not _fashion_available(), reason="Fashion-MNIST files missing: apt-get install dataset-fashion-mnist"
)


@needs_fashion
def test_fashion_mnist_clients_follow_the_official_split() -> None:
    from icml25.federated.data import load_federated_fashion_mnist

    data = load_federated_fashion_mnist(100, seed=0)
    assert len(data.clients) == 100 and data.n_features == 784 and data.x_test.shape == (10000, 784)
    assert {len(y) for _, y in data.clients} == {480}  # 80% of each 600-image shard
    xs = torch.cat([x for x, _ in data.clients])
    assert abs(float(xs.mean())) < 0.02 and float(xs.std()) == pytest.approx(1.0, abs=0.02)  # standardised
    again = load_federated_fashion_mnist(100, seed=0)
    assert torch.equal(again.clients[7][0], data.clients[7][0])
    other = load_federated_fashion_mnist(100, seed=1)
    assert not torch.equal(other.clients[7][1], data.clients[7][1])
    with pytest.raises(ValueError, match="local_train_fraction"):
        load_federated_fashion_mnist(10, local_train_fraction=0.0)
    # validation: the next 10% of every shard (never trained on), pooled; the test set stays the official one
    assert data.x_val.shape == (6000, 784) and data.y_val.shape == (6000,)
    rows = {tuple(r[::37].tolist()) for r in xs[:2000]}
    assert not any(tuple(r[::37].tolist()) in rows for r in data.x_val[:2000])
    with pytest.raises(ValueError, match=r"local_train_fraction \+ local_val_fraction must be <= 1"):
        load_federated_fashion_mnist(10, local_train_fraction=0.8, local_val_fraction=0.3)


def test_full_setting_is_the_official_protocol_at_cpu_scale() -> None:
    from icml25.federated.experiments import fedceo as experiment

    full = experiment.FULL
    assert (full.n_clients, full.clients_per_round, full.hidden, full.dropout) == (100, 10, 64, 0.5)
    assert (full.lam, full.theta, full.interval, full.clip, full.sigmas) == (0.03, 1.06, 20, 1.0, (2.0,))
    assert full.c_grid == (0.5, 1.0, 2.0)  # the plan's grid, plus the official lambda
    assert (full.batch_size, full.momentum, full.sampling, full.dp_mode) == (64, 0.5, "poisson", "sample")
    assert full.lr * full.local_epochs == pytest.approx(0.01 * 30)  # the official per-round lr·E
    assert full.rounds % full.interval == 0  # the last round is a smoothing round
    assert full.n_seeds == 3 and full.rounds == 60
    names = [c.name for c in experiment.checks(full)]
    assert len(names) == 3 and "+ 3 points" in names[0] and "0.8" in names[1] and "1.5 points" in names[2]
    good = {
        "fedceo_acc_s2": 0.80,
        "baseline_udp_fedavg_acc_s2": 0.765,
        "denoise_ratio_s2": 0.7,
        "zero_model_ratio_s2": 3.0,
        "nodp_gap_points": 1.0,
    }
    assert [c(good) for c in experiment.checks(full)] == [True, True, True]
    # +2.9 points is not +3; a gap of 1.6 points is not within 1.5
    worse = good | {"fedceo_acc_s2": 0.794, "nodp_gap_points": 1.6}
    assert [c(worse) for c in experiment.checks(full)] == [False, True, False]
    # a smoothing that zeroes the model: its distance is the noise-free model's norm; it does not denoise
    zeroed = good | {"denoise_ratio_s2": 0.5, "zero_model_ratio_s2": 0.5}
    assert experiment.checks(full)[1](zeroed) is False
    # the no-DP check cannot pass at chance: the precondition fails there (the run is inconclusive)
    (learns,) = experiment.preconditions(full)
    assert learns({"fedavg_nodp_acc": 0.85, "chance_acc": 0.1}) is True
    assert learns({"fedavg_nodp_acc": 0.1, "chance_acc": 0.1}) is False
    assert experiment.preconditions(experiment.QUICK) == []


def test_lambda_grid_is_the_plans_multiples_of_the_noise_spectral_norm_plus_the_official_lambda() -> None:
    from icml25.federated.experiments import fedceo as experiment

    full = experiment.FULL
    data = load_federated_digits(10, seed=0)
    dp = DPConfig("sample", 2.0, 1.0)
    s_noise = experiment.noise_spectral_norm(full, dp, data)
    sigma_u = upload_noise_std(dp, full.train, experiment.mean_client_size(data))
    # largest layer of the 64-64-10 MLP: the 64 x 64 input layer
    assert s_noise == pytest.approx(sigma_u / math.sqrt(10) * (8 + 8))
    grid = experiment.lambda_grid(full, dp, data)
    assert list(grid) == ["c0.5", "c1", "c2", "official"] and grid["official"] == 0.03
    for c in (0.5, 1.0, 2.0):
        assert 1 / (2 * grid[f"c{c:g}"] * 10) == pytest.approx(c * s_noise)  # tau/m at k = 0


def test_peek_round_is_the_next_rounds_mean_and_its_noise_free_counterpart() -> None:
    data = load_federated_digits(6, seed=0)
    train = LocalTrainConfig(epochs=1, batch_size=16, sampling="poisson")
    dp = DPConfig("sample", 2.0, 1.0)
    server = DPFedAvgServer(data, clients_per_round=3, dp=dp, seed=1, train=train)
    server.fit(1)
    clean = server.peek_round(DPConfig("sample", 0.0, 1.0))
    same = server.peek_round()
    assert server.round == 1 and len(server.history.test_acc) == 1  # the run does not advance
    after = server.run_round()
    assert all(torch.allclose(same[k], after[k]) for k in after)
    assert all(not torch.allclose(clean[k], after[k]) for k in after)
    with pytest.raises(TypeError, match="dp must be a DPConfig"):
        server.peek_round("none")  # type: ignore[arg-type]


def _fashion_toy_setting(experiment):
    return dataclasses.replace(experiment.FULL, rounds=4, interval=2, n_seeds=1, local_epochs=1, lr=0.3)


@needs_fashion
def test_full_path_end_to_end_at_toy_scale(monkeypatch, tmp_path) -> None:
    """The full protocol's code path (grid, forks, selection, no-DP pair, report, figure) on 4 rounds of 1
    local epoch."""
    from icml25.federated.experiments import fedceo as experiment

    toy = _fashion_toy_setting(experiment)
    monkeypatch.setattr(experiment, "FULL", toy)
    rep = experiment.run(quick=False, seed=0, out_dir=tmp_path)
    m = rep.metrics
    assert list(rep.checks) == [c.name for c in experiment.checks(toy)] and len(rep.checks) == 3
    assert list(rep.preconditions) == [c.name for c in experiment.preconditions(toy)]
    assert 0.1 < m["baseline_udp_fedavg_acc_s2"] <= 1 and m["epsilon_total_s2"] > m["epsilon_round_s2"] > 0
    assert m["fedavg_nodp_acc"] > m["chance_acc"] + 0.2  # the precondition holds
    # the selected lambda is the grid point with the best validation accuracy, and its test accuracy counts
    grid = ["c0.5", "c1", "c2", "official"]
    best = max(grid, key=lambda g: m[f"fedceo_val_acc_{g}_s2"])
    assert m["lambda_selected_s2"] == m[f"lambda_{best}_s2"] == m["lambda_nodp"]
    assert m["fedceo_acc_s2"] == m[f"fedceo_test_acc_{best}_s2"]
    assert m["tau_over_m_first_official_s2"] == pytest.approx(1.06 / (2 * 0.03) / 10)
    # the official lambda is reported on its own; below its threshold the smoothing zeroes the model
    assert m["top_sv_first_0.weight_s2"] < m["tau_over_m_first_official_s2"]
    assert m["fedceo_official_lambda_acc_s2"] == pytest.approx(0.1)
    assert m["denoise_ratio_official_s2"] == pytest.approx(m["zero_model_ratio_s2"])  # the zero model
    assert m["nodp_gap_points"] == pytest.approx(100 * (m["fedavg_nodp_acc"] - m["fedceo_nodp_acc"]))
    assert "fedceo_theta1_acc_s2" in m
    assert m["epsilon_round_s2"] == pytest.approx(experiment.epsilon_one_round(toy, 2.0, 480))
    assert len(rep.figures) == 1 and rep.figures[0].exists()


@pytest.mark.slow
@needs_fashion
def test_full_run_is_the_recorded_known_miss() -> None:
    """The recorded full outcome (about 1 h on one core): the validated FedCEO neither beats UDP-FedAvg by
    3 points nor denoises, and without DP it stays within 1.5 points of FedAvg."""
    from icml25.federated.experiments import fedceo as experiment

    rep = experiment.run(quick=False, seed=0)
    assert all(rep.preconditions.values())
    assert list(rep.checks.values()) == [False, False, True]
    assert rep.metrics["fedceo_official_lambda_acc_s2"] == pytest.approx(0.1)  # the official lambda zeroes it
