"""`draftgym` subcommands that live in pipeline/ (generation, datasets, head training, collection).

Each `add_*` function registers one subcommand on the argparse subparsers object; `online.cli.main`
collects them. Heavy imports (torch, transformers) happen inside the handlers so `draftgym --help`
stays fast.
"""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    for add in (add_generate, add_datasets):
        add(sub)


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="decode one prompt with AR or EAGLE-3 and print the text")
    p.add_argument("--model", default="smollm2-135m", help="'smollm2-135m', a HF model dir or a hub id")
    p.add_argument("--head", default="random", help="EAGLE-3 head: a dir, a hub id, 'default' or 'random'")
    p.add_argument("--prompt", required=True, help="user message (chat template applied)")
    p.add_argument("--method", choices=["ar", "eagle3"], default="eagle3")
    p.add_argument("--depth", type=int, default=8, help="D: draft forwards per cycle")
    p.add_argument("--width", type=int, default=10, help="W: EAGLE top_k")
    p.add_argument("--verify-size", type=int, default=60, help="V: tokens verified per cycle, root included")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt text as-is")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    p.set_defaults(func=_run_generate)


def _run_generate(args: argparse.Namespace) -> int:
    from pipeline.generate import run_generate

    return run_generate(args)


def add_datasets(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("datasets", help="list the built-in prompt datasets and their sizes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run_datasets)


def _run_datasets(args: argparse.Namespace) -> int:
    from pipeline.datasets import run_datasets_command

    return run_datasets_command(args)
