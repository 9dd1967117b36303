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
from functools import partial
from pathlib import Path

import numpy as np

from pipeline.errors import DataError, DraftGymError
from simulator import baselines
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import ReplayLogs
from simulator.logs.read import NO_CANDIDATES
from simulator.logs.stream import DEFAULT_MAX_POSITIONS, LogSource
from simulator.policy_specs import CHECKPOINT, load_policy, parse_spec
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


@dataclass
class Plan:
    """What every chunk of the evaluated split is replayed with (pickled to Ray tasks as it is)."""
    split: str
    policies: list
    latency: LatencyModel
    grid_best: dict                      # dataset -> (D, W, V)
    grid_best_all: tuple
    fit_logs: ReplayLogs | None = None   # goodput's fit (the training split of a window), else None


def grid_part(logs: ReplayLogs, tune: str, lat: LatencyModel, cfg: np.ndarray):
    """Pass 1 on one chunk: per-sequence tokens/s [S, A] of the static configs `cfg` on its tuning split."""
    t = logs.select(tune)
    if not t.n_sequences:
        return None
    r = baselines.simulate_static(t, lat, cfg)
    return t.source_index, r["tokens"][:, None] / np.maximum(r["time"], 1e-12), t.dataset


def grid_search_parts(parts, cfg: np.ndarray) -> dict:
    """baselines.grid_search's answer from grid_part's outputs over chunks of one selection (None: a chunk without
    tuning sequences), the sequences put back in the logs' order: the in-memory search's figures."""
    got = [g for g in parts if g]
    order = np.argsort(np.concatenate([g[0] for g in got]), kind="stable")
    return baselines.best_static(cfg, np.concatenate([g[1] for g in got])[order], np.concatenate([g[2] for g in got])[order])


def eval_part(logs: ReplayLogs, plan: Plan) -> dict | None:
    """Pass 2 on one chunk: every reference method and policy on its evaluated split ->
    {"results": {name: (source_index, SimResult)}, "names", "ctx", "notes", "default"}."""
    ev = logs.select(plan.split)
    if not ev.n_sequences:
        return None
    lat, default = plan.latency, baselines.default_static(ev)
    runs = {"ar": lambda: autoregressive(ev, lat),
            "static": lambda: simulate(baselines.StaticPolicy(*default), ev, lat),
            "grid-best": lambda: simulate(PerDatasetStatic(ev, plan.grid_best, plan.grid_best_all), ev, lat),
            "oracle": lambda: simulate(baselines.OraclePolicy(ev, lat), ev, lat)}
    out = {"results": {name: (ev.source_index, run()) for name, run in runs.items()}, "names": {},
           "ctx": ev.context_len.astype(np.int32), "notes": list(logs.notes), "default": default}
    for spec in plan.policies:
        if spec in runs:                          # e.g. --policy oracle: already a reference row
            continue
        try:
            pol = load_policy(spec, logs=ev, latency=lat, fit_logs=plan.fit_logs)
            res = simulate(pol, ev, lat)
        except ValueError as e:
            raise DraftGymError(f"policy {spec}: {e}") from None
        out["results"][spec] = (ev.source_index, res)
        out["names"][spec] = getattr(pol, "name", spec)
    return out


