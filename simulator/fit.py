"""The two numerical pieces of the profiled latency model.

`fit_linear`: a pass time linear in the batch's aggregates, t ≈ a + b·seqs + c·query + d·cached +
e·pairs, fitted by non-negative least squares on relative error. It is the model's shape
everywhere and its only answer far outside the profiled grid; non-negative because a pass never
gets faster with more work, relative so a 50 µs decode counts as much as a 50 ms prefill.

`PhaseGrid`: the measured/fitted ratio on one phase's grid (batch × query tokens per request ×
cached tokens per request), interpolated multilinearly in log-space. Log axes because the grids
are geometric (1, 2, 4, ... requests) and pass time bends smoothly on that scale; cached tokens
use log(1 + c) since prefill grids sit at c = 0.
"""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np
from scipy.optimize import nnls

COEFFICIENTS = ("fixed_s", "per_seq_s", "per_query_token_s", "per_cached_token_s",
                "per_attn_pair_s")
AXES = ("num_seqs", "query_tokens_per_seq", "cached_tokens_per_seq")
_AXIS_OFFSET = (0.0, 0.0, 1.0)  # coordinate = log(value + offset)


def uniform_aggregates(num_seqs, query_per_seq, cached_per_seq) -> tuple[np.ndarray, ...]:
    """(seqs, query, cached, pairs) of B requests that each feed q tokens over c cached ones."""
    b, q, c = (np.asarray(x, dtype=np.float64) for x in (num_seqs, query_per_seq, cached_per_seq))
    return b, b * q, b * c, b * (q * c + q * (q + 1) / 2)


def linear_form(coef: np.ndarray, seqs, query, cached, pairs) -> np.ndarray:
    """The fitted time a + b·seqs + c·query + d·cached + e·pairs (elementwise)."""
    a, b, c, d, e = coef
    return a + b * seqs + c * query + d * cached + e * pairs


def fit_linear(seqs, query, cached, pairs, seconds) -> np.ndarray:
    """Coefficients (see `COEFFICIENTS`) minimising the sum of squared relative errors.

    Columns are scaled to a unit maximum first: raw, pairs run to 1e8 while the constant is 1,
    and NNLS's active-set steps lose precision on such spreads.
    """
    t = np.asarray(seconds, dtype=np.float64)
    x = np.column_stack([np.ones_like(t), seqs, query, cached, pairs]) / t[:, None]
    scale = x.max(axis=0)
    scale[scale <= 0] = 1.0
    coef, _ = nnls(x / scale, np.ones_like(t), maxiter=50 * x.shape[1])
    return coef / scale


