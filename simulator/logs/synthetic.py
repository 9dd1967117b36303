"""Synthetic DraftGym logs with exactly the Parquet schemas of `pipeline/logs/schema.py`.

For tests and for developing policies before (or without) a real collection run. The generator
is a small, calibrated model of EAGLE's tree drafting, so policies have real signal:

  easiness     e_p = mu_dataset + b_seq + x_p,   x_p = rho x_{p-1} + sigma eps   (AR(1) per sequence)
  child dist   every expanded node (the root, then each beam) has a geometric next-token
               distribution p_k = (1-q) q^k (k = rank), q = exp(-s), sharpness
               s = softplus(e_p - depth_decay * level + node_noise) * sharp_scale
               -> its top-W children have log-probs log p_k, its entropy is H(q) (closed form)
  true path    the logged continuation's next token has rank k ~ p (the draft is calibrated):
               inverse CDF with one uniform per (position, level). The on-path node exists at
               level j iff its parent is on-path and is one of the W beams of level j-1 and k < W.
  expansion    EAGLE's: level 1 = the root's top-W children; level j >= 2: each of the W beams
               proposes W children (score = beam score + child log-prob), the best W of the W*W
               become the next beams. Pool = W + (D-1) W^2 nodes in depth-major order.
  acceptance   L[D, V] = number of on-path nodes (depth <= D) ranked within the top V-1 of
               pool(D) (stable order), exactly as `pipeline.collect.acceptance.acceptance_table`; then made
               monotone in D with a running max (real logs need not be monotone in D; the
               simulator never assumes it). Monotone in V and L <= D hold by construction.

So the beam scores, the candidate scores and the entropy all move with e_p, and so does L.
Latency rows come from a parametric profile ('cpu': verify cost steep in V, like the embedded
SmolLM2 on 2 cores; 'gpu': nearly flat in V), at batch 1 and, with `latency_batches`, at batch
sizes B > 1 too (the serving step's ops over B rows; see `latency_rows`).

`write_synthetic_logs(root, SyntheticConfig(...))` writes sequences + positions (+ latency);
`write_sequences` / `write_positions` / `write_latency` are the low-level writers that tests use to
build tiny hand-made logs.
"""
from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.logs.schema import (DEFAULT_MAX_DEPTH, DEFAULT_VERIFY_GRID, LATENCY, SCHEMA_VERSION, SEQUENCES,
                             partition_dir, positions_table, write_atomic)

DEFAULT_DATASETS = {"humaneval": 0.6, "gsm8k": 0.1, "mt-bench": -0.4}   # dataset -> mean easiness


@dataclass
class SyntheticConfig:
    model: str = "synthetic-llm"
    head: str = "synthetic-head"
    datasets: dict = field(default_factory=lambda: dict(DEFAULT_DATASETS))
    n_sequences: int = 10                  # per dataset
    new_tokens: tuple[int, int] = (40, 96)     # T uniform in [lo, hi]
    prompt_len: tuple[int, int] = (20, 400)
    temperature: float = 0.0
    widths: tuple[int, ...] = (10,)
    max_depth: int = DEFAULT_MAX_DEPTH
    verify_grid: tuple[int, ...] = DEFAULT_VERIFY_GRID
    split_cycle: tuple[str, ...] = ("train", "train", "train", "val", "test")   # split of sequence i: [i % 5]
    seed: int = 0
    seq_sd: float = 0.5                    # sd of the per-sequence easiness offset b_seq
    ar_rho: float = 0.8                    # AR(1) coefficient of x_p
    ar_sigma: float = 0.7                  # AR(1) innovation sd
    node_sd: float = 0.6                   # per-node sharpness noise
    depth_decay: float = 0.05              # easiness lost per level
    sharp_scale: float = 1.2
    vocab: int = 4000
    latency_profile: str | None = "cpu"    # 'cpu' | 'gpu' | None (no latency rows)
    latency_batches: tuple[int, ...] = (1,)  # batch sizes of the latency rows (1 always; e.g. 1,2,4,8,16)
    dist_verify_size: int = 60             # T > 0: V of the logged acceptance distributions
    shard_sequences: int | None = None     # sequences per shard (None: one shard per dataset); write_synthetic_logs


