"""The EAGLE-3 draft head: its config and its architecture (loading and saving are in pipeline/models/head.py).

Architecture (SafeAILab/EAGLE `cnets.py`, paraphrased; SpecForge's optional norms in [brackets]):

    h_i = [fc_norm.i](target hidden state of layer l_i), (l_0, l_1, l_2) = (2, L//2, L-3)
    f_t = fc(concat(h_0, h_1, h_2))                      # fuse 3 target layers, 3*H_t -> H
    x   = concat(input_layernorm(embed(tok_{t+1})),      # [.., 2H]: embedding first,
                 hidden_norm(g_t))                       #           then the hidden state
    g'  = g_t + o_proj(attn(q/k/v_proj(x)))              # residual is the incoming hidden g_t
    g'' = g' + mlp(post_attention_layernorm(g'))         # SwiGLU
    logits = lm_head(norm(g''))                          # [lm_head_norm = false: lm_head(g'')]
    s   = g''                                            # [norm_output = true: s = norm(g''), EAGLE-3.1]

`g_t` is `f_t` for positions whose target features are known (the accepted prefix), and the head's
own previous state `s` when it drafts deeper tree levels: g'' before `norm` in EAGLE-3, norm(g'') in
EAGLE-3.1. Hidden state t pairs with token t+1. Draft token i maps to target id `i + d2t[i]`.
`forward` returns s; `logits_of(s)` applies `norm` only where s is not normed already.

The optional flags (the meaning every engine gives them; sources and history in docs/head.md):
- `fc_norm` (default false): an RMSNorm per fused target layer (`fc_norm.{0,1,2}.weight`) before `fc`.
- `norm_output` (default false): the next draft step reads norm(g'') (EAGLE-3.1), not g'' (EAGLE-3).
- `lm_head_norm` (DraftGym's, default true): false = lm_head reads g'' (SpecForge before its PR #879).

RoPE (with rope_scaling / rope_parameters): pipeline/models/rope.py.

Compute dtype: the head runs in its weights' dtype; `fuse` and `forward` cast their float inputs to
it, so a head may run in another dtype than its target. Under autocast (training) autocast decides.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from pipeline.errors import DraftGymError, HeadMismatchError
from pipeline.models.rope import ROPE_TYPES, Rope, apply_rope, normalise_rope_scaling, rope_cos_sin  # noqa: F401

WRITTEN_ARCHITECTURE = "LlamaForCausalLMEagle3"     # SpecForge and SGLang; SpecForge refuses LlamaForCausalLM
ACCEPTED_ARCHITECTURES = (WRITTEN_ARCHITECTURE, "LlamaForCausalLM",   # SafeAILab/EAGLE's releases
                          "Eagle3LlamaForCausalLM")                     # vLLM's name for the same head
# 2: `norm_output` in the engines' meaning; a DraftGym head without the key meant lm_head_norm by it (from_json).
HEAD_FORMAT_KEY, HEAD_FORMAT = "draftgym_head_format", 2


def target_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """Indices into HF `output_hidden_states` (0 = embeddings, i = input of decoder layer i)."""
    if num_layers < 3:
        raise HeadMismatchError(f"EAGLE-3 needs a target with >= 3 layers, got {num_layers}")
    return (2, num_layers // 2, num_layers - 3)


@dataclass
class Eagle3Config:
    """The fields of an EAGLE-3 head `config.json` (Llama-style, one decoder layer)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int                       # the target's vocabulary
    draft_vocab_size: int                 # lm_head rows; == vocab_size means an identity d2t mapping
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0           # official configs omit it: EAGLE then uses 10000
    rope_scaling: dict | None = None      # normalised: {"rope_type": linear|dynamic|llama3|yarn, ...}
    head_dim: int | None = None
    target_hidden_size: int | None = None  # set when the head is narrower/wider than the target
    fc_norm: bool = False                 # RMSNorm each fused target layer before fc (EAGLE-3.1)
    norm_output: bool = False             # the next draft step reads norm(g'') (EAGLE-3.1); false: g'' (EAGLE-3)
    lm_head_norm: bool = True             # false: lm_head reads g'' (SpecForge before PR #879, norm_output: false)
    torch_dtype: str = "float32"
    num_hidden_layers: int = 1
    architectures: list = field(default_factory=lambda: [WRITTEN_ARCHITECTURE])  # as read; save writes ours

    def __post_init__(self):
        self.rope_scaling = normalise_rope_scaling(self.rope_scaling)
        for k in ("fc_norm", "norm_output", "lm_head_norm"):
            if not isinstance(getattr(self, k), bool):
                raise DraftGymError(f"head config {k} must be true or false, got {getattr(self, k)!r}")
        if self.norm_output and not self.lm_head_norm:
            raise DraftGymError("head config norm_output: true (the next step reads norm(g'')) contradicts "
                                "lm_head_norm: false (lm_head reads g'' un-normed)")

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def fused_size(self) -> int:
        return 3 * (self.target_hidden_size or self.hidden_size)

    @classmethod
    def from_json(cls, d: dict, legacy: bool = False) -> "Eagle3Config":
        """A config.json object -> Eagle3Config. legacy: a DraftGym head written before HEAD_FORMAT 2, whose
        `norm_output` (default true) said whether lm_head reads norm(g''); its next step always read g''."""
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d and d[k] is not None}
        if legacy:
            known.pop("lm_head_norm", None)
            known["lm_head_norm"] = known.pop("norm_output", True)
        archs = known.get("architectures")
        archs = [archs] if isinstance(archs, str) else archs
        if archs and not any(a in ACCEPTED_ARCHITECTURES for a in archs):
            raise DraftGymError(f"head config architectures {archs} is not an EAGLE-3 Llama head "
                                f"(expected {' or '.join(ACCEPTED_ARCHITECTURES[:2])})")
        rp = d.get("rope_parameters")     # transformers 5: rope_theta + the scaling in one dict
        if isinstance(rp, dict):
            known.setdefault("rope_theta", rp.get("rope_theta", 10000.0))
            if "rope_scaling" not in known:
                known["rope_scaling"] = rp
        known.setdefault("draft_vocab_size", d.get("vocab_size"))
        missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                               "num_key_value_heads", "vocab_size") if k not in known]
        if missing:
            raise DraftGymError(f"EAGLE-3 head config.json lacks {', '.join(missing)}")
        return cls(**known)

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("head_dim", "target_hidden_size", "rope_scaling"):
            if d[k] is None:
                del d[k]
        if d["lm_head_norm"]:
            del d["lm_head_norm"]        # the default every engine assumes; written only when false
        d[HEAD_FORMAT_KEY] = HEAD_FORMAT
        d["architectures"] = [WRITTEN_ARCHITECTURE]
        d["model_type"] = "llama"
        d["hidden_act"] = "silu"
        return d


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def causal_mask(q: int, past: int, device, dtype) -> torch.Tensor:
    """Additive mask [q, past+q]: row i sees all `past` entries and new entries 0..i."""
    m = torch.full((q, past + q), float("-inf"), device=device, dtype=dtype)
    m[:, :past] = 0
    m[:, past:] = torch.triu(m[:, past:], diagonal=1)
    return m


class KVBuffer:
    """A preallocated head KV for a growing draft tree: keys/values [B, nkv, capacity, d], the first
    `length` entries valid. Passed as `past_kv`, the attention writes its new entries in place and
    attends over keys[:, :, :length], so a prefix of S entries is copied in once per tree instead of
    once per level (torch.cat of [prefix | levels so far] each level)."""

    def __init__(self, prefix_kv: tuple[torch.Tensor, torch.Tensor], batch: int, extra: int):
        pk, pv = prefix_kv                                            # [1 or B, nkv, S, d]
        B, nkv, S, d = batch, pk.shape[1], pk.shape[2], pk.shape[3]
        self.keys = pk.new_empty(B, nkv, S + extra, d)
        self.values = pv.new_empty(B, nkv, S + extra, d)
        self.keys[:, :, :S], self.values[:, :, :S] = pk, pv           # broadcast a [1, ...] prefix to B rows
        self.length = S

    def append(self, ks: torch.Tensor, vs: torch.Tensor):
        """Write q new entries [B, nkv, q, d]; return views of all valid keys/values [B, nkv, length, d]."""
        q = ks.shape[2]
        self.keys[:, :, self.length : self.length + q] = ks
        self.values[:, :, self.length : self.length + q] = vs
        self.length += q
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]


def gqa_attention(qs: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v with nkv key/value heads shared by groups of rep = nh / nkv
    query heads, without repeating the keys: query head h = j*rep + r reads kv head j (repeat_interleave's
    convention), so the rep query heads of group j are folded into its rows.

    qs: [B, nh, q, d]; ks, vs: [B, nkv, K, d]; attn_mask: additive, broadcastable to [B, 1, q, K]
    (one mask for every head). Returns [B, nh, q, d]. Per query row this is the same computation as
    SDPA over repeated keys (bit for bit on an Intel Xeon; within 1 ulp in fp32 on an
    AMD EPYC, whose kernel rounds differently for rep*q rows than for q: tests/pipeline/models/test_head.py)."""
    B, nh, q, d = qs.shape
    nkv, K = ks.shape[1], ks.shape[2]
    rep = nh // nkv
    m = attn_mask if attn_mask.dim() == 4 else attn_mask.reshape(*(1,) * (4 - attn_mask.dim()), *attn_mask.shape)
    if m.shape[1] != 1:                                                # a per-head mask: repeat the keys instead
        return F.scaled_dot_product_attention(qs, ks.repeat_interleave(rep, 1), vs.repeat_interleave(rep, 1),
                                              attn_mask=attn_mask)
    m = m[:, :, None].expand(m.shape[0], 1, rep, q, K).reshape(m.shape[0], 1, rep * q, K)  # [B|1, 1, rep*q, K]
    out = F.scaled_dot_product_attention(qs.reshape(B, nkv, rep * q, d), ks, vs, attn_mask=m)
    return out.reshape(B, nh, q, d)


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.n_heads, self.n_kv, self.dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.dim_head
        H2 = 2 * cfg.hidden_size  # q/k/v read concat(embedding, hidden)
        self.q_proj = nn.Linear(H2, self.n_heads * self.dim, bias=False)
        self.k_proj = nn.Linear(H2, self.n_kv * self.dim, bias=False)
        self.v_proj = nn.Linear(H2, self.n_kv * self.dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.dim, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, past_kv, attn_mask):
        B, q, _ = x.shape
        qs = self.q_proj(x).view(B, q, self.n_heads, self.dim).transpose(1, 2)  # [B, nh, q, d]
        ks = self.k_proj(x).view(B, q, self.n_kv, self.dim).transpose(1, 2)     # [B, nkv, q, d]
        vs = self.v_proj(x).view(B, q, self.n_kv, self.dim).transpose(1, 2)
        qs, ks = apply_rope(qs, cos, sin), apply_rope(ks, cos, sin)
        new_kv = (ks, vs)
        if isinstance(past_kv, KVBuffer):
            ks, vs = past_kv.append(ks, vs)                                     # [B, nkv, S+q, d] views
        elif past_kv is not None:
            ks = torch.cat([past_kv[0], ks], dim=2)  # [B, nkv, S+q, d]
            vs = torch.cat([past_kv[1], vs], dim=2)
        if attn_mask is None:  # plain causal over [past | new]
            S = ks.shape[2] - q
            attn_mask = causal_mask(q, S, x.device, qs.dtype)
        out = gqa_attention(qs, ks, vs, attn_mask)                              # [B, nh, q, d]
        return self.o_proj(out.transpose(1, 2).reshape(B, q, -1)), new_kv


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        H = cfg.hidden_size
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.intermediate_size, H, bias=False)

    def forward(self, emb, hidden, cos, sin, past_kv, attn_mask):
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)  # [B, q, 2H]
        attn, new_kv = self.self_attn(x, cos, sin, past_kv, attn_mask)
        h = hidden + attn
        m = self.post_attention_layernorm(h)
        h = h + self.mlp.down_proj(F.silu(self.mlp.gate_proj(m)) * self.mlp.up_proj(m))
        return h, new_kv


class Eagle3Head(nn.Module):
    """An EAGLE-3 draft head. Keys match the official checkpoints.

    share_embedding (default: unless the config sets target_hidden_size): the head will use the
    target's token embedding, so it allocates none of its own; `embed_tokens.weight` stays None
    until `pipeline.models.head.attach_target_embeddings` puts the target's tensor there."""

    def __init__(self, cfg: Eagle3Config, layer_ids: tuple[int, int, int], share_embedding: bool | None = None):
        super().__init__()
        self.cfg = cfg
        self.layer_ids = tuple(layer_ids)
        self.shares_embedding = cfg.target_hidden_size is None if share_embedding is None else bool(share_embedding)
        if self.shares_embedding:  # a module with no weight: nothing [vocab, H] is ever allocated here
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device="meta")
            self.embed_tokens.weight = None
        else:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.embed_tokens.weight.requires_grad_(False)  # frozen
        self.fc = nn.Linear(cfg.fused_size, cfg.hidden_size, bias=False)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.fused_size // 3, cfg.rms_norm_eps) for _ in range(3))
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        # d2t[i] = target_id(i) - i; t2d[t] = token t is in the draft vocabulary
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        self.rope = Rope(cfg)
        self.head_id = "random"

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: the weights' (pipeline.decode.draft and pipeline.profiling.timed_ops read fc.weight.dtype too)."""
        return self.fc.weight.dtype

    def _to_head(self, x: torch.Tensor) -> torch.Tensor:
        """Cast a float input to the head's dtype, except under autocast (which picks dtypes itself)."""
        return x if torch.is_autocast_enabled(x.device.type) else x.to(self.fc.weight.dtype)

    # -- features -----------------------------------------------------------------------------
    def fuse(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Target `output_hidden_states` -> fused features f: 3 x [B, n, H_t] -> [fc_norm] -> fc -> [B, n, H]."""
        return self.fuse_concat(torch.cat([self._to_head(hidden_states[i]) for i in self.layer_ids], dim=-1))

    def fuse_concat(self, fused: torch.Tensor) -> torch.Tensor:
        """The three target layers already concatenated [B, n, 3*H_t] -> [fc_norm per layer] -> fc -> [B, n, H]
        (the trainer's feature cache holds them concatenated)."""
        if self.cfg.fc_norm:
            fused = torch.cat([norm(h) for norm, h in zip(self.fc_norm, fused.chunk(3, dim=-1))], dim=-1)
        return self.fc(fused)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                past_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                attn_mask: torch.Tensor | None = None, logits: bool = True):
        """One draft forward.

        input_ids: [B, q] target token ids (tok_{t+1}); hidden: [B, q, H] (fused f_t or the head's
        own previous output); position_ids: [q] or [B, q]; past_kv: ([B, nkv, S, d], [B, nkv, S, d]);
        attn_mask: additive [q, S+q] (or broadcastable), default causal.
        Returns (s: [B, q, H], the state the next draft step reads (module docstring),
        logits: [B, q, draft_vocab] (None with logits=False),
        new_kv for the q entries).
        """
        if self.embed_tokens.weight is None:
            raise DraftGymError("this head shares its target's token embedding: call "
                                "pipeline.models.head.attach_target_embeddings(head, target_model) first")
        hidden = self._to_head(hidden)
        emb = self.embed_tokens(input_ids).to(hidden.dtype)
        cos, sin = self.rope.cos_sin(position_ids.reshape(-1), hidden.dtype)
        if position_ids.dim() == 2:  # per-row positions [B, q] -> [B, 1, q, d] (broadcast over heads)
            cos, sin = (t.view(*position_ids.shape, -1)[:, None] for t in (cos, sin))
        g, new_kv = self.midlayer(emb, hidden, cos, sin, past_kv, attn_mask)
        s = self.norm(g) if self.cfg.norm_output else g        # the state the next draft step reads
        return s, (self.logits_of(s) if logits else None), new_kv

    def logits_of(self, s: torch.Tensor) -> torch.Tensor:
        """The head's output states s [..., H] (as `forward` returns them) -> draft logits [..., draft_vocab]
        (the trainer runs this on the rows that have a label only)."""
        normed = self.cfg.norm_output or not self.cfg.lm_head_norm   # s is already what lm_head reads
        return self.lm_head(s if normed else self.norm(s))
