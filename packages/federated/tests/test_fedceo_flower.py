"""Tests of the Flower integration of P50 FedCEO (Message API; needs the `[flower]` extra)."""

from __future__ import annotations

import importlib.util
import math
import warnings

import pytest
import torch

pytest.importorskip("flwr")

from icml25.federated import (
    DPConfig,
    FedCEOAggregator,
    FedCEOConfig,
    LocalTrainConfig,
    fedceo_smooth,
    load_federated_digits,
    make_mlp,
)
from icml25.federated.flower import (
    AggregatorStrategy,
    DPFedAvgStrategy,
    FedCEOStrategy,
    make_client_app,
    make_server_app,
    run_flower_simulation,
)
from icml25.federated.training import client_update, seed_generator

torch.set_num_threads(1)
needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Flower's simulation runtime needs ray: pip install 'icml25-federated[flower]'",
)


def _setup(n: int = 6, m: int = 3, interval: int = 2):
    data = load_federated_digits(n, seed=0)
    dp = DPConfig("user", 0.3, 1.0)
    train = LocalTrainConfig(epochs=1, lr=0.1, batch_size=32)
    init = make_mlp(64, 16, 10, bias=False, seed=0).state_dict()
    cfg = FedCEOConfig(lam=0.2, theta=1.04, interval=interval, restart=True)
    strategy = FedCEOStrategy(cfg, init, n_clients=n, clients_per_round=m, dp=dp, seed=0)
    return data, dp, train, init, cfg, strategy


def test_strategy_rounds_match_the_shared_aggregator_and_restart_personal_states() -> None:
    """The strategy's round plan and server step, driven by hand, equal the plain aggregator's."""
    data, dp, train, init, cfg, strategy = _setup()
    model = make_mlp(64, 16, 10, bias=False, seed=0)
    node_ids = [10**12 + 7 * k for k in range(6)]  # Flower node ids are large random ints
    partition = {node: k for k, node in enumerate(node_ids)}
    mirror = FedCEOAggregator(cfg)  # what the plain-python FedCEOServer does with the same uploads
    global_state = dict(init)
    for server_round in range(1, 6):
        t = server_round - 1
        plan = strategy.plan_round(server_round, reversed(node_ids), global_state)
        assert len({node for node, _ in plan}) == 3  # m distinct nodes
        uploads = []
        for node, start in plan:
            expected = mirror.start_state(t, node, global_state)
            assert all(torch.equal(start[k], expected[k]) for k in start)
            if t in (2, 4) and node in mirror.smoothed_clients:  # personalised restart
                assert not torch.equal(start["0.weight"], global_state["0.weight"])
            x, y = data.clients[partition[node]]
            res = client_update(model, start, x, y, train, dp, seed_generator(0, t, partition[node]))
            uploads.append(
                (node, res.upload, {"steps": res.steps, "sample-rate": res.sample_rate, "loss": res.loss})
            )
        global_state, metrics = strategy.aggregate_states(server_round, uploads)
        expected_global = mirror.aggregate(t, [(node, st) for node, st, _ in uploads])
        assert all(torch.allclose(global_state[k], expected_global[k], atol=1e-6) for k in global_state)
        assert metrics["smoothed"] == int(t in (1, 3))
        assert metrics["epsilon"] > 0 and math.isfinite(metrics["train-loss"])
        if metrics["smoothed"]:
            assert math.isclose(metrics["tau"], cfg.tau(t))
            assert math.isclose(metrics["tau-max"], max(mirror.layer_taus[t].values()))
    assert strategy.aggregator.taus.keys() == mirror.taus.keys() == {1, 3}
    assert len(strategy.epsilon) == 5 and strategy.epsilon == sorted(strategy.epsilon)


def test_node_sampling_is_seeded_and_never_touches_global_random_state() -> None:
    import random

    nodes = [2**63 + 11 * k for k in range(20)]  # 64-bit ids: must survive sampling exactly
    picks = []
    for _ in range(2):
        strategy = DPFedAvgStrategy(
            make_mlp(4, 3, 2, seed=0).state_dict(), n_clients=20, clients_per_round=5, seed=3
        )
        state = random.getstate()
        picks.append([[n for n, _ in strategy.plan_round(r, nodes, {})] for r in (1, 2, 3)])
        assert random.getstate() == state
    assert picks[0] == picks[1] and all(set(p) <= set(nodes) and len(set(p)) == 5 for p in picks[0])
    assert picks[0][0] != picks[0][1]  # a fresh draw each round


