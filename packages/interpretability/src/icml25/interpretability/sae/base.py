"""The SAE zoo: TopK (with AuxK), BatchTopK and ReLU sparse autoencoders behind one base class.

The sparse autoencoders every SAE paper in this package builds on (P22 MSAE; P19 SAeUron reuses them):

* :class:`TopKSAE` — ``z = ReLU(TopK_k(pre))`` (Gao et al. 2024), optional AuxK dead-latent loss;
* :class:`BatchTopKSAE` — top ``B·k`` activations over the whole batch while training, a learned global
  threshold at inference (Bussmann et al. 2024);
* :class:`ReLUSAE` — ``z = ReLU(pre)`` with MSAE's input-normalised L1 penalty.

Parameters use SAELens names and shapes::

    pre   = (x − b_dec) @ W_enc + b_enc      W_enc [d_in, d_sae], b_enc [d_sae]  (MSAE: b_pre ≡ b_dec)
    x̂     = z @ W_dec + b_dec                W_dec [d_sae, d_in], b_dec [d_in]

Every model accepts inputs ``[..., d_in]`` (flattened internally) and can be capped at inference with any
``k`` (``encode(x, k)`` keeps the k largest pre-activations, then ReLU), which is how the reconstruction-vs-
sparsity curves of the paper are measured. Top-k decodes go through the shared ``icml25.kernels`` op.

Every model saves to a folder (``model.save(path)``: ``config.json`` + ``model.safetensors``, see
:mod:`icml25.interpretability.sae.serialization`) and ``SparseAutoencoder.load(path)`` rebuilds the saved
class with the same parameters and buffers, bit for bit.
"""

from __future__ import annotations

import abc
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from icml25.interpretability.sae.losses import RECON_KINDS, nmse, normalized_l1, reconstruction_loss
from icml25.interpretability.sae.preprocessing import ActivationNormalizer
from icml25.interpretability.sae.serialization import (
    WEIGHTS_NAME,
    dtype_from_name,
    dtype_name,
    read_folder,
    write_folder,
)
from icml25.kernels.checks import check_int
from icml25.kernels.rng import make_generator
from icml25.kernels.topk_decode import topk_decode

logger = logging.getLogger(__name__)
SAE = TypeVar("SAE", bound="SparseAutoencoder")
#: Every SparseAutoencoder subclass by class name: what ``SparseAutoencoder.load`` can rebuild.
_SAE_CLASSES: dict[str, type[SparseAutoencoder]] = {}
_NORMALIZER_MEAN = "normalizer.mean"


