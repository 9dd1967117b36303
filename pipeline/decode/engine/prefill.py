"""Prefilling prompts for the batched engine (pipeline/decode/engine/core.py), several per forward.

Why: a batch-1 prefill of a short prompt has only P rows per matmul; the bench's 64 ShareGPT prompts of
~77 tokens prefilled one by one take 4.0 s, a third of their generation. A group
is right-padded to its longest prompt with natural positions: causal attention never lets a row see
the padding after it, so no mask is needed, and only each row's [0, P) KV entries are copied into its
slot. Prompts are sorted by length and cut into groups of at most PREFILL_TOKENS padded tokens
(`length_groups`), so a group's rows have similar lengths. Measured on that bench (bf16, 2-core Xeon):
4.0 s one by one; grouped 2.9 / 3.8 / 4.3 s unsorted and 1.9 / 2.0 / 4.9 s sorted at 1,024 / 4,096 /
16,384 padded tokens (large groups pad short rows to the longest).

The logits come from the decoder stack plus the output embedding on each row's last hidden state
(`pipeline.models.target.base_model`: the CausalLM's own `logits_to_keep` path copies the lm_head weight
once per row). Targets whose CausalLM changes logits after the lm_head (Gemma-2's soft-capping,
Cohere's and Granite's logit scales: `arch.logits_are_lm_head`) are prefilled one by one through the
CausalLM.

Exactness: a row's numbers may differ from its batch-1 prefill by the rounding of matmuls with more
rows, as any batched forward's; fp32 rows are equal token for token in the tests
(tests/pipeline/decode/test_batch_generate.py), reduced precision parts at near-ties (pipeline/decode/lossless.py).
"""
from __future__ import annotations

import torch

from pipeline.models.arch import logits_are_lm_head

PREFILL_TOKENS = 1024   # padded tokens per batched prefill forward (rows x longest prompt of the group)


def length_groups(lengths: list[int], max_items: int, max_tokens: int) -> list[list[int]]:
    """Consecutive groups of indices (lengths sorted ascending) with at most max_items members and
    members x the group's longest length <= max_tokens (a longer single item is a group alone)."""
    groups, cur = [], []
    for i, n in enumerate(lengths):
        if cur and (len(cur) + 1 > max_items or (len(cur) + 1) * n > max_tokens):
            groups.append(cur)
            cur = []
        cur.append(i)
    return groups + ([cur] if cur else [])


def prefill_groups(model, prompts: list[list[int]]):
    """Prefill `prompts` several per forward (module docstring), shortest first. Yields per prompt
    (its index in `prompts`, the group's DynamicCache, its row in that cache, its last-token logits
    [vocab] fp32); the caller copies row's [0, len) entries into its slot before the next group."""
    from transformers import DynamicCache

    from pipeline.models.target import base_model

    dev = next(model.parameters()).device
    cfg = model.config
    plain_head = logits_are_lm_head(cfg)        # no soft-capping / logit scale after the lm_head
    order = sorted(range(len(prompts)), key=lambda j: len(prompts[j]))
    groups = [[order[k] for k in g] for g in length_groups([len(prompts[i]) for i in order],
                                                           len(order) if plain_head else 1, PREFILL_TOKENS)]
    for grp in groups:
        Ps = [len(prompts[i]) for i in grp]
        P = max(Ps)
        ids = torch.tensor([prompts[i] + [0] * (P - len(prompts[i])) for i in grp], device=dev)     # [G, P]
        cache = DynamicCache(config=cfg)
        if plain_head:
            h = base_model(model)(input_ids=ids, position_ids=torch.arange(P, device=dev)[None].expand(len(grp), -1),
                                  cache=cache, use_cache=True).last_hidden_state                     # [G, P, H]
            last = h[torch.arange(len(grp), device=dev), torch.tensor(Ps, device=dev) - 1]           # [G, H]
            logits = model.get_output_embeddings()(last).float()                                     # [G, vocab]
        else:
            logits = model(input_ids=ids, position_ids=torch.arange(P, device=dev)[None], cache=cache,
                           use_cache=True, logits_to_keep=1).logits[:, -1].float()                   # G = 1
        for r, i in enumerate(grp):
            yield i, cache, r, logits[r]
