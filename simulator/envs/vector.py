"""Vectorised replay environments for RL training (numpy; thousands of episodes per step).

Each env holds a (sequence, root position p). Acceptance is replayed exactly from the logs,
time comes from the latency model (simulator/replay.py has the formulas, shared with evaluation):

    L = acceptance_W[row(s, p), D-1, index(V)]       emitted = min(L + 1, T - 1 - p)
    t = D t_draft(W, c) + t_verify(V_eff, c) + n_calls t_call + t_overhead(c)
    next root p + L + 1; the sequence is done once p >= T - 1.

Modes (docs/design.md, "Action spaces"); `make_replay_env(logs, latency, mode, **config)` builds one:

  depth   LTD depth policy. One step = one decision after draft forward d: 0 STOP, 1 CONTINUE.
          CONTINUE after forward Dmax-1 ends the cycle at D = Dmax (the engine does not ask after
          the last allowed forward, so a cycle of depth D costs min(D, Dmax-1) calls: always d).
          Reward (LTD, sparse): 0 while drafting, (L+1)/t_cycle when the cycle ends. V = 60, or
          `size_policy(obs) -> V` (co-adaptation Iter2).
  size    LTD size policy. One step = one cycle: D comes from `depth_policy(obs) -> continue` (Iter1,
          Iter3) or uniformly from 1..Dmax (Iter0); the action a in 0..11 sets V = 20 + 20 a.
          Reward (L+1)/t_cycle.
  shape   Re-SpS. The action picks (V, D, W) from `shapes` and is held for `hold_cycles` cycles;
          reward = mean cycle throughput over the held cycles; one policy call per decision.
          Re-SpS's V set {32..128} is snapped to the logged grid (32->30, 48->50, 64->60,
          96->100, 128->130); validity V <= W^(D-1) uses the paper's V; W is restricted to the
          logged widths, and to the logged widths themselves when none of {8,12,16,20,32} is
          logged (e.g. W = 10 only).
  radar   RADAR. One step = one decision after draft call t (at most 8), W = 10, V = 60; obs =
          the beam confidences of the current call (the LSTM keeps its state within a cycle;
          `info["new_cycle"]` marks where to reset it). Reward: -alpha per CONTINUE, and at the
          stop (L+1)/T_gen(t) (count_bonus, our throughput) or L/T_gen(t) (the paper), with
          T_gen(t) = T0 + Tf t + Teye (t+1) from the latency model (`LatencyModel.radar_tgen`);
          with reward="expected" (T > 0 logs) L is replaced by E[L] under the logged
          acceptance-length distribution (RADAR's dataset), the transition stays exact.

Rewards: EnvConfig.objective "ratio" is the seeds' per-cycle throughput, as above; "rate" replaces each
cycle's (L+1)/t by (L+1) - rate_ref * t (Re-SpS: summed over the held cycles; RADAR: with the
replayed t_cycle), which maximises the generation's tokens/s instead of the mean cycle's
(simulator/envs/core.py, OBJECTIVES).

Observations: EnvConfig.obs_variant "paper" (each seed's own, simulator/observations/paper.py) or "rich"
(the same plus the best beam's entropy and the generation's acceptance history,
simulator/observations/rich.py; episodes cut from mid-sequence first replay a short static burn-in
so the history is not empty: env_core._ReplayCore._burn_in).

Episodes: a whole sequence from p = 0 (episode_cycles=None), or `episode_cycles` cycles from a
uniformly drawn (sequence, position) (terminated at the sequence end, truncated at the budget).
Vector semantics follow gymnasium's: step returns (obs, reward, terminated, truncated, info)
arrays; with autoreset the obs of a finished env is already its next episode's first obs.
`make_replay_gym_env` wraps one env as a `gymnasium.Env`.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipeline.decode.step_shape import pool_size
from simulator.observations import paper as obs
from simulator.observations import rich
from simulator.envs.core import EnvConfig, _ReplayCore, resps_shapes  # noqa: F401 (resps_shapes: re-exported)
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import ReplayLogs


# ------------------------------------------------------------------ depth (LTD)

class DepthEnv(_ReplayCore):
    """LTD depth policy env (module docstring). Actions: 0 STOP, 1 CONTINUE."""

    n_actions = 2

    def __init__(self, logs, latency, cfg: EnvConfig, size_policy=None):
        super().__init__(logs, latency, cfg)
        self.Dmax = min(cfg.max_depth, logs.max_depth)
        self.size_policy = size_policy
        self.obs_dim = rich.obs_dim("ltd_depth", cfg.obs_variant, cfg.width)
        self.d = np.ones(self.n, np.int64)
        self._buf = np.zeros((self.n, obs.ltd_depth_obs_dim(cfg.width)), np.float32)
        W2 = cfg.width * cfg.width
        self._flat = self.wa.sorted_candidates.reshape(-1, W2)      # [N * Dmax_logged, W*W]

    def _start_cycle(self, idx):
        self.d[idx] = 1

    def observe(self):
        rows = self.rows()
        flat = rows * self.logs.max_depth + self.d - 1
        o = obs.ltd_depth_obs(self._flat[flat], self.d, self.logs.context_len[rows], self.cfg.width,
                              presorted=True, out=self._buf)
        if not self.rich:
            return o.copy()
        return rich.with_extra(o, rich.ltd_depth_extra(rich.entropy_feature(self.wa.entropy[rows, self.d - 1]),
                                                        self.hist.features()))

    def step(self, actions):
        a = np.asarray(actions).astype(bool)
        cont = a & ~self.done
        D = np.where(cont, self.d + 1, self.d)
        finish = (~cont | (D >= self.Dmax)) & ~self.done
        reward = np.zeros(self.n)
        term = np.zeros(self.n, bool)
        trunc = np.zeros(self.n, bool)
        i = np.flatnonzero(finish)
        if len(i):
            calls = self.d[i].copy()                                 # asked after forwards 1..d
            V = self.cfg.verify_size
            if self.size_policy is not None:
                rows = self.rows(i)
                o = obs.ltd_size_obs(self.wa.sorted_candidates[rows], D[i], self.logs.context_len[rows],
                                     self.cfg.width, self.Dmax, presorted=True)
                if self.rich:                   # the history up to the previous cycle, as in replay
                    o = rich.with_extra(o, self.hist.features(i))
                V = np.asarray(self.size_policy(o), np.int64)
                calls += 1
            out = self._finish_cycle(i, D[i], self.cfg.width, V, calls)
            reward[i] = self.cycle_reward(out["emitted"], out["t"])
            term[i], trunc[i] = out["terminated"], out["truncated"]
            self.d[i] = 1
        go = np.flatnonzero(~finish & ~self.done)
        self.d[go] = D[go]
        info = {"cycle_end": finish}
        self._end_episodes(np.arange(self.n), reward, term, trunc)
        return self.observe(), reward, term, trunc, info


# ------------------------------------------------------------------ size (LTD)

class SizeEnv(_ReplayCore):
    """LTD size policy env: one step per cycle; action a -> V = 20 + 20 a."""

    n_actions = len(obs.SIZE_ACTIONS)
    _uses_fixed_verify = False

    def __init__(self, logs, latency, cfg: EnvConfig, depth_policy=None, size_values=obs.SIZE_ACTIONS):
        self.depth_policy = depth_policy
        self.size_values = np.asarray(size_values, np.int64)
        self.n_actions = len(self.size_values)
        super().__init__(logs, latency, cfg)
        self.Dmax = min(cfg.max_depth, logs.max_depth)
        logs.grid_index(self.size_values)                            # all on the grid
        self.obs_dim = rich.obs_dim("ltd_size", cfg.obs_variant, cfg.width, self.Dmax)
        self.D = np.ones(self.n, np.int64)
        self.depth_calls = np.zeros(self.n, np.int64)

    def _start_cycle(self, idx):
        """Choose this cycle's D: the depth policy's stops, or uniform on 1..Dmax."""
        if self.depth_policy is None:
            self.D[idx] = self.rng.integers(1, self.Dmax + 1, len(idx))
            self.depth_calls[idx] = 0
            return
        rows = self.rows(idx)
        ctx = self.logs.context_len[rows]
        D = np.full(len(idx), self.Dmax, np.int64)
        drafting = np.ones(len(idx), bool)
        for d in range(1, self.Dmax):
            j = np.flatnonzero(drafting)
            if not len(j):
                break
            o = obs.ltd_depth_obs(self.wa.sorted_candidates[rows[j], d - 1], d, ctx[j], self.cfg.width, presorted=True)
            if self.rich:
                o = rich.with_extra(o, rich.ltd_depth_extra(
                    rich.entropy_feature(self.wa.entropy[rows[j], d - 1]), self.hist.features(idx[j])))
            stop = j[~np.asarray(self.depth_policy(o), bool)]
            D[stop] = d
            drafting[stop] = False
        self.D[idx] = D
        self.depth_calls[idx] = np.minimum(D, self.Dmax - 1)

    def observe(self):
        rows = self.rows()
        o = obs.ltd_size_obs(self.wa.sorted_candidates[rows], self.D, self.logs.context_len[rows], self.cfg.width,
                             self.Dmax, presorted=True)
        return rich.with_extra(o, self.hist.features()) if self.rich else o

    def step(self, actions):
        a = np.asarray(actions, np.int64)
        i = np.flatnonzero(~self.done)
        reward = np.zeros(self.n)
        term = np.zeros(self.n, bool)
        trunc = np.zeros(self.n, bool)
        if len(i):
            V = self.size_values[a[i]]
            out = self._finish_cycle(i, self.D[i], self.cfg.width, V, self.depth_calls[i] + 1)
            reward[i] = self.cycle_reward(out["emitted"], out["t"])
            term[i], trunc[i] = out["terminated"], out["truncated"]
            self._start_cycle(i)
        self._end_episodes(np.arange(self.n), reward, term, trunc)
        return self.observe(), reward, term, trunc, {"depth": self.D.copy()}


# ------------------------------------------------------------------ shape (Re-SpS)

class RespsEnv(_ReplayCore):
    """Re-SpS env: action = index into `shapes` [(V, D, W)], held for hold_cycles cycles."""

    _uses_fixed_verify = False

    def __init__(self, logs, latency, cfg: EnvConfig):
        self.shapes = np.asarray(cfg.shapes, np.int64) if cfg.shapes is not None else resps_shapes(logs, cfg.max_depth)
        if not len(self.shapes):
            raise ValueError("empty shape action set")
        for W in np.unique(self.shapes[:, 2]):
            if int(W) not in logs.w:
                raise ValueError(f"shape width {int(W)} not in the loaded logs (widths {list(logs.w)})")
        logs.grid_index(self.shapes[:, 0])
        self.n_actions = len(self.shapes)
        super().__init__(logs, latency, cfg)
        self.obs_dim = rich.obs_dim("resps", cfg.obs_variant)
        self.last = {k: np.zeros(self.n, np.int64) for k in ("D", "W", "V", "L", "emitted")}
        self.has_last = np.zeros(self.n, bool)
        self.last_root = np.full((self.n, obs.RESPS_ROOT_K), np.nan, np.float32)

    def _start(self, idx):
        super()._start(idx)
        self.has_last[idx] = False

    def observe(self):
        rows = self.rows()
        o = obs.resps_obs(self.last_root, self.last["L"], self.last["D"], self.last["V"], self.last["W"],
                          self.last["emitted"], self.logs.context_len[rows], self.has_last, self.logs.max_depth)
        return rich.with_extra(o, self.hist.features()) if self.rich else o

    def step(self, actions):
        a = np.asarray(actions, np.int64)
        V, D, W = self.shapes[a, 0], self.shapes[a, 1], self.shapes[a, 2]
        tput = np.zeros(self.n)
        count = np.zeros(self.n)
        term = np.zeros(self.n, bool)
        trunc = np.zeros(self.n, bool)
        live = ~self.done
        for k in range(self.cfg.hold_cycles):
            i = np.flatnonzero(live)
            if not len(i):
                break
            v_eff = np.minimum(V[i], 1 + pool_size(D[i], W[i]))
            out = self._finish_cycle(i, D[i], W[i], V[i], 1 if k == 0 else 0)
            tput[i] += self.cycle_reward(out["emitted"], out["t"])
            count[i] += 1
            for key, val in (("D", D[i]), ("W", W[i]), ("V", v_eff), ("L", out["L"]), ("emitted", out["emitted"])):
                self.last[key][i] = val
            self.has_last[i] = True
            for Wv in np.unique(W[i]):
                m = W[i] == Wv
                cs = self.logs.w[int(Wv)].root_scores(out["rows"][m], min(int(Wv), obs.RESPS_ROOT_K))
                self.last_root[i[m]] = np.nan
                self.last_root[i[m], : cs.shape[1]] = cs
            end = out["terminated"] | out["truncated"]
            term[i], trunc[i] = out["terminated"], out["truncated"]
            live[i[end]] = False
        if self.cfg.objective == "rate":                        # sum of the held cycles' (L+1) - lambda t
            reward = tput
        else:
            reward = np.where(count > 0, tput / np.maximum(count, 1), 0.0)
        self._end_episodes(np.arange(self.n), reward, term, trunc)
        return self.observe(), reward, term, trunc, {"held_cycles": count}


# ------------------------------------------------------------------ RADAR

class RadarEnv(_ReplayCore):
    """RADAR stop/continue env (module docstring). Actions: 0 STOP, 1 CONTINUE."""

    n_actions = 2

    def __init__(self, logs, latency, cfg: EnvConfig):
        super().__init__(logs, latency, cfg)
        self.tmax = min(cfg.radar_max_calls, logs.max_depth)
        self.obs_dim = rich.obs_dim("radar", cfg.obs_variant, cfg.width)
        self.d = np.ones(self.n, np.int64)
        if cfg.radar_reward == "expected" and self.wa.accept_dist is None:
            raise ValueError("radar_reward='expected' needs accept_dist (T > 0 logs)")

    def _start_cycle(self, idx):
        self.d[idx] = 1

    def observe(self):
        rows = self.rows()
        o = obs.radar_obs(self.wa.beam_scores[rows, self.d - 1], self.cfg.width)
        if not self.rich:
            return o
        return rich.with_extra(o, rich.radar_extra(rich.entropy_feature(self.wa.entropy[rows, self.d - 1]),
                                                   self.logs.context_len[rows], self.hist.features()))

    def step(self, actions):
        a = np.asarray(actions).astype(bool)
        cont = a & ~self.done
        D = np.where(cont, self.d + 1, self.d)
        finish = (~cont | (D >= self.tmax)) & ~self.done
        reward = np.where(cont, -self.cfg.radar_alpha, 0.0)
        term = np.zeros(self.n, bool)
        trunc = np.zeros(self.n, bool)
        new_cycle = np.zeros(self.n, bool)
        i = np.flatnonzero(finish)
        if len(i):
            out = self._finish_cycle(i, D[i], self.cfg.width, self.cfg.verify_size, self.d[i].copy())
            if self.cfg.radar_reward == "expected":
                dist = self.wa.accept_dist[out["rows"], D[i] - 1]            # [k, Dmax+1]
                L = dist @ np.arange(dist.shape[1])
                L = np.where(np.isnan(L), out["L"], L)                        # rows without a logged dist
            else:
                L = out["L"]
            num = L + 1 if self.cfg.radar_count_bonus else L
            if self.cfg.objective == "rate":                     # (L+1) - lambda t_cycle (the replayed cycle time)
                reward[i] += num - self.cfg.rate_ref * out["t"]
            else:
                tgen = self.lat.radar_tgen(D[i], out["ctx"], self.cfg.width, self.cfg.verify_size, self.tmax)
                reward[i] += num / tgen
            term[i], trunc[i] = out["terminated"], out["truncated"]
            self.d[i] = 1
            new_cycle[i] = True
        go = np.flatnonzero(~finish & ~self.done)
        self.d[go] = D[go]
        self._end_episodes(np.arange(self.n), reward, term, trunc)
        return self.observe(), reward, term, trunc, {"new_cycle": new_cycle | term | trunc, "cycle_end": finish}


MODES = {"depth": DepthEnv, "size": SizeEnv, "shape": RespsEnv, "radar": RadarEnv}


def make_replay_env(logs: ReplayLogs, latency: LatencyModel, mode: str = "depth", config: EnvConfig | None = None,
              **kwargs):
    """Build a vectorised replay env: mode in depth | size | shape | radar; kwargs override EnvConfig
    fields, except depth_policy (size mode) and size_policy (depth mode)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} ({' | '.join(MODES)})")
    extra = {k: kwargs.pop(k) for k in ("depth_policy", "size_policy", "size_values") if k in kwargs}
    cfg = replace(config or EnvConfig(), **kwargs)
    return MODES[mode](logs, latency, cfg, **extra)


