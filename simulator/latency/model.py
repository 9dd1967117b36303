"""Latency model: per-op times from the measured `latency` table, for the replay env's clock.

Ops (pipeline/logs/schema.py LATENCY rows, batch 1):
    draft_step  one draft forward over W beams at context length c        t_draft(W, c)
    verify      one target forward over V tree tokens at context length c t_verify(V, c)
    policy      one policy inference (one hook call)                      t_policy
    policy:<k>  one call of the checkpoint with latency key k, measured in the engine (optional;
                `draftgym profile-policy`); replaces t_policy for that checkpoint
    overhead    per-cycle bookkeeping outside the three above             t_overhead(c)
    prefill     one request's prefill over its n prompt tokens (the target forward with hidden
                states, the head's fusion and its forward over n - 1 entries), batch 1 as the
                engines run it; the row's context_len column holds n    t_prefill(n)

Cycle time (what the env charges; docs/design.md, "Vocabulary"):

    t_cycle = D * t_draft(W, c) + t_verify(V_eff, c) + n_calls * t_policy + t_overhead(c)
    V_eff   = min(V, 1 + W + (D-1) W^2)      (the engine clamps V to 1 + pool size)

Interpolation (simulator.latency.surface). For one op, the priced cell values (the `point` statistic,
simulator/latency/estimate.py) form a `Surface` over (x, c) with x = W (draft), V (verify) or nothing (overhead):
piecewise linear in x at each measured context level, then linear between context levels, flat
beyond the measured ranges; exact at every measured point. `fit_report()` measures how well it
predicts points it did not see (leave-one-out over interior points), the honest error bar (Vidur's
bar: < 9 %); `coverage()` and `plot()` are the other diagnostics (simulator.latency.diagnostics).

Noise (optional, for robustness training): a two-piece normal whose 10/90 % quantiles are the
measured p10/p90 (simulator.latency.surface.two_piece).

Batch size B (the serving step, docs/design.md "Serving at batch size B"). A profile taken with
`draftgym profile --batch-sizes 1,2,4,...` also has draft_step / verify / policy rows at B > 1 (one
op over B rows). Every prediction takes `batch=` (default 1: the surfaces above); B > 1 evaluates each profiled
level's surface at (x, c) and interpolates in B (simulator.latency.batch; beyond the largest profiled
B linear along the last segment, never cheaper than that level; ops with batch-1 rows only flat in
B). The serving step at B:

    t_step(D, W, V, c, B) = D * t_draft(W, c, B) + t_verify(V_eff, c, B) + n_calls * t_policy(B) + t_overhead(c, B)

with off = (0, -, 1), the AR step at B (t_ar), and a chain = (D, 1, D + 1). A profile with batch-1
rows only answers B > 1 with a one-line DataError instead of charging batch-1 costs.

The context c of a step over rows of different contexts c_r (`step_context`): the profile times B
rows at one context each, so what c stands for depends on the engine's attention. DraftGym's batched
engine keeps one KV slot per row and every row attends over the span of the longest (padding masked
out, not skipped: pipeline/decode/engine/core.py), so a step costs what B rows at max_r c_r cost:
`batch_context = "max"`. A paged engine (SGLang, vLLM) reads each row's own pages, so the attention
work is sum_r c_r = B mean_r c_r: `batch_context = "mean"`, what an imported SGLang profile sets
(simulator/serving/formats/sglang_import.py). At B = 1 both are the row's own context.

Padded steps (`row_bucket`). With CUDA graphs DraftGym's engine runs a step of B live rows over
row_buckets(B) rows (1, 2, 4, then multiples of 8: the capture sizes, as vLLM and SGLang pad), so
5 rows cost what 8 cost. A profile taken so says it in its rows' env_json ("row_bucket": true), and
every prediction at B is then made at row_buckets(B). Profiles without it (the CPU's, imported ones,
those taken before 2026-11-28) interpolate in B as above.

Prefill (`t_prefill`): interpolated in n between the profiled lengths, beyond the longest proportional
to n (flat would make long prompts free). Without prefill rows `has_prefill` is False and the load
replay charges no prefill.

RADAR's time model (RADAR, arXiv:2512.14069, Eq. 6):  T_gen(t) = T0 + Tf t + Teye (t+1)   (t < t_max; Teye t at t_max)
with t draft calls. Mapped onto ours at context c, width W, verify size V:
    T0   = t_verify(V, c) + t_overhead(c)     fixed per-cycle cost (verify + bookkeeping)
    Tf   = t_draft(W, c)                     one draft forward
    Teye = t_policy                          one predictor call
(RADAR counts one predictor call more than our engine makes: the engine asks the depth hook after
every forward but the last allowed one. `radar_tgen` follows the paper; the replay simulator
charges what the engine does.)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.decode.step_shape import pool_size
from pipeline.errors import DataError
from pipeline.logs.schema import read_table, table_files
from pipeline.profiling.trust import drop_suspects, suspects_line, trusted_out
from simulator.latency import diagnostics as latency_diagnostics
from simulator.latency.batch import BATCH_INTERP, X_KEY, batch_levels, interp_batch, row_batch, row_buckets
from simulator.latency.estimate import DEFAULT_POINT, POINTS, with_point
from simulator.latency.surface import Z90, Surface, surface_of, two_piece

OPS = ("draft_step", "verify", "policy", "overhead", "prefill")


@dataclass
class LatencyModel:
    draft: Surface                     # x = W
    verify: Surface                    # x = V
    overhead: Surface                  # x = 0
    policy_s: float                    # seconds per policy call
    policy_spread: tuple[float, float] = (1.0, 1.0)   # p10/median, p90/median of the policy op
    meta: dict = field(default_factory=dict)
    policy_costs: dict = field(default_factory=dict)  # latency_key -> seconds per call, measured in the engine
    batched: dict = field(default_factory=dict)       # op (draft_step | verify | overhead) -> {B: Surface}, B > 1
    policy_by_batch: dict = field(default_factory=dict)  # B -> (seconds, p10, p90) of the policy op over B rows, B > 1
    batch_interp: str = "linear"                      # in B: "linear" | "log" (simulator.latency.batch)
    prefill: Surface | None = None                    # x = 0, c = prompt tokens n; None: not profiled
    batch_context: str = "max"                        # a step's c over its rows: "max" | "mean" (module docstring)
    row_bucket: bool = False                          # B rows cost row_buckets(B) rows (module docstring)

    # ---- what a step over rows of different contexts costs, and the prefill
    def step_context(self, context_len, mask=None) -> np.ndarray:
        """The context c a batched step is charged at, over its rows' contexts along the last axis
        (module docstring): the longest row's for DraftGym's engine, the mean for a paged engine.
        mask (same shape, bool): the active rows; the others are ignored (each batch needs one)."""
        c = np.asarray(context_len, np.float64)
        m = np.ones(c.shape, bool) if mask is None else np.asarray(mask, bool)
        if self.batch_context == "max":
            return np.where(m, c, -np.inf).max(-1)
        return np.where(m, c, 0.0).sum(-1) / m.sum(-1)

    @property
    def has_prefill(self) -> bool:
        return self.prefill is not None

    def t_prefill(self, n_tokens) -> np.ndarray:
        """Seconds to prefill prompts of n tokens, one at a time (0 when the profile has no prefill rows)."""
        n = np.asarray(n_tokens, np.float64)
        if self.prefill is None:
            return np.zeros_like(n)
        top = float(self.prefill.levels[-1])
        t = self.prefill(np.zeros_like(n), np.minimum(n, top))
        return np.where(n > top, t * n / top, t)

    # ---- batch size B
    @property
    def batch_levels(self) -> list[int]:
        """Every batch size the profile measured (1 first)."""
        return sorted({1, *self.policy_by_batch, *(B for lv in self.batched.values() for B in lv)})

    def _batch(self, batch) -> np.ndarray | None:
        """None where every B is 1 (the batch-1 path, today's numbers exactly); else the B array,
        after refusing B > 1 on a profile measured at batch 1 only."""
        b = np.asarray(batch, np.float64)
        if self.row_bucket:
            b = row_buckets(b)
        if np.all(b == 1):
            return None
        if len(self.batch_levels) == 1:
            raise DataError(f"latency profile {self.meta.get('profile_id')!r} has batch 1 only; run "
                            f"`draftgym profile --batch-sizes 1,2,4,8,16` to time batch {float(b.max()):g}")
        return b

    def _at_batch(self, op: str, surf: Surface, x, ctx, b, rng=None) -> np.ndarray:
        """One op at (x, ctx, B), interpolated in B over the batch-1 surface and op's B > 1 levels."""
        x, ctx, b = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(ctx, np.float64), b)
        levels = [1, *sorted(self.batched.get(op, {}))]
        surfs = [surf] + [self.batched[op][B] for B in levels[1:]]
        at = lambda stat: interp_batch(levels, np.stack([s(x, ctx, stat) for s in surfs]), b, self.batch_interp)
        return at("median") if rng is None else two_piece(at("median"), at("p10"), at("p90"), rng)

    def call_s(self, latency_key: str | None) -> float:
        """Seconds per policy call for a checkpoint: its own 'policy:<key>' row when the profile has one
        (`draftgym profile-policy`: the real controller in real cycles, observation building included),
        else the generic `policy` op (a stand-in MLP forward)."""
        return float(self.policy_costs.get(latency_key, self.policy_s)) if latency_key else self.policy_s

    # ---- predictions (vectorised; rng -> sampled noise)
    def t_draft(self, width, context_len, rng: np.random.Generator | None = None, batch=1) -> np.ndarray:
        """One draft forward over `batch` rows of W beams."""
        if (b := self._batch(batch)) is not None:
            return self._at_batch("draft_step", self.draft, width, context_len, b, rng)
        return self.draft(width, context_len) if rng is None else self.draft.sample(width, context_len, rng)

    def t_verify(self, verify_size, context_len, rng: np.random.Generator | None = None, batch=1) -> np.ndarray:
        """One verify over `batch` rows of V tokens (V = 1: the AR step)."""
        if (b := self._batch(batch)) is not None:
            return self._at_batch("verify", self.verify, verify_size, context_len, b, rng)
        return self.verify(verify_size, context_len) if rng is None else self.verify.sample(verify_size, context_len, rng)

    def t_overhead(self, context_len, rng: np.random.Generator | None = None, batch=1) -> np.ndarray:
        """Per-cycle (per-step) engine cost outside the ops; flat in B unless the profile has B > 1 rows."""
        z = np.zeros(np.shape(context_len), np.int64)          # x = 0: integer, so the surface reads its table
        if (b := self._batch(batch)) is not None:
            return self._at_batch("overhead", self.overhead, z, context_len, b, rng)
        return self.overhead(z, context_len) if rng is None else self.overhead.sample(z, context_len, rng)

    def t_policy(self, n=None, rng: np.random.Generator | None = None, batch=1) -> np.ndarray | float:
        """One controller call (the policy op; at B > 1 over B observations). rng and n: n noisy draws."""
        if (b := self._batch(batch)) is not None:
            noisy = rng is not None and n is not None
            b = np.broadcast_to(b, (n,)) if noisy else b                      # one draw per call
            levels = sorted(self.policy_by_batch)
            one = (self.policy_s, self.policy_s * self.policy_spread[0], self.policy_s * self.policy_spread[1])

            def at(i):                                                         # i: 0 central, 1 p10, 2 p90
                F = np.stack([np.full(b.shape, one[i])] + [np.full(b.shape, self.policy_by_batch[B][i]) for B in levels])
                return interp_batch([1, *levels], F, b, self.batch_interp)
            return two_piece(at(0), at(1), at(2), rng) if noisy else at(0)
        if rng is None or n is None:
            return self.policy_s
        lo, hi = self.policy_spread
        z = rng.standard_normal(n)
        return self.policy_s * np.maximum(np.where(z > 0, 1 + z * (hi - 1) / Z90, 1 + z * (1 - lo) / Z90), 0.5 * lo)

    def t_ar(self, context_len, batch=1) -> np.ndarray:
        """Autoregressive decoding, per step of `batch` rows: one 1-token target forward per row + the
        per-step overhead."""
        return self.t_verify(1, context_len, batch=batch) + self.t_overhead(context_len, batch=batch)

    def t_step(self, depth, width, verify_size, context_len, batch=1, n_calls=0) -> np.ndarray:
        """Deterministic serving-step time at B rows (module docstring): depth 0 is "off" (the AR
        step: V_eff = 1, no draft), a chain is (D, 1, D + 1); V clamped to 1 + pool size as in
        t_cycle; n_calls controller calls at B (0 for a static shape or schedule)."""
        depth, width = np.asarray(depth), np.asarray(width)
        v_eff = np.where(depth > 0, np.minimum(verify_size, 1 + pool_size(depth, width)), 1)
        return (depth * self.t_draft(np.maximum(width, 1), context_len, batch=batch)
                + self.t_verify(v_eff, context_len, batch=batch)
                + np.asarray(n_calls) * self.t_policy(batch=batch) + self.t_overhead(context_len, batch=batch))

    def t_cycle(self, depth, width, verify_size, context_len, n_calls=0) -> np.ndarray:
        """Deterministic cycle time (module docstring), V clamped to 1 + pool size."""
        depth, width = np.asarray(depth), np.asarray(width)
        v_eff = np.minimum(verify_size, 1 + pool_size(depth, width))
        return (depth * self.t_draft(width, context_len) + self.t_verify(v_eff, context_len)
                + np.asarray(n_calls) * self.policy_s + self.t_overhead(context_len))

    # ---- RADAR
    def radar_constants(self, context_len=512, width: int = 10, verify_size: int = 60) -> tuple[float, float, float]:
        """(T0, Tf, Teye) of RADAR's T_gen at a context length (module docstring)."""
        T0 = float(self.t_verify(verify_size, context_len) + self.t_overhead(context_len))
        return T0, float(self.t_draft(width, context_len)), float(self.policy_s)

    def radar_tgen(self, t, context_len, width: int = 10, verify_size: int = 60, t_max: int = 8) -> np.ndarray:
        """RADAR's T_gen(t) (Eq. 6) for t draft calls, vectorised over t and context_len."""
        t = np.asarray(t, np.float64)
        T0 = self.t_verify(verify_size, context_len) + self.t_overhead(context_len)
        Tf = self.t_draft(width, context_len)
        eye = np.where(t < t_max, t + 1, t)
        return T0 + Tf * t + self.policy_s * eye

    def scaled(self, factor: float) -> "LatencyModel":
        """The same profile on a machine `factor` times slower (> 1) or faster (< 1): every engine op
        (draft, verify, overhead; median, p10, p90) times factor. Policy costs are kept: they are
        measured per checkpoint and are ~1 % of a cycle. Used for drift: on a shared VM the whole
        machine's speed moves by 10-30 % within minutes while the shape of the surfaces holds, so
        `draftgym validate --profile-interleave` rescales the pooled profile by the speed its own
        samples saw during each dataset's decoding (pipeline.profiling.profile.ProfileSampler.speed_factor)."""
        sc = lambda surf: surf.scaled(factor)
        return LatencyModel(sc(self.draft), sc(self.verify), sc(self.overhead), self.policy_s, self.policy_spread,
                            {**self.meta, "speed_factor": float(factor)}, dict(self.policy_costs),
                            {op: {B: sc(surf) for B, surf in lv.items()} for op, lv in self.batched.items()},
                            dict(self.policy_by_batch), self.batch_interp,
                            sc(self.prefill) if self.prefill is not None else None, self.batch_context,
                            self.row_bucket)

    # ---- constructors
    @classmethod
    def from_rows(cls, rows, model: str | None = None, profile: str | None = None,
                  point: str = DEFAULT_POINT, device: str | None = None, dtype: str | None = None,
                  batch_interp: str = "linear", trust: bool = True) -> "LatencyModel":
        """rows: a pyarrow Table or list of dicts with LATENCY columns. Rows without a `batch` (or with
        batch 0) are batch 1; the chosen profile's B > 1 rows become the levels interpolated in B
        (batch_interp: "linear" | "log", simulator.latency.batch).

        dtype: only profiles taken in this compute dtype (pass the logs' dtype: a bf16 replay timed
        with an fp32 profile would be a different machine). A profile whose rows mix dtypes is
        refused with a one-line error, whatever is asked.

        point: the cell statistic the model prices (simulator/latency/estimate.py): "robust"
        (default: each cell's median times its op's typical mean / median, so a few far samples in one
        cell cannot move its price; chosen by measurement against real decoding), "median" or "mean".

        trust: leave the profile's suspect cells out (default; pipeline/profiling/trust.py: a wild
        spread, an outlier mean, or dearer than a larger V, B or c); meta["suspect"] names them and
        meta["trust_note"] says it in one line (tune, serve-eval, train-load and validate print it).
        trust=False keeps every cell."""
        if point not in POINTS:
            raise ValueError(f"point must be one of {', '.join(POINTS)}, got {point!r}")
        if batch_interp not in BATCH_INTERP:
            raise ValueError(f"batch_interp must be one of {', '.join(BATCH_INTERP)}, got {batch_interp!r}")
        if hasattr(rows, "to_pylist"):
            rows = rows.to_pylist()
        wide = [r for r in rows if row_batch(r) > 1]
        rows = [r for r in rows if row_batch(r) == 1]
        if model is not None:
            safe = lambda s: str(s).replace("/", "--").replace("=", "-")
            rows = [r for r in rows if r["model_id"] == model or safe(r["model_id"]) == safe(model)]
        if not rows:
            raise DataError(f"no batch-1 latency rows{'' if model is None else f' for model {model}'}")
        if device is not None:
            # device: only profiles of this device (validate: the one it decodes on)
            have = sorted({str(r.get("device")) for r in rows})
            rows = [r for r in rows if r.get("device") == device]
            if not rows:
                raise DataError(f"no latency profile for device {device!r} (profiles exist for: {', '.join(have)}); "
                                f"run `draftgym profile` on this device, or validate with --profile-first")
        unfiltered = rows
        if dtype is not None:
            have = sorted({str(r.get("dtype")) for r in rows})
            rows = [r for r in rows if r.get("dtype") == dtype]
            if not rows:
                raise DataError(f"no {dtype} latency profile{'' if model is None else f' for model {model}'} "
                                f"(profiles exist in: {', '.join(have)}); run `draftgym profile --dtype {dtype}`")
        profiles = sorted({r["profile_id"] for r in rows})
        note = None
        if profile is None:
            # `draftgym profile` ids start with a timestamp: the last one sorted is the newest
            profile = profiles[-1]
            if len(profiles) > 1:
                note = f"{len(profiles)} latency profiles; using the newest, {profile} (choose with --profile)"
        rows = [r for r in rows if r["profile_id"] == profile]
        if not rows:
            raise DataError(f"latency profile {profile!r} not found (have {', '.join(profiles)})")
        mixed = sorted({str(r.get("dtype")) for r in unfiltered if r["profile_id"] == profile})
        if len(mixed) > 1:
            raise DataError(f"latency profile {profile!r} mixes dtypes ({', '.join(mixed)}); profile each dtype separately")
        wide = [r for r in wide if r["profile_id"] == profile]
        suspects = trusted_out(rows + wide) if trust else []
        if suspects:
            rows, wide = drop_suspects(rows, suspects), drop_suspects(wide, suspects)
        rows, wide = with_point(rows, point), with_point(wide, point)
        by = {op: [r for r in rows if r["op"] == op] for op in OPS}
        for op in ("draft_step", "verify"):
            if not by[op]:
                raise DataError(f"latency profile {profile!r} has no {op!r} rows")
        col = lambda rs, k: [float(r[k]) for r in rs]
        draft = surface_of(by["draft_step"], X_KEY["draft_step"], point)
        verify = surface_of(by["verify"], X_KEY["verify"], point)
        overhead = surface_of(by["overhead"], None, point) if by["overhead"] else Surface([0.0], [0.0], [0.0])
        pol = by["policy"]
        policy_s = float(np.mean(col(pol, point))) if pol else 0.0
        spread = ((float(np.mean(col(pol, "p10"))) / policy_s, float(np.mean(col(pol, "p90"))) / policy_s)
                  if pol and policy_s > 0 else (1.0, 1.0))
        costs = {r["op"].removeprefix("policy:"): float(r[point]) for r in rows if r["op"].startswith("policy:")}
        batched, policy_by_batch = batch_levels(wide, point)
        prefill = surface_of(by["prefill"], None, point) if by["prefill"] else None
        batch_context = "mean" if rows[0].get("device_type") == "sglang" else "max"   # paged vs slot attention
        row_bucket = bool(json.loads(rows[0].get("env_json") or "{}").get("row_bucket"))   # padded steps
        meta = {"profile_id": profile, "device": rows[0].get("device"), "model_id": rows[0].get("model_id"),
                "dtype": rows[0].get("dtype"), "n_rows": len(rows), "has_overhead": bool(by["overhead"]),
                "has_policy": bool(pol), "note": note, "point": point, "has_prefill": prefill is not None,
                "batch_context": batch_context, "row_bucket": row_bucket, "suspect": [x.label() for x in suspects],
                "trust_note": suspects_line(profile, suspects) if suspects else None,
                "batch_sizes": sorted({1, *policy_by_batch, *(B for lv in batched.values() for B in lv)})}
        return cls(draft, verify, overhead, policy_s, spread, meta, costs, batched, policy_by_batch, batch_interp,
                   prefill, batch_context, row_bucket)

    @classmethod
    def from_logs(cls, root: str | Path, model: str | None = None, profile: str | None = None,
                  point: str = DEFAULT_POINT, device: str | None = None, dtype: str | None = None,
                  batch_interp: str = "linear", trust: bool = True) -> "LatencyModel":
        """All latency shards under <root>/latency (any partitioning), checked reads. An object-store root:
        its latency table mirrored locally (only that table)."""
        from pipeline.logs.storage import local_dir

        files = table_files(local_dir(root, "the latency model", tables=("latency",)), "latency")
        if not files:
            raise DataError(f"no latency table under {root}/latency (run `draftgym profile` or pass --latency)")
        rows = []
        for f in files:
            rows += read_table(f, "latency").to_pylist()
        return cls.from_rows(rows, model=model, profile=profile, point=point, device=device, dtype=dtype,
                             batch_interp=batch_interp, trust=trust)

    @classmethod
    def from_constants(cls, draft_step: float = 0.006, verify: float = 0.05, policy: float = 0.0,
                       overhead: float = 0.0, verify_per_token: float = 0.0, draft_per_width: float = 0.0,
                       per_context: float = 0.0) -> "LatencyModel":
        """A linear model for tests: t_draft = draft_step + draft_per_width*W + per_context*c,
        t_verify = verify + verify_per_token*V + per_context*c, constant policy / overhead."""
        W = np.array([1.0, 64.0])
        V = np.array([1.0, 1024.0])
        C = np.array([0.0, 8192.0])
        gw, gc = np.meshgrid(W, C, indexing="ij")
        gv, gc2 = np.meshgrid(V, C, indexing="ij")
        d = draft_step + draft_per_width * gw + per_context * gc
        v = verify + verify_per_token * gv + per_context * gc2
        return cls(Surface(gw.ravel(), gc.ravel(), d.ravel()), Surface(gv.ravel(), gc2.ravel(), v.ravel()),
                   Surface([0.0], [0.0], [overhead]), float(policy),
                   meta={"profile_id": "constants", "device": "constants"})

    # ---- diagnostics (simulator.latency.diagnostics)
    def fit_report(self) -> dict:
        """Relative errors of the model against the measured points.

        in_sample: at the measured points (0 by construction; a sanity check).
        loo: leave-one-out, each interior point predicted from its neighbours along V/W (same
        context level) and along the context length (same V/W); the interpolation error estimate.
        batch_loo: each interior batch level predicted from the others, in B linear and log.
        """
        return latency_diagnostics.fit_report(self)

    def coverage(self, context_len, widths=(), verify_sizes=(), batches=()) -> dict:
        """How much of a workload lies outside the measured ranges (where the model extrapolates flat;
        in B: linearly along the last segment, see simulator.latency.batch). batch_range: the profiled
        batch sizes' range ([1, 1]: batch 1 only, no B > 1 query is answered)."""
        return latency_diagnostics.coverage(self, context_len, widths, verify_sizes, batches)

    def plot(self, path: str | Path | None = None, contexts=None):
        """Measured points and the interpolated curves: verify vs V and draft vs W, per context level."""
        return latency_diagnostics.plot(self, path, contexts)