# ------------------------------------------------------------------ low-level writers

def write_sequences(root, model: str, dataset: str, temperature: float, rows: list[dict], name: str = "seq") -> Path:
    """rows: dicts with (at least) prompt_id, split, prompt_tokens, output_tokens, new_tokens, widths,
    max_depth, verify_grid; the other SEQUENCES columns get defaults."""
    full = []
    for r in rows:
        d = {"schema_version": SCHEMA_VERSION, "run_key": "synthetic", "model_id": model, "head_id": "synthetic-head",
             "dtype": "float32", "seed": 0, "stop_reason": "max_new_tokens", "config_json": "{}", "env_json": "{}", "collect_s": 0.0}
        d.update(r)
        d["widths"] = [int(w) for w in d["widths"]]
        d["verify_grid"] = [int(v) for v in d["verify_grid"]]
        full.append(d)
    path = partition_dir(root, "sequences", model, dataset, temperature) / f"{name}.parquet"
    return write_atomic(pa.Table.from_pylist(full, schema=SEQUENCES), path, "sequences")


def write_positions(root, model: str, dataset: str, temperature: float, width: int, prompt_id, position,
                    context_len, acceptance, beam_scores, candidate_scores, entropy, accept_dist=None,
                    run_key="synthetic", root_token=None, name: str | None = None) -> Path:
    """Columns as arrays with one row per position: prompt_id [n] (str), position [n], context_len [n],
    acceptance [n, Dmax, G], beam_scores [n, Dmax, W], candidate_scores [n, Dmax, W*W],
    entropy [n, Dmax, W], accept_dist [n, Dmax, Dmax+1] or None."""
    acceptance = np.asarray(acceptance)
    n = len(acceptance)
    table = positions_table(run_key, prompt_id, position, context_len, width,
                            np.zeros(n, np.int32) if root_token is None else root_token, acceptance, beam_scores,
                            candidate_scores, entropy, accept_dist)
    path = partition_dir(root, "positions", model, dataset, temperature) / f"{name or 'pos'}-w{width}.parquet"
    return write_atomic(table, path, "positions")


