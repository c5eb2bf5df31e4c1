"""Flex3D: feed-forward 3D generation with flexible reconstruction model and input view curation — ICML 2025, P16: view curation and a flexible-view tri-plane reconstructor.

Han, Wang, Vedaldi, Torr, Kokkinos, "Flex3D: Feed-Forward 3D Generation with Flexible Reconstruction Model
and Input View Curation", ICML 2025 (arXiv 2410.00890; no official code is public). Flex3D over-generates
candidate views, keeps the good and mutually consistent ones, and reconstructs with FlexRM, a transformer
whose learnable tri-plane tokens attend to the tokens of *any number* of posed views; FlexRM is trained
with simulated imperfect input views so that it tolerates the residual flaws of generated views.

This module is the CPU-scale reconstruction side:

- cameras: camera-to-world matrices ``(..., 4, 4)`` in the OpenCV / PyTorch3D-screen-agnostic convention
  (x right, y down, z forward); :func:`opencv_to_opengl` converts to the OpenGL / nerfstudio convention
  (y up, looking along -z) and back (it is an involution); :func:`orbit_cameras`, :func:`look_at_cameras`,
  :func:`camera_rays` (pinhole, square images, field of view ``fov_deg``);
- :func:`volume_render`: emission-absorption compositing of samples on a ray (black background);
- analytic scenes: :class:`EllipsoidScenes` (1-3 coloured ellipsoids each, soft-indicator density),
  :func:`sample_ellipsoid_scenes` and :meth:`EllipsoidScenes.render`;
- :class:`FlexibleViewReconstructor`: per-view CNN (or a ``transformers`` DINOv2, the ``hf`` extra) over the
  image concatenated with its per-pixel Plücker rays -> tokens; learnable tri-plane queries cross-attend to
  the tokens of all unmasked views (``view_mask``), so the output is invariant to the order of the views
  and padded views have no effect; a tri-plane MLP decoder gives density and colour, volume-rendered;
- curation: :func:`consistency_scores` (leave-one-out re-rendering error of each view, relative to the
  median view, plus an image-quality term: the loss of high-frequency energy relative to the median
  candidate) and :func:`curate_views` (keep the best ``keep``);
- :func:`simulate_imperfect_views`: blur / shift / colour / swap corruptions for robust training.

The paper's curation is a video-quality classifier plus Efficient-LoFTR match counts, and FlexRM outputs 3D
Gaussians; our leave-one-out score and the NeRF-style volume rendering are our CPU-scale substitutes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "EllipsoidScenes",
    "FlexibleViewReconstructor",
    "camera_rays",
    "consistency_scores",
    "curate_views",
    "look_at_cameras",
    "opencv_to_opengl",
    "orbit_cameras",
    "sample_ellipsoid_scenes",
    "simulate_imperfect_views",
    "volume_render",
]

CORRUPTIONS = ("blur", "shift", "colour", "swap")
"""Kinds of :func:`simulate_imperfect_views` (``swap``: the view of another object of the batch)."""


# ------------------------------------------------------------------------------------------ validation
def _check_range(name: str, x: Tensor, bound: float = 1e6) -> None:
    if x.numel() and x.abs().max() > bound:
        raise ValueError(f"{name} must be pixel values of magnitude <= {bound:g}, got a maximum |value| "
                         f"{float(x.abs().max()):.3g}")  # fmt: skip


def _check_cameras(name: str, cams: object, batch_dims: int | None = None, atol: float = 1e-3) -> Tensor:
    """Validate camera-to-world matrices ``(..., 4, 4)``: finite, rigid rotation, last row ``[0, 0, 0, 1]``."""
    cams = check_tensor(cams, name)
    if cams.dim() < 2 or cams.shape[-2:] != (4, 4):
        raise ValueError(
            f"{name} must be camera-to-world matrices of shape (..., 4, 4), got {tuple(cams.shape)}"
        )
    if batch_dims is not None and cams.dim() != batch_dims + 2:
        raise ValueError(f"{name} must have shape {'(B, N, 4, 4)' if batch_dims == 2 else '(N, 4, 4)'}, "
                         f"got {tuple(cams.shape)}")  # fmt: skip
    if cams.numel() == 0:
        raise ValueError(f"{name} must hold at least one camera, got shape {tuple(cams.shape)}")
    c = cams.detach().double()
    if c.abs().max() > 1e6:
        raise ValueError(
            f"{name} must have translations below 1e6, got a maximum entry {float(c.abs().max()):.3g}"
        )
    R = c[..., :3, :3]
    eye = torch.eye(3, dtype=torch.float64)
    ortho = (R.transpose(-1, -2) @ R - eye).abs().amax()
    det = torch.linalg.det(R)
    bottom = (c[..., 3, :] - torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)).abs().amax()
    if ortho > atol or (det - 1).abs().max() > atol or bottom > atol:
        raise ValueError(
            f"{name} must be rigid camera-to-world matrices (orthonormal rotation with det +1, last row "
            f"[0, 0, 0, 1]); got max |R^T R - I| = {float(ortho):.3g}, det in [{float(det.min()):.3g}, "
            f"{float(det.max()):.3g}], max last-row error {float(bottom):.3g}"
        )
    return cams


def _check_fov(fov_deg: object) -> float:
    if isinstance(fov_deg, bool) or not isinstance(fov_deg, (int, float)):
        raise TypeError(f"fov_deg must be a float, got {type(fov_deg).__name__}")
    if not 0.0 < float(fov_deg) < 170.0:
        raise ValueError(f"fov_deg must be in (0, 170) degrees, got {fov_deg}")
    return float(fov_deg)


def _check_views(
    images: object, cams: object, view_mask: object | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Validate ``images (B, N, 3, S, S)``, ``cams (B, N, 4, 4)`` and ``view_mask (B, N)`` (bool)."""
    images = check_tensor(images, "images", ndim=5)
    if images.shape[2] != 3:
        raise ValueError(
            f"images must have 3 colour channels, shape (B, N, 3, S, S); got {tuple(images.shape)}"
        )
    if images.shape[-1] != images.shape[-2]:
        raise ValueError(f"images must be square (B, N, 3, S, S); got height {images.shape[-2]} and width "
                         f"{images.shape[-1]}")  # fmt: skip
    if images.shape[0] == 0 or images.shape[1] == 0 or images.shape[-1] == 0:
        raise ValueError(f"images must hold at least one object, one view and one pixel (N = 0 views is not a "
                         f"reconstruction input); got shape {tuple(images.shape)}")  # fmt: skip
    _check_range("images", images)
    cams = _check_cameras("cams", cams, batch_dims=2)
    if cams.shape[:2] != images.shape[:2]:
        raise ValueError(f"cams must have one camera per image, shape {(*images.shape[:2], 4, 4)}; got "
                         f"{tuple(cams.shape)}")  # fmt: skip
    if view_mask is None:
        view_mask = torch.ones(images.shape[:2], dtype=torch.bool, device=images.device)
    else:
        if not isinstance(view_mask, Tensor) or view_mask.dtype != torch.bool:
            raise TypeError(f"view_mask must be a bool tensor of shape (B, N), got "
                            f"{getattr(view_mask, 'dtype', type(view_mask).__name__)}")  # fmt: skip
        if view_mask.shape != images.shape[:2]:
            raise ValueError(
                f"view_mask must have shape {tuple(images.shape[:2])}, got {tuple(view_mask.shape)}"
            )
        if not view_mask.any(dim=1).all():
            raise ValueError("view_mask must keep at least one view of every object; got "
                             f"{int((~view_mask.any(dim=1)).sum())} object(s) with none")  # fmt: skip
    return images, cams, view_mask


