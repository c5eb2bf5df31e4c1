"""Tests of the Flower integration of P10 FedGO (Message API; needs the `[flower]` extra)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from icml25.federated import (
    FedGOAggregator,
    FedGOConfig,
    LocalTrainConfig,
    load_federated_digits,
    make_discriminator,
    make_mlp,
)
from icml25.federated.fedgo_flower import FedGOStrategy, make_fedgo_client_app, run_fedgo_simulation

torch.set_num_threads(1)
needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Flower's simulation runtime needs ray: pip install 'icml25-federated[flower]'",
)
CFG = FedGOConfig(distill_steps=20, disc_epochs=2, disc_hidden=16)


def model_fn() -> torch.nn.Module:
    return make_mlp(64, 16, 10)


@pytest.fixture
def task_identity() -> Iterator[None]:
    """Outside a Flower runtime, messages need a task identity (run, node, task ids); restored afterwards."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


class _Grid:
    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return self.nodes


def _round(strategy, app, arrays, server_round, nodes):  # type: ignore[no-untyped-def]
    messages = list(strategy.configure_train(server_round, arrays, ConfigRecord({}), _Grid(nodes)))
    replies = []
    for msg in messages:
        pid = nodes.index(msg.metadata.dst_node_id)
        ctx = Context(
            run_id=1,
            node_id=msg.metadata.dst_node_id,
            node_config={"partition-id": pid},
            state=RecordDict(),
            run_config={},
        )
        replies.append(app(msg, ctx))
    return messages, replies


def test_round_with_three_nodes_matches_the_plain_aggregator_and_disc_phase_runs_once(task_identity) -> None:  # type: ignore[no-untyped-def]
    """Three mocked nodes through configure_train -> ClientApp -> aggregate_train (no Ray): the generator is
    sent only in round 1, each discriminator arrives once, and the new global model is exactly the plain
    FedGOAggregator's step on the same uploads (per-node models, not only their average)."""
    data = load_federated_digits(3, val_size=0.3, seed=0)
    init = make_mlp(64, 16, 10, seed=0).state_dict()
    nodes = [10**12 + 3, 10**12 + 7, 10**12 + 11]
    strategy = FedGOStrategy(
        CFG, init, model_fn=model_fn, unlabeled=data.x_val, n_clients=3, clients_per_round=3
    )
    app = make_fedgo_client_app(data, model_fn=model_fn, train=LocalTrainConfig(epochs=1), seed=0)
    arrays = ArrayRecord(init)
    for server_round in (1, 2):
        messages, replies = _round(strategy, app, arrays, server_round, nodes)
        sent_generator = ["generator" in m.content.array_records for m in messages]
        got_disc = ["disc" in r.content.array_records for r in replies]
        assert sent_generator == got_disc == [server_round == 1] * 3
        arrays, metrics = strategy.aggregate_train(server_round, replies)
        new = arrays.to_torch_state_dict()
        assert {k: v.shape for k, v in new.items()} == {k: v.shape for k, v in init.items()}
        # the same step by hand
        mirror = FedGOAggregator(CFG, model_fn, data.x_val, seed=0)
        mirror.pre_fl(strategy.generator)
        uploads = []
        for r in replies:
            node = r.metadata.src_node_id
            mirror.register_client(
                node, int(r.content["metrics"]["num-examples"]), strategy.aggregator.discriminators[node]
            )
            uploads.append((node, r.content["arrays"].to_torch_state_dict()))
        expected = mirror.aggregate(server_round - 1, uploads)
        assert all(torch.allclose(new[k], expected[k], atol=1e-6) for k in new)
        assert metrics["train-loss"] > 0
    assert strategy.disc_rounds == dict.fromkeys(nodes, 1)
    assert set(strategy.aggregator.discriminators) == set(nodes)
    assert len(strategy.aggregator.weight_entropy) == 2


def test_strategy_bad_inputs() -> None:
    data = load_federated_digits(3, val_size=0.3, seed=0)
    init = make_mlp(64, 16, 10, seed=0).state_dict()
    with pytest.raises(ValueError, match="generator must be given"):
        FedGOStrategy(CFG, init, model_fn=model_fn, n_clients=3, clients_per_round=3)
    strategy = FedGOStrategy(
        CFG, init, model_fn=model_fn, unlabeled=data.x_val, n_clients=3, clients_per_round=3
    )
    strategy.aggregator.register_client(5, 10)
    with pytest.raises(RuntimeError, match="run pre_fl first"):  # no discriminator has arrived yet
        strategy.aggregate_states(1, [(5, init, {})])
    strategy.aggregator.register_client(6, 10, make_discriminator(64, 16, seed=0))
    with pytest.raises(KeyError, match=r"\[5\]"):  # a participating node without a stored discriminator
        strategy.aggregate_states(1, [(5, init, {})])


@pytest.mark.slow
@pytest.mark.integration
@needs_ray
def test_flower_simulation_runs_fedgo_for_two_rounds() -> None:
    """Two rounds in Flower's Simulation Runtime (Ray), 3 nodes: every node uploads its discriminator once
    (round 1), and the distilled global model is well above chance after two short rounds."""
    data = load_federated_digits(3, val_size=0.3, seed=0)
    strategy = run_fedgo_simulation(
        data,
        rounds=2,
        config=CFG,
        unlabeled=data.x_val,
        clients_per_round=3,
        train=LocalTrainConfig(epochs=2),
        model_fn=model_fn,
    )
    assert len(strategy.test_acc) == 2 and strategy.test_acc[-1] > 0.2  # chance: 0.1 (2 short rounds)
    assert sorted(strategy.disc_rounds.values()) == [1, 1, 1]
    assert len(strategy.aggregator.discriminators) == 3
