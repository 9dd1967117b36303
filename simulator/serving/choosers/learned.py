"""A learned load-aware policy as a step chooser: what `draftgym serve-eval --policy DIR` replays.

Wraps a policy with `act(obs [n, dim]) -> [n]`, `shapes` (labels), `hold` and `obs_spec` (the
manifest's observation spec): simulator/methods/resps/serving_policy.LoadAwarePolicy, loaded through
simulator/policy_specs.load_policy. Every `hold` steps of the load replay (simulator/serving/load.py)
it builds the observation of the batch (observations.step_obs: the same function the training env
uses), asks the policy for a shape, and holds it; between decisions it keeps what the engine would
keep: the accept-length EMA and the previous shape. A decision step also costs the observation's
probe forwards and one policy call (observations.decision_cost, charged through `extra_time`), as in
the env.

The same chooser steers the batched engine on the device (online/adapters/chooser.py, `draftgym
validate --load-trace --policy DIR`). There are no log rows there: the engine measures the
confidences itself, each root's depth-1 top draft log-prob from the pending draft forward, and hands
them over in the StepView (`view.confidence`, [B, 1]) on the steps where `needs_confidence` says the
next `choose` decides. That is s_r(1) exactly (observations.py), so a policy whose observation reads
at most depth 1 sees the same function of the same quantities on both sides; a deeper one is refused
on the device in one line (`check_device`).
"""
from __future__ import annotations

import numpy as np

from pipeline.decode.step_shape import parse
from pipeline.errors import DraftGymError
from simulator.serving import observations
from simulator.serving.choosers.base import Chooser


class LearnedChooser(Chooser):
    def __init__(self, policy, name: str | None = None):
        if not getattr(policy, "serving", False):
            raise DraftGymError(f"{getattr(policy, 'name', policy)} is not a load-aware serving policy "
                                f"(train one with `draftgym train-load`)")
        self.policy = policy
        self.spec = observations.LoadObsSpec.from_json(policy.obs_spec)
        self.name = name or f"learned ({policy.name}, hold {policy.hold})"
        self._shapes = [parse(s) for s in policy.shapes]

    def shapes(self):
        return list(self._shapes)

    def reset(self, table, latency):
        super().reset(table, latency)
        self.idx = np.array([table.index(s) for s in self._shapes], np.int64)   # policy action -> table index
        self.age, self.current, self.decided = self.policy.hold, -1, False
        self.ema, self.has_ema, self.prev_depth, self.prev_verify = 0.0, False, 0, 1
        self.decisions = 0
        self.policy.reset(1)

    def check_device(self) -> None:
        """Refuse, in one line, an observation the batched engine cannot measure: it gives each root's
        depth-1 draft confidence only (the first draft forward), so confidence depth must be <= 1 (at
        depth 1 the probe's width does not matter: the top-1 log-prob of the first forward is the same
        at every width)."""
        k = self.spec.confidence_depth
        if k > 1:
            raise DraftGymError(f"{self.name} observes draft confidences to depth {k}; the batched engine measures "
                                f"depth 1 only (the roots' first draft forward), so it replays only "
                                f"(draftgym serve-eval --policy); train it with --confidence-depth 1 to run it online")

    @property
    def needs_confidence(self) -> bool:
        """Whether the next `choose` is a decision that reads draft confidences (the device measures
        them only then)."""
        return self.age >= self.policy.hold and self.spec.confidence_depth >= 1

    def observation(self, view) -> np.ndarray:
        """[1, dim] the batch's observation now (observations.step_obs), from the view's measured
        confidences when it has them (the device), else from the logs' rows (the replay)."""
        if view.batch > self.spec.max_batch:
            raise DraftGymError(f"{self.policy.name} was trained for at most {self.spec.max_batch} rows; the load "
                                f"replay runs {view.batch} (use --max-batch {self.spec.max_batch})")
        logs = getattr(self.table, "logs", None)
        if view.confidence is None and logs is None and self.spec.confidence_depth:
            raise DraftGymError(f"{self.name}: no draft confidences for this step and no logs to read them from "
                                f"(the batched engine measures them only with an EAGLE-3 head)")
        return observations.step_obs(self.spec, logs, view.rows, view.context_len, view.queued, self.ema,
                          self.has_ema, self.prev_depth, self.prev_verify, conf=view.confidence)

    def choose(self, view):
        self.decided = self.age >= self.policy.hold
        if self.decided:
            self.current = int(self.idx[int(self.policy.act(self.observation(view))[0])])
            self.age = 0
            self.decisions += 1
        self.age += 1
        return self.current

    def extra_time(self, view, a):
        if not self.decided:
            return 0.0
        t = self.table
        return float(observations.decision_cost(self.spec, self.latency, t.depth[a], t.width[a], view.batch,
                                     self.latency.step_context(view.context_len)))

    def observe(self, view, a, accepted):
        ema, has = observations.ema_update(self.spec, self.ema, self.has_ema, self.table.depth[a] > 0, float(np.mean(accepted)))
        self.ema, self.has_ema = float(ema), bool(has)
        self.prev_depth, self.prev_verify = int(self.table.depth[a]), int(self.table.verify[a])