# --------------------------------------------------------------------------------------------- cameras
def opencv_to_opengl(c2w: Tensor) -> Tensor:
    """Convert camera-to-world matrices ``(..., 4, 4)`` between the OpenCV convention (x right, y down, z
    forward; ours) and the OpenGL / nerfstudio one (x right, y up, looking along -z): flip the camera's y and
    z axes. The map is its own inverse, so the same function converts back."""
    c2w = _check_cameras("c2w", c2w)
    flip = torch.diag(torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=c2w.dtype, device=c2w.device))
    return c2w @ flip


def look_at_cameras(
    eye: Tensor, target: Tensor | None = None, up: Sequence[float] = (0.0, 0.0, 1.0)
) -> Tensor:
    """Camera-to-world matrices ``(M, 4, 4)`` (OpenCV convention) of cameras at ``eye (M, 3)`` looking at
    ``target (M, 3)`` (default: the origin), with world ``up`` appearing upwards in the image."""
    eye = check_tensor(eye, "eye", ndim=2)
    if eye.shape[1] != 3:
        raise ValueError(f"eye must have shape (M, 3), got {tuple(eye.shape)}")
    target = torch.zeros_like(eye) if target is None else check_tensor(target, "target", ndim=2)
    if target.shape != eye.shape:
        raise ValueError(f"target must have the shape of eye {tuple(eye.shape)}, got {tuple(target.shape)}")
    up_t = torch.as_tensor(up, dtype=eye.dtype, device=eye.device).expand_as(eye)
    z = target - eye
    if (z.norm(dim=-1) < 1e-6).any():
        raise ValueError("eye and target must differ: a camera at its target has no viewing direction")
    z = z / z.norm(dim=-1, keepdim=True)
    x = torch.cross(z, up_t, dim=-1)  # camera right: forward x up (y points down in the image)
    if (x.norm(dim=-1) < 1e-6).any():
        raise ValueError("up must not be parallel to the viewing direction (eye - target)")
    x = x / x.norm(dim=-1, keepdim=True)
    y = torch.cross(z, x, dim=-1)
    c2w = torch.zeros(eye.shape[0], 4, 4, dtype=eye.dtype, device=eye.device)
    c2w[:, :3, 0], c2w[:, :3, 1], c2w[:, :3, 2], c2w[:, :3, 3] = x, y, z, eye
    c2w[:, 3, 3] = 1.0
    return c2w


