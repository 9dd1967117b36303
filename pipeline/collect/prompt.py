"""Collection: everything the simulator needs to replay EAGLE-3 decoding exactly, for one prompt.

Exact counterfactual replay (docs/design.md). Under greedy decoding the output is the target's greedy
sequence y whatever tree a policy picks, so a cycle's state is the position p of its root y_p.
We log, for every p, the draft tree rooted there (from teacher-forced target features) and read
off, for every static shape (D, W, V), how many selected nodes lie on the logged continuation
y_{p+1}, y_{p+2}, ...: that is L. At T > 0 the same holds by coupling (sample y once from the
target; a drafted child is accepted exactly when it is the sampled token).

Per prompt:
  1. generate y with the target (greedy, or sampled at T with the seed), max_new_tokens plus a
     lookahead of max_depth tokens so that L near the end is exact;
  2. one teacher-forced target forward over prompt + y -> fused features f_t;
  3. one head forward over all entries (f_t, x_{t+1}) -> the head's KV and each root's output;
  4. batched tree expansion for chunks of positions at once (positions x beams in one forward);
  5. the acceptance table L[D, V] from ranks of the on-path nodes (selections are nested in V).

`collect_prompt` does this for one prompt at batch 1 (the reference). `collect_prompts` does it for
many: continuations from the batched generator (pipeline/decode/continuations.py, optional disk cache),
one teacher-forced forward and one head forward per group of prompts (right-padded), and chunks of
roots from several prompts expanded together over a packed head prefix (no per-root KV copy). Its
logs equal collect_prompt's row for row (tests/pipeline/decode/test_batch_generate.py). At T > 0 prompt i samples
with seed `prompt_seed(cfg.seed, prompt_ids)`, in both.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from pipeline.collect.acceptance import acceptance_dists, acceptance_table
from pipeline.decode.continuations import ContinuationCache, generate_batch
from pipeline.decode.draft import expand_tree
from pipeline.decode.engine.single import Engine
from pipeline.errors import DraftGymError
from pipeline.models.head import Eagle3Head
from pipeline.logs.schema import DEFAULT_MAX_DEPTH, DEFAULT_VERIFY_GRID, SCHEMA_VERSION
from pipeline.models.target import base_model
from pipeline.decode.verify import target_forward


@dataclass
class CollectConfig:
    """What one collection run logs. Everything here goes into `sequences.config_json`."""

    model: str = "smollm2-135m"
    head: str = "default"
    dtype: str = "float32"           # the target's compute dtype: 'float32' | 'bfloat16' | 'float16' (resolved)
    dataset: str = "mt-bench"
    split: str | None = "test"
    n_prompts: int | None = 10
    max_new_tokens: int = 128        # episode length T (shorter when EOS comes first)
    temperature: float = 0.0
    seed: int = 0
    widths: tuple[int, ...] = (10,)
    max_depth: int = DEFAULT_MAX_DEPTH
    verify_grid: tuple[int, ...] = DEFAULT_VERIFY_GRID
    # roots expanded together in one batched draft forward (x W beams = rows per head matmul). 64: warm
    # collection of 64 ShareGPT prompts on the 2-core Xeon takes 26.6-26.9 / 24.6-24.9 / 22.7-23.2 /
    # 22.0-22.1 s at 16 / 32 / 64 / 128 in bf16, and 56.7-58.4 / 50.4-52.2 / 54.0-56.4 s at 16 / 64 / 128
    # in fp32. Not part of run_key: it changes speed, not what is logged.
    position_batch: int = 64
    dist_every: int = 1              # T > 0: acceptance distributions at every k-th position (0 = never)
    dist_verify_size: int = 60       # V of the trees whose acceptance distributions are logged
    schema_version: int = SCHEMA_VERSION

    def run_key(self) -> str:
        """Same data-defining config -> same key (so a rerun resumes instead of duplicating)."""
        keys = ("model", "head", "dtype", "dataset", "split", "max_new_tokens", "temperature", "seed", "widths",
                "max_depth", "verify_grid", "dist_every", "dist_verify_size", "schema_version")
        blob = json.dumps({k: getattr(self, k) for k in keys}, sort_keys=True, default=list)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=list)


@dataclass
class PromptLog:
    """The collected rows of one prompt (columns as numpy arrays / lists, ready for pyarrow)."""

    output_tokens: list[int]
    new_tokens: int
    stop_reason: str
    positions: dict = field(default_factory=dict)   # width -> {column -> array}, one row per position


def prompt_seed(seed: int, prompt_ids) -> int:
    """The sampling seed of one prompt's continuation: the first 63 bits of sha1(cfg.seed, prompt ids).
    It depends on the prompt's tokens only, not on its index, batch, shard or resume order, so
    `collect_prompt`, `collect_prompts` and any Ray sharding sample the same continuation, and two
    prompts never share one random stream (unless they are the same prompt)."""
    blob = json.dumps([int(seed), [int(t) for t in prompt_ids]]).encode()
    return int.from_bytes(hashlib.sha1(blob).digest()[:8], "big") >> 1


def _cut(y: list[int], cfg: CollectConfig, eos: set[int]):
    """y generated past EOS -> (y, T, stop): cut after the first EOS among the first T tokens."""
    cut = next((i for i, t in enumerate(y[: cfg.max_new_tokens]) if t in eos), None)
    if cut is not None:
        return y[: cut + 1], cut + 1, "eos"
    return y, cfg.max_new_tokens, "max_new_tokens"


def generate_past_eos(engine: Engine, ids: list[int], n: int, temperature: float = 0.0, seed: int = 0) -> list[int]:
    """Exactly n AR tokens after `ids` with the batch-1 engine, EOS or not (the caller cuts)."""
    eos = engine.eos
    engine.eos = set()
    try:
        return engine.generate_ar(ids, n, temperature, seed).output_ids
    finally:
        engine.eos = eos


def generate_continuation(engine: Engine, prompt_ids: list[int], cfg: CollectConfig, lookahead: int):
    """The logged continuation y: T = max_new_tokens tokens (or fewer, up to EOS), plus up to
    `lookahead` more so the acceptance of trees rooted near the end is exact. Batch 1 (the reference).
    AR, not EAGLE-3: the reference output itself, at a cost that does not depend on the head."""
    y = generate_past_eos(engine, prompt_ids, cfg.max_new_tokens + lookahead, cfg.temperature,
                          prompt_seed(cfg.seed, prompt_ids))
    return _cut(y, cfg, engine.eos)


def generate_continuations(engine: Engine, prompts: list[list[int]], cfg: CollectConfig, lookahead: int,
                           cache: ContinuationCache | None = None, batch_size: int = 16):
    """generate_continuation for many prompts with the batched generator: [(y, T, stop), ...]."""
    conts = generate_batch(engine.model, prompts, cfg.max_new_tokens + lookahead, cfg.temperature,
                           [prompt_seed(cfg.seed, p) for p in prompts], engine.eos, run_past_eos=True,
                           batch_size=batch_size, cache=cache)
    return [_cut(c.output_ids, cfg, engine.eos) for c in conts]


COLUMNS = ("position", "context_len", "width", "root_token", "acceptance", "beam_scores", "candidate_scores", "entropy")


def root_columns(pool, p: torch.Tensor, n: torch.Tensor, y_t: torch.Tensor, W: int, cfg: CollectConfig,
                 grid: torch.Tensor) -> dict[str, np.ndarray]:
    """The logged columns of B roots (one row each) from their expanded pool.

    p: [B] root positions in y; n: [B] context lengths (the root y_p sits at sequence index n);
    y_t: [B, T + Dmax + 1] each root's own continuation, padded with -1."""
    B = len(p)
    pool_cpu = type(pool)(pool.tokens.cpu(), pool.scores.cpu(), pool.parents.cpu(), pool.depths.cpu(), pool.width, [])
    cont = torch.stack([y_t[torch.arange(B), p + j] for j in range(1, cfg.max_depth + 1)], dim=1)   # [B, Dmax]
    L = acceptance_table(pool_cpu, cont, cfg.max_depth, grid)                # [B, Dmax, n_grid]
    beam = np.full((B, cfg.max_depth, W), np.nan, np.float32)
    cand = np.full((B, cfg.max_depth, W * W), np.nan, np.float32)
    ent = np.full((B, cfg.max_depth, W), np.nan, np.float32)
    for d, st in enumerate(pool.steps):
        beam[:, d, : st["beam_scores"].shape[1]] = st["beam_scores"].float().cpu().numpy()
        cand[:, d, : st["candidate_scores"].shape[1]] = st["candidate_scores"].float().cpu().numpy()
        ent[:, d, : st["entropy"].shape[1]] = st["entropy"].float().cpu().numpy()
    return {"position": p.numpy(), "context_len": n.numpy(), "width": np.full(B, W),
            "root_token": y_t[torch.arange(B), p].numpy(), "acceptance": L.reshape(B, -1).numpy(),
            "beam_scores": beam.reshape(B, -1), "candidate_scores": cand.reshape(B, -1), "entropy": ent.reshape(B, -1)}


