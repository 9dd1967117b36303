"""`draftgym generate --batch-size B`: decode a file of prompts with the batched engine.

    draftgym generate --batch-size 8 --prompts-file prompts.txt [--method ar|eagle3] [--chain K | --depth ...]

The prompts file is plain text, one prompt per line (blank lines skipped), or a dataset file that
pipeline/datasets.py reads (.jsonl / .jsonl.gz / .json / .parquet rows with `prompt` or `messages`).
All prompts go through pipeline/decode/engine/core.py at batch B with continuous batching (a
finished row's slot takes the next prompt), one shape every step: the EAGLE-3 tree (D, W, V), a
chain of K drafts (W = 1, V = K + 1) or, with --method ar, no drafts (AR at batch B).

Output: one JSON object per prompt on stdout, in prompt order,

    {"index", "prompt_id", "text", "output_ids", "new_tokens", "cycles", "tau", "stop_reason"}

(cycles: the steps the prompt took part in; tau = its emitted tokens / cycles), and one summary
object on stderr: prompts, new tokens, tokens/s = all new tokens / wall time of the whole call
(prefills included), B, the shape, steps, device and dtype. Prompt i samples (T > 0) with seed + i,
so its output equals `draftgym generate --prompt <it> --seed <seed + i>` (tests/pipeline/decode/test_generate_cli.py).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from pipeline.errors import DraftGymError


def read_prompts_file(path: str) -> list[tuple[str, object]]:
    """[(prompt_id, prompt)] of a prompts file (module docstring): a prompt is a string (a text
    line) or a tuple of chat messages (a dataset row)."""
    from pipeline.datasets import USER_SUFFIXES, load_prompts

    p = Path(path).expanduser()
    if not p.is_file():
        raise DraftGymError(f"prompts file not found: {path}")
    if p.name.endswith(USER_SUFFIXES):
        return [(r.prompt_id, r.messages) for r in load_prompts(str(p))]
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise DraftGymError(f"{path}: not UTF-8 text ({e.reason})") from None
    out = [(f"{p.stem}/{i}", line) for i, line in enumerate(lines) if line.strip()]
    if not out:
        raise DraftGymError(f"{path}: no prompts (one prompt per line)")
    return out


def batch_shape(cfg):
    """The one StepShape of every step: chain K (--chain), else the tree (D, W, V); off for --method ar."""
    from pipeline.decode.step_shape import StepShape

    if cfg.method == "ar":
        return StepShape.off()
    if cfg.chain is not None:
        return StepShape.chain(cfg.chain)
    try:
        return StepShape(cfg.depth, cfg.width, cfg.verify_size)
    except ValueError as e:
        raise DraftGymError(str(e)) from None


def row_json(row, prompt_id: str, tokenizer) -> dict:
    """One prompt's line of output."""
    return {"index": row.index, "prompt_id": prompt_id,
            "text": tokenizer.decode(row.output_ids, skip_special_tokens=True), "output_ids": row.output_ids,
            "new_tokens": row.new_tokens, "cycles": len(row.cycles), "tau": row.tau, "stop_reason": row.stop_reason}


def summary_json(res, shape, batch_size: int, device: str, dtype: str) -> dict:
    """The stderr summary: the whole call's throughput and what ran."""
    return {"summary": "draftgym generate", "method": res.method, "prompts": len(res), "new_tokens": res.new_tokens,
            "tokens_per_s": res.tokens_per_s, "wall_s": res.wall_s, "prefill_s": res.prefill_s,
            "batch_size": batch_size, "shape": shape.label(), "steps": len(res.steps),
            "max_active": max((s.batch_size for s in res.steps), default=0), "device": device, "dtype": dtype}


def run_batch_generate(cfg) -> int:
    """`draftgym generate --batch-size B` (cfg: pipeline.decode.generate.GenerateConfig)."""
    from pipeline.decode.engine.core import BatchEngine
    from pipeline.decode.controller import StaticController
    from pipeline.models.head import load_head_for, resolve_head_dir
    from pipeline.models.target import encode_prompt, load_target
    from pipeline.runtime.fingerprint import device_name, dtype_name

    if cfg.batch_size < 1:
        raise DraftGymError(f"--batch-size must be >= 1, got {cfg.batch_size}")
    shape = batch_shape(cfg)
    items = read_prompts_file(cfg.prompts_file) if cfg.prompts_file else [("prompt/0", cfg.prompt)]
    if cfg.method == "eagle3" and cfg.head != "random":
        resolve_head_dir(cfg.head)       # a wrong head path fails before the target loads
    target = load_target(cfg.model, device=cfg.device, dtype=cfg.dtype)
    prompts = [encode_prompt(target.tokenizer, p if isinstance(p, str) else list(p), chat_template=cfg.chat_template)
               for _, p in items]
    head = load_head_for(cfg.head, target.model, cfg.seed) if cfg.method == "eagle3" else None
    engine = BatchEngine(target.model, head, target.eos_token_ids)
    seeds = [cfg.seed + i for i in range(len(prompts))]
    torch.manual_seed(cfg.seed)
    if cfg.method == "ar":
        res = engine.generate_ar(prompts, cfg.max_new_tokens, cfg.temperature, seeds, batch_size=cfg.batch_size)
    else:
        res = engine.generate(prompts, cfg.max_new_tokens, cfg.temperature, seeds, batch_size=cfg.batch_size,
                              controller=StaticController(shape))
    for row, (pid, _) in zip(res, items):
        sys.stdout.write(json.dumps(row_json(row, pid, target.tokenizer)) + "\n")
    sys.stdout.flush()
    summary = summary_json(res, shape, cfg.batch_size, device_name(target.device, target.dtype),
                           dtype_name(target.dtype))
    sys.stderr.write(json.dumps(summary) + "\n")
    return 0