def orbit_cameras(azimuth_deg: Tensor, elevation_deg: Tensor, radius: float = 2.5) -> Tensor:
    """Cameras ``(M, 4, 4)`` on a sphere of ``radius`` around the origin, looking at it (z up), at
    ``azimuth_deg (M,)`` and ``elevation_deg (M,)`` (within (-89, 89) degrees)."""
    az = check_tensor(azimuth_deg, "azimuth_deg", ndim=1)
    el = check_tensor(elevation_deg, "elevation_deg", ndim=1)
    if az.shape != el.shape:
        raise ValueError(
            f"elevation_deg must have the shape of azimuth_deg {tuple(az.shape)}, got {tuple(el.shape)}"
        )
    if el.numel() and el.abs().max() >= 89.0:
        raise ValueError(f"elevation_deg must be within (-89, 89) degrees, got {float(el.abs().max()):.3g}")
    if not (isinstance(radius, (int, float)) and not isinstance(radius, bool)) or not 0 < radius < 1e6:
        raise ValueError(f"radius must be a positive float below 1e6, got {radius!r}")
    a, e = torch.deg2rad(az), torch.deg2rad(el)
    eye = radius * torch.stack([e.cos() * a.cos(), e.cos() * a.sin(), e.sin()], dim=-1)
    return look_at_cameras(eye)


def camera_rays(c2w: Tensor, size: int, fov_deg: float = 40.0) -> tuple[Tensor, Tensor]:
    """Pixel-centre rays of square pinhole images: ``(origins, directions)``, each ``(..., size, size, 3)``
    for ``c2w (..., 4, 4)``; directions have unit norm; pixel ``(i, j)`` is row ``i`` (down), column ``j``."""
    c2w = _check_cameras("c2w", c2w)
    size = check_int(size, "size", low=1)
    fov = _check_fov(fov_deg)
    f = 0.5 * size / math.tan(math.radians(fov) / 2)
    pix = (torch.arange(size, dtype=c2w.dtype, device=c2w.device) + 0.5 - size / 2) / f
    v, u = torch.meshgrid(pix, pix, indexing="ij")
    d_cam = torch.stack([u, v, torch.ones_like(u)], dim=-1)  # (S, S, 3)
    d_cam = d_cam / d_cam.norm(dim=-1, keepdim=True)
    R = c2w[..., None, None, :3, :3]
    dirs = (R @ d_cam[..., None]).squeeze(-1)
    origins = c2w[..., None, None, :3, 3].expand_as(dirs)
    return origins, dirs


def _plucker(c2w: Tensor, size: int, fov_deg: float) -> Tensor:
    """Per-pixel Plücker coordinates ``(d, o x d)`` as channels: ``(..., 6, size, size)``."""
    o, d = camera_rays(c2w, size, fov_deg)
    return torch.cat([d, torch.cross(o, d, dim=-1)], dim=-1).movedim(-1, -3)


# ------------------------------------------------------------------------------------ volume rendering
def volume_render(density: Tensor, rgb: Tensor, delta: float | Tensor) -> tuple[Tensor, Tensor]:
    """Emission-absorption compositing along rays, black background.

    ``density (..., S)`` (>= 0) and ``rgb (..., S, 3)`` at ``S`` samples spaced ``delta`` apart (a finite
    float > 0 or a finite non-negative tensor broadcastable to ``(..., S)``). Returns
    ``(colour (..., 3), opacity (...))``:
    ``w_i = T_i (1 - exp(-σ_i δ_i))`` with ``T_i = exp(-Σ_{j<i} σ_j δ_j)``.
    """
    density = check_tensor(density, "density")
    rgb = check_tensor(rgb, "rgb")
    if density.dim() < 1 or rgb.shape != (*density.shape, 3):
        raise ValueError(f"rgb must have shape density.shape + (3,) = {(*density.shape, 3)}, "
                         f"got {tuple(rgb.shape)}")  # fmt: skip
    if (density < 0).any():
        raise ValueError(f"density must be non-negative, got a minimum {float(density.min()):.3g}")
    if isinstance(delta, Tensor):
        delta = check_tensor(delta, "delta")
        try:
            fits = torch.broadcast_shapes(delta.shape, density.shape) == density.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"delta must broadcast to density's shape {tuple(density.shape)}, "
                             f"got shape {tuple(delta.shape)}")  # fmt: skip
        if delta.numel() and not bool((delta >= 0).all()):
            raise ValueError(
                f"delta must be non-negative (sample spacings), got a minimum {float(delta.min()):.3g}"
            )
    else:
        delta = check_float(delta, "delta", low=0, low_open=True)
    tau = density * delta
    alpha = 1.0 - torch.exp(-tau)
    trans = torch.exp(-torch.cumsum(torch.cat([torch.zeros_like(tau[..., :1]), tau[..., :-1]], -1), -1))
    w = alpha * trans
    return (w[..., None] * rgb).sum(-2), w.sum(-1)


def _ray_samples(
    origins: Tensor, dirs: Tensor, near: float, far: float, n_samples: int
) -> tuple[Tensor, float]:
    """Midpoint samples ``(..., n_samples, 3)`` on each ray between ``near`` and ``far`` and their spacing."""
    delta = (far - near) / n_samples
    t = near + delta * (torch.arange(n_samples, dtype=origins.dtype, device=origins.device) + 0.5)
    return origins[..., None, :] + t[:, None] * dirs[..., None, :], delta


