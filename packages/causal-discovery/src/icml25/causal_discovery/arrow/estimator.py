"""ARROW: An Accelerator for Time Series Causal Discovery with Time Weaving — ICML 2025, P54: the ``ARROW`` estimator, time
weaving -> XOR lags -> global pruning -> restricted base run.

The base algorithm sees only the kept (cause, lag) pairs of each effect, and its lag window shrinks to
``[min lag, max lag]`` of those pairs; that is where the speedup comes from. Official behaviour, the
defaults here: an effect with no kept cause is given every variable at every lag of that window
(``fallback="all"``), ``pad=0`` (only ``τ*``), no extra self-links (``self_lag1=False``), and one edge
decision per pair, read at its XOR lag ``(j, τ*_ij)`` (``readout="pair"``). Our options: each variable's own
lag-1 link always tested (``self_lag1=True``, the autoregressive term that a 2-bit trend code often misses),
every tested link an edge (``readout="all"``), ``theta="null"``, ``per_target_cap``, ``input="raw"`` by
default (the official code feeds the symbols, ``input="codes"``), and ``rescue="dependence"``: a binned mutual-information screen of the pairs the XOR step drops, which
restores the links of non-monotone link functions (whose trend codes agree with their cause only at
chance level) at the cost of the screen and of the extra base tests.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator

from icml25.causal_discovery.arrow.bases import BASES, Links, links_to_mask
from icml25.causal_discovery.arrow.interop import to_tigramite_graph
from icml25.causal_discovery.arrow.lags import (
    check_lag_max,
    null_threshold,
    prune_candidates,
    rescue_candidates,
    xor_lag_scores,
)
from icml25.causal_discovery.arrow.weaving import check_series, constant_columns, time_weave, warn_constant
from icml25.kernels.checks import check_choice, check_fitted, check_float, check_int


def default_lag_max(T: int) -> int:
    """Official default lag bound ``L = ⌊0.1·T⌋`` (candidate lags ``1 … L-1``)."""
    return max(2, int(0.1 * T))


class ARROW(BaseEstimator):
    """ARROW accelerator in front of a time-series causal discovery base (scikit-learn conventions).

    Args:
        base: ``"pcmci"`` (tigramite PCMCI + ParCorr), ``"varlingam"`` (lingam), ``"granger"`` (linear
            Granger t-test), or a callable ``base(X, links, tau_max) -> [d, d, tau_max+1]`` (see
            :mod:`icml25.causal_discovery.arrow.bases`).
        lag_max: ``L``; candidate lags ``1 … L-1``. ``None``: ``⌊0.1·T⌋`` (official).
        theta: pruning threshold (``s_ij > theta``); ``"null"`` for the circular-shift null threshold.
        k: global cap ``⌊k·d²/2⌋`` on kept pairs (official ``k = 0.5``).
        per_target_cap: optional cap on kept causes per effect.
        include_self: rank self pairs too (official).
        pad: also test lags ``τ* ± 1 … ± pad`` of every kept pair (official 0).
        self_lag1: always test each variable's own lag-1 link (ours; official ``False``).
        fallback: ``"all"`` gives effects without kept causes every variable at every lag of the window
            (official PCMCI wrapper); ``"none"`` tests nothing for them.
        readout: ``"pair"`` (official): pair ``(i, j)`` is an edge, at lag ``τ*_ij`` only, when the base
            finds the link ``(j, τ*_ij)`` (a pair whose ``τ*`` was not tested is no edge); ``"all"`` (ours):
            every tested link that the base finds is an edge, at any lag.
        input: ``"raw"`` values or the patch ``"codes"`` (symbols, as the official code) for the base.
        rescue: ``"none"`` (official: only the XOR-kept pairs) or ``"dependence"``: also keep the pairs that
            the XOR step dropped but whose lagged binned mutual information (rank bins, raw values) is
            significant, each at its own best lag (:func:`~icml25.causal_discovery.arrow.rescue_candidates`).
            Use it when links may be non-monotone (``sin``, quadratic): the trend codes miss them.
        rescue_bins: equal-frequency bins per series of the screen (``(bins-1)²`` degrees of freedom).
        rescue_alpha: family-wise level of the screen (Bonferroni over screened pairs × lags).
        null_shifts, null_quantile: surrogate count and quantile for ``theta="null"``.
        nan_policy: ``"raise"`` or ``"interpolate"``.
        constant_policy: ``"raise"`` (ValueError) or ``"exclude"`` (warn and drop as cause and effect).
        base_kwargs: keyword arguments of the built-in base (e.g. ``{"alpha_level": 0.05}``).
        random_state: seed of the null surrogates.
        backend: kernel backend of the XOR counting (``None``: automatic).
        device: torch device of the XOR counting (``"cuda"`` runs the Triton kernel); ``None``: CPU.

    Attributes (after ``fit``):
        graph_: bool ``[d, d, L]``, ``graph_[i, j, τ]``: edge ``x_j(t-τ) -> x_i(t)``.
        summary_: bool ``[d, d]`` (``graph_.any(-1)``).
        lags_: int ``[d, d]``, ``τ*`` of the kept pairs, 0 for pruned pairs.
        tau_star_, scores_: ``[d, d]`` best lag and score of every pair; ``same_``, ``opp_``: ``[d, d, L]``.
        candidates_: kept ``[(effect, cause, lag), ...]`` (the XOR-kept pairs, then the rescued ones);
            rescued_: the rescued pairs (empty with ``rescue="none"``); links_: the links given to the base.
        theta_: the threshold used; excluded_: excluded constant series.
        timings_: seconds of ``encode``, ``xor``, ``prune``, ``base`` and ``total`` (and ``rescue``, the
            screen, when ``rescue="dependence"``).
        n_features_in_: ``d``; feature_names_in_: the column names when ``X`` is a DataFrame with string
            column names (scikit-learn's convention; absent for arrays). :meth:`to_networkx` names its
            nodes by them.
    """

    def __init__(
        self,
        base: str | Callable[..., np.ndarray] = "pcmci",
        lag_max: int | None = None,
        theta: float | str = 0.33,
        k: float = 0.5,
        per_target_cap: int | None = None,
        include_self: bool = True,
        pad: int = 0,
        self_lag1: bool = False,
        fallback: str = "all",
        readout: str = "pair",
        input: str = "raw",
        rescue: str = "none",
        rescue_bins: int = 6,
        rescue_alpha: float = 0.05,
        null_shifts: int = 20,
        null_quantile: float = 0.95,
        nan_policy: str = "raise",
        constant_policy: str = "raise",
        base_kwargs: dict[str, Any] | None = None,
        random_state: int | None = None,
        backend: str | None = None,
        device: str | None = None,
    ) -> None:
        self.base = base
        self.lag_max = lag_max
        self.theta = theta
        self.k = k
        self.per_target_cap = per_target_cap
        self.include_self = include_self
        self.pad = pad
        self.self_lag1 = self_lag1
        self.fallback = fallback
        self.readout = readout
        self.input = input
        self.rescue = rescue
        self.rescue_bins = rescue_bins
        self.rescue_alpha = rescue_alpha
        self.null_shifts = null_shifts
        self.null_quantile = null_quantile
        self.nan_policy = nan_policy
        self.constant_policy = constant_policy
        self.base_kwargs = base_kwargs
        self.random_state = random_state
        self.backend = backend
        self.device = device

    # ----------------------------------------------------------------------------------- validation
    def _base_fn(self) -> Callable[[np.ndarray, Links | None, int], np.ndarray]:
        kwargs = dict(self.base_kwargs or {})
        if callable(self.base):
            fn = self.base
        elif isinstance(self.base, str) and self.base in BASES:
            fn = BASES[self.base]
        else:
            raise ValueError(f"base must be one of {sorted(BASES)} or a callable, got {self.base!r}")
        return lambda X, links, tau_max: fn(X, links, tau_max, **kwargs)

    def _check_params(self) -> None:
        check_choice(self.input, "input", ("raw", "codes"))
        check_choice(self.rescue, "rescue", ("none", "dependence"))
        check_int(self.rescue_bins, "rescue_bins", low=2)
        check_float(self.rescue_alpha, "rescue_alpha", low=0.0, high=1.0, low_open=True, high_open=True)
        check_choice(self.fallback, "fallback", ("all", "none"))
        check_choice(self.readout, "readout", ("pair", "all"))
        check_choice(self.constant_policy, "constant_policy", ("raise", "exclude"))
        check_int(self.pad, "pad", low=0)
        if not isinstance(self.self_lag1, (bool, np.bool_)):
            raise TypeError(
                f"self_lag1 must be a bool, got {type(self.self_lag1).__name__} {self.self_lag1!r}"
            )
        if isinstance(self.theta, str):
            check_choice(self.theta, "theta", ("null",))
        elif isinstance(self.theta, bool) or not isinstance(self.theta, (int, float, np.floating)):
            raise TypeError(f"theta must be a float or 'null', got {type(self.theta).__name__}")
        elif math.isnan(self.theta):
            raise ValueError(f"theta must be a float threshold (±inf allowed) or 'null', got {self.theta!r}")

    def _prepare(self, X: object) -> tuple[np.ndarray, list[int]]:
        feature_names(X)  # a DataFrame with mixed str / non-str column names is rejected before any work
        arr = check_series(X, nan_policy=self.nan_policy)
        const = constant_columns(arr)
        if const and self.constant_policy == "raise":
            raise ValueError(
                f"X has constant series (columns {const}): their trend code is all zeros and they cannot be "
                "causes; remove them or pass constant_policy='exclude'"
            )
        warn_constant(const)
        return arr, const

    # ----------------------------------------------------------------------------------------- fit
    def fit(self, X: object, y: None = None) -> ARROW:
        """Encode ``X [T, d]``, score and prune all (effect, cause) pairs, run the base on the kept links."""
        t_start = time.perf_counter()
        self._check_params()
        base = self._base_fn()
        arr, const = self._prepare(X)
        T, d = arr.shape
        L = default_lag_max(T) if self.lag_max is None else self.lag_max
        L = check_lag_max(L, T)
        if not isinstance(self.theta, str) and math.isfinite(self.theta) and (T < 1000 or L > T / 10):
            warnings.warn(
                f"the fixed theta={self.theta} is close to (or below) the null score level for T={T}, "
                f"lag_max={L} (T < 1000 or lag_max > T/10); consider theta='null'",
                UserWarning,
                stacklevel=2,
            )

        t0 = time.perf_counter()
        bits, symbols = time_weave(arr)
        t1 = time.perf_counter()
        sc = xor_lag_scores(bits, L, backend=self.backend, device=self.device)
        t2 = time.perf_counter()
        if self.theta == "null":
            theta = null_threshold(
                bits,
                L,
                self.null_shifts,
                self.null_quantile,
                rng=self.random_state,
                backend=self.backend,
                device=self.device,
            )
        else:
            theta = float(self.theta)
        cands = prune_candidates(
            sc.score, sc.tau_star, theta, self.k, self.per_target_cap, self.include_self, exclude=const
        )
        t_rescue = time.perf_counter()
        rescued: list[tuple[int, int, int]] = []
        if self.rescue == "dependence":
            rescued, _ = rescue_candidates(
                arr, cands, L, self.rescue_bins, self.rescue_alpha, self.k, self.include_self, const
            )
            cands = cands + rescued
        t_rescue = time.perf_counter() - t_rescue
        links = self._links(cands, d, L, const)
        t3 = time.perf_counter()

        data = arr if self.input == "raw" else symbols.astype(np.float64)
        tau_max = L - 1
        raw = np.asarray(base(data, links, tau_max))
        if raw.shape != (d, d, tau_max + 1):
            raise ValueError(
                f"base must return an array [d, d, tau_max+1] = {(d, d, tau_max + 1)}, got {raw.shape}"
            )
        t4 = time.perf_counter()

        self.n_features_in_ = d
        names = feature_names(X)
        if names is None:  # scikit-learn convention: a refit on unnamed data forgets earlier names
            self.__dict__.pop("feature_names_in_", None)
        else:
            self.feature_names_in_ = names
        self.lag_max_ = L
        self.theta_ = theta
        self.excluded_ = const
        self.tau_star_, self.scores_, self.same_, self.opp_ = sc
        self.candidates_ = cands
        self.rescued_ = rescued
        self.links_ = links
        tested = links_to_mask(links, d, tau_max)  # only tested links count
        if self.readout == "pair":  # official: one decision per pair, at its XOR lag τ*_ij
            tested &= np.arange(tau_max + 1)[None, None, :] == sc.tau_star[:, :, None]
        self.graph_ = raw.astype(bool) & tested
        self.summary_ = self.graph_.any(-1)
        self.lags_ = np.zeros((d, d), dtype=np.int64)
        for i, j, tau in cands:
            self.lags_[i, j] = tau
        self.timings_ = {
            "encode": t1 - t0,
            "xor": t2 - t1,
            "prune": t3 - t2,
            "base": t4 - t3,
            "total": time.perf_counter() - t_start,
        }
        if self.rescue != "none":
            self.timings_["rescue"] = t_rescue  # also counted in "prune"
        return self

    def _links(self, cands: list[tuple[int, int, int]], d: int, L: int, const: list[int]) -> Links:
        """Links given to the base: kept pairs (± pad), own lag 1, and the fallback for uncovered effects."""
        sets: dict[int, set[tuple[int, int]]] = {i: set() for i in range(d)}
        for i, j, tau in cands:
            for lag in range(max(1, tau - self.pad), min(L - 1, tau + self.pad) + 1):
                sets[i].add((j, lag))
        covered = {i for i in range(d) if sets[i]}
        if self.self_lag1:
            for i in range(d):
                if i not in const:
                    sets[i].add((i, 1))
        lags = [lag for s in sets.values() for _, lag in s]
        if self.fallback == "all" and lags:
            lo, hi = min(lags), max(lags)
            usable = [j for j in range(d) if j not in const]
            for i in usable:
                if i not in covered:  # official: an effect without kept causes gets every variable, every lag
                    sets[i] |= {(j, lag) for j in usable for lag in range(lo, hi + 1)}
        return {i: sorted(s) for i, s in sets.items()}

    # ------------------------------------------------------------------------------ comparisons
    def run_base_only(self, X: object, tau_max: int | None = None) -> tuple[np.ndarray, float]:
        """Run the unrestricted base (every cause, lags ``1 … tau_max``) on the same input as ``fit``.

        Args:
            X: ``[T, d]`` series.
            tau_max: lag window; ``None``: ``L - 1`` with ``L`` as in ``fit``.

        Returns:
            ``(graph, seconds)`` with ``graph`` bool ``[d, d, tau_max+1]`` (``[effect, cause, lag]``).
        """
        self._check_params()
        base = self._base_fn()
        arr, _ = self._prepare(X)
        T = arr.shape[0]
        if tau_max is None:
            tau_max = check_lag_max(default_lag_max(T) if self.lag_max is None else self.lag_max, T) - 1
        if (
            isinstance(tau_max, bool)
            or not isinstance(tau_max, (int, np.integer))
            or not 1 <= tau_max < T - 3
        ):
            raise ValueError(f"tau_max must be an int in [1, T-4] = [1, {T - 4}], got {tau_max!r}")
        data = arr if self.input == "raw" else time_weave(arr)[1].astype(np.float64)
        t0 = time.perf_counter()
        graph = np.asarray(base(data, None, int(tau_max))).astype(bool)
        graph[:, :, 0] = False
        return graph, time.perf_counter() - t0

    def _check_fitted(self) -> None:
        check_fitted(self, "graph_")

    def to_networkx(self, names: list[str] | None = None) -> Any:
        """The lagged graph as a networkx ``DiGraph`` (see :func:`to_networkx`), with XOR scores.

        Nodes are ``names``, else the DataFrame column names seen by ``fit`` (``feature_names_in_``), else
        the column indices ``0 … d-1``.
        """
        self._check_fitted()
        if names is None and hasattr(self, "feature_names_in_"):
            names = self.feature_names_in_.tolist()
        return to_networkx(self.graph_, names=names, scores=self.scores_)

    def to_tigramite_graph(self, tau_max: int | None = None) -> np.ndarray:
        """``graph_`` in tigramite's string layout ``[source, target, lag]`` (see
        :func:`~icml25.causal_discovery.arrow.to_tigramite_graph`); e.g.
        ``tigramite.plotting.plot_time_series_graph(model.to_tigramite_graph(), var_names=model.feature_names_in_)``.
        """
        self._check_fitted()
        return to_tigramite_graph(self.graph_, tau_max=tau_max)


def feature_names(X: object) -> np.ndarray | None:
    """Column names of a DataFrame-like ``X`` (anything with ``.columns``), scikit-learn's convention.

    Returns an object array of the names when they are all strings, ``None`` when ``X`` has no columns or
    none of its names is a string (e.g. pandas' default integer columns). pandas is never imported.

    Raises:
        TypeError: the column names mix strings and non-strings.
    """
    columns = getattr(X, "columns", None)
    if columns is None:
        return None
    names = np.asarray(list(columns), dtype=object)
    is_str = np.array([isinstance(n, str) for n in names], dtype=bool)
    if names.size and is_str.all():
        return names
    if is_str.any():
        kinds = sorted({type(n).__name__ for n in names})
        raise TypeError(
            f"X's column names must be all strings (or none), got a mix of types {kinds}; "
            "convert them, e.g. X.columns = X.columns.astype(str)"
        )
    return None


def to_networkx(graph: np.ndarray, names: list[str] | None = None, scores: np.ndarray | None = None) -> Any:
    """Export a lagged graph ``[d, d, L]`` (``graph[i, j, τ]``: ``x_j(t-τ) -> x_i(t)``) to ``networkx.DiGraph``.

    Edge ``cause -> effect`` carries ``lags`` (sorted tuple of its lags), ``lag`` (the smallest) and, when
    ``scores`` is given, ``score`` (the XOR score of the pair). Every variable is a node, linked or not.
    """
    import networkx as nx

    graph = np.asarray(graph)
    if graph.ndim != 3 or graph.shape[0] != graph.shape[1]:
        raise ValueError(f"graph must be a [d, d, L] array, got shape {graph.shape}")
    d = graph.shape[0]
    names = list(range(d)) if names is None else list(names)
    if len(names) != d:
        raise ValueError(f"names must have {d} entries, got {len(names)}")
    G = nx.DiGraph()
    G.add_nodes_from(names)
    for i, j in zip(*np.nonzero(graph.any(-1))):
        lags = tuple(int(t) for t in np.nonzero(graph[i, j])[0])
        attrs: dict[str, Any] = {"lags": lags, "lag": lags[0]}
        if scores is not None and not math.isnan(float(scores[i, j])):
            attrs["score"] = float(scores[i, j])
        G.add_edge(names[j], names[i], **attrs)
    return G
