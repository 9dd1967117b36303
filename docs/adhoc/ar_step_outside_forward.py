"""Time per AR step outside the target's forward: the one engine (B = 1) against the batch-1 loop it
replaced (tests/reference_engine.py), the cost of everything but the model (mask, accept, commit,
bookkeeping). Log: docs/benchmarks/2026-11-27-one-engine.md, section 6.

    PYTHONPATH=. .venv/bin/python docs/adhoc/ar_step_outside_forward.py [N_TOKENS] [RUNS]

The target's forward (and the one engine's grouped prefill, which calls the base model directly)
is wrapped by a perf_counter timer; per run, (wall - forward time) / forwards. Runs alternate the
engines' order. fp32, MT-bench prompt 0.
"""
import sys
import time

from pipeline.datasets import load_prompts
from pipeline.decode.batch_engine import BatchEngine
from pipeline.decode.engine import Engine
from pipeline.decode.head import load_head_for
from pipeline.decode.target import encode_prompt, load_target
from pipeline.runtime.fingerprint import cpu_model
from tests.reference_engine import ReferenceEngine

N = int(sys.argv[1]) if len(sys.argv) > 1 else 96
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 4
t = load_target("smollm2-135m", dtype="float32")
head = load_head_for("default", t.model)
p = encode_prompt(t.tokenizer, list(load_prompts("mt-bench", "test")[0].messages))
eng, ref = Engine(t.model, head, set()), ReferenceEngine(t.model, head, set())
acc = [0.0, 0]


def timed(fn):
    def w(*a, **k):
        t0 = time.perf_counter()
        out = fn(*a, **k)
        acc[0] += time.perf_counter() - t0
        acc[1] += 1
        return out
    return w


type(t.model).forward = timed(type(t.model).forward)
BatchEngine._fill_grouped = timed(BatchEngine._fill_grouped)
for e in (eng, ref):
    e.generate_ar(p, 8)
res = {"one engine": [], "batch-1 loop": []}
for k in range(RUNS):
    for name, e in (("one engine", eng), ("batch-1 loop", ref))[:: 1 if k % 2 == 0 else -1]:
        acc[:] = [0.0, 0]
        t0 = time.perf_counter()
        e.generate_ar(p, N)
        wall = time.perf_counter() - t0
        res[name].append(((wall - acc[0]) / acc[1] * 1e3, acc[0] / acc[1] * 1e3))
print(f"cpu: {cpu_model()}  dtype: float32  tokens: {N}  runs: {RUNS}")
for name, v in res.items():
    print(f"{name:13s} outside the forward, ms/step: {' / '.join(f'{a:.3f}' for a, _ in v)}   "
          f"forward ms: {' / '.join(f'{b:.2f}' for _, b in v)}")
