"""Observations: the ONE place where policy inputs are built, offline (simulator) and online (engine).

Every function takes the quantities the online engine exposes (`pipeline.decode.tree.DraftStep` fields,
`DraftPool.scores`, `StepContext`/`CycleRecord` fields) as numpy arrays with any leading batch
shape, so the same code builds one observation for the engine (batch 1) and millions for the
replay env (batched gathers from the logs). Outputs are float32 and deterministic.

Conventions
-----------
- Scores are cumulative draft log-probs (<= 0). Missing entries (NaN in the logs, e.g. the depth-1
  row of `candidate_scores` has only W of W*W slots) and everything below SCORE_FLOOR are mapped
  to SCORE_FLOOR = -20, which is also the padding value. exp(-20) ~ 2e-9: "no candidate".
- "sorted" means descending along the last axis (best first); sorting makes the features
  invariant to the engine's beam-major candidate order and to score ties.
- context length is fed as context_len / 1000 (LTD's released code did the same).

The four observation families (docs/design.md, "Action spaces"):

  LTD depth   s = [sort(c_1..c_{W^2}), D, ctx/1000]                          dim W^2 + 2
              c = the latest expansion's W*W candidate scores (W after forward 1, padded)
  LTD size    s = [sort(level_1)[W], sort(level_2)[W^2], .., sort(level_Dmax)[W^2], D, ctx/1000]
              dim W + (Dmax-1) W^2 + 2; levels deeper than the drafted D are padding.
              (LTD pads "all node scores of the tree"; we sort within each level, see above.)
  RADAR       s_t = sort(exp(beam_scores_t))  in [0, 1]^W, one vector per draft call t; the LSTM
              reads the sequence s_1..s_t (RADAR: "confidence scores of the top-k candidates").
  Re-SpS      probability-feature variant of Re-SpS's hidden-state state (documented deviation:
              the paper reuses target hidden states; we use what the engine already exposes):
              s = [sort(prev root-child scores)[:8], prev L/Dmax, prev D/Dmax, prev V/240,
                   prev W/32, prev emitted/(Dmax+1), ctx/1000, has_prev]                  dim 15
              "prev" is the previous cycle (the engine's `StepContext.last` at B = 1 plus the first W
              scores of the previous `DraftPool`), zeros with has_prev = 0 at a generation's start.
"""
from __future__ import annotations

import numpy as np

from pipeline.decode.step_shape import pool_size
from pipeline.logs.candidates import SCORE_FLOOR, clean   # the floor the logs store candidates at
from pipeline.logs.schema import DEFAULT_MAX_DEPTH     # LTD: D <= 12, the depth the logs hold

CTX_SCALE = 1000.0           # context length feature = context_len / CTX_SCALE

# LTD size policy: 12 actions mapping linearly to V in 20..240 (all on the logged V grid)
SIZE_ACTIONS: tuple[int, ...] = tuple(range(20, 241, 20))


def size_actions(space: str = "seeds", verify_grid=None) -> tuple[int, ...]:
    """LTD size-policy values. "seeds": SIZE_ACTIONS (V = 20..240). "wide": every logged V in 2..240
    (2, 4, 8, 10, 20, ..: small trees are what a CPU can afford; see simulator.envs.core.ACTION_SPACES)."""
    if space == "seeds":
        return SIZE_ACTIONS
    if space == "wide":
        return tuple(int(v) for v in np.asarray(verify_grid) if 2 <= v <= 240)
    raise ValueError(f"unknown action space {space!r}")


# RADAR: at most 8 draft calls, W = 10, V = 60
RADAR_MAX_CALLS = 8
# Re-SpS probability features
RESPS_ROOT_K = 8
RESPS_DIM = RESPS_ROOT_K + 7


def to_numpy(x) -> np.ndarray:
    """torch tensors (any device) or array-likes -> float32 numpy."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def clean_scores(scores) -> np.ndarray:
    """NaN / -inf / below-floor -> SCORE_FLOOR; above 0 clipped to 0 (rounding)."""
    # == np.clip(np.nan_to_num(s, nan=FLOOR, neginf=FLOOR, posinf=0), FLOOR, 0) (up to the sign of
    # a zero), at a fraction of the cost in the online controller, where each call runs cold between
    # two verify forwards: nan_to_num ~80 us, np.clip's Python wrapper ~50 us, two ufuncs ~5 us.
    return clean(to_numpy(scores))


def sort_desc(scores, size: int | None = None) -> np.ndarray:
    """Clean, sort descending along the last axis, pad (with SCORE_FLOOR) or cut to `size`."""
    s = clean_scores(scores)
    s = -np.sort(-s, axis=-1)
    if size is not None and s.shape[-1] != size:
        if s.shape[-1] > size:
            s = s[..., :size]
        else:
            pad = np.full(s.shape[:-1] + (size - s.shape[-1],), SCORE_FLOOR, np.float32)
            s = np.concatenate([s, pad], axis=-1)
    return np.ascontiguousarray(s, dtype=np.float32)


def _sort_desc_into(scores, out: np.ndarray) -> np.ndarray:
    """Batch-1 `sort_desc(scores, len(out))` written into `out` [size]: clean, sort descending, cut
    or pad with SCORE_FLOOR. The online controller's path (fewer numpy calls; equal values)."""
    s = clean_scores(scores)
    s.sort()
    m = min(len(s), len(out))
    out[:m] = s[::-1][:m]
    out[m:] = SCORE_FLOOR
    return out


