"""Which number of a profile cell the latency model prices: its `point` (LatencyModel.from_rows).

A cell is one LATENCY row (pipeline/logs/schema.py): an op at one (W or V, context c, batch B), with
the statistics of its n timing samples: median, p10, p90, mean. A cell holds 8-16 samples, and on a
shared machine a few of them can be far out: the demo's V = 1, c = 32 cell once read a mean of 67.2 ms
against a median of 46.5 ms (1.44x, from a handful of slow samples), so a model pricing means charged
real AR decoding's 40 ms steps 60 ms and the replay was -27 % off. The three points:

    median   (default) the cell's median: a few far samples cannot move it
    robust   the cell's median times its op's typical skew, an estimate of the mean that one cell's
             far samples move little:

                 robust(cell) = median(cell) * k(op, B)
                 k(op, B)     = sum_i n_i (mean_i / median_i) / sum_i n_i  over the op's cells at B whose
                                mean / median <= MEAN_MAX (pipeline/profiling/trust.py; none left: k = 1)

    mean     the cell's mean: what a throughput integrates, if the cell's samples are decoding's, but
             a few far samples move it (above)

Why the median: chosen by measurement against real decoding on held-out prompts (the fidelity
benchmark, online/bench/fidelity.py; docs/benchmarks/2026-11-28-clock.md, clock-1): mean |tokens/s
error| at B = 1 over AR, static, grid-best and LTD on two datasets, 2-core AMD EPYC (AVX512-BF16):

                 fp32     bf16
    median       2.2 %    2.7 %
    robust       3.3 %    2.6 %
    mean         4.1 %    3.3 %

At the robust point the clock priced decoding's own cycles 1-7 % dear in fp32 (static's V = 60
verify up to 13 % in bf16; online/validate/sim_vs_real.py cycle_cost), and the median, below the mean
by the profile's skew, takes part of that back. What makes the profile dear is not settled: not the
order of its shapes (a step right after another shape costs what the same step repeated costs, within
3 %, bf16, clock-2). Every validate report prints the error at each point (sim-vs-real's `by_point`),
so another machine can check the choice.
"""
from __future__ import annotations

from collections import defaultdict

POINTS = ("robust", "median", "mean")
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
