"""`draftgym` subcommands that live in simulator/: evaluate, train, transfer, synth-logs, latency-report,
and the serving ones: tune, serve-eval, export, profile-import, train-load.

The one home of these commands' flags: each subparser declares them (dest = the field of the
command's Config dataclass) and the function that builds the Config; the run functions are in the
library modules (pipeline.cliargs.set_command). Registered by `online.cli.build_parser`; nothing
heavy is imported until a command runs.
"""
from __future__ import annotations

import argparse

from pipeline.cliargs import (COUNT, DTYPES, NON_NEGATIVE, NON_NEGATIVE_FLOAT, POSITIVE_FLOAT, add_json,
                              add_no_progress, comma_list, config_from_args, given, parse_positive_ints,
                              set_command)
from pipeline.errors import DraftGymError

METHODS = ["radar", "ltd", "resps"]


def register(sub: argparse._SubParsersAction) -> None:
    for add in (add_evaluate, add_train, add_transfer, add_synth, add_latency_report, add_tune, add_serve_eval,
                add_export, add_profile_import, add_train_load):
        add(sub)


def _logs_args(p: argparse.ArgumentParser) -> None:
    """Which logs and which latency profile: the same flags on evaluate and train."""
    p.add_argument("--logs", required=True, help="logs root (sequences/, positions/, latency/)")
    p.add_argument("--model", default=None, help="model partition (default: the only one)")
    p.add_argument("--temperature", type=NON_NEGATIVE_FLOAT, default=None, help="temperature partition (default: the only one)")
    p.add_argument("--dataset", default=None, help="comma-separated datasets (default: all)")
    p.add_argument("--dtype", default=None, choices=list(DTYPES),
                   help="the logs' compute dtype (default: the only one); the latency profile must be of the same dtype")
    p.add_argument("--latency-dtype", default=None, choices=list(DTYPES),
                   help="time the replay with a latency profile of this dtype instead of the logs' own (a transfer "
                        "experiment: one set of acceptance logs, another device or dtype's clock) (default: the "
                        "logs' own)")
    p.add_argument("--profile", default=None, help="latency profile_id (default: the newest of the logs' dtype)")
    p.add_argument("--latency", default=None, help="root holding latency/ (default: --logs)")
    window_arg(p)


def window_arg(p: argparse.ArgumentParser) -> None:
    """--max-positions-in-memory: the one memory knob of every command that reads positions."""
    p.add_argument("--max-positions-in-memory", type=COUNT, default=None,
                   help="logs with more positions are read a chunk (evaluate, tune --ray; validate's grid-best) or a "
                        "seeded sampled window (train, tune, serve-eval, train-load, transfer; validate: plus the decoded "
                        "prompts' sequences) of this many at a time: about 3-6 KB each at W = 10")


def _iters(s: str | None) -> tuple[int, ...] | None:
    return None if s is None else parse_positive_ints(s, "--iters", minimum=0)


# ------------------------------------------------------------------------------------ evaluate

def add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="replay policies and baselines on logged decoding (tau, tokens/s, speedups)")
    _logs_args(p)
    p.add_argument("--split", help="train | val | test | all")
    p.add_argument("--policy", dest="policies", metavar="POLICY", action="append", default=[],
                   help="checkpoint dir, or static:D,W,V | ddd[:thr] | entropy[:theta] | goodput | "
                        "oracle[:static|depth] | random[:seed] (repeatable)")
    p.add_argument("--tune-split", help="split for grid-best selection (default: val, else train)")
    p.add_argument("--ray", action="store_true",
                   help="replay each chunk of --max-positions-in-memory positions as a Ray task: embedded, or the "
                        "cluster at RAY_ADDRESS (logs on a filesystem every node mounts)")
    add_no_progress(p)
    add_json(p)
    set_command(p, _evaluate_config, "simulator.evaluate:run_evaluate_command", "simulator.evaluate:EvaluateConfig")


def _evaluate_config(args):
    from simulator.evaluate import EvaluateConfig

    return config_from_args(EvaluateConfig, args)


# ------------------------------------------------------------------------------------ train, transfer