def test_strategy_bad_inputs() -> None:
    _data, _dp, _train, init, _cfg, strategy = _setup()
    wrong = {k: torch.zeros(3, 3) for k in init}
    with pytest.raises(ValueError, match="must have shape"):
        strategy.aggregate_states(1, [(0, wrong, {})])
    with pytest.raises(ValueError, match="missing"):
        strategy.aggregate_states(1, [(0, {"0.weight": init["0.weight"]}, {})])
    with pytest.raises(ValueError, match="clients_per_round"):
        DPFedAvgStrategy(init, n_clients=3, clients_per_round=4)
    with pytest.raises(ValueError, match="at least clients_per_round"):
        strategy.plan_round(1, [1, 2], init)
    with pytest.raises(TypeError, match="aggregator"):
        AggregatorStrategy(object(), init, n_clients=3, clients_per_round=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rounds"):
        make_server_app(strategy, 0)
    with pytest.raises(TypeError, match="FederatedData"):
        make_client_app([], model_fn=lambda: make_mlp(), train=LocalTrainConfig(), dp=DPConfig())  # type: ignore[arg-type]


class _RecordingFedCEO(FedCEOStrategy):
    """FedCEOStrategy that keeps what each round's server step received and returned."""

    def aggregate_states(self, server_round, uploads):  # type: ignore[no-untyped-def]
        out = super().aggregate_states(server_round, uploads)
        self.__dict__.setdefault("rounds_seen", []).append(
            ([(cid, {k: v.clone() for k, v in st.items()}) for cid, st, _ in uploads], out[0])
        )
        return out


@pytest.mark.slow
@pytest.mark.integration
@needs_ray
def test_flower_simulation_smooths_the_uploads_without_deprecation_warnings() -> None:
    """Two rounds in Flower's Simulation Runtime (Ray), smoothing after each: every global model is exactly
    FedCEO's server step (t-SVD smoothing of the m uploads, then the mean) applied to that round's uploads."""
    data = load_federated_digits(6, seed=0)
    dp = DPConfig("user", 0.3, 1.0)
    cfg = FedCEOConfig(lam=0.2, theta=1.04, interval=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        warnings.simplefilter("error", PendingDeprecationWarning)
        warnings.simplefilter("error", FutureWarning)
        strategy = run_flower_simulation(
            data,
            rounds=2,
            fedceo=cfg,
            clients_per_round=3,
            dp=dp,
            train=LocalTrainConfig(epochs=1, batch_size=32),
            model_fn=lambda: make_mlp(64, 16, 10, bias=False),
            strategy_cls=_RecordingFedCEO,
        )
    assert len(strategy.test_acc) == 2 and sorted(strategy.aggregator.taus) == [0, 1]
    template = strategy.template
    for t, (uploads, global_state) in enumerate(strategy.rounds_seen):
        states = [st for _, st in uploads]
        assert len(states) == 3 and len({cid for cid, _ in uploads}) == 3
        _, expected = fedceo_smooth(states, cfg.thresholds(t, template, 3))
        plain_mean = {k: torch.stack([s[k] for s in states]).mean(0) for k in template}
        for k in template:
            assert torch.allclose(global_state[k], expected[k], atol=1e-6)
            assert not torch.allclose(global_state[k], plain_mean[k], atol=1e-4)  # the smoothing acted
    final = strategy.result.arrays.to_torch_state_dict()
    assert all(torch.allclose(final[k], strategy.rounds_seen[-1][1][k]) for k in template)
    assert strategy.epsilon[-1] > strategy.epsilon[0] > 0


def _fashion_available() -> bool:
    from icml25.kernels.datasets import load_fashion_mnist

    try:
        load_fashion_mnist(split="test", verify=False)
    except FileNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.integration
@needs_ray
@pytest.mark.skipif(
    not _fashion_available(), reason="Fashion-MNIST files missing: apt-get install dataset-fashion-mnist"
)
def test_flower_strategy_on_the_fashion_mnist_setting() -> None:
    """The full setting's protocol (100 nodes, m = 10, per-sample DP-SGD with Poisson batches, the official
    MLP) for 2 rounds in the Simulation Runtime, smoothing after round 2; one local epoch to stay short."""
    import dataclasses

    from icml25.federated.data import load_federated_fashion_mnist
    from icml25.federated.experiments import fedceo as experiment

    setting = dataclasses.replace(experiment.FULL, local_epochs=1, lr=0.3)  # the official lr·E per round
    data = load_federated_fashion_mnist(setting.n_clients, seed=0)
    # λ from the paper's CIFAR-10 setting: a threshold that shrinks, not zeroes, these young weights
    cfg = FedCEOConfig(lam=0.6, theta=setting.theta, interval=2)
    strategy = run_flower_simulation(
        data,
        rounds=2,
        fedceo=cfg,
        clients_per_round=setting.clients_per_round,
        dp=DPConfig("sample", 1.0, setting.clip),
        train=setting.train,
        model_fn=experiment.model_fn_for(data, setting),
        strategy_cls=_RecordingFedCEO,
    )
    assert sorted(strategy.aggregator.taus) == [1] and len(strategy.test_acc) == 2
    uploads, global_state = strategy.rounds_seen[-1]
    states = [st for _, st in uploads]
    _, expected = fedceo_smooth(states, cfg.thresholds(1, strategy.template, 10))
    for k in strategy.template:
        assert torch.allclose(global_state[k], expected[k], atol=1e-5)
    assert strategy.test_acc[-1] > 0.3  # it learns
    assert strategy.epsilon[-1] > 0
