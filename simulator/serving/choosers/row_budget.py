"""Per-request budgets: every row of a step drafts the same chain, each verifies its own prefix of it.

The step drafts a chain of K tokens for all B rows (one draft phase, as vLLM's adaptive verification
does), then keeps, for row r, its first k_r drafts (k_r = 0: the row decodes one token). With

    p_{r,j} = P(row r accepts its first j drafts)        non-increasing in j

the step's expected tokens and its cost (ShapeTable.row_step_time: one verify over sum_r (k_r + 1)
tokens, priced as B rows of the mean) are

    E[tokens](k) = sum_r (1 + sum_{j <= k_r} p_{r,j})      t(k) = K t_draft(1, c, B) + t_verify(1 + sum_r k_r / B, c, B) + t_over

For a total of N kept drafts, the N largest p_{r,j} over every (r, j) maximise E[tokens], and since
p falls along each row they are a prefix of each row (ties broken towards the smaller j). So the
best allocation is one of B K + 1 candidates, N = 0 .. B K, and the step keeps

    N* = argmax_N  (B + sum of the N largest p) / t(N)                          (`allocate`)

Two things decide how good the allocation is: the probabilities and the cost. `CalibratedBudget`
(here) learns p offline from the logs and prices t with the run's own latency profile at the step's
B and context; vLLM's rule (vllm_adaptive.py) fits p online and prices with start-up cost tables
at one context. And one thing vLLM's rule leaves fixed: how deep to draft. Before drafting,
`CalibratedBudget` picks D from what it knows then, each row's p from its previous step (extended
past the depth drafted there by the model's mean hazards; a new row: the training mean):

    D* = argmax_{D in 0..K}  (B + sum of the N*(D) best stale p_{r,j <= D}) / t(D, N*(D))

then drafts D, and keeps each row's drafts by `allocate` on the current p (base.RowChooser: the
same two calls on the device). On DraftGym's own engine, whose verify is padded to the longest row
(ShapeTable.row_step_time), a shorter row saves nothing, so there every row keeps its D drafts and
the budget is the draft depth alone; the per-row cut pays on a flattened-token engine (a paged
profile, or `serve-eval --engine paged`). After an off step (nothing drafted, nothing learnt) each row's stale
p moves half way back to the prior, so a batch that went off probes again.

The learned acceptance model (`AcceptanceModel`): a logistic hazard over the drafts of a chain,

    P(accept draft j | drafts 1..j-1 accepted) = sigmoid(w . x_{r,j} + b_j)
    p_{r,j} = prod_{i <= j} sigmoid(w . x_{r,i} + b_i)                           (non-increasing in j)

with x_{r,j} = (the draft's own log-prob s_j - s_{j-1}, the chain's running log-prob s_j,
log(1 + context / 1000)): what the engine's draft gives it, the same in the replay; and a bias per
depth, fitted by
full-batch L-BFGS (plain torch) on the tuning split's width-1 logs: every row and depth j whose first
j - 1 drafts were accepted is one example, labelled by whether draft j was (L_K >= j). Deterministic
given the logs (L-BFGS from zeros); the seed only orders a subsample when a split holds more than
`max_examples` examples.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.decode import step_shape
from pipeline.errors import DataError
from simulator.serving.choosers.base import RowChooser, best_budget, draft_logprobs, keep_best
from simulator.serving.inputs import lookup_verify

FEATURES = ("draft_logprob", "running_logprob", "log1p_context_k")


def allocate(p: np.ndarray, step_time) -> np.ndarray:
    """k [B]: drafts each row keeps (module docstring). p [B, K] non-increasing along K; step_time(N)
    takes N [M] (total kept drafts) and returns the step's seconds [M]."""
    return keep_best(p, best_budget(p, p.shape[0], step_time))


def score_features(scores: np.ndarray, context_len) -> np.ndarray:
    """[n, D, F] the features of each row's chain drafts from their running log-probs [n, D]."""
    s = np.asarray(scores, np.float64)
    step = draft_logprobs(s)
    ctx = np.broadcast_to(np.log1p(np.asarray(context_len, np.float64) / 1000.0)[:, None], s.shape)
    return np.stack([step, s, ctx], -1)


def chain_features(logs, rows: np.ndarray, K: int) -> np.ndarray:
    """[n, K, F] the features of each row's chain drafts 1..K (width-1 logs)."""
    return score_features(logs.w[1].beam_scores[rows, :K, 0], logs.context_len[rows])


def chain_acceptance(logs, rows: np.ndarray, K: int) -> np.ndarray:
    """[n] L of the chain of K at each row (width-1 logs)."""
    col = logs.grid_index(np.array([lookup_verify(logs, step_shape.chain(K))]))[0]
    return logs.w[1].acceptance[rows, K - 1, col].astype(np.int64)


