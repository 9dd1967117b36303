"""Timing the engine's operations: one draft forward at width W, one verify forward at size V.

Method (Spec-Bench style): warm-up calls, a device sync before each clock read, `repeats` timed
calls, then median / p10 / p90. The collection pipeline's `draftgym profile` builds its latency
table from these same functions, so a benchmark and a profile measure the same thing.

Batch B (the serving step, docs/design.md "Serving at batch size B"): `draft_op(..., batch=B)` is one
head forward over B rows of W beams, each row with its own draft KV of the context ([B, W] queries on
[B, n_kv, S, d] keys); `verify_op(..., batch=B)` one target forward over B rows of V tree tokens, each
row on its own prefix (a batch-B cache, a [B, 1, V, c + V] additive mask), then the per-row greedy
acceptance, KV compaction and feature fusion a batched engine does. V = 1 is the AR step at B.
Micro-benchmarks only (e.g. docs/adhoc/target_gqa_verify.py): every row keeps row 0's path, so they
leave out the engine's per-row work; `draftgym profile --batch-sizes` times the batched engine's own
steps instead (pipeline/profiling/steps.py).
"""
from __future__ import annotations

import statistics
from typing import Callable

import numpy as np
import torch

from pipeline.decode.draft import additive
from pipeline.decode.step_shape import pool_size
from pipeline.decode.tree import tree_mask
from pipeline.errors import DraftGymError
from pipeline.models.head import Eagle3Head
from pipeline.runtime.clock import DeviceClock
from pipeline.decode.verify import (VerifyTree, accept_greedy, compact_cache, crop_cache, target_forward,
                                    tree_attention_mask, verify_tree)


def time_op(fn: Callable[[], object], device: torch.device, warmup: int = 2, repeats: int = 10) -> dict:
    """Run fn warmup + repeats times; return {'n', 'median', 'p10', 'p90', 'mean'} in seconds."""
    clock = DeviceClock(device)                  # synced reads (pipeline/runtime/clock.py)
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


def stats_of(samples) -> dict:
    """LATENCY statistics of timing samples (seconds): n, median, p10, p90, mean."""
    s = np.asarray(samples, np.float64)
    return {"n": int(s.size), "median": float(np.median(s)), "p10": float(np.quantile(s, 0.1)),
            "p90": float(np.quantile(s, 0.9)), "mean": float(s.mean())}


def depth_for(V: int, W: int, max_depth: int = 12) -> int:
    """Smallest D whose pool (W + (D-1) W^2 candidates) fills a V-node tree (root + V - 1)."""
    D = 1
    while D < max_depth and pool_size(D, W) < V - 1:
        D += 1
    return D


def verify_width(V: int, widths, max_depth: int = 12) -> int:
    """The first of `widths` whose tree of depth depth_for(V, W) holds V nodes (root + V - 1 drafted):
    the width a V-token verify is timed at. A chain (W = 1) holds at most max_depth + 1 tokens, and
    the engine cuts V to what the pool holds, so timing V = 40 at W = 1 would time a 13-token verify."""
    for W in widths:
        if pool_size(depth_for(V, W, max_depth), W) >= V - 1:
            return W
    raise DraftGymError(f"a {V}-token verify needs a wider tree than widths {', '.join(map(str, widths))} "
                        f"allow within depth {max_depth}: add a width (e.g. 10)")


def chain_tree(V: int, device) -> VerifyTree:
    """A V-node tree for timing (its shape does not change the cost of the forward: the mask is dense)."""
    parents = torch.arange(-1, V - 1, device=device)
    depths = torch.arange(V, device=device)
    return VerifyTree(torch.randint(0, 100, (V,), device=device), parents, depths, parents, tree_mask(parents, depths))


def repeat_rows(cache, batch: int) -> None:
    """A batch-1 cache -> `batch` rows holding the same entries (each row its own copy, as a batched
    engine's slots are): keys / values [1, n_kv, S, d] -> [B, n_kv, S, d], in place per layer."""
    for layer in cache.layers:
        layer.keys = layer.keys.repeat(batch, 1, 1, 1)
        layer.values = layer.values.repeat(batch, 1, 1, 1)


@torch.inference_mode()
def verify_op(model, V: int, context_len: int, head: Eagle3Head | None = None, batch: int = 1) -> Callable[[], None]:
    """A closure running one V-token verify on a cache holding `context_len` tokens (per row).

    With `head`: the whole verify phase (forward, greedy acceptance, KV compaction, feature fusion:
    `batch_verify_op`, at any batch), i.e. what a cycle's t_verify measures. Without, at batch 1: the
    bare target forward (hidden states included)."""
    from transformers import DynamicCache

    dev = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    ctx = torch.randint(0, model.config.vocab_size, (1, context_len), device=dev)
    target_forward(model, ctx, torch.arange(context_len, device=dev)[None], cache, hidden_states=False, last_only=True)
    tree = chain_tree(V, dev)
    if batch > 1 or head is not None:
        repeat_rows(cache, batch)
        return batch_verify_op(model, tree, context_len, cache, batch, head)

    def run():
        with torch.inference_mode():
            verify_tree(model, tree, context_len, cache)
            crop_cache(cache, context_len)
    return run


