"""fp32 against bf16 (and fp16) on this machine, in one run: the AR step and the verify phase at
V = 1, 2, 4, 8, 16, 32, 64 (BENCHMARKS.md H2). The verify is the engine's whole verify phase
(`pipeline.profiling.timed_ops.verify_op` with the head: target forward with hidden states, acceptance, KV
compaction, feature fusion) at a fixed context; the AR step is a 1-token forward without hidden
states, as `Engine.generate_ar` runs it. Dtypes are interleaved round by round so drift hits all alike.

    .venv/bin/python docs/adhoc/dtype_verify_cost.py [CONTEXT] [ROUNDS] [DTYPES]
"""
import json
import sys

import torch
from transformers import DynamicCache

from pipeline.decode.engine import Engine
from pipeline.runtime.fingerprint import cpu_model, device_name
from pipeline.decode.head import load_head_for
from pipeline.profiling.timed_ops import time_op, verify_op
from pipeline.decode.target import load_target
from pipeline.decode.verify import crop_cache, target_forward

ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 128
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
dtypes = (sys.argv[3] if len(sys.argv) > 3 else "float32,bfloat16").split(",")
VS = (1, 2, 4, 8, 16, 32, 64)
engines = {}
for dt in dtypes:
    t = load_target("smollm2-135m", dtype=dt)
    eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)   # packs fp32 linears (oneDNN)
    engines[dt] = eng


def ar_step(model):
    cache = DynamicCache(config=model.config)
    ids = torch.randint(0, model.config.vocab_size, (1, ctx))
    target_forward(model, ids, torch.arange(ctx)[None], cache, hidden_states=False)
    tok = torch.tensor([[5]])

    def run():
        target_forward(model, tok, torch.tensor([[ctx]]), cache, hidden_states=False)
        crop_cache(cache, ctx)
    return run


res = {dt: {"ar": [], **{V: [] for V in VS}} for dt in dtypes}
for r in range(rounds):
    for dt, eng in engines.items():
        res[dt]["ar"].append(time_op(ar_step(eng.model), eng.device, warmup=3, repeats=15)["median"])
        for V in VS:
            res[dt][V].append(time_op(verify_op(eng.model, V, ctx, head=eng.head), eng.device, warmup=2, repeats=10)["median"])
print(f"CPU: {cpu_model()}; context {ctx}; {rounds} rounds, median of medians")
base = {dt: sorted(res[dt]["ar"])[len(res[dt]["ar"]) // 2] for dt in dtypes}
for dt in dtypes:
    row = {k: sorted(v)[len(v) // 2] for k, v in res[dt].items()}
    print(f"{device_name('cpu', dt)}: AR step {1e3 * row['ar']:.2f} ms; verify ms (x own AR step): "
          + ", ".join(f"V={V} {1e3 * row[V]:.2f} ({row[V] / row['ar']:.2f}x)" for V in VS))
    if dt != dtypes[0]:
        print(f"   {dt} / {dtypes[0]}: AR step {row['ar'] / base[dtypes[0]]:.2f}x; "
              + ", ".join(f"V={V} {row[V] / sorted(res[dtypes[0]][V])[len(res[dtypes[0]][V]) // 2]:.2f}x" for V in VS))
print(json.dumps({dt: {str(k): v for k, v in d.items()} for dt, d in res.items()}))
