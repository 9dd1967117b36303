"""Baselines: static trees, grid search, DDD, an SVIP-like entropy stop, vLLM-style goodput, random,
and the hindsight ORACLE (dynamic programming over positions).

Action spaces (lists of (D, W, V), V on the logged grid):
    static_space(logs)   every D in 1..Dmax, every loaded W, every grid V >= 2
    depth_space(logs)    LTD's depth action space: D in 1..12 at W = 10 (or the primary W), V = 60

Oracle. For one sequence with T tokens, let best[p] be the least time needed to emit every token
after root position p. With t(a, p) the cycle time of action a at p and L(a, p) its acceptance,

    best[p] = min_a  t(a, p) + best[min(p + L(a, p) + 1, T - 1)],      best[T - 1] = 0,

computed backwards over p (vectorised over sequences and actions). The oracle pays no policy
time, so for any policy whose actions lie in the same space, time(policy) >= best[0] on every
sequence, i.e. its tokens/s is an upper bound (tested).
"""
from __future__ import annotations

import numpy as np

from pipeline.decode.step_shape import EAGLE3_DEFAULT_SHAPE, pool_size
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import ReplayLogs
from simulator.observations.paper import best_beam_entropy, best_beam_score
from simulator.policies.base import Policy, Shape, const_shape
from simulator.replay import cycle_time



def static_space(logs: ReplayLogs, min_verify: int = 2) -> np.ndarray:
    """[A, 3] (D, W, V): every depth, loaded width and grid V >= min_verify (`logs`: anything with
    max_depth, verify_grid and widths, e.g. a `simulator.logs.read.LogSelection`)."""
    D = np.arange(1, logs.max_depth + 1)
    V = logs.verify_grid[logs.verify_grid >= min_verify]
    return np.array([(d, w, v) for w in logs.widths for d in D for v in V], np.int64)


def depth_space(logs: ReplayLogs, verify: int = 60, max_depth: int = 12) -> np.ndarray:
    W = 10 if 10 in logs.w else logs.width
    return np.array([(d, W, verify) for d in range(1, min(max_depth, logs.max_depth) + 1)], np.int64)


def action_space(logs: ReplayLogs, space: str | np.ndarray) -> np.ndarray:
    if isinstance(space, str):
        if space == "static":
            return static_space(logs)
        if space == "depth":
            return depth_space(logs)
        raise ValueError(f"unknown action space {space!r} (static | depth)")
    return np.asarray(space, np.int64)


def default_static(logs: ReplayLogs) -> tuple[int, int, int]:
    """EAGLE-3's default (8, 10, 60), with the primary width when 10 is not logged."""
    D, W, V = EAGLE3_DEFAULT_SHAPE
    return min(D, logs.max_depth), (W if W in logs.w else logs.width), V


# ------------------------------------------------------------------ static

class StaticPolicy(Policy):
    """Static EAGLE-3: the same (D, W, V) every cycle."""

    def __init__(self, depth: int = 8, width: int = 10, verify: int = 60):
        self.depth, self.width, self.verify = depth, width, verify
        self.name = f"static:{depth},{width},{verify}"

    def plan(self, b):
        return const_shape(len(b.env), self.depth, self.width, self.verify)


def simulate_static(logs: ReplayLogs, latency: LatencyModel, configs) -> dict:
    """Every static config on every sequence at once (envs = sequences x configs).
    Returns {"configs": [A, 3], "time": [S, A], "cycles": [S, A], "tokens": [S]}."""
    cfg = np.asarray(configs, np.int64).reshape(-1, 3)
    S, A = logs.n_sequences, len(cfg)
    target = logs.new_tokens - 1
    time = np.zeros((S, A))
    cycles = np.zeros((S, A), np.int64)
    gidx = logs.grid_index(cfg[:, 2])
    for W in np.unique(cfg[:, 1]):
        cols = np.flatnonzero(cfg[:, 1] == W)
        accW = logs.w[int(W)].acceptance
        seq = np.repeat(np.arange(S), len(cols))
        a = np.tile(cols, S)
        D, V, g = cfg[a, 0], cfg[a, 2], gidx[a]
        p = np.zeros(len(seq), np.int64)
        active = np.flatnonzero(target[seq] > 0)
        while len(active):
            s, aa = seq[active], a[active]
            rows = logs.offsets[s] + p[active]
            L = accW[rows, D[active] - 1, g[active]].astype(np.int64)
            t = cycle_time(latency, D[active], W, V[active], logs.context_len[rows], 0, 0.0)["t_cycle"]
            np.add.at(time, (s, aa), t)
            np.add.at(cycles, (s, aa), 1)
            p[active] += L + 1
            active = active[p[active] < target[s]]
    return {"configs": cfg, "time": time, "cycles": cycles, "tokens": target.astype(np.float64)}


