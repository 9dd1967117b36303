"""The "rich" observation variant: each seed's own observation (the "paper" variant,
simulator/observations/paper.py) plus features the logs already hold and the engine already exposes at
the same decision point, wherever a decision can see them; the paper variant stays the default and
both are reported (docs/policies.md, "Observations").

What is appended (after the paper vector, in this order):

  LTD depth   [H_d / ENTROPY_SCALE, history(4)]                       dim W^2 + 2 + 5
  LTD size    [history(4)]                                            dim W + (Dmax-1) W^2 + 2 + 4
  RADAR       [H_t / ENTROPY_SCALE, context_len / CTX_SCALE, history(4)]   dim W + 6
  Re-SpS      [history(4)]                                            dim 15 + 4

  H_d         entropy (nats) of the best beam's next-token distribution at draft forward d
              (DraftStep.entropy slot 0; logged as entropy[row, d-1, 0]); 0 where not logged
  history     the acceptance history of this generation, `AcceptanceHistory.features`:
                  [has_last, L/D of the previous cycle, ema_rate, ema_accepted / 12]
              with, after every cycle (L accepted, D drafted, D >= 1),
                  ema_rate     <- beta ema_rate + (1 - beta) L / D
                  ema_accepted <- beta ema_accepted + (1 - beta) L          (beta = HISTORY_BETA)
              all zero before a generation's first cycle.

The same `AcceptanceHistory` object type runs in the replay env (updated when a cycle finishes),
in the policies' hooks during replay and online (updated in plan() from the previous cycle's
record), so a policy sees the same numbers in training, in replay and in the engine
(tests/simulator/observations/test_obs_rich.py checks env == replay hooks == online controller).
"""
from __future__ import annotations

import numpy as np

from pipeline.logs.schema import DEFAULT_MAX_DEPTH
from simulator.observations.paper import (CTX_SCALE, RESPS_DIM, best_beam_entropy, ltd_depth_obs_dim,
                                          ltd_size_obs_dim)

OBS_VARIANTS = ("paper", "rich")
HISTORY_BETA = 0.8
HISTORY_DIM = 4
ENTROPY_SCALE = 10.0            # nats; the draft vocabulary's maximum is ln 8192 ~ 9.0 (SmolLM2 head)

EXTRA_DIM = {"ltd_depth": 1 + HISTORY_DIM, "ltd_size": HISTORY_DIM, "radar": 2 + HISTORY_DIM,
             "resps": HISTORY_DIM}


def check_variant(variant: str) -> str:
    if variant not in OBS_VARIANTS:
        raise ValueError(f"unknown observation variant {variant!r} (known: {', '.join(OBS_VARIANTS)})")
    return variant


def obs_dim(name: str, variant: str = "paper", width: int = 10, max_depth: int = 12) -> int:
    """Observation size of component `name` (ltd_depth | ltd_size | radar | resps) in `variant`."""
    base = {"ltd_depth": ltd_depth_obs_dim(width), "ltd_size": ltd_size_obs_dim(width, max_depth),
            "radar": width, "resps": RESPS_DIM}[name]
    return base + (EXTRA_DIM[name] if check_variant(variant) == "rich" else 0)


