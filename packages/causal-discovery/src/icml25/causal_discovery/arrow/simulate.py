"""ARROW: An Accelerator for Time Series Causal Discovery with Time Weaving — ICML 2025, P54: synthetic lagged SVAR data
and the metrics of the reproduction.

Graphs are bool ``[d, d, L]`` arrays indexed ``[effect, cause, lag]`` (``x_cause(t-lag) -> x_effect(t)``).
"""

from __future__ import annotations

import numpy as np


def _companion_radius(A: np.ndarray) -> float:
    """Spectral radius of the VAR with lag matrices ``A [L+1, d, d]`` (``A[τ][i, j]``, ``A[0]`` unused)."""
    L, d = A.shape[0] - 1, A.shape[1]
    top = np.concatenate(list(A[1:]), axis=1)  # [d, d*L]
    comp = np.zeros((d * L, d * L))
    comp[:d] = top
    comp[d:, :-d] = np.eye(d * (L - 1))
    return float(np.abs(np.linalg.eigvals(comp)).max())


LINKS = {
    "linear": lambda v: v,
    "tanh": np.tanh,
    "sin": lambda v: np.sin(1.5 * v),  # non-monotone
}


def simulate_svar(
    d: int = 20,
    T: int = 2000,
    n_parents: int = 2,
    lags: tuple[int, int] = (1, 5),
    coef: tuple[float, float] = (0.3, 0.6),
    self_coef: float = 0.3,
    link: str = "linear",
    noise_sd: float = 1.0,
    noise: str = "gaussian",
    burn_in: int = 200,
    rng: np.random.Generator | int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The reproduction's SVAR: self-link ``self_coef`` at lag 1, ``n_parents`` parents per node at random lags.

    ``x_i(t) = self_coef·x_i(t-1) + Σ_j c_ij·f(x_j(t-τ_ij)) + ε``, ``|c_ij| ~ U(coef)`` with a random sign,
    ``τ_ij ~ U{lags}``, ``f`` = identity (``link="linear"``), ``tanh``, or ``sin(1.5·x)`` (``link="sin"``:
    non-monotone, it falls for ``|x| > π/3``, about a third of the samples at the series' sd ≈ 1.2, so the
    cause's and the effect's up/down trends agree only weakly). ``noise``: ``"gaussian"`` or ``"laplace"``
    (heavier tails), sd ``noise_sd`` either way. Linear draws whose VAR is not stable (companion spectral
    radius ≥ 0.99) are redrawn.

    Returns:
        ``X [T, d]`` and the true graph bool ``[d, d, lags[1]+1]``.
    """
    if link not in LINKS:
        raise ValueError(f"link must be one of {sorted(LINKS)}, got {link!r}")
    if noise not in ("gaussian", "laplace"):
        raise ValueError(f"noise must be 'gaussian' or 'laplace', got {noise!r}")
    if not 0 <= n_parents < d:
        raise ValueError(f"n_parents must be in [0, d-1] = [0, {d - 1}], got {n_parents}")
    rng = np.random.default_rng(rng)
    L = lags[1]
    for _ in range(100):
        A = np.zeros((L + 1, d, d))
        for i in range(d):
            A[1, i, i] = self_coef
            for j in rng.choice([v for v in range(d) if v != i], size=n_parents, replace=False):
                tau = int(rng.integers(lags[0], lags[1] + 1))
                A[tau, i, j] = rng.uniform(*coef) * rng.choice([-1.0, 1.0])
        if link != "linear" or _companion_radius(A) < 0.99:
            break
    graph = (A != 0).transpose(1, 2, 0)  # [effect, cause, lag]
    f = LINKS[link]
    n = T + burn_in
    X = np.zeros((n, d))
    if noise == "gaussian":
        eps = rng.normal(scale=noise_sd, size=(n, d))
    else:
        eps = rng.laplace(scale=noise_sd / np.sqrt(2.0), size=(n, d))
    for t in range(n):
        x = eps[t].copy()
        for tau in range(1, min(L, t) + 1):
            cross = A[tau] - np.diag(np.diag(A[tau]))
            x += np.diag(A[tau]) * X[t - tau] + cross @ f(X[t - tau])
        X[t] = x
    return X[burn_in:], graph


def simulate_repository_var(
    d: int = 10,
    T: int = 1000,
    lags: tuple[int, int] = (1, 20),
    noise_sd: float = 0.1,
    radius: float = 0.97,
    burn_in: int = 100,
    rng: np.random.Generator | int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The official repository's linear benchmark (wide-window protocol), re-implemented.

    Every node has a self-link plus one other parent, all coefficients equal and positive, scaled by 0.95
    until the lag-collapsed coefficient matrix has spectral radius ``<= radius``; every link (self-links
    included) gets its own lag ``~ U{lags}``; Gaussian noise with sd ``noise_sd``.

    Returns:
        ``X [T, d]`` and the true graph bool ``[d, d, lags[1]+1]``.
    """
    rng = np.random.default_rng(rng)
    beta = np.eye(d)
    for i in range(d):
        j = int(rng.choice([v for v in range(d) if v != i]))
        beta[i, j] = 1.0
    while np.abs(np.linalg.eigvals(beta)).max() > radius:
        beta = 0.95 * beta
    lag = rng.integers(lags[0], lags[1] + 1, size=(d, d))
    L = lags[1]
    graph = np.zeros((d, d, L + 1), dtype=bool)
    A = np.zeros((L + 1, d, d))
    for i, j in zip(*np.nonzero(beta)):
        graph[i, j, lag[i, j]] = True
        A[lag[i, j], i, j] = beta[i, j]
    n = T + burn_in
    X = np.zeros((n, d))
    X[:L] = rng.normal(scale=noise_sd, size=(L, d))
    eps = rng.normal(scale=noise_sd, size=(n, d))
    back = np.arange(1, L + 1)
    for t in range(L, n):
        X[t] = eps[t] + np.einsum("lij,lj->i", A[1:], X[t - back])  # X[t-1], …, X[t-L]
    return X[burn_in:], graph


def _pad(graph: np.ndarray, L: int) -> np.ndarray:
    out = np.zeros((*graph.shape[:2], L), dtype=bool)
    n = min(L, graph.shape[2])
    out[:, :, :n] = graph[:, :, :n]
    return out


def lagged_f1(true: np.ndarray, pred: np.ndarray) -> float:
    """F1 over lagged edges ``(effect, cause, lag ≥ 1)``, self-links included."""
    L = max(true.shape[2], pred.shape[2])
    t, p = _pad(true, L)[:, :, 1:], _pad(pred, L)[:, :, 1:]
    tp = float((t & p).sum())
    denom = float(t.sum() + p.sum())
    return 1.0 if denom == 0 else 2 * tp / denom


def summary_rates(true: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """Summary-graph TPR, FPR and AUROC of a binary prediction (diagonal included, as in the paper)."""
    t, p = true[:, :, 1:].any(-1), pred[:, :, 1:].any(-1)
    tpr = float((t & p).sum() / max(1, t.sum()))
    fpr = float((~t & p).sum() / max(1, (~t).sum()))
    return {"tpr": tpr, "fpr": fpr, "auroc": 0.5 * (1 + tpr - fpr)}


def cross_edges(true: np.ndarray) -> list[tuple[int, int, int]]:
    """True cross edges ``(effect, cause, lag)`` (self-links excluded)."""
    return [(int(i), int(j), int(t)) for i, j, t in zip(*np.nonzero(true)) if i != j and t >= 1]


def tau_accuracy(true: np.ndarray, tau_star: np.ndarray) -> float:
    """Fraction of true cross edges whose XOR lag ``τ*`` equals the true lag."""
    edges = cross_edges(true)
    return float(np.mean([tau_star[i, j] == t for i, j, t in edges])) if edges else 1.0


def pruning_recall(true: np.ndarray, links: dict[int, list[tuple[int, int]]]) -> float:
    """Fraction of true cross edges ``(i, j, τ)`` whose link ``(j, τ)`` is tested for effect ``i``."""
    edges = cross_edges(true)
    tested = {(i, j, t) for i, pairs in links.items() for j, t in pairs}
    return float(np.mean([e in tested for e in edges])) if edges else 1.0
