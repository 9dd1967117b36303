"""Per-request budgets (choosers.base.RowShapes), the switching price (load.SwitchPrice) and today's
engines' own adaptive rules as step choosers, each against a hand-computed trace."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.decode import step_shape
from pipeline.errors import DataError
from simulator.serving import metrics
from simulator.serving.choosers.base import Chooser, RowShapes, StaticChooser
from simulator.serving.load import SwitchPrice, serve
from simulator.serving.replay import ShapeTable
from tests.simulator.serving.conftest import lat, logs, root  # noqa: F401 (pytest fixtures)

CHAINS = [step_shape.OFF, step_shape.chain(1), step_shape.chain(2), step_shape.chain(3)]


class _Rows(Chooser):
    """Drafts chain(draft) and gives row r chain(k[r % len(k)]) (0: off), recording what it saw."""
    name = "rows"

    def __init__(self, draft, k):
        self.draft, self.k, self.seen = draft, k, []

    def choose(self, view):
        k = [self.k[r % len(self.k)] for r in range(view.batch)]
        self.seen.append((view.rows.copy(), view.context_len.copy(), k))
        return RowShapes(self.table.index(step_shape.chain(self.draft) if self.draft else step_shape.OFF),
                         np.array([self.table.index(step_shape.chain(x) if x else step_shape.OFF) for x in k]))


def test_row_shapes_equal_to_the_drafted_shape_replay_the_static_step(logs, lat):
    table = ShapeTable(logs, CHAINS)
    arrivals = np.zeros(8)
    a = serve(logs, lat, table, StaticChooser(step_shape.chain(2)), arrivals, 4)
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
    fixed = 3 * lat.t_draft(1, c, batch=3) + lat.t_overhead(c, batch=3)
    assert lat.batch_context == "max"                               # DraftGym's engine: padded to the longest row
    assert res.step_time[0] == pytest.approx(float(fixed + lat.t_verify(4, c, batch=3)), rel=1e-9)
    paged = dataclasses.replace(lat, batch_context="mean")          # a flattened-token engine: the rows' total
    t = table.row_step_time(paged, table.index(step_shape.chain(3)),
                            [table.index(x) for x in (step_shape.chain(1), step_shape.OFF, step_shape.chain(3))],
                            3, paged.step_context(ctx))
    fixed = 3 * paged.t_draft(1, paged.step_context(ctx), batch=3) + paged.t_overhead(paged.step_context(ctx), batch=3)
    assert t == pytest.approx(float(fixed + paged.t_verify((2 + 1 + 4) / 3, paged.step_context(ctx), batch=3)), rel=1e-9)
    assert res.step_drafted[0] == 1 + 0 + 3 and res.step_shape[0] == table.index(step_shape.chain(3))
    with pytest.raises(DataError, match="not a prefix of the drafted chain:2"):
        serve(logs, lat, table, _Rows(2, [3]), np.zeros(2), 2)


class _Alternate(Chooser):
    name = "alternate"

    def choose(self, view):
        self.n = getattr(self, "n", -1) + 1
        return self.table.index(step_shape.OFF if self.n % 2 else step_shape.chain(2))


def test_switch_price_charges_each_change_and_off_steps(logs, lat):
    table = ShapeTable(logs, CHAINS)
    free = serve(logs, lat, table, _Alternate(), np.zeros(1), 1)
    priced = serve(logs, lat, table, _Alternate(), np.zeros(1), 1, price=SwitchPrice(switch_s=0.01, off_factor=1.1))
    off = free.step_shape == table.index(step_shape.OFF)
    n_switch = int((np.diff(free.step_shape) != 0).sum())
    assert n_switch == len(free.step_shape) - 1 > 2 and np.array_equal(free.tokens, priced.tokens)
    want = free.step_time * np.where(off, 1.1, 1.0) + np.r_[0.0, np.full(n_switch, 0.01)]
    assert np.allclose(priced.step_time, want, rtol=1e-12)
    m = metrics.summarize(priced)
    assert m["switches"] == n_switch and m["switches_per_s"] == pytest.approx(n_switch / priced.step_time.sum())
    assert metrics.summarize(serve(logs, lat, table, StaticChooser(step_shape.chain(2)), np.zeros(1), 1))["switches"] == 0
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
    assert a.weights == b.weights and a.bias == b.bias and a.prior == b.prior and a.train["examples"] > 50
    assert np.allclose(a.extend(np.array([[0.5]])), [[0.5, 0.5 * a.prior[1] / a.prior[0], 0.5 * a.prior[2] / a.prior[0]]])
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


def test_vllm_feature_is_the_log_odds_of_each_chain_draft(logs):
    from simulator.serving.choosers.vllm_adaptive import top_logodds

    rows = np.arange(min(50, logs.n_positions))
    s = logs.w[1].beam_scores[rows, :3, 0].astype(np.float64)
    q = np.exp(np.diff(np.concatenate([np.zeros((len(rows), 1)), s], 1), axis=1))
    f = top_logodds(logs.w[1].beam_scores[rows, :3, 0])
    ok = q < 1 - 1e-9
    assert np.allclose(f[ok], np.clip(np.log(q / (1 - q)), -40, 40)[ok], atol=1e-6)


def test_vllm_estimator_refit_is_the_newton_step_of_the_full_system(monkeypatch):
    """The arrowhead solve equals np.linalg.solve on (X^T W X + l I) d = X^T (y - p) (damping off)."""
    from simulator.serving.choosers import vllm_adaptive

    monkeypatch.setattr(vllm_adaptive, "DAMPING", 0.0)
    rng = np.random.default_rng(0)
    K, B = 3, 40
    est = vllm_adaptive.OnlineEstimator(K)
    f = rng.normal(0, 2, (B, K))
    p = est.predict(f)
    acc = np.argmin(np.concatenate([f > -1.0, np.zeros((B, 1), bool)], 1), 1)    # leading drafts with f > -1
    adm = np.full(B, K)
    k = np.arange(K)[None, :]
    obs = (k <= acc[:, None]) & (k < adm[:, None])
    y = (k < acc[:, None]).astype(float)
    X = np.concatenate([f[obs][:, None], np.eye(K)[np.nonzero(obs)[1]]], 1)       # rows [f, e_k]
    W = (p * (1 - p))[obs]
    d = np.linalg.solve(X.T @ (W[:, None] * X) + vllm_adaptive.L2 * np.eye(K + 1), X.T @ (y - p)[obs])
    w0, b0 = est.w, est.b.copy()
    est.accumulate(f, p, acc, adm)
    est.refit()
    assert d[0] > 0 and est.w - w0 == pytest.approx(d[0], rel=1e-9) and np.allclose(est.b - b0, d[1:], rtol=1e-9)


def test_vllm_budget_is_the_argmax_over_stale_scores_and_admits_the_best_current_slots(logs, lat):
    from simulator.serving.choosers.base import StepView
    from simulator.serving.choosers.vllm_adaptive import VLLMAdaptiveVerification, top_logodds

    ch = VLLMAdaptiveVerification(K=3)
    table = ShapeTable(logs, ch.shapes())
    ch.reset(table, lat)
    rows = np.array([0, 7, 20])
    view = StepView(batch=3, rows=rows, context_len=logs.context_len[rows], left=np.full(3, 50),
                    requests=np.array([0, 1, 2]), time=0.0, queued=0)
    draft, verify = ch.costs(3)
    n_first = int(np.argmax((3 + np.arange(10)) / (draft + verify)))                  # new requests: every S = 1
    out = ch.choose(view)
    k = np.array([table.shapes[i][0] for i in out.rows])
    surv = np.cumprod(ch.est.predict(top_logodds(logs.w[1].beam_scores[rows, :3, 0])), 1)
    assert k.sum() == n_first and table.shapes[out.draft] == step_shape.chain(3)
    kept = np.concatenate([surv[r, :k[r]] for r in range(3)])
    dropped = np.concatenate([surv[r, k[r]:] for r in range(3)])
    assert not len(dropped) or not len(kept) or kept.min() >= dropped.max()
    ch.observe(view, out, np.minimum(k, 1))
    out2 = ch.choose(view)                                                          # now the stale S are this step's
    s2 = np.sort(surv.ravel())[::-1]
    assert sum(table.shapes[i][0] for i in out2.rows) == int(np.argmax((3 + np.r_[0, np.cumsum(s2)]) / (draft + verify)))
    res = serve(logs, lat, table, VLLMAdaptiveVerification(K=3), np.zeros(10), 4)
    assert (res.tokens == logs.new_tokens[res.seq] - 1).all()


def test_context_axis_splits_sum_to_the_totals_and_the_answer_is_an_exact_replay(logs, lat):
    from simulator.serving.choosers.base import StepView
    from simulator.serving.context_axis import ContextChooser, context_axis, context_edges, context_lines
    from simulator.serving.replay import closed_batch

    shapes = [step_shape.OFF, step_shape.chain(1), step_shape.chain(2), (2, 4, 8)]
    table = ShapeTable(logs, shapes)
    edges = context_edges(logs, 3)
    assert len(edges) == 2 and edges[0] < edges[1]
    run = closed_batch(logs, lat, table, 2, context_edges=edges)
    assert np.allclose(run["tokens_by_context"].sum(1), run["tokens"]) and np.allclose(run["time_by_context"].sum(1), run["time"])
    ch = ContextChooser({1: [step_shape.OFF, step_shape.chain(1), step_shape.chain(2)], 4: [step_shape.chain(2)] * 3}, edges)
    ch.reset(table, lat)
    view = lambda B, c: StepView(batch=B, rows=np.zeros(B, np.int64), context_len=np.full(B, c), left=np.ones(B),
                                 requests=np.arange(B), time=0.0, queued=0)
    assert (table.shapes[ch.choose(view(1, edges[0] - 1))] == step_shape.OFF
            and table.shapes[ch.choose(view(2, edges[1]))] == step_shape.chain(2))
    assert table.shapes[ch.choose(view(3, edges[0]))] == step_shape.chain(1) and table.shapes[ch.choose(view(4, 0))] == step_shape.chain(2)
    ans = context_axis(logs, lat, [1, 2], shapes, n_bins=3)
    for r in ans["per_batch"]:
        if len(set(r["by_bin"])) == 1:
            assert r["gain"] == 1.0
        assert abs(sum(r["bin_share_of_time"]) - 1) < 1e-3
    assert ans["pays"] == (ans["best_gain"] >= 1.01) and "context axis (3 bins" in context_lines(ans)[0]
    with pytest.raises(DataError, match="at least 2 bins"):
        context_edges(logs, 1)


def test_sglang_dspark_budget_by_hand(logs, lat):
    """SGLang's DSpark budget: new requests' lagged survivals are 1, so the first step's N* is the
    argmax of (R + N) / step_time(R, N) from the table; the kept slots are the best current survivals;
    the next step reads this step's confidences; every request still emits its whole text."""
    from simulator.serving.choosers.base import StepView
    from simulator.serving.choosers.sglang_dspark import SGLangDSpark
    from simulator.serving.formats.dspark_table import dspark_table, step_time

    sps, _ = dspark_table(lat, 3, 256.0)
    ch = SGLangDSpark(sps, 3)
    table = ShapeTable(logs, ch.shapes())
    ch.reset(table, lat)
    rows = np.array([1, 9, 30])
    view = StepView(batch=3, rows=rows, context_len=logs.context_len[rows], left=np.full(3, 50),
                    requests=np.array([0, 1, 2]), time=0.0, queued=0)
    scores = logs.w[1].beam_scores[rows, :3, 0].astype(np.float64)
    k = ch.row_caps(view, scores)
    N = np.arange(10)
    assert k.sum() == int(np.argmax((3 + N) / step_time(sps, np.full(10, 3), N)))
    surv = np.exp(scores)                                                   # running products of the confidences
    kept = np.concatenate([surv[r, :k[r]] for r in range(3)])
    dropped = np.concatenate([surv[r, k[r]:] for r in range(3)])
    assert not len(kept) or not len(dropped) or kept.min() >= dropped.max() - 1e-12
    k2 = ch.row_caps(view, scores)                                          # lagged = this step's confidences now
    cand = np.sort(surv.ravel())[::-1]
    assert k2.sum() == int(np.argmax((3 + np.r_[0, np.cumsum(cand)]) / step_time(sps, np.full(10, 3), N)))
    res = serve(logs, lat, table, SGLangDSpark(sps, 3), np.zeros(10), 4)
    assert (res.tokens == logs.new_tokens[res.seq] - 1).all() and ch.draft_depth(view) == 3


