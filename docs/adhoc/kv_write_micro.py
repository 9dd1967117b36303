"""The target KV write per forward (30 layers, SmolLM2-135M's KV geometry: 3 KV heads of 64, fp32),
the previous advanced-index write against today's flat index_copy_ (BatchSlotKV.update), at
(rows A, tokens per row q). Best of 3 repeats of 300 forwards each; no model, no generation noise.

    PYTHONPATH=. .venv/bin/python docs/adhoc/kv_write_micro.py
"""
import time

import torch

from pipeline.decode.batch_kv import BatchSlotKV
from pipeline.runtime.fingerprint import cpu_model

LAYERS, N_KV, D, S, N = 30, 3, 64, 400, 150


def advanced_index_update(self, k, v, layer_idx):
    """The write as it was: store[rows, :, idx] = k, its indices rebuilt in every layer."""
    A, q = k.shape[0], k.shape[2]
    idx = self.pos[:, None] + torch.arange(q, device=k.device)
    rows = torch.arange(A, device=k.device)[:, None]
    self.k[layer_idx][rows, :, idx] = k.transpose(1, 2)
    self.v[layer_idx][rows, :, idx] = v.transpose(1, 2)
    return self.k[layer_idx][:, :, : self.span], self.v[layer_idx][:, :, : self.span]


def per_forward_us(update, kv, k, v, n=300) -> float:
    def forward():
        for layer in range(LAYERS):
            update(kv, k, v, layer)
    for _ in range(50):
        forward()
    t0 = time.perf_counter()
    for _ in range(n):
        forward()
    return (time.perf_counter() - t0) / n * 1e6


print(f"cpu: {cpu_model()}  threads: {torch.get_num_threads()}  fp32, {LAYERS} layers, n_kv {N_KV}, d {D}")
print("| A | q | advanced index us | flat index_copy_ us | before / after |\n|---|---|---|---|---|")
for A, q in ((1, 1), (1, 4), (4, 1), (16, 1), (16, 3), (16, 10), (64, 1)):
    kv = BatchSlotKV(LAYERS, A, N_KV, S, D, torch.float32, "cpu")
    kv.pos, kv.span = torch.full((A,), N), N + q
    k = torch.randn(A, q, N_KV, D).transpose(1, 2)              # [A, n_kv, q, d], strided as a projection's
    v = torch.randn_like(k)
    old = min(per_forward_us(advanced_index_update, kv, k, v) for _ in range(3))
    new = min(per_forward_us(BatchSlotKV.update, kv, k, v) for _ in range(3))
    print(f"| {A} | {q} | {old:.0f} | {new:.0f} | {old / new:.2f}x |", flush=True)
