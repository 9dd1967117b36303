"""The head's draft attention, old path (prefix expanded to B roots, concatenated with the tree levels,
keys repeat_interleave'd to the query heads) against the new one (a preallocated buffer, query heads
folded onto their kv head): 64 roots x 10 beams, 400 prefix + 60 tree entries, 3 kv heads x 3 query
heads, median of 20 calls; the outputs must be equal (BENCHMARKS.md I1).

    .venv/bin/python docs/adhoc/gqa_attention_speed.py
"""
import time, torch
import torch.nn.functional as F
torch.manual_seed(0)
B,W,S,T,nkv,rep,d = 64,10,400,60,3,3,64
for dt in (torch.float32, torch.bfloat16):
    pk = torch.randn(1,nkv,S,d,dtype=dt); tk = torch.randn(B,nkv,T,d,dtype=dt)
    q = torch.randn(B,nkv*rep,W,d,dtype=dt)
    mask = torch.zeros(B,1,W,S+T,dtype=dt); mask[..., ::3] = float("-inf"); mask[...,0]=0
    def cur():
        ks = torch.cat([pk.expand(B,-1,-1,-1), tk], 2); vs = ks
        ks, vs = ks.repeat_interleave(rep,1), vs.repeat_interleave(rep,1)
        return F.scaled_dot_product_attention(q, ks, vs, attn_mask=mask)
    buf = torch.empty(B,nkv,S+T,d,dtype=dt); buf[:,:,:S]=pk; buf[:,:,S:]=tk
    def fold():
        ks = buf[:,:,:S+T]
        qq = q.view(B,nkv,rep*W,d)
        m = mask.expand(B,1,W,S+T).repeat(1,1,rep,1) if False else mask[:,:,None].expand(B,1,rep,W,S+T).reshape(B,1,rep*W,S+T)
        return F.scaled_dot_product_attention(qq, ks, ks, attn_mask=m).view(B,nkv*rep,W,d)
    def gqa():
        ks = buf[:,:,:S+T]
        return F.scaled_dot_product_attention(q, ks, ks, attn_mask=mask, enable_gqa=True)
    r0=cur()
    for f in (cur, fold, gqa):
        with torch.inference_mode():
            for _ in range(3): o=f()
            t0=time.perf_counter()
            for _ in range(20): o=f()
            t=(time.perf_counter()-t0)/20
        print(dt, f.__name__, f"{t*1e3:.2f} ms", (o-r0).abs().max().item())