def _dists(engine: Engine, cache, pool, rows: list[int], y: list[int], p: list[int], n: list[int],
           cfg: CollectConfig) -> list:
    """T > 0: the acceptance distributions [Dmax * (Dmax+1)] of pool rows `rows` (roots y_p, context n,
    all of one sequence), None where subsampled out by dist_every."""
    keep = [i for i, pi in enumerate(p) if pi % cfg.dist_every == 0]
    got = acceptance_dists(engine.model, cache, pool, [rows[i] for i in keep], [y[p[i]] for i in keep],
                           [n[i] for i in keep], cfg.max_depth, cfg.dist_verify_size, cfg.temperature)
    out = [None] * len(p)
    for i, d in zip(keep, got):
        out[i] = d.reshape(-1)
    return out


def _assemble(chunks: list[dict], dists: list, with_dist: bool) -> dict:
    out = {k: (np.concatenate([c[k] for c in chunks]) if chunks else np.zeros(0)) for k in COLUMNS}
    if with_dist:
        out["accept_dist"] = dists                                   # list of arrays / None
    return out


@torch.inference_mode()
def collect_prompt(engine: Engine, head: Eagle3Head, prompt_ids: list[int], cfg: CollectConfig) -> PromptLog:
    """One prompt at batch 1 (the reference for `collect_prompts`)."""
    dev = engine.device
    y, T, stop = generate_continuation(engine, prompt_ids, cfg, lookahead=cfg.max_depth)
    full = list(prompt_ids) + y
    P, N = len(prompt_ids), len(full)
    # 2. teacher-forced target forward; 3. the head over every entry (f_t, x_{t+1}), t = 0..N-2
    from transformers import DynamicCache

    cache = DynamicCache(config=engine.model.config)
    _, hs = target_forward(engine.model, torch.tensor([full], device=dev), torch.arange(N, device=dev)[None], cache,
                           last_only=True)                                  # the logits are not used: features only
    with_dist = cfg.temperature > 0 and cfg.dist_every > 0
    feats = head.fuse(tuple(h[:, : N - 1] for h in hs))                  # [1, N-1, H]
    g, dlogits, kv = head(torch.tensor([full[1:]], device=dev), feats, torch.arange(N - 1, device=dev))
    positions = np.arange(max(T - 1, 0))                                 # roots y_0 .. y_{T-2}
    grid = torch.tensor(cfg.verify_grid)
    y_t = torch.tensor(y + [-1] * (cfg.max_depth + 1))
    entry_ids = torch.arange(N - 1, device=dev)
    per_width = {}
    for W in cfg.widths:
        chunks, dists = [], []
        for start in range(0, len(positions), cfg.position_batch):
            p = torch.from_numpy(positions[start : start + cfg.position_batch])   # [B]
            n = P + p                                                   # root y_p sits at sequence index n
            root_entry = (n - 1).to(dev)                                # entry (f_{n-1}, x_n)
            prefix_mask = entry_ids[None, :] <= root_entry[:, None]     # [B, N-1]
            pool = expand_tree(head, kv, prefix_mask, g[0, root_entry], dlogits[0, root_entry], root_entry,
                               W, cfg.max_depth, context_len=n.tolist())
            chunks.append(root_columns(pool, p, n, y_t.expand(len(p), -1), W, cfg, grid))
            if with_dist:
                dists += _dists(engine, cache, pool, list(range(len(p))), y, p.tolist(), n.tolist(), cfg)
        per_width[W] = _assemble(chunks, dists, with_dist)
    return PromptLog(output_tokens=y, new_tokens=T, stop_reason=stop, positions=per_width)


