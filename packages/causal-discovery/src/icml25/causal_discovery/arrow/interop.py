"""ARROW: An Accelerator for Time Series Causal Discovery with Time Weaving — ICML 2025, P54: conversion of lagged
graphs between ARROW's boolean layout and tigramite's string layout.

ARROW (and every base of :mod:`icml25.causal_discovery.arrow.bases`) returns a boolean array
``graph[i, j, τ]`` indexed ``[effect, cause, lag]``: ``x_j(t-τ) -> x_i(t)``. tigramite (``PCMCI.run_pcmci``,
``toymodels.structural_causal_processes.links_to_graph``, ``tigramite.plotting.plot_graph``) uses a string
array ``graph[i, j, τ]`` indexed ``[source, target, lag]`` of shape ``[N, N, tau_max + 1]``:

* ``graph[i, j, τ] = "-->"`` for ``τ > 0``: ``x_i(t-τ) -> x_j(t)``; ``""``: no link;
* at lag 0 the array is symmetric: ``graph[i, j, 0] = "-->"`` requires ``graph[j, i, 0] = "<--"``;
* other marks are edges whose orientation is not (fully) determined: ``"o-o"`` (unoriented), ``"x-x"``
  (conflicting orientations, PCMCI+), and the PAG marks of LPCMCI (``"o->"``, ``"<->"``, ...). The left
  character is the mark at ``i``, the right one the mark at ``j``.

:func:`to_tigramite_graph` writes only ``"-->"``/``"<--"``; :func:`from_tigramite_graph` reads any of these
marks, and its ``ambiguous`` argument says what to do with the undetermined ones.
"""

from __future__ import annotations

import numpy as np

_HEAD = {"<", ">"}
_LEFT = ("<", "o", "x", "-")  # the mark at the source i
_RIGHT = (">", "o", "x", "-")  # the mark at the target j
MARKS = frozenset(f"{a}-{b}" for a in _LEFT for b in _RIGHT) - {"---"}
DIRECTED = frozenset({"-->", "<--"})
_MIRROR = {"<": ">", ">": "<"}


def reverse_mark(mark: str) -> str:
    """The same edge read from the other end: ``"-->"`` <-> ``"<--"``, ``"o->"`` <-> ``"<-o"``, ``"o-o"``."""
    if mark == "":
        return ""
    return _MIRROR.get(mark[2], mark[2]) + mark[1] + _MIRROR.get(mark[0], mark[0])


def _allows(mark: str) -> tuple[bool, bool]:
    """``(i -> j possible, j -> i possible)`` for the mark at ``[i, j]``: ``a -> b`` needs no arrowhead at
    the cause ``a`` and no tail at the effect ``b``."""
    left, right = mark[0], mark[2]
    return (left not in _HEAD and right != "-", right not in _HEAD and left != "-")


def _check_bool_graph(graph: object, name: str) -> np.ndarray:
    arr = np.asarray(graph)
    if arr.dtype != bool:
        if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
            raise TypeError(f"{name} must be a bool (or 0/1) array [d, d, L], got dtype {arr.dtype}")
        if arr.dtype.kind in "fc" and np.isnan(arr).any():
            raise ValueError(f"{name} must hold only 0/1 (or bool) entries, got NaN")
        bad = ~np.isin(arr, (0, 1))
        if bad.any():
            raise ValueError(
                f"{name} must hold only 0/1 (or bool) entries, got {arr[bad].reshape(-1)[0].item()!r}"
            )
    if arr.ndim != 3 or arr.shape[0] != arr.shape[1] or arr.shape[2] < 1:
        raise ValueError(f"{name} must be a [d, d, L] array with L >= 1, got shape {arr.shape}")
    return arr.astype(bool)


def _check_tau_max(tau_max: object, least: int) -> int:
    if isinstance(tau_max, bool) or not isinstance(tau_max, (int, np.integer)) or tau_max < least:
        raise ValueError(f"tau_max must be an int >= {least} (the largest lag with an edge), got {tau_max!r}")
    return int(tau_max)


def to_tigramite_graph(graph: object, tau_max: int | None = None) -> np.ndarray:
    """tigramite's string graph of a boolean lagged graph.

    Args:
        graph: bool (or 0/1) ``[d, d, L]``, ``graph[i, j, τ]``: ``x_j(t-τ) -> x_i(t)`` (ARROW's ``graph_``).
        tau_max: lag window of the output (pads with ``""``); ``None``: ``L - 1``. It must cover every edge.

    Returns:
        ``<U3`` array ``[d, d, tau_max + 1]`` indexed ``[source, target, lag]``: ``"-->"`` for
        ``x_i(t-τ) -> x_j(t)``, ``""`` elsewhere; a lag-0 edge ``x_j(t) -> x_i(t)`` is written as
        ``"-->"`` at ``[j, i, 0]`` and ``"<--"`` at ``[i, j, 0]`` (tigramite's symmetric lag 0).

    Raises:
        TypeError: ``graph`` is not bool/numeric.
        ValueError: wrong shape, entries other than 0/1, a lag-0 self loop or a lag-0 two-cycle (one
            tigramite entry cannot hold both directions), ``tau_max`` below the largest lag with an edge.
    """
    g = _check_bool_graph(graph, "graph")
    d, _, L = g.shape
    lags = np.nonzero(g.any((0, 1)))[0]
    top = int(lags[-1]) if lags.size else 0
    tau_max = L - 1 if tau_max is None else _check_tau_max(tau_max, top)
    if np.diagonal(g[:, :, 0]).any():
        v = int(np.nonzero(np.diagonal(g[:, :, 0]))[0][0])
        raise ValueError(
            f"graph has a lag-0 self loop at variable {v} (graph[{v}, {v}, 0]): not a valid link"
        )
    both = g[:, :, 0] & g[:, :, 0].T
    if both.any():
        i, j = (int(v) for v in np.argwhere(both)[0])
        raise ValueError(
            f"graph has a lag-0 two-cycle between variables {i} and {j} (graph[{i}, {j}, 0] and "
            f"graph[{j}, {i}, 0]): tigramite's single lag-0 entry cannot hold both directions"
        )
    out = np.zeros((d, d, tau_max + 1), dtype="<U3")
    keep = min(L, tau_max + 1)
    out[:, :, :keep][g.transpose(1, 0, 2)[:, :, :keep]] = "-->"
    out[:, :, 0][g[:, :, 0]] = "<--"  # effect i, cause j at lag 0: [j, i, 0] = "-->", [i, j, 0] = "<--"
    return out


