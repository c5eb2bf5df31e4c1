"""Normalizing Flows are Capable Generative Models — ICML 2025, P33: TarFlow, the model and its training loop.

TarFlow (Zhai et al., arXiv 2412.06329; official code ``apple/ml-tarflow``) is a Masked Autoregressive Flow whose conditioner is a causal
Transformer over image patches. An image ``x`` of shape ``(C, H, W)`` is cut into ``N = (H/p)(W/p)``
patch tokens of dimension ``d = C p^2``; ``T`` flow blocks follow, each one

    z'_i = (z_i - b_i(z_{<i})) * exp(-a_i(z_{<i})),     log|det| = -sum_{i,j} a_ij,

with ``(a, b)`` produced by a causal Transformer whose outputs are shifted right by one token (token 0 gets
``a = b = 0``). Consecutive blocks reverse the token order, so every token is eventually transformed
conditioned on every other one. The prior is a standard normal (a per-dimension EMA variance in the
volume-preserving ``nvp=False`` variant). Training is exact maximum likelihood (:func:`tarflow_loss`);
sampling inverts each block token by token with a KV cache, optionally with classifier-free guidance; and
samples of a model trained on Gaussian-noised data are cleaned by one Tweedie step
``x + sigma^2 grad_x log p_sigma(x)`` through the flow's own density (:meth:`TarFlow.denoise`).
:func:`train_flow` is the maximum-likelihood training loop (AdamW, one-epoch warm-up then cosine, fresh
noise augmentation per batch, early stopping on a validation likelihood) for a TarFlow or any flow with an
exact ``log_prob``.

Randomness never comes from the caller's global generators: the constructor takes ``seed=`` (parameter
initialisation under a seeded fork, :func:`icml25.kernels.rng.isolated_rng`), and sampling, label dropout
and training take ``seed=`` / ``generator=``.

Shapes used below: ``B`` batch, ``C`` channels, ``H x W`` image, ``p`` patch size, ``N`` tokens,
``d = C p^2`` token dimension, ``D = C H W`` data dimension, ``w`` transformer width.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_float, check_int, check_size2d, check_tensor
from icml25.kernels.experiment import progress
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = ["TarFlow", "TrainResult", "tarflow_loss", "train_flow"]

# |x| beyond this is certainly not data scaled to [-1, 1], even with noise augmentation or the tails of
# raw samples (e.g. [0, 255] pixels): warn once per model.
_RANGE_WARN_LIMIT = 4.0


# ----------------------------------------------------------------------------------------------------
# Transformer pieces. Pre-LayerNorm (computed in fp32 as the reference does), SDPA attention with an
# optional preallocated KV cache for the token-by-token inverse.
# ----------------------------------------------------------------------------------------------------


def _layer_norm(norm: nn.LayerNorm, h: Tensor) -> Tensor:
    # Half-precision activations are normalised in fp32 (as the reference does) for stability.
    if h.dtype in (torch.float16, torch.bfloat16):
        w, b = norm.weight.float(), norm.bias.float()
        return F.layer_norm(h.float(), norm.normalized_shape, w, b, norm.eps).to(h.dtype)
    return norm(h)


@dataclass
class _KVCache:
    """Keys/values of the tokens processed so far by one attention layer, shape ``(B, heads, N, hd)``."""

    k: Tensor
    v: Tensor
    length: int = 0


class _Attention(nn.Module):
    def __init__(self, width: int, head_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.num_heads = width // head_dim
        self.head_dim = head_dim

    def forward(self, h: Tensor, attn_temp: float = 1.0, cache: _KVCache | None = None) -> Tensor:
        """``h``: ``(B, L, w)``. Without a cache: causal self-attention over the ``L`` tokens. With a cache:
        the ``L`` new tokens are appended and attend to everything cached (the inverse feeds one token at a
        time, so no mask is needed)."""
        bsz, length, width = h.shape
        x = _layer_norm(self.norm, h)
        q, k, v = self.qkv(x).view(bsz, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        # attn_temp > 1 flattens the attention: the reference's "unconditional" branch for guidance.
        scale = 1.0 / (math.sqrt(self.head_dim) * attn_temp)
        if cache is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            if length != 1:
                raise RuntimeError("the KV-cache path processes exactly one token per call")
            end = cache.length + length
            cache.k[:, :, cache.length : end] = k
            cache.v[:, :, cache.length : end] = v
            cache.length = end
            out = F.scaled_dot_product_attention(q, cache.k[:, :, :end], cache.v[:, :, :end], scale=scale)
        return self.proj(out.transpose(1, 2).reshape(bsz, length, width))


class _MLP(nn.Module):
    def __init__(self, width: int, expansion: int = 4) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, expansion * width)
        self.fc2 = nn.Linear(expansion * width, width)

    def forward(self, h: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(_layer_norm(self.norm, h))))


class _Layer(nn.Module):
    def __init__(self, width: int, head_dim: int) -> None:
        super().__init__()
        self.attn = _Attention(width, head_dim)
        self.mlp = _MLP(width)

    def forward(self, h: Tensor, attn_temp: float = 1.0, cache: _KVCache | None = None) -> Tensor:
        h = h + self.attn(h, attn_temp, cache)
        return h + self.mlp(h)


# ----------------------------------------------------------------------------------------------------
# One autoregressive flow block.
# ----------------------------------------------------------------------------------------------------


class _FlowBlock(nn.Module):
    """One TarFlow block: token permutation (identity or reversal) + causal affine autoregressive map."""

    def __init__(
        self,
        token_dim: int,
        num_tokens: int,
        width: int,
        num_layers: int,
        head_dim: int,
        flip: bool,
        nvp: bool,
        num_classes: int,
    ) -> None:
        super().__init__()
        self.flip = flip
        self.nvp = nvp
        self.token_dim = token_dim
        self.proj_in = nn.Linear(token_dim, width)
        self.pos_emb = nn.Parameter(torch.randn(num_tokens, width) * 1e-2)
        self.class_emb = nn.Parameter(torch.randn(num_classes, width) * 1e-2) if num_classes else None
        self.layers = nn.ModuleList(_Layer(width, head_dim) for _ in range(num_layers))
        self.proj_out = nn.Linear(width, 2 * token_dim if nvp else token_dim)
        # Zero output layer (bias too, unlike the reference which zeroes the weight only): the block starts
        # as the identity map with log-det 0, so training starts from the standard-normal model.
        nn.init.zeros_(self.proj_out.weight)
        nn.init.zeros_(self.proj_out.bias)

    def _permute(self, z: Tensor, dim: int = 1) -> Tensor:
        return z.flip(dim) if self.flip else z

    def _cond_embedding(self, y: Tensor | None, bsz: int) -> Tensor | None:
        """Class embedding ``(B, 1, w)``; the mean embedding stands for "no label" (``y is None`` or -1)."""
        if self.class_emb is None:
            return None
        mean = self.class_emb.mean(0)
        if y is None:
            return mean.expand(bsz, 1, -1)
        dropped = (y < 0).unsqueeze(-1)
        emb = torch.where(dropped, mean, self.class_emb[y.clamp(min=0)])
        return emb.unsqueeze(1)

    def _split(self, out: Tensor) -> tuple[Tensor, Tensor]:
        if self.nvp:
            a, b = out.chunk(2, dim=-1)
            return a, b
        return torch.zeros_like(out), out

    def conditioner(
        self, u: Tensor, y: Tensor | None = None, attn_temp: float = 1.0
    ) -> tuple[Tensor, Tensor]:
        """Shift/log-scale for every token of the *permuted* sequence ``u`` ``(B, N, d)``.

        Returns ``(a, b)``, each ``(B, N, d)``; row ``i`` depends on ``u_{<i}`` only (row 0 is zero).
        """
        h = self.proj_in(u) + self._permute(self.pos_emb, dim=0)
        emb = self._cond_embedding(y, u.shape[0])
        if emb is not None:
            h = h + emb
        for layer in self.layers:
            h = layer(h, attn_temp)
        out = self.proj_out(h)
        # Shift right by one token: the output at position i-1 (which saw u_{<=i-1}) parameterises token i.
        out = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
        return self._split(out)

    def forward(self, x: Tensor, y: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Data-to-latent direction. ``x``: ``(B, N, d)`` -> ``(z (B, N, d), log|det J| (B,))``."""
        u = self._permute(x)
        a, b = self.conditioner(u, y)
        z = (u - b) * torch.exp(-a)
        return self._permute(z), -a.flatten(1).sum(1)

    def _new_caches(self, z: Tensor) -> list[_KVCache]:
        bsz, num_tokens, _ = z.shape
        caches = []
        for layer in self.layers:
            shape = (bsz, layer.attn.num_heads, num_tokens, layer.attn.head_dim)
            caches.append(_KVCache(z.new_empty(shape), z.new_empty(shape)))
        return caches

    def _step(
        self, token: Tensor, i: int, emb: Tensor | None, attn_temp: float, caches: list[_KVCache]
    ) -> tuple[Tensor, Tensor]:
        """Feed the already-inverted token ``i`` ``(B, 1, d)``; returns ``(a, b)`` for token ``i + 1``."""
        pos = self._permute(self.pos_emb, dim=0)[i : i + 1]
        h = self.proj_in(token) + pos
        if emb is not None:
            h = h + emb
        for layer, cache in zip(self.layers, caches):
            h = layer(h, attn_temp, cache)
        return self._split(self.proj_out(h))

    def reverse(
        self,
        z: Tensor,
        y: Tensor | None = None,
        guidance: float = 0.0,
        annealed: bool = False,
        attn_temp: float = 1.0,
        use_cache: bool = True,
    ) -> Tensor:
        """Latent-to-data direction, token by token. ``z``: ``(B, N, d)`` -> ``x`` ``(B, N, d)``.

        With ``guidance = w > 0`` a second, "unconditional" pass (mean class embedding, attention
        temperature ``attn_temp``) runs alongside, and ``(a, b) <- (a, b)_c + w ((a, b)_c - (a, b)_u)``.
        ``use_cache=False`` reruns the full masked forward at every step (slow; the test oracle).
        """
        u = self._permute(z).clone()
        bsz, num_tokens, _ = u.shape
        guided = guidance > 0
        emb_c = self._cond_embedding(y, bsz)
        emb_u = self._cond_embedding(None, bsz)
        caches_c = self._new_caches(u) if use_cache else None
        caches_u = self._new_caches(u) if use_cache and guided else None
        for i in range(num_tokens - 1):
            if use_cache:
                a, b = self._step(u[:, i : i + 1], i, emb_c, 1.0, caches_c)
            else:
                a, b = (t[:, i + 1 : i + 2] for t in self.conditioner(u, y))
            if guided:
                if use_cache:
                    a_u, b_u = self._step(u[:, i : i + 1], i, emb_u, attn_temp, caches_u)
                else:
                    a_u, b_u = (t[:, i + 1 : i + 2] for t in self.conditioner(u, None, attn_temp))
                w = guidance * (i + 1) / (num_tokens - 1) if annealed else guidance
                a = a + w * (a - a_u)
                b = b + w * (b - b_u)
            u[:, i + 1 : i + 2] = u[:, i + 1 : i + 2] * torch.exp(a) + b
        return self._permute(u)