@torch.inference_mode()
def collect_prompts(engine: Engine, head: Eagle3Head, prompts: list[list[int]], cfg: CollectConfig,
                    continuations: list | None = None, batch_size: int = 8,
                    cache: ContinuationCache | None = None) -> list[PromptLog]:
    """collect_prompt for many prompts, batched; row for row the same logs (up to fp rounding).

    continuations: [(y, T, stop), ...] from `generate_continuations`, or None to generate them here
    (batched, seeds from `prompt_seed`, so equal to collect_prompt's batch-1 continuations).
    Per group of `batch_size` prompts:
      - one teacher-forced target forward over the right-padded sequences [G, N_max]: position ids are
        the natural ones and causal attention never reaches the padding after a row, so no mask;
      - one head forward over the right-padded entries [G, N_max - 1];
      - the head KV packed once into one sequence [1, n_kv, sum_r (N_r - 1), d] (prompt r at offset o_r);
        a root of prompt r at sequence index n sees the packed entries o_r <= e <= o_r + n - 1 (a
        block-diagonal prefix mask), so chunks of `position_batch` roots from several prompts expand
        in one forward without copying any prefix KV per root (expand_tree broadcasts the [1, ...] KV).
    """
    if continuations is None:
        continuations = generate_continuations(engine, prompts, cfg, cfg.max_depth, cache=cache)
    if len(continuations) != len(prompts):
        raise DraftGymError(f"{len(continuations)} continuations for {len(prompts)} prompts")
    logs = []
    for g0 in range(0, len(prompts), batch_size):
        logs += _collect_group(engine, head, prompts[g0 : g0 + batch_size], continuations[g0 : g0 + batch_size], cfg)
    return logs


