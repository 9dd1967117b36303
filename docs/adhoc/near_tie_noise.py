"""The rounding noise behind the near-tie tolerance (pipeline/decode/lossless.py, BENCHMARKS.md H1).

AR-decode train-split prompts in the given dtype, then measure how far the target's top-2 logit gap
moves between a 1-token forward and a CHUNK-token forward over the same positions
(`pipeline.decode.lossless.rounding_noise`). Prints the distribution of |move| in ulps of the logit, and of
the top-2 gaps themselves.

    .venv/bin/python docs/adhoc/near_tie_noise.py [DTYPE] [N_PROMPTS] [NEW_TOKENS] [CHUNKS]
"""
import sys
import time

import numpy as np

from pipeline.datasets import load_prompts
from pipeline.decode.engine import Engine
from pipeline.decode.lossless import rounding_noise
from pipeline.decode.target import encode_prompt, load_target

dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
n_prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 8
new_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 96
chunks = [int(c) for c in (sys.argv[4] if len(sys.argv) > 4 else "8,60").split(",")]
t = load_target("smollm2-135m", dtype=dtype)
eng = Engine(t.model, None, t.eos_token_ids)
seqs, starts = [], []
for ds in ("mt-bench", "humaneval"):
    for r in load_prompts(ds, split="train", n=n_prompts // 2):
        ids = encode_prompt(t.tokenizer, list(r.messages))
        out = eng.generate_ar(ids, new_tokens).output_ids
        seqs.append(ids + out)
        starts.append(len(ids))
t0 = time.time()
for chunk in chunks:
    mv, gp = [], []
    for s, st in zip(seqs, starts):
        r = rounding_noise(t.model, [s], st, chunk=chunk)
        mv += r["moves_ulp"]
        gp += r["gaps_ulp"]
    a = np.abs(np.array(mv))
    g = np.array(gp)
    q = lambda v, p: float(np.quantile(v, p))
    print(f"{dtype} chunk {chunk}: {len(a)} positions; |move| in ulps: median {q(a, .5):.2f} p90 {q(a, .9):.2f} "
          f"p99 {q(a, .99):.2f} p99.9 {q(a, .999):.2f} max {a.max():.2f}; zero moves {np.mean(a == 0):.1%}")
    print(f"    top-2 gap in ulps: p1 {q(g, .01):.1f} p5 {q(g, .05):.1f} median {q(g, .5):.1f}; "
          f"gaps <= 8 ulps: {np.mean(g <= 8):.1%}; positions where |move| >= gap (a flip): {int(np.sum(a >= g))}")
print(f"({time.time() - t0:.0f} s)")
