"""`draftgym evaluate`: replay policies and baselines on a split of the logs, per dataset.

Reference methods, always reported:
    ar          autoregressive decoding: per token t_verify(V=1, c) + t_overhead(c)
    static      EAGLE-3's default (8, 10, 60)
    grid-best   the best static (D, W, V) per dataset, chosen on the tuning split (val, else train,
                else the evaluated split itself; reported) and replayed on the evaluated split
    oracle      hindsight DP over the static shape space (upper bound; simulator/baselines.py)

Per dataset (and "all"): tau (iteration-weighted), tokens/s (mean of per-sequence speeds,
Spec-Bench), speedup vs AR, vs static, vs grid-best (ratios of mean speeds) and % of oracle.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.errors import DataError, DraftGymError
from simulator import baselines as B
from simulator.latency_model import LatencyModel
from simulator.logs.load import ReplayLogs
from simulator.logs.stream import DEFAULT_MAX_POSITIONS, LogSource
from simulator.policy_specs import load_policy, parse_spec
from simulator.policies.base import Policy, Shape
from simulator.replay import SimResult, autoregressive, concat_results, simulate


class PerDatasetStatic(Policy):
    """A static config per dataset (grid-best)."""

    def __init__(self, logs: ReplayLogs, configs: dict[str, tuple[int, int, int]], fallback: tuple[int, int, int]):
        self.cfg = np.array([configs.get(d, fallback) for d in logs.dataset], np.int64)     # [S, 3]
        self.name = "grid-best"

    def plan(self, b):
        c = self.cfg[b.seq]
        return Shape(c[:, 0], c[:, 1], c[:, 2], np.zeros(len(b.env), np.int64))


def pick_tune_split(splits, split: str, tune_split: str | None) -> str:
    if tune_split and tune_split != "auto":
        return tune_split
    have = set(np.asarray(splits).tolist())
    for s in ("val", "train"):
        if s in have and s != split:
            return s
    return split


def metrics(res: SimResult, ref: dict[str, SimResult], groups: dict[str, np.ndarray]) -> dict[str, dict]:
    out = {}
    for g, m in groups.items():
        s = res.summary(m)
        tps = s["tokens_per_s"]
        row = {"sequences": s["sequences"], "tau": s["tau"], "tokens_per_s": tps, "mean_accepted": s["mean_accepted"]}
        for key, name in (("speedup_vs_ar", "ar"), ("vs_static", "static"), ("vs_grid_best", "grid-best")):
            row[key] = tps / ref[name].summary(m)["tokens_per_s"]
        row["pct_oracle"] = 100.0 * tps / ref["oracle"].summary(m)["tokens_per_s"]
        out[g] = row
    return out


def evaluate(logs_root: str | Path, split: str = "test", policies: list[str] | None = None, model: str | None = None,
             temperature: float | None = None, datasets=None, profile: str | None = None,
             latency_root: str | Path | None = None, tune_split: str | None = "auto", dtype: str | None = None,
             latency_dtype: str | None = None, max_positions_in_memory: int | None = None,
             progress: bool = False) -> dict:
    """The report of `draftgym evaluate`. Logs of more than max_positions_in_memory positions (None: no
    limit) are replayed a chunk at a time (simulator.logs.stream): grid-best's search over the tuning split
    in one pass, every method over the evaluated split in a second, the goodput heuristic fitted on a
    sampled window of the training split. Per-sequence results are put back in the logs' order, so the
    figures equal the in-memory path's (tests/test_logs_stream.py)."""
    for spec in policies or []:
        parse_spec(spec)                 # a bad spec fails in one line before the logs load
    src = LogSource(logs_root, model=model, temperature=temperature, datasets=datasets, widths="all", dtype=dtype,
                    progress=progress)
    lat = LatencyModel.from_logs(latency_root or logs_root, model=src.sel.model, profile=profile,
                                 dtype=latency_dtype or src.sel.dtype)
    have = sorted(set(src.sel.splits.tolist()))
    if split != "all" and split not in have:
        raise DataError(f"no sequences in split {split!r} (splits: {have})")
    tune = pick_tune_split(src.sel.splits, split, tune_split)
    if tune != "all" and tune not in have:
        raise DataError(f"no sequences in tuning split {tune!r}")
    budget = max_positions_in_memory or src.n_positions
    whole = src.sample(budget) if src.n_positions <= budget else None      # everything, in the logs' order
    chunks = (lambda desc: [whole]) if whole is not None else (lambda desc: src.chunks(budget, desc=desc))
    window = whole if whole is not None else src.sample(budget)
    train = window.select("train")
    fit_logs = train if train.n_sequences else window.select(tune)

    # pass 1: grid-best per dataset, searched on the tuning split
    cfg, tps, ds = None, [], []
    for logs in chunks("grid search"):
        t = logs.select(tune)
        if t.n_sequences:
            cfg = B.static_space(t) if cfg is None else cfg
            r = B.simulate_static(t, lat, cfg)
            tps.append((t.source_index, r["tokens"][:, None] / np.maximum(r["time"], 1e-12)))
            ds.append((t.source_index, t.dataset))
    order = np.argsort(np.concatenate([i for i, _ in tps]), kind="stable")
    gs = B.best_static(cfg, np.concatenate([x for _, x in tps])[order], np.concatenate([x for _, x in ds])[order])
    per_ds = {d: v["config"] for d, v in gs["by_dataset"].items() if d != "all"}

    # pass 2: every method on the evaluated split
    parts: dict[str, list] = {}
    ctx, default, names, notes = [], None, {}, list(src.notes)
    for logs in chunks("evaluate"):
        ev = logs.select(split)
        if not ev.n_sequences:
            continue
        default = default or B.default_static(ev)
        ctx.append(ev.context_len.astype(np.int32))
        notes += [n for n in logs.notes if n not in notes]
        runs = {"ar": lambda: autoregressive(ev, lat),
                "static": lambda: simulate(B.StaticPolicy(*default), ev, lat),
                "grid-best": lambda: simulate(PerDatasetStatic(ev, per_ds, gs["by_dataset"]["all"]["config"]), ev, lat),
                "oracle": lambda: simulate(B.OraclePolicy(ev, lat), ev, lat)}
        for name, run in runs.items():
            parts.setdefault(name, []).append((ev.source_index, run()))
        for spec in policies or []:
            if spec in runs:                      # e.g. --policy oracle: already a reference row
                continue
            try:
                pol = load_policy(spec, logs=ev, latency=lat, fit_logs=fit_logs)
                res = simulate(pol, ev, lat)
            except ValueError as e:
                raise DraftGymError(f"policy {spec}: {e}") from None
            parts.setdefault(spec, []).append((ev.source_index, res))
            names[spec] = getattr(pol, "name", spec)
    if not parts:
        raise DataError(f"no sequences in split {split!r} (splits: {have})")
    res = {name: concat_results(p) for name, p in parts.items()}
    dataset = res["ar"].dataset
    groups = {"all": np.ones(len(dataset), bool), **{d: dataset == d for d in sorted(set(dataset.tolist()))}}
    results = {name: metrics(r, res, groups) for name, r in res.items()}
    for spec, name in names.items():
        results[spec]["all"]["policy_name"] = name
    widths = tuple(src.sel.widths)
    return {"logs": str(logs_root), "model": src.sel.model, "temperature": src.sel.temperature, "split": split,
            "tune_split": tune, "latency": lat.meta, "static_default": list(default),
            "grid_best": {d: list(v["config"]) for d, v in gs["by_dataset"].items()},
            "datasets": list(groups), "results": results, "notes": notes,
            "latency_coverage": lat.coverage(np.concatenate(ctx), widths, src.sel.verify_grid),
            "positions": int(sum(len(c) for c in ctx)), "streamed": whole is None}


