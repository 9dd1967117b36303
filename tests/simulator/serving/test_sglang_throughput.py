"""SGLang's throughput-aware rule as a step chooser (simulator/serving/choosers/sglang_throughput.py): a trace
computed by hand (rates, the decision every update_interval once warmed, the move down clearing the
windows, geometric extrapolation, the ceiling cost lookup, the tiers), its config checks, and a run
in the load replay."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.decode import step_shape
from pipeline.errors import DataError, DraftGymError
from simulator.serving import arrivals as arr
from simulator.serving.choosers.base import StepView
from simulator.serving.choosers.sglang_throughput import PositionRates, SGLangThroughput, parse_tiers
from simulator.serving.load import serve
from simulator.serving.replay import ShapeTable
from tests.simulator.serving.conftest import root, logs, lat  # noqa: F401 (pytest fixtures)


class CostTable:
    """index(chain K) = K; a step of chain K costs (10 + 5 K) ms at B <= 4, twice that above."""

    def index(self, shape):
        return step_shape.chain_k(shape)

    def step_time(self, latency, a, batch, context_len):
        return np.array([(10 + 5 * a[0]) / 1e3 * (1 if batch <= 4 else 2)])


def view(b):
    return StepView(batch=b, rows=np.zeros(b, np.int64), context_len=np.full(b, 100), left=np.full(b, 50),
                    requests=np.arange(b), time=0.0, queued=0)


def test_a_trace_by_hand():
    cfg = {"window_size": 2, "update_interval": 2, "1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [1]}}
    ch = SGLangThroughput(cfg, initial_steps=3, cost_batch_sizes=(1, 4, 16))
    ch.reset(CostTable(), object())                        # the cost table reads no latency model here
    chosen = []
    for L in ([3, 1], [0, 2], [1, 1], [0, 1]):
        if len(chosen) == 2:                 # what step 3 decides on: E(1) = 1.75 / 15 ms, E(3) = 2.5 / 25 ms
            assert ch.scores(2) == [(1, pytest.approx(1.75 / 15)), (3, pytest.approx(2.5 / 25))]
        chosen.append(ch.choose(view(2)))
        ch.observe(view(2), chosen[-1], np.array(L))
    # steps 1-2 keep the initial 3 (no decision before batch 2); step 3 moves down to 1 and clears
    # positions 1, 2; step 4 is no decision point (batch 3)
    assert chosen == [3, 3, 1, 1]
    assert not ch.rates.w[1] and not ch.rates.w[2] and list(ch.rates.w[0]) == [1.0, 0.5]
    # step 5: p_0 = 0.75 known, p_1 = p_2 = 0.75 extrapolated: E(3) = 3.25 / 25 ms beats 1.75 / 15 ms
    assert ch.rates.expected_tokens(3) == pytest.approx(3.25)
    assert ch.choose(view(2)) == 3
    assert ch.tier(9) == [1] and ch.cost_ms(9, 1) == pytest.approx(30.0)      # B 9 -> profiled 16: twice


def test_extrapolation_and_cold_start():
    r = PositionRates(4, 3)
    assert r.expected_tokens(2) is None                                # no data: no score
    for L in ([4, 2, 0], [2, 2, 1], [1, 0, 3]):
        r.update(L, 2)
    p0, p1 = np.mean([2 / 3, 1.0, 2 / 3]), np.mean([2 / 3, 2 / 3, 1 / 3])
    alpha = p1 / p0                                                    # (p_1 / p_0)^(1 / 1)
    p2 = min(p1, p1 * alpha)
    p3 = min(p2, p2 * (p2 / p0) ** 0.5)                                # alpha over the three rates so far
    assert r.expected_tokens(4) == pytest.approx(1 + p0 + p1 + p2 + p3)
    assert r.warmed(2) and not r.warmed(3)


def test_config_checks_and_defaults():
    with pytest.raises(DraftGymError, match="latency profile"):
        SGLangThroughput().reset(CostTable(), None)
    ch = SGLangThroughput()
    assert ch.tiers == {1: [1, 3, 5, 7], 8: [1, 3, 5], 32: [1, 3], 128: [1]} and (ch.window, ch.interval) == (20, 10)
    assert SGLangThroughput(initial_steps=2).initial == 5               # not a candidate: the lowest tier's middle
    assert SGLangThroughput(cuda_graph_bs=[1, 2, 4, 16]).tier(5) == [1, 3, 5]      # 5 pads to 16
    for bad in ({"strategy": "throughput_aware"}, {"1": {"candidate_steps": [0]}}, {"1": {"candidate_steps": []}}):
        with pytest.raises(DataError, match="throughput-aware config"):
            parse_tiers(bad)


def test_it_runs_in_the_load_replay(logs, lat):
    ch = SGLangThroughput({"window_size": 3, "update_interval": 2, "1": {"candidate_steps": [1, 2, 3]}})
    table = ShapeTable(logs, list(dict.fromkeys([step_shape.OFF, *ch.shapes()])))
    res = serve(logs, lat, table, ch, arr.poisson(20.0, 20, seed=0), max_batch=8)
    used = {table.shapes[a] for a in res.step_shape}
    assert used <= set(ch.shapes()) and len(used) > 1                 # it moved
    assert res.tokens.sum() == (logs.new_tokens - 1)[res.seq].sum()


def test_on_the_device_it_prices_with_the_same_profile(logs, lat):
    """The device's table (online/adapters/chooser.ShapeIndex) prices a chain as the replay's ShapeTable
    does, so the rule's cost table is the same on both sides; without a profile it refuses in one line."""
    from online.adapters.chooser import ChooserController, ShapeIndex

    ch = SGLangThroughput()
    dev, rep = ShapeIndex(ch.shapes()), ShapeTable(logs, ch.shapes())
    for k in (1, 3, 7):
        for b in (1, 3, 8):
            a = [dev.index(step_shape.chain(k))]
            assert float(dev.step_time(lat, a, b, [2048.0])[0]) == pytest.approx(
                float(rep.step_time(lat, [rep.index(step_shape.chain(k))], b, [2048.0])[0]), rel=1e-9)
    with pytest.raises(DraftGymError, match="latency profile; none was given"):
        ChooserController(SGLangThroughput(), [10]).reset()
    ctl = ChooserController(SGLangThroughput(), [10], lat)
    ctl.reset()
    assert ctl.chooser.cost_ms(3, 5) == pytest.approx(1e3 * float(rep.step_time(lat, [rep.index(step_shape.chain(5))], 4, [2048.0])[0]))
