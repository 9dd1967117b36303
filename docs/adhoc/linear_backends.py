"""Target forward time by tokens per forward, MKL (torch default) vs oneDNN packed linears: one
smollm2-135m forward over a q-token chain on a context of 128, with hidden states, the tree mask
(log F1; pipeline/runtime/cpu_linear.py).

    .venv/bin/python docs/adhoc/linear_backends.py     (2 threads)
"""
import argparse
import os

import torch
from transformers import DynamicCache

from pipeline.decode.verify import crop_cache, target_forward, tree_attention_mask
from pipeline.models.target import load_target
from pipeline.profiling.timed_ops import chain_tree, time_op
from pipeline.runtime.cpu_linear import pack_linears

QS = (1, 2, 4, 8, 16, 32, 60)
CTX = 128


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    torch.set_num_threads(2)
    os.environ["DRAFTGYM_CPU_LINEAR"] = "torch"
    t = load_target("smollm2-135m")
    m, dev = t.model, t.device
    ids = torch.randint(0, 1000, (1, CTX))
    res = {}
    for backend in ("torch", "onednn"):
        if backend == "onednn":
            os.environ["DRAFTGYM_CPU_LINEAR"] = "onednn"
            print("packed", pack_linears(m))
        cache = DynamicCache(config=m.config)
        target_forward(m, ids, torch.arange(CTX)[None], cache, hidden_states=False)

        def run(q):
            tree = chain_tree(q, dev)
            am = tree_attention_mask(tree, CTX, m.dtype)

            def f():
                target_forward(m, tree.tokens[None], (CTX + tree.depths)[None], cache, am, hidden_states=True)
                crop_cache(cache, CTX)
            return f

        for q in QS:
            r = time_op(run(q), dev, warmup=3, repeats=15)
            res[(backend, q)] = r["median"]
            print(f"{backend:7s} q={q:3d}: {1e3 * r['median']:.1f} ms", flush=True)
    for q in QS:
        print(f"q={q:3d}: torch {1e3 * res[('torch', q)]:.1f} ms ({res[('torch', q)] / res[('torch', 1)]:.2f}x q=1), "
              f"onednn {1e3 * res[('onednn', q)]:.1f} ms ({res[('onednn', q)] / res[('onednn', 1)]:.2f}x q=1)")


if __name__ == "__main__":
    main()
