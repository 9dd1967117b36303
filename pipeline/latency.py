"""Timing the engine's operations: one draft forward at width W, one verify forward at size V.

Method (Spec-Bench style): warm-up calls, a device sync before each clock read, `repeats` timed
calls, then median / p10 / p90. The collection pipeline's `draftgym profile` builds its latency
table from these same functions, so a benchmark and a profile measure the same thing.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch

from pipeline.draft import additive
from pipeline.head import Eagle3Head
from pipeline.timing import DeviceClock
from pipeline.tree import tree_mask
from pipeline.verify import VerifyTree, crop_cache, target_forward, verify_tree


def time_op(fn: Callable[[], object], device: torch.device, warmup: int = 2, repeats: int = 10) -> dict:
    """Run fn warmup + repeats times; return {'n', 'median', 'p10', 'p90', 'mean'} in seconds."""
    clock = DeviceClock(device)                  # synced reads (pipeline/timing.py)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    times.sort()
    q = lambda f: times[min(len(times) - 1, int(round(f * (len(times) - 1))))]
    return {"n": len(times), "median": statistics.median(times), "p10": q(0.1), "p90": q(0.9),
            "mean": sum(times) / len(times)}


def chain_tree(V: int, device) -> VerifyTree:
    """A V-node tree for timing (its shape does not change the cost of the forward: the mask is dense)."""
    parents = torch.arange(-1, V - 1, device=device)
    depths = torch.arange(V, device=device)
    return VerifyTree(torch.randint(0, 100, (V,), device=device), parents, depths, parents, tree_mask(parents, depths))


@torch.inference_mode()
def verify_op(model, V: int, context_len: int, head: Eagle3Head | None = None) -> Callable[[], None]:
    """A closure running one V-token verify on a cache holding `context_len` tokens.

    With `head`: the engine's whole verify phase (`Engine.verify_commit`: forward, greedy acceptance,
    KV compaction, feature fusion), i.e. what a cycle's t_verify measures; this is what the profile
    uses. Without: the bare target forward (hidden states included)."""
    from transformers import DynamicCache

    from pipeline.engine import Engine

    dev = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    ctx = torch.randint(0, model.config.vocab_size, (1, context_len), device=dev)
    target_forward(model, ctx, torch.arange(context_len, device=dev)[None], cache, hidden_states=False)
    tree = chain_tree(V, dev)
    engine = Engine(model, head) if head is not None else None

    def run():
        with torch.inference_mode():
            if engine is not None:
                engine.verify_commit(tree, context_len, cache)
            else:
                verify_tree(model, tree, context_len, cache)
            crop_cache(cache, context_len)
    return run


@torch.inference_mode()
def draft_op(head: Eagle3Head, W: int, context_len: int, tree_entries: int = 0) -> Callable[[], None]:
    """A closure running one draft forward over W beams, with `context_len` prefix entries and
    `tree_entries` earlier tree entries in the head's KV."""
    dev = head.fc.weight.device
    dt = head.fc.weight.dtype
    cfg = head.cfg
    S = context_len + tree_entries
    k = torch.randn(1, cfg.num_key_value_heads, S, cfg.dim_head, device=dev, dtype=dt)
    past = (k, torch.randn_like(k))
    toks = torch.randint(0, cfg.vocab_size, (1, W), device=dev)
    hidden = torch.randn(1, W, cfg.hidden_size, device=dev, dtype=dt)
    pos = torch.full((1, W), context_len, device=dev)
    mask = additive(torch.ones(1, W, S + W, dtype=torch.bool, device=dev), dt)[:, None]

    def run():
        with torch.inference_mode():
            _, logits, _ = head(toks, hidden, pos, past_kv=past, attn_mask=mask)
            torch.log_softmax(logits.float(), -1).topk(min(W, logits.shape[-1]), dim=-1)
    return run
