"""The serving engines' formats: `draftgym export` (vLLM, SGLang static, adaptive and throughput-aware
configs, checked against each engine's rules) and `draftgym profile-import` of SGLang's timing file."""
from __future__ import annotations

import json

import pytest

from online.cli import main as cli
from pipeline.decode import step_shape
from pipeline.errors import DataError
from simulator.latency.model import LatencyModel
from simulator.serving.choosers.sglang_adaptive import AdaptiveTier, SGLangAdaptive, parse_config
from simulator.serving.formats import export as ex
from simulator.serving.formats.sglang_import import latency_rows, read_bench
from simulator.serving.schedule import Schedule


def _tuned(tmp_path, ranges, shapes, tps):
    s = Schedule(ranges, tuning={"batch_sizes": [r[0] for r in ranges], "shapes": [step_shape.label(x) for x in shapes],
                                 "tokens_per_s": tps})
    return s, str(s.save(tmp_path / "s.json"))


def test_export_vllm(tmp_path):
    chains, path = _tuned(tmp_path, [(1, 7, step_shape.chain(5)), (8, 31, step_shape.chain(2)), (32, 64, step_shape.OFF)],
                          [step_shape.OFF, step_shape.chain(2), step_shape.chain(5)], [[1, 2, 3], [1, 3, 2], [3, 2, 1]])
    cfg, _ = ex.to_vllm(chains, "org/head")
    ex.check_vllm(cfg)
    assert cfg == {"method": "eagle3", "model": "org/head", "num_speculative_tokens": 5,
                   "num_speculative_tokens_per_batch_size": [[1, 7, 5], [8, 31, 2], [32, 64, 0]]}
    assert ex.to_vllm(chains, None, max_batch=512)[0]["num_speculative_tokens_per_batch_size"][-1] == [32, 512, 0]
    for bad in ({**cfg, "num_speculative_tokens": 1}, {**cfg, "num_speculative_tokens_per_batch_size": [[2, 4, 1]]},
                {**cfg, "num_speculative_tokens_per_batch_size": [[1, 4, 1], [6, 9, 1]]}):
        with pytest.raises(DataError, match="vLLM"):
            ex.check_vllm(bad)
    tree, path = _tuned(tmp_path, [(1, 3, (4, 4, 20)), (4, 8, step_shape.chain(2))], [(4, 4, 20), step_shape.chain(2), step_shape.chain(1)],
                        [[9, 5, 6], [1, 4, 3]])
    with pytest.raises(DataError, match="vLLM cannot run tree:4,4,20.*chains only"):
        ex.to_vllm(tree, None)
    cfg, notes = ex.to_vllm(tree, None, best=True)
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 3, 1], [4, 8, 2]] and "tree:4,4,20 -> chain:1" in notes[0]
    with pytest.raises(DataError, match="never speculates"):
        ex.to_vllm(Schedule([(1, 4, step_shape.OFF)]), None)


def test_export_takes_a_one_draft_tree_as_chain_1(tmp_path):
    # logs of width 10 only (no chains tuned): (1, 10, 2) verifies one draft, the top-1, as chain 1 does
    one = (1, 10, 2)
    direct, _ = _tuned(tmp_path, [(1, 3, one), (4, 16, step_shape.OFF)], [step_shape.OFF, one], [[1, 2], [2, 1]])
    cfg, notes = ex.to_vllm(direct, None)
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 3, 1], [4, 16, 0]] and "as chain 1" in notes[0]
    # a deeper tree at B 1-3 in a width-10 table: the best runnable shape there is the one-draft tree
    tree, _ = _tuned(tmp_path, [(1, 3, (3, 10, 8)), (4, 16, one)], [step_shape.OFF, one, (3, 10, 8)],
                     [[1, 2, 3], [2, 3, 1]])
    with pytest.raises(DataError, match="vLLM cannot run tree:3,10,8"):
        ex.to_vllm(tree, None)
    cfg, notes = ex.to_vllm(tree, None, best=True)
    ex.check_vllm(cfg)
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 16, 1]] and "tree:3,10,8 -> tree:1,10,2" in notes[0]
    assert not ex.one_draft((2, 10, 3)) and not ex.one_draft(step_shape.OFF) and ex.one_draft((1, 4, 2))


