"""SGLang's DSpark cost table from a DraftGym latency profile (`draftgym cost-table`).

SGLang's DSpark ragged-verify scheduler picks each step's verify-token budget N (drafts kept over the
batch) by maximising expected tokens over step time, its step time from a table the server reads with
`--speculative-dspark-sps-table-path FILE`. Read on 2026-11-28 in sgl-project/sglang 692c5f7d532f
(python/sglang/srt/speculative/dspark_components/dspark_sps_table.py: SpsCostTable,
SpsAdditiveCostTable, load_sps_table_from_path) and b8c3d9bb50c5 (dspark_scheduler.py:
compute_verify_token_budget). Two JSON forms; the loader takes the additive one when the text holds
"bias_seconds":

    additive   {"bias_seconds": b > 0, "bs_probes": [B...], "alpha_seconds": [...],
                "m_probes": [m...], "theta_seconds": [...]}           (probes strictly increasing)
               step_time(num_reqs R, budget N) = b + alpha(R) + theta(R + N)
               alpha and theta linear between probes, clamped beyond them
    sps        {"sample_batch_tokens": [T...], "sample_steps_per_sec": [...], "max_batch_tokens": T_max}
               steps/s at the largest probe <= R + N (floor), a function of the batch's tokens alone

The export writes the additive form: it keeps the request count apart, which DraftGym's profile
has (a step's cost depends on B, not only on its tokens). From the profile at context c, for a
DSpark-like step with gamma drafts per request (all drafted, N of them verified):

    t(B, N) = gamma t_draft(1, c, B) + t_overhead(c, B) + t_verify(1 + N / B, c, B)

(the verify priced as a flattened-token engine runs it: ShapeTable.row_step_time, paged). The table
is fitted to t over the profile's batch levels B and every N = 0 .. B gamma: b = t_overhead(c, 1),
alpha(B) = gamma t_draft(1, c, B) + t_overhead(c, B) - b at each profiled B, and theta at m-probes
(SGLang's own batch-token sweep up to max B (gamma + 1)) by least squares on the linear-interpolation
basis, weighted to minimise the relative error of the step time. The largest and mean relative
error of the fitted table against t over the grid are reported: the additive form cannot say that
verifying m tokens costs more over more rows, and the error is how much that matters on this
profile.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.errors import DataError


def batch_token_sweep(max_tokens: int) -> list[int]:
    """SGLang's probe sizes up to max_tokens (build_batch_size_sweep's steps: 1, 2, 4, 8, then every 4
    to 128, 16 to 256, 32 to 1024, 128 to 2048, 256 beyond), max_tokens last."""
    raw = [1, 2, 4, 8, *range(12, 128, 4), *range(128, 256, 16), *range(256, 1024, 32), *range(1024, 2048, 128),
           *range(2048, max_tokens + 1, 256)]
    out = sorted({v for v in raw if 1 <= v <= max_tokens})
    return out if out[-1] == max_tokens else out + [max_tokens]


def _hat(probes: np.ndarray, x: np.ndarray) -> np.ndarray:
    """[len(x), len(probes)] linear-interpolation weights, clamped beyond the ends."""
    x = np.clip(np.asarray(x, np.float64), probes[0], probes[-1])
    hi = np.clip(np.searchsorted(probes, x, side="right"), 1, len(probes) - 1)
    lo = hi - 1
    f = (x - probes[lo]) / (probes[hi] - probes[lo])
    W = np.zeros((len(x), len(probes)))
    W[np.arange(len(x)), lo] = 1 - f
    W[np.arange(len(x)), hi] += f
    return W


def step_time(table: dict, num_reqs, budget) -> np.ndarray:
    """SGLang's additive step_time (module docstring), vectorised."""
    a = np.interp(num_reqs, table["bs_probes"], table["alpha_seconds"])
    m = np.asarray(num_reqs, np.float64) + np.asarray(budget, np.float64)
    return table["bias_seconds"] + a + np.interp(m, table["m_probes"], table["theta_seconds"])