def _scalar_feature(x, shape) -> np.ndarray:
    return np.broadcast_to(np.asarray(x, dtype=np.float32), shape)[..., None]


# ---------------------------------------------------------------- LTD depth policy

def ltd_depth_obs_dim(width: int) -> int:
    return width * width + 2


def ltd_depth_obs(candidate_scores, depth, context_len, width: int, presorted: bool = False,
                  out: np.ndarray | None = None) -> np.ndarray:
    """LTD depth observation after draft forward `depth`.

    candidate_scores: [..., k] the latest expansion's candidate scores, k = W (forward 1) or W*W,
    NaN-padded allowed; depth, context_len: scalars or [...]. Returns [..., W*W + 2] float32.
    presorted=True skips cleaning/sorting (the input is already `sort_desc(., W*W)`; the replay
    env precomputes that once for the whole log).
    """
    c = np.asarray(candidate_scores, np.float32) if presorted else sort_desc(candidate_scores, width * width)
    batch = c.shape[:-1]
    if out is None:
        out = np.empty(batch + (width * width + 2,), np.float32)
    out[..., : width * width] = c
    out[..., width * width] = np.asarray(depth, np.float32)
    out[..., width * width + 1] = np.asarray(context_len, np.float32) / CTX_SCALE
    return out


def ltd_depth_obs_one(candidate_scores, depth: int, context_len: int, width: int,
                      out: np.ndarray | None = None) -> np.ndarray:
    """Batch-1 `ltd_depth_obs` for the online controller: the same vector, bit for bit (tests check
    it), built with a handful of numpy calls instead of ~20. Each numpy call costs ~5-10 us when it
    runs cold between two verify forwards, and LTD decides after every draft forward.
    candidate_scores: [k] the latest expansion's scores (k = W or W*W, NaN allowed). -> [W*W + 2]
    (written into `out` when given: the rich variant's longer buffer, its first W*W + 2 entries)."""
    k = width * width
    out = np.empty(k + 2, np.float32) if out is None else out
    _sort_desc_into(candidate_scores, out[:k])
    out[k] = depth
    out[k + 1] = np.float32(context_len) / CTX_SCALE  # float32 / weak scalar, as the batched path
    return out


# ---------------------------------------------------------------- LTD size policy

def ltd_size_obs_dim(width: int, max_depth: int = DEFAULT_MAX_DEPTH) -> int:
    return pool_size(max_depth, width) + 2


def level_scores_from_pool(pool_scores, width: int, depth: int, max_depth: int = DEFAULT_MAX_DEPTH) -> np.ndarray:
    """Pool-order scores ([..., W + (depth-1) W^2], `DraftPool.scores`) -> [..., max_depth, W*W] per
    level (level 1 holds W entries, the rest NaN; levels deeper than `depth` NaN)."""
    s = to_numpy(pool_scores)
    n = pool_size(depth, width)
    if s.shape[-1] < n:
        raise ValueError(f"pool has {s.shape[-1]} scores, a depth-{depth} width-{width} pool has {n}")
    out = np.full(s.shape[:-1] + (max_depth, width * width), np.nan, np.float32)
    out[..., 0, :width] = s[..., :width]
    if depth > 1:
        out[..., 1:depth, :] = s[..., width:n].reshape(s.shape[:-1] + (depth - 1, width * width))
    return out


def sort_levels(level_scores, width: int) -> np.ndarray:
    """Per-level cleaning + descending sort of [..., Dmax, W*W] level scores (levels padded to W*W)."""
    return sort_desc(level_scores, width * width)


def ltd_size_obs(level_scores, depth, context_len, width: int, max_depth: int = DEFAULT_MAX_DEPTH,
                 presorted: bool = False) -> np.ndarray:
    """LTD size observation of a drafted tree of `depth` levels.

    level_scores: [..., Dl, W*W] candidate scores per level (Dl >= max drafted depth; level 1 uses
    its first W slots); depth: scalar or [...]. Returns [..., W + (max_depth-1) W^2 + 2] float32.
    presorted=True: level_scores is already `sort_levels(.)` output.
    """
    lv = np.asarray(level_scores, np.float32) if presorted else sort_levels(level_scores, width)
    lv = lv[..., :max_depth, :]
    batch = lv.shape[:-2]
    depth = np.broadcast_to(np.asarray(depth), batch)
    keep = (np.arange(lv.shape[-2]) < depth[..., None])                      # [..., Dl]
    lv = np.where(keep[..., None], lv, np.float32(SCORE_FLOOR))
    if lv.shape[-2] < max_depth:
        pad = np.full(batch + (max_depth - lv.shape[-2], width * width), SCORE_FLOOR, np.float32)
        lv = np.concatenate([lv, pad], axis=-2)
    first = lv[..., 0, :width]
    rest = lv[..., 1:, :].reshape(batch + ((max_depth - 1) * width * width,))
    return np.concatenate([first, rest, _scalar_feature(depth, batch),
                           _scalar_feature(np.asarray(context_len, np.float32) / CTX_SCALE, batch)],
                          axis=-1).astype(np.float32)


