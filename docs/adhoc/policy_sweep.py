"""Train a matrix of policies in the replay simulator, two at a time (one thread each), and pick each
(method, obs, objective) group's best seed on val (log M3, N4; docs/policies.md).

    .venv/bin/python docs/adhoc/policy_sweep.py LOGS OUT METHODS OBS OBJECTIVES SEEDS [STEPS...]
    e.g. ... data/logs/l-bf16 data/policies/l ltd,radar,resps paper,rich ratio,rate 0,1

Each run is `draftgym train --action-space wide`; its val tokens/s is the best validated checkpoint's
(training.json). Writes OUT/sweep.json (every run) and prints the selected checkpoints. Runs already
in OUT (training.json present) are not retrained. STEPS: method=N overrides, e.g. ltd=300000, and
temperature=T (default 0: the greedy logs, which validate decodes; logs may also hold T = 1)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def draftgym() -> str:
    """The draftgym entry point beside this interpreter (.venv/bin/draftgym)."""
    return str(Path(sys.executable).with_name("draftgym"))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs")
    ap.add_argument("out")
    ap.add_argument("methods", help="comma-separated: ltd,radar,resps")
    ap.add_argument("obs", help="comma-separated: paper,rich")
    ap.add_argument("objectives", help="comma-separated: ratio,rate")
    ap.add_argument("seeds", help="comma-separated ints")
    ap.add_argument("steps", nargs="*", metavar="method=N|temperature=T")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = dict(s.split("=", 1) for s in a.steps)
    temperature = budget.pop("temperature", "0")
    jobs = [(m, o, j, int(s)) for m in a.methods.split(",") for o in a.obs.split(",")
            for j in a.objectives.split(",") for s in a.seeds.split(",")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def run(job):
        m, o, j, s = job
        d = out / f"{m}-{o}-{j}-s{s}"
        if not (d / "training.json").exists():
            cmd = [draftgym(), "train", "--method", m, "--logs", a.logs, "--out", str(d), "--seed", str(s),
                   "--action-space", "wide", "--obs", o, "--objective", j, "--no-progress", "--json",
                   "--temperature", temperature]
            if m in budget:
                cmd += ["--steps", budget[m]]
            t0 = time.time()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode:
                print(f"FAILED {d.name}: {r.stderr.strip().splitlines()[-1:]}", flush=True)
                return None
            print(f"{d.name}: {time.time() - t0:.0f} s", flush=True)
        t = json.loads((d / "training.json").read_text())
        return {"dir": str(d), "method": m, "obs": o, "objective": j, "seed": s, "val": t["val_tokens_per_s"],
                "wall_s": t["wall_s"], "rate_ref": t["config"].get("rate_ref"), "reference": t["reference"]}

    with ThreadPoolExecutor(2) as ex:
        rows = [r for r in ex.map(run, jobs) if r]
    best = {}
    for r in rows:
        k = (r["method"], r["obs"], r["objective"])
        if k not in best or r["val"] > best[k]["val"]:
            best[k] = r
    sweep = {"runs": rows, "selected": list(best.values())}
    (out / "sweep.json").write_text(json.dumps(sweep, indent=2) + "\n")
    for r in sorted(rows, key=lambda r: (r["method"], r["obs"], r["objective"], r["seed"])):
        sel = "*" if best[(r["method"], r["obs"], r["objective"])] is r else " "
        print(f"{sel} {Path(r['dir']).name:28s} val {r['val']:.2f} tok/s  ({r['wall_s']:.0f} s)")
    return sweep


if __name__ == "__main__":
    main()