def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a policy in the replay simulator (radar | ltd | resps)")
    _logs_args(p)
    p.add_argument("--method", required=True, choices=METHODS, help="radar (REINFORCE stop/continue), ltd (PPO depth + size), resps (PPO tree shape, held N cycles)")
    p.add_argument("--out", required=True, help="policy directory (checkpoint + manifest.json + curve PNG)")
    p.add_argument("--steps", type=COUNT, default=None,
                   help="budget: ltd = depth env steps per depth phase (size phases get a quarter; default 200k); "
                        "radar = gradient steps (default 3000); resps = decisions (default 30k)")
    p.add_argument("--seed", type=NON_NEGATIVE, help="training seed (nets, rollouts)")
    p.add_argument("--split", help="training split (validation uses val when present)")
    p.add_argument("--width", type=COUNT, default=None, help="W (default 10 when logged)")
    p.add_argument("--n-envs", type=COUNT, default=None, help="parallel replay environments (default: the method's own)")
    p.add_argument("--iters", default=None, help="ltd: co-adaptation iterations to run, e.g. 0,1,2,3 (default all)")
    p.add_argument("--action-space", choices=["seeds", "wide"],
                   help="seeds: the papers' action sets (docs/design.md); wide: adds shallow/small trees "
                        "(LTD V in the logged grid 2..240, Re-SpS D 1..8 and V 2..128), for devices like CPUs "
                        "where a large verify costs several AR steps")
    p.add_argument("--obs", choices=["paper", "rich"],
                   help="observations: paper (each seed's own) or rich (adds the best beam's entropy and the "
                        "acceptance history of the generation; simulator/observations/rich.py)")
    p.add_argument("--objective", choices=["ratio", "rate"],
                   help="cycle reward: ratio (the seeds' (L+1)/t_cycle per cycle) or rate ((L+1) - lambda t_cycle "
                        "with lambda = grid-best's replay tokens/s on the training split: maximises the "
                        "generation's tokens/s, not the mean cycle's; simulator/envs/core.py)")
    p.add_argument("--verify-size", type=COUNT, default=None,
                   help="V for RADAR and LTD's Iter0 depth phase (default 60; with --action-space wide, "
                        "the grid-best static V on the training split)")
    add_no_progress(p)
    add_json(p)
    set_command(p, _train_config, "simulator.methods.run:run_trainer", "simulator.train.common:PolicyTrainConfig")


def _train_config(args):
    from simulator.train.common import PolicyTrainConfig

    return config_from_args(PolicyTrainConfig, args, iters=_iters(args.iters))


