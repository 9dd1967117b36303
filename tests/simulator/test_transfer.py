"""`draftgym transfer`: one set of logs, two latency profiles, a policy per profile, a 2 x 2 table."""
from __future__ import annotations

import json
import shutil

import pytest

from online.cli import main
from simulator import baselines
from simulator.methods.checkpoint import load_checkpoint
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import load_logs
from simulator.replay import simulate
from simulator.transfer import finished_policy
from simulator.logs.synthetic import latency_rows, write_latency
from tests.simulator.conftest import syn_root  # noqa: F401


@pytest.fixture()
def two_profiles(syn_root, tmp_path):
    root = tmp_path / "logs"
    shutil.copytree(syn_root, root)
    write_latency(root, latency_rows("synthetic-llm", "gpu"))        # a second device's clock, same logs
    return root


def test_transfer_2x2(two_profiles, tmp_path, capsys):
    out = tmp_path / "transfer"
    specs = ["id:synthetic-cpu", "id:synthetic-gpu"]
    assert main(["transfer", "--logs", str(two_profiles), "--profiles", ",".join(specs), "--method", "ltd",
                 "--steps", "2048", "--iters", "0", "--n-envs", "32", "--temperature", "0", "--out", str(out),
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    res = json.loads((out / "transfer.json").read_text())
    assert len(res["cells"]) == 4 and (out / "transfer.png").exists() and "trained on" in printed
    assert res["environment"]["cpu_count"] >= 1
    # the two clocks really differ: the GPU-like profile's best static tree is larger
    gb = {q: res["profiles"][q]["grid_best"] for q in specs}
    assert gb["id:synthetic-gpu"][2] > gb["id:synthetic-cpu"][2]
    # one cell recomputed by hand: the GPU-trained policy replayed under the CPU clock
    test = load_logs(two_profiles).select("test")
    lat = LatencyModel.from_logs(two_profiles, profile="synthetic-cpu")
    v = simulate(load_checkpoint(out / "policy-synthetic-gpu"), test, lat).summary()["tokens_per_s"]
    cell = res["cells"]["id:synthetic-gpu|id:synthetic-cpu"]
    assert cell["tokens_per_s"] == pytest.approx(v)
    best = simulate(baselines.StaticPolicy(*gb["id:synthetic-cpu"]), test, lat).summary()["tokens_per_s"]
    assert cell["vs_grid_best"] == pytest.approx(v / best)
    # a re-run reuses both finished policies (resumable); other training flags retrain
    stamp = (out / "policy-synthetic-gpu" / "training.json").stat().st_mtime_ns
    args = ["transfer", "--logs", str(two_profiles), "--profiles", ",".join(specs), "--method", "ltd",
            "--steps", "2048", "--iters", "0", "--n-envs", "32", "--temperature", "0", "--out", str(out),
            "--no-progress"]
    assert main(args) == 0
    assert capsys.readouterr().out.count("reusing it") == 2
    assert (out / "policy-synthetic-gpu" / "training.json").stat().st_mtime_ns == stamp
    assert json.loads((out / "transfer.json").read_text())["cells"] == res["cells"]
    # other training flags retrain: the reuse check, as that run asks it (a third run would train twice more)
    d, flags = out / "policy-synthetic-gpu", res["train_args"]
    pid = json.loads((d / "transfer_train.json").read_text())["profile_id"]
    assert finished_policy(d, "ltd", str(two_profiles), pid, flags)
    assert not finished_policy(d, "ltd", str(two_profiles), pid, flags + ["--seed", "1"])
    assert not finished_policy(d, "radar", str(two_profiles), pid, flags)


def test_transfer_refuses_bad_profiles(two_profiles, tmp_path, capsys):
    base = ["transfer", "--logs", str(two_profiles), "--method", "ltd", "--out", str(tmp_path / "t")]
    assert main(base + ["--profiles", "id:synthetic-cpu"]) == 2
    assert "two or more" in capsys.readouterr().err
    assert main(base + ["--profiles", "id:synthetic-cpu,fp8"]) == 2
    assert "profile spec 'fp8'" in capsys.readouterr().err
    assert main(base + ["--profiles", "id:synthetic-cpu,id:nope"]) == 2     # checked before any training
    assert not (tmp_path / "t" / "policy-synthetic-cpu").exists()
    # a logs partition that is not there fails in one line before any training or output
    assert main(base + ["--profiles", "id:synthetic-cpu,id:synthetic-gpu", "--temperature", "0.5"]) == 2
    assert "temperature 0.5" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
