"""FedCEO (Clients Collaborate) — ICML 2025, P50: the plain-python federated loop (FedAvg, DP-FedAvg, FedCEO).

For users without Flower; part of the FedCEO implementation (Li et al., "Clients Collaborate: Flexible
Differentially Private Federated Learning with Guaranteed Improvement of Utility-Privacy Trade-off").

Each round: sample m distinct clients, send each its start state (the global model, or its personalised
state on FedCEO restart rounds), run :func:`~icml25.federated.training.client_update` (local SGD + DP),
and aggregate with the server step — :class:`~icml25.federated.aggregation.FedAvgAggregator` (FedAvg /
DP-FedAvg) or :class:`~icml25.federated.fedceo.FedCEOAggregator`. The Flower strategy in
:mod:`icml25.federated.flower` uses the same aggregators and client code.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from torch import Tensor, nn

from icml25.federated.aggregation import FedAvgAggregator, mean_state
from icml25.federated.data import FederatedData
from icml25.federated.dp import DPConfig, FederatedPrivacyLedger
from icml25.federated.fedceo import FedCEOAggregator, FedCEOConfig
from icml25.federated.training import LocalTrainConfig, client_update, evaluate, make_mlp, seed_generator
from icml25.kernels.rng import isolated_rng

__all__ = ["DPFedAvgServer", "FedCEOServer", "FederatedServer", "History", "state_distance"]

State = dict[str, Tensor]


def state_distance(a: State, b: State) -> float:
    """Frobenius distance between two state dicts over their float tensors."""
    return math.sqrt(sum(float((a[k] - b[k]).double().pow(2).sum()) for k in a if a[k].is_floating_point()))


def _diff(a: State, b: State) -> State:
    return {k: a[k] - b[k] if a[k].is_floating_point() else a[k] for k in a}


@dataclass
class History:
    """Per-round record of a run (index = 0-indexed round).

    Attributes:
        test_acc, val_acc: accuracy of the global model after each round.
        epsilon: worst-client ε against the server after each round (see ``FederatedPrivacyLedger``).
        epsilon_aggregate: ε against observers of the global models only (user-level DP).
        dist_global: ‖global − noise-free model‖_F, where the noise-free model accumulates the mean of
            the very same clipped client updates without the user-level noise.
        dist_mean: the same for the plain mean of this round's noisy uploads (the DP-FedAvg server
            step); at FedCEO's first smoothing round ``dist_global / dist_mean`` measures its denoising.
        smoothing_rounds: rounds after which FedCEO smoothed, with their schedule value ϑ^k/(2λ).
        layer_taus: the same rounds with the per-parameter thresholds actually applied.
    """

    test_acc: list[float] = field(default_factory=list)
    val_acc: list[float] = field(default_factory=list)
    epsilon: list[float] = field(default_factory=list)
    epsilon_aggregate: list[float] = field(default_factory=list)
    dist_global: list[float] = field(default_factory=list)
    dist_mean: list[float] = field(default_factory=list)
    smoothing_rounds: dict[int, float] = field(default_factory=dict)
    layer_taus: dict[int, dict[str, float]] = field(default_factory=dict)


class FederatedServer:
    """Synchronous federated training with a pluggable server step.

    Args:
        data: client partitions and evaluation sets.
        aggregator: ``FedAvgAggregator()`` or ``FedCEOAggregator(config)``.
        model_fn: builds the model (a fresh instance is used on the server and for client training).
        clients_per_round: m distinct clients sampled uniformly per round (without replacement).
        train: local training configuration.
        dp: privacy mechanism.
        seed: seeds the model initialisation, client sampling, local shuffling and noise.
    """

    def __init__(
        self,
        data: FederatedData,
        aggregator: FedAvgAggregator,
        *,
        model_fn: Callable[[], nn.Module] | None = None,
        clients_per_round: int = 10,
        train: LocalTrainConfig | None = None,
        dp: DPConfig | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(data, FederatedData):
            raise TypeError(f"data must be a FederatedData, got {type(data).__name__}")
        if not isinstance(aggregator, FedAvgAggregator):
            raise TypeError(
                f"aggregator must be a FedAvgAggregator or FedCEOAggregator, got {type(aggregator).__name__}"
            )
        n = len(data.clients)
        if (
            isinstance(clients_per_round, bool)
            or not isinstance(clients_per_round, int)
            or not 1 <= clients_per_round <= n
        ):
            raise ValueError(
                f"clients_per_round must be an int in [1, {n}] (the number of clients), got {clients_per_round!r}"
            )
        self.data, self.aggregator, self.m, self.seed = data, aggregator, clients_per_round, seed
        self.train = train if train is not None else LocalTrainConfig()
        self.dp = dp if dp is not None else DPConfig()
        self.model_fn = (
            model_fn if model_fn is not None else (lambda: make_mlp(data.n_features, 64, data.n_classes))
        )
        with isolated_rng(seed):  # model initialisation seeded by `seed`; the caller's generator untouched
            self.model = self.model_fn()
        self.global_state: State = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.clean_state: State = {k: v.clone() for k, v in self.global_state.items()}
        self.ledger = FederatedPrivacyLedger(self.dp, n, clients_per_round)
        self.history = History()
        self._rng = np.random.default_rng(seed)
        self.round = 0

    def run_round(self) -> State:
        """One round; returns the new global state and appends to :attr:`history`."""
        t = self.round
        chosen = sorted(self._rng.choice(len(self.data.clients), size=self.m, replace=False).tolist())
        uploads, clean_deltas, participants = [], [], {}
        for cid in chosen:
            x, y = self.data.clients[cid]
            start = self.aggregator.start_state(t, cid, self.global_state)
            res = client_update(
                self.model, start, x, y, self.train, self.dp, seed_generator(self.seed, t, cid)
            )
            uploads.append((cid, res.upload))
            clean_deltas.append(_diff(res.clean, start))
            participants[cid] = (res.steps, res.sample_rate)
        self.global_state = self.aggregator.aggregate(t, uploads)
        self.ledger.record_round(participants)
        # Denoising diagnostic: the noise-free model applies the very same (clipped) client updates
        # without the user-level noise; before FedCEO's first smoothing it differs from the DP-FedAvg
        # global model by exactly the accumulated mean noise.
        mean_delta = mean_state(clean_deltas)
        self.clean_state = {
            k: v + mean_delta[k] if v.is_floating_point() else v for k, v in self.clean_state.items()
        }
        h = self.history
        h.dist_global.append(state_distance(self.global_state, self.clean_state))
        h.dist_mean.append(state_distance(mean_state([s for _, s in uploads]), self.clean_state))
        h.test_acc.append(evaluate(self.model, self.global_state, self.data.x_test, self.data.y_test))
        h.val_acc.append(evaluate(self.model, self.global_state, self.data.x_val, self.data.y_val))
        h.epsilon.append(self.ledger.epsilon())
        h.epsilon_aggregate.append(self.ledger.epsilon_aggregate())
        if isinstance(self.aggregator, FedCEOAggregator) and t in self.aggregator.taus:
            h.smoothing_rounds[t] = self.aggregator.taus[t]
            h.layer_taus[t] = dict(self.aggregator.layer_taus[t])
        self.round += 1
        return self.global_state

    def peek_round(self, dp: DPConfig | None = None) -> State:
        """The plain mean of the uploads the next round would collect under ``dp`` (default: this run's).

        Same clients, start states, mini-batches, dropout masks and generators as :meth:`run_round` (the
        DP noise is drawn, times σ, even when σ = 0, so every random stream stays aligned); the run does
        not advance. With ``DPConfig("sample", 0.0, clip)`` it is the noise-free counterpart of a DP-SGD
        round: the same clipped per-sample gradients without the Gaussian noise.
        """
        if dp is not None and not isinstance(dp, DPConfig):
            raise TypeError(f"dp must be a DPConfig or None, got {type(dp).__name__}")
        dp = self.dp if dp is None else dp
        t = self.round
        rng = copy.deepcopy(self._rng)
        chosen = sorted(rng.choice(len(self.data.clients), size=self.m, replace=False).tolist())
        model = copy.deepcopy(self.model)
        uploads = []
        for cid in chosen:
            x, y = self.data.clients[cid]
            start = self.aggregator.start_state(t, cid, self.global_state)
            res = client_update(model, start, x, y, self.train, dp, seed_generator(self.seed, t, cid))
            uploads.append(res.upload)
        return mean_state(uploads)

    def fork(self, aggregator: FedAvgAggregator) -> FederatedServer:
        """A copy of this run that continues with another server step; the data are shared, not copied.

        Used to branch DP-FedAvg into FedCEO variants at their first smoothing round: up to there FedCEO's
        server step is the plain mean and no client restarts, so the two runs coincide exactly and the
        shared rounds need to be trained once. Therefore this server must be a plain mean
        (``FedAvgAggregator``), and a ``FedCEOAggregator`` can only take over before its first smoothing
        round (``self.round <= interval - 1``).
        """
        if type(self.aggregator) is not FedAvgAggregator:
            raise ValueError(
                f"fork needs a run with the plain-mean server step (FedAvgAggregator), got {type(self.aggregator).__name__}"
            )
        if not isinstance(aggregator, FedAvgAggregator):
            raise TypeError(
                f"aggregator must be a FedAvgAggregator or FedCEOAggregator, got {type(aggregator).__name__}"
            )
        if isinstance(aggregator, FedCEOAggregator) and self.round > aggregator.config.interval - 1:
            raise ValueError(
                f"a FedCEO run with interval={aggregator.config.interval} smooths after round "
                f"{aggregator.config.interval - 1}; fork it from round <= that, got round {self.round}"
            )
        new = FederatedServer.__new__(
            FedCEOServer if isinstance(aggregator, FedCEOAggregator) else DPFedAvgServer
        )
        new.__dict__.update(self.__dict__)
        new.aggregator = aggregator
        new.model = copy.deepcopy(self.model)
        new.global_state = {k: v.clone() for k, v in self.global_state.items()}
        new.clean_state = {k: v.clone() for k, v in self.clean_state.items()}
        new.ledger = copy.deepcopy(self.ledger)
        new.history = copy.deepcopy(self.history)
        new._rng = copy.deepcopy(self._rng)
        return new

    def fit(self, rounds: int, progress: bool = False) -> History:
        """Run ``rounds`` more rounds (tqdm bar when ``progress``)."""
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
        it = range(rounds)
        if progress:
            from icml25.kernels.experiment import progress as progress_bar

            it = progress_bar(it, desc=type(self).__name__)
        for _ in it:
            self.run_round()
        return self.history


class DPFedAvgServer(FederatedServer):
    """FedAvg (``dp.mode == "none"``) or DP-FedAvg (user- or sample-level DP): plain mean of the uploads."""

    def __init__(self, data: FederatedData, **kwargs: object) -> None:
        super().__init__(data, FedAvgAggregator(), **kwargs)  # type: ignore[arg-type]


class FedCEOServer(FederatedServer):
    """FedCEO: the DP-FedAvg loop with tensor low-rank smoothing every I rounds and personalised restarts.

    Args:
        data: client partitions.
        config: FedCEO hyper-parameters (λ, ϑ, I, restart, exclude).
        **kwargs: as :class:`FederatedServer` (``clients_per_round``, ``train``, ``dp``, ``seed``, ``model_fn``).
    """

    def __init__(self, data: FederatedData, config: FedCEOConfig, **kwargs: object) -> None:
        super().__init__(data, FedCEOAggregator(config), **kwargs)  # type: ignore[arg-type]

    @property
    def personal_states(self) -> dict[int, State]:
        """Per-client personalised states (latest upload, or its smoothed slice)."""
        return self.aggregator.personal_states  # type: ignore[attr-defined,return-value]
