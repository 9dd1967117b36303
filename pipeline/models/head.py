"""EAGLE-3 draft heads on disk: loading, saving and fit checks (the architecture is in pipeline/models/head_model.py).

Formats read (`load_head`): a directory (or a hub id, fetched once) with `config.json` and
`model.safetensors` or `pytorch_model.bin`, as written by SafeAILab/EAGLE (architectures
`LlamaForCausalLM`), SpecForge and SGLang (`LlamaForCausalLMEagle3`) or vLLM (`Eagle3LlamaForCausalLM`).
- config: the Llama fields of `Eagle3Config`, `draft_vocab_size`, optional `target_hidden_size`,
  `rope_theta`, `rope_scaling` (or transformers 5's `rope_parameters`; linear, dynamic, llama3, yarn),
  `fc_norm`, `norm_output` (the engines' meaning: head_model.py) and DraftGym's `lm_head_norm`; a DraftGym
  head written before `draftgym_head_format` 2 is read in its old meaning, with one line on stderr.
- weights: `fc.weight`, `midlayer.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, hidden_norm,
  input_layernorm, post_attention_layernorm}.weight`, `norm.weight`, `lm_head.weight`, optional `d2t`,
  `t2d`, `embed_tokens.weight` and (with fc_norm) `fc_norm.{0,1,2}.weight`; a `model.` prefix and
  `layers.0.` for `midlayer.` are accepted. Any other key is an error, except the harmless ones in
  IGNORED_KEYS. Without `embed_tokens` the head uses the target's embedding tensor itself (no copy).
- dtype: the head computes in the target's dtype, except that an fp16 checkpoint beside a bf16/fp16
  target stays fp16 (no mantissa bits lost); `dtype=` overrides.

Format written (`save_head`): `config.json` with architectures `LlamaForCausalLMEagle3` (SpecForge refuses
`LlamaForCausalLM`), every config field above and `draftgym_head_format: 2`, and `model.safetensors` with the official key names,
always with `d2t` and `t2d` (SGLang reads them; identity mapping = zeros / all True), and with
`embed_tokens` only when the head has its own.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from pipeline.errors import DraftGymError, HeadMismatchError, first_line
from pipeline.runtime.atomic import atomic_write, atomic_write_text
from pipeline.runtime.fingerprint import dtype_name
from pipeline.models.head_model import (  # noqa: F401  (re-exported: callers import these from pipeline.models.head)
    HEAD_FORMAT, HEAD_FORMAT_KEY, ACCEPTED_ARCHITECTURES, ROPE_TYPES, WRITTEN_ARCHITECTURE, Eagle3Attention, Eagle3Config,
    Eagle3Head, Eagle3Layer, RMSNorm, Rope, apply_rope, causal_mask, rope_cos_sin, target_layer_ids)

DEFAULT_HEAD_DIR = Path(__file__).resolve().parents[2] / "data" / "heads" / "smollm2-135m"

REQUIRED_KEYS = ("fc.weight", "norm.weight", "lm_head.weight", "midlayer.self_attn.q_proj.weight",
                 "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
                 "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
                 "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
                 "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
                 "midlayer.post_attention_layernorm.weight")
FC_NORM_KEYS = ("fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight")

# Keys found in published checkpoints that carry nothing the head needs. They are dropped by name;
# any other key the head does not know is an error.
IGNORED_KEYS = (
    "midlayer.self_attn.rotary_emb.inv_freq",  # transformers < 4.31 saved RoPE's inv_freq buffer; it is
    "rotary_emb.inv_freq",                     # recomputed from rope_theta / rope_scaling, never loaded
)


# -- construction ------------------------------------------------------------------------------

def _target_dims(target_model) -> tuple[int, int, int]:
    cfg = target_model.config
    return cfg.hidden_size, target_model.get_input_embeddings().weight.shape[0], cfg.num_hidden_layers


def random_head(target_model, draft_vocab_size: int | None = None, seed: int = 0,
                intermediate_size: int | None = None, **config) -> Eagle3Head:
    """A randomly initialised head sized for `target_model` (for tests and pipeline smoke runs).

    With a smaller `draft_vocab_size` the draft vocabulary is the first ids (a test stand-in for the
    frequency-chosen vocabulary the trainer builds). `config`: further Eagle3Config fields
    (rope_theta, rope_scaling, fc_norm, norm_output)."""
    H, vocab, n_layers = _target_dims(target_model)
    tcfg = target_model.config
    cfg = Eagle3Config(hidden_size=H, intermediate_size=intermediate_size or tcfg.intermediate_size,
                       num_attention_heads=tcfg.num_attention_heads,
                       num_key_value_heads=tcfg.num_key_value_heads, vocab_size=vocab,
                       draft_vocab_size=draft_vocab_size or vocab, rms_norm_eps=tcfg.rms_norm_eps,
                       max_position_embeddings=tcfg.max_position_embeddings,
                       head_dim=getattr(tcfg, "head_dim", None), **config)
    gen = torch.Generator().manual_seed(seed)
    head = Eagle3Head(cfg, target_layer_ids(n_layers), share_embedding=True)
    with torch.no_grad():
        for name, prm in head.named_parameters():
            if name.endswith("norm.weight"):
                prm.fill_(1.0)
            elif prm.dim() == 2:
                prm.copy_(torch.randn(prm.shape, generator=gen) * 0.02)
        head.t2d.zero_()
        head.t2d[: cfg.draft_vocab_size] = True
    p = next(target_model.parameters())
    head = head.to(device=p.device, dtype=p.dtype)
    attach_target_embeddings(head, target_model)
    head.head_id = f"random(seed={seed})"
    return head.eval()


def attach_target_embeddings(head: Eagle3Head, target_model) -> None:
    """Share the target's input embeddings (frozen, the same tensor: no copy), as the official heads expect."""
    emb = target_model.get_input_embeddings().weight
    want = (head.cfg.vocab_size, head.cfg.hidden_size)
    if tuple(emb.shape) != want:
        raise HeadMismatchError(f"head embedding {want} does not fit target embedding {tuple(emb.shape)}")
    head.embed_tokens.weight = nn.Parameter(emb.detach(), requires_grad=False)
    head.shares_embedding = True


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


