"""The GPU check's slow cases, on the CPU: a tiny random Llama (online.gpu_check's dry-run shape), one
thread. Prints (1) t_draft / t_verify medians of static (8, 10, 60), (5, 1, 6), (2, 1, 3) at contexts 128
and 1024 (Engine), and (2) torch.profiler's count of top-level aten ops per 8 tokens for the same shapes
at both contexts, for BatchEngine at B = 1 and 4, and per AR step for BatchEngine.generate_ar and
generate_batch (BENCHMARKS log S1: the CPU shows neither the GPU's per-level draft cost nor a difference
in op counts).

    OMP_NUM_THREADS=1 DRAFTGYM_CPU_LINEAR=torch .venv/bin/python docs/adhoc/draft_cost_by_context_cpu.py
"""
import collections
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from online.gpu_check import CheckConfig, build_head, build_target, dry_run_sizes
from pipeline.decode.batch_engine import BatchEngine
from pipeline.decode.batch_generate import generate_batch
from pipeline.decode.controller import StaticController, StepShape
from pipeline.decode.engine import Engine

torch.set_num_threads(1)
cfg = dry_run_sizes(CheckConfig(out="unused"))
model = build_target(cfg)
head = build_head(cfg, model)
g = torch.Generator().manual_seed(1)
P = lambda n: torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist()
SHAPES = [(8, 10, 60), (5, 1, 6), (2, 1, 3)]


def top_level_ops(fn) -> int:
    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


eng = Engine(model, head)
for ctx in (128, 1024):
    p = P(ctx)
    for shape in SHAPES:
        c = StaticController(*shape)
        eng.generate(p, 4, controller=c)
        cyc = eng.generate(p, 24, controller=c).cycles
        ops = top_level_ops(lambda: eng.generate(p, 10, controller=c)) - top_level_ops(lambda: eng.generate(p, 2, controller=c))
        print(f"Engine {shape} context {ctx}: t_draft {1e3 * statistics.median(x.t_draft for x in cyc):.2f} ms, "
              f"t_verify {1e3 * statistics.median(x.t_verify for x in cyc):.2f} ms, {ops} aten ops per 8 tokens", flush=True)
be = BatchEngine(model, head)
for B in (1, 4):
    ps = [P(128) for _ in range(B)]
    ar = (top_level_ops(lambda: be.generate_ar(ps, 9, batch_size=B)) - top_level_ops(lambda: be.generate_ar(ps, 1, batch_size=B))) / 8
    gb = (top_level_ops(lambda: generate_batch(model, ps, 9, batch_size=B, run_past_eos=True))
          - top_level_ops(lambda: generate_batch(model, ps, 1, batch_size=B, run_past_eos=True))) / 8
    print(f"B = {B}: aten ops per AR step, BatchEngine {ar:.0f}, generate_batch {gb:.0f}", flush=True)
    for shape in SHAPES:
        c = StaticController(StepShape(*shape))
        ops = top_level_ops(lambda: be.generate(ps, 10, batch_size=B, controller=c)) - \
            top_level_ops(lambda: be.generate(ps, 2, batch_size=B, controller=c))
        print(f"BatchEngine {shape} B = {B}: {ops} aten ops per 8 tokens", flush=True)
