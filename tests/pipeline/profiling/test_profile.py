"""`draftgym profile` writes checked latency rows for every op."""
from __future__ import annotations

import json

import pytest

from online.cli import main as cli
from pipeline.logs.schema import read_table, table_files


def test_profile_tiny(tmp_path, tiny_model_dir, capsys):
    rc = cli(["profile", "--model", str(tiny_model_dir), "--head", "random", "--widths", "2,4",
              "--verify-sizes", "1,8,32", "--contexts", "16,64", "--repeats", "2", "--prefill-lengths", "8,32",
              "--out", str(tmp_path), "--json"])
    assert rc == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    files = table_files(tmp_path, "latency")
    # draft_step (W, c), verify (V, c), overhead (c), policy, prefill (n)
    assert len(files) == 1 and info["rows"] == 2 * 2 + 3 * 2 + 2 + 1 + 2
    t = read_table(files[0], "latency").to_pylist()
    ops = {r["op"] for r in t}
    assert ops == {"draft_step", "verify", "policy", "overhead", "prefill"}
    assert {r["context_len"] for r in t if r["op"] == "prefill"} == {8, 32}
    for r in t:
        assert r["p10"] <= r["median"] <= r["p90"] and r["n"] >= 1 and r["device"].startswith("cpu") and r["batch"] == 1
    assert {(r["verify_size"], r["context_len"]) for r in t if r["op"] == "verify"} == \
        {(v, c) for v in (1, 8, 32) for c in (16, 64)}


def test_profile_batch_sizes(tmp_path, tiny_model_dir, capsys):
    """--batch-sizes 1,2: the same cells at batch 1 and batch 2, both from the engine's own steps
    (one code path: batch 1 is B = 1), and a latency model that answers both."""
    from simulator.latency.model import LatencyModel

    rc = cli(["profile", "--model", str(tiny_model_dir), "--head", "random", "--widths", "2", "--verify-sizes", "1,4",
              "--contexts", "16", "--repeats", "2", "--batch-sizes", "1,2", "--prefill-lengths", "none",
              "--out", str(tmp_path), "--json", "--no-progress"])
    assert rc == 0
    t = read_table(table_files(tmp_path, "latency")[0], "latency").to_pylist()
    cells = {(r["op"], r["width"], r["verify_size"], r["context_len"], r["batch"]) for r in t}
    assert cells == {(op, W, V, c, B) for B in (1, 2) for op, W, V, c in
                     (("verify", 0, 1, 16), ("verify", 0, 4, 16), ("draft_step", 2, 0, 16), ("policy", 0, 0, 0),
                      ("overhead", 0, 0, 16))}
    for r in t:
        assert r["p10"] <= r["median"] <= r["p90"] and r["n"] >= 2
    lat = LatencyModel.from_rows(t, point="median")
    assert lat.batch_levels == [1, 2]
    for B in (1, 2):
        r = next(r for r in t if r["op"] == "verify" and r["verify_size"] == 4 and r["batch"] == B)
        assert lat.t_verify(4, 16, batch=B) == pytest.approx(r["median"])


def test_profile_rounds_spread_the_same_samples(tmp_path, tiny_model_dir, capsys):
    """--rounds 2 --repeats 1 passes twice through the (B, c) grid: every cell gets as many samples as
    --repeats 2 in one pass, from two stretches of time (the result's rounds and jobs say so)."""
    base = ["profile", "--model", str(tiny_model_dir), "--head", "random", "--widths", "2", "--verify-sizes", "1,4",
            "--contexts", "16", "--batch-sizes", "1,2", "--prefill-lengths", "none", "--top-ups", "0", "--json", "--no-progress"]
    n, runs = {}, {}
    for k, extra in (("one", ["--repeats", "2"]), ("two", ["--repeats", "1", "--rounds", "2"])):
        assert cli([*base, *extra, "--out", str(tmp_path / k)]) == 0
        runs[k] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        t = read_table(table_files(tmp_path / k, "latency")[0], "latency").to_pylist()
        n[k] = {(r["op"], r["width"], r["verify_size"], r["context_len"], r["batch"]): r["n"] for r in t if r["op"] != "policy"}
    assert n["one"] == n["two"] and min(n["two"].values()) >= 2
    assert (runs["one"]["rounds"], runs["one"]["jobs"]) == (1, 2) and (runs["two"]["rounds"], runs["two"]["jobs"]) == (2, 4)
    assert cli([*base, "--rounds", "0", "--out", str(tmp_path / "bad")]) == 2
    assert "--rounds" in capsys.readouterr().err


def test_profile_bad_args(capsys):
    assert cli(["profile", "--head", "/no/such/head"]) == 2
    assert "EAGLE-3 head directory not found" in capsys.readouterr().err
    assert cli(["profile", "--verify-sizes", "1,x"]) == 2
    assert cli(["profile", "--batch-sizes", "1,0"]) == 2
    assert "--batch-sizes values must be >= 1" in capsys.readouterr().err


