"""AQUA-KV: Cache Me If You Must: Adaptive Key-Value Quantization for Large Language Models — ICML 2025, P36: the inter-layer linear predictors and the compression chain they drive.

Per token (``c = H_kv * head_dim``, keys pre-RoPE, heads concatenated), for layer ``l >= 1``::

    K~_l = f^K_l(K^_{l-1})                 K^_l = K~_l + deQ(Q(K_l - K~_l))
    V~_l = f^V_l([K^_l ; V^_{l-1}])        V^_l = V~_l + deQ(Q(V_l - V~_l))

and layer 0 is stored with its own (higher-precision) quantizer. The predictors always see
*reconstructions*, so encoder and decoder compute the same predictions. ``f`` are affine maps fitted in
closed form by ridge regression (:func:`fit_ridge`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from icml25.kernels.checks import check_choice

__all__ = ["AquaCodec", "AquaPredictors", "fit_ridge"]

RIDGE_FORMS = ("official", "centred")
"""The forms of :func:`fit_ridge` (``ridge_form``): the official one (default) and the centred one."""


def fit_ridge(
    x: torch.Tensor,
    y: torch.Tensor,
    ridge: float = 1e-3,
    *,
    ridge_form: Literal["official", "centred"] = "official",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form ridge regression with intercept: ``y ~ x @ W + b``, in float64.

    ``ridge_form="official"`` (default) is the official ``fit_linear_regression(fit_intercept=True)``
    (``aquakv/linear_utils.py:37-57``): a column of ones is appended to the raw (uncentred) inputs,
    ``X1 = [x, 1]``, and ``[W; b] = (X1'X1 + ridge * mean(diag(X1'X1)) * I)^-1 X1'Y``; the damping is added
    to every diagonal entry, the intercept's included, so ``b`` is shrunk too. The official code solves
    this in float32 with a pseudo-inverse; for ``ridge > 0`` the matrix is positive definite and the
    float64 solve gives the same solution up to rounding.

    ``ridge_form="centred"`` (ours before the alignment) centres ``x`` and ``y`` and solves
    ``(Xc'Xc + ridge * mean(diag(Xc'Xc)) * I) W = Xc'Yc`` with ``b = mean(y) - mean(x) @ W``: the intercept is
    not penalised and the damping scales with the inputs' variance rather than their second moment.
    ``ridge=0`` is ordinary least squares in both forms (the same solution).

    Args:
        x: ``(N, p)`` inputs.
        y: ``(N, q)`` targets.
        ridge: relative damping (official ``percdamp`` 1e-3).
        ridge_form: ``"official"`` or ``"centred"`` (see above).

    Returns:
        ``(W (p, q), b (q,))`` in float32.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError(f"x and y must be torch.Tensors, got {type(x).__name__} and {type(y).__name__}")
    if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0] or x.shape[0] < 1:
        raise ValueError(
            f"x and y must be (N, p) and (N, q) with the same N >= 1, got {tuple(x.shape)}, {tuple(y.shape)}"
        )
    if not isinstance(ridge, (int, float)) or isinstance(ridge, bool) or not ridge >= 0:
        raise ValueError(f"ridge must be a float >= 0, got {ridge!r}")
    check_choice(ridge_form, "ridge_form", RIDGE_FORMS)
    x64, y64 = x.double(), y.double()
    if ridge_form == "official":
        x1 = torch.cat([x64, torch.ones(x64.shape[0], 1, dtype=x64.dtype, device=x64.device)], dim=1)
        gram = x1.T @ x1
        damp = ridge * gram.diagonal().abs().mean()
        eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
        wb = torch.linalg.solve(gram + damp * eye, x1.T @ y64)
        return wb[:-1].float(), wb[-1].float()
    mx, my = x64.mean(0), y64.mean(0)
    xc, yc = x64 - mx, y64 - my
    gram = xc.T @ xc
    damp = ridge * gram.diagonal().mean().clamp_min(1e-12)
    w = torch.linalg.solve(
        gram + damp * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device), xc.T @ yc
    )
    b = my - mx @ w
    return w.float(), b.float()


def _empty_linear(fan_in: int, fan_out: int) -> nn.Linear:
    """An ``nn.Linear`` whose parameters are about to be overwritten: built without the random
    initialisation (``skip_init``), so it never draws from the caller's global torch generator."""
    return torch.nn.utils.skip_init(nn.Linear, fan_in, fan_out)


def _linear(w: torch.Tensor, b: torch.Tensor) -> nn.Linear:
    lin = _empty_linear(w.shape[0], w.shape[1])
    with torch.no_grad():
        lin.weight.copy_(w.T)
        lin.bias.copy_(b)
    return lin.requires_grad_(False)


