"""`draftgym generate`: decode one prompt with AR or EAGLE-3 and print the text (or one JSON object);
with --batch-size, a file of prompts with the batched engine (pipeline/decode/generate_file.py)."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace

import torch

from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.errors import DraftGymError
from pipeline.runtime.fingerprint import device_name, dtype_name
from pipeline.models.head import load_head_for, resolve_head_dir
from pipeline.models.target import encode_prompt, load_target


@dataclass
class GenerateConfig:
    """`draftgym generate`: decode one prompt with AR or EAGLE-3 and print the text; with `batch_size`,
    decode a prompts file with the batched engine (pipeline/decode/generate_file.py)."""

    prompt: str = ""                  # the user message (the chat template is applied unless chat_template=False)
    prompts_file: str | None = None   # with batch_size: a text file (one prompt per line) or a JSONL/JSON/Parquet
                                      # file of `prompt` / `messages` rows (pipeline/datasets.py)
    batch_size: int | None = None     # None: one prompt with the batch-1 engine; B: BatchEngine at batch B
    model: str = "smollm2-135m"       # target: 'smollm2-135m' (embedded), a HF model directory or a hub id
    head: str | None = None           # EAGLE-3 head: 'default' (the shipped one), 'random', a directory or a hub id;
                                      # None: 'default' on the embedded target (the head it ships with), else 'random'
    method: str = "eagle3"            # 'ar': plain autoregressive decoding; 'eagle3': speculative decoding
    depth: int = 8                    # D: draft forwards per cycle
    width: int = 10                   # W: EAGLE top_k
    verify_size: int = 60             # V: tokens verified per cycle, root included
    chain: int | None = None          # K: a chain of K drafts (D = K, W = 1, V = K + 1) instead of depth/width/verify_size
    temperature: float = 0.0          # 0 = greedy; > 0 samples (EAGLE's lossless q = 1 rule)
    seed: int = 0                     # sampling seed (and a random head's seed)
    max_new_tokens: int = 128         # tokens to generate after the prompt
    device: str | None = None         # None: cuda if present, else cpu
    dtype: str | None = None          # None: the device's default (pipeline.models.target.resolve_dtype_name)
    chat_template: bool = True        # False: feed the prompt text as-is
    as_json: bool = False             # print one JSON object instead of the text


def run_generate_command(cfg: GenerateConfig) -> int:
    if cfg.head is None:
        from pipeline.models.target import EMBEDDED_DEFAULT
        cfg = replace(cfg, head="default" if cfg.model == EMBEDDED_DEFAULT else "random")
    if cfg.temperature < 0:
        raise DraftGymError(f"temperature must be >= 0, got {cfg.temperature}")
    if cfg.chain is not None and cfg.chain < 1:
        raise DraftGymError(f"--chain must be >= 1 (use --method ar for no drafts), got {cfg.chain}")
    if cfg.prompts_file and cfg.batch_size is None:
        raise DraftGymError("--prompts-file needs --batch-size (--batch-size 1 decodes the prompts one at a time)")
    if bool(cfg.prompt) == bool(cfg.prompts_file):
        raise DraftGymError("give one of --prompt and --prompts-file")
    if cfg.batch_size is not None:
        from pipeline.decode.generate_file import run_batch_generate

        return run_batch_generate(cfg)
    if cfg.chain is not None:
        cfg = replace(cfg, depth=cfg.chain, width=1, verify_size=cfg.chain + 1)
    if cfg.method == "eagle3" and cfg.head != "random":
        resolve_head_dir(cfg.head)  # fail on a wrong head path before spending seconds on the target
    target = load_target(cfg.model, device=cfg.device, dtype=cfg.dtype)
    prompt_ids = encode_prompt(target.tokenizer, cfg.prompt, chat_template=cfg.chat_template)
    head = load_head_for(cfg.head, target.model, cfg.seed) if cfg.method == "eagle3" else None
    engine = Engine(target.model, head, target.eos_token_ids)
    torch.manual_seed(cfg.seed)
    if cfg.method == "ar":
        res = engine.generate_ar(prompt_ids, cfg.max_new_tokens, cfg.temperature, cfg.seed)
    else:
        ctrl = StaticController(cfg.depth, cfg.width, cfg.verify_size)
        res = engine.generate(prompt_ids, cfg.max_new_tokens, cfg.temperature, cfg.seed, controller=ctrl)
    text = target.tokenizer.decode(res.output_ids, skip_special_tokens=True)
    if cfg.as_json:
        obj = {"text": text, "output_ids": res.output_ids, **res.summary(), "device": device_name(target.device, target.dtype),
               "dtype": dtype_name(target.dtype),
               "model": cfg.model, "head": None if head is None else head.head_id,
               "config": {"depth": cfg.depth, "width": cfg.width, "verify_size": cfg.verify_size,
                          "temperature": cfg.temperature, "seed": cfg.seed, "max_new_tokens": cfg.max_new_tokens},
               "prompt_tokens": len(prompt_ids)}
        if cfg.method == "eagle3":
            obj["accepted_per_cycle"] = [c.accepted for c in res.cycles]
        json.dump(obj, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(text)
    return 0
