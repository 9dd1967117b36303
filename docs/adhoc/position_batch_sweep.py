"""Warm collection wall time against the position batch (roots per head forward), BENCHMARKS.md O2.

The 64 ShareGPT test prompts of <= 256 tokens of online.bench.collect, 64 new tokens, prompt batch
64, continuations cached in a scratch $DRAFTGYM_CACHE (filled by one untimed pass), each position batch
timed twice, interleaved.

    .venv/bin/python docs/adhoc/position_batch_sweep.py DTYPE 16,32,64,128
"""
import os, sys, time, tempfile, argparse
from pathlib import Path
tmp = Path(tempfile.mkdtemp())
from pipeline.decode.target import load_target
from pipeline.runtime.cache import cache_dir
models = cache_dir() / "models"
os.environ["DRAFTGYM_CACHE"] = str(tmp / "cache"); (tmp / "cache").mkdir()
(tmp / "cache" / "models").symlink_to(models.resolve(), target_is_directory=True)
from pipeline.collect.prompt import CollectConfig
from pipeline.collect.job import run_collect
from online.bench.collect import prompt_file
dt = sys.argv[1]
t = load_target("smollm2-135m", dtype=dt)
pf = prompt_file(argparse.Namespace(dataset="sharegpt", split="test", max_prompt_tokens=256), t.tokenizer, 64, tmp / "prompts.jsonl")
mk = lambda pb: CollectConfig(model="smollm2-135m", head="default", dataset=str(pf), split=None, n_prompts=64, max_new_tokens=64, dtype=dt, position_batch=pb)
run_collect(mk(16), tmp / "fill", use_ray=False, progress=False, prompt_batch=64, continuation_cache=True)
for rep in range(2):
    for pb in [int(x) for x in sys.argv[2].split(",")]:
        t0 = time.perf_counter()
        run_collect(mk(pb), tmp / f"out{pb}-{rep}", use_ray=False, progress=False, prompt_batch=64, continuation_cache=True)
        print(dt, "position_batch", pb, f"warm wall {time.perf_counter() - t0:.1f}s", flush=True)