def latency_rows(model: str, profile: str = "cpu", widths=(8, 10, 12, 16, 20, 32), verify_grid=DEFAULT_VERIFY_GRID,
                 contexts=(128, 512, 1024, 2048), spread=(0.94, 1.09), profile_id: str | None = None,
                 batches=(1,)) -> list[dict]:
    """A parametric latency profile as LATENCY rows (seconds), at each batch size B of `batches`
    (batch 1 always; B = 1 gives the formulas' batch-1 values exactly).

    cpu: verify(V, c, B) = 0.040 + 1.6e-3 BV + 8e-7 BV^2 + 1.5e-5 Bc  (B=1: 42 ms at V=1, ~140 ms at 60, ~470 ms at 240)
         draft(W, c, B)  = 3.5e-3 + 2.5e-4 BW + 3e-6 Bc                (~6 ms at W=10)
         overhead        = 3e-3 + 1e-6 c,  policy(B) = 4e-4 (1 + 0.02 (B-1)),  prefill(n) = 0.040 + 4e-4 n
    gpu: verify(V, c, B) = 0.022 + 2e-5 BV + 6e-5 max(0, BV-128) + 2e-6 Bc
         draft(W, c, B)  = 2.4e-3 + 1e-5 BW + 5e-7 Bc,  overhead = 1.5e-3 + 2e-7 c,  policy(B) = 2e-4 (1 + 0.02 (B-1))
         prefill(n)      = 0.020 + 2e-5 n   (one request's prompt of n tokens, at the context levels)

    In B: a fixed cost (the weights read once per forward, whatever B) plus work per token (B V or
    B W rows) and per row's context (its own KV); so the 'gpu' AR step (V = 1) is nearly flat in B
    until BV passes its 128-token memory-bound floor, the 'cpu' one grows with every row. Overhead
    rows are batch 1 only (as in a real profile: `draftgym profile --batch-sizes` has none at B > 1).
    """
    if profile == "cpu":
        fv = lambda V, c, B=1: 0.040 + 1.6e-3 * (B * V) + 8e-7 * B * V * V + 1.5e-5 * B * c
        fd = lambda W, c, B=1: 3.5e-3 + 2.5e-4 * (B * W) + 3e-6 * B * c
        fo = lambda c: 3e-3 + 1e-6 * c
        fp = 4e-4
        fpf = lambda n: 0.040 + 4e-4 * n
    elif profile == "gpu":
        fv = lambda V, c, B=1: 0.022 + 2e-5 * (B * V) + 6e-5 * max(0, B * V - 128) + 2e-6 * B * c
        fd = lambda W, c, B=1: 2.4e-3 + 1e-5 * (B * W) + 5e-7 * B * c
        fo = lambda c: 1.5e-3 + 2e-7 * c
        fp = 2e-4
        fpf = lambda n: 0.020 + 2e-5 * n
    else:
        raise ValueError(f"unknown latency profile {profile!r} (cpu | gpu)")
    pid = profile_id or f"synthetic-{profile}"
    lo, hi = spread

    def row(op, t, W=0, V=0, c=0, B=1):
        return {"schema_version": SCHEMA_VERSION, "profile_id": pid, "device": f"synthetic {profile}",
                "device_type": profile, "model_id": model, "head_id": "synthetic-head", "dtype": "float32",
                "op": op, "width": W, "verify_size": V, "context_len": c, "batch": B, "n": 20, "median": t,
                "p10": t * lo, "p90": t * hi, "mean": t * (lo + hi) / 2, "env_json": "{}"}
    rows = []
    for c in contexts:
        rows += [row("draft_step", fd(W, c), W=W, c=c) for W in widths]
        rows += [row("verify", fv(V, c), V=V, c=c) for V in verify_grid]
        rows.append(row("overhead", fo(c), c=c))
        rows.append(row("prefill", fpf(c), c=c))
    rows.append(row("policy", fp))
    for B in sorted({int(b) for b in batches} - {1}):
        for c in contexts:
            rows += [row("draft_step", fd(W, c, B), W=W, c=c, B=B) for W in widths]
            rows += [row("verify", fv(V, c, B), V=V, c=c, B=B) for V in verify_grid]
        rows.append(row("policy", fp * (1 + 0.02 * (B - 1)), B=B))
    return rows


def write_latency(root, rows: list[dict], model: str | None = None, name: str | None = None) -> Path:
    """<root>/latency/model=<M>/<profile_id>.parquet"""
    model = model or rows[0]["model_id"]
    safe = str(model).replace("/", "--").replace("=", "-")
    path = Path(root) / "latency" / f"model={safe}" / f"{name or rows[0]['profile_id']}.parquet"
    return write_atomic(pa.Table.from_pylist(rows, schema=LATENCY), path, "latency")


# ------------------------------------------------------------------ the generative model

def _softplus(x):
    return np.logaddexp(0.0, x)


def _geom(s):
    """Sharpness s -> (q, log(1-q), log q, entropy) of p_k = (1-q) q^k."""
    q = np.exp(-s)
    l1q, lq = np.log1p(-q), -s
    H = -(l1q + q / (1.0 - q) * lq)
    return q, l1q, lq, H


