"""The load-aware replay env: a vectorised serving replay (numpy, n independent servers) in which a
policy picks the shared shape of the next steps (docs/serving.md, "Learned load-aware policies").

Each env is one server under a Poisson load, replayed exactly as `load.serve` does it (the same
serving step, replay.ShapeTable's acceptance and step time):

    episode   a rate lambda drawn uniformly from `rates` (by default the rates that keep about
              B = 1, 2, 4, 8, 16, 32 rows busy under AR: arrivals.rates_for_logs; beyond max_batch
              the server is overloaded and the queue grows), so across episodes B moves from 1 to
              max_batch; the server starts warm: min(round(B_target), max_batch) rows at uniformly
              drawn (sequence, position), queue empty; `episode_decisions` decisions, then truncated
    boundary  requests arrived by t wait in the queue and take free slots (lowest first) at a step
              boundary; with no active row the clock jumps to the next arrival (idle time is not
              busy time, as in metrics.tokens_per_s)
    action    a in 0..A-1: the shape of the next `hold` = N steps (engines switch between prepared
              CUDA-graph states; Re-SpS holds its action too); one env step = one decision = N steps
    cost      every step t(s, B, c) at the batch's step context (LatencyModel.step_context); the decision's step also pays the
              observation's probe forwards and one policy call (observations.decision_cost); a
              request joining pays its prefill on the server's clock (t_prefill, as load.py), which
              moves the arrivals and the queue but not the reward's busy time

Reward (`objective`), over the N held steps, with B_0 and c_0 the batch and step context at the
decision and rho_AR = B_0 / t_AR(c_0, B_0) AR's throughput there (action-independent, so it only
rescales a state's rewards: high-load states do not drown the low-load ones):

    ratio  (sum_h e_h / sum_h t_h) / rho_AR          the held steps' throughput, x AR   (default)
    rate   (sum_h e_h - kappa rho_AR sum_h t_h) / (N B_0)      the renewal-reward form: tokens minus
           lambda time with lambda = kappa rho_AR (kappa = `rate_ref`), per nominal row-step

PPO treats each decision as a contextual bandit (gamma 0, boundary "step", as Re-SpS): "ratio" then
picks, per state, the shape with the best throughput over the hold, the per-step greedy oracle's
criterion over N steps; "rate" maximises the long-run tokens/s when kappa rho_AR is that rate (the
renewal-reward theorem), which "ratio" only approximates when holds last unequal times.

gymnasium's vector semantics: reset(seed) -> (obs [n, dim], info); step(a [n]) -> (obs, reward,
terminated, truncated, info) with autoreset (a truncated env's obs is its next episode's first);
info["step_shape"] [n, N] is the shape index each held step ran (the hold, checked by the tests);
info["batch"], info["tokens"], info["time"] [n]: B_0, and the hold's tokens and seconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.errors import DataError
from simulator.serving import arrivals as arr
from simulator.serving import observations
from simulator.serving.replay import ShapeTable

OBJECTIVES = ("ratio", "rate")


@dataclass
class LoadEnvConfig:
    """The env's settings (`draftgym train-load` sets them from its own config)."""
    n_envs: int = 64                       # independent servers
    max_batch: int = 16                    # M: most rows in a batch
    hold: int = 5                          # N: steps each decision is held
    target_batches: tuple = (1, 2, 4, 8, 16, 32)   # an episode's rate keeps about one of these busy under AR
    episode_decisions: int = 32            # decisions per episode
    objective: str = "ratio"               # ratio | rate (module docstring)
    rate_ref: float = 1.0                  # rate: kappa, lambda = kappa x AR's throughput at (B_0, c_0)
    confidence_depth: int = 1              # k of the observation's confidences (observations.py)
    seed: int = 0


