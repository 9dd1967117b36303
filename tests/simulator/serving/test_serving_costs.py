"""What a load replay charges besides the steps' own shapes: the prefill of each joining request
(LatencyModel.t_prefill, load.serve) and the context a batch of mixed lengths is charged at
(LatencyModel.step_context: the longest row's for DraftGym's engine, the mean for a paged one)."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.decode import step_shape
from simulator.latency.model import LatencyModel
from simulator.latency.surface import Surface
from simulator.logs.synthetic import latency_rows as synthetic_latency
from simulator.serving import metrics
from simulator.serving.choosers.base import Chooser, StaticChooser
from simulator.serving.formats.sglang_import import latency_rows
from simulator.serving.load import serve
from simulator.serving.replay import ShapeTable
from tests.simulator.serving.conftest import root, logs, lat  # noqa: F401 (pytest fixtures)


def test_prefill_interpolates_and_grows_beyond_the_profile():
    lat = LatencyModel.from_constants()
    assert not lat.has_prefill and lat.t_prefill(500) == 0.0
    lat.prefill = Surface([0.0, 0.0], [100.0, 1000.0], [0.1, 0.5])
    assert lat.t_prefill([100, 550, 1000]) == pytest.approx([0.1, 0.3, 0.5], rel=1e-12)
    assert lat.t_prefill(2000) == pytest.approx(1.0, rel=1e-12)        # proportional past the longest, not flat
    assert lat.t_prefill(50) == pytest.approx(0.1)                     # flat below the shortest
    assert lat.scaled(2.0).t_prefill(550) == pytest.approx(0.6, rel=1e-12)


def test_step_context_max_for_slots_and_mean_for_pages():
    lat = LatencyModel.from_constants()
    c = np.array([[100.0, 1900.0, 400.0], [50.0, 60.0, 5000.0]])
    m = np.array([[True, True, True], [True, True, False]])
    assert lat.batch_context == "max"
    assert lat.step_context(c).tolist() == [1900.0, 5000.0]
    assert lat.step_context(c, m).tolist() == [1900.0, 60.0]
    lat.batch_context = "mean"
    assert lat.step_context(c, m).tolist() == pytest.approx([800.0, 55.0])
    rows = latency_rows([{"batch": 1, "shape": step_shape.OFF, "acc_length": 1.0, "step_time": 0.01},
                         {"batch": 1, "shape": step_shape.chain(1), "acc_length": 1.5, "step_time": 0.012}], "m", "bfloat16", "sg-1",
                       "bench.jsonl")[0]
    assert LatencyModel.from_rows(rows).batch_context == "mean"                 # SGLang pages its KV


class Recording(Chooser):
    def __init__(self, shape):
        self.shape, self.name, self.ctx = step_shape.canonical(shape), "rec", []

    def shapes(self):
        return [self.shape]

    def choose(self, view):
        self.ctx.append(view.context_len.copy())
        return self.table.index(self.shape)


def test_a_step_is_charged_at_the_longest_row(logs):
    """Rows of different contexts in one step: the step costs t(s, B, max_r c_r), which is more than
    at the mean (a synthetic profile measured from c = 0, growing with c)."""
    lat = LatencyModel.from_rows(synthetic_latency("m", "gpu", widths=(1, 4), contexts=(0, 64, 512), batches=(1, 2, 4)))
    table = ShapeTable(logs, [step_shape.chain(2)])
    ch = Recording(step_shape.chain(2))
    res = serve(logs, lat, table, ch, np.zeros(8), max_batch=4, prefill=False)
    mixed = [i for i, c in enumerate(ch.ctx) if len(c) > 1 and c.max() > c.mean()]
    assert mixed
    for i in mixed:
        B, c = len(ch.ctx[i]), ch.ctx[i]
        assert res.step_time[i] == pytest.approx(float(lat.t_step(2, 1, 3, c.max(), batch=B)), rel=1e-12)
        assert res.step_time[i] > float(lat.t_step(2, 1, 3, c.mean(), batch=B))


def test_joining_requests_pay_their_prefills_one_after_another(logs, lat):
    """Two requests at t = 0 and two slots: both are prefilled before the first step, the second's
    join is when its prefill starts; the steps' busy time does not include them."""
    assert lat.has_prefill
    table = ShapeTable(logs, [step_shape.OFF])
    n = logs.context_len[logs.offsets[[0, 1]]]
    pf = lat.t_prefill(n)
    res = serve(logs, lat, table, StaticChooser(step_shape.OFF), [0.0, 0.0], max_batch=2, request_seq=[0, 1])
    bare = serve(logs, lat, table, StaticChooser(step_shape.OFF), [0.0, 0.0], max_batch=2, request_seq=[0, 1], prefill=False)
    assert res.join.tolist() == pytest.approx([0.0, pf[0]]) and res.step_start[0] == pytest.approx(pf.sum())
    assert np.array_equal(res.step_time, bare.step_time)
    assert res.finish - bare.finish == pytest.approx(np.full(2, pf.sum()))
    m, mb = metrics.summarize(res), metrics.summarize(bare)
    assert m["tokens_per_s"] == mb["tokens_per_s"] and m["prefill_s"] == pytest.approx(pf.sum())
    assert mb["prefill_s"] == 0.0 and 0 < m["prefill_share"] < 1 and m["wall_tokens_per_s"] < mb["wall_tokens_per_s"]


def test_a_request_arriving_during_a_prefill_joins_at_the_same_boundary(logs, lat):
    table = ShapeTable(logs, [step_shape.OFF])
    pf0 = float(lat.t_prefill(logs.context_len[logs.offsets[0]]))
    res = serve(logs, lat, table, StaticChooser(step_shape.OFF), [0.0, 0.5 * pf0], max_batch=2, request_seq=[0, 1])
    assert res.join[1] == pytest.approx(pf0) and res.step_batch[0] == 2


def test_the_sweeps_rates_leave_room_for_the_prefills(logs, lat):
    """rates_for_logs: lambda_B T t_AR(B) / B + lambda_B t_pf = 1 (Little's law with the clock's share
    spent prefilling); without prefill rows it is the decode-only rate, and with them it is lower."""
    from simulator.serving import arrivals as arr

    tb = [1, 2, 4]
    T, c = float(np.mean(logs.new_tokens - 1)), float(np.mean(logs.context_len))
    t_pf = float(np.mean(lat.t_prefill(logs.context_len[logs.offsets[:-1]])))
    assert t_pf > 0
    lam = arr.rates_for_logs(tb, logs, lat)
    for B, r in zip(tb, lam):
        assert r * T * float(lat.t_ar(c, batch=B)) / B + r * t_pf == pytest.approx(1.0, rel=1e-12)
    bare = LatencyModel.from_rows(synthetic_latency("m", "cpu", contexts=(64, 512), batches=(1, 2, 4)))
    bare.prefill = None
    assert np.allclose(arr.rates_for_logs(tb, logs, bare), arr.rates_for_batches(tb, T, bare, c))
    assert (arr.rates_for_logs(tb, logs, lat) < arr.rates_for_batches(tb, T, lat, c)).all()
