"""Hadamard-rotation + grid vector quantization (the HIGGS quantizer's hot path, used by AQUA-KV, P36).

A float tensor ``x`` of shape ``(..., c)`` is split into groups of ``group`` (a power of two) consecutive
values; each group is scaled by its norm (stored in float16), rotated by the unnormalised Walsh-Hadamard
matrix so its coordinates are roughly N(0, 1), and cut into ``d``-dim sub-vectors, each replaced by the
index of its nearest point in a grid ``(n, d)``. The exact arithmetic is specified in
:mod:`icml25.kernels.hadamard_grid.reference`.

Ops dispatch through :func:`icml25.kernels.select_backend`: fused Triton kernels (rotation as a
``tl.dot``, grid search in registers) for CUDA tensors when ``16 <= group <= 128``, the PyTorch reference
otherwise (a 256-group rotation tile needs 278 KB of shared memory, over the H200's 227 KB). Not differentiable.

Example::

    >>> import torch
    >>> from icml25.kernels.hadamard_grid import grid_decode, grid_encode
    >>> grid = torch.tensor([[-1.0, -1.0], [-1.0, 1.0], [1.0, -1.0], [1.0, 1.0]])
    >>> idx, scale = grid_encode(torch.randn(3, 64), grid, group=32)
    >>> tuple(idx.shape), tuple(scale.shape), grid_decode(idx, scale, grid, group=32).shape
    ((3, 2, 16), (3, 2), torch.Size([3, 64]))
"""

from __future__ import annotations

import numbers

import torch

from icml25.kernels._dispatch import select_backend
from icml25.kernels.hadamard_grid import reference as _reference
from icml25.kernels.hadamard_grid.reference import hadamard_matrix

__all__ = ["TRITON_GROUPS", "fwht", "grid_decode", "grid_encode", "hadamard_matrix"]

TRITON_GROUPS = (16, 32, 64, 128)  # the dense (G, G) float32 rotation tile must fit in shared memory
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_group(group: object) -> int:
    if isinstance(group, bool) or not isinstance(group, numbers.Integral):
        raise TypeError(f"group must be an int (a power of two), got {type(group).__name__} {group!r}")
    group = int(group)
    if group < 1 or group & (group - 1):
        raise ValueError(f"group must be a power of two >= 1, got {group}")
    return group


def _check_grid(grid: object, group: int) -> torch.Tensor:
    if not isinstance(grid, torch.Tensor) or not grid.is_floating_point():
        raise TypeError(f"grid must be a float torch.Tensor (n, d), got {type(grid).__name__}")
    if grid.dim() != 2 or grid.shape[0] < 1 or grid.shape[1] < 1:
        raise ValueError(f"grid must have shape (n, d) with n, d >= 1, got {tuple(grid.shape)}")
    # Value check off CUDA only: on the GPU it would cost a host sync per call (as sparse_attention does).
    if grid.device.type != "cuda" and not bool(torch.isfinite(grid).all()):
        raise ValueError(f"grid must be finite, got NaN/Inf entries in a grid of shape {tuple(grid.shape)}")
    if group % grid.shape[1]:
        raise ValueError(f"grid dim d={grid.shape[1]} must divide group={group}")
    return grid


def _backend(group: int, *tensors: torch.Tensor, backend: str | None) -> str:
    choice = select_backend(*tensors, backend=backend)
    if choice == "triton" and group not in TRITON_GROUPS:
        forced = backend is not None and backend.strip().lower() == "triton"
        if forced:
            raise ValueError(f"backend='triton' needs group in {TRITON_GROUPS}, got group={group}")
        return "reference"
    return choice


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised fast Walsh-Hadamard transform along the last dim (a power of two); ``fwht(fwht(x)) = n x``.

    A linear map: NaN/Inf entries propagate to the outputs of their row (values are not inspected).
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a float torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0 or x.shape[-1] < 1 or x.shape[-1] & (x.shape[-1] - 1):
        raise ValueError(f"x's last dim must be a power of two, got shape {tuple(x.shape)}")
    return _reference.fwht(x)


