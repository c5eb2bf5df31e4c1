"""Sable: a Performant, Efficient and Scalable Sequence Model for MARL — ICML 2025, P45: activation-memory probe.

Sable (Mahjoub et al., ICML 2025; official code ``instadeepai/Mava``) claims memory growing linearly in the
number of agents when the agents are retained in chunks (Mava's ``n_agents_per_chunk``), against the
quadratic memory of softmax attention (the Multi-Agent Transformer). :func:`forward_peak_bytes` measures the
peak bytes of the tensors alive during a call (every tensor created by a torch op is counted from its
creation until it is freed), which works on CPU where torch keeps no allocator statistics;
:class:`SoftmaxAttentionEncoder` is the MAT-style comparison encoder.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from icml25.kernels.checks import check_int
from icml25.kernels.rng import isolated_rng
from icml25.rl.sable.network import check_float_tensor

__all__ = ["SoftmaxAttentionEncoder", "forward_peak_bytes"]


class _PeakTracker(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key, nbytes = st.data_ptr(), st.nbytes()
            if nbytes == 0 or key in self._seen:
                continue  # a view of a counted storage, or empty
            self._seen.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._free, key, nbytes)
        return out


def forward_peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes of the tensors created and alive at once while ``fn()`` runs (under ``torch.no_grad``).

    Inputs existing before the call are not counted; the result of ``fn`` counts while it is alive inside
    the call. A storage is counted once, from the op that created it until its first tensor is freed.

    Args:
        fn: a zero-argument callable (e.g. ``lambda: net.forward_train(obs, actions)``).

    Returns:
        peak bytes (int ≥ 0).
    """
    if not callable(fn):
        raise TypeError(f"fn must be a zero-argument callable, got {type(fn).__name__}")
    tracker = _PeakTracker()
    with torch.no_grad(), tracker:
        out = fn()
    del out
    return int(tracker.peak)


class SoftmaxAttentionEncoder(nn.Module):
    """A one-block MAT-style encoder: obs embedding → softmax self-attention over all agents (one
    ``[A, A]`` score matrix per head) + MLP → per-agent values.

    Args:
        obs_dim: per-agent observation size; embed_dim: E; n_head: heads with ``E % n_head == 0``; seed: init.
    """

    def __init__(self, obs_dim: int, embed_dim: int = 32, n_head: int = 1, seed: int | None = 0) -> None:
        super().__init__()
        for name, v in (("obs_dim", obs_dim), ("embed_dim", embed_dim), ("n_head", n_head)):
            check_int(v, name, low=1)
        if embed_dim % n_head:
            raise ValueError(
                f"embed_dim must be divisible by n_head, got embed_dim={embed_dim}, n_head={n_head}"
            )
        self.n_head, self.embed_dim = n_head, embed_dim
        with isolated_rng(seed):
            self.embed = nn.Sequential(nn.LayerNorm(obs_dim), nn.Linear(obs_dim, embed_dim), nn.GELU())
            self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=False)
            self.proj = nn.Linear(embed_dim, embed_dim)
            self.mlp = nn.Sequential(
                nn.Linear(embed_dim, embed_dim), nn.GELU(), nn.Linear(embed_dim, embed_dim)
            )
            self.ln1, self.ln2 = nn.LayerNorm(embed_dim), nn.LayerNorm(embed_dim)
            self.head = nn.Linear(embed_dim, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, A, obs_dim] -> values [B, A] (explicit softmax over the [A, A] scores)."""
        obs = check_float_tensor("obs", obs, 3, "[B, A, obs_dim]")
        B, A, _ = obs.shape
        x = self.embed(obs)
        q, k, v = self.qkv(x).reshape(B, A, 3, self.n_head, -1).permute(2, 0, 3, 1, 4)
        scores = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
        att = (scores @ v).transpose(1, 2).reshape(B, A, self.embed_dim)
        x = self.ln1(x + self.proj(att))
        x = self.ln2(x + self.mlp(x))
        return self.head(x).squeeze(-1)
