"""Latency samples at batch size B > 1 for `draftgym profile --batch-sizes`: the serving step's ops.

The serving step (docs/design.md "Serving at batch size B") runs, for B active rows and one shape:
D head forwards over B x W rows, one target forward over B x V tokens (each row on its own prefix),
and one controller call. At B = 1 the profile samples real engine cycles (in situ); no engine decodes
B rows here, so each (V, context_len) cell runs stand-in steps built from `timed_ops` instead:

    step = depth_for(V, W0) draft forwards  draft_op(head, W0, c, batch=B)      -> t_draft / D samples
         + one verify                      verify_op(model, V, c, head, batch=B) -> t_verify samples

alternating as in decoding (draft work between two verifies keeps the caches as cold as in situ;
a tight loop of one op ran 13-15 % faster on a CPU, pipeline.profiling.profile). Further widths W
run steps of 2 draft forwards + a verify of 1 + W tokens (only their draft samples are kept), as the
in-situ grid does. Rows (op, stats, W, V, c, B):

    draft_step  per (W, c, B)    one head forward over B rows x W beams, each row its own draft KV
    verify      per (V, c, B)    one B x V target forward + acceptance, compaction, fusion; V = 1 is
                                 the AR step at B (the latency model's t_ar), as at batch 1
    policy      per B            the stand-in policy MLP over B observations (a controller that scores
                                 every row; one that reads an aggregate costs the batch-1 row)

No overhead rows at B > 1: the per-step engine cost outside the timed ops can only be read off a
batched engine's steps; the latency model holds the batch-1 overhead flat in B and says so.
"""
from __future__ import annotations

from typing import Callable

from tqdm import tqdm

from pipeline.profiling.timed_ops import depth_for, draft_op, policy_op, stats_of, time_op, verify_op
from pipeline.runtime.clock import DeviceClock


def step_samples(draft_fn: Callable[[], None], verify_fn: Callable[[], None], depth: int, steps: int,
                 clock: DeviceClock, warmup: int = 1) -> tuple[list[float], list[float]]:
    """`warmup` + `steps` stand-in steps (depth draft forwards, then the verify); returns the timed
    steps' (t_draft / depth samples, t_verify samples) in seconds."""
    t_draft, t_verify = [], []
    for i in range(warmup + steps):
        t0 = clock()
        for _ in range(depth):
            draft_fn()
        t1 = clock()
        verify_fn()
        t2 = clock()
        if i >= warmup:
            t_draft.append((t1 - t0) / depth)
            t_verify.append(t2 - t1)
    return t_draft, t_verify


def batched_jobs(widths, verify_sizes, contexts) -> list[tuple[int, int, int, bool]]:
    """(W, V, c, keep_verify) stand-in cells of one batch size, the in-situ grid's: every V with the
    first width, then one 1 + W verify per further width (draft samples only)."""
    W0 = widths[0]
    return [(W0, V, c, True) for c in contexts for V in verify_sizes] + \
           [(W, min(1 + W, max(verify_sizes)), c, False) for W in widths[1:] for c in contexts]


def batched_rows(engine, batch: int, widths, verify_sizes, contexts, repeats: int = 5, warmup: int = 1,
                 progress: bool = True) -> list[tuple]:
    """Latency rows (op, stats, W, V, c, B) of one batch size B > 1 for a loaded engine (module docstring)."""
    model, head, dev = engine.model, engine.head, engine.device
    clock = DeviceClock(dev)
    verify, drafts = {}, {}
    for W, V, c, keep_verify in tqdm(batched_jobs(tuple(widths), tuple(verify_sizes), contexts),
                                     desc=f"profile (batch {batch})", unit="cell", disable=not progress):
        D = depth_for(V, W) if keep_verify else 2
        t_draft, t_verify = step_samples(draft_op(head, W, c, batch=batch), verify_op(model, V, c, head=head, batch=batch),
                                         D, repeats, clock, warmup)
        drafts.setdefault((W, c), []).extend(t_draft)
        if keep_verify:
            verify.setdefault((V, c), []).extend(t_verify)
    rows = [("verify", stats_of(ts), 0, V, c, batch) for (V, c), ts in verify.items()]
    rows += [("draft_step", stats_of(ts), W, 0, c, batch) for (W, c), ts in drafts.items()]
    rows.append(("policy", time_op(policy_op(device=dev, batch=batch), dev, warmup=5, repeats=50), 0, 0, 0, batch))
    return rows