def batch_verify_op(model, tree: VerifyTree, context_len: int, cache, batch: int,
                    head: Eagle3Head | None = None) -> Callable[[], None]:
    """One verify step of `batch` rows: the target forward (hidden states included) over [B, V] tree
    tokens on a cache of B rows of `context_len` entries, with the [B, 1, V, c + V] mask built per step (as the engine builds it);
    with `head`, also each row's greedy acceptance, the KV compaction of the kept entries and their
    fused features [B, L + 1, H]. Every row verifies the same stand-in tree and keeps row 0's path: the
    cost is a batched engine's, whatever the tokens."""
    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    ids = tree.tokens[None].repeat(batch, 1)                                   # [B, V]
    pos = (context_len + tree.depths)[None].repeat(batch, 1)                   # [B, V]

    def run():
        with torch.inference_mode():
            mask = tree_attention_mask(tree, context_len, dtype).repeat(batch, 1, 1, 1)   # [B, 1, V, c + V]
            out = model(input_ids=ids, position_ids=pos, cache=cache, attention_mask=mask, use_cache=True,
                        output_hidden_states=True)
            logits = out.logits.float()                                        # [B, V, vocab]
            if head is not None:
                paths = [accept_greedy(tree, logits[b])[0] for b in range(batch)]
                keep = [0] + paths[0]
                compact_cache(cache, context_len, keep)
                keep_t = torch.tensor(keep, device=dev)
                head.fuse(tuple(h[:, keep_t] for h in out.hidden_states))     # [B, L + 1, H]
            crop_cache(cache, context_len)
    return run


@torch.inference_mode()
def draft_op(head: Eagle3Head, W: int, context_len: int, tree_entries: int = 0, batch: int = 1) -> Callable[[], None]:
    """A closure running one draft forward over `batch` rows of W beams, each row with `context_len`
    prefix entries and `tree_entries` earlier tree entries in its own head KV, then each beam's top-W."""
    dev = head.fc.weight.device
    dt = head.fc.weight.dtype
    cfg = head.cfg
    S = context_len + tree_entries
    k = torch.randn(batch, cfg.num_key_value_heads, S, cfg.dim_head, device=dev, dtype=dt)   # [B, n_kv, S, d]
    past = (k, torch.randn_like(k))
    toks = torch.randint(0, cfg.vocab_size, (batch, W), device=dev)                            # [B, W]
    hidden = torch.randn(batch, W, cfg.hidden_size, device=dev, dtype=dt)                      # [B, W, H]
    pos = torch.full((batch, W), context_len, device=dev)
    mask = additive(torch.ones(batch, W, S + W, dtype=torch.bool, device=dev), dt)[:, None]   # [B, 1, W, S + W]

    def run():
        with torch.inference_mode():
            _, logits, _ = head(toks, hidden, pos, past_kv=past, attn_mask=mask)
            torch.log_softmax(logits.float(), -1).topk(min(W, logits.shape[-1]), dim=-1)
    return run


@torch.inference_mode()
def prefill_op(model, head: Eagle3Head, n: int) -> Callable[[], None]:
    """A closure running one request's prefill as the engine does (BatchEngine._fill): the target
    forward over n prompt tokens with hidden states, on a fresh cache,
    the head's fusion of the n feature vectors and its forward over entries 0 .. n - 2."""
    from transformers import DynamicCache

    dev = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (1, n), device=dev)                 # [1, n]
    pos = torch.arange(n, device=dev)

    def run():
        with torch.inference_mode():
            _, hs = target_forward(model, ids, pos[None], DynamicCache(config=model.config), last_only=True)
            feats = head.fuse(hs)                                                         # [1, n, H]
            if n > 1:
                head(ids[:, 1:], feats[:, : n - 1], pos[: n - 1], logits=False)
    return run


def policy_op(obs_dim: int = 102, hidden: int = 64, device="cpu", batch: int = 1) -> Callable[[], None]:
    """A stand-in policy of LTD's size (obs -> 64 -> 64 -> 2, tanh) over `batch` observations [B, obs]."""
    net = torch.nn.Sequential(torch.nn.Linear(obs_dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                              torch.nn.Tanh(), torch.nn.Linear(hidden, 2)).to(device)
    x = torch.randn(batch, obs_dim, device=device)

    def run():
        with torch.inference_mode():
            net(x).argmax(-1).tolist()
    return run
