"""FedCEO (Clients Collaborate) — ICML 2025, P50: FedCEO and DP-FedAvg on Flower's Message API.

Li et al., "Clients Collaborate: Flexible Differentially Private Federated Learning with Guaranteed
Improvement of Utility-Privacy Trade-off", ICML 2025 (official code: 6lyc/FedCEO_Collaborate-with-Each-Other).
Needs the ``[flower]`` extra (``pip install 'icml25-federated[flower]'``: flwr with its simulation runtime).

The server step is the one shared with the plain-python loop (:class:`~icml25.federated.server.FedCEOServer`):
:class:`~icml25.federated.fedceo.FedCEOAggregator` (t-SVD smoothing every I rounds, personalised restarts)
or :class:`~icml25.federated.aggregation.FedAvgAggregator` (DP-FedAvg), and the client code is
:func:`~icml25.federated.training.client_update`. On Flower's Message API:

* :class:`FedCEOStrategy` / :class:`DPFedAvgStrategy` subclass ``flwr.serverapp.strategy.FedAvg``.
  ``configure_train`` samples m distinct nodes with the strategy's own seeded generator (Flower's default
  sampler draws from the global ``random`` module) and sends each node its start state: the global model,
  or its personalised smoothed state on FedCEO restart rounds. ``aggregate_train`` applies the aggregator
  to the uploads (unweighted, as the official code) and reports ε, the smoothing flag and τ.
* :func:`make_client_app` builds a ``ClientApp`` whose ``train`` handler runs local (DP-)SGD on the node's
  partition (``context.node_config["partition-id"]``) and uploads the privatised model.
* :func:`make_server_app` builds a ``ServerApp`` whose ``main`` runs ``strategy.start`` with centralised
  evaluation of the global model.
* :func:`run_flower_simulation` runs both in Flower's Simulation Runtime (Ray backend).

Rounds: Flower counts from 1, the FedCEO schedule from 0 (``t = server_round - 1``). Clients are keyed by
their Flower node id; the simulation runtime draws node ids at random, so which partitions a seeded run
samples can differ between runs, while every client's training is seeded by (seed, round, partition id).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from torch import Tensor, nn

try:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"icml25.federated.flower needs Flower (flwr): pip install 'icml25-federated[flower]' ({err})"
    ) from err

from icml25.federated.aggregation import FedAvgAggregator
from icml25.federated.data import FederatedData
from icml25.federated.dp import DPConfig, FederatedPrivacyLedger
from icml25.federated.fedceo import FedCEOAggregator, FedCEOConfig
from icml25.federated.training import LocalTrainConfig, client_update, evaluate, make_mlp, seed_generator
from icml25.kernels.checks import check_int
from icml25.kernels.rng import isolated_rng

__all__ = [
    "AggregatorStrategy",
    "DPFedAvgStrategy",
    "FedCEOStrategy",
    "make_client_app",
    "make_server_app",
    "run_flower_simulation",
]

State = dict[str, Tensor]
ARRAYS_KEY = "arrays"
CONFIG_KEY = "config"
METRICS_KEY = "metrics"


class AggregatorStrategy(FedAvg):
    """A Message-API ``FedAvg`` whose server step is an icml25 aggregator (see the module docstring).

    Args:
        aggregator: ``FedAvgAggregator()`` (DP-FedAvg) or ``FedCEOAggregator(config)``.
        initial_state: initial global model ``{name: tensor}`` (defines the keys, shapes and dtypes).
        n_clients: number of nodes N (privacy accounting; sampling waits until N nodes are connected).
        clients_per_round: m distinct nodes per round.
        dp: the clients' privacy mechanism (for the reported ε; the clients add the noise).
        seed: seeds the node sampling.
        eval_fn: optional centralised evaluation ``state -> accuracy`` after every round.
        node_timeout: seconds to wait for N connected nodes before a round fails.

    Attributes:
        test_acc: accuracy of the global model after each round (when ``eval_fn`` is given).
        epsilon: worst client's ε after each round (:class:`~icml25.federated.dp.FederatedPrivacyLedger`).
        sampled: the node ids sampled in each round.
        result: Flower's ``Result`` of the last ``start`` (set by :func:`make_server_app`).
    """

    def __init__(
        self,
        aggregator: FedAvgAggregator,
        initial_state: Mapping[str, Tensor],
        *,
        n_clients: int,
        clients_per_round: int,
        dp: DPConfig | None = None,
        seed: int = 0,
        eval_fn: Callable[[State], float] | None = None,
        node_timeout: float = 300.0,
    ) -> None:
        if not isinstance(aggregator, FedAvgAggregator):
            raise TypeError(f"aggregator must be a FedAvgAggregator, got {type(aggregator).__name__}")
        if not isinstance(initial_state, Mapping) or not initial_state:
            raise TypeError(
                f"initial_state must be a non-empty dict[str, Tensor], got {type(initial_state).__name__}"
            )
        for name, v in (("n_clients", n_clients), ("clients_per_round", clients_per_round)):
            check_int(v, name, low=1)
        if clients_per_round > n_clients:
            raise ValueError(
                f"clients_per_round must be in [1, n_clients={n_clients}], got {clients_per_round}"
            )
        super().__init__(
            fraction_train=clients_per_round / n_clients,
            min_train_nodes=clients_per_round,
            min_available_nodes=n_clients,
        )
        # Federated evaluation is not used: the global model is evaluated centrally (``eval_fn``).
        self.fraction_evaluate, self.min_evaluate_nodes = 0.0, 0
        self.aggregator = aggregator
        self.template: State = {k: v.detach().clone() for k, v in initial_state.items()}
        self.n_clients, self.clients_per_round = n_clients, clients_per_round
        self.dp = dp if dp is not None else DPConfig()
        self.ledger = FederatedPrivacyLedger(self.dp, n_clients, clients_per_round)
        self.eval_fn = eval_fn
        self.node_timeout = float(node_timeout)
        self._rng = np.random.default_rng(seed)
        self.test_acc: list[float] = []
        self.epsilon: list[float] = []
        self.sampled: list[list[int]] = []
        self.result: Any = None

    #: names of the extra records a subclass reads from the replies (:meth:`receive_extra`), besides the model
    extra_records: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(aggregator={type(self.aggregator).__name__}, m={self.clients_per_round})"
        )

    def extra_payload(self, server_round: int, node: int) -> dict[str, ArrayRecord | ConfigRecord]:
        """Records sent to ``node`` besides its start state and the config (none here; FedGO's generator)."""
        return {}

    def receive_extra(self, server_round: int, node: int, content: RecordDict) -> None:
        """Read a reply's extra records (:attr:`extra_records`) before the server step (nothing here)."""

    # ---------------------------------------------------------------------------- the round's plan

    def plan_round(
        self, server_round: int, node_ids: Iterable[int], global_state: State
    ) -> list[tuple[int, State]]:
        """Sample m distinct nodes and pick each one's start state: ``[(node id, state), ...]``.

        The state is ``global_state`` itself, or the node's personalised state on a FedCEO restart round.
        """
        nodes = sorted(int(n) for n in node_ids)
        if len(nodes) < self.clients_per_round:
            raise ValueError(
                f"node_ids must hold at least clients_per_round={self.clients_per_round} nodes, got {len(nodes)}"
            )
        picks = self._rng.choice(len(nodes), size=self.clients_per_round, replace=False)
        chosen = sorted(nodes[int(i)] for i in picks)  # node ids are 64-bit: index, never convert
        self.sampled.append(chosen)
        t = server_round - 1
        return [(node, self.aggregator.start_state(t, node, global_state)) for node in chosen]

    def aggregate_states(
        self, server_round: int, uploads: Sequence[tuple[Hashable, State, Mapping[str, float]]]
    ) -> tuple[State, dict[str, float]]:
        """The server step on ``[(node id, uploaded state, train metrics), ...]``: new global state, metrics.

        Each upload must have the keys and shapes of ``initial_state``; the metrics may carry ``steps`` and
        ``sample-rate`` (DP-SGD accounting) and ``loss``.
        """
        t = server_round - 1
        for cid, state, _ in uploads:
            self._check_state(state, f"the upload of node {cid}")
        global_state = self.aggregator.aggregate(t, [(cid, state) for cid, state, _ in uploads])
        self.ledger.record_round(
            {cid: (int(mt.get("steps", 1)), float(mt.get("sample-rate", 1.0))) for cid, _, mt in uploads}
        )
        eps = self.ledger.epsilon()
        self.epsilon.append(eps)
        smoothed = isinstance(self.aggregator, FedCEOAggregator) and t in self.aggregator.taus
        taus = self.aggregator.layer_taus.get(t, {}) if smoothed else {}  # type: ignore[attr-defined]
        losses = [float(mt["loss"]) for _, _, mt in uploads if "loss" in mt]
        metrics = {
            "epsilon": eps,
            "smoothed": int(smoothed),
            "tau": self.aggregator.taus[t] if smoothed else 0.0,  # type: ignore[attr-defined]
            "tau-max": max(taus.values(), default=0.0),
            "train-loss": float(np.mean(losses)) if losses else float("nan"),
        }
        return global_state, metrics

    def _check_state(self, state: Mapping[str, Tensor], what: str) -> None:
        if set(state) != set(self.template):
            missing, extra = sorted(set(self.template) - set(state)), sorted(set(state) - set(self.template))
            raise ValueError(f"{what} must have the model's keys: missing {missing}, unexpected {extra}")
        for k, v in state.items():
            if tuple(v.shape) != tuple(self.template[k].shape):
                raise ValueError(
                    f"{what}: parameter {k!r} must have shape {tuple(self.template[k].shape)}, got {tuple(v.shape)}"
                )

    # ------------------------------------------------------------------------- Flower's interface

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Messages of round ``server_round``: m distinct nodes, each with its start state and the config."""
        nodes = self._connected_nodes(grid)
        global_state = arrays.to_torch_state_dict()
        messages = []
        for node, start in self.plan_round(server_round, nodes, global_state):
            payload = arrays if start is global_state else ArrayRecord(start)
            cfg = ConfigRecord({**dict(config), "server-round": server_round, "round": server_round - 1})
            content = RecordDict(
                {ARRAYS_KEY: payload, CONFIG_KEY: cfg, **self.extra_payload(server_round, node)}
            )
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node))
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedCEO's (or FedAvg's) server step on the replies; replies with an error are left out."""
        uploads = [self.parse_reply(server_round, reply) for reply in replies if not reply.has_error()]
        if not uploads:
            return None, None  # Flower's convention: keep the current global model
        global_state, metrics = self.aggregate_states(server_round, uploads)
        return ArrayRecord(global_state), MetricRecord(metrics)

    def parse_reply(self, server_round: int, reply: Message) -> tuple[int, State, dict[str, Any]]:
        """``(node id, uploaded state, train metrics)`` of a reply; its extra records go to :meth:`receive_extra`."""
        content = reply.content
        arrays = [v for k, v in content.array_records.items() if k not in self.extra_records]
        if len(arrays) != 1 or len(content.metric_records) != 1:
            raise ValueError(
                f"the reply of node {reply.metadata.src_node_id} must hold one model ArrayRecord and one "
                f"MetricRecord, got {len(arrays)} and {len(content.metric_records)}"
            )
        node = int(reply.metadata.src_node_id)
        self.receive_extra(server_round, node, content)
        return node, arrays[0].to_torch_state_dict(), dict(next(iter(content.metric_records.values())))

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No federated evaluation: the global model is evaluated centrally (``eval_fn``)."""
        return []

    def evaluate_global(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Centralised evaluation for ``strategy.start(evaluate_fn=...)``: accuracy of the global model."""
        if self.eval_fn is None or server_round == 0:
            return None
        acc = float(self.eval_fn(arrays.to_torch_state_dict()))
        self.test_acc.append(acc)
        return MetricRecord({"accuracy": acc})

    def _connected_nodes(self, grid: Grid) -> list[int]:
        deadline = time.monotonic() + self.node_timeout
        while len(nodes := list(grid.get_node_ids())) < self.min_available_nodes:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(nodes)} of n_clients={self.min_available_nodes} nodes connected "
                    f"within {self.node_timeout:g} s"
                )
            time.sleep(0.2)
        return nodes


