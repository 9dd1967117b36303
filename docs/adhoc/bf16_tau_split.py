"""Where bf16 replay and bf16 decoding part ways (log H3): tau before and after the first token where
the online output leaves the logged continuation.

For each held-out prompt in the logs: decode it online with a static tree, find the first index k where
the output differs from the logged continuation y (a near-tie flip in bf16), then split both the
replay's cycles (on y) and the online cycles at k: a cycle is "before" when every token it emits lies
before k. Before k the two walk the same text, so their tau should agree; after it the online text is
another continuation, and only the statistics can agree.

    .venv/bin/python docs/adhoc/bf16_tau_split.py LOGS DATASET [N] [SHAPES]

SHAPES: static (D, W, V) trees as 'D,W,V;D,W,V' (default '8,10,60;1,10,10').
"""
import argparse

import numpy as np

from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.decode.lossless import first_difference
from pipeline.logs.query import connect
from pipeline.models.head import load_head_for
from pipeline.models.target import load_target
from tests.helpers import replay_static


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs")
    ap.add_argument("dataset")
    ap.add_argument("n", nargs="?", type=int, default=8)
    ap.add_argument("shapes", nargs="?", default="8,10,60;1,10,10")
    a = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shapes.split(";")]
    con = connect(a.logs)
    seqs = con.execute("SELECT run_key, prompt_id, prompt_tokens, output_tokens, new_tokens, verify_grid, max_depth, dtype "
                       "FROM sequences WHERE dataset = ? AND split = 'test' ORDER BY prompt_id LIMIT ?",
                       [a.dataset, a.n]).fetchall()
    dtype = seqs[0][7]
    t = load_target("smollm2-135m", dtype=dtype)
    eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
    stats = {s: {k: [0, 0] for k in ("sim_pre", "real_pre", "sim_post", "real_post")} for s in shapes}   # [tokens, cycles]
    for run_key, pid, prompt, y, T, grid, Dm, _ in seqs:
        rows = con.execute("SELECT acceptance FROM positions WHERE run_key = ? AND prompt_id = ? AND width = 10 "
                           "ORDER BY position", [run_key, pid]).fetchall()
        acc = np.stack([np.asarray(r[0], np.int64) for r in rows]).reshape(-1, Dm, len(grid))
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

    def tau(v):
        return v[0] / v[1] if v[1] else float("nan")

    print(f"{a.dataset}, {len(seqs)} test prompts, {dtype}, logs {a.logs}")
    for s, d in stats.items():
        pre = (tau(d["sim_pre"]) - tau(d["real_pre"])) / tau(d["real_pre"])
        post = (tau(d["sim_post"]) - tau(d["real_post"])) / tau(d["real_post"])
        sim_all = [d["sim_pre"][0] + d["sim_post"][0], d["sim_pre"][1] + d["sim_post"][1]]
        real_all = [d["real_pre"][0] + d["real_post"][0], d["real_pre"][1] + d["real_post"][1]]
        tot = (tau(sim_all) - tau(real_all)) / tau(real_all)
        print(f"{s}: before the first divergence: {d['sim_pre'][1]} sim / {d['real_pre'][1]} real cycles, tau "
              f"{tau(d['sim_pre']):.3f} / {tau(d['real_pre']):.3f} ({100 * pre:+.1f}%); after: {d['sim_post'][1]} / "
              f"{d['real_post'][1]} cycles, tau {tau(d['sim_post']):.3f} / {tau(d['real_post']):.3f} ({100 * post:+.1f}%); "
              f"all: {100 * tot:+.1f}%")


if __name__ == "__main__":
    main()
