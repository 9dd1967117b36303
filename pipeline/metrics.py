"""The figures every DraftGym report states, defined once (vLLM's `v1/spec_decode/metrics.py` is the
model): the engine's results, the replay's summaries, the serving tables and validate's reports all
compute them here, so a tau or a tokens/s means the same thing in every table.

    tau            emitted tokens / cycles: the mean acceptance length (vLLM's), iteration-weighted.
                   A cycle is one draft + verify round of one sequence (at batch B: one row-step);
                   a cycle emits L + 1 tokens (L accepted drafts and the bonus token) or fewer at
                   the end, so AR has tau = 1
    tokens/s       tokens / seconds (0 when no time passed); which tokens and which seconds (wall,
                   decode only, busy steps) each report says beside its figure
    speedup        tokens/s(method) / tokens/s(baseline), same prompts, same runs
    relative error (predicted - measured) / measured: the sim-vs-real errors (None when measured is 0)

Each takes numbers or numpy arrays (elementwise); a 0-d result is a numpy scalar, `float()` it.
"""
from __future__ import annotations

import numpy as np


def tau(emitted, cycles):
    """emitted / cycles, a cycle count of 0 read as 1 (no cycle: tau 0)."""
    return np.asarray(emitted, np.float64) / np.maximum(np.asarray(cycles, np.float64), 1)


def tau_of_cycles(cycles) -> float | None:
    """tau over CycleRecords (each with `emitted`); None without a cycle (an AR generation)."""
    cycles = list(cycles)
    return sum(c.emitted for c in cycles) / len(cycles) if cycles else None


def tokens_per_s(tokens, seconds):
    """tokens / seconds; 0 where seconds <= 0."""
    t, s = np.asarray(tokens, np.float64), np.asarray(seconds, np.float64)
    return np.where(s > 0, t / np.where(s > 0, s, 1.0), 0.0)


def speedup(method_tokens_per_s: float, baseline_tokens_per_s: float) -> float | None:
    return method_tokens_per_s / baseline_tokens_per_s if baseline_tokens_per_s else None


def rel_error(predicted, measured) -> float | None:
    """(predicted - measured) / measured; None when measured is 0 or None."""
    return (predicted - measured) / measured if measured else None