class FedCEOStrategy(AggregatorStrategy):
    """FedCEO as a Flower strategy (Message API).

    Args:
        config: FedCEO hyper-parameters (λ, ϑ, I, restart, exclude, noise_std).
        initial_state: initial global model ``{name: tensor}``.
        **kwargs: as :class:`AggregatorStrategy` (``n_clients``, ``clients_per_round``, ``dp``, ``seed``,
            ``eval_fn``, ``node_timeout``).

    Attributes:
        aggregator: the :class:`~icml25.federated.fedceo.FedCEOAggregator` (personalised states keyed by
            node id; ``taus``/``layer_taus`` of the smoothing rounds).
    """

    def __init__(self, config: FedCEOConfig, initial_state: Mapping[str, Tensor], **kwargs: Any) -> None:
        super().__init__(FedCEOAggregator(config), initial_state, **kwargs)


class DPFedAvgStrategy(AggregatorStrategy):
    """DP-FedAvg (FedAvg when the clients run without DP): unweighted mean of the privatised uploads."""

    def __init__(self, initial_state: Mapping[str, Tensor], **kwargs: Any) -> None:
        super().__init__(FedAvgAggregator(), initial_state, **kwargs)


def make_client_app(
    data: FederatedData,
    *,
    model_fn: Callable[[], nn.Module],
    train: LocalTrainConfig,
    dp: DPConfig,
    seed: int = 0,
    extra_reply: Callable[[Message, int, Tensor], dict[str, ArrayRecord]] | None = None,
) -> ClientApp:
    """A ``ClientApp`` whose ``train`` handler trains on partition ``context.node_config["partition-id"]``.

    It runs :func:`~icml25.federated.training.client_update` (local SGD or DP-SGD, then the user-level
    mechanism when ``dp.mode == "user"``) from the received state, seeded by ``(seed, round, partition id)``,
    and replies with the upload and the metrics ``num-examples``, ``steps``, ``sample-rate``, ``loss``.
    ``extra_reply(message, partition id, local x)`` adds records to the reply (FedGO's discriminator).
    """
    if not isinstance(data, FederatedData):
        raise TypeError(f"data must be a FederatedData, got {type(data).__name__}")
    clients = data.clients
    models: dict[str, nn.Module] = {}  # one model per worker process, built on first use

    app = ClientApp()

    @app.train()
    def train_handler(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        if not 0 <= pid < len(clients):
            raise ValueError(f"partition-id must be in [0, {len(clients)}), got {pid}")
        if "model" not in models:
            with isolated_rng(seed):  # the weights are overwritten by the received state
                models["model"] = model_fn()
        x, y = clients[pid]
        start = msg.content[ARRAYS_KEY].to_torch_state_dict()
        t = int(msg.content[CONFIG_KEY]["round"])
        res = client_update(models["model"], start, x, y, train, dp, seed_generator(seed, t, pid))
        metrics = MetricRecord(
            {
                "num-examples": res.num_examples,
                "steps": res.steps,
                "sample-rate": res.sample_rate,
                "loss": res.loss,
                "partition-id": pid,
            }
        )
        extra = extra_reply(msg, pid, x) if extra_reply is not None else {}
        content = RecordDict({ARRAYS_KEY: ArrayRecord(res.upload), METRICS_KEY: metrics, **extra})
        return Message(content, reply_to=msg)

    return app


def make_server_app(strategy: AggregatorStrategy, rounds: int, *, timeout: float = 3600.0) -> ServerApp:
    """A ``ServerApp`` whose ``main`` runs ``strategy.start`` for ``rounds`` rounds from its initial state,
    with centralised evaluation (:meth:`AggregatorStrategy.evaluate_global`); the ``Result`` is kept in
    ``strategy.result``."""
    if not isinstance(strategy, AggregatorStrategy):
        raise TypeError(f"strategy must be an AggregatorStrategy, got {type(strategy).__name__}")
    check_int(rounds, "rounds", low=1)
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy.result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(strategy.template),
            num_rounds=rounds,
            timeout=timeout,
            evaluate_fn=strategy.evaluate_global,
        )

    return app


