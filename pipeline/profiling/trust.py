"""Which cells of a latency profile not to trust: wild spreads and broken physics.

A cell is one LATENCY row: an op (`verify`, `draft_step`) at one (W or V, context c, batch B), with
the statistics of its timing samples. Two signs that a cell measured something else than the engine
(a second job on the cores, a GPU shared with another process, a clock step):

    wild     p90 / p10 > SPREAD_MAX. Clean profiles stay well under it: the demo's profiles on a
             quiet 2-core EPYC (fp32) spread 1.02-1.25 (verify) and 1.37-1.94 (draft_step), while
             a second job sharing the cores can spread a cell 17x (p10 90 ms, median 1,531 ms)
             and mislead `tune`.
    outlier  mean / median > MEAN_MAX: a few samples far out that the quantiles do not show (one
             sample of 15 at 190 ms in a cell whose median is 0.5 ms, on an H200: a CUDA graph
             captured inside the timed steps), yet the replay prices the mean.
    physics  a verify of more tokens, a step over more rows, or a step at a longer context costs more:
             a cell whose median exceeds the median of a cell with a larger V (same B, c), a larger
             B (same op, W or V, c) or a longer c (same op, W or V, B) by more than SLACK is suspect.
             The slower cell is blamed: interference only ever slows a measurement down, so of two
             cells in the wrong order the dearer one is wrong.

`draftgym profile` re-measures a suspect cell once (pipeline/profiling/profile.py ProfileSampler.remeasure)
and runs once more (`--top-ups`) each (B, c) whose cells are too few for their spread (`rel_se` above REL_SE_MAX:
ProfileSampler.top_up); the latency model leaves any cell that stayed suspect out and names it in one
line (simulator/latency/model.py, `trust=True`, the default: tune, serve-eval, train-load and validate
print it), unless they are every cell of their op at that B (`trusted_out`: then nothing would be left
to interpolate from, and they stay). Policy, overhead and prefill rows are not judged: no shape
decision rests on their spread, and their sizes are not ordered; nor are rows of one sample (n = 1:
an imported profile's cells, fitted to an engine's step times, simulator/serving/formats/sglang_import.py).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

SPREAD_MAX = 2.5    # p90 / p10 above this: a wild cell
SLACK = 0.25        # a cell dearer than a larger one's median by more than this share breaks the physics
MEAN_MAX = 1.5      # mean / median above this: an outlier cell (clean CPU cells: mean 1.00-1.07x the median)
REL_SE_MAX = 0.03   # a cell's median known to within 3 % (rel_se): else its (B, c) job runs once more
JUDGED = ("verify", "draft_step")


def rel_se(samples) -> float:
    """The relative standard error of a cell's median from its samples: 1.2533 sigma / sqrt(n) / median
    (the median's asymptotic error under a normal), sigma read robustly as (p90 - p10) / 2.5631, so a
    few far samples do not inflate it. 8 samples spread p90 / p10 = 1.2 give 2.7 %; 1.3 give 3.9 %."""
    s = np.asarray(samples, np.float64)
    med = float(np.median(s)) if s.size else 0.0
    if s.size < 2 or med <= 0:
        return float("inf")
    sigma = float(np.quantile(s, 0.9) - np.quantile(s, 0.1)) / 2.5631
    return 1.2533 * sigma / np.sqrt(s.size) / med


@dataclass(frozen=True)
class Suspect:
    op: str
    size: int          # V of a verify, W of a draft_step
    context: int
    batch: int
    why: str

    def label(self) -> str:
        s = "V" if self.op == "verify" else "W"
        return f"{self.op} {s}={self.size} c={self.context} B={self.batch} ({self.why})"


def cell_key(r: dict) -> tuple[str, int, int, int]:
    """A LATENCY row's cell: (op, V of a verify or W of a draft_step, context, B)."""
    size = int(r.get("verify_size") or 0) if r["op"] == "verify" else int(r.get("width") or 0)
    return r["op"], size, int(r.get("context_len") or 0), max(1, int(r.get("batch") or 1))


def suspect_cells(rows: list[dict], spread_max: float = SPREAD_MAX, slack: float = SLACK) -> list[Suspect]:
    """The suspect cells among LATENCY rows of one profile (module docstring), one Suspect per cell
    (its first reason), in row order."""
    cells = {cell_key(r): r for r in rows if r["op"] in JUDGED and int(r.get("n") or 2) >= 2}   # n = 1: fitted, not sampled
    out: dict[tuple, str] = {}
    for k, r in cells.items():
        p10, p90 = float(r["p10"]), float(r["p90"])
        med, mean = float(r["median"]), float(r.get("mean") or r["median"])
        if p10 > 0 and p90 / p10 > spread_max:
            out.setdefault(k, f"p90/p10 {p90 / p10:.1f}")
        elif med > 0 and mean / med > MEAN_MAX:
            out.setdefault(k, f"mean {mean / med:.1f}x the median")
    for k, r in cells.items():
        if k in out:
            continue
        op, size, c, B = k
        med = float(r["median"])
        for (op2, size2, c2, B2), r2 in cells.items():
            larger = op2 == op and ((c2 == c and ((op == "verify" and B2 == B and size2 > size) or (size2 == size and B2 > B)))
                                    or (size2 == size and B2 == B and c2 > c))
            if larger and med > (1 + slack) * float(r2["median"]):
                what = f"c={c2}" if c2 != c else f"V={size2}" if B2 == B else f"B={B2}"
                out[k] = f"median {1e3 * med:.1f} ms above {what}'s {1e3 * float(r2['median']):.1f} ms"
                break
    return [Suspect(*k, out[k]) for k in cells if k in out]


def trusted_out(rows: list[dict]) -> list[Suspect]:
    """The suspect cells a latency model leaves out: all of them, except where they are every cell of
    their (op, B) (a profile taken entirely under interference, or a model too small to have
    physics: leaving them all out would leave nothing to interpolate from, so they stay)."""
    sus = suspect_cells(rows)
    cells = Counter((k[0], k[3]) for k in (cell_key(r) for r in rows if r["op"] in JUDGED))
    per = Counter((x.op, x.batch) for x in sus)
    return [x for x in sus if per[(x.op, x.batch)] < cells[(x.op, x.batch)]]


def drop_suspects(rows: list[dict], suspects: list[Suspect]) -> list[dict]:
    """`rows` without the cells of `suspects`."""
    bad = {(x.op, x.size, x.context, x.batch) for x in suspects}
    return [r for r in rows if r["op"] not in JUDGED or cell_key(r) not in bad]


def suspects_line(profile: str, suspects: list[Suspect], action: str = "left out") -> str:
    """One line naming the suspect cells of a profile."""
    return (f"latency profile {profile}: {action} {len(suspects)} suspect cell{'s' * (len(suspects) != 1)} "
            f"(wild spread, outlier mean or out of order; re-profile on a quiet device): " + "; ".join(s.label() for s in suspects))