# -- reading -----------------------------------------------------------------------------------

def is_legacy_draftgym_head(d: Path, raw: dict) -> bool:
    """A head DraftGym trained (it has DraftGym's manifest.json) before `norm_output` took the engines'
    meaning (its config.json has no HEAD_FORMAT_KEY)."""
    return (d / "manifest.json").is_file() and HEAD_FORMAT_KEY not in raw


def _read_config(d: Path) -> Eagle3Config:
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise DraftGymError(f"head directory {d} has no config.json")
    try:
        raw = json.loads(cfg_path.read_text())
        if not isinstance(raw, dict):
            raise TypeError("not a JSON object")
        legacy = is_legacy_draftgym_head(d, raw)
        cfg = Eagle3Config.from_json(raw, legacy=legacy)
        if legacy:
            print(f"draftgym: note: head {d} was written by DraftGym before {HEAD_FORMAT_KEY} {HEAD_FORMAT}: "
                  f"its norm_output: {str(raw.get('norm_output', True)).lower()} is read as lm_head_norm "
                  f"(EAGLE-3 recurrence); `draftgym head-convert {d}` rewrites it for vLLM and SGLang",
                  file=sys.stderr)
        elif raw.get("norm_output") is True:
            print(f"draftgym: note: head {d} has norm_output: true, read as EAGLE-3.1 (the next draft step reads "
                  f"the post-norm state), as vLLM, SGLang and SpecForge since its PR #879 read it", file=sys.stderr)
        return cfg
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise DraftGymError(f"corrupt head config {cfg_path}: {first_line(e)}") from e
    except DraftGymError as e:  # an unusable field: say which file
        raise type(e)(f"{e} ({cfg_path})") from e


