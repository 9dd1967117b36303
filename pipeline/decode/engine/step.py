"""The fixed-shape parts of a batched step: what the batched engine hands to its CUDA graph cache.

Each function below computes on device tensors only: its shapes follow from its Python arguments
(A = state.rows, M, span, the step shape) and never from tensor values, it reads nothing back to
the host, and it writes only into the stores of `state` (pipeline/decode/engine/kv.py) at indices
that its tensor inputs give. So one call can be recorded as a CUDA graph and replayed on later
steps of the same shape with new inputs copied in (pipeline/runtime/cuda_graphs.py); on a CPU the
engine calls them directly. tests/pipeline/decode/engine/test_compile_step.py traces each whole (`fullgraph=True`) and
tests/pipeline/runtime/test_cuda_graphs.py replays them from frozen traces.

    pending       the head over each row's pending entries          n, dl [A] -> [A, H], [A, draft_vocab]
    draft_trees   D - 1 levels over A x W beams, A trees of V nodes   n [A], root -> tokens, parents,
                                                                      depths [A, V], mask [A, V, V]
    verify_greedy target forward over the A x V tree tokens, greedy  n [A], tree -> [A, 1 + V]: L_r,
                  acceptance, commit, the V fused features stored     then the emitted tokens

Without graphs (a CPU; T > 0) the engine runs the same pieces itself and stores only the 1 + max L_r
features the next step reads, after its host read (fusing all 60 rows of a (8, 10, 60) tree is
work a CPU would pay for nothing).
"""
from __future__ import annotations

import torch

from pipeline.decode.engine.kv import BatchState
from pipeline.decode.engine.verify import (TreeBatch, accept_greedy_batch, commit_order, emitted_tokens, root_trees,
                                          select_trees, verify_forward)
from pipeline.decode.draft import expand_tree
from pipeline.decode.step_shape import StepShape


def pending(head, state: BatchState, n: torch.Tensor, dl: torch.Tensor, M: int, span: int):
    """Row r's pending entries t in [dl_r, n_r), padded to M (the padding repeats entry n_r - 1; its
    writes land at dl_r + i >= n_r, past the row, stale): written in the row's head slot, a query at
    t sees the row's entries <= t. Returns each root's head output [A, H] (entry n_r - 1) and its
    draft logits [A, draft_vocab]."""
    dev = n.device
    t = torch.minimum(dl[:, None] + torch.arange(M, device=dev), n[:, None] - 1)          # [A, M] entry index
    ar = torch.arange(state.rows, device=dev)[:, None]
    allowed = torch.arange(span, device=dev)[None, None, :] <= t[:, :, None]               # [A, M, span]
    mask = torch.zeros(allowed.shape, dtype=head.dtype, device=dev)
    mask.masked_fill_(~allowed, torch.finfo(head.dtype).min)
    state.hkv.pos, state.hkv.span = dl, span
    g, _, _ = head(state.ids.gather(1, t + 1), state.feat[ar, t], t, past_kv=state.hkv,
                   attn_mask=mask[:, None], logits=False)                                 # [A, M, H]
    root_hidden = g[ar[:, 0], n - dl - 1]                                                  # [A, H]
    return root_hidden, head.logits_of(root_hidden)


def roots(state: BatchState, n: torch.Tensor) -> torch.Tensor:
    """Each row's root x_{n_r} (emitted, not yet in the target cache): [A]."""
    return state.ids.gather(1, n[:, None])[:, 0]


def draft_pool(head, state: BatchState, shape: StepShape, span: int, n, root_hidden, root_logits,
               context_len=None, should_continue=None):
    """D - 1 head forwards over the A x W beams (forward 1 was `pending`), each root masked to its
    own row's head entries [0, n_r): the draft pool. should_continue (batch 1, eager only): asked
    after each level, as expand_tree asks it."""
    prefix_mask = torch.arange(span, device=n.device)[None, :] < n[:, None]                # [A, span] own entries
    return expand_tree(head, state.hkv.prefix(span), prefix_mask, root_hidden, root_logits, n - 1,
                       shape.width, shape.depth, context_len=context_len, should_continue=should_continue)


def draft_trees(head, state: BatchState, shape: StepShape, span: int, n, root_hidden, root_logits):
    """The draft pool, then A trees of V nodes (pipeline/decode/engine/verify.py)."""
    pool = draft_pool(head, state, shape, span, n, root_hidden, root_logits)
    t = select_trees(pool, roots(state, n), shape.verify_size)
    return t.tokens, t.parents, t.depths, t.mask


def trees_of(state: BatchState, n: torch.Tensor, tree: tuple) -> TreeBatch:
    """The step's trees from their tensors; none given: the off step, each root alone."""
    return TreeBatch(*tree) if tree else root_trees(roots(state, n))


def verify_greedy(model, head, state: BatchState, span: int, features: bool, n: torch.Tensor, *tree):
    """Target forward over the trees on keys [0, span), greedy acceptance, commit: [A, 1 + V]."""
    trees = trees_of(state, n, tree)
    logits, hs = verify_forward(model, trees, n, span, state.kv, features)
    accepted, bonus = accept_greedy_batch(trees, logits)
    packed, order = commit(state, n, trees, accepted, bonus)
    if hs is not None:
        store_features(head, state, n, order, hs, trees.size)
    return packed


def commit(state: BatchState, n: torch.Tensor, trees: TreeBatch, accepted, bonus) -> tuple[torch.Tensor, torch.Tensor]:
    """Row r keeps its accepted path's target KV at n_r .. and its tokens x_{n+1} .. (all V written:
    past L_r + 1 they are stale, overwritten before they are read). Returns ([A, 1 + V]: L_r, then
    the emitted tokens, -1 past L_r + 1; the commit order [A, V], the accepted path first). The off
    step (V = 1) keeps its one entry where it is and emits the bonus: one write, no sort."""
    A, V, dev = state.rows, trees.size, n.device
    if V == 1:
        state.ids.scatter_(1, (n + 1)[:, None], bonus[:, None])                            # x_{n+1}
        return torch.stack([torch.zeros_like(bonus), bonus], 1), torch.zeros(A, 1, dtype=torch.long, device=dev)
    order, L = commit_order(accepted)
    emit = emitted_tokens(trees, order, L, bonus)                                         # [A, V]
    state.kv.compact(n, order)
    ar, k = torch.arange(A, device=dev)[:, None], torch.arange(V, device=dev)[None, :]
    state.ids[ar, n[:, None] + 1 + k] = emit.clamp(min=0)                                 # x_{n+1} ..
    return torch.cat([L[:, None], emit], 1), order


def store_features(head, state: BatchState, n: torch.Tensor, order: torch.Tensor, hs, K: int) -> None:
    """The fused features f_n .. f_{n+K-1} of the first K nodes in commit order (the head's pending
    entries next step): K = V in a graph (a fixed shape; past L_r + 1 they are stale), K = 1 +
    max_r L_r when the accepted lengths are already on the host (eager)."""
    A, dev = state.rows, n.device
    idx = order[:, :K]
    picked = list(hs)
    for i in set(head.layer_ids):
        picked[i] = torch.gather(hs[i], 1, idx[..., None].expand(A, K, hs[i].shape[-1]))
    ar, k = torch.arange(A, device=dev)[:, None], torch.arange(K, device=dev)[None, :]
    state.feat[ar, n[:, None] + k] = head.fuse(tuple(picked))
