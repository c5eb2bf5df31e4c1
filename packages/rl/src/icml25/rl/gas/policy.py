"""GAS: graph-assisted stitching for offline hierarchical RL — ICML 2025, P05: stage 3, the low-level policy.

The low-level policy π(a | s, z) is conditioned on a *direction* in TDR space, z = (φ(g) − φ(s)) / ‖·‖, so
one policy serves every subgoal the planner picks. :func:`train_policy` trains it in one of two ways
(``PolicyConfig.low_level``):

``"critic"`` (default, the official agent, ``M_utils/agents/gas.py`` ``total_critic_actor_loss``): HILP-style
directional skills. Each batch draws a random unit skill z_v per transition and the directional reward
r = (φ(s′) − φ(s))·z_v (mask 1). A value V(s, z) is fitted by expectile regression (τ = 0.7) to the
pessimistic target critic min(Q̄₁, Q̄₂)(s, z_v, a); two critic heads Q_k(s, z_v, a) are regressed onto
r + γ·V(s′, z_v) (V held fixed). The actor is aimed at z_a = normalise(φ(g_sub) − φ(s)), where the subgoal
g_sub of row i is min(i + Geometric(1 − γ), w_i) and w_i is the first later row of the trajectory at TDR
distance ≥ ``subgoal_steps`` from row i (its last row if none; :func:`waystep_indices`,
``O_utils/datasets.py`` ``GASDataset``). Actor loss: −q.mean() / stopgrad(|q|.mean() + 1e-6) + α·BC with
α = 1, the critic held fixed. All three losses are summed and take one Adam step; the target critic follows
by Polyak averaging.

Discrete actions (our grid maze) adapt the official continuous agent as follows: the critic has one output
per action (Q(s, z, ·), the dataset action's entry is regressed), the actor is a categorical head whose
BC term is the cross-entropy of the dataset action, and the actor's q is the expectation Σₐ π(a | s, z_a)·
min(Q₁, Q₂)(s, z_a, a) — the official agent evaluates Q at the Gaussian's mode and differentiates through
the action, which a categorical argmax does not allow. Continuous actions follow the official code:
Q(s, z, clip(μ, −1, 1)) with the constant-std (σ = 1) Gaussian's log-likelihood as BC.

``"bc"``: directional behaviour cloning alone, with hindsight subgoals drawn uniformly 1..``subgoal_steps``
steps ahead in the same trajectory (our earlier CPU-scale simplification; kept as an option and reported
alongside in the reproduction). Discrete action spaces get a categorical head (cross-entropy), continuous
ones a constant-std Gaussian (the MSE of its mean).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from icml25.kernels.checks import check_array, check_choice, check_float, check_int
from icml25.kernels.experiment import progress as progress_bar
from icml25.kernels.rng import isolated_rng
from icml25.rl.datasets import trajectories, validate_offline_dataset
from icml25.rl.gas.tdr import EnsembleMLP, FourierFeatures, expectile_loss, mlp, progress_kwargs

logger = logging.getLogger(__name__)

LOW_LEVELS = ("critic", "bc")
"""Low-level trainings of :func:`train_policy`: the official actor-critic, or directional BC alone."""


@dataclass
class PolicyConfig:
    """Hyper-parameters of the low-level policy (official defaults in brackets).

    Attributes:
        hidden_dims: MLP widths of the actor, value and critic [(512, 512, 512)].
        fourier_features: sin/cos octaves on the observation input (see ``TDRConfig.fourier_features``).
        subgoal_steps: the subgoal horizon ``way_steps`` [8]: ``"critic"`` caps the subgoal at the first
            later row at TDR distance ≥ this; ``"bc"`` draws subgoals 1..this many steps ahead.
        steps, batch_size, lr: Adam training schedule [1M steps, 1024, 3e-4].
        low_level: ``"critic"`` (the official HILP-style actor-critic) or ``"bc"`` (directional BC alone).
        expectile: τ of the value's expectile regression [0.7] (``"critic"`` only).
        alpha: weight of the BC term in the actor loss [1.0] (``"critic"`` only).
        discount: γ of the critic and of the geometric subgoal offset [0.99; 0.995 giant mazes].
        tau: Polyak rate of the target critic [0.005] (``"critic"`` only).
    """

    hidden_dims: Sequence[int] = (128, 128)
    fourier_features: int = 0
    subgoal_steps: int = 6
    steps: int = 2000
    batch_size: int = 256
    lr: float = 1e-3
    low_level: str = "critic"
    expectile: float = 0.7
    alpha: float = 1.0
    discount: float = 0.99
    tau: float = 0.005

    def __post_init__(self) -> None:
        for key in ("subgoal_steps", "steps", "batch_size"):
            check_int(getattr(self, key), key, low=1)
        check_choice(self.low_level, "low_level", LOW_LEVELS)
        check_float(self.expectile, "expectile", low=0.5, high=1.0, high_open=True)
        check_float(self.alpha, "alpha", low=0.0)
        check_float(self.discount, "discount", low=0.0, high=1.0, low_open=True, high_open=True)
        check_float(self.tau, "tau", low=0.0, high=1.0, low_open=True)


def unit_direction(
    phi_target: np.ndarray | torch.Tensor, phi_s: np.ndarray | torch.Tensor, eps: float = 1e-10
):
    """z = (φ_target − φ_s) / (‖φ_target − φ_s‖ + eps), rowwise (``(..., d)`` → ``(..., d)``)."""
    diff = phi_target - phi_s
    if isinstance(diff, torch.Tensor):
        return diff / (diff.norm(dim=-1, keepdim=True) + eps)
    return diff / (np.linalg.norm(diff, axis=-1, keepdims=True) + eps)


def _action_space(n_actions: int | None, action_dim: int | None) -> tuple[bool, int]:
    """``(discrete, size)``: the number of discrete actions or the continuous action dimension, exactly one given."""
    if (n_actions is None) == (action_dim is None):
        raise ValueError(
            f"give exactly one of n_actions (discrete) or action_dim (continuous), got {n_actions}, {action_dim}"
        )
    return n_actions is not None, int(n_actions if n_actions is not None else action_dim)  # type: ignore[arg-type]


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
        self.discrete, out = _action_space(n_actions, action_dim)
        self.obs_dim, self.tdr_dim = int(obs_dim), int(tdr_dim)
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


class DirectionalCritic(nn.Module):
    """Skill-conditioned value V(s, z) and two critic heads Q_k(s, z, a) of the official low-level agent.

    Discrete actions: ``q(obs, z)`` gives ``(2, B, n_actions)`` (one output per action); continuous actions:
    the action is an input and ``q(obs, z, actions)`` gives ``(2, B, 1)``. Built and trained by
    :func:`train_policy` (``low_level="critic"``); acting needs only the actor.
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
        self.discrete, n_out = _action_space(n_actions, action_dim)
        self.features = FourierFeatures(fourier_features)
        in_dim = self.features.out_dim(int(obs_dim)) + int(tdr_dim)
        self.value = mlp(in_dim, hidden_dims, 1, layer_norm=True)
        q_in = in_dim if self.discrete else in_dim + n_out
        q_out = n_out if self.discrete else 1
        self.critic = EnsembleMLP(2, q_in, hidden_dims, q_out, layer_norm=True)

    def v(self, obs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """V(s, z): ``(B, obs_dim)``, ``(B, tdr_dim)`` → ``(B,)``."""
        return self.value(torch.cat([self.features(obs), z], dim=-1)).squeeze(-1)

    def q(self, obs: torch.Tensor, z: torch.Tensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        """Both heads: ``(2, B, n_actions)`` (discrete, ``actions`` unused) or ``(2, B, 1)`` (continuous)."""
        x = torch.cat([self.features(obs), z], dim=-1)
        if not self.discrete:
            if actions is None:
                raise ValueError("continuous critic needs the actions (B, action_dim)")
            x = torch.cat([x, actions], dim=-1)
        return self.critic(x)

    def q_data(self, obs: torch.Tensor, z: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Both heads at the given actions: ``(2, B)``."""
        if self.discrete:
            return self.q(obs, z).gather(-1, actions.view(1, -1, 1).expand(2, -1, 1)).squeeze(-1)
        return self.q(obs, z, actions).squeeze(-1)


def waystep_indices(phi: np.ndarray, traj_end: np.ndarray, way_steps: float) -> np.ndarray:
    """For each row i, the first row j ≥ i of its trajectory with ‖φ_j − φ_i‖ ≥ ``way_steps`` (else its last row).

    The official cap on the low-level subgoal (``GASDataset.build_waysteps_idx_by_distance``).

    Args:
        phi: ``(N, d)`` TDR embeddings of the dataset rows.
        traj_end: ``(N,)`` int, the last row of each row's trajectory (rows are in trajectory order).
        way_steps: the TDR distance threshold, > 0.

    Returns:
        ``(N,)`` int64 row indices, each in ``[i, traj_end[i]]``.
    """
    f = check_array(phi, "phi", ndim=2, dtype=("float", "int"), non_empty=True).astype(np.float64)
    if f.shape[1] == 0:
        raise ValueError(f"phi must have at least one embedding dimension, got shape {f.shape}")
    ends = check_array(traj_end, "traj_end", shape=(len(f),), dtype="int")
    check_float(way_steps, "way_steps", low=0.0, low_open=True)
    if len(f) and (np.any(ends < np.arange(len(f))) or np.any(ends >= len(f))):
        raise ValueError(f"traj_end[i] must lie in [i, {len(f) - 1}] for every row i")
    out = np.empty(len(f), dtype=np.int64)
    block = 64
    for i in range(len(f)):
        end = int(ends[i])
        j, found = i, end
        while j <= end:  # scan forward in blocks: O(distance to the waystep), not O(trajectory length)
            stop = min(end + 1, j + block)
            hits = np.flatnonzero(np.linalg.norm(f[j:stop] - f[i], axis=1) >= way_steps)
            if len(hits):
                found = j + int(hits[0])
                break
            j = stop
        out[i] = found
    return out


def sample_subgoals(
    rng: np.random.Generator, idx: np.ndarray, waysteps: np.ndarray, discount: float
) -> np.ndarray:
    """The official low-level subgoal rows: ``min(idx + Geometric(1 − discount), waysteps[idx])``."""
    return np.minimum(idx + rng.geometric(1.0 - discount, size=len(idx)), waysteps[idx])


def normalised_q_loss(q: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """−q.mean() / stopgrad(|q|.mean() + eps): the official actor's scale-free Q term (a scalar)."""
    return -q.mean() / (q.abs().mean().detach() + eps)


def critic_losses(
    critic: DirectionalCritic,
    target: DirectionalCritic,
    obs: torch.Tensor,
    next_obs: torch.Tensor,
    actions: torch.Tensor,
    z: torch.Tensor,
    rewards: torch.Tensor,
    discount: float,
    expectile: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(value loss, critic loss) of the official agent on one batch (mask 1: the skills never terminate).

    Value: expectile(q̄ − V, τ) with q̄ = min over the target critic's heads at the data action. Critic:
    Σ_k (Q_k − (r + γ·V(s′, z)))², V held fixed.
    """
    with torch.no_grad():
        q_bar = target.q_data(obs, z, actions).min(0).values
        q_target = rewards + discount * critic.v(next_obs, z)
    v = critic.v(obs, z)
    value_loss = expectile_loss(q_bar - v, q_bar - v, expectile).mean()
    q = critic.q_data(obs, z, actions)
    critic_loss = (q - q_target).pow(2).sum(0).mean()
    return value_loss, critic_loss


def actor_loss(
    policy: DirectionalPolicy,
    critic: DirectionalCritic,
    obs: torch.Tensor,
    actions: torch.Tensor,
    z: torch.Tensor,
    alpha: float,
) -> torch.Tensor:
    """The official actor loss, ``normalised_q_loss(q) + alpha · BC``, the critic held fixed.

    Discrete: q = Σₐ π(a | s, z)·min_k Q_k(s, z, a), BC = cross-entropy of the data action. Continuous:
    q = min_k Q_k(s, z, clip(μ, −1, 1)), BC = ½‖a − μ‖² (constant σ = 1 Gaussian, up to a constant).
    """
    out = policy(obs, z)
    if policy.discrete:
        with torch.no_grad():
            q_all = critic.q(obs, z).min(0).values
        q = (out.softmax(-1) * q_all).sum(-1)
        bc = nn.functional.cross_entropy(out, actions)
    else:
        critic.requires_grad_(False)  # gradients flow through the action into the actor only
        try:
            q = critic.q(obs, z, out.clamp(-1.0, 1.0)).min(0).values.squeeze(-1)
        finally:
            critic.requires_grad_(True)
        bc = 0.5 * (out - actions).pow(2).sum(-1).mean()
    return normalised_q_loss(q) + alpha * bc


def train_policy(
    dataset: Mapping[str, np.ndarray],
    phi: np.ndarray,
    cfg: PolicyConfig | None = None,
    *,
    next_phi: np.ndarray | None = None,
    seed: int = 0,
    progress: bool | None = None,
) -> DirectionalPolicy:
    """Train the directional low-level policy (see the module docstring for the two ``cfg.low_level`` modes).

    Args:
        dataset: offline dataset (see :mod:`icml25.rl.datasets`).
        phi: ``(N, tdr_dim)`` TDR embeddings of ``dataset["observations"]``.
        next_phi: ``(N, tdr_dim)`` TDR embeddings of the successor observations (the critic's rewards
            φ(s′) − φ(s), as the official code embeds ``next_observations``); ``None``: taken from ``phi``
            (the next row of the trajectory, or a row holding the same observation).
        cfg: hyper-parameters (default :class:`PolicyConfig`).
        seed: seeds the initial weights and the batch/subgoal/skill sampling. The same seed gives the same
            policy; the caller's global random state (torch, NumPy, ``random``) is left untouched.
        progress: show a progress bar over the gradient steps; ``None`` (default): in a terminal, once the
            training has run for 2 s, never in CI (``CI`` set) or when stderr is not a terminal.

    Returns:
        the actor, a :class:`DirectionalPolicy` in eval mode (the critic is a training device only).
    """
    cfg = cfg or PolicyConfig()
    data = validate_offline_dataset(dataset)
    phi = _check_embeddings(phi, "phi", (len(data["observations"]), None))
    if next_phi is not None:
        next_phi = _check_embeddings(next_phi, "next_phi", phi.shape)
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
    shapes = {
        "obs_dim": data["observations"].shape[1],
        "tdr_dim": phi.shape[1],
        "n_actions": int(actions.max()) + 1 if discrete else None,
        "action_dim": None if discrete else actions.shape[1],
        "hidden_dims": cfg.hidden_dims,
        "fourier_features": cfg.fourier_features,
    }
    critic_mode = cfg.low_level == "critic"
    # The initial weights come from torch's generator: a fork seeded with `seed`, restored on exit. The
    # training loop draws only from `rng` (batches, subgoals, skills), so the caller's random state is untouched.
    with isolated_rng(seed):
        policy = DirectionalPolicy(**shapes)
        critic = DirectionalCritic(**shapes) if critic_mode else None
    rng = np.random.default_rng(seed)
    obs_t = torch.as_tensor(data["observations"], dtype=torch.float32)
    phi_t = torch.from_numpy(phi)
    act_t = torch.as_tensor(actions, dtype=torch.int64 if discrete else torch.float32)
    params = list(policy.parameters())
    if critic is not None:
        # The successor's φ is that of the next observation row when it is the next row of the trajectory;
        # otherwise (the last row, given next_observations) it is embedded from the row's nearest match.
        next_t = torch.as_tensor(traj.next_observations, dtype=torch.float32)
        if next_phi is None:
            next_phi_t = _next_phi(phi, data["observations"], traj.next_observations, traj.traj_end)
        else:
            next_phi_t = torch.from_numpy(next_phi)
        waysteps = waystep_indices(phi, traj.traj_end, cfg.subgoal_steps)
        target = copy.deepcopy(critic).requires_grad_(False)
        params += list(critic.parameters())
    opt = torch.optim.Adam(params, lr=cfg.lr)
    bar = progress_kwargs(progress)
    logger.info(
        "policy training (%s): %d steps, batch %d, %d source rows", cfg.low_level, cfg.steps,
        cfg.batch_size, len(rows),
    )  # fmt: skip
    log_every = max(1, cfg.steps // 10)
    for step in progress_bar(range(cfg.steps), desc="policy", **bar):
        idx = rows[rng.integers(0, len(rows), size=cfg.batch_size)]
        if critic is None:
            goal = np.minimum(idx + rng.integers(1, cfg.subgoal_steps + 1, size=len(idx)), traj.traj_end[idx])
            z = unit_direction(phi_t[goal], phi_t[idx])
            out = policy(obs_t[idx], z)
            if discrete:
                loss = nn.functional.cross_entropy(out, act_t[idx])
            else:
                loss = (out - act_t[idx]).pow(2).sum(-1).mean()
        else:
            goal = sample_subgoals(rng, idx, waysteps, cfg.discount)
            z_actor = unit_direction(phi_t[goal], phi_t[idx])
            skills = torch.from_numpy(rng.standard_normal((len(idx), phi.shape[1])).astype(np.float32))
            z_value = skills / (skills.norm(dim=-1, keepdim=True) + 1e-10)
            rewards = ((next_phi_t[idx] - phi_t[idx]) * z_value).sum(-1)
            value_l, critic_l = critic_losses(
                critic, target, obs_t[idx], next_t[idx], act_t[idx], z_value, rewards, cfg.discount,
                cfg.expectile,
            )  # fmt: skip
            loss = value_l + critic_l + actor_loss(policy, critic, obs_t[idx], act_t[idx], z_actor, cfg.alpha)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if critic is not None:
            with torch.no_grad():
                for p, tp in zip(critic.parameters(), target.parameters()):
                    tp.lerp_(p, cfg.tau)
        if (step + 1) % log_every == 0 and logger.isEnabledFor(logging.DEBUG):
            logger.debug("policy step %d/%d: loss %.5g", step + 1, cfg.steps, loss.detach().item())
    logger.info("policy trained: final batch loss %.5g", loss.detach().item())
    return policy.eval()


def _check_embeddings(x: np.ndarray, name: str, shape: tuple[int, int | None]) -> np.ndarray:
    """``x`` as finite float32 ``(n, d)`` with ``n = shape[0]`` (and ``d = shape[1]`` unless ``None``)."""
    arr = np.asarray(x)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise TypeError(f"{name} must be a real numeric array (N, tdr_dim), got dtype {arr.dtype}")
    n, d = shape
    if arr.ndim != 2 or len(arr) != n or arr.shape[1] == 0 or (d is not None and arr.shape[1] != d):
        want = f"({n}, {d})" if d is not None else f"({n}, tdr_dim >= 1)"
        raise ValueError(f"{name} must have shape {want} (one row per observation), got {arr.shape}")
    with np.errstate(over="ignore"):  # values beyond float32's range become Inf and are reported below
        out = arr.astype(np.float32)
    if not np.all(np.isfinite(out)):
        raise ValueError(
            f"{name} must be finite in float32 (|{name}| < 3.4e38); got {int(np.isnan(out).sum())} NaN and "
            f"{int(np.isinf(out).sum())} Inf values in an array of shape {out.shape}"
        )
    return out


def _next_phi(phi: np.ndarray, obs: np.ndarray, next_obs: np.ndarray, traj_end: np.ndarray) -> torch.Tensor:
    """φ of each row's successor observation, taken from the dataset's own embeddings ``phi``.

    Row i's successor is row i+1 when i is not its trajectory's last row and row i+1 holds that observation
    (the official code embeds ``next_observations`` with the same network: identical values). Otherwise the
    successor is looked up among the rows with the same observation; if none exists, φ(s′) = φ(s) (a zero
    reward: such a row only trains the critic on an unknown successor as a stay).
    """
    n = len(phi)
    out = phi.copy()
    inside = np.arange(n) < traj_end
    nxt_row = np.minimum(np.arange(n) + 1, n - 1)
    same = inside & np.all(obs[nxt_row] == next_obs, axis=1)
    out[same] = phi[nxt_row[same]]
    rest = np.flatnonzero(~same)
    if len(rest):
        lookup = {row.tobytes(): k for k, row in enumerate(np.ascontiguousarray(obs))}
        for i in rest:
            k = lookup.get(np.ascontiguousarray(next_obs[i]).tobytes())
            if k is not None:
                out[i] = phi[k]
    return torch.from_numpy(out)