def grid_encode(
    x: torch.Tensor, grid: torch.Tensor, group: int, *, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode ``x`` ``(..., c)`` with a ``(n, d)`` grid after a Hadamard rotation per group.

    Args:
        x: float tensor ``(..., c)``, finite, ``c % group == 0``; off CUDA a NaN/Inf ``x`` or a group norm
            beyond float16 raises ``ValueError`` (on CUDA it is not checked: that would sync the host).
        grid: float ``(n, d)`` grid points (optimised for N(0, I_d)); ``d`` divides ``group``.
        group: power-of-two group size (one float16 scale per group).
        backend: ``"auto"``, ``"reference"`` or ``"triton"``; ``None`` reads ``ICML25_KERNELS_BACKEND``.

    Returns:
        ``(idx, scale)``: int32 ``(..., c // group, group // d)`` in ``[0, n)`` and float16 ``(..., c // group)``.
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in _DTYPES:
        raise TypeError(
            f"x must be a float32/float16/bfloat16 torch.Tensor, got {getattr(x, 'dtype', type(x))}"
        )
    group = _check_group(group)
    grid = _check_grid(grid, group)
    if x.dim() == 0 or x.shape[-1] % group:
        raise ValueError(f"x's last dim must be divisible by group={group}, got shape {tuple(x.shape)}")
    if _backend(group, x, backend=backend) == "triton":
        from icml25.kernels.hadamard_grid import triton as _triton

        idx, scale = _triton.encode(x.detach(), grid, group)
    else:
        idx, scale = _reference.encode(x.detach(), grid, group)
    # Off CUDA, reject what would silently give a NaN/Inf float16 scale (on CUDA: a host sync; skipped).
    if x.device.type != "cuda" and scale.numel() and not bool(torch.isfinite(scale).all()):
        n_bad = int((~torch.isfinite(x)).sum())
        raise ValueError(
            f"x must be finite with group norms representable in float16 (<= 65504); got {n_bad} NaN/Inf "
            f"values and max |x| = {float(x.detach().abs().nan_to_num(0, 0, 0).amax()):.4g} in a tensor of "
            f"shape {tuple(x.shape)}"
        )
    return idx, scale


def grid_decode(
    idx: torch.Tensor,
    scale: torch.Tensor,
    grid: torch.Tensor,
    group: int,
    dtype: torch.dtype = torch.float32,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Decode :func:`grid_encode`'s output back to a ``dtype`` tensor ``(..., c)``.

    Args:
        idx: integer ``(..., n_groups, group // d)`` grid indices in ``[0, n)``.
        scale: ``(..., n_groups)`` group norms.
        grid, group: as in :func:`grid_encode`.
        dtype: output dtype.
    """
    group = _check_group(group)
    grid = _check_grid(grid, group)
    if not isinstance(idx, torch.Tensor) or idx.is_floating_point() or idx.dtype == torch.bool:
        raise TypeError(f"idx must be an integer torch.Tensor, got {getattr(idx, 'dtype', type(idx))}")
    if not isinstance(scale, torch.Tensor) or not scale.is_floating_point():
        raise TypeError(f"scale must be a float torch.Tensor, got {getattr(scale, 'dtype', type(scale))}")
    d = grid.shape[1]
    if idx.dim() < 2 or idx.shape[-1] != group // d or tuple(scale.shape) != tuple(idx.shape[:-1]):
        raise ValueError(
            f"idx must have shape (..., n_groups, group // d = {group // d}) and scale (..., n_groups), "
            f"got {tuple(idx.shape)} and {tuple(scale.shape)}"
        )
    if dtype not in _DTYPES:
        raise TypeError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype!r}")
    if scale.numel() and not bool(torch.isfinite(scale).all()):  # idx's range check below syncs anyway
        raise ValueError(
            f"scale must be finite, got NaN/Inf entries in a tensor of shape {tuple(scale.shape)}"
        )
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= grid.shape[0]):
        raise ValueError(f"idx must lie in [0, {grid.shape[0]}), got [{int(idx.min())}, {int(idx.max())}]")
    if _backend(group, idx, scale, backend=backend) == "triton":
        from icml25.kernels.hadamard_grid import triton as _triton

        return _triton.decode(idx, scale, grid, group, dtype)
    return _reference.decode(idx, scale, grid, group, dtype)
