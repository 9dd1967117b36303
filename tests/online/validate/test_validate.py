"""`draftgym validate` end to end on a tiny target: collect -> profile -> train -> validate; and its
one driver's warm-up (online/validate/speedbench.py run_calls): "short" decodes 8 tokens of two
requests per method, "full" every call of run 0 in full per method (validate --load-trace with CUDA
graphs), and neither reaches the timed results."""
from __future__ import annotations

import json

import pytest

from online.cli import main as cli
from online.validate.speedbench import Call, run_calls
from pipeline.decode.engine.result import BatchResult, RowResult
from tests.conftest import build_tiny_logs


@pytest.fixture(scope="module")
def tiny_logs(tmp_path_factory, tiny_model_dir):
    return build_tiny_logs(tmp_path_factory.mktemp("logs"), tiny_model_dir, n_prompts=3)


def test_validate_end_to_end(tmp_path, tiny_model_dir, tiny_logs, capsys):
    pol = tmp_path / "ltd"
    assert cli(["train", "--method", "ltd", "--logs", str(tiny_logs), "--model", str(tiny_model_dir), "--out", str(pol),
                "--steps", "2000", "--iters", "0", "--no-progress"]) == 0
    # the checkpoint's own per-call cost, measured in the engine, joins the newest profile
    capsys.readouterr()
    assert cli(["profile-policy", "--policy", str(pol), "--logs", str(tiny_logs), "--model", str(tiny_model_dir),
                "--head", "random", "--max-new-tokens", "12", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    from simulator.latency.model import LatencyModel
    from simulator.methods.checkpoint import latency_key, load_checkpoint
    key = latency_key(pol)
    assert set(cost["per_call_s"]) == {key} and cost["per_call_s"][key] > 0
    lat = LatencyModel.from_logs(tiny_logs)
    assert lat.call_s(key) == pytest.approx(cost["per_call_s"][key]) and lat.call_s(None) == lat.policy_s
    assert load_checkpoint(pol).latency_key == key
    out = tmp_path / "report"
    capsys.readouterr()
    rc = cli(["validate", "--model", str(tiny_model_dir), "--head", "random", "--policy", str(pol), "--policy", "ddd",
              "--dataset", "mt-bench", "--n-prompts", "2", "--runs", "2", "--max-new-tokens", "16",
              "--logs", str(tiny_logs), "--out", str(out), "--json"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    e = rep["datasets"]["mt-bench"]
    assert e["lossless"] and e["lossless_checked"]
    assert set(e["methods"]) == {"ar", "static", "grid-best", "ltd", "ddd"}
    for name, m in e["methods"].items():
        assert m["tokens_per_s"] > 0 and m["speedup_vs_ar"] > 0
        if name != "ar":   # fp32: every generation exactly AR's (2 prompts x 2 runs)
            assert m["lossless"] == {"exact": 4, "near-tie": 0, "mismatch": 0}
    svr = e["sim_vs_real"]["methods"]
    assert set(svr) == {"static", "grid-best", "ltd", "ddd"} and not e["sim_vs_real"]["missing_prompts"]
    for m in svr.values():
        assert abs(m["tau_rel_error"]) < 0.02     # same logged tokens, exact replay: tau must agree
    # the AR row gives the machine speed factor; the anchored error is the raw one rescaled by it
    k = e["sim_vs_real"]["machine_speed_factor"]
    a = e["sim_vs_real"]["ar"]
    assert k == pytest.approx(a["real_decode_tokens_per_s"] / a["sim_decode_tokens_per_s"])
    for m in svr.values():
        raw, anch = m["tokens_per_s_rel_error"], m["tokens_per_s_rel_error_ar_anchored"]
        assert (1 + anch) == pytest.approx(k * (1 + raw))
    assert (out / "report.md").is_file() and (out / "speedup.png").is_file() and (out / "sim_vs_real.png").is_file()
    cyc = list((out / "cycles").rglob("*.parquet"))
    assert len(cyc) == 1
    assert cli(["query", "SELECT method, count(*) AS n FROM cycles GROUP BY method ORDER BY method",
                "--logs", str(out), "--format", "json"]) == 0


def test_validate_bad_inputs(capsys, tmp_path):
    assert cli(["validate", "--policy", str(tmp_path / "nope"), "--logs", ""]) == 2
    assert "policy not found" in capsys.readouterr().err
    assert cli(["validate", "--logs", str(tmp_path / "missing")]) == 2
    assert "logs directory not found" in capsys.readouterr().err
    assert cli(["profile-policy", "--policy", str(tmp_path), "--logs", str(tmp_path)]) == 2
    assert "no latency profile" in capsys.readouterr().err


def test_validate_sampling_without_logs_at_t(tmp_path, tiny_model_dir, tiny_logs, capsys):
    """T = 1 with only greedy logs: grid-best from the T = 0 logs, sim-vs-real skipped with a note."""
    out = tmp_path / "t1"
    capsys.readouterr()
    assert cli(["validate", "--model", str(tiny_model_dir), "--head", "random", "--policy", "ddd",
                "--dataset", "mt-bench", "--n-prompts", "1", "--runs", "2", "--max-new-tokens", "8",
                "--temperature", "1", "--logs", str(tiny_logs), "--out", str(out), "--json"]) == 0
    e = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["datasets"]["mt-bench"]
    assert not e["lossless_checked"] and len(e["grid_best"]) == 3
    assert "no logs at temperature 1" in e["sim_vs_real"]["note"]
    assert set(e["methods"]) == {"ar", "static", "grid-best", "ddd"}


@pytest.fixture(scope="module")
def radar_ckpt(tmp_path_factory, tiny_model_dir, tiny_logs):
    pol = tmp_path_factory.mktemp("pol") / "radar"
    assert cli(["train", "--method", "radar", "--logs", str(tiny_logs), "--model", str(tiny_model_dir), "--out", str(pol),
                "--steps", "200", "--no-progress"]) == 0
    return pol


def test_validate_profile_first(tmp_path, tiny_model_dir, tiny_logs, radar_ckpt, capsys):
    """--profile-first: a fresh in-situ profile (and the checkpoint's call cost) under OUT, used for
    grid-best and sim-vs-real; the logs' own profile is left as it was."""
    from pipeline.logs.schema import table_files

    pol = radar_ckpt
    before = sorted(map(str, table_files(tiny_logs, "latency")))
    out = tmp_path / "pf"
    capsys.readouterr()
    assert cli(["validate", "--model", str(tiny_model_dir), "--head", "random", "--policy", str(pol),
                "--dataset", "mt-bench", "--n-prompts", "1", "--runs", "1", "--max-new-tokens", "12",
                "--logs", str(tiny_logs), "--out", str(out), "--profile-first", "--profile-verify-sizes", "1,2,4,8",
                "--profile-contexts", "16,48", "--profile-repeats", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(map(str, table_files(tiny_logs, "latency"))) == before
    pf = rep["profile_first"]
    assert pf["policies_timed"] == 1 and {k: v for k, v in rep["latency_profile"].items() if k != "trust_note"} == {
        "root": str(out), "profile_id": pf["profile_id"], "point": "robust"}
    note = rep["latency_profile"]["trust_note"]          # a tiny target's noisy cells may be named, in one line
    assert note is None or (note.startswith(f"latency profile {pf['profile_id']}: left out") and "\n" not in note)
    from simulator.latency.model import LatencyModel
    from simulator.methods.checkpoint import latency_key
    lat = LatencyModel.from_logs(out)
    assert lat.meta["profile_id"] == pf["profile_id"] and latency_key(pol) in lat.policy_costs
    assert sorted(set(lat.verify.points["x"].tolist())) == [1.0, 2.0, 4.0, 8.0]
    assert "radar" in rep["datasets"]["mt-bench"]["sim_vs_real"]["methods"]
    assert "--profile-first" in (out / "report.md").read_text()
    # --profile-first without logs is refused in one line
    assert cli(["validate", "--profile-first", "--logs", ""]) == 2
    assert "--profile-first needs --logs" in capsys.readouterr().err


def test_validate_profile_interleave(tmp_path, tiny_model_dir, tiny_logs, radar_ckpt, capsys):
    """--profile-interleave 2: one round before decoding, two more spread between the generations,
    and sim-vs-real timed with the profile pooled over all three (which also carries the call costs)."""
    out = tmp_path / "pi"
    capsys.readouterr()
    assert cli(["validate", "--model", str(tiny_model_dir), "--head", "random", "--policy", "ddd", "--policy", str(radar_ckpt),
                "--dataset", "mt-bench", "--n-prompts", "2", "--runs", "2", "--max-new-tokens", "10",
                "--logs", str(tiny_logs), "--out", str(out), "--profile-interleave", "2", "--profile-verify-sizes",
                "1,4", "--profile-contexts", "16,40", "--profile-repeats", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    pi = rep["profile_interleave"]
    assert pi["rounds"] == 3 and pi["jobs"] == 3 * 2            # a job: one context's generation
    assert rep["latency_profile"]["profile_id"] == pi["profile_id"] != rep["profile_first"]["profile_id"]
    from simulator.latency.model import LatencyModel
    first = LatencyModel.from_logs(out, profile=rep["profile_first"]["profile_id"])
    pooled = LatencyModel.from_logs(out, profile=pi["profile_id"])
    assert pooled.meta["profile_id"] == pi["profile_id"]
    e = rep["datasets"]["mt-bench"]
    assert set(e["sim_vs_real"]["methods"]) == {"static", "grid-best", "ddd", "radar"}
    assert "--profile-interleave" in (out / "report.md").read_text()
    # drift: the clock is the pooled profile x the speed its samples saw during this dataset's decoding;
    # for static trees (no policy calls) that divides the simulated tokens/s by exactly that factor
    svr = e["sim_vs_real"]
    f = svr["profile_speed_factor"]["factor"]
    assert svr["profile_speed_factor"]["cells"] >= 1 and 0.2 < f < 5
    st = svr["methods"]["static"]
    assert 1 + st["tokens_per_s_rel_error"] == pytest.approx((1 + st["tokens_per_s_rel_error_pooled"]) / f, rel=1e-6)
    assert "tokens_per_s_rel_error_pooled" in svr["ar"]
    assert "tok/s error, pooled" in (out / "report.md").read_text()
    # the clock alone: each method's own cycles priced by the clock, and the error at every cell statistic
    assert st["cost"]["cycles"] >= 1 and st["cost"]["step"] > -1 and list(st["cost"]["verify_by_V"]) == ["60"]   # (8, 10, 60)
    assert list(svr["by_point"]) == ["robust", "median", "mean"]
    assert svr["by_point"]["robust"]["static"] == pytest.approx(st["tokens_per_s_rel_error"])   # the default point
    assert "The clock on decoding's own cycles" in (out / "report.md").read_text()
    from pipeline.logs.schema import read_table, table_files
    n = {}
    for f in table_files(out, "latency"):
        for r in read_table(f, "latency").to_pylist():
            if r["op"] == "verify":
                n[r["profile_id"]] = n.get(r["profile_id"], 0) + r["n"]
    # pooled: every round's samples (--profile-repeats 2 steps per (V, c) per round, 2 x 2 points, 3 rounds)
    assert n[pi["profile_id"]] == 3 * 2 * 4 and n[rep["profile_first"]["profile_id"]] == 2 * 4
    # the checkpoint's call cost, timed before decoding, is carried over to the pooled profile
    from simulator.methods.checkpoint import latency_key
    assert pooled.policy_costs[latency_key(radar_ckpt)] == pytest.approx(first.policy_costs[latency_key(radar_ckpt)])


def test_validate_logs_of_another_dtype(tmp_path, tiny_model_dir, tiny_logs, capsys):
    """Transfer online: fp32 acceptance logs, bf16 decoding with its own fresh profile (--logs-dtype)."""
    base = ["validate", "--model", str(tiny_model_dir), "--head", "random", "--policy", "ddd", "--dataset", "mt-bench",
            "--n-prompts", "1", "--runs", "1", "--max-new-tokens", "8", "--logs", str(tiny_logs), "--dtype", "bfloat16"]
    assert cli(base + ["--out", str(tmp_path / "refused")]) == 2
    assert "no bfloat16 logs" in capsys.readouterr().err
    out = tmp_path / "xfer"
    assert cli(base + ["--logs-dtype", "float32", "--profile-first", "--profile-verify-sizes", "1,8",
                       "--profile-contexts", "32", "--profile-repeats", "1", "--out", str(out), "--json"]) in (0, 1)
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["dtype"] == "bfloat16" and rep["logs_dtype"] == "float32" and "bfloat16" in rep["device"]
    e = rep["datasets"]["mt-bench"]
    assert len(e["grid_best"]) == 3 and set(e["sim_vs_real"]["methods"]) == {"static", "grid-best", "ddd"}
    assert "acceptance logs in **float32**" in (out / "report.md").read_text()


def test_validate_refuses_logs_without_the_static_default_width(tmp_path):
    """Logs collected at other widths only: one line before any decoding (the static default's sim-vs-real
    row replays width 10), not a traceback after it."""
    from online.validate.common import ValidateConfig, load_acceptance_logs
    from pipeline.errors import DataError
    from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs

    write_synthetic_logs(tmp_path, SyntheticConfig(n_sequences=3, widths=(2,)))
    cfg = ValidateConfig(model="synthetic-llm", logs=str(tmp_path), temperature=0.0)
    with pytest.raises(DataError, match=r"widths \[2\].*collect with --widths 10"):
        load_acceptance_logs(cfg, None)


def test_step_cost_prices_the_devices_own_steps():
    """validate --load-trace's cost error (online/validate/sim_vs_real.py step_cost): each step priced by the
    profile at its own shape, B and step context (the longest row's), against t_step less
    t_controller; per B and over all steps, by hand."""
    from online.validate.sim_vs_real import step_cost
    from pipeline.decode.controller import StepRecord
    from simulator.latency.model import LatencyModel
    from tests.simulator.latency.test_latency_batch import hand_rows

    lat = LatencyModel.from_rows(hand_rows())

    def step(B, shape, ctx, factor, t_ctrl=0.0):
        D, W, V = shape
        t = float(lat.t_step(D, W, V, max(ctx), batch=B))
        return StepRecord(step=0, batch_size=B, depth=D, width=W, verify_size=V, rows=list(range(B)),
                          context_lens=ctx, accepted=[0] * B, emitted=[1] * B, queued=0,
                          t_controller=t_ctrl, t_step=factor * t + t_ctrl), t

    (a, ta), (b, tb), (c, tc) = step(1, (0, 1, 1), [150], 1.25), step(2, (3, 4, 8), [120, 280], 1.0, 0.5), \
        step(2, (2, 1, 3), [100, 200], 0.8)
    out = step_cost([a, b, c], lat)
    assert out["by_batch"][1] == pytest.approx(1 / 1.25 - 1)
    assert out["by_batch"][2] == pytest.approx((tb + tc) / (tb + 0.8 * tc) - 1)     # the controller's 0.5 s left out
    assert out["rel_error"] == pytest.approx((ta + tb + tc) / (1.25 * ta + tb + 0.8 * tc) - 1)
    assert step_cost([], lat) == {"rel_error": None, "by_batch": {}}


def test_cycle_cost_compares_the_profile_with_decodings_own_cycles():
    """Batch-1 sim-vs-real's clock alone (online/validate/sim_vs_real.py cycle_cost): cycles measured at
    exactly the profile's cells price at 0 error (the controller's time left out of the step); a cycle
    whose verify ran 1.2x its cell shows in that V's error alone, by hand."""
    from online.validate.sim_vs_real import cycle_cost
    from pipeline.decode.controller import CycleRecord
    from simulator.latency.model import LatencyModel
    from tests.simulator.latency.test_latency_batch import hand_rows

    lat = LatencyModel.from_rows(hand_rows())

    def cyc(D, W, V, c, slow=1.0, ctrl=0.0):
        td, tv = D * float(lat.t_draft(W, c)), slow * float(lat.t_verify(V, c))
        return CycleRecord(step=0, batch_size=1, depth=D, width=W, verify_size=V, accepted=0, emitted=1, context_len=c,
                           t_draft=td, t_verify=tv, t_controller=ctrl, t_cycle=td + tv + float(lat.t_overhead(c)) + ctrl)

    clean = [cyc(3, 4, 8, 100, ctrl=0.01), cyc(2, 1, 3, 250)]
    out = cycle_cost(clean, lat)
    assert out["cycles"] == 2 and all(abs(out[k]) < 1e-9 for k in ("step", "draft", "verify"))
    slow = cycle_cost(clean + [cyc(2, 4, 8, 180, slow=1.2)], lat)
    assert slow["verify_by_V"][3] == pytest.approx(0.0, abs=1e-9)
    assert slow["verify_by_V"][8] < 0 and slow["draft"] == pytest.approx(0.0, abs=1e-9)
    tv = [float(lat.t_verify(8, c)) for c in (100, 180)]
    assert slow["verify_by_V"][8] == pytest.approx(sum(tv) / (tv[0] + 1.2 * tv[1]) - 1)
    assert cycle_cost([], lat) == {}

class CountingEngine:
    """Records every generation (method, batch, requests' prompts, max_new, arrivals)."""

    def __init__(self):
        self.log = []

    def _res(self, ids):
        return BatchResult("x", [RowResult(i, list(p)) for i, p in enumerate(ids)])

    def generate_ar(self, ids, max_new, T, seeds, batch_size, arrivals=None):
        self.log.append(("ar", batch_size, len(ids), tuple(max_new), arrivals))
        return self._res(ids)

    def generate(self, ids, max_new, T, seeds, batch_size, controller=None, arrivals=None):
        self.log.append(("spec", batch_size, len(ids), tuple(max_new), arrivals))
        return self._res(ids)


PROMPTS = [[1, 2], [3], [4, 5, 6], [7]]
CALLS = lambda r: [Call(3, [0, 1, 2, 3], [10 * r + k for k in range(4)], arrivals=[0.0, 0.1, 0.2, 0.3],
                        max_new=[5, 6, 7, 8])]
METHODS = {"AR": None, "tree": lambda: None}


@pytest.mark.parametrize("warmup, warm_log", [
    ("short", [("ar", 2, 2, (8, 8), None), ("spec", 2, 2, (8, 8), None)]),
    ("full", [("ar", 3, 4, (5, 6, 7, 8), [0.0, 0.1, 0.2, 0.3]), ("spec", 3, 4, (5, 6, 7, 8), [0.0, 0.1, 0.2, 0.3])]),
])
def test_warmup_generations_come_first_and_are_not_results(warmup, warm_log):
    eng = CountingEngine()
    results, verdicts = run_calls(eng, PROMPTS, METHODS, CALLS, 16, temperature=0.5, runs=2, progress=False,
                                  warmup=warmup)
    assert eng.log[:2] == warm_log
    assert len(eng.log) == 2 + 2 * 2 and sorted(results) == [(0, 0, "AR"), (0, 0, "tree"), (1, 0, "AR"), (1, 0, "tree")]
    assert verdicts == []


def test_bad_warmup_is_refused():
    with pytest.raises(ValueError, match="warmup must be"):
        run_calls(CountingEngine(), PROMPTS, METHODS, CALLS, 16, temperature=0.5, runs=1, progress=False, warmup="x")