def draft_trees(easiness: np.ndarray, width: int, max_depth: int, grid: np.ndarray, cfg: SyntheticConfig,
                rng: np.random.Generator, u_path: np.ndarray) -> dict[str, np.ndarray]:
    """Vectorised synthetic expansion for N roots. easiness [N]; u_path [N, max_depth] uniforms
    (shared across widths, so widths see the same continuation). Returns the positions columns."""
    N, W, Dm = len(easiness), width, max_depth
    k = np.arange(W)
    beam = np.full((N, Dm, W), np.nan, np.float32)
    cand = np.full((N, Dm, W * W), np.nan, np.float32)
    ent = np.full((N, Dm, W), np.nan, np.float32)
    pool_scores = []                                     # per level [N, n_level] in pool order
    true_idx = np.full((N, Dm), -1, np.int64)            # pool index of the on-path node at level j
    true_score = np.zeros((N, Dm))
    ar = np.arange(N)

    def true_rank(l1q, lq, u):                           # inverse CDF of the geometric: P(K >= k) = q^k
        return np.floor(np.log(np.maximum(u, 1e-300)) / lq).astype(np.int64)

    # level 1: the root's top-W children
    s = _softplus(easiness - cfg.depth_decay + cfg.node_sd * rng.standard_normal(N)) * cfg.sharp_scale + 1e-3
    q, l1q, lq, H = _geom(s)
    sc = (l1q[:, None] + lq[:, None] * k[None, :]).astype(np.float32)        # [N, W], sorted desc
    beam[:, 0], cand[:, 0, :W], ent[:, 0, 0] = sc, sc, H
    pool_scores.append(sc)
    kt = true_rank(l1q, lq, u_path[:, 0])
    on = kt < W
    true_idx[on, 0] = kt[on]
    true_score[on, 0] = sc[on, kt[on]]
    true_beam = np.where(on, kt, -1)                     # index among the current beams
    beam_scores = sc.astype(np.float64)
    offset = W
    for j in range(1, Dm):                               # level j+1
        s = _softplus(easiness[:, None] - cfg.depth_decay * (j + 1) + cfg.node_sd * rng.standard_normal((N, W))) \
            * cfg.sharp_scale + 1e-3                     # [N, W] one child distribution per beam
        q, l1q, lq, H = _geom(s)
        child = l1q[..., None] + lq[..., None] * k                               # [N, W(beam), W(child)]
        cs = (beam_scores[..., None] + child).reshape(N, W * W)                  # beam-major, like expand_level
        nxt = np.argsort(-cs, axis=1, kind="stable")[:, :W]                      # best W of W*W
        cand[:, j], ent[:, j] = cs, H
        beam_scores = np.take_along_axis(cs, nxt, 1)
        beam[:, j] = beam_scores
        pool_scores.append(cs.astype(np.float32))
        # on-path child of the on-path beam
        has = true_beam >= 0
        b = np.clip(true_beam, 0, None)
        kt = true_rank(l1q[ar, b], lq[ar, b], u_path[:, j])
        on = has & (kt < W)
        ci = b * W + np.clip(kt, 0, W - 1)                                       # candidate index
        true_idx[on, j] = offset + ci[on]
        true_score[on, j] = cs[on, ci[on]]
        match = (nxt == ci[:, None]) & on[:, None]
        true_beam = np.where(match.any(1), match.argmax(1), -1)
        offset += W * W
    pool = np.concatenate(pool_scores, axis=1).astype(np.float32)             # [N, W + (Dm-1) W^2]
    # stable rank of each on-path node among pool(D) for every D: per-level counts, cumulated
    level_of = np.concatenate([np.zeros(W, np.int64)] + [np.full(W * W, j) for j in range(1, Dm)])
    pidx = np.arange(pool.shape[1])
    ts = true_score.astype(np.float32)
    cnt = np.zeros((N, Dm, Dm), np.int64)                                      # [N, path level j, pool level]
    for lev in range(Dm):
        cols = level_of == lev
        ps, pi = pool[:, cols], pidx[cols]
        better = (ps[:, None, :] > ts[:, :, None]) | ((ps[:, None, :] == ts[:, :, None]) &
                                                       (pi[None, None, :] < true_idx[:, :, None]))
        cnt[:, :, lev] = better.sum(-1)
    rank = np.cumsum(cnt, axis=2)                                              # rank[n, j, D-1]
    valid = true_idx >= 0
    L = np.zeros((N, Dm, len(grid)), np.int64)
    for D in range(1, Dm + 1):
        r = rank[:, :D, D - 1]                                                 # [N, D]
        sel = valid[:, :D, None] & (r[..., None] <= grid[None, None, :] - 2)   # [N, D, G]
        L[:, D - 1] = sel.sum(1)
    L = np.maximum.accumulate(L, axis=1)                                       # monotone in D (see docstring)
    return {"acceptance": L.astype(np.uint8), "beam_scores": beam, "candidate_scores": cand, "entropy": ent}