class PhaseGrid:
    """A log-ratio on a product grid of (num_seqs, query/seq, cached/seq), interpolated.

    Built from scattered grid points; the lattice is the product of each axis's distinct values.
    Missing lattice nodes (held-out points) are filled by linear interpolation along every axis
    on which present nodes bracket them (`_bracketed`), and nodes at the lattice's edge that
    nothing brackets by the nearest known nodes' ratio (`_nearest`, the model's "clamp" rule
    outside its box); docs/profiling.md, "Holes in the grid".
    """

    def __init__(self, values: list[np.ndarray], log_ratio: np.ndarray, filled: int) -> None:
        self.values = values  # distinct raw values per axis, ascending
        self.coords = [np.log(v + off) for v, off in zip(values, _AXIS_OFFSET)]
        self.log_ratio = log_ratio  # shape (len(values[0]), len(values[1]), len(values[2]))
        self.filled = filled
        self.active = [i for i, v in enumerate(values) if len(v) > 1]
        # plain-Python copies for the scalar path (the engine's per-iteration calls)
        self._coords = [c.tolist() for c in self.coords]
        self._lo = [float(v[0]) for v in values]
        self._hi = [float(v[-1]) for v in values]
        self._flat = log_ratio.ravel().tolist()
        self._flat_array = log_ratio.ravel()  # the same, for many points at once
        self._strides = [log_ratio.shape[1] * log_ratio.shape[2], log_ratio.shape[2], 1]
        # flat offsets of a cell's corners, first active axis most significant
        self._corners = [sum(bit * self._strides[a] for a, bit in zip(self.active, bits))
                         for bits in itertools.product((0, 1), repeat=len(self.active))]

    @classmethod
    def build(cls, points: np.ndarray, log_ratio: np.ndarray) -> PhaseGrid | str:
        """From (n, 3) raw points and their log-ratios; a reason string if it is not a grid."""
        values = [np.unique(points[:, i]) for i in range(3)]
        shape = tuple(len(v) for v in values)
        grid = np.full(shape, np.nan)
        index = tuple(np.searchsorted(values[i], points[:, i]) for i in range(3))
        grid[index] = log_ratio
        missing = [tuple(node) for node in np.argwhere(np.isnan(grid))]
        coords = [np.log(v + off) for v, off in zip(values, _AXIS_OFFSET)]
        filled = grid.copy()
        for node in missing:  # nodes that measured points bracket: interpolated
            estimate = _bracketed(grid, coords, node)
            if estimate is not None:
                filled[node] = estimate
        for _ in range(3):  # the lattice's edges: the nearest known node's ratio, carried over
            edges = [node for node in missing if np.isnan(filled[node])]
            if not edges:
                break
            known = filled.copy()
            for node in edges:
                estimate = _nearest(known, coords, node)
                if estimate is not None:
                    filled[node] = estimate
        still = [node for node in missing if np.isnan(filled[node])]
        if still:
            point = ", ".join(f"{AXES[a]}={values[a][still[0][a]]:g}" for a in range(3))
            return (f"not a full product grid ({len(points)} of {grid.size} points; "
                    f"nothing near {point})")
        return cls(values, filled, len(missing))

    def interpolate_scalar(self, b: float, q: float, c: float, clamp: bool) -> float:
        """The multilinear log-ratio at one point, clamped onto the grid's box outside it (or,
        with `clamp` False, 0 outside it, beyond 1e-9 of its edges), in plain Python: the
        engine costs an iteration at a time through here, and a few passes one by one
        (`ProfiledLatency.forward_s`)."""
        point = (b, q, c)
        if not clamp:
            for x, lo, hi in zip(point, self._lo, self._hi):
                tol = 1e-9 * max(1.0, hi)
                if x < lo - tol or x > hi + tol:
                    return 0.0
        base, weights = 0, []
        for axis in self.active:
            co, lo, hi = self._coords[axis], self._lo[axis], self._hi[axis]
            x = point[axis]
            u = math.log((lo if x < lo else hi if x > hi else x) + _AXIS_OFFSET[axis])
            i = bisect.bisect_right(co, u) - 1
            i = 0 if i < 0 else len(co) - 2 if i > len(co) - 2 else i
            w = (u - co[i]) / (co[i + 1] - co[i])
            base += i * self._strides[axis]
            weights.append(0.0 if w < 0.0 else 1.0 if w > 1.0 else w)
        return _cell(self._flat, base, self._corners, weights)

    def interpolate_many(self, b: np.ndarray, q: np.ndarray, c: np.ndarray,
                         clamp: bool) -> np.ndarray:
        """`interpolate_scalar` of every point (1-d float64 arrays), to the bit: the same
        operations element by element, the logarithms taken by math's log (numpy's differs
        from it in the last bit)."""
        point = (b, q, c)
        base = np.zeros(len(b), dtype=np.int64)
        weights = []
        for axis in self.active:
            co, lo, hi = self.coords[axis], self._lo[axis], self._hi[axis]
            x = point[axis]
            clipped = np.where(x < lo, lo, np.where(x > hi, hi, x)) + _AXIS_OFFSET[axis]
            u = np.fromiter(map(math.log, clipped.tolist()), np.float64, len(clipped))
            i = np.clip(np.searchsorted(co, u, side="right") - 1, 0, len(co) - 2)
            w = (u - co[i]) / (co[i + 1] - co[i])
            base += i * self._strides[axis]
            weights.append(np.where(w < 0.0, 0.0, np.where(w > 1.0, 1.0, w)))
        out = _cell(self._flat_array, base, self._corners, weights)
        if not clamp:
            outside = np.zeros(len(b), dtype=bool)
            for x, lo, hi in zip(point, self._lo, self._hi):
                tol = 1e-9 * max(1.0, hi)
                outside |= (x < lo - tol) | (x > hi + tol)
            out = np.where(outside, 0.0, out)
        return out


