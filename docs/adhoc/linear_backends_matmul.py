"""One linear layer by rows, MKL (F.linear) vs oneDNN (plain and with a packed weight), 2 threads.
Run: .venv/bin/python docs/adhoc/linear_backends_matmul.py"""
import torch
from matmul_by_rows import bench          # same timing loop (2 threads, 3 warm-up, mean of 30)
for (o,i) in [(1536,576),(576,576),(192,576),(49152,576)]:
    W = torch.randn(o,i)
    Wm = W.to_mkldnn()
    Wp = torch.ops.mkldnn._reorder_linear_weight(W, None)
    for M in (1,2,4,8,16,60):
        x = torch.randn(M,i)
        ref = torch.nn.functional.linear(x, W)
        y = torch.ops.mkldnn._linear_pointwise(x, Wp, None, "none", [None], "")
        err = (y-ref).abs().max().item()
        a = bench(lambda: torch.nn.functional.linear(x, W))
        c = bench(lambda: torch._C._nn.mkldnn_linear(x.to_mkldnn(), Wm, None).to_dense())
        d = bench(lambda: torch.ops.mkldnn._linear_pointwise(x, Wp, None, "none", [None], ""))
        print(f"W[{o},{i}] M={M}: linear {a:.3f}  mkldnn {c:.3f}  packed {d:.3f} ms  err {err:.1e}", flush=True)