def topk_relu(pre: torch.Tensor, k: int, sorted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the pre-activations along the last dim, then ReLU (largest values, not absolute ones).

    Exactly ``k`` entries are kept per row, ties included (``torch.topk`` picks k indices). Returns
    ``(values [..., k], idx [..., k])``; values are ``ReLU(pre)`` at ``idx``.
    """
    vals, idx = torch.topk(pre, k, dim=-1, sorted=sorted)
    return vals.relu(), idx


def scatter_latents(values: torch.Tensor, idx: torch.Tensor, d_sae: int) -> torch.Tensor:
    """Dense latents ``[..., d_sae]`` holding ``values`` at ``idx`` and zeros elsewhere."""
    z = values.new_zeros(*values.shape[:-1], d_sae)
    return z.scatter(-1, idx, values)


class SparseAutoencoder(nn.Module, abc.ABC):
    """Shared parameters, init, encode/decode and decoder-norm utilities of all SAEs here.

    Subclasses define :meth:`activate` (default latents from pre-activations, dense [B, d_sae]) and
    :meth:`loss` (the training objective on a flattened batch).

    Args:
        d_in: input dimension d.
        d_sae: number of latents n.
        loss_kind: reconstruction loss, ``"nmse"`` (MSAE ICML code, default) or ``"mse"``.
        init_norm: norm of the decoder rows at init (MSAE / Anthropic: 0.1); ``W_enc = W_decᵀ``.
        seed: seeds the initial weights from a local generator (the same seed gives the same weights
            in every model of the zoo, and the global random state is untouched); ``None`` draws from
            torch's global generator, as ``nn.Linear`` does.
    """

    #: learning rate the MSAE paper used for this model family (the training loop's default).
    default_lr: float = 5e-4

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _SAE_CLASSES[cls.__name__] = cls

    def __init__(
        self,
        d_in: int,
        d_sae: int,
        *,
        loss_kind: str = "nmse",
        init_norm: float = 0.1,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.d_in = check_int(d_in, "d_in", low=1)
        self.d_sae = check_int(d_sae, "d_sae", low=1)
        if loss_kind not in RECON_KINDS:
            raise ValueError(f"loss_kind must be one of {RECON_KINDS}, got {loss_kind!r}")
        if not (isinstance(init_norm, (int, float)) and init_norm > 0):
            raise ValueError(f"init_norm must be a positive float, got {init_norm!r}")
        self.loss_kind = loss_kind
        self.init_norm = float(init_norm)
        W_dec = torch.empty(d_sae, d_in)
        generator = None if seed is None else make_generator(seed)
        nn.init.kaiming_uniform_(W_dec, a=math.sqrt(5), generator=generator)
        W_dec = W_dec / W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12) * init_norm
        self.W_dec = nn.Parameter(W_dec)
        self.W_enc = nn.Parameter(W_dec.t().clone())
        self.b_enc = nn.Parameter(torch.zeros(d_sae))
        self.b_dec = nn.Parameter(torch.zeros(d_in))
        # Training samples seen since each latent last fired: dead-latent statistics and AuxK.
        self.register_buffer("samples_since_fired", torch.zeros(d_sae, dtype=torch.long))

    # ----------------------------------------------------------------------------------------- inputs
    def _flatten(self, x: torch.Tensor, name: str = "x") -> tuple[torch.Tensor, torch.Size]:
        """Validate ``x`` [..., d_in] and return it as [B, d_in] plus the leading shape."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor [..., d_in={self.d_in}], got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        if x.ndim < 1 or x.shape[-1] != self.d_in:
            raise ValueError(f"{name} must have shape [..., d_in={self.d_in}], got {tuple(x.shape)}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} must be finite, got {int((~torch.isfinite(x)).sum())} NaN/inf entries")
        return x.reshape(-1, self.d_in).to(self.W_enc.dtype), x.shape[:-1]

    def _batch(self, x: torch.Tensor, name: str = "x") -> torch.Tensor:
        """A training batch: ``_flatten`` plus at least one sample (a mean over none would be NaN)."""
        x2, _ = self._flatten(x, name)
        if x2.shape[0] == 0:
            raise ValueError(
                f"{name} must hold at least one sample [..., d_in={self.d_in}], got an empty batch of shape "
                f"{tuple(x.shape)}"
            )
        return x2

    def _check_k(self, k: int | None) -> int | None:
        return None if k is None else check_int(k, "k", low=1, high=self.d_sae)

    # -------------------------------------------------------------------------------------- encode/decode
    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        """``(x − b_dec) @ W_enc + b_enc`` for x [B, d_in] → [B, d_sae] (no validation; internal)."""
        return (x - self.b_dec) @ self.W_enc + self.b_enc

    @abc.abstractmethod
    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        """The model's default latents [B, d_sae] from pre-activations [B, d_sae]."""

    def encode(self, x: torch.Tensor, k: int | None = None) -> torch.Tensor:
        """Latents [..., d_sae] of x [..., d_in].

        ``k=None`` uses the model's own activation (TopK: its k; ReLU/MSAE: uncapped ReLU; BatchTopK:
        its threshold). An int ``k`` caps at inference: ``ReLU(TopK_k(pre))``.
        """
        x2, lead = self._flatten(x)
        k = self._check_k(k)
        pre = self.pre_activations(x2)
        if k is None:
            z = self.activate(pre)
        else:
            z = scatter_latents(*topk_relu(pre, k), self.d_sae)
        return z.reshape(*lead, self.d_sae)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """``z @ W_dec + b_dec`` for dense latents z [..., d_sae] → [..., d_in]."""
        if not isinstance(z, torch.Tensor) or z.ndim < 1 or z.shape[-1] != self.d_sae:
            got = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
            raise ValueError(f"z must be a tensor of shape [..., d_sae={self.d_sae}], got {got}")
        return z @ self.W_dec + self.b_dec

    def decode_sparse(self, values: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Decode top-k codes ``values, idx`` [..., k] → [..., d_in] with the sparse kernel (O(k·d))."""
        return topk_decode(values, idx, self.W_dec) + self.b_dec

    def forward(self, x: torch.Tensor, k: int | None = None) -> torch.Tensor:
        """Reconstruction x̂ [..., d_in] of x [..., d_in], optionally capped at ``k`` active latents."""
        x2, lead = self._flatten(x)
        k = self._check_k(k)
        pre = self.pre_activations(x2)
        if k is None:
            x_hat = self.activate(pre) @ self.W_dec + self.b_dec
        else:
            x_hat = self.decode_sparse(*topk_relu(pre, k))
        return x_hat.reshape(*lead, self.d_in)

    # ------------------------------------------------------------------------------------------ training
    @abc.abstractmethod
    def loss(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Training objective on a batch x [..., d_in]; returns ``(loss, logs)``."""

    @torch.no_grad()
    def _update_fired(self, fired: torch.Tensor, batch_size: int) -> None:
        """Track samples since each latent last fired; ``fired`` is a [d_sae] bool mask of this batch."""
        self.samples_since_fired += batch_size
        self.samples_since_fired[fired] = 0

    @torch.no_grad()
    def normalize_decoder_(self) -> torch.Tensor:
        """Rescale decoder rows to unit norm, compensating in W_enc columns and b_enc (MSAE training step).

        Multiplying latent i's pre-activation by its row norm ``s_i`` and dividing its decoder row by
        ``s_i`` leaves the ReLU reconstruction unchanged (and the top-k one when the norms are equal).
        Returns the norms [d_sae] that were divided out.
        """
        norms = self.W_dec.norm(dim=1) + torch.finfo(self.W_dec.dtype).eps
        self.W_dec.div_(norms[:, None])
        self.W_enc.mul_(norms[None, :])
        self.b_enc.mul_(norms)
        return norms

    @torch.no_grad()
    def project_decoder_grad_(self) -> None:
        """Remove from ``W_dec.grad`` the component parallel to each decoder row (keeps rows on the sphere)."""
        if self.W_dec.grad is None:
            return
        W, G = self.W_dec, self.W_dec.grad
        coef = (G * W).sum(dim=1, keepdim=True) / W.pow(2).sum(dim=1, keepdim=True).clamp_min(1e-12)
        G.sub_(coef * W)

    def dead_latents(self, after_samples: int) -> torch.Tensor:
        """[d_sae] bool mask of latents that have not fired in the last ``after_samples`` training samples."""
        return self.samples_since_fired >= after_samples

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_sae={self.d_sae}, loss_kind={self.loss_kind!r}"

    # --------------------------------------------------------------------------------------- persistence
    def config(self) -> dict[str, Any]:
        """The constructor's arguments (JSON types) that rebuild this architecture: ``type(m)(**m.config())``.

        ``seed`` is not part of it: it only draws the initial weights, which :meth:`load` overwrites.
        """
        return {
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "loss_kind": self.loss_kind,
            "init_norm": self.init_norm,
        }

    @classmethod
    def from_config(cls: type[SAE], config: dict[str, Any]) -> SAE:
        """A fresh model of this class from :meth:`config` (initial weights from a private generator)."""
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict of {cls.__name__} arguments, got {type(config).__name__}")
        return cls(**config, seed=0)

    def save(self, path: str | os.PathLike, *, normalizer: ActivationNormalizer | None = None) -> Path:
        """Write the model to the folder ``path`` (created if needed); returns it as a ``Path``.

        ``config.json`` holds the class name, :meth:`config` and the dtype; ``model.safetensors`` the
        ``state_dict()`` (parameters and buffers). A fitted ``normalizer`` the model was trained behind is
        stored with it (read back by :meth:`load_normalizer`). Existing files of those names are overwritten.
        """
        tensors = dict(self.state_dict())
        header: dict[str, Any] = {
            "class": type(self).__name__,
            "config": self.config(),
            "dtype": dtype_name(self.W_enc.dtype),
            "normalizer": None,
        }
        if normalizer is not None:
            if not isinstance(normalizer, ActivationNormalizer):
                raise TypeError(
                    f"normalizer must be an ActivationNormalizer, got {type(normalizer).__name__}"
                )
            header["normalizer"], mean = normalizer._export_state()
            if mean.numel() != self.d_in:
                raise ValueError(
                    f"normalizer was fitted on d={mean.numel()} features, model has d_in={self.d_in}"
                )
            tensors[_NORMALIZER_MEAN] = mean
        folder = write_folder(path, tensors, header)
        logger.info("%s saved to %s", type(self).__name__, folder)
        return folder

    @classmethod
    def load(cls: type[SAE], path: str | os.PathLike, *, device: str | torch.device = "cpu") -> SAE:
        """Rebuild a model written by :meth:`save`, in eval mode on ``device``: the same parameters and buffers.

        ``SparseAutoencoder.load`` returns whichever class was saved; ``TopKSAE.load`` (etc.) also checks
        that the folder holds that class (or a subclass).

        Raises:
            FileNotFoundError: ``path`` or one of its two files does not exist.
            NotADirectoryError: ``path`` is a file.
            ValueError: not a saved SAE, a saved SAE of another class, a config its class rejects, or
                tensors that are missing, unexpected or of other shapes than the config implies.
        """
        folder, header, tensors = read_folder(path, device=device)
        name = header.get("class")
        saved = _SAE_CLASSES.get(name) if isinstance(name, str) else None
        if saved is None:
            raise ValueError(f"{folder} holds an unknown SAE class {name!r}; known: {sorted(_SAE_CLASSES)}")
        if not issubclass(saved, cls):
            raise ValueError(
                f"{folder} holds a {name}, not a {cls.__name__}: load it with {name}.load or SparseAutoencoder.load"
            )
        try:
            model = saved.from_config(header.get("config"))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{folder} has a config that {name} rejects: {err}") from None
        model = model.to(dtype=dtype_from_name(header.get("dtype")), device=device)
        state = {key: t for key, t in tensors.items() if key != _NORMALIZER_MEAN}
        expected = model.state_dict()
        if set(state) != set(expected):
            raise ValueError(
                f"{folder / WEIGHTS_NAME} must hold the tensors {sorted(expected)} of a {name}; missing "
                f"{sorted(set(expected) - set(state))}, unexpected {sorted(set(state) - set(expected))}"
            )
        for key, want in expected.items():
            if state[key].shape != want.shape:
                raise ValueError(
                    f"{folder / WEIGHTS_NAME}: tensor {key!r} has shape {tuple(state[key].shape)}, but the config "
                    f"({name}, d_in={model.d_in}, d_sae={model.d_sae}) needs {tuple(want.shape)}"
                )
        model.load_state_dict(state)
        logger.info("%s loaded from %s", name, folder)
        return model.eval()

    @staticmethod
    def load_normalizer(path: str | os.PathLike) -> ActivationNormalizer | None:
        """The :class:`ActivationNormalizer` saved with the model in ``path`` (``None`` if none was)."""
        folder, header, tensors = read_folder(path)
        state = header.get("normalizer")
        if state is None:
            return None
        if not isinstance(state, dict) or _NORMALIZER_MEAN not in tensors:
            raise ValueError(f"{folder} has a normalizer entry but no consistent {_NORMALIZER_MEAN!r} tensor")
        return ActivationNormalizer._from_state(state, tensors[_NORMALIZER_MEAN])


class TopKSAE(SparseAutoencoder):
    """TopK SAE: ``z = ReLU(TopK_k(pre))`` (Gao et al., 2024), with the optional AuxK dead-latent loss.

    AuxK (``aux_k`` set): latents that have not fired for ``dead_after`` training samples reconstruct the
    residual ``x − x̂`` with their own top-``aux_k`` activations; ``aux_coef · NMSE(ê, x − x̂)`` is added to
    the loss, so dead latents receive gradient. MSAE does not use it; SAeUron (P19) does.

    Args:
        d_in, d_sae: sizes.
        k: active latents per sample, ``1 <= k <= d_sae``.
        aux_k: active dead latents in the auxiliary loss (``None``: no AuxK; Gao et al. use 512).
        aux_coef: weight of the auxiliary loss (Gao et al.: 1/32).
        dead_after: samples without firing after which a latent counts as dead (Gao et al.: 10M tokens).
        loss_kind, init_norm, seed: as in :class:`SparseAutoencoder`.
    """

    def __init__(
        self,
        d_in: int,
        d_sae: int,
        k: int = 32,
        *,
        aux_k: int | None = None,
        aux_coef: float = 1 / 32,
        dead_after: int = 10_000_000,
        loss_kind: str = "nmse",
        init_norm: float = 0.1,
        seed: int | None = None,
    ) -> None:
        super().__init__(d_in, d_sae, loss_kind=loss_kind, init_norm=init_norm, seed=seed)
        self.k = check_int(k, "k", low=1, high=d_sae)
        self.aux_k = None if aux_k is None else check_int(aux_k, "aux_k", low=1, high=d_sae)
        if not (isinstance(aux_coef, (int, float)) and aux_coef >= 0):
            raise ValueError(f"aux_coef must be a non-negative float, got {aux_coef!r}")
        self.aux_coef = float(aux_coef)
        self.dead_after = check_int(dead_after, "dead_after", low=1)

    def config(self) -> dict[str, Any]:
        return {
            **super().config(), "k": self.k, "aux_k": self.aux_k, "aux_coef": self.aux_coef,
            "dead_after": self.dead_after,
        }  # fmt: skip

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return scatter_latents(*topk_relu(pre, self.k), self.d_sae)

    def loss(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        x2 = self._batch(x)
        pre = self.pre_activations(x2)
        values, idx = topk_relu(pre, self.k)
        x_hat = self.decode_sparse(values, idx)
        recon = reconstruction_loss(x_hat, x2, self.loss_kind)
        fired = torch.zeros(self.d_sae, dtype=torch.bool, device=x2.device)
        fired[idx[values > 0]] = True
        self._update_fired(fired, x2.shape[0])
        logs = {"recon": float(recon.detach())}
        loss = recon
        if self.aux_k is not None:
            aux = self.auxk_loss(pre, x2 - x_hat)
            logs["aux"] = float(aux.detach())
            loss = loss + self.aux_coef * aux
        return loss, logs

    def auxk_loss(self, pre: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """NMSE of the residual [B, d] reconstructed by the top-``aux_k`` dead latents of ``pre`` [B, n].

        Zero (and no gradient) when no latent is dead. The residual is a fixed target (detached).
        """
        dead = self.dead_latents(self.dead_after)
        n_dead = int(dead.sum())
        if n_dead == 0 or self.aux_k is None:
            return pre.new_zeros(())
        masked = pre.masked_fill(~dead, float("-inf"))  # only dead latents can be selected
        values, idx = topk_relu(masked, min(self.aux_k, n_dead))
        e_hat = topk_decode(values, idx, self.W_dec)  # no bias: the residual has the bias already
        return nmse(e_hat, residual.detach())


class BatchTopKSAE(SparseAutoencoder):
    """BatchTopK SAE (Bussmann et al., 2024): the top ``B·k`` activations of the whole batch while training.

    Inference cannot depend on the batch, so a global threshold θ is learned during training (exponential
    moving average of the smallest positive kept activation); in eval mode ``z = ReLU(pre)·1[pre > θ]``.
    Before any training step there is no threshold: batch top-k is used, and with a batch of size 1 (where
    batch top-k is per-sample top-k anyway) a warning says so.

    Args:
        d_in, d_sae: sizes.
        k: average active latents per sample.
        threshold_momentum: EMA momentum of θ.
        loss_kind, init_norm, seed: as in :class:`SparseAutoencoder`.
    """

    def __init__(
        self,
        d_in: int,
        d_sae: int,
        k: int = 32,
        *,
        threshold_momentum: float = 0.99,
        loss_kind: str = "nmse",
        init_norm: float = 0.1,
        seed: int | None = None,
    ) -> None:
        super().__init__(d_in, d_sae, loss_kind=loss_kind, init_norm=init_norm, seed=seed)
        self.k = check_int(k, "k", low=1, high=d_sae)
        if not (0.0 <= threshold_momentum < 1.0):
            raise ValueError(f"threshold_momentum must be in [0, 1), got {threshold_momentum!r}")
        self.threshold_momentum = float(threshold_momentum)
        self.register_buffer("threshold", torch.tensor(-1.0))  # < 0: not learned yet

    def config(self) -> dict[str, Any]:
        return {**super().config(), "k": self.k, "threshold_momentum": self.threshold_momentum}

    def batch_topk(self, pre: torch.Tensor) -> torch.Tensor:
        """Dense latents [B, n] keeping the ``B·k`` largest ReLU pre-activations of the batch [B, n]."""
        B = pre.shape[0]
        flat = pre.relu().reshape(-1)
        values, idx = torch.topk(flat, min(B * self.k, flat.numel()), sorted=False)
        return torch.zeros_like(flat).scatter(0, idx, values).reshape_as(pre)

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.batch_topk(pre)
        if float(self.threshold) >= 0:
            return pre.relu() * (pre > self.threshold)
        if pre.shape[0] == 1:
            warnings.warn(
                "BatchTopKSAE has no learned threshold yet and got a batch of size 1: using per-sample top-k",
                stacklevel=3,
            )
        return self.batch_topk(pre)

    def loss(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        x2 = self._batch(x)
        z = self.batch_topk(self.pre_activations(x2))
        x_hat = z @ self.W_dec + self.b_dec
        recon = reconstruction_loss(x_hat, x2, self.loss_kind)
        with torch.no_grad():
            self._update_fired((z > 0).any(dim=0), x2.shape[0])
            pos = z[z > 0]
            if pos.numel() > 0:
                t_min = pos.min()
                m = self.threshold_momentum
                new = t_min if float(self.threshold) < 0 else m * self.threshold + (1 - m) * t_min
                self.threshold.copy_(new)
        return recon, {"recon": float(recon.detach()), "threshold": float(self.threshold)}


class ReLUSAE(SparseAutoencoder):
    """ReLU SAE: ``z = ReLU(pre)``, loss ``recon + l1_coef · mean_b Σ|z_b| / ‖x_b‖`` (MSAE's baseline).

    Args:
        d_in, d_sae: sizes.
        l1_coef: weight of the input-normalised L1 penalty (MSAE: 0.003).
        loss_kind, init_norm, seed: as in :class:`SparseAutoencoder`.
    """

    default_lr = 5e-5

    def __init__(
        self,
        d_in: int,
        d_sae: int,
        l1_coef: float = 0.003,
        *,
        loss_kind: str = "nmse",
        init_norm: float = 0.1,
        seed: int | None = None,
    ) -> None:
        super().__init__(d_in, d_sae, loss_kind=loss_kind, init_norm=init_norm, seed=seed)
        if not (isinstance(l1_coef, (int, float)) and l1_coef >= 0):
            raise ValueError(f"l1_coef must be a non-negative float, got {l1_coef!r}")
        self.l1_coef = float(l1_coef)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "l1_coef": self.l1_coef}

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return pre.relu()

    def loss(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        x2 = self._batch(x)
        z = self.pre_activations(x2).relu()
        x_hat = z @ self.W_dec + self.b_dec
        recon = reconstruction_loss(x_hat, x2, self.loss_kind)
        l1 = normalized_l1(z, x2)
        self._update_fired((z > 0).any(dim=0), x2.shape[0])
        return recon + self.l1_coef * l1, {"recon": float(recon.detach()), "l1": float(l1.detach())}