def test_speed_factor_is_the_median_cell_ratio():
    """ProfileSampler.speed_factor: per sampled cell, mean(segment) / mean(all); the median over cells."""
    from pipeline.profiling.profile import ProfileSampler

    s = object.__new__(ProfileSampler)           # only the sample stores: no engine needed
    s.samples, s.by_segment = {}, {}
    def add(seg, key, ts):
        s.by_segment.setdefault(seg, {}).setdefault(key, []).extend(ts)
        s.samples.setdefault(key, []).extend(ts)
    for V in (1, 4, 8):                           # "a" ran 1.5x as slow as "b" on every verify cell
        add("a", ("verify", 0, V, 32, 1), [0.03 * V, 0.03 * V])
        add("b", ("verify", 0, V, 32, 1), [0.02 * V, 0.02 * V])
    add("a", ("draft_step", 10, 0, 32, 1), [0.010])          # one noisy cell moves the median little
    add("b", ("draft_step", 10, 0, 32, 1), [0.001])
    fa, na = s.speed_factor("a")
    fb, nb = s.speed_factor("b")
    assert na == nb == 4
    assert fa == pytest.approx(0.03 / 0.025) and fb == pytest.approx(0.02 / 0.025)
    assert s.speed_factor("never") is None


def test_batched_step_rows_attribute_each_step_to_its_shape():
    """Step k played grid shape k % n: its verify (kept shapes), its draft per depth, its overhead;
    warm-up rounds and steps with fewer than B rows are dropped (pipeline/profiling/steps.py)."""
    from pipeline.decode.controller import StepRecord
    from pipeline.decode.step_shape import StepShape
    from pipeline.profiling.steps import grid_shapes, step_rows

    shapes = grid_shapes((1, 4), (1, 3))
    assert [(s, keep) for s, keep in shapes] == [(StepShape.off(), True), (StepShape.chain(2), True),
                                                 (StepShape(2, 4, 3), False)]

    def rec(k, shape, B=2):
        return StepRecord(step=k, batch_size=B, depth=shape.depth, width=shape.width, verify_size=shape.verify_size,
                          rows=[0, 1][:B], context_lens=[8] * B, accepted=[0] * B, emitted=[1] * B, queued=0,
                          t_draft=0.01 * shape.depth, t_verify=0.1 + 0.01 * k, t_controller=0.001, t_step=0.2 + 0.01 * k)

    recs = [rec(k, shapes[k % 3][0]) for k in range(9)]
    recs[7] = rec(7, shapes[1][0], B=1)                       # a row had finished: not a batch-2 step
    got = step_rows(recs, shapes, batch=2, context=16, warmup=1)
    assert got[("verify", 0, 1, 16, 2)] == pytest.approx([0.13, 0.16])
    assert got[("verify", 0, 3, 16, 2)] == pytest.approx([0.14])
    assert got[("draft_step", 1, 0, 16, 2)] == pytest.approx([0.01])
    assert got[("draft_step", 4, 0, 16, 2)] == pytest.approx([0.01, 0.01])
    off, drafted = 0.1 - 0.001, 0.1 - 0.02 - 0.001          # t_step - t_verify = 0.1 by construction
    assert got[("overhead", 0, 0, 16, 2)] == pytest.approx([off, drafted, drafted, off, drafted])
    assert set(got) == {("verify", 0, 1, 16, 2), ("verify", 0, 3, 16, 2), ("draft_step", 1, 0, 16, 2),
                        ("draft_step", 4, 0, 16, 2), ("overhead", 0, 0, 16, 2)}


def test_verify_width_times_the_tree_that_holds_v():
    """A V-token verify is timed at the first width whose tree holds V nodes: a chain (W = 1) holds
    at most 13 at depth 12, so V = 40 goes to W = 10; no width that can: a one-line error."""
    from pipeline.errors import DraftGymError
    from pipeline.profiling.steps import grid_shapes
    from pipeline.decode.step_shape import pool_size
    from pipeline.profiling.timed_ops import depth_for, verify_width

    assert [verify_width(V, (1, 10)) for V in (1, 2, 13, 14, 40)] == [1, 1, 1, 10, 10]
    for V in (2, 13, 14, 40, 100):
        W = verify_width(V, (1, 10))
        assert pool_size(depth_for(V, W), W) >= V - 1
    with pytest.raises(DraftGymError, match="40-token verify needs a wider tree than widths 1"):
        verify_width(40, (1,))
    assert [(s.depth, s.width, s.verify_size) for s, _ in grid_shapes((1, 10), (1, 4, 40))] == \
        [(0, 1, 1), (3, 1, 4), (2, 10, 40), (2, 10, 11)]
