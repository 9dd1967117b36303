"""RADAR's policy (seed: RADAR): an LSTM reads each draft forward's beam confidences and says
STOP or CONTINUE, at most `max_calls` forwards per cycle. Trained by REINFORCE on logged acceptance
distributions (simulator/methods/radar/train.py).

The net (simulator/policies/nets.py, make_radar_net): LSTMCell(k -> 128) over the per-call confidences x_t
(observations.radar_obs, [k]), then MLP([h_t, x_t] -> 128 -> 2); nets.NumpyRadar is the same step in
numpy for the online controller. obs_variant "rich" appends the best beam's entropy, the context
length and the acceptance history to each call's input (simulator/observations/rich.py).
"""
from __future__ import annotations

import numpy as np

from simulator.observations import paper as obs
from simulator.observations import rich
from simulator.policies.nets import NumpyRadar
from simulator.policies.base import CONTINUE, Policy, choose_action, const_shape


class RadarPolicy(Policy):
    """RADAR: an LSTM reads the per-call beam confidences; STOP/CONTINUE, at most `max_calls` forwards."""

    call_cost = "model"
    uses_depth_hook = True
    step_fields = ("beam_scores",)
    reads_root_scores = False

    def __init__(self, net, width: int = 10, verify_size: int = 60, max_calls: int = obs.RADAR_MAX_CALLS,
                 name: str = "radar", sample: bool = False, obs_variant: str = "paper"):
        self.net, self.width, self.verify, self.max_calls = net, width, verify_size, max_calls
        self.name, self.sample = name, sample
        self.rng = np.random.default_rng(0)
        self._np = None                            # NumpyRadar copy, built on the first batch-1 call
        self._set_obs_variant(obs_variant, ("beam_scores", "entropy"))

    def reset(self, n_envs, seed=0):
        self.h = np.zeros((n_envs, self.net.hidden), np.float32)     # [n_envs, hidden] LSTM state
        self.c = np.zeros((n_envs, self.net.hidden), np.float32)
        self.rng = np.random.default_rng(seed)
        self._reset_history(n_envs)

    def plan(self, b):
        self._history_plan(b)
        self.h[b.env] = 0.0
        self.c[b.env] = 0.0
        return const_shape(len(b.env), self.max_calls, self.width, self.verify)

    # batch-1 fast paths (see the module docstring)
    def plan_one(self, ctx) -> tuple[int, int, int]:
        self._history_plan_one(ctx)
        self.h[0] = 0.0
        self.c[0] = 0.0
        return self.max_calls, self.width, self.verify

    def continue_one(self, step) -> bool:
        x = obs.radar_obs_one(obs.to_numpy(step.beam_scores), self.width)    # [W]
        if self.rich:                                                        # [W + 6]
            x = rich.with_extra(x, rich.radar_extra(rich.entropy_feature_one(step.entropy), step.context_len,
                                                    self.hist.features_one()))
        self._np = NumpyRadar.fresh(self._np, self.net)
        logits, self.h[0], self.c[0] = self._np(x, self.h[0], self.c[0])
        return bool(choose_action(logits[None], self.sample, self.rng)[0] == CONTINUE)

    def continue_drafting(self, s):
        import torch

        x = obs.radar_obs(s.beam_scores, self.width)                  # [n, k]
        idx = np.asarray(s.env)
        if self.rich:                                                  # [n, k + 6]
            x = rich.with_extra(x, rich.radar_extra(rich.entropy_feature(s.entropy), s.context_len,
                                                    self.hist.features(idx)))
        if len(x) == 1:                  # batch 1 (the online controller): numpy forward, same function
            self._np = NumpyRadar.fresh(self._np, self.net)
            logits, h, c = self._np(x[0], self.h[idx[0]], self.c[idx[0]])
            self.h[idx[0]], self.c[idx[0]] = h, c
            return choose_action(logits[None], self.sample, self.rng) == CONTINUE
        with torch.no_grad():
            logits, (h, c) = self.net(torch.from_numpy(x), (torch.from_numpy(self.h[idx]), torch.from_numpy(self.c[idx])))
        self.h[idx], self.c[idx] = h.numpy(), c.numpy()
        return choose_action(logits.numpy(), self.sample, self.rng) == CONTINUE
