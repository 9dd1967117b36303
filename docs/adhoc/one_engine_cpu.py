"""The one engine at batch 1 against the batch-1 loop it replaced (issue N item 2's CPU goal: AR and
the grid-best tree within 2 %), interleaved in one run on the same target, head and prompts.

    PYTHONPATH=. .venv/bin/python docs/adhoc/one_engine_cpu.py [DTYPE] [N_PROMPTS] [MAX_NEW] [ROUNDS] [METHODS]

METHODS: a comma-separated subset of ar, grid, static, chain (default: all four).

"before" is tests/pipeline/decode/reference_engine.py, the batch-1 loop (growing DynamicCache) as `Engine` ran it
until 2026-11-27, its clock reads left out (perf_counter on a CPU); "after" is `Engine` (the batched
engine at B = 1). Each side is timed the same way, perf_counter around the whole generation
(prefill included). Prompt by prompt both decode it, the order alternating, so the machine's drift
falls on both alike. Prints per method: tokens/s of each, after / before, and whether every output
is equal (fp32: it must be). Besides the ratio of the sums, the median and quartiles of the per-pair
ratios (each prompt's two back-to-back generations): a slow patch of the VM falls on one pair, not on
the whole sum. The last line is the report as JSON.
"""
import argparse
import json
import time

import torch

from pipeline.datasets import load_prompts
from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target
from pipeline.runtime.fingerprint import cpu_model
from tests.pipeline.decode.reference_engine import ReferenceEngine

METHODS = {"ar": None, "grid-best (3, 10, 8)": (3, 10, 8), "static default (8, 10, 60)": (8, 10, 60),
           "chain 3 (3, 1, 4)": (3, 1, 4)}


def method_key(name: str) -> str:
    """The METHODS argument's word for a method: ar, grid, static, chain."""
    return name.split()[0].split("-")[0]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dtype", nargs="?", default="float32")
    ap.add_argument("n_prompts", nargs="?", type=int, default=8)
    ap.add_argument("max_new", nargs="?", type=int, default=64)
    ap.add_argument("rounds", nargs="?", type=int, default=2)
    ap.add_argument("methods", nargs="?", default=None, help="comma-separated subset of ar, grid, static, chain")
    a = ap.parse_args(argv)
    methods = dict(METHODS)
    if a.methods:
        keep = a.methods.split(",")
        unknown = set(keep) - {method_key(k) for k in METHODS}
        if unknown:
            ap.error(f"unknown methods {sorted(unknown)}: choose from ar, grid, static, chain")
        methods = {k: v for k, v in METHODS.items() if method_key(k) in keep}

    t = load_target("smollm2-135m", dtype=a.dtype)
    head = load_head_for("default", t.model)
    sides = {"before": ReferenceEngine(t.model, head, t.eos_token_ids), "after": Engine(t.model, head, t.eos_token_ids)}
    recs = load_prompts("mt-bench", "test")
    prompts = [p for p in (encode_prompt(t.tokenizer, list(r.messages)) for r in recs) if len(p) <= 256][:a.n_prompts]

    def run(eng, shape, p):
        t0 = time.perf_counter()
        r = eng.generate_ar(p, a.max_new) if shape is None else eng.generate(p, a.max_new, controller=StaticController(*shape))
        return r, time.perf_counter() - t0

    print(f"cpu: {cpu_model()}  threads: {torch.get_num_threads()}  dtype: {a.dtype}  prompts: {len(prompts)}  "
          f"max_new: {a.max_new}  rounds: {a.rounds}", flush=True)
    for shape in methods.values():                                             # warm-up, untimed
        for eng in sides.values():
            run(eng, shape, prompts[0])
    report = {}
    for name, shape in methods.items():
        tok, wall, equal, pairs = {"before": 0, "after": 0}, {"before": 0.0, "after": 0.0}, True, []
        for k in range(a.rounds):
            for i, p in enumerate(prompts):
                outs, secs = {}, {}
                for side in (("before", "after") if (i + k) % 2 == 0 else ("after", "before")):
                    r, s = run(sides[side], shape, p)
                    tok[side] += r.new_tokens
                    wall[side] += s
                    secs[side] = s
                    outs[side] = r.output_ids
                equal &= outs["before"] == outs["after"]
                pairs.append(secs["before"] / secs["after"])                  # after/before in tokens/s
        b, af = tok["before"] / wall["before"], tok["after"] / wall["after"]
        q1, med, q3 = (float(x) for x in torch.tensor(pairs).quantile(torch.tensor([0.25, 0.5, 0.75])))
        report[name] = {"before_tokens_per_s": b, "after_tokens_per_s": af, "after_over_before": af / b,
                        "pair_median": med, "pair_q1": q1, "pair_q3": q3, "pairs": len(pairs), "equal": equal}
        print(f"{name:28s} before {b:6.2f} tok/s  after {af:6.2f} tok/s  after/before {af / b:.3f}  "
              f"per pair median {med:.3f} [{q1:.3f}, {q3:.3f}] ({len(pairs)})  outputs equal: {equal}", flush=True)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
