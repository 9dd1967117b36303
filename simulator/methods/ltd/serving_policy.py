"""LTD at batch size B (method "ltd-load"): a depth head and a size head over the load-aware
observation pick the shared shape of the next `hold` serving steps. Trained by PPO on the joint
log-prob in the serving replay (simulator/methods/ltd/serving_train.py: settings, action set, trainer;
`draftgym train-load --method ltd`); replayed by simulator/serving/choosers/learned.py (`serve-eval --policy`).

LTD ("Learning to Draft") has a depth policy and a size policy. At batch size B one decision is made
per held block, before drafting, for every row of the batch, from the load-aware observation s
(simulator/serving/observations.py: B, queue, context, accept-length EMA, previous shape, the batch's
aggregated draft confidences):

    depth head   pi_D(D | s),      D in {0 (off), 1 .. Dmax}            MLP [dim] -> [Dmax + 1]
    size head    pi_V(j | s, D),   V = verify_sizes[j]                  MLP [dim + 1] -> [len(verify_sizes)]
                 (input [s, D / Dmax]: as LTD's size policy, it sees the drafted depth)
    shape        canonical(D, W, V_j), W fixed (W = 1: chain D, V clamped to D + 1)
    action       index[D, j]: the position of that shape in `shapes`

The policy's output is an index into its list of shapes, as every load-aware serving policy's: the
env, the load replay and the chooser speak shape indices, and the manifest names every shape the
policy can play; `index` ([Dmax + 1, len(verify_sizes)], saved in the manifest) maps the structured
decision there (several (D, j) can share a shape: at W = 1 every V >= D + 1 is chain D).

A decision is one batched forward (the size head read at the chosen D), charged as one policy call.
"""
from __future__ import annotations

import numpy as np

from pipeline.errors import DraftGymError
from simulator.policies.base import choose_action
from simulator.policies.nets import torch_logits
from simulator.methods.resps.serving_policy import LoadAwarePolicy

METHOD = "ltd-load"


def size_input(obs: np.ndarray, depth, max_depth: int) -> np.ndarray:
    """The size head's input [n, dim + 1]: the observation and D / Dmax."""
    d = np.asarray(depth, np.float32) / np.float32(max_depth)
    return np.concatenate([np.asarray(obs, np.float32), d[:, None]], 1)


class LTDLoadPolicy(LoadAwarePolicy):
    """depth_net: [n, dim] -> [n, Dmax + 1]; size_net: [n, dim + 1] -> [n, len(verify_sizes)];
    index [Dmax + 1, len(verify_sizes)] into `shapes` (labels); act() -> [n] indices into `shapes`."""

    def __init__(self, depth_net, size_net, shapes, index, verify_sizes, width: int, hold: int, obs: dict,
                 name: str = METHOD, sample: bool = False):
        super().__init__(depth_net, shapes, hold, obs, name=name, sample=sample)
        self.size_net, self.width, self.verify_sizes = size_net, int(width), [int(v) for v in verify_sizes]
        self.index = np.asarray(index, np.int64)
        self.max_depth = self.index.shape[0] - 1
        if self.index.shape != (self.max_depth + 1, len(self.verify_sizes)) or self.max_depth < 1 or \
                not ((0 <= self.index) & (self.index < len(self.shapes))).all():
            raise DraftGymError(f"{name}: the decision index {self.index.shape} does not fit D = 0..Dmax x "
                                f"{len(self.verify_sizes)} verify sizes into {len(self.shapes)} shapes")

    def decide(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[n, dim] -> (D [n], j [n]): argmax (or a draw when `sample`) of each head, the size head at D."""
        obs = np.asarray(obs, np.float32)
        d = choose_action(torch_logits(self.net, obs), self.sample, self.rng)
        j = choose_action(torch_logits(self.size_net, size_input(obs, d, self.max_depth)), self.sample, self.rng)
        return d, j

    def act(self, obs: np.ndarray) -> np.ndarray:
        d, j = self.decide(obs)
        return self.index[d, j]

    def describe(self) -> dict:
        return {**super().describe(), "width": self.width, "max_depth": self.max_depth,
                "verify_sizes": self.verify_sizes}

    @classmethod
    def from_checkpoint(cls, man: dict, nets: dict, name: str, sample: bool = False, hold: int | None = None):
        """From a manifest (simulator/methods/ltd/serving_train.py writes it) and its loaded nets."""
        a, sh = man["components"]["depth"]["action"], man["shape"]
        return cls(nets["depth"], nets["size"], a["shapes"], a["index"], sh["verify_sizes"], sh["width"],
                   hold or a["hold"], man["components"]["depth"]["obs"], name=name, sample=sample)
