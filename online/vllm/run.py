"""`draftgym vllm-run`: DraftGym's heads and schedules in the real vLLM engine, measured and checked.

For each speculation config (`--k 0,3`: none and a static chain of k drafts; `--schedule FILE`: a
`draftgym export --format vllm` speculative_config or a `draftgym tune` schedule, exported here), one
vLLM engine (online/vllm/worker.py, in vLLM's own environment) decodes the same prompts, as token ids
from DraftGym's tokenizer and chat template, greedily:

    closed batches   B = --batch-sizes: B requests in flight, a finished one's slot takes the next prompt
    load             --rates (Poisson, req/s, seeded) or --trace (a file of arrival times, s), at most
                     --max-batch requests in the engine (vLLM's max_num_seqs), the rest queue

and records per run: tokens/s (output tokens / wall time), TPOT mean and p90 ((finish - first token) /
(tokens - 1) per request), time to first token, vLLM's own speculation counters (mean acceptance length,
per-position acceptance) and the outputs. Checks: every speculative config's outputs against vLLM
without speculation (k = 0, run first; in fp32 they must be identical), and in fp32 vLLM's outputs
against DraftGym's own AR (`--check-ar`). `--compare-logs LOGS` replays each chain k on DraftGym's logs
of the same prompts (simulator/serving/formats/vllm_counters.py) and prints the prediction beside
vLLM's counters. Written to --out: report.json (config, seed, dtype, environment, every figure),
report.md, vllm_steps.jsonl (vLLM's step time per (B, k): `draftgym profile-import --format vllm-steps`
makes it a latency profile, so tune / serve-eval / train-load answer on vLLM's own costs), each
engine's log (logs/<config>.log) and its raw results (logs/<config>.jsonl).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from online.vllm import env as vllm_env
from online.vllm.checks import classify_divergences, draftgym_ar, lossless, same_outputs
from online.vllm.compare import compare_replay, predict_closed, predict_load, prompt_logs, vllm_costs
from pipeline.datasets import load_prompts, resolve_split
from pipeline.errors import DataError, DraftGymError
from pipeline.models.target import encode_prompt, resolve_dtype_name
from pipeline.runtime.fingerprint import environment_fingerprint
from simulator.serving.formats.export import check_vllm, to_vllm
from simulator.serving.formats.vllm_counters import spec_figures
from simulator.serving.schedule import Schedule

WARMUP_PROMPTS = 2


@dataclass
class VllmRunConfig:
    """`draftgym vllm-run` settings."""
    model: str = "smollm2-135m"           # target: 'smollm2-135m' (embedded), a HF model directory or a hub id
    head: str = "default"                 # EAGLE-3 head: 'default' or a directory (written with draftgym_head_format 2)
    dataset: str = "mt-bench"             # a built-in prompt set or a prompts file
    split: str | None = None              # None: test for built-ins, all of a user's file
    n_prompts: int = 8                    # first N prompts of the split
    max_new_tokens: int = 64
    k: tuple = (0, 3)                     # static configs: 0 = no speculation, k > 0 = a chain of k drafts
    schedules: tuple = ()                 # vLLM speculative_config JSON files or DraftGym schedule JSONs
    batch_sizes: tuple = (1, 8)           # closed batches
    rates: tuple = ()                     # Poisson load runs, requests/s
    trace: str | None = None              # a load run from a file of arrival times (s), one per line or a JSON list
    load_requests: int = 16               # requests per Poisson run (the prompts, cycled)
    max_batch: int = 16                   # vLLM's max_num_seqs: the most requests in the engine at once
    dtype: str | None = None              # float32 | bfloat16 (default: DraftGym's CPU default)
    seed: int = 0                         # vLLM's seed and the Poisson arrivals'
    check_ar: bool = True                 # fp32: vLLM's outputs against DraftGym's own AR
    compare_logs: str | None = None       # logs root: each chain's replayed counters beside vLLM's
    cost_curve: str | None = None         # a vllm_steps.jsonl from an earlier run to price the replay with
                                          # (default: this run's own, from its closed batches)
    out: str = "data/reports/vllm"
    kv_cache_gib: int = 1                 # VLLM_CPU_KVCACHE_SPACE
    max_model_len: int = 2048
    timeout_s: int = 1800                 # per engine
    as_json: bool = False


@dataclass
class SpecConfig:
    name: str                             # none | k3 | <schedule file stem>
    k: int                                # the largest k it drafts (0: none)
    speculative_config: dict | None = None
    ranges: list = field(default_factory=list)   # a schedule's [[start, end, k], ...]


def spec_configs(cfg: VllmRunConfig, head_dir: str) -> list[SpecConfig]:
    """none first (the lossless reference), then each k, then each schedule."""
    out = [SpecConfig("none", 0)] if 0 in cfg.k or cfg.k == () else []
    if not out:
        out = [SpecConfig("none", 0)]
    for k in sorted({int(k) for k in cfg.k if int(k) > 0}):
        out.append(SpecConfig(f"k{k}", k, {"method": "eagle3", "model": head_dir, "num_speculative_tokens": k}))
    for path in cfg.schedules:
        sc = load_vllm_schedule(path, head_dir, cfg.max_batch)
        ranges = sc.get("num_speculative_tokens_per_batch_size") or []
        out.append(SpecConfig(Path(path).stem, int(sc["num_speculative_tokens"]), sc, ranges))
    return out


def load_vllm_schedule(path: str, head_dir: str, max_batch: int) -> dict:
    """A file -> vLLM's speculative_config: an exported one as it is (its model set to this head), or a DraftGym
    schedule exported with --best-expressible (simulator/serving/formats/export.py checks vLLM's rules)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"schedule file not found: {path}")
    try:
        obj = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path} is not JSON: {e.msg} (line {e.lineno})") from None

    if isinstance(obj, dict) and obj.get("method") == "eagle3":
        sc = dict(obj)
    else:
        sc, _ = to_vllm(Schedule.load(p), head_dir, best=True, max_batch=max_batch)
    sc["model"] = head_dir
    check_vllm(sc)
    return sc