def add_transfer(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("transfer", help="hardware transfer: a policy per latency profile from one set of logs, "
                                        "each replayed under every profile (a 2 x 2 table vs grid-best)")
    p.add_argument("--logs", required=True, help="logs root (sequences/, positions/, latency/)")
    p.add_argument("--model", default=None, help="model partition (default: the only one)")
    p.add_argument("--dtype", default=None, choices=list(DTYPES),
                   help="the logs' compute dtype (default: the only one)")
    p.add_argument("--temperature", type=NON_NEGATIVE_FLOAT, default=None,
                   help="the logs' temperature partition (default: the only one; a root holding T = 0 and T = 1 "
                        "logs needs it)")
    p.add_argument("--latency", default=None, help="root holding latency/ (default: --logs)")
    p.add_argument("--profiles", type=comma_list, required=True,
                   help="comma-separated profile specs: a dtype (float32 | bfloat16 | float16: its newest profile) "
                        "or id:<profile_id>; e.g. float32,bfloat16")
    p.add_argument("--method", required=True, choices=METHODS, help="the policy to train")
    p.add_argument("--out", required=True, help="directory: policy-<profile>/ per profile, transfer.{json,md,png}")
    p.add_argument("--split", help="split the table is measured on (grid-best is picked on val)")
    p.add_argument("--steps", type=COUNT, default=None,
                   help="training budget, as `draftgym train --steps` (default: the method's own)")
    p.add_argument("--seed", type=NON_NEGATIVE, help="training seed (the same for every profile)")
    p.add_argument("--n-envs", type=COUNT, default=None,
                   help="parallel replay environments, as `draftgym train` (default: the method's own)")
    p.add_argument("--iters", default=None, help="ltd: co-adaptation iterations, as `draftgym train` (default all)")
    p.add_argument("--action-space", choices=["seeds", "wide"],
                   help="as `draftgym train` (wide: a CPU's best trees are small)")
    p.add_argument("--obs", choices=["paper", "rich"], help="observations, as `draftgym train`")
    p.add_argument("--objective", choices=["ratio", "rate"],
                   help="cycle reward, as `draftgym train` (rate: lambda is each profile's own grid-best)")
    window_arg(p)
    add_no_progress(p)
    set_command(p, _transfer_config, "simulator.transfer:run_transfer_command", "simulator.transfer:TransferConfig")


def _transfer_config(args):
    from simulator.transfer import TransferConfig

    return config_from_args(TransferConfig, args, iters=_iters(args.iters))


# ------------------------------------------------------------------------------------ synth-logs, latency-report

def add_synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth-logs", help="write synthetic logs with the real schemas (tests, demos)")
    p.add_argument("--out", required=True, help="output logs root")
    p.add_argument("--n-sequences", type=COUNT, help="per dataset")
    p.add_argument("--widths", help="comma-separated W values")
    p.add_argument("--temperature", type=NON_NEGATIVE_FLOAT, help="the logs' temperature partition")
    p.add_argument("--latency-profile", choices=["cpu", "gpu", "none"], help="synthetic latency profile shape")
    p.add_argument("--latency-batches", help="comma-separated batch sizes of the latency rows (batch 1 always), e.g. 1,2,4,8,16")
    p.add_argument("--seed", type=NON_NEGATIVE, help="random seed of the synthetic data")
    p.add_argument("--new-tokens", default=None, help="LO,HI: new tokens per sequence, uniform")
    p.add_argument("--shard-sequences", type=COUNT, default=None,
                   help="sequences per shard, written in parallel and resumable (default: one shard per dataset)")
    p.add_argument("--workers", type=COUNT, help="processes writing shards (with --shard-sequences)")
    add_no_progress(p)
    set_command(p, _synth_config, "simulator.logs.synthetic:run_synth_logs_command",
                "simulator.logs.synthetic:SynthLogsConfig")


def _synth_config(args):
    from simulator.logs.synthetic import SyntheticConfig, SynthLogsConfig

    extra = {}
    if args.new_tokens is not None:
        extra["new_tokens"] = parse_positive_ints(args.new_tokens, "--new-tokens")
        if len(extra["new_tokens"]) != 2:
            raise DraftGymError(f"--new-tokens takes LO,HI, got {args.new_tokens!r}")
    data = config_from_args(SyntheticConfig, args, widths=given(args.widths, lambda s: parse_positive_ints(s, "--widths")),
                            **extra, latency_profile=given(args.latency_profile, lambda s: None if s == "none" else s),
                            latency_batches=given(args.latency_batches,
                                                  lambda s: parse_positive_ints(s, "--latency-batches")))
    return config_from_args(SynthLogsConfig, args, data=data)


def add_latency_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("latency-report", help="fit report (and plot) of the latency model of a logs root")
    p.add_argument("--logs", required=True, help="logs root holding latency/")
    p.add_argument("--model", default=None, help="model partition (default: the only one)")
    p.add_argument("--profile", default=None, help="latency profile_id (default: the newest)")
    p.add_argument("--plot", default=None, help="write a PNG of measured points and interpolated curves (default: no plot)")
    add_json(p)
    set_command(p, _latency_report_config, "simulator.latency.report:run_latency_report_command",
                "simulator.latency.report:LatencyReportConfig")


def _latency_report_config(args):
    from simulator.latency.report import LatencyReportConfig

    return config_from_args(LatencyReportConfig, args)


# ------------------------------------------------------------------------------------ serving: tune, serve-eval, export, profile-import

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
    p.add_argument("--requests-per-slot", type=COUNT, help="closed batch of B rows: max(sequences, this x B) requests, the split's sequences cycled")
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
    p.add_argument("--switch-ms", type=NON_NEGATIVE_FLOAT,
                   help="ms the modelled engine adds to a step whose shape differs from the step before")
    p.add_argument("--engine", choices=["profile", "paged"],
                   help="price steps as the profile's engine runs them (DraftGym's: the longest row's context, "
                        "per-row verifies padded to the longest) or as a paged engine (vLLM, SGLang: the mean "
                        "context, per-row verifies by their total tokens)")
    p.add_argument("--acceptance-model-out", default=None, metavar="FILE",
                   help="write the per-request budget's fitted acceptance model (for validate --acceptance-model)")
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
    from dataclasses import replace

    from simulator.methods.train_load import LoadTrainConfig
    from simulator.methods.ltd.serving_train import LTDLoadConfig
    from simulator.methods.radar.serving_train import RadarLoadConfig

    shared = {k: v for k, v in (("width", args.width), ("max_depth", args.max_depth)) if v is not None}
    return config_from_args(LoadTrainConfig, args, ltd=replace(LTDLoadConfig(), **shared),
                            radar=replace(RadarLoadConfig(), **shared))


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
    p.add_argument("--context-len", type=NON_NEGATIVE, help="the context length the engine measured at (its file does not say; one level, flat in c)")
    p.add_argument("--compare-logs", default=None,
                   help="logs root to replay the same shapes on at batch 1: the file's acc_length against the "
                        "replayed tau (default: no comparison)")
    add_json(p)
    set_command(p, _profile_import_config, "simulator.serving.formats.sglang_import:run_profile_import_command",
                "simulator.serving.formats.sglang_import:ProfileImportConfig")


def _profile_import_config(args):
    from simulator.serving.formats.sglang_import import ProfileImportConfig

    return config_from_args(ProfileImportConfig, args)
