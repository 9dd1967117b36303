"""tune's bisection between tuned batch sizes whose best shapes differ, and the mix bound
(simulator/serving/tune.py; on the H200's 8B-shaped profile the tree best at B = 8
held up to B = 15, 5.9 % below AR there)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from online.cli import main as cli
from pipeline.decode import step_shape
from simulator.serving.inputs import candidates
from simulator.serving.tune import headroom, mix_bound, tune



def best_labels(res) -> list[str]:
    return [step_shape.label(res["shapes"][int(np.argmax(r))]) for r in res["tokens_per_s"]]


def test_refine_puts_each_switch_where_a_dense_tune_has_it(logs, lat):
    """Tuned at B = 1 and 16 only, bisection finds the schedule a tune at every B = 1..16 gives, and
    each B it probed holds the dense tune's own figures; without it B = 1's choice holds to 15."""
    shapes = candidates(logs, "all")
    dense = tune(logs, lat, range(1, 17), shapes, refine=False)
    assert len(set(best_labels(dense))) >= 3                       # the fixture's best shape moves with B
    res = tune(logs, lat, [1, 16], shapes)
    assert res["refined"] and set(res["refined"]) < set(range(2, 16)) and len(res["refined"]) < 14
    assert res["schedule"].ranges == dense["schedule"].ranges
    for i, B in enumerate(res["batch_sizes"]):
        assert np.array_equal(res["tokens_per_s"][i], dense["tokens_per_s"][B - 1])
    assert res["schedule"].meta["refined"] == res["refined"]
    assert res["schedule"].tuning["batch_sizes"] == res["batch_sizes"]
    coarse = tune(logs, lat, [1, 16], shapes, refine=False)
    assert coarse["refined"] == [] and coarse["schedule"].shape_for(15) == dense["shapes"][int(np.argmax(dense["tokens_per_s"][0]))]
    # every range's shape is the dense tune's best at both of its ends
    for lo, hi, s in res["schedule"].ranges:
        assert best_labels(dense)[lo - 1] == step_shape.label(s) == best_labels(dense)[min(hi, 16) - 1]


def test_mix_bound_is_the_value_of_the_game():
    """Two batch sizes, two shapes: s0 best at B = 1 (s1 2x behind), s1 best at B = 16 (s0 3x behind).
    gain(u) = min(u1 + 3 u2, 2 u1 + u2) peaks at u = (2/3, 1/3): 5/3, below the headroom (2x)."""
    res = {"batch_sizes": [1, 16], "shapes": [step_shape.chain(1), step_shape.chain(4)],
           "tokens_per_s": np.array([[100.0, 50.0], [100.0, 300.0]])}
    b = mix_bound(res, tol=1e-4, max_iters=200_000)
    assert b["lower"] <= b["gain"] and b["gain"] == pytest.approx(5 / 3, abs=1e-3)
    assert b["mix"][1] == pytest.approx(2 / 3, abs=0.02) and b["mix"][16] == pytest.approx(1 / 3, abs=0.02)
    assert headroom(res)["gap"] == pytest.approx(2.0)
    one = {"batch_sizes": [4], "shapes": [step_shape.OFF, step_shape.chain(2)], "tokens_per_s": np.array([[100.0, 120.0]])}
    assert mix_bound(one)["gain"] == pytest.approx(1.0) and mix_bound(one)["static"] == "chain:2"


def test_mix_bound_lies_between_one_and_the_headroom(logs, lat):
    dense = tune(logs, lat, range(1, 17), candidates(logs, "all"), refine=False)
    b, h = mix_bound(dense), headroom(dense)
    assert 1.0 <= b["lower"] <= b["gain"] <= h["gap"] + 1e-9 and b["gain"] - b["lower"] <= 0.002
    assert sum(b["mix"].values()) == pytest.approx(1.0, abs=0.05)


def test_tune_cli_marks_probed_batch_sizes(root, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert cli(["tune", "--logs", str(root), "--split", "all", "--batch-sizes", "1,16", "--out", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [r["batch"] for r in rep["per_batch"] if not r["refined"]] == [1, 16]
    assert any(r["refined"] for r in rep["per_batch"]) and rep["mix_bound"]["gain"] <= rep["headroom"]["gap"] + 1e-9
    assert cli(["tune", "--logs", str(root), "--split", "all", "--batch-sizes", "1,16", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "* probed between tuned batch sizes" in text and "mix bound: " in text
    assert cli(["tune", "--logs", str(root), "--split", "all", "--batch-sizes", "1,16", "--out", str(out),
                "--no-refine", "--json"]) == 0
    assert [r["batch"] for r in json.loads(capsys.readouterr().out)["per_batch"]] == [1, 16]
