"""`draftgym` subcommands that live in pipeline/: generate, datasets, train-draft, head-report, collect,
head-convert, profile, query, compact-logs.

The one home of these commands' flags. Each command is a documented Config dataclass plus a
`run_<command>_command(cfg)` in its library module; here each subparser declares the flags (dest =
the Config field's name) and the function that builds the Config (`config_from_args`). Registered
by `online.cli.build_parser`. Nothing heavy is imported until a command runs, so `draftgym --help`
stays fast.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from pipeline.cliargs import (COUNT, DTYPES, NON_NEGATIVE, NON_NEGATIVE_FLOAT, POSITIVE_FLOAT, add_device_dtype,
                              add_json, add_model_head, add_no_progress, add_split, comma_list, config_from_args,
                              given, parse_positive_ints, set_command)


def register(sub: argparse._SubParsersAction) -> None:
    for add in (add_generate, add_datasets, add_train_draft, add_head_report, add_head_convert, add_collect,
                add_profile, add_query, add_compact_logs):
        add(sub)


# ------------------------------------------------------------------------------------ generate, datasets

def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="decode one prompt with AR or EAGLE-3 and print the text (with --batch-size: "
                                        "a prompts file at batch B, one JSON line per prompt)")
    add_model_head(p, head_default="'default', the shipped head, on the embedded target; 'random' on any other")
    p.add_argument("--prompt", default=None, help="user message (chat template applied) (default: none; give it or "
                                                  "--prompts-file)")
    p.add_argument("--prompts-file", default=None,
                   help="with --batch-size: a text file, one prompt per line, or a JSONL/JSON/Parquet file of "
                        "'prompt' or 'messages' rows (default: none)")
    p.add_argument("--batch-size", type=COUNT, default=None,
                   help="decode with the batched engine at batch B (continuous batching): one JSON line per prompt "
                        "on stdout, a summary line (tokens/s, B, shape) on stderr; prompt i samples with seed + i "
                        "(default: none: one prompt, the batch-1 engine)")
    p.add_argument("--method", choices=["ar", "eagle3"],
                   help="ar: plain autoregressive decoding; eagle3: speculative decoding with the head")
    p.add_argument("--depth", type=COUNT, help="D: draft forwards per cycle")
    p.add_argument("--width", type=COUNT, help="W: EAGLE top_k")
    p.add_argument("--verify-size", type=COUNT, help="V: tokens verified per cycle, root included")
    p.add_argument("--chain", type=COUNT, default=None,
                   help="K: a chain of K drafts (D = K, W = 1, V = K + 1) instead of --depth/--width/--verify-size "
                        "(default: none: the tree)")
    p.add_argument("--temperature", type=NON_NEGATIVE_FLOAT, help="0 = greedy; > 0 samples (EAGLE's lossless q = 1 rule)")
    p.add_argument("--seed", type=NON_NEGATIVE, help="sampling seed (and a random head's seed)")
    p.add_argument("--max-new-tokens", type=COUNT, help="tokens to generate after the prompt")
    add_device_dtype(p)
    p.add_argument("--no-chat-template", dest="chat_template", action="store_false", help="feed the prompt text as-is")
    add_json(p, "print one JSON object instead of the text")
    set_command(p, _generate_config, "pipeline.decode.generate:run_generate_command",
                "pipeline.decode.generate:GenerateConfig")


def _generate_config(args):
    from pipeline.decode.generate import GenerateConfig

    return config_from_args(GenerateConfig, args)


def add_datasets(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("datasets", help="list the built-in prompt datasets and their sizes")
    add_json(p)
    set_command(p, _datasets_config, "pipeline.datasets:run_datasets_command", "pipeline.datasets:DatasetsConfig")


def _datasets_config(args):
    from pipeline.datasets import DatasetsConfig

    return config_from_args(DatasetsConfig, args)


# ------------------------------------------------------------------------------------ train-draft, head-report

def add_train_draft(sub: argparse._SubParsersAction) -> None:
    """The flags of pipeline.train_head.config.TrainConfig (one per field); a flag left at None keeps
    TrainConfig's default, which its help states."""
    p = sub.add_parser("train-draft", help="train an EAGLE-3 draft head (self-distillation + training-time test)")
    p.add_argument("--model", help="'smollm2-135m', a HF model dir or a hub id")
    p.add_argument("--dataset", dest="datasets", metavar="DATASET", type=comma_list,
                   help="comma list of train-split datasets, each NAME or NAME:COUNT (e.g. sharegpt,gsm8k:300)")
    p.add_argument("--n-prompts", type=COUNT, default=None, help="prompts in total, shared evenly")
    p.add_argument("--out", required=True, help="head directory: config.json, model.safetensors, manifest.json")
    p.add_argument("--data", default=None,
                   help="train on a frozen dataset (the dataset-*.parquet an earlier run wrote into its work dir, "
                        "or a committed copy) instead of selecting and regenerating prompts (default: select "
                        "and regenerate)")
    p.add_argument("--work-dir", default=None, help="caches and checkpoints (default $DRAFTGYM_CACHE/train-draft/<model>)")
    p.add_argument("--draft-vocab-size", type=COUNT, default=None, help="draft vocabulary size")
    p.add_argument("--intermediate-size", type=COUNT, default=None, help="head MLP width (default: the target's)")
    p.add_argument("--ttt-steps", type=COUNT, default=None, help="training-time-test steps")
    p.add_argument("--max-len", type=COUNT, default=None, help="tokens per training sequence")
    p.add_argument("--max-new-tokens", type=COUNT, default=None, help="regenerated answer length")
    p.add_argument("--max-prompt-tokens", type=COUNT, default=None, help="skip longer prompts")
    p.add_argument("--gen-batch-size", type=COUNT, default=None,
                   help="rows decoded together in self-distillation (on the 2-core AMX Xeon in bf16, "
                        "64 rows gave 175 tokens/s and 128 rows 108)")
    p.add_argument("--regen-budget-min", type=POSITIVE_FLOAT, default=None,
                   help="stop regenerating answers after this long and train on those done (resumable) "
                        "(default: no limit)")
    p.add_argument("--reference-prompts", type=NON_NEGATIVE, default=None,
                   help="extra train prompts trained with the dataset's reference answer as text")
    p.add_argument("--steps", type=COUNT, default=None, help="optimizer steps (default: --epochs passes)")
    p.add_argument("--epochs", type=POSITIVE_FLOAT, default=None, help="passes over the data (default 1; unlimited with a budget)")
    p.add_argument("--time-budget-min", type=POSITIVE_FLOAT, default=None,
                   help="the run's total training time over all sessions: the lr schedule decays over it, and "
                        "training stops (checkpoint + head) when it is spent (default: none)")
    p.add_argument("--session-budget-min", type=POSITIVE_FLOAT, default=None,
                   help="stop (checkpoint + head) after this much training in this session, without changing the "
                        "schedule; continue later with --resume (default: none)")
    p.add_argument("--batch-size", type=COUNT, default=None, help="max sequences per batch")
    p.add_argument("--batch-tokens", type=COUNT, default=None, help="max padded tokens per batch")
    p.add_argument("--lr", type=POSITIVE_FLOAT, default=None, help="peak learning rate")
    p.add_argument("--warmup-steps", type=NON_NEGATIVE, default=None, help="linear warm-up steps")
    p.add_argument("--amp", choices=["auto", "bf16", "none"], default=None, help="bf16 autocast")
    p.add_argument("--no-feature-cache", dest="feature_cache", action="store_false",
                   help="recompute target features every epoch")
    p.add_argument("--init", choices=["passthrough", "target", "random"], default=None,
                   help="head initialisation (passthrough: lm_head and norm from the target, fc passing the "
                        "highest fused layer through, attention and MLP outputs zero; see "
                        "pipeline.train_head.initialise.build_head)")
    p.add_argument("--no-init-from-target", dest="init", action="store_const", const="random",
                   help="the same as --init random")
    p.add_argument("--init-from", default=None,
                   help="warm start from a saved head directory (its weights and draft vocabulary; a fresh optimizer "
                        "and schedule), e.g. the committed head of an earlier session whose checkpoint is gone "
                        "(default: none)")
    p.add_argument("--ttt-curriculum", type=comma_list, default=None,
                   help="TTT steps by schedule progress, e.g. 4@0,7@0.5 (4 steps, then 7 from half-way); "
                        "default: --ttt-steps throughout")
    p.add_argument("--heldout-prompts", type=NON_NEGATIVE, default=None,
                   help="val-split prompts answered by the target (on-policy), the fixed held-out set whose accuracy "
                        "curve the manifest records (0 = none)")
    p.add_argument("--eval-every", type=NON_NEGATIVE, default=None, help="steps between held-out evaluations")
    p.add_argument("--checkpoint-every", type=NON_NEGATIVE, default=None, help="steps between checkpoints")
    p.add_argument("--seed", type=NON_NEGATIVE, default=None, help="seed of the head's initialisation and the data order")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if present)")
    p.add_argument("--dtype", default=None, choices=list(DTYPES),
                   help="the target's dtype for the training features (the generation copy "
                        "that writes the answers is bfloat16)")
    p.add_argument("--resume", action="store_true",
                   help="continue the last checkpoint of this --out (refused, in one line, if the data or a "
                        "setting changed)")
    p.add_argument("--restart", action="store_true", help="start over although a checkpoint of this --out exists")
    add_no_progress(p)
    set_command(p, _train_draft_config, "pipeline.train_head.train:run_train_draft_command",
                "pipeline.train_head.config:TrainConfig")


