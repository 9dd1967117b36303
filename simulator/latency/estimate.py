"""Which number of a profile cell the latency model prices: its `point` (LatencyModel.from_rows).

A cell is one LATENCY row (pipeline/logs/schema.py): an op at one (W or V, context c, batch B), with
the statistics of its n timing samples: median, p10, p90, mean. A cell holds 8-16 samples, and on a
shared machine a few of them can be far out: the demo's V = 1, c = 32 cell once read a mean of 67.2 ms
against a median of 46.5 ms (1.44x, from a handful of slow samples), so a model pricing means charged
real AR decoding's 40 ms steps 60 ms and the replay was -27 % off. The three points:

    robust   (default) the cell's median times its op's typical skew: an estimate of the mean (what a
             throughput, tokens / total time, integrates) that one cell's far samples move little:

                 robust(cell) = median(cell) * k(op, B)
                 k(op, B)     = sum_i n_i (mean_i / median_i) / sum_i n_i  over the op's cells at B whose
                                mean / median <= MEAN_MAX (pipeline/profiling/trust.py; none left: k = 1)

             On clean cells (mean / median 0.97-1.04 in the 2026-11-28 demos) it is the mean to
             within a percent or two; a cell of one op alone (a policy's) is its mean.
    median   the cell's median: a few far samples cannot move it, but it sits below the mean by the
             skew
    mean     the cell's mean: a few far samples move it (above)

Why robust: measured against real decoding, the mean |decode tokens/s error| at B = 1 over AR,
static, grid-best and LTD on two held-out datasets (validate's sim-vs-real `by_point`: the same
replay timed at each point), 2-core AMD EPYC (AVX512-BF16), docs/benchmarks/2026-11-28-clock.md:

                          robust    median    mean
    fidelity bench, fp32   3.3 %     2.2 %    4.1 %
    fidelity bench, bf16   2.6 %     2.7 %    3.3 %
    make demo, bf16        8.2 %     9.9 %    8.5 %
    make demo, fp32        4.0 %     5.2 %    3.9 %
    the four runs          4.5 %     5.0 %    5.0 %

The differences are within this VM's drift (the clock on decoding's own cycles, online/validate/
sim_vs_real.py cycle_cost, was 2-7 % dear in one run and 3-8 % cheap in another); robust is the one
that estimates what a throughput integrates and is also immune to one cell's far samples. Every
validate report prints the error at each point, so another machine can check the choice.
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
