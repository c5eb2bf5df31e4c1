"""Activation preprocessing for SAEs: the affine normalisations of MSAE and SAELens.

MSAE (``SAEDataset``) centres the activations on the training mean μ and multiplies them by
``√d / mean_i ‖x_i − μ‖²`` — the mean *squared* norm, a quirk of the official code kept here for parity.
SAELens' ``normalize_activations="expected_average_only_in"`` instead scales (without centring) so that the
mean norm is ``√d``. Both are affine maps ``x ↦ (x − μ)·s`` and can be folded into an SAE's weights
(:func:`icml25.interpretability.sae.to_saelens`).
"""

from __future__ import annotations

import math

import torch

from icml25.kernels.checks import check_fitted, check_tensor

METHODS = ("msae", "saelens", "none")


class ActivationNormalizer:
    """Affine input normalisation ``x_n = (x − mean_) · scale_`` fitted on training activations.

    Args:
        method: ``"msae"`` (centre, scale by ``√d / E‖x − μ‖²``), ``"saelens"`` (no centring, scale by
            ``√d / E‖x‖``, SAELens' ``expected_average_only_in``) or ``"none"``.
    """

    def __init__(self, method: str = "msae") -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self.method = method

    def fit(self, X: torch.Tensor) -> ActivationNormalizer:
        """Estimate ``mean_`` [d] and ``scale_`` (float) from X [N, d]."""
        X = check_tensor(X, "X", ndim=2, non_empty=True)
        d = X.shape[1]
        Xd = X.double()

        def _ratio(spread: float) -> float:  # zero spread: reported below, not a ZeroDivisionError
            return math.sqrt(d) / spread if spread > 0 else math.inf

        if self.method == "msae":
            mean = Xd.mean(dim=0)
            scale = _ratio(float((Xd - mean).pow(2).sum(dim=1).mean()))
        elif self.method == "saelens":
            mean = torch.zeros(d, dtype=torch.float64)
            scale = _ratio(float(Xd.norm(dim=1).mean()))
        else:
            mean, scale = torch.zeros(d, dtype=torch.float64), 1.0
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"X has (near-)zero spread, cannot normalise (scale={scale})")
        self.mean_ = mean.to(X.dtype)
        self.scale_ = scale
        return self

    def _check_fitted(self) -> None:
        check_fitted(self, ("mean_", "scale_"))  # scikit-learn's NotFittedError, a ValueError

    def transform(self, X: torch.Tensor) -> torch.Tensor:
        """``(X − mean_) · scale_`` for X [..., d]."""
        self._check_fitted()
        if X.shape[-1] != self.mean_.numel():
            raise ValueError(f"X must have shape [..., d={self.mean_.numel()}], got {tuple(X.shape)}")
        return (X - self.mean_.to(X)) * self.scale_

    def inverse_transform(self, X: torch.Tensor) -> torch.Tensor:
        """``X / scale_ + mean_`` (maps reconstructions back to the activation space)."""
        self._check_fitted()
        return X / self.scale_ + self.mean_.to(X)

    def fit_transform(self, X: torch.Tensor) -> torch.Tensor:
        return self.fit(X).transform(X)

    def _export_state(self) -> tuple[dict[str, object], torch.Tensor]:
        """``({"method", "scale"}, mean_)``: the fitted state as JSON and a tensor (``SparseAutoencoder.save``)."""
        self._check_fitted()
        return {"method": self.method, "scale": self.scale_}, self.mean_

    @classmethod
    def _from_state(cls, state: dict[str, object], mean: torch.Tensor) -> ActivationNormalizer:
        """The fitted normaliser :meth:`_export_state` described (the same ``mean_`` and ``scale_``, bit for bit)."""
        scale = state.get("scale")
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not (math.isfinite(scale) and scale > 0)
        ):
            raise ValueError(f"normalizer scale must be a positive finite float, got {scale!r}")
        if not isinstance(mean, torch.Tensor) or mean.ndim != 1 or not mean.is_floating_point():
            got = tuple(mean.shape) if isinstance(mean, torch.Tensor) else type(mean).__name__
            raise ValueError(f"normalizer mean must be a floating-point tensor [d], got {got}")
        norm = cls(str(state.get("method")))
        norm.mean_, norm.scale_ = mean, float(scale)
        return norm
