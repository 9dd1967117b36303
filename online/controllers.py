"""Controllers that run trained policies (or baselines) inside the real engine.

A policy spec is what `draftgym evaluate --policy` takes: a checkpoint directory written by
`draftgym train`, or a built-in (`static:D,W,V`, `ddd[:thr]`, `entropy[:theta]`, `goodput`,
`random[:seed]`). The online controller is `online.policy_controller.PolicyController`: it builds the
observations with the very functions the simulator used (`simulator.observations`), so a policy
sees the same inputs online as in training. Depth decisions come after every draft forward, size
decisions once per cycle, and held tree shapes (Re-SpS) through `plan`; the engine times each
call as t_controller.
"""
from __future__ import annotations

from pipeline.controller import Controller, StaticController
from pipeline.errors import DraftGymError


def policy_label(spec: str) -> str:
    """A short display name: the checkpoint directory's name, or the built-in spec."""
    from pathlib import Path

    p = Path(spec)
    return p.name if p.is_dir() else spec


def make_controller(spec: str, logs=None, latency=None) -> Controller:
    """Engine controller for a policy spec (see module docstring)."""
    from online.policy_controller import PolicyController
    from simulator.checkpoint import load_policy

    if spec.startswith("static:"):
        try:
            D, W, V = (int(x) for x in spec.split(":", 1)[1].split(","))
        except ValueError:
            raise DraftGymError(f"bad static spec {spec!r}: use static:D,W,V") from None
        return StaticController(D, W, V)
    if spec.startswith("oracle"):
        raise DraftGymError("the oracle needs the logged future: it exists only in the simulator")
    return PolicyController(load_policy(spec, logs=logs, latency=latency))