def grid_search(logs: ReplayLogs, latency: LatencyModel, configs=None) -> dict:
    """Best static (D, W, V) by mean per-sequence tokens/s, per dataset and overall."""
    cfg = static_space(logs) if configs is None else np.asarray(configs, np.int64)
    r = simulate_static(logs, latency, cfg)
    return best_static(cfg, r["tokens"][:, None] / np.maximum(r["time"], 1e-12), logs.dataset)


def best_static(cfg: np.ndarray, tps: np.ndarray, dataset: np.ndarray) -> dict:
    """grid_search's answer from per-sequence tokens/s [S, A] of the configs [A, 3] (sequences may come
    from several chunks of logs, concatenated in the logs' order: the same means as one pass)."""
    out = {"configs": cfg, "tokens_per_s": tps, "by_dataset": {}}
    groups = {"all": np.ones(len(dataset), bool), **{d: dataset == d for d in sorted(set(dataset.tolist()))}}
    for name, m in groups.items():
        mean = tps[m].mean(0)
        i = int(np.argmax(mean))
        out["by_dataset"][name] = {"config": tuple(int(x) for x in cfg[i]), "tokens_per_s": float(mean[i])}
    return out


# ------------------------------------------------------------------ depth heuristics

class DDDPolicy(Policy):
    """Dynamic Depth Decoding (Brown et al. 2024), as LTD ran it: after forwards 5, 7, 9 stop when
    the best beam's cumulative log-prob < threshold (-0.3); W = 10, V = 60, D <= 12."""

    threshold = -0.3
    checkpoints = (5, 7, 9)
    uses_depth_hook = True
    step_fields = ("beam_scores",)
    call_cost = 0.0

    def __init__(self, threshold: float | None = None, checkpoints=None, width: int = 10, verify: int = 60,
                 max_depth: int = 12):
        self.threshold = self.threshold if threshold is None else threshold
        self.checkpoints = tuple(checkpoints or self.checkpoints)
        self.width, self.verify, self.max_depth = width, verify, max_depth
        self.name = f"ddd:{self.threshold:g}"

    def plan(self, b):
        return const_shape(len(b.env), self.max_depth, self.width, self.verify)

    def continue_drafting(self, s):
        if s.depth not in self.checkpoints:
            return np.ones(len(s.env), bool)
        return best_beam_score(s.beam_scores) >= self.threshold


class EntropyStopPolicy(Policy):
    """SVIP-like entropy stop (Zhang et al. 2024; LTD's setting: factor gamma = 0.15, minimum entropy 0.3).
    SVIP bounds the rejection probability of the next draft token by sqrt(gamma * H) with H the
    draft entropy. We stop after forward d when sqrt(gamma * max(H_d, H_min)) > theta, with H_d the
    entropy of the best beam's child distribution. W = 10, V = 60, D <= 12."""

    theta = 0.5
    uses_depth_hook = True
    step_fields = ("entropy",)
    call_cost = 0.0

    def __init__(self, theta: float | None = None, gamma: float = 0.15, min_entropy: float = 0.3, width: int = 10,
                 verify: int = 60, max_depth: int = 12):
        self.theta = self.theta if theta is None else theta
        self.gamma, self.min_entropy = gamma, min_entropy
        self.width, self.verify, self.max_depth = width, verify, max_depth
        self.name = f"entropy:{self.theta:g}"

    def plan(self, b):
        return const_shape(len(b.env), self.max_depth, self.width, self.verify)

    def continue_drafting(self, s):
        H = np.maximum(best_beam_entropy(s.entropy), self.min_entropy)
        return np.sqrt(self.gamma * H) <= self.theta


