"""Draft-tree expansion and selection (EAGLE `topK_genrate`), batched over independent roots.

Vocabulary (docs/design.md, "Vocabulary"): D = draft forwards = tree depth below the root, W = width (EAGLE top_k),
V = verify size, root included.

Expansion. Forward 1 reads the root and gives its top-W children (depth 1); their cumulative
score is their log-prob. Forward k >= 2 runs the W beams of depth k-1 at once; each beam proposes
its top-W children with score = beam score + child log-prob, and the best W of those W*W become
the next beams. Every candidate of every level enters the pool, which therefore holds
W + (D-1)*W^2 nodes, in depth-major order (a parent always precedes its children).

Selection. The verified tree is the root plus the top V-1 pool nodes by score. We break score
ties by pool index (stable sort), so a parent ranks before a child of equal score and the
selection is always a connected subtree; and the selections for increasing V are nested, which
the collection pipeline relies on to read L[D, V] for every V from one expansion.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from pipeline.decode.step_shape import pool_size


@dataclass
class DraftStep:
    """What a depth controller sees after draft forward number `depth` (1-based), for one root."""

    depth: int                   # draft forwards done so far
    width: int
    beam_scores: torch.Tensor    # [W] cumulative log-probs of the current beams (best first)
    candidate_scores: torch.Tensor  # [W*W] scores of the latest expansion ([W] after forward 1)
    entropy: torch.Tensor        # [W] entropy (nats) of each expanded beam's child distribution ([1] after forward 1)
    context_len: int             # tokens before the root


@dataclass
class DraftPool:
    """All candidates of one cycle, batched over B roots. N = W + (D-1)*W^2."""

    tokens: torch.Tensor         # [B, N] target token ids
    scores: torch.Tensor         # [B, N] cumulative draft log-probs
    parents: torch.Tensor        # [B, N] pool index of the parent, -1 = the root
    depths: torch.Tensor         # [B, N] 1..D
    width: int
    steps: list = field(default_factory=list)  # per forward: dict of beam_scores [B,W], candidate_scores, entropy

    @property
    def depth(self) -> int:
        return int(self.depths[:, -1].max()) if self.depths.numel() else 0

    def truncate_depth(self, depth: int) -> "DraftPool":
        """The pool a shallower expansion would have built (a prefix in pool order)."""
        n = pool_size(depth, self.width)
        return DraftPool(self.tokens[:, :n], self.scores[:, :n], self.parents[:, :n], self.depths[:, :n],
                         self.width, self.steps[:depth])


def rank_nodes(scores: torch.Tensor) -> torch.Tensor:
    """Pool indices in selection order: score descending, ties by index. scores: [B, N] -> [B, N]."""
    return torch.sort(-scores, dim=-1, stable=True).indices


@dataclass
class VerifyTree:
    """The tree sent to the target for one root: index 0 is the root. V = verify size."""

    tokens: torch.Tensor         # [V] target ids (root first)
    parents: torch.Tensor        # [V] tree index of the parent, -1 for the root
    depths: torch.Tensor         # [V] 0 for the root
    pool_index: torch.Tensor     # [V] pool index of each node, -1 for the root
    mask: torch.Tensor           # [V, V] bool: mask[i, j] = j is i or an ancestor of i

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                kids[p].append(i)
        return kids

    def paths(self) -> list[list[int]]:
        """EAGLE's retrieve_indices: one root-to-leaf path per leaf (tree indices)."""
        kids = self.children()
        par = self.parents.tolist()
        out = []
        for leaf in (i for i in range(self.size) if not kids[i]):
            path = [leaf]
            while par[path[-1]] >= 0:
                path.append(par[path[-1]])
            out.append(path[::-1])
        return out


def select_tree(pool: DraftPool, b: int, root_token: int, verify_size: int) -> VerifyTree:
    """Root + the top (V-1) nodes of pool row b, in pool order. V is clamped to 1 + pool size."""
    n_pool = pool.tokens.shape[1]
    k = max(0, min(verify_size - 1, n_pool))
    chosen = rank_nodes(pool.scores[b : b + 1])[0, :k]                          # [k] pool indices
    return tree_from_nodes(pool, b, root_token, chosen)


def tree_from_nodes(pool: DraftPool, b: int, root_token: int, chosen: torch.Tensor) -> VerifyTree:
    """Root + the given pool nodes of row b (a connected set: every node's parent is in it)."""
    chosen = chosen.sort().values                                               # pool order: parents first
    par_pool = pool.parents[b, chosen]                                          # [k]
    # parent's tree index: its position among `chosen` (+1 for the root); -1 (root) -> 0
    par_tree = torch.searchsorted(chosen, par_pool.clamp(min=0)) + 1
    par_tree = torch.where(par_pool < 0, torch.zeros_like(par_tree), par_tree)
    dev = pool.tokens.device
    tokens = torch.cat([torch.tensor([root_token], device=dev), pool.tokens[b, chosen]])
    parents = torch.cat([torch.tensor([-1], device=dev), par_tree])
    depths = torch.cat([torch.tensor([0], device=dev), pool.depths[b, chosen]])
    pool_index = torch.cat([torch.tensor([-1], device=dev), chosen])
    return VerifyTree(tokens, parents, depths, pool_index, tree_mask(parents, depths))