# ------------------------------------------------------------------------------------- analytic scenes
@dataclass
class EllipsoidScenes:
    """A batch of analytic scenes of up to ``K`` axis-aligned coloured ellipsoids inside ``[-1, 1]^3``.

    ``centres (B, K, 3)``, ``radii (B, K, 3)`` (> 0), ``colours (B, K, 3)`` in ``[0, 1]``, ``mask (B, K)``
    (bool, which ellipsoids exist). The density is a soft indicator
    ``σ(x) = sigma_max · sigmoid(sharpness · (1 - Σ_d (x_d - c_d)² / r_d²))`` summed over ellipsoids; the
    colour at ``x`` is the density-weighted mean of the ellipsoids' colours.
    """

    centres: Tensor
    radii: Tensor
    colours: Tensor
    mask: Tensor
    sigma_max: float = 30.0
    sharpness: float = 12.0

    def __post_init__(self) -> None:
        c = check_tensor(self.centres, "centres", ndim=3)
        if c.shape[-1] != 3 or c.shape[0] == 0 or c.shape[1] == 0:
            raise ValueError(f"centres must have shape (B, K, 3) with B, K >= 1, got {tuple(c.shape)}")
        for name in ("radii", "colours"):
            t = check_tensor(getattr(self, name), name, ndim=3)
            if t.shape != c.shape:
                raise ValueError(
                    f"{name} must have the shape of centres {tuple(c.shape)}, got {tuple(t.shape)}"
                )
        if (self.radii <= 0).any():
            raise ValueError(f"radii must be positive, got a minimum {float(self.radii.min()):.3g}")
        if (
            not isinstance(self.mask, Tensor)
            or self.mask.dtype != torch.bool
            or self.mask.shape != c.shape[:2]
        ):
            raise ValueError(f"mask must be a bool tensor of shape {tuple(c.shape[:2])}")

    def __len__(self) -> int:
        return self.centres.shape[0]

    def __getitem__(self, idx: int | slice | Tensor) -> EllipsoidScenes:
        if isinstance(idx, int):
            idx = slice(idx, idx + 1)
        return EllipsoidScenes(self.centres[idx], self.radii[idx], self.colours[idx], self.mask[idx],
                               self.sigma_max, self.sharpness)  # fmt: skip

    def field(self, points: Tensor) -> tuple[Tensor, Tensor]:
        """Density ``(B, P)`` and colour ``(B, P, 3)`` at ``points (B, P, 3)``."""
        q = (((points[:, :, None, :] - self.centres[:, None]) / self.radii[:, None]) ** 2).sum(
            -1
        )  # (B, P, K)
        sig = self.sigma_max * torch.sigmoid(self.sharpness * (1.0 - q)) * self.mask[:, None].to(points.dtype)
        dens = sig.sum(-1)
        rgb = (sig[..., None] * self.colours[:, None]).sum(-2) / (dens[..., None] + 1e-6)
        return dens, rgb

    def render(self, cams: Tensor, size: int = 32, n_samples: int = 16, fov_deg: float = 40.0,
               near: float = 1.3, far: float = 3.7) -> Tensor:  # fmt: skip
        """Images ``(B, M, 3, size, size)`` of each scene from its cameras ``cams (B, M, 4, 4)``."""
        cams = _check_cameras("cams", cams, batch_dims=2)
        if cams.shape[0] != len(self):
            raise ValueError(f"cams must have one row per scene ({len(self)}), got {tuple(cams.shape)}")
        o, d = camera_rays(cams, check_int(size, "size", low=1), fov_deg)
        pts, delta = _ray_samples(o, d, near, far, check_int(n_samples, "n_samples", low=1))
        B = pts.shape[0]
        dens, rgb = self.field(pts.reshape(B, -1, 3))
        col, _ = volume_render(dens.reshape(pts.shape[:-1]), rgb.reshape(pts.shape), delta)
        return col.movedim(-1, -3)


def sample_ellipsoid_scenes(n: int, max_ellipsoids: int = 3, *, seed: int | None = None,
                            generator: torch.Generator | None = None) -> EllipsoidScenes:  # fmt: skip
    """``n`` random scenes of 1..``max_ellipsoids`` ellipsoids: centres in ``[-0.45, 0.45]^3``, radii in
    ``[0.15, 0.45]``, saturated random colours."""
    n = check_int(n, "n", low=1)
    K = check_int(max_ellipsoids, "max_ellipsoids", low=1)
    g = make_generator(seed, generator)
    centres = (torch.rand(n, K, 3, generator=g) - 0.5) * 0.9
    radii = 0.15 + 0.3 * torch.rand(n, K, 3, generator=g)
    colours = 0.15 + 0.85 * torch.rand(n, K, 3, generator=g)
    count = torch.randint(1, K + 1, (n,), generator=g)
    mask = torch.arange(K)[None] < count[:, None]
    return EllipsoidScenes(centres, radii, colours, mask)


