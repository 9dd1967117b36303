"""The GPU check's latency step: what one target + head cost on this device, at batch 1 and batch B.

Batch 1 (Spec-Bench method: warm-up calls, a device sync before every clock read, median / p10 / p90;
the same functions `draftgym profile` times with, pipeline/profiling/timed_ops.py):

    ar_step      one AR decode step inside real decoding: (wall - prefill) / (new tokens - 1) of
                 `Engine.generate_ar`, per generation, from a prompt of `context` tokens
    verify       the engine's verify phase over V tree tokens on a cache of `context` tokens
                 (target forward with hidden states, acceptance, KV compaction, feature fusion)
    draft_step   one head forward over W beams with `context` prefix entries, plus its top-k
    cycle        whole EAGLE-3 cycles of a static tree (D, W, V) inside real decoding: medians of
                 t_draft, t_verify, t_controller, t_cycle

    break-even tau = t_cycle / ar_step: the mean accepted length (L + 1) a head must reach for that
    tree to match AR's speed on this device; with a trained head, speedup = tau / break-even tau.

    weight_read_bound  bytes of the target's weights / the GPU's datasheet bandwidth
                 (pipeline/runtime/bandwidth.py): the least an AR step can take at batch 1; every AR
                 step (batch 1 and batch B) is also given as a multiple of it (x_bound)

Batch B (each B a separate call, all rows of one prompt length, no EOS, after a warm-up call):

    ar_batch     AR decode step at batch B from `generate_batch` (collection's continuations, on the
                 batched engine's AR step):
                 (wall(1 + T new tokens) - wall(1)) / T, median of 3 such pairs (None where that
                 difference is below the timer's noise, as for the dry run's tiny model)
    spec_batch   one step of the batched engine (pipeline/decode/engine/core.py) at batch B: median
                 t_step of its AR (every step off) and of each tree shape; break-even tau(B) =
                 t_step(shape) / t_step(AR); its AR step also as a multiple of the weight-read bound.
                 Twice where the device has CUDA graphs: replayed from graphs ("graphs", the
                 engine's default there) and eager ("eager", cuda_graphs=False), same span buckets,
                 so the pair is the graphs' gain; with the graphs' captures, capture time and any
                 capture failure. Measured first (the figure this check is for), the batch-1 tables
                 after it. Skipped, with the reason, where that engine is missing.
    collect      collection's positions/s (`collection_rate`: continuations, teacher forcing, every
                 root expanded and scored, in-process) against the online AR tokens/s at batch 1
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch

from pipeline.errors import first_line
from pipeline.profiling.timed_ops import draft_op, stats_of, time_op, verify_op
from pipeline.runtime.bandwidth import weight_read_bound
from pipeline.runtime.clock import DeviceClock

WARMUP = 2


def _ms(stats: dict) -> dict:
    return {"n": stats["n"], **{k: 1e3 * stats[k] for k in ("median", "p10", "p90", "mean")}}


def _median_ms(xs) -> float | None:
    return 1e3 * statistics.median(xs) if xs else None


def profile_latency(cfg, deadline: float, model, head) -> dict:
    """Every table of the module docstring that fits before `deadline` (perf_counter seconds)."""
    from pipeline.decode.engine.single import Engine
    from pipeline.runtime.fingerprint import device_name, dtype_name

    dev = next(model.parameters()).device
    eng = Engine(model, head)
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompt = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()
    more = lambda: time.perf_counter() < deadline
    ops, cycles, batch1_failure = [], [], None
    spec = guarded(lambda: spec_batch_steps(model, head, cfg, deadline, prompt), more)
    try:
        complete = batch1_tables(cfg, eng, model, head, prompt, more, ops, cycles)
    except Exception as e:                          # the batched table above and the ones below stay
        batch1_failure, complete = f"{type(e).__name__}: {first_line(e)}", False
    # the batch tables last, each on its own: a failure there keeps the batch-1 tables above
    batched_ar = guarded(lambda: ar_batch_steps(model, cfg, deadline, prompt), more)
    ar1 = next((o["median"] for o in ops if o["op"] == "ar_step"), None)
    collect = guarded(lambda: collection_rate(model, head, cfg, prompt, ar1), more)
    complete = complete and batched_ar["status"] == spec["status"] == collect["status"] == "ok"
    bound = weight_read_bound(model)
    for o in ops:                                   # each AR step as a multiple of the weight-read bound
        if o["op"] == "ar_step" and bound["bound_ms"]:
            o["x_bound"] = o["median"] / bound["bound_ms"]
    for r in batched_ar.get("rows", []):
        if r.get("step_ms") and bound["bound_ms"]:
            r["x_bound"] = r["step_ms"] / bound["bound_ms"]
    for r in spec.get("rows", []):
        if (r.get("ar") or {}).get("t_step") and bound["bound_ms"]:
            r["ar"]["x_bound"] = r["ar"]["t_step"] / bound["bound_ms"]
    return {"status": "ok" if complete else "partial",
            "reason": None if complete else "time budget or a failed table: some rows left out",
            "device": device_name(dev, dtype_name(next(model.parameters()).dtype)), "weight_read_bound": bound,
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
            "target": cfg.target, "dtype": cfg.dtype, "head_draft_vocab": head.cfg.draft_vocab_size,
            "ops": ops, "cycles": cycles, "batch1_failure": batch1_failure, "ar_batch": batched_ar, "spec_batch": spec,
            "collect": collect}


def batch1_tables(cfg, eng, model, head, prompt, more, ops: list, cycles: list) -> bool:
    """The batch-1 tables (module docstring) into ops and cycles; False when the time ran out."""
    dev = next(model.parameters()).device
    complete = True
    for c in cfg.contexts:
        if not more():
            complete = False
            break
        p = prompt(c)
        eng.generate_ar(p, 4)                                       # warm-up at this context
        steps = []
        for _ in range(3):
            r = eng.generate_ar(p, cfg.cycle_tokens)
            steps.append((r.wall_s - r.prefill_s) / max(r.new_tokens - 1, 1))
        ar = stats_of(steps)
        ops.append({"op": "ar_step", "context": c, "W": None, "V": 1, **_ms(ar)})
        for V in cfg.verify_sizes:
            if not more():
                complete = False
                break
            s = time_op(verify_op(model, V, c, head=head), dev, warmup=WARMUP, repeats=cfg.repeats)
            ops.append({"op": "verify", "context": c, "W": None, "V": V, **_ms(s)})
        for W in cfg.widths:
            if not more():
                complete = False
                break
            s = time_op(draft_op(head, W, c), dev, warmup=WARMUP, repeats=cfg.repeats)
            ops.append({"op": "draft_step", "context": c, "W": W, "V": None, **_ms(s)})
        for shape in cfg.shapes:
            if not more():
                complete = False
                break
            cycles.append(cycle_row(eng, p, shape, cfg.cycle_tokens, ar["median"]))
    return complete


def guarded(table, more) -> dict:
    """table() -> {"status", ...}; skipped when the time is up, failed (with the reason) when it raises."""
    if not more():
        return {"status": "skipped", "reason": "time budget"}
    try:
        return table()
    except Exception as e:
        return {"status": "failed", "reason": f"{type(e).__name__}: {first_line(e)}"}


def cycle_row(eng, prompt: list[int], shape, tokens: int, ar_step_s: float) -> dict:
    """Medians (ms) of the cycles of one static tree, and its break-even tau against the AR step."""
    from pipeline.decode.controller import StaticController

    ctrl = StaticController(*shape)
    eng.generate(prompt, 4, controller=ctrl)                        # warm-up: this tree's kernels
    cyc = eng.generate(prompt, tokens, controller=ctrl).cycles
    t_cycle = _median_ms([c.t_cycle for c in cyc])
    return {"shape": list(shape), "context": len(prompt), "cycles": len(cyc),
            "t_draft": _median_ms([c.t_draft for c in cyc]), "t_verify": _median_ms([c.t_verify for c in cyc]),
            "t_controller": _median_ms([c.t_controller for c in cyc]), "t_cycle": t_cycle,
            "verify_size": statistics.median(c.verify_size for c in cyc) if cyc else None,
            "break_even_tau": t_cycle / (1e3 * ar_step_s) if cyc and ar_step_s > 0 else None}


def ar_batch_steps(model, cfg, deadline: float, prompt) -> dict:
    """AR decode step time at each batch size, from `generate_batch` (module docstring)."""
    from pipeline.decode.continuations import generate_batch

    clock = DeviceClock(next(model.parameters()).device)
    T, n, rows = cfg.batch_steps, cfg.contexts[0], []
    for B in cfg.batch_sizes:
        if time.perf_counter() > deadline:
            break
        ps = [prompt(n) for _ in range(B)]
        run = lambda k: generate_batch(model, ps, k, batch_size=B, run_past_eos=True)
        run(2)                                                      # warm-up: this B's kernels
        steps = []
        for _ in range(3):
            t0 = clock()
            run(1)
            t1 = clock()
            run(1 + T)
            t2 = clock()
            steps.append(((t2 - t1) - (t1 - t0)) / T)
        step = statistics.median(steps)
        if step <= 0:                                   # below the timer's noise (tiny models only)
            step = None
        rows.append({"B": B, "context": n, "steps_timed": T, "step_ms": step and 1e3 * step,
                     "tokens_per_s": step and B / step})
    return {"status": "ok" if len(rows) == len(cfg.batch_sizes) else "partial", "rows": rows}


def collection_rate(model, head, cfg, prompt, ar_step_ms: float | None) -> dict:
    """`draftgym collect`'s work on this device, in-process (no Parquet): `collect_prompts` over
    cfg.collect_prompts random prompts of context cfg.contexts[0], cfg.collect_tokens new tokens each,
    W = the widest of cfg.widths, Dmax = 12: continuations on the one engine at B = all prompts,
    then teacher forcing and every root expanded and scored. After a warm-up of 2 prompts x 4
    tokens. positions/s against the online AR tokens/s at batch 1 (1 / the AR step above): with a
    random head nothing is accepted, so no online EAGLE-3 figure exists to compare with here."""
    from pipeline.collect.prompt import CollectConfig, collect_prompts, generate_continuations
    from pipeline.decode.engine.single import Engine

    eng, clock = Engine(model, head), DeviceClock(next(model.parameters()).device)
    ccfg = CollectConfig(model=cfg.target, dtype=cfg.dtype, max_new_tokens=cfg.collect_tokens, widths=(max(cfg.widths),))
    ps = [prompt(cfg.contexts[0]) for _ in range(cfg.collect_prompts)]
    collect_prompts(eng, head, ps[:2], replace(ccfg, max_new_tokens=4))                            # warm-up
    t0 = clock()
    conts = generate_continuations(eng, ps, ccfg, ccfg.max_depth, batch_size=len(ps))
    t1 = clock()
    logs = collect_prompts(eng, head, ps, ccfg, continuations=conts, batch_size=len(ps))
    t2 = clock()
    positions = sum(len(cols["position"]) for log in logs for cols in log.positions.values())
    rate = positions / (t2 - t0)
    online = 1e3 / ar_step_ms if ar_step_ms else None
    return {"status": "ok", "prompts": len(ps), "context": cfg.contexts[0], "new_tokens": cfg.collect_tokens,
            "width": ccfg.widths[0], "max_depth": ccfg.max_depth, "positions": positions,
            "continuations_s": t1 - t0, "expand_s": t2 - t1, "positions_per_s": rate,
            "online_ar_tokens_per_s": online, "x_online_ar": rate / online if online else None}


def spec_batch_steps(model, head, cfg, deadline: float, prompt) -> dict:
    """Median step times of the batched engine at each B: its AR (every step off) and each tree
    shape, replayed from CUDA graphs and eager where the device has graphs (module docstring)."""
    try:
        from pipeline.decode.engine.core import BatchEngine
        from pipeline.decode.controller import StaticController
        from pipeline.decode.step_shape import StepShape
    except ImportError as e:
        return {"status": "skipped", "reason": f"no batched engine in this checkout ({e})"}
    graphed = BatchEngine(model, head)
    engines = [("eager", BatchEngine(model, head, cuda_graphs=False, span_bucket=graphed.span_bucket))]
    if graphed.graphs.enabled:
        engines.insert(0, ("graphs", graphed))
    T, n, rows, complete = cfg.batch_steps, cfg.contexts[0], [], True
    # "ar": the engine's own AR at batch B (no head, no features), the like-for-like baseline
    shapes = [("ar", None)] + [(",".join(map(str, s)), StepShape(*s)) for s in cfg.shapes]
    for B in cfg.batch_sizes:
        ps = [prompt(n) for _ in range(B)]
        for mode, eng in engines:
            row = {"B": B, "context": n, "mode": mode}
            for label, shape in shapes:
                if time.perf_counter() > deadline:
                    complete = False
                    break
                if shape is None:
                    run = lambda k: eng.generate_ar(ps, k, batch_size=B)
                else:
                    run = lambda k, c=StaticController(shape): eng.generate(ps, k, batch_size=B, controller=c)
                run(3)                                                  # warm-up: this (B, shape)'s kernels, graphs
                res = run(T + 1)
                full = [s for s in res.steps if s.batch_size == B]
                row[label] = {"t_step": _median_ms([s.t_step for s in full]),
                              "t_draft": _median_ms([s.t_draft for s in full]),
                              "t_verify": _median_ms([s.t_verify for s in full]), "steps": len(full)}
                if shape is None:                                       # AR: the same call with no phase marks
                    eng.timed = False
                    untimed = run(T + 1)
                    eng.timed = True
                    row[label]["timed_over_untimed"] = res.wall_s / untimed.wall_s if untimed.wall_s > 0 else None
            if mode == "graphs" and not eng.graphs.enabled:         # a capture failed: these ran eagerly
                row["mode"] = "graphs failed"
            ar = row.get("ar", {}).get("t_step")
            for label, _ in shapes[1:]:
                if label in row and ar:
                    row[label]["break_even_tau"] = row[label]["t_step"] / ar
            rows.append(row)
            eng.release()                                               # this B's stores and graphs
            if not complete:
                break
        if not complete:
            break
    return {"status": "ok" if complete else "partial", "shapes": [label for label, _ in shapes], "rows": rows,
            "modes": [m for m, _ in engines], "span_bucket": graphed.span_bucket,
            "graphs": graphed.graphs.summary() if graphed.graphs.enabled or graphed.graphs.failure else None}
