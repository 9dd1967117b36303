"""The batched engine under CUDA graph semantics, on the CPU (pipeline/runtime/cuda_graphs.py).

A CUDA graph replays the kernels of one call: same shapes, same addresses, every Python decision
frozen; only the inputs copied into its buffers change, and its outputs are the same buffers each
time. `FrozenTraces` stands in for the capture on a CPU with exactly those semantics: `make_fx`
records the aten ops of the engine's own part once (the closed-over caches and stores by
reference, as a graph holds their addresses) and each replay re-runs that record on the copied
inputs, writing into the first outputs. So a part that decides something in Python from a value
that changes between steps, reads a buffer the key does not name, or returns an output the caller
keeps too long gives a different output here, as it would on the GPU. (tests/online/test_on_device.py
runs the real graphs where a GPU is there.)
"""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_leaves

from pipeline.decode.controller import ScheduleController, StaticController
from pipeline.decode.engine import step as batch_step
from pipeline.decode.engine.core import BatchEngine, pow2_at_least
from pipeline.decode.step_shape import StepShape
from pipeline.errors import DraftGymError
from pipeline.models.head import random_head
from pipeline.runtime.cuda_graphs import ENV, MODE_ENV, GraphCache, graphs_wanted
from tests.conftest import make_tiny_llama


class FrozenTraces(GraphCache):
    """GraphCache with each capture a frozen aten trace (module docstring)."""

    def __init__(self):
        super().__init__("cpu")
        self.enabled = True

    def _record(self, fn, static):
        gm = make_fx(fn)(*static)
        outputs = gm(*static)

        def replay():
            for buf, x in zip(tree_leaves(outputs), tree_leaves(gm(*static))):
                buf.copy_(x)
        return replay, outputs


# a vocabulary of 6: the random head's drafts are often right, so steps accept 0..D tokens
_g = torch.Generator().manual_seed(1)
PROMPTS = [torch.randint(0, 6, (k,), generator=_g).tolist() for k in (3, 9, 1, 17, 5)]


@pytest.fixture(scope="module")
def models():
    model = make_tiny_llama(vocab=6, hidden=16, seed=0)
    return model, random_head(model, seed=0)


def _frozen(model, head, span_bucket=16):
    eng = BatchEngine(model, head, span_bucket=span_bucket)
    eng.graphs = FrozenTraces()
    return eng


CONTROLLERS = {"tree": lambda: StaticController(StepShape(4, 3, 10)),
               "schedule": lambda: ScheduleController([(1, 2, StepShape(3, 2, 6)), (3, None, StepShape.chain(2))])}


@pytest.mark.parametrize("kind", list(CONTROLLERS))
def test_replayed_parts_give_the_eager_engines_output(models, kind):
    """Rows of different lengths, refills (5 prompts, B = 3) and rows leaving: every key's graph is
    replayed on later steps and the output is the eager engine's (exact span, no buckets)."""
    model, head = models
    want = BatchEngine(model, head).generate(PROMPTS, 12, batch_size=3, controller=CONTROLLERS[kind]())
    eng = _frozen(model, head)
    with torch.inference_mode():
        got = eng.generate(PROMPTS, 12, batch_size=3, controller=CONTROLLERS[kind]())
    assert [r.output_ids for r in got.rows] == [r.output_ids for r in want.rows]
    assert [s.accepted for s in got.steps] == [s.accepted for s in want.steps]
    assert max(max(s.accepted) for s in want.steps) >= 2                    # paths kept, M > 1 pending
    assert eng.graphs.captures >= 3 and eng.graphs.replays > 2 * eng.graphs.captures, eng.graphs.summary()


def test_ar_at_batch_b_replays_one_graph_per_shape(models):
    model, head = models
    want = BatchEngine(model, head).generate_ar(PROMPTS, 12, batch_size=4)
    eng = _frozen(model, head)
    with torch.inference_mode():
        got = eng.generate_ar(PROMPTS, 12, batch_size=4)
    assert [r.output_ids for r in got.rows] == [r.output_ids for r in want.rows]
    assert {k[0][0] for k in eng.graphs.graphs} == {"verify"}