def _read_state_dict(d: Path) -> dict[str, torch.Tensor]:
    st, bn = d / "model.safetensors", d / "pytorch_model.bin"
    try:
        if st.is_file():
            from safetensors.torch import load_file
            return load_file(str(st))
        if bn.is_file():
            return torch.load(str(bn), map_location="cpu", weights_only=True)
    except Exception as e:  # truncated / corrupt weights
        raise DraftGymError(f"cannot read head weights in {d}: {first_line(e)}") from e
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
        raise DraftGymError(f"cannot fetch EAGLE-3 head {path_or_id!r}: {first_line(e)}") from e


def head_dtype(checkpoint_dtype: torch.dtype, target_dtype: torch.dtype, dtype=None) -> torch.dtype:
    """The head's compute dtype: `dtype` if given; else the target's, except that fp16 weights beside a
    reduced-precision target stay fp16 (fp16 -> bf16 would drop 3 mantissa bits for nothing)."""
    if dtype is not None:
        if isinstance(dtype, str):
            dt = getattr(torch, dtype.removeprefix("torch."), None)
            if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
                raise DraftGymError(f"unknown head dtype {dtype!r} (use float32, bfloat16 or float16)")
            return dt
        return dtype
    if checkpoint_dtype == torch.float16 and target_dtype in (torch.bfloat16, torch.float16):
        return torch.float16
    return target_dtype


