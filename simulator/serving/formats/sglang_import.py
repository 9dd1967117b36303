"""`draftgym profile-import --format sglang-bench|vllm-steps FILE`: an engine's timing file as a latency profile.

vllm-steps: the `vllm_steps.jsonl` that `draftgym vllm-run` writes (online/vllm/run.py), the same fields
as below, one row per (B, k) it ran: steps = k, topk = 1, num_draft_tokens = k + 1 (0, 0, 0 without
speculation), acc_length = vLLM's mean acceptance length, step_time = the median of vLLM's decode steps
with exactly B requests in flight (steps where a request joined are left out); and prefill rows
{"prefill_tokens": n, "prefill_time": s} (what one request's n-token prompt adds to a step: vLLM's step
that took it alone, at B = 1 without speculation, less a decode step there), written as `prefill`
latency rows (context_len = n), so the load replay charges each join what it adds to vLLM's step.

The file: the JSONL that sgl-project/sglang's scripts/playground/bench_speculative.py appends, one
object per (batch_size, steps, topk, num_draft_tokens) it launched a server for (read 2026-11-25,
commit 01d2a3d0d57b):

    batch_size, steps, topk, num_draft_tokens    the config; steps = topk = num_draft_tokens = 0 is no speculation
    acc_length                                   tokens per verify step, bonus included (DraftGym's tau)
    step_time                                    s per decode step at that batch size: the 20th percentile of
                                                 the server's step times (SGLANG_RECORD_STEP_TIME=1)
    speed                                        acc_length / step_time, tokens/s per request
    completion_tokens                            mean output tokens per request (not used)

Shapes: (D, W, V) = (steps, topk, num_draft_tokens) (export.py has the mapping and its sources);
with topk = 1 the server runs V = steps + 1 whatever the flag says; off rows are the AR step.

A step time is a whole step, t = D t_draft(W, B) + t_verify(V, B) (+ overhead), and the latency table
holds ops. Per batch size B the import solves, in relative least squares over the file's rows at B,

    step_time(D, W, V) = D d_W + v_V      (off rows: v_1 = step_time),    d_W, v_V >= 0

and, among the solutions that fit equally well, the one with the smallest draft costs (the fit plus
its component in the null space of the equations that minimises sum_W d_W^2): where the rows cannot
tell drafting from verifying (a file of chains only: D and V = D + 1 move together) the draft cost
goes to 0 and the verify entry of V carries the whole step; negative values are clipped to 0.
Every measured shape's step time is then reproduced (the fit's largest relative error is reported),
and the serving replay, which only ever charges whole steps, gets the engine's own step costs;
between measured shapes the latency model interpolates (flat outside).
A profile from chains alone says nothing about trees (their draft cost reads as 0): tune it with
--shapes chain.

Rows written: draft_step (width W), verify (verify size V) at every batch size of the file, at one
context level (--context-len; the file does not record it, so the profile is flat in the context),
device "sglang bench_speculative (<file>)", p10 = p90 = the step-time statistic (no noise model).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.decode import step_shape
from pipeline.errors import DataError
from pipeline.logs.schema import SCHEMA_VERSION
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import load_logs
from simulator.logs.synthetic import write_latency
from simulator.serving.inputs import replayable
from simulator.serving.replay import ShapeTable, closed_batch

# format -> (engine, what its step_time is)
FORMATS = {"sglang-bench": ("sglang", "20th percentile step time"),
           "vllm-steps": ("vllm", "median decode step time at exactly B requests")}
FIELDS = ("batch_size", "steps", "topk", "num_draft_tokens", "acc_length", "step_time")


@dataclass
class ProfileImportConfig:
    """`draftgym profile-import` settings."""
    file: str = ""                        # the engine's timing file (required)
    out: str = ""                         # logs root to write latency/ into (required)
    model: str = ""                       # model_id of the logs the profile will time (required)
    fmt: str = "sglang-bench"             # sglang-bench | vllm-steps (FORMATS)
    dtype: str = "bfloat16"               # the engine's compute dtype
    profile_id: str | None = None         # default: sglang-<file stem>
    context_len: int = 0                  # the one context level the rows are written at
    compare_logs: str | None = None       # logs root: acc_length against the replayed tau of the same shapes
    as_json: bool = False


def read_bench(path) -> list[dict]:
    """The JSONL rows, checked: every field present and of the right type (one-line DataError naming the line)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} not found")
    rows = []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            if isinstance(r, dict) and "prefill_tokens" in r:      # a vllm-steps prefill row: read_prefill's
                continue
            missing = [k for k in FIELDS if k not in r]
            if missing:
                raise ValueError(f"missing {', '.join(missing)}")
            ints = [int(r[k]) for k in FIELDS[:4]]
            if any(int(r[k]) != r[k] for k in FIELDS[:4]) or ints[0] < 1 or min(ints[1:]) < 0:
                raise ValueError("batch_size >= 1 and steps, topk, num_draft_tokens >= 0 must be integers")
            acc, st = float(r["acc_length"]), float(r["step_time"])
            if not (acc >= 1 and st > 0):
                raise ValueError("acc_length >= 1 and step_time > 0")
        except (ValueError, TypeError, json.JSONDecodeError, AttributeError) as e:
            raise DataError(f"{path}:{i}: not a bench_speculative.py row ({str(e).splitlines()[0]})") from None
        b, d, w, v = ints
        shape = step_shape.OFF if d == 0 else (step_shape.chain(d) if w == 1 else step_shape.canonical((d, w, v)))
        rows.append({"batch": b, "shape": shape, "acc_length": acc, "step_time": st})
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def read_prefill(path) -> list[tuple[int, float]]:
    """The prefill rows of a vllm-steps file: [(prompt tokens, seconds)] (none in SGLang's files)."""
    out = []
    for i, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1):
        if '"prefill_tokens"' not in line:
            continue
        try:
            r = json.loads(line)
            n, t = int(r["prefill_tokens"]), float(r["prefill_time"])
            if n < 1 or not t > 0:
                raise ValueError("prefill_tokens >= 1 and prefill_time > 0")
        except (ValueError, TypeError, KeyError, json.JSONDecodeError) as e:
            raise DataError(f"{path}:{i}: not a prefill row ({str(e).splitlines()[0]})") from None
        out.append((n, t))
    return out