def step_times(table: ShapeTable, latency, a, batch, context_len) -> np.ndarray:
    """[n] t(s_a, B, c) for envs of different batch sizes (ShapeTable.step_time, one call per B)."""
    a, batch, c = np.asarray(a, np.int64), np.asarray(batch, np.int64), np.asarray(context_len, np.float64)
    out = np.empty(len(a))
    for b in np.unique(batch):
        m = batch == b
        out[m] = table.step_time(latency, a[m], int(b), c[m])
    return out


class LoadEnv:
    """n servers under Poisson load, a shared shape per held block of steps (module docstring)."""

    def __init__(self, logs, latency, shapes, cfg: LoadEnvConfig, rates=None):
        if cfg.objective not in OBJECTIVES:
            raise DataError(f"objective must be one of {OBJECTIVES}, got {cfg.objective!r}")
        if cfg.hold < 1 or cfg.episode_decisions < 1:
            raise DataError("hold and episode_decisions must be >= 1")
        self.logs, self.latency, self.cfg = logs, latency, cfg
        self.table = ShapeTable(logs, shapes)
        self.spec = observations.make_spec(logs, cfg.max_batch, cfg.confidence_depth)
        self.n, self.M, self.n_actions, self.obs_dim = cfg.n_envs, cfg.max_batch, len(self.table), self.spec.dim
        self.target = logs.new_tokens - 1                                    # [S] tokens a request emits
        self.prefill = latency.t_prefill(logs.prompt_len)                    # [S] s to prefill each sequence
        self.conf = observations.confidences(logs, self.spec) if cfg.confidence_depth else np.zeros((logs.n_positions, 0), np.float32)
        tb = np.asarray(cfg.target_batches, np.float64)          # beyond max_batch: the queue overloads
        self.rates = np.asarray(rates if rates is not None else arr.rates_for_logs(tb, logs, latency))
        self.start_rows = np.clip(np.round(tb), 1, cfg.max_batch).astype(np.int64) if rates is None else \
            np.ones(len(self.rates), np.int64)
        n, M = self.n, self.M
        self.seq, self.pos = np.zeros((n, M), np.int64), np.zeros((n, M), np.int64)
        self.active = np.zeros((n, M), bool)
        self.t, self.next_arrival, self.rate = np.zeros(n), np.zeros(n), np.ones(n)
        self.queued, self.decisions, self.prev = np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -1)
        self.ema, self.has_ema = np.zeros(n), np.zeros(n, bool)
        self.ep_tokens, self.ep_time, self.finished = np.zeros(n), np.zeros(n), []
        self.rng = np.random.default_rng(cfg.seed)

    # ---------------------------------------------------------------- episodes
    def reset(self, seed: int | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.finished = []
        self._reset_envs(np.arange(self.n))
        return self.observe(), {}

    def _reset_envs(self, idx):
        k = self.rng.integers(0, len(self.rates), len(idx))
        self.rate[idx] = self.rates[k]
        self.active[idx] = False
        n0 = np.minimum(self.start_rows[k], self.M)
        for i, e in enumerate(idx):                                     # warm start: n0 rows mid-sequence
            s = self.rng.integers(0, self.logs.n_sequences, n0[i])
            self.seq[e, :n0[i]], self.pos[e, :n0[i]] = s, self.rng.integers(0, self.target[s])
            self.active[e, :n0[i]] = True
        self.t[idx], self.queued[idx], self.decisions[idx], self.prev[idx] = 0.0, 0, 0, -1
        self.next_arrival[idx] = self.rng.exponential(1.0 / self.rate[idx])
        self.ema[idx], self.has_ema[idx] = 0.0, False
        self.ep_tokens[idx], self.ep_time[idx] = 0.0, 0.0
        self._boundary()

    def drain_finished(self) -> list[dict]:
        """Episodes finished since the last call: their tokens/s and rate (ppo_train logs them)."""
        out, self.finished = self.finished, []
        return out

    # ---------------------------------------------------------------- the step boundary
    def _arrive(self):
        while True:
            due = self.next_arrival <= self.t
            if not due.any():
                return
            self.queued[due] += 1
            self.next_arrival[due] += self.rng.exponential(1.0 / self.rate[due])

    def _admit(self):
        free = ~self.active
        take = free & (np.cumsum(free, 1) - 1 < self.queued[:, None])      # the lowest free slots
        if take.any():
            self.seq[take] = self.rng.integers(0, self.logs.n_sequences, int(take.sum()))
            self.pos[take] = 0
            self.t += np.where(take, self.prefill[self.seq], 0.0).sum(1)        # prefills, one by one
            self.active |= take
            self.queued -= take.sum(1)

    def _boundary(self):
        """Arrivals up to t join free slots; a server with no row jumps to its next arrival."""
        self._arrive()
        self._admit()
        while (idle := ~self.active.any(1)).any():
            self.t[idle] = self.next_arrival[idle]
            self._arrive()
            self._admit()

    def rows(self) -> np.ndarray:
        """[n, M] log rows of the slots (0 where inactive)."""
        return np.where(self.active, self.logs.offsets[self.seq] + self.pos, 0)

    def observe(self) -> np.ndarray:
        rows = self.rows()
        prev = np.maximum(self.prev, 0)
        had = self.prev >= 0
        return observations.load_obs(self.spec, self.active, self.queued, self.logs.context_len[rows], self.conf[rows],
                          self.ema, self.has_ema, np.where(had, self.table.depth[prev], 0),
                          np.where(had, self.table.verify[prev], 1))

    # ---------------------------------------------------------------- one decision
    def step(self, actions):
        a = np.asarray(actions, np.int64)
        N, tab = self.cfg.hold, self.table
        tokens, time = np.zeros(self.n), np.zeros(self.n)
        shapes_run = np.zeros((self.n, N), np.int64)
        B0 = c0 = None
        for h in range(N):
            if h:
                self._boundary()
            rows, act = self.rows(), self.active
            B = act.sum(1)
            c = self.latency.step_context(self.logs.context_len[rows], act)
            L = np.zeros(act.shape, np.int64)
            L[act] = tab.accepted(rows[act], np.broadcast_to(a[:, None], act.shape)[act])
            e = np.where(act, np.minimum(L + 1, self.target[self.seq] - self.pos), 0)
            dt = step_times(tab, self.latency, a, B, c)
            if h == 0:
                B0, c0 = B, c
                dt = dt + observations.decision_cost(self.spec, self.latency, tab.depth[a], tab.width[a], B, c)
            tokens += e.sum(1)
            time += dt
            self.t += dt
            drafted = tab.depth[a] > 0
            self.ema, self.has_ema = observations.ema_update(self.spec, self.ema, self.has_ema, drafted,
                                                  np.where(act, L, 0).sum(1) / B)
            self.pos = np.where(act, self.pos + L + 1, self.pos)
            self.active = act & (self.pos < self.target[self.seq])
            shapes_run[:, h] = a
        self.prev = a.copy()
        self._boundary()
        reward = self._reward(tokens, time, B0, c0)
        self.ep_tokens += tokens
        self.ep_time += time
        self.decisions += 1
        trunc = self.decisions >= self.cfg.episode_decisions
        term = np.zeros(self.n, bool)
        done = np.flatnonzero(trunc)
        for e in done:
            self.finished.append({"tokens_per_s": self.ep_tokens[e] / self.ep_time[e], "rate": float(self.rate[e])})
        if len(done):
            self._reset_envs(done)
        return self.observe(), reward, term, trunc, {"step_shape": shapes_run, "batch": B0, "tokens": tokens, "time": time}

    def _reward(self, tokens, time, B0, c0) -> np.ndarray:
        rho_ar = B0 / self.latency.t_ar(c0, batch=B0)                     # AR's tokens/s at (B_0, c_0)
        if self.cfg.objective == "ratio":
            return tokens / time / rho_ar
        return (tokens - self.cfg.rate_ref * rho_ar * time) / (self.cfg.hold * B0)
