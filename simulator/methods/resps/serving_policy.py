"""A load-aware serving policy (Re-SpS style, at batch size B): an MLP picks the one shape shared by
every row of a serving step from a fixed list, and the shape is held for `hold` steps.

Its input is the load-aware observation (simulator/serving/observations.py: the batch size, the
queue, the rows' mean context, the accept-length EMA, the previous shape and the batch's draft
confidences); its output indexes `shapes` (labels: "off", "chain:K", "tree:D,W,V"). Trained by PPO in
the load-aware replay env (simulator/serving/env.py, `draftgym train-load`); replayed under load by
simulator/serving/choosers/learned.py (`draftgym serve-eval --policy DIR`).

It decides for a batch, not for one generation, so it has none of the batch-1 hooks: `draftgym
evaluate` and the online controller refuse it in one line.
"""
from __future__ import annotations

import numpy as np

from pipeline.errors import DraftGymError
from simulator.policies.base import Policy, choose_action
from simulator.policies.nets import torch_logits


class LoadAwarePolicy(Policy):
    """net: [n, obs dim] -> logits [n, len(shapes)]; obs: the manifest's observation spec (a dict)."""

    serving = True                       # a serving-step policy (simulator/serving/choosers/learned.py wraps it)
    call_cost = "model"

    def __init__(self, net, shapes, hold: int, obs: dict, name: str = "resps-load", sample: bool = False):
        if hold < 1:
            raise DraftGymError(f"{name}: hold must be >= 1, got {hold}")
        self.net, self.shapes, self.hold, self.obs_spec = net, list(shapes), int(hold), dict(obs)
        self.name, self.sample = name, sample
        self.rng = np.random.default_rng(0)

    def reset(self, n_envs: int = 1, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray) -> np.ndarray:
        """[n, dim] observations -> [n] indices into `shapes` (argmax, or a draw when `sample`)."""
        return choose_action(torch_logits(self.net, obs), self.sample, self.rng)

    def plan(self, b):
        raise DraftGymError(f"{self.name} is a load-aware serving policy (one shape per batch step): replay it "
                            f"with `draftgym serve-eval --policy`, not as a batch-1 policy")

    def describe(self) -> dict:
        return {"name": self.name, "shapes": self.shapes, "hold": self.hold, "obs": self.obs_spec}
