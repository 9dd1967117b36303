"""`draftgym validate --load-trace FILE`: requests arrive as the trace says, the batched engine serves
them with continuous batching (at most --max-batch rows), once per method, and the serving replay
(simulator/serving/load.py) predicts the same trace from the logs.

Requests: request k arrives at trace[k] s and decodes prompt k mod N of the datasets' prompts (in
order). With --logs holding the prompt, it decodes as many tokens as its logged sequence
(max_new_tokens = the sequence's new tokens), so the device and the replay decode the same work;
else --max-new-tokens. The engine skips the waits for the next arrival on its clock (nothing runs
then: pipeline/decode/engine/core.py), so a sparse trace costs no idle time.

Methods, every one on the same arrivals, each driven on the device and in the replay by the same
chooser (online/adapters/chooser.py):

    AR                     off every step (the engine's AR path: no head, no features)
    static <shape>         each --shapes shape
    schedule               the --schedule (a per-B schedule written by `draftgym tune`)
    vLLM EAGLE-3 example   vLLM's documented schedule (chains: 1-16 -> 5, ..., 129-512 -> 0)
    SGLang adaptive        SGLang's EMA rule on its stored tiers (simulator/serving/choosers/sglang_adaptive.py)
    SGLang throughput-aware  SGLang's throughput-aware rule (simulator/serving/choosers/sglang_throughput.py): with
                           --logs only, as it prices each candidate chain with the latency profile (the
                           replay's, handed to the same chooser on the device)
    learned <ckpt> (...)   each --policy: a load-aware serving policy (`draftgym train-load`), deciding
                           every `hold` steps from the load-aware observation; on the device its draft
                           confidence is the engine's measured depth-1 log-prob, in the replay the
                           logs' (simulator/serving/choosers/learned.py); confidence depth must be <= 1

Cost and path: with --logs, each method's steps on the device are also priced by the profile, each
at its own shape, batch size and step context (LatencyModel.t_step, as the replay prices its steps),
against their measured engine time (t_step less the controller's t_controller):

    cost error = sum(priced) / sum(measured) - 1            (per run; and per B over every run's steps)
    path error = (1 + replay error) (1 + cost error) - 1    (the replay's tokens/s error had the profile
                                                             priced every step right)

so a replay error splits into what the profile charges for the steps the device ran and what the
replay's own steps (batches, shapes, acceptance) differ by. The step table (pipeline/logs/schema.py
BATCH_STEPS, as `validate --batch-sizes` writes it) goes to <out>/batch_steps/.

Figures, on both sides from one ServingResult (simulator/serving/metrics.py defines them once):
throughput = step tokens / busy step time, x AR, TPOT mean and p90, time in queue, tau, drafts per
row-step, mean and largest batch; the device also reports its wall rate (every new token, prefills
and the first tokens included, over the makespan with idle waits skipped) and its prefill share.
The replay charges each joining request's prefill from the profile's `prefill` rows (none if it
has none), so TPOT and queue times compare too; throughput compares decode steps only. Error =
(replayed - device) / device. Mean +- std over --runs.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import numpy as np

from online.adapters.chooser import controller_for
from online.adapters.specs import policy_label
from online.validate.batch import step_table_rows
from online.validate.common import check_config, load_prompt_sets, load_replay, LoadTraceConfig
from online.validate.sim_vs_real import step_cost
from online.validate.speedbench import Call, run_calls
from pipeline import metrics as pipeline_metrics
from pipeline.decode import step_shape
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.lossless import summarize_verdicts
from pipeline.errors import DataError, DraftGymError
from pipeline.logs.schema import write_batch_steps
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target, resolve_dtype_name
from pipeline.runtime.atomic import atomic_write_json, atomic_write_text
from pipeline.runtime.fingerprint import device_name, environment_fingerprint
from simulator.latency.diagnostics import prefill_note
from simulator.policy_specs import CHECKPOINT, load_policy, parse_spec
from simulator.serving import metrics
from simulator.serving.arrivals import read_trace
from simulator.serving.choosers.base import RowChooser, ScheduleChooser, StaticChooser
from simulator.serving.choosers.learned import LearnedChooser
from simulator.serving.choosers.nightjar import Nightjar
from simulator.serving.choosers.row_budget import AcceptanceModel, CalibratedBudget
from simulator.serving.choosers.sglang_adaptive import SGLangAdaptive
from simulator.serving.choosers.sglang_throughput import SGLangThroughput
from simulator.serving.choosers.vllm_adaptive import VLLMAdaptiveVerification
from simulator.serving.load import serve, ServingResult
from simulator.serving.replay import ShapeTable
from simulator.serving.schedule import Schedule

FIGURES = ("tokens_per_s", "x_ar", "tpot_mean_s", "tpot_p90_s", "queue_mean_s", "tau", "drafts_per_step", "mean_batch")


def learned_methods(cfg: LoadTraceConfig) -> list:
    """A LearnedChooser per --policy (one-line errors: a built-in spec, a checkpoint that is not a
    load-aware serving policy, trained for fewer rows than --max-batch, confidences deeper than the
    engine measures)."""
    out = []
    for spec in cfg.policies:
        if parse_spec(spec)[0] != CHECKPOINT:
            raise DraftGymError(f"--policy {spec}: --load-trace runs load-aware serving checkpoints (draftgym "
                                f"train-load), not built-in batch-1 policies (static shapes: --shapes)")
        pol = load_policy(spec)
        ch = LearnedChooser(pol, f"learned {policy_label(spec)} ({getattr(pol, 'name', '?')}, "
                                 f"hold {getattr(pol, 'hold', '?')})")
        if ch.spec.max_batch < cfg.max_batch:
            raise DraftGymError(f"--policy {spec} was trained for at most {ch.spec.max_batch} rows; the trace is "
                                f"served with up to {cfg.max_batch} (use --max-batch {ch.spec.max_batch})")
        ch.check_device()
        out.append(ch)
    return out


def load_methods(cfg: LoadTraceConfig) -> list:
    """The choosers, AR first, each --policy last (module docstring); one-line errors for bad spellings."""
    out = [StaticChooser(step_shape.OFF, "AR")]
    for spec in cfg.shapes:
        s = step_shape.parse(spec)
        if s == step_shape.OFF:
            raise DraftGymError("--shapes: 'off' is the AR method, which always runs")
        out.append(StaticChooser(s))
    if cfg.schedule:
        out.append(ScheduleChooser(Schedule.load(cfg.schedule), "schedule (per B)"))
    out += [ScheduleChooser(Schedule.vllm_eagle3_example(), "vLLM EAGLE-3 example"), SGLangAdaptive()]
    out += learned_methods(cfg)
    if cfg.row_budget_k:
        out.append(VLLMAdaptiveVerification(cfg.row_budget_k))
    if cfg.nightjar_k:
        out.append(Nightjar(cfg.nightjar_k, seed=cfg.seed))
    if cfg.acceptance_model:
        out.append(CalibratedBudget(AcceptanceModel.load(cfg.acceptance_model)))
    names = [m.name for m in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise DraftGymError(f"--shapes / --policy: {dup} given twice")
    return out


def check_load_config(cfg: LoadTraceConfig) -> np.ndarray:
    """What `validate --load-trace` refuses up front, in one line; returns the arrival times."""
    check_config(cfg)
    if cfg.profile_first or cfg.profile_interleave:
        raise DraftGymError("--load-trace runs static shapes, --schedule, the engines' rules and load-aware "
                            "--policy checkpoints; --profile-first runs at batch 1 only")
    if cfg.max_batch < 1:
        raise DraftGymError(f"--max-batch must be >= 1, got {cfg.max_batch}")
    load_methods(cfg)
    return read_trace(cfg.load_trace)


# ---------------------------------------------------------------------------------- the device

def device_result(res, name: str) -> ServingResult:
    """A BatchResult served under arrivals as the replay's ServingResult (tokens: decode-step tokens,
    as the replay counts them; the first token of each request comes from its prefill)."""
    steps = res.steps
    shapes = list(dict.fromkeys(step_shape.canonical((s.depth, s.width, s.verify_size)) for s in steps))
    a = lambda f, dt: np.array([f(s) for s in steps], dt)
    rows = res.rows
    return ServingResult(
        name=name, shapes=shapes, seq=np.arange(len(rows)),
        arrival=np.array([r.arrival_s for r in rows]), join=np.array([r.join_s for r in rows], np.float64),
        finish=np.array([r.finish_s for r in rows], np.float64),
        tokens=np.array([sum(c.emitted for c in r.cycles) for r in rows], np.int64),
        cycles=np.array([len(r.cycles) for r in rows], np.int64),
        step_start=np.zeros(len(steps)), step_time=a(lambda s: s.t_step, np.float64),
        step_batch=a(lambda s: s.batch_size, np.int64),
        step_shape=a(lambda s: shapes.index(step_shape.canonical((s.depth, s.width, s.verify_size))), np.int64),
        step_emitted=a(lambda s: s.emitted_sum, np.int64),
        step_drafted=a(lambda s: s.batch_size * (s.verify_size - 1), np.int64), step_queued=a(lambda s: s.queued, np.int64))


def device_figures(res, name: str) -> dict:
    """One served trace's figures: the replay's (metrics.summarize of device_result) and the device's own:
    its wall rate, prefill share and the idle waits its clock skipped."""
    wall = res.wall_s                          # the call's wall, idle waits skipped
    return {**metrics.summarize(device_result(res, name)), "wall_tokens_per_s": res.new_tokens / wall if wall > 0 else 0.0,
            "prefill_share": res.prefill_s / wall if wall > 0 else 0.0, "idle_skipped_s": res.idle_s,
            "graph_captures": res.captures}


# ---------------------------------------------------------------------------------- the replay

def request_plan(cfg: LoadTraceConfig, recs, logs, n_requests: int):
    """(prompt index, max_new_tokens, logged sequence or -1) per request (module docstring)."""
    seq_of = {}
    if logs is not None:
        for i, pid in enumerate(logs.prompt_id.tolist()):
            seq_of.setdefault(pid, i)
    idx = [k % len(recs) for k in range(n_requests)]
    seq = [seq_of.get(recs[i].prompt_id, -1) for i in idx]
    max_new = [int(logs.new_tokens[s]) if s >= 0 else cfg.max_new_tokens for s in seq]
    return idx, max_new, seq


def replay(logs, lat, chooser, arrivals, max_batch: int, seq) -> ServingResult:
    table = ShapeTable(logs, chooser.shapes() or [step_shape.OFF])
    return serve(logs, lat, table, chooser, arrivals, max_batch, request_seq=seq)


def replay_side(logs, lat, methods, arrivals, max_batch: int, seq, rows: list[dict]) -> None:
    """Each method's replay of the same trace next to its device row (`replay`, `replay_rel_error`),
    or a one-line `replay_note` where the logs cannot replay it (chains need width-1 logs)."""
    sims = {}
    for m, row in zip(methods, rows):
        try:
            sims[m.name] = metrics.summarize(replay(logs, lat, m, arrivals, max_batch, seq))
        except DataError as e:
            row["replay_note"] = str(e)
    ar = sims.get("AR")
    for m, row in zip(methods, rows):
        s = sims.get(m.name)
        if s is None:
            continue
        s["x_ar"] = s["tokens_per_s"] / ar["tokens_per_s"] if ar else None
        row["replay"] = {k: s[k] for k in (*FIGURES, "max_batch")}
        row["replay_rel_error"] = {k: pipeline_metrics.rel_error(s[k], row[k]) if s[k] is not None else None
                                   for k in ("tokens_per_s", "x_ar", "tau", "mean_batch", "tpot_mean_s")}
        r, c = row["replay_rel_error"]["tokens_per_s"], row.get("cost_rel_error")
        row["path_rel_error"] = (1 + r) * (1 + c) - 1 if r is not None and c is not None else None


# ---------------------------------------------------------------------------------- the command

def _mean_std(xs):
    xs = [x for x in xs if x is not None and np.isfinite(x)]
    if not xs:
        return None, None
    return statistics.mean(xs), (statistics.pstdev(xs) if len(xs) > 1 else 0.0)


def run_validate_load(cfg: LoadTraceConfig, progress: bool = True) -> dict:
    t_start = time.perf_counter()
    arrivals = check_load_config(cfg)
    methods = load_methods(cfg)
    dtype = resolve_dtype_name(cfg.dtype, cfg.device)
    sets = load_prompt_sets(cfg)
    recs = [r for ds in cfg.datasets for r in sets[ds]]
    target = load_target(cfg.model, device=cfg.device, dtype=dtype)
    head = load_head_for(cfg.head, target.model, cfg.seed)
    engine = BatchEngine(target.model, head, target.eos_token_ids)
    dev = device_name(target.device, dtype)
    logs, lat, note = load_replay(cfg, dev, dtype, [r.prompt_id for r in recs])
    if logs is not None:
        logs = logs.subset(np.isin(logs.prompt_id, [r.prompt_id for r in recs]))
        if logs.n_sequences == 0:
            logs, note = None, f"no logged sequences for these prompts in {cfg.logs}: no replay"
    idx, max_new, seq = request_plan(cfg, recs, logs, len(arrivals))
    if logs is not None and min(seq) < 0:
        missing = sorted({recs[i].prompt_id for i, s in zip(idx, seq) if s < 0})
        logs, note = None, f"{len(missing)} prompts have no logged sequence (e.g. {missing[0]}): no replay"
        idx, max_new, seq = request_plan(cfg, recs, None, len(arrivals))
    if lat is not None:                          # SGLang's throughput-aware rule: after its EMA rule
        methods.insert(next(i for i, m in enumerate(methods) if isinstance(m, SGLangAdaptive)) + 1, SGLangThroughput())
    tok = [encode_prompt(target.tokenizer, list(r.messages)) for r in recs]
    prompts = [tok[i] for i in idx]
    # the one driver (online/validate/speedbench.py run_calls): one call per run, the trace's requests with their
    # arrivals, each row checked against its request's batch-1 AR output (T = 0)
    calls = lambda r: [Call(cfg.max_batch, list(range(len(prompts))), [cfg.seed + 1000 * r + k for k in range(len(prompts))],
                            arrivals=[float(a) for a in arrivals], max_new=max_new)]
    if lat is None:                              # per-request budgets price their steps with the profile
        methods = [m for m in methods if not isinstance(m, RowChooser)]
    factories = {m.name: None if m.shapes() == [step_shape.OFF] else (lambda m=m: controller_for(m, max_new, lat))
                 for m in methods}
    # with CUDA graphs the whole trace is served once per method untimed first, as a server captures its
    # graphs before it serves (the replay prices warm steps); the timed runs' captures are in the report
    results, verdicts = run_calls(engine, prompts, factories, calls, cfg.max_new_tokens, cfg.temperature, cfg.runs,
                                  progress, warmup="full" if engine.graphs.enabled else "short")
    device = {m.name: [device_figures(results[(r, 0, m.name)], m.name) for r in range(cfg.runs)] for m in methods}
    checked = cfg.temperature <= 0              # lossless checked (T = 0)
    rows = []
    for m in methods:
        row = {"name": m.name}
        for k in (*FIGURES, "wall_tokens_per_s", "prefill_share", "max_batch", "graph_captures"):
            if k == "x_ar":
                vals = [d["tokens_per_s"] / a["tokens_per_s"] for d, a in zip(device[m.name], device["AR"])]
            else:
                vals = [d[k] for d in device[m.name]]
            row[k], row[k + "_std"] = _mean_std(vals)
        if lat is not None:                      # the profile's price of the device's own steps
            runs = [results[(r, 0, m.name)].steps for r in range(cfg.runs)]
            row["cost_rel_error"], row["cost_rel_error_std"] = _mean_std([step_cost(st, lat)["rel_error"] for st in runs])
            row["cost_rel_error_by_batch"] = step_cost([s for st in runs for s in st], lat)["by_batch"]
        if checked:
            row["lossless"] = summarize_verdicts([v for name, *_, v in verdicts if name == m.name])["counts"]
        rows.append(row)
    if logs is not None:
        replay_side(logs, lat, methods, arrivals, cfg.max_batch, seq, rows)
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    pids = [recs[i].prompt_id for i in idx]      # request k decodes prompt idx[k]
    steps = [row for (r, _, name), res in results.items() for row in step_table_rows(res, name, r, pids, dev)]
    steps_path = steps_note = None
    try:                                         # the step table is a by-product: its failure must not lose the report
        steps_path = write_batch_steps(cfg.out, cfg.model, "+".join(cfg.datasets), cfg.temperature, run_id, steps) if steps else None
    except (DataError, OSError) as e:
        steps_note = f"step table not written: {e}"
    report = {"run_id": run_id, "config": asdict(cfg), "steps_file": str(steps_path) if steps_path else None,
              "steps_note": steps_note,
              "prefill_note": prefill_note(lat, logs.prompt_len[np.asarray(seq)]) if logs is not None else None,
              "device": dev, "dtype": dtype, "environment": environment_fingerprint(target.device, dtype),
              "head_id": head.head_id, "trace": {"path": cfg.load_trace, "requests": len(arrivals),
                                                 "span_s": float(arrivals[-1] - arrivals[0])},
              "max_batch": cfg.max_batch, "prompts": [r.prompt_id for r in recs], "rows": rows,
              "replay_note": note, "command": " ".join(sys.argv), "wall_s": time.perf_counter() - t_start}
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(report, out / "report.json")
    atomic_write_text(out / "report.md", load_markdown(report))
    return report


def load_markdown(rep: dict) -> str:
    """The report as Markdown: one row per method, the device and the replay side by side."""
    env = rep["environment"]
    on_gpu = env.get("device_type") == "cuda"                     # a GPU's name, not its host CPU's
    where = f"{rep['device'] if on_gpu else env.get('cpu_model') or rep['device']}, {rep['dtype']}"
    f = lambda x, k=1.0, p=1: "-" if x is None else f"{k * x:.{p}f}"
    lines = [f"# validate --load-trace ({where})", "",
             f"trace {rep['trace']['path']}: {rep['trace']['requests']} requests over {rep['trace']['span_s']:.1f} s; "
             f"at most {rep['max_batch']} rows; {rep['config']['runs']} runs (mean +- std); device | replay (error)", "",
             "| method | tokens/s | cost / path % | x AR | TPOT ms | TPOT p90 ms | queue ms | tau | drafts/step | mean B "
             "| wall tok/s | prefill % | graphs captured | lossless (exact / near-tie / mismatch) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        s, e = r.get("replay"), r.get("replay_rel_error") or {}
        cell = lambda k, m=1.0, p=1: (f"{f(r[k], m, p)} ± {f(r[k + '_std'], m, p)}" +
                                      (f" \\| {f(s[k], m, p)} ({100 * e[k]:+.1f} %)" if s and e.get(k) is not None
                                       else f" \\| {f(s[k], m, p)}" if s else ""))
        pct = lambda x: "-" if x is None else f"{100 * x:+.1f}"
        lines.append(f"| {r['name']} | {cell('tokens_per_s')} | {pct(r.get('cost_rel_error'))} / {pct(r.get('path_rel_error'))} | "
                     f"{cell('x_ar', p=2)} | {cell('tpot_mean_s', 1e3, 2)} | "
                     f"{f(r['tpot_p90_s'], 1e3, 2)} | {f(r['queue_mean_s'], 1e3)} | {cell('tau', p=2)} | "
                     f"{f(r['drafts_per_step'], p=2)} | {cell('mean_batch', p=2)} | {f(r['wall_tokens_per_s'])} | "
                     f"{f(r['prefill_share'], 100)} | {f(r.get('graph_captures'), p=0)} | {lossless_cell(r.get('lossless'))} |")
    if any(r.get("cost_rel_error") is not None for r in rep["rows"]):
        lines += ["", "cost / path %: the replay's tokens/s error in two parts (docs/serving.md): cost = the profile's "
                      "price of the steps the device ran against their measured time; path = the error left had the "
                      "profile priced every step right; graphs captured: CUDA graphs a run's generation captured "
                      "(mean over runs; each capture runs its step eagerly first)"]
    notes = [f"note: {rep[k]}" for k in ("replay_note", "prefill_note", "steps_note") if rep.get(k)]
    notes += [f"note: {r['name']} not replayed: {r['replay_note']}" for r in rep["rows"] if r.get("replay_note")]
    lines += [""] + notes if notes else []
    return "\n".join(lines) + "\n"


def lossless_cell(counts) -> str:
    return "-" if not counts else f"{counts['exact']} / {counts['near-tie']} / {counts['mismatch']}"


def run_validate_load_command(cfg: LoadTraceConfig) -> int:
    """Exit status 1 when a row at T = 0 was not lossless against its batch-1 AR output."""
    rep = run_validate_load(cfg, progress=cfg.progress)
    if cfg.as_json:
        print(json.dumps(rep))
    else:
        print(load_markdown(rep))
        print(f"report: {Path(cfg.out) / 'report.md'}")
    return 1 if any((r.get("lossless") or {}).get("mismatch") for r in rep["rows"]) else 0
