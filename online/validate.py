"""`draftgym validate`: policies in the loop on the real device, against AR, the static EAGLE-3
default and the grid-best static config, with a sim-vs-real report.

For each dataset (test split, first N prompts) and each run, every method decodes every prompt
(methods interleaved per prompt; Spec-Bench timing, see `online.speedbench`). At T = 0 every
output is checked against AR. Every cycle goes to `<out>/cycles/...parquet` (schema `cycles`).

Metrics (definitions stated once):
  tokens/s          new tokens / wall time per prompt (prefill included), mean over prompts, then
                    mean +- std over runs
  speedup vs X      tokens/s(method) / tokens/s(X), same prompts, same runs
  tau               sum(emitted) / cycles (vLLM's mean acceptance length)
  draft calls/cycle mean D actually drafted
  controller %      sum(t_controller) / sum(wall)
  sim-vs-real       the simulator replays the same policy on the logged sequences of the same
                    prompts (same model, head, temperature) with the device's latency profile.
                    Compared quantities are cycle-only: tau, and decode tokens/s =
                    sum(emitted) / sum(t_cycle) per prompt (the simulator has no prefill).
                    Error = (sim - real) / real.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from online.controllers import make_controller, policy_label
from online.speedbench import run_methods, summarize
from online.validate_report import write_markdown
from pipeline.cliargs import add_device_dtype, add_model_head, add_no_progress, add_split, parse_positive_ints
from pipeline.controller import StaticController
from pipeline.lossless import summarize_verdicts
from pipeline.errors import DataError, DraftGymError
from pipeline.schema import CYCLES, SCHEMA_VERSION, partition_dir, write_atomic, write_json_atomic

STATIC_DEFAULT = (8, 10, 60)


@dataclass
class ValidateConfig:
    model: str = "smollm2-135m"
    head: str = "default"
    policies: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=lambda: ["mt-bench"])
    split: str | None = "test"           # train | val | test | all; None: test for built-ins, all of a user's file
    n_prompts: int = 5
    temperature: float = 0.0
    runs: int = 3
    max_new_tokens: int = 128
    seed: int = 0
    logs: str | None = "data/logs"       # for grid-best and sim-vs-real (None: skip both)
    out: str = "data/reports/validate"
    device: str | None = None
    dtype: str | None = None             # compute dtype (default: bf16 on a GPU, pipeline.target.default_cpu_dtype on a CPU)
    logs_dtype: str | None = None        # the acceptance logs' dtype, when not the decoding's (transfer: logs of one
                                         # setting, the profile and decoding of another); None: the decoding's
    profile_first: bool = False          # profile this device in situ right before decoding (see profile_first)
    profile_verify_sizes: tuple = (1, 2, 4, 8, 16, 32, 60, 100, 240)
    profile_contexts: tuple = (32, 128, 512)
    profile_repeats: int = 8             # at least this many cycles per (V, context)
    profile_cycle_tokens: int = 16
    profile_interleave: int = 0          # further profile rounds spread between the generations (implies profile_first)


def decode_tokens_per_s(res) -> float | None:
    """Cycle-only throughput of one generation: sum(emitted) / sum(t_cycle). AR has no cycles: its
    decode steps after the prefill's token, (new_tokens - 1) / (wall - prefill)."""
    if res.method == "ar":
        t = res.wall_s - res.prefill_s
        return (res.new_tokens - 1) / t if t > 0 and res.new_tokens > 1 else None
    t = sum(c.t_cycle for c in res.cycles)
    return sum(c.emitted for c in res.cycles) / t if t > 0 else None


def cycle_rows(run_id: str, method: str, prompt_id: str, run: int, res, device: str) -> list[dict]:
    rows, p = [], 0
    for i, c in enumerate(res.cycles):
        rows.append({"schema_version": SCHEMA_VERSION, "run_id": run_id, "method": method, "prompt_id": prompt_id,
                     "run": run, "cycle": i, "position": p, "context_len": c.context_len, "depth": c.depth,
                     "width": c.width, "verify_size": c.verify_size, "accepted": c.accepted, "emitted": c.emitted,
                     "t_draft": c.t_draft, "t_verify": c.t_verify, "t_controller": c.t_controller,
                     "t_cycle": c.t_cycle, "device": device})
        p += c.emitted
    return rows


