"""`draftgym validate`'s sim-vs-real: the replay's predictions for the prompts and methods just decoded,
against the measured cycles (tau, decode tokens/s, per-cycle time components), and the clock alone:
decoding's own cycles or steps priced by the profile (`cycle_cost` at batch 1, `step_cost` for the
batched engine's steps, used by validate --batch-sizes and --load-trace)."""
from __future__ import annotations

import statistics

import numpy as np

from pipeline import metrics
from pipeline.decode.step_shape import EAGLE3_DEFAULT_SHAPE
from simulator import baselines
from simulator.policy_specs import load_policy
from simulator.replay import autoregressive, simulate


def decode_tokens_per_s(res) -> float | None:
    """Cycle-only throughput of one generation: sum(emitted) / sum(t_cycle). AR has no cycles: its
    decode steps after the prefill's token, (new_tokens - 1) / (wall - prefill)."""
    if res.method == "ar":
        t = res.wall_s - res.prefill_s
        return (res.new_tokens - 1) / t if t > 0 and res.new_tokens > 1 else None
    t = sum(c.t_cycle for c in res.cycles)
    return sum(c.emitted for c in res.cycles) / t if t > 0 else None



def sim_vs_real(cfg, sim, recs, runs, labels, reanchored=None) -> dict:
    """Simulator predictions for the same prompts and policies vs the measured cycles (`cfg`: the
    Batch1Config; `sim`: its SimSide, the acceptance logs and the latency clocks).

    reanchored: online.validate.reanchor's `Reanchored` (each method's own decoded texts, collected), a
    {"note"} when that failed, or None. With it every method also gets a "reanchored" entry: the same
    policy object replayed on its own text with the same clock, its errors against the same measured
    tau and decode tokens/s (where the logs' error mixes the simulator's with a different text's).

    Also the AR row: the simulator's AR (t_ar per token) against measured AR decoding. Its error is
    the profile's view of this machine's speed against the speed during this validation, so
    `machine_speed_factor` = real AR decode tokens/s / simulated, and every method's
    `tokens_per_s_rel_error_ar_anchored` is its error after the simulated tokens/s are scaled by
    that factor (equivalently: the error of the predicted speedup vs AR). A diagnostic: the raw
    error is the one the <= 10 % sim-vs-real target is about.

    With --profile-interleave the clock is time-local: the pooled profile rescaled by the speed its
    own samples saw while this dataset decoded (`profile_speed_factor`; never fitted to the decoding
    being predicted). `tokens_per_s_rel_error_pooled` keeps the error of the unscaled pooled profile.

    Two measures of the clock alone (the replay's path, its acceptance on the logs' text, left out):
      cost         each method's own measured cycles priced by the clock (`cycle_cost`): the
                   profile's cells against decoding's steps at the same (D, W, V, c), same run
      by_point     the raw tokens/s error of every method with the clock priced at each cell
                   statistic (simulator/latency/estimate.py: robust, mean, median), the measurement
                   behind the default"""
    logs, lat, pooled = sim.logs, sim.lat, sim.clock
    local = sim.local.get(recs[0].dataset)
    clock = local[0] if local else pooled        # time-local when --profile-interleave sampled this dataset
    ids = [r.prompt_id for r in recs]
    keep = np.isin(logs.prompt_id, ids)
    missing = sorted(set(ids) - set(logs.prompt_id[keep].tolist()))
    if not keep.any():
        return {"note": f"no logged sequences for these prompts in {cfg.logs} (collect them first)"}
    ev = logs.subset(keep)
    order = [ids.index(p) for p in ev.prompt_id.tolist()]         # log row -> prompt index
    ds = recs[0].dataset
    pols = {"static": baselines.StaticPolicy(*EAGLE3_DEFAULT_SHAPE), "grid-best": baselines.StaticPolicy(*sim.grid_best(ds))}
    for spec, label in zip(cfg.policies, labels):
        pols[label] = load_policy(spec, logs=ev, latency=lat)

    def real_decode(m):          # per logged prompt: mean over runs of the decode tokens/s
        return [statistics.mean(d for run in m.results if (d := decode_tokens_per_s(run[i])) is not None)
                for i in order]

    ar_sim = autoregressive(ev, clock).tokens_per_s
    ar_real = real_decode(runs["ar"])
    by_point = {p: {"ar": float(metrics.rel_error(np.mean(autoregressive(ev, c).tokens_per_s), np.mean(ar_real)))}
                for p, c in sim.clocks_at_points(ds).items()}
    speed = float(np.mean(ar_real) / np.mean(ar_sim))       # > 1: the machine ran faster than profiled
    out = {"missing_prompts": missing, "machine_speed_factor": speed,
           "profile_speed_factor": {"factor": local[1][0], "cells": local[1][1]} if local else None,
           "ar": {"sim_decode_tokens_per_s": float(np.mean(ar_sim)), "real_decode_tokens_per_s": float(np.mean(ar_real)),
                  "tokens_per_s_rel_error": float(metrics.rel_error(np.mean(ar_sim), np.mean(ar_real)))},
           "methods": {}}
    if reanchored is not None:
        out["reanchored"] = reanchored if isinstance(reanchored, dict) else reanchored.info
    if local:
        ar_pooled = autoregressive(ev, pooled).tokens_per_s
        out["ar"]["tokens_per_s_rel_error_pooled"] = float(metrics.rel_error(np.mean(ar_pooled), np.mean(ar_real)))
    for name, pol in pols.items():
        res = simulate(pol, ev, clock)          # the policy as built online (lat), timed by the clock
        m = runs[name]
        real_tau = m.tau(order)
        real_dec = real_decode(m)
        sim_tau = float(metrics.tau(res.tokens.sum(), res.cycles.sum()))
        sim_dec = res.tokens_per_s.tolist()
        err = lambda scale: err_of(scale * np.mean(sim_dec), real_dec)
        out["methods"][name] = {
            "sim_tau": sim_tau, "real_tau": real_tau, "tau_rel_error": metrics.rel_error(sim_tau, real_tau),
            "sim_decode_tokens_per_s": float(np.mean(sim_dec)), "real_decode_tokens_per_s": float(np.mean(real_dec)),
            "tokens_per_s_rel_error": err(1.0), "tokens_per_s_rel_error_ar_anchored": err(speed),
            "per_prompt": [{"prompt_id": ev.prompt_id[i], "sim": sim_dec[i], "real": real_dec[i]} for i in range(len(order))],
            "per_cycle_ms": per_cycle_components(res, m, order),
            "cost": cycle_cost([c for run in m.results for i in order for c in run[i].cycles], clock)}
        for p, c in sim.clocks_at_points(ds).items():
            by_point[p][name] = err_of(np.mean(simulate(pol, ev, c).tokens_per_s), real_dec)
        if reanchored is not None and not isinstance(reanchored, dict) and name in reanchored.seq_ids:
            out["methods"][name]["reanchored"] = reanchored.replay(name, pol, order, clock, real_tau, real_dec)
        if local:
            pooled_dec = float(np.mean(simulate(pol, ev, pooled).tokens_per_s))
            out["methods"][name]["tokens_per_s_rel_error_pooled"] = float(metrics.rel_error(pooled_dec, np.mean(real_dec)))
    out["by_point"] = by_point
    return out


