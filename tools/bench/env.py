"""Benchmark: vectorised replay-env steps per second (python -m tools.bench.env [--logs DIR]).

Without --logs it writes synthetic logs (3 datasets x --sequences x 128..256 tokens) to a temp dir.
Actions are random (CONTINUE with probability 0.8), so cycles end at a realistic rate. Report
the numbers together with OMP_NUM_THREADS, the CPU and the machine's load.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from pipeline.runtime.atomic import atomic_write_json


def bench(logs, lat, mode: str, n_envs: int, steps: int, seed: int = 0) -> float:
    from simulator.envs.vector import make_replay_env

    env = make_replay_env(logs, lat, mode, n_envs=n_envs)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    acts = [(rng.random(n_envs) < 0.8).astype(np.int64) if mode in ("depth", "radar")
            else rng.integers(0, env.n_actions, n_envs) for _ in range(16)]
    for a in acts[:4]:                                   # warm-up
        env.step(a)
    t = time.perf_counter()
    for k in range(steps):
        env.step(acts[k % 16])
    return steps * n_envs / (time.perf_counter() - t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", default=None)
    ap.add_argument("--sequences", type=int, default=200, help="per dataset (synthetic)")
    ap.add_argument("--modes", default="depth,radar,size,shape")
    ap.add_argument("--n-envs", default="256,1024,4096,16384")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=None, help="write the JSON report here too")
    args = ap.parse_args(argv)
    from simulator.latency.model import LatencyModel
    from simulator.logs.replay_logs import load_logs
    from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs

    tmp = None
    root = args.logs
    if root is None:
        tmp = tempfile.TemporaryDirectory()
        root = tmp.name
        write_synthetic_logs(root, SyntheticConfig(n_sequences=args.sequences, new_tokens=(128, 256)))
    logs = load_logs(root)
    lat = LatencyModel.from_logs(root, model=logs.model, dtype=logs.dtype)
    out = {"positions": logs.n_positions, "sequences": logs.n_sequences, "omp_num_threads": os.environ.get(
        "OMP_NUM_THREADS"), "loadavg": os.getloadavg(), "cpus": os.cpu_count(), "results": {}}
    for mode in args.modes.split(","):
        for n in (int(x) for x in args.n_envs.split(",")):
            steps = max(10, args.steps * 1024 // max(n, 1024)) if mode in ("size", "shape") else args.steps
            out["results"][f"{mode}/{n}"] = round(bench(logs, lat, mode, n, steps))
            print(f"{mode:6s} n_envs={n:6d}: {out['results'][f'{mode}/{n}']:>12,} steps/s", flush=True)
    print(json.dumps(out))
    if args.out:
        atomic_write_json(out, args.out)
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
