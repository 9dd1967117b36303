"""The `draftgym` command line: one parser, the subcommands of each layer (pipeline/cli.py,
simulator/cli.py, and online's own here: validate, profile-policy, vllm-run).

Imports flow online -> simulator -> pipeline, so the top-level parser lives here. Each subcommand
names a function that builds its Config from the parsed options and the `run_<command>_command(cfg)`
that runs it (pipeline.cliargs.set_command); nothing heavy is imported until a command runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import sys

from pipeline.cliargs import (COUNT, DTYPES, NON_NEGATIVE, NON_NEGATIVE_FLOAT, add_device_dtype, add_json,
                              add_model_head, add_no_progress, add_split, comma_list, config_from_args,
                              DefaultsHelpFormatter, given, OneLineParser, parse_positive_ints, set_command)
from pipeline.errors import DraftGymError


def build_parser() -> argparse.ArgumentParser:
    from pipeline import cli as pipeline_cli
    from simulator import cli as simulator_cli

    parser = argparse.ArgumentParser(prog="draftgym", description="DraftGym: learn speculative-decoding policies offline by exact "
                                                                  "replay; validate them online.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    pipeline_cli.register(sub)
    simulator_cli.register(sub)
    add_validate(sub)
    add_profile_policy(sub)
    add_vllm_run(sub)
    for sp in sub.choices.values():           # every option's default (or "required") in --help, the Config's
        sp.formatter_class = functools.partial(DefaultsHelpFormatter, config=sp.get_default("config"))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one `draftgym` command; the exit status is returned, not raised (0 after --help, 2 after a bad
    option, whose one-line error argparse has printed), so the demo and scripts can call it."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
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

def add_validate(sub: argparse._SubParsersAction) -> None:
    from pipeline.cliargs import window_arg

    p = sub.add_parser("validate", help="run policies in the loop on this device; speedup, lossless, sim-vs-real report")
    add_model_head(p)
    p.add_argument("--policy", dest="policies", metavar="POLICY", action="append", default=[],
                   help="checkpoint dir or built-in spec (repeatable); with --load-trace, a load-aware serving "
                        "checkpoint (`draftgym train-load`, confidence depth <= 1) run as one more method")
    p.add_argument("--dataset", dest="datasets", metavar="DATASET", type=comma_list, help="comma-separated datasets")
    add_split(p)
    p.add_argument("--n-prompts", type=COUNT, help="first N prompts per dataset")
    p.add_argument("--temperature", type=NON_NEGATIVE_FLOAT, help="0 = greedy (outputs checked against AR); > 0 samples")
    p.add_argument("--runs", type=COUNT, help="Spec-Bench-style repeats (mean and std over runs)")
    p.add_argument("--max-new-tokens", type=COUNT, help="tokens generated per prompt")
    p.add_argument("--seed", type=NON_NEGATIVE, help="sampling seed base (seed + 1000 * run + prompt index)")
    p.add_argument("--logs", help="logs for grid-best + sim-vs-real ('' to skip)")
    add_device_dtype(p)
    p.add_argument("--logs-dtype", default=None, choices=DTYPES + ("fp32", "bf16", "fp16"),
                   help="dtype of the --logs acceptance logs when it is not --dtype (hardware transfer: logs collected in "
                        "one dtype replayed with this device's profile; sim-vs-real then shows what that costs) "
                        "(default: --dtype)")
    p.add_argument("--out", help="report folder (report.md, report.json, PNGs, cycles Parquet)")
    p.add_argument("--profile-first", action="store_true",
                   help="profile this device in situ (and each checkpoint's controller cost) into OUT right before "
                        "decoding; grid-best and sim-vs-real then use that profile")
    p.add_argument("--profile-verify-sizes", help="--profile-first: V values")
    p.add_argument("--profile-contexts", help="--profile-first: context lengths")
    p.add_argument("--profile-repeats", type=COUNT, help="--profile-first: at least this many cycles per (V, context)")
    p.add_argument("--profile-interleave", type=NON_NEGATIVE, metavar="ROUNDS",
                   help="ROUNDS further profile rounds spread between the generations (implies --profile-first); "
                        "sim-vs-real is then timed with the profile pooled over all rounds (which samples the same "
                        "machine states as the decoding), rescaled per dataset by the speed its samples saw while "
                        "that dataset decoded. With --batch-sizes: at every run and B, before each method's generation, "
                        "ROUNDS rounds of the methods' shapes on the batched engine; the replay is timed with the logs' "
                        "profile whose measured levels these replace (online/validate/interleave.py); 0: off")
    p.add_argument("--no-reanchor", dest="reanchor", action="store_false", default=None,
                   help="at T = 0, skip the re-anchored sim-vs-real (each method also replayed on its own decoded "
                        "text, collected after the decoding: online/validate/reanchor.py)")
    p.add_argument("--batch-sizes", help="comma-separated batch sizes B, e.g. 1,4,16: AR, each --shapes shape and the --schedule at each "
                        "B with the batched engine (queues of max(N, 2B) requests), per-B report, step table and "
                        "tokens/s-against-B plot (online/validate/batch.py) (default: none: the batch-1 validation)")
    p.add_argument("--shapes", help="with --batch-sizes or --load-trace: semicolon-separated static shapes, each chain:K or "
                        "tree:D,W,V")
    p.add_argument("--schedule", default=None,
                   help="with --batch-sizes or --load-trace: a schedule JSON written by `draftgym tune`, run as one more method "
                        "(default: none)")
    p.add_argument("--load-trace", default=None, metavar="FILE",
                   help="a file of arrival times (s, one per line or a JSON list): the batched engine serves the "
                        "requests as they arrive (continuous batching up to --max-batch rows) with AR, each --shapes "
                        "shape, the --schedule, vLLM's example schedule, SGLang's adaptive rule and each --policy, against "
                        "the serving replay of the same trace (online/validate/load.py) (default: none)")
    p.add_argument("--max-batch", type=COUNT, help="with --load-trace: the most rows decoding at once")
    p.add_argument("--row-budget-k", type=NON_NEGATIVE, help="with --load-trace: > 0 also serves vLLM's adaptive "
                   "verification over chains of K (per-request verify budgets; needs --logs for its cost tables)")
    p.add_argument("--nightjar-k", type=NON_NEGATIVE, help="with --load-trace: > 0 also serves Nightjar's bandit over "
                   "chains 0..K (simulator/serving/choosers/nightjar.py)")
    p.add_argument("--acceptance-model", default=None, metavar="FILE",
                   help="with --load-trace: an acceptance model (serve-eval --acceptance-model-out) to serve "
                        "DraftGym's learned per-request budget too (default: not served)")
    window_arg(p)
    add_json(p, "print the report as one JSON object")
    add_no_progress(p)
    set_command(p, _validate_config, "online.cli:run_validate_command",
                "online.validate.common:Batch1Config,BatchSizesConfig,LoadTraceConfig")
    p.set_defaults(flags={a.dest: a.option_strings[0] for a in p._actions if a.option_strings})   # dest -> its flag


def _validate_config(args):
    from online.validate.common import MODE_FIELDS, validate_mode

    mode = validate_mode({name: flag for name, flag in args.flags.items()             # the mode's own settings given
                          if name in MODE_FIELDS and getattr(args, name) not in (None, "")})
    ints = lambda name: given(getattr(args, name), lambda s: parse_positive_ints(s, "--" + name.replace("_", "-"))
                              if s else ())
    modal = {"batch_sizes": ints("batch_sizes"),
             "shapes": given(args.shapes, lambda s: tuple(x.strip() for x in s.split(";") if x.strip()))}
    names = {f.name for f in dataclasses.fields(mode)}
    return config_from_args(mode, args, logs=given(args.logs, lambda s: s or None),
                            profile_verify_sizes=ints("profile_verify_sizes"), profile_contexts=ints("profile_contexts"),
                            **{k: v for k, v in modal.items() if k in names})


def run_validate_command(cfg) -> int:
    """`draftgym validate` in its mode: batch 1 (online/validate/batch1.py), at --batch-sizes
    (online/validate/batch.py) or under a --load-trace (online/validate/load.py)."""
    from online.validate.common import BatchSizesConfig, LoadTraceConfig

    if isinstance(cfg, LoadTraceConfig):
        from online.validate.load import run_validate_load_command

        return run_validate_load_command(cfg)
    if isinstance(cfg, BatchSizesConfig):
        from online.validate.batch import run_validate_batch_command

        return run_validate_batch_command(cfg)
    from online.validate.batch1 import run_validate_batch1_command

    return run_validate_batch1_command(cfg)


def add_profile_policy(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile-policy", help="time trained policies' controller calls in the engine, into the newest profile")
    p.add_argument("--policy", dest="policies", metavar="POLICY", action="append", required=True,
                   help="checkpoint directory (repeatable)")
    p.add_argument("--logs", help="logs root holding the device's latency profile")
    add_model_head(p)
    p.add_argument("--max-new-tokens", type=COUNT, help="tokens decoded per timing generation")
    add_device_dtype(p)
    add_json(p, "print the result as one JSON object")
    add_no_progress(p)
    set_command(p, _profile_policy_config, "online.policy_cost:run_profile_policy_command",
                "online.policy_cost:ProfilePolicyConfig")


def _profile_policy_config(args):
    from online.policy_cost import ProfilePolicyConfig

    return config_from_args(ProfilePolicyConfig, args)


def add_vllm_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vllm-run", help="run prompts through the real vLLM engine (make vllm) with a head and a "
                                        "speculation config: tokens/s, TPOT, acceptance, lossless, its step costs")
    add_model_head(p)
    p.add_argument("--dataset", help="a built-in prompt set or a prompts file")
    add_split(p)
    p.add_argument("--n-prompts", type=COUNT, help="first N prompts of the split")
    p.add_argument("--max-new-tokens", type=COUNT, help="tokens generated per prompt")
    p.add_argument("--k", help="static configs, comma-separated: 0 = no speculation (always run, the lossless "
                               "reference), K > 0 = EAGLE-3 with K draft tokens")
    p.add_argument("--schedule", dest="schedules", metavar="FILE", action="append",
                   help="a `draftgym export --format vllm` speculative_config or a `draftgym tune` schedule (repeatable)")
    p.add_argument("--batch-sizes", help="closed batches: B requests in flight, refilled ('none': load runs only)")
    p.add_argument("--rates", help="Poisson load runs, requests/s, comma-separated")
    p.add_argument("--trace", help="a load run from a file of arrival times (s) (default: none)")
    p.add_argument("--load-requests", type=COUNT, help="requests per Poisson run (the prompts, cycled)")
    p.add_argument("--max-batch", type=COUNT, help="vLLM's max_num_seqs: the most requests in the engine at once")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="compute dtype (default: DraftGym's CPU default)")
    p.add_argument("--seed", type=NON_NEGATIVE, help="vLLM's seed and the arrivals'")
    p.add_argument("--no-check-ar", dest="check_ar", action="store_false", default=None,
                   help="skip the fp32 check of vLLM's outputs against DraftGym's own AR")
    p.add_argument("--compare-logs", help="logs root (collected with --widths 1): each chain's replayed acceptance "
                                          "beside vLLM's (default: no comparison)")
    p.add_argument("--cost-curve", help="with --compare-logs: price the replay with this vllm_steps.jsonl (an earlier "
                                        "run's) instead of this run's own closed batches (default: this run's)")
    p.add_argument("--out", help="report folder")
    p.add_argument("--timeout-s", type=COUNT, help="per engine")
    add_json(p, "print the report's summary as one JSON object")
    set_command(p, _vllm_run_config, "online.vllm.run:run_vllm_run_command", "online.vllm.run:VllmRunConfig")


def _vllm_run_config(args):
    from online.vllm.run import VllmRunConfig

    return config_from_args(VllmRunConfig, args, k=given(args.k, lambda s: parse_positive_ints(s, "--k", 0)),
                            batch_sizes=given(args.batch_sizes, lambda s: () if s.strip() in ("", "none") else
                                              parse_positive_ints(s, "--batch-sizes")),
                            rates=given(args.rates, lambda s: tuple(float(x) for x in comma_list(s))),
                            schedules=given(args.schedules, tuple))


if __name__ == "__main__":
    sys.exit(main())