@dataclass
class AquaPredictors:
    """Key predictors ``f^K_l: R^c -> R^c`` and value predictors ``f^V_l: R^{2c} -> R^c`` for layers ``1..L-1``.

    Attributes:
        key, value: layer index -> ``nn.Linear``.
        num_layers: the model's number of layers ``L``.
        kv_dim: ``c = num_key_value_heads * head_dim``.
    """

    key: dict[int, nn.Linear]
    value: dict[int, nn.Linear]
    num_layers: int
    kv_dim: int
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        want = set(range(1, self.num_layers))
        for name, preds, fan_in in (("key", self.key, self.kv_dim), ("value", self.value, 2 * self.kv_dim)):
            if set(preds) != want:
                raise ValueError(
                    f"{name} predictors must cover layers 1..{self.num_layers - 1}, got {sorted(preds)}"
                )
            for layer, lin in preds.items():
                if not isinstance(lin, nn.Linear) or (lin.in_features, lin.out_features) != (
                    fan_in,
                    self.kv_dim,
                ):
                    raise ValueError(
                        f"{name}[{layer}] must be nn.Linear({fan_in}, {self.kv_dim}), got {lin!r}"
                    )

    @classmethod
    def zeros(cls, num_layers: int, kv_dim: int) -> AquaPredictors:
        """Predictors that always predict 0: AQUA-KV reduces to plain quantization of every layer."""
        z = torch.zeros
        return cls(
            {i: _linear(z(kv_dim, kv_dim), z(kv_dim)) for i in range(1, num_layers)},
            {i: _linear(z(2 * kv_dim, kv_dim), z(kv_dim)) for i in range(1, num_layers)},
            num_layers,
            kv_dim,
        )

    @classmethod
    def from_weights(
        cls, key: dict[int, tuple[torch.Tensor, torch.Tensor]], value: dict[int, tuple[torch.Tensor, torch.Tensor]],
        num_layers: int, kv_dim: int,
    ) -> AquaPredictors:  # fmt: skip
        """Build from ``{layer: (W (in, out), b (out,))}`` as returned by :func:`fit_ridge`."""
        return cls(
            {i: _linear(*wb) for i, wb in key.items()},
            {i: _linear(*wb) for i, wb in value.items()},
            num_layers,
            kv_dim,
        )

    def check_config(self, num_layers: int, kv_dim: int) -> None:
        """Raise ``ValueError`` naming the mismatch if these predictors were fitted for another model."""
        if num_layers != self.num_layers:
            raise ValueError(
                f"predictors were fitted for {self.num_layers} layers, the model has {num_layers}"
            )
        if kv_dim != self.kv_dim:
            raise ValueError(
                f"predictors were fitted for kv_dim c={self.kv_dim} (num_key_value_heads * head_dim), "
                f"the model has c={kv_dim}"
            )

    def to(self, device: torch.device | str) -> AquaPredictors:
        """Move every predictor to ``device`` (in place) and return self."""
        for lin in [*self.key.values(), *self.value.values()]:
            lin.to(device)
        return self

    def num_parameters(self) -> int:
        """Extra parameters: ~3 c^2 per layer."""
        return sum(p.numel() for lin in [*self.key.values(), *self.value.values()] for p in lin.parameters())

    def save(self, path: str | os.PathLike) -> None:
        """Save weights and shapes with ``torch.save`` (load with :meth:`load`)."""
        torch.save(
            {
                "num_layers": self.num_layers,
                "kv_dim": self.kv_dim,
                "key": {i: lin.state_dict() for i, lin in self.key.items()},
                "value": {i: lin.state_dict() for i, lin in self.value.items()},
                "meta": {k: v for k, v in self.meta.items() if isinstance(v, (int, float, str, bool))},
            },
            path,
        )

    @classmethod
    def load(cls, path: str | os.PathLike, map_location: str | torch.device = "cpu") -> AquaPredictors:
        """Load predictors saved by :meth:`save` (``weights_only``: no code is unpickled)."""
        blob = torch.load(path, map_location=map_location, weights_only=True)
        c = int(blob["kv_dim"])

        def build(states: dict, fan_in: int) -> dict[int, nn.Linear]:
            out = {}
            for i, state in states.items():
                lin = _empty_linear(fan_in, c)
                lin.load_state_dict(state)
                out[int(i)] = lin.requires_grad_(False)
            return out

        return cls(
            build(blob["key"], c),
            build(blob["value"], 2 * c),
            int(blob["num_layers"]),
            c,
            blob.get("meta", {}),
        )


Quantizer = Any  # has quantize(x (N, c)) -> stored, dequantize(stored) -> (N, c)


