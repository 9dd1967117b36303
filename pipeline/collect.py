"""Collection: everything the simulator needs to replay EAGLE-3 decoding exactly, for one prompt.

Exact counterfactual replay (design.md). Under greedy decoding the output is the target's greedy
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
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from pipeline.draft import expand_tree
from pipeline.engine import Engine
from pipeline.head import Eagle3Head
from pipeline.schema import DEFAULT_MAX_DEPTH, DEFAULT_VERIFY_GRID, SCHEMA_VERSION
from pipeline.tree import rank_nodes, tree_from_nodes
from pipeline.verify import crop_cache, target_forward, tree_attention_mask


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
    position_batch: int = 16         # roots expanded together in one batched draft forward
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


def generate_continuation(engine: Engine, prompt_ids: list[int], cfg: CollectConfig, lookahead: int):
    """The logged continuation y: T = max_new_tokens tokens (or fewer, up to EOS), plus up to
    `lookahead` more so the acceptance of trees rooted near the end is exact."""
    eos = engine.eos
    engine.eos = set()                                   # run past EOS; we cut ourselves
    try:
        # AR, not EAGLE-3: the reference output itself, at a cost that does not depend on the head
        res = engine.generate_ar(prompt_ids, cfg.max_new_tokens + lookahead, cfg.temperature, cfg.seed)
    finally:
        engine.eos = eos
    y = res.output_ids
    cut = next((i for i, t in enumerate(y[: cfg.max_new_tokens]) if t in eos), None)
    if cut is not None:
        return y[: cut + 1], cut + 1, "eos"
    return y, cfg.max_new_tokens, "max_new_tokens"


def acceptance_table(pool, cont: torch.Tensor, max_depth: int, grid: torch.Tensor) -> torch.Tensor:
    """L[b, D-1, v] for every static tree (D, W, grid[v]) of each root in the pool.

    pool: DraftPool with B roots, N = W + (max_depth-1)W^2 nodes; cont: [B, max_depth] logged
    continuation y_{p+1}.. (-1 where it does not exist). A node is on-path when its token equals
    cont at its depth and its parent is on-path (or is the root); there is at most one per depth.
    The tree (D, V) selects the top V-1 nodes of pool[:n_D] (n_D = W + (D-1)W^2) in the stable
    order of `rank_nodes`; the on-path depth-j node is selected iff its rank there is <= V-2, and
    then (the selection being connected) L >= j.
    """
    B, N = pool.tokens.shape
    W = pool.width
    on_path = torch.zeros(B, N, dtype=torch.bool)
    path_idx = torch.full((B, max_depth), -1, dtype=torch.long)        # [B, j] on-path node at depth j+1
    for j in range(1, max_depth + 1):
        lo = 0 if j == 1 else W + (j - 2) * W * W
        hi = W + (j - 1) * W * W
        tok = pool.tokens[:, lo:hi]
        par = pool.parents[:, lo:hi]
        par_ok = torch.ones_like(tok, dtype=torch.bool) if j == 1 else torch.gather(on_path, 1, par.clamp(min=0))
        ok = (tok == cont[:, j - 1 : j]) & par_ok & (cont[:, j - 1 : j] >= 0)
        on_path[:, lo:hi] = ok
        has = ok.any(1)
        path_idx[has, j - 1] = lo + ok[has].float().argmax(1)
    L = torch.zeros(B, max_depth, len(grid), dtype=torch.uint8)
    scores = pool.scores
    ar = torch.arange(N)
    for D in range(1, max_depth + 1):
        n_D = W + (D - 1) * W * W
        s = scores[:, :n_D]                                             # [B, n_D]
        best = torch.zeros(B, len(grid), dtype=torch.uint8)
        for j in range(1, D + 1):
            idx = path_idx[:, j - 1]                                    # [B]
            valid = idx >= 0
            si = torch.gather(scores, 1, idx.clamp(min=0)[:, None])     # [B, 1]
            # rank in the stable order: strictly better scores, plus equal scores at lower index
            rank = (s > si).sum(1) + ((s == si) & (ar[None, :n_D] < idx[:, None])).sum(1)  # [B]
            sel = valid[:, None] & (rank[:, None] <= grid[None, :] - 2)  # [B, n_grid]
            best = torch.where(sel, torch.full_like(best, j), best)
        L[:, D - 1] = best
    return L


@torch.inference_mode()
def acceptance_dist(model, cache, pool, b: int, root_token: int, n: int, max_depth: int, verify_size: int,
                    temperature: float) -> np.ndarray:
    """P(L = l) for the trees (D, W, verify_size), D = 1..max_depth, of one root: [max_depth, max_depth + 1].

    One target forward over the union of those trees (on the teacher-forced cache, prefix < n).
    Under EAGLE's sampling rule the emitted token is distributed as p_target and the path goes on
    exactly when it is a drafted child, so reaching node i has probability prod_{k on path} p(tok_k | parent)
    and P(L >= j) = sum over selected depth-j nodes of that product.
    """
    W = pool.width
    order = rank_nodes(pool.scores[b : b + 1])[0]
    sel = []                                                            # pool indices selected per D
    for D in range(1, max_depth + 1):
        n_D = W + (D - 1) * W * W
        sel.append(order[order < n_D][: max(0, verify_size - 1)])
    union = torch.unique(torch.cat(sel))
    tree = tree_from_nodes(pool, b, root_token, union)
    N = cache.get_seq_length()                                          # the whole teacher-forced sequence
    mask = tree_attention_mask(tree, N, next(model.parameters()).dtype, visible=n)
    logits, _ = target_forward(model, tree.tokens[None], (n + tree.depths)[None], cache, mask, hidden_states=False)
    crop_cache(cache, N)
    probs = torch.softmax(logits / temperature, dim=-1)                 # [V_u, vocab]
    par = tree.parents.tolist()
    q = probs[tree.parents.clamp(min=0), tree.tokens]                   # [V_u] p(tok_i | parent)
    reach = torch.ones(tree.size, dtype=torch.float64)
    for i in range(1, tree.size):                                       # parents precede children
        reach[i] = reach[par[i]] * float(q[i])
    pos_of = {int(x): i for i, x in enumerate(tree.pool_index.tolist())}
    depth_t = tree.depths.tolist()
    out = np.zeros((max_depth, max_depth + 1), np.float32)
    for D in range(1, max_depth + 1):
        ge = np.zeros(max_depth + 2)                                    # ge[j] = P(L >= j)
        ge[0] = 1.0
        for x in sel[D - 1].tolist():
            i = pos_of[x]
            ge[depth_t[i]] += float(reach[i])
        out[D - 1] = np.clip(ge[: max_depth + 1] - ge[1 : max_depth + 2], 0.0, 1.0)
    return out


@torch.inference_mode()
def collect_prompt(engine: Engine, head: Eagle3Head, prompt_ids: list[int], cfg: CollectConfig) -> PromptLog:
    dev = engine.device
    y, T, stop = generate_continuation(engine, prompt_ids, cfg, lookahead=cfg.max_depth)
    full = list(prompt_ids) + y
    P, N = len(prompt_ids), len(full)
    # 2. teacher-forced target forward; 3. the head over every entry (f_t, x_{t+1}), t = 0..N-2
    from transformers import DynamicCache

    cache = DynamicCache(config=engine.model.config)
    _, hs = target_forward(engine.model, torch.tensor([full], device=dev), torch.arange(N, device=dev)[None], cache)
    with_dist = cfg.temperature > 0 and cfg.dist_every > 0
    feats = head.fuse(tuple(h[:, : N - 1] for h in hs))                  # [1, N-1, H]
    g, dlogits, kv = head(torch.tensor([full[1:]], device=dev), feats, torch.arange(N - 1, device=dev))
    positions = np.arange(max(T - 1, 0))                                 # roots y_0 .. y_{T-2}
    grid = torch.tensor(cfg.verify_grid)
    y_t = torch.tensor(y + [-1] * (cfg.max_depth + 1))
    entry_ids = torch.arange(N - 1, device=dev)
    per_width = {}
    for W in cfg.widths:
        cols: dict[str, list] = {k: [] for k in ("position", "context_len", "width", "root_token", "acceptance",
                                                 "beam_scores", "candidate_scores", "entropy", "accept_dist")}
        for start in range(0, len(positions), cfg.position_batch):
            p = torch.from_numpy(positions[start : start + cfg.position_batch])   # [B]
            B = len(p)
            n = P + p                                                   # root y_p sits at sequence index n
            root_entry = (n - 1).to(dev)                                # entry (f_{n-1}, x_n)
            prefix_mask = entry_ids[None, :] <= root_entry[:, None]     # [B, N-1]
            pool = expand_tree(head, kv, prefix_mask, g[0, root_entry], dlogits[0, root_entry], root_entry,
                               W, cfg.max_depth, context_len=n.tolist())
            pool_cpu = type(pool)(pool.tokens.cpu(), pool.scores.cpu(), pool.parents.cpu(), pool.depths.cpu(),
                                  pool.width, [])
            cont = torch.stack([y_t[p + j] for j in range(1, cfg.max_depth + 1)], dim=1)   # [B, Dmax]
            L = acceptance_table(pool_cpu, cont, cfg.max_depth, grid)  # [B, Dmax, n_grid]
            beam = np.full((B, cfg.max_depth, W), np.nan, np.float32)
            cand = np.full((B, cfg.max_depth, W * W), np.nan, np.float32)
            ent = np.full((B, cfg.max_depth, W), np.nan, np.float32)
            for d, st in enumerate(pool.steps):
                beam[:, d, : st["beam_scores"].shape[1]] = st["beam_scores"].float().cpu().numpy()
                cand[:, d, : st["candidate_scores"].shape[1]] = st["candidate_scores"].float().cpu().numpy()
                ent[:, d, : st["entropy"].shape[1]] = st["entropy"].float().cpu().numpy()
            if with_dist:  # [B] entries: [Dmax, Dmax+1] arrays, or None for positions subsampled out
                cols["accept_dist"].append([
                    acceptance_dist(engine.model, cache, pool, i, y[int(pi)], int(n[i]), cfg.max_depth,
                                    cfg.dist_verify_size, cfg.temperature).reshape(-1)
                    if int(pi) % cfg.dist_every == 0 else None for i, pi in enumerate(p)])
            cols["position"].append(p.numpy())
            cols["context_len"].append(n.numpy())
            cols["width"].append(np.full(B, W))
            cols["root_token"].append(np.array([y[i] for i in p.tolist()]))
            cols["acceptance"].append(L.reshape(B, -1).numpy())
            cols["beam_scores"].append(beam.reshape(B, -1))
            cols["candidate_scores"].append(cand.reshape(B, -1))
            cols["entropy"].append(ent.reshape(B, -1))
        dist = [d for chunk in cols.pop("accept_dist") for d in chunk]
        per_width[W] = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in cols.items()}
        if with_dist:
            per_width[W]["accept_dist"] = dist                          # list of arrays / None
    return PromptLog(output_tokens=y, new_tokens=T, stop_reason=stop, positions=per_width)


def replay_static(acceptance: np.ndarray, new_tokens: int, depth: int, verify_size: int,
                  verify_grid=DEFAULT_VERIFY_GRID) -> list[tuple[int, int]]:
    """Walk one sequence's log with a static (D, V): [(p, L), ...] cycle by cycle.
    acceptance: [n_positions, max_depth, n_grid] for one width, rows indexed by position."""
    v = list(verify_grid).index(verify_size)
    p, out = 0, []
    while p < new_tokens - 1:
        L = int(acceptance[p, depth - 1, v])
        out.append((p, L))
        p += L + 1
    return out


def timed(fn, *a, **kw):
    t0 = time.perf_counter()
    r = fn(*a, **kw)
    return r, time.perf_counter() - t0