def ltd_size_obs_from_pool(pool_scores, width: int, depth: int, context_len: int,
                           max_depth: int = DEFAULT_MAX_DEPTH) -> np.ndarray:
    """One observation from a `DraftPool` row's scores (what the engine's size hook receives)."""
    return ltd_size_obs(level_scores_from_pool(pool_scores, width, depth, max_depth), depth, context_len, width,
                        max_depth)


def ltd_size_obs_parts(pool_scores, width: int, depth: int, context_len: int,
                       max_depth: int = DEFAULT_MAX_DEPTH) -> tuple[np.ndarray, np.ndarray]:
    """Batch-1 `ltd_size_obs` from a pool's scores, in the two parts that are not constant:

        live = obs[:W + (D'-1) W^2]   the drafted levels, sorted per level (D' = min(D, max_depth))
        tail = obs[-2:]               [depth, context_len / CTX_SCALE]

    Every column between them is SCORE_FLOOR, which `NumpyMLP.call_parts` folds into a cached
    constant. Equal, bit for bit, to the matching slices of `ltd_size_obs_from_pool` (tests check it),
    at a fraction of its cost: it never builds the [max_depth, W*W] level array.
    pool_scores: [>= W + (D-1) W^2] `DraftPool.scores` of one row, in pool order."""
    s = to_numpy(pool_scores)
    pool = pool_size(int(depth), width)
    if s.shape[-1] < pool:
        raise ValueError(f"pool has {s.shape[-1]} scores, a depth-{depth} width-{width} pool has {pool}")
    D = min(int(depth), max_depth)
    n = pool_size(D, width)
    s = clean_scores(s[:n])
    live = np.empty(n, np.float32)
    live[:width] = np.sort(s[:width])[::-1]               # level 1: its W scores, descending
    if D > 1:                                             # levels 2..D: W*W each, descending per level
        live[width:] = np.sort(s[width:].reshape(D - 1, width * width), axis=-1)[:, ::-1].ravel()
    tail = np.array([depth, np.float32(context_len) / CTX_SCALE], np.float32)
    return live, tail


# ---------------------------------------------------------------- RADAR

def radar_obs(beam_scores, width: int | None = None) -> np.ndarray:
    """RADAR's per-call input: the W beam confidences exp(cumulative log-prob), sorted, in [0, 1].
    beam_scores: [..., W] (DraftStep.beam_scores). Returns [..., W] float32."""
    s = sort_desc(beam_scores, width)
    return np.exp(s).astype(np.float32)


def radar_obs_one(beam_scores, width: int) -> np.ndarray:
    """Batch-1 `radar_obs` for the online controller: [W] beam scores (NaN allowed) -> [W], equal
    to the batched builder's row (tests check it)."""
    return np.exp(_sort_desc_into(beam_scores, np.empty(width, np.float32)))


# ---------------------------------------------------------------- Re-SpS (probability features)

def resps_obs(prev_root_scores, prev_accepted, prev_depth, prev_verify, prev_width, prev_emitted,
              context_len, has_prev, max_depth: int = DEFAULT_MAX_DEPTH) -> np.ndarray:
    """Re-SpS state, probability-feature variant (see module docstring). All args [...] except
    prev_root_scores [..., k] (the previous cycle's depth-1 scores, any k; sorted, cut/padded to 8).
    Where has_prev is 0 every 'prev' feature is zeroed (root scores -> SCORE_FLOOR)."""
    root = sort_desc(prev_root_scores, RESPS_ROOT_K)
    batch = root.shape[:-1]
    has = np.broadcast_to(np.asarray(has_prev, np.float32), batch)
    root = np.where(has[..., None] > 0, root, np.float32(SCORE_FLOOR))
    f = lambda x, scale: _scalar_feature(np.asarray(x, np.float32) / scale * has, batch)
    return np.concatenate([
        root, f(prev_accepted, max_depth), f(prev_depth, max_depth), f(prev_verify, 240.0), f(prev_width, 32.0),
        f(prev_emitted, max_depth + 1.0), _scalar_feature(np.asarray(context_len, np.float32) / CTX_SCALE, batch),
        _scalar_feature(has, batch)], axis=-1).astype(np.float32)


# ---------------------------------------------------------------- heuristics' statistics

def best_beam_score(beam_scores) -> np.ndarray:
    """DDD's statistic: the cumulative log-prob of the best beam. [..., W] -> [...]."""
    return clean_scores(beam_scores).max(axis=-1)


def best_beam_entropy(entropy) -> np.ndarray:
    """SVIP-like statistic: the entropy (nats) of the best beam's child distribution (slot 0:
    beams are best-first; at forward 1 slot 0 is the root's). [..., W] -> [...]."""
    e = to_numpy(entropy)[..., 0]
    return np.nan_to_num(e, nan=0.0)
