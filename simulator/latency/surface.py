"""Interpolation of measured op times over (x, context length): the `Surface` a LatencyModel is built of.

One op's measured rows (the `latency` table, pipeline/logs/schema.py) give points (x_i, c_i) with a
central value m_i (the `point` statistic: mean or median) and the 10/90 % quantiles p10_i, p90_i;
x = W (draft_step), V (verify) or 0 (overhead). Duplicate (x, c) points are averaged.

Interpolation. At each measured context level c_k we interpolate piecewise linearly in x
(np.interp; flat beyond the measured range), then linearly between the two neighbouring context
levels (flat beyond the measured levels):

    F_k(x) = interp(x; x_k., m_k.)          t(x, c) = (1 - w) F_lo(x) + w F_hi(x),  w = (c - c_lo) / (c_hi - c_lo)

The surface is therefore exact at every measured point; `loo_errors` measures how well it predicts
points it did not see (leave-one-out over interior points), the honest error bar (Vidur's bar: < 9 %).

Noise (optional, for robustness training): t = m + z (p90 - m)/1.2816 for z > 0, m + z (m - p10)/1.2816
for z < 0, z ~ N(0, 1), i.e. a two-piece normal whose 10/90 % quantiles are the measured p10/p90
(interpolated like the median); clipped below at p10/2.
"""
from __future__ import annotations

import numpy as np

Z90 = 1.2815515655446004     # N(0,1) 90 % quantile
TABLE_CELLS = 4_000_000      # largest (x, ctx) table a Surface keeps per statistic (32 MB)


class Surface:
    """Piecewise-linear interpolation of (median, p10, p90) over (x, context_len) points."""

    def __init__(self, x, ctx, median, p10=None, p90=None):
        x, ctx, median = (np.asarray(a, np.float64) for a in (x, ctx, median))
        p10 = median if p10 is None else np.asarray(p10, np.float64)
        p90 = median if p90 is None else np.asarray(p90, np.float64)
        if len(x) == 0:
            raise ValueError("no points")
        # average duplicate (x, ctx) points
        key = np.stack([ctx, x], 1)
        uniq, inv = np.unique(key, axis=0, return_inverse=True)
        inv = inv.ravel()
        cnt = np.bincount(inv)
        avg = lambda v: np.bincount(inv, weights=v) / cnt
        self.points = {"ctx": uniq[:, 0], "x": uniq[:, 1], "median": avg(median), "p10": avg(p10), "p90": avg(p90)}
        self.levels = np.unique(uniq[:, 0])
        self._lv = []
        for c in self.levels:
            m = self.points["ctx"] == c
            o = np.argsort(self.points["x"][m])
            self._lv.append({k: self.points[k][m][o] for k in ("x", "median", "p10", "p90")})
        self._tables: dict[str, np.ndarray] = {}

    def __call__(self, x, ctx, stat: str = "median") -> np.ndarray:
        x, ctx = np.broadcast_arrays(np.asarray(x), np.asarray(ctx))
        shape = x.shape
        x, ctx = x.ravel(), ctx.ravel()
        if len(x) and x.dtype.kind in "iu" and ctx.dtype.kind in "iu":        # replay's calls: tabulated
            hit = self._tabulated(x, ctx, stat)
            if hit is not None:
                return hit.reshape(shape)
        return self._interp(x.astype(np.float64), ctx.astype(np.float64), stat).reshape(shape)

    def _tabulated(self, x: np.ndarray, ctx: np.ndarray, stat: str) -> np.ndarray | None:
        """t(x, ctx) at integer x and ctx read from a table of `_interp` over every x <= max x and ctx <=
        max ctx seen (grown on demand, at most TABLE_CELLS cells): the same numbers, one gather instead
        of K interpolations per call. None when x or ctx is negative or the table would be too large."""
        if x.min() < 0 or ctx.min() < 0:
            return None
        xm, cm = int(x.max()), int(ctx.max())
        t = self._tables.get(stat)
        if t is None or t.shape[0] <= xm or t.shape[1] <= cm:
            nx, nc = max(xm + 1, 0 if t is None else t.shape[0]), max(cm + 1, 0 if t is None else t.shape[1])
            if nx * nc > TABLE_CELLS:
                return None
            gx, gc = np.meshgrid(np.arange(nx, dtype=np.float64), np.arange(nc, dtype=np.float64), indexing="ij")
            t = self._tables[stat] = self._interp(gx.ravel(), gc.ravel(), stat).reshape(nx, nc)
        return t[x, ctx]

    def _interp(self, x: np.ndarray, ctx: np.ndarray, stat: str) -> np.ndarray:
        K = len(self.levels)
        if K == 1:
            return np.interp(x, self._lv[0]["x"], self._lv[0][stat])
        F = np.stack([np.interp(x, lv["x"], lv[stat]) for lv in self._lv])     # [K, n]
        c = np.clip(ctx, self.levels[0], self.levels[-1])
        hi = np.clip(np.searchsorted(self.levels, c, side="left"), 1, K - 1)
        lo = hi - 1
        w = (c - self.levels[lo]) / (self.levels[hi] - self.levels[lo])
        n = np.arange(len(x))
        return (1 - w) * F[lo, n] + w * F[hi, n]

    def sample(self, x, ctx, rng: np.random.Generator) -> np.ndarray:
        return two_piece(*(self(x, ctx, s) for s in ("median", "p10", "p90")), rng)

    def scaled(self, factor: float) -> "Surface":
        """The same points with every value (median, p10, p90) times factor."""
        p = self.points
        return Surface(p["x"], p["ctx"], p["median"] * factor, p["p10"] * factor, p["p90"] * factor)


def two_piece(m, a, b, rng: np.random.Generator) -> np.ndarray:
    """One draw per element of the two-piece normal with central value m and 10/90 % quantiles a, b
    (module docstring), clipped below at a / 2."""
    z = rng.standard_normal(m.shape)
    t = np.where(z > 0, m + z * (b - m) / Z90, m + z * (m - a) / Z90)
    return np.maximum(t, 0.5 * a)


def surface_of(rows: list[dict], x_key: str | None, point: str = "mean") -> Surface:
    """One op's measured rows (dicts with LATENCY columns) -> its Surface over (row[x_key], context_len);
    x_key None: x = 0 (an op that depends on the context length only)."""
    col = lambda k: [float(r[k]) for r in rows]
    x = [0.0] * len(rows) if x_key is None else col(x_key)
    return Surface(x, col("context_len"), col(point), col("p10"), col("p90"))


def loo_errors(surf: Surface) -> np.ndarray:
    """Leave-one-out relative errors of the interpolation: each interior point predicted from its
    neighbours along x (same context level) and along the context length (same x)."""
    pts = surf.points
    loo = []
    for i in range(len(pts["x"])):
        for axis in ("x", "ctx"):
            other = "ctx" if axis == "x" else "x"
            same = np.flatnonzero(pts[other] == pts[other][i])
            vals = pts[axis][same]
            if len(same) < 3 or pts[axis][i] <= vals.min() or pts[axis][i] >= vals.max():
                continue
            rest = same[same != i]
            o = np.argsort(pts[axis][rest])
            p = np.interp(pts[axis][i], pts[axis][rest][o], pts["median"][rest][o])
            loo.append(abs(p - pts["median"][i]) / max(pts["median"][i], 1e-12))
    return np.array(loo)
