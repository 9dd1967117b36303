"""The batched engine's step traces whole (`torch.compile(..., fullgraph=True)`): no graph breaks.

A CUDA graph can only capture code that torch.compile (or a capture by hand) sees as one graph, so
the step's pieces must stay traceable even where nobody has a GPU. Each piece below is the engine's
own function (pipeline/decode/engine/step.py), the one it hands to its CUDA graph cache (pipeline/runtime/cuda_graphs.py), compiled
with `backend="eager"` (Dynamo's trace only: no code generation, seconds on a CPU) and run against
its eager result on the same inputs:

    pending  the head over each row's pending entries (padded to M), written into its slot
    draft    expand_tree + select_trees: D - 1 head forwards over A x W beams, A trees of V nodes
    verify   target forward over A x V tree tokens on the slot KV cache, greedy acceptance and the
             commit (KV compacted, tokens and fused features stored): L and the tokens out

Shapes are static per (A, D, W, V, span): the engine passes the span as a Python int, so each bucket
is one graph. The oneDNN-packed linears of the CPU trace too (pipeline/runtime/cpu_linear.py).
"""
from __future__ import annotations

import pytest
import torch

from pipeline.decode.engine import step as batch_step
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.kv import BatchState
from pipeline.decode.step_shape import StepShape
from pipeline.models.head import random_head
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
def test_the_engines_graphed_parts_trace_whole_and_match_eager(parts):
    model, head, n, x = parts
    shape = StepShape(D, W, V)
    dl = n - torch.tensor([1, 3, 2])                                  # 1..3 pending entries per row

    def pending(st, n, dl):
        return batch_step.pending(head, st, n, dl, 4, SPAN)

    def draft(st, n, root_hidden, root_logits):
        return batch_step.draft_trees(head, st, shape, SPAN, n, root_hidden, root_logits)

    def verify(st, n, *tree):                                        # forward, acceptance, commit
        packed = batch_step.verify_greedy(model, head, st, SPAN + V, True, n, *tree)
        return packed, st.kv.k[0][:, :, : SPAN + V].clone(), st.feat.clone(), st.ids.clone()

    eager_state, graph_state = _state(model, head), _state(model, head)
    for name, fn, args in (("pending", pending, (n, dl)), ("draft", draft, (n, x["root_hidden"], x["root_logits"]))):
        want = fn(eager_state, *args)
        got = _compiled(fn)(graph_state, *args)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), name
    tree = draft(eager_state, n, x["root_hidden"], x["root_logits"])
    assert tree[0].shape == (A, V)
    want = verify(eager_state, n, *tree)
    for got, w in zip(_compiled(verify)(graph_state, n, *tree), want):
        assert torch.equal(got, w)                    # L and tokens out, the KV compacted, features, tokens stored