def _train_draft_config(args):
    from pipeline.train_head.config import TrainConfig

    return config_from_args(TrainConfig, args)


def add_head_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("head-report", help="a trained head's held-out accuracy over all runs of its lineage (table + PNG)")
    p.add_argument("--head", help="'default' (the shipped head) or a head directory")
    p.add_argument("--out", default=None,
                   help="PNG path (default: data/reports/head-report/<head directory name>.png; never the head's "
                        "own directory)")
    set_command(p, _head_report_config, "pipeline.train_head.lineage:run_head_report_command",
                "pipeline.train_head.lineage:HeadReportConfig")


def _head_report_config(args):
    from pipeline.train_head.lineage import HeadReportConfig

    return config_from_args(HeadReportConfig, args)


def add_head_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("head-convert", help="rewrite a head's config.json so vLLM, SGLang and DraftGym read it as "
                                            "it was trained (norm_output in the engines' meaning; weights untouched)")
    p.add_argument("head", help="a head directory")
    p.add_argument("--dry-run", action="store_true", help="print the new config.json; write nothing")
    set_command(p, lambda args: config_from_args(__import__("pipeline.models.head", fromlist=["x"]).HeadConvertConfig,
                                                 args),
                "pipeline.models.head:run_head_convert_command", "pipeline.models.head:HeadConvertConfig")


