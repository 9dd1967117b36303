"""Latency model at batch size B: interpolation in B, batch-1 identity, the batch-1-only error,
t_step, and the batch_steps table."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import DataError
from pipeline.logs.schema import BATCH_STEPS, read_table, step_kind, table_files, write_batch_steps
from simulator.latency.batch import interp_batch
from simulator.latency.model import LatencyModel
from simulator.logs.synthetic import SyntheticConfig, latency_rows, write_synthetic_logs

LEVELS = (1, 2, 4, 8)


def hand_rows(levels=LEVELS, with_batch_column=True):
    """verify(V, c, B) = 0.01 + 1e-3 V B^1.5 + 1e-5 c B (convex in B, so chords differ from the curve),
    draft(W, c, B) = 0.002 + 1e-4 W B, policy(B) = 1e-4 (1 + B / 10), overhead at batch 1 only."""
    def row(op, t, W=0, V=0, c=0, B=1):
        r = {"schema_version": 2, "profile_id": "p", "device": "d", "device_type": "cpu", "model_id": "m",
             "head_id": "h", "dtype": "float32", "op": op, "width": W, "verify_size": V, "context_len": c,
             "n": 5, "median": t, "p10": 0.9 * t, "p90": 1.2 * t, "mean": t, "env_json": "{}"}
        if with_batch_column:
            r["batch"] = B
        return r
    rows = [row("overhead", 0.003 + 1e-6 * c, c=c) for c in (100, 300)]
    for B in levels:
        for c in (100, 300):
            rows += [row("verify", 0.01 + 1e-3 * V * B ** 1.5 + 1e-5 * c * B, V=V, c=c, B=B) for V in (1, 8)]
            rows += [row("draft_step", 0.002 + 1e-4 * W * B, W=W, c=c, B=B) for W in (4, 10)]
        rows.append(row("policy", 1e-4 * (1 + B / 10), B=B))
    return rows


def test_exact_at_profiled_batches_and_monotone_between():
    lat = LatencyModel.from_rows(hand_rows())
    assert lat.batch_levels == list(LEVELS) and lat.meta["batch_sizes"] == list(LEVELS)
    for r in hand_rows():
        kw = {"batch": r["batch"]}
        if r["op"] == "verify":
            assert lat.t_verify(r["verify_size"], r["context_len"], **kw) == pytest.approx(r["mean"], rel=1e-12)
        elif r["op"] == "draft_step":
            assert lat.t_draft(r["width"], r["context_len"], **kw) == pytest.approx(r["mean"], rel=1e-12)
        elif r["op"] == "policy":
            assert lat.t_policy(**kw) == pytest.approx(r["mean"], rel=1e-12)
    B = np.linspace(1, 8, 141)
    for fn in (lambda b: lat.t_verify(8, 200, batch=b), lambda b: lat.t_draft(10, 100, batch=b),
               lambda b: lat.t_policy(batch=b)):
        t = fn(B)
        assert t.shape == B.shape and np.all(np.diff(t) > 0)                    # monotone in B
    # linear in B between two levels: the chord; log: the chord in log B (above it for an affine cost)
    t2, t4 = lat.t_verify(8, 100, batch=2), lat.t_verify(8, 100, batch=4)
    assert lat.t_verify(8, 100, batch=3) == pytest.approx((t2 + t4) / 2)
    log = LatencyModel.from_rows(hand_rows(), batch_interp="log")
    w = np.log(3 / 2) / np.log(2)
    assert log.t_verify(8, 100, batch=3) == pytest.approx((1 - w) * t2 + w * t4)
    # the overhead has batch-1 rows only: flat in B
    assert lat.t_overhead(300, batch=8) == lat.t_overhead(300) == pytest.approx(0.0033)
    # beyond the largest profiled B: linear along the last segment, never below the last level
    t8, t16 = lat.t_verify(1, 100, batch=8), lat.t_verify(1, 100, batch=16)
    assert t16 == pytest.approx(t8 + 2 * (t8 - lat.t_verify(1, 100, batch=4)))
    assert interp_batch([1, 2], np.array([[1.0], [0.5]]), 4)[0] == 0.5     # a falling last segment stops at F_K
    with pytest.raises(ValueError, match=">= 1"):
        lat.t_verify(8, 100, batch=0)
    # broadcasting over (V, c, B) like the other arguments
    v = lat.t_verify(np.array([[1], [8]]), 100, batch=np.array([1, 2, 4]))
    assert v.shape == (2, 3) and v[1, 2] == pytest.approx(lat.t_verify(8, 100, batch=4))


def test_batch_one_is_todays_model():
    """A profile with B > 1 rows answers every batch-1 query (no batch argument, batch=1, an array of
    ones) with exactly the numbers of the same profile's batch-1 rows alone."""
    wide = LatencyModel.from_rows(latency_rows("m", "cpu", batches=(1, 2, 4, 8, 16)))
    one = LatencyModel.from_rows(latency_rows("m", "cpu"))
    V, c = np.array([1, 7, 60, 240]), np.array([[100], [700], [3000]])
    assert np.array_equal(wide.t_verify(V, c), one.t_verify(V, c))
    assert np.array_equal(wide.t_verify(V, c, batch=1), one.t_verify(V, c))
    assert np.array_equal(wide.t_verify(V, c, batch=np.ones(4)), one.t_verify(V, c))
    assert np.array_equal(wide.t_draft(np.array([8, 10, 32]), c), one.t_draft(np.array([8, 10, 32]), c))
    assert np.array_equal(wide.t_overhead(c), one.t_overhead(c)) and wide.t_policy() == one.t_policy()
    assert np.array_equal(wide.t_ar(c), one.t_ar(c))
    assert np.array_equal(wide.t_cycle(8, 10, 60, c, n_calls=3), one.t_cycle(8, 10, 60, c, n_calls=3))
    assert np.array_equal(wide.t_verify(V, 512, rng=np.random.default_rng(3)),
                          one.t_verify(V, 512, rng=np.random.default_rng(3)))
    assert np.array_equal(wide.t_policy(6, np.random.default_rng(3)), one.t_policy(6, np.random.default_rng(3)))
    assert wide.fit_report()["ops"]["verify"]["loo_mean_rel_err"] == one.fit_report()["ops"]["verify"]["loo_mean_rel_err"]
    # the synthetic profile is affine in B: linear interpolation in B is exact there, log is not
    loo = wide.fit_report()["batch_loo"]["verify"]
    assert loo["linear_max_rel_err"] < 1e-9 < 0.05 < loo["log_mean_rel_err"]