class GoodputPolicy(Policy):
    """vLLM-style dynamic speculation: per-position acceptance rates a_i = P(L >= i) (i = 1..Dmax,
    from the acceptance table of the deepest tree at V), then at each cycle pick

        D*(c) = argmax_D (1 + sum_{i <= D} a_i) / (D t_draft(W, c) + t_verify(V, c) + t_overhead(c))

    (vLLM interpolates a latency table over batch size and K; here over the context length c)."""

    call_cost = 0.0

    def __init__(self, rates: np.ndarray, latency: LatencyModel, width: int = 10, verify: int = 60):
        self.rates = np.asarray(rates, np.float64)          # [Dmax]
        self.latency, self.width, self.verify = latency, width, verify
        self.name = "goodput"

    @classmethod
    def fit(cls, logs: ReplayLogs, latency: LatencyModel, width: int = 10, verify: int = 60) -> "GoodputPolicy":
        w = width if width in logs.w else logs.width
        g = logs.grid_index(verify)
        L = logs.w[w].acceptance[:, logs.max_depth - 1, g].astype(np.int64)
        rates = np.array([(L >= i).mean() if len(L) else 0.0 for i in range(1, logs.max_depth + 1)])
        return cls(rates, latency, w, verify)

    def best_depth(self, context_len) -> np.ndarray:
        c = np.asarray(context_len, np.float64)[:, None]
        D = np.arange(1, len(self.rates) + 1)[None, :]
        gain = 1.0 + np.cumsum(self.rates)[None, :]
        t = (D * self.latency.t_draft(self.width, c) + self.latency.t_verify(np.minimum(self.verify, 1 + pool_size(
            D, self.width)), c) + self.latency.t_overhead(c))
        return np.argmax(gain / t, axis=1) + 1

    def plan(self, b):
        n = len(b.env)
        return Shape(self.best_depth(b.context_len), np.full(n, self.width), np.full(n, self.verify), np.zeros(n, np.int64))


class RandomShapePolicy(Policy):
    """Uniformly random (D, W, V) from the static space every cycle (a sanity floor)."""

    def __init__(self, logs: ReplayLogs, seed: int = 0):
        self.space = static_space(logs)
        self.seed = seed
        self.name = f"random:{seed}"

    def reset(self, n_envs, seed=0):
        self.rng = np.random.default_rng([self.seed, seed])

    def plan(self, b):
        a = self.space[self.rng.integers(0, len(self.space), len(b.env))]
        return Shape(a[:, 0], a[:, 1], a[:, 2], np.zeros(len(b.env), np.int64))


# ------------------------------------------------------------------ oracle

def oracle_dp(logs: ReplayLogs, latency: LatencyModel, space: str | np.ndarray = "static") -> dict:
    """Backward DP (module docstring). Returns {"best_time": [S], "action": [N] index into
    "space" of the optimal action at every row, "space": [A, 3]}."""
    acts = action_space(logs, space)
    A = len(acts)
    S = logs.n_sequences
    target = logs.new_tokens - 1
    Pmax = int(target.max()) if S else 0
    best = np.zeros((S, Pmax + 1))
    choice = np.zeros(logs.n_positions, np.int64)
    gidx = logs.grid_index(acts[:, 2])
    D, W, V = acts[:, 0], acts[:, 1], acts[:, 2]
    for p in range(Pmax - 1, -1, -1):
        s = np.flatnonzero(target > p)
        if not len(s):
            continue
        rows = logs.offsets[s] + p
        ctx = logs.context_len[rows][:, None]
        L = np.empty((len(s), A), np.int64)
        for w in np.unique(W):
            cols = np.flatnonzero(W == w)
            L[:, cols] = logs.w[int(w)].acceptance[rows[:, None], D[cols][None, :] - 1, gidx[cols][None, :]]
        t = cycle_time(latency, D[None, :], W[None, :], V[None, :], ctx, 0, 0.0)["t_cycle"]
        nxt = np.minimum(p + L + 1, target[s][:, None])
        val = t + best[s[:, None], nxt]
        a = np.argmin(val, axis=1)
        best[s, p] = val[np.arange(len(s)), a]
        choice[rows] = a
    return {"best_time": best[:, 0].copy(), "action": choice, "space": acts}


class OraclePolicy(Policy):
    """Plays the DP's optimal action at every root (needs the replay's (seq, position): offline only)."""

    call_cost = 0.0
    offline_only = True

    def __init__(self, logs: ReplayLogs, latency: LatencyModel, space: str | np.ndarray = "static"):
        self.dp = oracle_dp(logs, latency, space)
        self.offsets = logs.offsets
        self.name = "oracle" if isinstance(space, str) and space == "static" else f"oracle:{space}"

    def plan(self, b):
        a = self.dp["space"][self.dp["action"][self.offsets[b.seq] + b.position]]
        return Shape(a[:, 0], a[:, 1], a[:, 2], np.zeros(len(b.env), np.int64))
