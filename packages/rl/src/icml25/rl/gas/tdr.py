"""GAS: graph-assisted stitching for offline hierarchical RL — ICML 2025, P05: stage 1, the TDR.

The Temporal Distance Representation φ embeds states so that ‖φ(s) − φ(g)‖ approximates the number of steps
from s to g. It is learned as the goal-conditioned value V(s, g) = −‖φ(s) − φ(g)‖ of the reward "−1 per step
until the goal", with IQL-style expectile TD (no actions are needed): an ensemble of two φ heads, targets
from a Polyak-averaged copy, and the expectile weight chosen by the sign of the advantage computed from the
target's mean value. A high expectile makes V track the *best* (shortest) continuation seen in the data, so
the distance becomes a shortest-path step count even though the behaviour data is noisy.

Goals for each batch follow the paper's mixture: a future state of the same trajectory at a geometric
offset (p = 0.625), a uniformly random dataset state (p = 0.375), the current state (p = 0). The goal
counts as reached when it is the transition's own dataset row (the official index test), not when two
observations are equal.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from icml25.kernels.experiment import progress as progress_bar
from icml25.kernels.rng import isolated_rng
from icml25.rl.datasets import trajectories, validate_offline_dataset

logger = logging.getLogger(__name__)

AUTO_PROGRESS_DELAY = 2.0  # seconds a training runs before its automatic (progress=None) bar appears


def progress_kwargs(progress: bool | None) -> dict[str, object]:
    """``disable``/``delay`` for :func:`icml25.kernels.experiment.progress` from a trainer's ``progress``.

    ``True``/``False`` force the bar on/off; ``None`` leaves it to the terminal check (quiet in CI or when
    stderr is not a terminal) and shows it only once the loop has run :data:`AUTO_PROGRESS_DELAY` seconds.
    """
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None, got {type(progress).__name__} {progress!r}")
    if progress is None:
        return {"disable": None, "delay": AUTO_PROGRESS_DELAY}
    return {"disable": not progress}


@dataclass
class TDRConfig:
    """Hyper-parameters of TDR training (paper defaults in brackets).

    Attributes:
        hidden_dims: MLP widths [(512, 512, 512)].
        tdr_dim: dimension of φ [32].
        steps: gradient steps [1M].
        batch_size: [1024].
        lr: Adam learning rate [3e-4].
        discount: γ [0.99; 0.995 on giant mazes].
        expectile: τ_e of the expectile loss [0.999; 0.95 kitchen/visual].
        tau: Polyak rate of the target network [0.005].
        p_trajgoal, p_randomgoal, p_curgoal: goal mixture [0.625, 0.375, 0.0].
        layer_norm: LayerNorm after each hidden activation [True].
        fourier_features: sin/cos input features at this many octaves [0: none]. Not in the paper: for
            low-dimensional inputs such as maze coordinates, cells on both sides of a wall are close in
            input space but far in time, and a plain small MLP needs thousands of steps to separate them
            (spectral bias); a few Fourier octaves make it converge within the CPU budget.
    """

    hidden_dims: Sequence[int] = (128, 128)
    tdr_dim: int = 16
    steps: int = 3000
    batch_size: int = 256
    lr: float = 3e-4
    discount: float = 0.99
    expectile: float = 0.95
    tau: float = 0.005
    p_trajgoal: float = 0.625
    p_randomgoal: float = 0.375
    p_curgoal: float = 0.0
    layer_norm: bool = True
    fourier_features: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.discount < 1.0:
            raise ValueError(f"discount must be in (0, 1), got {self.discount!r}")
        if not 0.5 <= self.expectile < 1.0:
            raise ValueError(f"expectile must be in [0.5, 1), got {self.expectile!r}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau!r}")
        probs = (self.p_trajgoal, self.p_randomgoal, self.p_curgoal)
        if min(probs) < 0 or abs(sum(probs) - 1.0) > 1e-6:
            raise ValueError(
                f"p_trajgoal + p_randomgoal + p_curgoal must be non-negative and sum to 1, got {probs}"
            )
        for key in ("tdr_dim", "steps", "batch_size"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"{key} must be a positive int, got {getattr(self, key)!r}")


def mlp(in_dim: int, hidden_dims: Sequence[int], out_dim: int, layer_norm: bool) -> nn.Sequential:
    """Linear → GELU (→ LayerNorm) blocks, then a linear head (the paper's MLP)."""
    layers: list[nn.Module] = []
    for width in hidden_dims:
        layers += [nn.Linear(in_dim, width), nn.GELU()]
        if layer_norm:
            layers.append(nn.LayerNorm(width))
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class FourierFeatures(nn.Module):
    """``x`` → ``[x, sin(π·2^k·x), cos(π·2^k·x)]`` for ``k < n_octaves`` (identity when 0).

    Maps ``(..., d)`` to ``(..., d · (1 + 2·n_octaves))``: lets a small MLP on low-dimensional inputs (maze
    coordinates) represent functions that change sharply across a wall.
    """

    def __init__(self, n_octaves: int) -> None:
        super().__init__()
        self.register_buffer("freqs", torch.pi * 2.0 ** torch.arange(int(n_octaves), dtype=torch.float32))

    def out_dim(self, in_dim: int) -> int:
        return in_dim * (1 + 2 * len(self.freqs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.freqs) == 0:
            return x
        angles = (x[..., None] * self.freqs).flatten(-2)
        return torch.cat([x, torch.sin(angles), torch.cos(angles)], dim=-1)


class EnsembleMLP(nn.Module):
    """``n_heads`` independent MLPs evaluated together with batched matmuls (one op per layer for all heads).

    Same architecture per head as :func:`mlp` (Linear → GELU → LayerNorm blocks, linear output).
    """

    def __init__(
        self, n_heads: int, in_dim: int, hidden_dims: Sequence[int], out_dim: int, layer_norm: bool
    ) -> None:
        super().__init__()
        dims = [in_dim, *hidden_dims, out_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        self.ln_scales = nn.ParameterList()
        self.ln_shifts = nn.ParameterList()
        self.layer_norm = layer_norm
        for fan_in, fan_out in itertools.pairwise(dims):
            # PyTorch's nn.Linear default initialisation, drawn independently per head.
            bound = 1.0 / fan_in**0.5
            self.weights.append(nn.Parameter(torch.empty(n_heads, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n_heads, 1, fan_out).uniform_(-bound, bound)))
        for width in hidden_dims:
            self.ln_scales.append(nn.Parameter(torch.ones(n_heads, 1, width)))
            self.ln_shifts.append(nn.Parameter(torch.zeros(n_heads, 1, width)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, in_dim)`` (shared input) or ``(n_heads, B, in_dim)`` → ``(n_heads, B, out_dim)``."""
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(len(self.weights[0]), -1, -1)
        last = len(self.weights) - 1
        for k, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w)
            if k < last:
                x = nn.functional.gelu(x)
                if self.layer_norm:
                    x = nn.functional.layer_norm(x, x.shape[-1:]) * self.ln_scales[k] + self.ln_shifts[k]
        return x


class TDR(nn.Module):
    """Ensemble of φ networks; the first head is the representation used for planning (as in the paper).

    Args:
        obs_dim: observation dimension.
        tdr_dim: dimension of φ.
        hidden_dims: hidden widths of each head.
        layer_norm: LayerNorm after hidden activations.
        n_heads: ensemble size (2 in the paper: the TD target takes the min over heads).
        fourier_features: if > 0, append sin/cos of the inputs at frequencies π·2^k, k < this, before the MLP.
    """

    def __init__(
        self,
        obs_dim: int,
        tdr_dim: int = 16,
        hidden_dims: Sequence[int] = (128, 128),
        layer_norm: bool = True,
        n_heads: int = 2,
        fourier_features: int = 0,
    ) -> None:
        super().__init__()
        self.obs_dim, self.tdr_dim, self.n_heads = int(obs_dim), int(tdr_dim), int(n_heads)
        self.hidden_dims, self.layer_norm = tuple(int(w) for w in hidden_dims), bool(layer_norm)
        self.fourier_features = int(fourier_features)
        self.features = FourierFeatures(fourier_features)
        self.net = EnsembleMLP(
            self.n_heads, self.features.out_dim(self.obs_dim), hidden_dims, self.tdr_dim, layer_norm
        )

    def config(self) -> dict[str, object]:
        """The constructor's arguments (JSON-serialisable): ``TDR(**tdr.config())`` has the same architecture."""
        return {
            "obs_dim": self.obs_dim,
            "tdr_dim": self.tdr_dim,
            "hidden_dims": list(self.hidden_dims),
            "layer_norm": self.layer_norm,
            "n_heads": self.n_heads,
            "fourier_features": self.fourier_features,
        }

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """φ of every head: ``(B, obs_dim)`` → ``(n_heads, B, tdr_dim)``."""
        return self.net(self.features(obs))

    def value(self, obs: torch.Tensor, goals: torch.Tensor) -> torch.Tensor:
        """V(s, g) = −‖φ(s) − φ(g)‖ per head: ``(B, obs_dim)`` ×2 → ``(n_heads, B)``."""
        phi = self(torch.cat([obs, goals]))  # one pass for states and goals
        return distance_value(phi[:, : len(obs)], phi[:, len(obs) :])

    @torch.no_grad()
    def encode(self, obs: np.ndarray, batch_size: int = 65536) -> np.ndarray:
        """φ (first head) of numpy observations: ``(N, obs_dim)`` or ``(obs_dim,)`` → ``(N, tdr_dim)`` / ``(tdr_dim,)``."""
        arr = np.asarray(obs, dtype=np.float32)
        single = arr.ndim == 1
        arr = arr[None] if single else arr
        if arr.ndim != 2 or arr.shape[1] != self.obs_dim:
            raise ValueError(
                f"obs must have shape (N, {self.obs_dim}) or ({self.obs_dim},), got {np.shape(obs)}"
            )
        if not np.all(np.isfinite(arr)):
            raise ValueError("obs must be finite, got NaN/inf")
        out = np.concatenate(
            [
                self(torch.from_numpy(arr[i : i + batch_size]))[0].numpy()
                for i in range(0, len(arr), batch_size)
            ]
        )
        return out[0] if single else out


def distance_value(phi_s: torch.Tensor, phi_g: torch.Tensor) -> torch.Tensor:
    """−‖φ_s − φ_g‖ over the last dim; the 1e-6 floor (as in the paper) keeps the sqrt's gradient finite at s = g."""
    return -torch.sqrt((phi_s - phi_g).pow(2).sum(-1).clamp_min(1e-6))


def expectile_loss(adv: torch.Tensor, diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """Asymmetric L2: weight τ where ``adv >= 0`` else 1 − τ, times ``diff²`` (elementwise)."""
    weight = torch.where(adv >= 0, torch.full_like(adv, expectile), torch.full_like(adv, 1.0 - expectile))
    return weight * diff.pow(2)


def tdr_loss(
    tdr: TDR,
    target: TDR,
    obs: torch.Tensor,
    next_obs: torch.Tensor,
    goals: torch.Tensor,
    rewards: torch.Tensor,
    masks: torch.Tensor,
    discount: float,
    expectile: float,
) -> torch.Tensor:
    """The paper's TDR value loss on one batch (all ``(B, ·)``; rewards/masks ``(B,)``); returns a scalar."""
    b = len(obs)
    with torch.no_grad():
        t_phi = target(torch.cat([obs, next_obs, goals]))  # (H, 3B, d): one pass for all three
        next_v = distance_value(t_phi[:, b : 2 * b], t_phi[:, 2 * b :])  # (H, B)
        q_targets = rewards + discount * masks * next_v  # one target per head
        # Advantage uses the pessimistic (min) next value and the target's mean current value.
        cur_v = distance_value(t_phi[:, :b], t_phi[:, 2 * b :]).mean(0)
        adv = rewards + discount * masks * next_v.min(0).values - cur_v
    v = tdr.value(obs, goals)
    return sum(expectile_loss(adv, q_targets[k] - v[k], expectile).mean() for k in range(len(v)))


def sample_tdr_goals(
    rng: np.random.Generator,
    idx: np.ndarray,
    traj_end: np.ndarray,
    n_rows: int,
    cfg: TDRConfig,
) -> np.ndarray:
    """Goal rows for transitions ``idx``: same-trajectory future (geometric offset ≥ 1, clipped to the
    trajectory's last row), uniformly random row, or the current row, mixed with the config's probabilities."""
    offsets = rng.geometric(1.0 - cfg.discount, size=len(idx))
    future = np.minimum(idx + offsets, traj_end[idx])
    random_rows = rng.integers(0, n_rows, size=len(idx))
    u = rng.random(len(idx))
    goals = np.where(u < cfg.p_trajgoal, future, random_rows)
    return np.where(u >= 1.0 - cfg.p_curgoal, idx, goals)


def train_tdr(
    dataset: Mapping[str, np.ndarray],
    cfg: TDRConfig | None = None,
    *,
    seed: int = 0,
    progress: bool | None = None,
) -> TDR:
    """Train a TDR on an offline dataset (see :mod:`icml25.rl.datasets` for the layout).

    Args:
        dataset: offline dataset (validated by :func:`icml25.rl.datasets.validate_offline_dataset`).
        cfg: hyper-parameters (default :class:`TDRConfig`).
        seed: seeds the initial weights and the batch/goal sampling. The same seed gives the same TDR;
            the caller's global random state (torch, NumPy, ``random``) is left untouched.
        progress: show a progress bar over the gradient steps; ``None`` (default): in a terminal, once the
            training has run for 2 s, never in CI (``CI`` set) or when stderr is not a terminal.

    Returns:
        the trained :class:`TDR` in eval mode (use ``tdr.encode(observations)`` for φ).
    """
    cfg = cfg or TDRConfig()
    data = validate_offline_dataset(dataset)
    traj = trajectories(data)
    valid_rows = np.flatnonzero(traj.valid)
    if len(valid_rows) == 0:
        raise ValueError("dataset must contain at least one transition (a trajectory with a successor state)")
    obs_all = torch.as_tensor(data["observations"], dtype=torch.float32)
    next_all = torch.as_tensor(traj.next_observations, dtype=torch.float32)
    # The initial weights come from torch's generator: a fork seeded with `seed`, restored on exit. The
    # training loop draws only from `rng` (batches and goals), so the caller's random state is untouched.
    with isolated_rng(seed):
        tdr = TDR(
            obs_all.shape[1],
            cfg.tdr_dim,
            cfg.hidden_dims,
            cfg.layer_norm,
            fourier_features=cfg.fourier_features,
        )
    rng = np.random.default_rng(seed)
    target = copy.deepcopy(tdr).requires_grad_(False)
    opt = torch.optim.Adam(tdr.parameters(), lr=cfg.lr)
    bar = progress_kwargs(progress)
    logger.info(
        "TDR training: %d steps, batch %d, %d transitions", cfg.steps, cfg.batch_size, len(valid_rows)
    )
    log_every = max(1, cfg.steps // 10)
    for step in progress_bar(range(cfg.steps), desc="TDR", **bar):
        idx = valid_rows[rng.integers(0, len(valid_rows), size=cfg.batch_size)]
        goal_idx = sample_tdr_goals(rng, idx, traj.traj_end, len(obs_all), cfg)
        obs, nxt, goals = obs_all[idx], next_all[idx], obs_all[goal_idx]
        # Reward −1 per step; reaching the goal gives 0 and ends the bootstrap. "Reached" is the official
        # index test (the goal row is the transition's own row), not equality of observations.
        success = torch.from_numpy((goal_idx == idx).astype(np.float32))
        loss = tdr_loss(
            tdr, target, obs, nxt, goals, success - 1.0, 1.0 - success, cfg.discount, cfg.expectile
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for p, tp in zip(tdr.parameters(), target.parameters()):
                tp.lerp_(p, cfg.tau)
        if (step + 1) % log_every == 0 and logger.isEnabledFor(logging.DEBUG):
            logger.debug("TDR step %d/%d: loss %.5g", step + 1, cfg.steps, loss.detach().item())
    logger.info("TDR trained: final batch loss %.5g", loss.detach().item())
    return tdr.eval()
