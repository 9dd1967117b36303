"""Policy specs: the one parser of `--policy` strings, and the registry that turns one into a `Policy`.

A spec is a checkpoint directory written by `draftgym train` or `draftgym train-load` (a serving
policy, which only `draftgym serve-eval --policy` replays) (or its `manifest.json`), or a built-in:
`static:D,W,V`, `ddd[:threshold]`, `entropy[:theta]`, `goodput`, `oracle[:static|depth]`,
`random[:seed]`. `parse_spec` reads one into (name, args) and refuses a bad one in one line;
`load_policy` builds the policy. `draftgym evaluate`, `draftgym validate` and the online
controllers (online/adapters/specs.py) all go through here.
"""
from __future__ import annotations

from pathlib import Path

from pipeline.errors import DraftGymError
from simulator import baselines
from simulator.policies.base import Policy
from simulator.methods.checkpoint import load_checkpoint

CHECKPOINT = "checkpoint"
BUILTINS = "static:D,W,V, ddd[:threshold], entropy[:theta], goodput, oracle[:static|depth], random[:seed]"


def parse_spec(spec: str) -> tuple[str, tuple]:
    """A spec -> (name, args):

        <dir> or <dir>/manifest.json   ("checkpoint", (path,))
        static:D,W,V                    ("static", (D, W, V))        ints >= 1
        ddd[:threshold]                 ("ddd", ()) or ("ddd", (threshold,))
        entropy[:theta]                 ("entropy", ()) or ("entropy", (theta,))
        goodput                         ("goodput", ())
        oracle[:static|depth]           ("oracle", (space,))         default "static"
        random[:seed]                   ("random", (seed,))          default 0
    """
    if Path(spec).is_dir() or spec.endswith("manifest.json"):
        return CHECKPOINT, (spec,)
    name, colon, arg = spec.partition(":")
    try:
        if name == "static":
            shape = tuple(int(x) for x in arg.split(","))
            if len(shape) != 3 or min(shape) < 1:
                raise ValueError("D, W and V must be three integers >= 1")
            return name, shape
        if name in ("ddd", "entropy"):
            return name, (float(arg),) if arg else ()
        if name == "goodput" and not colon:
            return name, ()
        if name == "oracle":
            if arg not in ("", "static", "depth"):
                raise ValueError("the oracle's space is static or depth")
            return name, (arg or "static",)
        if name == "random":
            return name, (int(arg) if arg else 0,)
    except ValueError as e:
        raise DraftGymError(f"bad policy spec {spec!r}: {e}") from None
    raise DraftGymError(f"unknown policy {spec!r}: no checkpoint directory there (policy not found), "
                        f"and not a built-in ({BUILTINS})")


def load_policy(spec: str, logs=None, latency=None, fit_logs=None) -> Policy:
    """A policy from a checkpoint directory or a built-in spec (`parse_spec`).

    logs / latency: needed by `oracle` (dynamic programming over these logs) and `goodput`
    (fit on `fit_logs`, default `logs`)."""
    name, args = parse_spec(spec)
    width = logs.width if logs is not None else 10
    if name == CHECKPOINT:
        return load_checkpoint(*args)
    if name == "static":
        return baselines.StaticPolicy(*args)
    if name == "ddd":
        return baselines.DDDPolicy(threshold=args[0] if args else baselines.DDDPolicy.threshold, width=width)
    if name == "entropy":
        return baselines.EntropyStopPolicy(theta=args[0] if args else baselines.EntropyStopPolicy.theta, width=width)
    if name == "random":
        return baselines.RandomShapePolicy(logs, seed=args[0])
    if latency is None or logs is None:                  # goodput, oracle
        raise DraftGymError(f"{name} needs logs and a latency model")
    if name == "goodput":
        return baselines.GoodputPolicy.fit(fit_logs if fit_logs is not None else logs, latency, width=width)
    return baselines.OraclePolicy(logs, latency, space=args[0])
