"""The LTD- and RADAR-style load-aware methods (simulator/methods/ltd/serving_policy.py,
simulator/methods/radar/serving_policy.py) beside the Re-SpS-style one: their action sets and the map
from a structured decision to a shape index, each method trains, saves, loads and replays in
`draftgym serve-eval`, a learned policy learns "off" at large B where drafting is expensive there,
and bad input is refused in one line. Small synthetic logs."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from online.cli import main as cli
from pipeline.decode import step_shape
from pipeline.errors import DataError, DraftGymError
from pipeline.logs.schema import DEFAULT_VERIFY_GRID
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import load_logs
from simulator.logs.synthetic import SyntheticConfig, latency_rows, write_latency, write_synthetic_logs
from simulator.methods.ltd.serving_policy import LTDLoadPolicy
from simulator.methods.ltd.serving_train import LTDLoadConfig, decision_index
from simulator.methods.ltd.serving_train import action_shapes as ltd_shapes
from simulator.methods.radar.serving_policy import RadarLoadPolicy, level_inputs, stop_depth
from simulator.methods.radar.serving_train import RadarLoadConfig
from simulator.methods.radar.serving_train import action_shapes as radar_shapes
from simulator.methods.resps.serving_policy import LoadAwarePolicy
from simulator.methods.train_load import LoadTrainConfig, train_load
from simulator.policies.base import CONTINUE, STOP
from simulator.policies.nets import build_net
from simulator.policy_specs import load_policy
from simulator.serving import observations
from simulator.serving.choosers.learned import LearnedChooser
from simulator.serving.inputs import replayable
from simulator.serving.load import serve
from simulator.serving.replay import ShapeTable
from simulator.train.ppo import mlp_spec
from tests.simulator.serving.conftest import root, logs  # noqa: F401 (pytest fixtures)

DRAFT_S = {2: 0.01, 4: 0.3, 8: 0.3}    # a draft forward at B in the "expensive" profile (B = 1: the gpu one's ~2.5 ms)


@pytest.fixture(scope="module")
def expensive_root(tmp_path_factory):
    """Width-1 logs timed by the gpu profile, except that a draft forward costs 10 ms at B = 2 and 0.3 s
    from B = 4 on (a verify ~22 ms): drafting pays off at B = 1 (a held chain that sees a second row
    arrive loses little), and "off" is clearly best at B = 4 (it pays the observation's one-forward
    probe once per decision, a chain pays its forwards at every held step)."""
    d = tmp_path_factory.mktemp("serving-methods-expensive")
    cfg = SyntheticConfig(n_sequences=8, widths=(1,), new_tokens=(12, 30), latency_profile=None)
    write_synthetic_logs(d, cfg)
    rows = latency_rows(cfg.model, "gpu", widths=(1, 8, 10), verify_grid=DEFAULT_VERIFY_GRID, batches=(1, 2, 4, 8))
    for r in rows:
        if r["op"] == "draft_step" and r["batch"] >= 2:
            t = DRAFT_S[r["batch"]]
            r.update(median=t, mean=t, p10=t, p90=t)
    write_latency(d, rows)
    return d


def _net(n_in, n_out, bias):
    """An MLP whose output is `bias` whatever its input (last layer's weights zeroed)."""
    net = build_net(mlp_spec(n_in, (8,), n_out))
    with torch.no_grad():
        net[-1].weight.zero_()
        net[-1].bias.copy_(torch.tensor(bias, dtype=torch.float32))
    return net.eval()


# ------------------------------------------------------------------ action sets and the decision -> index map

def test_ltd_action_set_and_index(logs):
    """W = 1, Dmax = 3: V grid auto = [2, 4] (4 = 1 + pool(3, 1) verifies every draft at Dmax); the
    shapes are every canonical (D, 1, V), deduplicated; index[D, j] names the shape of (D, V_j)."""
    cfg = LTDLoadConfig(width=1, max_depth=3)
    shapes = ltd_shapes(logs, cfg)
    labels = [step_shape.label(s) for s in shapes]
    assert labels == ["off", "chain:1", "tree:2,1,2", "chain:2", "tree:3,1,2", "chain:3"]
    index = decision_index(shapes, 1, 3, [2, 4])
    assert index.tolist() == [[0, 0], [1, 1], [2, 3], [4, 5]]
    spec = observations.make_spec(logs, 4).to_json()
    dim = spec["dim"]
    for d, j in ((0, 1), (1, 0), (2, 0), (2, 1), (3, 1)):                # the heads' argmax -> that shape's index
        bias_d, bias_v = np.zeros(4), np.zeros(2)
        bias_d[d], bias_v[j] = 5.0, 5.0
        pol = LTDLoadPolicy(_net(dim, 4, bias_d), _net(dim + 1, 2, bias_v), labels, index, [2, 4], 1, 3, spec)
        a = pol.act(np.zeros((2, dim), np.float32))
        want = step_shape.canonical((d, 1, [2, 4][j]))
        assert [step_shape.parse(labels[i]) for i in a] == [want, want]
    with pytest.raises(DraftGymError, match="does not fit"):
        LTDLoadPolicy(_net(dim, 4, bias_d), _net(dim + 1, 2, bias_v), labels[:4], index, [2, 4], 1, 3, spec)
    tree = ltd_shapes(logs, LTDLoadConfig(width=4, max_depth=2, verify_sizes="4,8"))
    assert [step_shape.label(s) for s in tree] == ["off", "tree:1,4,4", "tree:1,4,5", "tree:2,4,4", "tree:2,4,8"]
    with pytest.raises(DataError, match="width 3"):
        ltd_shapes(logs, LTDLoadConfig(width=3, max_depth=2))


def test_radar_action_set_walk_and_level_inputs(logs):
    """Shapes [off, shape(1) .. shape(Dmax)] (index = D); the walk stops at the first STOP; level d reads
    the confidence of depth min(max(d, 1), k) from the observation."""
    assert [step_shape.label(s) for s in radar_shapes(logs, RadarLoadConfig(width=1, max_depth=3))] == \
        ["off", "chain:1", "chain:2", "chain:3"]
    assert [step_shape.label(s) for s in radar_shapes(logs, RadarLoadConfig(width=4, max_depth=2))] == \
        ["off", "tree:1,4,5", "tree:2,4,21"]
    with pytest.raises(DraftGymError, match="one per depth"):
        radar_shapes(logs, RadarLoadConfig(width=1, max_depth=3, verify="4,8"))
    cont = np.array([[False, True, True], [True, True, False], [True, True, True], [True, False, True]])
    assert stop_depth(cont).tolist() == [0, 2, 3, 1]
    spec = observations.make_spec(logs, 4, confidence_depth=2).to_json()
    obs = np.random.default_rng(0).normal(size=(3, spec["dim"])).astype(np.float32)
    x = level_inputs(obs, spec, 4)                                     # [3, 4, dim + 3]
    assert x.shape == (3, 4, spec["dim"] + 3) and np.array_equal(x[:, 2, :spec["dim"]], obs)
    assert np.allclose(x[0, :, spec["dim"]], [0, 0.25, 0.5, 0.75])
    for d, depth in ((0, 1), (1, 1), (2, 2), (3, 2)):
        col = observations.N_BASE + 2 * (depth - 1)
        assert np.array_equal(x[:, d, -2:], obs[:, col:col + 2])
    assert not level_inputs(obs[:, :observations.N_BASE], {**spec, "confidence_depth": 0}, 4)[..., -2:].any()
    labels = ["off", "chain:1", "chain:2", "chain:3"]
    for stop, cont, want in ((5.0, 0.0, 0), (0.0, 5.0, 3)):             # always STOP: off; always CONTINUE: Dmax
        bias = np.zeros(2)
        bias[STOP], bias[CONTINUE] = stop, cont
        pol = RadarLoadPolicy(_net(spec["dim"] + 3, 2, bias), labels, 3, spec)
        assert pol.max_depth == 3 and pol.act(obs).tolist() == [want] * 3


# ------------------------------------------------------------------ train, save, load, serve-eval

@pytest.mark.parametrize("method,manifest,cls", [("ltd", "ltd-load", LTDLoadPolicy),
                                                 ("radar", "radar-load", RadarLoadPolicy),
                                                 ("resps", "resps-load", LoadAwarePolicy)])
def test_each_method_trains_saves_loads_and_serve_eval_replays_it(root, tmp_path, capsys, method, manifest, cls):
    out = tmp_path / method
    assert cli(["train-load", "--logs", str(root), "--out", str(out), "--method", method, "--split", "all",
                "--val-split", "all", "--max-batch", "4", "--hold", "2", "--tune-batches", "1,4", "--target-batches",
                "1,4", "--chains", "3", "--max-depth", "3", "--steps", "64", "--episode-decisions", "4",
                "--val-requests-per-rate", "3", "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    man = json.loads((out / "manifest.json").read_text())
    assert man["method"] == summary["method"] == manifest and summary["val_tokens_per_s"] > 0
    training = json.loads((out / "training.json").read_text())
    assert any("val" in h for h in training["history"]) and (out / "training_curve.png").is_file()
    pol = load_policy(str(out))
    assert type(pol) is cls and pol.serving and pol.hold == 2 and pol.shapes == summary["shapes"]
    assert pol.shapes[0] == "off" and all(replayable(load_logs(root, widths="all", split="all"), step_shape.parse(s))
                                          for s in pol.shapes)
    if method != "resps":
        assert man["shape"]["width"] == 1 and man["shape"]["max_depth"] == 3 and len(pol.shapes) >= 4
        assert all(step_shape.canonical(step_shape.parse(s))[0] <= 3 for s in pol.shapes)
    a = pol.act(np.zeros((5, pol.obs_spec["dim"]), np.float32))
    assert a.shape == (5,) and ((0 <= a) & (a < len(pol.shapes))).all()
    with pytest.raises(DraftGymError, match="serving policy"):
        pol.plan(None)
    assert cli(["serve-eval", "--logs", str(root), "--split", "all", "--tune-split", "all", "--batch-sizes", "1,4",
                "--target-batches", "1,4", "--requests-per-rate", "4", "--no-oracle", "--policy", str(out),
                "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    learned = [r for r in rep["rows"] if r["name"].startswith("learned")]
    assert len(learned) == 1 and learned[0]["tokens"] == rep["rows"][0]["tokens"] and learned[0]["tokens_per_s"] > 0


def test_bad_input_is_one_line(root, tmp_path, capsys):
    base = ["train-load", "--logs", str(root), "--out", str(tmp_path / "p"), "--no-progress"]
    for extra, msg in ((["--method", "bogus"], "unknown load-aware method 'bogus' (known: resps, ltd, radar)"),
                       (["--method", "ltd", "--width", "3"], "--width 3: not in the logs"),
                       (["--method", "radar", "--shapes", "off chain:2"], "--shapes is resps's action set")):
        assert cli(base + extra) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1
    assert not (tmp_path / "p").exists()


# ------------------------------------------------------------------ it learns: off where drafting is expensive

@pytest.mark.parametrize("method", ["ltd", "radar", "resps"])
def test_a_learned_policy_picks_off_at_large_batch_where_drafting_is_expensive(expensive_root, method):
    """With a draft forward costing 0.3 s at B = 4 (~14 verify steps), the policy trained in the env
    must switch drafting off at B = 4 (a closed batch) and still draft at B = 1 (requests 100 s apart),
    in the load replay (learned.LearnedChooser, as serve-eval). Fails untrained (16 decisions: each
    method drafts at B = 4 in half of its decisions or more) and if it learned one shape for every B.
    Budgets are tiny (3072 decisions, ~1 s each), hence the larger learning rates."""
    small = dict(n_envs=16, eval_every=1000)                           # validate once, at the end
    cfg = LoadTrainConfig(logs=str(expensive_root), out="unused", method=method, split="all", val_split="all",
                          max_batch=4, hold=3, target_batches="1,4,8", tune_batches="1,4", chains=3,
                          episode_decisions=8, steps=3072, val_requests_per_rate=2, progress=False,
                          ltd=LTDLoadConfig(max_depth=3, n_steps=8, minibatch=64, lr=3e-3, **small),
                          radar=RadarLoadConfig(max_depth=3, n_steps=4, lr=1e-2, **small))
    cfg.ppo.n_envs, cfg.ppo.n_steps, cfg.ppo.minibatch, cfg.ppo.lr, cfg.ppo.eval_every = 16, 8, 64, 3e-3, 1000
    res = train_load(cfg)
    pol = res["policy"] if method != "resps" else \
        LoadAwarePolicy(res["actor"], [step_shape.label(s) for s in res["shapes"]], 3, res["obs_spec"])
    logs, lat = load_logs(expensive_root, widths="all", split="all"), LatencyModel.from_logs(expensive_root)
    table = ShapeTable(logs, res["shapes"])

    def decisions(arrivals):
        class Recording(LearnedChooser):
            def choose(self, view):
                a = super().choose(view)
                if self.decided:
                    seen.append((view.batch, a))
                return a
        seen = []
        serve(logs, lat, table, Recording(pol), arrivals, max_batch=4)
        return np.array(seen)

    busy = decisions(np.zeros(24))                                     # a closed batch of 4, then the drain
    full = busy[busy[:, 0] == 4, 1]
    alone = decisions(np.arange(8) * 100.0)[:, 1]                      # one request at a time: B = 1
    off = table.index(step_shape.OFF)
    assert len(full) >= 5 and len(alone) >= 8
    assert (full == off).mean() >= 0.9, f"{method}: drafts at B = 4 in {(full != off).mean():.0%} of decisions"
    assert (alone != off).mean() >= 0.8, f"{method}: off at B = 1 in {(alone == off).mean():.0%} of decisions"