# ------------------------------------------------------------------------------------ collect, profile, query

def add_collect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("collect", help="log per-position draft trees and acceptance tables (Ray job)")
    add_model_head(p)
    p.add_argument("--dataset", help="a built-in prompt set (see `draftgym datasets`) or a JSON/JSONL/Parquet file (its empty or "
                        "over-long prompts are skipped and listed; the rest are collected)")
    add_split(p)
    p.add_argument("--n-prompts", type=COUNT, help="first N prompts of the split")
    p.add_argument("--max-new-tokens", type=COUNT, help="logged continuation length per prompt (episode length)")
    p.add_argument("--temperature", type=NON_NEGATIVE_FLOAT,
                   help="0 = greedy continuation; > 0 samples it (and logs acceptance distributions)")
    p.add_argument("--seed", type=NON_NEGATIVE, help="sampling seed (T > 0) and random-head seed")
    p.add_argument("--widths", help="comma-separated W values")
    p.add_argument("--max-depth", type=COUNT, help="deepest tree logged (Dmax): acceptance tables cover D = 1..Dmax")
    p.add_argument("--position-batch", type=COUNT,
                   help="roots expanded together in one batched draft forward (x the width = rows per head matmul); "
                        "larger uses more memory at long contexts")
    p.add_argument("--dist-every", type=NON_NEGATIVE,
                   help="T > 0: log acceptance-length distributions at every k-th position (0 = never; each costs a "
                        "verify forward)")
    p.add_argument("--dist-verify-size", type=COUNT, help="T > 0: V of the tree whose acceptance-length distribution is logged")
    p.add_argument("--num-actors", type=COUNT, default=None,
                   help="Ray actors, one model copy each (default: from the cluster's resources: one per GPU "
                        "(per --num-gpus GPUs) on a GPU cluster, one per node (all its CPUs, or one per "
                        "--cpus-per-actor CPUs) on a CPU cluster; at least 1, at most one per prompt)")
    p.add_argument("--num-gpus", type=NON_NEGATIVE_FLOAT, default=None,
                   help="GPUs per actor (default: 1 if any node of the Ray cluster has a GPU, else 0; read from "
                        "the cluster, not from this machine)")
    p.add_argument("--cpus-per-actor", type=POSITIVE_FLOAT, default=None,
                   help="CPUs per actor (default: 1 with GPUs; on a CPU cluster the largest node's CPUs, or the "
                        "cluster's CPUs shared among --num-actors)")
    p.add_argument("--retry-failed", action="store_true",
                   help="collect again the prompts recorded in the failures table by an earlier run of the same "
                        "command (without it they are skipped and listed); a success deletes their failures row")
    p.add_argument("--prompt-batch", type=COUNT,
                   help="prompts one actor takes at a time: sorted by length, their continuations are generated "
                        "together (batches of <= GEN_TOKENS slot tokens, pipeline.collect.actor; cached on the "
                        "actor's node under $DRAFTGYM_CACHE/continuations), then teacher-forced and expanded in "
                        "groups of similar length (<= GROUP_PROMPTS prompts, <= GROUP_TOKENS padded tokens), each "
                        "group committed before the next (pipeline.collect.prompt.collect_prompts); 1 = one prompt "
                        "at a time")
    p.add_argument("--no-continuation-cache", dest="continuation_cache", action="store_false",
                   help="generate every continuation afresh: neither read nor write $DRAFTGYM_CACHE/continuations "
                        "(benchmarks; by default a continuation is reused by any later run with the same model, "
                        "dtype, device, prompt, temperature, seed and length, whatever the head or widths)")
    p.add_argument("--no-ray", dest="use_ray", action="store_false", help="run in-process (debugging)")
    add_device_dtype(p)
    p.add_argument("--out", help="logs root (hive-partitioned Parquet): a local path (made absolute on this machine, the "
                        "driver) or a pyarrow filesystem URI: file:///abs/path, s3://bucket/prefix, gs://bucket/prefix "
                        "(every worker writes there; use shared storage or an object store on a multi-node cluster)")
    add_json(p, "print the summary as one JSON object")
    add_no_progress(p)
    set_command(p, _collect_config, "pipeline.collect.job:run_collect_command", "pipeline.collect.job:CollectJob")


