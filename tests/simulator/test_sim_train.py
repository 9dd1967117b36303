"""Trainers run end to end on tiny budgets and save checkpoints that load and replay."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from online.cli import main
from simulator.methods.checkpoint import load_checkpoint, read_manifest
from simulator.train.ppo import PPOConfig
from simulator.replay import simulate
from simulator.train.common import load_training_data
from tests.simulator.conftest import syn, syn_root  # noqa: F401

TINY = dict(n_envs=32, n_steps=8, minibatch=64, epochs=2, eval_every=1)


def test_ltd_coadaptation_tiny(syn_root, tmp_path):
    from simulator.methods.ltd.train import LTDConfig, save_ltd, train_ltd

    data = load_training_data(syn_root)
    cfg = LTDConfig(depth_steps=512, size_steps=256, iters=(0, 1, 2),
                    depth_ppo=PPOConfig(gamma=0.999, actor_hidden=(16,), critic_hidden=(16,), boundary="cycle", **TINY),
                    size_ppo=PPOConfig(gamma=0.9, actor_hidden=(16,), critic_hidden=(16,), boundary="step", **TINY))
    res = train_ltd(data, cfg, progress=False)
    assert set(res["val"]) == {"iter0-depth", "iter0-size", "iter1-size", "iter2-depth", "final"}
    assert [h["phase"] for h in res["history"]][0] == "iter0-depth" and np.isfinite(res["val"]["final"])
    out = save_ltd(tmp_path / "ltd", "ltd-tiny", res["depth"], res["size"], cfg, {"val": res["val"]})
    pol = load_checkpoint(out)
    assert pol.uses_depth_hook and pol.uses_size_hook
    r = simulate(pol, data.val, data.latency)
    assert r.summary()["tokens_per_s"] == res["val"]["final"]       # the saved policy is the validated one


def test_radar_cli_tiny(syn_root, tmp_path, capsys):
    out = tmp_path / "radar"
    assert main(["train", "--method", "radar", "--logs", str(syn_root), "--out", str(out), "--steps", "8",
                 "--n-envs", "16", "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == "radar" and (out / "training_curve.png").exists()
    man = read_manifest(out)
    assert man["method"] == "radar" and man["components"]["radar"]["net"]["hidden"] == 128
    logs = load_training_data(syn_root).val
    res = simulate(load_checkpoint(out), logs, load_training_data(syn_root).latency, trace=True)
    assert res.trace["depth"].max() <= 8 and (res.trace["verify"] <= 60).all()


def test_resps_tiny(syn_root, tmp_path):
    from simulator.methods.resps.train import RespsConfig, train_resps

    data = load_training_data(syn_root, widths="all")
    cfg = RespsConfig(steps=256, ppo=PPOConfig(gamma=0.0, actor_hidden=(16,), critic_hidden=(16,), boundary="step",
                                                ent_coef=0.1, lr=3e-4, **TINY))
    res = train_resps(data, cfg, progress=False)
    assert np.isfinite(res["val"]) and len(res["shapes"]) > 0
    assert {h["phase"] for h in res["history"]} == {"resps"}
    assert replace(cfg).hold_infer == 30


def test_wide_action_space(syn_root, tmp_path, capsys):
    """--action-space wide: small trees join the seeds' sets, and the checkpoints carry them."""
    from simulator.observations import paper
    from simulator.envs.vector import resps_shapes

    data = load_training_data(syn_root, widths="all")
    seeds, wide = resps_shapes(data.train), resps_shapes(data.train, space="wide")
    assert seeds[:, 1].min() >= 3 and (seeds[:, 0] >= 30).all()     # 32 snaps to the logged 30
    assert wide[:, 1].min() == 1 and 2 in wide[:, 0] and len(wide) > len(seeds)
    assert all(v <= 1 + w + (d - 1) * w * w for v, d, w in wide.tolist())
    assert paper.size_actions("wide", data.train.verify_grid)[0] == 2 and paper.size_actions("seeds") == paper.SIZE_ACTIONS
    out = tmp_path / "ltd-wide"
    assert main(["train", "--method", "ltd", "--logs", str(syn_root), "--out", str(out), "--steps", "512",
                 "--iters", "0", "--n-envs", "32", "--action-space", "wide", "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    man = read_manifest(out)
    assert man["components"]["size"]["action"]["values"][:3] == [2, 4, 8]
    assert summary["config"]["verify_size"] in data.train.verify_grid.tolist()
    pol = load_checkpoint(out)
    r = simulate(pol, data.val, data.latency, trace=True)
    assert set(r.trace["verify"].tolist()) <= set(man["components"]["size"]["action"]["values"]) | {1}
    assert main(["train", "--method", "radar", "--logs", str(syn_root), "--out", str(tmp_path / "r"),
                 "--steps", "4", "--verify-size", "7", "--no-progress"]) == 2
    assert "not on the logged grid" in capsys.readouterr().err


def test_out_of_range_budgets_are_refused(tmp_path, capsys):
    """`--steps 0` used to train the method's default budget (0 read as unset) and `--steps -5` one
    update that exited 0: every count is refused in one line before any log is read, by train and by
    transfer, and nothing is written."""
    for flag, v in (("--steps", "0"), ("--steps", "-5"), ("--n-envs", "0"), ("--width", "0"), ("--verify-size", "-1")):
        out = tmp_path / "never"
        assert main(["train", "--method", "ltd", "--logs", str(tmp_path / "no-logs"), "--out", str(out), flag, v]) == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: must be >= 1, got {v}" in err and err.count("\n") == 1 and not out.exists()
    assert main(["transfer", "--method", "ltd", "--logs", str(tmp_path / "no-logs"), "--profiles", "float32,bfloat16",
                 "--out", str(tmp_path / "t"), "--steps", "0"]) == 2
    assert "argument --steps: must be >= 1, got 0" in capsys.readouterr().err
