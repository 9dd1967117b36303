"""tools/bench/batch.py at a tiny size on a tiny random target: the JSON and the tables have every
figure the full-size run reports (no timing assertions), and --dry-run loads no model."""
from __future__ import annotations

import json

from tools.bench.batch import best_and_crossover, main


def test_bench_batch_tiny(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "batch.json"
    assert main(["--model", str(tiny_model_dir), "--head", "random", "--dataset", "mt-bench", "--n-prompts", "3",
                 "--max-new-tokens", "6", "--batch-sizes", "1,2", "--chains", "2", "--trees", "2,10,10",
                 "--grid-best", "3,10,20", "--dtypes", "float32", "--hf-batch", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    names = ["ar", "chain:2", "tree:2,10,10", "grid-best tree:3,10,20"]
    assert list(r["config"]["methods"]) == names and r["generations"] == 2 * 4
    (run,) = r["runs"]
    assert run["dtype"] == "float32" and run["environment"]["cpu_model"] is not None and len(run["prompts"]) == 3
    for name in names:
        for B in ("1", "2"):
            f = run["by_method"][name][B]
            assert f["tokens_per_s"] > 0 and f["new_tokens"] > 0 and f["steps"] > 0 and f["tau"] >= 1.0
            if name != "ar":
                assert f["same_as_ar"] == 3                       # fp32: every row is AR's output
    assert set(run["best_static"]) == {"1", "2"} and set(run["best_static"].values()) <= set(names[1:])
    assert run["off_beats_every_speculation_from"] in (None, 1, 2)
    assert {(v["rows"], v["verify_size"]) for v in run["verify_cost"]} >= {(1, 1), (2, 1), (1, 3), (2, 3), (2, 10), (2, 20)}
    assert all(v["tokens"] == v["rows"] * v["verify_size"] and v["t_verify_ms"] > 0 for v in run["verify_cost"])
    assert {(d["rows"], d["width"]) for d in run["draft_step"]} >= {(1, 1), (1, 10), (2, 1), (2, 10)}
    assert run["hf_generate"]["batch"] == 2 and run["hf_generate"]["hf_tokens"] > 0 and run["hf_generate"]["ratio"] > 0
    assert "tokens/s against B" in printed and "float32" in printed and run["environment"]["cpu_model"] in printed
    assert r["tables"] in printed


def test_bench_batch_dry_run_and_bad_input(capsys):
    assert main(["--dry-run", "--grid-best", "3,10,8", "--dtypes", "float32"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["config"]["batch_sizes"] == [1, 2, 4, 8, 16, 32] and plan["runs"] == []
    assert list(plan["config"]["methods"]) == ["ar", "chain:1", "chain:2", "chain:3", "chain:4", "tree:2,10,10",
                                               "tree:3,10,20", "tree:8,10,60", "grid-best tree:3,10,8"]
    assert plan["generations"] == 6 * 9
    assert main(["--dry-run", "--trees", "8,10"]) == 2
    assert "--trees takes D,W,V triples" in capsys.readouterr().err


def test_best_shape_and_crossover():
    tps = {"ar": {1: 10, 2: 20, 4: 40, 8: 80}, "chain:2": {1: 15, 2: 25, 4: 35, 8: 70}, "tree": {1: 18, 2: 19, 4: 41, 8: 60}}
    best, cross = best_and_crossover(tps, [1, 2, 4, 8])
    assert best == {1: "tree", 2: "chain:2", 4: "tree", 8: "chain:2"} and cross == 8
    tps["ar"][8] = 65
    assert best_and_crossover(tps, [1, 2, 4, 8])[1] is None