# ----------------------------------------------------------------------------------------------------
# The model.
# ----------------------------------------------------------------------------------------------------


class TarFlow(nn.Module):
    """Transformer autoregressive normalizing flow on image patches.

    Args:
        in_channels: ``C``.
        img_size: ``H = W`` (int) or ``(H, W)``; both divisible by ``patch_size``.
        patch_size: ``p``; tokens are ``p x p`` patches of all channels, ``d = C p^2``.
        width: transformer width ``w`` (divisible by ``head_dim``).
        num_blocks: ``T`` flow blocks; odd blocks reverse the token order.
        layers_per_block: ``K`` pre-LN causal transformer layers per block (MLP 4x, GELU).
        head_dim: attention head dimension (the paper uses 64).
        nvp: affine blocks (True) or additive, volume-preserving blocks with a learned per-dimension prior
            variance (False; the variance is an EMA of ``z^2`` updated by :meth:`update_prior`).
        num_classes: > 0 adds a class embedding per block (label ``-1`` or ``None`` = unconditional, the
            mean embedding); 0 for an unconditional model.
        seed: seed of the parameter initialisation, drawn from a seeded fork of torch's global generator
            (the caller's stream is left untouched); None initialises from the global generator, as every
            ``nn.Module`` does.

    Data is expected in ``[-1, 1]`` (plus any noise augmentation). ``forward`` maps images ``(B, C, H, W)``
    to latent tokens ``(B, N, d)`` and the per-sample log-determinant (a **sum** over all ``D`` dims).

    Example:
        >>> model = TarFlow(1, 8, 2, width=32, num_blocks=2, layers_per_block=1, head_dim=16, seed=0)
        >>> x = torch.rand(4, 1, 8, 8) * 2 - 1
        >>> model.log_prob(x).shape
        torch.Size([4])
        >>> model.sample(3, seed=0).shape
        torch.Size([3, 1, 8, 8])
    """

    prior_var: Tensor
    VAR_LR: float = 0.1

    def __init__(
        self,
        in_channels: int,
        img_size: int | tuple[int, int],
        patch_size: int,
        width: int,
        num_blocks: int,
        layers_per_block: int,
        head_dim: int = 64,
        nvp: bool = True,
        num_classes: int = 0,
        *,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        check_int(in_channels, "in_channels", low=1)
        check_int(patch_size, "patch_size", low=1)
        check_int(width, "width", low=1)
        check_int(num_blocks, "num_blocks", low=1)
        check_int(layers_per_block, "layers_per_block", low=1)
        check_int(head_dim, "head_dim", low=1)
        check_int(num_classes, "num_classes", low=0)
        height, wid = check_size2d(img_size, "img_size")
        if height < 1 or wid < 1 or height % patch_size or wid % patch_size:
            raise ValueError(
                f"img_size must be positive and divisible by patch_size={patch_size}, got {(height, wid)}"
            )
        if width % head_dim:
            raise ValueError(f"width must be divisible by head_dim={head_dim}, got width={width}")
        if not isinstance(nvp, bool):
            raise TypeError(f"nvp must be a bool, got {type(nvp).__name__}")
        self.in_channels = in_channels
        self.img_size = (height, wid)
        self.patch_size = patch_size
        self.nvp = nvp
        self.num_classes = num_classes
        self.num_tokens = (height // patch_size) * (wid // patch_size)
        self.token_dim = in_channels * patch_size**2
        with isolated_rng(seed) if seed is not None else contextlib.nullcontext():
            self.blocks = nn.ModuleList(
                _FlowBlock(
                    self.token_dim,
                    self.num_tokens,
                    width,
                    layers_per_block,
                    head_dim,
                    flip=t % 2 == 1,
                    nvp=nvp,
                    num_classes=num_classes,
                )
                for t in range(num_blocks)
            )
        # Prior variance per latent dimension: fixed at 1 for the affine flow; EMA-learned for nvp=False.
        self.register_buffer("prior_var", torch.ones(self.num_tokens, self.token_dim))
        self._warned_range = False

    @property
    def data_dim(self) -> int:
        """``D = C H W``."""
        return self.in_channels * self.img_size[0] * self.img_size[1]

    # ---- shapes --------------------------------------------------------------------------------------

    def patchify(self, x: Tensor) -> Tensor:
        """``(B, C, H, W)`` -> ``(B, N, C p^2)``, tokens in raster order, features ordered (C, p, p)."""
        bsz, c, h, w = x.shape
        p = self.patch_size
        x = x.reshape(bsz, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(bsz, self.num_tokens, self.token_dim)

    def unpatchify(self, z: Tensor) -> Tensor:
        """``(B, N, C p^2)`` -> ``(B, C, H, W)``; the inverse of :meth:`patchify`."""
        bsz = z.shape[0]
        p, (h, w) = self.patch_size, self.img_size
        z = z.reshape(bsz, h // p, w // p, self.in_channels, p, p).permute(0, 3, 1, 4, 2, 5)
        return z.reshape(bsz, self.in_channels, h, w)

    # ---- input validation ----------------------------------------------------------------------------

    def _check_x(self, x: object, name: str = "x") -> Tensor:
        x = check_tensor(x, name, shape=(None, self.in_channels, *self.img_size), finite=False)
        peak = float(x.detach().abs().amax()) if x.numel() else 0.0  # one reduction: finiteness and range
        if not math.isfinite(peak):
            check_tensor(x, name)  # names the NaN and inf counts
        if peak > _RANGE_WARN_LIMIT and not self._warned_range:
            self._warned_range = True
            warnings.warn(
                f"{name} has values far outside [-1, 1] (max |x| = {peak:.3g}); TarFlow expects data scaled to "
                "[-1, 1]",
                stacklevel=3,
            )
        return x

    def _check_y(self, y: object, bsz: int, allow_dropped: bool = True) -> Tensor | None:
        if y is None:
            return None
        if self.num_classes == 0:
            raise ValueError("y must be None for an unconditional model (num_classes=0), got class labels")
        if not isinstance(y, Tensor) or y.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8):
            raise TypeError(f"y must be an integer torch.Tensor of shape (B,), got {y!r}")
        if y.shape != (bsz,):
            raise ValueError(f"y must have shape ({bsz},), got {tuple(y.shape)}")
        low = -1 if allow_dropped else 0
        if y.numel() and (y.min() < low or y.max() >= self.num_classes):
            raise ValueError(
                f"y must hold labels in [{low}, {self.num_classes - 1}] (-1 = no label), "
                f"got range [{y.min().item()}, {y.max().item()}]"
            )
        return y.long()

    # ---- density -------------------------------------------------------------------------------------

    def forward(self, x: Tensor, y: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Images ``(B, C, H, W)`` -> latent tokens ``z`` ``(B, N, d)`` and log|det dz/dx| ``(B,)`` (a sum)."""
        x = self._check_x(x)
        y = self._check_y(y, x.shape[0])
        z = self.patchify(x)
        logdet = z.new_zeros(z.shape[0])
        for block in self.blocks:
            z, ld = block(z, y)
            logdet = logdet + ld
        return z, logdet

    def log_prob(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        """Exact log-density of ``x`` ``(B, C, H, W)`` in nats, per sample ``(B,)``.

        ``log p(x) = log N(z; 0, diag(prior_var)) + log|det dz/dx|``. Compute in fp32 or fp64.
        """
        if isinstance(x, Tensor) and x.dtype in (torch.float16, torch.bfloat16):
            warnings.warn("log_prob/bpd must be computed in fp32 (got half-precision input)", stacklevel=2)
        z, logdet = self(x, y)
        var = self.prior_var.to(z.dtype)
        log_pz = -0.5 * (z.pow(2) / var + var.log() + math.log(2 * math.pi))
        return log_pz.flatten(1).sum(1) + logdet

    def nll_bits_per_dim(self, x: Tensor, y: Tensor | None = None, n_bins: int = 256) -> Tensor:
        """Discrete NLL in bits/dim ``(B,)`` of dequantized data ``x`` in ``[-1, 1]`` with ``n_bins`` levels.

        Each level is a bin of width ``2 / n_bins``, so ``bpd = (-log p(x)/D + log(n_bins/2)) / ln 2``
        (the reference's ``k = 128`` for 8-bit data). Only meaningful for uniformly dequantized models.
        """
        check_int(n_bins, "n_bins", low=2)
        nll = -self.log_prob(x, y) / self.data_dim
        return (nll + math.log(n_bins / 2)) / math.log(2)

    @torch.no_grad()
    def update_prior(self, z: Tensor) -> None:
        """EMA update (rate ``VAR_LR``) of the per-dimension prior variance from latents ``z`` ``(B, N, d)``.

        Only used by the volume-preserving variant (``nvp=False``); a no-op for affine models.
        """
        if self.nvp:
            return
        self.prior_var.lerp_(z.detach().pow(2).mean(0).to(self.prior_var.dtype), self.VAR_LR)

    # ---- sampling ------------------------------------------------------------------------------------

    def _check_guidance(self, y: Tensor | None, guidance: float, attn_temp: float) -> None:
        if isinstance(guidance, bool) or not isinstance(guidance, (int, float)) or not guidance >= 0:
            raise ValueError(f"guidance must be a float >= 0, got {guidance!r}")
        if isinstance(attn_temp, bool) or not isinstance(attn_temp, (int, float)) or not attn_temp > 0:
            raise ValueError(f"attn_temp must be a float > 0, got {attn_temp!r}")
        if guidance > 0:
            if self.num_classes and y is None:
                raise ValueError("guidance > 0 on a conditional model needs class labels y, got y=None")
            if self.num_classes == 0 and attn_temp == 1.0:
                raise ValueError(
                    "guidance > 0 on an unconditional model needs attn_temp != 1 (the unconditional branch "
                    "is the same model with a raised attention temperature), got attn_temp=1.0"
                )

    @torch.no_grad()
    def inverse(
        self,
        z: Tensor,
        y: Tensor | None = None,
        *,
        guidance: float = 0.0,
        annealed: bool = False,
        attn_temp: float = 1.0,
        use_cache: bool = True,
    ) -> Tensor:
        """Latent tokens ``z`` ``(B, N, d)`` -> images ``(B, C, H, W)`` (blocks in reverse order).

        ``guidance``, ``annealed``, ``attn_temp``: see :meth:`sample`. ``use_cache=False`` recomputes the
        full causal forward at every token (the slow oracle for the KV-cache path).
        """
        if (
            not isinstance(z, Tensor)
            or z.dim() != 3
            or tuple(z.shape[1:]) != (self.num_tokens, self.token_dim)
        ):
            shape = tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__
            raise ValueError(
                f"z must be a tensor of shape (B, {self.num_tokens}, {self.token_dim}), got {shape}"
            )
        y = self._check_y(y, z.shape[0], allow_dropped=False)
        self._check_guidance(y, guidance, attn_temp)
        x = z
        for block in reversed(self.blocks):
            x = block.reverse(x, y, float(guidance), annealed, float(attn_temp), use_cache)
        return self.unpatchify(x)

    @torch.no_grad()
    def sample(
        self,
        n: int,
        y: Tensor | None = None,
        guidance: float = 0.0,
        annealed: bool = False,
        temperature: float = 1.0,
        attn_temp: float = 1.0,
        generator: torch.Generator | None = None,
        *,
        seed: int | None = None,
    ) -> Tensor:
        """Draw ``n`` images ``(n, C, H, W)``: ``z ~ N(0, temperature^2 prior_var)``, then :meth:`inverse`.

        Args:
            n: number of samples.
            y: ``(n,)`` class labels for a conditional model (None = unconditional, mean class embedding).
            guidance: classifier-free guidance weight ``w >= 0``; 0 disables it. The unconditional branch
                uses the mean class embedding (conditional models) and attention temperature ``attn_temp``
                (required ``!= 1`` for unconditional models, as in the reference).
            annealed: scale ``w`` by ``(i + 1) / (N - 1)`` along the tokens.
            temperature: standard deviation multiplier of the prior noise.
            generator: torch generator for the prior noise (on the model's device).
            seed: seed of a fresh generator when ``generator`` is None; with neither, a nondeterministic
                one. The global generator is never used.
        """
        check_int(n, "n", low=1)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"temperature must be a float >= 0, got {temperature!r}")
        var = self.prior_var  # (N, d); ones for the affine flow
        gen = make_generator(seed, generator, device=var.device)
        z = torch.randn(n, self.num_tokens, self.token_dim, generator=gen, device=var.device, dtype=var.dtype)
        z = (z * temperature * var.sqrt()).to(next(self.parameters()).dtype)
        return self.inverse(z, y, guidance=guidance, annealed=annealed, attn_temp=attn_temp)

    # ---- denoising -----------------------------------------------------------------------------------

    def score(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        """``grad_x log p(x)`` ``(B, C, H, W)`` by autograd through the forward flow (sum convention)."""
        x = self._check_x(x).detach().requires_grad_(True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(self.log_prob(x, y).sum(), x)
        return grad

    def denoise(
        self, x: Tensor, y: Tensor | None = None, *, noise_std: float, step_scale: float = 1.0
    ) -> Tensor:
        """One Tweedie step ``x + step_scale * noise_std^2 * grad_x log p(x)`` ``(B, C, H, W)``.

        For a model trained on ``x + noise_std * eps``, this is ``E[clean | noisy]`` to first order. The
        gradient is of the per-sample **summed** log-density (the reference steps on the mean loss with
        ``lr = B D sigma^2``, which is the same thing). No clipping is applied.
        """
        if isinstance(noise_std, bool) or not isinstance(noise_std, (int, float)) or not noise_std >= 0:
            raise ValueError(f"noise_std must be a float >= 0, got {noise_std!r}")
        if isinstance(step_scale, bool) or not isinstance(step_scale, (int, float)):
            raise TypeError(f"step_scale must be a float, got {type(step_scale).__name__}")
        x = self._check_x(x)
        if noise_std == 0:
            warnings.warn("denoise called with noise_std=0: returning the input unchanged", stacklevel=2)
            return x
        return (x + step_scale * noise_std**2 * self.score(x, y)).detach()


def tarflow_loss(
    model: TarFlow,
    x: Tensor,
    y: Tensor | None = None,
    label_drop: float = 0.0,
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Training loss: per-dimension NLL without the Gaussian constant, ``0.5 mean(z^2) - mean(logdet)/D``.

    Equal to ``-mean(log_prob)/D - 0.5 log(2 pi)`` for an affine model (unit prior). For the
    volume-preserving variant the loss uses the unit prior, as in the reference, and in training mode the
    prior variance EMA is updated from this batch. ``label_drop`` replaces labels by -1 (unconditional)
    with that probability, for classifier-free guidance.

    Args:
        model: a :class:`TarFlow`.
        x: ``(B, C, H, W)`` training images (already noise-augmented or dequantized).
        y: ``(B,)`` labels for a conditional model, else None.
        label_drop: probability in ``[0, 1]`` of dropping each label.
        generator: torch generator of the label dropout (None: a fresh nondeterministic one; the global
            generator is never used).
    """
    if not isinstance(model, TarFlow):
        raise TypeError(f"model must be a TarFlow, got {type(model).__name__}")
    if isinstance(label_drop, bool) or not isinstance(label_drop, (int, float)) or not 0 <= label_drop <= 1:
        raise ValueError(f"label_drop must be a float in [0, 1], got {label_drop!r}")
    if y is not None and label_drop > 0:
        model._check_y(y, x.shape[0])
        gen = make_generator(generator=generator, device=y.device)
        drop = torch.rand(y.shape, generator=gen, device=y.device) < label_drop
        y = torch.where(drop, torch.full_like(y, -1), y)
    if isinstance(x, Tensor) and x.dim() >= 1 and x.shape[0] == 0:
        raise ValueError(f"x must hold at least one sample (the loss is a mean), got shape {tuple(x.shape)}")
    z, logdet = model(x, y)
    if model.training:
        model.update_prior(z)
    return 0.5 * z.pow(2).mean() - logdet.mean() / model.data_dim


# ----------------------------------------------------------------------------------------------------
# Training loop.
# ----------------------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    """What :func:`train_flow` did. The model itself is trained in place."""

    steps: int
    """Optimiser steps taken."""
    best_step: int
    """Step whose parameters the model holds at the end (the last step without validation data)."""
    best_val_nll: float | None
    """Validation NLL of those parameters in nats/dim (None without validation data)."""
    final_loss: float
    """Training loss of the last batch (per-dim NLL without the Gaussian constant for a TarFlow)."""
    seconds: float
    """Wall time of the loop, validation included."""
    val_history: list[tuple[int, float]] = field(default_factory=list)
    """``(step, validation NLL in nats/dim)`` at every evaluation."""


def _check_images(x: object, name: str, allow_none: bool = False) -> Tensor | None:
    """A finite, non-empty float tensor of images ``(n, C, H, W)`` scaled to about [-1, 1]."""
    if x is None and allow_none:
        return None
    x = check_tensor(x, name, ndim=4, non_empty=True)
    peak = float(x.detach().abs().amax())
    if peak > _TRAIN_RANGE_LIMIT:
        raise ValueError(
            f"{name} must be images scaled to about [-1, 1] (max |x| <= {_TRAIN_RANGE_LIMIT:g}), got max |x| = "
            f"{peak:.3g}"
        )
    return x


# Training data beyond this magnitude is certainly not scaled to [-1, 1] and overflows the flow.
_TRAIN_RANGE_LIMIT = 1e3


@torch.no_grad()
def _mean_nll(model: nn.Module, x: Tensor, chunk: int = 1000) -> float:
    """Mean ``-log p(x) / D`` in nats/dim over ``x``, evaluated ``chunk`` images at a time."""
    total = 0.0
    for start in range(0, len(x), chunk):
        total += -model.log_prob(x[start : start + chunk]).sum().item()
    return total / (len(x) * x[0].numel())


def train_flow(
    model: nn.Module,
    x_train: Tensor,
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    noise_std: float = 0.0,
    x_val: Tensor | None = None,
    eval_every: int = 100,
    warmup: int | None = None,
    weight_decay: float = 1e-4,
    clip_norm: float = 1.0,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    desc: str | None = None,
) -> TrainResult:
    """Train a flow by exact maximum likelihood on noise-augmented data; the model is trained in place.

    The recipe of the reference ``train.py``: AdamW (betas 0.9, 0.95), linear warm-up then a cosine decay to
    0, gradient-norm clipping, and a fresh Gaussian noise draw ``x + noise_std * eps`` for every batch. With
    validation data the parameters of the best validation NLL are restored at the end (early stopping).
    The loss is :func:`tarflow_loss` for a :class:`TarFlow` (whose volume-preserving prior it updates) and
    ``-mean(log_prob(x)) / D`` for any other flow.

    Args:
        model: a :class:`TarFlow`, or any ``nn.Module`` with an exact ``log_prob(x) -> (B,)`` in nats.
        x_train: ``(n, C, H, W)`` clean training images in ``[-1, 1]``.
        steps: optimiser steps.
        batch_size: images per step, drawn with replacement.
        lr: peak learning rate.
        noise_std: ``sigma`` of the Gaussian noise augmentation (0 trains on ``x_train`` as given).
        x_val: ``(m, C, H, W)`` validation images, already noise-augmented (one fixed draw, so the
            stopping criterion is deterministic); None trains for ``steps`` and keeps the last parameters.
        eval_every: validation period in steps (and at the last step).
        warmup: warm-up steps (default one epoch, ``n // batch_size``, as the reference).
        weight_decay: AdamW weight decay.
        clip_norm: gradient-norm clip.
        seed: seed of a fresh generator for the batches and the noise, when ``generator`` is None (neither:
            nondeterministic). The global generators are never used.
        generator: torch generator for the batches and the noise (advanced by the call).
        desc: label of a progress bar (:func:`icml25.kernels.experiment.progress`); None shows none.

    Returns:
        :class:`TrainResult`.
    """
    if not isinstance(model, nn.Module) or not callable(getattr(model, "log_prob", None)):
        raise TypeError(f"model must be an nn.Module with a log_prob method, got {type(model).__name__}")
    x_train = _check_images(x_train, "x_train")
    x_val = _check_images(x_val, "x_val", allow_none=True)
    if x_val is not None and x_val.shape[1:] != x_train.shape[1:]:
        raise ValueError(
            f"x_val must hold images of x_train's shape {tuple(x_train.shape[1:])}, got {tuple(x_val.shape)}"
        )
    steps = check_int(steps, "steps", low=1)
    batch_size = check_int(batch_size, "batch_size", low=1)
    eval_every = check_int(eval_every, "eval_every", low=1)
    warmup = max(1, len(x_train) // batch_size) if warmup is None else check_int(warmup, "warmup", low=1)
    lr = check_float(lr, "lr", low=0.0, low_open=True)
    noise_std = check_float(noise_std, "noise_std", low=0.0)
    weight_decay = check_float(weight_decay, "weight_decay", low=0.0)
    clip_norm = check_float(clip_norm, "clip_norm", low=0.0, low_open=True)
    gen = make_generator(seed, generator, device=x_train.device)

    t0 = time.perf_counter()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    decay = max(1, steps - warmup)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / decay)))
        ),
    )
    is_tarflow = isinstance(model, TarFlow)
    data_dim = x_train[0].numel()
    best, best_state, best_step = math.inf, None, steps
    history: list[tuple[int, float]] = []
    loss = torch.zeros(())
    for step in progress(range(1, steps + 1), desc=desc, disable=True if desc is None else None):
        model.train()
        idx = torch.randint(len(x_train), (batch_size,), generator=gen, device=x_train.device)
        xb = x_train[idx]
        if noise_std > 0:
            xb = xb + noise_std * torch.randn(xb.shape, generator=gen, device=xb.device, dtype=xb.dtype)
        loss = tarflow_loss(model, xb) if is_tarflow else -model.log_prob(xb).mean() / data_dim
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        opt.step()
        sched.step()
        if x_val is not None and (step % eval_every == 0 or step == steps):
            model.eval()
            val = _mean_nll(model, x_val)
            history.append((step, val))
            if val < best:
                best, best_state, best_step = val, copy.deepcopy(model.state_dict()), step
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return TrainResult(
        steps=steps,
        best_step=best_step,
        best_val_nll=best if x_val is not None else None,
        final_loss=float(loss.item()),
        seconds=time.perf_counter() - t0,
        val_history=history,
    )
