"""Target forward time by tokens per forward, MKL (torch default) vs oneDNN packed linears.
Run: .venv/bin/python docs/adhoc/linear_backends.py   (2 threads, smollm2-135m, context 128)"""
import torch
from torch import nn
from transformers import DynamicCache
from pipeline.runtime.cpu_linear import PackedLinear, pack_linears
from pipeline.decode.target import load_target
from pipeline.decode.verify import target_forward, tree_attention_mask, crop_cache
from pipeline.profiling.timed_ops import chain_tree, time_op
torch.set_num_threads(2)
import os
os.environ["DRAFTGYM_CPU_LINEAR"] = "torch"
t = load_target("smollm2-135m"); m = t.model; dev = t.device
ctx = 128
ids = torch.randint(0, 1000, (1, ctx))

def run(q):
    tree = chain_tree(q, dev)
    am = tree_attention_mask(tree, ctx, m.dtype)
    def f():
        target_forward(m, tree.tokens[None], (ctx + tree.depths)[None], cache, am, hidden_states=True)
        crop_cache(cache, ctx)
    return f

res = {}
for backend in ("torch", "onednn"):
    if backend == "onednn":
        os.environ["DRAFTGYM_CPU_LINEAR"] = "onednn"
        print("packed", pack_linears(m))
    cache = DynamicCache(config=m.config)
    target_forward(m, ids, torch.arange(ctx)[None], cache, hidden_states=False)
    for q in (1, 2, 4, 8, 16, 32, 60):
        r = time_op(run(q), dev, warmup=3, repeats=15)
        res[(backend, q)] = r["median"]
        print(f"{backend:7s} q={q:3d}: {1e3*r['median']:.1f} ms", flush=True)
for q in (1, 2, 4, 8, 16, 32, 60):
    print(f"q={q:3d}: torch {1e3*res[('torch', q)]:.1f} ms ({res[('torch', q)]/res[('torch', 1)]:.2f}x q=1), "
          f"onednn {1e3*res[('onednn', q)]:.1f} ms ({res[('onednn', q)]/res[('onednn', 1)]:.2f}x q=1)")
