"""The target KV write of the engine at B > 1, before and after it became one flat index_copy_ per
layer (pipeline/decode/engine/kv.py BatchSlotKV.update): the previous advanced-index write, patched
back in, against today's, interleaved in one run on the same prompts (issue N: the batched tables
must be no slower; log one-engine 3).

    PYTHONPATH=. .venv/bin/python docs/adhoc/kv_write_batched.py [DTYPE] [BATCHES] [ROUNDS]

Prints tokens/s of each write per (method, B) over ROUNDS alternating runs, and whether rows are equal.
"""
import argparse
import time

import torch

from pipeline.datasets import load_prompts
from pipeline.decode.controller import StaticController
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.kv import BatchSlotKV
from pipeline.decode.step_shape import StepShape
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target
from pipeline.runtime.fingerprint import cpu_model

NEW = 32


def advanced_index_update(self, k, v, layer_idx, *args, **kwargs):
    """The write as it was: store[rows, :, idx] = k, its indices rebuilt in every layer."""
    A, q = k.shape[0], k.shape[2]
    idx = self.pos[:, None] + torch.arange(q, device=k.device)                 # [A, q]
    rows = torch.arange(A, device=k.device)[:, None]
    self.k[layer_idx][rows, :, idx] = k.transpose(1, 2)
    self.v[layer_idx][rows, :, idx] = v.transpose(1, 2)
    return self.k[layer_idx][:, :, : self.span], self.v[layer_idx][:, :, : self.span]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dtype", nargs="?", default="float32")
    ap.add_argument("batches", nargs="?", default="4,16", help="comma-separated")
    ap.add_argument("rounds", nargs="?", type=int, default=2)
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    t = load_target("smollm2-135m", dtype=a.dtype)
    eng = BatchEngine(t.model, load_head_for("default", t.model), t.eos_token_ids)
    recs = load_prompts("sharegpt", "test", n=200)
    prompts = [p for p in (encode_prompt(t.tokenizer, list(r.messages)) for r in recs) if len(p) <= 256]
    flat_update = BatchSlotKV.update
    writes = {"advanced index (before)": advanced_index_update, "flat index_copy_ (after)": flat_update}
    methods = {"ar": None, "chain 2": StepShape.chain(2), "tree (2, 10, 4)": StepShape(2, 10, 4)}

    def run(shape, ps, B):
        t0 = time.perf_counter()
        if shape is None:
            r = eng.generate_ar(ps, NEW, batch_size=B)
        else:
            r = eng.generate(ps, NEW, batch_size=B, controller=StaticController(shape))
        return r, time.perf_counter() - t0

    print(f"cpu: {cpu_model()}  threads: {torch.get_num_threads()}  dtype: {a.dtype}  new tokens: {NEW}", flush=True)
    try:
        for B in batches:
            ps = prompts[: 2 * B]
            for name, shape in methods.items():
                tok, wall, rows = {w: 0 for w in writes}, {w: 0.0 for w in writes}, {}
                for k in range(a.rounds + 1):                                  # round 0: warm-up, untimed
                    for w in (list(writes) if k % 2 == 0 else list(writes)[::-1]):
                        BatchSlotKV.update = writes[w]
                        r, s = run(shape, ps, B)
                        rows[w] = [x.output_ids for x in r.rows]
                        if k:
                            tok[w] += sum(len(x.output_ids) for x in r.rows)
                            wall[w] += s
                BatchSlotKV.update = flat_update
                b, af = (tok[w] / wall[w] for w in writes)
                print(f"B={B:3d} {name:16s} before {b:7.1f} tok/s  after {af:7.1f} tok/s  after/before {af / b:.3f}  "
                      f"rows equal: {len(set(map(str, rows.values()))) == 1}", flush=True)
    finally:
        BatchSlotKV.update = flat_update


if __name__ == "__main__":
    main()