def poisson_arrivals(rate: float, n: int, seed: int) -> list[float]:
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    return np.cumsum(gaps).round(6).tolist()


def read_trace(path: str) -> list[float]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"trace file not found: {path}")
    text = p.read_text().strip()
    try:
        vals = json.loads(text) if text.startswith("[") else [float(x) for x in text.split()]
    except ValueError:
        raise DataError(f"{path}: not a list of arrival times in seconds") from None
    if not vals or any(v < 0 for v in vals):
        raise DataError(f"{path}: no arrival times, or a negative one")
    return sorted(float(v) for v in vals)


def make_runs(cfg: VllmRunConfig, prompts: list[list[int]]) -> list[dict]:
    runs = []
    for B in cfg.batch_sizes:
        n = max(len(prompts), 2 * int(B))                       # refilled at least once
        runs.append({"name": f"B{B}", "kind": "closed", "batch": int(B), "max_tokens": cfg.max_new_tokens,
                     "prompts": [prompts[i % len(prompts)] for i in range(n)]})
    loads = [(f"rate{r:g}", poisson_arrivals(float(r), cfg.load_requests, cfg.seed)) for r in cfg.rates]
    if cfg.trace:
        loads.append(("trace", read_trace(cfg.trace)))
    for name, arr in loads:
        runs.append({"name": name, "kind": "trace", "arrivals": arr, "max_tokens": cfg.max_new_tokens,
                     "prompts": [prompts[i % len(prompts)] for i in range(len(arr))]})
    return runs


def vllm_error(log: Path) -> str:
    """The line of vLLM's log that says why it stopped (its last exception), for a one-line error."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    for line in reversed(lines):
        s = line.split("] ", 1)[-1].strip()
        if ("Error" in s or "error:" in s) and "Traceback" not in s and not s.startswith("File "):
            return s[:300]
    return (lines[-1].strip()[:300] if lines else "no output")


def read_events(res: Path) -> list[dict]:
    """The worker's results file, one event a line (none if it never wrote one)."""
    return [json.loads(x) for x in res.read_text().splitlines() if x.strip()] if res.is_file() else []


def run_engine(py: Path, job: dict, out_dir: Path, name: str, timeout_s: int) -> tuple[list[dict], bool, Path]:
    """Start the worker for one config; return (its result events, complete?, its log). Never raises for an engine
    that died after it was ready: what it wrote is kept and marked partial. A job that already ran to the end in
    this folder (the same job.json, a results file ending in "done") is not run again."""
    out_dir = Path(out_dir).resolve()                           # the worker runs with its cwd there
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    job_path, res, log = logs / f"{name}.job.json", logs / f"{name}.jsonl", logs / f"{name}.log"
    if job_path.is_file() and job_path.read_text() == json.dumps(job):
        events = read_events(res)
        if events and events[-1]["event"] == "done":          # the same job ran to the end: reuse it (idempotent)
            return events, True, log
    job_path.write_text(json.dumps(job))
    res.unlink(missing_ok=True)
    job = dict(job)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": str(job.pop("kv_cache_gib")),
           "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    with open(log, "w") as lf:
        try:
            rc = subprocess.run([str(py), str(vllm_env.WORKER), str(job_path), str(res)], stdout=lf, stderr=subprocess.STDOUT,
                                env=env, timeout=timeout_s, cwd=str(out_dir)).returncode
        except subprocess.TimeoutExpired:
            rc = -9
            lf.write(f"\ndraftgym: the engine ran past --timeout-s {timeout_s} and was stopped\n")
    events = read_events(res)
    done = rc == 0 and any(e["event"] == "done" for e in events)
    if not any(e["event"] == "ready" for e in events):
        raise DraftGymError(f"vLLM did not start ({name}): {vllm_error(log)} (log: {log})")
    return events, done, log


