"""`draftgym` subcommands that live in simulator/: evaluate, train, transfer, synth-logs, latency-report.

Registered by `online.cli.build_parser`; heavy imports happen inside the handlers.
"""
from __future__ import annotations

import argparse
import json

from pipeline.cliargs import add_no_progress


def register(sub: argparse._SubParsersAction) -> None:
    for add in (add_evaluate, add_train, add_transfer, add_synth, add_latency_report):
        add(sub)


def _logs_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--logs", required=True, help="logs root (sequences/, positions/, latency/)")
    p.add_argument("--model", default=None, help="model partition (default: the only one)")
    p.add_argument("--temperature", type=float, default=None, help="temperature partition (default: the only one)")
    p.add_argument("--dataset", default=None, help="comma-separated datasets (default: all)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="the logs' compute dtype (default: the only one); the latency profile must be of the same dtype")
    p.add_argument("--latency-dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="time the replay with a latency profile of this dtype instead of the logs' own (a transfer "
                        "experiment: one set of acceptance logs, another device or dtype's clock)")
    p.add_argument("--profile", default=None, help="latency profile_id (default: the newest of the logs' dtype)")
    p.add_argument("--latency", default=None, help="root holding latency/ (default: --logs)")


def add_evaluate(sub) -> None:
    p = sub.add_parser("evaluate", help="replay policies and baselines on logged decoding (tau, tokens/s, speedups)")
    _logs_args(p)
    p.add_argument("--split", default="test", help="train | val | test | all")
    p.add_argument("--policy", action="append", default=[],
                   help="checkpoint dir, or static:D,W,V | ddd[:thr] | entropy[:theta] | goodput | "
                        "oracle[:static|depth] | random[:seed] (repeatable)")
    p.add_argument("--tune-split", default="auto", help="split for grid-best selection (default: val, else train)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run_evaluate)


def _run_evaluate(args) -> int:
    from simulator.evaluate import run_evaluate

    return run_evaluate(args)


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train a policy in the replay simulator (radar | ltd | resps)")
    _logs_args(p)
    p.add_argument("--method", required=True, choices=["radar", "ltd", "resps"], help="radar (REINFORCE stop/continue), ltd (PPO depth + size), resps (PPO tree shape, held N cycles)")
    p.add_argument("--out", required=True, help="policy directory (checkpoint + manifest.json + curve PNG)")
    p.add_argument("--steps", type=int, default=None,
                   help="budget: ltd = depth env steps per depth phase (size phases get a quarter; default 200k); "
                        "radar = gradient steps (default 3000); resps = decisions (default 30k)")
    p.add_argument("--seed", type=int, default=0, help="training seed (nets, rollouts)")
    p.add_argument("--split", default="train", help="training split (validation uses val when present)")
    p.add_argument("--width", type=int, default=None, help="W (default 10 when logged)")
    p.add_argument("--n-envs", type=int, default=None, help="parallel replay environments (default: the method's own)")
    p.add_argument("--iters", default=None, help="ltd: co-adaptation iterations to run, e.g. 0,1,2,3 (default all)")
    p.add_argument("--action-space", default="seeds", choices=["seeds", "wide"],
                   help="seeds: the papers' action sets (design.md); wide: adds shallow/small trees "
                        "(LTD V in the logged grid 2..240, Re-SpS D 1..8 and V 2..128), for devices like CPUs "
                        "where a large verify costs several AR steps")
    p.add_argument("--obs", default="paper", choices=["paper", "rich"],
                   help="observations: paper (each seed's own) or rich (adds the best beam's entropy and the "
                        "acceptance history of the generation; simulator/observations_rich.py)")
    p.add_argument("--objective", default="ratio", choices=["ratio", "rate"],
                   help="cycle reward: ratio (the seeds' (L+1)/t_cycle per cycle) or rate ((L+1) - lambda t_cycle "
                        "with lambda = grid-best's replay tokens/s on the training split: maximises the "
                        "generation's tokens/s, not the mean cycle's; simulator/env_core.py)")
    p.add_argument("--verify-size", type=int, default=None,
                   help="V for RADAR and LTD's Iter0 depth phase (default 60; with --action-space wide, "
                        "the grid-best static V on the training split)")
    add_no_progress(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run_train)


def add_transfer(sub) -> None:
    p = sub.add_parser("transfer", help="hardware transfer: a policy per latency profile from one set of logs, "
                                        "each replayed under every profile (a 2 x 2 table vs grid-best)")
    p.add_argument("--logs", required=True, help="logs root (sequences/, positions/, latency/)")
    p.add_argument("--model", default=None, help="model partition (default: the only one)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="the logs' compute dtype (default: the only one)")
    p.add_argument("--temperature", type=float, default=None,
                   help="the logs' temperature partition (default: the only one; a root holding T = 0 and T = 1 "
                        "logs needs it)")
    p.add_argument("--latency", default=None, help="root holding latency/ (default: --logs)")
    p.add_argument("--profiles", required=True,
                   help="comma-separated profile specs: a dtype (float32 | bfloat16 | float16: its newest profile) "
                        "or id:<profile_id>; e.g. float32,bfloat16")
    p.add_argument("--method", required=True, choices=["radar", "ltd", "resps"], help="the policy to train")
    p.add_argument("--out", required=True, help="directory: policy-<profile>/ per profile, transfer.{json,md,png}")
    p.add_argument("--split", default="test", help="split the table is measured on (grid-best is picked on val)")
    p.add_argument("--steps", type=int, default=None, help="training budget, as `draftgym train --steps`")
    p.add_argument("--seed", type=int, default=0, help="training seed (the same for every profile)")
    p.add_argument("--n-envs", type=int, default=None, help="parallel replay environments, as `draftgym train`")
    p.add_argument("--iters", default=None, help="ltd: co-adaptation iterations, as `draftgym train`")
    p.add_argument("--action-space", default="wide", choices=["seeds", "wide"],
                   help="as `draftgym train` (default wide: a CPU's best trees are small)")
    p.add_argument("--obs", default="paper", choices=["paper", "rich"], help="observations, as `draftgym train`")
    p.add_argument("--objective", default="ratio", choices=["ratio", "rate"],
                   help="cycle reward, as `draftgym train` (rate: lambda is each profile's own grid-best)")
    add_no_progress(p)
    p.set_defaults(func=_run_transfer)


def _run_transfer(args) -> int:
    from simulator.transfer import run_transfer_command

    train_args = ["--seed", str(args.seed), "--action-space", args.action_space, "--obs", args.obs,
                  "--objective", args.objective]
    for flag, v in (("--steps", args.steps), ("--n-envs", args.n_envs), ("--iters", args.iters),
                    ("--dtype", args.dtype), ("--latency", args.latency), ("--model", args.model),
                    ("--temperature", args.temperature)):
        if v is not None:
            train_args += [flag, str(v)]
    if args.no_progress:
        train_args.append("--no-progress")

    def train(argv: list[str]) -> int:
        parser = argparse.ArgumentParser(prog="draftgym")
        add_train(parser.add_subparsers())
        return _run_train(parser.parse_args(["train", *argv]))

    return run_transfer_command(args, train_args, train)


def _run_train(args) -> int:
    from pipeline.errors import DraftGymError

    try:
        if args.method == "ltd":
            from simulator.train_ltd import run_cli
        elif args.method == "radar":
            from simulator.train_radar import run_cli
        else:
            from simulator.train_resps import run_cli
    except ImportError as e:
        raise DraftGymError(f"training method {args.method!r} is not available in this checkout ({e})") from None
    return run_cli(args)


def add_synth(sub) -> None:
    p = sub.add_parser("synth-logs", help="write synthetic logs with the real schemas (tests, demos)")
    p.add_argument("--out", required=True, help="output logs root")
    p.add_argument("--n-sequences", type=int, default=10, help="per dataset")
    p.add_argument("--widths", default="10", help="comma-separated W values")
    p.add_argument("--temperature", type=float, default=0.0, help="the logs' temperature partition")
    p.add_argument("--latency-profile", default="cpu", choices=["cpu", "gpu", "none"], help="synthetic latency profile shape")
    p.add_argument("--seed", type=int, default=0, help="random seed of the synthetic data")
    p.set_defaults(func=_run_synth)


def _run_synth(args) -> int:
    from pipeline.errors import DraftGymError
    from simulator.synthetic import SyntheticConfig, write_synthetic_logs

    try:
        widths = tuple(int(w) for w in args.widths.split(","))
    except ValueError:
        raise DraftGymError(f"--widths must be comma-separated integers, got {args.widths!r}") from None
    cfg = SyntheticConfig(n_sequences=args.n_sequences, widths=widths, temperature=args.temperature, seed=args.seed,
                          latency_profile=None if args.latency_profile == "none" else args.latency_profile)
    print(json.dumps(write_synthetic_logs(args.out, cfg)))
    return 0


def add_latency_report(sub) -> None:
    p = sub.add_parser("latency-report", help="fit report (and plot) of the latency model of a logs root")
    p.add_argument("--logs", required=True, help="logs root holding latency/")
    p.add_argument("--model", default=None, help="model partition (default: the only one)")
    p.add_argument("--profile", default=None, help="latency profile_id (default: the newest)")
    p.add_argument("--plot", default=None, help="write a PNG of measured points and interpolated curves")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run_latency_report)


def _run_latency_report(args) -> int:
    from simulator.latency import LatencyModel

    lat = LatencyModel.from_logs(args.logs, model=args.model, profile=args.profile)
    rep = lat.fit_report()
    rep["radar_constants_ctx512"] = dict(zip(("T0", "Tf", "Teye"), lat.radar_constants(512)))
    if args.plot:
        lat.plot(args.plot)
        rep["plot"] = args.plot
    if args.json:
        print(json.dumps(rep))
    else:
        print(f"latency profile {rep['profile']} ({rep['device']})")
        for op, r in rep["ops"].items():
            if "points" in r:
                loo = "n/a" if r["loo_mean_rel_err"] is None else f"{100 * r['loo_mean_rel_err']:.2f}% mean, " \
                                                                  f"{100 * r['loo_max_rel_err']:.2f}% max"
                print(f"  {op:10s} {r['points']:4d} points, x {r['x_range']}, ctx {r['ctx_range']}, "
                      f"leave-one-out error {loo}")
            else:
                print(f"  {op:10s} {1e3 * r['median_s']:.3f} ms per call")
        c = rep["radar_constants_ctx512"]
        print(f"  RADAR at ctx 512: T0 {1e3 * c['T0']:.2f} ms, Tf {1e3 * c['Tf']:.2f} ms, Teye {1e3 * c['Teye']:.3f} ms")
    return 0
