"""Benchmark: wall time of an LTD depth-policy PPO run of N env steps (BENCHMARKS.md's "1M-step" figure).

    python -m tools.bench.ltd --logs data/logs/main --steps 1000000 [--action-space wide] [--out FILE]

Runs LTD's Iter0 depth phase exactly as `draftgym train --method ltd` does (paper PPO settings:
2048-step rollouts, minibatch 256, 20 epochs, actor [1024], critic [1024, 256], validation replay
every 10 updates included), with the size phase cut to a single update so the figure is the depth
phase's. Reports the depth phase's wall time (from the PPO history), env steps/s and the best
validation tokens/s, plus the device fingerprint.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

from pipeline.runtime.fingerprint import environment_fingerprint
from simulator.logs.stream import DEFAULT_MAX_POSITIONS
from simulator.train.common import PolicyTrainConfig, load_training_data
from simulator.methods.ltd.train import configure, train_ltd
from pipeline.runtime.atomic import atomic_write_json


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", required=True)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--action-space", default="wide", choices=["seeds", "wide"])
    ap.add_argument("--verify-size", type=int, default=None, help="depth phase V (default: 60, or grid-best with wide)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--amp", default="auto", choices=["auto", "bf16", "off"],
                    help="PPO update forwards in bf16 autocast (auto: where the CPU has bf16 units)")
    ap.add_argument("--obs", default="paper", choices=["paper", "rich"], help="observation variant")
    ap.add_argument("--max-positions-in-memory", type=int, default=DEFAULT_MAX_POSITIONS,
                    help="larger logs train from a seeded replay window of this many positions")
    ap.add_argument("--out", default=None, help="write the result JSON here too")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    data = load_training_data(args.logs, max_positions_in_memory=args.max_positions_in_memory, seed=args.seed,
                              progress=True)
    settings = PolicyTrainConfig(method="ltd", logs=args.logs, seed=args.seed, action_space=args.action_space,
                                 obs=args.obs, verify_size=args.verify_size)
    cfg = replace(configure(settings, data), depth_steps=args.steps, size_steps=1, iters=(0,))
    cfg = replace(cfg, depth_ppo=replace(cfg.depth_ppo, amp=args.amp))
    t_load = time.perf_counter() - t0
    res = train_ltd(data, cfg, progress=True)
    depth_hist = [h for h in res["history"] if h["phase"] == "iter0-depth"]
    wall = depth_hist[-1]["wall_s"]
    steps = depth_hist[-1]["steps"]
    out = {"bench": "ltd_depth_ppo", "steps": steps, "depth_phase_wall_s": wall, "steps_per_s": steps / wall,
           "updates": len(depth_hist), "best_val_tokens_per_s": res["val"]["iter0-depth"], "load_s": t_load,
           "verify_size": cfg.verify_size, "action_space": args.action_space, "logs": args.logs,
           "amp": depth_hist[-1].get("amp", "off"), "obs": cfg.obs_variant,
           "train_positions": int(data.train.n_positions), "environment": environment_fingerprint("cpu"),
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(json.dumps(out))
    if args.out:
        atomic_write_json(out, args.out)
    return 0


if __name__ == "__main__":
    import sys

    from pipeline.errors import DraftGymError

    try:
        raise SystemExit(main())
    except DraftGymError as e:                  # bad --logs etc.: one line, like the draftgym CLI
        print(f"bench_ltd: error: {e}", file=sys.stderr)
        raise SystemExit(2)