def test_batch_one_profile_refuses_batch_above_one():
    for rows in (latency_rows("m", "cpu"), hand_rows(levels=(1,), with_batch_column=False)):
        lat = LatencyModel.from_rows(rows)
        assert lat.batch_levels == [1] and lat.coverage([128])["batch_range"] == [1, 1]
        for call in (lambda: lat.t_verify(8, 128, batch=2), lambda: lat.t_draft(10, 128, batch=4),
                     lambda: lat.t_ar(128, batch=np.array([1, 2])), lambda: lat.t_step(2, 10, 8, 128, batch=8),
                     lambda: lat.t_policy(batch=2), lambda: lat.t_overhead(128, batch=2)):
            with pytest.raises(DataError, match=r"has batch 1 only; run `draftgym profile --batch-sizes 1,2,4,8,16`") as e:
                call()
            assert "\n" not in str(e.value)
        assert lat.t_verify(8, 128, batch=1) == lat.t_verify(8, 128)         # batch 1 still answers


def test_rows_without_batch_column_read_as_batch_one():
    lat = LatencyModel.from_rows(hand_rows(with_batch_column=False)[:10])
    assert lat.batch_levels == [1]


def test_t_step_shapes_at_batch():
    lat = LatencyModel.from_rows(hand_rows())
    for B in (1, 3, 8):
        # off: the AR step at B; chain (D, 1, D + 1); a tree = D drafts + verify + calls + overhead
        assert lat.t_step(0, 10, 1, 200, batch=B) == pytest.approx(lat.t_ar(200, batch=B))
        assert lat.t_step(0, 0, 1, 200, batch=B) == pytest.approx(lat.t_ar(200, batch=B))
        chain = 3 * lat.t_draft(1, 200, batch=B) + lat.t_verify(4, 200, batch=B) + lat.t_overhead(200, batch=B)
        assert lat.t_step(3, 1, 4, 200, batch=B) == pytest.approx(chain)
        tree = (2 * lat.t_draft(4, 200, batch=B) + lat.t_verify(8, 200, batch=B) + 2 * lat.t_policy(batch=B)
                + lat.t_overhead(200, batch=B))
        assert lat.t_step(2, 4, 8, 200, batch=B, n_calls=2) == pytest.approx(tree)
    assert lat.t_step(2, 4, 8, 200) == pytest.approx(lat.t_cycle(2, 4, 8, 200))
    t = lat.t_step(np.array([0, 2, 4]), 4, np.array([1, 8, 8]), 200, batch=np.array([2, 4, 8]))
    assert t.shape == (3,) and t[0] == pytest.approx(lat.t_ar(200, batch=2))
    # noise at B: the two-piece normal of the interpolated quantiles
    x = lat.t_verify(np.full(20_000, 8), 100, rng=np.random.default_rng(0), batch=3)
    m = lat.t_verify(8, 100, batch=3)                  # p10 = 0.9 m and p90 = 1.2 m at every level, so also at B = 3
    assert np.median(x) == pytest.approx(m, rel=0.01)
    assert np.quantile(x, 0.1) == pytest.approx(0.9 * m, rel=0.01) and np.quantile(x, 0.9) == pytest.approx(1.2 * m, rel=0.01)
    s = lat.scaled(2.0)
    assert s.t_verify(8, 100, batch=3) == pytest.approx(2 * lat.t_verify(8, 100, batch=3))