def err_of(sim: float, real: list[float]) -> float:
    """(sim - mean real) / mean real."""
    return float(metrics.rel_error(sim, np.mean(real)))


def cycle_cost(cycles, clock) -> dict:
    """Decoding's own cycles priced by the clock at their (D, W, V, c), against their measured times:
    the relative error of the summed draft (D t_draft(W, c)), verify (t_verify(V, c)) and step (the
    cycle less its controller calls, against t_step) times, and of the verify per V. Where these
    are near 0 the profile prices what decoding runs, and a tokens/s error comes from the path (the
    acceptance on the logs' text), not the clock."""
    if not cycles:
        return {}
    col = lambda f, dt=np.int64: np.array([f(c) for c in cycles], dt)
    D, W, V, ctx = col(lambda c: c.depth), col(lambda c: max(c.width, 1)), col(lambda c: c.verify_size), col(lambda c: c.context_len)
    real = {"draft": col(lambda c: c.t_draft, np.float64), "verify": col(lambda c: c.t_verify, np.float64),
            "step": col(lambda c: c.t_cycle - c.t_controller, np.float64)}
    priced = {"draft": D * clock.t_draft(W, ctx), "verify": clock.t_verify(V, ctx), "step": clock.t_step(D, W, V, ctx)}
    rel = lambda k, m: float(metrics.rel_error(float(priced[k][m].sum()), float(real[k][m].sum()))) if real[k][m].sum() > 0 else None
    every = np.ones(len(cycles), bool)
    return {**{k: rel(k, every) for k in real}, "verify_by_V": {int(v): rel("verify", V == v) for v in np.unique(V)},
            "cycles": len(cycles)}


def per_cycle_components(res, m, order) -> dict:
    """Mean per-cycle time components (ms), simulated vs measured: where a tokens/s error comes from."""
    cyc = [c for run in m.results for i in order for c in run[i].cycles]
    n_sim = max(int(res.cycles.sum()), 1)
    real = {"draft": np.mean([c.t_draft for c in cyc]), "verify": np.mean([c.t_verify for c in cyc]),
            "policy": np.mean([c.t_controller for c in cyc]),
            "overhead": np.mean([c.t_overhead for c in cyc])} if cyc else {}
    simc = {k: float(res.components[f"t_{k}"].sum() / n_sim) for k in ("draft", "verify", "policy", "overhead")
            if f"t_{k}" in res.components}
    return {"sim": {k: 1e3 * v for k, v in simc.items()}, "real": {k: 1e3 * float(v) for k, v in real.items()}}


def step_cost(steps, lat) -> dict:
    """The profile's price of the device's own batched steps (StepRecords) against their measured
    engine time, the controller's calls left out of both (online/validate/load.py, "Cost and path"; the
    batch-1 twin over cycles is `cycle_cost`): {"rel_error": over all steps, "by_batch": {B: over
    the steps at B}}."""
    if not steps:
        return {"rel_error": None, "by_batch": {}}
    col = lambda f, dt=np.int64: np.array([f(s) for s in steps], dt)
    B, D, W, V = col(lambda s: s.batch_size), col(lambda s: s.depth), col(lambda s: s.width), col(lambda s: s.verify_size)
    measured = col(lambda s: s.t_step - s.t_controller, np.float64)
    priced = np.zeros(len(steps))
    for b in np.unique(B):                       # one call per B: its steps' contexts are one [n, B] array
        m = B == b
        c = lat.step_context(np.array([s.context_lens for s, on in zip(steps, m) if on], np.float64))
        priced[m] = lat.t_step(D[m], W[m], V[m], c, batch=int(b))
    err = lambda m: metrics.rel_error(float(priced[m].sum()), float(measured[m].sum()))
    return {"rel_error": err(np.ones(len(steps), bool)), "by_batch": {int(b): err(B == b) for b in np.unique(B)}}