def decompose(rows: list[dict]) -> tuple[dict, dict, float]:
    """One batch size's rows -> ({W: d_W}, {V: v_V}, largest relative error of the fit) (module docstring)."""
    Ws = sorted({r["shape"][1] for r in rows if r["shape"][0] > 0})
    Vs = sorted({r["shape"][2] for r in rows})
    y = np.array([r["step_time"] for r in rows])
    tau = float(np.median(y))
    A = np.zeros((len(rows), len(Ws) + len(Vs)))
    for i, r in enumerate(rows):
        d, w, v = r["shape"]
        if d > 0:
            A[i, Ws.index(w)] = d
        A[i, len(Ws) + Vs.index(v)] = 1.0
    Ar = A * tau / y[:, None]                                                 # relative equations, unknowns in units of tau
    u, *_ = np.linalg.lstsq(Ar, np.ones(len(rows)), rcond=None)               # a least-squares fit
    _, sv, vt = np.linalg.svd(Ar)
    null = vt[int((sv > sv.max() * 1e-10).sum()):].T                          # directions the rows cannot see
    if null.size and Ws:                                                      # among equal fits, the smallest draft costs
        z, *_ = np.linalg.lstsq(null[:len(Ws)], -u[:len(Ws)], rcond=None)
        u = u + null @ z
    x = np.maximum(u * tau, 0.0)
    err = float(np.max(np.abs(A @ x - y) / y))
    return dict(zip(Ws, x[:len(Ws)])), dict(zip(Vs, x[len(Ws):])), err


