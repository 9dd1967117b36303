"""The draft head's rotary position embedding, and what a config's rope fields may say.

RoPE: base `rope_theta` (10000 when absent, as EAGLE); an optional `rope_scaling` / `rope_parameters`
(linear, dynamic, llama3, yarn) exactly as transformers' `ROPE_INIT_FUNCTIONS` define inv_freq and the
attention factor; dynamic recomputes inv_freq past max_position_embeddings (transformers' rule).
The config object is the head's `Eagle3Config` (pipeline/models/head_model.py): rope_theta, rope_scaling
(normalised by `normalise_rope_scaling`), dim_head, max_position_embeddings and the attention sizes.
"""
from __future__ import annotations

import torch

from pipeline.errors import DraftGymError, first_line

ROPE_TYPES = ("linear", "dynamic", "llama3", "yarn")                    # plus "default" (= no scaling)


def normalise_rope_scaling(rs) -> dict | None:
    """A config's rope_scaling / rope_parameters -> None (plain RoPE) or {"rope_type": t, params...}."""
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise DraftGymError(f"head config rope_scaling must be a JSON object, got {rs!r}")
    kind = rs.get("rope_type", rs.get("type"))
    params = {k: v for k, v in rs.items() if k not in ("type", "rope_type", "rope_theta")}
    if kind is None and any(isinstance(v, dict) for v in params.values()):
        raise DraftGymError("head config has per-layer-type rope parameters; an EAGLE-3 head needs one set")
    if kind in (None, "default"):
        if kind is None and params:
            raise DraftGymError(f"head config rope_scaling {rs} names no rope_type")
        return None
    if kind not in ROPE_TYPES:
        raise DraftGymError(f"head config rope type {kind!r} is not supported (supported: default, {', '.join(ROPE_TYPES)})")
    return {"rope_type": kind, **params}


def rope_cos_sin(position_ids: torch.Tensor, dim: int, theta: float, dtype: torch.dtype):
    """cos/sin for plain RoPE. position_ids: [q] -> cos, sin: [q, dim]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=position_ids.device, dtype=torch.float32) / dim))
    freqs = position_ids.float()[:, None] * inv_freq[None, :]  # [q, dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)                     # [q, dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _hf_rope(cfg, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim/2] fp32 on the CPU, attention factor) from transformers' ROPE_INIT_FUNCTIONS,
    given a LlamaConfig carrying the head's RoPE fields (transformers 4 and 5 both read rope_scaling)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = cfg.rope_scaling["rope_type"]
    try:
        with torch.device("cpu"):  # also when the head itself is being built on the meta device
            hf = LlamaConfig(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
                             num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.dim_head,
                             max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta,
                             rope_scaling=dict(cfg.rope_scaling))
            inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](hf, "cpu", **({"seq_len": seq_len} if seq_len else {}))
    except Exception as e:  # a missing or malformed scaling parameter
        raise DraftGymError(f"head config rope_scaling {cfg.rope_scaling} is not usable: {first_line(e)}") from e
    return inv_freq.float(), float(scale)


class Rope:
    """cos/sin tables of the head's RoPE at given positions: [q] -> ([q, dim], [q, dim]).

    Without rope_scaling this is `rope_cos_sin` (bit for bit the plain EAGLE RoPE). With it:
    freqs = pos * inv_freq, cos = cos(cat(freqs, freqs)) * factor (sin alike), as transformers."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.kind = cfg.rope_scaling["rope_type"] if cfg.rope_scaling else None
        self.inv_freq, self.scale = _hf_rope(cfg) if self.kind else (None, 1.0)
        self._on: dict[torch.device, torch.Tensor] = {}   # inv_freq per device (kept out of .to(dtype))

    def tables(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(inv_freq on the positions' device, factor) for this forward."""
        if self.kind == "dynamic":
            seq_len = int(position_ids.max()) + 1          # transformers: max position + 1
            if seq_len > self.cfg.max_position_embeddings:  # grown past the trained length: rescale the base
                inv, scale = _hf_rope(self.cfg, seq_len)
                return inv.to(position_ids.device), scale
        dev = position_ids.device
        if dev not in self._on:
            self._on[dev] = self.inv_freq.to(dev)
        return self._on[dev], self.scale

    def cos_sin(self, position_ids: torch.Tensor, dtype: torch.dtype):
        if self.kind is None:
            return rope_cos_sin(position_ids, self.cfg.dim_head, self.cfg.rope_theta, dtype)
        inv_freq, scale = self.tables(position_ids)
        freqs = position_ids.float()[:, None] * inv_freq[None, :]  # [q, dim/2]
        emb = torch.cat([freqs, freqs], dim=-1)                     # [q, dim]
        return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, q, dim]; cos/sin: [q, dim]. Llama's rotate-half convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
