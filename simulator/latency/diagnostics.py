"""How far to trust a LatencyModel: its fit to the measured points, a workload's coverage, a plot.

    fit_report  relative errors against the measured points: in sample (0 by construction, a sanity
                check), leave-one-out along x and the context length (simulator.latency.surface), and
                leave-one-level-out in the batch size B, linear and log (simulator.latency.batch)
    coverage    how much of a workload lies outside the measured ranges, where the model extrapolates
    prefill_note  one line when requests' prompts lie outside the profiled prefill lengths (the load
                replays charge each joining request's prefill: LatencyModel.t_prefill)
    plot        measured points (with p10/p90 bars) and the interpolated curves, per context level

Each takes the model as its first argument (the LatencyModel methods of the same names call these);
`draftgym latency-report` (simulator.latency.report) prints the fit report.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.latency.batch import batch_loo
from simulator.latency.surface import loo_errors


def _engine_ops(lat) -> tuple:
    return ("draft_step", lat.draft), ("verify", lat.verify), ("overhead", lat.overhead)


def fit_report(lat) -> dict:
    """Relative errors of the model `lat` against its measured points (module docstring)."""
    out = {"profile": lat.meta.get("profile_id"), "device": lat.meta.get("device"), "ops": {}}
    for name, surf in _engine_ops(lat):
        pts = surf.points
        pred = surf(pts["x"], pts["ctx"])
        rel = np.abs(pred - pts["median"]) / np.maximum(pts["median"], 1e-12)
        loo = loo_errors(surf)
        out["ops"][name] = {
            "points": int(len(pts["x"])), "x_range": [float(pts["x"].min()), float(pts["x"].max())],
            "ctx_range": [float(pts["ctx"].min()), float(pts["ctx"].max())],
            "in_sample_max_rel_err": float(rel.max()) if len(rel) else 0.0,
            "loo_points": int(len(loo)),
            "loo_mean_rel_err": float(loo.mean()) if len(loo) else None,
            "loo_max_rel_err": float(loo.max()) if len(loo) else None,
            "spread_p90_over_p10": float(np.mean(pts["p90"] / np.maximum(pts["p10"], 1e-12))),
        }
    out["ops"]["policy"] = {"median_s": lat.policy_s, "measured": bool(lat.meta.get("has_policy", True)),
                            "per_policy_s": dict(lat.policy_costs),
                            "by_batch_s": {1: lat.policy_s, **{B: v[0] for B, v in lat.policy_by_batch.items()}}}
    out["batch_levels"] = lat.batch_levels
    out["batch_interp"] = lat.batch_interp
    # interpolation in B: each interior batch level predicted from the others, linear and log
    out["batch_loo"] = {}
    for name, surf in _engine_ops(lat):
        levels = [1, *sorted(lat.batched.get(name, {}))]
        out["ops"][name]["batch_levels"] = levels
        if len(levels) >= 3:
            surfs = [surf] + [lat.batched[name][B] for B in levels[1:]]
            errs = {mode: np.array(batch_loo(levels, surfs, mode)) for mode in ("linear", "log")}
            out["batch_loo"][name] = {f"{mode}_mean_rel_err": float(e.mean()) for mode, e in errs.items()} | \
                                     {f"{mode}_max_rel_err": float(e.max()) for mode, e in errs.items()} | \
                                     {"points": int(len(errs["linear"]))}
    return out


def coverage(lat, context_len, widths=(), verify_sizes=(), batches=()) -> dict:
    """How much of a workload lies outside the measured ranges of `lat` (where the model extrapolates
    flat; in B: linearly along the last segment, see simulator.latency.batch). batch_range: the
    profiled batch sizes' range ([1, 1]: batch 1 only, no B > 1 query is answered)."""
    c = np.asarray(context_len, np.float64)
    out = {}
    for name, surf in _engine_ops(lat):
        lo, hi = surf.levels[0], surf.levels[-1]
        out[f"{name}_ctx_outside"] = float(np.mean((c < lo) | (c > hi))) if c.size else 0.0
    out["ctx_range_logs"] = [float(c.min()), float(c.max())] if c.size else None
    w = np.asarray(widths, np.float64)
    if w.size:
        out["widths_outside"] = sorted({int(x) for x in w if x < lat.draft.points["x"].min()
                                        or x > lat.draft.points["x"].max()})
    v = np.asarray(verify_sizes, np.float64)
    if v.size:
        out["verify_outside"] = sorted({int(x) for x in v if x < lat.verify.points["x"].min()
                                        or x > lat.verify.points["x"].max()})
    levels = lat.batch_levels
    out["batch_range"] = [levels[0], levels[-1]]
    out["batch_levels"] = levels
    b = np.asarray(batches, np.float64)
    if b.size:
        out["batches_outside"] = sorted({int(x) for x in b.ravel() if x > levels[-1]})
    return out