# -- Nightjar's bandit (choosers/nightjar.py) ---------------------------------------------------------

def _view(B, t, requests=None, left=100):
    from simulator.serving.choosers.base import StepView

    req = np.arange(B) if requests is None else np.asarray(requests)
    return StepView(batch=B, rows=np.zeros(B, np.int64), context_len=np.full(B, 64), left=np.full(B, left),
                    requests=req, time=t, queued=0)


def test_nightjar_schedule_prior_reward_and_exploit_by_hand(logs):
    from simulator.serving.choosers.nightjar import Nightjar

    nj = Nightjar(k=3, seed=0)
    nj.reset(ShapeTable(logs, CHAINS), None)
    # the prior: "off" is never explored below 50 rows, the rest equal; past 50 shorter chains weigh more
    assert nj.prior[0].tolist() == [0.0, 0.5, 0.5, 0.5] and nj.bin_prior(30).tolist() == [2.0, 1.75, 1.5, 1.25]
    assert [nj.bin_of(b) for b in (1, 2, 3, 4, 22, 23, 500)] == [0, 0, 1, 1, 10, 11, 11]
    # blocks of 1, 2, 4, 8, 16 steps (sub-bins of 1, 1, 2, 2, 4): a block's first sub-bin always explores,
    # so steps 1, 2, 4, 8 and 16 of a bin explore whatever the draws
    starts = []
    for step in range(1, 17):
        before = int(nj.block[0])
        nj.advance(0)
        if int(nj.block[0]) != before or step == 1:
            starts.append(step)
            assert nj.exploring[0]
    assert starts == [1, 2, 4, 8, 16]
    # never "off" by exploration at B <= 20, over many steps
    nj.reset(ShapeTable(logs, CHAINS), None)
    picks = {nj.choose(_view(3, 0.01 * i)) for i in range(300)}
    assert nj.index[0] not in picks and len(picks) == 3
    # reward = tokens emitted / B / step seconds; exploit = the prior-smoothed mean, strength 1
    nj.reset(ShapeTable(logs, CHAINS), None)
    for arm, acc, dt in ((1, [1, 0], 0.1), (1, [1, 1], 0.1), (2, [3, 0], 0.25)):
        nj.arm = arm
        v = _view(2, 0.0)
        v.step_time = dt
        nj.observe(v, nj.index[arm], np.array(acc))
    assert nj.mean[1, 0] == pytest.approx((3 / 2 / 0.1 + 4 / 2 / 0.1) / 2) and nj.n[1, 0] == 2   # 17.5 tok/row/s
    assert nj.mean[2, 0] == pytest.approx(5 / 2 / 0.25)                                         # 10
    nj.exploring[0], nj.block[0], nj.count[0] = False, 5, 0                                   # an exploit sub-bin
    # scores: arm 1 (17.5 * 2 + 0.5) / 3 = 11.83, arm 2 (10 + 0.5) / 2 = 5.25, arm 3 0.5 / 1, off 0
    assert nj.choose(_view(2, 0.0)) == nj.index[1]


