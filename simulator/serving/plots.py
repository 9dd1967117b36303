"""The serving figures (notebooks/04_serving.ipynb), each a function that returns a matplotlib Figure,
and the data each one plots:

    (a) tokens/s against the batch size B, one line per shape
        bench_curves(report)            measured: the JSON of `python -m tools.bench.batch --out FILE`
        replay_curves(logs, lat, ...)   predicted: the closed-batch replay (replay.closed_batch) of the
                                        same shapes at the same B, as `draftgym tune` measures them
        plot_batch_curves(...)          measured solid, replayed dashed, one colour per shape
    (b) a per-B schedule (`draftgym tune`)
        plot_schedule(schedule)         a coloured band per batch-size range, labelled with its shape,
                                        over every tuned candidate's tokens/s (the schedule's shapes and
                                        off in colour, the rest grey)
    (c) each method against the arrival rate
        plot_rate_sweep(sweep)          tokens/s and mean TPOT against the rate, one line per method, from
                                        simulator/serve_eval.py's rate_sweep(cfg, rates)

and what the notebook replays:

        serving_logs(root, fallback)    root when its logs can replay chains (width-1 positions) under a
                                        latency profile measured at several batch sizes, else small
                                        synthetic logs written to `fallback`, with the reason

Figures are built on matplotlib.figure.Figure (no pyplot state): a notebook shows them with
display(fig), a script saves them with fig.savefig. Every line carries its method or shape as its
label, so tests read the figure back.
"""
from __future__ import annotations

import math

import numpy as np

from pipeline.decode import step_shape
from pipeline.errors import DataError
from simulator.serving.inputs import lookup_verify, replayable
from simulator.serving.replay import ShapeTable, closed_batch

AR_NAME = "ar"        # tools.bench.batch's name of the AR method


# ------------------------------------------------------------------ (a) tokens/s against B

def bench_curves(report: dict, key: str = "tokens_per_s") -> list[dict]:
    """One entry per dtype run of a batch-benchmark report:
    {"dtype", "where" (CPU model or device), "batch_sizes" [n], "shapes" {name: (D, W, V)},
     "curves" {name: {B: value}}} with value = by_method[name][str(B)][key] (NaN where missing:
    full_batch_decode_tokens_per_s is None when no step ran at the full batch)."""
    cfg = report.get("config") or {}
    if "batch_sizes" not in cfg or not report.get("runs"):
        raise DataError("not a batch-benchmark report (expected config.batch_sizes and runs: "
                        "python -m tools.bench.batch --out FILE)")
    bs = [int(b) for b in cfg["batch_sizes"]]
    methods = cfg.get("methods") or {}
    out = []
    for run in report["runs"]:
        env = run.get("environment") or {}
        curves = {}
        for name, by in run["by_method"].items():
            val = lambda B: (by.get(str(B)) or {}).get(key)
            curves[name] = {B: float(val(B)) if val(B) is not None else math.nan for B in bs}
        out.append({"dtype": run.get("dtype"), "where": env.get("cpu_model") or env.get("device") or "?",
                    "batch_sizes": bs, "shapes": {n: tuple(methods[n]) for n in curves if n in methods},
                    "curves": curves})
    return out


def replay_curves(logs, latency, shapes: dict, batch_sizes, requests_per_slot: int = 4) -> tuple[dict, list[str]]:
    """Closed-batch tokens/s of each named shape at each B ({name: {B: tokens/s}}, notes): B rows held
    full, max(S, requests_per_slot x B) requests (as tune.tune), so the figure to set beside it is the
    benchmark's full_batch_decode_tokens_per_s (decode steps at the full batch; prefills not modelled).
    Shapes the logs cannot replay are left out and named in the notes."""
    notes, ok = [], {}
    for name, shape in shapes.items():
        s = step_shape.canonical(shape)
        if replayable(logs, s):
            ok[name] = s
        else:
            try:
                lookup_verify(logs, s)
            except DataError as e:
                notes.append(f"{name}: not replayed ({e})")
    if not ok:
        return {}, notes
    table = ShapeTable(logs, list(dict.fromkeys(ok.values())))
    curves = {name: {} for name in ok}
    for B in sorted({int(b) for b in batch_sizes}):
        run = closed_batch(logs, latency, table, B, n_requests=max(logs.n_sequences, requests_per_slot * B))
        for name, s in ok.items():
            curves[name][B] = float(run["tokens_per_s"][table.index(s)])
    return curves, notes


def _colours(names) -> dict:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def _batch_axis(ax, batch_sizes) -> None:
    """A log2 x axis of batch sizes, ticked at the batch sizes shown, labelled 1, 2, 4, ..."""
    bs = sorted({int(b) for b in batch_sizes})
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs, [str(b) for b in bs])
    ax.minorticks_off()
    ax.set_xlabel("batch size B")


