import torch, time, statistics
from transformers import DynamicCache
from pipeline.decode.target import load_target
from pipeline.decode.verify import target_forward, verify_tree, tree_attention_mask, crop_cache
from pipeline.profiling.timed_ops import chain_tree, time_op
torch.set_num_threads(2)
t = load_target("smollm2-135m"); m = t.model; dev = t.device
print("attn impl", m.config._attn_implementation, m.dtype)
ctx = 70
cache = DynamicCache(config=m.config)
ids = torch.randint(0, 1000, (1, ctx))
target_forward(m, ids, torch.arange(ctx)[None], cache, hidden_states=False)
def run(q, hs, mask):
    tree = chain_tree(q, dev)
    am = tree_attention_mask(tree, ctx, m.dtype) if mask else None
    def f():
        target_forward(m, tree.tokens[None], (ctx + tree.depths)[None], cache, am, hidden_states=hs)
        crop_cache(cache, ctx)
    return f
for q in (1, 2, 4, 8):
    for hs in (False, True):
        for mask in (False, True):
            r = time_op(run(q, hs, mask), dev, warmup=3, repeats=15)
            print(f"q={q} hidden={hs} mask={mask}: {1e3*r['median']:.1f} ms")