def _collect_config(args):
    """CollectJob: the logged data's config (dtype and split resolved, as the run_key needs) + the job's."""
    from pipeline.collect.job import CollectJob
    from pipeline.collect.prompt import CollectConfig
    from pipeline.datasets import resolve_split
    from pipeline.models.target import resolve_dtype_name

    data = config_from_args(CollectConfig, args, widths=given(args.widths, lambda s: parse_positive_ints(s, "--widths")),
                            dtype=resolve_dtype_name(args.dtype, args.device))
    data = replace(data, split=resolve_split(data.dataset, args.split))
    return config_from_args(CollectJob, args, data=data)


def add_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="measure draft/verify/policy/overhead latency on this device")
    add_model_head(p)
    p.add_argument("--widths", help="comma-separated W values to time draft forwards at")
    p.add_argument("--verify-sizes", help="comma-separated V values to time verification at")
    p.add_argument("--contexts", help="comma-separated context lengths")
    p.add_argument("--repeats", type=COUNT,
                   help="timed rounds of the shapes per (batch size, context) generation (and timed calls, --isolated)")
    p.add_argument("--rounds", type=COUNT, help="passes through the whole (batch size, context) grid, --repeats each: "
                        "more than 1 spreads every cell's samples over the profile's time, for a machine whose speed drifts")
    p.add_argument("--top-ups", type=NON_NEGATIVE, help="up to this many times, run once more each (batch size, context) whose cells "
                        "know their median to worse than 3 %% (size each cell's samples by its spread; 0: never)")
    p.add_argument("--isolated", action="store_true",
                   help="also time the bare ops in a tight loop (ops verify_isolated / draft_isolated)")
    p.add_argument("--batch-sizes", help="comma-separated batch sizes B: draft_step, verify, overhead and policy rows at each B "
                        "(batch 1 is always profiled), e.g. 1,2,4,8,16")
    p.add_argument("--prefill-lengths", help="comma-separated prompt lengths n to time one request's prefill at (the load replay "
                        "charges it when a request joins; cover your longest prompts), or 'none'")
    add_device_dtype(p)
    p.add_argument("--out", help="logs root: the profile goes to OUT/latency/")
    add_json(p, "print the summary as one JSON object")
    add_no_progress(p)
    set_command(p, _profile_config, "pipeline.profiling.profile:run_profile_command",
                "pipeline.profiling.profile:ProfileConfig")


