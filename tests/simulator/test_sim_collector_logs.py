"""The simulator reads what the real collector writes (tiny random model, no Ray)."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.collect.prompt import CollectConfig
from pipeline.collect.job import run_collect
from simulator import baselines
from simulator.envs.vector import make_replay_env
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import load_logs
from simulator.replay import simulate
from tests.helpers import replay_static

GRID = (1, 2, 4, 8, 10, 20, 60)
LAT = LatencyModel.from_constants(draft_step=0.004, verify=0.03, verify_per_token=5e-4, policy=1e-4, overhead=1e-3)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_collector_logs_replay(tmp_path, tiny_model_dir, temperature):
    cfg = CollectConfig(model=str(tiny_model_dir), head="random", dataset="mt-bench", split=None, n_prompts=2,
                        max_new_tokens=10, temperature=temperature, max_depth=4, widths=(2, 3), verify_grid=GRID,
                        dist_every=2)
    run_collect(cfg, tmp_path, use_ray=False, progress=False)
    logs = load_logs(tmp_path, widths="all")
    assert logs.widths == (2, 3) and logs.width == 2 and logs.max_depth == 4 and logs.n_sequences == 2
    assert logs.temperature == temperature
    res = simulate(baselines.StaticPolicy(3, 3, 20), logs, LAT, trace=True)
    for s in range(logs.n_sequences):
        m = res.trace["seq"] == s
        walk = replay_static(logs.w[3].acceptance[logs.rows_of(s)], int(logs.new_tokens[s]), 3, 20, GRID)
        assert list(zip(res.trace["position"][m].tolist(), res.trace["accepted"][m].tolist())) == walk
    dist = logs.w[2].accept_dist
    if temperature > 0:
        odd = logs.position % 2 == 1
        assert np.isnan(dist[odd]).all() and np.allclose(dist[~odd].sum(-1), 1, atol=1e-4)
        env = make_replay_env(logs, LAT, "radar", n_envs=8, width=2, verify_size=20, radar_reward="expected")
        env.reset(seed=0)
        for _ in range(5):
            _, r, *_ = env.step(np.ones(8, np.int64))
            assert np.isfinite(r).all()
    else:
        assert dist is None
    best = simulate(baselines.OraclePolicy(logs, LAT), logs, LAT)
    assert (best.time <= res.time + 1e-12).all()


def test_collect_profile_evaluate_end_to_end(tmp_path, tiny_model_dir, capsys):
    import json

    from online.cli import main

    cfg = CollectConfig(model=str(tiny_model_dir), head="random", dataset="mt-bench", split=None, n_prompts=2,
                        max_new_tokens=10, max_depth=4, widths=(2,), verify_grid=GRID)
    run_collect(cfg, tmp_path, use_ray=False, progress=False)
    assert main(["profile", "--model", str(tiny_model_dir), "--head", "random", "--widths", "2",
                 "--verify-sizes", "1,8,32", "--contexts", "16,64", "--repeats", "2", "--out", str(tmp_path),
                 "--json"]) == 0
    capsys.readouterr()
    lat = LatencyModel.from_logs(tmp_path, model=str(tiny_model_dir))
    assert lat.meta["has_policy"] and lat.meta["has_overhead"]
    assert main(["evaluate", "--logs", str(tmp_path), "--split", "all", "--policy", "ddd", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["static_default"] == [4, 2, 60] and rep["tune_split"] in ("val", "train", "all")
    # AR (no drafting) is outside the oracle's action space: with a random head it can be faster
    assert all(r["all"]["pct_oracle"] <= 100 + 1e-9 for k, r in rep["results"].items() if k != "ar"), \
        {k: r["all"]["pct_oracle"] for k, r in rep["results"].items()}