def evaluate(logs_root: str | Path, split: str = "test", policies: list[str] | None = None, model: str | None = None,
             temperature: float | None = None, datasets=None, profile: str | None = None,
             latency_root: str | Path | None = None, tune_split: str | None = "auto", dtype: str | None = None,
             latency_dtype: str | None = None, max_positions_in_memory: int | None = None,
             progress: bool = False, ray: bool = False) -> dict:
    """The report of `draftgym evaluate`. Logs of more than max_positions_in_memory positions (None: no
    limit) are replayed a chunk at a time (simulator.logs.stream): grid-best's search over the tuning split
    in one pass, every method over the evaluated split in a second, the goodput heuristic fitted on a
    sampled window of the training split. ray=True runs each chunk of each pass as a Ray task
    (simulator.logs.ray_chunks; RAY_ADDRESS: a cluster). Per-sequence results are put back in the logs'
    order, so the figures equal the in-memory path's (tests/simulator/logs/test_logs_stream.py, tests/pipeline/collect/test_cluster.py)."""
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
    whole = src.sample(budget) if src.n_positions <= budget and not ray else None   # everything, in the logs' order
    if whole is not None:
        each = lambda fn, desc, scores=True: [fn(whole)]
    elif ray:
        from simulator.logs.ray_chunks import map_chunks
        each = lambda fn, desc, scores=True: map_chunks(src, fn, budget, scores=scores, desc=desc)
    else:
        each = lambda fn, desc, scores=True: (fn(c) for c in src.chunks(budget, desc=desc, scores=scores))

    # pass 1: grid-best per dataset, searched on the tuning split
    cfg = baselines.static_space(src.sel)                          # every depth, logged width and grid V >= 2
    gs = grid_search_parts(each(partial(grid_part, tune=tune, lat=lat, cfg=cfg), "grid search", scores=False), cfg)
    per_ds = {d: v["config"] for d, v in gs["by_dataset"].items() if d != "all"}
    fit_logs = None
    if any(spec.split(":")[0] == "goodput" for spec in policies or []):     # the one heuristic fitted on logs
        window = whole if whole is not None else src.sample(budget)
        train = window.select("train")
        fit_logs = train if train.n_sequences else window.select(tune)
    plan = Plan(split, list(policies or []), lat, per_ds, gs["by_dataset"]["all"]["config"], fit_logs)

    # pass 2: every method on the evaluated split (the candidates are read only for checkpoints: LTD reads them)
    need = any(parse_spec(spec)[0] == CHECKPOINT for spec in policies or [])
    outs = [o for o in each(partial(eval_part, plan=plan), "evaluate", scores=True if need else NO_CANDIDATES) if o]
    if not outs:
        raise DataError(f"no sequences in split {split!r} (splits: {have})")
    res = {name: concat_results([o["results"][name] for o in outs]) for name in outs[0]["results"]}
    notes = list(src.notes) + [n for n in dict.fromkeys(x for o in outs for x in o["notes"]) if n not in src.notes]
    dataset = res["ar"].dataset
    groups = {"all": np.ones(len(dataset), bool), **{d: dataset == d for d in sorted(set(dataset.tolist()))}}
    results = {name: metrics(r, res, groups) for name, r in res.items()}
    for spec, name in outs[0]["names"].items():
        results[spec]["all"]["policy_name"] = name
    ctx = np.concatenate([o["ctx"] for o in outs])
    return {"logs": str(logs_root), "model": src.sel.model, "temperature": src.sel.temperature, "split": split,
            "tune_split": tune, "latency": lat.meta, "static_default": list(outs[0]["default"]),
            "grid_best": {d: list(v["config"]) for d, v in gs["by_dataset"].items()},
            "datasets": list(groups), "results": results, "notes": notes,
            "latency_coverage": lat.coverage(ctx, tuple(src.sel.widths), src.sel.verify_grid),
            "positions": int(len(ctx)), "streamed": whole is None}


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
    ray: bool = False                    # each chunk a Ray task (embedded Ray, or the cluster at RAY_ADDRESS)


def run_evaluate_command(cfg: EvaluateConfig) -> int:
    rep = evaluate(cfg.logs, split=cfg.split, policies=cfg.policies, model=cfg.model, temperature=cfg.temperature,
                   datasets=cfg.dataset, profile=cfg.profile, latency_root=cfg.latency, tune_split=cfg.tune_split,
                   dtype=cfg.dtype, latency_dtype=cfg.latency_dtype, max_positions_in_memory=cfg.max_positions_in_memory,
                   progress=cfg.progress, ray=cfg.ray)
    if cfg.as_json:
        print(json.dumps(rep, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
    else:
        print_report(rep)
    return 0
