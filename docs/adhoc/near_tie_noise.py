"""The rounding noise behind the near-tie tolerance (pipeline/decode/lossless.py, log H1).

AR-decode train-split prompts in the given dtype, then measure how far the target's top-2 logit gap
moves between a 1-token forward and a CHUNK-token forward over the same positions
(`pipeline.decode.lossless.rounding_noise`). Prints the distribution of |move| in ulps of the logit, and of
the top-2 gaps themselves.

    .venv/bin/python docs/adhoc/near_tie_noise.py [DTYPE] [N_PROMPTS] [NEW_TOKENS] [CHUNKS]
"""
import argparse
import time

import numpy as np

from pipeline.datasets import load_prompts
from pipeline.decode.engine.single import Engine
from pipeline.decode.lossless import rounding_noise
from pipeline.models.target import encode_prompt, load_target


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dtype", nargs="?", default="bfloat16")
    ap.add_argument("n_prompts", nargs="?", type=int, default=8, help="half MT-bench, half HumanEval (train split)")
    ap.add_argument("new_tokens", nargs="?", type=int, default=96)
    ap.add_argument("chunks", nargs="?", default="8,60", help="comma-separated")
    a = ap.parse_args(argv)
    chunks = [int(c) for c in a.chunks.split(",")]
    t = load_target("smollm2-135m", dtype=a.dtype)
    eng = Engine(t.model, None, t.eos_token_ids)
    seqs, starts = [], []
    for ds in ("mt-bench", "humaneval"):
        for r in load_prompts(ds, split="train", n=a.n_prompts // 2):
            ids = encode_prompt(t.tokenizer, list(r.messages))
            out = eng.generate_ar(ids, a.new_tokens).output_ids
            seqs.append(ids + out)
            starts.append(len(ids))
    t0 = time.time()

    def q(v, p):
        return float(np.quantile(v, p))

    for chunk in chunks:
        mv, gp = [], []
        for s, st in zip(seqs, starts):
            r = rounding_noise(t.model, [s], st, chunk=chunk)
            mv += r["moves_ulp"]
            gp += r["gaps_ulp"]
        m = np.abs(np.array(mv))
        g = np.array(gp)
        print(f"{a.dtype} chunk {chunk}: {len(m)} positions; |move| in ulps: median {q(m, .5):.2f} p90 {q(m, .9):.2f} "
              f"p99 {q(m, .99):.2f} p99.9 {q(m, .999):.2f} max {m.max():.2f}; zero moves {np.mean(m == 0):.1%}")
        print(f"    top-2 gap in ulps: p1 {q(g, .01):.1f} p5 {q(g, .05):.1f} median {q(g, .5):.1f}; "
              f"gaps <= 8 ulps: {np.mean(g <= 8):.1%}; positions where |move| >= gap (a flip): {int(np.sum(m >= g))}")
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