class AquaCodec:
    """The AQUA-KV chain for one chunk of tokens, one layer at a time (used by the cache and calibration).

    Args:
        predictors: fitted :class:`AquaPredictors` (``AquaPredictors.zeros`` gives plain quantization).
        quantizer: quantizer of the residuals of layers ``>= 1``.
        first_layer_quantizer: quantizer of layer 0 (no predictor there, so give it more bits;
            ``PassthroughQuantizer()`` keeps it in 16 bits).

    Raises:
        ValueError: a quantizer's ``group`` exceeds the KV width ``predictors.kv_dim`` (its
            ``check_width``; a HIGGS group that only fails to divide it warns).
    """

    def __init__(
        self, predictors: AquaPredictors, quantizer: Quantizer, first_layer_quantizer: Quantizer
    ) -> None:
        if not isinstance(predictors, AquaPredictors):
            raise TypeError(f"predictors must be AquaPredictors, got {type(predictors).__name__}")
        for name, q in (("quantizer", quantizer), ("first_layer_quantizer", first_layer_quantizer)):
            if q is None:
                raise ValueError(
                    f"{name} is required (no layer-0 policy given): pass a quantizer, e.g. "
                    "HiggsQuantizer(d=2, n=256) as in the paper, or PassthroughQuantizer() to keep layer 0 in 16 bits"
                )
            if not (callable(getattr(q, "quantize", None)) and callable(getattr(q, "dequantize", None))):
                raise TypeError(f"{name} must have quantize/dequantize methods, got {type(q).__name__}")
            if callable(getattr(q, "check_width", None)):  # group vs c = num_key_value_heads * head_dim
                q.check_width(predictors.kv_dim, name)
        self.predictors, self.quantizer, self.first_layer_quantizer = (
            predictors,
            quantizer,
            first_layer_quantizer,
        )

    def _predict(self, lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        w = lin.weight
        return torch.nn.functional.linear(x.to(w.dtype), w.to(x.device), lin.bias.to(x.device))

    @torch.no_grad()
    def encode_layer(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, prev: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[tuple[object, object], tuple[torch.Tensor, torch.Tensor]]:
        """Compress layer ``layer``'s pre-RoPE keys/values ``(N, c)`` given the previous layer's reconstruction.

        Returns:
            ``((code_k, code_v), (k_hat, v_hat))``: the stored objects and the float32 reconstructions.
        """
        return self._run(layer, k.float(), v.float(), prev, None)

    @torch.no_grad()
    def decode_layer(
        self, layer: int, codes: tuple[object, object], prev: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Reconstruct layer ``layer`` from its codes and the previous layer's reconstruction (float32)."""
        return self._run(layer, None, None, prev, codes)[1]

    def _run(
        self,
        layer: int,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        prev: tuple[torch.Tensor, torch.Tensor] | None,
        codes: tuple[object, object] | None,
    ) -> tuple[tuple[object, object], tuple[torch.Tensor, torch.Tensor]]:
        write = codes is None

        def residual(q: Quantizer, target: torch.Tensor | None, pred: torch.Tensor, code: object) -> tuple:
            if write:
                code = q.quantize(target - pred)
            return code, pred + q.dequantize(code).float()

        if layer == 0:
            zero_k = torch.zeros_like(k) if write else 0.0
            zero_v = torch.zeros_like(v) if write else 0.0
            ck, k_hat = residual(self.first_layer_quantizer, k, zero_k, None if write else codes[0])
            cv, v_hat = residual(self.first_layer_quantizer, v, zero_v, None if write else codes[1])
            return (ck, cv), (k_hat, v_hat)
        if prev is None:
            raise ValueError(f"layer {layer} needs the reconstruction of layer {layer - 1}")
        k_prev, v_prev = prev
        k_pred = self._predict(self.predictors.key[layer], k_prev)
        ck, k_hat = residual(self.quantizer, k, k_pred, None if write else codes[0])
        v_pred = self._predict(self.predictors.value[layer], torch.cat([k_hat, v_prev], dim=-1))
        cv, v_hat = residual(self.quantizer, v, v_pred, None if write else codes[1])
        return (ck, cv), (k_hat, v_hat)


def relative_mse(x_hat: torch.Tensor, x: torch.Tensor) -> float:
    """``||x_hat - x||^2 / ||x||^2``."""
    return float(((x_hat.float() - x.float()) ** 2).sum() / (x.float() ** 2).sum().clamp_min(1e-30))


def equivalent_bits(rel_mse: float) -> float:
    """``-log4(relMSE)``: the bits per value a Gaussian-optimal quantizer needs for this error."""
    return -math.log(max(rel_mse, 1e-30), 4)
