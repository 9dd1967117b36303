"""The GPU check's kernels step: where the device time of a slow case goes, op by op (torch.profiler).

On a GPU (an H200, 8B-shaped target, bf16) some costs appear that the CPU never shows and the op
counts do not explain (the same number of ops per step at context 128 and 1024):

    Engine, context 1024      t_draft of (5, 1, 6) 212 ms against 7 ms for (2, 1, 3), and 1.5 ms for
                              one draft forward timed alone at that context
    BatchEngine, B = 2        its AR step 86 ms against 40 ms for `generate_batch`'s at B = 2

Each case below runs once as a warm-up, then once under torch.profiler (CPU, and CUDA when the model
is on a GPU). The report keeps the case's wall time and its top ops by self device time and by self
CPU time, so one run names the kernel or the host wait behind a slow case. Pairs: each slow case
beside its fast twin, so the difference is read off two tables of the same run.

    engine-deep      Engine.generate, static (5, 1, 6), prompt of the largest context, 8 new tokens
    engine-shallow   the same with (2, 1, 3)
    batch-ar         BatchEngine.generate_ar, B = 2, prompts of the smallest context, 8 new tokens
    generate-batch   generate_batch, the same prompts and tokens (the same engine's AR with
                     run_past_eos, so the pair shows what collection's wrapper adds)
"""
from __future__ import annotations

import time

import torch

TOP = 10           # ops per table
NEW_TOKENS = 8


def _cases(model, head, cfg, prompt):
    from pipeline.decode.engine.core import BatchEngine
    from pipeline.decode.continuations import generate_batch
    from pipeline.decode.controller import StaticController
    from pipeline.decode.engine.single import Engine

    eng, beng = Engine(model, head), BatchEngine(model, head)
    long_p, short = prompt(max(cfg.contexts)), [prompt(min(cfg.contexts)) for _ in range(2)]
    return [
        ("engine-deep", lambda: eng.generate(long_p, NEW_TOKENS, controller=StaticController(5, 1, 6))),
        ("engine-shallow", lambda: eng.generate(long_p, NEW_TOKENS, controller=StaticController(2, 1, 3))),
        ("batch-ar", lambda: beng.generate_ar(short, NEW_TOKENS, batch_size=2)),
        ("generate-batch", lambda: generate_batch(model, short, NEW_TOKENS, batch_size=2, run_past_eos=True)),
    ]


def _self_device_us(e) -> float:
    return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)


def op_table(averages, key, top: int = TOP) -> list[dict]:
    """The `top` ops of profiler key averages by `key` (a function of one average, µs)."""
    rows = sorted(averages, key=key, reverse=True)[:top]
    return [{"op": e.key, "calls": int(e.count), "self_device_ms": _self_device_us(e) / 1e3,
             "self_cpu_ms": float(e.self_cpu_time_total) / 1e3} for e in rows]


def trace_case(fn, device: torch.device) -> dict:
    """Warm-up, then one profiled call: wall time and the top ops by self device and self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    from pipeline.runtime.clock import DeviceClock

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    clock = DeviceClock(device)
    fn()
    with profile(activities=acts) as prof:
        t0 = clock()
        fn()
        wall = clock() - t0
    avg = prof.key_averages()
    return {"wall_ms": 1e3 * wall, "ops": len(avg),
            "by_device": op_table(avg, _self_device_us) if device.type == "cuda" else [],
            "by_cpu": op_table(avg, lambda e: float(e.self_cpu_time_total))}


def kernel_traces(cfg, deadline: float, model, head) -> dict:
    """Every case of the module docstring that fits before `deadline` (perf_counter seconds)."""
    from tools.gpu_check.latency import guarded

    dev = next(model.parameters()).device
    g = torch.Generator().manual_seed(2)
    prompt = lambda n: torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist()
    traces, complete = [], True
    for name, fn in _cases(model, head, cfg, prompt):
        if time.perf_counter() > deadline:
            complete = False
            break
        res = guarded(lambda: {"status": "ok", **trace_case(fn, dev)}, lambda: True)
        traces.append({"case": name, **res})
    ok = complete and all(t["status"] == "ok" for t in traces)
    return {"status": "ok" if ok else "partial", "reason": None if ok else "time budget or a failed case",
            "new_tokens": NEW_TOKENS, "traces": traces}