def prefill_note(lat, prompt_lens) -> str | None:
    """One line when prompts lie outside the profile's prefill lengths, else None. Below the shortest,
    LatencyModel.t_prefill charges the shortest's time (flat), so short prompts are over-charged;
    above the longest, it scales that time in proportion to n. On the 2-core CPU a profile with one
    128-token prefill row charged a 53-token prompt (mt-bench's median) 348 ms, where 32 and 64 tokens
    measure 117 and 161 ms, and the load replay's batch ran 8-14 % too full (docs/benchmarks/
    2026-11-27-replay-error-split.md, split-7)."""
    n = np.asarray(prompt_lens, np.float64)
    if lat.prefill is None or not n.size:
        return None
    lo, hi = float(lat.prefill.levels[0]), float(lat.prefill.levels[-1])
    below, above = int((n < lo).sum()), int((n > hi).sum())
    if not below and not above:
        return None
    parts = ([f"{below} below (charged as {lo:g} tokens)"] if below else []) + \
            ([f"{above} above (scaled up from {hi:g} tokens)"] if above else [])
    return (f"prefill: of {n.size} prompts ({n.min():g}-{n.max():g} tokens), {' and '.join(parts)} the profiled "
            f"prefill lengths {lo:g}-{hi:g}; profile --prefill-lengths to cover them")


def plot(lat, path: str | Path | None = None, contexts=None):
    """Measured points and the interpolated curves of `lat`: verify vs V and draft vs W, per context
    level; the overhead and the policy call per cycle. path: save a PNG there (and close the figure)."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, surf, xlabel, title in ((axes[0], lat.verify, "V (verify size)", "verify"),
                                    (axes[1], lat.draft, "W (width)", "draft forward")):
        for c in (contexts or surf.levels):
            m = surf.points["ctx"] == c
            xs = np.linspace(surf.points["x"].min(), surf.points["x"].max(), 200)
            line, = ax.plot(xs, 1e3 * surf(xs, c), lw=1, label=f"ctx {int(c)}")
            if m.any():
                ax.errorbar(surf.points["x"][m], 1e3 * surf.points["median"][m],
                            yerr=1e3 * np.stack([surf.points["median"][m] - surf.points["p10"][m],
                                                 surf.points["p90"][m] - surf.points["median"][m]]),
                            fmt="o", ms=3, color=line.get_color())
        ax.set_xlabel(xlabel); ax.set_ylabel("ms"); ax.set_title(title); ax.legend(fontsize=7)
    ov = lat.overhead.points
    axes[2].plot(ov["ctx"], 1e3 * ov["median"], "o-", label="overhead")
    axes[2].axhline(1e3 * lat.policy_s, color="k", ls="--", label="policy call")
    axes[2].set_xlabel("context length"); axes[2].set_ylabel("ms"); axes[2].legend(); axes[2].set_title("per cycle")
    fig.suptitle(f"latency profile {lat.meta.get('profile_id')} ({lat.meta.get('device')})")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig
