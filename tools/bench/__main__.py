"""`make bench`: every DraftGym benchmark at a small size, one summary table.

    python -m tools.bench [--only engine,env,ltd,collect,batch] [--out data/reports/bench]

Each benchmark runs in its own process (`python -m tools.bench.<name> ... --out <json>`), one after
the other, never two at once (two timing jobs on one machine distort each other). The full-size
runs behind BENCHMARKS.md are the same modules with larger arguments; their commands are in the
benchmark log (docs/benchmarks/). The small sizes here take a few minutes on a 2-core CPU and answer "does every benchmark run,
and roughly where does this machine stand":

    engine   AR against static EAGLE-3 trees on MT-bench prompts (tokens/s, tau, lossless)
    env      vectorised replay-env steps/s on synthetic logs
    ltd      an LTD depth-policy PPO run on synthetic logs (env steps/s of training)
    collect  positions logged per second against online EAGLE-3 tokens/s (starts Ray)
    scale    logs of 100k positions: writing, streamed evaluate (every baseline), LTD PPO from the replay
             window, with disk per position and peak RSS (tools/bench/scale.py: its docstring runs 2M)
    fidelity the replay's decode tokens/s against real decoding, per method, on held-out prompts, in
             fp32 and bf16: B = 1, closed batches B = 4 and 16, a load trace (tools/bench/fidelity.py;
             the longest, 25-30 min on a 2-core CPU)
    batch    optional (not in the default --only): tokens/s of the batched engine at B = 1 and 4 for AR,
             chain 2 and the (8, 10, 60) tree on 4 prompts of 16 tokens (tools/bench/batch.py, whose
             docstring gives the full-size command)

The table names the CPU (or GPU) and the dtype of every figure; the JSON of each benchmark is kept
under --out.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCHES = ("engine", "env", "ltd", "collect", "scale", "fidelity", "batch")
DEFAULT_BENCHES = ("engine", "env", "ltd", "collect", "scale", "fidelity")   # batch is optional: --only ...,batch


@dataclass
class BenchConfig:
    """`python -m tools.bench` settings."""
    only: str = ",".join(DEFAULT_BENCHES)   # comma-separated subset of BENCHES
    out: str = "data/reports/bench"     # folder for each benchmark's JSON and summary.md
    n_prompts: int = 3                  # prompts of the engine and collection benchmarks
    max_new_tokens: int = 64            # new tokens per prompt (engine, collection)
    ltd_steps: int = 20_000             # env steps of the LTD depth-phase PPO run
    scale_positions: int = 100_000      # positions of the scale benchmark's logs


def _run(module: str, args: list[str]) -> None:
    cmd = [sys.executable, "-m", module, *args]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _device() -> str:
    import torch

    from pipeline.runtime.fingerprint import environment_fingerprint

    if torch.cuda.is_available():
        return environment_fingerprint("cuda")["device"]
    return environment_fingerprint("cpu")["cpu_model"] or "cpu"


def bench_engine(cfg: BenchConfig, out: Path) -> list[tuple]:
    path = out / "engine.json"
    _run("tools.bench.engine", ["--head", "default", "--n-prompts", str(cfg.n_prompts), "--skip-ops",
                                 "--max-new-tokens", str(cfg.max_new_tokens), "--configs", "8,10,60;2,10,10",
                                 "--out", str(path)])
    r = json.loads(path.read_text())
    dtype = r["environment"].get("dtype")
    rows = []
    for name, s in r["summary"].items():
        rows.append(("engine", f"{name}: tokens/s (x AR, tau)",
                     f"{s['tokens_per_s']:.1f} ({s['speedup_vs_ar']:.2f}x, tau {s['tau']:.2f})", dtype))
    rows.append(("engine", "EAGLE-3 output equals AR", str(r["lossless"]), dtype))
    return rows


def bench_env(cfg: BenchConfig, out: Path) -> list[tuple]:
    path = out / "env.json"
    _run("tools.bench.env", ["--sequences", "20", "--n-envs", "1024", "--steps", "100",
                              "--modes", "depth,shape", "--out", str(path)])
    r = json.loads(path.read_text())
    return [("env", f"replay env {k}: steps/s", f"{v:,}", "numpy") for k, v in r["results"].items()]


def bench_ltd(cfg: BenchConfig, out: Path) -> list[tuple]:
    logs, path = out / "synthetic-logs", out / "ltd.json"
    if not (logs / "sequences").exists():
        _run("online.cli", ["synth-logs", "--out", str(logs), "--n-sequences", "20"])
    _run("tools.bench.ltd", ["--logs", str(logs), "--steps", str(cfg.ltd_steps), "--out", str(path)])
    r = json.loads(path.read_text())
    return [("ltd", f"LTD depth PPO, {r['steps']:,} env steps: wall s (steps/s)",
             f"{r['depth_phase_wall_s']:.1f} ({r['steps_per_s']:,.0f})", f"amp {r['amp']}")]


def bench_collect(cfg: BenchConfig, out: Path) -> list[tuple]:
    path = out / "collect.json"
    _run("tools.bench.collect", ["--n-prompts", str(cfg.n_prompts), "--max-new-tokens", str(cfg.max_new_tokens),
                                  "--online-trees", "2,10,10", "--prompt-batches", str(cfg.n_prompts),
                                  "--out", str(path)])
    r = json.loads(path.read_text())
    rows = []
    for run in r["runs"]:
        for c in run["collection"]:
            ratio = ", ".join(f"{v:.2f}x ({k})" for k, v in c["ratio"].items())
            rows.append(("collect", "positions/s (x online tokens/s)", f"{c['positions_per_s']:.1f} ({ratio})", run["dtype"]))
    return rows


def bench_batch(cfg: BenchConfig, out: Path) -> list[tuple]:
    path = out / "batch.json"
    _run("tools.bench.batch", ["--dataset", "mt-bench", "--n-prompts", "4", "--max-new-tokens", "16",
                                "--batch-sizes", "1,4", "--chains", "2", "--trees", "8,10,60", "--hf-batch", "4",
                                "--out", str(path)])
    r = json.loads(path.read_text())
    rows = []
    for run in r["runs"]:
        for name, by in run["by_method"].items():
            cells = ", ".join(f"B {B}: {f['tokens_per_s']:.1f}" for B, f in by.items())
            rows.append(("batch", f"{name}: tokens/s by batch size", cells, run["dtype"]))
        h = run.get("hf_generate")
        if h:
            rows.append(("batch", f"batched AR x HF generate at B = {h['batch']}", f"{h['ratio']:.2f}x", run["dtype"]))
    return rows


def bench_scale(cfg: BenchConfig, out: Path) -> list[tuple]:
    path = out / "scale.json"
    _run("tools.bench.scale", ["--positions", str(cfg.scale_positions), "--logs", str(out / "scale-logs"),
                                "--max-positions", str(cfg.scale_positions // 4), "--ltd-steps", "5000",
                                "--out", str(path)])
    r = {x["phase"]: x for x in json.loads(path.read_text())["results"]}
    w, e, t = r["write"], r["evaluate"], r["ltd"]
    return [("scale", "disk bytes per position (positions table, W = 10)", f"{w['bytes_per_position']:,.0f}", "v3"),
            ("scale", f"evaluate {e['positions']:,} positions streamed: s (pos/s, peak RSS GB)",
             f"{e['seconds']} ({e['positions_per_s']:,}, {e['peak_rss_gb']})", "numpy"),
            ("scale", f"LTD PPO {t['steps']:,} steps from a window: steps/s (peak RSS GB)",
             f"{t['steps_per_s']:,} ({t['peak_rss_gb']})", "numpy")]


def bench_fidelity(cfg: BenchConfig, out: Path) -> list[tuple]:
    path = out / "fidelity.json"
    _run("tools.bench.fidelity", ["--n-prompts", str(cfg.n_prompts), "--train-prompts", str(cfg.n_prompts),
                                   "--max-new-tokens", str(cfg.max_new_tokens), "--work", str(out / "fidelity"),
                                   "--out", str(path)])
    r = json.loads(path.read_text())
    rows = []
    for run in r["runs"]:
        s = run["summary"]
        if not s["rows"]:
            rows.append(("fidelity", "replayed against real decode tokens/s", "no rows (see fidelity.json)", run["dtype"]))
            continue
        per = "; ".join(f"{k} {100 * v['mean_abs']:.1f} %" for k, v in run["by_setting"].items())
        rows.append(("fidelity", "replayed against real decode tokens/s: mean abs error (largest; rows within 10 %)",
                     f"{100 * s['mean_abs']:.1f} % ({100 * s['max_abs']:.1f} %; {s['within_10pct']}/{s['rows']}); {per}",
                     run["dtype"]))
    return rows


def summary_table(rows: list[tuple], device: str) -> str:
    lines = ["| bench | figure | value | dtype | device |", "|---|---|---|---|---|"]
    lines += [f"| {b} | {f} | {v} | {d} | {device} |" for b, f, v, d in rows]
    return "\n".join(lines)


def run(cfg: BenchConfig) -> int:
    chosen = [b.strip() for b in cfg.only.split(",") if b.strip()]
    unknown = sorted(set(chosen) - set(BENCHES))
    if unknown:
        print(f"bench: error: unknown benchmark(s) {unknown}; choose from {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, rows = time.perf_counter(), []
    for name in chosen:
        rows += globals()[f"bench_{name}"](cfg, out)
    table = summary_table(rows, _device())
    text = (f"{table}\n\n{len(chosen)} benchmark(s) in {time.perf_counter() - t0:.0f} s, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    (out / "summary.md").write_text(text)
    print("\n" + text + f"JSON and summary.md under {out}")
    return 0


def main(argv=None) -> int:
    d = BenchConfig()
    ap = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--only", default=d.only, help="comma-separated benchmarks to run")
    ap.add_argument("--out", default=d.out, help="folder for the JSON reports and summary.md")
    ap.add_argument("--n-prompts", type=int, default=d.n_prompts, help="prompts (engine, collect)")
    ap.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="new tokens per prompt")
    ap.add_argument("--ltd-steps", type=int, default=d.ltd_steps, help="env steps of the LTD PPO run")
    a = ap.parse_args(argv)
    return run(BenchConfig(only=a.only, out=a.out, n_prompts=a.n_prompts, max_new_tokens=a.max_new_tokens,
                           ltd_steps=a.ltd_steps))


if __name__ == "__main__":
    sys.exit(main())
