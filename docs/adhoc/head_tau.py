"""tau of draft heads on held-out prompts, by exact replay of their collected logs (docs/head.md; log
I5, J1, K2).

For each head: greedy continuations (128 new tokens) of MT-bench val+test and HumanEval test prompts,
collected with `pipeline.collect.prompt.collect_prompts` (W = 10, Dmax = 12), then tau = mean accepted
tokens per cycle + 1 of the static trees (8, 10, 60) (the static default), (1, 10, 4) and (2, 10, 8)
(this CPU's grid-best shapes), replayed cycle by cycle with `replay_static` (exact for greedy decoding).
Also the top-1 agreement of the head's first draft token with the target's next token over every
position (step-0 accuracy in decoding, the quantity the trainer's acc[0] estimates).

    .venv/bin/python docs/adhoc/head_tau.py [DTYPE] HEAD [HEAD ...]

DTYPE (float32 | bfloat16 | float16, default bfloat16) is read as such when the first argument names one.
"""
import argparse

import numpy as np

from pipeline.collect.prompt import CollectConfig, collect_prompts
from pipeline.datasets import load_prompts
from pipeline.decode.engine.single import Engine
from pipeline.logs.schema import DEFAULT_VERIFY_GRID
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target
from pipeline.runtime.fingerprint import cpu_model
from tests.helpers import replay_static

DTYPES = ("float32", "bfloat16", "float16")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("args", nargs="+", metavar="[DTYPE] HEAD")
    args = ap.parse_args(argv).args
    dtype, heads = (args[0], args[1:]) if args[0] in DTYPES else ("bfloat16", args)
    if not heads:
        ap.error("no HEAD given")
    print(f"cpu: {cpu_model()}  dtype: {dtype}")
    t = load_target("smollm2-135m", dtype=dtype)
    sets = {"mt-bench": load_prompts("mt-bench", "val") + load_prompts("mt-bench", "test"),
            "humaneval": load_prompts("humaneval", "test")}
    prompts = {k: [encode_prompt(t.tokenizer, list(r.messages)) for r in v] for k, v in sets.items()}
    cfg = CollectConfig(dtype=dtype, max_new_tokens=128, widths=(10,))
    conts = {}
    for spec in heads:
        eng = Engine(t.model, load_head_for(spec, t.model), t.eos_token_ids)
        for name, ps in prompts.items():
            logs = collect_prompts(eng, eng.head, ps, cfg, continuations=conts.get(name))
            conts[name] = [(lg.output_tokens, lg.new_tokens, lg.stop_reason) for lg in logs]
            accs = [lg.positions[10]["acceptance"].reshape(-1, cfg.max_depth, len(DEFAULT_VERIFY_GRID)) for lg in logs]
            row = []
            for D, V in ((8, 60), (1, 4), (2, 8)):
                cyc = acc = 0
                for lg, a in zip(logs, accs):
                    steps = replay_static(a, lg.new_tokens, D, V)
                    cyc += len(steps)
                    acc += sum(L for _, L in steps)
                row.append(f"tau({D},10,{V}) {1 + acc / max(cyc, 1):.3f}")
            top1 = np.mean([float(x) for a in accs for x in (a[:, 0, 1] >= 1)])
            print(f"{spec:32s} {name:10s} {len(ps):3d} prompts  " + "  ".join(row) + f"  first-token top-1 {top1:.3f}")


if __name__ == "__main__":
    main()