def check_table(table: dict) -> None:
    """SGLang's own checks on the additive form, as one-line DataErrors."""
    for name, vals in (("bs", "alpha_seconds"), ("m", "theta_seconds")):
        probes = table.get(f"{name}_probes")
        if not probes or list(probes) != sorted(set(probes)):
            raise DataError(f"DSpark table: {name}_probes must be non-empty and strictly increasing")
        if len(probes) != len(table.get(vals, ())):
            raise DataError(f"DSpark table: {name}_probes and {vals} differ in length")
    if not table.get("bias_seconds", 0) > 0:
        raise DataError("DSpark table: bias_seconds must be > 0")


def dspark_table(latency, gamma: int, context: float, batch_sizes=None) -> tuple[dict, dict]:
    """(the additive table, its fit against the profile: max and mean relative error, grid size)."""
    if gamma < 1:
        raise DataError(f"--gamma must be >= 1, got {gamma}")
    bs = sorted({1, *(batch_sizes or getattr(latency, "batch_levels", [1]))})
    c = np.float64(context)
    bias = float(latency.t_overhead(c, batch=1))
    # SGLang wants b > 0; a profile with no overhead term (one imported from an engine's step times) lends b half
    # its B = 1 one-token verify, which theta gives back: the same sums, a table SGLang loads
    lent = 0.5 * float(latency.t_verify(1, c, batch=1)) if bias <= 0 else 0.0
    bias += lent
    alpha = [float(gamma * latency.t_draft(1, c, batch=B) + latency.t_overhead(c, batch=B)) + lent - bias for B in bs]
    m_probes = np.array(batch_token_sweep(bs[-1] * (gamma + 1)), np.float64)
    rows, target = [], []
    for B in bs:
        N = np.arange(B * gamma + 1)
        rows.append(_hat(m_probes, B + N))
        target.append(latency.t_verify(1 + N / B, c, batch=B) - lent)
    A, y = np.concatenate(rows), np.concatenate(target)
    full = y + np.concatenate([np.full(B * gamma + 1, bias + a) for B, a in zip(bs, alpha)])   # the step times t(B, N)
    keep = A.sum(0) > 0                                               # probes some grid point reaches
    w = 1.0 / full[:, None]                                           # least squares in relative step-time error
    theta = np.interp(m_probes, m_probes[keep], np.linalg.lstsq(A[:, keep] * w, y * w[:, 0], rcond=None)[0])
    table = {"bias_seconds": bias, "bs_probes": bs, "alpha_seconds": alpha, "m_probes": m_probes.astype(int).tolist(),
             "theta_seconds": theta.tolist()}
    check_table(table)
    reqs = np.concatenate([np.full(B * gamma + 1, B) for B in bs])       # the grid's (B, N), in full's order
    budget = np.concatenate([np.arange(B * gamma + 1) for B in bs])
    rel = np.abs(step_time(table, reqs, budget) / full - 1)
    return table, {"max_rel_error": float(rel.max()), "mean_rel_error": float(rel.mean()), "grid_points": int(len(rel)),
                   "gamma": gamma, "context": float(context), "batch_sizes": bs}


def write_table(table: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    return path


def run_cost_table_command(cfg) -> int:
    """`draftgym cost-table`: the table to cfg.out, its fit on stdout (or one JSON object)."""
    from simulator.latency.model import LatencyModel

    lat = LatencyModel.from_logs(cfg.latency, model=cfg.model, profile=cfg.profile, dtype=cfg.dtype, trust=True)
    table, fit = dspark_table(lat, cfg.gamma, cfg.context)
    path = write_table(table, cfg.out)
    info = {"out": str(path), "profile": lat.meta.get("profile_id"), "device": lat.meta.get("device"), **fit}
    if cfg.as_json:
        print(json.dumps(info))
        return 0
    print(f"wrote {path}: SGLang DSpark additive cost table (--speculative-dspark-sps-table-path), gamma {cfg.gamma}, "
          f"context {cfg.context:g}, B {fit['batch_sizes'][0]}..{fit['batch_sizes'][-1]}, {len(table['m_probes'])} "
          f"token probes, from profile {info['profile']} ({info['device']})")
    print(f"fit against the profile's step times over {fit['grid_points']} (B, budget) points: mean "
          f"{100 * fit['mean_rel_error']:.2f} %, largest {100 * fit['max_rel_error']:.2f} %")
    return 0
