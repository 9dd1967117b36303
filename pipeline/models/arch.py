"""What a target architecture must offer for exact EAGLE-3 decoding, checked once when an engine is set up.

The engine (pipeline/decode/engine/single.py, verify.py) assumes three things of a Hugging Face causal LM:

1. Its logits are the CausalLM's own output, `model(...).logits`. Whatever a model does after the
   lm_head is therefore applied: Gemma-2's final soft-capping z -> c * tanh(z / c) (c =
   `final_logit_softcapping`), Cohere's `logit_scale`, Granite's `logits_scaling`. Code that
   recomputes logits from hidden states applies the same transform (`output_logits`: the trainer's
   soft labels, pipeline/train_head/ttt.py) or goes through the CausalLM where one is present
   (`logits_are_lm_head`: the batched prefill, pipeline/decode/engine/prefill.py).
2. Every decoder layer keeps a plain key/value cache (full or sliding-window attention), so the
   entries of the verified tree can be compacted in place (verify.compact_cache). Recurrent, linear
   attention, chunked, or KV-sharing layers are refused by `check_target`.
3. A sliding window (Mistral, Gemma-2, Phi-3 `sliding_window`; Qwen2 only with `use_sliding_window`)
   is never reached. transformers' sliding cache keeps only the last window - 1 entries, and a
   verify forward writes the whole tree (V entries) on top of the n cached ones before compaction
   picks the accepted path; the tree masks are not windowed either. So EAGLE-3 needs
   n + V <= window - 1 in every cycle, which holds when

       prompt + max_new_tokens + V  <=  window - 1,

   and the autoregressive paths need prompt + max_new_tokens <= window - 1 (continuations.py's slot
   cache copies the prefill's sliding cache and masks without a window). `check_length` refuses
   anything longer up front, in one line naming the window; the engine also refuses, at its cycle,
   a verify size a policy raises past the window mid-generation.

The capture layers of the EAGLE-3 head, (2, L // 2, L - 3), come from the target's
`num_hidden_layers` (pipeline.models.head_model.target_layer_ids); nothing here is per architecture.
"""
from __future__ import annotations

import torch

from pipeline.errors import DraftGymError

PLAIN_LAYERS = ("full_attention", "sliding_attention")   # layer types whose KV cache the engine can compact


def text_config(config):
    """The decoder's config (a multimodal config nests it; a text model's config is itself)."""
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if get is not None else config


def layer_types(config) -> list[str]:
    """One attention type per decoder layer, as transformers' DynamicCache reads them: the config's
    `layer_types`, else 'sliding_attention' where a sliding window is set, 'chunked_attention' where
    an attention chunk size is, else 'full_attention'."""
    c = text_config(config)
    types = getattr(c, "layer_types", None)
    if types:
        return list(types)
    if getattr(c, "sliding_window", None) is not None:
        kind = "sliding_attention"
    elif getattr(c, "attention_chunk_size", None) is not None:
        kind = "chunked_attention"
    else:
        kind = "full_attention"
    return [kind] * int(getattr(c, "num_hidden_layers", 0) or 0)


def attention_window(config) -> int | None:
    """The sliding window of the target's sliding-attention layers (tokens), None when every layer
    attends to the whole context."""
    if "sliding_attention" not in layer_types(config):
        return None
    w = getattr(text_config(config), "sliding_window", None)
    return int(w) if w is not None else None


def check_target(model) -> None:
    """Refuse, in one line, a target whose KV cache the engine cannot compact (point 2 above)."""
    types = layer_types(model.config)
    bad = sorted(set(types) - set(PLAIN_LAYERS))
    if bad:
        name = type(model).__name__
        raise DraftGymError(f"target {name} has {bad[0]!r} layers: EAGLE-3 tree verification needs full or "
                            f"sliding-window attention in every layer (a key/value cache it can compact)")
    if getattr(text_config(model.config), "kv_sharing_modes", None):
        raise DraftGymError(f"target {type(model).__name__} shares key/value caches between layers: EAGLE-3 tree "
                            f"verification needs each layer's own cache")


def max_positions(config) -> int:
    """The longest sequence the engine may hold: max_position_embeddings, and window - 1 when a
    sliding window is set (point 3 above)."""
    c = text_config(config)
    limit = int(getattr(c, "max_position_embeddings", None) or 1 << 30)
    w = attention_window(config)
    return min(limit, w - 1) if w is not None else limit


def check_length(config, prompt_len: int, max_new_tokens: int, tree: int = 0) -> None:
    """Refuse a generation that could pass the target's positions or its sliding window.

    tree: the verify tree size V of an EAGLE-3 generation (0 for autoregressive decoding); it counts
    against the window only (past max_position_embeddings the tree's last positions are harmless)."""
    c = text_config(config)
    limit = int(getattr(c, "max_position_embeddings", None) or 1 << 30)
    if prompt_len + max_new_tokens > limit:
        raise DraftGymError(f"prompt too long: {prompt_len} tokens + {max_new_tokens} new "
                            f"> the target's {limit} positions")
    w = attention_window(config)
    if w is not None and prompt_len + max_new_tokens + tree > w - 1:
        tree_s = f" + {tree} tree" if tree else ""
        raise DraftGymError(f"prompt too long for the target's sliding attention window: {prompt_len} tokens + "
                            f"{max_new_tokens} new{tree_s} > {w - 1} (window {w}; its cache keeps only the last "
                            f"{w - 1} entries)")


def _logit_transforms(config) -> tuple[float | None, float | None, float | None]:
    """(logit_scale, logits_scaling, final_logit_softcapping), each None where it does nothing."""
    c = text_config(config)
    scale, div, cap = (getattr(c, k, None) for k in ("logit_scale", "logits_scaling", "final_logit_softcapping"))
    return (None if scale in (None, 1.0) else scale, None if div in (None, 1.0) else div, cap or None)


def logits_are_lm_head(config) -> bool:
    """True when the CausalLM returns lm_head(h) unchanged (no transform of `output_logits`)."""
    return _logit_transforms(config) == (None, None, None)


def output_logits(config, logits: torch.Tensor) -> torch.Tensor:
    """What the CausalLM does to lm_head(h) before returning it (point 1 above): Cohere's logit_scale
    (z * s), Granite's logits_scaling (z / s), Gemma-2's and Gemma-3's final soft-capping c * tanh(z / c).
    Identity for every other architecture."""
    scale, div, cap = _logit_transforms(config)
    if scale is not None:
        logits = logits * scale
    if div is not None:
        logits = logits / div
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits
