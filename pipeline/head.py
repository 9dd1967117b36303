"""The EAGLE-3 draft head: architecture, official checkpoint format, loading and checks.

Architecture (SafeAILab/EAGLE `cnets.py`, paraphrased):

    f_t = fc(concat(h2_t, h{L//2}_t, h{L-3}_t))        # fuse 3 target layers, 3*H_t -> H
    x   = concat(input_layernorm(embed(tok_{t+1})),      # [.., 2H]: embedding first,
                 hidden_norm(g_t))                       #           then the hidden state
    g'  = g_t + o_proj(attn(q/k/v_proj(x)))              # residual is the incoming hidden g_t
    g'' = g' + mlp(post_attention_layernorm(g'))         # SwiGLU
    logits = lm_head(norm(g''))                          # over the draft vocabulary

`g_t` is `f_t` for positions whose target features are known (the accepted prefix), and the head's
own previous output `g''` (before `norm`) when it drafts deeper tree levels. Hidden state t pairs
with token t+1. Draft token i maps to target id `i + d2t[i]`.

Checkpoint: `config.json` + `model.safetensors` or `pytorch_model.bin` with keys `fc.weight`,
`midlayer.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, hidden_norm, input_layernorm,
post_attention_layernorm}.weight`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`. `embed_tokens` is
usually absent and then comes from the target. Loading is non-strict.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from pipeline.errors import DraftGymError, HeadMismatchError

DEFAULT_HEAD_DIR = Path(__file__).resolve().parent.parent / "data" / "heads" / "smollm2-135m"


def target_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """Indices into HF `output_hidden_states` (0 = embeddings, i = input of decoder layer i)."""
    if num_layers < 3:
        raise HeadMismatchError(f"EAGLE-3 needs a target with >= 3 layers, got {num_layers}")
    return (2, num_layers // 2, num_layers - 3)


@dataclass
class Eagle3Config:
    """The fields of an official EAGLE-3 head `config.json` (Llama-style, one decoder layer)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int                       # the target's vocabulary
    draft_vocab_size: int                 # lm_head rows; == vocab_size means no d2t mapping
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0           # official configs omit it: EAGLE then uses 10000
    head_dim: int | None = None
    target_hidden_size: int | None = None  # set when the head is narrower/wider than the target
    torch_dtype: str = "float32"
    num_hidden_layers: int = 1
    architectures: list = field(default_factory=lambda: ["LlamaForCausalLM"])

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def fused_size(self) -> int:
        return 3 * (self.target_hidden_size or self.hidden_size)

    @classmethod
    def from_json(cls, d: dict) -> "Eagle3Config":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d and d[k] is not None}
        if "rope_theta" not in known and isinstance(d.get("rope_parameters"), dict):
            known["rope_theta"] = d["rope_parameters"].get("rope_theta", 10000.0)
        known.setdefault("draft_vocab_size", d.get("vocab_size"))
        missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                               "num_key_value_heads", "vocab_size") if k not in known]
        if missing:
            raise DraftGymError(f"EAGLE-3 head config.json lacks {', '.join(missing)}")
        return cls(**known)

    def to_json(self) -> dict:
        d = asdict(self)
        if d["head_dim"] is None:
            del d["head_dim"]
        if d["target_hidden_size"] is None:
            del d["target_hidden_size"]
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


def rope_cos_sin(position_ids: torch.Tensor, dim: int, theta: float, dtype: torch.dtype):
    """cos/sin for RoPE. position_ids: [q] -> cos, sin: [q, dim]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=position_ids.device, dtype=torch.float32) / dim))
    freqs = position_ids.float()[:, None] * inv_freq[None, :]  # [q, dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)                     # [q, dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, q, dim]; cos/sin: [q, dim]. Llama's rotate-half convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


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
        if past_kv is not None:
            ks = torch.cat([past_kv[0], ks], dim=2)  # [B, nkv, S+q, d]
            vs = torch.cat([past_kv[1], vs], dim=2)
        rep = self.n_heads // self.n_kv
        ks, vs = ks.repeat_interleave(rep, dim=1), vs.repeat_interleave(rep, dim=1)
        if attn_mask is None:  # plain causal over [past | new]
            S = ks.shape[2] - q
            attn_mask = causal_mask(q, S, x.device, qs.dtype)
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=attn_mask)  # [B, nh, q, d]
        return self.o_proj(out.transpose(1, 2).reshape(B, q, -1)), new_kv


def causal_mask(q: int, past: int, device, dtype) -> torch.Tensor:
    """Additive mask [q, past+q]: row i sees all `past` entries and new entries 0..i."""
    m = torch.full((q, past + q), float("-inf"), device=device, dtype=dtype)
    m[:, :past] = 0
    m[:, past:] = torch.triu(m[:, past:], diagonal=1)
    return m


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
    """An EAGLE-3 draft head. Keys match the official checkpoints."""

    def __init__(self, cfg: Eagle3Config, layer_ids: tuple[int, int, int]):
        super().__init__()
        self.cfg = cfg
        self.layer_ids = tuple(layer_ids)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # frozen, from the target
        self.fc = nn.Linear(cfg.fused_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        # d2t[i] = target_id(i) - i; t2d[t] = token t is in the draft vocabulary
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        self.head_id = "random"

    # -- features -----------------------------------------------------------------------------
    def fuse(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Target `output_hidden_states` -> fused features f: [B, n, 3*H_t] -> fc -> [B, n, H]."""
        return self.fc(torch.cat([hidden_states[i] for i in self.layer_ids], dim=-1))

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                past_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                attn_mask: torch.Tensor | None = None):
        """One draft forward.

        input_ids: [B, q] target token ids (tok_{t+1}); hidden: [B, q, H] (fused f_t or the head's
        own previous output); position_ids: [q] or [B, q]; past_kv: ([B, nkv, S, d], [B, nkv, S, d]);
        attn_mask: additive [q, S+q] (or broadcastable), default causal.
        Returns (g: [B, q, H] before norm, logits: [B, q, draft_vocab], new_kv for the q entries).
        """
        emb = self.embed_tokens(input_ids).to(hidden.dtype)
        cos, sin = rope_cos_sin(position_ids.reshape(-1), self.cfg.dim_head, self.cfg.rope_theta, hidden.dtype)
        if position_ids.dim() == 2:  # per-row positions [B, q] -> [B, 1, q, d] (broadcast over heads)
            cos, sin = (t.view(*position_ids.shape, -1)[:, None] for t in (cos, sin))
        g, new_kv = self.midlayer(emb, hidden, cos, sin, past_kv, attn_mask)
        return g, self.lm_head(self.norm(g)), new_kv


# -- construction, loading, saving -------------------------------------------------------------

def _target_dims(target_model) -> tuple[int, int, int]:
    cfg = target_model.config
    return cfg.hidden_size, target_model.get_input_embeddings().weight.shape[0], cfg.num_hidden_layers


def random_head(target_model, draft_vocab_size: int | None = None, seed: int = 0,
                intermediate_size: int | None = None) -> Eagle3Head:
    """A randomly initialised head sized for `target_model` (for tests and pipeline smoke runs).

    With a smaller `draft_vocab_size` the draft vocabulary is the first ids (a test stand-in for the
    frequency-chosen vocabulary the trainer builds)."""
    H, vocab, n_layers = _target_dims(target_model)
    tcfg = target_model.config
    cfg = Eagle3Config(hidden_size=H, intermediate_size=intermediate_size or tcfg.intermediate_size,
                       num_attention_heads=tcfg.num_attention_heads,
                       num_key_value_heads=tcfg.num_key_value_heads, vocab_size=vocab,
                       draft_vocab_size=draft_vocab_size or vocab, rms_norm_eps=tcfg.rms_norm_eps,
                       max_position_embeddings=tcfg.max_position_embeddings,
                       head_dim=getattr(tcfg, "head_dim", None))
    gen = torch.Generator().manual_seed(seed)
    head = Eagle3Head(cfg, target_layer_ids(n_layers))
    with torch.no_grad():
        for name, prm in head.named_parameters():
            if name.endswith("norm.weight"):
                prm.fill_(1.0)
            elif prm.dim() == 2 and name != "embed_tokens.weight":
                prm.copy_(torch.randn(prm.shape, generator=gen) * 0.02)
        head.t2d.zero_()
        head.t2d[: cfg.draft_vocab_size] = True
    attach_target_embeddings(head, target_model)
    head.head_id = f"random(seed={seed})"
    p = next(target_model.parameters())
    return head.to(device=p.device, dtype=p.dtype).eval()


def attach_target_embeddings(head: Eagle3Head, target_model) -> None:
    """Share the target's input embeddings (frozen), as the official heads expect."""
    emb = target_model.get_input_embeddings().weight
    if emb.shape != head.embed_tokens.weight.shape:
        raise HeadMismatchError(
            f"head embedding {tuple(head.embed_tokens.weight.shape)} does not fit target embedding {tuple(emb.shape)}")
    head.embed_tokens.weight = nn.Parameter(emb.detach(), requires_grad=False)


def check_head_fits(cfg: Eagle3Config, target_model, has_embed: bool, fc_shape: tuple | None) -> None:
    """Raise a one-line HeadMismatchError if the head cannot draft for this target."""
    H_t, vocab_t, _ = _target_dims(target_model)
    if cfg.vocab_size != vocab_t:
        raise HeadMismatchError(f"head vocab_size {cfg.vocab_size} != target vocabulary {vocab_t}")
    if cfg.draft_vocab_size > cfg.vocab_size:
        raise HeadMismatchError(f"head draft_vocab_size {cfg.draft_vocab_size} > vocab_size {cfg.vocab_size}")
    if fc_shape is not None and fc_shape[1] != 3 * H_t:
        raise HeadMismatchError(
            f"head fc expects 3 x {fc_shape[1] // 3} target features but the target hidden size is {H_t}")
    if not has_embed and cfg.hidden_size != H_t:
        raise HeadMismatchError(
            f"head hidden_size {cfg.hidden_size} != target hidden_size {H_t} and the checkpoint has no embed_tokens")


