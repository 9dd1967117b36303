"""Per-request budgets (choosers.base.RowShapes), the switching price (load.SwitchPrice) and today's
engines' own adaptive rules as step choosers, each against a hand-computed trace."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import DataError
from simulator.serving import metrics
from simulator.serving import shapes as S
from simulator.serving.choosers.base import Chooser, RowShapes, StaticChooser
from simulator.serving.load import SwitchPrice, serve
from simulator.serving.replay import ShapeTable
from tests.simulator.serving.conftest import lat, logs, root  # noqa: F401 (pytest fixtures)

CHAINS = [S.OFF, S.chain(1), S.chain(2), S.chain(3)]


class _Rows(Chooser):
    """Drafts chain(draft) and gives row r chain(k[r % len(k)]) (0: off), recording what it saw."""
    name = "rows"

    def __init__(self, draft, k):
        self.draft, self.k, self.seen = draft, k, []

    def choose(self, view):
        k = [self.k[r % len(self.k)] for r in range(view.batch)]
        self.seen.append((view.rows.copy(), view.context_len.copy(), k))
        return RowShapes(self.table.index(S.chain(self.draft) if self.draft else S.OFF),
                         np.array([self.table.index(S.chain(x) if x else S.OFF) for x in k]))


def test_row_shapes_equal_to_the_drafted_shape_replay_the_static_step(logs, lat):
    table = ShapeTable(logs, CHAINS)
    arrivals = np.zeros(8)
    a = serve(logs, lat, table, StaticChooser(S.chain(2)), arrivals, 4)
    b = serve(logs, lat, table, _Rows(2, [2]), arrivals, 4)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.step_emitted, b.step_emitted)
    assert np.allclose(a.step_time, b.step_time, rtol=1e-9) and np.array_equal(a.step_drafted, b.step_drafted)


def test_row_shapes_each_row_takes_its_own_acceptance_and_the_verify_is_priced_by_its_tokens(logs, lat):
    table = ShapeTable(logs, CHAINS)
    ch = _Rows(3, [1, 0, 3])
    res = serve(logs, lat, table, ch, np.zeros(3), 3, trace=True, max_steps=10_000)
    rows, ctx, k = ch.seen[0]
    L = [int(logs.w[1].acceptance[r, x - 1, logs.grid_index(np.array([x + 1]))[0]]) if x else 0 for r, x in zip(rows, k)]
    assert res.row_trace["accepted"][:3].tolist() == L
    c = lat.step_context(ctx)
    want = 3 * lat.t_draft(1, c, batch=3) + lat.t_verify((2 + 1 + 4) / 3, c, batch=3) + lat.t_overhead(c, batch=3)
    assert res.step_time[0] == pytest.approx(float(want), rel=1e-9)
    assert res.step_drafted[0] == 1 + 0 + 3 and res.step_shape[0] == table.index(S.chain(3))
    with pytest.raises(DataError, match="not a prefix of the drafted chain:2"):
        serve(logs, lat, table, _Rows(2, [3]), np.zeros(2), 2)


class _Alternate(Chooser):
    name = "alternate"

    def choose(self, view):
        self.n = getattr(self, "n", -1) + 1
        return self.table.index(S.OFF if self.n % 2 else S.chain(2))


def test_switch_price_charges_each_change_and_off_steps(logs, lat):
    table = ShapeTable(logs, CHAINS)
    free = serve(logs, lat, table, _Alternate(), np.zeros(1), 1)
    priced = serve(logs, lat, table, _Alternate(), np.zeros(1), 1, price=SwitchPrice(switch_s=0.01, off_factor=1.1))
    off = free.step_shape == table.index(S.OFF)
    n_switch = int((np.diff(free.step_shape) != 0).sum())
    assert n_switch == len(free.step_shape) - 1 > 2 and np.array_equal(free.tokens, priced.tokens)
    want = free.step_time * np.where(off, 1.1, 1.0) + np.r_[0.0, np.full(n_switch, 0.01)]
    assert np.allclose(priced.step_time, want, rtol=1e-12)
    m = metrics.summarize(priced)
    assert m["switches"] == n_switch and m["switches_per_s"] == pytest.approx(n_switch / priced.step_time.sum())
    assert metrics.summarize(serve(logs, lat, table, StaticChooser(S.chain(2)), np.zeros(1), 1))["switches"] == 0
    with pytest.raises(DataError, match="off factor"):
        SwitchPrice(off_factor=0)


def test_allocate_keeps_the_best_slots_as_row_prefixes_by_hand():
    """Two rows, K = 2: p = [[.9, .5], [.6, .1]]; step costs 1, 1.1, 1.2, 1.5, 3 s for N = 0..4 kept
    drafts. Rates (B + best N) / t: 2/1, 2.9/1.1 = 2.636, 3.5/1.2 = 2.917, 4/1.5 = 2.667, 4.1/3: N = 2,
    the slots (0, 1) and (1, 1): one draft each."""
    from simulator.serving.choosers.row_budget import allocate

    p = np.array([[0.9, 0.5], [0.6, 0.1]])
    t = lambda N: np.array([1.0, 1.1, 1.2, 1.5, 3.0])[N]
    assert allocate(p, t).tolist() == [1, 1]
    assert allocate(p, lambda N: 1.0 + 0.01 * N).tolist() == [2, 2]              # cheap verify: keep all
    assert allocate(p, lambda N: 1.0 + 10.0 * N).tolist() == [0, 0]              # dear verify: keep none
    assert allocate(np.array([[0.5, 0.5]]), lambda N: np.array([1.0, 1.2, 1.3])[N]).tolist() == [2]


def test_acceptance_model_fits_reproducibly_saves_and_a_learned_budget_is_lossless_in_tokens(logs, lat, tmp_path):
    from simulator.serving.choosers.row_budget import AcceptanceModel, CalibratedBudget, chain_acceptance, chain_features

    a, b = AcceptanceModel.fit(logs, 3, seed=1), AcceptanceModel.fit(logs, 3, seed=1)
    assert a.weights == b.weights and a.bias == b.bias and a.train["examples"] > 50
    rows = np.arange(logs.n_positions)
    p = a.p(chain_features(logs, rows, 3))
    assert (np.diff(p, axis=1) <= 1e-12).all() and ((p > 0) & (p < 1)).all()
    assert p[:, 0].mean() == pytest.approx((chain_acceptance(logs, rows, 3) >= 1).mean(), abs=0.05)    # calibrated at depth 1
    m = AcceptanceModel.load(a.save(tmp_path / "acc.json"))
    assert m == a
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DataError, match="not an acceptance model"):
        AcceptanceModel.load(tmp_path / "bad.json")
    ch = CalibratedBudget(a)
    table = ShapeTable(logs, ch.shapes())
    res = serve(logs, lat, table, ch, np.zeros(12), 4, trace=True)
    assert (res.tokens == logs.new_tokens[res.seq] - 1).all()                   # every request emits its text
    assert (res.row_trace["accepted"] <= 3).all() and res.step_drafted.sum() > 0
