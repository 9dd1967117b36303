"""Serving metrics, defined once (docs/serving.md; tau and tokens/s themselves are pipeline/metrics.py's):

    throughput     sum over steps of sum_r e_r  /  sum of step times       (tokens/s; idle time excluded)
    wall rate      the same tokens over the makespan, first arrival to last finish
    TPOT_i         request i's decode time (finish - join) / its tokens    (s per output token)
    queue_i        join - arrival                                         (s a request waits for a slot)
    goodput(x)     tokens of the requests with TPOT_i <= x, over the same busy time as throughput
    tau            tokens / row-steps  (e_r averaged over every row of every step; the batch-1 replay's
                   iteration-weighted tau at B = 1)
    drafts/step    draft tokens verified per row-step, V - 1 averaged (0 for an AR step)
    mean batch     row-steps / steps
    switches       steps whose shape differs from the step before (the drafted shape of a per-row
                   step); switches/s over the busy time

    prefill share  the requests' prefill seconds over the makespan

e_r = min(L_r + 1, tokens left) is what row r emits in a step. A request's tokens are the T - 1 its
logged sequence emits in decode steps (the prefill's first token is not counted, on either side);
its prefill, when the profile has one (load.py), delays the steps after it, so it counts in the
wall rate, TPOT and queue times but not in the busy time of the throughput.
"""
from __future__ import annotations

import numpy as np

from pipeline.metrics import tau, tokens_per_s


def drafts_per_step(drafted, row_steps) -> np.ndarray:
    return np.asarray(drafted, np.float64) / np.maximum(np.asarray(row_steps, np.float64), 1)


def tpot(join, finish, tokens) -> np.ndarray:
    """[R] seconds per output token of each request (NaN for a request with no token)."""
    tokens = np.asarray(tokens, np.float64)
    return np.where(tokens > 0, (np.asarray(finish) - np.asarray(join)) / np.maximum(tokens, 1), np.nan)


def goodput(tokens, tpot_s, busy_s: float, target_s: float) -> float:
    """Tokens/s of the requests whose TPOT meets the target."""
    ok = np.asarray(tpot_s) <= target_s
    return float(np.asarray(tokens, np.float64)[ok].sum() / max(busy_s, 1e-12))


def summarize(res, tpot_target: float | None = None) -> dict:
    """One row of figures from a `load.ServingResult` (module docstring)."""
    busy = float(res.step_time.sum())
    tok = float(res.step_emitted.sum())
    row_steps = float(res.step_batch.sum())
    steps = len(res.step_time)
    tp = tpot(res.join, res.finish, res.tokens)
    q = res.join - res.arrival
    span = float(res.finish.max() - res.arrival.min()) if len(res.finish) else 0.0
    out = {"requests": int(len(res.tokens)), "tokens": int(tok), "steps": steps, "busy_s": busy,
           "tokens_per_s": float(tokens_per_s(tok, busy)), "wall_tokens_per_s": float(tokens_per_s(tok, span)),
           "tau": float(tau(tok, row_steps)), "drafts_per_step": float(drafts_per_step(res.step_drafted.sum(), row_steps)),
           "mean_batch": row_steps / max(steps, 1), "max_batch": int(res.step_batch.max()) if steps else 0,
           "tpot_mean_s": float(np.nanmean(tp)) if len(tp) else float("nan"),
           "tpot_p90_s": float(np.nanpercentile(tp, 90)) if len(tp) else float("nan"),
           "queue_mean_s": float(q.mean()) if len(q) else 0.0,
           "queue_p90_s": float(np.percentile(q, 90)) if len(q) else 0.0}
    out["switches"] = int((np.diff(res.step_shape) != 0).sum()) if steps > 1 else 0
    out["switches_per_s"] = out["switches"] / busy if busy > 0 else 0.0
    pf = float(np.sum(res.prefill)) if getattr(res, "prefill", None) is not None else 0.0
    out["prefill_s"] = pf
    out["prefill_share"] = pf / span if span > 0 else 0.0
    if tpot_target is not None:
        out["tpot_target_s"] = float(tpot_target)
        out["goodput_tokens_per_s"] = goodput(res.tokens, tp, busy, tpot_target)
        out["tpot_met"] = float(np.mean(tp <= tpot_target)) if len(tp) else 0.0
    return out
