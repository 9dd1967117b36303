"""`make demo`'s chain (collect -> profile -> train -> profile-policy -> evaluate -> validate, then the
serving steps: batched profile -> tune -> export) end to end, on a tiny random target with tiny sizes
(the real demo runs the embedded default)."""
from __future__ import annotations

import json

import pytest

from online import demo


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_demo_chain_tiny(tmp_path, tiny_model_dir, capsys, dtype):
    out = tmp_path / "demo"
    # bf16 is emulated on AVX2-only CPUs: that run checks the dtype reaches every step, on one dataset, a smaller
    # profile grid and without validate's interleaved profile rounds (the float32 run checks those)
    grid = ["--verify-sizes", "1,4,16,60", "--contexts", "16,64", "--serving-context", "64"] if dtype == "float32" else \
        ["--verify-sizes", "1,16", "--contexts", "16,64", "--batch-sizes", "none", "--profile-interleave", "0",
         "--datasets", "mt-bench"]
    rc = demo.main(["--model", str(tiny_model_dir), "--head", "random", "--out", str(out), "--train-prompts", "2",
                    "--test-prompts", "1", "--max-new-tokens", "8", "--ltd-steps", "2048", "--no-ray", "--no-vllm",
                    "--dtype", dtype] + grid)
    assert rc == 0
    printed = capsys.readouterr().out
    step = "[9/12]" if dtype == "float32" else "[7/7]"       # bf16: two collect steps, no serving steps
    assert f"{step} draftgym validate" in printed and "demo finished" in printed
    rep = json.loads((out / "report" / "report.json").read_text())
    assert set(rep["datasets"]) == ({"mt-bench", "humaneval"} if dtype == "float32" else {"mt-bench"})
    assert rep["dtype"] == dtype and rep["device"].endswith(f"[{dtype}]") and rep["environment"]["dtype"] == dtype
    for e in rep["datasets"].values():
        assert e["lossless"] and "ltd" in e["methods"]
        assert e["lossless_counts"]["mismatch"] == 0 and sum(e["lossless_counts"].values()) == 3   # 3 EAGLE-3 methods
        if dtype == "float32":
            assert e["lossless_counts"]["exact"] == 3
    assert (out / "policies" / "ltd" / "manifest.json").is_file()
    assert list((out / "logs" / "latency").rglob("*-policies-*.parquet"))      # profile-policy ran
    # validate re-profiled right before decoding (and, in float32, once between the generations) into the
    # report folder, and timed sim-vs-real with that profile (float32: the pooled one)
    assert list((out / "report" / "latency").rglob("*-policies-*.parquet"))
    if dtype == "bfloat16":
        assert "profile_interleave" not in rep and rep["latency_profile"]["profile_id"] == rep["profile_first"]["profile_id"]
    else:
        assert rep["profile_interleave"]["rounds"] == 2
        assert rep["latency_profile"]["profile_id"] == rep["profile_interleave"]["profile_id"] != rep["profile_first"]["profile_id"]
    if dtype == "float32":                                    # the serving steps: a schedule from B = 1, 4, 16
        sched = json.loads((out / "serving" / "schedule.json").read_text())
        assert sched["ranges"][0]["batch"][0] == 1 and sched["ranges"][-1]["batch"][1] == 16
        assert sched["meta"]["split"] == "train" and sched["tuning"]["batch_sizes"] == [1, 4, 16]
        assert "headroom: " in printed
        vllm = out / "serving" / "vllm_speculative_config.json"
        if demo.vllm_speculates(out / "serving" / "schedule.json"):
            assert "num_speculative_tokens_per_batch_size" in vllm.read_text() and "[12/12] draftgym export" in printed
        else:                                 # a random head: AR (or a tree vLLM cannot run) wins at every B
            assert "[12/12] export: skipped, vLLM would never speculate" in printed and not vllm.exists()
        if all(r["shape"] == "off" for r in sched["ranges"]):
            assert not demo.vllm_speculates(out / "serving" / "schedule.json")


def test_vllm_speculates_reads_the_schedule_as_vllm_runs_it(tmp_path):
    # the case CI met: tune picks a tree at B = 1, but AR beats every shape vLLM can run there (the
    # one-draft tree (1, 10, 2)), so the best-expressible export would never speculate: the demo skips it
    from simulator.serving.schedule import Schedule

    tuning = {"batch_sizes": [1, 4], "shapes": ["off", "tree:1,10,2", "tree:1,10,4"],
              "tokens_per_s": [[100.0, 99.0, 101.0], [300.0, 200.0, 150.0]]}
    tree_wins = Schedule([(1, 3, (1, 10, 4)), (4, 16, (0, 1, 1))], tuning=tuning).save(tmp_path / "a.json")
    assert not demo.vllm_speculates(tree_wins)
    tuning["tokens_per_s"][0][1] = 100.5                  # the one-draft tree now beats AR at B = 1: K = 1 there
    chain_wins = Schedule([(1, 3, (1, 10, 4)), (4, 16, (0, 1, 1))], tuning=tuning).save(tmp_path / "b.json")
    assert demo.vllm_speculates(chain_wins)
