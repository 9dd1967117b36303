"""The GPU check's lossless step: EAGLE-3 output against AR output on the random-weight target,
each divergence classified exact / near-tie / mismatch (pipeline/decode/lossless.py). Random drafts
are never accepted (tau = 1): the check is that the engine still emits exactly what AR emits, up
to rounding near-ties in reduced precision.

    batch 1   the batch-1 `Engine`, AR once per prompt, then EAGLE-3 at every shape
    batched   the batched engine as it runs on the device (CUDA graphs there) at each B of
              `lossless_batch_sizes`, largest first: max(8, B) prompts of mixed lengths at batch size B, each
              row against the same engine's AR at B = 1 (graphed too); the prompts' lengths and
              the tokens cross span buckets, so several graphs per shape are replayed
"""
from __future__ import annotations

import time

import torch

from pipeline.decode.lossless import classify, summarize_verdicts


def _row(summ: dict, **head) -> dict:
    return {**head, **summ["counts"],
            "max_gap_ulps": max((d["gap_ulps"] or 0.0 for d in summ["divergences"]), default=None),
            "divergences": summ["divergences"]}


def check_lossless(cfg, deadline: float, model, head) -> dict:
    """AR once per prompt, then EAGLE-3 at every shape; each output classified against AR's."""
    from pipeline.decode.controller import StaticController
    from pipeline.decode.engine.single import Engine

    eng = Engine(model, head)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    verdicts = {s: [] for s in cfg.shapes}
    taus = {s: [] for s in cfg.shapes}
    done = True
    for i in range(cfg.prompts):
        if time.perf_counter() > deadline:
            done = False
            break
        n = cfg.prompt_lens[i % len(cfg.prompt_lens)]
        p = torch.randint(0, vocab, (n,), generator=g).tolist()
        ar = eng.generate_ar(p, cfg.new_tokens).output_ids
        for s in cfg.shapes:
            sp = eng.generate(p, cfg.new_tokens, controller=StaticController(*s))
            verdicts[s].append(classify(model, p, ar, sp.output_ids))
            taus[s].append(sp.tau)
    rows = []
    for s in cfg.shapes:
        rows.append(_row(summarize_verdicts(verdicts[s]), shape=list(s), prompts=len(verdicts[s]),
                         tau=sum(taus[s]) / len(taus[s]) if taus[s] else None))
    batched = check_lossless_batched(cfg, deadline, model, head) if done else {"status": "skipped",
                                                                               "reason": "time budget"}
    bad = sum(r["mismatch"] for r in rows) + sum(r["mismatch"] for r in batched.get("rows", []))
    done = done and batched["status"] == "ok"
    status = "failed" if bad else ("ok" if done else "partial")
    return {"status": status, "reason": (f"{bad} mismatch(es)" if bad else None if done else "time budget: fewer prompts"),
            "target": cfg.target, "dtype": cfg.dtype, "new_tokens": cfg.new_tokens,
            "prompt_lens": [cfg.prompt_lens[i % len(cfg.prompt_lens)] for i in range(max(len(v) for v in verdicts.values()))],
            "head_draft_vocab": head.cfg.draft_vocab_size, "shapes": rows, "batched": batched}


def check_lossless_batched(cfg, deadline: float, model, head) -> dict:
    """The batched engine at each B (module docstring): one row per (B, shape)."""
    from pipeline.decode.engine.core import BatchEngine
    from pipeline.decode.controller import StaticController
    from pipeline.decode.step_shape import StepShape

    eng = BatchEngine(model, head)
    g = torch.Generator().manual_seed(1)
    vocab, T = model.config.vocab_size, cfg.lossless_batch_tokens
    n = max(max(8, B) for B in cfg.lossless_batch_sizes)
    ps = [torch.randint(0, vocab, (cfg.prompt_lens[i % len(cfg.prompt_lens)],), generator=g).tolist() for i in range(n)]
    ar = [r.output_ids for r in eng.generate_ar(ps, T, batch_size=1).rows]
    rows, done = [], True
    for B in sorted(cfg.lossless_batch_sizes, reverse=True):      # the largest first: B = 1 is also the batch-1 table
        k = max(8, B)
        for s in cfg.lossless_batch_shapes:
            if time.perf_counter() > deadline:
                done = False
                break
            res = eng.generate(ps[:k], T, batch_size=B, controller=StaticController(StepShape(*s)))
            verdicts = [classify(model, p, a, r.output_ids) for p, a, r in zip(ps[:k], ar, res.rows)]
            rows.append(_row(summarize_verdicts(verdicts), B=B, shape=list(s), prompts=k))
        eng.release()
    return {"status": "ok" if done else "partial", "new_tokens": T, "graphs": eng.graphs.summary(),
            "span_bucket": eng.span_bucket, "rows": rows}
