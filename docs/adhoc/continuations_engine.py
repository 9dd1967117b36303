"""Collection's continuations before and after they moved onto the one engine (issue N, item 5):
`generate_batch` of the previous commit (its own slot cache, a file given as OLD) against today's
(`BatchEngine.generate_ar`), interleaved in one run, same prompts, run_past_eos as collection runs it.

    PYTHONPATH=. .venv/bin/python docs/adhoc/continuations_engine.py OLD [DTYPES] [BATCHES] [REPEATS]

e.g. `git show e80055e:pipeline/decode/batch_generate.py > /tmp/old_bg.py` first. Prints tokens/s per
(dtype, B), the median of REPEATS runs each, and whether the rows are equal.
"""
import importlib.util
import statistics
import sys
import time

import torch

from pipeline.datasets import load_prompts
from pipeline.decode.batch_generate import generate_batch
from pipeline.decode.target import encode_prompt, load_target
from pipeline.runtime.fingerprint import cpu_model

NEW, MAX_PROMPT = 48, 256
spec = importlib.util.spec_from_file_location("old_bg", sys.argv[1])
old = sys.modules["old_bg"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
dtypes = (sys.argv[2] if len(sys.argv) > 2 else "float32,bfloat16").split(",")
batches = [int(b) for b in (sys.argv[3] if len(sys.argv) > 3 else "1,16,64").split(",")]
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3
print(f"cpu: {cpu_model()}  threads: {torch.get_num_threads()}")
for dt in dtypes:
    t = load_target("smollm2-135m", dtype=dt)
    recs = load_prompts("mt-bench", "train") + load_prompts("sharegpt", "train", n=400)
    prompts = [p for p in (encode_prompt(t.tokenizer, list(r.messages)) for r in recs) if len(p) <= MAX_PROMPT][:64]
    for fn in (old.generate_batch, generate_batch):                       # warm-up
        fn(t.model, prompts[:2], 4, batch_size=2, run_past_eos=True)
    for b in batches:
        ps = prompts[: max(b, 4)]
        times, outs = {"old": [], "new": []}, {}
        for _ in range(repeats):
            for name, fn in (("old", old.generate_batch), ("new", generate_batch)):
                t0 = time.perf_counter()
                outs[name] = fn(t.model, ps, NEW, batch_size=b, run_past_eos=True)
                times[name].append(time.perf_counter() - t0)
        tok = len(ps) * NEW
        o, n = statistics.median(times["old"]), statistics.median(times["new"])
        same = [a.output_ids for a in outs["old"]] == [c.output_ids for c in outs["new"]]
        print(f"{dt:9s} B={b:3d} prompts={len(ps):3d}  old {tok / o:7.1f} tok/s  new {tok / n:7.1f} tok/s  "
              f"new/old {o / n:5.3f}  rows equal: {same}", flush=True)
