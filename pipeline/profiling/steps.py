"""Latency samples at every batch size B, from the one engine's own steps: `draftgym profile` (batch 1
as batch 64) and validate's profile rounds.

The step (docs/design.md "Serving at batch size B") runs, for B active rows and one shape: D head
forwards over B x W rows, one target forward over B x V tokens (each row on its own prefix), and one
controller call. The profile samples exactly that, with the engine that decodes
(pipeline/decode/engine/core.py; batch 1 is B = 1 of it): for each (B, c), B prompts of c tokens
are prefilled once, then one generation plays the grid's shapes round-robin,

    steps = (warmup + repeats) rounds x [off, S(V_2), ..., S(V_n), S'(W_2), ...]
    S(V)  = (depth_for(V, W), W, V)        W = verify_width(V, widths): the first width whose tree holds V
                                           its t_verify -> verify (V, c, B), t_draft / D -> draft_step (W, c, B)
    S'(W) = (2, W, min(1 + W, max V))      its t_draft / 2 -> draft_step (W, c, B)
    off   = no draft, the root alone       its t_verify -> verify (1, c, B): the AR step at B (t_ar)

and every step's t_step - t_draft - t_verify - t_controller -> overhead (c, B). Each row follows its
own path (its own drafts, acceptance, KV slots and emitted tokens), so a step costs what the engine
pays for B rows, per-row work included; the rounds interleave the shapes, so each sees the same
drift of the machine and of the rows' contexts. The rows grow by their emitted tokens over the
generation (about rounds x shapes x tau tokens: ~100-250 at the defaults), so c is the context the
rows start from; one prefill per (B, c) is what keeps a GPU profile at B = 64 and c = 4096 inside
a few minutes. No EOS (the rows must stay B); the call stops after its steps
(`BatchEngine.generate(max_steps=...)`). Rows (op, stats, W, V, c, B):

    draft_step  per (W, c, B)    one head forward over B rows x W beams (pending entries included)
    verify      per (V, c, B)    one B x V target forward + acceptance, compaction, fusion
    overhead    per (c, B)       the step's bookkeeping outside the three timed phases
    policy      per B            the stand-in policy MLP over B observations (a controller that scores
                                 every row; one that reads an aggregate costs the batch-1 row)

Why the engine's own steps and not stand-ins (one timed head forward and one timed target forward
over B copies of one path): they miss the engine's per-row work (each row's own path compacted,
its features stored), which grows with B and V, so they underrate speculative steps at B > 1. Why
not a tight loop even at batch 1: on a CPU the same forward timed in a loop (hot caches, no draft
work in between; `profile --isolated` keeps it as ops verify_isolated / draft_isolated) runs 13-15 %
faster than inside real decoding, and a simulator fed by it overrates every method by that much.
"""
from __future__ import annotations

from typing import Callable

from pipeline.decode.controller import ScriptedController
from pipeline.decode.step_shape import StepShape
from pipeline.profiling.timed_ops import depth_for, stats_of, verify_width
from pipeline.profiling.trust import cell_key, suspect_cells

TOKENS_PER_STEP = 8          # max_new_tokens per step and row: above any tau seen, so no row ends early


def grid_shapes(widths, verify_sizes) -> list[tuple[StepShape, bool]]:
    """(shape, its verify is kept) of one round: the in-situ grid's trees (module docstring)."""
    V_max = max(verify_sizes)
    tree = lambda V, W: StepShape(depth_for(V, W), W, V)
    shapes = [(StepShape.off() if V == 1 else tree(V, verify_width(V, widths)), True) for V in verify_sizes]
    return shapes + [(StepShape(2, W, min(1 + W, V_max)), False) for W in widths[1:]]


def step_rows(records, shapes, batch: int, context: int, warmup: int) -> dict[tuple, list[float]]:
    """A generation's step records -> samples per row key (op, W, V, c, B) -> [seconds]. Step k played
    shapes[k % len(shapes)]; the first `warmup` rounds, steps with fewer than B rows and steps that
    captured a CUDA graph (an eager run and a capture: the rows crossed into a new span bucket; on
    an H200 one such draft step read 190 ms where its cell's median is 0.5 ms) are dropped."""
    samples: dict[tuple, list[float]] = {}
    add = lambda key, t: samples.setdefault(key, []).append(t)
    for k, r in enumerate(records):
        if k < warmup * len(shapes) or r.batch_size != batch or r.captures:
            continue
        shape, keep_verify = shapes[k % len(shapes)]
        if keep_verify:
            add(("verify", 0, shape.verify_size, context, batch), r.t_verify)
        if not shape.is_off:
            add(("draft_step", r.width, 0, context, batch), r.t_draft / r.depth)
        add(("overhead", 0, 0, context, batch), max(0.0, r.t_overhead))
    return samples


def step_samples(eng, batch: int, shapes, context: int, prompt: Callable[[int, int], list[int]],
                 repeats: int, warmup: int = 1) -> dict[tuple, list[float]]:
    """One (B, c) generation of a BatchEngine `eng` (no EOS) playing `shapes` (grid_shapes) round-robin:
    samples per row key (op, W, V, c, B) (step_rows). prompt(c, r) -> row r's prompt of c tokens."""
    n_steps = (warmup + repeats) * len(shapes)
    res = eng.generate([prompt(context, r) for r in range(batch)], n_steps * TOKENS_PER_STEP, batch_size=batch,
                       controller=ScriptedController([s for s, _ in shapes]), max_steps=n_steps)
    return step_rows(res.steps, shapes, batch, context, warmup)


def rows_of(samples: dict[tuple, list[float]]) -> list[tuple]:
    """Pooled samples per key (op, W, V, c, B) -> latency rows (op, stats, W, V, c, B)."""
    return [(op, stats_of(ts), W, V, c, B) for (op, W, V, c, B), ts in samples.items()]


def suspect_keys(samples: dict[tuple, list[float]]) -> list[tuple]:
    """The keys (op, W, V, c, B) of cells pipeline/profiling/trust.py finds suspect among `samples`."""
    rows = {(op, W, V, c, B): {"op": op, "width": W, "verify_size": V, "context_len": c, "batch": B, **stats_of(ts)}
            for (op, W, V, c, B), ts in samples.items()}
    sus = {(x.op, x.size, x.context, x.batch) for x in suspect_cells(list(rows.values()))}
    return [k for k, r in rows.items() if cell_key(r) in sus]