def _profile_config(args):
    from pipeline.profiling.profile import ProfileConfig

    ints = lambda name: given(getattr(args, name), lambda s: parse_positive_ints(s, "--" + name.replace("_", "-")))
    return config_from_args(ProfileConfig, args, widths=ints("widths"), verify_sizes=ints("verify_sizes"),
                            contexts=ints("contexts"), batch_sizes=ints("batch_sizes"),
                            prefill_lengths=() if (args.prefill_lengths or "").strip().lower() == "none"
                            else ints("prefill_lengths"))


def add_query(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("query", help="SQL (DuckDB) over the Parquet logs: views sequences, positions, latency, "
                                     "cycles, batch_steps, failures, acceptance_long")
    p.add_argument("sql", nargs="?", help="a DuckDB SQL query over the views")
    p.add_argument("--logs", default=None, help="logs directory, file:// URI, or s3:// / gs:// URI read through a local mirror "
                                                "(default $DRAFTGYM_LOGS or data/logs)")
    p.add_argument("--format", choices=["table", "csv", "json"], help="output format")
    p.add_argument("--example", metavar="NAME",
                   help="run a named example query (see --list-examples) (default: none; give SQL)")
    p.add_argument("--list-examples", action="store_true", help="list the example queries and exit")
    p.add_argument("--show-sql", action="store_true", help="print the SQL that runs (to stderr)")
    p.add_argument("--max-rows", type=COUNT, help="table format: rows shown")
    set_command(p, _query_config, "pipeline.logs.query:run_query_command", "pipeline.logs.query:QueryConfig")


def _query_config(args):
    from pipeline.logs.query import QueryConfig

    return config_from_args(QueryConfig, args)


def add_compact_logs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compact-logs", help="rewrite version-2 positions shards in the compact version-3 layout "
                                            "(in place, resumable)")
    p.add_argument("--logs", help="logs directory or file:// URI")
    p.add_argument("--dry-run", action="store_true", help="count the shards that would be converted; write nothing")
    add_no_progress(p)
    add_json(p)
    set_command(p, _compact_logs_config, "pipeline.logs.compact:run_compact_logs_command",
                "pipeline.logs.compact:CompactLogsConfig")


def _compact_logs_config(args):
    from pipeline.logs.compact import CompactLogsConfig

    return config_from_args(CompactLogsConfig, args)
