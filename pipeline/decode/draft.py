"""Drafting with an EAGLE-3 head: batched tree expansion over the head's KV cache.

Sequence convention (that of SafeAILab/EAGLE's EAGLE-3 code): the head's entry t pairs the target feature f_t (three
fused target layers) with token x_{t+1}, at position t. Its output predicts x_{t+2}. The head keeps
a KV cache of these entries for the accepted prefix across cycles; the entries of tree levels are
temporary and dropped after each cycle.

A tree node at depth j below the root x_n is fed as (g_parent, token) at position n-1+j, where
g_parent is the head's output state (g'' before `norm` in EAGLE-3, norm(g'') in EAGLE-3.1:
pipeline/models/head_model.py) at the row that proposed it: exactly the position a
sequential decode would give it if the path were accepted.
"""
from __future__ import annotations

from typing import Callable

import torch

from pipeline.models.head import Eagle3Head
from pipeline.models.head_model import KVBuffer
from pipeline.decode.tree import DraftPool, DraftStep, expand_level, level_stats


def additive(mask_bool: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool mask (True = may attend) -> additive float mask (0 / -inf)."""
    out = torch.zeros(mask_bool.shape, dtype=dtype, device=mask_bool.device)
    return out.masked_fill_(~mask_bool, float("-inf"))


@torch.inference_mode()
def expand_tree(head: Eagle3Head, prefix_kv: tuple[torch.Tensor, torch.Tensor], prefix_mask: torch.Tensor,
                root_hidden: torch.Tensor, root_logits: torch.Tensor, root_pos: torch.Tensor, width: int,
                max_depth: int, context_len: list[int] | None = None,
                should_continue: Callable[[DraftStep], bool] | None = None) -> DraftPool:
    """Grow draft trees for B roots at once.

    prefix_kv: head KV of the prefix entries ([1 or B, n_kv, S, d]); prefix_mask: [B, S] bool, the
    prefix entries each root may see; root_hidden: [B, H] head output at each root's entry (the
    forward that read the root); root_logits: [B, draft_vocab] its logits (forward 1);
    root_pos: [B] position of each root's entry (depth-j nodes sit at root_pos + j).
    should_continue is asked after each forward (batch 1 only); returning False stops drafting.
    """
    B, dev = root_hidden.shape[0], root_hidden.device
    W = min(width, root_logits.shape[-1])                               # top_k cannot exceed the draft vocab
    scores, ids, root_entropy = level_stats(root_logits, W)              # [B, W] depth-1 nodes, [B]
    tokens = [head.draft_to_target(ids)]
    all_scores, parents, depths = [scores], [torch.full((B, W), -1, device=dev)], [torch.ones(B, W, dtype=torch.long, device=dev)]
    steps = [dict(beam_scores=scores, candidate_scores=scores, entropy=root_entropy[:, None])]
    pool_idx = torch.arange(W, device=dev).expand(B, W)                 # pool index of each beam
    beam_tokens, beam_scores = tokens[0], scores
    beam_hidden = root_hidden[:, None, :].expand(B, W, root_hidden.shape[-1])  # [B, W, H]
    anc = torch.zeros(B, W, 0, dtype=torch.bool, device=dev)             # [B, W, T] ancestors of each beam
    eye = torch.eye(W, dtype=torch.bool, device=dev)
    kv = None                                                            # KVBuffer, made at the first level
    n_pool = W

    def _ask(depth: int) -> bool:
        if should_continue is None:
            return True
        s = steps[-1]
        return bool(should_continue(DraftStep(depth=depth, width=W, beam_scores=s["beam_scores"][0],
                                              candidate_scores=s["candidate_scores"][0], entropy=s["entropy"][0],
                                              context_len=(context_len or [0])[0])))

    for depth in range(2, max_depth + 1):
        if not _ask(depth - 1):
            break
        if kv is None:  # [B, n_kv, S + (max_depth-1)W, d]: the prefix copied in once, then each level's W entries
            kv = KVBuffer(prefix_kv, B, (max_depth - 1) * W)
        # forward the W beams of depth-1: each sees its root's prefix, its tree ancestors and itself
        allowed = torch.cat([prefix_mask[:, None, :].expand(B, W, -1), anc, eye.expand(B, W, W)], dim=-1)  # [B, W, S+T+W]
        pos = (root_pos[:, None] + depth - 1).expand(B, W)                # [B, W]
        g, logits, _ = head(beam_tokens, beam_hidden, pos, past_kv=kv,
                            attn_mask=additive(allowed, beam_hidden.dtype)[:, None])
        top_logp, top_ids, child_entropy = level_stats(logits, W)        # [B, W, W] x2, [B, W]
        cand_ids, cand_scores, cand_parent, nxt = expand_level(beam_scores, top_logp, top_ids)
        tokens.append(head.draft_to_target(cand_ids))
        all_scores.append(cand_scores)
        parents.append(torch.gather(pool_idx, 1, cand_parent))
        depths.append(torch.full_like(cand_ids, depth))
        steps.append(dict(beam_scores=torch.gather(cand_scores, 1, nxt), candidate_scores=cand_scores,
                          entropy=child_entropy))
        # next beams: the best W candidates; a beam's hidden is its parent's output row
        par_beam = torch.gather(cand_parent, 1, nxt)                      # [B, W]
        beam_tokens = torch.gather(tokens[-1], 1, nxt)
        beam_scores = torch.gather(cand_scores, 1, nxt)
        beam_hidden = torch.gather(g, 1, par_beam[..., None].expand(B, W, g.shape[-1]))
        anc_par = torch.gather(anc, 1, par_beam[..., None].expand(B, W, anc.shape[-1]))
        anc = torch.cat([anc_par, eye[par_beam]], dim=-1)                 # parent's ancestors + parent's entry
        pool_idx = n_pool + nxt
        n_pool += W * W
    return DraftPool(torch.cat(tokens, 1), torch.cat(all_scores, 1), torch.cat(parents, 1),
                     torch.cat(depths, 1), W, steps)
