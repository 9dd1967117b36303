"""Exact replay of whole generations under any policy, vectorised over sequences.

`simulate(policy, logs, latency)` runs every sequence of `logs` once, all of them in lockstep
(one numpy batch per cycle), calling the policy's hooks exactly where the engine calls the
`pipeline.decode.controller.Controller` hooks:

    plan(ctx)                  once per cycle                       -> (D_max, W, V, policy calls)
    continue_drafting(step)    after draft forward d = 1..D_max-1   -> False stops at D = d
    verify_size(pool)          once, when the policy has a size hook -> V
    observe(record)            after the cycle

Replay (docs/design.md, "Exact counterfactual replay"): at root position p, the static tree (D, W, V) accepts
    L = acceptance_W[row(s, p), D-1, index(V)]
the cycle emits min(L + 1, T - 1 - p) tokens and the next root is p + L + 1; the generation is
done once p >= T - 1. The clock is `LatencyModel.t_cycle`:
    t = D t_draft(W, c) + t_verify(min(V, 1 + W + (D-1)W^2), c) + n_calls t_call + t_overhead(c)
with t_call = latency.t_policy for learned policies (policy.call_cost == "model") or the
policy's own figure (heuristics: 0).

Metrics (docs/design.md, "Vocabulary"): tau = total emitted / total cycles (iteration-weighted); tokens/s per
sequence = (T - 1) / total cycle time, averaged over sequences (Spec-Bench: per-question speeds).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline import metrics
from pipeline.decode.step_shape import pool_size
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import ReplayLogs
from simulator.observations.paper import RESPS_ROOT_K
from simulator.policies.base import PlanBatch, PoolBatch, StepBatch


def call_seconds(policy, latency: LatencyModel) -> float:
    """Seconds the clock charges per policy call: the checkpoint's own measured cost when the profile
    has it (LatencyModel.call_s), else the generic policy op; heuristics state their own figure."""
    c = getattr(policy, "call_cost", "model")
    return latency.call_s(getattr(policy, "latency_key", None)) if c == "model" else float(c)


def lookup_accepted(logs: ReplayLogs, rows, depth, width, verify) -> np.ndarray:
    """L for arrays of (row, D, W, V); V must be on the logged grid; W among the loaded widths."""
    rows, depth, width = np.asarray(rows), np.asarray(depth), np.broadcast_to(np.asarray(width), np.shape(rows))
    g = logs.grid_index(np.broadcast_to(np.asarray(verify), np.shape(rows)))
    out = np.empty(np.shape(rows), np.int64)
    for W in np.unique(width):
        m = width == W
        if int(W) not in logs.w:
            raise ValueError(f"width {int(W)} not in the loaded logs (widths {list(logs.w)})")
        out[m] = logs.w[int(W)].acceptance[rows[m], np.broadcast_to(depth, np.shape(rows))[m] - 1, g[m]]
    return out


def cycle_time(latency: LatencyModel, depth, width, verify, context_len, n_calls, call_s: float,
               rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """Per-component cycle times (module docstring). rng -> sampled latency noise."""
    depth = np.asarray(depth)
    v_eff = np.minimum(verify, 1 + pool_size(np.asarray(depth), np.asarray(width)))
    td = depth * latency.t_draft(width, context_len, rng)
    tv = latency.t_verify(v_eff, context_len, rng)
    to = latency.t_overhead(context_len, rng)
    tp = np.asarray(n_calls, np.float64) * call_s      # policy calls: measured median (no noise)
    return {"t_draft": td, "t_verify": tv, "t_policy": tp, "t_overhead": to, "t_cycle": td + tv + tp + to,
            "verify_eff": v_eff}


@dataclass
class SimResult:
    policy: str
    dataset: np.ndarray            # [S]
    tokens: np.ndarray             # [S] T - 1 emitted in cycles
    time: np.ndarray               # [S] seconds
    cycles: np.ndarray             # [S]
    accepted: np.ndarray           # [S] sum of L
    components: dict = field(default_factory=dict)   # t_draft / t_verify / t_policy / t_overhead [S], calls [S]
    trace: dict | None = None      # per cycle: seq, position, depth, width, verify, accepted, emitted, t_cycle

    @property
    def tokens_per_s(self) -> np.ndarray:
        return self.tokens / np.maximum(self.time, 1e-12)

    def summary(self, mask: np.ndarray | None = None) -> dict:
        m = np.ones(len(self.tokens), bool) if mask is None else np.asarray(mask, bool)
        if not m.any():
            return {"sequences": 0}
        cyc = self.cycles[m].sum()
        return {"sequences": int(m.sum()), "tokens": int(self.tokens[m].sum()), "cycles": int(cyc),
                "tau": float(metrics.tau(self.tokens[m].sum(), cyc)),
                "mean_accepted": float(self.accepted[m].sum() / max(cyc, 1)),
                "tokens_per_s": float(self.tokens_per_s[m].mean()),
                "time_s": float(self.time[m].sum()),
                **{k: float(v[m].sum() / max(self.time[m].sum(), 1e-12)) for k, v in self.components.items()
                   if k.startswith("t_")}}


def concat_results(parts: list[tuple[np.ndarray, SimResult]]) -> SimResult:
    """One SimResult from per-chunk results [(source_index [S_i], result)], its sequences in source_index
    order (a streamed replay then equals the in-memory one, sequence for sequence)."""
    idx = np.concatenate([i for i, _ in parts])
    order = np.argsort(idx, kind="stable")
    cat = lambda get: np.concatenate([get(r) for _, r in parts])[order]
    first = parts[0][1]
    return SimResult(first.policy, cat(lambda r: r.dataset), cat(lambda r: r.tokens), cat(lambda r: r.time),
                     cat(lambda r: r.cycles), cat(lambda r: r.accepted),
                     {k: cat(lambda r, k=k: r.components[k]) for k in first.components})


def simulate(policy, logs: ReplayLogs, latency: LatencyModel, seed: int = 0, max_cycles: int | None = None,
             noise_seed: int | None = None, trace: bool = False) -> SimResult:
    """Replay every sequence of `logs` once under `policy` (see module docstring)."""
    S = logs.n_sequences
    target = logs.new_tokens - 1
    p = np.zeros(S, np.int64)
    cycles = np.zeros(S, np.int64)
    active = target > 0
    acc = {k: np.zeros(S) for k in ("time", "accepted", "emitted", "t_draft", "t_verify", "t_policy", "t_overhead", "calls")}
    last = {k: np.zeros(S, np.int64) for k in ("depth", "width", "verify", "accepted", "emitted")}
    has_last = np.zeros(S, bool)
    last_root = np.full((S, RESPS_ROOT_K), np.nan, np.float32)
    rng = None if noise_seed is None else np.random.default_rng(noise_seed)
    call_s = call_seconds(policy, latency)
    policy.reset(S, seed=seed)
    tr = {k: [] for k in ("seq", "position", "depth", "width", "verify", "accepted", "emitted", "t_cycle")} if trace else None

    while active.any():
        env = np.flatnonzero(active)
        rows = logs.offsets[env] + p[env]
        ctx = logs.context_len[rows]
        shape = policy.plan(PlanBatch(env=env, seq=env, position=p[env], cycle=cycles[env], context_len=ctx,
                                      has_last=has_last[env], last_depth=last["depth"][env],
                                      last_width=last["width"][env], last_verify=last["verify"][env],
                                      last_accepted=last["accepted"][env], last_emitted=last["emitted"][env],
                                      last_root_scores=last_root[env]))
        D_max = np.clip(np.asarray(shape.depth, np.int64), 1, logs.max_depth)
        W = np.broadcast_to(np.asarray(shape.width, np.int64), env.shape).copy()
        V = np.broadcast_to(np.asarray(shape.verify, np.int64), env.shape).copy()
        calls = np.broadcast_to(np.asarray(shape.calls, np.int64), env.shape).copy()
        D = D_max.copy()
        if policy.uses_depth_hook or policy.uses_size_hook:
            Wp = int(policy.width)
            if np.any(W != Wp):
                raise ValueError(f"{policy.name}: hook policies draft with one width ({Wp})")
            wa = logs.w[Wp]
        if policy.uses_depth_hook:
            drafting = np.ones(len(env), bool)
            for d in range(1, int(D_max.max())):
                ask = drafting & (d < D_max)
                if not ask.any():
                    break
                i = np.flatnonzero(ask)
                r = rows[i]
                cand = wa.candidate_scores[r, d - 1] if "candidate_scores" in policy.step_fields else None
                cont = np.asarray(policy.continue_drafting(StepBatch(
                    env=env[i], depth=d, width=Wp, beam_scores=wa.beam_scores[r, d - 1],
                    candidate_scores=cand, entropy=wa.entropy[r, d - 1],
                    context_len=ctx[i], sorted_candidates=cand)), bool)
                calls[i] += 1
                stop = i[~cont]
                D[stop] = d
                drafting[stop] = False
        if policy.uses_size_hook:
            V = np.asarray(policy.verify_size(PoolBatch(env=env, depth=D, width=Wp,
                                                        level_scores=wa.sorted_candidates[rows], context_len=ctx),
                                              V), np.int64)
            calls += 1
        L = lookup_accepted(logs, rows, D, W, V)
        t = cycle_time(latency, D, W, V, ctx, calls, call_s, rng)
        remaining = target[env] - p[env]
        emitted = np.minimum(L + 1, remaining)
        acc["time"][env] += t["t_cycle"]
        acc["accepted"][env] += L
        acc["emitted"][env] += emitted
        for k in ("t_draft", "t_verify", "t_policy", "t_overhead"):
            acc[k][env] += t[k]
        acc["calls"][env] += calls
        if tr is not None:
            for k, v in (("seq", env), ("position", p[env]), ("depth", D), ("width", W), ("verify", t["verify_eff"]),
                         ("accepted", L), ("emitted", emitted), ("t_cycle", t["t_cycle"])):
                tr[k].append(np.asarray(v).copy())
        policy.observe(env, {"depth": D, "width": W, "verify_size": t["verify_eff"], "accepted": L, "emitted": emitted,
                             "context_len": ctx, "t_cycle": t["t_cycle"]})
        for Wv in np.unique(W):
            m = W == Wv
            cs = logs.w[int(Wv)].root_scores(rows[m], min(int(Wv), RESPS_ROOT_K))
            last_root[env[m]] = np.nan
            last_root[env[m], : cs.shape[1]] = cs
        for k, v in (("depth", D), ("width", W), ("verify", t["verify_eff"]), ("accepted", L), ("emitted", emitted)):
            last[k][env] = v
        has_last[env] = True
        p[env] += L + 1
        cycles[env] += 1
        active[env] = p[env] < target[env]
        if max_cycles is not None:
            active[env] &= cycles[env] < max_cycles
    comps = {k: acc[k] for k in ("t_draft", "t_verify", "t_policy", "t_overhead", "calls")}
    trace_out = {k: np.concatenate(v) if v else np.zeros(0) for k, v in tr.items()} if tr is not None else None
    return SimResult(policy=getattr(policy, "name", "policy"), dataset=logs.dataset, tokens=acc["emitted"],
                     time=acc["time"], cycles=cycles, accepted=acc["accepted"], components=comps, trace=trace_out)


def autoregressive(logs: ReplayLogs, latency: LatencyModel) -> SimResult:
    """AR decoding: one target forward (V = 1) + overhead per token, at context prompt_len + p."""
    t_row = latency.t_ar(logs.context_len)
    time = np.add.reduceat(t_row, logs.offsets[:-1]) if logs.n_positions else np.zeros(logs.n_sequences)
    time = np.where(logs.offsets[1:] > logs.offsets[:-1], time, 0.0)
    tokens = (logs.new_tokens - 1).astype(np.float64)
    return SimResult(policy="ar", dataset=logs.dataset, tokens=tokens, time=time, cycles=tokens.astype(np.int64),
                     accepted=np.zeros(logs.n_sequences), components={"t_verify": time})
