"""Geometry Informed Tokenization of Molecules for Language Model Generation — ICML 2025, P27: Geo2Seq tokens.

Li, Wang, Luo, Edwards, Gui, Lin, Ji & Ji, ICML 2025 (arXiv 2408.10120; official code ``divelab/AIRS``,
folder ``OpenMol/Geo2Seq``). Geo2Seq turns a 3D molecule into a plain 1D token sequence that any causal
language model can learn, and back:

1. order the atoms canonically (graph canonical labelling, so isomorphic molecules give the same order);
2. build a frame from the molecule itself: origin at atom 0, ``e_x`` along atom 1, ``e_y`` normal to the
   plane of atoms 0, 1 and the first atom off the 0–1 line, ``e_z = e_x × e_y``;
3. write every atom as ``element d θ° φ°``: spherical coordinates in that frame, rounded (2 decimals by
   default; the "°" only separates the angle vocabulary from the distance one, the values are radians).

The string is invariant to rotations and translations (SE(3)); a mirror image flips the sign of φ, so
chirality is kept. :func:`decode` inverts it exactly up to rounding (position error about 0.005 Å radially
plus d·0.005 rad angularly).

Main entry points: :func:`encode` / :func:`tokenize_molecule` (RDKit ``Mol`` with a conformer, or
``(symbols, positions)``), :func:`decode` (raises :class:`Geo2SeqDecodeError` with the offending token
position), :func:`to_spherical` / :func:`from_spherical`, :func:`canonical_order` (RDKit's canonical SMILES
output order, as the official scripts use) and :func:`graph_canonical_order` (a dependency-free colour
refinement + DFS order for coordinates alone), :class:`Geo2SeqTokenizer` (word-level vocabulary, JSON
save/load, ``transformers`` export through :mod:`icml25.generative_models.geo2seq_hf`), :func:`stability`
(EDM-style atom/molecule stability from distance-inferred bond orders) and :func:`decode_to_mol` (RDKit
``Mol`` with a conformer and perceived bonds). RDKit is the ``chem`` extra, imported lazily.

Deviations from the official code, on purpose: the third frame atom is the first atom whose direction makes
more than ``collinear_tol_deg`` (5°) with ``e_x`` (the official test is an exact ``!= 0`` cross product,
which lets a tiny, noisy cross product set the frame of near-linear prefixes); when no atom passes the
tolerance the most off-axis atom is used, and an exactly collinear molecule (CO₂, acetylene) uses the
axis with φ = 0 / π for every atom (the official code falls back to raw centred coordinates there, which
are not rotation invariant). Coincident atoms are rejected unless ``allow_overlap=True``.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from icml25.kernels.checks import check_array, check_choice, check_float, check_int

__all__ = [
    "Geo2SeqConfig",
    "Geo2SeqDecodeError",
    "Geo2SeqEncoding",
    "Geo2SeqTokenizer",
    "bond_orders",
    "canonical_order",
    "decode",
    "decode_to_mol",
    "encode",
    "from_spherical",
    "graph_canonical_order",
    "kabsch_rmsd",
    "molecule_frame",
    "stability",
    "to_spherical",
    "tokenize_molecule",
]

ELEMENTS: tuple[str, ...] = (
    "H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se Br Kr "
    "Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy Ho Er Tm Yb "
    "Lu Hf Ta W Re Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf Es Fm Md No Lr Rf "
    "Db Sg Bh Hs Mt Ds Rg Cn Nh Fl Mc Lv Ts Og"
).split()
"""Element symbols by atomic number (index + 1); decode rejects any other atom token."""
_Z = {s: i + 1 for i, s in enumerate(ELEMENTS)}

# EDM-style bond-length tables (pm; single, double, triple) for the organic elements, with the EDM margins.
# Values: standard covalent bond lengths (as in the EDM / Geo2Seq evaluation code's tables).
_B1: dict[tuple[str, str], float] = {}
_B2: dict[tuple[str, str], float] = {}
_B3: dict[tuple[str, str], float] = {}


def _table(dst: dict[tuple[str, str], float], rows: Mapping[str, Mapping[str, float]]) -> None:
    for a, row in rows.items():
        for b, v in row.items():
            dst[(a, b)] = dst[(b, a)] = float(v)


_table(
    _B1,
    {
        "H": {"H": 74, "C": 109, "N": 101, "O": 96, "F": 92, "S": 134, "Cl": 127, "P": 144},
        "C": {"C": 154, "N": 147, "O": 143, "F": 135, "S": 182, "Cl": 177, "P": 184},
        "N": {"N": 145, "O": 140, "F": 136, "S": 168, "Cl": 175, "P": 177},
        "O": {"O": 148, "F": 142, "S": 151, "Cl": 164, "P": 163},
        "F": {"F": 142, "S": 158, "Cl": 166, "P": 156},
        "S": {"S": 204, "Cl": 207, "P": 210},
        "Cl": {"Cl": 199, "P": 203},
        "P": {"P": 221},
    },
)
_table(
    _B2, {"C": {"C": 134, "N": 129, "O": 120, "S": 160}, "N": {"N": 125, "O": 121}, "O": {"O": 121, "P": 150}}
)
_table(_B3, {"C": {"C": 120, "N": 116, "O": 113}, "N": {"N": 110}})
MARGINS_PM: tuple[float, float, float] = (10.0, 5.0, 3.0)
"""EDM margins (pm) added to the single / double / triple bond lengths."""
VALENCE: dict[str, tuple[int, ...]] = {"H": (1,), "C": (4,), "N": (3,), "O": (2,), "F": (1,), "S": (2, 4, 6),
                                       "Cl": (1,), "P": (3, 5)}  # fmt: skip
"""Allowed total bond order per element for :func:`stability` (EDM's table; S as in its Drugs variant)."""

SPECIAL_TOKENS: tuple[str, str, str, str] = ("<pad>", "<s>", "</s>", "<unk>")
"""Special tokens of :class:`Geo2SeqTokenizer`, ids 0..3 (as the official ``SimpleTokenizer``)."""
_MAX_ABS = 1e6  # Å: larger coordinates are rejected as unrepresentable at 2-decimal precision

Order = Literal["canonical", "bfs", "dfs", "input"]
Coords = Literal["spherical", "cartesian", "invariant_cartesian"]


class Geo2SeqDecodeError(ValueError):
    """A malformed Geo2Seq string: ``position`` is the index of the offending token (whitespace split)."""

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message if position is None else f"{message} (token position {position})")
        self.position = position


