"""NPISeg3D: Probabilistic Interactive 3D Segmentation with Hierarchical Neural Processes — ICML 2025, P17: procedural toy scenes.

Liu et al., ICML 2025 (arXiv 2505.01726; official code ``jliu4ai/NPISeg3D``). The small-scale reproduction
replaces ScanNet/S3DIS/KITTI-360 with :func:`make_scene`: a ground plane and a few touching primitives, the
training kinds (:data:`TRAIN_KINDS`) in domain and unseen kinds (:data:`OOD_KINDS`) out of domain.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["OOD_KINDS", "TRAIN_KINDS", "make_scene"]

TRAIN_KINDS = ("sphere", "box", "cylinder")
OOD_KINDS = ("torus", "cone")
_KINDS = ("sphere", "box", "cylinder", "torus", "cone")


def _surface(kind: str, n: int, size: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` points on a primitive of footprint radius ≈ ``size`` resting on z = 0, centred at the origin."""
    if kind == "sphere":
        v = rng.normal(size=(n, 3))
        return v / np.linalg.norm(v, axis=1, keepdims=True) * size + [0, 0, size]
    if kind == "box":
        ext = size * rng.uniform(0.55, 0.7, 3) * [1, 1, 1.3]
        areas = np.array([ext[1] * ext[2], ext[0] * ext[2], ext[0] * ext[1]])
        face = rng.choice(6, size=n, p=np.repeat(areas, 2) / (2 * areas.sum()))
        p = rng.uniform(-1, 1, size=(n, 3))
        ax, sign = face // 2, np.where(face % 2 == 0, 1.0, -1.0)
        p[np.arange(n), ax] = sign
        p = p * ext + [0, 0, ext[2]]
    elif kind == "cylinder":
        r, h = size * 0.85, size * rng.uniform(1.2, 2.0)
        side = 2 * np.pi * r * h
        cap = np.pi * r * r
        part = rng.choice(3, size=n, p=np.array([side, cap, cap]) / (side + 2 * cap))
        th = rng.uniform(0, 2 * np.pi, n)
        rad = np.where(part == 0, r, r * np.sqrt(rng.uniform(0, 1, n)))
        z = np.where(part == 0, rng.uniform(0, h, n), np.where(part == 1, h, 0.0))
        p = np.stack([rad * np.cos(th), rad * np.sin(th), z], 1)
    elif kind == "torus":
        R, r = size * 0.7, size * 0.3
        u, v = rng.uniform(0, 2 * np.pi, n), rng.uniform(0, 2 * np.pi, n)
        keep = rng.uniform(0, 1, n) < (R + r * np.cos(v)) / (R + r)  # area-uniform by rejection
        u, v = u[keep], v[keep]
        while u.size < n:
            u2, v2 = rng.uniform(0, 2 * np.pi, n), rng.uniform(0, 2 * np.pi, n)
            k2 = rng.uniform(0, 1, n) < (R + r * np.cos(v2)) / (R + r)
            u, v = np.concatenate([u, u2[k2]]), np.concatenate([v, v2[k2]])
        u, v = u[:n], v[:n]
        p = np.stack([(R + r * np.cos(v)) * np.cos(u), (R + r * np.cos(v)) * np.sin(u), r * np.sin(v) + r], 1)
    elif kind == "cone":
        r, h = size * 0.9, size * rng.uniform(1.4, 2.2)
        slant = np.pi * r * math.hypot(r, h)
        cap = np.pi * r * r
        on_side = rng.uniform(0, 1, n) < slant / (slant + cap)
        th = rng.uniform(0, 2 * np.pi, n)
        t = np.sqrt(rng.uniform(0, 1, n))
        rad = np.where(on_side, r * t, r * np.sqrt(rng.uniform(0, 1, n)))
        z = np.where(on_side, h * (1 - t), 0.0)
        p = np.stack([rad * np.cos(th), rad * np.sin(th), z], 1)
    else:
        raise ValueError(f"kinds must be among {_KINDS}, got {kind!r}")
    if kind in ("box",):
        a = rng.uniform(0, 2 * np.pi)
        rot = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
        p = p @ rot.T
    return p


def make_scene(
    n_points: int = 2048,
    n_objects: tuple[int, int] = (3, 6),
    kinds: tuple[str, ...] = TRAIN_KINDS,
    noise: float = 0.01,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """A procedural scene: a ground plane (label 0) and ``n_objects`` (inclusive range) primitives of the
    given ``kinds`` with random sizes and poses, touching or nearly touching (gaps in [0, 0.05]).

    Returns ``points [n_points, 3]`` (float32, Gaussian noise σ = ``noise``) and ``labels [n_points]``
    (int64, 0 = ground, objects 1..O). Points are split area-proportionally, ~30% on the ground."""
    if isinstance(n_points, bool) or not isinstance(n_points, (int, np.integer)) or n_points < 64:
        raise ValueError(f"n_points must be an int >= 64, got {n_points!r}")
    lo, hi = n_objects
    if not (1 <= int(lo) <= int(hi) <= 12):
        raise ValueError(f"n_objects must be (lo, hi) with 1 <= lo <= hi <= 12, got {n_objects!r}")
    if not kinds or any(k not in _KINDS for k in kinds):
        raise ValueError(f"kinds must be a non-empty tuple from {_KINDS}, got {kinds!r}")
    if not (isinstance(noise, (int, float)) and 0.0 <= float(noise) <= 0.2):
        raise ValueError(f"noise must be in [0, 0.2], got {noise!r}")
    rng = np.random.default_rng(seed)
    n_obj = int(rng.integers(int(lo), int(hi) + 1))
    sizes = rng.uniform(0.15, 0.3, n_obj)
    centres = np.zeros((n_obj, 2))
    for i in range(1, n_obj):
        for _ in range(200):
            j = int(rng.integers(i))
            a = rng.uniform(0, 2 * np.pi)
            c = centres[j] + (sizes[i] + sizes[j] + rng.uniform(0.0, 0.05)) * np.array([np.cos(a), np.sin(a)])
            d = np.linalg.norm(centres[:i] - c, axis=1) - sizes[:i] - sizes[i]
            if d.min() >= -1e-9:
                break
        centres[i] = c
    n_ground = int(0.3 * n_points)
    weights = sizes**2
    counts = np.floor(weights / weights.sum() * (n_points - n_ground)).astype(int)
    counts[: (n_points - n_ground - counts.sum())] += 1
    pts, labels = [], []
    for i in range(n_obj):
        kind = kinds[int(rng.integers(len(kinds)))]
        p = _surface(kind, int(counts[i]), float(sizes[i]), rng)
        pts.append(p + np.array([centres[i, 0], centres[i, 1], 0.0]))
        labels.append(np.full(int(counts[i]), i + 1))
    lo_xy = (centres - sizes[:, None]).min(0) - 0.25
    hi_xy = (centres + sizes[:, None]).max(0) + 0.25
    g = np.concatenate([rng.uniform(lo_xy, hi_xy, size=(n_ground, 2)), np.zeros((n_ground, 1))], 1)
    pts.insert(0, g)
    labels.insert(0, np.zeros(n_ground, dtype=int))
    points = np.concatenate(pts) + rng.normal(scale=float(noise), size=(n_points, 3))
    points[:, :2] -= points[:, :2].mean(0)
    perm = rng.permutation(n_points)
    return points[perm].astype(np.float32), np.concatenate(labels)[perm].astype(np.int64)
