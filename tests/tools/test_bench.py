"""`make bench` (python -m tools.bench): runs the chosen benchmarks and prints one summary table."""
import argparse
import json
from pathlib import Path

import pytest

from tools.bench import fidelity
from tools.bench.__main__ import BenchConfig, run
from online.cli import build_parser


def test_bench_env_writes_a_summary(tmp_path, capsys):
    assert run(BenchConfig(only="env", out=str(tmp_path))) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "| env | replay env depth/1024: steps/s |" in summary
    assert "| env | replay env shape/1024: steps/s |" in summary
    assert (tmp_path / "env.json").is_file()


def test_bench_refuses_an_unknown_name(tmp_path, capsys):
    assert run(BenchConfig(only="env,nope", out=str(tmp_path))) == 2
    assert "unknown benchmark(s) ['nope']" in capsys.readouterr().err
    assert not (tmp_path / "summary.md").exists()


def test_bench_scale_writes_and_streams(tmp_path, capsys):
    import json

    from tools.bench.scale import main

    common = ["--positions", "3000", "--logs", str(tmp_path / "logs"), "--max-positions", "1000"]
    r = {}
    for phase in ("write", "evaluate", "tune", "validate"):     # each phase as `make bench` runs it, in this process
        assert main(common + ["--phase", phase]) == 0
        line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("SCALE_RESULT ")][-1]
        r[phase] = json.loads(line[len("SCALE_RESULT "):])
    assert r["write"]["positions"] >= 3000 and 0 < r["write"]["bytes_per_position"] < 3000
    assert r["evaluate"]["streamed"] and r["evaluate"]["positions"] == r["write"]["positions"]
    assert set(r["evaluate"]["tokens_per_s"]) == {"ar", "static", "grid-best", "oracle", "ddd", "entropy"}
    (first, _), (last, _) = r["tune"]["ranges"][0], r["tune"]["ranges"][-1]      # [batch range, shape] each
    assert first[0] == 1 and last[1] == 64
    v = r["validate"]              # 3,000 positions, a 1,000 budget: streamed (the 3 prompts' groups are all of them)
    assert v["streamed"] and v["prompts_read"]
    assert main(common[:-1] + ["100000", "--phase", "validate"]) == 0          # the logs fit: read whole
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("SCALE_RESULT ")][-1]
    whole = json.loads(line[len("SCALE_RESULT "):])
    assert not whole["streamed"] and whole["grid_best"] == v["grid_best"]


def _args(**kw):
    ap = argparse.Namespace(model="smollm2-135m", head="default", datasets="mt-bench,humaneval", n_prompts=3,
                            train_prompts=2, max_new_tokens=32, policy=["data/demo/policies/ltd"], batch_sizes="4,16",
                            batch_shapes="chain:2;tree:3,10,8", load_shapes="chain:2", load_requests=8, load_rate=1.5)
    ap.__dict__.update(kw)
    return ap


def test_fidelity_commands_parse():
    """The fidelity benchmark (tools/bench/fidelity.py): every command it runs parses with the real CLI
    (a real run takes 25-30 min: BENCHMARKS.md; the commands themselves are tested where they live)."""
    cmds = fidelity.commands(_args(), "float32", Path("/tmp/x"))
    assert list(cmds)[:4] == ["collect mt-bench train", "collect mt-bench test", "collect humaneval train",
                              "collect humaneval test"] and set(fidelity.SETTINGS) < set(cmds)
    parser = build_parser()
    for name, argv in cmds.items():
        ns = parser.parse_args(argv)
        assert ns.dtype == "float32", name
    v = parser.parse_args(cmds["b1"])
    assert v.profile_first and v.profile_interleave == 1 and v.policies == ["data/demo/policies/ltd"]
    assert parser.parse_args(cmds["batch"]).batch_sizes == "4,16"


def test_fidelity_poisson_trace():
    t = fidelity.poisson_trace(200, 2.0, seed=3)
    assert t[0] == 0.0 and all(b >= a for a, b in zip(t, t[1:])) and t == fidelity.poisson_trace(200, 2.0, seed=3)
    assert 199 / t[-1] == pytest.approx(2.0, rel=0.2)


