"""The target KV write per forward (30 layers, SmolLM2-135M's KV geometry: 3 KV heads of 64, fp32),
the previous advanced-index write against today's flat index_copy_ (BatchSlotKV.update), at
(rows A, tokens per row q). Best of 3 repeats of 300 forwards each; no model, no generation noise
(log one-engine 1).

    PYTHONPATH=. .venv/bin/python docs/adhoc/kv_write_micro.py [--cases AxQ,...] [--forwards N] [--repeats R]

Both writes must leave the same store: checked once per case before the timing.
"""
import argparse
import time

import torch

from pipeline.decode.engine.kv import BatchSlotKV
from pipeline.runtime.fingerprint import cpu_model

LAYERS, N_KV, D, S, N = 30, 3, 64, 400, 150
CASES = "1x1,1x4,4x1,16x1,16x3,16x10,64x1"


def advanced_index_update(self, k, v, layer_idx):
    """The write as it was: store[rows, :, idx] = k, its indices rebuilt in every layer."""
    A, q = k.shape[0], k.shape[2]
    idx = self.pos[:, None] + torch.arange(q, device=k.device)
    rows = torch.arange(A, device=k.device)[:, None]
    self.k[layer_idx][rows, :, idx] = k.transpose(1, 2)
    self.v[layer_idx][rows, :, idx] = v.transpose(1, 2)
    return self.k[layer_idx][:, :, : self.span], self.v[layer_idx][:, :, : self.span]


def per_forward_us(update, kv, k, v, n: int = 300) -> float:
    def forward():
        for layer in range(LAYERS):
            update(kv, k, v, layer)
    for _ in range(min(50, n)):
        forward()
    t0 = time.perf_counter()
    for _ in range(n):
        forward()
    return (time.perf_counter() - t0) / n * 1e6


def same_store(A: int, q: int, k, v) -> bool:
    """Both writes, each into a fresh store: equal keys and values read back."""
    out = []
    for update in (advanced_index_update, BatchSlotKV.update):
        kv = BatchSlotKV(1, A, N_KV, S, D, torch.float32, "cpu")
        kv.pos, kv.span = torch.full((A,), N), N + q
        out.append([x.clone() for x in update(kv, k, v, 0)])
    return all(torch.equal(a, b) for a, b in zip(*out))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=CASES, help=f"rows x tokens per row, comma-separated (default {CASES})")
    ap.add_argument("--forwards", type=int, default=300, help="forwards per timed repeat")
    ap.add_argument("--repeats", type=int, default=3, help="the best of this many repeats")
    a = ap.parse_args(argv)
    cases = [tuple(int(x) for x in c.split("x")) for c in a.cases.split(",")]
    print(f"cpu: {cpu_model()}  threads: {torch.get_num_threads()}  fp32, {LAYERS} layers, n_kv {N_KV}, d {D}")
    print("| A | q | advanced index us | flat index_copy_ us | before / after |\n|---|---|---|---|---|")
    for A, q in cases:
        k = torch.randn(A, q, N_KV, D).transpose(1, 2)              # [A, n_kv, q, d], strided as a projection's
        v = torch.randn_like(k)
        if not same_store(A, q, k, v):
            raise SystemExit(f"A={A} q={q}: the two writes leave different stores")
        kv = BatchSlotKV(LAYERS, A, N_KV, S, D, torch.float32, "cpu")
        kv.pos, kv.span = torch.full((A,), N), N + q
        old = min(per_forward_us(advanced_index_update, kv, k, v, a.forwards) for _ in range(a.repeats))
        new = min(per_forward_us(BatchSlotKV.update, kv, k, v, a.forwards) for _ in range(a.repeats))
        print(f"| {A} | {q} | {old:.0f} | {new:.0f} | {old / new:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
