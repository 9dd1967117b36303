"""The flags of the serving commands that live in simulator/: tune, serve-eval, train-load, export,
profile-import (registered by simulator/cli.py's `register`, as its own commands are; the same
conventions: dest = the field of the command's Config dataclass, nothing heavy imported until a
command runs).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from pipeline.cliargs import (COUNT, DTYPES, NON_NEGATIVE, NON_NEGATIVE_FLOAT, POSITIVE_FLOAT, add_json,
                              add_no_progress, config_from_args, set_command, window_arg)


def _serving_logs_args(p: argparse.ArgumentParser) -> None:
    """Which logs and latency profile the serving commands replay (no --latency-dtype: one clock)."""
    p.add_argument("--logs", required=True, help="logs root (sequences/, positions/, latency/)")
    p.add_argument("--model", default=None, help="model partition (default: the only one)")
    p.add_argument("--temperature", type=NON_NEGATIVE_FLOAT, default=None, help="temperature partition (default: the only one)")
    p.add_argument("--dataset", default=None, help="comma-separated datasets (default: all)")
    p.add_argument("--dtype", default=None, choices=list(DTYPES), help="the logs' compute dtype (default: the only one)")
    p.add_argument("--profile", default=None,
                   help="latency profile_id, profiled at several batch sizes (default: the newest of the logs' dtype)")
    p.add_argument("--latency", default=None, help="root holding latency/ (default: --logs)")
    p.add_argument("--latency-model", default=None, metavar="MODEL", help="a what-if: the logs' acceptance, the step costs "
                   "of MODEL's profile (e.g. llama-3.1-8b on a GPU) in its dtype; every output says so (default: the logs')")


def add_tune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="the best speculation shape at each batch size (closed-batch replay), "
                                    "merged into a schedule JSON")
    _serving_logs_args(p)
    p.add_argument("--batch-sizes", help="batch sizes to tune at")
    p.add_argument("--shapes", choices=["chain", "tree", "all"],
                   help="candidates besides off: chain K = 1..8 (needs width-1 logs), the logged trees, or both")
    p.add_argument("--split", help="split the choice is made on")
    p.add_argument("--requests-per-slot", type=COUNT,
                   help="closed batch of B rows: max(sequences, this x B) requests, the split's sequences cycled")
    p.add_argument("--max-batch", type=COUNT, help="the schedule's last range reaches this batch size (default: the largest tuned B)")
    p.add_argument("--out", required=True, help="schedule JSON to write (the tokens/s table goes beside it, same name with .csv)")
    p.add_argument("--no-refine", dest="refine", action="store_false", default=None, help="tune only --batch-sizes "
                   "(default: also bisect where neighbouring tuned B's best shapes differ, to find each switch)")
    p.add_argument("--plot", default=None, help="PNG of tokens/s x AR against B per shape (default: no plot)")
    p.add_argument("--context-bins", type=NON_NEGATIVE, help="K >= 2: also answer whether choosing the shape by "
                   "context (K bins at the split's context quantiles) beats one shape per B, by exact replay; 0: skip")
    p.add_argument("--context-min-gain", type=POSITIVE_FLOAT, help="the context split pays at this gain at some B")
    p.add_argument("--ray", action="store_true",
                   help="tune on every position, not a window: each chunk of --max-positions-in-memory positions "
                        "replays its own closed batches as a Ray task (embedded, or the cluster at RAY_ADDRESS; logs "
                        "on a filesystem every node mounts), the chunks' tokens and times pooled")
    window_arg(p)
    add_no_progress(p)
    add_json(p)
    set_command(p, _tune_config, "simulator.serving.tune:run_tune_command", "simulator.serving.tune:TuneConfig")


def _tune_config(args):
    from simulator.serving.tune import TuneConfig

    return config_from_args(TuneConfig, args)


def add_serve_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve-eval", help="replay a load sweep under AR, the best static shape, the per-B "
                                          "schedule, vLLM's example, SGLang's adaptive rule and an oracle")
    _serving_logs_args(p)
    p.add_argument("--split", help="split the requests replay")
    p.add_argument("--tune-split", help="split the schedule and the best static shape are chosen on")
    p.add_argument("--schedule", default=None, help="a schedule JSON from `draftgym tune` (default: tune one here)")
    p.add_argument("--batch-sizes", help="batch sizes to tune at (without --schedule)")
    p.add_argument("--shapes", choices=["chain", "tree", "all"], help="tuning candidates besides off")
    p.add_argument("--target-batches", help="the Poisson sweep's rates keep about these many rows busy under AR decoding")
    p.add_argument("--rates", default=None, help="comma-separated arrival rates in requests/s instead (default: from "
                                                 "--target-batches)")
    p.add_argument("--trace", default=None, help="file of arrival times in s (one per line, or a JSON list) instead "
                                                 "of a sweep (default: a sweep)")
    p.add_argument("--requests-per-rate", type=COUNT, help="requests at each rate of the sweep")
    p.add_argument("--segment-seconds", type=POSITIVE_FLOAT, default=None,
                   help="instead: each rate's segment lasts about this many seconds (round(rate x S) requests), so "
                        "the sweep spends equal time at each load; with equal requests the low rates take the "
                        "longest (default: --requests-per-rate)")
    p.add_argument("--max-batch", type=COUNT, default=None, help="most rows in a batch (default: the largest target batch)")
    p.add_argument("--tpot-target", type=POSITIVE_FLOAT, default=None,
                   help="seconds per output token a request must meet to count in goodput (default: AR's median TPOT)")
    p.add_argument("--seed", type=NON_NEGATIVE, help="arrival seed")
    p.add_argument("--sglang-config", default=None,
                   help="SGLang --speculative-adaptive-config JSON to replay (default: SGLang's stored tiers)")
    p.add_argument("--sglang-initial-steps", type=COUNT, help="SGLang's --speculative-num-steps")
    p.add_argument("--no-oracle", dest="oracle", action="store_false", help="skip the greedy per-step oracle")
    p.add_argument("--row-budget-k", type=NON_NEGATIVE,
                   help="per-request budgets: fit the acceptance model on the tuning split for chains up to K and "
                        "replay the learned allocator (simulator/serving/choosers/row_budget.py); 0: skip")
    p.add_argument("--nightjar-k", type=NON_NEGATIVE,
                   help="Nightjar's bandit over chains 0..K per batch-size bin, as its authors' vLLM fork runs it "
                        "(simulator/serving/choosers/nightjar.py); 0: skip")
    p.add_argument("--switch-ms", type=NON_NEGATIVE_FLOAT,
                   help="ms the modelled engine adds to a step whose shape differs from the step before")
    p.add_argument("--engine", choices=["profile", "paged"],
                   help="price steps as the profile's engine runs them (DraftGym's: the longest row's context, "
                        "per-row verifies padded to the longest) or as a paged engine (vLLM, SGLang: the mean "
                        "context, per-row verifies by their total tokens)")
    p.add_argument("--acceptance-model-out", default=None, metavar="FILE",
                   help="write the per-request budget's fitted acceptance model, for validate --acceptance-model "
                        "(default: not written)")
    p.add_argument("--off-factor", type=POSITIVE_FLOAT,
                   help="an off step costs this many times the profiled AR step (K = 0 inside a speculative engine)")
    p.add_argument("--policy", dest="policies", metavar="DIR", action="append", default=[],
                   help="a load-aware policy from `draftgym train-load` to replay too (repeatable)")
    p.add_argument("--out", default=None, help="write the table as JSON (default: print only)")
    p.add_argument("--write-trace", default=None, metavar="FILE",
                   help="write the sweep's arrival times (one per line, a # header naming the rates and the seed) "
                        "to FILE for `draftgym validate --load-trace FILE`, and exit without replaying (default: replay)")
    window_arg(p)
    add_json(p)
    set_command(p, _serve_eval_config, "simulator.serve_eval:run_serve_eval_command",
                "simulator.serve_eval:ServeEvalConfig")


def _serve_eval_config(args):
    from simulator.serve_eval import ServeEvalConfig

    return config_from_args(ServeEvalConfig, args, policies=tuple(args.policies))


def add_train_load(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-load", help="train a load-aware speculation policy (the step's shape from the batch "
                                          "size, queue and draft confidences) in the serving replay")
    _serving_logs_args(p)
    p.add_argument("--out", required=True, help="policy directory (checkpoint, manifest.json, training.json)")
    p.add_argument("--method", help="resps (resps-load is the same): an MLP picks the shared shape of the next --hold "
                        "steps from a list, PPO | ltd: a depth head (0 = off .. --max-depth) and a verify-size head, "
                        "PPO on the joint log-prob | radar: stop / continue at each depth, REINFORCE with a baseline")
    p.add_argument("--width", type=NON_NEGATIVE, default=None,
                   help="ltd, radar: W of every drafting shape (default: 1 when the logs have width 1, else their "
                        "primary width; W = 1 drafts chains)")
    p.add_argument("--max-depth", type=COUNT, default=None, help="ltd, radar: the deepest D")
    p.add_argument("--split", help="training split")
    p.add_argument("--val-split", help="validation split (the best validated policy is kept)")
    p.add_argument("--shapes", help="action set: auto (off, chains 1..--chains, the tuned best shape at each --tune-batches) "
                        "or space-separated labels, e.g. \"off chain:2 tree:4,10,60\"")
    p.add_argument("--chains", type=COUNT, help="auto: chains K = 1..this")
    p.add_argument("--tune-batches", help="auto: the tuned best shape at each of these B joins")
    p.add_argument("--max-batch", type=COUNT, help="most rows in a batch")
    p.add_argument("--hold", type=COUNT, help="steps each decision is held")
    p.add_argument("--target-batches", help="training episodes' Poisson rates (and the validation sweep) keep about these B busy under AR "
                        "(beyond --max-batch: overload)")
    p.add_argument("--episode-decisions", type=COUNT, help="decisions per training episode")
    p.add_argument("--objective", choices=["ratio", "rate"],
                   help="reward over a hold: ratio = throughput x AR; rate = tokens - lambda time, lambda = "
                        "--rate-ref x AR's tokens/s at the decision's batch")
    p.add_argument("--rate-ref", type=POSITIVE_FLOAT, help="rate: lambda as a multiple of AR's tokens/s")
    p.add_argument("--confidence-depth", type=NON_NEGATIVE, help="observation: the batch's draft confidences at depths 1..this (0: none)")
    p.add_argument("--steps", type=COUNT, help="training decisions")
    p.add_argument("--val-requests-per-rate", type=COUNT, help="requests per rate of the validation sweep")
    p.add_argument("--seed", type=NON_NEGATIVE, help="nets, rollouts, arrivals")
    window_arg(p)
    add_json(p)
    add_no_progress(p)
    set_command(p, _train_load_config, "simulator.methods.train_load:run_train_load_command",
                "simulator.methods.train_load:LoadTrainConfig")


def _train_load_config(args):
    from simulator.methods.train_load import LoadTrainConfig
    from simulator.methods.ltd.serving_train import LTDLoadConfig
    from simulator.methods.radar.serving_train import RadarLoadConfig

    shared = {k: v for k, v in (("width", args.width), ("max_depth", args.max_depth)) if v is not None}
    return config_from_args(LoadTrainConfig, args, ltd=replace(LTDLoadConfig(), **shared),
                            radar=replace(RadarLoadConfig(), **shared))


def add_cost_table(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cost-table", help="SGLang's DSpark cost table (--speculative-dspark-sps-table-path) from a "
                                          "latency profile")
    p.add_argument("--latency", required=True, help="root holding latency/ (a logs root or a profile folder)")
    p.add_argument("--model", default=None, help="model partition (default: the only one)")
    p.add_argument("--profile", default=None, help="latency profile_id (default: the newest)")
    p.add_argument("--dtype", default=None, choices=list(DTYPES), help="the profile's dtype (default: the only one)")
    p.add_argument("--gamma", type=COUNT, required=True, help="drafts per request each step (DSpark's block size)")
    p.add_argument("--context", type=POSITIVE_FLOAT, help="context the table is priced at, in tokens")
    p.add_argument("--out", required=True, help="table JSON to write")
    add_json(p)
    set_command(p, lambda a: config_from_args(CostTableConfig, a), "simulator.serving.formats.dspark_table:"
                "run_cost_table_command", "simulator.serving_cli:CostTableConfig")


@dataclass
class CostTableConfig:
    """`draftgym cost-table` settings."""
    latency: str = ""
    model: str | None = None
    profile: str | None = None
    dtype: str | None = None
    gamma: int = 1
    context: float = 2048.0               # SGLang's throughput-aware rule profiles at 2048 by default
    out: str = ""
    as_json: bool = False


def add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a schedule in a serving engine's format (vLLM speculative_config, "
                                      "SGLang flags or its adaptive config)")
    p.add_argument("--schedule", required=True, help="schedule JSON (from `draftgym tune`)")
    p.add_argument("--format", dest="fmt", required=True, choices=["vllm", "sglang", "sglang-adaptive", "sglang-throughput", "json"],
                   help="vllm: speculative_config JSON; sglang: static launch flags; sglang-adaptive: "
                        "--speculative-adaptive-config JSON for its EMA rule (+ its launch flags); "
                        "sglang-throughput: the same for its throughput-aware controller; json: the schedule itself")
    p.add_argument("--head", default=None, help="the EAGLE-3 head's path or hub id to write into the config "
                                                "(default: a placeholder to replace)")
    p.add_argument("--best-expressible", action="store_true",
                   help="replace what the engine cannot run by its best runnable shape from the schedule's tuning "
                        "table, and say so (default: refuse)")
    p.add_argument("--max-batch", type=COUNT, default=None,
                   help="vllm: the last batch range ends here (default: the schedule's own end)")
    p.add_argument("--out", default=None, help="file to write (default: print)")
    set_command(p, _export_config, "simulator.serving.formats.export:run_export_command",
                "simulator.serving.formats.export:ExportConfig")


def _export_config(args):
    from simulator.serving.formats.export import ExportConfig

    return config_from_args(ExportConfig, args)


def add_profile_import(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile-import", help="turn an engine's own timing file (SGLang bench_speculative.py JSONL, "
                                              "vllm-run's vllm_steps.jsonl) into a latency profile with batch rows")
    p.add_argument("file", help="the engine's file")
    p.add_argument("--format", dest="fmt", choices=["sglang-bench", "vllm-steps"], help="sglang-bench: SGLang's "
                   "bench_speculative.py JSONL; vllm-steps: `draftgym vllm-run`'s vllm_steps.jsonl")
    p.add_argument("--out", required=True, help="logs root to write latency/model=<M>/<profile_id>.parquet into")
    p.add_argument("--model", required=True, help="model_id of the logs the profile will time")
    p.add_argument("--dtype", choices=list(DTYPES), help="the engine's compute dtype")
    p.add_argument("--profile-id", default=None, help="profile_id (default: <engine>-<file stem>)")
    p.add_argument("--context-len", type=NON_NEGATIVE,
                   help="the context length the engine measured at (its file does not say; one level, flat in c)")
    p.add_argument("--compare-logs", default=None,
                   help="logs root to replay the same shapes on at batch 1: the file's acc_length against the "
                        "replayed tau (default: no comparison)")
    add_json(p)
    set_command(p, _profile_import_config, "simulator.serving.formats.sglang_import:run_profile_import_command",
                "simulator.serving.formats.sglang_import:ProfileImportConfig")


def _profile_import_config(args):
    from simulator.serving.formats.sglang_import import ProfileImportConfig

    return config_from_args(ProfileImportConfig, args)