def test_coverage_and_fit_report_show_the_batch_range():
    lat = LatencyModel.from_rows(hand_rows())
    cov = lat.coverage([100, 200], batches=[1, 4, 8, 16, 32])
    assert cov["batch_range"] == [1, 8] and cov["batch_levels"] == [1, 2, 4, 8] and cov["batches_outside"] == [16, 32]
    rep = lat.fit_report()
    assert rep["batch_levels"] == [1, 2, 4, 8] and rep["batch_interp"] == "linear"
    assert rep["ops"]["overhead"]["batch_levels"] == [1] and set(rep["batch_loo"]) == {"draft_step", "verify"}
    assert rep["ops"]["policy"]["by_batch_s"][8] == pytest.approx(1.8e-4)
    with pytest.raises(ValueError, match="batch_interp"):
        LatencyModel.from_rows(hand_rows(), batch_interp="cubic")


def test_synthetic_batched_rows(tmp_path):
    """Batch-1 rows are today's, B > 1 rows follow; the synthetic logs carry them when asked."""
    one, wide = latency_rows("m", "gpu"), latency_rows("m", "gpu", batches=(1, 2, 16))
    assert wide[: len(one)] == one and {r["batch"] for r in wide} == {1, 2, 16}
    assert not any(r["op"] == "overhead" and r["batch"] > 1 for r in wide)
    lat = LatencyModel.from_rows(wide)
    ar = [float(lat.t_ar(512, batch=B)) for B in (1, 2, 16)]
    assert ar[0] < ar[1] < ar[2] < 2 * ar[0]             # the GPU AR step: nearly flat in B
    write_synthetic_logs(tmp_path, SyntheticConfig(n_sequences=2, latency_batches=(1, 4)))
    assert LatencyModel.from_logs(tmp_path).batch_levels == [1, 4]