def from_tigramite_graph(graph: object, ambiguous: str = "raise") -> np.ndarray:
    """ARROW's boolean lagged graph of a tigramite string graph (the inverse of :func:`to_tigramite_graph`).

    Args:
        graph: string array ``[N, N, tau_max + 1]`` indexed ``[source, target, lag]`` (e.g.
            ``PCMCI.run_pcmci(...)["graph"]``), entries ``""``, ``"-->"``, ``"<--"`` (lag 0 only) or an
            undetermined mark (``"o-o"``, ``"x-x"``, ``"o->"``, ``"<->"``, ...).
        ambiguous: what an undetermined mark becomes: ``"raise"`` (``ValueError``), ``"drop"`` (no edge) or
            ``"possible"`` (an edge in every direction its marks and time order allow: a direction
            ``a -> b`` needs no arrowhead at ``a`` and no tail at ``b``, and a lagged link can only point
            forward in time; ``"o-o"``/``"x-x"`` at lag 0 give both directions, ``"<->"`` none).

    Returns:
        bool ``[N, N, tau_max + 1]``, ``out[i, j, τ]``: ``x_j(t-τ) -> x_i(t)``.

    Raises:
        TypeError: ``graph`` is not a string array.
        ValueError: wrong shape, an unknown mark, ``"<--"`` at a lag > 0 (effect before cause), a lag-0 entry
            whose mirror ``graph[j, i, 0]`` is not its reverse, a lag-0 self link, an undetermined mark under
            ``ambiguous="raise"``, a bad ``ambiguous``.
    """
    if ambiguous not in ("raise", "drop", "possible"):
        raise ValueError(f"ambiguous must be 'raise', 'drop' or 'possible', got {ambiguous!r}")
    arr = np.asarray(graph)
    if arr.dtype.kind != "U" and not (
        arr.dtype == object and all(isinstance(v, str) for v in arr.reshape(-1))
    ):
        raise TypeError(
            f"graph must be a string array [N, N, tau_max+1] (tigramite's layout), got dtype {arr.dtype}"
        )
    if arr.ndim != 3 or arr.shape[0] != arr.shape[1] or arr.shape[2] < 1:
        raise ValueError(f"graph must be a [N, N, tau_max+1] array with tau_max >= 0, got shape {arr.shape}")
    arr = arr.astype(str)
    unknown = sorted({m for m in np.unique(arr).tolist() if m != "" and m not in MARKS})
    if unknown:
        raise ValueError(
            f"graph has unknown link marks {unknown}; expected '', '-->', '<--' or a mark like 'o-o'"
        )
    lag0 = arr[:, :, 0]
    if np.diagonal(lag0).any():
        v = int(np.nonzero(np.diagonal(lag0) != "")[0][0])
        raise ValueError(f"graph has a lag-0 self link graph[{v}, {v}, 0] = {str(lag0[v, v])!r}")
    for i, j in (tuple(int(v) for v in e) for e in np.argwhere(lag0 != "")):
        if lag0[j, i] != reverse_mark(str(lag0[i, j])):
            raise ValueError(
                f"graph's lag 0 must be symmetric: graph[{i}, {j}, 0] = {str(lag0[i, j])!r} needs graph[{j}, {i}, 0] = "
                f"{reverse_mark(str(lag0[i, j]))!r}, got {str(lag0[j, i])!r}"
            )
    out = np.zeros(arr.shape, dtype=bool)
    for i, j, tau in (tuple(int(v) for v in e) for e in np.argwhere(arr != "")):
        mark = str(arr[i, j, tau])
        if tau > 0 and mark == "<--":
            raise ValueError(
                f"graph[{i}, {j}, {tau}] = '<--' points from x_{j}(t) back to x_{i}(t-{tau}); lagged links are "
                "written '-->' at [source, target, lag]"
            )
        if mark not in DIRECTED:
            if ambiguous == "raise":
                raise ValueError(
                    f"graph[{i}, {j}, {tau}] = {mark!r} does not fix a direction; pass ambiguous='drop' or "
                    "'possible' to read such marks"
                )
            if ambiguous == "drop":
                continue
        forward, backward = _allows(mark)
        if forward:  # x_i(t-τ) -> x_j(t)
            out[j, i, tau] = True
        if backward and tau == 0:  # x_j(t) -> x_i(t); a lagged link cannot point back in time
            out[i, j, tau] = True
    return out
