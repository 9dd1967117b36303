"""SGLang's DSpark ragged-verify budget, reimplemented from its source to replay it on DraftGym logs.

Read on 2026-11-28 in sgl-project/sglang b8c3d9bb50c5, python/sglang/srt/speculative/dspark_components/
dspark_scheduler.py (compute_verify_token_budget, HostConfidenceBudgetPlanner) and 692c5f7d532f
dspark_sps_table.py (the cost tables; simulator/serving/formats/dspark_table.py writes one). Per
step over R decoding requests, each drafting gamma tokens:

    survival   S_{r,j} = prod_{i <= j} c_{r,i}, c the drafter's per-position confidence, taken from
               the planner's lagged copy (one step behind: a request with no earlier step scores 1)
    budget     N* = argmax_N (R + sum of the N largest S) / step_time(R, N)      (additive table)
               candidates below survival_eps (1e-6) left out
    admission  the N* best current survivals over all (r, j): a prefix of each row (the survival
               falls along j); kernels/schedule_verify_lens_topk.py (692c5f7d532f): each request
               verifies min_verify_len (1: its anchor) plus its cells among the global top N*,
               clamped to [1, gamma + 1]

On EAGLE-3 chains the confidence is the drafted token's own probability (the logs' running log-probs,
differenced). The step time is the exported table's, so the replay runs the rule as a server fed
`draftgym cost-table`'s file would; the step is still charged by the profile (ShapeTable.row_step_time).
"""
from __future__ import annotations

import numpy as np

from simulator.serving.choosers.base import RowChooser, best_budget, draft_logprobs, keep_best
from simulator.serving.formats.dspark_table import step_time

SURVIVAL_EPS = 1e-6


class SGLangDSpark(RowChooser):
    """The rule of the module docstring over chains of gamma, priced by an additive DSpark table."""

    def __init__(self, table: dict, gamma: int, name: str | None = None):
        self.sps, self.K = table, int(gamma)
        self.name = name or f"SGLang DSpark budget (gamma = {self.K})"

    def reset(self, table, latency):
        super().reset(table, latency)
        self.lagged: dict[int, np.ndarray] = {}

    def draft_depth(self, view):
        return self.K

    def row_caps(self, view, scores):
        R = view.batch
        conf = np.exp(draft_logprobs(scores))                                           # [R, gamma] c_{r,j}
        old = np.stack([self.lagged.get(int(q), np.ones(self.K)) for q in view.requests])
        cand = np.cumprod(old, 1).ravel()
        n = best_budget(cand[cand >= SURVIVAL_EPS], R, lambda N: step_time(self.sps, np.full(len(N), R), N))
        k = keep_best(np.cumprod(conf, 1), n)
        for q, row in zip(view.requests, conf):
            self.lagged[int(q)] = row
        return k
