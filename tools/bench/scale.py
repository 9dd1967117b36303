"""Benchmark: DraftGym on logs of N positions (scale table): writing, evaluate, LTD PPO.

    python -m tools.bench.scale --positions 2000000 --logs /big/disk/scale-logs [--out FILE]

Writes synthetic logs of about N positions (W = 10, Dmax = 12, the 28-size V grid, 511 positions a
sequence, three datasets; `simulator.logs.synthetic`, sharded, `--workers` processes, resumable: a
rerun skips the shards already written), then times, each in its own process so its peak RSS is its
own:

    write      seconds, positions/s, bytes on disk per position (positions table, and every table)
    evaluate   `draftgym evaluate --split all` with every baseline (ar, static, grid-best, oracle,
               ddd, entropy): wall seconds, positions/s, peak RSS; streamed when N exceeds
               --max-positions-in-memory
    ltd        an LTD depth-phase PPO run of --ltd-steps env steps from the replay window
               (tools.bench.ltd): wall seconds, env steps/s, peak RSS
    tune       `draftgym tune` at B = 1, 4, 16, 64 on the train split's replay window, with a synthetic
               batched CPU profile: wall seconds, peak RSS, the schedule
    tune_ray   the same with --ray: every train position, a chunk of --max-positions a Ray task (embedded
               Ray, or RAY_ADDRESS), the chunks pooled: wall seconds, the driver's peak RSS (a task's
               is the window's: it holds one chunk), the schedule
    validate   validate's logs side (no model): the acceptance logs of three prompts (a window plus their
               sequences when N exceeds --max-positions-in-memory) and grid-best (streamed then): wall
               seconds, peak RSS, grid-best

`make bench` runs it at a small N. The figures name the CPU; everything is numpy/float32 on the CPU.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

SEQ_POSITIONS = 511                      # new_tokens = 512: positions 0 .. 510 per sequence
SHARD_SEQUENCES = 64                     # ~33k positions a shard


def _peak_rss_gb() -> float:
    """Peak resident set of this process and of its finished children, GB (Linux: ru_maxrss in KB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1e6


def _disk(root: Path, table: str | None = None) -> int:
    base = root / table if table else root
    return sum(f.stat().st_size for f in base.rglob("*.parquet"))


def phase_write(args) -> dict:
    from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs

    per_ds = max(1, -(-args.positions // (3 * SEQ_POSITIONS)))
    cfg = SyntheticConfig(n_sequences=per_ds, new_tokens=(SEQ_POSITIONS + 1, SEQ_POSITIONS + 1), widths=(10,),
                          seed=args.seed, shard_sequences=SHARD_SEQUENCES)
    t0 = time.perf_counter()
    out = write_synthetic_logs(args.logs, cfg, workers=args.workers, progress=True)
    dt = time.perf_counter() - t0
    root = Path(args.logs)
    n = per_ds * 3 * SEQ_POSITIONS
    return {"phase": "write", "positions": n, "seconds": round(dt, 1), "written_now": out["positions"],
            "positions_per_s": round(out["positions"] / dt) if out["positions"] else None,
            "bytes_per_position": round(_disk(root, "positions") / n, 1),
            "bytes_per_position_all_tables": round(_disk(root) / n, 1), "peak_rss_gb": round(_peak_rss_gb(), 2)}


def phase_evaluate(args) -> dict:
    from simulator.evaluate import evaluate

    t0 = time.perf_counter()
    rep = evaluate(args.logs, split="all", policies=["ddd", "entropy"], max_positions_in_memory=args.max_positions,
                   progress=True)
    dt = time.perf_counter() - t0
    return {"phase": "evaluate", "positions": rep["positions"], "seconds": round(dt, 1),
            "positions_per_s": round(rep["positions"] / dt), "streamed": rep["streamed"],
            "peak_rss_gb": round(_peak_rss_gb(), 2),
            "tokens_per_s": {k: round(v["all"]["tokens_per_s"], 2) for k, v in rep["results"].items()}}


def phase_ltd(args) -> dict:
    t0 = time.perf_counter()
    out = Path(args.logs) / "_bench_ltd.json"
    subprocess.run([sys.executable, "-m", "tools.bench.ltd", "--logs", args.logs, "--steps", str(args.ltd_steps),
                    "--max-positions-in-memory", str(args.max_positions), "--out", str(out)], check=True)
    r = json.loads(out.read_text())
    return {"phase": "ltd", "steps": r["steps"], "depth_phase_wall_s": round(r["depth_phase_wall_s"], 1),
            "steps_per_s": round(r["steps_per_s"]), "load_s": round(r["load_s"], 1),
            "train_positions": r["train_positions"], "seconds": round(time.perf_counter() - t0, 1),
            "peak_rss_gb": round(_peak_rss_gb(), 2)}


def phase_tune(args, ray: bool = False) -> dict:
    """`draftgym tune` at B = 1, 4, 16, 64 (every logged tree, the train split's window; ray: every
    position, in chunks as Ray tasks) on a synthetic CPU profile taken at those batch sizes, written
    beside the logs."""
    from online.cli import main as cli
    from simulator.logs.synthetic import SyntheticConfig, latency_rows, write_latency

    lat, out = Path(args.logs) / "_bench_tune", Path(args.logs) / "_bench_tune" / "schedule.json"
    write_latency(lat, latency_rows(SyntheticConfig().model, "cpu", batches=(1, 4, 16, 64)))
    t0 = time.perf_counter()
    rc = cli(["tune", "--logs", args.logs, "--latency", str(lat), "--batch-sizes", "1,4,16,64", "--shapes", "tree", "--split", "train",
              "--max-positions-in-memory", str(args.max_positions), "--out", str(out), "--no-progress"]
             + (["--ray"] if ray else []))
    dt = time.perf_counter() - t0
    if rc:
        raise SystemExit(f"bench_scale: tune exited {rc}")
    sched = json.loads(out.read_text())
    return {"phase": "tune_ray" if ray else "tune", "seconds": round(dt, 1), "peak_rss_gb": round(_peak_rss_gb(), 2),
            "sequences": sched["meta"]["sequences"], "chunks": sched["meta"]["chunks"],
            "ranges": [[r["batch"], r["shape"]] for r in sched["ranges"]]}


def phase_validate(args) -> dict:
    """validate's logs side, as `draftgym validate` runs it before decoding (no model): the acceptance
    logs for three prompts (the first, middle and last sequence) and grid-best on the tuning split."""
    from online.validate.common import ValidateConfig, load_acceptance_logs
    from online.validate.batch1 import simulator_side
    from simulator.logs.stream import LogSource

    seqs = LogSource(args.logs, widths="all", progress=False).sel.sequences
    ids = [seqs.prompt_id[i] for i in (0, len(seqs.prompt_id) // 2, len(seqs.prompt_id) - 1)]
    cfg = ValidateConfig(model=None, logs=args.logs, datasets=("mt-bench",), max_positions_in_memory=args.max_positions)
    t0 = time.perf_counter()
    logs, _, source = load_acceptance_logs(cfg, None, ids)
    t1 = time.perf_counter()
    sim, _ = simulator_side(cfg, logs, source, None, None, None, None, logs.dtype, {}, False)
    t2 = time.perf_counter()
    return {"phase": "validate", "seconds": round(t2 - t0, 1), "logs_s": round(t1 - t0, 1), "grid_s": round(t2 - t1, 1),
            "streamed": source is not None, "positions_read": logs.n_positions,
            "prompts_read": set(ids) <= set(logs.prompt_id.tolist()), "peak_rss_gb": round(_peak_rss_gb(), 2),
            "grid_best": {k: list(v) for k, v in sim.grid.items()}}


PHASES = {"write": phase_write, "evaluate": phase_evaluate, "ltd": phase_ltd, "tune": phase_tune,
          "tune_ray": lambda args: phase_tune(args, ray=True), "validate": phase_validate}


def main(argv=None) -> int:
    from pipeline.logs.schema import SCHEMA_VERSION
    from simulator.logs.stream import DEFAULT_MAX_POSITIONS

    ap = argparse.ArgumentParser(prog="python -m tools.bench.scale", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--positions", type=int, default=200_000, help="positions to write (rounded up to sequences)")
    ap.add_argument("--logs", default="data/reports/bench/scale-logs", help="where the synthetic logs go")
    ap.add_argument("--phases", default="write,evaluate,ltd,tune,validate",
                    help="comma-separated: write, evaluate, ltd, tune, tune_ray, validate")
    ap.add_argument("--workers", type=int, default=2, help="processes writing shards")
    ap.add_argument("--max-positions", type=int, default=DEFAULT_MAX_POSITIONS,
                    help="--max-positions-in-memory of evaluate and training")
    ap.add_argument("--ltd-steps", type=int, default=20_000, help="env steps of the LTD depth-phase PPO run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the result JSON here too")
    ap.add_argument("--phase", default=None, help=argparse.SUPPRESS)      # internal: run one phase in this process
    args = ap.parse_args(argv)
    if args.phase:
        print("SCALE_RESULT " + json.dumps(PHASES[args.phase](args)), flush=True)
        return 0
    from pipeline.runtime.fingerprint import environment_fingerprint

    results = []
    for name in [p.strip() for p in args.phases.split(",") if p.strip()]:
        if name not in PHASES:
            print(f"bench_scale: error: unknown phase {name!r} ({', '.join(PHASES)})", file=sys.stderr)
            return 2
        cmd = [sys.executable, "-m", "tools.bench.scale", *(argv if argv is not None else sys.argv[1:]),
               "--phase", name]
        print("$ " + " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        line = [x for x in proc.stdout.splitlines() if x.startswith("SCALE_RESULT ")][-1]
        results.append(json.loads(line[len("SCALE_RESULT "):]))
        print(json.dumps(results[-1]), flush=True)
    env = environment_fingerprint("cpu")
    out = {"bench": "scale", "positions_target": args.positions, "max_positions_in_memory": args.max_positions,
           "schema_version": SCHEMA_VERSION, "results": results, "cpu": env.get("cpu_model"),
           "environment": env, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(json.dumps(out))
    if args.out:
        from pipeline.runtime.atomic import atomic_write_json

        atomic_write_json(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
