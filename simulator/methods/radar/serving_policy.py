"""RADAR at batch size B (method "radar-load"): a stop/continue policy walks the draft depths and stops
at the shared depth of the next `hold` serving steps. Trained by REINFORCE with a baseline in the
serving replay (simulator/methods/radar/serving_train.py: settings, action set, trainer; `draftgym
train-load --method radar`); replayed by simulator/serving/choosers/learned.py (`serve-eval --policy`).

RADAR decides after each draft forward whether to draft another (STOP / CONTINUE). At batch size B
one decision is made per held block, before drafting, for every row of the batch: the policy walks
levels d = 0 .. Dmax - 1 (d forwards done) and at each says STOP or CONTINUE from

    x_d = [s, d / Dmax, mean_r c_r(l), min_r c_r(l)],    l = min(max(d, 1), k)         [dim + 3]

s the load-aware observation (simulator/serving/observations.py: B, queue, context, accept-length
EMA, previous shape, then for depths 1..k the batch's mean and min confidence), c_r(l) the
confidence of the latest forward the walk has seen (the probe's depth 1 before any forward, the
observation's deepest, k, beyond it; zeros when k = 0): the walk reads only what the observation
holds, whose probe forwards the env and the replay already charge. Then

    D = the first level that says STOP (STOP at d = 0: off), Dmax if none does
    action = D, the index into `shapes` = [off, shape(1) .. shape(Dmax)] (labels), shape(D) = (D, W, V(D))
    with V(D) fixed by the trainer's rule (the chain's D + 1 at W = 1 by default)

One MLP [dim + 3] -> 2 serves every level (d is an input). Every x_d is known before drafting, so the
walk is one batched forward over the Dmax levels: one policy call per decision.
"""
from __future__ import annotations

import numpy as np

from simulator.policies.base import CONTINUE, STOP
from simulator.policies.nets import torch_logits
from simulator.methods.resps.serving_policy import LoadAwarePolicy

METHOD = "radar-load"
EXTRA_INPUTS = 3                # d / Dmax, the level's mean and min confidence


def level_inputs(obs: np.ndarray, spec: dict, max_depth: int) -> np.ndarray:
    """The walk's inputs x_d, d = 0 .. Dmax - 1 (module docstring): [n, dim] -> [n, Dmax, dim + 3].
    The observation ends with the k (mean, min) confidence pairs (observations.py), so depth l's
    mean sits at column dim - 2k + 2 (l - 1) and its min right after."""
    obs = np.asarray(obs, np.float32)
    n, dim = obs.shape
    k = int(spec["confidence_depth"])
    d = np.arange(max_depth)
    out = np.zeros((n, max_depth, dim + EXTRA_INPUTS), np.float32)
    out[:, :, :dim] = obs[:, None, :]
    out[:, :, dim] = d / max_depth
    if k:
        col = dim - 2 * k + 2 * (np.minimum(np.maximum(d, 1), k) - 1)     # [Dmax] the mean's column
        out[:, :, dim + 1], out[:, :, dim + 2] = obs[:, col], obs[:, col + 1]
    return out


def stop_depth(cont: np.ndarray) -> np.ndarray:
    """[n, Dmax] CONTINUE flags per level -> D [n]: the first level that stops, Dmax if none does."""
    return np.where(cont.all(1), cont.shape[1], np.argmin(cont, 1))


class RadarLoadPolicy(LoadAwarePolicy):
    """net: [m, dim + 3] -> [m, 2] (STOP, CONTINUE) logits; shapes: [off, shape(1) .. shape(Dmax)] as
    labels; act() -> D [n], the index into `shapes`."""

    def __init__(self, net, shapes, hold: int, obs: dict, name: str = METHOD, sample: bool = False,
                 width: int | None = None, verify=None):
        super().__init__(net, shapes, hold, obs, name=name, sample=sample)
        self.max_depth = len(self.shapes) - 1
        self.width, self.verify = width, verify                  # what shapes 1..Dmax are made of (describe())

    def walk_logits(self, obs: np.ndarray) -> np.ndarray:
        """[n, dim] -> [n, Dmax, 2] logits at every level (one batched forward)."""
        x = level_inputs(obs, self.obs_spec, self.max_depth)
        n, L, m = x.shape
        return torch_logits(self.net, x.reshape(n * L, m)).reshape(n, L, 2)

    def act(self, obs: np.ndarray) -> np.ndarray:
        z = self.walk_logits(obs)
        if self.sample:                                          # CONTINUE with prob sigmoid(z_C - z_S)
            cont = self.rng.random(z.shape[:2]) < 1.0 / (1.0 + np.exp(z[..., STOP] - z[..., CONTINUE]))
        else:
            cont = z[..., CONTINUE] > z[..., STOP]
        return stop_depth(cont)

    def describe(self) -> dict:
        return {**super().describe(), "width": self.width, "max_depth": self.max_depth, "verify": self.verify}

    @classmethod
    def from_checkpoint(cls, man: dict, nets: dict, name: str, sample: bool = False, hold: int | None = None):
        """From a manifest (simulator/methods/radar/serving_train.py writes it) and its loaded net."""
        c, sh = man["components"]["radar"], man["shape"]
        obs = {k: v for k, v in c["obs"].items() if k != "extra"}
        return cls(nets["radar"], c["action"]["shapes"], hold or c["action"]["hold"], obs, name=name, sample=sample,
                   width=sh.get("width"), verify=sh.get("verify"))
