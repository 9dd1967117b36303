"""`draftgym` subcommands that live in pipeline/ (generation, datasets, head training, collection).

Each `add_*` function registers one subcommand on the argparse subparsers object; `online.cli.main`
collects them. Heavy imports (torch, transformers) happen inside the handlers so `draftgym --help`
stays fast.
"""
from __future__ import annotations

import argparse

from pipeline.cliargs import add_device_dtype, add_model_head, add_no_progress


def register(sub: argparse._SubParsersAction) -> None:
    from pipeline.collect_job import add_collect
    from pipeline.head_lineage import add_head_report
    from pipeline.profile import add_profile
    from pipeline.query import add_query

    for add in (add_generate, add_datasets, add_train_draft, add_head_report, add_collect, add_profile, add_query):
        add(sub)


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="decode one prompt with AR or EAGLE-3 and print the text")
    add_model_head(p, "random")
    p.add_argument("--prompt", required=True, help="user message (chat template applied)")
    p.add_argument("--method", choices=["ar", "eagle3"], default="eagle3", help="ar: plain autoregressive decoding; eagle3: speculative decoding with the head")
    p.add_argument("--depth", type=int, default=8, help="D: draft forwards per cycle")
    p.add_argument("--width", type=int, default=10, help="W: EAGLE top_k")
    p.add_argument("--verify-size", type=int, default=60, help="V: tokens verified per cycle, root included")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 samples (EAGLE's lossless q = 1 rule)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (and a random head's seed)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate after the prompt")
    add_device_dtype(p)
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt text as-is")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    p.set_defaults(func=_run_generate)


def _run_generate(args: argparse.Namespace) -> int:
    from pipeline.generate import run_generate

    return run_generate(args)


def add_datasets(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("datasets", help="list the built-in prompt datasets and their sizes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run_datasets)


def _run_datasets(args: argparse.Namespace) -> int:
    from pipeline.datasets import run_datasets_command

    return run_datasets_command(args)


def add_train_draft(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-draft", help="train an EAGLE-3 draft head (self-distillation + training-time test)")
    p.add_argument("--model", default="smollm2-135m", help="'smollm2-135m', a HF model dir or a hub id")
    p.add_argument("--dataset", default="sharegpt",
                   help="comma list of train-split datasets, each NAME or NAME:COUNT (e.g. sharegpt,gsm8k:300)")
    p.add_argument("--n-prompts", type=int, default=None, help="prompts in total, shared evenly (default 2000)")
    p.add_argument("--out", required=True, help="head directory: config.json, model.safetensors, manifest.json")
    p.add_argument("--data", default=None,
                   help="train on a frozen dataset (the dataset-*.parquet an earlier run wrote into its work dir, "
                        "or a committed copy) instead of selecting and regenerating prompts")
    p.add_argument("--work-dir", default=None, help="caches and checkpoints (default $DRAFTGYM_CACHE/train-draft/<model>)")
    p.add_argument("--draft-vocab-size", type=int, default=None, help="default 8192")
    p.add_argument("--intermediate-size", type=int, default=None, help="head MLP width (default: the target's)")
    p.add_argument("--ttt-steps", type=int, default=None, help="training-time-test steps (default 7)")
    p.add_argument("--max-len", type=int, default=None, help="tokens per training sequence (default 512)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="regenerated answer length (default 256)")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="skip longer prompts (default 256)")
    p.add_argument("--gen-batch-size", type=int, default=None, help="rows decoded together in self-distillation (default 64; on the 2-core AMX Xeon in bf16, "
                        "64 rows gave 175 tokens/s and 128 rows 108)")
    p.add_argument("--regen-budget-min", type=float, default=None,
                   help="stop regenerating answers after this long and train on those done (resumable)")
    p.add_argument("--reference-prompts", type=int, default=None,
                   help="extra train prompts trained with the dataset's reference answer as text (default 0)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: --epochs passes)")
    p.add_argument("--epochs", type=float, default=None, help="passes over the data (default 1; unlimited with a budget)")
    p.add_argument("--time-budget-min", type=float, default=None,
                   help="the run's total training time over all sessions: the lr schedule decays over it, and "
                        "training stops (checkpoint + head) when it is spent")
    p.add_argument("--session-budget-min", type=float, default=None,
                   help="stop (checkpoint + head) after this much training in this session, without changing the "
                        "schedule; continue later with --resume")
    p.add_argument("--batch-size", type=int, default=None, help="max sequences per batch (default 16)")
    p.add_argument("--batch-tokens", type=int, default=None, help="max padded tokens per batch (default 4096)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 5e-4)")
    p.add_argument("--warmup-steps", type=int, default=None, help="default 50")
    p.add_argument("--amp", choices=["auto", "bf16", "none"], default=None, help="bf16 autocast (default auto)")
    p.add_argument("--no-feature-cache", action="store_true", help="recompute target features every epoch")
    p.add_argument("--init", choices=["passthrough", "target", "random"], default=None,
                   help="head initialisation (default passthrough: lm_head and norm from the target, fc passing the "
                        "highest fused layer through, attention and MLP outputs zero; see train_draft.build_head)")
    p.add_argument("--no-init-from-target", action="store_true", help="the same as --init random")
    p.add_argument("--init-from", default=None,
                   help="warm start from a saved head directory (its weights and draft vocabulary; a fresh optimizer "
                        "and schedule), e.g. the committed head of an earlier session whose checkpoint is gone")
    p.add_argument("--ttt-curriculum", default=None,
                   help="TTT steps by schedule progress, e.g. 4@0,7@0.5 (4 steps, then 7 from half-way); "
                        "default: --ttt-steps throughout")
    p.add_argument("--heldout-prompts", type=int, default=None,
                   help="val-split prompts answered by the target (on-policy), the fixed held-out set whose accuracy "
                        "curve the manifest records (default 64; 0 = none)")
    p.add_argument("--eval-every", type=int, default=None, help="steps between held-out evaluations (default 100)")
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps between checkpoints (default 500)")
    p.add_argument("--seed", type=int, default=None, help="seed of the head's initialisation and the data order (default 0)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if present)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="the target's dtype for the training features (default float32; the generation copy "
                        "that writes the answers is bfloat16)")
    p.add_argument("--resume", action="store_true",
                   help="continue the last checkpoint of this --out (refused, in one line, if the data or a "
                        "setting changed)")
    p.add_argument("--restart", action="store_true", help="start over although a checkpoint of this --out exists")
    add_no_progress(p)
    p.set_defaults(func=_run_train_draft)


def _run_train_draft(args: argparse.Namespace) -> int:
    from pipeline.train_draft import run_train_draft_command

    return run_train_draft_command(args)
