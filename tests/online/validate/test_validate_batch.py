"""`draftgym validate --batch-sizes` (every method at every B, its step table, the per-B report) and
`draftgym validate --load-trace` (the engine under arrivals beside the continuous-batching replay)."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from online.cli import main as cli

def test_validate_batch_sizes_end_to_end(tmp_path, tiny_model_dir, batch_logs, capsys):
    """AR, a tree, a chain and a schedule at B = 1 and 2 on a queue of max(3, 2B) prompts: every row
    exact against its batch-1 AR output (fp32), the figures of every (B, method), the step table
    (one file per B, agreeing with the report), the plot, and replayed tokens/s with its error."""
    sched = tmp_path / "schedule.json"
    sched.write_text(json.dumps({"format": "draftgym.schedule", "version": 1,
                                 "ranges": [{"batch": [1, 1], "shape": "chain:3"}, {"batch": [2, 4], "shape": "chain:1"}]}))
    out = tmp_path / "report"
    rc = cli(["validate", "--model", str(tiny_model_dir), "--head", "random", "--batch-sizes", "1,2", "--n-prompts", "3",
              "--runs", "2", "--max-new-tokens", "10", "--shapes", "tree:3,10,10;chain:2", "--schedule", str(sched),
              "--logs", str(batch_logs), "--out", str(out), "--json", "--no-progress"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["methods"] == ["ar", "tree:3,10,10", "chain:2", "schedule"] and rep["batch_sizes"] == [1, 2]
    e = rep["datasets"]["mt-bench"]
    assert e["lossless"] and e["lossless_counts"] == {"exact": 2 * (3 + 4) * 4, "near-tie": 0, "mismatch": 0}
    for B, requests in (("1", 3), ("2", 4)):
        by = e["by_batch"][B]
        assert list(by) == rep["methods"] and by["ar"]["speedup_vs_ar"] == 1.0
        assert by["schedule"]["shape"] == ("chain:3" if B == "1" else "chain:1")
        for name, s in by.items():
            assert s["requests"] == requests and s["held_batch"] == int(B) and s["lossless"]["exact"] == 2 * requests
            assert s["tokens_per_s"] > 0 and s["per_request_tokens_per_s"] > 0 and s["tau"] >= 1.0
            assert s.get("replayed_tokens_per_s", 0) > 0 and s["replay_rel_error"] is not None, (name, e["replay"])
            assert s["replay_tau_rel_error"] == pytest.approx(0.0, abs=1e-12), (B, name)   # fp32: exact per row
            assert s["cost_rel_error"] > -1, (B, name)          # the clock on the device's own held-window steps
        assert [by[n]["drafts_per_step"] for n in ("ar", "tree:3,10,10", "chain:2")] == [0.0, 9.0, 2.0]
        steps = pq.read_table(e["step_tables"][B]).to_pylist()
        assert {r["method"] for r in steps} == set(rep["methods"]) and {r["run"] for r in steps} == {0, 1}
        assert max(r["batch"] for r in steps) == int(B) and all(r["active"] == len(r["accepted"]) for r in steps)
        for name in rep["methods"]:
            rows = [r for r in steps if r["method"] == name]
            assert sum(r["emitted_sum"] for r in rows) + 2 * requests == by[name]["new_tokens"]
    assert {r.split("/")[0] for r in e["prompts"]} == {"mt-bench"}
    md = (out / "report.md").read_text()
    assert "### B = 2" in md and "| schedule | chain:1 |" in md and (out / "tokens_per_s_vs_batch.png").stat().st_size > 0


def test_validate_batch_profile_interleave(tmp_path, tiny_model_dir, batch_logs, capsys):
    """--profile-interleave at --batch-sizes: one slice per (run, B), the time-local profile written
    under OUT (the measured levels from the slices: the methods' verify sizes at the two context
    levels; prefill and policy rows copied from the logs' profile), the replay timed with it and the
    logs' profile's error kept as the second column."""
    from online.validate.interleave import slice_grid

    assert slice_grid([(0, 1, 1), (2, 1, 5), (8, 10, 60)]) == ((1, 10), (1, 3, 60))
    out = tmp_path / "report"
    rc = cli(["validate", "--model", str(tiny_model_dir), "--head", "random", "--batch-sizes", "1,2", "--n-prompts", "3",
              "--runs", "2", "--max-new-tokens", "8", "--shapes", "chain:2", "--profile-interleave", "1",
              "--logs", str(batch_logs), "--out", str(out), "--json", "--no-progress"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    pi = rep["profile_interleave"]
    assert pi["slices"] == 2 * 2 * 2 and pi["rounds"] == 1 and len(pi["contexts"]) == 2 and pi["copied_rows"] > 0
    assert set(pi["levels"]) == {f"{op}@B{B}" for op in ("draft_step", "verify", "overhead") for B in (1, 2)}
    rows = pq.read_table(pi["path"]).to_pylist()
    assert {r["profile_id"] for r in rows} == {pi["profile_id"]}
    ver = [r for r in rows if r["op"] == "verify"]
    assert {(r["verify_size"], r["context_len"], r["batch"]) for r in ver} == \
        {(V, c, B) for V in (1, 3) for c in pi["contexts"] for B in (1, 2)}
    assert all(r["n"] == 4 for r in ver)                         # 1 round x 2 runs x 2 methods
    assert {r["op"] for r in rows} >= {"prefill", "policy"}      # copied from the logs' profile
    for B in ("1", "2"):
        for name, s in rep["datasets"]["mt-bench"]["by_batch"][B].items():
            assert s["replayed_tokens_per_s"] > 0 and s["replayed_tokens_per_s_logs_profile"] > 0, name
            assert s["replayed_tokens_per_s"] != s["replayed_tokens_per_s_logs_profile"]
    md = (out / "report.md").read_text()
    assert "time-local profile" in md and "the logs' profile | its error |" in md


def test_validate_batch_bad_inputs(tmp_path, capsys):
    base = ["validate", "--logs", "", "--out", str(tmp_path / "r")]
    bad_sched = tmp_path / "bad.json"
    bad_sched.write_text("{\"format\": \"other\"}")
    cases = [(["--batch-sizes", "1,2", "--policy", "ddd"], "--policy runs at batch 1 only"),
             (["--schedule", str(bad_sched)], "--schedule needs --batch-sizes"),
             (["--batch-sizes", "1,0"], "--batch-sizes values must be >= 1"),
             (["--batch-sizes", "2", "--shapes", "tree:8,10"], "bad shape"),
             (["--batch-sizes", "2", "--shapes", "off"], "'off' is the AR method"),
             (["--batch-sizes", "2", "--schedule", str(bad_sched)], "not a DraftGym schedule"),
             (["--batch-sizes", "2", "--profile-first", "--logs", str(tmp_path)], "--profile-first runs at batch 1 only")]
    for argv, msg in cases:
        assert cli([*base, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err


def test_validate_batch_bf16_classifies_rows(tmp_path, tiny_model_dir, capsys):
    """bf16: each row of each method is classified against its batch-1 AR output (exact / near-tie /
    mismatch); the counts cover every row, and the Markdown names the dtype."""
    out = tmp_path / "r"
    rc = cli(["validate", "--model", str(tiny_model_dir), "--head", "random", "--batch-sizes", "2", "--n-prompts", "2",
              "--runs", "1", "--max-new-tokens", "8", "--dtype", "bfloat16", "--shapes", "chain:2", "--logs", "",
              "--out", str(out), "--json", "--no-progress"])
    rep = json.loads(capsys.readouterr().out)
    e = rep["datasets"]["mt-bench"]
    assert rep["dtype"] == "bfloat16" and rc == (0 if e["lossless"] else 1)
    assert sum(e["lossless_counts"].values()) == 2 * 4
    assert all(sum(s["lossless"].values()) == 4 for s in e["by_batch"]["2"].values())
    assert "bfloat16" in (out / "report.md").read_text() and rep["replay_note"].startswith("no --logs")


# ---------------------------------------------------------------------------------- validate --load-trace

def test_validate_load_trace_end_to_end(tmp_path, tiny_model_dir, batch_logs, capsys):
    """A trace of 7 requests (a burst, then stragglers) served at most 2 rows at a time by every
    method: each row exact against its batch-1 AR output (fp32), the device's figures and the
    replay's prediction of the same trace side by side, the Markdown report."""
    trace = tmp_path / "trace.txt"
    trace.write_text("# arrival times, s\n0\n0\n0\n0.001\n0.002\n30\n30.5\n")
    sched = tmp_path / "schedule.json"
    sched.write_text(json.dumps({"format": "draftgym.schedule", "version": 1,
                                 "ranges": [{"batch": [1, 1], "shape": "chain:3"}, {"batch": [2, 4], "shape": "chain:1"}]}))
    out = tmp_path / "load"
    rc = cli(["validate", "--model", str(tiny_model_dir), "--head", "random", "--load-trace", str(trace),
              "--max-batch", "2", "--n-prompts", "3", "--runs", "1", "--shapes", "tree:3,10,10;chain:2",
              "--schedule", str(sched), "--logs", str(batch_logs), "--nightjar-k", "2", "--out", str(out), "--json",
              "--no-progress"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in rep["rows"]]
    assert names == ["AR", "static tree:3,10,10", "static chain:2", "schedule (per B)", "vLLM EAGLE-3 example",
                     "SGLang adaptive", "SGLang throughput-aware",          # priced by --logs' profile
                     "Nightjar bandit (authors' fork)"]
    assert rep["trace"]["requests"] == 7 and rep["replay_note"] is None
    for r in rep["rows"]:
        assert r["lossless"] == {"exact": 7, "near-tie": 0, "mismatch": 0}, r["name"]
        assert r["tokens_per_s"] > 0 and 1 <= r["mean_batch"] <= 2 and r["max_batch"] <= 2 and r["tau"] >= 1
        sim = r["replay"]
        assert sim["tokens_per_s"] > 0 and 1 <= sim["mean_batch"] <= 2 and sim["max_batch"] <= 2
        if r["name"] == "AR" or r["name"].startswith("static"):   # a static shape's cycles do not depend on the batch
            assert r["replay_rel_error"]["tau"] == pytest.approx(0.0, abs=1e-9), r["name"]
    ar = rep["rows"][0]
    assert ar["x_ar"] == 1.0 and ar["drafts_per_step"] == 0 and ar["tau"] == 1.0
    assert rep["rows"][2]["drafts_per_step"] == 2.0
    md = (out / "report.md").read_text()
    assert "validate --load-trace" in md and "| SGLang adaptive |" in md and "7 / 0 / 0" in md
    # the replay error split into cost and path (online/validate/load.py), and the device's step table
    for r in rep["rows"]:
        c, e = r["cost_rel_error"], r["replay_rel_error"]["tokens_per_s"]
        assert c > -1 and set(r["cost_rel_error_by_batch"]) <= {"1", "2"}, r["name"]
        assert r["path_rel_error"] == pytest.approx((1 + e) * (1 + c) - 1), r["name"]
    steps = pq.read_table(rep["steps_file"]).to_pylist()
    assert {s["method"] for s in steps} == set(names) and {s["batch"] for s in steps} <= {1, 2}
    assert sum(s["emitted_sum"] for s in steps if s["method"] == "AR") > 0 and "cost / path %" in md
    # the fixture profiles prefill at 64, 256, 1024 tokens (the default); 3 of the 7 requests' prompts are shorter
    assert rep["prefill_note"].startswith("prefill: of 7 prompts (53-101 tokens), 3 below (charged as 64 tokens)")
    assert f"note: {rep['prefill_note']}" in md


def test_validate_load_trace_keeps_its_report_when_the_step_table_fails(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """The step table is a by-product: a failure to write it is a note in the report, not a lost run."""
    import online.validate.load as load
    from pipeline.errors import DataError

    def refuse(*a, **k):
        raise DataError("disk full")

    monkeypatch.setattr(load, "write_batch_steps", refuse)
    trace = tmp_path / "trace.txt"
    trace.write_text("0\n0\n")
    out = tmp_path / "load"
    assert cli(["validate", "--model", str(tiny_model_dir), "--head", "random", "--load-trace", str(trace),
                "--max-batch", "2", "--n-prompts", "2", "--runs", "1", "--max-new-tokens", "4", "--logs", "", "--out", str(out),
                "--json", "--no-progress"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["steps_file"] is None and rep["steps_note"] == "step table not written: disk full"
    assert "note: step table not written: disk full" in (out / "report.md").read_text()


def test_validate_load_trace_bad_inputs(tmp_path, capsys):
    base = ["validate", "--logs", "", "--out", str(tmp_path / "r")]
    bad = tmp_path / "bad.txt"
    bad.write_text("0\n2\n1\n")
    cases = [(["--load-trace", str(tmp_path / "none.txt")], "not found"),
             (["--load-trace", str(bad)], "must not decrease"),
             (["--load-trace", str(bad), "--batch-sizes", "2"], "--load-trace and --batch-sizes"),
             (["--load-trace", str(bad), "--max-batch", "0"], "argument --max-batch: must be >= 1")]
    for argv, msg in cases:
        assert cli([*base, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err
