"""The policy adapter: a simulator `Policy` inside the engine's controller hooks, batch 1.

`PolicyController` is a `pipeline.decode.controller.Controller` (the engine's controller interface);
`online/adapters/specs.py` picks it, or a built-in StaticController, for a `--policy` spec.

The hooks turn the engine's objects (StepContext and StepRecord at B = 1, DraftStep, DraftPool) into
the same batched inputs the replay builds from the logs (simulator.policies.base's PlanBatch, StepBatch,
PoolBatch with n = 1), so a policy sees identical observations online and offline
(tests/online/validate/test_sim_online_parity.py). Policies with batch-1 fast paths (plan_one, continue_one,
verify_size_one) are called through those.
"""
from __future__ import annotations

import numpy as np

from pipeline.decode.controller import Controller
from pipeline.decode.step_shape import StepShape
from pipeline.errors import DraftGymError
from pipeline.logs.schema import DEFAULT_MAX_DEPTH
from simulator.observations import paper as obs
from simulator.policies.base import PlanBatch, Policy, PoolBatch, StepBatch

_BLAS_LIMIT = []


def single_thread_blas() -> None:
    """Limit numpy's BLAS to one thread in this process, once. The online controller's products are
    batch-1 (at most [1024] x [1024, 256]); waking OpenBLAS's thread pool between two verify
    forwards cost more than the product itself (LTD's size call: 0.53 -> 0.26 ms per cycle,
    docs/adhoc/controller_profile.py). torch's own threads are not touched."""
    if not _BLAS_LIMIT:
        from threadpoolctl import threadpool_limits

        _BLAS_LIMIT.append(threadpool_limits(limits=1, user_api="blas"))


class PolicyController(Controller):
    """Runs a simulator `Policy` inside the online engine (a `pipeline.decode.controller.Controller`,
    B = 1: the papers' policies decide per sequence). Its hooks see one row, row 0 of the step's
    context and record, turned into the replay's inputs (module docstring). Offline-only policies
    (the oracle) are refused.
    """

    def __init__(self, policy: Policy, max_depth: int = DEFAULT_MAX_DEPTH):
        if getattr(policy, "offline_only", False):
            raise DraftGymError(f"{policy.name} needs the logged future (offline only)")
        single_thread_blas()
        super().__init__()
        self.policy, self.max_depth = policy, max_depth
        self.zero = np.zeros(1, np.int64)
        # observe() builds its record only for policies that read it (the base one is a no-op)
        self.observes = type(policy).observe is not Policy.observe
        # batch-1 fast paths where the policy has them (LTD, RADAR), else the batched hooks, n = 1
        self.plan_one = getattr(policy, "plan_one", None)
        self.continue_one = getattr(policy, "continue_one", None)
        self.verify_size_one = getattr(policy, "verify_size_one", None)
        self.shapes = {}            # (D, W, V) -> StepShape, built once each

    def reset(self):
        self.calls = 0          # policy inferences, counted as the replay counts them (replay.simulate)
        self.policy.reset(1, seed=0)
        self.root = np.full(obs.RESPS_ROOT_K, np.nan, np.float32)
        self.ctx_len = 0

    def plan(self, ctx):
        self.ctx_len = ctx.context_lens[0]
        if self.plan_one is not None:
            key = self.plan_one(ctx)
            shape = self.shapes.get(key)
            if shape is None:
                shape = self.shapes[key] = StepShape(*key)
            return shape
        last = ctx.last
        # [6, 1]: the previous cycle's D, W, V, L, emitted, and this context length; one array
        lv = np.array([[0], [0], [0], [0], [0], [self.ctx_len]]) if last is None else np.array(
            [[last.depth], [last.width], [last.verify_size], [last.accepted[0]], [last.emitted[0]], [self.ctx_len]])
        sh = self.policy.plan(PlanBatch(
            env=self.zero, seq=self.zero, position=self.zero, cycle=np.array([ctx.step]),
            context_len=lv[5], has_last=np.array([last is not None]),
            last_depth=lv[0], last_width=lv[1], last_verify=lv[2],
            last_accepted=lv[3], last_emitted=lv[4], last_root_scores=self.root[None]))
        self.calls += int(np.asarray(sh.calls).ravel()[0]) if sh.calls is not None else 0
        return StepShape(int(sh.depth[0]), int(sh.width[0]), int(sh.verify[0]))

    def continue_drafting(self, step):
        if not self.policy.uses_depth_hook:
            return True
        if self.continue_one is not None:
            self.calls += 1
            return self.continue_one(step)
        W, need = step.width, self.policy.step_fields
        # only the fields this policy reads (each is a tensor -> numpy copy, cold between verifies)
        pad = lambda x, n: np.concatenate([x, np.full(n - len(x), np.nan, np.float32)])[None]
        s = StepBatch(env=self.zero, depth=step.depth, width=W,
                      beam_scores=obs.to_numpy(step.beam_scores)[None] if "beam_scores" in need else None,
                      candidate_scores=pad(obs.to_numpy(step.candidate_scores), W * W)
                      if "candidate_scores" in need else None,
                      entropy=pad(obs.to_numpy(step.entropy), W) if "entropy" in need else None,
                      context_len=np.array([step.context_len]))
        self.calls += 1
        return bool(np.asarray(self.policy.continue_drafting(s))[0])

    def verify_size(self, pool, shape):
        scores = obs.to_numpy(pool.scores[0])
        W, D = pool.width, pool.depth
        if self.policy.reads_root_scores:
            k = min(W, obs.RESPS_ROOT_K)
            self.root = np.full(obs.RESPS_ROOT_K, np.nan, np.float32)
            self.root[:k] = scores[:k]
        if not self.policy.uses_size_hook:
            return shape.verify_size
        if self.verify_size_one is not None:
            self.calls += 1
            return self.verify_size_one(scores, D, self.ctx_len, shape.verify_size)
        # only the D drafted levels need sorting; deeper ones are all-NaN, which sort_levels
        # turns into SCORE_FLOOR rows: fill those directly (same array, ~10x less work at D = 1)
        raw = obs.level_scores_from_pool(scores, W, D, self.max_depth)     # [Dmax, W*W]
        lv = np.full(raw.shape, obs.SCORE_FLOOR, np.float32)
        lv[:D] = obs.sort_levels(raw[:D], W)
        p = PoolBatch(env=self.zero, depth=np.array([D]), width=W, level_scores=lv[None],
                      context_len=np.array([self.ctx_len]))
        self.calls += 1
        return int(np.asarray(self.policy.verify_size(p, np.array([shape.verify_size])))[0])

    def observe(self, record):
        """The step's record at B = 1 as the replay's cycle arrays (t_cycle is 0 here: the engine
        resolves its times when the call ends)."""
        if not self.observes:
            return
        self.policy.observe(self.zero, {
            "depth": np.array([record.depth]), "width": np.array([record.width]),
            "verify_size": np.array([record.verify_size]), "accepted": np.array(record.accepted[:1]),
            "emitted": np.array(record.emitted[:1]), "context_len": np.array(record.context_lens[:1]),
            "t_cycle": np.array([record.t_step])})
