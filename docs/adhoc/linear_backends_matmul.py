"""One linear layer by rows, MKL (F.linear) vs oneDNN (plain and with a packed weight), 2 threads,
3 warm-up calls and the mean of 30: the target's MLP, attention and lm_head shapes (log F1;
pipeline/runtime/cpu_linear.py).

    .venv/bin/python docs/adhoc/linear_backends_matmul.py [--shapes OUTxIN,...] [--rows M,...] [--n N]
"""
import argparse
import time

import torch

SHAPES = "1536x576,576x576,192x576,49152x576"
ROWS = "1,2,4,8,16,60"


def bench(f, n: int = 30) -> float:
    """Mean ms of f() over n calls after 3 warm-up calls."""
    for _ in range(3):
        f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES, help=f"weight shapes out x in (default {SHAPES})")
    ap.add_argument("--rows", default=ROWS, help=f"rows M of the input (default {ROWS})")
    ap.add_argument("--n", type=int, default=30, help="timed calls per cell")
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    for o, i in (tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")):
        W = torch.randn(o, i)
        Wm = W.to_mkldnn()
        Wp = torch.ops.mkldnn._reorder_linear_weight(W, None)
        for M in (int(r) for r in a.rows.split(",")):
            x = torch.randn(M, i)
            ref = torch.nn.functional.linear(x, W)
            y = torch.ops.mkldnn._linear_pointwise(x, Wp, None, "none", [None], "")
            err = (y - ref).abs().max().item()
            t_lin = bench(lambda: torch.nn.functional.linear(x, W), a.n)
            t_mkl = bench(lambda: torch._C._nn.mkldnn_linear(x.to_mkldnn(), Wm, None).to_dense(), a.n)
            t_pack = bench(lambda: torch.ops.mkldnn._linear_pointwise(x, Wp, None, "none", [None], ""), a.n)
            print(f"W[{o},{i}] M={M}: linear {t_lin:.3f}  mkldnn {t_mkl:.3f}  packed {t_pack:.3f} ms  err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
