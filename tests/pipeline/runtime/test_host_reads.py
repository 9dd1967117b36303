"""Host reads per decode step (pipeline/runtime/host_reads.py): each is a device sync on a GPU.

The counter sees every kind of read it names (so the budget test can fail), and the batched engine
stays within its budget of 2 per step at static shapes and with a schedule, at B = 1 and B = 4, for
off, chain and tree steps: one read of the accepted lengths and emitted tokens. Reads per step are
the difference between a run of 6 steps and one of 2, so the prefills (one read of the first token
each) are not counted.
"""
from __future__ import annotations

import pytest
import torch

from pipeline.decode.controller import ScheduleController, StaticController
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.step_shape import StepShape
from pipeline.models.head import random_head
from pipeline.runtime.host_reads import HostReads
from tests.conftest import make_tiny_llama


def test_the_counter_sees_each_kind_of_read():
    x = torch.arange(6)
    mask = x > 2
    with HostReads() as r:
        x[1].item(), x.tolist(), int(x[0]), float(x[1]), bool(mask.any()), x.nonzero(), x[mask], x.masked_select(mask)
        x[mask] = 0
        y = x + 1                                           # no read
        y.sum(), torch.where(mask, x, y), x[:3], x[torch.tensor([0, 2])]      # none either
    assert dict(r.by_name) == {"item": 1, "tolist": 1, "__int__": 1, "__float__": 1, "__bool__": 1, "nonzero": 1,
                               "__getitem__[bool]": 1, "masked_select": 1, "__setitem__[bool]": 1}
    assert r.total == 9


@pytest.fixture(scope="module")
def engine():
    model = make_tiny_llama(vocab=40, hidden=16, seed=3)
    return BatchEngine(model, random_head(model, seed=3))


PROMPTS = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12], [3, 4]]
CONTROLLERS = {"off": lambda: StaticController(StepShape.off()),
               "chain": lambda: StaticController(StepShape.chain(3)),
               "tree": lambda: StaticController(StepShape(4, 3, 10)),
               "schedule": lambda: ScheduleController([(1, 1, StepShape(3, 2, 6)), (2, None, StepShape.chain(2))])}


def _reads(engine, B, make, steps) -> int:
    with HostReads() as r:
        res = engine.generate(PROMPTS[:B], 64, batch_size=B, controller=make(), max_steps=steps)
    assert len(res.steps) == steps and all(len(row.output_ids) == 0 for row in res.rows)   # no row ended
    return r.total


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("kind", list(CONTROLLERS))
def test_batched_steps_read_the_host_at_most_twice(engine, B, kind):
    per_step = (_reads(engine, B, CONTROLLERS[kind], 6) - _reads(engine, B, CONTROLLERS[kind], 2)) / 4
    assert per_step <= 2, per_step