def run_flower_simulation(
    data: FederatedData,
    *,
    rounds: int,
    fedceo: FedCEOConfig | None = None,
    clients_per_round: int = 10,
    train: LocalTrainConfig | None = None,
    dp: DPConfig | None = None,
    model_fn: Callable[[], nn.Module] | None = None,
    seed: int = 0,
    num_cpus: int = 2,
    strategy_cls: type[AggregatorStrategy] | None = None,
) -> AggregatorStrategy:
    """Run FedCEO (``fedceo`` given) or DP-FedAvg in Flower's Simulation Runtime, one node per client.

    Args:
        data: client partitions (client ``k`` is the node with ``partition-id`` k) and test set.
        rounds: number of rounds.
        fedceo: FedCEO configuration; ``None`` runs DP-FedAvg.
        clients_per_round, train, dp, model_fn, seed: as :class:`~icml25.federated.server.FederatedServer`
            (the initial model is the one ``FederatedServer(seed=seed)`` builds).
        num_cpus: CPUs given to the Ray backend (one per client worker).
        strategy_cls: a subclass of :class:`FedCEOStrategy` / :class:`DPFedAvgStrategy` to use instead.

    Returns:
        The strategy after the run: ``.test_acc`` (per round), ``.epsilon``, ``.aggregator``, ``.result``.
    """
    check_int(rounds, "rounds", low=1)
    train = train if train is not None else LocalTrainConfig()
    dp = dp if dp is not None else DPConfig()
    n = len(data.clients)
    mf = model_fn if model_fn is not None else (lambda: make_mlp(data.n_features, 64, data.n_classes))
    init, eval_fn = centralised_eval(data, mf, seed)  # the initial model of FederatedServer(seed=seed)
    common: dict[str, Any] = dict(
        n_clients=n, clients_per_round=clients_per_round, dp=dp, seed=seed, eval_fn=eval_fn
    )
    if strategy_cls is None:
        strategy_cls = FedCEOStrategy if fedceo is not None else DPFedAvgStrategy
    if issubclass(strategy_cls, FedCEOStrategy):
        if fedceo is None:
            raise ValueError(f"strategy_cls={strategy_cls.__name__} needs fedceo= a FedCEOConfig, got None")
        strategy: AggregatorStrategy = strategy_cls(fedceo, init, **common)
    else:
        strategy = strategy_cls(init, **common)
    client_app = make_client_app(data, model_fn=mf, train=train, dp=dp, seed=seed)
    simulate(strategy, client_app, rounds, num_supernodes=n, num_cpus=num_cpus)
    return strategy


