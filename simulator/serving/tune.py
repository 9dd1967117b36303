"""`draftgym tune`: the best shape at each batch size, merged into a schedule.

For every batch size B of --batch-sizes and every candidate shape s (inputs.candidates: off, chains
K = 1..8, the trees the logs support), replay a closed batch of B rows on the tuning split
(replay.closed_batch: B rows always full, each row its own logged acceptance) and measure

    tokens/s(s, B) = sum of tokens / sum of step times    while the batch is held at B

The best s at each B becomes the schedule (schedule.Schedule.from_choices: the choice at B_i holds up
to B_{i+1} - 1, equal neighbours merge). Between two tuned batch sizes whose best shapes differ, tune
first bisects (`refine`, on unless --no-refine): it tunes the middle B with every candidate, and again
between any two neighbours that still differ, until they are adjacent. Each switch then falls at the
batch size where the choice changes, not at the next tuned B: without it, on the H200's 8B-shaped
profile the tree best at B = 8 (tree:3,10,20) held up to B = 15, where it runs 5.9 % below AR
(docs/benchmarks/2026-11-28-gpu-replay-h200.md, gpu-replay 8). Probes cost log2(gap) closed-batch
rounds per switch; a range whose two ends agree is not probed inside. Printed per B: the best shape, its tokens/s, x AR (the
"off" shape at the same B) and x the second best (how sharp the choice is). Written: the schedule
JSON (--out, with the whole tuning table inside, for exports that need the best expressible shape)
and the table as CSV beside it (<out>.csv: batch, shape, tokens_per_s, tau, drafts_per_step, x_ar),
plus a cost-curve plot with --plot.

Printed last, the headroom: how much any per-B schedule can gain over the one shape that is never
far behind (`headroom`):

    gap(s) = max over B of  best tokens/s(B) / tokens/s(s, B)        s* = argmin over s of gap(s)

At every tuned B the schedule's choice is at most gap(s*) times as fast as s*, so over any mix of
these batch sizes a schedule beats the single shape s* by at most gap(s*). A headroom near 1 says
that on this device one static shape is as good as a schedule; the schedule pays where the best
shape at low B and at high B are far apart (a GPU, whose verify is flat in V until B x V reaches
its knee).

The headroom compares with one fixed shape; a trace is served against the best static shape for its
own mix of batch sizes, and the mix bound (`mix_bound`, printed last) is the tight figure. With u_B
the share of the schedule's busy time spent at B and R[B, s] = best tokens/s(B) / tokens/s(s, B),

    gain(u) = min over s of  sum_B u_B R[B, s]     the schedule over the best static shape for mix u
    bound   = max over mixes u of gain(u)           a zero-sum game's value, at most the headroom

(x_B tokens served at B take x_B / best(B) under the schedule and x_B R[B, s] / best(B) under s).
Solved by multiplicative weights for the mix against the static shape's best response, until the
certificates meet within 0.002: a mix whose gain is `lower`, and the static shapes' average play,
which no mix beats by more than `gain`. A goal such as "the schedule >= 1.20x the best static shape"
is out of reach on every trace of these batch sizes when `gain` is below it; the mix that attains it
says which loads a trace must spend its time at to show the gain. The figures are closed-batch ones:
under arrivals the methods' batch sizes differ a little, so for a load replay the bound is close, not
exact.

--context-bins K (K >= 2) adds whether splitting the schedule by context length pays, measured by
exact replay at each tuned B (simulator/serving/context_axis.py).

Logs larger than --max-positions-in-memory: by default tune answers on a seeded window of that many
positions. With --ray it answers on all of them: the split is cut into chunks of at most that many
positions (simulator.logs.ray_chunks, one Ray task each, on this box or the cluster at RAY_ADDRESS),
each chunk replays its own closed batch at every (B, shape), and the chunks' sums are pooled,

    tokens/s(s, B) = sum over chunks of tokens / sum over chunks of step time

(tau and drafts/step likewise over row-steps). One chunk is exactly the in-memory answer; several
are independent closed batches of the same traffic, each chunk's sequences batched together.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from pipeline.cliargs import parse_positive_ints
from pipeline.decode import step_shape
from pipeline.errors import DataError
from simulator.serving import metrics
from simulator.serving.inputs import ServingLogsConfig, load_inputs, log_source, profiled_candidates
from simulator.serving.replay import ShapeTable, closed_batch
from simulator.serving.schedule import Schedule


@dataclass
class TuneConfig(ServingLogsConfig):
    """`draftgym tune` settings (and ServingLogsConfig's)."""
    out: str = ""                         # schedule JSON to write, the table goes to <out>.csv (required)
    batch_sizes: str = "1,2,4,8,16,32"    # batch sizes to tune at
    shapes: str = "all"                   # candidate shapes: chain | tree | all (off is always one)
    split: str = "val"                    # the split the choice is made on
    requests_per_slot: int = 4            # closed batch: max(S, this x B) requests (the split's sequences cycled)
    max_batch: int | None = None          # the last range reaches this batch size (default: the largest tuned B)
    refine: bool = True                   # bisect between tuned B's whose best shapes differ (module docstring)
    plot: str | None = None               # PNG of tokens/s against B per shape
    as_json: bool = False                 # print one JSON object
    ray: bool = False                     # all positions, in chunks of max_positions_in_memory, as Ray tasks
    progress: bool = True                 # progress bar of the Ray chunks
    context_bins: int = 0                 # > 1: also answer whether splitting by context pays (context_axis.py)
    context_min_gain: float = 1.01        # the context split pays at this gain over one shape at some B


def tune_part(logs, latency, batch_sizes, shapes, requests_per_slot: int = 4) -> dict:
    """One set of logs' closed batches at every B: the additive sums {"tokens", "time", "row_steps",
    "drafted"}, each [n, A] (n batch sizes in the order given, A shapes), and "sequences"."""
    table = ShapeTable(logs, shapes)
    runs = [closed_batch(logs, latency, table, B, n_requests=max(logs.n_sequences, requests_per_slot * B))
            for B in batch_sizes]
    out = {k: np.stack([r[k] for r in runs]) for k in ("tokens", "time", "row_steps")}
    out["drafted"] = out["row_steps"] * table.drafts(np.arange(len(table)))[None, :]
    out["sequences"] = int(logs.n_sequences)
    return out


SUMS = ("tokens", "time", "row_steps", "drafted")


def _pool(parts: list[dict], bs: list[int]) -> dict[int, dict]:
    """Parts' sums at batch sizes bs -> {B: {sum key: [A]}}, the parts added (module docstring)."""
    return {B: {k: sum(p[k][i] for p in parts) for k in SUMS} for i, B in enumerate(bs)}


def _best(row: dict) -> int:
    return int(np.argmax(metrics.tokens_per_s(row["tokens"], row["time"])))


def tune(logs, latency, batch_sizes, shapes, requests_per_slot: int = 4, max_batch: int | None = None,
         split: str | None = None, refine: bool = True, measure=None) -> dict:
    """Closed-batch tokens/s of every shape at every B -> {"schedule", "batch_sizes", "refined",
    "shapes" [A], "tokens_per_s" [n, A], "tau" [n, A], "drafts_per_step" [n, A], "sequences"}.
    measure(bs) -> the parts' `tune_part` sums at batch sizes bs, pooled (module docstring; default
    one part, `logs` itself; --ray: one per chunk). refine: bisect between neighbours whose best
    shapes differ; the B's it added are "refined" (n counts them too)."""
    shapes = [step_shape.canonical(s) for s in shapes]
    if measure is None:
        measure = lambda b: [tune_part(logs, latency, b, shapes, requests_per_slot)]
    bs = sorted({int(b) for b in batch_sizes})
    parts = measure(bs)
    rows, n_seq = _pool(parts, bs), sum(p["sequences"] for p in parts)
    while refine:
        known = sorted(rows)
        mids = [(a + b) // 2 for a, b in zip(known, known[1:]) if b - a > 1 and _best(rows[a]) != _best(rows[b])]
        if not mids:
            break
        rows.update(_pool(measure(mids), mids))
    bs_all = sorted(rows)
    tot = {k: np.stack([rows[B][k] for B in bs_all]) for k in SUMS}                    # [n, A] each
    tps = metrics.tokens_per_s(tot["tokens"], tot["time"])                                  # [n, A]
    best = [shapes[_best(rows[B])] for B in bs_all]
    refined = [B for B in bs_all if B not in bs]
    tuning = {"batch_sizes": bs_all, "shapes": [step_shape.label(s) for s in shapes], "tokens_per_s": tps.round(6).tolist()}
    meta = {"split": split, "model": logs.model, "dtype": logs.dtype, "latency_profile": latency.meta.get("profile_id"),
            "device": latency.meta.get("device"), "sequences": n_seq, "chunks": len(parts), "refined": refined}
    sched = Schedule.from_choices(bs_all, best, max_batch=max_batch, tuning=tuning, meta=meta)
    return {"schedule": sched, "batch_sizes": bs_all, "refined": refined, "shapes": shapes, "tokens_per_s": tps,
            "tau": metrics.tau(tot["tokens"], tot["row_steps"]),
            "drafts_per_step": metrics.drafts_per_step(tot["drafted"], tot["row_steps"]),
            "sequences": n_seq}


def tune_chunks_on_ray(cfg, latency, batch_sizes, shapes) -> list[dict]:
    """`tune_part` of every chunk of cfg's split (at most cfg.max_positions_in_memory positions each),
    one Ray task per chunk (simulator.logs.ray_chunks)."""
    from simulator.logs.ray_chunks import map_chunks

    fn = partial(tune_part, latency=latency, batch_sizes=sorted({int(b) for b in batch_sizes}), shapes=list(shapes),
                 requests_per_slot=cfg.requests_per_slot)
    return map_chunks(log_source(cfg, progress=cfg.progress), fn, cfg.max_positions_in_memory, scores=False, desc="tune")


def summary_rows(res: dict) -> list[dict]:
    """One row per tuned B (refined: added by bisection): best shape, tokens/s, x AR, x second best."""
    off = res["shapes"].index(step_shape.OFF)
    out = []
    for i, B in enumerate(res["batch_sizes"]):
        row = res["tokens_per_s"][i]
        o = np.argsort(-row)
        second = row[o[1]] if len(o) > 1 else np.nan
        out.append({"batch": B, "refined": B in res.get("refined", ()), "best": step_shape.label(res["shapes"][o[0]]),
                    "tokens_per_s": float(row[o[0]]),
                    "tau": float(res["tau"][i, o[0]]), "x_ar": float(row[o[0]] / row[off]),
                    "second": step_shape.label(res["shapes"][o[1]]) if len(o) > 1 else None,
                    "x_second": float(row[o[0]] / second) if len(o) > 1 else None})
    return out


def headroom(res: dict) -> dict:
    """The single shape s* whose worst shortfall against each B's best is smallest, and that shortfall:
    {"shape", "gap", "at_batch"} (gap(s) = max_B best(B) / tokens/s(s, B); see the module doc)."""
    tps = res["tokens_per_s"]                                          # [n, A]
    gap = tps.max(1, keepdims=True) / np.maximum(tps, 1e-12)          # [n, A]  best(B) / s at B
    worst = gap.max(0)                                                 # [A]
    a = int(np.argmin(worst))
    return {"shape": step_shape.label(res["shapes"][a]), "gap": float(worst[a]),
            "at_batch": int(res["batch_sizes"][int(np.argmax(gap[:, a]))])}


def mix_bound(res: dict, tol: float = 0.002, max_iters: int = 50_000) -> dict:
    """The most a per-B schedule gains over the best static shape for a mix of the tuned batch sizes,
    over every mix (module docstring): {"gain" (certified from above), "lower" (attained by "mix"),
    "mix" {B: busy-time share >= 1 %}, "static" (the best static shape against that mix)}."""
    tps = np.asarray(res["tokens_per_s"], np.float64)                   # [n, A]
    R = tps.max(1, keepdims=True) / np.maximum(tps, 1e-12)              # [n, A] >= 1, 1 at each B's best
    n = R.shape[0]
    logw, plays = np.zeros(n), np.zeros(R.shape[1])                     # the mix's log weights; the shapes' plays
    lower, best_u, span, upper = 0.0, np.full(n, 1.0 / n), 1e-12, np.inf
    for t in range(1, max_iters + 1):
        u = np.exp(logw - logw.max())
        u /= u.sum()
        v = u @ R                                                       # [A] each static shape against mix u
        s = int(np.argmin(v))                                           # the best static shape for it
        if v[s] > lower:
            lower, best_u = float(v[s]), u
        plays[s] += 1
        upper = min(upper, float((R @ plays).max() / t))                # no mix beats the average play by more
        if upper - lower <= tol:
            break
        span = max(span, float(np.ptp(R[:, s])))
        logw += np.sqrt(np.log(max(n, 2)) / t) / span * R[:, s]         # the mix moves to where s loses most
    bs = res["batch_sizes"]
    return {"gain": upper, "lower": lower, "static": step_shape.label(res["shapes"][int(np.argmin(best_u @ R))]),
            "mix": {int(bs[i]): float(best_u[i]) for i in range(n) if best_u[i] >= 0.01}}


def write_table(res: dict, path: Path) -> Path:
    off = res["shapes"].index(step_shape.OFF)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["batch", "shape", "tokens_per_s", "tau", "drafts_per_step", "x_ar"])
        for i, B in enumerate(res["batch_sizes"]):
            for a, s in enumerate(res["shapes"]):
                tps = res["tokens_per_s"][i, a]
                w.writerow([B, step_shape.label(s), f"{tps:.6g}", f"{res['tau'][i, a]:.6g}", f"{res['drafts_per_step'][i, a]:.6g}",
                            f"{tps / res['tokens_per_s'][i, off]:.6g}"])
    return path


def plot_curves(res: dict, path) -> None:
    """tokens/s x AR against B: off, every chain, and each B's best tree."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bs, tps = res["batch_sizes"], res["tokens_per_s"]
    off = res["shapes"].index(step_shape.OFF)
    ratio = tps / tps[:, [off]]
    show = [a for a, s in enumerate(res["shapes"]) if step_shape.is_chain(s)]
    show += sorted({int(np.argmax(np.where([step_shape.is_chain(s) for s in res["shapes"]], -np.inf, ratio[i])))
                    for i in range(len(bs))} - set(show))
    fig, ax = plt.subplots(figsize=(7, 4))
    chains = [a for a in show if step_shape.is_chain(res["shapes"][a])]
    for i, a in enumerate(show):
        s = res["shapes"][a]
        if step_shape.is_chain(s):                      # chains: thin, shades of one colour map; trees: bold, dashed
            ax.plot(bs, ratio[:, a], ".-", lw=1, color=plt.cm.viridis(i / max(len(chains), 1)), label=step_shape.label(s))
        else:
            ax.plot(bs, ratio[:, a], "o--", lw=2, color=plt.cm.tab10(i - len(chains)), label=step_shape.label(s))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("tokens/s / AR at the same B")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("closed-batch replay: which shape pays at which load")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_tune_command(cfg: TuneConfig) -> int:
    bs = parse_positive_ints(cfg.batch_sizes, "--batch-sizes")
    logs, lat = load_inputs(cfg, window_note=not cfg.ray)
    if logs.n_sequences == 0:
        raise DataError(f"no sequences in split {cfg.split!r}")
    cands, note = profiled_candidates(logs, lat, cfg.shapes)
    measure = (lambda b: tune_chunks_on_ray(cfg, lat, b, cands)) if cfg.ray else None
    res = tune(logs, lat, bs, cands, cfg.requests_per_slot, cfg.max_batch, cfg.split, refine=cfg.refine, measure=measure)
    sched = res["schedule"]
    out = sched.save(cfg.out)
    table = write_table(res, out.with_suffix(".csv"))
    if cfg.plot:
        plot_curves(res, cfg.plot)
    rows, room, bound = summary_rows(res), headroom(res), mix_bound(res)
    ctx = None
    if cfg.context_bins:
        from simulator.serving.context_axis import context_axis, context_lines

        ctx = context_axis(logs, lat, bs, cands, cfg.context_bins, cfg.requests_per_slot, cfg.context_min_gain)
    if cfg.as_json:
        print(json.dumps({"schedule": sched.to_json()["ranges"], "per_batch": rows, "headroom": room, "mix_bound": bound,
                          "context_axis": ctx, "out": str(out),
                          "table": str(table), "plot": cfg.plot, "note": note, "what_if": lat.meta.get("what_if")}))
        return 0
    chunks = f" in {sched.meta['chunks']} Ray chunks" if cfg.ray else ""
    print(f"tuned on {res['sequences']} {cfg.split} sequences{chunks}, {len(res['shapes'])} shapes, latency "
          f"{lat.meta.get('profile_id')} ({lat.meta.get('device')})" + (" [what-if]" if lat.meta.get("what_if") else ""))
    print(f"{'B':>5}  {'best shape':<16} {'tokens/s':>10} {'x AR':>6} {'x 2nd':>6}  second")
    for r in rows:
        print(f"{str(r['batch']) + ('*' if r['refined'] else ''):>5}  {r['best']:<16} {r['tokens_per_s']:>10.1f} {r['x_ar']:>6.2f} "
              f"{(r['x_second'] or float('nan')):>6.3f}  {r['second']}")
    if res["refined"]:
        print(f"* probed between tuned batch sizes whose best shapes differ ({len(res['refined'])} more; --no-refine: none)")
    print("schedule: " + ", ".join(f"B {b} -> {s}" for b, s in sched.table()))
    print(f"headroom: at every tuned B the best shape is within {room['gap']:.3f}x of {room['shape']} (furthest at "
          f"B = {room['at_batch']}), so over any mix of these batch sizes a schedule gains at most {room['gap']:.3f}x "
          f"over {room['shape']} alone")
    mix = ", ".join(f"B {b} {100 * w:.0f} %" for b, w in bound["mix"].items())
    print(f"mix bound: over any mix of these batch sizes a schedule gains at most {bound['gain']:.3f}x over the best "
          f"static shape for that mix ({bound['lower']:.3f}x attained with {mix} of its busy time, against "
          f"{bound['static']})")
    for line in context_lines(ctx) if ctx else ():
        print(line)
    print(f"wrote {out} and {table}" + (f" and {cfg.plot}" if cfg.plot else ""))
    if note:
        print("note: " + note)
    return 0
