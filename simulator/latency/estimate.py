"""Which number of a profile cell the latency model prices: its `point` (LatencyModel.from_rows).

A cell is one LATENCY row (pipeline/logs/schema.py): an op at one (W or V, context c, batch B), with
the statistics of its n timing samples: median, p10, p90, mean. What a throughput integrates
(tokens / total time) is the mean step time, but a cell holds 8-16 samples, and on a shared machine a
few of them can be far out: the demo's V = 1, c = 32 cell once read a mean of 67.2 ms against a
median of 46.5 ms (1.44x, from a handful of slow samples), so the model charged real AR decoding's
40 ms steps 60 ms and the replay was -27 % off. The three points:

    mean     the cell's mean: unbiased, but a few far samples move it (above)
    median   the cell's median: robust, but below the mean of a right-skewed cell, so every method
             would look faster than it is by the skew (the CPU's in-situ verify cells: mean up to
             5-7 % above the median)
    robust   (default) the cell's median times its op's typical skew:

                 robust(cell) = median(cell) * k(op, B)
                 k(op, B)     = sum_i n_i (mean_i / median_i) / sum_i n_i  over the op's cells at B whose
                                mean / median <= MEAN_MAX (pipeline/profiling/trust.py; none left: k = 1)

             Each cell contributes its robust location, the skew is estimated from every cell of the
             op at once, so one cell's few far samples move its price by at most its share of k's
             samples instead of by their full size. On clean cells (mean / median 0.97-1.04 in the
             2026-11-28 bf16 demo) it is the mean to within a percent or two. Its n-weighting counts
             a cell by its samples, so a re-measured cell (more samples) weighs more.

Why robust is the default: measured against real decoding in `draftgym validate`'s report (its
sim-vs-real `by_point`: the same replay timed at each point) and in the fidelity benchmark
(online/bench/fidelity.py); the figures are in docs/benchmarks/2026-11-28-clock.md.
"""
from __future__ import annotations

from collections import defaultdict

POINTS = ("robust", "mean", "median")
DEFAULT_POINT = "robust"


def with_point(rows: list[dict], point: str, mean_max: float | None = None) -> list[dict]:
    """The rows (LATENCY dicts of one profile) with the column `point` the surfaces read: as they are
    for "mean" and "median"; for "robust" a copy of each row with its "robust" value (module
    docstring; its p10 and p90 stay as measured)."""
    if point not in POINTS:
        raise ValueError(f"point must be one of {', '.join(POINTS)}, got {point!r}")
    if point != "robust":
        return rows
    if mean_max is None:
        from pipeline.profiling.trust import MEAN_MAX as mean_max
    from simulator.latency.batch import row_batch

    num, den = defaultdict(float), defaultdict(float)
    for r in rows:
        med, mean, n = float(r["median"]), float(r.get("mean") or r["median"]), float(r.get("n") or 1)
        if med > 0 and mean / med <= mean_max:
            key = (r["op"], row_batch(r))
            num[key] += n * mean / med
            den[key] += n
    out = []
    for r in rows:
        key = (r["op"], row_batch(r))
        k = num[key] / den[key] if den[key] > 0 else 1.0
        med = float(r["median"])
        out.append({**r, "robust": med * k, "skew": k})
    return out
