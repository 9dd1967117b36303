"""The batched engine's step traces whole (`torch.compile(..., fullgraph=True)`): no graph breaks.

A CUDA graph can only capture code that torch.compile (or a capture by hand) sees as one graph, so
the step's pieces must stay traceable even where nobody has a GPU. Each piece below is the engine's
own function, compiled with `backend="eager"` (Dynamo's trace only: no code generation, seconds on
a CPU) and run against its eager result on the same inputs:

    draft   expand_tree + select_trees: D - 1 head forwards over A x W beams, A trees of V nodes
    verify  verify_forward: one target forward over A x V tree tokens on the slot KV cache
    accept  accept_greedy_batch + commit_order + emitted_tokens: L, the path first, the tokens out

Shapes are static per (A, D, W, V, span): the engine passes the span as a Python int, so each bucket
is one graph. The oneDNN-packed linears of the CPU trace too (pipeline/runtime/cpu_linear.py).
"""
from __future__ import annotations

import pytest
import torch

from pipeline.decode.batch_engine import BatchEngine
from pipeline.decode.batch_kv import BatchState
from pipeline.decode.batch_verify import (TreeBatch, accept_greedy_batch, commit_order, emitted_tokens, select_trees,
                                          verify_forward)
from pipeline.decode.draft import expand_tree
from pipeline.decode.head import random_head
from pipeline.runtime.attention_backends import attention_backends
from tests.conftest import make_tiny_llama

A, S, SPAN = 3, 48, 24
D, W, V = 4, 3, 9


@pytest.fixture(scope="module")
def parts():
    torch._dynamo.reset()
    model = make_tiny_llama(vocab=50, hidden=16, seed=4)
    head = random_head(model, seed=4)
    BatchEngine(model, head)                               # packs the linears and chooses the SDPA kernels
    g = torch.Generator().manual_seed(4)
    n = torch.tensor([5, 11, 8])
    inputs = dict(root_hidden=torch.randn(A, 16, generator=g), root_logits=torch.randn(A, 50, generator=g),
                  roots=torch.randint(0, 50, (A,), generator=g))
    return model, head, n, inputs


def _state(model, head, seed=5):
    st = BatchState(model, head, A, S, True)
    g = torch.Generator().manual_seed(seed)
    for t in (*st.kv.k, *st.kv.v, st.hkv.keys, st.hkv.values):
        t.copy_(torch.randn(t.shape, generator=g))
    return st


def _compiled(fn):
    """fn traced whole, under the chosen SDPA kernels (the hooks stand aside while Dynamo traces)."""
    graph = torch.compile(fn, fullgraph=True, backend="eager")

    def run(*args, **kwargs):
        with attention_backends():
            return graph(*args, **kwargs)
    return run


@torch.inference_mode()
def test_draft_and_verify_trace_whole_and_match_eager(parts):
    model, head, n, x = parts

    def draft(st, n, root_hidden, root_logits, roots):
        prefix_mask = torch.arange(SPAN)[None, :] < n[:, None]                       # [A, span]
        pool = expand_tree(head, st.hkv.prefix(SPAN), prefix_mask, root_hidden, root_logits, n - 1, W, D)
        t = select_trees(pool, roots, V)
        return t.tokens, t.parents, t.depths, t.mask

    def verify(st, n, tokens, parents, depths, mask):
        logits, hs = verify_forward(model, TreeBatch(tokens, parents, depths, mask), n, SPAN, st.kv, True)
        return logits, hs[-1], st.kv.k[0][:, :, :SPAN].clone()

    def accept(tokens, parents, depths, mask, logits):
        t = TreeBatch(tokens, parents, depths, mask)
        accepted, bonus = accept_greedy_batch(t, logits)
        order, L = commit_order(accepted)
        return order, L, emitted_tokens(t, order, L, bonus)

    eager_state, graph_state = _state(model, head), _state(model, head)
    tree = draft(eager_state, n, **x)
    assert tree[0].shape == (A, V)
    for got, want in zip(_compiled(draft)(graph_state, n, **x), tree):
        assert torch.equal(got, want)
    ver = verify(eager_state, n, *tree)
    for got, want in zip(_compiled(verify)(graph_state, n, *tree), ver):
        assert torch.equal(got, want)                        # logits, features and the KV written
    for got, want in zip(_compiled(accept)(*tree, ver[0]), accept(*tree, ver[0])):
        assert torch.equal(got, want)
