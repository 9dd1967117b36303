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
    # bf16 is emulated on AVX2-only CPUs: that run checks the dtype reaches every step, on a smaller profile grid
    grid = ["--verify-sizes", "1,4,16,60", "--contexts", "16,64", "--serving-context", "64"] if dtype == "float32" else \
        ["--verify-sizes", "1,16,60", "--contexts", "16,64", "--batch-sizes", "none"]
    rc = demo.main(["--model", str(tiny_model_dir), "--head", "random", "--out", str(out), "--train-prompts", "2",
                    "--test-prompts", "1", "--max-new-tokens", "8", "--ltd-steps", "2048", "--no-ray",
                    "--dtype", dtype] + grid)
    assert rc == 0
    printed = capsys.readouterr().out
    steps = 12 if dtype == "float32" else 9                   # bf16 (emulated here) leaves out the serving steps
    assert f"[9/{steps}] draftgym validate" in printed and "demo finished" in printed
    rep = json.loads((out / "report" / "report.json").read_text())
    assert set(rep["datasets"]) == {"mt-bench", "humaneval"}
    assert rep["dtype"] == dtype and rep["device"].endswith(f"[{dtype}]") and rep["environment"]["dtype"] == dtype
    for e in rep["datasets"].values():
        assert e["lossless"] and "ltd" in e["methods"]
        assert e["lossless_counts"]["mismatch"] == 0 and sum(e["lossless_counts"].values()) == 3   # 3 EAGLE-3 methods
        if dtype == "float32":
            assert e["lossless_counts"]["exact"] == 3
    assert (out / "policies" / "ltd" / "manifest.json").is_file()
    assert list((out / "logs" / "latency").rglob("*-policies-*.parquet"))      # profile-policy ran
    # validate re-profiled right before decoding and once between the generations, into the report
    # folder, and timed sim-vs-real with the pooled profile
    assert rep["profile_interleave"]["rounds"] == 2
    assert rep["latency_profile"]["profile_id"] == rep["profile_interleave"]["profile_id"] != rep["profile_first"]["profile_id"]
    assert list((out / "report" / "latency").rglob("*-policies-*.parquet"))
    if dtype == "float32":                                    # the serving steps: a schedule from B = 1, 4, 16
        sched = json.loads((out / "serving" / "schedule.json").read_text())
        assert sched["ranges"][0]["batch"][0] == 1 and sched["ranges"][-1]["batch"][1] == 16
        assert sched["meta"]["split"] == "train" and sched["tuning"]["batch_sizes"] == [1, 4, 16]
        assert "headroom: " in printed
        if all(r["shape"] == "off" for r in sched["ranges"]):        # a random head: nothing is accepted
            assert "[12/12] export: skipped, the schedule never speculates" in printed
        else:
            vllm = json.loads((out / "serving" / "vllm_speculative_config.json").read_text())
            assert "num_speculative_tokens_per_batch_size" in json.dumps(vllm) and "[12/12] draftgym export" in printed