def _bracketed(grid: np.ndarray, coords: list[np.ndarray], node: tuple) -> float | None:
    """Linear interpolation along every axis on which present nodes bracket `node`, averaged
    with weights 1/width² (a linear interpolant's error grows with the bracket's width squared;
    every estimate is exact for a multilinear function); None if no axis brackets it."""
    estimates = []
    for axis in range(3):
        line = list(node)
        line[axis] = slice(None)
        present = np.flatnonzero(~np.isnan(grid[tuple(line)]))
        below, above = present[present < node[axis]], present[present > node[axis]]
        if len(below) and len(above):
            i, j = below[-1], above[0]
            x, xi, xj = (coords[axis][k] for k in (node[axis], i, j))
            vi, vj = grid[tuple(line)][[i, j]]
            estimates.append((vi + (vj - vi) * (x - xi) / (xj - xi), (xj - xi) ** -2))
    if not estimates:
        return None
    value, weight = np.array(estimates).T
    return float(np.average(value, weights=weight))


def _nearest(grid: np.ndarray, coords: list[np.ndarray], node: tuple) -> float | None:
    """A node past the last measured one on its lines (a profile that times long contexts for
    short verifies only, say): the nearest known node's ratio along each axis, averaged with
    weights 1/distance², as the model keeps the nearest point's ratio outside its box
    (extrapolation "clamp"); None if every line through it is empty."""
    estimates = []
    for axis in range(3):
        line = list(node)
        line[axis] = slice(None)
        present = np.flatnonzero(~np.isnan(grid[tuple(line)]))
        if len(present):
            k = present[np.argmin(np.abs(coords[axis][present] - coords[axis][node[axis]]))]
            distance = abs(coords[axis][k] - coords[axis][node[axis]])
            estimates.append((grid[tuple(line)][k], distance ** -2))
    if not estimates:
        return None
    value, weight = np.array(estimates).T
    return float(np.average(value, weights=weight))


def _cell(f, k, c: list[int], w: list):
    """Multilinear value in the cell whose first corner is f[k] (corners at k + c[j]); for
    one point (lists, ints and floats) or many (a float64 array f, arrays k and w[j]), the
    same operations either way.

    Unrolled per dimension: list comprehensions cost more than the arithmetic at this size.
    """
    if len(w) == 0:
        return f[k]
    if len(w) == 1:
        a = f[k]
        return a + w[0] * (f[k + c[1]] - a)
    if len(w) == 2:
        w0, w1 = w
        a, b = f[k], f[k + c[2]]
        lo, hi = a + w1 * (f[k + c[1]] - a), b + w1 * (f[k + c[3]] - b)
        return lo + w0 * (hi - lo)
    w0, w1, w2 = w
    _, c1, c2, c3, c4, c5, c6, c7 = c
    v0, v2, v4, v6 = f[k], f[k + c2], f[k + c4], f[k + c6]
    x00, x01 = v0 + w2 * (f[k + c1] - v0), v2 + w2 * (f[k + c3] - v2)
    x10, x11 = v4 + w2 * (f[k + c5] - v4), v6 + w2 * (f[k + c7] - v6)
    lo, hi = x00 + w1 * (x01 - x00), x10 + w1 * (x11 - x10)
    return lo + w0 * (hi - lo)
