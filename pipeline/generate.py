"""`draftgym generate`: decode one prompt with AR or EAGLE-3 and print the text (or one JSON object)."""
from __future__ import annotations

import json
import sys

import torch

from pipeline.controller import StaticController
from pipeline.engine import Engine
from pipeline.errors import DraftGymError
from pipeline.fingerprint import device_name, dtype_name
from pipeline.head import load_head, random_head, resolve_head_dir
from pipeline.target import encode_prompt, load_target


def load_head_for(spec: str, target_model, seed: int = 0):
    """'random' -> a random head (seeded); anything else -> load_head (dir, hub id or 'default')."""
    return random_head(target_model, seed=seed) if spec == "random" else load_head(spec, target_model)


def run_generate(args) -> int:
    if args.temperature < 0:
        raise DraftGymError(f"temperature must be >= 0, got {args.temperature}")
    if args.method == "eagle3" and args.head != "random":
        resolve_head_dir(args.head)  # fail on a wrong head path before spending seconds on the target
    target = load_target(args.model, device=args.device, dtype=args.dtype)
    prompt_ids = encode_prompt(target.tokenizer, args.prompt, chat_template=not args.no_chat_template)
    head = load_head_for(args.head, target.model, args.seed) if args.method == "eagle3" else None
    engine = Engine(target.model, head, target.eos_token_ids)
    torch.manual_seed(args.seed)
    if args.method == "ar":
        res = engine.generate_ar(prompt_ids, args.max_new_tokens, args.temperature, args.seed)
    else:
        ctrl = StaticController(args.depth, args.width, args.verify_size)
        res = engine.generate(prompt_ids, args.max_new_tokens, args.temperature, args.seed, controller=ctrl)
    text = target.tokenizer.decode(res.output_ids, skip_special_tokens=True)
    if args.json:
        obj = {"text": text, "output_ids": res.output_ids, **res.summary(), "device": device_name(target.device, target.dtype),
               "dtype": dtype_name(target.dtype),
               "model": args.model, "head": None if head is None else head.head_id,
               "config": {"depth": args.depth, "width": args.width, "verify_size": args.verify_size,
                          "temperature": args.temperature, "seed": args.seed, "max_new_tokens": args.max_new_tokens},
               "prompt_tokens": len(prompt_ids)}
        if args.method == "eagle3":
            obj["accepted_per_cycle"] = [c.accepted for c in res.cycles]
        json.dump(obj, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(text)
    return 0
