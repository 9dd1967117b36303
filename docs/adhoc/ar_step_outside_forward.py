"""Time per AR step outside the target's forward: the one engine (B = 1) against the batch-1 loop it
replaced (tests/pipeline/decode/reference_engine.py), the cost of everything but the model (mask, accept, commit,
bookkeeping). Log: docs/benchmarks/2026-11-27-one-engine.md, section 6.

    PYTHONPATH=. .venv/bin/python docs/adhoc/ar_step_outside_forward.py [N_TOKENS] [RUNS]

The target's forward (and the one engine's grouped prefill, which calls the base model directly)
is wrapped by a perf_counter timer; per run, (wall - forward time) / forwards. Runs alternate the
engines' order. fp32, MT-bench prompt 0.
"""
import argparse
import time

from pipeline.datasets import load_prompts
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.single import Engine
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target
from pipeline.runtime.fingerprint import cpu_model
from tests.pipeline.decode.reference_engine import ReferenceEngine


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n_tokens", nargs="?", type=int, default=96)
    ap.add_argument("runs", nargs="?", type=int, default=4)
    a = ap.parse_args(argv)
    t = load_target("smollm2-135m", dtype="float32")
    head = load_head_for("default", t.model)
    p = encode_prompt(t.tokenizer, list(load_prompts("mt-bench", "test")[0].messages))
    eng, ref = Engine(t.model, head, set()), ReferenceEngine(t.model, head, set())
    acc = [0.0, 0]

    def timed(fn):
        def w(*args, **kw):
            t0 = time.perf_counter()
            out = fn(*args, **kw)
            acc[0] += time.perf_counter() - t0
            acc[1] += 1
            return out
        return w

    type(t.model).forward = timed(type(t.model).forward)
    BatchEngine._fill_grouped = timed(BatchEngine._fill_grouped)
    for e in (eng, ref):
        e.generate_ar(p, 8)
    res = {"one engine": [], "batch-1 loop": []}
    for k in range(a.runs):
        for name, e in (("one engine", eng), ("batch-1 loop", ref))[:: 1 if k % 2 == 0 else -1]:
            acc[:] = [0.0, 0]
            t0 = time.perf_counter()
            e.generate_ar(p, a.n_tokens)
            wall = time.perf_counter() - t0
            res[name].append(((wall - acc[0]) / acc[1] * 1e3, acc[0] / acc[1] * 1e3))
    print(f"cpu: {cpu_model()}  dtype: float32  tokens: {a.n_tokens}  runs: {a.runs}")
    for name, v in res.items():
        print(f"{name:13s} outside the forward, ms/step: {' / '.join(f'{x:.3f}' for x, _ in v)}   "
              f"forward ms: {' / '.join(f'{y:.2f}' for _, y in v)}")


if __name__ == "__main__":
    main()
