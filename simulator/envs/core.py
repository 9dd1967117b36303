"""The replay envs' shared core: configuration, Re-SpS's shape sets, and `_ReplayCore`, which keeps
each env's (sequence, position), replays a cycle's outcome exactly from the logs, tracks the
acceptance history (the "rich" observation variant, simulator/observations/rich.py) and records
finished episodes. The four modes built on it are in simulator/envs/vector.py (whose docstring has the
formulas)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline import metrics
from pipeline.decode.step_shape import pool_size
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import ReplayLogs
from simulator.observations import paper as obs
from simulator.observations import rich
from simulator.replay import cycle_time

RESPS_VERIFY = (32, 48, 64, 80, 96, 128)
RESPS_DEPTH = (3, 4, 5, 6, 7, 8)
RESPS_WIDTH = (8, 12, 16, 20, 32)


BURN_IN_SHAPE = (2, 8)                 # (D, V) at the env's W: a small tree, like the CPU's grid-best


@dataclass
class EnvConfig:
    n_envs: int = 256
    width: int = 10                     # W for depth / size / radar
    max_depth: int = 12                 # LTD: D <= 12
    verify_size: int = 60               # V for depth / radar
    episode_cycles: int | None = None   # None: whole sequences from p = 0
    autoreset: bool = True
    latency_noise: bool = False         # sample cycle times from the measured p10/p90 spread
    call_cost: float | None = None      # seconds per policy call (None: latency.t_policy)
    hold_cycles: int = 10               # shape: cycles an action is held (Re-SpS: 10 train, 30 inference)
    shapes: tuple | None = None         # shape: [(V, D, W)]; None: Re-SpS's set (see module docstring)
    radar_max_calls: int = obs.RADAR_MAX_CALLS
    radar_alpha: float = 0.0            # penalty per CONTINUE (tokens/s units)
    radar_count_bonus: bool = True      # numerator L+1 (True) or RADAR's L (False)
    radar_reward: str = "exact"         # exact | expected
    obs_variant: str = "paper"          # paper (the seeds' observations) | rich (observations_rich)
    history_burn_in: int = 8            # rich, episodes from a random position: cycles of BURN_IN_SHAPE
                                        # replayed first, so the acceptance history is not always empty
    objective: str = "ratio"            # ratio: the seeds' per-cycle throughput (L+1)/t_cycle
                                        # rate: (L+1) - rate_ref * t_cycle (see OBJECTIVES below)
    rate_ref: float = 0.0               # rate: tokens/s to beat (the trainers pass grid-best's replay tokens/s)
    seed: int = 0


# Cycle rewards (EnvConfig.objective). What decoding maximises is the generation's rate
#     R = sum_cycles (L+1) / sum_cycles t_cycle.
# "ratio" (the seeds') scores each cycle by its own (L+1)/t_cycle, so a policy that maximises the
# per-cycle mean prefers, in a good state, the cycle with the higher ratio even when a deeper one
# would add tokens faster than the generation's average rate: it under-drafts exactly where
# drafting pays. "rate" is Dinkelbach's form: with lambda = rate_ref,
#     r = (L+1) - lambda t_cycle,      sum r = sum (L+1) - lambda sum t  >  0  <=>  R > lambda,
# and maximising E[r | state] per state is the renewal-reward optimum at lambda = R* (for lambda
# below R*, its maximiser still beats lambda). Taking lambda = grid-best's rate asks the policy for
# every cycle that beats the best static tree's rate.
OBJECTIVES = ("ratio", "rate")


# "wide" action space (ACTION_SPACES): the seeds' sets were tuned for GPUs, where a 60-token verify
# costs about one AR step. On a CPU it costs several, and the best trees are shallow and small, so
# the wide space adds D = 1, 2 and V down to 2 (V <= 1 + pool size instead of W^(D-1)).
RESPS_WIDE_VERIFY = (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)
RESPS_WIDE_DEPTH = (1, 2, 3, 4, 5, 6, 7, 8)
ACTION_SPACES = ("seeds", "wide")


def resps_shapes(logs: ReplayLogs, max_depth: int | None = None, space: str = "seeds") -> np.ndarray:
    """Re-SpS's (V, D, W) set, V snapped to the logged grid, W restricted to logged widths, deduplicated.

    space "seeds": V in {32..128}, D in {3..8}, W in {8..32}, V <= W^(D-1) (docs/design.md, "Action spaces").
    space "wide":  V in RESPS_WIDE_VERIFY, D in 1..8, every logged W, V <= 1 + W + (D-1) W^2."""
    if space not in ACTION_SPACES:
        raise ValueError(f"unknown action space {space!r} (known: {', '.join(ACTION_SPACES)})")
    wide = space == "wide"
    widths = list(logs.widths) if wide else ([w for w in RESPS_WIDTH if w in logs.w] or list(logs.widths))
    out = []
    for W in widths:
        for D in (RESPS_WIDE_DEPTH if wide else RESPS_DEPTH):
            if D > (max_depth or logs.max_depth):
                continue
            for V in (RESPS_WIDE_VERIFY if wide else RESPS_VERIFY):
                if (V <= 1 + pool_size(D, W)) if wide else (V <= W ** (D - 1)):
                    t = (int(logs.snap_to_grid(V)), D, W)
                    if t not in out:
                        out.append(t)
    return np.array(out, np.int64)


class _ReplayCore:
    """Sequence/position bookkeeping, exact cycle outcomes, episode statistics."""

    obs_dim: int
    n_actions: int

    def __init__(self, logs: ReplayLogs, latency: LatencyModel, cfg: EnvConfig):
        self.logs, self.lat, self.cfg = logs, latency, cfg
        if cfg.width not in logs.w:
            raise ValueError(f"width {cfg.width} not in the loaded logs (widths {list(logs.w)})")
        self.n = cfg.n_envs
        self.target = logs.new_tokens - 1
        self.valid_seqs = np.flatnonzero(self.target > 0)
        if not len(self.valid_seqs):
            raise ValueError("no sequence with anything to draft")
        self.call_s = latency.policy_s if cfg.call_cost is None else float(cfg.call_cost)
        self.wa = logs.w[cfg.width]
        self.G = logs.grid_index(cfg.verify_size) if self._uses_fixed_verify else None
        self.seq = np.zeros(self.n, np.int64)
        self.p = np.zeros(self.n, np.int64)
        self.cycles = np.zeros(self.n, np.int64)
        self.done = np.zeros(self.n, bool)
        self.ep = {k: np.zeros(self.n) for k in ("return", "time", "tokens", "cycles", "steps")}
        self.finished: list[dict] = []           # stats of finished episodes (drained by trainers)
        self.rng = np.random.default_rng(cfg.seed)
        self.rich = rich.check_variant(cfg.obs_variant) == "rich"
        if cfg.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {cfg.objective!r} ({' | '.join(OBJECTIVES)})")
        if cfg.objective == "rate" and not cfg.rate_ref > 0:
            raise ValueError("objective 'rate' needs rate_ref > 0 (tokens/s, e.g. grid-best's)")
        self.hist = rich.AcceptanceHistory(self.n)      # updated when a cycle finishes (rich only)

    _uses_fixed_verify = True

    # ---- episodes
    def _start(self, idx: np.ndarray) -> None:
        k = len(idx)
        if self.cfg.episode_cycles is None:
            self.seq[idx] = self.valid_seqs[self.rng.integers(0, len(self.valid_seqs), k)]
            self.p[idx] = 0
        else:
            rows = self.rng.integers(0, self.logs.n_positions, k)
            self.seq[idx] = self.logs.seq_index[rows]
            self.p[idx] = self.logs.position[rows]
        self.cycles[idx] = 0
        self.done[idx] = False
        for v in self.ep.values():
            v[idx] = 0.0
        if self.rich:
            self.hist.reset(idx)
            if self.cfg.episode_cycles is not None and self.cfg.history_burn_in > 0:
                self._burn_in(idx)
        self._start_cycle(idx)

    def _burn_in(self, idx: np.ndarray) -> None:
        """Replay up to history_burn_in cycles of the static BURN_IN_SHAPE from the drawn position and
        start the episode where they end, so that an episode cut from the middle of a generation
        starts with an acceptance history, as it would in decoding (that history comes from a static
        tree, not from the policy being trained: a documented approximation; whole-sequence episodes
        need none). A sequence that would end stops its burn-in early."""
        D = min(BURN_IN_SHAPE[0], self.logs.max_depth)
        g = self.logs.grid_index(self.logs.snap_to_grid(BURN_IN_SHAPE[1]))
        acc = self.wa.acceptance                                          # the env's W
        live = np.asarray(idx)
        for _ in range(self.cfg.history_burn_in):
            L = acc[self.rows(live), D - 1, g].astype(np.int64)
            ok = self.p[live] + L + 1 < self.target[self.seq[live]]      # the episode keeps >= 1 token
            live = live[ok]
            if not len(live):
                break
            self.hist.update(live, L[ok], D)
            self.p[live] += L[ok] + 1

    def _start_cycle(self, idx: np.ndarray) -> None:
        pass

    def rows(self, idx=None) -> np.ndarray:
        s = self.seq if idx is None else self.seq[idx]
        p = self.p if idx is None else self.p[idx]
        return self.logs.offsets[s] + np.minimum(p, self.target[s] - 1)

    def _finish_cycle(self, idx, D, W, V, calls) -> dict:
        """Replay one cycle for envs idx; advance p; return L, emitted, t and episode ends."""
        rows = self.rows(idx)
        D = np.asarray(D, np.int64)
        if np.isscalar(W) or np.ndim(W) == 0:
            acc = self.logs.w[int(W)].acceptance
            g = self.G if (self.G is not None and np.ndim(V) == 0) else self.logs.grid_index(V)
            L = acc[rows, D - 1, g].astype(np.int64)
        else:
            from simulator.replay import lookup_accepted
            L = lookup_accepted(self.logs, rows, D, W, V)
        ctx = self.logs.context_len[rows]
        t = cycle_time(self.lat, D, W, V, ctx, calls, self.call_s,
                       self.rng if self.cfg.latency_noise else None)
        s = self.seq[idx]
        emitted = np.minimum(L + 1, self.target[s] - self.p[idx])
        if self.rich:
            self.hist.update(idx, L, D)
        self.p[idx] += L + 1
        self.cycles[idx] += 1
        self.ep["time"][idx] += t["t_cycle"]
        self.ep["tokens"][idx] += emitted
        self.ep["cycles"][idx] += 1
        term = self.p[idx] >= self.target[s]
        trunc = ~term & (False if self.cfg.episode_cycles is None else self.cycles[idx] >= self.cfg.episode_cycles)
        return {"L": L, "emitted": emitted, "t": t["t_cycle"], "D": D, "rows": rows, "ctx": ctx,
                "terminated": term, "truncated": trunc}

    def cycle_reward(self, emitted, t) -> np.ndarray:
        """One cycle's reward (OBJECTIVES): emitted / t ("ratio") or emitted - rate_ref * t ("rate")."""
        if self.cfg.objective == "rate":
            return emitted - self.cfg.rate_ref * t
        return emitted / t

    def _end_episodes(self, idx, reward, terminated, truncated) -> None:
        """Record finished episodes, autoreset (or freeze) them."""
        self.ep["return"] += reward
        self.ep["steps"] += 1
        end = np.flatnonzero(terminated | truncated)
        if not len(end):
            return
        tok, tim = self.ep["tokens"][end], self.ep["time"][end]
        for j, e in enumerate(end):
            self.finished.append({"return": float(self.ep["return"][e]), "tokens_per_s": float(tok[j] / max(tim[j], 1e-12)),
                                  "tau": float(metrics.tau(tok[j], self.ep["cycles"][e])), "cycles": int(self.ep["cycles"][e]),
                                  "steps": int(self.ep["steps"][e]), "tokens": float(tok[j]), "time": float(tim[j])})
        if len(self.finished) > 100_000:
            del self.finished[: len(self.finished) - 100_000]
        if self.cfg.autoreset:
            self._start(end)
        else:
            self.done[end] = True

    def drain_finished(self) -> list[dict]:
        out, self.finished = self.finished, []
        return out

    # ---- gym-style API
    def reset(self, seed: int | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self._start(np.arange(self.n))
        self.finished = []
        return self.observe(), {}

    def observe(self) -> np.ndarray:
        raise NotImplementedError

    def step(self, actions):
        raise NotImplementedError
