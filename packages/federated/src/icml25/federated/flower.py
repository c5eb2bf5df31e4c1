"""Flower integration of FedCEO (ICML 2025, P50) and DP-FedAvg: strategies, client, simulation helper.

Flower (``flwr``, the ``[flower]`` extra) is imported lazily: importing this module is cheap, and the
first access to :class:`FedCEOStrategy`, :class:`DPFedAvgStrategy` or :class:`FedCEONumPyClient` imports
flwr (``ImportError`` naming the extra when it is missing).

The strategies are ``flwr.server.strategy.FedAvg`` subclasses, so they run in Flower's simulation engine
(:func:`run_flower_simulation`, Ray-based) and in a real deployment (``ServerApp`` / SuperLink) alike.
They hold a :class:`~icml25.federated.fedceo.FedCEOAggregator` (or ``FedAvgAggregator``) — the very object
the plain-python :class:`~icml25.federated.server.FedCEOServer` uses — so there is no duplicated logic:

* ``configure_fit`` samples m distinct clients and sends each its own start state (the global model, or
  its stored personalised state on FedCEO restart rounds) plus ``{"round": t}``;
* ``aggregate_fit`` hands the uploads to the aggregator (smoothing on rounds ``(t+1) % I == 0``), updates
  the privacy ledger from the clients' reported step counts, and returns the global model with the
  metrics ``epsilon``, ``smoothed``, ``tau`` (schedule value) and ``tau_max`` (largest threshold applied).

The user-level Gaussian mechanism runs on the client (:class:`FedCEONumPyClient` calls
:func:`~icml25.federated.training.client_update`): FedCEO needs *each* upload to carry independent noise.
Flower's ``DifferentialPrivacyClientSideFixedClipping`` only clips on the client and adds the noise once to
the aggregate on the server, which would leave nothing for FedCEO to denoise, so it is not used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from icml25.federated.data import FederatedData
from icml25.federated.dp import DPConfig, FederatedPrivacyLedger
from icml25.federated.fedceo import FedAvgAggregator, FedCEOAggregator, FedCEOConfig
from icml25.federated.training import LocalTrainConfig, client_update, evaluate, make_mlp, seed_generator

__all__ = [
    "DPFedAvgStrategy",  # noqa: F822 (built lazily by __getattr__)
    "FedCEONumPyClient",  # noqa: F822 (built lazily by __getattr__)
    "FedCEOStrategy",  # noqa: F822 (built lazily by __getattr__)
    "ndarrays_to_state",
    "run_flower_simulation",
    "state_to_ndarrays",
]

State = dict[str, Tensor]
_EXTRA = "pip install 'icml25-federated[flower]'"


def _require_flwr() -> Any:
    try:
        import flwr
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"the Flower integration needs flwr: {_EXTRA}") from err
    return flwr


def state_to_ndarrays(state: State, keys: Sequence[str]) -> list[np.ndarray]:
    """State dict → list of NumPy arrays in the order of ``keys`` (Flower's wire format)."""
    return [state[k].detach().cpu().numpy() for k in keys]


def ndarrays_to_state(arrays: Sequence[np.ndarray], template: State) -> State:
    """Inverse of :func:`state_to_ndarrays`; checks the count and the shapes against ``template``."""
    keys = list(template)
    if len(arrays) != len(keys):
        raise ValueError(f"expected {len(keys)} parameter arrays (keys {keys}), got {len(arrays)}")
    out: State = {}
    for k, a in zip(keys, arrays):
        if tuple(a.shape) != tuple(template[k].shape):
            raise ValueError(
                f"parameter {k!r} must have shape {tuple(template[k].shape)}, got {tuple(a.shape)}"
            )
        out[k] = torch.as_tensor(np.array(a, copy=True), dtype=template[k].dtype)
    return out


# --------------------------------------------------------------------------------------------------
# Classes that subclass flwr types: built on first access (module __getattr__), so flwr stays optional.
# --------------------------------------------------------------------------------------------------


_CLASSES: dict[str, type] = {}


def _build() -> dict[str, type]:
    if _CLASSES:
        return _CLASSES
    _require_flwr()
    from flwr.client import NumPyClient
    from flwr.common import FitIns, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg

    class AggregatorStrategy(FedAvg):
        """A FedAvg strategy whose server step is an icml25 aggregator (see the module docstring)."""

        def __init__(
            self,
            aggregator: FedAvgAggregator,
            initial_state: State,
            *,
            n_clients: int,
            clients_per_round: int,
            dp: DPConfig | None = None,
            eval_fn: Callable[[State], float] | None = None,
            **fedavg_kwargs: Any,
        ) -> None:
            if not isinstance(aggregator, FedAvgAggregator):
                raise TypeError(f"aggregator must be a FedAvgAggregator, got {type(aggregator).__name__}")
            if not isinstance(initial_state, dict) or not initial_state:
                raise TypeError(
                    f"initial_state must be a non-empty dict[str, Tensor], got {type(initial_state).__name__}"
                )
            if not 1 <= clients_per_round <= n_clients:
                raise ValueError(
                    f"clients_per_round must be in [1, n_clients={n_clients}], got {clients_per_round}"
                )
            self.aggregator = aggregator
            self.template = {k: v.detach().clone() for k, v in initial_state.items()}
            self.keys = list(self.template)
            self.clients_per_round = clients_per_round
            self.dp = dp if dp is not None else DPConfig()
            self.ledger = FederatedPrivacyLedger(self.dp, n_clients, clients_per_round)
            self.eval_fn = eval_fn
            self.test_acc: list[float] = []
            self.epsilon: list[float] = []
            fedavg_kwargs.setdefault("fraction_evaluate", 0.0)
            fedavg_kwargs.setdefault("min_available_clients", clients_per_round)
            super().__init__(
                initial_parameters=ndarrays_to_parameters(state_to_ndarrays(self.template, self.keys)),
                min_fit_clients=clients_per_round,
                **fedavg_kwargs,
            )

        def __repr__(self) -> str:
            return f"{type(self).__name__}(aggregator={type(self.aggregator).__name__}, m={self.clients_per_round})"

        def _to_state(self, parameters: Parameters) -> State:
            return ndarrays_to_state(parameters_to_ndarrays(parameters), self.template)

        def configure_fit(
            self, server_round: int, parameters: Parameters, client_manager: Any
        ) -> list[tuple[Any, Any]]:
            t = server_round - 1  # Flower counts rounds from 1, the FedCEO schedule from 0
            config = dict(self.on_fit_config_fn(server_round)) if self.on_fit_config_fn else {}
            config["round"] = t
            clients = client_manager.sample(
                num_clients=self.clients_per_round,
                min_num_clients=max(self.min_available_clients, self.clients_per_round),
            )
            global_state = self._to_state(parameters)
            out = []
            for proxy in clients:
                start = self.aggregator.start_state(t, proxy.cid, global_state)
                params = (
                    parameters
                    if start is global_state
                    else ndarrays_to_parameters(state_to_ndarrays(start, self.keys))
                )
                out.append((proxy, FitIns(params, dict(config))))
            return out

        def aggregate_fit(
            self, server_round: int, results: list[tuple[Any, Any]], failures: list[Any]
        ) -> tuple[Parameters | None, dict[str, Any]]:
            if not results or (failures and not self.accept_failures):
                return None, {}  # Flower's convention: keep the current global model
            t = server_round - 1
            uploads = [(proxy.cid, self._to_state(res.parameters)) for proxy, res in results]
            global_state = self.aggregator.aggregate(t, uploads)
            self.ledger.record_round(
                {
                    proxy.cid: (int(res.metrics.get("steps", 1)), float(res.metrics.get("sample_rate", 1.0)))
                    for proxy, res in results
                }
            )
            eps = self.ledger.epsilon()
            self.epsilon.append(eps)
            smoothed = isinstance(self.aggregator, FedCEOAggregator) and t in self.aggregator.taus
            metrics = {
                "epsilon": eps,
                "smoothed": int(smoothed),
                "tau": self.aggregator.taus.get(t, 0.0) if smoothed else 0.0,  # schedule value ϑ^k/(2λ)
                "tau_max": max(self.aggregator.layer_taus[t].values(), default=0.0) if smoothed else 0.0,
            }  # type: ignore[attr-defined]
            return ndarrays_to_parameters(state_to_ndarrays(global_state, self.keys)), metrics

        def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Any]] | None:
            if self.eval_fn is None or server_round == 0:
                return None
            acc = float(self.eval_fn(self._to_state(parameters)))
            self.test_acc.append(acc)
            return 1.0 - acc, {"accuracy": acc}

    class FedCEOStrategy(AggregatorStrategy):
        """FedCEO as a Flower strategy.

        Args:
            config: FedCEO hyper-parameters (λ, ϑ, I, restart, exclude).
            initial_state: initial global model ``{name: tensor}`` (defines the parameter order).
            n_clients: number of clients N (for privacy accounting).
            clients_per_round: m distinct clients per round.
            dp: the clients' privacy mechanism (for the reported ε; the noise is added by the clients).
            eval_fn: optional centralised evaluation ``state -> accuracy`` run after every round.
            **fedavg_kwargs: forwarded to ``flwr.server.strategy.FedAvg`` (e.g. ``on_fit_config_fn``).

        Attributes:
            aggregator: the shared :class:`FedCEOAggregator` (personalised states keyed by client id).
        """

        def __init__(self, config: FedCEOConfig, initial_state: State, **kwargs: Any) -> None:
            super().__init__(FedCEOAggregator(config), initial_state, **kwargs)

    class DPFedAvgStrategy(AggregatorStrategy):
        """DP-FedAvg (FedAvg when the clients run without DP): unweighted mean of the privatised uploads."""

        def __init__(self, initial_state: State, **kwargs: Any) -> None:
            super().__init__(FedAvgAggregator(), initial_state, **kwargs)

    class FedCEONumPyClient(NumPyClient):
        """A Flower client: local SGD (+ DP-SGD) and the user-level Gaussian mechanism before upload.

        Args:
            client_id: integer id, seeds the client's randomness as in the plain loop.
            x, y: ``[n, d]`` features and ``[n]`` labels.
            model_fn: builds the model.
            train, dp: local training and privacy configuration.
            seed: run seed.
        """

        def __init__(
            self,
            client_id: int,
            x: Tensor,
            y: Tensor,
            model_fn: Callable[[], nn.Module],
            train: LocalTrainConfig,
            dp: DPConfig,
            seed: int = 0,
        ) -> None:
            self.client_id, self.x, self.y = client_id, x, y
            self.model = model_fn()
            self.train, self.dp, self.seed = train, dp, seed
            self.template = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

        def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
            return state_to_ndarrays(self.template, list(self.template))

        def fit(
            self, parameters: list[np.ndarray], config: dict[str, Any]
        ) -> tuple[list[np.ndarray], int, dict]:
            t = int(config.get("round", 0))
            start = ndarrays_to_state(parameters, self.template)
            gen = seed_generator(self.seed, t, self.client_id)
            res = client_update(self.model, start, self.x, self.y, self.train, self.dp, gen)
            metrics = {
                "client_id": self.client_id,
                "steps": res.steps,
                "sample_rate": min(1.0, self.train.batch_size / res.num_examples),
                "loss": res.loss,
            }
            return state_to_ndarrays(res.upload, list(self.template)), res.num_examples, metrics

        def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[float, int, dict]:
            acc = evaluate(self.model, ndarrays_to_state(parameters, self.template), self.x, self.y)
            return 1.0 - acc, int(self.x.shape[0]), {"accuracy": acc}

    for cls in (FedCEOStrategy, DPFedAvgStrategy, FedCEONumPyClient, AggregatorStrategy):
        cls.__qualname__ = cls.__name__  # readable reprs: they are public classes, built lazily
    _CLASSES.update(
        {
            "FedCEOStrategy": FedCEOStrategy,
            "DPFedAvgStrategy": DPFedAvgStrategy,
            "FedCEONumPyClient": FedCEONumPyClient,
            "AggregatorStrategy": AggregatorStrategy,
        }
    )
    return _CLASSES


