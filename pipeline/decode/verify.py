"""Target-side work of a cycle: the tree-verify forward, the acceptance rules, KV compaction.

Acceptance, greedy (T = 0): from the root, move to the child whose token equals the target argmax
at the current node; stop when none does. L = number of moves; the bonus token is the target
argmax at the last accepted node. The output is the target's greedy sequence whatever the tree.

Acceptance, sampling (T > 0, EAGLE's rule with q = 1 because drafts are deterministic top-k):
at the current node with target distribution p, try each child token x in turn: accept with
probability p(x); on rejection set p(x) = 0 and renormalise. If every child is rejected (or the
node is a leaf) the bonus token is sampled from the residual p. Each emitted token is therefore
distributed exactly as the target's p: lossless.
"""
from __future__ import annotations

import torch

from pipeline.decode.tree import VerifyTree


def tree_attention_mask(tree: VerifyTree, prefix_len: int, dtype: torch.dtype,
                        visible: int | None = None) -> torch.Tensor:
    """Additive 4D mask [1, 1, V, prefix_len + V]: every node sees the prefix entries < `visible`
    (default: the whole prefix), its ancestors and itself."""
    return trees_attention_mask([tree], prefix_len, dtype, [prefix_len if visible is None else visible])


def trees_attention_mask(trees: list[VerifyTree], prefix_len: int, dtype: torch.dtype,
                         visible: list[int]) -> torch.Tensor:
    """Several trees verified side by side in one forward: additive 4D mask [1, 1, Q, prefix_len + Q],
    Q = sum of the tree sizes. Tree b's nodes see the prefix entries < visible[b], their ancestors in
    tree b and themselves (block-diagonal over the trees)."""
    Q, dev = sum(t.size for t in trees), trees[0].mask.device
    allowed = torch.zeros(Q, prefix_len + Q, dtype=torch.bool, device=dev)
    o = 0
    for t, n in zip(trees, visible):
        allowed[o : o + t.size, :n] = True                                      # its own prefix
        allowed[o : o + t.size, prefix_len + o : prefix_len + o + t.size] = t.mask   # its ancestors and itself
        o += t.size
    m = torch.zeros(allowed.shape, dtype=dtype, device=dev)
    m.masked_fill_(~allowed, torch.finfo(dtype).min)
    return m[None, None]


@torch.inference_mode()
def target_forward(model, input_ids: torch.Tensor, position_ids: torch.Tensor, cache,
                   attn_mask: torch.Tensor | None = None, hidden_states: bool = True, last_only: bool = False):
    """One target forward over a DynamicCache. input_ids, position_ids: [1, q].
    Returns (logits [q, vocab] fp32, or [1, vocab] with `last_only`; hidden_states tuple of [1, q, H] or None).

    `last_only` (every prefill: only the last position's logits pick the next token) asks the CausalLM
    for `logits_to_keep=1`, so its lm_head (and any soft-capping / logit scale after it) runs on the last
    row only: on the embedded default the [q, 576] x [576, 49152] output matmul is as long as the 30
    layers' gate and up projections together, and for an 8B target with a
    128k vocabulary the [q, vocab] fp32 logits of an 8k-token prompt alone are 4 GB."""
    out = model(input_ids=input_ids, position_ids=position_ids, cache=cache, attention_mask=attn_mask, use_cache=True,
                output_hidden_states=hidden_states, logits_to_keep=1 if last_only else 0)
    return out.logits[0].float(), (out.hidden_states if hidden_states else None)


def verify_tree(model, tree: VerifyTree, prefix_len: int, cache):
    """Run the target on the V tree nodes (positions prefix_len + depth) in one forward.
    Returns (logits [V, vocab], hidden_states). The cache grows by V entries."""
    dtype = next(model.parameters()).dtype
    pos = (prefix_len + tree.depths)[None]
    return target_forward(model, tree.tokens[None], pos, cache, tree_attention_mask(tree, prefix_len, dtype))


def accept_greedy(tree: VerifyTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Returns (accepted path as tree indices, root excluded; bonus token)."""
    argmax = logits.argmax(-1).tolist()             # [V]
    tokens, kids = tree.tokens.tolist(), tree.children()
    node, path = 0, []
    while True:
        nxt = next((c for c in kids[node] if tokens[c] == argmax[node]), None)
        if nxt is None:
            return path, argmax[node]
        path.append(nxt)
        node = nxt


def accept_sampling(tree: VerifyTree, logits: torch.Tensor, temperature: float,
                    generator: torch.Generator | None) -> tuple[list[int], int]:
    """EAGLE's lossless rule with q = 1. Children are tried in draft-score order (tree order)."""
    tokens, kids = tree.tokens.tolist(), tree.children()
    node, path = 0, []
    while True:
        p = torch.softmax(logits[node] / temperature, dim=-1)   # [vocab] target distribution
        accepted = None
        for c in kids[node]:
            x = tokens[c]
            u = torch.rand((), generator=generator, device=p.device)
            if u < p[x]:                                         # accept x with probability p(x) / q(x), q = 1
                accepted = c
                break
            p[x] = 0.0                                           # residual: (p - q)+ with q = one-hot(x)
            total = p.sum()
            if total <= 0:                                       # cannot happen in exact arithmetic
                p = torch.softmax(logits[node] / temperature, dim=-1)
                break
            p /= total
        if accepted is None:
            return path, int(torch.multinomial(p, 1, generator=generator))
        path.append(accepted)
        node = accepted


def sample_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Greedy at T = 0, otherwise one draw from softmax(logits / T). logits: [vocab]."""
    if temperature <= 0:
        return int(logits.argmax())
    return int(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator))


@torch.inference_mode()
def compact_cache(cache, prefix_len: int, keep: list[int]) -> None:
    """Keep the prefix and the tree entries `keep` (tree indices, root first), contiguous.

    Before: [prefix | V tree entries]; after: [prefix | keep...]. In place per layer."""
    idx = torch.tensor(keep, dtype=torch.long)
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)                              # [B, n_kv, prefix_len + V, d]
            src = t[..., prefix_len + idx.to(t.device), :]
            t[..., prefix_len : prefix_len + len(keep), :] = src
            setattr(layer, name, t[..., : prefix_len + len(keep), :])


def crop_cache(cache, length: int) -> None:
    """Drop every cache entry at or past `length`."""
    for layer in cache.layers:
        layer.keys = layer.keys[..., :length, :]
        layer.values = layer.values[..., :length, :]
