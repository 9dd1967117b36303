"""`draftgym serve-eval`: every way of choosing speculation under one load, in one table.

The load: requests arrive by a Poisson process whose rate sweeps upwards (arrivals.sweep; the
rates keep about B = 1, 2, 4, ... rows busy under AR, arrivals.rates_for_logs) or by a trace
file; each request replays one logged sequence of the evaluated split; continuous batching up to
--max-batch rows (load.serve). The same arrivals for every method:

    AR                 off at every step
    best static        the one shape with the highest throughput over the whole load on the tuning
                       split, among off, the chains and each tuned B's best shape
    schedule           the per-B schedule (--schedule, or `draftgym tune` run here on the tuning split)
    vLLM example       vLLM's documented EAGLE-3 schedule, chain K: 1-16 -> 5, 17-32 -> 4, 33-64 -> 3,
                       65-128 -> 1, 129-512 -> 0 (needs width-1 logs)
    SGLang adaptive    SGLang's EMA rule with its stored tiers or --sglang-config (sglang_adaptive.py)
    vLLM adaptive      vLLM's adaptive verification: every row drafts a chain of K, the verify keeps the
                       best draft slots by an online-fitted survival estimate under a budget priced by
                       start-up cost tables (vllm_adaptive.py; K = --row-budget-k; width-1 logs)
    SGLang throughput  SGLang's throughput-aware rule on its documented example tiers, its cost table
                       read from this run's latency profile (sglang_throughput.py; chains: width-1 logs)
    SGLang DSpark      SGLang's DSpark ragged-verify budget over chains of K, its cost table written from this
                       run's profile at the tuning split's median context (choosers/sglang_dspark.py,
                       formats/dspark_table.py; width-1 logs)
    Nightjar           Nightjar's bandit over chains 0..--nightjar-k per batch-size bin, off above 20 rows at
                       > 2 req/s, as its authors' vLLM fork runs it (choosers/nightjar.py; width-1 logs; 0: skip)
    per-request budget each row verifies its own prefix of one drafted chain, drafts stop when one more
                       would not pay, kept by a learned acceptance model (fitted here on the tuning
                       split, chains up to --row-budget-k) and the profile's cost
                       (choosers/row_budget.py; width-1 logs)
    oracle             per step, the hindsight best shape of the tuning candidates (choosers.GreedyOracle:
                       greedy, not an upper bound)
    learned            each --policy: a load-aware policy from `draftgym train-load`, loaded through
                       simulator/policy_specs.load_policy and replayed by learned.LearnedChooser

Figures (metrics.py): throughput, x AR, wall tokens/s, TPOT mean and p90, time in queue, goodput
under the TPOT target (default: AR's median TPOT in this run), tau, draft tokens per row-step,
mean and largest batch; for a sweep, the mean TPOT of the requests of each rate (how each method
fares as the load grows).

--write-trace FILE writes the load's arrival times instead (arrivals.write_trace: a header naming
the rates and the seed, a comment before each rate's requests, one time in seconds per line) and
exits: the same arrivals this command replays, for `draftgym validate --load-trace FILE` to serve
on the device (docs/serving.md, "Validating on the device under load").
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.cliargs import comma_list, parse_positive_ints
from pipeline.decode import step_shape
from pipeline.errors import DataError, DraftGymError
from simulator.latency.diagnostics import prefill_note
from simulator.serving import arrivals as arr
from simulator.serving import metrics
from simulator.serving.choosers.base import GreedyOracle, ScheduleChooser, StaticChooser
from simulator.serving.choosers.nightjar import Nightjar
from simulator.serving.choosers.row_budget import AcceptanceModel, CalibratedBudget
from simulator.serving.choosers.sglang_adaptive import SGLangAdaptive, load_config
from simulator.serving.choosers.sglang_dspark import SGLangDSpark
from simulator.serving.choosers.sglang_throughput import SGLangThroughput
from simulator.serving.choosers.vllm_adaptive import VLLMAdaptiveVerification
from simulator.serving.formats.dspark_table import dspark_table
from simulator.serving.inputs import load_inputs, profiled_candidates, replayable, ServingLogsConfig
from simulator.serving.load import SwitchPrice, serve
from simulator.serving.replay import ShapeTable
from simulator.serving.schedule import Schedule
from simulator.serving.tune import tune


@dataclass
class ServeEvalConfig(ServingLogsConfig):
    """`draftgym serve-eval` settings (and ServingLogsConfig's)."""
    split: str = "test"                   # split the requests replay
    tune_split: str = "val"               # split the schedule and the best static shape are chosen on
    schedule: str | None = None           # a schedule JSON (default: tune one here)
    batch_sizes: str = "1,2,4,8,16,32"    # batch sizes to tune at (without --schedule)
    shapes: str = "all"                   # tuning candidates: chain | tree | all
    target_batches: str = "1,2,4,8,16"    # the sweep's rates keep about these many rows busy under AR
    rates: str | None = None              # explicit comma-separated arrival rates (requests/s) instead
    trace: str | None = None              # a file of arrival times instead of a sweep
    requests_per_rate: int = 32           # requests at each rate of the sweep
    segment_seconds: float | None = None  # instead: each rate's segment lasts this long (round(rate x s) requests)
    max_batch: int | None = None          # most rows in a batch (default: the largest target batch)
    tpot_target: float | None = None      # s per token for goodput (default: AR's median TPOT here)
    seed: int = 0                         # arrival seed
    sglang_config: str | None = None      # SGLang adaptive JSON (default: its stored tiers)
    sglang_initial_steps: int = 3         # SGLang's --speculative-num-steps (each tier's start)
    oracle: bool = True                   # run the greedy per-step oracle
    row_budget_k: int = 5                 # per-request budgets: chains up to K (0: skip)
    nightjar_k: int = 3                   # Nightjar's bandit: chains 0..K, its fork's default (0: skip)
    switch_ms: float = 0.0                # the modelled engine's price of a shape switch (load.SwitchPrice)
    off_factor: float = 1.0               # an off step's cost over the profiled AR step
    engine: str = "profile"               # price steps as the profile's engine runs them, or "paged": the batch's
                                          # mean context and per-row verifies by their total tokens (vLLM, SGLang)
    acceptance_model_out: str | None = None   # write the per-request budget's fitted acceptance model here
    policies: tuple = ()                  # load-aware policy directories (`draftgym train-load`) to replay too
    out: str | None = None                # write the table as JSON
    write_trace: str | None = None        # write the arrival times to this file and exit (no replay)
    as_json: bool = False


def make_arrivals(cfg: ServeEvalConfig, logs, lat) -> tuple[np.ndarray, dict]:
    """The load's arrival times and how they were made."""
    if cfg.trace:
        t = arr.read_trace(cfg.trace)
        return t, {"trace": cfg.trace, "requests": len(t)}
    if cfg.rates:
        try:
            rates = [float(x) for x in comma_list(cfg.rates)]
        except ValueError:
            raise DraftGymError(f"--rates must be comma-separated numbers, got {cfg.rates!r}") from None
    else:
        tb = parse_positive_ints(cfg.target_batches, "--target-batches")
        rates = arr.rates_for_logs(tb, logs, lat)
    counts = arr.segment_counts(rates, cfg.requests_per_rate, cfg.segment_seconds)
    t = arr.sweep(rates, counts, cfg.seed)
    return t, {"rates": [float(r) for r in rates], "requests_per_rate": counts, "seed": cfg.seed}


def per_rate(counts, each: str = "each") -> str:
    """'12 each' or '3, 6, 12 requests' (a sweep's segment sizes, for the one-line summaries)."""
    if len(set(counts)) == 1:
        return f"{counts[0]} {each}" if each == "each" else f"{counts[0]} requests {each}"
    return ", ".join(map(str, counts)) + " requests"


def write_arrivals(cfg: ServeEvalConfig) -> dict:
    """--write-trace: the arrivals `serve_eval` would replay, to cfg.write_trace (module docstring)."""
    if cfg.trace:
        raise DraftGymError("--write-trace writes a Poisson sweep; --trace already names a trace file")
    logs, lat = load_inputs(cfg, cfg.split)
    if logs.n_sequences == 0:
        raise DataError(f"no sequences in split {cfg.split!r}")
    t, load = make_arrivals(cfg, logs, lat)
    rates, n = load["rates"], load["requests_per_rate"]
    how = (f"--rates {cfg.rates}" if cfg.rates else
           f"--target-batches {cfg.target_batches} (rates keeping about B rows busy under AR: mean "
           f"{float(np.mean(logs.new_tokens - 1)):.1f} tokens per {cfg.split} request, latency profile "
           f"{lat.meta.get('profile_id')} on {lat.meta.get('device')})")
    header = ["draftgym serve-eval --write-trace: arrival times in s, one per line (simulator/serving/arrivals.py)",
              f"Poisson sweep: rates {','.join(f'{r:.6g}' for r in rates)} req/s, {per_rate(n, 'per rate')}, seed "
              f"{cfg.seed} (rate k drawn with seed {cfg.seed} + k)", f"rates from {how}"]
    path = arr.write_trace(cfg.write_trace, t, header, [(f"rate {r:.6g} req/s", k) for r, k in zip(rates, n)])
    return {"trace": str(path), "requests": int(len(t)), "span_s": float(t[-1]), **load}


def best_static(logs, lat, arrivals, max_batch, shapes) -> tuple[tuple, dict]:
    """The shape with the highest throughput over the whole load (on these logs)."""
    table = ShapeTable(logs, shapes)
    runs = {s: metrics.summarize(serve(logs, lat, table, StaticChooser(s), arrivals, max_batch))["tokens_per_s"]
            for s in shapes}
    best = max(runs, key=runs.get)
    return best, {step_shape.label(s): v for s, v in runs.items()}


def learned_choosers(specs, logs, max_batch: int) -> list:
    """A LearnedChooser per --policy spec (one-line errors: not a serving policy, shapes the logs cannot
    replay, trained for fewer rows than the load allows)."""
    from simulator.policy_specs import load_policy
    from simulator.serving.choosers.learned import LearnedChooser

    out = []
    for spec in specs:
        ch = LearnedChooser(load_policy(spec))
        missing = [step_shape.label(s) for s in ch.shapes() if not replayable(logs, s)]
        if missing:
            raise DataError(f"--policy {spec}: the logs cannot replay its shapes {', '.join(missing)}")
        if ch.spec.max_batch < max_batch:
            raise DataError(f"--policy {spec} was trained for at most {ch.spec.max_batch} rows; the load replay "
                            f"allows {max_batch} (use --max-batch {ch.spec.max_batch})")
        out.append(ch)
    return out


def serve_eval(cfg: ServeEvalConfig) -> dict:
    logs, lat = load_inputs(cfg, cfg.split)
    tune_logs, _ = load_inputs(cfg, cfg.tune_split)
    if cfg.engine not in ("profile", "paged"):
        raise DraftGymError(f"--engine must be profile or paged, got {cfg.engine!r}")
    if cfg.engine == "paged":
        lat = dataclasses.replace(lat, batch_context="mean")
    if logs.n_sequences == 0 or tune_logs.n_sequences == 0:
        raise DataError(f"no sequences in split {cfg.split!r} or tuning split {cfg.tune_split!r}")
    arrivals, load = make_arrivals(cfg, logs, lat)
    max_batch = cfg.max_batch or max(parse_positive_ints(cfg.target_batches, "--target-batches"))
    cands, cand_note = profiled_candidates(tune_logs, lat, cfg.shapes)
    if cfg.schedule:
        sched = Schedule.load(cfg.schedule)
    else:
        sched = tune(tune_logs, lat, parse_positive_ints(cfg.batch_sizes, "--batch-sizes"), cands,
                     split=cfg.tune_split)["schedule"]
    notes = [n for n in (lat.meta.get("what_if"), cand_note, prefill_note(lat, logs.prompt_len)) if n]
    static_pool = list(dict.fromkeys([step_shape.OFF, *[s for s in cands if step_shape.is_chain(s)], *sched.shapes()]))
    best, static_runs = best_static(tune_logs, lat, arrivals, max_batch, static_pool)
    methods = [StaticChooser(step_shape.OFF, "AR"), StaticChooser(best, f"best static ({step_shape.label(best)})"),
               ScheduleChooser(sched, "schedule (per B)")]
    sg_cfg = load_config(cfg.sglang_config) if cfg.sglang_config else None
    rules = [ScheduleChooser(Schedule.vllm_eagle3_example(), "vLLM EAGLE-3 example"),
             SGLangAdaptive(sg_cfg, initial_steps=cfg.sglang_initial_steps),
             SGLangThroughput(initial_steps=cfg.sglang_initial_steps)]
    rules += [Nightjar(cfg.nightjar_k, seed=cfg.seed)] if cfg.nightjar_k else []
    for m in rules:
        missing = [step_shape.label(s) for s in m.shapes() if not replayable(logs, s)]
        if missing:
            notes.append(f"{m.name} skipped: the logs cannot replay {', '.join(missing)} (chains need width-1 logs "
                         f"deep enough: collect with --widths 1,10)")
        else:
            methods.append(m)
    methods += learned_choosers(cfg.policies, logs, max_batch)
    if cfg.row_budget_k:
        if 1 in tune_logs.w and 1 in logs.w:
            k = min(cfg.row_budget_k, tune_logs.max_depth)
            methods.append(VLLMAdaptiveVerification(k))
            sps, _ = dspark_table(lat, k, float(np.median(tune_logs.context_len)))
            methods.append(SGLangDSpark(sps, k))
            acc = AcceptanceModel.fit(tune_logs, k, split=cfg.tune_split)
            if cfg.acceptance_model_out:
                acc.save(cfg.acceptance_model_out)
            methods.append(CalibratedBudget(acc))
        else:
            notes.append("per-request budget, vLLM adaptive verification and SGLang DSpark skipped: they need width-1 "
                         "logs (collect with --widths 1,10)")
    if cfg.oracle:
        methods.append(GreedyOracle())
    shapes = list(dict.fromkeys([*cands, *sched.shapes(), best, *(s for m in methods for s in m.shapes())]))
    table = ShapeTable(logs, shapes)
    price = SwitchPrice(cfg.switch_ms / 1e3, cfg.off_factor)
    # methods[0] is AR: a plain decoder, outside any speculative config, pays no switching price
    results = [serve(logs, lat, table, m, arrivals, max_batch, price=SwitchPrice() if i == 0 else price)
               for i, m in enumerate(methods)]
    ar = results[0]
    target = cfg.tpot_target or float(np.nanmedian(metrics.tpot(ar.join, ar.finish, ar.tokens)))
    rows = [{"name": m.name, **metrics.summarize(r, target)} for m, r in zip(methods, results)]
    for r, res in zip(rows, results):
        r["x_ar"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
        if "rates" in load:                                      # mean TPOT of the requests of each rate of the sweep
            seg = np.repeat(np.arange(len(load["rates"])), load["requests_per_rate"])
            tp = metrics.tpot(res.join, res.finish, res.tokens)
            r["tpot_by_rate_s"] = [float(np.nanmean(tp[seg == k])) for k in range(len(load["rates"]))]
            r["mean_batch_by_rate"] = batch_by_segment(res, arrivals, load["requests_per_rate"])
    if "rates" in load and not cfg.rates:
        notes += short_segments(parse_positive_ints(cfg.target_batches, "--target-batches"), rows[0]["mean_batch_by_rate"])
    return {"rows": rows, "load": load, "max_batch": max_batch, "tpot_target_s": target, "schedule": sched.to_json()["ranges"],
            "best_static": step_shape.label(best), "static_on_tune_split": static_runs, "notes": notes,
            "split": cfg.split, "tune_split": cfg.tune_split, "latency_profile": lat.meta.get("profile_id"),
            "switch_price": {"switch_ms": cfg.switch_ms, "off_factor": cfg.off_factor},
            "engine": cfg.engine, "batch_context": lat.batch_context}


def batch_by_segment(res, arrivals, counts) -> list[float]:
    """Mean batch (row-steps / steps) over the steps that start while each segment of a sweep arrives
    (from its first arrival to the next segment's; the last runs to the end)."""
    first = np.asarray(arrivals)[np.cumsum([0, *counts[:-1]])]                  # [k] each segment's first arrival
    k_of = np.searchsorted(first, res.step_start, side="right") - 1               # [N] the segment of each step
    return [float(res.step_batch[k_of == k].mean()) if (k_of == k).any() else math.nan for k in range(len(counts))]


def short_segments(targets, ar_batch) -> list[str]:
    """A note when AR held fewer than half the rows a segment's rate was chosen for (rates_for_batches
    is Little's law at steady state; a short segment ends before its queue fills)."""
    short = [f"B {b}: {m:.1f}" for b, m in zip(targets, ar_batch) if b > 1 and m < 0.5 * b]
    return [f"the sweep held fewer rows under AR than its target batch sizes ({', '.join(short)} on average): "
            "its segments end before the batch fills; --segment-seconds or more --requests-per-rate hold each "
            "load longer"] if short else []


def run_serve_eval_command(cfg: ServeEvalConfig) -> int:
    if cfg.write_trace:
        info = write_arrivals(cfg)
        print(json.dumps(info) if cfg.as_json else
              f"wrote {info['requests']} arrival times over {info['span_s']:.1f} s to {info['trace']} (rates "
              + ", ".join(f"{r:.3g}" for r in info["rates"]) + f" req/s, {per_rate(info['requests_per_rate'])}, seed "
              f"{info['seed']}); serve them with `draftgym validate --load-trace {info['trace']}`")
        return 0
    rep = serve_eval(cfg)
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(rep, indent=1) + "\n")
    if cfg.as_json:
        print(json.dumps(rep))
        return 0
    load = rep["load"]
    how = f"trace {load['trace']}" if "trace" in load else \
        "Poisson sweep at " + ", ".join(f"{r:.2f}" for r in load["rates"]) + f" req/s ({per_rate(load['requests_per_rate'])})"
    print(f"load: {how}; up to {rep['max_batch']} rows; split {rep['split']}; latency {rep['latency_profile']}")
    print(f"{'method':<34} {'tok/s':>8} {'x AR':>5} {'TPOT ms':>8} {'p90':>7} {'queue ms':>8} "
          f"{'goodput':>8} {'tau':>5} {'drafts':>6} {'mean B':>6} {'max B':>5} {'sw/s':>6}")
    for r in rep["rows"]:
        print(f"{r['name']:<34} {r['tokens_per_s']:>8.1f} {r['x_ar']:>5.2f} {1e3 * r['tpot_mean_s']:>8.2f} "
              f"{1e3 * r['tpot_p90_s']:>7.2f} {1e3 * r['queue_mean_s']:>8.1f} {r['goodput_tokens_per_s']:>8.1f} "
              f"{r['tau']:>5.2f} {r['drafts_per_step']:>6.2f} {r['mean_batch']:>6.2f} {r['max_batch']:>5d} "
              f"{r['switches_per_s']:>6.1f}")
    if "rates" in load:
        print("mean TPOT (ms) of the requests arriving at each rate:")
        print(f"{'method':<34} " + " ".join(f"{r:>7.2f}/s" for r in load["rates"]))
        for r in rep["rows"]:
            print(f"{r['name']:<34} " + " ".join(f"{1e3 * x:>9.2f}" for x in r["tpot_by_rate_s"]))
        print(f"{'mean B under AR':<34} " + " ".join(f"{x:>9.2f}" for x in rep["rows"][0]["mean_batch_by_rate"]))
    print(f"goodput: tokens/s of requests with TPOT <= {1e3 * rep['tpot_target_s']:.2f} ms; schedule: "
          + ", ".join(f"{r['batch'][0]}-{r['batch'][1]} {r['shape']}" for r in rep["schedule"]))
    for n in rep["notes"]:
        print("note: " + n)
    return 0


FIGURES = ("tokens_per_s", "x_ar", "tpot_mean_s", "mean_batch", "goodput_tokens_per_s")


def method_name(name: str) -> str:
    """The method's name without what varies with the load ("best static (chain:3)" -> "best static")."""
    return "best static" if name.startswith("best static") else name


def rate_sweep(cfg, rates) -> dict:
    """serve_eval once per arrival rate, every other setting of cfg (a ServeEvalConfig) kept:
    {"rates" [k], "methods" {name: {figure: [k]}} (FIGURES), "best_static" [k] labels, "notes"}.
    Pass cfg.schedule (and cfg.max_batch) to replay one schedule at every rate instead of tuning one
    per call. Each rate is its own load (cfg.requests_per_rate Poisson requests), so a method's
    tokens/s at a rate is its steady figure there, not a stretch of one long sweep."""
    rates = [float(r) for r in rates]
    if not rates:
        raise DataError("rate_sweep needs at least one rate")
    out = {"rates": rates, "methods": {}, "best_static": [], "notes": []}
    for k, r in enumerate(rates):
        rep = serve_eval(dataclasses.replace(cfg, rates=repr(r), trace=None, write_trace=None))
        out["best_static"].append(rep["best_static"])
        out["notes"] += [n for n in rep["notes"] if n not in out["notes"]]
        for row in rep["rows"]:
            m = out["methods"].setdefault(method_name(row["name"]), {f: [math.nan] * len(rates) for f in FIGURES})
            for f in FIGURES:
                m[f][k] = float(row.get(f, math.nan))
    return out