def plot_batch_curves(measured: dict | None, predicted: dict | None = None, title: str = "",
                      ylabel: str = "tokens/s"):
    """Tokens/s against B (log2 axis): `measured` {name: {B: value}} as solid lines labelled name,
    `predicted` the same as dashed lines labelled "name (replay)", one colour per name."""
    from matplotlib.figure import Figure

    measured, predicted = measured or {}, predicted or {}
    if not measured and not predicted:
        raise DataError("nothing to plot: no measured and no replayed curve")
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    col = _colours(list(dict.fromkeys([*measured, *predicted])))
    for name, curve in measured.items():
        bs = sorted(curve)
        ax.plot(bs, [curve[b] for b in bs], "o-", color=col[name], label=name)
    for name, curve in predicted.items():
        bs = sorted(curve)
        ax.plot(bs, [curve[b] for b in bs], "s--", color=col[name], alpha=0.8, label=f"{name} (replay)")
    _batch_axis(ax, [b for c in (*measured.values(), *predicted.values()) for b in c])
    ax.set(ylabel=ylabel, title=title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ (b) the schedule

def plot_schedule(schedule, title: str = ""):
    """A tuned schedule over its tuning table (Schedule.tuning, written by `draftgym tune`): tokens/s of
    every candidate against B; one band per range [lo, hi + 1) (the last to the plot's edge) in the
    colour of its shape, the shape named in the band; a star on each tuned B's best."""
    from matplotlib.figure import Figure

    if not schedule.tuning:
        raise DataError("this schedule has no tuning table (write it with `draftgym tune`)")
    t = schedule.tuning
    bs = np.asarray(t["batch_sizes"], np.float64)
    tps = np.asarray(t["tokens_per_s"], np.float64)                           # [n, A]
    labels = list(t["shapes"])
    ranged = list(dict.fromkeys(step_shape.label(s) for _, _, s in schedule.ranges))
    col = _colours(list(dict.fromkeys([*ranged, "off"])))
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    right = max(bs[-1], schedule.max_batch) * 1.5
    for i, (lo, hi, s) in enumerate(schedule.ranges):
        x1 = right if i == len(schedule.ranges) - 1 else hi + 1
        ax.axvspan(lo, x1, color=col[step_shape.label(s)], alpha=0.15, lw=0)
        ax.text(math.sqrt(lo * x1), 0.98, f"{lo}-{hi}\n{step_shape.label(s)}", transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=7)
    for a, name in enumerate(labels):                                        # grey first, coloured on top
        if name not in col:
            ax.plot(bs, tps[:, a], "-", color="0.6", lw=0.6, alpha=0.5, label=name)
    for a, name in enumerate(labels):
        if name in col:
            ax.plot(bs, tps[:, a], "o-", color=col[name], lw=2 if name != "off" else 1.5, ms=3, label=name)
    best = tps.max(1)
    ax.plot(bs, best, "k*", ms=9, label="best at B")
    _batch_axis(ax, bs)
    ax.set_xlim(1, right)
    ax.set_ylim(0, best.max() * 1.25)
    ax.set(ylabel="tokens/s (closed batch)",
           title=title or f"schedule over {len(labels)} candidates (grey: not chosen)")
    handles = [ln for ln in ax.lines if ln.get_label() in col or ln.get_label() == "best at B"]
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ (c) methods against the arrival rate

def plot_rate_sweep(sweep: dict, title: str = ""):
    """Left: tokens/s (busy time) against the arrival rate; right: mean TPOT (ms). One line per method."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.2))
    ax, ax2 = fig.subplots(1, 2)
    col = _colours(list(sweep["methods"]))
    x = sweep["rates"]
    for name, m in sweep["methods"].items():
        style = "k--" if name == "AR" else "o-"
        kw = {} if name == "AR" else {"color": col[name]}
        ax.plot(x, m["tokens_per_s"], style, ms=4, label=name, **kw)
        ax2.plot(x, 1e3 * np.asarray(m["tpot_mean_s"]), style, ms=4, label=name, **kw)
    for a in (ax, ax2):
        a.set_xscale("log")
        a.set_xticks(x, [f"{r:.3g}" for r in x])
        a.minorticks_off()
        a.set_xlabel("arrival rate, requests/s (Poisson)")
    ax.set(ylabel="tokens/s (busy time)", title=title or "throughput against the load")
    ax2.set(ylabel="mean TPOT, ms", title="time per output token")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ which logs to replay

SYNTHETIC = dict(n_sequences=10, widths=(1, 10), new_tokens=(24, 64), max_depth=8,
                 verify_grid=(1, 2, 4, 8, 10, 20, 40, 60), latency_profile="cpu",
                 latency_batches=(1, 2, 4, 8, 16, 32))


def why_not(root) -> str | None:
    """Why the logs under root cannot drive the serving figures (None when they can): missing or
    unreadable, no width-1 positions (chains), a latency profile at batch 1 only, no test sequences."""
    from simulator.latency.model import LatencyModel
    from simulator.logs.replay_logs import load_logs

    try:
        logs = load_logs(root, widths="all", split="all")
        lat = LatencyModel.from_logs(root, model=logs.model, dtype=logs.dtype)
    except DataError as e:
        return f"cannot read {root}: {e}"
    missing = []
    if 1 not in logs.w:
        missing.append(f"width-1 positions (chains; its widths are {list(logs.w)})")
    if len(lat.batch_levels) < 2:
        missing.append(f"a latency profile at several batch sizes (profile {lat.meta.get('profile_id')} is batch 1 only)")
    if "test" not in set(logs.split.tolist()):
        missing.append("test-split sequences")
    return f"{root} lacks " + " and ".join(missing) if missing else None


def tune_split_of(root) -> str:
    """'val' when the logs have val sequences, else 'train' (`make demo` collects train and test only)."""
    from simulator.logs.replay_logs import load_logs

    return "val" if "val" in set(load_logs(root, split="all").split.tolist()) else "train"


def serving_logs(root, fallback, **synthetic) -> tuple[str, str | None]:
    """(logs root to replay, None) when `root` can drive the figures, else (`fallback` with synthetic
    logs written there: SYNTHETIC updated by `synthetic`, reason)."""
    from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs

    reason = why_not(root)
    if reason is None:
        return str(root), None
    write_synthetic_logs(fallback, SyntheticConfig(**{**SYNTHETIC, **synthetic}))
    return str(fallback), reason