def test_batch_steps_table(tmp_path):
    assert step_kind(0, 10, 1) == "off" and step_kind(3, 1, 4) == "chain" and step_kind(3, 10, 4) == "tree"
    base = {"method": "static", "run": 0, "batch": 4, "depth": 2, "width": 10, "verify_size": 8,
            "context_mean": 130.5, "context_max": 200, "emitted_sum": 6, "t_draft": 0.01, "t_verify": 0.05,
            "t_controller": 0.0, "t_step": 0.07, "device": "cpu"}
    rows = [{**base, "step": 0, "prompt_ids": ["a", "b", "c"], "accepted": [2, 0, 1]},
            {**base, "step": 1, "depth": 0, "width": 0, "verify_size": 1, "queue": 3, "prompt_ids": ["a"], "accepted": [0]}]
    path = write_batch_steps(tmp_path, "org/m", "mt-bench", 0.0, "run1", rows)
    assert table_files(tmp_path, "batch_steps") == [path]
    t = read_table(path, "batch_steps")
    assert t.schema.remove_metadata() == BATCH_STEPS
    got = t.to_pylist()
    assert [r["active"] for r in got] == [3, 1] and [r["accepted_sum"] for r in got] == [3, 0]
    assert [r["kind"] for r in got] == ["tree", "off"] and got[0]["accepted"] == [2, 0, 1]
    assert got[0]["queue"] is None and got[1]["queue"] == 3 and got[0]["run_id"] == "run1"
    for bad, msg in (({"accepted": [1, 1]}, "2 accepted and 3 prompt_ids"), ({"batch": 2}, "3 active rows in a batch of 2"),
                     ({"kind": "chain"}, "kind 'chain'"), ({"accepted": [3, 0, 0]}, "outside 0..D"),
                     ({"accepted_sum": 9}, "accepted_sum 9")):
        with pytest.raises(DataError, match=msg):
            write_batch_steps(tmp_path, "m", "d", 0.0, "bad", [{**rows[0], **bad}])
    from pipeline.logs.query import connect
    con = connect(tmp_path)
    assert con.execute("SELECT sum(accepted_sum), max(len(accepted)) FROM batch_steps").fetchall() == [(3, 3)]


def test_prefill_note_names_prompts_outside_the_profiled_lengths():
    """simulator.latency.diagnostics.prefill_note: below the shortest prefill length the charge is that
    length's (flat), above the longest it scales in proportion; one line naming both, None inside."""
    from simulator.latency.diagnostics import prefill_note

    rows = hand_rows()
    base = rows[0]
    rows += [{**base, "op": "prefill", "context_len": n, "median": t, "mean": t, "p10": t, "p90": t, "batch": 1}
             for n, t in ((64, 0.1), (256, 0.3))]
    lat = LatencyModel.from_rows(rows)
    assert lat.t_prefill(32) == pytest.approx(0.1) and lat.t_prefill(512) == pytest.approx(0.6)
    note = prefill_note(lat, [32, 100, 300, 600])
    assert note == ("prefill: of 4 prompts (32-600 tokens), 1 below (charged as 64 tokens) and 2 above (scaled up "
                    "from 256 tokens) the profiled prefill lengths 64-256; profile --prefill-lengths to cover them")
    assert prefill_note(lat, [64, 200, 256]) is None and prefill_note(lat, []) is None
    assert prefill_note(LatencyModel.from_rows(hand_rows()), [32]) is None       # no prefill rows: nothing charged


def test_padded_profile_prices_a_step_at_its_row_bucket():
    """A profile whose env says the engine pads (row_bucket: CUDA graphs) charges B rows at
    row_buckets(B): 3 rows cost 4 rows, 5..8 rows cost 8; without it B interpolates. row_buckets is
    the engine's row_bucket, vectorised."""
    from pipeline.decode.engine.core import row_bucket
    from simulator.latency.batch import row_buckets

    assert row_buckets(np.arange(1, 201)).tolist() == [row_bucket(a) for a in range(1, 201)]
    rows = hand_rows()
    padded = LatencyModel.from_rows([{**r, "env_json": '{"row_bucket": true}'} for r in rows])
    plain = LatencyModel.from_rows(rows)
    assert padded.meta["row_bucket"] and not plain.meta["row_bucket"]
    for B, at in ((1, 1), (2, 2), (3, 4), (5, 8), (7, 8), (8, 8)):
        assert padded.t_step(3, 4, 10, 200, batch=B) == pytest.approx(plain.t_step(3, 4, 10, 200, batch=at))
    assert plain.t_step(3, 4, 10, 200, batch=5) < plain.t_step(3, 4, 10, 200, batch=8)
    assert padded.scaled(2.0).row_bucket