# --------------------------------------------------------------------------------------- reconstructor
class _ConvTokens(nn.Module):
    """Image + Plücker rays ``(M, 9, S, S)`` -> ``(M, (S/8)², dim)`` tokens (three stride-2 convolutions)."""

    def __init__(self, dim: int, img_size: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(9, 32, 3, 2, 1), nn.GELU(), nn.Conv2d(32, 64, 3, 2, 1), nn.GELU(),
            nn.Conv2d(64, dim, 3, 2, 1),
        )  # fmt: skip
        self.pos = nn.Parameter(torch.zeros(1, (img_size // 8) ** 2, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).flatten(2).transpose(1, 2) + self.pos


def _project(points: Tensor, cams: Tensor, size: int, fov_deg: float) -> tuple[Tensor, Tensor]:
    """Normalised image coordinates ``(B, N, P, 2)`` (``grid_sample``, align_corners=False) of world
    ``points (B, P, 3)`` in cameras ``(B, N, 4, 4)`` and whether each lies in front of the camera and in frame."""
    R, t = cams[..., :3, :3], cams[..., :3, 3]
    xc = (points[:, None] - t[:, :, None]) @ R  # (B, N, P, 3): R^T (x - t), row form
    f = 0.5 * size / math.tan(math.radians(fov_deg) / 2)
    z = xc[..., 2:].clamp_min(1e-3)
    uv = f * xc[..., :2] / z / (0.5 * size)  # pixel centre j + 0.5 -> 2 (j + 0.5) / S - 1
    ok = (xc[..., 2] > 1e-3) & (uv.abs() <= 1).all(-1)
    return uv, ok


class _CrossBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.nq, self.nkv, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, q: Tensor, kv: Tensor, pad: Tensor) -> Tensor:
        kvn = self.nkv(kv)
        q = q + self.attn(self.nq(q), kvn, kvn, key_padding_mask=pad, need_weights=False)[0]
        return q + self.mlp(self.n2(q))


class FlexibleViewReconstructor(nn.Module):
    """Any number of posed views -> tri-plane -> density / colour field, volume-rendered (FlexRM, lite).

    Each view (its image concatenated with its per-pixel Plücker rays) becomes ``tokens_per_view`` tokens;
    the ``3 · plane_res²`` learnable tri-plane queries cross-attend (``depth`` blocks, width ``dim``) to the
    tokens of all views that ``view_mask`` keeps, so the tri-plane does not depend on the order of the views
    and padded views have no effect. A point ``x ∈ [-1, 1]³`` reads the xy, xz and yz planes bilinearly; the
    summed features go through an MLP to density (softplus) and colour (sigmoid).

    ``encoder="dinov2"`` uses a random-init ``transformers`` ``Dinov2Model`` (patch 8, width ``dim``) as the
    per-view tokeniser, as LRM / FlexRM use DINO features (the ``hf`` extra).
    """

    LIFT_CHANNELS = 16
    """Channels of the per-view feature maps lifted onto the voxel grid."""

    def __init__(self, img_size: int = 32, plane_res: int = 16, dim: int = 64, depth: int = 2, heads: int = 4,
                 plane_channels: int = 16, fov_deg: float = 40.0, near: float = 1.3, far: float = 3.7,
                 encoder: str = "cnn"):  # fmt: skip
        super().__init__()
        self.img_size = check_int(img_size, "img_size", low=8)
        if img_size % 8:
            raise ValueError(f"img_size must be a multiple of 8, got {img_size}")
        self.plane_res = check_int(plane_res, "plane_res", low=2)
        self.dim = check_int(dim, "dim", low=1)
        if dim % check_int(heads, "heads", low=1) != 0:
            raise ValueError(f"dim must be divisible by heads, got dim={dim}, heads={heads}")
        self.fov_deg = _check_fov(fov_deg)
        if not 0 < near < far:
            raise ValueError(f"near and far must satisfy 0 < near < far, got near={near}, far={far}")
        self.near, self.far = float(near), float(far)
        self.plane_channels = check_int(plane_channels, "plane_channels", low=1)
        if encoder == "cnn":
            self.encoder: nn.Module = _ConvTokens(dim, img_size)
        elif encoder == "dinov2":
            from icml25.generative_models.flex3d_hf import dinov2_view_encoder

            self.encoder = dinov2_view_encoder(dim, img_size, n_channels=9, heads=heads)
        else:
            raise ValueError(f"encoder must be 'cnn' or 'dinov2', got {encoder!r}")
        self.encoder_kind = encoder
        self.queries = nn.Parameter(torch.randn(1, 3 * plane_res * plane_res, dim) * 0.02)
        self.lift_cnn = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1), nn.GELU(), nn.Conv2d(32, self.LIFT_CHANNELS, 3, 1, 1)
        )  # fmt: skip
        self.lift_proj = nn.Linear(2 * (2 * self.LIFT_CHANNELS + 1), dim)
        self.blocks = nn.ModuleList(_CrossBlock(dim, heads) for _ in range(check_int(depth, "depth", low=1)))
        self.out_norm = nn.LayerNorm(dim)
        self.to_plane = nn.Linear(dim, plane_channels)
        self.decoder = nn.Sequential(
            nn.Linear(plane_channels, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
        )  # fmt: skip

    def forward(self, images: Tensor, cams: Tensor, view_mask: Tensor | None = None) -> Tensor:
        """Tri-plane features ``(B, 3, C, R, R)`` (planes xy, xz, yz; ``C = plane_channels``,
        ``R = plane_res``) from ``images (B, N, 3, S, S)``, ``cams (B, N, 4, 4)`` and an optional bool
        ``view_mask (B, N)`` (False = padding; each object keeps at least one view)."""
        images, cams, view_mask = _check_views(images, cams, view_mask)
        B, N, _, S, _ = images.shape
        if S != self.img_size:
            raise ValueError(f"images must be {self.img_size}x{self.img_size} (img_size), got {S}x{S}")
        x = torch.cat([images, _plucker(cams.to(images.dtype), S, self.fov_deg)], dim=2)
        tok = self.encoder(x.reshape(B * N, 9, S, S))  # (B*N, T, dim)
        T = tok.shape[1]
        tok = tok.reshape(B, N * T, self.dim)
        pad = (~view_mask)[:, :, None].expand(B, N, T).reshape(B, N * T)
        q = self.queries + self._lift(images, cams.to(images.dtype), view_mask)
        for blk in self.blocks:
            q = blk(q, tok, pad)
        planes = self.to_plane(self.out_norm(q))  # (B, 3 R², C)
        R = self.plane_res
        return planes.reshape(B, 3, R, R, self.plane_channels).permute(0, 1, 4, 2, 3)

    def _lift(self, images: Tensor, cams: Tensor, view_mask: Tensor) -> Tensor:
        """Initial tri-plane tokens ``(B, 3 R², dim)``: per-view feature maps sampled at the projections of an
        ``R³`` voxel grid, their masked mean and variance over the views (and the share of views seeing each
        voxel), mean- and max-pooled along each plane's normal axis."""
        B, N, _, S, _ = images.shape
        R, Cf = self.plane_res, self.LIFT_CHANNELS
        feat = self.lift_cnn(images.reshape(B * N, 3, S, S))  # (B N, Cf, S/2, S/2)
        ax = (torch.arange(R, dtype=images.dtype, device=images.device) + 0.5) / R * 2 - 1
        gx, gy, gz = torch.meshgrid(ax, ax, ax, indexing="ij")  # voxel (i, j, k) at (x_i, y_j, z_k)
        pts = torch.stack([gx, gy, gz], -1).reshape(1, R**3, 3).expand(B, -1, -1)
        uv, ok = _project(pts, cams, S, self.fov_deg)  # (B, N, R³, 2), (B, N, R³)
        smp = F.grid_sample(feat, uv.reshape(B * N, 1, R**3, 2), align_corners=False)  # (B N, Cf, 1, R³)
        smp = smp.reshape(B, N, Cf, R**3)
        w = (ok & view_mask[:, :, None]).to(images.dtype)[:, :, None]  # (B, N, 1, R³)
        cnt = w.sum(1)
        mean = (w * smp).sum(1) / cnt.clamp_min(1.0)
        var = (w * (smp - mean[:, None]) ** 2).sum(1) / cnt.clamp_min(1.0)
        frac = cnt / view_mask.sum(1).to(images.dtype)[:, None, None]
        vox = torch.cat([mean, var, frac], 1).reshape(B, 2 * Cf + 1, R, R, R)  # (B, C, x, y, z)
        planes = []
        for axis in (4, 3, 2):  # xy (pool z), xz (pool y), yz (pool x); grid_sample rows = second coord
            planes.append(torch.cat([vox.mean(axis), vox.amax(axis)], 1).transpose(-1, -2))  # (B, 2C, R, R)
        tok = torch.stack(planes, 1).permute(0, 1, 3, 4, 2).reshape(B, 3 * R * R, -1)
        return self.lift_proj(tok)

    def query(self, triplane: Tensor, points: Tensor) -> tuple[Tensor, Tensor]:
        """Density ``(B, P)`` and colour ``(B, P, 3)`` of the field at ``points (B, P, 3)`` (outside
        ``[-1, 1]³`` the density is zero)."""
        coords = [points[..., [0, 1]], points[..., [0, 2]], points[..., [1, 2]]]
        feat = 0
        for k, uv in enumerate(coords):
            feat = feat + F.grid_sample(
                triplane[:, k], uv[:, None], align_corners=False, padding_mode="zeros"
            )
        h = self.decoder(feat[:, :, 0].transpose(1, 2))  # (B, P, 4)
        inside = (points.abs() <= 1).all(-1).to(h.dtype)
        return F.softplus(h[..., 0] - 1.0) * 10.0 * inside, torch.sigmoid(h[..., 1:])

    def render_rays(self, triplane: Tensor, origins: Tensor, dirs: Tensor, n_samples: int = 16) -> Tensor:
        """Colours ``(B, Q, 3)`` of rays ``origins, dirs (B, Q, 3)`` through the field of ``triplane``."""
        pts, delta = _ray_samples(origins, dirs, self.near, self.far, n_samples)
        B, Q, Sn, _ = pts.shape
        dens, rgb = self.query(triplane, pts.reshape(B, Q * Sn, 3))
        return volume_render(dens.reshape(B, Q, Sn), rgb.reshape(B, Q, Sn, 3), delta)[0]

    def render(self, triplane: Tensor, cams: Tensor, size: int | None = None, n_samples: int = 16) -> Tensor:
        """Images ``(B, M, 3, size, size)`` of the tri-plane fields ``(B, 3, C, R, R)`` from ``cams (B, M, 4, 4)``."""
        triplane = check_tensor(triplane, "triplane", ndim=5)
        want = (3, self.plane_channels, self.plane_res, self.plane_res)
        if tuple(triplane.shape[1:]) != want or triplane.shape[0] == 0:
            raise ValueError(f"triplane must have shape (B, {', '.join(map(str, want))}) with B >= 1 (forward's "
                             f"output), got {tuple(triplane.shape)}")  # fmt: skip
        cams = _check_cameras("cams", cams, batch_dims=2)
        if cams.shape[0] != triplane.shape[0]:
            raise ValueError(
                f"cams must have one row per tri-plane ({triplane.shape[0]}), got {tuple(cams.shape)}"
            )
        size = self.img_size if size is None else check_int(size, "size", low=1)
        o, d = camera_rays(cams.to(triplane.dtype), size, self.fov_deg)
        B, M = cams.shape[:2]
        col = self.render_rays(
            triplane, o.reshape(B, -1, 3), d.reshape(B, -1, 3), check_int(n_samples, "n_samples", low=1)
        )
        return col.reshape(B, M, size, size, 3).movedim(-1, -3)


# ------------------------------------------------------------------------------------------- curation
def _high_frequency_energy(images: Tensor) -> Tensor:
    """Mean squared 4-neighbour Laplacian of ``images (..., 3, S, S)`` -> ``(...)``."""
    lap = (4 * images[..., 1:-1, 1:-1] - images[..., :-2, 1:-1] - images[..., 2:, 1:-1]
           - images[..., 1:-1, :-2] - images[..., 1:-1, 2:])  # fmt: skip
    return (lap**2).mean(dim=(-3, -2, -1))


def consistency_scores(images: Tensor, cams: Tensor, reconstructor: FlexibleViewReconstructor,
                       quality_weight: float = 1.0, view_mask: Tensor | None = None) -> Tensor:  # fmt: skip
    """Per-view curation scores ``(B, N)`` of candidate views ``images (B, N, 3, S, S)`` with ``cams (B, N, 4, 4)``;
    **lower is better**.

    ``score_i = e_i / median_j e_j + quality_weight · max(0, 1 - h_i / median_j h_j)`` where ``e_i`` is the
    leave-one-out error (MSE between view ``i`` and the rendering, from camera ``i``, of the reconstruction
    from all other candidates) and ``h_i`` the high-frequency energy of view ``i`` (a blurred view loses it).
    Needs N >= 2. ``view_mask (B, N)`` excludes candidates (their score is ``+inf``). Runs without gradients.
    """
    images, cams, view_mask = _check_views(images, cams, view_mask)
    if not isinstance(reconstructor, FlexibleViewReconstructor):
        raise TypeError(
            f"reconstructor must be a FlexibleViewReconstructor, got {type(reconstructor).__name__}"
        )
    if (
        isinstance(quality_weight, bool)
        or not isinstance(quality_weight, (int, float))
        or not (0 <= quality_weight < 1e6)
    ):
        raise ValueError(f"quality_weight must be a float in [0, 1e6), got {quality_weight!r}")
    B, N = images.shape[:2]
    if (view_mask.sum(1) < 2).any():
        raise ValueError(f"consistency_scores needs at least 2 candidate views per object, got N = "
                         f"{int(view_mask.sum(1).min())}")  # fmt: skip
    errors = torch.empty(B, N, dtype=images.dtype)
    with torch.no_grad():
        for i in range(N):
            m = view_mask.clone()
            m[:, i] = False
            tri = reconstructor(images, cams, m)
            pred = reconstructor.render(tri, cams[:, i : i + 1])[:, 0]
            errors[:, i] = ((pred - images[:, i]) ** 2).mean(dim=(-3, -2, -1))
    e = torch.where(view_mask, errors, torch.tensor(float("nan"), dtype=images.dtype))
    e_rel = e / e.nanmedian(dim=1, keepdim=True).values.clamp_min(1e-12)
    h = torch.where(view_mask, _high_frequency_energy(images), torch.tensor(float("nan"), dtype=images.dtype))
    q = (1.0 - h / h.nanmedian(dim=1, keepdim=True).values.clamp_min(1e-12)).clamp_min(0.0)
    return torch.where(view_mask, e_rel + quality_weight * q, torch.tensor(float("inf"), dtype=images.dtype))


def curate_views(scores: Tensor, keep: int | float) -> Tensor:
    """Indices ``(B, k)`` (ascending) of the ``k`` best views per object by ``scores (B, N)`` (lower is
    better, as :func:`consistency_scores`); ``keep`` is a count ``k`` (int, 1 <= k <= N) or a fraction in
    ``(0, 1]`` (``k = max(1, round(keep · N))``)."""
    if not isinstance(scores, Tensor) or not scores.is_floating_point():
        raise TypeError(
            f"scores must be a floating-point tensor, got {getattr(scores, 'dtype', type(scores).__name__)}"
        )
    if scores.dim() != 2:
        raise ValueError(f"scores must have shape (B, N), got {tuple(scores.shape)}")
    n_nan, n_neg = int(torch.isnan(scores).sum()), int((scores == float("-inf")).sum())
    if n_nan or n_neg:
        raise ValueError(
            f"scores must be finite or +inf (excluded views); got {n_nan} NaN and {n_neg} -Inf values "
            f"in a tensor of shape {tuple(scores.shape)}"
        )
    B, N = scores.shape
    if B == 0 or N == 0:
        raise ValueError(
            f"scores must hold at least one object and one view, got shape {tuple(scores.shape)}"
        )
    if isinstance(keep, bool) or not isinstance(keep, (int, float)):
        raise TypeError(f"keep must be an int count or a float fraction, got {type(keep).__name__}")
    if isinstance(keep, float):
        if not 0 < keep <= 1:
            raise ValueError(f"keep as a fraction must be in (0, 1], got {keep}")
        k = max(1, round(keep * N))
    else:
        if not 1 <= keep <= N:
            raise ValueError(f"keep must be between 1 and N = {N} views, got {keep}")
        k = keep
    idx = torch.argsort(scores, dim=1, stable=True)[:, :k]
    return idx.sort(dim=1).values


def _gaussian_blur(img: Tensor, sigma: float) -> Tensor:
    r = max(1, math.ceil(3 * sigma))
    x = torch.arange(-r, r + 1, dtype=img.dtype)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    k = k / k.sum()
    c = img.shape[0]
    out = F.conv2d(
        F.pad(img[None], (r, r, 0, 0), mode="replicate"), k.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c
    )
    out = F.conv2d(
        F.pad(out, (0, 0, r, r), mode="replicate"), k.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c
    )
    return out[0]


def simulate_imperfect_views(images: Tensor, p: float, kinds: Sequence[str] = CORRUPTIONS, *,
                             min_shift: int = 4, min_blur: float = 1.5, seed: int | None = None,
                             generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Corrupt each view of ``images (B, N, 3, S, S)`` independently with probability ``p``.

    A corrupted view gets one of ``kinds`` (uniformly): ``blur`` (Gaussian, σ in [min_blur, min_blur + 1]
    px), ``shift`` (translation by ``min_shift``..``min_shift + 2`` px along a random axis and sign, zero
    fill), ``colour`` (a random permutation of the colour channels and a gain in [0.6, 1.4]) or ``swap`` (the
    same view index of the next object in the batch: an inconsistent object; needs B >= 2). Returns
    ``(corrupted images, corrupted (B, N) bool)``; the input is not modified.
    """
    images = check_tensor(images, "images", ndim=5)
    if images.shape[2] != 3 or images.shape[-1] != images.shape[-2] or images.numel() == 0:
        raise ValueError(f"images must have shape (B, N, 3, S, S) with S >= 1, got {tuple(images.shape)}")
    _check_range("images", images)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in CORRUPTIONS]
    if not kinds or bad:
        raise ValueError(f"kinds must be a non-empty subset of {CORRUPTIONS}, got {kinds}")
    if "swap" in kinds and images.shape[0] < 2:
        raise ValueError(
            f"kinds with 'swap' needs at least 2 objects in the batch, got B = {images.shape[0]}"
        )
    min_shift = check_int(min_shift, "min_shift", low=1)
    if not isinstance(min_blur, (int, float)) or not 0 < min_blur < 100:
        raise ValueError(f"min_blur must be a positive float below 100, got {min_blur!r}")
    g = make_generator(seed, generator)
    B, N = images.shape[:2]
    hit = torch.rand(B, N, generator=g) < p
    kind = torch.randint(0, len(kinds), (B, N), generator=g)
    u = torch.rand(B, N, 4, generator=g)
    out = images.clone()
    for b, n in hit.nonzero().tolist():
        name, r = kinds[int(kind[b, n])], u[b, n]
        img = images[b, n]
        if name == "blur":
            out[b, n] = _gaussian_blur(img, float(min_blur + r[0]))
        elif name == "shift":
            s = (min_shift + int(r[0] * 3)) * (1 if r[1] < 0.5 else -1)
            dim = -1 if r[2] < 0.5 else -2
            shifted = torch.roll(img, s, dims=dim)
            idx = slice(0, s) if s > 0 else slice(s, None)
            if dim == -1:
                shifted[..., idx] = 0.0
            else:
                shifted[..., idx, :] = 0.0
            out[b, n] = shifted
        elif name == "colour":
            perm = torch.randperm(3, generator=g)
            out[b, n] = (img[perm] * (0.6 + 0.8 * float(r[0]))).clamp(0, 1)
        else:  # swap
            out[b, n] = images[(b + 1) % B, n]
    return out, hit


def _init_reconstructor(seed: int, **kwargs: object) -> FlexibleViewReconstructor:
    """A reconstructor initialised under ``isolated_rng(seed)`` (leaves the global generator untouched)."""
    with isolated_rng(seed):
        return FlexibleViewReconstructor(**kwargs)  # type: ignore[arg-type]