def test_export_sglang_static_and_adaptive(tmp_path):
    flags, notes = ex.to_sglang_static(Schedule([(1, 8, (3, 4, 10))]), "h")
    f = dict(zip(flags[::2], flags[1::2]))
    assert (f["--speculative-algorithm"], f["--speculative-num-steps"], f["--speculative-eagle-topk"],
            f["--speculative-num-draft-tokens"]) == ("EAGLE3", "3", "4", "10") and not notes
    flags, _ = ex.to_sglang_static(Schedule([(1, 8, step_shape.chain(4))]), "h")
    assert flags[-5:] == ["4", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5"]   # topk 1: V = D + 1
    assert ex.check_sglang_static(2, 4, 12)                           # bench rule D W + 1 >= V: noted, not refused
    with pytest.raises(DataError, match="exceeds the draft pool"):
        ex.check_sglang_static(1, 4, 8)
    multi, path = _tuned(tmp_path, [(1, 3, (4, 4, 20)), (4, 8, step_shape.chain(2))], [(4, 4, 20), step_shape.chain(2), step_shape.OFF],
                         [[9, 5, 1], [1, 4, 1]])
    with pytest.raises(DataError, match="one shape at every batch size"):
        ex.to_sglang_static(multi, None)
    flags, notes = ex.to_sglang_static(multi, None, best=True)       # best mean relative tokens/s: chain 2
    assert flags[flags.index("--speculative-num-steps") + 1] == "2" and "chain:2" in notes[0]
    with pytest.raises(DataError, match="topk = 1 chains only"):
        ex.to_sglang_adaptive(multi, None)
    obj, flags, notes = ex.to_sglang_adaptive(multi, None, best=True, config_path="a.json")
    parse_config(obj)                                                 # SGLang's own checks pass
    assert obj == {"strategy": "ema", "1": {"candidate_steps": [2]}} and notes
    chains = Schedule([(1, 7, step_shape.chain(5)), (8, 31, step_shape.chain(2)), (32, 64, step_shape.OFF)])
    obj, flags, _ = ex.to_sglang_adaptive(chains, "h", config_path="a.json")
    assert {k: v["candidate_steps"] for k, v in obj.items() if k.isdigit()} == {"1": [5], "8": [2], "32": [0]}
    assert "--speculative-adaptive" in flags and flags[flags.index("--speculative-eagle-topk") + 1] == "1"
    ch = SGLangAdaptive(obj)                                          # the exported tiers replay as the schedule
    ch.tiers = {b: AdaptiveTier(9, p) for b, p in ch.tiers_cfg.items()}
    ch.keys = list(ch.tiers)
    assert [ch.tier(b).steps for b in (1, 7, 8, 40)] == [5, 5, 2, 0]


def test_export_sglang_throughput(tmp_path, capsys):
    """SGLang's throughput-aware config: a tier per range, the schedule's K plus the chains within 5 % of
    the best chain at a tuned B of the tier; off and trees refused, or their best chain; SGLang's checks."""
    sched, path = _tuned(tmp_path, [(1, 7, step_shape.chain(5)), (8, 31, step_shape.chain(3)), (32, 64, step_shape.OFF)],
                         [step_shape.OFF, step_shape.chain(1), step_shape.chain(3), step_shape.chain(5)],
                         [[10, 12, 19.5, 20], [30, 35, 40, 30], [90, 80, 60, 40]])
    with pytest.raises(DataError, match="SGLang throughput-aware cannot run off"):
        ex.to_sglang_throughput(sched, None)
    obj, flags, notes = ex.to_sglang_throughput(sched, "h", best=True, config_path="t.json")
    ex.check_sglang_throughput(obj)
    assert (obj["strategy"], obj["window_size"], obj["update_interval"]) == ("throughput_aware", 20, 10)
    assert {k: v["candidate_steps"] for k, v in obj.items() if k.isdigit()} == {"1": [3, 5], "8": [3], "32": [1]}
    assert "batch 32: off -> chain:1" in notes[0]
    f = lambda name: flags[flags.index(name) + 1]
    assert (f("--speculative-num-steps"), f("--speculative-eagle-topk"), f("--speculative-num-draft-tokens"),
            f("--speculative-adaptive-config")) == ("5", "1", "6", "t.json") and "--speculative-adaptive" in flags
    out = tmp_path / "t.json"
    assert cli(["export", "--schedule", path, "--format", "sglang-throughput", "--best-expressible",
                "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == obj
    tree, _ = _tuned(tmp_path, [(1, 3, (4, 4, 20)), (4, 8, step_shape.chain(2))], [(4, 4, 20), step_shape.chain(2), step_shape.chain(1)],
                     [[9, 5, 6], [1, 4, 3]])
    with pytest.raises(DataError, match="cannot run tree:4,4,20"):
        ex.to_sglang_throughput(tree, None)
    with pytest.raises(DataError, match="never speculates"):
        ex.to_sglang_throughput(Schedule([(1, 4, step_shape.OFF)]), None)
    for bad in ({"strategy": "throughput_aware"}, {"1": {"candidate_steps": []}}, {"1": {"candidate_steps": [0, 3]}},
                {"1": {"candidate_steps": [True]}}, {"1": [3]}):
        with pytest.raises(DataError, match="throughput-aware config"):
            ex.check_sglang_throughput(bad)


def test_export_cli(tmp_path, capsys):
    tree, path = _tuned(tmp_path, [(1, 3, (4, 4, 20)), (4, 8, step_shape.chain(2))], [(4, 4, 20), step_shape.chain(2), step_shape.chain(1)],
                        [[9, 5, 6], [1, 4, 3]])
    assert cli(["export", "--schedule", path, "--format", "vllm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("draftgym: error: vLLM cannot run") and err.count("\n") == 1
    out = tmp_path / "v.json"
    assert cli(["export", "--schedule", path, "--format", "vllm", "--best-expressible", "--out", str(out)]) == 0
    ex.check_vllm(json.loads(out.read_text()))
    capsys.readouterr()
    assert cli(["export", "--schedule", path, "--format", "json"]) == 0
    assert Schedule.from_json(json.loads(capsys.readouterr().out)).ranges == tree.ranges


# ------------------------------------------------------------------ SGLang's timing file

BENCH = [
    {"batch_size": 1, "steps": 0, "topk": 0, "num_draft_tokens": 0, "acc_length": 1.0, "step_time": 0.010, "speed": 100.0},
    {"batch_size": 1, "steps": 1, "topk": 1, "num_draft_tokens": 2, "acc_length": 1.6, "step_time": 0.012, "speed": 133.3},
    {"batch_size": 1, "steps": 3, "topk": 1, "num_draft_tokens": 4, "acc_length": 2.2, "step_time": 0.016, "speed": 137.5},
    {"batch_size": 1, "steps": 3, "topk": 4, "num_draft_tokens": 8, "acc_length": 2.6, "step_time": 0.019, "speed": 136.8},
    {"batch_size": 1, "steps": 5, "topk": 4, "num_draft_tokens": 8, "acc_length": 2.8, "step_time": 0.023, "speed": 121.7},
    {"batch_size": 4, "steps": 0, "topk": 0, "num_draft_tokens": 0, "acc_length": 1.0, "step_time": 0.011, "speed": 90.9},
    {"batch_size": 4, "steps": 3, "topk": 1, "num_draft_tokens": 2, "acc_length": 2.2, "step_time": 0.021, "speed": 104.8},
]


def test_sglang_bench_import(tmp_path, capsys, root):
    f = tmp_path / "bench.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in BENCH) + "\n")
    rows = read_bench(f)
    assert rows[6]["shape"] == step_shape.chain(3)                             # topk 1: SGLang runs V = steps + 1
    lat_rows, fit = latency_rows(rows, "m", "bfloat16", "sg", f.name)
    assert max(fit.values()) < 1e-9 and {r["device"] for r in lat_rows} == {"sglang bench_speculative (bench.jsonl)"}
    lat = LatencyModel.from_rows(lat_rows, model="m")
    for r in rows:                                                     # every measured step time comes back
        assert float(lat.t_step(*r["shape"], 0, batch=r["batch"])) == pytest.approx(r["step_time"], rel=1e-9)
    assert float(lat.t_draft(4, 0)) == pytest.approx(0.002)           # the two trees tell draft from verify
    assert cli(["profile-import", str(f), "--out", str(tmp_path / "logs"), "--model", "synthetic-llm",
                "--dtype", "float32", "--compare-logs", str(root), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["replay_max_rel_err"] < 1e-9 and LatencyModel.from_logs(tmp_path / "logs").meta["batch_sizes"] == [1, 4]
    cmp = {(c["batch"], c["shape"]): c for c in rep["acc_length_vs_tau"]}
    assert cmp[(1, "off")]["replayed_tau"] == 1.0 and cmp[(1, "chain:3")]["replayed_tau"] > 1.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(BENCH[0]) + "\n" + json.dumps({k: v for k, v in BENCH[1].items() if k != "step_time"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: .*missing step_time"):
        read_bench(bad)
    with pytest.raises(DataError, match="no speculative row at batch_size 1"):
        latency_rows(read_bench_rows(tmp_path, BENCH[5:]), "m", "bfloat16", "sg", "x")


def read_bench_rows(tmp_path, rows):
    f = tmp_path / "part.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    return read_bench(f)


def test_dspark_cost_table_from_a_profile(tmp_path, capsys):
    """`draftgym cost-table`: SGLang's additive DSpark table, its probes SGLang's own sweep, its checks
    passed, its step time fitted to the profile's (B, budget) grid with the error it reports, and the
    bias and alpha exact at every profiled B when nothing is verified beyond the anchors."""
    import numpy as np

    from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs
    from simulator.serving.formats import dspark_table

    assert dspark_table.batch_token_sweep(40) == [1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
    assert dspark_table.batch_token_sweep(130)[-3:] == [124, 128, 130]
    write_synthetic_logs(tmp_path / "logs", SyntheticConfig(n_sequences=3, widths=(1,), latency_profile="gpu",
                                                           latency_batches=(1, 2, 4, 8)))
    lat = LatencyModel.from_logs(tmp_path / "logs")
    table, fit = dspark_table.dspark_table(lat, gamma=3, context=256)
    dspark_table.check_table(table)
    assert table["bs_probes"] == [1, 2, 4, 8] and table["m_probes"][-1] == 8 * 4
    for B in table["bs_probes"]:                                           # budget 0: the anchors alone
        want = 3 * lat.t_draft(1, 256.0, batch=B) + lat.t_overhead(256.0, batch=B) + lat.t_verify(1, 256.0, batch=B)
        assert float(dspark_table.step_time(table, B, 0)) == pytest.approx(float(want), rel=max(fit["max_rel_error"], 1e-9) + 1e-9)
    grid = [(B, N) for B in (1, 2, 4, 8) for N in range(B * 3 + 1)]
    rel = [abs(float(dspark_table.step_time(table, B, N)) / float(3 * lat.t_draft(1, 256.0, batch=B) + lat.t_overhead(256.0, batch=B)
                                                      + lat.t_verify(1 + N / B, 256.0, batch=B)) - 1) for B, N in grid]
    assert fit["grid_points"] == len(grid) and max(rel) == pytest.approx(fit["max_rel_error"], rel=1e-6)
    assert np.mean(rel) == pytest.approx(fit["mean_rel_error"], rel=1e-6)
    out = tmp_path / "t.json"
    assert cli(["cost-table", "--latency", str(tmp_path / "logs"), "--gamma", "3", "--context", "256", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["bias_seconds"] > 0 and "token probes" in capsys.readouterr().out
    with pytest.raises(DataError, match="strictly increasing"):
        dspark_table.check_table({**table, "m_probes": [2, 1]})
    assert cli(["cost-table", "--latency", str(tmp_path / "nope"), "--gamma", "3", "--out", str(out)]) != 0
    # a profile without an overhead term (imported from an engine's step times): b > 0 all the same, the sums kept
    lat.t_overhead = lambda c, rng=None, batch=1: np.zeros(np.shape(c))
    table, fit = dspark_table.dspark_table(lat, gamma=3, context=256)
    dspark_table.check_table(table)
    assert table["bias_seconds"] == pytest.approx(0.5 * float(lat.t_verify(1, 256.0, batch=1)))
    for B in table["bs_probes"]:
        want = 3 * lat.t_draft(1, 256.0, batch=B) + lat.t_verify(1, 256.0, batch=B)
        assert float(dspark_table.step_time(table, B, 0)) == pytest.approx(float(want), rel=max(fit["max_rel_error"], 1e-9) + 1e-9)
