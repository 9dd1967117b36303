"""Batched collection on the 64 first ShareGPT test prompts (contexts up to 2,585 tokens), bf16: the 64
continuations generated in one batch, then the shortest and the longest group of 8 collected, the
longest profiled. This is what showed the need for the length caps of `pipeline/collect/actor.py`
(BENCHMARKS.md I3); it calls `collect_prompts` directly, without those caps.

    .venv/bin/python docs/adhoc/collect_long_prompts.py
"""
import time, sys, cProfile, pstats
import torch
from pipeline.collect.prompt import CollectConfig, collect_prompts, generate_continuations
from pipeline.datasets import load_prompts
from pipeline.decode.engine import Engine
from pipeline.decode.head import load_head_for
from pipeline.decode.target import encode_prompt, load_target
t = load_target("smollm2-135m", dtype="bfloat16")
eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
recs = load_prompts("sharegpt", "test", n=64)
ps = sorted([encode_prompt(t.tokenizer, list(r.messages)) for r in recs], key=len)
cfg = CollectConfig(dtype="bfloat16", max_new_tokens=64, widths=(10,))
t0=time.perf_counter(); conts = generate_continuations(eng, ps, cfg, cfg.max_depth, batch_size=64); tg=time.perf_counter()-t0
print("gen batch 64", round(tg,1), "s", sum(c[1] for c in conts), "positions")
for lo in (0, 56):
    g = list(range(lo, lo+8))
    t0=time.perf_counter()
    pr = cProfile.Profile(); pr.enable()
    logs = collect_prompts(eng, eng.head, [ps[i] for i in g], cfg, continuations=[conts[i] for i in g], batch_size=8)
    pr.disable()
    dt=time.perf_counter()-t0
    n = sum(len(l.positions[10]["position"]) for l in logs)
    print("group", lo, "lens", [len(ps[i]) for i in g], round(dt,1), "s", n, "pos", round(n/dt,1), "pos/s")
    if lo == 56: pstats.Stats(pr).sort_stats("tottime").print_stats(12)
