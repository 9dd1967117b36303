"""The GPU check's serving step: every serving method under one load trace on this device.

The embedded SmolLM2 and the shipped head (as the validate step prepares them), from nothing but the
carried weights, through the commands a user runs, each in this process, in this order:

    collect      acceptance logs on this device of the first `serving_prompts` prompts of the set's train
                 split (what tune and train-load fit on) and of its test split (what is served: no
                 method was chosen or trained on it), widths 1 and 10 (chains and trees), in-process
                 (no Ray on the GPU machines); val-split of train-load: train too (mt-bench's val
                 split holds 6 prompts)
    profile      the batched engine's step costs on this device, B = `serving_batch_sizes`,
                 V = `serving_verify_sizes`, one context, the prefill at `serving_prefill_lengths` (into
                 the same logs root, so the replay and SGLang's throughput-aware rule price shapes with
                 this device's costs; a prompt below the shortest profiled length would be charged as
                 that length: docs/benchmarks/2026-11-27-replay-error-split.md, split-7)
    tune         the per-B schedule on those logs and that profile; its headroom shape (the one
                 static shape closest to every B's best) is served beside validate's static shapes
    serve-eval   the Poisson sweep whose rates keep about B = serving_batch_sizes rows busy under AR,
                 written as a trace (--write-trace)
    train-load   (serving_train_steps > 0) a load-aware policy trained on those logs and that profile
    validate     --load-trace: AR, the static shapes, the schedule, vLLM's example, SGLang's EMA and
                 throughput-aware rules and the learned policy on the device, `serving_runs` runs each,
                 every row checked against its prompt's batch-1 AR output, and the replay of the same
                 trace beside each (tokens/s error = sim-vs-real under load)

Comes back as serving_report.md (validate's load table) and serving_profile.parquet (this device's
SmolLM2 profile: `tune` / `serve-eval` / `train-load` read it from a logs root's latency/ folder), with
the commands, their wall times and every figure in gpu_report.json. The dry run serves a tiny random
Llama with a random head (nothing is accepted: the plumbing, not the speed).
"""
from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import time
from pathlib import Path

REPORT_FILE, PROFILE_FILE = "serving_report.md", "serving_profile.parquet"


def _ints(xs) -> str:
    return ",".join(map(str, xs))