def summarise(events: list[dict]) -> dict:
    """Result events -> {run: figures, outputs}."""
    out = {}
    reqs = [e for e in events if e["event"] == "request"]
    for e in (e for e in events if e["event"] == "run"):
        rs = sorted((r for r in reqs if r["run"] == e["run"]), key=lambda r: r["index"])
        toks = sum(len(r["output_ids"]) for r in rs)
        tpot = [(r["finish_s"] - r["first_token_s"]) / (len(r["output_ids"]) - 1) for r in rs if len(r["output_ids"]) > 1]
        decode, emitted, alone = {}, {}, []
        for n, t, prefill, *tok in e["steps"]:
            if prefill and n == 1:
                alone.append(t)                                  # one request's prompt, nothing else running
            if not prefill:
                decode.setdefault(int(n), []).append(t)
                emitted.setdefault(int(n), []).append(tok[0] if tok else 0)
        span = max((r["finish_s"] for r in rs), default=0.0) - min((r["arrival_s"] for r in rs), default=0.0)
        out[e["run"]] = {"requests": len(rs), "tokens": toks, "wall_s": e["wall_s"], "tokens_per_s": toks / e["wall_s"],
                         "span_tokens_per_s": toks / span if span > 0 else None, "prefill_alone_s": alone,
                         "tpot_mean_ms": 1e3 * statistics.fmean(tpot) if tpot else None,
                         "tpot_p90_ms": 1e3 * float(np.percentile(tpot, 90)) if tpot else None,
                         "ttft_mean_ms": 1e3 * statistics.fmean(r["first_token_s"] - r["arrival_s"] for r in rs) if rs else None,
                         "steps": len(e["steps"]), "spec": e["spec"], **spec_figures(e["spec"]),
                         "decode_step_ms": {n: 1e3 * statistics.median(v) for n, v in sorted(decode.items())},
                         # tokens / s over the decode steps with n requests in flight (no request joining)
                         "decode_tokens_per_s": {n: sum(emitted[n]) / sum(v) for n, v in sorted(decode.items())},
                         "outputs": {r["index"]: r["output_ids"] for r in rs}}
    return out


def cost_curve_rows(results: dict, configs: list[SpecConfig], runs: list[dict]) -> list[dict]:
    """vllm_steps.jsonl: one row per (B, static k) closed run, profile-import's fields (sglang_import.py), and the
    prefills of the B = 1 run without speculation (there the i-th prompt is prefilled alone in the i-th joining step),
    each as its marginal cost: that step less a decode step at B = 1. vLLM runs a joining prompt inside the step
    that decodes the other requests, so what a join adds to a step is the prompt's work, not a step of its own
    (charging the whole B = 1 step made the load replay 10-14 % slow at B 10-14; log vllm-cpu 4d)."""
    rows = []
    b1 = next((r for r in runs if r["kind"] == "closed" and r["batch"] == 1), None)
    got = results.get("none", {}).get("runs", {}).get("B1")
    step = (got or {}).get("decode_step_ms", {}).get(1)
    if b1 and got and step and len(got["prefill_alone_s"]) == len(b1["prompts"]):
        rows += [{"prefill_tokens": len(p), "prefill_time": t - step / 1e3, "engine": "vllm"}
                 for p, t in zip(b1["prompts"], got["prefill_alone_s"]) if t > step / 1e3]
    for sc in configs:
        if sc.ranges or sc.name not in results:
            continue
        for run in (r for r in runs if r["kind"] == "closed"):
            B, r = run["batch"], results[sc.name]["runs"].get(run["name"])
            t = r["decode_step_ms"].get(B) if r else None
            if t is None:
                continue
            rows.append({"batch_size": B, "steps": sc.k, "topk": 1 if sc.k else 0, "num_draft_tokens": sc.k + 1 if sc.k else 0,
                         "acc_length": r["mean_acceptance_length"], "step_time": t / 1e3, "engine": "vllm"})
    return rows