class AcceptanceHistory:
    """Per-env acceptance history of the current generation (module docstring). Arrays [n]."""

    def __init__(self, n: int):
        self.has_last = np.zeros(n, np.float32)
        self.last_rate = np.zeros(n, np.float32)
        self.ema_rate = np.zeros(n, np.float32)
        self.ema_accepted = np.zeros(n, np.float32)
        self._one = None                # features(0) as [4], cached between updates (features_one)

    def reset(self, idx) -> None:
        self._one = None
        for a in (self.has_last, self.last_rate, self.ema_rate, self.ema_accepted):
            a[idx] = 0.0

    def update(self, idx, accepted, depth) -> None:
        """One finished cycle for envs idx: L accepted tokens of a depth-D draft."""
        L = np.asarray(accepted, np.float32)
        self._advance(idx, L, L / np.maximum(np.asarray(depth, np.float32), np.float32(1.0)))

    def _advance(self, idx, L, rate) -> None:
        """The EMA step of `update` from float32 L and L/D (arrays over idx, or scalars for one env)."""
        b = np.float32(HISTORY_BETA)
        self._one = None
        self.has_last[idx] = 1.0
        self.last_rate[idx] = rate
        self.ema_rate[idx] = b * self.ema_rate[idx] + (np.float32(1.0) - b) * rate
        self.ema_accepted[idx] = b * self.ema_accepted[idx] + (np.float32(1.0) - b) * L

    def update_from_plan(self, env, cycle, has_last, last_accepted, last_depth) -> None:
        """What a policy's plan() does: a generation's first cycle resets; otherwise the previous
        cycle (PlanBatch.last_*) is added. Arrays [n] over `env`."""
        env, cycle, has_last = np.asarray(env), np.asarray(cycle), np.asarray(has_last, bool)
        first = cycle == 0
        if first.any():
            self.reset(env[first])
        upd = has_last & ~first
        if upd.any():
            self.update(env[upd], np.asarray(last_accepted)[upd], np.asarray(last_depth)[upd])

    def update_from_context(self, ctx) -> None:
        """Batch-1 `update_from_plan` for the online controller: env 0, from the engine's StepContext
        at B = 1 (ctx.step, ctx.last: the previous StepRecord or None; its row 0)."""
        if ctx.step == 0:
            self.reset(0)
        elif ctx.last is not None:
            # = self.update(0, L, D) in float32 scalars (the same float32 operations, so the same
            # numbers; fewer numpy array calls between two verify forwards)
            L = np.float32(ctx.last.accepted[0])
            self._advance(0, L, L / max(np.float32(ctx.last.depth), np.float32(1.0)))

    def features(self, idx=None) -> np.ndarray:
        """[n, 4] = [has_last, last L/D, ema_rate, ema_accepted / 12] (float32; 12 = LTD's Dmax, a fixed
        scale so that the feature does not depend on the logs' depth)."""
        sel = slice(None) if idx is None else idx
        return np.stack([self.has_last[sel], self.last_rate[sel], self.ema_rate[sel],
                         self.ema_accepted[sel] / np.float32(DEFAULT_MAX_DEPTH)], axis=-1)

    def features_one(self) -> np.ndarray:
        """features(0) [4], built once per cycle: the online controller reads it at every draft
        forward and at the size decision, and np.stack costs ~30 us per call there."""
        if self._one is None:
            self._one = self.features(0)
        return self._one


def entropy_feature(entropy) -> np.ndarray:
    """[..., W] entropies of one draft forward (slot 0: the best beam) -> [...] H / ENTROPY_SCALE,
    NaN (not logged) -> 0."""
    return (best_beam_entropy(entropy) / np.float32(ENTROPY_SCALE)).astype(np.float32)


def entropy_feature_one(entropy) -> np.float32:
    """Batch-1 `entropy_feature`: entropy [W] (a torch tensor or array) -> H_0 / ENTROPY_SCALE as one
    float32, read with one scalar access instead of a whole-tensor copy. Equal to entropy_feature's
    value bit for bit (float32 division of the same float32 numbers)."""
    e = np.float32(float(entropy[0]))
    return np.float32(0.0) if e != e else e / np.float32(ENTROPY_SCALE)


def ltd_depth_extra(entropy_best: np.ndarray, history: np.ndarray) -> np.ndarray:
    """[n] scaled entropy, [n, 4] history -> [n, 5]."""
    return np.concatenate([np.asarray(entropy_best, np.float32)[..., None], history], axis=-1)


def radar_extra(entropy_best: np.ndarray, context_len, history: np.ndarray) -> np.ndarray:
    """[n], [n], [n, 4] -> [n, 6]."""
    ctx = np.asarray(context_len, np.float32) / np.float32(CTX_SCALE)
    return np.concatenate([np.asarray(entropy_best, np.float32)[..., None],
                           np.broadcast_to(ctx, np.shape(entropy_best))[..., None], history], axis=-1)


def with_extra(paper: np.ndarray, extra: np.ndarray | None) -> np.ndarray:
    """The rich vector: [paper, extra] along the last axis (paper unchanged when extra is None)."""
    if extra is None:
        return paper
    return np.concatenate([paper, np.asarray(extra, np.float32)], axis=-1).astype(np.float32)