def test_a_second_call_replays_the_first_calls_graphs(models):
    """The stores are static (reused while B and the capacity fit), so graphs outlive a call (rows
    that leave early copy the stores, and those graphs are captured anew: max_steps keeps them in)."""
    model, head = models
    eng = _frozen(model, head)
    ctrl = lambda: StaticController(StepShape(3, 2, 5))
    with torch.inference_mode():
        first = eng.generate(PROMPTS[:2], 40, batch_size=2, controller=ctrl(), max_steps=4)
        captures = eng.graphs.captures
        second = eng.generate(PROMPTS[:2], 40, batch_size=2, controller=ctrl(), max_steps=4)
    assert [r.output_ids for r in first.rows] == [r.output_ids for r in second.rows]
    assert eng.graphs.captures == captures


def test_a_broken_trace_would_be_seen(models, monkeypatch):
    """The stand-in can fail: a part that reads a per-step tensor it closed over instead of its input
    (here the pending forward reading state.dl, replaced each step) replays the first step's values."""
    model, head = models
    want = BatchEngine(model, head).generate(PROMPTS[:3], 20, batch_size=3, controller=CONTROLLERS["tree"]())
    eng = _frozen(model, head)
    monkeypatch.setattr(batch_step, "pending", lambda head, state, n, dl, M, span, f=batch_step.pending:
                        f(head, state, n, state.dl, M, span))
    try:
        with torch.inference_mode():
            got = eng.generate(PROMPTS[:3], 20, batch_size=3, controller=CONTROLLERS["tree"]())
    except IndexError:                    # the stale entry index ran off the pending block
        return
    assert [r.output_ids for r in got.rows] != [r.output_ids for r in want.rows] or \
        [s.accepted for s in got.steps] != [s.accepted for s in want.steps]


def test_graphs_are_for_cuda_and_can_be_turned_off(monkeypatch):
    assert not graphs_wanted("cpu") and not GraphCache("cpu").enabled
    assert not GraphCache("cpu", enabled=True).enabled              # no CUDA graphs on a CPU
    assert graphs_wanted("cuda")
    monkeypatch.setenv(ENV, "0")
    assert not graphs_wanted("cuda")
    monkeypatch.setenv(ENV, "maybe")
    with pytest.raises(DraftGymError, match="DRAFTGYM_CUDA_GRAPHS='maybe': expected one of 1, on"):
        graphs_wanted("cuda")
    monkeypatch.setenv(ENV, "0")
    monkeypatch.setenv(MODE_ENV, "loose")
    with pytest.raises(DraftGymError, match="DRAFTGYM_CAPTURE_MODE='loose': expected one of global"):
        GraphCache("cpu")
    monkeypatch.delenv(MODE_ENV)
    calls = []
    assert GraphCache("cpu").run(("k",), lambda x: calls.append(1) or x + 1, torch.ones(2)).tolist() == [2, 2]
    assert calls == [1]


def test_a_failed_capture_turns_graphs_off_and_says_why(models):
    class Failing(FrozenTraces):
        def _record(self, fn, static):
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
    model, head = models
    eng = BatchEngine(model, head)
    eng.graphs = Failing()
    want = BatchEngine(model, head).generate_ar(PROMPTS[:2], 8, batch_size=2)
    got = eng.generate_ar(PROMPTS[:2], 8, batch_size=2)
    assert [r.output_ids for r in got.rows] == [r.output_ids for r in want.rows]
    assert not eng.graphs.enabled
    assert eng.graphs.failure == "RuntimeError: operation not permitted when stream is capturing"


def test_buckets():
    assert [pow2_at_least(x) for x in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]
    model = make_tiny_llama(vocab=40, hidden=16, seed=3)
    eng = BatchEngine(model, None, span_bucket=128)
    assert (eng._span(1), eng._span(128), eng._span(129)) == (128, 128, 256)
    assert BatchEngine(model, None)._span(77) == 77                  # CPU default: the exact span
