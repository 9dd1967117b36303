"""Policies: the vectorised mirror of `pipeline.decode.controller.Controller`, and what every policy shares.

A `Policy` has the engine's four hooks, batched over many independent generations ("envs"):

    reset(n_envs, seed)                 start of every generation batch
    plan(PlanBatch) -> StepShape        cycle start: D_max, W, V and the policy calls it made
    continue_drafting(StepBatch) -> bool[n]   after draft forward `depth` (< D_max); False = STOP
    verify_size(PoolBatch, V) -> V[n]   once before verification (size policies)
    observe(env, record)                after the cycle (numpy arrays keyed like CycleRecord)

Batch-1 fast paths (optional): the online controller (online.adapters.policy.PolicyController,
n = 1) calls these instead of the batched hooks when a policy defines them. They must make the same
decisions from the same observations (observations.*_one / *_parts are bit-equal to the batched
builders; tests check both):

    plan_one(ctx: StepContext, B = 1) -> (D_max, W, V)    (only for plans that make no policy call)
    continue_one(step: DraftStep) -> bool
    verify_size_one(pool_scores [W + (D-1) W^2], depth, context_len, verify) -> V

Class attributes tell the simulator which hooks to call and what a call costs:
    uses_depth_hook / uses_size_hook    bool
    width                               the W its hooks' observations assume (hook policies)
    call_cost                           "model" (latency.t_policy per call) or seconds (heuristics: 0.0)

Inputs hold exactly what the engine exposes (DraftStep fields, DraftPool scores, StepContext,
StepRecord at B = 1), so an online adapter feeds the same policy with n = 1; observation vectors are
always built by `simulator.observations.paper`.

Where each policy lives, one module per method (CleanRL style: a method's policy reads in one place):
    simulator/methods/ltd/policy.py      LTD: MLP depth policy (STOP/CONTINUE) and MLP size policy (V)
    simulator/methods/radar/policy.py    RADAR: LSTM over per-call confidences, STOP/CONTINUE
    simulator/methods/resps/policy.py    Re-SpS: MLP over (V, D, W) shapes, held for N cycles
    simulator/methods/resps/serving_policy.py  load-aware Re-SpS at batch B: the shape of a serving step (no batch-1 hooks)
    simulator/baselines.py       static, grid search, DDD, entropy stop, goodput, random, oracle
    simulator/policies/nets.py            the MLP builder, input normalisation, numpy batch-1 forwards
    simulator/methods/checkpoint.py      checkpoints (save / load) and `load_policy(spec)`
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STOP, CONTINUE = 0, 1


# ------------------------------------------------------------------ hook inputs

@dataclass
class PlanBatch:
    env: np.ndarray               # [n] env ids
    seq: np.ndarray               # [n] sequence index (replay only: the oracle's lookup)
    position: np.ndarray          # [n] root position p (replay only: the oracle's lookup)
    cycle: np.ndarray             # [n] cycle index within the generation
    context_len: np.ndarray       # [n]
    has_last: np.ndarray          # [n] bool: a previous cycle exists
    last_depth: np.ndarray        # [n] previous cycle's D, W, V (effective), L, emitted (0 if none)
    last_width: np.ndarray
    last_verify: np.ndarray
    last_accepted: np.ndarray
    last_emitted: np.ndarray
    last_root_scores: np.ndarray  # [n, 8] previous cycle's depth-1 scores (NaN-padded)


@dataclass
class StepBatch:
    """Batched `pipeline.decode.tree.DraftStep`."""
    env: np.ndarray
    depth: int                    # draft forwards done (same for the whole batch)
    width: int
    beam_scores: np.ndarray       # [n, W]
    candidate_scores: np.ndarray  # [n, W*W] (W valid + NaN after forward 1)
    entropy: np.ndarray           # [n, W] (slot 0 valid after forward 1)
    context_len: np.ndarray       # [n]
    sorted_candidates: np.ndarray | None = None   # [n, W*W] = observations.sort_desc(candidate_scores, W*W)


@dataclass
class PoolBatch:
    """Batched `DraftPool`, as per-level scores sorted within each level (observations.sort_levels)."""
    env: np.ndarray
    depth: np.ndarray             # [n] D drafted
    width: int
    level_scores: np.ndarray      # [n, Dmax, W*W] sorted per level, levels >= D are to be ignored
    context_len: np.ndarray


@dataclass
class Shape:
    depth: np.ndarray             # D_max (the depth when no depth hook stops earlier)
    width: np.ndarray
    verify: np.ndarray            # V (before the size hook, if any)
    calls: np.ndarray             # policy inferences made in plan()


class Policy:
    name = "policy"
    uses_depth_hook = False
    uses_size_hook = False
    step_fields = ("beam_scores", "candidate_scores", "entropy")   # StepBatch fields continue_drafting reads
    reads_root_scores = True         # plan() reads PlanBatch.last_root_scores (Re-SpS)
    call_cost: str | float = 0.0
    width: int | None = None
    obs_variant = "paper"            # paper | rich (learned policies; simulator/observations/rich.py)
    rich = False

    def reset(self, n_envs: int, seed: int = 0) -> None:
        pass

    # -- the rich observation variant's shared state (learned policies call these)
    def _set_obs_variant(self, variant: str, rich_step_fields: tuple | None = None) -> None:
        """paper | rich. A rich policy keeps the generation's acceptance history (reset per batch by
        `_reset_history`, advanced by `_history_plan` / `_history_plan_one` once per cycle) and may
        read more StepBatch fields."""
        from simulator.observations import rich

        self.rich = rich.check_variant(variant) == "rich"
        self.obs_variant = variant
        if self.rich and rich_step_fields:
            self.step_fields = rich_step_fields
        self._reset_history(1)

    def _reset_history(self, n_envs: int) -> None:
        from simulator.observations.rich import AcceptanceHistory

        self.hist = AcceptanceHistory(n_envs)

    def _history_plan(self, b: PlanBatch) -> None:
        if self.rich:
            self.hist.update_from_plan(b.env, b.cycle, b.has_last, b.last_accepted, b.last_depth)

    def _history_plan_one(self, ctx) -> None:
        if self.rich:
            self.hist.update_from_context(ctx)

    def plan(self, b: PlanBatch) -> Shape:
        raise NotImplementedError

    def continue_drafting(self, s: StepBatch) -> np.ndarray:
        return np.ones(len(s.env), bool)

    def verify_size(self, pool: PoolBatch, verify: np.ndarray) -> np.ndarray:
        return verify

    def observe(self, env: np.ndarray, record: dict) -> None:
        pass

    def describe(self) -> dict:
        return {"name": self.name}


def const_shape(n: int, depth: int, width: int, verify: int, calls: int = 0) -> Shape:
    return Shape(np.full(n, depth, np.int64), np.full(n, width, np.int64), np.full(n, verify, np.int64),
                 np.full(n, calls, np.int64))


def choose_action(logits: np.ndarray, sample: bool, rng: np.random.Generator | None) -> np.ndarray:
    """logits [n, A] -> action index [n]: the argmax, or a draw from softmax(logits) when `sample`."""
    if not sample:
        return logits.argmax(-1)
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    u = rng.random(p.shape[:-1] + (1,))
    return (p.cumsum(-1) < u).sum(-1).clip(0, p.shape[-1] - 1)
