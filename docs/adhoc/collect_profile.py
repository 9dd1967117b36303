"""cProfile of batched collection on 8 ShareGPT train prompts of <= 256 tokens (64 new tokens, W = 10):
continuation generation timed apart, then `collect_prompts` profiled (BENCHMARKS.md I2).

    .venv/bin/python docs/adhoc/collect_profile.py DTYPE POSITION_BATCH
"""
import time, sys, cProfile, pstats
import torch
from pipeline.collect.prompt import CollectConfig, collect_prompts, generate_continuations
from pipeline.datasets import load_prompts
from pipeline.decode.engine import Engine
from pipeline.decode.head import load_head_for
from pipeline.decode.target import encode_prompt, load_target
dt = sys.argv[1]
t = load_target("smollm2-135m", dtype=dt)
eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
recs = load_prompts("sharegpt", "train", n=40)
ids = [encode_prompt(t.tokenizer, list(r.messages)) for r in recs]
ps = [p for p in ids if len(p) <= 256][:8]
cfg = CollectConfig(dtype=dt, max_new_tokens=64, widths=(10,), position_batch=int(sys.argv[2]))
t0=time.perf_counter(); conts = generate_continuations(eng, ps, cfg, cfg.max_depth); tg=time.perf_counter()-t0
print("gen", tg, sum(c[1] for c in conts))
collect_prompts(eng, eng.head, ps[:2], cfg, continuations=conts[:2])
pr = cProfile.Profile(); t0=time.perf_counter(); pr.enable()
logs = collect_prompts(eng, eng.head, ps, cfg, continuations=conts)
pr.disable(); tc=time.perf_counter()-t0
npos = sum(len(l.positions[10]["position"]) for l in logs)
print("collect (no gen)", tc, npos, npos/tc, "with gen", npos/(tc+tg))
pstats.Stats(pr).sort_stats(sys.argv[3] if len(sys.argv) > 3 else "tottime").print_stats(25)
