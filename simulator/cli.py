"""`draftgym` subcommands that live in simulator/: evaluate, train, transfer, synth-logs, latency-report,
and the serving ones (their flags in simulator/serving_cli.py): tune, serve-eval, export,
profile-import, train-load.

The one home of these commands' flags: each subparser declares them (dest = the field of the
command's Config dataclass) and the function that builds the Config; the run functions are in the
library modules (pipeline.cliargs.set_command). Registered by `online.cli.build_parser`; nothing
heavy is imported until a command runs.
"""
from __future__ import annotations

import argparse

from pipeline.cliargs import (COUNT, DTYPES, NON_NEGATIVE, NON_NEGATIVE_FLOAT, add_json, window_arg,
                              add_no_progress, comma_list, config_from_args, given, parse_positive_ints,
                              set_command)
from pipeline.errors import DraftGymError

METHODS = ["radar", "ltd", "resps"]


def register(sub: argparse._SubParsersAction) -> None:
    from simulator.serving_cli import (add_cost_table, add_export, add_profile_import, add_serve_eval, add_train_load,
                                       add_tune)

    for add in (add_evaluate, add_train, add_transfer, add_synth, add_latency_report, add_tune, add_serve_eval,
                add_export, add_cost_table, add_profile_import, add_train_load):
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
    p.add_argument("--method", required=True, choices=METHODS,
                   help="radar (REINFORCE stop/continue), ltd (PPO depth + size), resps (PPO tree shape, held N cycles)")
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
