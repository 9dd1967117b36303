"""Grouped-query attention under a mask, without copying K and V once per query head.

Targets of the users' envelope (Llama 3, Qwen3, SmolLM2) use grouped-query attention: Hq query heads
share Hkv < Hq key/value heads, g = Hq / Hkv queries per group. transformers' `sdpa` attention
(transformers/integrations/sdpa_attention.py) hands the grouping to torch's SDPA (`enable_gqa`) only
when there is no mask, or folds the g heads into the query length when one token is decoded. Every
other call, which is every verify (a tree or a chain of V > 1 tokens under its tree mask) and every
batched step (the rows' padding mask), first expands K and V to Hq heads:

    repeat_kv: [B, Hkv, c, d] -> [B, Hq, c, d]          a copy of g x the whole KV cache, per layer

On a CPU that copy is the verify's cost at long contexts (SmolLM2-135M, g = 3, 30 layers, 16 rows
at c = 2048, fp32: a 2-token verify 2771 ms against 475 ms for 1 token), so speculation would look
dearest exactly where the contexts are long. `draftgym_sdpa` is transformers' `sdpa` but for that
case, where it calls SDPA with `enable_gqa=True` on the grouped K/V as they are:

    out[b, h] = softmax(q[b, h] k[b, h // g]^T * scale + mask[b]) v[b, h // g]        [B, Hq, q, d]

the same attention, head for head (tests/pipeline/models/test_attention.py checks it against `sdpa`). Masks are
built as for `sdpa` (transformers.masking_utils.sdpa_mask). `pipeline.models.target.load_target`
selects it on a CPU. On CUDA, SDPA's fused kernels do not take a mask together with enable_gqa
(they fall back to the math kernel), so GPUs keep transformers' `sdpa`.
"""
from __future__ import annotations

import torch

NAME = "draftgym_sdpa"


def sdpa_grouped_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                           is_causal=None, **kwargs):
    """transformers' attention-function signature: query [B, Hq, q, d], key and value [B, Hkv, k, d],
    attention_mask [B, 1, q, >= k] (additive float or bool) or None -> ([B, q, Hq, d], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    plain = (groups == 1 or attention_mask is None or query.shape[2] == 1
             or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None)
    if plain:                                   # transformers' own dispatch already copies nothing here
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    mask = attention_mask[:, :, :, : key.shape[-2]]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0, scale=scaling,
        enable_gqa=True)                                                                   # [B, Hq, q, d]
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make `draftgym_sdpa` known to transformers (attention and mask interfaces); idempotent."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, sdpa_grouped_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_grouped_attention(model) -> bool:
    """Switch a loaded target from `sdpa` to `draftgym_sdpa` on a CPU (module docstring); True when it
    switched. Other implementations (eager, flash kernels) and other devices are left as they are."""
    dev = next(model.parameters()).device
    if dev.type != "cpu" or getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(register())
    return True
