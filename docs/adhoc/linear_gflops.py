"""GFLOP/s of the head's lm_head shape (rows x 576 -> 8192) in fp32 (packed oneDNN, as the engine runs it)
and bf16 (torch linear, AMX where present), for 10, 160 and 640 rows (BENCHMARKS.md I2).

    .venv/bin/python docs/adhoc/linear_gflops.py
"""
import time, torch
from torch import nn
from pipeline.runtime.cpu_linear import PackedLinear
for dt in (torch.float32, torch.bfloat16):
  for rows in (10, 160, 640):
    lin = nn.Linear(576, 8192, bias=False).to(dt)
    m = PackedLinear(lin) if dt == torch.float32 else lin
    x = torch.randn(rows, 576, dtype=dt)
    with torch.inference_mode():
        for _ in range(5): m(x)
        n=50; t0=time.perf_counter()
        for _ in range(n): m(x)
        t=(time.perf_counter()-t0)/n
    print(dt, rows, f"{t*1e3:.2f} ms  {2*rows*576*8192/t/1e9:.0f} GFLOP/s")