def test_nightjar_load_rule_and_request_rate_by_hand(logs):
    from simulator.serving.choosers.nightjar import Nightjar

    nj = Nightjar(k=2, seed=1)
    nj.reset(ShapeTable(logs, [step_shape.OFF, step_shape.chain(1), step_shape.chain(2)]), None)
    assert nj.request_rate(_view(1, 0.0, [0])) == 0.0                     # nothing elapsed yet
    assert nj.request_rate(_view(2, 4.0, [0, 1])) == pytest.approx(2 / 4)  # 2 joins in 4 s
    # 21 rows, 21 requests joined within 11 s: the trailing 10 s hold 20 of them (t in (1, 11])
    req = list(range(21))
    nj.reset(nj.table, None)
    for i in req:
        nj.request_rate(_view(1, 0.5 * i + 1.0, [i]))
    assert nj.request_rate(_view(21, 11.0, req)) == pytest.approx(20 / 10)
    assert nj.choose(_view(21, 11.0, req)) != nj.index[0]                 # 2 req/s is not > 2: the bandit
    assert nj.choose(_view(21, 11.0, req + [21, 22])) == nj.index[0]      # 2.2 req/s at 21 rows: off
    assert nj.choose(_view(20, 11.0, req[:20] + [21, 22])) != nj.index[0]  # 20 rows: the bandit again


def test_nightjar_replays_reproducibly_and_learns_per_bin(logs, lat):
    from simulator.serving.choosers.nightjar import Nightjar

    table = ShapeTable(logs, CHAINS)
    arrivals = np.sort(np.random.default_rng(0).uniform(0, 2.0, 12))
    a = serve(logs, lat, table, Nightjar(3, seed=4), arrivals, 8)
    b = serve(logs, lat, table, Nightjar(3, seed=4), arrivals, 8)
    assert np.array_equal(a.step_shape, b.step_shape) and np.array_equal(a.tokens, b.tokens)
    ar = serve(logs, lat, table, StaticChooser(step_shape.OFF), arrivals, 8)
    assert np.array_equal(a.tokens, ar.tokens)                           # greedy replay: the same tokens
    ch = Nightjar(3, seed=4)
    serve(logs, lat, table, ch, arrivals, 8)
    assert ch.n.sum() == len(a.step_shape) and ch.n[0].sum() == 0         # every step learned, never "off" here
    bins = {ch.bin_of(x) for x in a.step_batch}
    assert set(np.flatnonzero(ch.n.sum(0))) == bins