@dataclass(frozen=True)
class Geo2SeqConfig:
    """How a molecule becomes a string.

    ``order``: ``"canonical"`` (default), ``"bfs"`` / ``"dfs"`` (from input atom 0, neighbours in input order:
    the paper's ablations) or ``"input"``. ``canonicalizer``: ``"rdkit"`` (RDKit canonical SMILES output
    order; coordinates alone get bonds from ``rdDetermineBonds``), ``"graph"`` (:func:`graph_canonical_order`
    on distance-inferred bonds, no RDKit) or ``"auto"`` (RDKit for a ``Mol``, graph for coordinates).
    ``coords``: ``"spherical"`` (Geo2Seq), ``"cartesian"`` (x y z centred on atom 0, *not* rotation
    invariant: the baseline) or ``"invariant_cartesian"`` (x y z in the molecule frame).
    """

    order: Order = "canonical"
    canonicalizer: Literal["auto", "rdkit", "graph"] = "auto"
    coords: Coords = "spherical"
    remove_h: bool = False
    dist_decimals: int = 2
    angle_decimals: int = 2
    angle_suffix: str = "°"
    collinear_tol_deg: float = 5.0
    allow_overlap: bool = False

    def __post_init__(self) -> None:
        check_choice(self.order, "order", ("canonical", "bfs", "dfs", "input"))
        check_choice(self.canonicalizer, "canonicalizer", ("auto", "rdkit", "graph"))
        check_choice(self.coords, "coords", ("spherical", "cartesian", "invariant_cartesian"))
        for name in ("dist_decimals", "angle_decimals"):
            check_int(getattr(self, name), name, low=0, high=8)
        if not isinstance(self.angle_suffix, str) or any(
            c.isspace() or c.isdigit() for c in self.angle_suffix
        ):
            raise ValueError(
                f"angle_suffix must be a string without spaces or digits, got {self.angle_suffix!r}"
            )
        check_float(self.collinear_tol_deg, "collinear_tol_deg", low=0, high=90, high_open=True)


@dataclass
class Geo2SeqEncoding:
    """A tokenized molecule: ``sequence`` (the string), ``symbols`` and ``positions`` ``(N, 3)`` in token
    order (input coordinates, reordered; hydrogens dropped when ``remove_h``), ``perm`` (input index of each
    token atom), ``values`` ``(N, 3)`` (the unrounded numbers written: d θ φ or x y z) and ``order`` (the
    ordering actually used: ``"input"`` when bond perception failed and the encoder fell back)."""

    sequence: str
    symbols: list[str]
    positions: np.ndarray
    perm: list[int]
    values: np.ndarray
    order: str
    metadata: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ validation
def _positions(pos: object, name: str = "pos", n: int | None = None) -> np.ndarray:
    """``pos`` as a finite float64 ``(N, 3)`` array (N >= 1), or a clear error naming ``name``."""
    if hasattr(pos, "detach"):  # a torch tensor
        pos = pos.detach().cpu().numpy()
    arr = check_array(pos, name, shape=(None, 3), dtype=("float", "int"), non_empty=True).astype(np.float64)
    if np.abs(arr).max() > _MAX_ABS:
        raise ValueError(
            f"{name} must lie within ±{_MAX_ABS:g} Å, got a coordinate of {np.abs(arr).max():.3g}"
        )
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} must have one row per atom: {n} symbols but {arr.shape[0]} positions")
    return arr


def _symbols(symbols: object, name: str = "symbols") -> list[str]:
    if isinstance(symbols, str) or not isinstance(symbols, Iterable):
        raise TypeError(
            f"{name} must be a sequence of element symbols like ['C', 'O'], got {type(symbols).__name__}"
        )
    out = list(symbols)
    if not out:
        raise ValueError(f"{name} must name at least one atom, got an empty sequence")
    for i, s in enumerate(out):
        if isinstance(s, np.str_):
            s = out[i] = str(s)
        if not isinstance(s, str) or s not in _Z:
            raise ValueError(f"{name}[{i}] must be an element symbol like 'C', got {s!r}")
    return out


