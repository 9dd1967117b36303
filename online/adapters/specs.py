"""The built-in controllers: a `--policy` spec as a controller for the real engine.

The controller interface (the hooks the engine calls every cycle) is `pipeline/decode/controller.py`,
with the static EAGLE-3 shape `StaticController`. A spec (parsed by `simulator/policy_specs.py`: a
checkpoint directory written by `draftgym train`, or `static:D,W,V`, `ddd[:thr]`, `entropy[:theta]`,
`goodput`, `random[:seed]`) becomes a StaticController for a static shape, and any other policy runs
through the policy adapter, `online/adapters/policy.py`'s `PolicyController`, which builds the
observations with the very functions the simulator used (`simulator.observations.paper`), so a
policy sees the same inputs online as in training. The engine times each controller call as
t_controller.
"""
from __future__ import annotations

from pathlib import Path

from online.adapters.policy import PolicyController
from pipeline.decode.controller import Controller, StaticController
from pipeline.errors import DraftGymError
from simulator.policy_specs import CHECKPOINT, load_policy, parse_spec


def policy_label(spec: str) -> str:
    """A short display name: the checkpoint directory's name, or the built-in spec (a bad spec is
    refused here, in one line)."""
    if parse_spec(spec)[0] != CHECKPOINT:
        return spec
    p = Path(spec)
    return (p.parent if p.name == "manifest.json" else p).name


def make_controller(spec: str, logs=None, latency=None) -> Controller:
    """Engine controller for a policy spec (parsed by simulator.policy_specs.parse_spec): a static
    shape runs as the engine's own StaticController, anything else as a PolicyController."""
    name, args = parse_spec(spec)
    if name == "static":
        return StaticController(*args)
    if name == "oracle":
        raise DraftGymError("the oracle needs the logged future: it exists only in the simulator")
    return PolicyController(load_policy(spec, logs=logs, latency=latency))
