"""What a root's draft tree is worth, read off the logged continuation: the acceptance table L[D, V]
(step 5 of pipeline/collect/prompt.py's per-prompt collection) and, at T > 0 or for the per-depth
acceptance-length distributions, the target's probabilities over the tree's nodes (acceptance_dists)."""
from __future__ import annotations

import numpy as np
import torch

from pipeline.decode.step_shape import pool_size
from pipeline.decode.tree import rank_nodes, tree_from_nodes
from pipeline.decode.verify import crop_cache, target_forward, trees_attention_mask


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
        lo, hi = pool_size(j - 1, W), pool_size(j, W)                 # level j's nodes in pool order
        tok = pool.tokens[:, lo:hi]
        par = pool.parents[:, lo:hi]
        par_ok = torch.ones_like(tok, dtype=torch.bool) if j == 1 else torch.gather(on_path, 1, par.clamp(min=0))
        ok = (tok == cont[:, j - 1 : j]) & par_ok & (cont[:, j - 1 : j] >= 0)
        on_path[:, lo:hi] = ok
        has = ok.any(1)
        path_idx[has, j - 1] = lo + ok[has].float().argmax(1)
    # rank of depth j's on-path node in the stable order of each pool prefix [:n_D]: the nodes with a
    # strictly better score, plus those with an equal score at a lower index. The pool is depth-major,
    # so count level by level and take the cumulative sum over levels (one pass, not one per (D, j)).
    scores = pool.scores                                                 # [B, N]
    si = torch.gather(scores, 1, path_idx.clamp(min=0))                  # [B, Dmax] on-path scores
    ar = torch.arange(N)
    better = (scores[:, None, :] > si[:, :, None]) | (
        (scores[:, None, :] == si[:, :, None]) & (ar[None, None, :] < path_idx[:, :, None]))   # [B, Dmax(j), N]
    ends = [pool_size(k, W) for k in range(1, max_depth + 1)]           # n_D for D = 1..Dmax
    per_level = torch.stack([better[:, :, lo:hi].sum(-1) for lo, hi in zip([0] + ends[:-1], ends)], -1)
    rank = per_level.cumsum(-1)                                          # [B, j, D] rank in pool[:n_D]
    depth = torch.arange(1, max_depth + 1)
    sel = ((path_idx >= 0)[:, :, None, None] & (depth[:, None] <= depth[None, :])[None, :, :, None]
           & (rank[..., None] <= grid - 2))                              # [B, j, D, n_grid] node j selected
    # the selection is connected, so L is the deepest selected on-path node
    return (sel * depth.to(torch.uint8)[None, :, None, None]).amax(1)    # [B, D, n_grid] uint8


DIST_ROWS = 512   # tree nodes of several roots verified in one forward (bounds the [rows, vocab] logits)


@torch.inference_mode()
def acceptance_dists(model, cache, pool, bs: list[int], root_tokens: list[int], ns: list[int], max_depth: int,
                     verify_size: int, temperature: float) -> list[np.ndarray]:
    """P(L = l) for the trees (D, W, verify_size), D = 1..max_depth, of roots bs of the pool (all of one
    sequence): one [max_depth, max_depth + 1] array per root.

    Per root, the union of those trees is verified on the teacher-forced cache (prefix < n), the
    unions of several roots side by side in one target forward (block-diagonal tree masks, each
    block seeing its own prefix < n_b), up to DIST_ROWS nodes per forward.
    Under EAGLE's sampling rule the emitted token is distributed as p_target and the path goes on
    exactly when it is a drafted child, so reaching node i has probability prod_{k on path} p(tok_k | parent)
    and P(L >= j) = sum over selected depth-j nodes of that product.
    """
    W = pool.width
    N = cache.get_seq_length()                                          # the whole teacher-forced sequence
    trees, sels = [], []
    for b, root_token in zip(bs, root_tokens):
        order = rank_nodes(pool.scores[b : b + 1])[0]
        sel = [order[order < pool_size(D, W)][: max(0, verify_size - 1)] for D in range(1, max_depth + 1)]
        trees.append(tree_from_nodes(pool, b, root_token, torch.unique(torch.cat(sel))))
        sels.append(sel)
    out, i0 = [], 0
    while i0 < len(trees):                                              # chunks of roots, <= DIST_ROWS nodes
        i1 = i0 + 1
        while i1 < len(trees) and sum(t.size for t in trees[i0 : i1 + 1]) <= DIST_ROWS:
            i1 += 1
        chunk, sizes = trees[i0:i1], [t.size for t in trees[i0:i1]]
        mask = trees_attention_mask(chunk, N, next(model.parameters()).dtype, ns[i0:i1])   # [1, 1, Q, N + Q]
        tokens = torch.cat([t.tokens for t in chunk])
        pos = torch.cat([n + t.depths for t, n in zip(chunk, ns[i0:i1])])
        logits, _ = target_forward(model, tokens[None], pos[None], cache, mask, hidden_states=False)
        crop_cache(cache, N)
        for t, sel, lg in zip(chunk, sels[i0:i1], logits.split(sizes)):
            out.append(_dist_of_tree(t, sel, lg, max_depth, temperature))
        i0 = i1
    return out


def _dist_of_tree(tree, sel, logits: torch.Tensor, max_depth: int, temperature: float) -> np.ndarray:
    """[max_depth, max_depth + 1] P(L = l) of the trees sel[D-1] (pool indices) inside a verified union
    tree; logits: [V_u, vocab] of its nodes."""
    probs = torch.softmax(logits / temperature, dim=-1)                 # [V_u, vocab]
    q = probs[tree.parents.clamp(min=0), tree.tokens].double().cpu()    # [V_u] p(tok_i | parent)
    parents, depths, pool_index = tree.parents.cpu(), tree.depths.cpu(), tree.pool_index.cpu()
    reach = torch.ones(tree.size, dtype=torch.float64)                  # [V_u] P(the path reaches node i)
    for d in range(1, int(depths.max()) + 1):                           # parents precede children by depth
        rows = (depths == d).nonzero().flatten()
        reach[rows] = reach[parents[rows]] * q[rows]
    pos_of = torch.full((int(pool_index.max()) + 2,), -1, dtype=torch.long)
    pos_of[pool_index + 1] = torch.arange(tree.size)                    # pool index -> tree row (root: -1 -> 0)
    out = np.zeros((max_depth, max_depth + 1), np.float32)
    for D in range(1, max_depth + 1):
        rows = pos_of[sel[D - 1].cpu() + 1]
        ge = torch.zeros(max_depth + 2, dtype=torch.float64)            # ge[j] = P(L >= j)
        ge[0] = 1.0
        ge.index_add_(0, depths[rows], reach[rows])
        out[D - 1] = np.clip((ge[: max_depth + 1] - ge[1 : max_depth + 2]).numpy(), 0.0, 1.0)
    return out
