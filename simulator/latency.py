"""Latency model: per-op times from the measured `latency` table, for the replay env's clock.

Ops (pipeline/schema.py LATENCY rows, batch 1):
    draft_step  one draft forward over W beams at context length c        t_draft(W, c)
    verify      one target forward over V tree tokens at context length c t_verify(V, c)
    policy      one policy inference (one hook call)                      t_policy
    policy:<k>  one call of the checkpoint with latency key k, measured in the engine (optional;
                `draftgym profile-policy`); replaces t_policy for that checkpoint
    overhead    per-cycle bookkeeping outside the three above             t_overhead(c)

Cycle time (what the env charges, design.md "cycle reward"):

    t_cycle = D * t_draft(W, c) + t_verify(V_eff, c) + n_calls * t_policy + t_overhead(c)
    V_eff   = min(V, 1 + W + (D-1) W^2)      (the engine clamps V to 1 + pool size)

Interpolation. For one op, the measured means (the `point` statistic; see from_rows) form a surface over (x, c) with x = W (draft),
V (verify) or nothing (overhead). At each measured context level c_k we interpolate piecewise
linearly in x (np.interp; flat beyond the measured range), then linearly between the two
neighbouring context levels (flat beyond the measured levels). The model is therefore exact at
every measured point, and `fit_report()` measures how well it predicts points it did not see
(leave-one-out over interior points), the honest error bar (Vidur's bar: < 9 %).

Noise (optional, for robustness training): t = m + z (p90 - m)/1.2816 for z > 0, m + z (m - p10)/1.2816
for z < 0, z ~ N(0, 1), i.e. a two-piece normal whose 10/90 % quantiles are the measured p10/p90
(interpolated like the median); clipped below at p10/2.

RADAR's time model (seeds/002, Eq. 6):  T_gen(t) = T0 + Tf t + Teye (t+1)   (t < t_max; Teye t at t_max)
with t draft calls. Mapped onto ours at context c, width W, verify size V:
    T0   = t_verify(V, c) + t_overhead(c)     fixed per-cycle cost (verify + bookkeeping)
    Tf   = t_draft(W, c)                     one draft forward
    Teye = t_policy                          one predictor call
(RADAR counts one predictor call more than our engine makes: the engine asks the depth hook after
every forward but the last allowed one. `radar_tgen` follows the paper; the replay simulator
charges what the engine does.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.errors import DataError
from pipeline.schema import read_table, table_files

Z90 = 1.2815515655446004     # N(0,1) 90 % quantile
OPS = ("draft_step", "verify", "policy", "overhead")


class Surface:
    """Piecewise-linear interpolation of (median, p10, p90) over (x, context_len) points."""

    def __init__(self, x, ctx, median, p10=None, p90=None):
        x, ctx, median = (np.asarray(a, np.float64) for a in (x, ctx, median))
        p10 = median if p10 is None else np.asarray(p10, np.float64)
        p90 = median if p90 is None else np.asarray(p90, np.float64)
        if len(x) == 0:
            raise ValueError("no points")
        # average duplicate (x, ctx) points
        key = np.stack([ctx, x], 1)
        uniq, inv = np.unique(key, axis=0, return_inverse=True)
        inv = inv.ravel()
        cnt = np.bincount(inv)
        avg = lambda v: np.bincount(inv, weights=v) / cnt
        self.points = {"ctx": uniq[:, 0], "x": uniq[:, 1], "median": avg(median), "p10": avg(p10), "p90": avg(p90)}
        self.levels = np.unique(uniq[:, 0])
        self._lv = []
        for c in self.levels:
            m = self.points["ctx"] == c
            o = np.argsort(self.points["x"][m])
            self._lv.append({k: self.points[k][m][o] for k in ("x", "median", "p10", "p90")})

    def __call__(self, x, ctx, stat: str = "median") -> np.ndarray:
        x, ctx = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(ctx, np.float64))
        shape = x.shape
        x, ctx = x.ravel(), ctx.ravel()
        K = len(self.levels)
        if K == 1:
            lv = self._lv[0]
            return np.interp(x, lv["x"], lv[stat]).reshape(shape)
        F = np.stack([np.interp(x, lv["x"], lv[stat]) for lv in self._lv])     # [K, n]
        c = np.clip(ctx, self.levels[0], self.levels[-1])
        hi = np.clip(np.searchsorted(self.levels, c, side="left"), 1, K - 1)
        lo = hi - 1
        w = (c - self.levels[lo]) / (self.levels[hi] - self.levels[lo])
        n = np.arange(len(x))
        return ((1 - w) * F[lo, n] + w * F[hi, n]).reshape(shape)

    def sample(self, x, ctx, rng: np.random.Generator) -> np.ndarray:
        m, a, b = (self(x, ctx, s) for s in ("median", "p10", "p90"))
        z = rng.standard_normal(m.shape)
        t = np.where(z > 0, m + z * (b - m) / Z90, m + z * (m - a) / Z90)
        return np.maximum(t, 0.5 * a)


@dataclass
class LatencyModel:
    draft: Surface                     # x = W
    verify: Surface                    # x = V
    overhead: Surface                  # x = 0
    policy_s: float                    # seconds per policy call
    policy_spread: tuple[float, float] = (1.0, 1.0)   # p10/median, p90/median of the policy op
    meta: dict = field(default_factory=dict)
    policy_costs: dict = field(default_factory=dict)  # latency_key -> seconds per call, measured in the engine

    def call_s(self, latency_key: str | None) -> float:
        """Seconds per policy call for a checkpoint: its own 'policy:<key>' row when the profile has one
        (`draftgym profile-policy`: the real controller in real cycles, observation building included),
        else the generic `policy` op (a stand-in MLP forward)."""
        return float(self.policy_costs.get(latency_key, self.policy_s)) if latency_key else self.policy_s

    # ---- predictions (vectorised; rng -> sampled noise)
    def t_draft(self, width, context_len, rng: np.random.Generator | None = None) -> np.ndarray:
        return self.draft(width, context_len) if rng is None else self.draft.sample(width, context_len, rng)

    def t_verify(self, verify_size, context_len, rng: np.random.Generator | None = None) -> np.ndarray:
        return self.verify(verify_size, context_len) if rng is None else self.verify.sample(verify_size, context_len, rng)

    def t_overhead(self, context_len, rng: np.random.Generator | None = None) -> np.ndarray:
        z = np.zeros_like(np.asarray(context_len, np.float64))
        return self.overhead(z, context_len) if rng is None else self.overhead.sample(z, context_len, rng)

    def t_policy(self, n=None, rng: np.random.Generator | None = None) -> np.ndarray | float:
        if rng is None or n is None:
            return self.policy_s
        lo, hi = self.policy_spread
        z = rng.standard_normal(n)
        return self.policy_s * np.maximum(np.where(z > 0, 1 + z * (hi - 1) / Z90, 1 + z * (1 - lo) / Z90), 0.5 * lo)

    def t_ar(self, context_len) -> np.ndarray:
        """Autoregressive decoding, per token: one 1-token target forward + the per-step overhead."""
        return self.t_verify(1, context_len) + self.t_overhead(context_len)

    def t_cycle(self, depth, width, verify_size, context_len, n_calls=0) -> np.ndarray:
        """Deterministic cycle time (module docstring), V clamped to 1 + pool size."""
        depth, width = np.asarray(depth), np.asarray(width)
        v_eff = np.minimum(verify_size, 1 + width + (depth - 1) * width * width)
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
        samples saw during each dataset's decoding (pipeline.profile.InSituSampler.speed_factor)."""
        def sc(surf):
            p = surf.points
            return Surface(p["x"], p["ctx"], p["median"] * factor, p["p10"] * factor, p["p90"] * factor)

        return LatencyModel(sc(self.draft), sc(self.verify), sc(self.overhead), self.policy_s, self.policy_spread,
                            {**self.meta, "speed_factor": float(factor)}, dict(self.policy_costs))

    # ---- constructors
    @classmethod
    def from_rows(cls, rows, model: str | None = None, profile: str | None = None,
                  point: str = "mean", device: str | None = None, dtype: str | None = None) -> "LatencyModel":
        """rows: a pyarrow Table or list of dicts with LATENCY columns.

        dtype: only profiles taken in this compute dtype (pass the logs' dtype: a bf16 replay timed
        with an fp32 profile would be a different machine). A profile whose rows mix dtypes is
        refused with a one-line error, whatever is asked.

        point: the measured statistic the model predicts (its central value). "mean" (default): the
        expected time, which is what a throughput (tokens / total time) integrates; on a CPU the
        in-situ verify times are right-skewed (mean 5-7 % above the median), so medians would make
        every method look faster than it is. "median" for robust comparisons of profiles."""
        if point not in ("mean", "median"):
            raise ValueError(f"point must be 'mean' or 'median', got {point!r}")
        if hasattr(rows, "to_pylist"):
            rows = rows.to_pylist()
        rows = [r for r in rows if int(r.get("batch") or 1) in (0, 1)]
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
        by = {op: [r for r in rows if r["op"] == op] for op in OPS}
        for op in ("draft_step", "verify"):
            if not by[op]:
                raise DataError(f"latency profile {profile!r} has no {op!r} rows")
        col = lambda rs, k: [float(r[k]) for r in rs]
        draft = Surface(col(by["draft_step"], "width"), col(by["draft_step"], "context_len"),
                        col(by["draft_step"], point), col(by["draft_step"], "p10"), col(by["draft_step"], "p90"))
        verify = Surface(col(by["verify"], "verify_size"), col(by["verify"], "context_len"), col(by["verify"], point),
                         col(by["verify"], "p10"), col(by["verify"], "p90"))
        if by["overhead"]:
            ov = by["overhead"]
            overhead = Surface([0.0] * len(ov), col(ov, "context_len"), col(ov, point), col(ov, "p10"),
                               col(ov, "p90"))
        else:
            overhead = Surface([0.0], [0.0], [0.0])
        pol = by["policy"]
        policy_s = float(np.mean(col(pol, point))) if pol else 0.0
        spread = ((float(np.mean(col(pol, "p10"))) / policy_s, float(np.mean(col(pol, "p90"))) / policy_s)
                  if pol and policy_s > 0 else (1.0, 1.0))
        costs = {r["op"].removeprefix("policy:"): float(r[point]) for r in rows if r["op"].startswith("policy:")}
        meta = {"profile_id": profile, "device": rows[0].get("device"), "model_id": rows[0].get("model_id"),
                "dtype": rows[0].get("dtype"), "n_rows": len(rows), "has_overhead": bool(by["overhead"]),
                "has_policy": bool(pol), "note": note, "point": point}
        return cls(draft, verify, overhead, policy_s, spread, meta, costs)

    @classmethod
    def from_logs(cls, root: str | Path, model: str | None = None, profile: str | None = None,
                  point: str = "mean", device: str | None = None, dtype: str | None = None) -> "LatencyModel":
        """All latency shards under <root>/latency (any partitioning), checked reads."""
        files = table_files(root, "latency")
        if not files:
            raise DataError(f"no latency table under {root}/latency (run `draftgym profile` or pass --latency)")
        rows = []
        for f in files:
            rows += read_table(f, "latency").to_pylist()
        return cls.from_rows(rows, model=model, profile=profile, point=point, device=device, dtype=dtype)

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

    # ---- diagnostics
    def fit_report(self) -> dict:
        """Relative errors of the model against the measured points.

        in_sample: at the measured points (0 by construction; a sanity check).
        loo: leave-one-out, each interior point predicted from its neighbours along V/W (same
        context level) and along the context length (same V/W); the interpolation error estimate.
        """
        out = {"profile": self.meta.get("profile_id"), "device": self.meta.get("device"), "ops": {}}
        for name, surf in (("draft_step", self.draft), ("verify", self.verify), ("overhead", self.overhead)):
            pts = surf.points
            pred = surf(pts["x"], pts["ctx"])
            rel = np.abs(pred - pts["median"]) / np.maximum(pts["median"], 1e-12)
            loo = []
            for i in range(len(pts["x"])):
                for axis in ("x", "ctx"):
                    other = "ctx" if axis == "x" else "x"
                    same = np.flatnonzero(pts[other] == pts[other][i])
                    vals = pts[axis][same]
                    if len(same) < 3 or pts[axis][i] <= vals.min() or pts[axis][i] >= vals.max():
                        continue
                    rest = same[same != i]
                    o = np.argsort(pts[axis][rest])
                    p = np.interp(pts[axis][i], pts[axis][rest][o], pts["median"][rest][o])
                    loo.append(abs(p - pts["median"][i]) / max(pts["median"][i], 1e-12))
            loo = np.array(loo)
            out["ops"][name] = {
                "points": int(len(pts["x"])), "x_range": [float(pts["x"].min()), float(pts["x"].max())],
                "ctx_range": [float(pts["ctx"].min()), float(pts["ctx"].max())],
                "in_sample_max_rel_err": float(rel.max()) if len(rel) else 0.0,
                "loo_points": int(len(loo)),
                "loo_mean_rel_err": float(loo.mean()) if len(loo) else None,
                "loo_max_rel_err": float(loo.max()) if len(loo) else None,
                "spread_p90_over_p10": float(np.mean(pts["p90"] / np.maximum(pts["p10"], 1e-12))),
            }
        out["ops"]["policy"] = {"median_s": self.policy_s, "measured": bool(self.meta.get("has_policy", True)),
                                "per_policy_s": dict(self.policy_costs)}
        return out

    def coverage(self, context_len, widths=(), verify_sizes=()) -> dict:
        """How much of a workload lies outside the measured ranges (where the model extrapolates flat)."""
        c = np.asarray(context_len, np.float64)
        out = {}
        for name, surf in (("draft_step", self.draft), ("verify", self.verify), ("overhead", self.overhead)):
            lo, hi = surf.levels[0], surf.levels[-1]
            out[f"{name}_ctx_outside"] = float(np.mean((c < lo) | (c > hi))) if c.size else 0.0
        out["ctx_range_logs"] = [float(c.min()), float(c.max())] if c.size else None
        w = np.asarray(widths, np.float64)
        if w.size:
            out["widths_outside"] = sorted({int(x) for x in w if x < self.draft.points["x"].min()
                                            or x > self.draft.points["x"].max()})
        v = np.asarray(verify_sizes, np.float64)
        if v.size:
            out["verify_outside"] = sorted({int(x) for x in v if x < self.verify.points["x"].min()
                                            or x > self.verify.points["x"].max()})
        return out

    def plot(self, path: str | Path | None = None, contexts=None):
        """Measured points and the interpolated curves: verify vs V and draft vs W, per context level."""
        import matplotlib
        if path is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(14, 4))
        for ax, surf, xlabel, title in ((axes[0], self.verify, "V (verify size)", "verify"),
                                        (axes[1], self.draft, "W (width)", "draft forward")):
            for c in (contexts or surf.levels):
                m = surf.points["ctx"] == c
                xs = np.linspace(surf.points["x"].min(), surf.points["x"].max(), 200)
                line, = ax.plot(xs, 1e3 * surf(xs, c), lw=1, label=f"ctx {int(c)}")
                if m.any():
                    ax.errorbar(surf.points["x"][m], 1e3 * surf.points["median"][m],
                                yerr=1e3 * np.stack([surf.points["median"][m] - surf.points["p10"][m],
                                                     surf.points["p90"][m] - surf.points["median"][m]]),
                                fmt="o", ms=3, color=line.get_color())
            ax.set_xlabel(xlabel); ax.set_ylabel("ms"); ax.set_title(title); ax.legend(fontsize=7)
        ov = self.overhead.points
        axes[2].plot(ov["ctx"], 1e3 * ov["median"], "o-", label="overhead")
        axes[2].axhline(1e3 * self.policy_s, color="k", ls="--", label="policy call")
        axes[2].set_xlabel("context length"); axes[2].set_ylabel("ms"); axes[2].legend(); axes[2].set_title("per cycle")
        fig.suptitle(f"latency profile {self.meta.get('profile_id')} ({self.meta.get('device')})")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=120)
            plt.close(fig)
        return fig
