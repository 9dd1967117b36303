"""Batch-1 profile, old path (in-situ generations per tree, commit 25cbad1) against the one path
(pipeline/profiling/steps.py: per context one generation playing the grid's shapes), interleaved
(log one-path 1).

    PYTHONPATH=. python docs/adhoc/profile_one_path.py OLD_CHECKOUT [ROUNDS] [REPEATS_NEW] [OUT_JSON]

Each round runs `profile_engine` at batch 1 with the demo's grid (V = 1..240 in 9 sizes, contexts 32
and 512, no prefill rows; repeats 3 in the old checkout, as the demo asks: at least 8 cycles per
tree there; REPEATS_NEW rounds of the grid in this one, default 3) once in each checkout, in a fresh
process, alternating which goes first. The child imports the package's modules under this layout
or, in an old checkout, under the old one (pipeline/decode/head.py, target.py). Prints the wall time
of each and, per batch-1 verify / draft_step cell, the median ratio new / old over the rounds; the
raw rows go to OUT_JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r'''
import json, sys, time, torch
from pipeline.decode.engine.single import Engine
try:                                    # this layout (pipeline/models/)
    from pipeline.models.head import load_head_for
    from pipeline.models.target import load_target
except ImportError:                     # checkouts before the package was reorganised
    from pipeline.decode.head import load_head_for
    from pipeline.decode.target import load_target
from pipeline.profiling.profile import profile_engine
from pipeline.logs.schema import read_table, table_files
torch.manual_seed(0)
t = load_target("smollm2-135m", device="cpu", dtype="float32")
head = load_head_for("default", t.model)
eng = Engine(t.model, head, t.eos_token_ids)
out = sys.argv[1]
t0 = time.perf_counter()
res = profile_engine(eng, t.tokenizer, "smollm2-135m", out, verify_sizes=(1, 2, 4, 8, 16, 32, 60, 100, 240),
                     contexts=(32, 512), repeats=int(sys.argv[2]), prefill_lengths=(), progress=False)
wall = time.perf_counter() - t0
rows = [r for f in table_files(out, "latency") for r in read_table(f, "latency").to_pylist()]
print(json.dumps({"wall_s": wall, "rows": [{k: r[k] for k in ("op", "width", "verify_size", "context_len", "batch", "n", "median")}
                                           for r in rows]}))
'''


def run(root: str, repeats: int) -> dict:
    """One profile in a fresh process with `root` as the package's checkout: its wall time and rows."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PYTHONPATH": root}
        p = subprocess.run([sys.executable, "-c", CHILD, d, str(repeats)], cwd=root, env=env, capture_output=True,
                           text=True, check=True)
        return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old_checkout")
    ap.add_argument("rounds", nargs="?", type=int, default=2)
    ap.add_argument("repeats_new", nargs="?", type=int, default=3)
    ap.add_argument("out_json", nargs="?", default=None)
    a = ap.parse_args(argv)
    old_root, new_root = a.old_checkout, os.getcwd()
    got = {"old": [], "new": []}
    for r in range(a.rounds):
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            res = run(old_root, 3) if name == "old" else run(new_root, a.repeats_new)
            got[name].append(res)
            print(f"round {r} {name}: {res['wall_s']:.1f} s, {len(res['rows'])} rows", flush=True)

    def key(x):
        return x["op"], x["width"], x["verify_size"], x["context_len"], x["batch"]

    ratios = {}
    for o, n in zip(got["old"], got["new"]):
        old = {key(x): x for x in o["rows"]}
        for x in n["rows"]:
            k = key(x)
            if k in old and x["op"] in ("verify", "draft_step"):
                ratios.setdefault(k, []).append(x["median"] / old[k]["median"])
    print("cell (op, W, V, c, B): new / old median, per round; n new / old")
    n_new = {key(x): x["n"] for x in got["new"][0]["rows"]}
    n_old = {key(x): x["n"] for x in got["old"][0]["rows"]}
    for k in sorted(ratios):
        print(k, " ".join(f"{v:.3f}" for v in ratios[k]), f"n {n_new.get(k)}/{n_old.get(k)}")
    allr = [v for vs in ratios.values() for v in vs]
    print(f"median over cells and rounds: {statistics.median(allr):.3f}; "
          f"walls old {[round(x['wall_s'], 1) for x in got['old']]} new {[round(x['wall_s'], 1) for x in got['new']]}")
    if a.out_json:
        with open(a.out_json, "w") as f:
            json.dump(got, f)
    return got


if __name__ == "__main__":
    main()
