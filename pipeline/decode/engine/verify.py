"""The verify half of a batched step: B trees of V tokens each, one target forward, acceptance per row.

Every row verifies the same number V of tokens (one shape per step), so the trees are tensors
[B, V] with no padding. Each is selected as `pipeline.decode.tree.select_tree` selects it for one
root (root + the top V-1 pool nodes by score, ties by pool index, in pool order), so a row's tree
at batch B is its tree at batch 1.

Verify: row r's V tokens sit at positions n_r + depth and are written at cache indices
n_r .. n_r + V - 1 of its slot; node i of row r attends to

    j < n_r                       (its prefix)
    j = n_r + k, k anc-or-self i  (its tree)

and nothing else in the span [0, max_r n_r + V) of keys read (additive mask, finfo.min).

Acceptance, greedy (T = 0), for all rows at once. Node i is `right` when its token is the target
argmax at its parent; a node is accepted when it and all its ancestors are right:

    accepted[r, i] = not any_j (mask[r, i, j] and not right[r, j])         (root: right)

Sibling tokens are distinct (top-k of one draft distribution, mapped by an injective d2t), so at
most one child of a node is right and the accepted nodes form one path: `pipeline.decode.verify.
accept_greedy`'s path, walked with tensor ops. The bonus token is the argmax at the deepest one.
Sampling (T > 0) runs `pipeline.decode.verify.accept_sampling` row by row, each row with its own
generator: the rule draws one uniform per child tried, so no tensor op can stand in for the loop
without changing which numbers a row's generator gives, and a row's sample path is its batch-1 one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.decode.tree import DraftPool, VerifyTree, rank_nodes
from pipeline.decode.verify import accept_sampling


@dataclass
class TreeBatch:
    """B verify trees of V nodes each (index 0 = the root), in pool order: a parent precedes its children."""

    tokens: torch.Tensor        # [B, V] target ids
    parents: torch.Tensor       # [B, V] tree index of the parent, -1 for the root
    depths: torch.Tensor        # [B, V] 0 for the root
    mask: torch.Tensor          # [B, V, V] bool: mask[r, i, j] = j is i or an ancestor of i

    @property
    def size(self) -> int:
        return int(self.tokens.shape[1])

    def row(self, r: int) -> VerifyTree:
        """Row r as a batch-1 VerifyTree (views; its pool_index, which acceptance never reads, is -1)."""
        return VerifyTree(self.tokens[r], self.parents[r], self.depths[r], torch.full_like(self.parents[r], -1),
                          self.mask[r])


def root_trees(roots: torch.Tensor) -> TreeBatch:
    """The off step: every tree is its root alone. roots: [B]."""
    B, dev = roots.shape[0], roots.device
    zeros = torch.zeros(B, 1, dtype=torch.long, device=dev)
    return TreeBatch(roots[:, None], zeros - 1, zeros, torch.ones(B, 1, 1, dtype=torch.bool, device=dev))


def select_trees(pool: DraftPool, roots: torch.Tensor, verify_size: int) -> TreeBatch:
    """Row r's tree: root + the top V-1 nodes of pool row r (V clamped to 1 + pool size), in pool
    order. roots: [B] root tokens. When V-1 covers the pool (a chain with V = D + 1) nothing is ranked."""
    B, N = pool.tokens.shape
    dev, W = pool.tokens.device, pool.width
    depth = 1 + (N - W) // (W * W)                                                     # N = W + (D-1) W^2
    k = max(0, min(verify_size - 1, N))
    if k == N:
        chosen = torch.arange(N, device=dev).expand(B, N)                               # [B, k]
    else:
        chosen = rank_nodes(pool.scores)[:, :k].sort(-1).values                         # pool order
    par_pool = torch.gather(pool.parents, 1, chosen)                                    # [B, k]
    par_tree = torch.searchsorted(chosen.contiguous(), par_pool.clamp(min=0).contiguous()) + 1
    par_tree = torch.where(par_pool < 0, torch.zeros_like(par_tree), par_tree)
    tokens = torch.cat([roots[:, None], torch.gather(pool.tokens, 1, chosen)], 1)       # [B, V]
    parents = torch.cat([torch.full((B, 1), -1, device=dev, dtype=torch.long), par_tree], 1)
    depths = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev), torch.gather(pool.depths, 1, chosen)], 1)
    return TreeBatch(tokens, parents, depths, tree_masks(parents, depth))


def tree_masks(parents: torch.Tensor, depth: int) -> torch.Tensor:
    """mask[r, i] = e_i OR mask[r, parent(i)], iterated `depth` times (one level deeper each time).
    parents: [B, V] (-1 root) -> [B, V, V] bool."""
    B, V = parents.shape
    eye = torch.eye(V, dtype=torch.bool, device=parents.device).expand(B, V, V)
    par = parents.clamp(min=0)[..., None].expand(B, V, V)                               # the root reads itself
    mask = eye
    for _ in range(depth):
        mask = eye | torch.gather(mask, 1, par)
    return mask


def verify_mask(n: torch.Tensor, tree_mask: torch.Tensor, span: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [B, 1, V, span] of the module docstring. n: [B] prefix lengths. The off step
    (V = 1, the root alone) is j <= n_r, built directly (a plain AR step's mask, 3 ops)."""
    B, V, _ = tree_mask.shape
    if V == 1:
        past = torch.arange(span, device=n.device)[None, :] > n[:, None]                  # [B, span]
        return torch.zeros(B, 1, 1, span, dtype=dtype, device=n.device).masked_fill_(
            past[:, None, None, :], torch.finfo(dtype).min)
    rel = torch.arange(span, device=n.device)[None, :] - n[:, None]                     # [B, span] j - n_r
    in_tree = (rel >= 0) & (rel < V)
    tree_part = torch.gather(tree_mask, 2, rel.clamp(0, V - 1)[:, None, :].expand(B, V, span))
    allowed = (rel < 0)[:, None, :] | (in_tree[:, None, :] & tree_part)                 # [B, V, span]
    m = torch.zeros(allowed.shape, dtype=dtype, device=n.device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return m[:, None]


@torch.inference_mode()
def verify_forward(model, trees: TreeBatch, n: torch.Tensor, span: int, kv, hidden_states: bool):
    """One target forward over the B x V tree tokens, each row on its own prefix in the slot cache kv
    (written at n_r .. n_r + V - 1). Returns (logits [B, V, vocab] fp32, hidden states or None)."""
    dtype = next(model.parameters()).dtype
    kv.pos, kv.span = n, span
    out = model(input_ids=trees.tokens, position_ids=n[:, None] + trees.depths, cache=kv,
                attention_mask=verify_mask(n, trees.mask, span, dtype), use_cache=True,
                output_hidden_states=hidden_states)
    return out.logits.float(), (out.hidden_states if hidden_states else None)


def accept_greedy_batch(trees: TreeBatch, logits: torch.Tensor, caps: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance for every row (module docstring). logits: [B, V, vocab].
    Returns (accepted [B, V] bool, root True; bonus [B] target argmax at the deepest accepted node).
    The off step (V = 1) accepts its root alone: the bonus is the argmax at the root. caps [B]
    (per-request budgets): row r accepts no node deeper than caps[r], as if its tree stopped there;
    the bonus is then the target's argmax at its deepest kept node, so the output is still exact."""
    if trees.size == 1:
        return torch.ones(logits.shape[:2], dtype=torch.bool, device=logits.device), logits[:, 0].argmax(-1)
    best = logits.argmax(-1)                                                            # [B, V]
    right = trees.tokens == torch.gather(best, 1, trees.parents.clamp(min=0))
    right[:, 0] = True
    if caps is not None:
        right &= trees.depths <= caps[:, None]
    accepted = ~(trees.mask & ~right[:, None, :]).any(-1)                               # [B, V]
    last = (accepted * (trees.depths + 1)).argmax(-1)                                   # deepest accepted node
    return accepted, torch.gather(best, 1, last[:, None])[:, 0]


def accept_sampling_rows(trees: TreeBatch, logits: torch.Tensor, temperature: float,
                         generators: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE's sampling rule (q = 1) row by row, row r drawing from generators[r]. Same outputs as
    accept_greedy_batch."""
    paths, bonus = [], []
    for r, gen in enumerate(generators):
        path, b = accept_sampling(trees.row(r), logits[r], temperature, gen)
        paths.append(path)
        bonus.append(b)
    return paths_to_accepted(paths, trees.size, logits.device), torch.tensor(bonus, device=logits.device)


def paths_to_accepted(paths: list[list[int]], V: int, device) -> torch.Tensor:
    """Accepted paths (tree indices, root excluded), one per row -> accepted [B, V] bool, root True."""
    acc = torch.zeros(len(paths), V, dtype=torch.bool)
    acc[:, 0] = True
    for r, p in enumerate(paths):
        acc[r, p] = True
    return acc.to(device)


def commit_order(accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The accepted nodes first, in tree order (root, then the path by depth), then the rest.
    Returns (order [B, V], L [B] accepted draft tokens)."""
    order = torch.sort((~accepted).to(torch.uint8), dim=-1, stable=True).indices
    return order, accepted.sum(-1) - 1


def emitted_tokens(trees: TreeBatch, order: torch.Tensor, L: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """Row r emits its L_r path tokens and then its bonus: [B, V], entries past L_r are -1."""
    B, V = order.shape
    path = torch.gather(trees.tokens, 1, order)[:, 1:]                                  # [B, V-1]
    k = torch.arange(V, device=order.device)[None, :]
    out = torch.where(k < L[:, None], torch.cat([path, path.new_zeros(B, 1)], 1), -1)
    return torch.where(k == L[:, None], bonus[:, None], out)
