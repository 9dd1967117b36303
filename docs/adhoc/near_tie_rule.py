"""The near-tie rule on real decodings (BENCHMARKS.md H1): the embedded default in bf16 with the shipped
head, 12 held-out prompts x 2 static trees, 96 new tokens; every EAGLE-3 output classified against AR
(pipeline/decode/lossless.py), first with the engine's greedy acceptance, then with the deliberately biased
rule of tests/test_lossless.py (a draft is accepted when it is among the target's top-2). Prints each
divergence (prompt, shape, status, k, gap in logits, gap in ulps, tolerance) and the counts.

    .venv/bin/python docs/adhoc/near_tie_rule.py
"""
import time

import pipeline.decode.engine as engine_mod
from pipeline.decode.controller import StaticController
from pipeline.datasets import load_prompts
from pipeline.decode.engine import Engine
from pipeline.decode.head import load_head_for
from pipeline.decode.lossless import classify
from pipeline.decode.target import encode_prompt, load_target
from tests.test_lossless import biased_accept

t = load_target("smollm2-135m", dtype="bfloat16")
eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
recs = load_prompts("mt-bench", split="test", n=6) + load_prompts("humaneval", split="test", n=6)
t0 = time.time()
for mode in ("real", "biased"):
    if mode == "biased":
        engine_mod.accept_greedy = biased_accept
    counts = {"exact": 0, "near-tie": 0, "mismatch": 0}
    for r in recs:
        ids = encode_prompt(t.tokenizer, list(r.messages))
        ar = eng.generate_ar(ids, 96).output_ids
        for shape in [(8, 10, 60), (1, 10, 4)]:
            v = classify(t.model, ids, ar, eng.generate(ids, 96, controller=StaticController(*shape)).output_ids)
            counts[v.status] += 1
            if v.status != "exact":
                print(mode, r.prompt_id, shape, v.status, v.k, round(v.gap, 3), v.gap_ulps, round(v.tol, 3), flush=True)
    print(mode, counts, f"{time.time() - t0:.0f} s")
