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
B and context; vLLM's rule (vllm_adaptive.py) ranks by the running product of the draft
probabilities and prices with a start-up cost table.

The learned acceptance model (`AcceptanceModel`): a logistic hazard over the drafts of a chain,

    P(accept draft j | drafts 1..j-1 accepted) = sigmoid(w . x_{r,j} + b_j)
    p_{r,j} = prod_{i <= j} sigmoid(w . x_{r,i} + b_i)                           (non-increasing in j)

with x_{r,j} = (the draft's own log-prob s_j - s_{j-1}, the chain's running log-prob s_j, the entropy
of the distribution it was drawn from, log(1 + context / 1000)) and a bias per depth, fitted by
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

from pipeline.errors import DataError
from simulator.serving import shapes as S
from simulator.serving.choosers.base import Chooser, RowShapes

FEATURES = ("draft_logprob", "running_logprob", "entropy", "log1p_context_k")


def allocate(p: np.ndarray, step_time) -> np.ndarray:
    """k [B]: drafts each row keeps (module docstring). p [B, K] non-increasing along K; step_time(N)
    takes N [M] (total kept drafts) and returns the step's seconds [M]."""
    B, K = p.shape
    flat = p.ravel()
    depth = np.tile(np.arange(K), B)
    order = np.lexsort((depth, -flat))                          # best first; ties: the shallower draft
    gain = np.concatenate([[0.0], np.cumsum(flat[order])])       # [B K + 1] sum of the N largest
    N = np.arange(B * K + 1)
    rate = (B + gain) / np.asarray(step_time(N), np.float64)
    n = int(np.argmax(rate))
    k = np.zeros(B, np.int64)
    np.add.at(k, order[:n] // K, 1)
    return k


def chain_features(logs, rows: np.ndarray, K: int) -> np.ndarray:
    """[n, K, F] the features of each row's chain drafts 1..K (width-1 logs)."""
    w = logs.w[1]
    s = w.beam_scores[rows, :K, 0].astype(np.float64)                     # running log-prob after draft j
    step = np.diff(np.concatenate([np.zeros((len(rows), 1)), s], 1), axis=1)
    ent = w.entropy[rows, :K, 0].astype(np.float64)
    ctx = np.broadcast_to(np.log1p(logs.context_len[rows] / 1000.0)[:, None], s.shape)
    return np.stack([step, s, ent, ctx], -1)


def chain_acceptance(logs, rows: np.ndarray, K: int) -> np.ndarray:
    """[n] L of the chain of K at each row (width-1 logs)."""
    col = logs.grid_index(np.array([S.lookup_verify(logs, S.chain(K))]))[0]
    return logs.w[1].acceptance[rows, K - 1, col].astype(np.int64)


@dataclass
class AcceptanceModel:
    """The logistic hazard of the module docstring; `p` turns features into p_{r,j}."""
    K: int
    weights: list                   # [F]
    bias: list                      # [K] one per depth
    features: tuple = FEATURES
    feature_means: list | None = None   # [K][F] mean features of the drafts at each depth (the guess
                                        # for a draft not yet made: `CalibratedBudget`)
    train: dict | None = None       # examples, positives, log-loss, the split and seed it was fitted on

    def p(self, x: np.ndarray) -> np.ndarray:
        """x [n, K, F] -> [n, K] P(first j drafts accepted)."""
        z = x @ np.asarray(self.weights) + np.asarray(self.bias)
        return np.cumprod(1.0 / (1.0 + np.exp(-z)), axis=1)

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
        if m.features != FEATURES or len(m.weights) != len(FEATURES) or len(m.bias) != m.K:
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
        return cls(K=K, weights=w.detach().tolist(), bias=b.detach().tolist(), feature_means=x.mean(0).tolist(),
                   train={"examples": int(len(y)), "positives": int(y.sum()), "log_loss": loss, "split": split, "seed": seed})

    def next_p(self, p_so_far: np.ndarray, x_last: np.ndarray | None, j: int) -> np.ndarray:
        """[n] a guess of p_{r,j+1} before draft j + 1 is made (j = 0: before any): p_{r,j} times the
        hazard at the features the row's last draft had (its own log-prob repeated, its running
        log-prob one such step further, its entropy); at j = 0 the training mean of depth 1's."""
        if j == 0:
            q = 1.0 / (1.0 + np.exp(-(np.asarray(self.feature_means[0]) @ np.asarray(self.weights) + self.bias[0])))
            return np.full(len(p_so_far), q)
        x = x_last.copy()
        x[:, 1] = x_last[:, 1] + x_last[:, 0]
        q = 1.0 / (1.0 + np.exp(-(x @ np.asarray(self.weights) + self.bias[j])))
        return p_so_far[:, j - 1] * q


class CalibratedBudget(Chooser):
    """DraftGym's per-request budget. It drafts one forward at a time and stops when one more would
    not pay: after draft j (j = 0: before drafting) it compares the best allocation of the drafts it
    has, (B + the N* largest p) / t(j drafts, N*), with the best allocation were it to draft once more,
    its p_{r,j+1} guessed by `AcceptanceModel.next_p`; it drafts on while the guess wins, up to K.
    Then it keeps each row's drafts by `allocate` with the learned p and the run's own cost of the
    step. Every figure it reads is known at its decision: the confidences of drafts made, the
    latency profile, B and the context."""

    def __init__(self, model: AcceptanceModel, name: str = "per-request budget (learned)"):
        self.model, self.name = model, name

    def shapes(self):
        return [S.OFF, *[S.chain(k) for k in range(1, self.model.K + 1)]]

    def reset(self, table, latency):
        super().reset(table, latency)
        self.idx = np.array([table.index(s) for s in self.shapes()])

    def choose(self, view):
        B, K, lat = view.batch, self.model.K, self.latency
        c = lat.step_context(view.context_len)
        t_draft, t_over = float(lat.t_draft(1, c, batch=B)), float(lat.t_overhead(c, batch=B))
        x = chain_features(self.table.logs, view.rows, K)                    # [B, K, F]: read up to depth j only
        p = self.model.p(x)

        def best(pj: np.ndarray, j: int) -> tuple[float, np.ndarray]:
            t = lambda N: j * t_draft + lat.t_verify(1 + N / B, c, batch=B) + t_over
            k = allocate(pj, t) if j else np.zeros(B, np.int64)
            return (B + sum(pj[r, :k[r]].sum() for r in range(B))) / float(t(np.array([k.sum()]))[0]), k

        D, (rate, k) = 0, best(p[:, :0], 0)
        while D < K:
            guess = np.concatenate([p[:, :D], self.model.next_p(p, x[:, D - 1] if D else None, D)[:, None]], 1)
            if best(guess, D + 1)[0] <= rate:
                break
            D += 1
            rate, k = best(p[:, :D], D)
        return RowShapes(int(self.idx[D]), self.idx[k])
