"""Sable: a Performant, Efficient and Scalable Sequence Model for MARL — ICML 2025, P45: the retention network.

Mahjoub et al., ICML 2025 (official JAX code ``instadeepai/Mava``: ``mava/networks/retention.py``,
``mava/networks/sable_network.py``). An encoder reads every agent's observation and predicts per-agent values;
a decoder emits the agents' actions autoregressively (agent ``i`` reads the action of agent ``i - 1``, a start
token for agent 0). Attention is replaced by multi-scale retention (:mod:`icml25.kernels.retention`), so the
same weights run

* chunkwise over whole rollouts in training (:meth:`SableNet.forward_train`, hidden states carried from the
  rollout's start, episode resets cutting every path), and
* recurrently, one timestep at a time, when acting (:meth:`SableNet.act`, memory constant in episode length).

Tokens are ordered by timestep, then agent. ``memory="rec"`` is rec-Sable (memory over time and agents);
``memory="ff"`` is ff-Sable (each timestep is its own sequence of agents, κ = 1: no temporal memory).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from icml25.kernels.checks import check_choice, check_int, check_tensor
from icml25.kernels.retention import default_kappas, retention, retention_step
from icml25.kernels.rng import isolated_rng

__all__ = ["MultiScaleRetention", "SableConfig", "SableNet", "SableState"]

SableState = list[torch.Tensor]
"""The hidden states of a :class:`SableNet`: one ``[B, H, Dh, Dh]`` tensor per retention layer (encoder
blocks, then two per decoder block); an empty list for ff-Sable."""


@dataclass(frozen=True)
class SableConfig:
    """Sable's network hyperparameters (defaults: Mava's ``rec_retention.yaml`` except where noted)."""

    n_agents: int
    """Agents per timestep A (fixed per environment)."""
    obs_dim: int
    """Per-agent observation size (homogeneous across agents)."""
    n_actions: int
    """Discrete actions per agent (a categorical head; continuous actions are not supported)."""
    embed_dim: int = 64
    """Width (Mava 64)."""
    n_head: int = 1
    """Retention heads (Mava 1); ``embed_dim % n_head == 0``."""
    n_block: int = 1
    """Encoder and decoder blocks (Mava 1)."""
    memory: str = "rec"
    """``"rec"`` (memory over time, chunkwise training) or ``"ff"`` (agents only, no temporal memory)."""
    decay_scaling_factor: float = 0.8
    """Multiplier of the per-head decays κ_h (Mava's ``rec_retention.yaml`` 0.8; 1.0 keeps κ ≈ 0.97)."""
    chunk_size: int = 32
    """Timesteps per training chunk (Mava 32); sets the memory of training, not its result."""
    agents_per_chunk: int | None = None
    """ff-Sable only: retain the agents in chunks of this many (Mava's ``n_agents_per_chunk``; then the
    encoder is causal across agent chunks, as in Mava); None: one chunk of all agents."""
    key_scaling: bool = False
    """Scale keys by ``d^-1/2`` (in one Mava version, not in the verified one: off)."""
    init: str = "mava"
    """``"mava"``: the official initialisation (retention weights N(0, (1/E)²), orthogonal(√2) encoders and
    heads' first layers); ``"torch"``: this package's earlier one (W_Q/K/V std E^-1/2, torch's defaults for
    W_G, W_O, the encoders and the heads' first layers), which learned the delayed-cue game faster."""

    def __post_init__(self) -> None:
        for name in ("n_agents", "obs_dim", "n_actions", "embed_dim", "n_head", "n_block", "chunk_size"):
            check_int(getattr(self, name), name, low=1)
        if self.embed_dim % self.n_head:
            raise ValueError(
                f"embed_dim must be divisible by n_head, got embed_dim={self.embed_dim}, n_head={self.n_head}"
            )
        if self.memory not in ("rec", "ff"):
            raise ValueError(f"memory must be 'rec' or 'ff', got {self.memory!r}")
        check_choice(self.init, "init", ("mava", "torch"))
        if isinstance(self.decay_scaling_factor, bool) or not isinstance(
            self.decay_scaling_factor, (int, float)
        ):
            raise TypeError(f"decay_scaling_factor must be a float, got {self.decay_scaling_factor!r}")
        if not (math.isfinite(self.decay_scaling_factor) and 0 < self.decay_scaling_factor <= 1):
            raise ValueError(f"decay_scaling_factor must lie in (0, 1], got {self.decay_scaling_factor}")
        if self.agents_per_chunk is not None:
            check_int(self.agents_per_chunk, "agents_per_chunk", low=1)
            if self.n_agents % self.agents_per_chunk:
                raise ValueError(
                    f"n_agents = {self.n_agents} must be divisible by agents_per_chunk = {self.agents_per_chunk}"
                )
            if self.memory == "rec" and self.agents_per_chunk < self.n_agents:
                raise NotImplementedError(
                    "agents_per_chunk < n_agents is supported for memory='ff' only (rec-Sable would decay "
                    "across the agent chunks of one timestep)"
                )


class MultiScaleRetention(nn.Module):
    """Gated multi-scale retention: ``Y = (swish(x_key W_G) ⊙ GroupNorm_heads(Ret(Q, K, V))) W_O``.

    ``Q = x_query W_Q``, ``K = x_key W_K``, ``V = x_value W_V`` (no bias, no ``d^-1/2`` key scaling unless
    ``key_scaling``), one decay κ_h per head (a buffer, not trained). W_Q, W_K, W_V, W_G and W_O are
    initialised from N(0, (1/embed_dim)²), as in Mava's ``retention.py`` (``init="torch"``: W_Q, W_K, W_V
    from N(0, 1/embed_dim), torch's default for W_G and W_O).

    Args:
        embed_dim: E; n_head: H with ``E % H == 0``; kappa: [H] decays in (0, 1];
        causal_agents: the decoder's causal mask over the agents of a timestep.

    :meth:`forward` and :meth:`step` check the inputs' form (``[B, L, E]`` / ``[B, A, E]`` tensors of the
    parameters' dtype, float32 unless the module was converted: a float64 input to a float32 module is a
    ``TypeError``, not a silent cast) but not their values: NaN or ±inf inputs propagate to NaN outputs and
    state (a value check would cost a full pass over every training batch). Validate at the boundary
    (:class:`SableNetwork` checks its observations).
    """

    def __init__(
        self,
        embed_dim: int,
        n_head: int,
        kappa: torch.Tensor,
        causal_agents: bool,
        key_scaling: bool = False,
        init: str = "mava",
    ) -> None:
        super().__init__()
        embed_dim = check_int(embed_dim, "embed_dim", low=1)
        n_head = check_int(n_head, "n_head", low=1)
        if embed_dim % n_head:
            raise ValueError(
                f"embed_dim must be divisible by n_head, got embed_dim={embed_dim}, n_head={n_head}"
            )
        kappa = check_float_tensor("kappa", kappa, 1, f"[n_head] = [{n_head}]")
        if kappa.shape[0] != n_head or not bool(((kappa > 0) & (kappa <= 1)).all()):
            raise ValueError(f"kappa must be [n_head] = [{n_head}] decays in (0, 1], got {kappa.tolist()}")
        self.embed_dim, self.n_head, self.head_dim = embed_dim, n_head, embed_dim // n_head
        self.causal_agents = causal_agents
        self.key_scale = self.head_dim**-0.5 if key_scaling else 1.0
        self.register_buffer("kappa", kappa.detach().to(torch.float32).clone(), persistent=False)
        self.w_q, self.w_k, self.w_v = (nn.Linear(embed_dim, embed_dim, bias=False) for _ in range(3))
        self.w_g = nn.Linear(embed_dim, embed_dim, bias=False)
        self.w_o = nn.Linear(embed_dim, embed_dim, bias=False)
        if check_choice(init, "init", ("mava", "torch")) == "mava":
            for lin in (self.w_q, self.w_k, self.w_v, self.w_g, self.w_o):
                nn.init.normal_(lin.weight, std=1.0 / embed_dim)  # Mava's retention.py: N(0, (1/E)²)
        else:
            for lin in (self.w_q, self.w_k, self.w_v):
                nn.init.normal_(lin.weight, std=embed_dim**-0.5)
        self.norm = nn.GroupNorm(n_head, embed_dim)

    def _check_inputs(self, key: object, query: object, value: object, form: str) -> None:
        """``key``, ``query``, ``value``: tensors of one shape ``[B, *, E]`` in the parameters' dtype."""
        dtype = self.w_q.weight.dtype
        for name, x in (("key", key), ("query", query), ("value", value)):
            x = check_tensor(
                x, name, ndim=3, shape=(None, None, self.embed_dim), finite=False, non_empty=True
            )
            if x.dtype != dtype:
                raise TypeError(f"{name} must be a {dtype} tensor {form} (the module's dtype), got {x.dtype}")
            if x.shape != key.shape:  # type: ignore[union-attr]
                raise ValueError(
                    f"{name} must have the shape of key {tuple(key.shape)}, got {tuple(x.shape)}"  # type: ignore[union-attr]
                )

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # [B, L, E] -> [B, H, L, Dh]
        B, L, _ = x.shape
        return x.reshape(B, L, self.n_head, self.head_dim).transpose(1, 2)

    def _out(self, ret: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        B, _, L, _ = ret.shape
        ret = ret.transpose(1, 2).reshape(B * L, self.embed_dim)
        ret = self.norm(ret).reshape(B, L, self.embed_dim)
        return self.w_o(F.silu(self.w_g(key)) * ret)

    def forward(
        self,
        key: torch.Tensor,
        query: torch.Tensor,
        value: torch.Tensor,
        *,
        n_agents: int,
        state: torch.Tensor | None = None,
        dones: torch.Tensor | None = None,
        chunk_size: int = 1,
        kappa: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chunkwise retention over a sequence.

        Args:
            key, query, value: [B, L, E] with ``L = T · n_agents`` (timestep-major).
            state: [B, H, Dh, Dh] incoming state or None; dones: [B, T] (timestep starts an episode) or None.
            kappa: override of the decays (ff-Sable passes 1).

        Returns:
            ``(y [B, L, E], new_state [B, H, Dh, Dh])``.
        """
        self._check_inputs(key, query, value, f"[B, L, E={self.embed_dim}]")
        q = self._heads(self.w_q(query))
        k = self._heads(self.w_k(key)) * self.key_scale
        v = self._heads(self.w_v(value))
        kap = self.kappa if kappa is None else kappa
        ret, new_state = retention(
            q, k, v, kap, n_agents=n_agents, dones=dones, causal_agents=self.causal_agents,
            chunk_size=chunk_size, state=state,
        )  # fmt: skip
        return self._out(ret, key), new_state

    def step(
        self,
        key: torch.Tensor,
        query: torch.Tensor,
        value: torch.Tensor,
        state: torch.Tensor | None,
        done: torch.Tensor | None,
        kappa: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent retention for one timestep: key/query/value [B, A, E] -> (y [B, A, E], state)."""
        self._check_inputs(key, query, value, f"[B, A, E={self.embed_dim}]")
        q = self._heads(self.w_q(query))
        k = self._heads(self.w_k(key)) * self.key_scale
        v = self._heads(self.w_v(value))
        kap = self.kappa if kappa is None else kappa
        ret, new_state = retention_step(q, k, v, kap, state, done=done, causal_agents=self.causal_agents)
        return self._out(ret, key), new_state


class _SwiGLU(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.w3 = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


_GAIN = math.sqrt(2.0)
"""Orthogonal gain of the encoders and the heads' first layers (Mava's ``sable_network.py``)."""


def _orthogonal(lin: nn.Linear, gain: float) -> nn.Linear:
    """Orthogonal weight with ``gain``, zero bias (flax's ``Dense(kernel_init=orthogonal(gain))``)."""
    nn.init.orthogonal_(lin.weight, gain=gain)
    if lin.bias is not None:
        nn.init.zeros_(lin.bias)
    return lin


def _head(d: int, out: int, gain: float, mava: bool = True) -> nn.Sequential:
    first = _orthogonal(nn.Linear(d, d), _GAIN) if mava else nn.Linear(d, d)
    last = _orthogonal(nn.Linear(d, out), gain)
    return nn.Sequential(first, nn.GELU(), nn.RMSNorm(d), last)


class SableNet(nn.Module):
    """Sable's encoder–decoder retention policy for A agents with discrete actions.

    Encoder: RMSNorm → Linear → GELU embedding, ``n_block`` blocks of [retention (all agents of this and
    earlier timesteps) + SwiGLU], a per-agent value head. Decoder: the one-hot of the previous agent's action
    (index 0: the start token) → Linear → GELU, ``n_block`` blocks of [causal self-retention, causal
    cross-retention (query: the encoder's representation, key/value: the decoder stream) + SwiGLU], a
    categorical policy head. Post-norm residuals with RMSNorm, as in Mava. Initialisation as Mava's
    ``sable_network.py``: orthogonal(√2) for the two encoders and the heads' first layers, orthogonal(0.01)
    for the heads' last layers (zero biases); the retention layers as :class:`MultiScaleRetention`
    (``SableConfig(init="torch")``: the earlier initialisation, torch's defaults but the heads' last layers).

    Args:
        config: a :class:`SableConfig`.
        seed: seeds the initialisation (torch's global generator is left untouched); None: the global one.
    """

    def __init__(self, config: SableConfig, seed: int | None = 0) -> None:
        super().__init__()
        if not isinstance(config, SableConfig):
            raise TypeError(f"config must be a SableConfig, got {type(config).__name__}")
        self.config = c = config
        kappa = default_kappas(c.n_head, float(c.decay_scaling_factor)).float()
        mava = c.init == "mava"

        def enc(lin: nn.Linear) -> nn.Linear:
            return _orthogonal(lin, _GAIN) if mava else lin

        with isolated_rng(seed) if seed is not None else contextlib.nullcontext():
            E = c.embed_dim
            self.obs_encoder = nn.Sequential(
                nn.RMSNorm(c.obs_dim), enc(nn.Linear(c.obs_dim, E, bias=False)), nn.GELU()
            )
            self.enc_ln = nn.RMSNorm(E)
            self.enc_ret = nn.ModuleList(
                MultiScaleRetention(E, c.n_head, kappa, False, c.key_scaling, c.init)
                for _ in range(c.n_block)
            )
            self.enc_ffn = nn.ModuleList(_SwiGLU(E) for _ in range(c.n_block))
            self.enc_ln1 = nn.ModuleList(nn.RMSNorm(E) for _ in range(c.n_block))
            self.enc_ln2 = nn.ModuleList(nn.RMSNorm(E) for _ in range(c.n_block))
            self.value_head = _head(E, 1, 0.01, mava)
            self.action_encoder = nn.Sequential(enc(nn.Linear(c.n_actions + 1, E, bias=False)), nn.GELU())
            self.dec_ln = nn.RMSNorm(E)
            self.dec_ret1 = nn.ModuleList(
                MultiScaleRetention(E, c.n_head, kappa, True, c.key_scaling, c.init) for _ in range(c.n_block)
            )
            self.dec_ret2 = nn.ModuleList(
                MultiScaleRetention(E, c.n_head, kappa, True, c.key_scaling, c.init) for _ in range(c.n_block)
            )
            self.dec_ffn = nn.ModuleList(_SwiGLU(E) for _ in range(c.n_block))
            self.dec_ln1, self.dec_ln2, self.dec_ln3 = (
                nn.ModuleList(nn.RMSNorm(E) for _ in range(c.n_block)) for _ in range(3)
            )
            self.policy_head = _head(E, c.n_actions, 0.01, mava)

    # ------------------------------------------------------------------------------------------ helpers
    @property
    def n_layers(self) -> int:
        """Retention layers with a hidden state (``3 · n_block``)."""
        return 3 * self.config.n_block

    def initial_state(self, batch_size: int) -> SableState:
        """Zero hidden states for ``batch_size`` environments (an empty list for ff-Sable)."""
        check_int(batch_size, "batch_size", low=1)
        if self.config.memory == "ff":
            return []
        c = self.config
        dh = c.embed_dim // c.n_head
        p = next(self.parameters())
        return [p.new_zeros(batch_size, c.n_head, dh, dh) for _ in range(self.n_layers)]

    def _kappa(self) -> torch.Tensor | None:
        return torch.ones(self.config.n_head) if self.config.memory == "ff" else None

    def shift_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Decoder input: actions [..., A] (long) -> one-hot [..., A, n_actions + 1] of the previous agent's
        action (agent 0 gets the start token, index 0)."""
        prev = torch.cat([torch.zeros_like(actions[..., :1]), actions[..., :-1] + 1], dim=-1)
        return F.one_hot(prev, self.config.n_actions + 1).to(next(self.parameters()).dtype)

    def _check_obs(self, obs: object, lead: int) -> torch.Tensor:
        c = self.config
        form = "[B, T, n_agents, obs_dim]" if lead == 2 else "[B, n_agents, obs_dim]"
        if isinstance(obs, torch.Tensor) and obs.ndim == lead + 2 and obs.shape[-1] == c.obs_dim:
            if obs.shape[-2] != c.n_agents and obs.numel() > 0:
                raise NotImplementedError(
                    f"Sable's agent count is fixed per environment: the network has n_agents = {c.n_agents}, "
                    f"obs has {obs.shape[-2]} agents"
                )
        obs = check_float_tensor("obs", obs, lead + 2, form)
        if obs.shape[-1] != c.obs_dim:
            raise ValueError(f"obs must end in obs_dim = {c.obs_dim}, got shape {tuple(obs.shape)}")
        return obs

    def _check_state(self, hstate: object, B: int) -> SableState:
        if hstate is None:
            return self.initial_state(B)
        if not isinstance(hstate, (list, tuple)):
            raise TypeError(f"hstate must be a list of tensors (initial_state), got {type(hstate).__name__}")
        want = self.initial_state(B)
        if len(hstate) != len(want) or any(
            not isinstance(h, torch.Tensor) or h.shape != w.shape for h, w in zip(hstate, want, strict=False)
        ):
            raise ValueError(
                f"hstate must be {len(want)} tensors of shape {tuple(want[0].shape) if want else ()} "
                f"(initial_state({B})), got {[tuple(getattr(h, 'shape', ())) for h in hstate]}"
            )
        return list(hstate)

    # ------------------------------------------------------------------------------------------ training
    def forward_train(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        dones: torch.Tensor | None = None,
        hstate: SableState | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Chunkwise training pass over rollout sequences (teacher-forced decoder).

        Args:
            obs: [B, T, A, obs_dim] float; actions: [B, T, A] long, the actions taken.
            dones: [B, T] bool, ``dones[b, t]``: timestep ``t`` starts a new episode (the hidden state is
                reset before it); None: no resets. ``[B, T, A]`` is accepted if equal across agents.
            hstate: the hidden states at the sequence's start (from :meth:`act`); None: zeros.

        Returns:
            ``(logp [B, T, A], entropy [B, T, A], value [B, T, A])`` of the taken actions.
        """
        c = self.config
        obs = self._check_obs(obs, 2)
        B, T, A, _ = obs.shape
        if not isinstance(actions, torch.Tensor) or actions.dtype not in (torch.int64, torch.int32):
            raise TypeError(
                f"actions must be an integer tensor [B, T, A], got {getattr(actions, 'dtype', type(actions))}"
            )
        if actions.shape != (B, T, A):
            raise ValueError(f"actions must have shape [B, T, A] = {[B, T, A]}, got {tuple(actions.shape)}")
        if actions.numel() and (int(actions.min()) < 0 or int(actions.max()) >= c.n_actions):
            raise ValueError(
                f"actions must lie in [0, {c.n_actions}), got [{int(actions.min())}, {int(actions.max())}]"
            )
        actions = actions.long()
        if dones is not None:
            dones = _team_dones(dones, B, T, A)
        hs = self._check_state(hstate, B)
        if c.memory == "ff":
            # Each timestep is its own sequence of agents: no temporal memory.
            o, a = obs.reshape(B * T, 1, A, -1), actions.reshape(B * T, 1, A)
            logits, value = self._train_seq(o, a, None, [], chunk=1)
            logits, value = logits.reshape(B, T, A, -1), value.reshape(B, T, A)
        else:
            logits, value = self._train_seq(obs, actions, dones, hs, chunk=c.chunk_size)
        dist = torch.distributions.Categorical(logits=logits)
        return dist.log_prob(actions), dist.entropy(), value

    def _train_seq(
        self, obs: torch.Tensor, actions: torch.Tensor, dones: torch.Tensor | None, hs: SableState, chunk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        B, T, A, _ = obs.shape
        L = T * A
        kap = self._kappa()
        n_ag, ch = A, chunk
        if c.memory == "ff" and c.agents_per_chunk is not None:
            n_ag, ch = c.agents_per_chunk, 1  # agent chunks retained in sequence (κ = 1), as Mava does
        state = (lambda i: hs[i]) if hs else (lambda i: None)
        x = self.obs_encoder(obs.reshape(B, L, -1))
        for i in range(c.n_block):
            h = self.enc_ln(x)
            ret, _ = self.enc_ret[i](
                h, h, h, n_agents=n_ag, state=state(i), dones=dones, chunk_size=ch, kappa=kap
            )
            h = self.enc_ln1[i](h + ret)
            x = self.enc_ln2[i](h + self.enc_ffn[i](h))
        value = self.value_head(x).squeeze(-1)
        y = self.dec_ln(self.action_encoder(self.shift_actions(actions).reshape(B, L, -1)))
        for i in range(c.n_block):
            j = c.n_block + 2 * i
            r, _ = self.dec_ret1[i](
                y, y, y, n_agents=n_ag, state=state(j), dones=dones, chunk_size=ch, kappa=kap
            )
            r = self.dec_ln1[i](y + r)
            r2, _ = self.dec_ret2[i](
                r, x, r, n_agents=n_ag, state=state(j + 1), dones=dones, chunk_size=ch, kappa=kap
            )
            z = self.dec_ln2[i](x + r2)
            y = self.dec_ln3[i](z + self.dec_ffn[i](z))
        return self.policy_head(y).reshape(B, T, A, -1), value.reshape(B, T, A)

    # ------------------------------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(
        self,
        obs: torch.Tensor,
        hstate: SableState | None = None,
        first: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, SableState]:
        """One recurrent step: encode the agents, then sample their actions one agent at a time.

        Args:
            obs: [B, A, obs_dim]; hstate: the states from the previous step (None: zeros);
            first: [B] bool, this step starts a new episode (the states are reset first); None: no reset.
            generator: a ``torch.Generator`` for the samples; greedy: take the argmax instead.

        Returns:
            ``(actions [B, A] long, logp [B, A], value [B, A], new_hstate)``; memory is constant in the
            episode length.
        """
        obs = self._check_obs(obs, 1)
        B, A, _ = obs.shape
        hs = self._check_state(hstate, B)
        done = None
        if first is not None:
            done = _team_dones(first.reshape(B, 1) if isinstance(first, torch.Tensor) else first, B, 1, A)[
                :, 0
            ]
        c = self.config
        kap = self._kappa()
        rec = c.memory == "rec"
        st = (lambda i: hs[i]) if rec else (lambda i: None)
        new: list[torch.Tensor] = list(hs)
        x = self.obs_encoder(obs)
        for i in range(c.n_block):
            h = self.enc_ln(x)
            ret, s = self.enc_ret[i].step(h, h, h, st(i), done, kap)
            if rec:
                new[i] = s
            h = self.enc_ln1[i](h + ret)
            x = self.enc_ln2[i](h + self.enc_ffn[i](h))
        value = self.value_head(x).squeeze(-1)
        actions = torch.zeros(B, A, dtype=torch.long, device=obs.device)
        logp = torch.zeros(B, A, dtype=obs.dtype, device=obs.device)
        for agent in range(A):
            y = self.dec_ln(self.action_encoder(self.shift_actions(actions)))
            for i in range(c.n_block):
                j = c.n_block + 2 * i
                r, s1 = self.dec_ret1[i].step(y, y, y, st(j), done, kap)
                r = self.dec_ln1[i](y + r)
                r2, s2 = self.dec_ret2[i].step(r, x, r, st(j + 1), done, kap)
                z = self.dec_ln2[i](x + r2)
                y = self.dec_ln3[i](z + self.dec_ffn[i](z))
                if rec and agent == A - 1:  # the last pass has every agent's input action
                    new[j], new[j + 1] = s1, s2
            logits = self.policy_head(y[:, agent])
            if greedy:
                a = logits.argmax(-1)
            else:
                a = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)
            actions[:, agent] = a
            logp[:, agent] = torch.log_softmax(logits, -1).gather(-1, a[:, None]).squeeze(-1)
        return actions, logp, value, new

    @torch.no_grad()
    def value(
        self, obs: torch.Tensor, hstate: SableState | None = None, first: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-agent values [B, A] of one step (the bootstrap value after a rollout)."""
        obs = self._check_obs(obs, 1)
        B, A, _ = obs.shape
        hs = self._check_state(hstate, B)
        done = None if first is None else _team_dones(first.reshape(B, 1), B, 1, A)[:, 0]
        kap = self._kappa()
        x = self.obs_encoder(obs)
        for i in range(self.config.n_block):
            h = self.enc_ln(x)
            ret, _ = self.enc_ret[i].step(h, h, h, hs[i] if hs else None, done, kap)
            h = self.enc_ln1[i](h + ret)
            x = self.enc_ln2[i](h + self.enc_ffn[i](h))
        return self.value_head(x).squeeze(-1)


def _team_dones(dones: object, B: int, T: int, A: int) -> torch.Tensor:
    """dones [B, T] or [B, T, A] (equal across agents) -> [B, T] bool."""
    if not isinstance(dones, torch.Tensor):
        raise TypeError(f"dones must be a torch.Tensor [B, T], got {type(dones).__name__}")
    if dones.dtype != torch.bool:
        if dones.is_complex() or (dones.numel() and not bool(((dones == 0) | (dones == 1)).all())):
            raise ValueError(f"dones must be bool or 0/1, got dtype {dones.dtype}")
        dones = dones != 0
    if dones.shape == (B, T, A):
        if not bool((dones == dones[..., :1]).all()):
            raise ValueError(
                f"dones must be equal across the {A} agents of each timestep (Sable assumes team-level "
                "termination)"
            )
        dones = dones[..., 0]
    if dones.shape != (B, T):
        raise ValueError(f"dones must have shape [B, T] = {[B, T]} (or [B, T, A]), got {tuple(dones.shape)}")
    return dones


def check_float_tensor(name: str, x: object, ndim: int, form: str) -> torch.Tensor:
    """Validate a non-empty, finite floating tensor of ``ndim`` dims (``form`` describes the shape, e.g.
    ``"[B, A, obs_dim]"``); :func:`icml25.kernels.checks.check_tensor` with the form in the messages."""
    try:
        return check_tensor(x, name, ndim=ndim, non_empty=True)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{err} (expected {form})") from None