# ------------------------------------------------------------------ gymnasium wrapper

def _gym_cls():
    import gymnasium as gym

    class _ReplayGymEnv(gym.Env):
        """One replay env as a gymnasium.Env (no autoreset; call reset() after the episode ends)."""

        metadata = {"render_modes": []}

        def __init__(self, logs: ReplayLogs, latency: LatencyModel, mode: str = "depth", **kwargs):
            kwargs.update(n_envs=1, autoreset=False)
            self.vec = make_replay_env(logs, latency, mode, **kwargs)
            # scores >= SCORE_FLOOR, every other feature >= 0; context_len/1000 is unbounded in principle
            self.observation_space = gym.spaces.Box(low=obs.SCORE_FLOOR, high=1e6, shape=(self.vec.obs_dim,),
                                                    dtype=np.float32)
            self.action_space = gym.spaces.Discrete(self.vec.n_actions)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            if seed is None:
                seed = int(self.np_random.integers(0, 2**31 - 1))
            o, _ = self.vec.reset(seed=seed)
            return o[0], {}

        def step(self, action):
            o, r, term, trunc, info = self.vec.step(np.array([int(action)]))
            return o[0], float(r[0]), bool(term[0]), bool(trunc[0]), {}

    return _ReplayGymEnv


def make_replay_gym_env(logs: ReplayLogs, latency: LatencyModel, mode: str = "depth", **kwargs):
    """One replay env (n_envs = 1, no autoreset) as a `gymnasium.Env` (gymnasium imported on first use)."""
    return _gym_cls()(logs, latency, mode, **kwargs)
