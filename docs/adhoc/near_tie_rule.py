"""The near-tie rule on real decodings (log H1): the embedded default in bf16 with the shipped head,
12 held-out prompts x 2 static trees, 96 new tokens; every EAGLE-3 output classified against AR
(pipeline/decode/lossless.py), first with the engine's greedy acceptance, then with the deliberately
biased rule of tests/pipeline/decode/test_lossless.py (a draft is accepted when it is among the target's top-2),
planted where the engine accepts (`accept_greedy_batch` of pipeline/decode/engine/core.py and
step.py, as tests/pipeline/decode/test_lossless.py plants it). Prints each divergence (prompt, shape, status, k, gap
in logits, gap in ulps, tolerance) and the counts.

    .venv/bin/python docs/adhoc/near_tie_rule.py
"""
import argparse
import time

import pipeline.decode.engine.core as batch_engine_mod
import pipeline.decode.engine.step as batch_step_mod
from pipeline.datasets import load_prompts
from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.decode.lossless import classify
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target
from tests.pipeline.decode.test_lossless import biased_accept_batch

RULE_MODULES = (batch_engine_mod, batch_step_mod)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    t = load_target("smollm2-135m", dtype="bfloat16")
    eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
    recs = load_prompts("mt-bench", split="test", n=6) + load_prompts("humaneval", split="test", n=6)
    real = {mod: mod.accept_greedy_batch for mod in RULE_MODULES}
    t0 = time.time()
    try:
        for mode in ("real", "biased"):
            if mode == "biased":
                for mod in RULE_MODULES:
                    mod.accept_greedy_batch = biased_accept_batch
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
    finally:
        for mod, fn in real.items():
            mod.accept_greedy_batch = fn


if __name__ == "__main__":
    main()
