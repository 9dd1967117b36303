"""AR and static EAGLE-3 trees, decoded online in fp32 and in bf16 in the same run (log H2).

For each held-out test prompt, each dtype, each method: one greedy generation (dtypes and methods
interleaved per prompt, so drift hits all alike; one warm-up per engine). Per method and dtype:
tokens/s = mean over prompts of new tokens / wall; speedup vs the same dtype's AR; the online
grid-best = the best of the static shapes. bf16 outputs are classified against bf16 AR
(pipeline/decode/lossless.py).

    .venv/bin/python docs/adhoc/dtype_speed.py [N_PER_DATASET] [NEW_TOKENS] [DTYPES]
"""
import argparse
import statistics
import sys

from pipeline.datasets import load_prompts
from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.decode.lossless import classify
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target
from pipeline.runtime.fingerprint import cpu_model, device_name

SHAPES = [(1, 10, 2), (1, 10, 4), (2, 10, 4), (2, 10, 8), (3, 10, 16), (8, 10, 60)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", nargs="?", type=int, default=4, help="prompts per dataset (MT-bench, HumanEval test)")
    ap.add_argument("new", nargs="?", type=int, default=96, help="new tokens")
    ap.add_argument("dtypes", nargs="?", default="float32,bfloat16", help="comma-separated")
    a = ap.parse_args(argv)
    dtypes = a.dtypes.split(",")
    engines, tok = {}, None
    for dt in dtypes:
        t = load_target("smollm2-135m", dtype=dt)
        engines[dt] = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
        tok = t.tokenizer
    recs = load_prompts("mt-bench", split="test", n=a.n) + load_prompts("humaneval", split="test", n=a.n)
    prompts = [encode_prompt(tok, list(r.messages)) for r in recs]
    for eng in engines.values():
        eng.generate_ar(prompts[0], 8)
        eng.generate(prompts[0], 8, controller=StaticController(2, 10, 8))
    tps = {dt: {m: [] for m in ["ar"] + SHAPES} for dt in dtypes}
    classes = {dt: {"exact": 0, "near-tie": 0, "mismatch": 0} for dt in dtypes}
    for i, p in enumerate(prompts):
        for dt, eng in engines.items():
            ar = eng.generate_ar(p, a.new)
            tps[dt]["ar"].append(ar.tokens_per_s)
            for s in SHAPES:
                r = eng.generate(p, a.new, controller=StaticController(*s))
                tps[dt][s].append(r.tokens_per_s)
                classes[dt][classify(eng.model, p, ar.output_ids, r.output_ids).status] += 1
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    print(f"CPU: {cpu_model()}; {len(prompts)} held-out prompts (MT-bench + HumanEval test), {a.new} new tokens, greedy")
    mean = {dt: {m: statistics.mean(v) for m, v in d.items()} for dt, d in tps.items()}
    for dt in dtypes:
        best = max(SHAPES, key=lambda s: mean[dt][s])
        print(f"{device_name('cpu', dt)}: AR {mean[dt]['ar']:.2f} tok/s; "
              + ", ".join(f"{s} {mean[dt][s]:.2f} ({mean[dt][s] / mean[dt]['ar']:.3f}x)" for s in SHAPES)
              + f"; grid-best {best} {mean[dt][best] / mean[dt]['ar']:.3f}x AR; lossless {classes[dt]}")
    if len(dtypes) == 2:
        a_dt, b_dt = dtypes
        ba, bb = (max(SHAPES, key=lambda s: mean[d][s]) for d in dtypes)
        print(f"{b_dt} / {a_dt}: AR {mean[b_dt]['ar'] / mean[a_dt]['ar']:.3f}x, grid-best {mean[b_dt][bb] / mean[a_dt][ba]:.3f}x "
              f"(tokens/s ratios; > 1: {b_dt} faster)")


if __name__ == "__main__":
    main()
