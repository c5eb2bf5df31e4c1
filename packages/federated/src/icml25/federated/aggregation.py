"""The server step every federated strategy here shares: FedAvg's unweighted mean and the checks on a round's uploads.

:class:`FedAvgAggregator` is the FedAvg / DP-FedAvg server step; FedCEO's and FedGO's aggregators keep its
interface (``start_state``, ``aggregate``, ``smoothed_round``) so that the plain-python loop
(:mod:`icml25.federated.server`) and the Flower strategies (:mod:`icml25.federated.flower`) drive any of
them. :func:`check_uploads` and :func:`check_client_states` validate one round's uploads (the same keys and
shapes in every client, finite floats, distinct client ids) before any of them averages.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import torch
from torch import Tensor

State = dict[str, Tensor]

__all__ = ["FedAvgAggregator", "State", "check_client_states", "check_uploads", "mean_state"]


def check_client_states(
    client_states: Sequence[Mapping[str, Tensor]], name: str = "client_states"
) -> list[Mapping[str, Tensor]]:
    """Validate one round's client state dicts and return them as a list.

    Every entry must be a ``dict[str, Tensor]`` with the same keys and shapes as the first one, and every
    floating tensor must be finite. Raises ``TypeError`` (not a list, a non-dict entry, a non-tensor value)
    or ``ValueError`` (no clients, differing keys or shapes, NaN/Inf), naming the client and the key.
    Shared by FedCEO's smoothing and mean and by FedGO's weighted mean.

    Args:
        client_states: the clients' state dicts.
        name: what the error messages call ``client_states``.
    """
    if not isinstance(client_states, Sequence) or isinstance(client_states, (str, bytes)):
        raise TypeError(f"{name} must be a list of state dicts, got {type(client_states).__name__}")
    if len(client_states) == 0:
        raise ValueError(f"{name} must hold at least one client state (empty round), got 0")
    ref = client_states[0]
    for i, st in enumerate(client_states):
        if not isinstance(st, Mapping):
            raise TypeError(f"{name}[{i}] must be a dict[str, Tensor], got {type(st).__name__}")
        if set(st) != set(ref):
            missing, extra = sorted(set(ref) - set(st)), sorted(set(st) - set(ref))
            raise ValueError(f"{name}[{i}] keys differ from {name}[0]: missing {missing}, unexpected {extra}")
        for k, v in st.items():
            if not isinstance(v, Tensor):
                raise TypeError(f"{name}[{i}][{k!r}] must be a torch.Tensor, got {type(v).__name__}")
            if v.shape != ref[k].shape:
                raise ValueError(
                    f"{name}[{i}][{k!r}] has shape {tuple(v.shape)}, expected {tuple(ref[k].shape)} "
                    f"(the shape in {name}[0]); all clients must upload the same architecture"
                )
            if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                raise ValueError(f"{name}[{i}][{k!r}] contains NaN or Inf")
    return list(client_states)


def mean_state(client_states: Sequence[Mapping[str, Tensor]]) -> State:
    """Unweighted client mean of every floating tensor; non-float buffers are taken from client 0.

    Args:
        client_states: m state dicts with identical keys and shapes.
    """
    check_client_states(client_states)
    out: State = {}
    for k, v0 in client_states[0].items():
        if v0.is_floating_point():
            out[k] = torch.stack([st[k] for st in client_states]).mean(0)
        else:
            out[k] = v0.clone()
    return out


def check_uploads(
    uploads: Mapping[Hashable, Mapping[str, Tensor]] | Sequence[tuple[Hashable, State]],
) -> list[tuple[Hashable, State]]:
    """Validate one round's uploads and return them as ``[(client_id, state), ...]``.

    ``uploads`` is ``{client_id: state}`` or a sequence of ``(client_id, state)`` pairs. Raises
    ``ValueError`` for an empty round, a client id that appears twice (the official code samples with
    replacement by accident), or states that :func:`check_client_states` rejects; ``TypeError`` for an
    entry that is not a pair. Shared by the FedAvg, FedCEO and FedGO server steps.
    """
    if isinstance(uploads, (str, bytes)) or not isinstance(uploads, (Mapping, Sequence)):
        raise TypeError(
            f"uploads must be a dict {{client_id: state}} or a list of (client_id, state) pairs, "
            f"got {type(uploads).__name__}"
        )
    items = list(uploads.items()) if isinstance(uploads, Mapping) else list(uploads)
    for i, item in enumerate(items):
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"uploads[{i}] must be a (client_id, state) pair, got {type(item).__name__}")
    if len(items) == 0:
        raise ValueError("uploads must hold at least one (client_id, state) pair (empty round), got 0")
    ids = [cid for cid, _ in items]
    if len(set(ids)) != len(ids):
        dup = sorted({str(c) for c in ids if ids.count(c) > 1})
        raise ValueError(f"uploads must have distinct client ids within a round, got duplicates {dup}")
    check_client_states([st for _, st in items], name="uploads")
    return items


class FedAvgAggregator:
    """Unweighted mean of the uploads (FedAvg / DP-FedAvg server step), same interface as FedCEO's."""

    def start_state(self, round_idx: int, client_id: Hashable, global_state: State) -> State:
        """State the client trains from in round ``round_idx``: always the global model."""
        return global_state

    def aggregate(
        self, round_idx: int, uploads: Mapping[Hashable, State] | Sequence[tuple[Hashable, State]]
    ) -> State:
        """Global model after round ``round_idx`` from ``{client_id: uploaded state}``."""
        items = check_uploads(uploads)
        return mean_state([st for _, st in items])

    def smoothed_round(self, round_idx: int) -> bool:
        return False