def test_fidelity_rows_read_the_reports_errors():
    """The rows the fidelity benchmark reads from validate's three reports are the errors they hold."""
    b1 = {"datasets": {"mt-bench": {"sim_vs_real": {
        "ar": {"tokens_per_s_rel_error": -0.03},
        "methods": {"static": {"tokens_per_s_rel_error": 0.12, "reanchored": {"tokens_per_s_rel_error": -0.01},
                               "cost": {"step": 0.02}}}}}}}
    batch = {"datasets": {"mt-bench": {"by_batch": {"4": {"ar": {"replay_rel_error": 0.05, "cost_rel_error": 0.04},
                                                          "chain:2": {"replay_rel_error": None}}}}}}
    load = {"config": {"datasets": ["mt-bench"]}, "rows": [{"name": "AR", "replay_rel_error": {"tokens_per_s": -0.2},
                                                            "cost_rel_error": -0.1}, {"name": "x", "replay_rel_error": None}]}
    rows = fidelity.b1_rows(b1) + fidelity.batch_rows(batch) + fidelity.load_rows(load)
    assert [(r["setting"], r["method"], r["raw"], r["own_text"], r["clock"]) for r in rows] == [
        ("B = 1", "ar", -0.03, None, None), ("B = 1", "static", 0.12, -0.01, 0.02), ("B = 4", "ar", 0.05, None, 0.04),
        ("load", "AR", -0.2, None, -0.1)]
    s = fidelity.summary(rows)
    assert s["rows"] == 4 and s["max_abs"] == pytest.approx(0.2) and s["within_10pct"] == 2
    assert s["mean_abs"] == pytest.approx((0.03 + 0.12 + 0.05 + 0.2) / 4)
    run = {"dtype": "float32", "environment": {"cpu_model": "cpu"}, "rows": rows, "summary": s, "commands": [],
           "by_setting": {"B = 1": fidelity.summary(rows[:2])}}
    md = fidelity.tables({"date": "d", "runs": [run]})
    assert "| B = 1 | mt-bench | static | +12.0% | -1.0% | +2.0% |" in md and "4 rows, mean |raw error| 10.0 %" in md


def test_fidelity_repeatability_sets_two_runs_side_by_side(tmp_path):
    """--repeatability: two runs' work folders, matched row by row: real decoding's run-to-run change
    beside each run's replay error; a row measured in one run only is left out."""
    def batch(real_ar, real_chain, err):
        return {"datasets": {"humaneval": {"by_batch": {"4": {
            "ar": {"replay_rel_error": err, "cost_rel_error": err, "held_decode_tokens_per_s": real_ar},
            "chain:2": {"replay_rel_error": -err, "cost_rel_error": 0.0, "held_decode_tokens_per_s": real_chain}}}}}}
    for name, rep in (("a", batch(100.0, 80.0, 0.04)), ("b", batch(108.0, 60.0, 0.02))):
        (tmp_path / name / "batch").mkdir(parents=True)
        (tmp_path / name / "batch" / "report.json").write_text(json.dumps(rep))
    (tmp_path / "a" / "load").mkdir()
    (tmp_path / "a" / "load" / "report.json").write_text(json.dumps({"config": {"datasets": ["x"]}, "rows": [
        {"name": "AR", "tokens_per_s": 50.0, "replay_rel_error": {"tokens_per_s": 0.1}}]}))
    rep = fidelity.repeatability(tmp_path / "a", tmp_path / "b")
    assert [(r["method"], round(r["real_rel"], 4)) for r in rep["rows"]] == [("ar", 0.08), ("chain:2", -0.25)]
    s = rep["by_setting"]["B = 4"]
    assert s["rows"] == 2 and s["real_mean_abs"] == pytest.approx(0.165) and s["real_within_10pct"] == 1
    assert s["replay_mean_abs"] == pytest.approx(0.03) and "load" not in rep["by_setting"]
    assert "| B = 4 | 2 | 16.5 % | 25.0 % | 1 | 3.0 % |" in fidelity.repeatability_table(rep)
    assert fidelity.main(["--repeatability", str(tmp_path / "a"), str(tmp_path / "nope")]) == 2