def _draftgym(argv: list[str], log: list[dict]) -> str:
    """One `draftgym` command in this process; its stdout (returned) and wall time go to `log`; a
    non-zero exit raises with the command's last output line."""
    from online.cli import main as draftgym
    from pipeline.errors import DraftGymError

    t0, buf = time.perf_counter(), io.StringIO()
    print(f"gpu_check: serving: draftgym {argv[0]} ...", file=sys.stderr, flush=True)    # where a killed call got to
    with contextlib.redirect_stdout(buf):
        rc = draftgym(argv)
    log.append({"command": "draftgym " + " ".join(argv), "wall_s": time.perf_counter() - t0, "rc": rc})
    print(f"gpu_check: serving: draftgym {argv[0]}: exit {rc} [{log[-1]['wall_s']:.0f} s]", file=sys.stderr, flush=True)
    if rc != 0:
        tail = [ln for ln in buf.getvalue().splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise DraftGymError(f"draftgym {argv[0]} exited {rc}: {tail[0]}")
    return buf.getvalue()


def splits(dataset: str) -> tuple[str, str]:
    """(the split tune and train-load fit on, the split served): a built-in set's train and test splits,
    so the device serves prompts no method was chosen or trained on; a file of prompts has no splits
    (both 'all': in-sample, and the report says so)."""
    from pipeline.datasets import DATASETS

    return ("train", "test") if dataset in DATASETS else ("all", "all")


def serving_commands(cfg, model: str, head: str, dataset: str, work: Path) -> dict:
    """The argv of every command (module docstring) but validate's shapes and policy, which depend on
    tune's and train-load's results."""
    logs = str(work / "logs")
    on = ["--device", cfg.device, "--dtype", cfg.dtype]
    bs = _ints(cfg.serving_batch_sizes)
    fit, served = splits(dataset)
    prompts = lambda split: ["--dataset", dataset, "--split", split, "--n-prompts", str(cfg.serving_prompts)]
    collect = lambda split: ["collect", "--model", model, "--head", head, *prompts(split), "--max-new-tokens",
                             str(cfg.serving_new_tokens), "--widths", "1,10", "--out", logs, "--no-ray", "--no-progress", *on]
    return {
        "collect": collect(fit),
        "collect-served": collect(served),
        "profile": ["profile", "--model", model, "--head", head, "--batch-sizes", bs, "--widths", "1,10", "--verify-sizes",
                    _ints(cfg.serving_verify_sizes), "--contexts", str(cfg.serving_context), "--prefill-lengths",
                    _ints(cfg.serving_prefill_lengths), "--repeats", str(cfg.serving_repeats), "--out", logs, "--no-progress", *on],
        "tune": ["tune", "--logs", logs, "--split", fit, "--batch-sizes", bs, "--out", str(work / "schedule.json"),
                 "--json", "--no-progress"],
        "trace": ["serve-eval", "--logs", logs, "--split", served, "--tune-split", fit, "--batch-sizes", bs,
                  "--target-batches", bs, "--requests-per-rate", str(cfg.serving_requests_per_rate), "--max-batch",
                  str(max(cfg.serving_batch_sizes)), "--write-trace", str(work / "trace.txt")],
        "train-load": ["train-load", "--logs", logs, "--out", str(work / "policy"), "--split", fit, "--val-split", fit,
                       "--max-batch", str(max(cfg.serving_batch_sizes)), "--tune-batches", bs, "--target-batches", bs,
                       "--steps", str(cfg.serving_train_steps), "--no-progress"],
        "validate": ["validate", "--model", model, "--head", head, *prompts(served), "--load-trace", str(work / "trace.txt"),
                     "--max-batch", str(max(cfg.serving_batch_sizes)), "--schedule", str(work / "schedule.json"),
                     "--logs", logs, "--runs", str(cfg.serving_runs), "--max-new-tokens", str(cfg.serving_new_tokens),
                     "--out", str(work / "load"), "--no-progress", *on],
    }


def run_serving_step(cfg, deadline: float, work: Path, out: Path, tiny_shape: dict) -> dict:
    """The commands of the module docstring; a summary for gpu_report.json (status failed on a lossless
    mismatch; train-load skipped, and named, when the deadline leaves too little for it)."""
    from tools.gpu_check.validate import smollm2_or_tiny, validate_prompt_sets
    from online.validate.common import LoadTraceConfig
    from simulator.latency.model import LatencyModel

    work = work / "serving"
    model, head, why = smollm2_or_tiny(cfg, work, tiny_shape)
    if why:
        return {"status": "skipped", "reason": why}
    dataset = validate_prompt_sets(work, 1)[0]
    (fit, served), cmds, log = splits(dataset), serving_commands(cfg, model, head, dataset, work), []
    for name in ("collect", "collect-served", "profile") if fit != served else ("collect", "profile"):
        _draftgym(cmds[name], log)
    lat = LatencyModel.from_logs(work / "logs", trust=True)
    profile = next((work / "logs" / "latency").rglob("*.parquet"))
    shutil.copyfile(profile, out / PROFILE_FILE)
    tuned = json.loads(_draftgym(cmds["tune"], log).strip().splitlines()[-1])
    _draftgym(cmds["trace"], log)
    validate = cmds["validate"]
    static = tuned["headroom"]["shape"]               # beside validate's own static shapes, where it is not one
    shapes = list(LoadTraceConfig.shapes) + ([static] if static != "off" and static not in LoadTraceConfig.shapes else [])
    validate += ["--shapes", ";".join(shapes)]
    train_note = None
    if cfg.serving_train_steps > 0:
        left = deadline - time.perf_counter()
        if left > cfg.serving_train_reserve_s:
            _draftgym(cmds["train-load"], log)
            validate += ["--policy", str(work / "policy")]
        else:
            train_note = (f"train-load skipped: {left:.0f} s left of the step, it needs {cfg.serving_train_reserve_s:.0f} "
                          f"s beside validate")
    (work / "load" / "report.json").unlink(missing_ok=True)       # a rerun in the same --work reads only its own
    try:
        _draftgym(validate, log)
    except Exception:
        if not (work / "load" / "report.json").is_file():
            raise
    rep = json.loads((work / "load" / "report.json").read_text())    # written before a mismatch's exit 1
    shutil.copyfile(work / "load" / "report.md", out / REPORT_FILE)
    c0 = cfg.serving_context
    rows = [{k: r.get(k) for k in ("name", "tokens_per_s", "tokens_per_s_std", "x_ar", "tau", "drafts_per_step",
                                    "mean_batch", "graph_captures", "lossless")}
            | {"replay_tokens_per_s": (r.get("replay") or {}).get("tokens_per_s"),
               "replay_error": (r.get("replay_rel_error") or {}).get("tokens_per_s"),
               "cost_error": r.get("cost_rel_error"), "path_error": r.get("path_rel_error"),
               "cost_error_by_batch": r.get("cost_rel_error_by_batch")} for r in rep["rows"]]
    mismatch = sum((r.get("lossless") or {}).get("mismatch", 0) for r in rep["rows"])
    return {"status": "failed" if mismatch else "ok",
            "reason": f"{mismatch} served rows were a mismatch against batch-1 AR" if mismatch else None,
            "model": model, "head": rep["head_id"], "device": rep["device"], "dataset": dataset,
            "commands": log, "profile_file": PROFILE_FILE, "profile_id": lat.meta.get("profile_id"),
            "ar_ms": {B: 1e3 * float(lat.t_ar(c0, batch=B)) for B in lat.batch_levels},
            "schedule": tuned["schedule"], "tuned": tuned["per_batch"], "headroom": tuned["headroom"],
            "static": static, "fit_split": fit, "served_split": served,
            "trace": rep["trace"], "runs": cfg.serving_runs, "rows": rows,
            "replay_note": rep.get("replay_note"), "prefill_note": rep.get("prefill_note"), "train_note": train_note,
            "report_file": REPORT_FILE}