def print_report(rep: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, 120))
    t = Table(title=f"DraftGym replay: {rep['model']} T={rep['temperature']:g} split={rep['split']} "
                    f"(grid-best tuned on {rep['tune_split']}; latency {rep['latency'].get('profile_id')})")
    for col in ("dataset", "method", "seqs", "tau", "tok/s", "x AR", "x static", "x grid", "% oracle"):
        t.add_column(col, justify="left" if col in ("dataset", "method") else "right", no_wrap=True)
    for ds in rep["datasets"]:
        for i, (name, per) in enumerate(rep["results"].items()):
            r = per[ds]
            t.add_row(ds if i == 0 else "", name, str(r["sequences"]), f"{r['tau']:.2f}", f"{r['tokens_per_s']:.1f}",
                      f"{r['speedup_vs_ar']:.2f}", f"{r['vs_static']:.2f}", f"{r['vs_grid_best']:.2f}",
                      f"{r['pct_oracle']:.0f}")
        t.add_section()
    console.print(t)
    gb = ", ".join(f"{d}: {tuple(c)}" for d, c in rep["grid_best"].items())
    console.print(f"static default (D, W, V) = {tuple(rep['static_default'])}; grid-best per dataset: {gb}")
    cov = rep.get("latency_coverage", {})
    if cov.get("verify_ctx_outside", 0) > 0.05:
        console.print(f"[yellow]note: {100 * cov['verify_ctx_outside']:.0f}% of roots have a context length outside "
                      f"the latency profile's range (times are extrapolated flat): profile longer contexts[/yellow]")
    for n in rep.get("notes", []) + ([rep["latency"]["note"]] if rep["latency"].get("note") else []):
        console.print(f"note: {n}")


@dataclass
class EvaluateConfig:
    """`draftgym evaluate`: policies and baselines replayed on logged decoding (tau, tokens/s, speedups)."""

    logs: str = ""                       # logs root: sequences/, positions/, latency/ (required)
    model: str | None = None             # model partition; None: the only one
    temperature: float | None = None     # temperature partition; None: the only one
    dataset: str | None = None           # comma-separated datasets; None: all
    dtype: str | None = None             # the logs' compute dtype; None: the only one
    latency_dtype: str | None = None     # time the replay with a profile of this dtype instead of the logs' own
    profile: str | None = None           # latency profile_id; None: the newest of the logs' dtype
    latency: str | None = None           # root holding latency/; None: `logs`
    split: str = "test"                  # train | val | test | all
    policies: list[str] = field(default_factory=list)   # checkpoint dirs or built-in specs (simulator.policy_specs)
    tune_split: str = "auto"             # split for grid-best selection; auto: val, else train
    as_json: bool = False                # print one JSON object instead of the table
    max_positions_in_memory: int = DEFAULT_MAX_POSITIONS   # larger logs are replayed a chunk at a time
    progress: bool = True                # progress bars (stderr) on long reads


def run_evaluate_command(cfg: EvaluateConfig) -> int:
    rep = evaluate(cfg.logs, split=cfg.split, policies=cfg.policies, model=cfg.model, temperature=cfg.temperature,
                   datasets=cfg.dataset, profile=cfg.profile, latency_root=cfg.latency, tune_split=cfg.tune_split,
                   dtype=cfg.dtype, latency_dtype=cfg.latency_dtype, max_positions_in_memory=cfg.max_positions_in_memory,
                   progress=cfg.progress)
    if cfg.as_json:
        print(json.dumps(rep, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
    else:
        print_report(rep)
    return 0