_LAZY = ("FedCEOStrategy", "DPFedAvgStrategy", "FedCEONumPyClient", "AggregatorStrategy")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        classes = _build()
        globals().update(classes)
        return classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
) -> Any:
    """Run FedCEO (``fedceo`` given) or DP-FedAvg in Flower's simulation engine, one virtual client each.

    Args:
        data: client partitions (client ``k`` is the SuperNode with ``partition-id`` k) and test set.
        rounds: number of rounds.
        fedceo: FedCEO configuration; ``None`` runs DP-FedAvg.
        clients_per_round, train, dp, model_fn, seed: as :class:`~icml25.federated.server.FederatedServer`.
        num_cpus: CPUs given to the Ray backend.

    Returns:
        The strategy after the run: ``.test_acc`` (per round), ``.epsilon``, ``.aggregator``.
    """
    _require_flwr()
    import os
    import random

    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    from flwr.client import ClientApp
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.simulation import run_simulation

    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    train = train if train is not None else LocalTrainConfig()
    dp = dp if dp is not None else DPConfig()
    n = len(data.clients)
    mf = model_fn if model_fn is not None else (lambda: make_mlp(data.n_features, 64, data.n_classes))
    torch.manual_seed(seed)  # same initial model as FederatedServer(seed=seed)
    eval_model = mf()
    init = {k: v.detach().clone() for k, v in eval_model.state_dict().items()}
    x_te, y_te = data.x_test, data.y_test
    common = dict(n_clients=n, clients_per_round=clients_per_round, dp=dp, min_available_clients=n)

    def eval_fn(state: State) -> float:
        return evaluate(eval_model, state, x_te, y_te)

    classes = _build()
    if fedceo is not None:
        strategy = classes["FedCEOStrategy"](fedceo, init, eval_fn=eval_fn, **common)
    else:
        strategy = classes["DPFedAvgStrategy"](init, eval_fn=eval_fn, **common)
    clients = data.clients
    client_cls = classes["FedCEONumPyClient"]

    def client_fn(context: Any) -> Any:
        pid = int(context.node_config["partition-id"])
        x, y = clients[pid]
        return client_cls(pid, x, y, mf, train, dp, seed).to_client()

    def server_fn(context: Any) -> Any:
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": num_cpus, "include_dashboard": False, "logging_level": "ERROR"},
    }
    random.seed(seed)  # Flower's client manager samples with the global `random` module
    run_simulation(
        ServerApp(server_fn=server_fn),
        ClientApp(client_fn=client_fn),
        num_supernodes=n,
        backend_config=backend,
    )
    if len(strategy.test_acc) != rounds:
        raise RuntimeError(
            f"Flower simulation finished {len(strategy.test_acc)} of {rounds} rounds; see the Flower log"
        )
    return strategy
