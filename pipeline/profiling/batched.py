"""Latency samples at batch size B > 1 for `draftgym profile --batch-sizes`: the batched engine's own steps.

The serving step (docs/design.md "Serving at batch size B") runs, for B active rows and one shape:
D head forwards over B x W rows, one target forward over B x V tokens (each row on its own prefix),
and one controller call. At B = 1 the profile samples real engine cycles (in situ). At B > 1 it
does the same with the batched engine (pipeline/decode/batch_engine.py): B prompts of c tokens are
prefilled once per (B, c), then one generation plays the grid's shapes round-robin,

    steps = (warmup + repeats) rounds x [off, S(V_2), ..., S(V_n), S'(W_2), ...]
    S(V)  = (depth_for(V, W), W, V)        W = verify_width(V, widths): the first width whose tree holds V
                                           its t_verify -> verify (V, c, B), t_draft / D -> draft_step (W, c, B)
    S'(W) = (2, W, min(1 + W, max V))      its t_draft / 2 -> draft_step (W, c, B) (as the in-situ grid)
    off   = no draft, the root alone       its t_verify -> verify (1, c, B): the AR step at B (t_ar)

and every step's t_step - t_draft - t_verify - t_controller -> overhead (c, B). Each row follows its
own path (its own drafts, acceptance, KV slots and emitted tokens), so a step costs what the engine
pays for B rows, per-row work included; the rounds interleave the shapes, so each sees the same
drift of the machine and of the rows' contexts (each row grows by its emitted tokens over the
generation: about rounds x shapes x tau tokens, so c is the context the rows start from). No EOS
(the rows must stay B); the call stops after its steps (`BatchEngine.generate(max_steps=...)`).
Rows (op, stats, W, V, c, B):

    draft_step  per (W, c, B)    one head forward over B rows x W beams (pending entries included)
    verify      per (V, c, B)    one B x V target forward + acceptance, compaction, fusion
    overhead    per (c, B)       the step's bookkeeping outside the three timed phases
    policy      per B            the stand-in policy MLP over B observations (a controller that scores
                                 every row; one that reads an aggregate costs the batch-1 row)

Why not stand-ins (one timed head forward and one timed target forward over B copies of one path):
they missed the engine's per-row work, and the closed-batch check (BENCHMARKS log R4) found the
batched engine's speculative steps 15-60 % dearer than they predicted.
"""
from __future__ import annotations

from typing import Callable

from tqdm import tqdm

from pipeline.decode.controller import ScriptedController, StepShape
from pipeline.profiling.timed_ops import depth_for, policy_op, stats_of, time_op, verify_width
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
    shapes[k % len(shapes)]; the first `warmup` rounds and steps with fewer than B rows are dropped."""
    samples: dict[tuple, list[float]] = {}
    add = lambda key, t: samples.setdefault(key, []).append(t)
    for k, r in enumerate(records):
        if k < warmup * len(shapes) or r.batch_size != batch:
            continue
        shape, keep_verify = shapes[k % len(shapes)]
        if keep_verify:
            add(("verify", 0, shape.verify_size, context, batch), r.t_verify)
        if not shape.is_off:
            add(("draft_step", r.width, 0, context, batch), r.t_draft / r.depth)
        add(("overhead", 0, 0, context, batch), max(0.0, r.t_overhead))
    return samples


def batched_samples(eng, batch: int, shapes, context: int, prompt: Callable[[int, int], list[int]],
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


def batched_rows(engine, batch: int, widths, verify_sizes, contexts, prompt: Callable[[int, int], list[int]],
                 repeats: int = 5, warmup: int = 1, progress: bool = True) -> tuple[list[tuple], int]:
    """Latency rows (op, stats, W, V, c, B) of one batch size B > 1 for a loaded engine (module
    docstring), and the number of cells re-measured: a (B, c) whose cells trust.py finds suspect
    (a wild spread, or out of order in V) is generated once more and those cells take the new
    samples. prompt(c, r) -> row r's prompt of exactly c tokens (rows differ, so their paths do)."""
    from pipeline.decode.batch_engine import BatchEngine

    eng = BatchEngine(engine.model, engine.head, eos_token_ids=set())
    shapes = grid_shapes(tuple(widths), tuple(verify_sizes))
    samples: dict[tuple, list[float]] = {}
    remeasured = 0
    for c in tqdm(contexts, desc=f"profile (batch {batch})", unit="context", disable=not progress):
        got = batched_samples(eng, batch, shapes, c, prompt, repeats, warmup)
        bad = suspect_keys(got)
        if bad:
            again = batched_samples(eng, batch, shapes, c, prompt, repeats, warmup)
            got.update({k: again[k] for k in bad if k in again})
            remeasured += len(bad)
        for key, ts in got.items():
            samples.setdefault(key, []).extend(ts)
    rows = rows_of(samples)
    rows.append(("policy", time_op(policy_op(device=engine.device, batch=batch), engine.device, warmup=5, repeats=50),
                 0, 0, 0, batch))
    return rows, remeasured
