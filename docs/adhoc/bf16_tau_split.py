"""Where bf16 replay and bf16 decoding part ways (BENCHMARKS.md H3): tau before and after the first
token where the online output leaves the logged continuation.

For each held-out prompt in the logs: decode it online with a static tree, find the first index k where
the output differs from the logged continuation y (a near-tie flip in bf16), then split both the
replay's cycles (on y) and the online cycles at k: a cycle is "before" when every token it emits lies
before k. Before k the two walk the same text, so their tau should agree; after it the online text is
another continuation, and only the statistics can agree.

    .venv/bin/python docs/adhoc/bf16_tau_split.py LOGS DATASET [N] [SHAPES]
"""
import sys

import numpy as np

from tests.helpers import replay_static
from pipeline.decode.controller import StaticController
from pipeline.decode.engine import Engine
from pipeline.decode.head import load_head_for
from pipeline.decode.lossless import first_difference
from pipeline.logs.query import connect
from pipeline.decode.target import load_target

logs, dataset = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 8
shapes = [tuple(int(x) for x in s.split(",")) for s in (sys.argv[4] if len(sys.argv) > 4 else "8,10,60;1,10,10").split(";")]
con = connect(logs)
seqs = con.execute(f"SELECT run_key, prompt_id, prompt_tokens, output_tokens, new_tokens, verify_grid, max_depth, dtype "
                   f"FROM sequences WHERE dataset = '{dataset}' AND split = 'test' ORDER BY prompt_id LIMIT {n}").fetchall()
dtype = seqs[0][7]
t = load_target("smollm2-135m", dtype=dtype)
eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
stats = {s: {k: [0, 0] for k in ("sim_pre", "real_pre", "sim_post", "real_post")} for s in shapes}   # [tokens, cycles]
for run_key, pid, prompt, y, T, grid, Dm, _ in seqs:
    acc = np.array(con.execute("SELECT acceptance FROM positions WHERE run_key = ? AND prompt_id = ? AND width = 10 "
                               "ORDER BY position", [run_key, pid]).fetchall()[0:], dtype=object)
    acc = np.stack([np.asarray(a[0], np.int64) for a in acc]).reshape(-1, Dm, len(grid))
    for s in shapes:
        res = eng.generate(list(prompt), T, controller=StaticController(*s))
        k = first_difference(list(y[: len(res.output_ids)]), res.output_ids)
        k = len(res.output_ids) if k is None else k
        for p, L in replay_static(acc, T, s[0], s[2], grid):
            part = "sim_pre" if p + L + 1 < k else "sim_post"
            stats[s][part][0] += min(L + 1, T - 1 - p)
            stats[s][part][1] += 1
        p = 0
        for c in res.cycles:
            part = "real_pre" if p + c.accepted + 1 < k else "real_post"
            stats[s][part][0] += c.emitted
            stats[s][part][1] += 1
            p += c.emitted
tau = lambda v: v[0] / v[1] if v[1] else float("nan")
print(f"{dataset}, {len(seqs)} test prompts, {dtype}, logs {logs}")
for s, d in stats.items():
    pre = (tau(d["sim_pre"]) - tau(d["real_pre"])) / tau(d["real_pre"])
    post = (tau(d["sim_post"]) - tau(d["real_post"])) / tau(d["real_post"])
    allv = lambda a, b: [d[a][0] + d[b][0], d[a][1] + d[b][1]]
    tot = (tau(allv("sim_pre", "sim_post")) - tau(allv("real_pre", "real_post"))) / tau(allv("real_pre", "real_post"))
    print(f"{s}: before the first divergence: {d['sim_pre'][1]} sim / {d['real_pre'][1]} real cycles, tau "
          f"{tau(d['sim_pre']):.3f} / {tau(d['real_pre']):.3f} ({100 * pre:+.1f}%); after: {d['sim_post'][1]} / "
          f"{d['real_post'][1]} cycles, tau {tau(d['sim_post']):.3f} / {tau(d['real_post']):.3f} ({100 * post:+.1f}%); "
          f"all: {100 * tot:+.1f}%")
