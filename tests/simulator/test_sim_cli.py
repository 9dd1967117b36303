"""`draftgym evaluate` / `latency-report` / `synth-logs` and policy checkpoints."""
from __future__ import annotations

import json

import numpy as np
import pytest

from online.cli import main
from simulator.observations.paper import ltd_depth_obs_dim, ltd_size_obs_dim
from simulator.methods.checkpoint import load_checkpoint, save_policy
from simulator.policies.nets import build_net
from simulator.methods.ltd.policy import LTDPolicy
from simulator.replay import simulate
from tests.simulator.conftest import syn, syn_root  # noqa: F401


def _json_out(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_evaluate_json(syn_root, capsys):
    rep = _json_out(capsys, ["evaluate", "--logs", str(syn_root), "--split", "test", "--policy", "ddd",
                             "--policy", "static:4,10,10", "--policy", "goodput", "--json"])
    assert rep["split"] == "test" and rep["tune_split"] == "val" and rep["static_default"] == [8, 10, 60]
    assert set(rep["results"]) == {"ar", "static", "grid-best", "oracle", "ddd", "static:4,10,10", "goodput"}
    assert set(rep["datasets"]) == {"all", "gsm8k", "humaneval", "mt-bench"}
    for name, per in rep["results"].items():
        for ds, r in per.items():
            assert r["pct_oracle"] <= 100 + 1e-9 and r["tokens_per_s"] > 0 and r["sequences"] > 0
            if name == "ar":
                assert r["tau"] == 1 and r["speedup_vs_ar"] == pytest.approx(1)
    assert rep["results"]["oracle"]["all"]["pct_oracle"] == pytest.approx(100)


def test_evaluate_errors(tmp_path, syn_root, capsys):
    assert main(["evaluate", "--logs", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftgym: error: no sequences table") and "\n" not in err
    assert main(["evaluate", "--logs", str(syn_root), "--policy", "static:4,10,64"]) == 2
    assert "not on the logged grid" in capsys.readouterr().err
    assert main(["evaluate", "--logs", str(syn_root), "--policy", "nonsense"]) == 2
    assert "unknown policy" in capsys.readouterr().err


def test_checkpoint_roundtrip_and_evaluate(syn, syn_root, tmp_path, capsys):
    import torch

    logs, lat = syn
    torch.manual_seed(0)
    specs = {"depth": {"type": "mlp", "in": ltd_depth_obs_dim(10), "hidden": [16], "out": 2},
             "size": {"type": "mlp", "in": ltd_size_obs_dim(10), "hidden": [16, 8], "out": 12}}
    nets = {k: build_net(v) for k, v in specs.items()}
    comps = {"depth": {"module": nets["depth"], "net": specs["depth"],
                       "obs": {"name": "ltd_depth", "width": 10, "dim": ltd_depth_obs_dim(10)},
                       "action": {"type": "stop_continue", "max_depth": 12}},
             "size": {"module": nets["size"], "net": specs["size"],
                      "obs": {"name": "ltd_size", "width": 10, "max_depth": 12, "dim": ltd_size_obs_dim(10)},
                      "action": {"type": "verify_size", "values": list(range(20, 241, 20))}}}
    out = save_policy(tmp_path / "pol", "tiny-ltd", "ltd", comps, {"width": 10, "max_depth": 12, "verify_size": 60})
    loaded = load_checkpoint(out)
    direct = LTDPolicy(nets["depth"].eval(), nets["size"].eval())
    assert np.array_equal(simulate(loaded, logs, lat).time, simulate(direct, logs, lat).time)
    rep = _json_out(capsys, ["evaluate", "--logs", str(syn_root), "--policy", str(out), "--json"])
    assert rep["results"][str(out)]["all"]["policy_name"] == "tiny-ltd"
    (out / "size.pt").unlink()
    assert main(["evaluate", "--logs", str(syn_root), "--policy", str(out)]) == 2
    assert "cannot load" in capsys.readouterr().err


def test_synth_and_latency_report(tmp_path, capsys):
    rep = _json_out(capsys, ["synth-logs", "--out", str(tmp_path), "--n-sequences", "2", "--latency-profile", "gpu"])
    assert rep["sequences"] == 6
    rep = _json_out(capsys, ["latency-report", "--logs", str(tmp_path), "--plot", str(tmp_path / "l.png"), "--json"])
    assert rep["ops"]["verify"]["in_sample_max_rel_err"] < 1e-12 and (tmp_path / "l.png").exists()
    assert rep["radar_constants_ctx512"]["Tf"] > 0