def centralised_eval(
    data: FederatedData, model_fn: Callable[[], nn.Module], seed: int
) -> tuple[State, Callable[[State], float]]:
    """The initial model of ``FederatedServer(seed=seed)`` and ``state -> test accuracy`` on ``data``."""
    with isolated_rng(seed):
        eval_model = model_fn()
    init = {k: v.detach().clone() for k, v in eval_model.state_dict().items()}
    x_te, y_te = data.x_test, data.y_test

    def eval_fn(state: State) -> float:
        return evaluate(eval_model, state, x_te, y_te)

    return init, eval_fn


def simulate(
    strategy: AggregatorStrategy,
    client_app: ClientApp,
    rounds: int,
    *,
    num_supernodes: int,
    num_cpus: int = 2,
) -> AggregatorStrategy:
    """Run ``strategy`` (through :func:`make_server_app`) and ``client_app`` in Flower's Simulation Runtime
    (Ray backend, one CPU per client worker, telemetry off) and check that every round finished."""
    from flwr.simulation import run_simulation

    check_int(rounds, "rounds", low=1)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no network calls from the runtime
    # CPU workers: keep Ray's future default (leave accelerator variables alone), which also silences its
    # FutureWarning about the current default.
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": num_cpus, "include_dashboard": False, "logging_level": "ERROR"},
    }
    run_simulation(
        server_app=make_server_app(strategy, rounds),
        client_app=client_app,
        num_supernodes=num_supernodes,
        backend_config=backend,
    )
    if len(strategy.test_acc) != rounds:
        raise RuntimeError(
            f"Flower simulation finished {len(strategy.test_acc)} of {rounds} rounds; see the Flower log"
        )
    return strategy
