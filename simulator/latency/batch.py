"""Interpolation of op times in the batch size B, the serving step's cost over B rows (LatencyModel).

A profile measured at batch levels B_1 = 1 < B_2 < ... < B_K (`draftgym profile --batch-sizes`)
gives, per op, one (x, context) surface per level (x = W for draft_step, V for verify). A query
(x, c, B) evaluates every level's surface at (x, c) -> F_k, then interpolates F_k in B:

    linear (default)  t(B) = (1 - w) F_lo + w F_hi,   w = (B - B_lo) / (B_hi - B_lo)
    log               the same with log B in place of B

Why linear by default: one forward over B rows costs a memory-bound floor (the weights are read once
whatever B) plus work per token (B * V matmul rows, B * c attention reads): affine in B above a flat
floor. Piecewise-linear interpolation is exact on each affine piece and on the floor; chords in log B
overrate an affine cost between profiled doublings (at B = 12, between 8 and 16, log B charges 12.68
rows' worth of the per-row slope instead of 12). `batch_loo` measures both on a real profile
(LatencyModel.fit_report()["batch_loo"]): build the model with batch_interp="log" where that fits better.

Outside the profiled levels: B < 1 is refused (ValueError); B > B_K extrapolates along the last
segment (the last two levels' slope: cost keeps growing with the batch) and is never below F_K. An op
profiled only at batch 1 (the overhead of a profile made before the batched engine's steps were
timed, or an imported one) is flat in B. Exact at every profiled level; monotone
between two levels (linear in B, or in log B).
"""
from __future__ import annotations

import numpy as np

from simulator.latency.surface import surface_of

X_KEY = {"draft_step": "width", "verify": "verify_size", "overhead": None}   # each op's x column (None: x = 0)

BATCH_INTERP = ("linear", "log")


def row_buckets(batch) -> np.ndarray:
    """The rows an engine that pads to CUDA-graph capture sizes runs a step of B rows over: 1, 2, 4,
    then multiples of 8 (pipeline/decode/engine/core.py `row_bucket`, vectorised; B rounded up)."""
    b = np.ceil(np.asarray(batch, np.float64))
    return np.where(b <= 2, b, np.where(b <= 4, 4.0, np.ceil(b / 8) * 8))


def interp_batch(levels, F: np.ndarray, batch, mode: str = "linear") -> np.ndarray:
    """levels [K] ascending batch sizes (levels[0] = 1); F [K, *shape] each level's values at the query
    points; batch broadcastable to shape -> [*shape] (module docstring)."""
    if mode not in BATCH_INTERP:
        raise ValueError(f"batch_interp must be one of {', '.join(BATCH_INTERP)}, got {mode!r}")
    L = np.asarray(levels, np.float64)
    F = np.asarray(F, np.float64)
    b = np.broadcast_to(np.asarray(batch, np.float64), F.shape[1:])
    if np.any(b < 1):
        raise ValueError(f"batch sizes must be >= 1, got {float(b.min()):g}")
    K = len(L)
    if K == 1:
        return F[0].copy()
    u, q = (np.log(L), np.log(b)) if mode == "log" else (L, b)
    hi = np.clip(np.searchsorted(L, b, side="left"), 1, K - 1)                 # B_lo < B <= B_hi
    lo = hi - 1
    w = (q - u[lo]) / (u[hi] - u[lo])                                          # > 1 beyond B_K
    f_lo = np.take_along_axis(F, lo[None], 0)[0]
    f_hi = np.take_along_axis(F, hi[None], 0)[0]
    out = (1 - w) * f_lo + w * f_hi
    return np.where(b > L[-1], np.maximum(out, F[-1]), out)


def batch_loo(levels, surfaces, mode: str = "linear") -> list[float]:
    """Leave-one-level-out relative errors of the interpolation in B: each interior level's measured
    points predicted from the other levels' surfaces (callables (x, ctx) -> values with a `points`
    dict: x, ctx, median)."""
    errs = []
    for k in range(1, len(levels) - 1):
        pts = surfaces[k].points
        rest = [j for j in range(len(levels)) if j != k]
        F = np.stack([surfaces[j](pts["x"], pts["ctx"]) for j in rest])
        pred = interp_batch([levels[j] for j in rest], F, levels[k], mode)
        errs += list(np.abs(pred - pts["median"]) / np.maximum(pts["median"], 1e-12))
    return errs


def row_batch(row: dict) -> int:
    """A LATENCY row's batch size B (rows without one, or with 0, are batch 1)."""
    return max(1, int(row.get("batch") or 1))


def batch_levels(rows: list[dict], point: str = "mean") -> tuple[dict, dict]:
    """One profile's B > 1 rows -> ({op: {B: Surface}} for draft_step / verify / overhead,
    {B: (point, p10, p90)} of the policy op)."""
    col = lambda rs, k: [float(r[k]) for r in rs]
    batched = {}
    for op, xk in X_KEY.items():
        for B in sorted({int(r["batch"]) for r in rows if r["op"] == op}):
            rs = [r for r in rows if r["op"] == op and int(r["batch"]) == B]
            batched.setdefault(op, {})[B] = surface_of(rs, xk, point)
    policy = {}
    for B in sorted({int(r["batch"]) for r in rows if r["op"] == "policy"}):
        rs = [r for r in rows if r["op"] == "policy" and int(r["batch"]) == B]
        policy[B] = tuple(float(np.mean(col(rs, k))) for k in (point, "p10", "p90"))
    return batched, policy