def _collect_group(engine: Engine, head: Eagle3Head, prompts, conts, cfg: CollectConfig) -> list[PromptLog]:
    from transformers import DynamicCache

    dev, G = engine.device, len(prompts)
    fulls = [list(p) + c[0] for p, c in zip(prompts, conts)]
    Ns = [len(f) for f in fulls]
    Nmax = max(Ns)
    ids = torch.tensor([f + [0] * (Nmax - len(f)) for f in fulls], device=dev)              # [G, N_max] right-padded
    cache = DynamicCache(config=engine.model.config)
    with_dist = cfg.temperature > 0 and cfg.dist_every > 0
    out = base_model(engine.model)(input_ids=ids, position_ids=torch.arange(Nmax, device=dev)[None].expand(G, -1),
                                   cache=cache if with_dist else None, use_cache=with_dist,
                                   output_hidden_states=True)                                 # no lm_head: logits unused
    feats = head.fuse(tuple(h[:, : Nmax - 1] for h in out.hidden_states))                    # [G, N_max-1, H]
    g, dlogits, (hk, hv) = head(ids[:, 1:], feats, torch.arange(Nmax - 1, device=dev))        # [G, N_max-1, .]
    # pack the head KV: prompt r's entries 0..N_r-2 at offsets o_r
    off = np.concatenate([[0], np.cumsum([N - 1 for N in Ns])])                              # [G+1]
    pk = torch.cat([hk[r : r + 1, :, : Ns[r] - 1] for r in range(G)], 2)                      # [1, n_kv, S, d]
    pv = torch.cat([hv[r : r + 1, :, : Ns[r] - 1] for r in range(G)], 2)
    # roots: (prompt r, position p) for p = 0 .. T_r - 2, prompt-major
    ri = np.concatenate([np.full(max(c[1] - 1, 0), r) for r, c in enumerate(conts)]).astype(np.int64)
    pp = np.concatenate([np.arange(max(c[1] - 1, 0)) for c in conts]).astype(np.int64)
    P = torch.tensor([len(p) for p in prompts])
    y_t = torch.full((G, Nmax + cfg.max_depth + 2), -1, dtype=torch.long)                     # [G, .] y, -1 padded
    for r, c in enumerate(conts):
        y_t[r, : len(c[0])] = torch.tensor(c[0], dtype=torch.long)
    row_caches: dict[int, DynamicCache] = {}

    def row_cache(r: int):
        """T > 0: prompt r's own batch-1 teacher-forced cache (a copy of its row, made once)."""
        if r not in row_caches:
            c = DynamicCache(config=engine.model.config)
            for li, layer in enumerate(cache.layers):
                c.update(layer.keys[r : r + 1, :, : Ns[r]].clone(), layer.values[r : r + 1, :, : Ns[r]].clone(), li)
            row_caches[r] = c
        return row_caches[r]

    grid = torch.tensor(cfg.verify_grid)
    per_prompt = [dict() for _ in range(G)]
    for W in cfg.widths:
        chunks: list[list[dict]] = [[] for _ in range(G)]
        dists: list[list] = [[] for _ in range(G)]
        for start in range(0, len(ri), cfg.position_batch):
            r_np, p_np = ri[start : start + cfg.position_batch], pp[start : start + cfg.position_batch]
            r, p = torch.from_numpy(r_np), torch.from_numpy(p_np)                            # [B]
            n = P[r] + p                                                                     # root y_p at index n
            lo, hi = int(off[r_np[0]]), int(off[r_np[-1] + 1])                              # the chunk's prompts
            e = torch.arange(lo, hi)                                                         # packed entries
            first = torch.from_numpy(off[r_np])                                              # [B] o_r
            prefix_mask = (e[None, :] >= first[:, None]) & (e[None, :] <= (first + n - 1)[:, None])  # [B, S_chunk]
            rd, ed = r.to(dev), (n - 1).to(dev)                                              # entry (f_{n-1}, x_n)
            pool = expand_tree(head, (pk[:, :, lo:hi], pv[:, :, lo:hi]), prefix_mask.to(dev), g[rd, ed],
                               dlogits[rd, ed], ed, W, cfg.max_depth, context_len=n.tolist())
            cols = root_columns(pool, p, n, y_t[r], W, cfg, grid)
            for q in np.unique(r_np):                                                        # split rows by prompt
                sel = r_np == q
                chunks[q].append({k: v[sel] for k, v in cols.items()})
                if with_dist:
                    idx = np.nonzero(sel)[0].tolist()
                    dists[q] += _dists(engine, row_cache(int(q)), pool, idx, conts[q][0], p_np[idx].tolist(),
                                       n[idx].tolist(), cfg)
        for q in range(G):
            per_prompt[q][W] = _assemble(chunks[q], dists[q], with_dist)
    return [PromptLog(output_tokens=c[0], new_tokens=c[1], stop_reason=c[2], positions=per_prompt[q])
            for q, c in enumerate(conts)]
