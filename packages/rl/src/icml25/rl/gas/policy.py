"""GAS: graph-assisted stitching for offline hierarchical RL — ICML 2025, P05: stage 3, the low-level policy.

The low-level policy π(a | s, z) is conditioned on a *direction* in TDR space, z = (φ(g) − φ(s)) / ‖·‖, so
one policy serves every subgoal the planner picks.

Deviation at our CPU scale (documented in the reproduction): the paper trains this actor HILP-style —
a critic on the directional reward (φ(s′) − φ(s))·z for random unit z, expectile-0.7 value, and an actor loss
−Q/|Q| + α·BC. Here the actor is trained by goal-conditioned behaviour cloning alone, with hindsight
subgoals drawn 1..H steps ahead in the same trajectory. In the small grid mazes the dataset's moves toward a
hindsight subgoal ≤ H steps away are already mostly on a shortest path, so the BC term carries the signal and
the critic's extra CPU cost buys little; the stitching — the paper's contribution — happens entirely in the
graph. Discrete action spaces get a categorical head (cross-entropy), continuous ones the paper's
constant-std Gaussian (whose log-likelihood is the MSE of its mean).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from icml25.kernels.experiment import progress as progress_bar
from icml25.kernels.rng import isolated_rng
from icml25.rl.datasets import trajectories, validate_offline_dataset
from icml25.rl.gas.tdr import FourierFeatures, mlp, progress_kwargs

logger = logging.getLogger(__name__)


@dataclass
class PolicyConfig:
    """Hyper-parameters of the directional BC policy.

    Attributes:
        hidden_dims: MLP widths (paper: (512, 512, 512)).
        subgoal_steps: hindsight subgoals are 1..subgoal_steps steps ahead (the paper's subgoal step H).
        steps, batch_size, lr: Adam training schedule.
        fourier_features: sin/cos octaves on the observation input (see ``TDRConfig.fourier_features``).
    """

    hidden_dims: Sequence[int] = (128, 128)
    fourier_features: int = 0
    subgoal_steps: int = 6
    steps: int = 2000
    batch_size: int = 256
    lr: float = 1e-3

    def __post_init__(self) -> None:
        for key in ("subgoal_steps", "steps", "batch_size"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"{key} must be a positive int, got {getattr(self, key)!r}")


def unit_direction(
    phi_target: np.ndarray | torch.Tensor, phi_s: np.ndarray | torch.Tensor, eps: float = 1e-10
):
    """z = (φ_target − φ_s) / (‖φ_target − φ_s‖ + eps), rowwise (``(..., d)`` → ``(..., d)``)."""
    diff = phi_target - phi_s
    if isinstance(diff, torch.Tensor):
        return diff / (diff.norm(dim=-1, keepdim=True) + eps)
    return diff / (np.linalg.norm(diff, axis=-1, keepdims=True) + eps)


class DirectionalPolicy(nn.Module):
    """π(a | s, z): MLP on ``[obs, z]``.

    Args:
        obs_dim: observation dimension.
        tdr_dim: dimension of the direction z.
        n_actions: number of discrete actions, or ``None`` for continuous actions of ``action_dim``.
        action_dim: continuous action dimension (ignored when ``n_actions`` is given).
    """

    def __init__(
        self,
        obs_dim: int,
        tdr_dim: int,
        n_actions: int | None = None,
        action_dim: int | None = None,
        hidden_dims: Sequence[int] = (128, 128),
        fourier_features: int = 0,
    ) -> None:
        super().__init__()
        if (n_actions is None) == (action_dim is None):
            raise ValueError(
                f"give exactly one of n_actions (discrete) or action_dim (continuous), got {n_actions}, {action_dim}"
            )
        self.obs_dim, self.tdr_dim = int(obs_dim), int(tdr_dim)
        self.discrete = n_actions is not None
        out = int(n_actions if n_actions is not None else action_dim)  # type: ignore[arg-type]
        self.n_actions = out if self.discrete else None
        self.action_dim = None if self.discrete else out
        self.hidden_dims = tuple(int(w) for w in hidden_dims)
        self.fourier_features = int(fourier_features)
        self.features = FourierFeatures(fourier_features)
        self.net = mlp(self.features.out_dim(self.obs_dim) + self.tdr_dim, hidden_dims, out, layer_norm=True)

    def config(self) -> dict[str, object]:
        """The constructor's arguments (JSON-serialisable): ``DirectionalPolicy(**p.config())`` has the same architecture."""
        return {
            "obs_dim": self.obs_dim,
            "tdr_dim": self.tdr_dim,
            "n_actions": self.n_actions,
            "action_dim": self.action_dim,
            "hidden_dims": list(self.hidden_dims),
            "fourier_features": self.fourier_features,
        }

    def forward(self, obs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, n_actions)`` or action means ``(B, action_dim)`` for ``obs`` ``(B, obs_dim)``, ``z`` ``(B, tdr_dim)``."""
        return self.net(torch.cat([self.features(obs), z], dim=-1))

    @torch.no_grad()
    def act(self, obs: np.ndarray, z: np.ndarray) -> np.ndarray:
        """Greedy (temperature 0) actions for numpy ``obs`` ``(B, obs_dim)`` and ``z`` ``(B, tdr_dim)``:
        ``(B,)`` ints (argmax) or ``(B, action_dim)`` floats clipped to [-1, 1]."""
        out = self(torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(z, dtype=torch.float32))
        return out.argmax(-1).numpy() if self.discrete else out.clamp(-1.0, 1.0).numpy()


def train_policy(
    dataset: Mapping[str, np.ndarray],
    phi: np.ndarray,
    cfg: PolicyConfig | None = None,
    *,
    seed: int = 0,
    progress: bool | None = None,
) -> DirectionalPolicy:
    """Directional BC: for a transition (s, a) and a hindsight subgoal g ≤ ``subgoal_steps`` ahead in the
    same trajectory, maximise log π(a | s, normalise(φ(g) − φ(s))).

    Args:
        dataset: offline dataset (see :mod:`icml25.rl.datasets`).
        phi: ``(N, tdr_dim)`` TDR embeddings of ``dataset["observations"]``.
        cfg: hyper-parameters (default :class:`PolicyConfig`).
        seed: seeds the initial weights and the batch/subgoal sampling. The same seed gives the same
            policy; the caller's global random state (torch, NumPy, ``random``) is left untouched.
        progress: show a progress bar over the gradient steps; ``None`` (default): in a terminal, once the
            training has run for 2 s, never in CI (``CI`` set) or when stderr is not a terminal.
    """
    cfg = cfg or PolicyConfig()
    data = validate_offline_dataset(dataset)
    phi_in = np.asarray(phi)
    if phi_in.dtype == bool or not np.issubdtype(phi_in.dtype, np.number) or np.iscomplexobj(phi_in):
        raise TypeError(f"phi must be a real numeric array (N, tdr_dim), got dtype {phi_in.dtype}")
    n = len(data["observations"])
    if phi_in.ndim != 2 or len(phi_in) != n or phi_in.shape[1] == 0:
        raise ValueError(
            f"phi must have shape ({n}, tdr_dim >= 1) (one row per observation), got {phi_in.shape}"
        )
    with np.errstate(over="ignore"):  # values beyond float32's range become Inf and are reported below
        phi = phi_in.astype(np.float32)
    if not np.all(np.isfinite(phi)):
        raise ValueError(
            f"phi must be finite in float32 (|phi| < 3.4e38); got {int(np.isnan(phi).sum())} NaN and "
            f"{int(np.isinf(phi).sum())} Inf values in an array of shape {phi.shape}"
        )
    traj = trajectories(data)
    rows = np.flatnonzero(traj.valid)
    # The subgoal is an observation row after idx, so the trajectory's last row can't be a source here.
    rows = rows[rows < traj.traj_end[rows]]
    if len(rows) == 0:
        raise ValueError("dataset must contain trajectories of at least 2 rows to draw hindsight subgoals")
    actions = data["actions"]
    discrete = actions.ndim == 1
    if discrete and not np.issubdtype(actions.dtype, np.integer):
        raise TypeError(f"1-D actions must be integer ids (discrete), got dtype {actions.dtype}")
    # The initial weights come from torch's generator: a fork seeded with `seed`, restored on exit. The
    # training loop draws only from `rng` (batches and subgoals), so the caller's random state is untouched.
    with isolated_rng(seed):
        policy = DirectionalPolicy(
            data["observations"].shape[1],
            phi.shape[1],
            n_actions=int(actions.max()) + 1 if discrete else None,
            action_dim=None if discrete else actions.shape[1],
            hidden_dims=cfg.hidden_dims,
            fourier_features=cfg.fourier_features,
        )
    rng = np.random.default_rng(seed)
    obs_t = torch.as_tensor(data["observations"], dtype=torch.float32)
    phi_t = torch.from_numpy(phi)
    act_t = torch.as_tensor(actions, dtype=torch.int64 if discrete else torch.float32)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    bar = progress_kwargs(progress)
    logger.info("policy training: %d steps, batch %d, %d source rows", cfg.steps, cfg.batch_size, len(rows))
    log_every = max(1, cfg.steps // 10)
    for step in progress_bar(range(cfg.steps), desc="policy", **bar):
        idx = rows[rng.integers(0, len(rows), size=cfg.batch_size)]
        goal = np.minimum(idx + rng.integers(1, cfg.subgoal_steps + 1, size=len(idx)), traj.traj_end[idx])
        z = unit_direction(phi_t[goal], phi_t[idx])
        out = policy(obs_t[idx], z)
        if discrete:
            loss = nn.functional.cross_entropy(out, act_t[idx])
        else:
            loss = (out - act_t[idx]).pow(2).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % log_every == 0 and logger.isEnabledFor(logging.DEBUG):
            logger.debug("policy step %d/%d: loss %.5g", step + 1, cfg.steps, loss.detach().item())
    logger.info("policy trained: final batch loss %.5g", loss.detach().item())
    return policy.eval()