def _check_overlap(pos: np.ndarray, allow_overlap: bool, name: str = "pos") -> None:
    if allow_overlap or len(pos) < 2:
        return
    diff = pos[:, None, :] - pos[None, :, :]
    dist = np.sqrt((diff**2).sum(-1))
    dist[np.diag_indices(len(pos))] = np.inf
    i, j = np.unravel_index(int(np.argmin(dist)), dist.shape)
    if dist[i, j] < 1e-6:
        raise ValueError(
            f"{name} has two atoms at the same position (atoms {min(i, j)} and {max(i, j)}, distance "
            f"{dist[i, j]:.2g} Å): their angles are undefined; pass allow_overlap=True to encode them with θ = φ = 0"
        )


# -------------------------------------------------------------------------------------------- geometry
def molecule_frame(
    pos: np.ndarray, collinear_tol_deg: float = 5.0, allow_overlap: bool = False
) -> tuple[np.ndarray, int | None]:
    """The invariant frame of ``pos`` ``(N, 3)`` (atoms already in token order).

    Returns ``(R, k)``: ``R`` ``(3, 3)`` has the unit axes ``e_x, e_y, e_z`` as rows (right-handed,
    ``det R = +1``), so frame coordinates are ``(pos - pos[0]) @ R.T``; ``k`` is the index of the atom that
    fixed ``e_y`` (the first whose direction from atom 0 makes more than ``collinear_tol_deg`` with ``e_x``,
    else the most off-axis one), or ``None`` when the atoms are collinear (then ``e_y``, ``e_z`` are an
    arbitrary completion and every atom gets φ = 0 or π). N = 1 gives the identity. As in the official
    code, ``e_y = e_x × (p_k − p_0)`` normalised, so atom ``k`` lies in the x–z plane (φ = 0, z < 0).
    """
    pos = _positions(pos)
    collinear_tol_deg = check_float(collinear_tol_deg, "collinear_tol_deg", low=0, high=90, high_open=True)
    _check_overlap(pos, allow_overlap)
    c = pos - pos[0]
    norms = np.linalg.norm(c, axis=1)
    scale = max(float(norms.max()), 1e-12)
    axis_atoms = np.flatnonzero(norms > 1e-9 * scale + 1e-12)
    if len(axis_atoms) == 0:
        return np.eye(3), None
    a = int(axis_atoms[0])
    ex = c[a] / norms[a]
    cross = np.cross(ex, c)
    sines = np.zeros(len(c))
    ok = norms > 1e-12
    sines[ok] = np.linalg.norm(cross[ok], axis=1) / norms[ok]
    sines[: a + 1] = 0.0
    passing = np.flatnonzero(sines > math.sin(math.radians(collinear_tol_deg)))
    if len(passing):
        k = int(passing[0])
    elif sines.max() > 1e-7:
        k = int(np.argmax(sines))
    else:  # collinear: complete e_x to a right-handed basis by a fixed rule (only φ = 0 / π is used)
        helper = np.eye(3)[int(np.argmin(np.abs(ex)))]
        ey = np.cross(ex, helper)
        ey /= np.linalg.norm(ey)
        return np.stack([ex, ey, np.cross(ex, ey)]), None
    ey = cross[k] / np.linalg.norm(cross[k])
    return np.stack([ex, ey, np.cross(ex, ey)]), k


def _frame_coordinates(pos: np.ndarray, tol: float, allow_overlap: bool) -> np.ndarray:
    """Invariant Cartesian coordinates ``(N, 3)``: ``(pos - pos[0])`` in the molecule frame."""
    R, k = molecule_frame(pos, tol, allow_overlap)
    q = (pos - pos[0]) @ R.T
    scale = max(float(np.abs(q).max()), 1.0)
    if k is None:  # collinear: exactly on the axis
        q[:, 1:] = 0.0
    else:
        first = int(np.flatnonzero(np.linalg.norm(q, axis=1) > 1e-12)[0])
        q[first, 1:] = 0.0  # on e_x by construction
        q[k, 1] = 0.0  # in the x-z half-plane z < 0 by construction (e_y is normal to it)
    # components that are zero up to float error (atoms on the axis, or in the x-z plane of a planar
    # molecule): snap to +0, so φ is exactly 0 or π and not ±π by the sign of a rounding error
    q[np.abs(q) < 1e-9 * scale] = 0.0
    return q


def _cart_to_sph(q: np.ndarray) -> np.ndarray:
    d = np.linalg.norm(q, axis=1)
    theta = np.zeros_like(d)
    nz = d > 0
    theta[nz] = np.arccos(np.clip(q[nz, 2] / d[nz], -1.0, 1.0))
    phi = np.arctan2(q[:, 1], q[:, 0])
    phi = np.where(phi <= -math.pi, math.pi, phi)
    phi[~nz] = 0.0
    return np.stack([d, theta, phi], axis=1)


def to_spherical(pos: np.ndarray, collinear_tol_deg: float = 5.0, allow_overlap: bool = False) -> np.ndarray:
    """Invariant spherical coordinates of ``pos`` ``(N, 3)`` (atoms in token order): ``(N, 3)`` columns
    ``d`` (Å, distance to atom 0), ``θ`` ∈ [0, π] (from ``e_z``; 0 for atom 0), ``φ`` ∈ (−π, π] (in the
    e_x–e_y plane) in the frame of :func:`molecule_frame`. Invariant to rotations and translations of
    ``pos``; a reflection flips the sign of φ."""
    pos = _positions(pos)
    return _cart_to_sph(_frame_coordinates(pos, collinear_tol_deg, allow_overlap))


