"""Requests arriving over time at the batched engine (pipeline/decode/batch/engine.py, `arrivals=`):
rows join only once arrived, the batch grows (new slots) and shrinks with the traffic, idle waits
are skipped on the call's clock, and every row is still its own batch-1 AR output in fp32."""
from __future__ import annotations

import itertools

import pytest

from pipeline.decode.controller import ScriptedController, StaticController, StepShape
from pipeline.errors import DraftGymError
from tests.pipeline.decode.conftest import MIXED


class TickClock:
    """A clock that advances one 'second' per reading: arrivals land mid-run at known readings."""

    def __init__(self):
        self.t = itertools.count()

    def __call__(self) -> float:
        return float(next(self.t))

    mark = __call__                         # a step's phase marks are readings too (as DeviceClock's on a CPU)

    @staticmethod
    def seconds(a: float, b: float) -> float:
        return b - a


@pytest.fixture
def ticking(tiny, monkeypatch):
    eng, beng, prompts, ar = tiny
    monkeypatch.setattr(beng, "clock", TickClock())
    return beng, prompts, ar


def test_batch_grows_and_shrinks_with_arrivals_and_stays_lossless(ticking):
    """Two requests at 0, the rest arriving while they decode: the batch grows to batch_size through
    new slots, shrinks as the queue runs dry, and every row equals its batch-1 AR output."""
    beng, prompts, ar = ticking
    arrivals = [0, 0, 40, 45, 50, 60, 400, 410, 420, 430]
    res = beng.generate(prompts, 20, batch_size=4, controller=ScriptedController(MIXED), arrivals=arrivals)
    for r, a in zip(res, ar):
        assert r.output_ids == a.output_ids and r.stop_reason == a.stop_reason, r.index
    sizes = [s.batch_size for s in res.steps]
    assert max(sizes) == 4 and sizes[0] <= 2
    assert any(b > a for a, b in zip(sizes, sizes[1:])), "the batch never grew"
    assert any(b < a for a, b in zip(sizes, sizes[1:])), "the batch never shrank"
    for r in res:
        assert r.arrival_s == arrivals[r.index] and r.join_s >= r.arrival_s and r.finish_s >= r.join_s
    assert all(s.queued >= 0 for s in res.steps)


def test_idle_wait_is_skipped(ticking):
    """A request arriving long after the first finished: the call's clock jumps to its arrival
    (idle_s), it joins at once, and the wall time does not hold the wait."""
    beng, prompts, ar = ticking
    res = beng.generate_ar(prompts[:3], 20, batch_size=4, arrivals=[0, 0, 10_000])
    assert res.idle_s > 9_000 and res.wall_s < 1_000
    late = res.rows[2]
    assert late.join_s == pytest.approx(10_000, abs=5) and late.output_ids == ar[2].output_ids
    assert max(s.batch_size for s in res.steps if s.rows == [2]) == 1


def test_all_arriving_at_zero_is_the_closed_batch(tiny):
    """arrivals all 0 = no arrivals: the same rows, the same steps."""
    _, beng, prompts, _ = tiny
    ctl = lambda: StaticController(StepShape(3, 4, 10))
    a = beng.generate(prompts, 16, batch_size=3, controller=ctl())
    b = beng.generate(prompts, 16, batch_size=3, controller=ctl(), arrivals=[0.0] * len(prompts))
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert [(s.batch_size, s.rows, s.accepted) for s in a.steps] == [(s.batch_size, s.rows, s.accepted) for s in b.steps]


def test_bad_arrivals(tiny):
    _, beng, prompts, _ = tiny
    with pytest.raises(DraftGymError, match="non-decreasing"):
        beng.generate_ar(prompts[:3], 4, arrivals=[0, 2, 1])
    with pytest.raises(DraftGymError, match="2 arrival times for 3 prompts"):
        beng.generate_ar(prompts[:3], 4, arrivals=[0, 1])
    with pytest.raises(DraftGymError, match=">= 0"):
        beng.generate_ar(prompts[:2], 4, arrivals=[-1, 0])