def run_validate(cfg: ValidateConfig, progress: bool = True) -> dict:
    from pipeline.datasets import load_prompts, resolve_split
    from pipeline.engine import Engine
    from pipeline.fingerprint import device_name, environment_fingerprint
    from pipeline.generate import load_head_for
    from pipeline.target import encode_prompt, load_target, resolve_dtype_name

    out = Path(cfg.out)
    t_start = time.perf_counter()
    dtype = resolve_dtype_name(cfg.dtype, cfg.device)     # decoding and profile must be of this dtype
    # the logs too, unless --logs-dtype says otherwise: acceptance moves little between dtypes (near-ties),
    # the clock moves a lot, so logs of one dtype with a profile of another is the transfer setting
    logs_dtype = resolve_dtype_name(cfg.logs_dtype, cfg.device) if cfg.logs_dtype else dtype
    # every prompt set first: a bad dataset or split fails before any model loads or profiling starts
    prompt_sets = {}
    for ds in cfg.datasets:
        split = resolve_split(ds, cfg.split)
        prompt_sets[ds] = load_prompts(ds, split=split, n=cfg.n_prompts)
        if not prompt_sets[ds]:
            raise DraftGymError(f"no prompts in {ds}" + (f" split {split}" if split else ""))
    # acceptance logs first: a bad --logs fails before the model loads
    logs = sim_note = None
    if cfg.logs:
        from simulator.logs import load_logs

        try:
            logs = load_logs(cfg.logs, model=cfg.model, temperature=cfg.temperature, widths="all", dtype=logs_dtype)
        except DataError as e:
            if cfg.temperature <= 0 or "temperature" not in str(e):
                raise
            # T > 0 without logs at this T: grid-best still comes from the greedy logs (acceptance at
            # T > 0 is what the sampled rule gives, so this choice is an approximation), and there is
            # no sim-vs-real (the replay needs logs at the decoding temperature).
            logs = load_logs(cfg.logs, model=cfg.model, temperature=0.0, widths="all", dtype=logs_dtype)
            sim_note = (f"no logs at temperature {cfg.temperature:g} in {cfg.logs}: grid-best tuned on the T = 0 logs; "
                        f"no sim-vs-real (collect with --temperature {cfg.temperature:g} for it)")
    elif cfg.profile_first or cfg.profile_interleave:
        raise DraftGymError("--profile-first needs --logs (the acceptance logs the simulator replays)")

    target = load_target(cfg.model, device=cfg.device, dtype=dtype)
    head = load_head_for(cfg.head, target.model, cfg.seed)
    engine = Engine(target.model, head, target.eos_token_ids)
    dev = device_name(target.device, dtype)
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    report = {"run_id": run_id, "config": asdict(cfg), "device": dev, "dtype": dtype, "logs_dtype": logs_dtype if logs is not None else None,
              "environment": environment_fingerprint(target.device, dtype),
              "head_id": head.head_id, "datasets": {}, "command": " ".join(sys.argv)}
    labels = [policy_label(p) for p in cfg.policies]
    if len(set(labels)) != len(labels):
        raise DraftGymError(f"policy names repeat: {labels}")

    # simulator side: this device's latency profile (fresh with --profile-first), grid-best configs
    sim = None
    if logs is not None:
        from simulator import baselines as B
        from simulator.evaluate import pick_tune_split
        from simulator.latency import LatencyModel

        lat_root = cfg.logs
        if cfg.profile_first or cfg.profile_interleave:
            report["profile_first"], sampler = profile_first(cfg, engine, target.tokenizer, out, progress)
            lat_root = str(out)
        lat = LatencyModel.from_logs(lat_root, model=logs.model, device=dev, dtype=dtype)
        report["latency_profile"] = {"root": lat_root, "profile_id": lat.meta.get("profile_id")}
        tune = logs.select(pick_tune_split(logs, resolve_split(cfg.datasets[0], cfg.split) or "test", "auto"))
        gs = B.grid_search(tune, lat)["by_dataset"]
        # lat: what grid-best and the online policies were chosen / built with; clock: what the
        # simulator's sim-vs-real prediction is timed with (the interleaved profile, when there is one)
        sim = {"logs": logs, "lat": lat, "clock": lat, "grid": {d: tuple(v["config"]) for d, v in gs.items()},
               "note": sim_note}
    if cfg.profile_interleave and sim:
        # profile rounds spread over the decoding: after generation slot j of n, the sampler has run
        # ceil(total * (j + 1) / n) trees, so its samples cover the same stretch of time as the decoding
        n_slots = len(cfg.datasets) * cfg.runs * cfg.n_prompts
        total = cfg.profile_interleave * len(sampler.jobs)
        slot = [0]
        base = sampler.done

        def between(*_):
            slot[0] += 1
            want = base + -(-total * min(slot[0], n_slots) // n_slots)
            if want > sampler.done:
                sampler.step(want - sampler.done)
    else:
        between = None

    pending = []
    for ds in cfg.datasets:
        recs = prompt_sets[ds]
        prompts = [encode_prompt(target.tokenizer, list(r.messages)) for r in recs]
        if between is not None:
            sampler.segment = ds        # the profile samples taken while this dataset decodes
        methods = {"ar": None, "static": StaticController(*STATIC_DEFAULT)}
        if sim:
            methods["grid-best"] = StaticController(*sim["grid"].get(ds, sim["grid"]["all"]))
        for spec, label in zip(cfg.policies, labels):
            methods[label] = make_controller(spec, logs=sim and sim["logs"], latency=sim and sim["lat"])
        runs, verdicts = run_methods(engine, prompts, methods, cfg.max_new_tokens, cfg.temperature, cfg.runs,
                                     cfg.seed, progress=progress, between=between)
        rows = [row for name, m in runs.items() if name != "ar" for r, run in enumerate(m.results)
                for rec, res in zip(recs, run) for row in cycle_rows(run_id, name, rec.prompt_id, r, res, dev)]
        if rows:
            path = partition_dir(out, "cycles", cfg.model, ds, cfg.temperature) / f"{run_id}.parquet"
            write_atomic(pa.Table.from_pylist(rows, schema=CYCLES), path, "cycles")
        summ = summarize(runs, baselines=("ar", "static") + (("grid-best",) if sim else ()))
        for name, m in runs.items():
            if name != "ar" and cfg.temperature <= 0:
                summ[name]["lossless"] = summarize_verdicts([v for n, _, _, v in verdicts if n == name])["counts"]
            dec = [decode_tokens_per_s(res) for run in m.results for res in run]
            dec = [d for d in dec if d is not None]
            summ[name]["decode_tokens_per_s"] = statistics.mean(dec) if dec else None
        lossless = summarize_verdicts([v for *_, v in verdicts])
        entry = {"prompts": [r.prompt_id for r in recs], "methods": summ,
                 "lossless": cfg.temperature > 0 or lossless["ok"], "lossless_checked": cfg.temperature <= 0,
                 "lossless_counts": lossless["counts"] if cfg.temperature <= 0 else None,
                 "divergences": [{"method": n, "run": r, "prompt_id": recs[i].prompt_id, **v.to_dict()}
                                 for n, r, i, v in verdicts if v.status != "exact"]}
        if sim:
            entry["grid_best"] = list(sim["grid"].get(ds, sim["grid"]["all"]))
            pending.append((entry, recs, runs))
        report["datasets"][ds] = entry
    if cfg.profile_interleave and sim:
        t0 = time.perf_counter()
        sampler.segment = "after"
        if sampler.done - base < total:               # fewer slots than planned (short datasets)
            sampler.step(base + total - sampler.done)
        info = sampler.write(str(out))
        from online.policy_cost import copy_policy_rows
        copy_policy_rows(str(out), cfg.model, report["profile_first"]["profile_id"], info["profile_id"])
        sim["clock"] = LatencyModel.from_logs(str(out), model=logs.model, device=dev, profile=info["profile_id"],
                                              dtype=dtype)
        # drift: each dataset's clock is the pooled profile rescaled by the speed the profile's own
        # samples saw while that dataset decoded (LatencyModel.scaled); the pooled clock's error stays
        # in the report as a second column
        sim["local"] = {ds: (sim["clock"].scaled(sf[0]), sf) for ds in cfg.datasets
                        if (sf := sampler.speed_factor(ds)) is not None}
        report["profile_interleave"] = {"profile_id": info["profile_id"], "rounds": info["rounds"],
                                        "trees": info["trees"], "final_s": time.perf_counter() - t0}
        report["latency_profile"] = {"root": str(out), "profile_id": info["profile_id"]}
    for entry, recs, runs in pending:                # after all decoding: the clock may be the pooled profile
        entry["sim_vs_real"] = ({"note": sim["note"]} if sim["note"] else sim_vs_real(cfg, sim, recs, runs, labels))
    report["wall_s"] = time.perf_counter() - t_start
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(report, out / "report.json")
    write_markdown(report, out)
    return report


def profile_first(cfg: ValidateConfig, engine, tokenizer, out: Path, progress: bool = True):
    """`--profile-first`: profile this engine in situ into `<out>/latency`, then time each checkpoint
    policy's controller calls into the same profile, right before decoding. Why: on a shared VM the
    machine's speed drifts (1.5-1.7x within an hour was measured here), and a profile taken in another
    state mis-predicts every method by that ratio (BENCHMARKS.md, E2). Returns (info, the sampler,
    whose further rounds `--profile-interleave` spreads over the decoding)."""
    from online.policy_cost import profile_policies
    from pipeline.profile import InSituSampler
    from simulator.checkpoint import load_checkpoint

    t0 = time.perf_counter()
    sampler = InSituSampler(engine, tokenizer, cfg.model, verify_sizes=cfg.profile_verify_sizes,
                            contexts=cfg.profile_contexts, repeats=cfg.profile_repeats,
                            cycle_tokens=cfg.profile_cycle_tokens)
    sampler.run_round(progress)
    info = sampler.write(str(out))
    ckpts = [(spec, load_checkpoint(spec)) for spec in cfg.policies if Path(spec).is_dir()]
    if ckpts:
        profile_policies(engine, tokenizer, ckpts, str(out), cfg.model, progress=progress)
    return ({"profile_id": info["profile_id"], "path": info["path"], "policies_timed": len(ckpts),
             "wall_s": time.perf_counter() - t0}, sampler)


def sim_vs_real(cfg: ValidateConfig, sim: dict, recs, runs, labels) -> dict:
    """Simulator predictions for the same prompts and policies vs the measured cycles.

    Also the AR row: the simulator's AR (t_ar per token) against measured AR decoding. Its error is
    the profile's view of this machine's speed against the speed during this validation, so
    `machine_speed_factor` = real AR decode tokens/s / simulated, and every method's
    `tokens_per_s_rel_error_ar_anchored` is its error after the simulated tokens/s are scaled by
    that factor (equivalently: the error of the predicted speedup vs AR). A diagnostic: the raw
    error is the one the issue's <= 10 % target is about.

    With --profile-interleave the clock is time-local: the pooled profile rescaled by the speed its
    own samples saw while this dataset decoded (`profile_speed_factor`; never fitted to the decoding
    being predicted). `tokens_per_s_rel_error_pooled` keeps the error of the unscaled pooled profile."""
    from simulator import baselines as B
    from simulator.checkpoint import load_policy
    from simulator.replay import autoregressive, simulate

    logs, lat, pooled = sim["logs"], sim["lat"], sim["clock"]
    local = sim.get("local", {}).get(recs[0].dataset)
    clock = local[0] if local else pooled        # time-local when --profile-interleave sampled this dataset
    ids = [r.prompt_id for r in recs]
    keep = np.isin(logs.prompt_id, ids)
    missing = sorted(set(ids) - set(logs.prompt_id[keep].tolist()))
    if not keep.any():
        return {"note": f"no logged sequences for these prompts in {cfg.logs} (collect them first)"}
    ev = logs.subset(keep)
    order = [ids.index(p) for p in ev.prompt_id.tolist()]         # log row -> prompt index
    ds = recs[0].dataset
    pols = {"static": B.StaticPolicy(*STATIC_DEFAULT), "grid-best": B.StaticPolicy(*sim["grid"].get(ds, sim["grid"]["all"]))}
    for spec, label in zip(cfg.policies, labels):
        pols[label] = load_policy(spec, logs=ev, latency=lat)

    def real_decode(m):          # per logged prompt: mean over runs of the decode tokens/s
        return [statistics.mean(d for run in m.results if (d := decode_tokens_per_s(run[i])) is not None)
                for i in order]

    ar_sim = autoregressive(ev, clock).tokens_per_s
    ar_real = real_decode(runs["ar"])
    speed = float(np.mean(ar_real) / np.mean(ar_sim))       # > 1: the machine ran faster than profiled
    out = {"missing_prompts": missing, "machine_speed_factor": speed,
           "profile_speed_factor": {"factor": local[1][0], "cells": local[1][1]} if local else None,
           "ar": {"sim_decode_tokens_per_s": float(np.mean(ar_sim)), "real_decode_tokens_per_s": float(np.mean(ar_real)),
                  "tokens_per_s_rel_error": float((np.mean(ar_sim) - np.mean(ar_real)) / np.mean(ar_real))},
           "methods": {}}
    if local:
        ar_pooled = autoregressive(ev, pooled).tokens_per_s
        out["ar"]["tokens_per_s_rel_error_pooled"] = float((np.mean(ar_pooled) - np.mean(ar_real)) / np.mean(ar_real))
    for name, pol in pols.items():
        res = simulate(pol, ev, clock)          # the policy as built online (lat), timed by the clock
        m = runs[name]
        real_tau = m.tau(order)
        real_dec = real_decode(m)
        sim_tau = float(res.tokens.sum() / max(res.cycles.sum(), 1))
        sim_dec = res.tokens_per_s.tolist()
        err = lambda scale: float((scale * np.mean(sim_dec) - np.mean(real_dec)) / np.mean(real_dec))
        out["methods"][name] = {
            "sim_tau": sim_tau, "real_tau": real_tau, "tau_rel_error": (sim_tau - real_tau) / real_tau if real_tau else None,
            "sim_decode_tokens_per_s": float(np.mean(sim_dec)), "real_decode_tokens_per_s": float(np.mean(real_dec)),
            "tokens_per_s_rel_error": err(1.0), "tokens_per_s_rel_error_ar_anchored": err(speed),
            "per_prompt": [{"prompt_id": ev.prompt_id[i], "sim": sim_dec[i], "real": real_dec[i]} for i in range(len(order))],
            "per_cycle_ms": per_cycle_components(res, m, order)}
        if local:
            pooled_dec = float(np.mean(simulate(pol, ev, pooled).tokens_per_s))
            out["methods"][name]["tokens_per_s_rel_error_pooled"] = float((pooled_dec - np.mean(real_dec)) / np.mean(real_dec))
    return out


def per_cycle_components(res, m, order) -> dict:
    """Mean per-cycle time components (ms), simulated vs measured: where a tokens/s error comes from."""
    cyc = [c for run in m.results for i in order for c in run[i].cycles]
    n_sim = max(int(res.cycles.sum()), 1)
    real = {"draft": np.mean([c.t_draft for c in cyc]), "verify": np.mean([c.t_verify for c in cyc]),
            "policy": np.mean([c.t_controller for c in cyc]),
            "overhead": np.mean([c.t_cycle - c.t_draft - c.t_verify - c.t_controller for c in cyc])} if cyc else {}
    simc = {k: float(res.components[f"t_{k}"].sum() / n_sim) for k in ("draft", "verify", "policy", "overhead")
            if f"t_{k}" in res.components}
    return {"sim": {k: 1e3 * v for k, v in simc.items()}, "real": {k: 1e3 * float(v) for k, v in real.items()}}


def add_validate(sub) -> None:
    p = sub.add_parser("validate", help="run policies in the loop on this device; speedup, lossless, sim-vs-real report")
    add_model_head(p)
    p.add_argument("--policy", action="append", default=[], help="checkpoint dir or built-in spec (repeatable)")
    p.add_argument("--dataset", default="mt-bench", help="comma-separated datasets")
    add_split(p)
    p.add_argument("--n-prompts", type=int, default=5, help="first N prompts per dataset")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (outputs checked against AR); > 0 samples")
    p.add_argument("--runs", type=int, default=3, help="Spec-Bench-style repeats (mean and std over runs)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt")
    p.add_argument("--seed", type=int, default=0, help="sampling seed base (seed + 1000 * run + prompt index)")
    p.add_argument("--logs", default="data/logs", help="logs for grid-best + sim-vs-real ('' to skip)")
    add_device_dtype(p)
    p.add_argument("--logs-dtype", default=None, choices=("float32", "bfloat16", "float16", "fp32", "bf16", "fp16"),
                   help="dtype of the --logs acceptance logs when it is not --dtype (hardware transfer: logs collected in "
                        "one dtype replayed with this device's profile; sim-vs-real then shows what that costs) "
                        "(default: --dtype)")
    p.add_argument("--out", default="data/reports/validate", help="report folder (report.md, report.json, PNGs, cycles Parquet)")
    p.add_argument("--profile-first", action="store_true",
                   help="profile this device in situ (and each checkpoint's controller cost) into OUT right before "
                        "decoding; grid-best and sim-vs-real then use that profile")
    p.add_argument("--profile-verify-sizes", default=",".join(map(str, ValidateConfig.profile_verify_sizes)), help="--profile-first: V values")
    p.add_argument("--profile-contexts", default=",".join(map(str, ValidateConfig.profile_contexts)), help="--profile-first: context lengths")
    p.add_argument("--profile-repeats", type=int, default=ValidateConfig.profile_repeats, help="--profile-first: at least this many cycles per (V, context)")
    p.add_argument("--profile-interleave", type=int, default=0, metavar="ROUNDS",
                   help="ROUNDS further profile rounds spread between the generations (implies --profile-first); "
                        "sim-vs-real is then timed with the profile pooled over all rounds (which samples the same "
                        "machine states as the decoding), rescaled per dataset by the speed its samples saw while "
                        "that dataset decoded")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_no_progress(p)
    p.set_defaults(func=_run_validate_cli)


def _run_validate_cli(args) -> int:

    if args.temperature < 0:
        raise DraftGymError(f"temperature must be >= 0, got {args.temperature}")
    if args.runs < 1 or args.n_prompts < 1:
        raise DraftGymError("--runs and --n-prompts must be >= 1")
    if args.profile_interleave < 0:
        raise DraftGymError(f"--profile-interleave must be >= 0, got {args.profile_interleave}")
    if (args.profile_first or args.profile_interleave) and not args.logs:
        raise DraftGymError("--profile-first needs --logs (the acceptance logs the simulator replays)")
    for spec in args.policy:
        if not spec.startswith(("static:", "ddd", "entropy", "goodput", "random", "oracle")) and not Path(spec).is_dir():
            raise DraftGymError(f"policy not found: {spec} (a directory from `draftgym train`, or a built-in spec)")
    if args.logs and not Path(args.logs).is_dir():
        raise DraftGymError(f"logs directory not found: {args.logs} (pass --logs '' to skip grid-best and sim-vs-real)")
    cfg = ValidateConfig(model=args.model, head=args.head, policies=args.policy, datasets=args.dataset.split(","),
                         split=args.split, n_prompts=args.n_prompts, temperature=args.temperature, runs=args.runs,
                         max_new_tokens=args.max_new_tokens, seed=args.seed, logs=args.logs or None, out=args.out,
                         device=args.device, dtype=args.dtype, logs_dtype=args.logs_dtype,
                         profile_first=args.profile_first,
                         profile_verify_sizes=parse_positive_ints(args.profile_verify_sizes, "--profile-verify-sizes"),
                         profile_contexts=parse_positive_ints(args.profile_contexts, "--profile-contexts"),
                         profile_repeats=args.profile_repeats, profile_interleave=args.profile_interleave)
    rep = run_validate(cfg, progress=not args.no_progress)
    if args.json:
        print(json.dumps(rep, default=str))
    else:
        print((Path(cfg.out) / "report.md").read_text())
        print(f"report: {Path(cfg.out) / 'report.md'}")
    ok = all(e["lossless"] for e in rep["datasets"].values())
    return 0 if ok else 1
