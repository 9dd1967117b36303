"""The `draftgym` command line: one parser, the subcommands of each layer (pipeline/cli.py,
simulator/cli.py, and online's own here: validate, profile-policy).

Imports flow online -> simulator -> pipeline, so the top-level parser lives here. Each subcommand
names a function that builds its Config from the parsed options and the `run_<command>_command(cfg)`
that runs it (pipeline.cliargs.set_command); nothing heavy is imported until a command runs.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from pipeline.cliargs import (DTYPES, DefaultsHelpFormatter, add_device_dtype, add_json, add_model_head,
                              add_no_progress, add_split, comma_list, config_from_args, parse_positive_ints,
                              set_command)
from pipeline.errors import DraftGymError


def build_parser() -> argparse.ArgumentParser:
    from pipeline import cli as pipeline_cli
    from simulator import cli as simulator_cli

    parser = argparse.ArgumentParser(prog="draftgym", description="DraftGym: learn speculative-decoding policies offline by exact replay; validate them online.")
    sub = parser.add_subparsers(dest="command", required=True)
    pipeline_cli.register(sub)
    simulator_cli.register(sub)
    add_validate(sub)
    add_profile_policy(sub)
    for sp in sub.choices.values():           # every option's default (or "required") in --help
        sp.formatter_class = DefaultsHelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        module, name = args.run.split(":")
        run = getattr(importlib.import_module(module), name)
        return int(run(args.make_config(args)) or 0)
    except DraftGymError as e:
        print(f"draftgym: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftgym: interrupted", file=sys.stderr)
        return 130


# ------------------------------------------------------------------------------------ validate, profile-policy

PROFILE_VERIFY_SIZES, PROFILE_CONTEXTS = "1,2,4,8,16,32,60,100,240", "32,128,512"   # ValidateConfig's
BATCH_SHAPES = ("tree:8,10,60", "chain:2", "chain:4")                                 # ValidateConfig.shapes


def add_validate(sub: argparse._SubParsersAction) -> None:
    from simulator.cli import window_arg

    p = sub.add_parser("validate", help="run policies in the loop on this device; speedup, lossless, sim-vs-real report")
    add_model_head(p)
    p.add_argument("--policy", dest="policies", metavar="POLICY", action="append", default=[],
                   help="checkpoint dir or built-in spec (repeatable); with --load-trace, a load-aware serving "
                        "checkpoint (`draftgym train-load`, confidence depth <= 1) run as one more method")
    p.add_argument("--dataset", dest="datasets", metavar="DATASET", type=comma_list, default="mt-bench",
                   help="comma-separated datasets")
    add_split(p)
    p.add_argument("--n-prompts", type=int, default=5, help="first N prompts per dataset")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (outputs checked against AR); > 0 samples")
    p.add_argument("--runs", type=int, default=3, help="Spec-Bench-style repeats (mean and std over runs)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt")
    p.add_argument("--seed", type=int, default=0, help="sampling seed base (seed + 1000 * run + prompt index)")
    p.add_argument("--logs", default="data/logs", help="logs for grid-best + sim-vs-real ('' to skip)")
    add_device_dtype(p)
    p.add_argument("--logs-dtype", default=None, choices=DTYPES + ("fp32", "bf16", "fp16"),
                   help="dtype of the --logs acceptance logs when it is not --dtype (hardware transfer: logs collected in "
                        "one dtype replayed with this device's profile; sim-vs-real then shows what that costs) "
                        "(default: --dtype)")
    p.add_argument("--out", default="data/reports/validate", help="report folder (report.md, report.json, PNGs, cycles Parquet)")
    p.add_argument("--profile-first", action="store_true",
                   help="profile this device in situ (and each checkpoint's controller cost) into OUT right before "
                        "decoding; grid-best and sim-vs-real then use that profile")
    p.add_argument("--profile-verify-sizes", default=PROFILE_VERIFY_SIZES, help="--profile-first: V values")
    p.add_argument("--profile-contexts", default=PROFILE_CONTEXTS, help="--profile-first: context lengths")
    p.add_argument("--profile-repeats", type=int, default=8, help="--profile-first: at least this many cycles per (V, context)")
    p.add_argument("--profile-interleave", type=int, default=0, metavar="ROUNDS",
                   help="ROUNDS further profile rounds spread between the generations (implies --profile-first); "
                        "sim-vs-real is then timed with the profile pooled over all rounds (which samples the same "
                        "machine states as the decoding), rescaled per dataset by the speed its samples saw while "
                        "that dataset decoded. With --batch-sizes: at every run and B, before each method's generation, "
                        "ROUNDS rounds of the methods' shapes on the batched engine; the replay is timed with the logs' "
                        "profile whose measured levels these replace (online/batch_interleave.py) (default: 0, off)")
    p.add_argument("--no-reanchor", dest="reanchor", action="store_false",
                   help="at T = 0, skip the re-anchored sim-vs-real (each method also replayed on its own decoded "
                        "text, collected after the decoding: online/reanchor.py)")
    p.add_argument("--batch-sizes", default="",
                   help="comma-separated batch sizes B, e.g. 1,4,16: AR, each --shapes shape and the --schedule at each "
                        "B with the batched engine (queues of max(N, 2B) requests), per-B report, step table and "
                        "tokens/s-against-B plot (online/validate_batch.py) (default: none: the batch-1 validation)")
    p.add_argument("--shapes", default=";".join(BATCH_SHAPES),
                   help="with --batch-sizes or --load-trace: semicolon-separated static shapes, each chain:K or "
                        "tree:D,W,V")
    p.add_argument("--schedule", default=None,
                   help="with --batch-sizes or --load-trace: a schedule JSON written by `draftgym tune`, run as one more method "
                        "(default: none)")
    p.add_argument("--load-trace", default=None, metavar="FILE",
                   help="a file of arrival times (s, one per line or a JSON list): the batched engine serves the "
                        "requests as they arrive (continuous batching up to --max-batch rows) with AR, each --shapes "
                        "shape, the --schedule, vLLM's example schedule, SGLang's adaptive rule and each --policy, against "
                        "the serving replay of the same trace (online/validate_load.py) (default: none)")
    p.add_argument("--max-batch", type=int, default=16, help="with --load-trace: the most rows decoding at once")
    window_arg(p)
    add_json(p, "print the report as one JSON object")
    add_no_progress(p)
    set_command(p, _validate_config, "online.cli:run_validate_command")


def _validate_config(args):
    from online.validate import ValidateConfig

    return config_from_args(ValidateConfig, args, logs=args.logs or None,
                            profile_verify_sizes=parse_positive_ints(args.profile_verify_sizes, "--profile-verify-sizes"),
                            profile_contexts=parse_positive_ints(args.profile_contexts, "--profile-contexts"),
                            batch_sizes=parse_positive_ints(args.batch_sizes, "--batch-sizes") if args.batch_sizes else (),
                            shapes=tuple(x.strip() for x in args.shapes.split(";") if x.strip()))


def run_validate_command(cfg) -> int:
    """`draftgym validate`: at batch 1 (online/validate.py), or at --batch-sizes (online/validate_batch.py)."""
    if cfg.load_trace:
        from online.validate_load import run_validate_load_command

        return run_validate_load_command(cfg)
    if cfg.batch_sizes:
        from online.validate_batch import run_validate_batch_command

        return run_validate_batch_command(cfg)
    if cfg.schedule:
        raise DraftGymError("--schedule needs --batch-sizes or --load-trace (a schedule picks a shape per batch size)")
    from online.validate import run_validate_command as run_batch1

    return run_batch1(cfg)


def add_profile_policy(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile-policy", help="time trained policies' controller calls in the engine, into the newest profile")
    p.add_argument("--policy", dest="policies", metavar="POLICY", action="append", required=True,
                   help="checkpoint directory (repeatable)")
    p.add_argument("--logs", default="data/logs", help="logs root holding the device's latency profile")
    add_model_head(p)
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens decoded per timing generation")
    add_device_dtype(p)
    add_json(p, "print the result as one JSON object")
    add_no_progress(p)
    set_command(p, _profile_policy_config, "online.policy_cost:run_profile_policy_command")


def _profile_policy_config(args):
    from online.policy_cost import ProfilePolicyConfig

    return config_from_args(ProfilePolicyConfig, args)


if __name__ == "__main__":
    sys.exit(main())
