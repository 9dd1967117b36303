"""LTD's policies (seed: LTD, "Learning to Draft"): two MLPs over the draft's confidences.

    depth policy   after each draft forward: STOP / CONTINUE from the sorted candidate scores of that
                   forward, the depth and the context length (observations.ltd_depth_obs, [W*W + 2])
    size policy    before verification: V from the per-level sorted scores of the whole pool, the
                   drafted depth and the context length (observations.ltd_size_obs)

Either may be absent: a depth-only policy verifies a fixed V, a size-only policy drafts a fixed depth.
obs_variant "rich" appends the best beam's entropy and the acceptance history to the depth input and
the acceptance history to the size input (simulator/observations/rich.py); plan() keeps the history.
Trained by PPO in the replay env (simulator/methods/ltd/train.py).
"""
from __future__ import annotations

import numpy as np

from pipeline.decode.step_shape import pool_size
from simulator.observations import paper as obs
from simulator.observations import rich
from simulator.policies.base import CONTINUE, Policy, choose_action, const_shape
from simulator.policies.nets import NumpyMLP, torch_logits


class LTDPolicy(Policy):
    """LTD: an MLP depth policy (STOP/CONTINUE after each forward) and/or an MLP size policy (V)."""

    call_cost = "model"
    step_fields = ("candidate_scores",)

    def __init__(self, depth_net=None, size_net=None, width: int = 10, max_depth: int = 12, verify_size: int = 60,
                 size_values=obs.SIZE_ACTIONS, name: str = "ltd", sample: bool = False, fixed_depth: int = 8,
                 obs_variant: str = "paper"):
        self.depth_net, self.size_net = depth_net, size_net
        self.width, self.max_depth, self.verify = width, max_depth, verify_size
        self.size_values = np.asarray(size_values, np.int64)
        self.name, self.sample, self.fixed_depth = name, sample, fixed_depth
        self.uses_depth_hook = depth_net is not None
        self.uses_size_hook = size_net is not None
        self.rng = np.random.default_rng(0)
        self._np_depth = self._np_size = None      # NumpyMLP copies, built on the first batch-1 call
        self._set_obs_variant(obs_variant, ("candidate_scores", "entropy"))
        # continue_one's observation, filled in place: [W*W + 2] (paper) or [W*W + 7] (rich)
        self._depth_obs = np.empty(rich.obs_dim("ltd_depth", obs_variant, width), np.float32)

    def reset(self, n_envs, seed=0):
        self.rng = np.random.default_rng(seed)
        self._reset_history(n_envs)

    def plan(self, b):
        self._history_plan(b)
        D = self.max_depth if self.uses_depth_hook else self.fixed_depth
        return const_shape(len(b.env), D, self.width, self.verify)

    def continue_drafting(self, s):
        c = s.sorted_candidates
        o = obs.ltd_depth_obs(c if c is not None else s.candidate_scores, s.depth, s.context_len, self.width,
                              presorted=c is not None)
        if self.rich:
            o = rich.with_extra(o, rich.ltd_depth_extra(rich.entropy_feature(s.entropy), self.hist.features(s.env)))
        if len(o) == 1:                  # batch 1 (the online controller): numpy forward, same function
            self._np_depth = NumpyMLP.fresh(self._np_depth, self.depth_net)
            return choose_action(self._np_depth(o[0])[None], self.sample, self.rng) == CONTINUE
        return choose_action(torch_logits(self.depth_net, o), self.sample, self.rng) == CONTINUE

    # batch-1 fast paths (see the module docstring): same observations, nets and decisions as the
    # batched hooks, with a few numpy calls instead of ~40 torch calls per cycle, which would otherwise
    # make up most of LTD's controller time.
    reads_root_scores = False

    def plan_one(self, ctx) -> tuple[int, int, int]:
        self._history_plan_one(ctx)
        return (self.max_depth if self.uses_depth_hook else self.fixed_depth), self.width, self.verify

    def continue_one(self, step) -> bool:
        k, o = self.width * self.width, self._depth_obs
        obs.ltd_depth_obs_one(obs.to_numpy(step.candidate_scores), step.depth, step.context_len, self.width,
                              out=o[:k + 2])                                                # [W*W + 2]
        if self.rich:                                        # [W*W + 7]: + [H_d / scale, history(4)]
            o[k + 2] = rich.entropy_feature_one(step.entropy)
            o[k + 3:] = self.hist.features_one()
        self._np_depth = NumpyMLP.fresh(self._np_depth, self.depth_net)
        return bool(choose_action(self._np_depth(o)[None], self.sample, self.rng)[0] == CONTINUE)

    def verify_size_one(self, pool_scores: np.ndarray, depth: int, context_len: int, verify: int) -> int:
        """verify_size for one generation: pool_scores [W + (D-1) W^2], one DraftPool row."""
        live, tail = obs.ltd_size_obs_parts(pool_scores, self.width, depth, context_len, self.max_depth)
        if self.rich:                   # the history follows [depth, context] at the end of the vector
            tail = np.concatenate([tail, self.hist.features_one()])
        logits = self._size_mlp().call_parts(live, tail)
        return int(self.size_values[choose_action(logits[None], self.sample, self.rng)[0]])

    def _size_mlp(self) -> NumpyMLP:
        """The size net's numpy copy; levels deeper than the drafted depth hold SCORE_FLOOR and the
        last columns are [depth, context] (+ the history, rich) (the `live` / `call_parts` layout)."""
        if self._np_size is None or self._np_size.stale(self.size_net):
            n = rich.obs_dim("ltd_size", self.obs_variant, self.width, self.max_depth)
            pad = np.full(n, obs.SCORE_FLOOR, np.float32)
            self._np_size = NumpyMLP(self.size_net, pad=pad, tail=2 + (rich.HISTORY_DIM if self.rich else 0))
        return self._np_size

    def verify_size(self, pool, verify):
        o = obs.ltd_size_obs(pool.level_scores, pool.depth, pool.context_len, self.width, self.max_depth, presorted=True)
        if self.rich:
            o = rich.with_extra(o, self.hist.features(pool.env))
        if len(o) == 1:                  # batch 1: numpy, reading only the drafted levels' weight rows
            D = min(int(np.asarray(pool.depth).ravel()[0]), self.max_depth)
            logits = self._size_mlp()(o[0], live=pool_size(D, self.width))
            return self.size_values[choose_action(logits[None], self.sample, self.rng)]
        return self.size_values[choose_action(torch_logits(self.size_net, o), self.sample, self.rng)]