def _accept_dist(L: np.ndarray, grid: np.ndarray, v_dist: int, max_depth: int) -> np.ndarray:
    """T > 0 stand-in for P(L = l | D) of the tree (D, W, v_dist): 0.7 on the realised L, 0.3 spread over 0..D."""
    g = int(np.argmin(np.abs(grid - v_dist)))
    N = L.shape[0]
    out = np.zeros((N, max_depth, max_depth + 1), np.float32)
    for D in range(1, max_depth + 1):
        out[:, D - 1, : D + 1] = 0.3 / (D + 1)
        out[np.arange(N), D - 1, L[:, D - 1, g]] += 0.7
    return out


def write_synthetic_logs(root, cfg: SyntheticConfig | None = None, workers: int = 1, progress: bool = False) -> dict:
    """Write a full synthetic log tree under root; returns a summary dict.

    With cfg.shard_sequences = None each dataset is one shard (one sequences file, one positions file per
    width). With shard_sequences = k the sequences of a dataset are written k at a time, each shard from
    its own seeded generators (the logs do not depend on `workers` or on the order shards run in), by
    `workers` processes; a shard whose sequences file exists is skipped (the sequences file is written
    last: a rerun resumes an interrupted run)."""
    cfg = cfg or SyntheticConfig()
    if cfg.shard_sequences is None:
        rng = np.random.default_rng(cfg.seed)
        n_pos = sum(_write_shard(root, cfg, di, cfg.n_sequences, 0, rng, [cfg.seed, di],
                                 f"synthetic-{ds}") for di, ds in enumerate(cfg.datasets))
    else:
        k = cfg.shard_sequences
        jobs = [(di, min(k, cfg.n_sequences - lo), lo) for di in range(len(cfg.datasets))
                for lo in range(0, cfg.n_sequences, k)]
        n_pos = _run_shards(root, cfg, jobs, workers, progress)
    if cfg.latency_profile:
        write_latency(root, latency_rows(cfg.model, cfg.latency_profile, widths=sorted({8, 10, 12, 16, 20, 32,
                                                                                        *cfg.widths}),
                                         verify_grid=cfg.verify_grid, batches=cfg.latency_batches))
    return {"root": str(root), "datasets": list(cfg.datasets), "sequences": cfg.n_sequences * len(cfg.datasets),
            "positions": n_pos, "widths": list(cfg.widths)}


def _shard_job(args) -> int:
    root, cfg, di, S, lo = args
    name = f"synthetic-{list(cfg.datasets)[di]}-{lo // cfg.shard_sequences:05d}"
    seqs = partition_dir(root, "sequences", cfg.model, list(cfg.datasets)[di], cfg.temperature) / f"{name}.parquet"
    if seqs.is_file():
        return -1                                       # written by an earlier run
    return _write_shard(root, cfg, di, S, lo, np.random.default_rng([cfg.seed, di, lo, 1]), [cfg.seed, di, lo], name)