def from_spherical(sph: np.ndarray) -> np.ndarray:
    """Frame coordinates ``(N, 3)`` from spherical ``(N, 3)`` rows ``(d, θ, φ)``:
    ``d (sinθ cosφ, sinθ sinφ, cosθ)``. The inverse of :func:`to_spherical` up to a rigid motion."""
    sph = _positions(sph, "sph")
    if (sph[:, 0] < 0).any():
        raise ValueError(f"sph[:, 0] (distances) must be >= 0, got min {sph[:, 0].min():.3g}")
    d, t, p = sph[:, 0], sph[:, 1], sph[:, 2]
    return np.stack([d * np.sin(t) * np.cos(p), d * np.sin(t) * np.sin(p), d * np.cos(t)], axis=1)


def kabsch_rmsd(a: np.ndarray, b: np.ndarray) -> float:
    """RMSD (Å) between two conformations ``(N, 3)`` of the same atoms after optimal superposition
    (centring and the best proper rotation, Kabsch)."""
    a, b = _positions(a, "a"), _positions(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape, got {a.shape} and {b.shape}")
    a, b = a - a.mean(0), b - b.mean(0)
    u, _, vt = np.linalg.svd(a.T @ b)
    s = np.diag([1.0, 1.0, np.sign(np.linalg.det(u @ vt)) or 1.0])
    rot = u @ s @ vt
    return float(np.sqrt(((a @ rot - b) ** 2).sum(1).mean()))


# --------------------------------------------------------------------------------- bonds and stability
def bond_orders(symbols: Sequence[str], pos: np.ndarray) -> np.ndarray:
    """EDM-style bond orders ``(N, N)`` (0–3) from interatomic distances: a pair is bonded when closer than
    its single-bond length + 10 pm, double under the double length + 5 pm, triple under the triple length
    + 3 pm. Pairs without a tabulated length (other elements) are never bonded."""
    symbols = _symbols(symbols)
    pos = _positions(pos, n=len(symbols))
    dist = 100.0 * np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    n = len(symbols)
    out = np.zeros((n, n), dtype=np.int64)
    m1, m2, m3 = MARGINS_PM
    for i in range(n):
        for j in range(i + 1, n):
            key = (symbols[i], symbols[j])
            if key not in _B1 or dist[i, j] >= _B1[key] + m1:
                continue
            order = 1
            if key in _B2 and dist[i, j] < _B2[key] + m2:
                order = 3 if key in _B3 and dist[i, j] < _B3[key] + m3 else 2
            out[i, j] = out[j, i] = order
    return out


def stability(symbols: Sequence[str], pos: np.ndarray) -> tuple[float, bool]:
    """EDM-style stability of one molecule: ``(fraction of atoms whose summed bond order is an allowed
    valence, every atom stable)``. Bond orders from :func:`bond_orders`; elements outside the table count
    as unstable."""
    symbols = _symbols(symbols)
    valence = bond_orders(symbols, pos).sum(1)
    ok = [int(v) in VALENCE.get(s, ()) for s, v in zip(symbols, valence)]
    return float(np.mean(ok)), bool(all(ok))


# ---------------------------------------------------------------------------------------- atom orders
def _adjacency(n: int, bonds: Iterable[tuple[int, int]] | np.ndarray) -> list[list[int]]:
    """Neighbour lists from ``(i, j)`` pairs (a list or a ``(K, 2)`` int array) or an ``(N, N)`` matrix."""
    if hasattr(bonds, "detach"):
        bonds = bonds.detach().cpu().numpy()
    if isinstance(bonds, (str, bytes)) or not isinstance(bonds, (np.ndarray, Iterable)):
        raise TypeError(f"bonds must be (i, j) pairs or an (N, N) matrix, got {type(bonds).__name__}")
    arr = np.asarray(bonds if isinstance(bonds, np.ndarray) else list(bonds))
    if arr.ndim == 1 and arr.size == 0:  # [] : no bonds
        arr = arr.reshape(0, 2)
    if arr.size == 0 and arr.dtype.kind == "f":  # np.asarray([]) is float
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iub":
        raise TypeError(f"bonds must hold integer atom indices (or bond orders), got dtype {arr.dtype}")
    if arr.ndim == 2 and arr.shape == (n, n) and n != 2:
        if (arr != arr.T).any():
            raise ValueError("bonds as an (N, N) bond-order matrix must be symmetric")
        arr = np.argwhere(np.triu(arr, 1) != 0)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(
            f"bonds must be (K, 2) atom-index pairs or an (N, N) matrix with N = {n}, got shape {arr.shape}"
        )
    adj: list[list[int]] = [[] for _ in range(n)]
    for i, j in arr.tolist():
        if not (0 <= i < n and 0 <= j < n) or i == j:
            raise ValueError(f"bonds must be pairs of distinct atom indices in [0, {n}), got ({i}, {j})")
        if j not in adj[i]:
            adj[i].append(j)
            adj[j].append(i)
    return adj


def _refine(colors: list[Any], adj: list[list[int]]) -> list[int]:
    """Colour refinement (1-WL) to a stable partition; colours are ranks of input-independent signatures."""
    ranks = _ranks(colors)
    while True:
        sig = [(ranks[i], tuple(sorted(ranks[j] for j in adj[i]))) for i in range(len(adj))]
        new = _ranks(sig)
        if len(set(new)) == len(set(ranks)):
            return new
        ranks = new


def _ranks(keys: list[Any]) -> list[int]:
    table = {k: r for r, k in enumerate(sorted(set(keys)))}
    return [table[k] for k in keys]


def _traverse(start_order: list[int], adj: list[list[int]], key: list[Any], depth_first: bool) -> list[int]:
    """DFS/BFS over every component, roots and neighbours taken by increasing ``key``."""
    seen: set[int] = set()
    out: list[int] = []
    for root in start_order:
        if root in seen:
            continue
        if depth_first:
            stack = [root]
            while stack:
                v = stack.pop()
                if v in seen:
                    continue
                seen.add(v)
                out.append(v)
                stack.extend(sorted((u for u in adj[v] if u not in seen), key=lambda u: key[u], reverse=True))
        else:
            queue = [root]
            seen.add(root)
            while queue:
                v = queue.pop(0)
                out.append(v)
                for u in sorted(adj[v], key=lambda u: key[u]):
                    if u not in seen:
                        seen.add(u)
                        queue.append(u)
    return out


def graph_canonical_order(symbols: Sequence[str], bonds: Iterable[tuple[int, int]] | np.ndarray) -> list[int]:
    """A canonical atom order of a molecular graph without RDKit: colour refinement from (heavy before H,
    element, degree), ties broken by individualising the lowest-ranked tied atom (input index among
    equals) and refining again, then a depth-first walk from the lowest-ranked atom visiting neighbours by
    rank (the shape of a SMILES output order). ``bonds``: ``(i, j)`` pairs or an ``(N, N)`` bond-order
    matrix. Returns ``order`` with ``order[k]`` = input index of the k-th atom.

    Invariant to input permutations up to graph automorphisms whenever colour refinement separates the
    non-automorphic atoms (true for the small organic molecules used here; exotic regular graphs may need
    a full canonical labelling such as nauty or :func:`canonical_order`).
    """
    symbols = _symbols(symbols)
    n = len(symbols)
    adj = _adjacency(n, bonds)
    ranks = _refine([(s == "H", _Z[s], len(adj[i])) for i, s in enumerate(symbols)], adj)
    while len(set(ranks)) < n:
        counts: dict[int, int] = {}
        for r in ranks:
            counts[r] = counts.get(r, 0) + 1
        cell = min(r for r, c in counts.items() if c > 1)
        pick = min(i for i in range(n) if ranks[i] == cell)
        ranks = _refine([(r, 0 if i == pick else 1) for i, r in enumerate(ranks)], adj)
    by_rank = sorted(range(n), key=lambda i: ranks[i])
    return _traverse(by_rank, adj, ranks, depth_first=True)


def _chem() -> Any:
    try:
        from rdkit import Chem, RDLogger
        from rdkit.Chem import rdDetermineBonds
    except ImportError as exc:
        raise ImportError(
            "Geo2Seq's RDKit canonical order and Mol I/O need rdkit: pip install 'icml25-generative-models[chem]'"
        ) from exc
    return Chem, rdDetermineBonds, RDLogger


def _is_mol(obj: object) -> bool:
    return type(obj).__name__ in ("Mol", "RWMol", "EditableMol") and type(obj).__module__.startswith("rdkit")


def canonical_order(mol: Any) -> list[int]:
    """RDKit's canonical atom order of ``mol`` (an RDKit ``Mol``): the atom output order of its canonical
    SMILES (``_smilesAtomOutputOrder``), as the official Geo2Seq scripts use; ``order[k]`` is the input
    index of the k-th atom. Explicit hydrogens are ordered too (written as ``[H]``)."""
    Chem, _, _ = _chem()
    if not _is_mol(mol):
        raise TypeError(f"mol must be an RDKit Mol, got {type(mol).__name__}")
    if mol.GetNumAtoms() == 0:
        raise ValueError("mol must have at least one atom, got an empty Mol")
    m = Chem.Mol(mol)
    Chem.MolToSmiles(m)
    return [int(i) for i in m.GetProp("_smilesAtomOutputOrder").strip("[],").split(",") if i.strip()]


def _rdkit_order_from_xyz(symbols: list[str], pos: np.ndarray) -> list[int] | None:
    """RDKit order after ``rdDetermineBonds.DetermineBonds`` on an XYZ block; None when bonds fail."""
    Chem, rdDetermineBonds, RDLogger = _chem()
    block = f"{len(symbols)}\n\n" + "".join(
        f"{s} {x:.8f} {y:.8f} {z:.8f}\n" for s, (x, y, z) in zip(symbols, pos)
    )
    RDLogger.DisableLog("rdApp.*")
    try:
        mol = Chem.MolFromXYZBlock(block)
        if mol is None:
            return None
        try:
            rdDetermineBonds.DetermineBonds(mol, charge=0)
        except Exception:  # RDKit raises ValueError / RuntimeError for valence or charge failures
            return None
        return canonical_order(mol)
    finally:
        RDLogger.EnableLog("rdApp.*")


def _mol_inputs(mol: Any) -> tuple[list[str], np.ndarray, list[tuple[int, int]]]:
    if mol.GetNumAtoms() == 0:
        raise ValueError("mol must have at least one atom, got an empty Mol")
    if mol.GetNumConformers() == 0:
        raise ValueError(
            "mol must have a 3D conformer (e.g. from AllChem.EmbedMolecule), got a Mol with none"
        )
    symbols = [a.GetSymbol() for a in mol.GetAtoms()]
    pos = _positions(mol.GetConformer().GetPositions(), "mol conformer positions", n=len(symbols))
    bonds = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()]
    return symbols, pos, bonds