def run_vllm_run_command(cfg: VllmRunConfig) -> int:
    from transformers import AutoTokenizer
    from tqdm import tqdm

    if not cfg.batch_sizes and not cfg.rates and not cfg.trace:
        raise DataError("nothing to run: give --batch-sizes, --rates or --trace")
    py = vllm_env.vllm_python()
    version = vllm_env.vllm_version(py)
    dtype = resolve_dtype_name(cfg.dtype, "cpu")
    tdir, hdir = vllm_env.target_dir(cfg.model), vllm_env.head_dir(cfg.head)
    records = load_prompts(cfg.dataset, resolve_split(cfg.dataset, cfg.split), cfg.n_prompts)
    if not records:
        raise DataError(f"no prompts in {cfg.dataset} (split {cfg.split or 'default'})")
    tok = AutoTokenizer.from_pretrained(tdir)
    prompts, kept, skipped = [], [], []
    for r in records:
        try:
            prompts.append(encode_prompt(tok, list(r.messages), max_prompt_tokens=cfg.max_model_len - cfg.max_new_tokens))
            kept.append(r)
        except DraftGymError as e:                                   # one bad prompt never kills the run
            skipped.append({"prompt_id": r.prompt_id, "error": str(e)})
    if not prompts:
        raise DataError(f"every prompt of {cfg.dataset} was refused, e.g. {skipped[0]['error']}")
    # what the comparisons read is checked before any engine starts: the logs of these prompts, the cost curve
    logs = prompt_logs(cfg.compare_logs, [r.prompt_id for r in kept], dtype) if cfg.compare_logs else None
    if cfg.cost_curve and not Path(cfg.cost_curve).is_file():
        raise DataError(f"cost curve not found: {cfg.cost_curve}")
    configs = spec_configs(cfg, hdir)
    runs = make_runs(cfg, prompts)
    out = Path(cfg.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    max_seqs = max([cfg.max_batch, *[int(b) for b in cfg.batch_sizes]])
    results = {}
    for sc in tqdm(configs, desc="vLLM engines", unit="engine", disable=cfg.as_json, file=sys.stderr):
        job = {"model": tdir, "dtype": dtype, "seed": cfg.seed, "max_model_len": cfg.max_model_len,
               "max_num_seqs": max_seqs, "memory_fraction": 0.2, "kv_cache_gib": cfg.kv_cache_gib,
               "speculative_config": sc.speculative_config, "warmup": prompts[:WARMUP_PROMPTS], "runs": runs}
        t0 = time.perf_counter()
        events, done, log = run_engine(py, job, out, sc.name, cfg.timeout_s)
        ready = next(e for e in events if e["event"] == "ready")
        results[sc.name] = {"k": sc.k, "ranges": sc.ranges, "speculative_config": sc.speculative_config,
                            "complete": done, "log": str(log), "startup_s": ready["startup_s"],
                            "engine_s": time.perf_counter() - t0, "runs": summarise(events)}
        if not done:
            print(f"draftgym: note: vLLM stopped before the end of config {sc.name}; its results so far are kept and "
                  f"marked partial: {vllm_env.vllm_error(log)} (log: {log})", file=sys.stderr)
    ref = results["none"]["runs"]
    for name, r in results.items():
        if name != "none":
            r["lossless_vs_none"] = lossless(r["runs"], ref)
    if dtype != "float32":                                      # reduced precision: is each divergence a near-tie?
        classify_divergences(cfg.model, dtype, results, runs)
    rep = {"config": asdict(cfg), "vllm_version": version, "dtype": dtype, "target": tdir, "head": hdir,
           "prompts": [r.prompt_id for r in kept], "skipped_prompts": skipped,
           "environment": environment_fingerprint("cpu", dtype), "results": results}
    if cfg.check_ar and dtype == "float32" and "B1" in ref:
        ar = dict(enumerate(draftgym_ar(cfg, prompts, dtype)))
        rep["draftgym_ar_vs_vllm"] = same_outputs(ar, ref["B1"]["outputs"])
    curve = cost_curve_rows(results, configs, runs)
    (out / "vllm_steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))
    if logs is not None:
        rep["replay_vs_vllm"] = compare_replay(logs, results, configs)
        costs = Path(cfg.cost_curve) if cfg.cost_curve else out / "vllm_steps.jsonl"
        if costs.is_file() and costs.read_text().strip():
            rep["cost_curve"] = str(costs)
            loads = {r["name"]: (r["arrivals"], [i % len(kept) for i in range(len(r["arrivals"]))])
                     for r in runs if r["kind"] == "trace"}
            try:
                lat = vllm_costs(costs, logs.model, dtype)
                rep["predicted_tokens_per_s"] = predict_closed(logs, lat, results, configs, cfg.batch_sizes)
                if loads:
                    rep["predicted_load"] = predict_load(logs, lat, results, configs, loads, cfg.max_batch)
            except DataError as e:                              # e.g. a curve without a speculative row at B = 1
                rep["prediction_note"] = f"no tokens/s prediction: {e}"
                print(f"draftgym: note: {rep['prediction_note']}", file=sys.stderr)
    (out / "report.json").write_text(json.dumps(rep, indent=1))
    (out / "report.md").write_text(report_md(rep))
    if cfg.as_json:
        print(json.dumps({k: v for k, v in rep.items() if k != "results"} | {"out": str(out)}))
    else:
        print(report_md(rep))
        print(f"wrote {out}/report.md, report.json, vllm_steps.jsonl ({len(curve)} rows: `draftgym profile-import "
              f"--format vllm-steps {out}/vllm_steps.jsonl --model {cfg.model} --dtype {dtype} --out LOGS`)")
    return 0


def report_md(rep: dict) -> str:
    c = rep["config"]
    lines = [f"# vLLM {rep['vllm_version']} run: {c['model']} + {c['head']}, {rep['dtype']}",
             "", f"CPU: {rep['environment'].get('cpu_model')}; {len(rep['prompts'])} prompts of {c['dataset']}, "
             f"{c['max_new_tokens']} new tokens, greedy", "",
             "| config | run | tokens/s | TPOT mean / p90 ms | mean acc. length | per-position acceptance | identical to none |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rep["results"].items():
        for run, f in r["runs"].items():
            ll = r.get("lossless_vs_none", {}).get(run)
            same = "ref" if name == "none" else (f"{ll['identical']}/{ll['of']}" if ll else "-")
            per = " / ".join(f"{x:.3f}" for x in f["acceptance_per_pos"]) or "-"
            tp = f"{f['tpot_mean_ms']:.1f} / {f['tpot_p90_ms']:.1f}" if f["tpot_mean_ms"] is not None else "-"
            if ll and ll.get("verdicts"):
                same += " (" + ", ".join(f"{v} {k}" for k, v in ll["verdicts"].items() if v and k != "exact") + ")"
            lines.append(f"| {name}{'' if r['complete'] else ' (partial)'} | {run} | {f['tokens_per_s']:.1f} | {tp} | "
                         f"{f['mean_acceptance_length']:.3f} | {per} | {same} |")
    if "draftgym_ar_vs_vllm" in rep:
        a = rep["draftgym_ar_vs_vllm"]
        lines += ["", f"DraftGym's AR against vLLM without speculation (B = 1): {a['identical']}/{a['of']} identical"]
    for row in rep.get("replay_vs_vllm", []):
        per = ", ".join(f"{v:.3f}/{p:.3f}" for v, p in zip(row["vllm_acceptance_per_pos"], row["replay_acceptance_per_pos"]))
        lines += ["", f"{row['config']} ({row['run']}): mean acceptance length vLLM {row['vllm_mean_acceptance_length']:.3f}, "
                      f"replay {row['replay_mean_acceptance_length']:.3f}; per position vLLM/replay {per}"]
    load = rep.get("predicted_load", [])
    if load:
        lines += ["", "Under load: vLLM against the replay of the same arrivals on vLLM's own step costs (tokens/s from "
                      "the first arrival to the last finish):", "",
                  "| config | run | vLLM tokens/s | replay | error | TPOT mean ms vLLM / replay | replay mean batch |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['config']} | {r['run']} | {r['vllm_tokens_per_s']:.1f} | {r['replay_tokens_per_s']:.1f} | "
                  f"{100 * r['error']:+.1f} % | {r['vllm_tpot_mean_ms'] or float('nan'):.1f} / {r['replay_tpot_mean_ms']:.1f} | "
                  f"{r['replay_mean_batch']:.2f} |" for r in load]
    pred = rep.get("predicted_tokens_per_s", [])
    if pred:
        lines += ["", "Decode tokens/s at B requests in flight, vLLM against the replay on vLLM's own step costs:", "",
                  "| config | B | vLLM | replay | error |", "|---|---|---|---|---|"]
        lines += [f"| {r['config']} | {r['batch']} | {r['vllm_decode_tokens_per_s']:.1f} | {r['replay_tokens_per_s']:.1f} | "
                  f"{100 * r['error']:+.1f} % |" for r in pred]
    return "\n".join(lines) + "\n"