def _run_shards(root, cfg: SyntheticConfig, jobs: list, workers: int, progress: bool) -> int:
    from tqdm import tqdm

    args = [(root, cfg, di, S, lo) for di, S, lo in jobs]
    total = cfg.n_sequences * len(cfg.datasets)
    bar = tqdm(total=total, desc="synthetic logs", unit="seq", disable=not progress)
    n_pos = 0
    with ProcessPoolExecutor(max_workers=max(1, workers)) as ex:
        for (_, _, _, S, _), n in zip(args, ex.map(_shard_job, args) if workers > 1 else map(_shard_job, args)):
            n_pos += max(n, 0)
            bar.update(S)
    bar.close()
    return n_pos


def _write_shard(root, cfg: SyntheticConfig, di: int, S: int, lo: int, rng, tree_seed: list, name: str) -> int:
    """Sequences lo .. lo+S-1 of dataset di: positions (every width; each width's trees from a generator
    seeded with tree_seed), then sequences. -> positions written."""
    ds, mu = list(cfg.datasets.items())[di]
    grid = np.asarray(cfg.verify_grid, np.int64)
    Dm = cfg.max_depth
    T = rng.integers(cfg.new_tokens[0], cfg.new_tokens[1] + 1, S)
    P = rng.integers(cfg.prompt_len[0], cfg.prompt_len[1] + 1, S)
    rows, seq_of, pos, ctx, e = [], [], [], [], []
    for s in range(S):
        pid = f"{ds}-{lo + s:04d}"
        n = int(T[s]) - 1
        x = np.zeros(n)
        eps = rng.standard_normal(n) * cfg.ar_sigma
        for i in range(n):
            x[i] = (cfg.ar_rho * x[i - 1] if i else 0.0) + eps[i]
        e.append(mu + cfg.seq_sd * rng.standard_normal() + x)
        seq_of += [pid] * n
        pos.append(np.arange(n))
        ctx.append(P[s] + np.arange(n))
        out_tokens = rng.integers(0, cfg.vocab, int(T[s]) + Dm).tolist()
        rows.append({"run_key": "synthetic", "prompt_id": pid, "split": cfg.split_cycle[(lo + s) % len(cfg.split_cycle)],
                     "model_id": cfg.model, "head_id": cfg.head, "dtype": "float32", "seed": cfg.seed,
                     "prompt_tokens": rng.integers(0, cfg.vocab, int(P[s])).tolist(),
                     "output_tokens": out_tokens, "new_tokens": int(T[s]), "stop_reason": "max_new_tokens",
                     "widths": list(cfg.widths), "max_depth": Dm, "verify_grid": list(cfg.verify_grid),
                     "config_json": json.dumps(asdict(cfg), default=list), "env_json": "{}", "collect_s": 0.0})
    easiness = np.concatenate(e)
    pos, ctx = np.concatenate(pos), np.concatenate(ctx)
    u_path = rng.random((len(easiness), Dm))
    tok_rows = {r["prompt_id"]: r["output_tokens"] for r in rows}
    root_tok = np.array([tok_rows[pid][p] for pid, p in zip(seq_of, pos)], np.int32)
    for W in cfg.widths:
        cols = draft_trees(easiness, W, Dm, grid, cfg, np.random.default_rng(tree_seed), u_path)
        dist = _accept_dist(cols["acceptance"], grid, cfg.dist_verify_size, Dm) if cfg.temperature > 0 else None
        write_positions(root, cfg.model, ds, cfg.temperature, W, seq_of, pos, ctx, accept_dist=dist,
                        root_token=root_tok, name=name, **cols)
    write_sequences(root, cfg.model, ds, cfg.temperature, rows, name=name)
    return len(pos)


@dataclass
class SynthLogsConfig:
    """`draftgym synth-logs`: synthetic logs (the `data` config, recorded in the logs) under `out`."""

    out: str = ""                                            # output logs root (required)
    data: SyntheticConfig = field(default_factory=SyntheticConfig)
    workers: int = 1                                         # processes writing shards (data.shard_sequences)
    progress: bool = True


def run_synth_logs_command(cfg: SynthLogsConfig) -> int:
    print(json.dumps(write_synthetic_logs(cfg.out, cfg.data, workers=cfg.workers, progress=cfg.progress)))
    return 0
