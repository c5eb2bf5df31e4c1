"""Provably Near-Optimal Federated Ensemble Distillation with Negligible Overhead — ICML 2025, P10: FedGO on Flower.

Jang, Park and Lee, ICML 2025 (official code named by the paper: ``pupiu45/FedGO``). Needs the ``[flower]``
extra. Built on the package's Message-API integration (:mod:`icml25.federated.flower`, shared with FedCEO):

* :class:`FedGOStrategy` is an :class:`~icml25.federated.flower.AggregatorStrategy` whose server step is
  :class:`~icml25.federated.fedgo.FedGOAggregator` (FedAvg by ``n_k``, weighted ensemble pseudo-labels on the
  server set, distillation). A node sampled for the first time also receives the generator (``"generator"``
  ArrayRecord, ``"fedgo"`` ConfigRecord with the discriminator settings); its reply then carries its
  discriminator (``"disc"`` ArrayRecord), stored under the node id once: the discriminator phase happens
  once per client, and later rounds send nothing extra. The per-node uploads (not only their average)
  build the ensemble.
* :func:`make_fedgo_client_app`: :func:`~icml25.federated.flower.make_client_app` (local SGD from the
  received state) plus the discriminator phase.
* :func:`run_fedgo_simulation`: both in Flower's Simulation Runtime (Ray backend).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from icml25.federated.data import FederatedData
from icml25.federated.dp import DPConfig
from icml25.federated.fedgo import (
    FedGOAggregator,
    FedGOConfig,
    GaussianGenerator,
    make_discriminator,
    train_discriminator,
)
from icml25.federated.flower import (
    AggregatorStrategy,
    ArrayRecord,
    ClientApp,
    ConfigRecord,
    Message,
    RecordDict,
    centralised_eval,
    make_client_app,
    simulate,
)
from icml25.federated.training import LocalTrainConfig, make_mlp

__all__ = ["FedGOStrategy", "make_fedgo_client_app", "run_fedgo_simulation"]

GENERATOR_KEY, DISC_KEY, FEDGO_CONFIG_KEY = "generator", "disc", "fedgo"


class FedGOStrategy(AggregatorStrategy):
    """FedGO (or FedDF with ``config.weighting="uniform"``) as a Flower strategy (Message API).

    Args:
        config: FedGO settings.
        initial_state: initial global model ``{name: tensor}``.
        model_fn: builds the classifier (the server loads uploads into it).
        unlabeled: ``[n, d]`` server set; ``None``: no server dataset (``generator`` required; the
            distillation set is sampled from it).
        generator: the generator sent to the clients; default: a :class:`GaussianGenerator` fitted on
            ``unlabeled``.
        **kwargs: as :class:`~icml25.federated.flower.AggregatorStrategy` (``n_clients``,
            ``clients_per_round``, ``seed``, ``eval_fn``, ``node_timeout``).

    Attributes:
        aggregator: the :class:`~icml25.federated.fedgo.FedGOAggregator` (``discriminators``,
            ``n_samples`` keyed by node id; ``weight_entropy`` per round).
        disc_rounds: ``{node id: the round its discriminator arrived}``.
    """

    extra_records = (DISC_KEY,)

    def __init__(
        self,
        config: FedGOConfig,
        initial_state: Mapping[str, Tensor],
        *,
        model_fn: Callable[[], nn.Module],
        unlabeled: Tensor | None = None,
        generator: GaussianGenerator | None = None,
        **kwargs: Any,
    ) -> None:
        seed = int(kwargs.get("seed", 0))
        aggregator = FedGOAggregator(config, model_fn, unlabeled, seed=seed)
        if generator is None:
            if unlabeled is None:
                raise ValueError("generator must be given when there is no server dataset (unlabeled=None)")
            generator = GaussianGenerator().fit(unlabeled)
        if not isinstance(generator, GaussianGenerator):
            raise TypeError(f"generator must be a GaussianGenerator, got {type(generator).__name__}")
        aggregator.pre_fl(generator)
        super().__init__(aggregator, initial_state, **kwargs)
        self.generator = generator
        self.disc_rounds: dict[int, int] = {}

    def extra_payload(self, server_round: int, node: int) -> dict[str, ArrayRecord | ConfigRecord]:
        """The generator and the discriminator settings, for a node without a stored discriminator."""
        agg: FedGOAggregator = self.aggregator  # type: ignore[assignment]
        if not agg.needs_discriminator(node):
            return {}
        c = agg.config
        cfg = ConfigRecord(
            {
                "disc-hidden": c.disc_hidden,
                "disc-epochs": c.disc_epochs,
                "disc-lr": c.disc_lr,
                "disc-weight-decay": c.disc_weight_decay,
            }
        )
        return {GENERATOR_KEY: ArrayRecord(self.generator.state_dict()), FEDGO_CONFIG_KEY: cfg}

    def receive_extra(self, server_round: int, node: int, content: RecordDict) -> None:
        """Register the node's size (``num-examples``) and, in its first round, its discriminator."""
        metrics = next(iter(content.metric_records.values()))
        disc = content.array_records.get(DISC_KEY)
        agg: FedGOAggregator = self.aggregator  # type: ignore[assignment]
        agg.register_client(
            node, int(metrics["num-examples"]), None if disc is None else disc.to_torch_state_dict()
        )
        if disc is not None:
            self.disc_rounds.setdefault(node, server_round)