# ------------------------------------------------------------------------------------ encode / decode
def _fmt(v: float, decimals: int) -> str:
    s = f"{v:.{decimals}f}"
    return s[1:] if s.startswith("-") and float(s) == 0.0 else s


def tokenize_molecule(mol_or_xyz: Any, config: Geo2SeqConfig | None = None) -> Geo2SeqEncoding:
    """Tokenize a molecule: an RDKit ``Mol`` with a conformer, or ``(symbols, positions)`` with positions
    ``(N, 3)`` in Å. Returns a :class:`Geo2SeqEncoding` (string + the order used + the unrounded values).

    A failed RDKit bond perception (coordinates with ``canonicalizer="rdkit"``) warns and falls back to the
    input order, recorded as ``encoding.order == "input"``.
    """
    cfg = Geo2SeqConfig() if config is None else config
    if not isinstance(cfg, Geo2SeqConfig):
        raise TypeError(f"config must be a Geo2SeqConfig, got {type(cfg).__name__}")
    is_mol = _is_mol(mol_or_xyz)
    if is_mol:
        symbols, pos, bonds = _mol_inputs(mol_or_xyz)
    elif isinstance(mol_or_xyz, (tuple, list)) and len(mol_or_xyz) == 2:
        symbols = _symbols(mol_or_xyz[0])
        pos = _positions(mol_or_xyz[1], "positions", n=len(symbols))
        bonds = None
    else:
        raise TypeError(
            f"mol_or_xyz must be an RDKit Mol with a conformer or a (symbols, positions) pair, got "
            f"{type(mol_or_xyz).__name__}"
        )
    _check_overlap(pos, cfg.allow_overlap, "positions")
    n = len(symbols)
    used = cfg.order
    meta: dict[str, Any] = {}
    if cfg.order == "input":
        perm = list(range(n))
    else:
        if bonds is None:
            bonds = [tuple(p) for p in zip(*np.nonzero(np.triu(bond_orders(symbols, pos), 1)))]
        adj = _adjacency(n, bonds)
        if cfg.order == "canonical":
            method = cfg.canonicalizer if cfg.canonicalizer != "auto" else ("rdkit" if is_mol else "graph")
            meta["canonicalizer"] = method
            if method == "graph":
                perm = graph_canonical_order(symbols, bonds)
            elif is_mol:
                perm = canonical_order(mol_or_xyz)
            else:
                found = _rdkit_order_from_xyz(symbols, pos)
                if found is None:
                    warnings.warn(
                        "RDKit bond perception (rdDetermineBonds) failed on these coordinates: falling back "
                        "to the input atom order (encoding.order = 'input'), which is not permutation invariant",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    perm, used = list(range(n)), "input"
                else:
                    perm = found
        else:
            perm = _traverse(list(range(n)), adj, list(range(n)), depth_first=cfg.order == "dfs")
    sym = [symbols[i] for i in perm]
    p = pos[perm]
    if cfg.remove_h:
        keep = [k for k, s in enumerate(sym) if s != "H"]
        if not keep:
            raise ValueError("remove_h=True would remove every atom: the molecule has only hydrogens")
        sym, p, perm = [sym[k] for k in keep], p[keep], [perm[k] for k in keep]
    if cfg.coords == "cartesian":
        values = p - p[0]
    else:
        q = _frame_coordinates(p, cfg.collinear_tol_deg, cfg.allow_overlap)
        values = q if cfg.coords == "invariant_cartesian" else _cart_to_sph(q)
    parts: list[str] = []
    for s, row in zip(sym, values):
        parts.append(s)
        if cfg.coords == "spherical":
            parts += [
                _fmt(row[0], cfg.dist_decimals),
                _fmt(row[1], cfg.angle_decimals) + cfg.angle_suffix,
                _fmt(row[2], cfg.angle_decimals) + cfg.angle_suffix,
            ]
        else:
            parts += [_fmt(v, cfg.dist_decimals) for v in row]
    return Geo2SeqEncoding(" ".join(parts), sym, p, [int(i) for i in perm], values, used, meta)


def encode(mol_or_xyz: Any, config: Geo2SeqConfig | None = None) -> str:
    """The Geo2Seq string ``"E₁ d₁ θ₁° φ₁° E₂ d₂ θ₂° φ₂° …"`` of a molecule (see :func:`tokenize_molecule`)."""
    return tokenize_molecule(mol_or_xyz, config).sequence


def decode(seq: str, config: Geo2SeqConfig | None = None) -> tuple[list[str], np.ndarray]:
    """Parse a Geo2Seq string back to ``(symbols, positions (N, 3))`` in the molecule frame (equal to the
    encoded molecule up to a rigid motion and rounding). Leading ``<s>``, trailing ``</s>`` and ``<pad>``
    are ignored; ``config`` must match the encoder's ``coords`` and ``angle_suffix``.

    Raises :class:`Geo2SeqDecodeError` (a ``ValueError``) naming the offending token position for: a token
    count not a multiple of 4, an unknown element, a non-numeric value, an angle without (or a distance with)
    the angle suffix, a negative distance, or ``<unk>``.
    """
    cfg = Geo2SeqConfig() if config is None else config
    if not isinstance(cfg, Geo2SeqConfig):
        raise TypeError(f"config must be a Geo2SeqConfig, got {type(cfg).__name__}")
    if not isinstance(seq, str):
        raise TypeError(f"seq must be a str, got {type(seq).__name__}")
    toks = seq.split()
    if toks and toks[0] == SPECIAL_TOKENS[1]:
        toks = toks[1:]
    if SPECIAL_TOKENS[2] in toks:
        toks = toks[: toks.index(SPECIAL_TOKENS[2])]
    toks = [t for t in toks if t != SPECIAL_TOKENS[0]]
    if not toks:
        raise Geo2SeqDecodeError("seq must hold at least one atom (4 tokens), got no tokens", 0)
    if len(toks) % 4:
        raise Geo2SeqDecodeError(
            f"seq must have 4 tokens per atom (element and 3 numbers), got {len(toks)} tokens", len(toks) - 1
        )
    suffix = cfg.angle_suffix
    symbols: list[str] = []
    rows = np.empty((len(toks) // 4, 3))
    for a in range(len(toks) // 4):
        el = toks[4 * a]
        if el not in _Z:
            raise Geo2SeqDecodeError(
                f"seq has an unknown element token {el!r} where an element is expected", 4 * a
            )
        symbols.append(el)
        for c in range(3):
            pos_i = 4 * a + 1 + c
            tok = toks[pos_i]
            angle = cfg.coords == "spherical" and c > 0
            if suffix and cfg.coords == "spherical":
                if angle != tok.endswith(suffix):
                    what = "an angle must end with" if angle else "a distance must not end with"
                    raise Geo2SeqDecodeError(f"seq token {tok!r}: {what} {suffix!r}", pos_i)
                if angle:
                    tok = tok[: -len(suffix)]
            try:
                v = float(tok)
            except ValueError:
                raise Geo2SeqDecodeError(f"seq token {toks[pos_i]!r} is not a number", pos_i) from None
            if not math.isfinite(v) or abs(v) > _MAX_ABS:
                raise Geo2SeqDecodeError(f"seq token {toks[pos_i]!r} is not a finite coordinate", pos_i)
            if cfg.coords == "spherical" and c == 0 and v < 0:
                raise Geo2SeqDecodeError(f"seq token {toks[pos_i]!r}: a distance must be >= 0", pos_i)
            rows[a, c] = v
    pos = from_spherical(rows) if cfg.coords == "spherical" else rows
    return symbols, pos


def decode_to_mol(seq: str, config: Geo2SeqConfig | None = None, perceive_bonds: bool = True) -> Any:
    """Decode to an RDKit ``Mol`` with one conformer; bonds from ``rdDetermineBonds.DetermineBonds``
    (connectivity only when bond orders fail, none when that fails too, as the reference ignores
    failures). Needs the ``chem`` extra."""
    Chem, rdDetermineBonds, RDLogger = _chem()
    symbols, pos = decode(seq, config)
    block = f"{len(symbols)}\n\n" + "".join(
        f"{s} {x:.6f} {y:.6f} {z:.6f}\n" for s, (x, y, z) in zip(symbols, pos)
    )
    mol = Chem.MolFromXYZBlock(block)
    if mol is None:
        raise Geo2SeqDecodeError("seq decodes to coordinates RDKit cannot read as an XYZ block")
    if perceive_bonds:
        RDLogger.DisableLog("rdApp.*")
        try:
            for fn in (
                lambda m: rdDetermineBonds.DetermineBonds(m, charge=0),
                rdDetermineBonds.DetermineConnectivity,
            ):
                trial = Chem.Mol(mol)
                try:
                    fn(trial)
                except Exception:  # RDKit's ValueError / RuntimeError on perception failure
                    continue
                mol = trial
                break
        finally:
            RDLogger.EnableLog("rdApp.*")
    return mol


# ------------------------------------------------------------------------------------------ tokenizer
class Geo2SeqTokenizer:
    """Word-level tokenizer of Geo2Seq strings (whitespace split, as the official ``SimpleTokenizer``).

    ``fit(sequences)`` builds the vocabulary: the 4 :data:`SPECIAL_TOKENS` (ids 0–3: pad, bos, eos, unk) then
    the training tokens sorted. ``encode`` gives ``[bos, …, eos]`` ids, ``batch`` a padded ``(B, L)`` id array
    and mask, ``decode`` the string back. ``save``/``load`` use JSON; ``to_transformers()`` exports a
    ``transformers.PreTrainedTokenizerFast`` (WordLevel) with the same ids (``hf`` extra).
    """

    def __init__(self, vocab: Mapping[str, int] | None = None) -> None:
        self.vocab_: dict[str, int] | None = None
        if vocab is not None:
            self._set_vocab(dict(vocab))

    def _set_vocab(self, vocab: dict[str, int]) -> None:
        for i, t in enumerate(SPECIAL_TOKENS):
            if vocab.get(t) != i:
                raise ValueError(f"vocab must map the special token {t!r} to id {i}, got {vocab.get(t)!r}")
        ids = sorted(vocab.values())
        if ids != list(range(len(vocab))):
            raise ValueError("vocab ids must be exactly 0..len(vocab)-1")
        self.vocab_ = vocab
        self.inverse_ = {i: t for t, i in vocab.items()}

    def _fitted(self) -> dict[str, int]:
        if self.vocab_ is None:
            raise ValueError("Geo2SeqTokenizer is not fitted: call fit(...) first")
        return self.vocab_

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    @property
    def unk_id(self) -> int:
        return 3

    def __len__(self) -> int:
        return len(self._fitted())

    def fit(self, sequences: Iterable[str]) -> Geo2SeqTokenizer:
        """Build the vocabulary from ``sequences`` (Geo2Seq strings). Returns ``self``."""
        if isinstance(sequences, str):
            raise TypeError("sequences must be an iterable of strings, got a single str (wrap it in a list)")
        seqs = list(sequences)
        if not seqs:
            raise ValueError("sequences must hold at least one string, got none")
        toks: set[str] = set()
        for i, s in enumerate(seqs):
            if not isinstance(s, str):
                raise TypeError(f"sequences[{i}] must be a str, got {type(s).__name__}")
            toks.update(s.split())
        toks -= set(SPECIAL_TOKENS)
        if not toks:
            raise ValueError("sequences must contain at least one token, got only whitespace")
        self._set_vocab({**{t: i for i, t in enumerate(SPECIAL_TOKENS)},
                         **{t: i + len(SPECIAL_TOKENS) for i, t in enumerate(sorted(toks))}})  # fmt: skip
        return self

    def encode(self, seq: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``seq`` (unknown tokens -> ``<unk>``), wrapped in bos/eos by default."""
        vocab = self._fitted()
        if not isinstance(seq, str):
            raise TypeError(f"seq must be a str, got {type(seq).__name__}")
        ids = [vocab.get(t, self.unk_id) for t in seq.split()]
        return [self.bos_id, *ids, self.eos_id] if add_special_tokens else ids

    def batch(self, sequences: Sequence[str], max_length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, mask)``, both int64 ``(B, L)``: bos/eos-wrapped ids right-padded with ``<pad>`` to the
        longest (or ``max_length``; a longer sequence raises ``ValueError``)."""
        self._fitted()
        if isinstance(sequences, str) or not len(sequences):
            raise ValueError("sequences must be a non-empty list of strings")
        enc = [self.encode(s) for s in sequences]
        longest = max(len(e) for e in enc)
        L = longest if max_length is None else max_length
        if longest > L:
            raise ValueError(
                f"max_length={L} is shorter than the longest sequence ({longest} tokens with bos/eos)"
            )
        ids = np.full((len(enc), L), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(enc), L), dtype=np.int64)
        for i, e in enumerate(enc):
            ids[i, : len(e)] = e
            mask[i, : len(e)] = 1
        return ids, mask

    def decode(self, ids: Iterable[int]) -> str:
        """The string of ``ids``: stops at the first eos, drops bos and pad, keeps ``<unk>`` visible."""
        self._fitted()
        if hasattr(ids, "detach"):
            ids = ids.detach().cpu().numpy()
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (np.ndarray, Iterable)):
            raise TypeError(f"ids must be a 1-D sequence of integer token ids, got {type(ids).__name__}")
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids))
        if arr.ndim != 1:
            raise ValueError(f"ids must be a 1-D sequence of token ids, got shape {arr.shape}")
        if arr.size and (arr.dtype.kind not in "iu"):
            raise TypeError(f"ids must be integer token ids, got dtype {arr.dtype}")
        out = []
        for k, i in enumerate(arr.tolist()):
            if i == self.eos_id:
                break
            if i in (self.bos_id, self.pad_id):
                continue
            if i not in self.inverse_:
                raise ValueError(f"ids[{k}] = {i} is not in the vocabulary of {len(self.inverse_)} tokens")
            out.append(self.inverse_[i])
        return " ".join(out)

    def save(self, path: str | Path) -> Path:
        """Write the vocabulary as JSON (``{"vocab": {token: id}}``) and return the path."""
        path = Path(path)
        path.write_text(json.dumps({"vocab": self._fitted()}, ensure_ascii=False, indent=0), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Geo2SeqTokenizer:
        """Read a tokenizer written by :meth:`save`."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("vocab"), dict):
            raise ValueError(
                f"path must be a JSON file written by Geo2SeqTokenizer.save, got keys {list(data)[:5]}"
            )
        return cls(data["vocab"])

    def to_transformers(self) -> Any:
        """A ``transformers.PreTrainedTokenizerFast`` with this vocabulary (``hf`` extra)."""
        from icml25.generative_models.geo2seq_hf import to_fast_tokenizer

        return to_fast_tokenizer(self)
