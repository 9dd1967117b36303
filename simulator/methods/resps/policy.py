"""Re-SpS's policy (seed: Re-SpS): an MLP picks the whole tree shape (V, D, W) from a fixed list and
holds it for `hold` cycles, one policy call per hold. Its input is the previous cycle's root scores,
acceptance and shape, and the context length (observations.resps_obs). Trained by PPO in the replay
env with held actions (simulator/methods/resps/train.py). obs_variant "rich" appends the acceptance history
(an exponential average over all cycles so far, simulator/observations/rich.py), kept by plan(),
which the engine calls every cycle.
"""
from __future__ import annotations

import numpy as np

from simulator.observations import paper as obs
from simulator.observations import rich
from simulator.policies.nets import torch_logits
from simulator.policies.base import Policy, Shape, choose_action


class RespsPolicy(Policy):
    """Re-SpS: an MLP picks (V, D, W) from a fixed list, held for `hold` cycles (one call per hold)."""

    call_cost = "model"

    def __init__(self, net, shapes, hold: int = 30, max_depth: int = 12, name: str = "resps", sample: bool = False,
                 obs_variant: str = "paper"):
        self.net, self.shapes = net, np.asarray(shapes, np.int64)        # [A, 3] (V, D, W)
        self.hold, self.max_depth, self.name, self.sample = hold, max_depth, name, sample
        self.rng = np.random.default_rng(0)
        self._set_obs_variant(obs_variant)

    def reset(self, n_envs, seed=0):
        self.current = np.zeros(n_envs, np.int64)
        self.age = np.zeros(n_envs, np.int64)            # cycles since the last call
        self.rng = np.random.default_rng(seed)
        self._reset_history(n_envs)

    def plan(self, b):
        self._history_plan(b)            # every cycle, also inside a hold
        call = (b.cycle == 0) | (self.age[b.env] >= self.hold)
        if call.any():
            i = np.flatnonzero(call)
            o = obs.resps_obs(b.last_root_scores[i], b.last_accepted[i], b.last_depth[i], b.last_verify[i],
                              b.last_width[i], b.last_emitted[i], b.context_len[i], b.has_last[i], self.max_depth)
            if self.rich:
                o = rich.with_extra(o, self.hist.features(b.env[i]))
            self.current[b.env[i]] = choose_action(torch_logits(self.net, o), self.sample, self.rng)
            self.age[b.env[i]] = 0
        self.age[b.env] += 1
        a = self.shapes[self.current[b.env]]
        return Shape(a[:, 1].copy(), a[:, 2].copy(), a[:, 0].copy(), call.astype(np.int64))
