import torch, time
torch.set_num_threads(2)
def bench(f, n=30):
    for _ in range(3): f()
    t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n*1e3
if __name__ == "__main__":       # bench() is shared with linear_backends_matmul.py
  for (o,i) in [(1536,576),(576,1536),(49152,576)]:
    W = torch.randn(o,i); Wt = W.t().contiguous()
    for M in (1,2,4,8):
        x = torch.randn(M,i)
        a = bench(lambda: torch.nn.functional.linear(x, W))
        b = bench(lambda: x @ Wt)
        c = bench(lambda: torch.stack([torch.mv(W, x[j]) for j in range(M)]))
        print(f"W[{o},{i}] M={M}: linear {a:.3f} ms, x@Wt {b:.3f} ms, M x mv {c:.3f} ms")