def load_head(path_or_id: str, target_model, dtype: torch.dtype | str | None = None) -> Eagle3Head:
    """Load an EAGLE-3 head (any format in the module docstring) for `target_model`, checking that it fits.

    The head is built on the meta device and takes the checkpoint's tensors as its parameters, so
    nothing is randomly initialised and no [vocab, H] embedding is made unless the checkpoint has one."""
    d = resolve_head_dir(path_or_id)
    cfg = _read_config(d)
    sd = {k: v for k, v in _normalise_keys(_read_state_dict(d)).items() if k not in IGNORED_KEYS}
    required = REQUIRED_KEYS + (FC_NORM_KEYS if cfg.fc_norm else ())
    missing = [k for k in required if k not in sd]
    if missing:
        raise HeadMismatchError(f"head checkpoint {d} lacks {len(missing)} keys, e.g. {missing[0]}")
    has_embed = "embed_tokens.weight" in sd
    check_head_fits(cfg, target_model, has_embed, tuple(sd["fc.weight"].shape))
    if sd["fc.weight"].shape[1] != cfg.fused_size:  # config lacks target_hidden_size but fc says otherwise
        cfg.target_hidden_size = sd["fc.weight"].shape[1] // 3
    if sd["lm_head.weight"].shape[0] != cfg.draft_vocab_size:
        raise HeadMismatchError(
            f"head lm_head has {sd['lm_head.weight'].shape[0]} rows but draft_vocab_size is {cfg.draft_vocab_size}")
    with torch.device("meta"):
        head = Eagle3Head(cfg, target_layer_ids(_target_dims(target_model)[2]), share_embedding=not has_embed)
    known = head.state_dict().keys()
    unknown = sorted(k for k in sd if k not in known)
    if unknown:
        raise HeadMismatchError(f"head checkpoint {d} has an unknown weight {unknown[0]!r} "
                                f"(not an EAGLE-3 head key for this config.json)")
    sd.setdefault("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
    sd.setdefault("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
    sd["d2t"], sd["t2d"] = sd["d2t"].long(), sd["t2d"].bool()
    if sd["d2t"].shape == (cfg.draft_vocab_size,):
        tids = torch.arange(cfg.draft_vocab_size) + sd["d2t"]
        if int(tids.min()) < 0 or int(tids.max()) >= cfg.vocab_size:
            raise HeadMismatchError(f"head d2t maps draft ids outside the target vocabulary ({cfg.vocab_size})")
    ckpt_dtype = sd["fc.weight"].dtype
    try:
        head.load_state_dict(sd, strict=False, assign=True)  # the checkpoint's tensors become the parameters
    except RuntimeError as e:  # a shape mismatch inside the layer
        lines = str(e).splitlines()
        why = lines[1].strip() if len(lines) > 1 else first_line(e)
        raise HeadMismatchError(f"head {d} does not match its config.json: {why}") from e
    left = [n for n, t in [*head.named_parameters(), *head.named_buffers()] if t.is_meta]
    if left:  # cannot happen with the checks above; never hand out a half-built head
        raise HeadMismatchError(f"head checkpoint {d} lacks {left[0]!r}")
    p = next(target_model.parameters())
    head = head.to(device=p.device, dtype=head_dtype(ckpt_dtype, p.dtype, dtype))
    if not has_embed:
        attach_target_embeddings(head, target_model)  # after .to(): the target's tensor, whatever the head dtype
    head.head_id = str(path_or_id)
    return head.eval()


def load_head_for(spec: str, target_model, seed: int = 0) -> Eagle3Head:
    """A `--head` spec: 'random' -> a random head (seeded); anything else -> `load_head` (a directory,
    a hub id or 'default')."""
    return random_head(target_model, seed=seed) if spec == "random" else load_head(spec, target_model)


# -- writing -----------------------------------------------------------------------------------

def save_head(head: Eagle3Head, out_dir: str | Path, extra_config: dict | None = None) -> Path:
    """Write `config.json` + `model.safetensors` in the format of the module docstring."""
    from safetensors.torch import save

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    if getattr(head, "shares_embedding", head.cfg.target_hidden_size in (None, head.cfg.hidden_size)):
        sd.pop("embed_tokens.weight", None)   # the target's; loading attaches it again
    cfg = head.cfg.to_json() | {"torch_dtype": dtype_name(head.fc.weight.dtype)} | (extra_config or {})
    data = save(sd, metadata={"format": "pt"})
    atomic_write(out / "model.safetensors", lambda f: f.write(data))
    atomic_write_text(out / "config.json", json.dumps(cfg, indent=2) + "\n")
    return out


def num_params(module: nn.Module, trainable_only: bool = True) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if (p.requires_grad or not trainable_only)
               and not n.startswith("embed_tokens"))


# -- head-convert -------------------------------------------------------------------------------

@dataclass
class HeadConvertConfig:
    """`draftgym head-convert HEAD`: rewrite a head's config.json so every engine reads it as it was trained."""
    head: str = ""                        # a head directory (required)
    dry_run: bool = False                 # print the new config.json; write nothing


def converted_config(d: Path) -> tuple[dict, dict]:
    """(config.json as it is, as `save_head` would write it now). The weights are not read or touched."""
    cfg = _read_config(d)                 # a missing or corrupt config.json is its one-line error
    raw = json.loads((d / "config.json").read_text())
    new = {k: v for k, v in raw.items() if k not in ("norm_output", "lm_head_norm")} | cfg.to_json()
    return raw, new | {"torch_dtype": raw.get("torch_dtype", cfg.torch_dtype)}


def run_head_convert_command(cfg: HeadConvertConfig) -> int:
    d = resolve_head_dir(cfg.head)
    old, new = converted_config(d)
    if not new.get("lm_head_norm", True):
        print(f"draftgym: note: {d}: lm_head reads the un-normed state (lm_head_norm: false); no engine "
              f"(vLLM, SGLang) can run this head as trained, only DraftGym", file=sys.stderr)
    if cfg.dry_run:
        print(json.dumps(new, indent=2))
        return 0
    if old == new:
        print(f"{d}/config.json is already {HEAD_FORMAT_KEY} {HEAD_FORMAT}; nothing to do")
        return 0
    atomic_write_text(d / "config.json", json.dumps(new, indent=2) + "\n")
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    print(f"rewrote {d}/config.json ({', '.join(changed)}); weights unchanged")
    return 0
