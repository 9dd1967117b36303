"""One engine: `Engine` runs every generation on the batched engine at B = 1.

It must give what the batch-1 loop it replaced gave (tests/pipeline/decode/reference_engine.py, the oracle), cycle
for cycle in fp32 (tokens, depth, width, V, accepted, emitted, context), for static trees, chains,
V = 1, a controller that plans from the last cycle, one with level hooks (stop early, V from the
pool), EOS and sampling with seeds. That every simulator policy makes the replay's decisions on it
is tests/online/validate/test_sim_online_parity.py (its engine is this one).
"""
from __future__ import annotations

import pytest
import torch

from pipeline.decode.controller import Controller, StaticController
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.single import Engine
from pipeline.decode.step_shape import StepShape
from pipeline.errors import DraftGymError
from pipeline.models.head import random_head
from tests.conftest import make_tiny_llama
from tests.pipeline.decode.reference_engine import ReferenceEngine


def _cycles(res):
    return [(c.depth, c.width, c.verify_size, c.accepted, c.emitted, c.context_len) for c in res.cycles]


@pytest.fixture(scope="module")
def engines():
    model = make_tiny_llama(vocab=6, hidden=16, seed=0)
    head = random_head(model, seed=0)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 6, (k,), generator=g).tolist() for k in (1, 4, 11, 2, 7, 3)]
    return ReferenceEngine(model, head, {4}), Engine(model, head, {4}), prompts


class Planner(Controller):
    """Plans from the cycle index and the last record: deeper after a long acceptance."""

    def plan(self, ctx):
        if ctx.last is None:
            return StepShape(3, 2, 6)
        L = ctx.last.accepted[0]
        return StepShape(2 + min(L, 3), 1 + ctx.step % 3, 4 + L)


class Hooks(Controller):
    """Level hooks: stops when the best beam's score falls below -1.5; V from the pool's scores."""

    def __init__(self):
        super().__init__(StepShape(6, 3, 30))
        self.asks = 0

    def continue_drafting(self, step):
        self.asks += 1
        return bool(step.beam_scores.max() > -1.5)

    def verify_size(self, pool, shape):
        return 1 + int((pool.scores[0] > -2.0).sum())


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_ar_equals_the_reference(engines, temperature):
    ref, eng, prompts = engines
    for seed, p in enumerate(prompts):
        a, b = ref.generate_ar(p, 24, temperature, seed), eng.generate_ar(p, 24, temperature, seed)
        assert (b.output_ids, b.stop_reason, b.cycles) == (a.output_ids, a.stop_reason, [])
        assert b.wall_s > 0 and 0 < b.prefill_s <= b.wall_s


@pytest.mark.parametrize("make", [lambda: StaticController(8, 10, 60), lambda: StaticController(5, 1, 6),
                                  lambda: StaticController(1, 1, 1), lambda: StaticController(3, 4, 37), Planner,
                                  Hooks], ids=["tree", "chain", "v1", "tree2", "planner", "hooks"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_cycles_equal_the_reference(engines, make, temperature):
    ref, eng, prompts = engines
    asks, depths, cycles = 0, set(), 0
    for seed, p in enumerate(prompts):
        a = ref.generate(p, 30, temperature, seed, controller=make())
        ctrl = make()
        b = eng.generate(p, 30, temperature, seed, controller=ctrl)
        assert (b.output_ids, b.stop_reason) == (a.output_ids, a.stop_reason)
        assert _cycles(b) == _cycles(a)
        assert all(c.t_cycle >= c.t_draft + c.t_verify > 0 for c in b.cycles)
        asks += getattr(ctrl, "asks", 0)
        depths |= {c.depth for c in b.cycles}
        cycles += len(a.cycles)
    assert cycles >= 5
    if make is Hooks:
        assert asks > 0 and min(depths) < 6                                    # the hook stopped drafts


def test_level_hooks_refuse_more_rows(engines):
    _, eng, prompts = engines
    with pytest.raises(DraftGymError, match="level hooks runs at batch size 1"):
        BatchEngine(eng.model, eng.head).generate(prompts, 8, batch_size=2, controller=Hooks())