def latency_rows(rows: list[dict], model: str, dtype: str, profile_id: str, source: str, context_len: int = 0,
                 fmt: str = "sglang-bench", prefill: list[tuple[int, float]] = ()):
    """LATENCY rows of the imported profile + {B: fit error}."""
    out, fit = [], {}
    measured = sorted({step_shape.label(r["shape"]) for r in rows})
    engine, statistic = FORMATS[fmt]
    env = json.dumps({"engine": engine, "source": source, "statistic": statistic, "measured_shapes": measured})
    device = f"sglang bench_speculative ({source})" if engine == "sglang" else f"vllm step times ({source})"

    def row(op, t, B, W=0, V=0, c=context_len):
        return {"schema_version": SCHEMA_VERSION, "profile_id": profile_id, "device": device,
                "device_type": engine, "model_id": model, "head_id": engine, "dtype": dtype, "op": op, "width": int(W),
                "verify_size": int(V), "context_len": int(c), "batch": int(B), "n": 1, "median": float(t),
                "p10": float(t), "p90": float(t), "mean": float(t), "env_json": env}
    for B in sorted({r["batch"] for r in rows}):
        d, v, fit[B] = decompose([r for r in rows if r["batch"] == B])
        out += [row("draft_step", t, B, W=W) for W, t in d.items()]
        out += [row("verify", t, B, V=V) for V, t in v.items()]
    by_n = {}
    for n, t in prefill:
        by_n.setdefault(n, []).append(t)
    out += [row("prefill", float(np.median(ts)), 1, c=n) for n, ts in sorted(by_n.items())]
    if not any(r["batch"] == 1 and r["op"] == "draft_step" for r in out):
        raise DataError(f"{source}: no speculative row at batch_size 1; the latency model needs batch-1 rows "
                        f"(run bench_speculative.py with --batch-size 1 ...)")
    return out, fit


def compare_tau(rows: list[dict], logs_root: str, latency) -> list[dict]:
    """acc_length of each file row against the batch-1 replayed tau of its shape on the logs (all splits)."""
    logs = load_logs(logs_root, widths="all")
    shapes = sorted({r["shape"] for r in rows if replayable(logs, r["shape"])})
    tau = {}
    if shapes:
        table = ShapeTable(logs, shapes)
        res = closed_batch(logs, latency, table, 1, n_requests=logs.n_sequences)
        tau = {s: float(res["tau"][table.index(s)]) for s in shapes}
    return [{"batch": r["batch"], "shape": step_shape.label(r["shape"]), "acc_length": r["acc_length"],
             "replayed_tau": tau.get(r["shape"]), "ratio": (r["acc_length"] / tau[r["shape"]]) if r["shape"] in tau else None}
            for r in rows]


def run_profile_import_command(cfg: ProfileImportConfig) -> int:
    if cfg.fmt not in FORMATS:
        raise DataError(f"unknown profile format {cfg.fmt!r} ({' | '.join(FORMATS)})")
    rows = read_bench(cfg.file)
    pid = cfg.profile_id or f"{FORMATS[cfg.fmt][0]}-{Path(cfg.file).stem}"
    lat_rows, fit = latency_rows(rows, cfg.model, cfg.dtype, pid, Path(cfg.file).name, cfg.context_len, cfg.fmt,
                                 read_prefill(cfg.file))
    path = write_latency(cfg.out, lat_rows, model=cfg.model, name=pid)
    lat = LatencyModel.from_rows(lat_rows, model=cfg.model, profile=pid, trust=False)
    check = [abs(float(lat.t_step(*r["shape"], cfg.context_len, batch=r["batch"])) - r["step_time"]) / r["step_time"]
             for r in rows]
    chains_only = all(step_shape.is_chain(r["shape"]) for r in rows)
    rep = {"profile_id": pid, "path": str(path), "rows": len(lat_rows), "batch_sizes": sorted(fit),
           "fit_max_rel_err": max(fit.values()), "replay_max_rel_err": float(max(check)), "chains_only": chains_only}
    if cfg.compare_logs:
        rep["acc_length_vs_tau"] = compare_tau(rows, cfg.compare_logs, lat)
    if cfg.as_json:
        print(json.dumps(rep))
        return 0
    print(f"wrote {path}: profile {pid}, {len(lat_rows)} latency rows at batch sizes {rep['batch_sizes']}")
    print(f"  step times reproduced within {100 * rep['replay_max_rel_err']:.2f} % (fit {100 * rep['fit_max_rel_err']:.2f} %)")
    if chains_only:
        print("  chains only: the profile says nothing about trees; tune it with --shapes chain")
    for c in rep.get("acc_length_vs_tau", []):
        t = "not replayable on these logs" if c["replayed_tau"] is None else \
            f"replayed tau {c['replayed_tau']:.3f} (x {c['ratio']:.3f})"
        print(f"  B {c['batch']:>3} {c['shape']:<14} acc_length {c['acc_length']:.3f}  {t}")
    return 0
