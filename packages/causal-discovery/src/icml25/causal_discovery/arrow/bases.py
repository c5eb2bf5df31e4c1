"""ARROW: An Accelerator for Time Series Causal Discovery with Time Weaving — ICML 2025, P54: the base causal discovery
algorithms that ARROW runs on the pruned candidate links (step 4).

Every base follows one protocol, so users can plug in their own algorithm:

``base(X, links, tau_max) -> graph``

* ``X``: float ``[T, d]`` data (raw values, or the patch symbols when ``ARROW(input="codes")``);
* ``links``: ``{effect: [(cause, lag), ...]}`` — the lagged links (``lag >= 1``) to test for each effect,
  or ``None`` for the unrestricted base (every cause at every lag ``1 … tau_max``);
* ``tau_max``: largest lag of the output;
* ``graph``: bool/0-1 array ``[d, d, tau_max+1]`` indexed ``[effect, cause, lag]`` (lag 0 = same time).

Built-ins: tigramite PCMCI with ParCorr (extra ``[tigramite]``), lingam VARLiNGAM (extra ``[lingam]``) and a
linear Granger t-test (numpy/scipy only, a cheap stand-in for neural Granger).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Links = dict[int, list[tuple[int, int]]]
BaseFn = Callable[[np.ndarray, "Links | None", int], np.ndarray]


def all_links(d: int, tau_min: int, tau_max: int) -> Links:
    """Every cause at every lag in ``[tau_min, tau_max]`` for each of the ``d`` effects."""
    return {i: [(j, tau) for j in range(d) for tau in range(tau_min, tau_max + 1)] for i in range(d)}


def links_to_mask(links: Links, d: int, tau_max: int) -> np.ndarray:
    """bool ``[d, d, tau_max+1]`` mask (``[effect, cause, lag]``) of the links in ``links``."""
    mask = np.zeros((d, d, tau_max + 1), dtype=bool)
    for i, pairs in links.items():
        for j, tau in pairs:
            mask[i, j, tau] = True
    return mask


def pcmci_base(
    X: np.ndarray,
    links: Links | None,
    tau_max: int,
    *,
    pc_alpha: float | None = 0.05,
    alpha_level: float = 0.01,
    fdr_method: str = "none",
    verbosity: int = 0,
) -> np.ndarray:
    """tigramite PCMCI with partial correlation (ParCorr), restricted to ``links`` via ``link_assumptions``.

    A link is an edge when PCMCI's graph marks it ``-->`` (MCI p-value ``<= alpha_level``, after the
    optional ``fdr_method`` correction). The restricted run uses ``tau_min``/``tau_max`` = the smallest and
    largest requested lags, so its conditioning sets come only from the requested links.

    Defaults follow our reproduction (``pc_alpha=0.05``, ``alpha_level=0.01``, no FDR); the
    official code uses ``pc_alpha=None`` and FDR-BH at 0.05 (``fdr_method="fdr_bh", alpha_level=0.05``).
    """
    try:
        from tigramite.data_processing import DataFrame
        from tigramite.independence_tests.parcorr import ParCorr
        from tigramite.pcmci import PCMCI
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the 'pcmci' base needs tigramite: pip install 'icml25-causal-discovery[tigramite]'"
        ) from err

    d = X.shape[1]
    out = np.zeros((d, d, tau_max + 1), dtype=bool)
    if links is None:
        tau_min, hi, assumptions = 1, tau_max, None
    else:
        lags = [tau for pairs in links.values() for _, tau in pairs]
        if not lags:
            return out
        tau_min, hi = min(lags), max(lags)
        # tigramite's convention: {target: {(source, -lag): '-?>'}}; an absent link is assumed absent.
        assumptions = {i: {(j, -tau): "-?>" for j, tau in links.get(i, [])} for i in range(d)}
    pcmci = PCMCI(dataframe=DataFrame(X), cond_ind_test=ParCorr(), verbosity=verbosity)
    res = pcmci.run_pcmci(
        link_assumptions=assumptions,
        tau_min=tau_min,
        tau_max=hi,
        pc_alpha=pc_alpha,
        alpha_level=alpha_level,
        fdr_method=fdr_method,
    )
    directed = res["graph"] == "-->"  # [source, target, lag]
    directed[:, :, 0] = False  # lagged links only (ARROW never proposes lag 0)
    out[:, :, : hi + 1] = directed.transpose(1, 0, 2)
    return out


def varlingam_base(
    X: np.ndarray,
    links: Links | None,
    tau_max: int,
    *,
    threshold: float = 0.1,
    prune: bool = True,
    random_state: int | None = 0,
) -> np.ndarray:
    """lingam VARLiNGAM with ``lags`` = the largest requested lag; edge where ``|B_τ[i, j]| > threshold``.

    VARLiNGAM estimates every coefficient at once, so the restriction shortens the lag window (its cost)
    and ARROW reads the coefficients only at the kept (cause, lag) pairs. The official code keeps only
    positive coefficients ``> 0.1``; we use the absolute value so that negative links count.
    """
    try:
        from lingam import VARLiNGAM
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the 'varlingam' base needs lingam: pip install 'icml25-causal-discovery[lingam]'"
        ) from err

    d = X.shape[1]
    out = np.zeros((d, d, tau_max + 1), dtype=bool)
    lags = tau_max if links is None else max((tau for pairs in links.values() for _, tau in pairs), default=0)
    if lags < 1:
        return out
    model = VARLiNGAM(lags=lags, criterion=None, prune=prune, random_state=random_state)
    model.fit(X)
    B = np.asarray(model.adjacency_matrices_)  # [lags+1, effect, cause]
    out[:, :, 1 : lags + 1] = np.abs(B[1:]).transpose(1, 2, 0) > threshold
    return out


def granger_base(X: np.ndarray, links: Links | None, tau_max: int, *, alpha: float = 0.01) -> np.ndarray:
    """Linear Granger test: per effect, OLS on its candidate lagged causes; edge if the t-test p < ``alpha``.

    Each effect ``x_i(t)`` is regressed (with intercept) on ``x_j(t-τ)`` for its ``(j, τ)`` in ``links``
    (all causes and lags ``1 … tau_max`` when ``links`` is None); the two-sided t-test of a coefficient is
    the Granger F-test of that single lagged term.
    """
    from scipy import stats

    T, d = X.shape
    out = np.zeros((d, d, tau_max + 1), dtype=bool)
    links = all_links(d, 1, tau_max) if links is None else links
    for i in range(d):
        cand = sorted(set(links.get(i, [])))
        if not cand:
            continue
        start = max(tau for _, tau in cand)
        n = T - start
        Z = np.column_stack([np.ones(n)] + [X[start - tau : T - tau, j] for j, tau in cand])
        y = X[start:, i]
        if n <= Z.shape[1]:
            raise ValueError(f"granger base: {n} samples cannot fit {Z.shape[1]} coefficients for effect {i}")
        coef, *_ = np.linalg.lstsq(Z, y, rcond=None)
        resid = y - Z @ coef
        dof = n - Z.shape[1]
        sigma2 = resid @ resid / dof
        cov = sigma2 * np.linalg.pinv(Z.T @ Z)
        t_stat = coef[1:] / np.sqrt(np.maximum(np.diag(cov)[1:], 1e-300))
        p = 2 * stats.t.sf(np.abs(t_stat), dof)
        for (j, tau), pv in zip(cand, p):
            out[i, j, tau] = pv < alpha
    return out


BASES: dict[str, BaseFn] = {"pcmci": pcmci_base, "varlingam": varlingam_base, "granger": granger_base}