def tree_mask(parents: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """mask[i] = mask[parent(i)] OR e_i, filled depth by depth. parents, depths: [V] -> [V, V] bool."""
    V = parents.shape[0]
    mask = torch.eye(V, dtype=torch.bool, device=parents.device)
    for d in range(1, int(depths.max()) + 1 if V else 0):
        rows = (depths == d).nonzero().flatten()
        mask[rows] |= mask[parents[rows]]
    return mask


def expand_level(beam_scores: torch.Tensor, top_logp: torch.Tensor, top_ids: torch.Tensor):
    """One level of beam expansion.

    beam_scores: [B, W] cumulative log-probs of the beams; top_logp, top_ids: [B, W, W] each beam's
    top-W next-token log-probs and draft ids (`level_stats`). Returns (cand_tokens [B, W*W] draft ids,
    cand_scores [B, W*W], cand_parent_beam [B, W*W], next_beam_idx [B, W] indices into the W*W
    candidates).
    """
    B, Wb, width = top_logp.shape
    cand_scores = (beam_scores[..., None] + top_logp).reshape(B, Wb * width)
    cand_tokens = top_ids.reshape(B, Wb * width)
    cand_parent = torch.arange(Wb, device=beam_scores.device).repeat_interleave(width).expand(B, -1)
    next_idx = rank_nodes(cand_scores)[:, :width]                      # best W of W*W
    return cand_tokens, cand_scores, cand_parent, next_idx


STATS_ROWS = 16   # rows of [rows, vocab] per chunk in level_stats: 16 x 8192 fp32 = 512 KB, within L2


def level_stats(logits: torch.Tensor, k: int, rows: int = STATS_ROWS):
    """What one draft forward's logits are used for: per row, the top-k log-probs and ids, and the
    entropy in nats of the row's distribution.

        logp = log_softmax32(logits)            # [..., Vd] fp32
        top_logp, top_ids = logp.topk(k)        # [..., k]
        entropy = -(exp(logp) * logp).sum(-1)   # [...]

    logits: [..., Vd] in any float dtype. The numbers are bit for bit those of the three lines above
    (tests/pipeline/models/test_dtype.py), which every op here computes row by row; the work runs `rows` rows at a
    time into buffers made once, so the [rows x Vd] fp32 log-probs and their products are never
    materialised whole. Why: in collection a level has 64 roots x 10 beams = 640 rows of 8,192,
    and allocating three fresh 21 MB fp32 tensors per level (page faults, cache misses) cost more
    than the arithmetic: bf16 [64, 10, 8192] on the 2-core Xeon, 18.2 -> 7.5-8.4 ms per level.
    On other devices the rows go in one chunk (same numbers; chunking is a CPU cache measure).
    """
    lead, Vd = logits.shape[:-1], logits.shape[-1]
    x = logits.reshape(-1, Vd)                                         # [R, Vd]
    R, dev = x.shape[0], x.device
    if dev.type != "cpu":       # on a GPU the chunks would only add kernel launches: all rows at once
        rows = max(R, 1)
    top_logp = torch.empty(R, k, device=dev)                           # [R, k] fp32
    top_ids = torch.empty(R, k, dtype=torch.long, device=dev)          # [R, k]
    ent = torch.empty(R, device=dev)                                   # [R]
    buf = torch.empty(min(rows, R), Vd, device=dev)                    # [rows, Vd] fp32 scratch
    for i in range(0, R, rows):
        j = min(R, i + rows)
        logp = log_softmax32(x[i:j])                                   # [n, Vd]
        torch.topk(logp, k, dim=-1, out=(top_logp[i:j], top_ids[i:j]))
        plogp = torch.exp(logp, out=buf[: j - i]).mul_(logp)           # p log p
        torch.sum(plogp, dim=-1, out=ent[i:j])
    return top_logp.view(*lead, k), top_ids.view(*lead, k), ent.neg_().view(lead)


def log_softmax32(logits: torch.Tensor) -> torch.Tensor:
    """fp32 log-probs of (bf16 / fp16 / fp32) logits. `dtype=` casts inside the kernel: the same
    numbers as log_softmax(logits.float()) (checked bit for bit in bf16 and fp32), without
    materialising the fp32 copy of [rows, vocab] first (bf16, 640 x 8192: 2.79 -> 2.37 ms)."""
    return F.log_softmax(logits, dim=-1, dtype=torch.float32)