def make_fedgo_client_app(
    data: FederatedData,
    *,
    model_fn: Callable[[], nn.Module],
    train: LocalTrainConfig,
    seed: int = 0,
) -> ClientApp:
    """The FedGO ``ClientApp``: local SGD as :func:`~icml25.federated.flower.make_client_app`; when the message
    carries the generator, the node also trains its discriminator on its local data (seeded by
    ``(seed, partition id)``) and adds it to the reply."""

    def discriminator_phase(msg: Message, pid: int, x: Tensor) -> dict[str, ArrayRecord]:
        if GENERATOR_KEY not in msg.content.array_records:
            return {}
        gen = GaussianGenerator.from_state(msg.content.array_records[GENERATOR_KEY].to_torch_state_dict())
        cfg = msg.content.config_records[FEDGO_CONFIG_KEY]
        disc = make_discriminator(x.shape[1], int(cfg["disc-hidden"]), seed=seed * 1000 + pid)
        train_discriminator(
            disc,
            x,
            gen,
            epochs=int(cfg["disc-epochs"]),
            lr=float(cfg["disc-lr"]),
            weight_decay=float(cfg["disc-weight-decay"]),
            seed=seed * 1000 + pid,
        )
        return {DISC_KEY: ArrayRecord(disc.state_dict())}

    return make_client_app(
        data, model_fn=model_fn, train=train, dp=DPConfig(), seed=seed, extra_reply=discriminator_phase
    )


def run_fedgo_simulation(
    data: FederatedData,
    *,
    rounds: int,
    config: FedGOConfig | None = None,
    unlabeled: Tensor | None = None,
    generator: GaussianGenerator | None = None,
    clients_per_round: int = 10,
    train: LocalTrainConfig | None = None,
    model_fn: Callable[[], nn.Module] | None = None,
    seed: int = 0,
    num_cpus: int = 2,
) -> FedGOStrategy:
    """Run FedGO in Flower's Simulation Runtime, one node per client of ``data``.

    Args:
        data: client partitions (client ``k`` is the node with ``partition-id`` k) and test set.
        rounds: number of rounds.
        config: FedGO settings (default ``FedGOConfig()``; ``weighting="uniform"`` is FedDF).
        unlabeled, generator: the server set / generator (see :class:`FedGOStrategy`).
        clients_per_round, train, model_fn, seed: as :class:`~icml25.federated.server.FederatedServer`.
        num_cpus: CPUs given to the Ray backend.

    Returns:
        The strategy after the run: ``.test_acc`` per round, ``.aggregator``, ``.disc_rounds``, ``.result``.
    """
    config = config if config is not None else FedGOConfig()
    train = train if train is not None else LocalTrainConfig()
    mf = model_fn if model_fn is not None else (lambda: make_mlp(data.n_features, 64, data.n_classes))
    init, eval_fn = centralised_eval(data, mf, seed)
    n = len(data.clients)
    strategy = FedGOStrategy(
        config,
        init,
        model_fn=mf,
        unlabeled=unlabeled,
        generator=generator,
        n_clients=n,
        clients_per_round=clients_per_round,
        seed=seed,
        eval_fn=eval_fn,
    )
    client_app = make_fedgo_client_app(data, model_fn=mf, train=train, seed=seed)
    simulate(strategy, client_app, rounds, num_supernodes=n, num_cpus=num_cpus)
    return strategy