def _read_state_dict(d: Path) -> dict[str, torch.Tensor]:
    st, bn = d / "model.safetensors", d / "pytorch_model.bin"
    try:
        if st.is_file():
            from safetensors.torch import load_file
            return load_file(str(st))
        if bn.is_file():
            return torch.load(str(bn), map_location="cpu", weights_only=True)
    except Exception as e:  # truncated / corrupt weights
        raise DraftGymError(f"cannot read head weights in {d}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    raise DraftGymError(f"head directory {d} has no model.safetensors or pytorch_model.bin")


def _normalise_keys(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accept the official names and the common variants (`model.` prefix, `layers.0.` for midlayer)."""
    out = {}
    for k, v in sd.items():
        k = k.removeprefix("model.")
        if k.startswith("layers.0."):
            k = "midlayer." + k[len("layers.0."):]
        out[k] = v
    return out


REQUIRED_KEYS = ("fc.weight", "norm.weight", "lm_head.weight", "midlayer.self_attn.q_proj.weight",
                 "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
                 "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
                 "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
                 "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
                 "midlayer.post_attention_layernorm.weight")


def resolve_head_dir(path_or_id: str) -> Path:
    """'default' -> the shipped head; a local dir -> itself; otherwise a hub id, downloaded once."""
    if path_or_id == "default":
        if not (DEFAULT_HEAD_DIR / "config.json").is_file():
            raise DraftGymError(f"the default head is not shipped in this checkout ({DEFAULT_HEAD_DIR})")
        return DEFAULT_HEAD_DIR
    p = Path(path_or_id).expanduser()
    if p.is_dir():
        return p
    if p.is_absolute() or path_or_id.startswith((".", "~")) or p.exists() or path_or_id.count("/") != 1:
        raise DraftGymError(f"EAGLE-3 head directory not found: {path_or_id}")
    try:  # a hub id such as 'yuhuili/EAGLE3-LLaMA3.1-Instruct-8B' (needs a network)
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(path_or_id, allow_patterns=["config.json", "*.safetensors", "*.bin"]))
    except Exception as e:
        raise DraftGymError(f"cannot fetch EAGLE-3 head {path_or_id!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


def load_head(path_or_id: str, target_model) -> Eagle3Head:
    """Load an EAGLE-3 head (official format) for `target_model`, checking that it fits."""
    d = resolve_head_dir(path_or_id)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise DraftGymError(f"head directory {d} has no config.json")
    try:
        cfg = Eagle3Config.from_json(json.loads(cfg_path.read_text()))
    except (json.JSONDecodeError, TypeError) as e:
        raise DraftGymError(f"corrupt head config {cfg_path}: {e}") from e
    sd = _normalise_keys(_read_state_dict(d))
    missing = [k for k in REQUIRED_KEYS if k not in sd]
    if missing:
        raise HeadMismatchError(f"head checkpoint {d} lacks {len(missing)} keys, e.g. {missing[0]}")
    has_embed = "embed_tokens.weight" in sd
    check_head_fits(cfg, target_model, has_embed, tuple(sd["fc.weight"].shape))
    if sd["fc.weight"].shape[1] != cfg.fused_size:  # config lacks target_hidden_size but fc says otherwise
        cfg.target_hidden_size = sd["fc.weight"].shape[1] // 3
    if sd["lm_head.weight"].shape[0] != cfg.draft_vocab_size:
        raise HeadMismatchError(
            f"head lm_head has {sd['lm_head.weight'].shape[0]} rows but draft_vocab_size is {cfg.draft_vocab_size}")
    head = Eagle3Head(cfg, target_layer_ids(_target_dims(target_model)[2]))
    sd.setdefault("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
    sd.setdefault("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
    sd["d2t"], sd["t2d"] = sd["d2t"].long(), sd["t2d"].bool()
    if cfg.draft_vocab_size != cfg.vocab_size and int((torch.arange(cfg.draft_vocab_size) + sd["d2t"]).max()) >= cfg.vocab_size:
        raise HeadMismatchError(f"head d2t maps draft ids past the target vocabulary ({cfg.vocab_size})")
    try:
        result = head.load_state_dict(sd, strict=False)
    except RuntimeError as e:  # a shape mismatch inside the layer
        raise HeadMismatchError(f"head {d} does not match its config.json: {str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else e}") from e
    del result  # non-strict: extra keys (optimizer state, etc.) are ignored
    if not has_embed:
        attach_target_embeddings(head, target_model)
    head.head_id = str(path_or_id)
    p = next(target_model.parameters())
    return head.to(device=p.device, dtype=p.dtype).eval()


def save_head(head: Eagle3Head, out_dir: str | Path, extra_config: dict | None = None) -> Path:
    """Write `config.json` + `model.safetensors` with the official key names (no embed_tokens
    unless the head's hidden size differs from the target's)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    if head.cfg.target_hidden_size in (None, head.cfg.hidden_size):
        sd.pop("embed_tokens.weight", None)
    if head.cfg.draft_vocab_size == head.cfg.vocab_size:
        sd.pop("d2t", None)
        sd.pop("t2d", None)
    cfg = head.cfg.to_json() | (extra_config or {})
    tmp = out / "model.safetensors.tmp"
    save_file(sd, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def num_params(module: nn.Module, trainable_only: bool = True) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if (p.requires_grad or not trainable_only)
               and not n.startswith("embed_tokens"))

