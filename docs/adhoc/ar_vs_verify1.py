"""Does the simulator's AR step (the in-situ 1-token verify + per-cycle overhead, LatencyModel.t_ar)
cost what a real AR decode step costs? Side by side, interleaved, same prompts of exactly c tokens:
AR decode time per token ((wall - prefill) / (new - 1)) against the median t_verify of static
(1, 10, 1) EAGLE-3 cycles (verify of the root only: target forward, acceptance, KV compaction,
feature fusion) and those cycles' overhead (t_cycle - t_draft - t_verify - t_controller).
Run: .venv/bin/python docs/adhoc/ar_vs_verify1.py [REPEATS]"""
import sys
import time

import numpy as np
import torch

from pipeline.decode.controller import StaticController
from pipeline.decode.engine import Engine
from pipeline.decode.head import load_head_for
from pipeline.profiling.profile import context_prompt
from pipeline.decode.target import load_target

torch.set_num_threads(2)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
t = load_target("smollm2-135m")
eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
N = 32
ar, v1 = {}, {}
eng.generate_ar(context_prompt(t.tokenizer, 32), 8)
eng.generate(context_prompt(t.tokenizer, 32), 8, controller=StaticController(1, 10, 1))
for rep in range(reps):
    for c in (32, 128, 512):
        ids = context_prompt(t.tokenizer, c, rep)
        r = eng.generate_ar(ids, N)
        ar.setdefault(c, []).append((r.wall_s - r.prefill_s) / (len(r.output_ids) - 1))
        g = eng.generate(ids, N, controller=StaticController(1, 10, 1))
        v1.setdefault(c, []).append((np.median([x.t_verify for x in g.cycles]),
                                     np.median([x.t_cycle - x.t_draft - x.t_verify - x.t_controller for x in g.cycles])))
print(f"{'context':>8} {'AR step ms':>22} {'verify(1) ms':>22} {'overhead ms':>12} {'(verify+overhead)/AR':>21}")
for c in ar:
    a, v = 1e3 * np.array(ar[c]), 1e3 * np.array(v1[c])
    ratio = (v[:, 0] + v[:, 1]) / a
    print(f"{c:>8} {np.median(a):>10.2f} ({a.min():.1f}-{a.max():.1f}) {np.median(v[:, 0]):>10.2f} "
          f"({v[:, 0].min():.1f}-{v[:, 0].max():.1f}) {np.median(v[:, 1]):>12.2f} {np.median(ratio):>10.3f} "
          f"({ratio.min():.2f}-{ratio.max():.2f})")