@dataclass
class AcceptanceModel:
    """The logistic hazard of the module docstring; `p` turns features into p_{r,j}."""
    K: int
    weights: list                   # [F]
    bias: list                      # [K] one per depth
    prior: list                     # [K] mean p_{r,j} over the training rows (a row with no step yet)
    features: tuple = FEATURES
    train: dict | None = None       # examples, positives, log-loss, the split and seed it was fitted on

    def p(self, x: np.ndarray) -> np.ndarray:
        """x [n, D, F] (D <= K) -> [n, D] P(first j drafts accepted)."""
        z = x @ np.asarray(self.weights) + np.asarray(self.bias)[: x.shape[1]]
        return np.cumprod(1.0 / (1.0 + np.exp(-z)), axis=1)

    def extend(self, p: np.ndarray) -> np.ndarray:
        """[n, D] -> [n, K]: past depth D, each row's last p times the prior's own fall from D on."""
        n, D = p.shape
        if D == self.K:
            return p
        prior = np.asarray(self.prior)
        base = p[:, -1:] if D else np.ones((n, 1))
        tail = prior[D:] / (prior[D - 1] if D else 1.0)
        return np.concatenate([p, base * tail[None, :]], 1)

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path) -> "AcceptanceModel":
        path = Path(path)
        if not path.is_file():
            raise DataError(f"acceptance model {path} not found")
        try:
            d = json.loads(path.read_text())
            m = cls(**{**d, "features": tuple(d["features"])})
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise DataError(f"{path}: not an acceptance model ({e})") from None
        if m.features != FEATURES or len(m.weights) != len(FEATURES) or len(m.bias) != m.K or len(m.prior) != m.K:
            raise DataError(f"{path}: features {list(m.features)} or sizes do not match this version's {list(FEATURES)}")
        return m

    @classmethod
    def fit(cls, logs, K: int, seed: int = 0, max_examples: int = 400_000, split: str = "") -> "AcceptanceModel":
        import torch

        if 1 not in logs.w:
            raise DataError("per-request budgets need width-1 logs (collect with --widths 1,10)")
        if not 1 <= K <= logs.max_depth:
            raise DataError(f"chain length K = {K} outside the logs' depths 1..{logs.max_depth}")
        rows = np.arange(logs.n_positions)
        x, L = chain_features(logs, rows, K), chain_acceptance(logs, rows, K)
        reach = np.arange(K)[None, :] <= L[:, None]                          # draft j's turn came (L >= j - 1)
        r_i, j_i = np.nonzero(reach)
        if len(r_i) > max_examples:
            keep = np.sort(np.random.default_rng(seed).choice(len(r_i), max_examples, replace=False))
            r_i, j_i = r_i[keep], j_i[keep]
        X = torch.as_tensor(x[r_i, j_i], dtype=torch.float64)
        y = torch.as_tensor((L[r_i] > j_i).astype(np.float64))
        D = torch.nn.functional.one_hot(torch.as_tensor(j_i), K).double()
        w = torch.zeros(X.shape[1], dtype=torch.float64, requires_grad=True)
        b = torch.zeros(K, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

        def loss_fn():
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(X @ w + D @ b, y) + 1e-4 * (w @ w)
            loss.backward()
            return loss
        opt.step(loss_fn)
        with torch.no_grad():
            loss = float(torch.nn.functional.binary_cross_entropy_with_logits(X @ w + D @ b, y))
        m = cls(K=K, weights=w.detach().tolist(), bias=b.detach().tolist(), prior=[1.0] * K,
                train={"examples": int(len(y)), "positives": int(y.sum()), "log_loss": loss, "split": split, "seed": seed})
        m.prior = m.p(x).mean(0).tolist()
        return m


class CalibratedBudget(RowChooser):
    """DraftGym's per-request budget (module docstring): D before drafting from each row's stale p,
    then each row's kept drafts by `allocate` on the current p, both priced by the run's profile at
    the step's B and context."""

    def __init__(self, model: AcceptanceModel, name: str = "per-request budget (learned)"):
        self.model, self.name, self.K = model, name, model.K

    def reset(self, table, latency):
        super().reset(table, latency)
        self.stale: dict[int, np.ndarray] = {}

    def _cost(self, view, D: int):
        lat, B = self.latency, view.batch
        c = lat.step_context(view.context_len)
        fixed = D * float(lat.t_draft(1, c, batch=B)) + float(lat.t_overhead(c, batch=B))
        return lambda N: fixed + lat.t_verify(1 + np.asarray(N) / B, c, batch=B)

    def _best(self, view, p: np.ndarray, D: int) -> tuple[float, np.ndarray]:
        """(expected tokens/s, k) of drafting D with these p. A flattened-token engine keeps each row's
        best drafts (`allocate`); DraftGym's padded engine verifies max_r k_r + 1 tokens for every row
        whatever each keeps, so there every row keeps all D (ShapeTable.row_step_time)."""
        B, t = view.batch, self._cost(view, D)
        if D == 0:
            return B / float(t(np.array([0]))[0]), np.zeros(B, np.int64)
        k = allocate(p[:, :D], t) if self.latency.batch_context == "mean" else np.full(B, D)
        return (B + sum(p[r, :k[r]].sum() for r in range(B))) / float(t(np.array([k.sum()]))[0]), k

    def draft_depth(self, view):
        prior = np.asarray(self.model.prior)
        p = np.stack([self.stale.get(int(q), prior) for q in view.requests])             # [B, K]
        D = max(range(self.K + 1), key=lambda d: self._best(view, p, d)[0])
        if D == 0:                      # an off step learns nothing: each row's stale p halves its way to the prior
            for q in view.requests:
                if int(q) in self.stale:
                    self.stale[int(q)] = 0.5 * (self.stale[int(q)] + prior)
        return D

    def row_caps(self, view, scores):
        p = self.model.p(score_features(scores, view.context_len))
        k = self._best(view, p, scores.shape[1])[1]
        for q, row in zip(view.requests, self.model.extend(p)):
            self.stale[int(q)] = row
        return k
