"""Learned load-aware speculation (simulator/serving/{observations,env,learned,train_load}.py): the
observation is the same from the env's slot state and from a hand-built step, the hold is respected
in the env and in the load replay, and `draftgym train-load` trains, saves, loads and is reported by
`draftgym serve-eval`. Small synthetic logs; seconds."""
from __future__ import annotations

import json

import numpy as np
import pytest

from online.cli import main as cli
from pipeline.decode import step_shape
from pipeline.errors import DraftGymError
from simulator.baselines import StaticPolicy
from simulator.methods.resps.serving_policy import LoadAwarePolicy
from simulator.policy_specs import load_policy
from simulator.serving import observations
from simulator.serving.choosers.base import StepView
from simulator.serving.choosers.learned import LearnedChooser
from simulator.serving.env import LoadEnv, LoadEnvConfig
from simulator.serving.load import serve
from simulator.serving.replay import ShapeTable
from tests.simulator.serving.conftest import root, logs, lat  # noqa: F401 (pytest fixtures)

SHAPES = [step_shape.OFF, step_shape.chain(1), step_shape.chain(3), step_shape.canonical((3, 4, 10))]


def _env(logs, lat, **kw):
    cfg = LoadEnvConfig(**{"n_envs": 6, "max_batch": 4, "hold": 3, "target_batches": (1, 2, 4), "confidence_depth": 2,
                           **kw})
    return LoadEnv(logs, lat, SHAPES, cfg)


class _RandomServingPolicy:
    """A stand-in serving policy: uniform random actions (so the shape changes), any hold."""
    serving = True

    def __init__(self, hold, spec):
        self.shapes, self.hold, self.obs_spec, self.name = [step_shape.label(s) for s in SHAPES], hold, spec.to_json(), "random"
        self.seen = []

    def reset(self, n_envs=1, seed=0):
        self.rng = np.random.default_rng(seed)

    def act(self, obs):
        self.seen.append(obs)
        return self.rng.integers(0, len(self.shapes), len(obs))


# ------------------------------------------------------------------ the observation

def test_observation_is_the_same_from_the_env_and_from_a_step(logs, lat):
    """Slot state with a hole -> load_obs; the same rows packed, as a StepView -> the chooser's
    observation (observations.step_obs): equal bit for bit. And the features are what they say."""
    env = _env(logs, lat)
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(4):
        env.step(rng.integers(0, len(SHAPES), env.n))
    e = int(np.flatnonzero(env.active.sum(1) >= 2)[0])
    env.active[e, np.flatnonzero(env.active[e])[0]] = False          # a hole before the remaining rows
    env.queued[e] = 3
    o_env = env.observe()[e]
    act = np.flatnonzero(env.active[e])
    rows = logs.offsets[env.seq[e, act]] + env.pos[e, act]
    view = StepView(batch=len(act), rows=rows, context_len=logs.context_len[rows], left=np.ones(len(act), np.int64),
                    requests=np.arange(len(act)), time=0.0, queued=3)
    pol = _RandomServingPolicy(3, env.spec)
    ch = LearnedChooser(pol)
    ch.reset(ShapeTable(logs, SHAPES), lat)
    p = int(env.prev[e])
    ch.ema, ch.has_ema = float(env.ema[e]), bool(env.has_ema[e])
    ch.prev_depth, ch.prev_verify = int(ch.table.depth[p]), int(ch.table.verify[p])
    o_step = ch.observation(view)[0]
    assert o_step.dtype == np.float32 and np.array_equal(o_env, o_step)
    top = logs.w[1].beam_scores[rows, :2, 0]                          # the chain's best beam at depths 1, 2
    assert o_env[0] == np.float32(len(act) / 4) and o_env[1] == np.float32(3 / 4)
    assert o_env[2] == pytest.approx(logs.context_len[rows].mean() / 1000, rel=1e-6)
    assert o_env[7] == pytest.approx(top[:, 0].mean(), rel=1e-5) and o_env[8] == pytest.approx(top[:, 0].min(), rel=1e-5)
    assert o_env[9] == pytest.approx(top[:, 1].mean(), rel=1e-5) and o_env[10] == pytest.approx(top[:, 1].min(), rel=1e-5)
    assert env.spec.dim == 11 == len(o_env)


def test_probe_forwards_and_ema():
    spec = observations.LoadObsSpec(max_batch=8, confidence_depth=2, probe_width=1)
    d, w = np.array([0, 1, 2, 3, 3]), np.array([1, 1, 1, 1, 4])
    assert observations.probe_forwards(spec, d, w).tolist() == [2, 1, 0, 0, 1]   # off; chains; a tree shares forward 1
    assert observations.probe_forwards(observations.LoadObsSpec(confidence_depth=0), d, w).tolist() == [0] * 5
    ema, has = observations.ema_update(spec, np.zeros(3), np.array([False, True, True]), np.array([True, True, False]),
                            np.array([2.0, 2.0, 2.0]))
    assert ema.tolist() == [2.0, 0.4, 0.0] and has.tolist() == [True, True, True]


# ------------------------------------------------------------------ the hold

def test_the_env_holds_each_action_for_n_steps(logs, lat):
    env = _env(logs, lat)
    o, _ = env.reset(seed=1)
    assert o.shape == (6, env.obs_dim)
    for a in ([0, 1, 2, 3, 0, 1], [3, 3, 2, 1, 0, 0]):
        o, r, term, trunc, info = env.step(np.array(a))
        assert info["step_shape"].shape == (6, 3) and (info["step_shape"] == np.array(a)[:, None]).all()
        assert np.isfinite(r).all() and (r > 0).all()
    env2 = _env(logs, lat)
    env2.reset(seed=1)
    o2, r2, *_ = env2.step(np.array([0, 1, 2, 3, 0, 1]))
    env.reset(seed=1)
    o1, r1, *_ = env.step(np.array([0, 1, 2, 3, 0, 1]))
    assert np.array_equal(o1, o2) and np.array_equal(r1, r2)          # deterministic replay


def test_the_two_rewards(logs, lat):
    """ratio = (tokens / time) / rho_AR; rate = (tokens - kappa rho_AR time) / (N B_0): the same holds
    under both objectives, rewards tied through rho_AR."""
    a = np.array([0, 1, 2, 3, 3, 1])
    out = {}
    for o, k in (("ratio", 1.0), ("rate", 1.0), ("rate", 0.0)):
        env = _env(logs, lat, objective=o, rate_ref=k)
        env.reset(seed=2)
        _, r, _, _, info = env.step(a)
        out[(o, k)] = (r, info)
    (r1, i1), (r2, i2), (r0, i0) = out[("ratio", 1.0)], out[("rate", 1.0)], out[("rate", 0.0)]
    assert np.array_equal(i1["tokens"], i2["tokens"]) and np.array_equal(i1["time"], i0["time"])
    N, B0 = 3, i1["batch"]
    assert np.allclose(r0 * N * B0, i1["tokens"], rtol=1e-12)
    rho = i1["tokens"] / i1["time"] / r1
    assert np.allclose(r2, (i1["tokens"] - rho * i1["time"]) / (N * B0), rtol=1e-9)
    assert (r1 > 0).all() and (rho > 0).all()


def test_the_load_replay_holds_each_decision(logs, lat):
    """A random policy with hold 3 in load.serve: the shape can change only every 3rd step, every
    decision step pays the probe and the policy call, and the other steps pay the bare step."""

    class Recording(LearnedChooser):
        def choose(self, view):
            self.contexts.append(float(lat.step_context(view.context_len)))
            return super().choose(view)

    spec = observations.make_spec(logs, 4, confidence_depth=1)
    pol = _RandomServingPolicy(3, spec)
    table = ShapeTable(logs, SHAPES)
    ch = Recording(pol)
    ch.contexts = []
    res = serve(logs, lat, table, ch, np.linspace(0, 0.5, 12), max_batch=4)
    n, c = len(res.step_shape), np.array(ch.contexts)
    change = np.flatnonzero(np.diff(res.step_shape)) + 1
    assert len(change) > 0 and (change % 3 == 0).all()
    assert len(pol.seen) == -(-n // 3) and len(c) == n
    bare = np.array([float(table.step_time(lat, a, int(b), x)) for a, b, x in zip(res.step_shape, res.step_batch, c)])
    extra = res.step_time - bare
    dec = np.arange(n) % 3 == 0
    assert np.allclose(extra[~dec], 0.0, atol=1e-15)
    want = observations.decision_cost(spec, lat, table.depth[res.step_shape[dec]], table.width[res.step_shape[dec]],
                           res.step_batch[dec], c[dec])
    assert np.allclose(extra[dec], want, rtol=1e-9) and (extra[dec] > 0).all()


# ------------------------------------------------------------------ train, save, load, serve-eval

def test_train_load_saves_loads_and_serve_eval_reports_it(root, tmp_path, capsys):
    out = tmp_path / "pol"
    assert cli(["train-load", "--logs", str(root), "--out", str(out), "--split", "all", "--val-split", "all",
                "--max-batch", "4", "--hold", "2", "--tune-batches", "1,4", "--target-batches", "1,4", "--chains", "3",
                "--steps", "64", "--episode-decisions", "4", "--val-requests-per-rate", "3", "--no-progress",
                "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    man = json.loads((out / "manifest.json").read_text())
    assert man["method"] == "resps-load" and man["components"]["shape"]["action"]["hold"] == 2
    assert summary["shapes"][:4] == ["off", "chain:1", "chain:2", "chain:3"] and summary["val_tokens_per_s"] > 0
    pol = load_policy(str(out))
    assert isinstance(pol, LoadAwarePolicy) and pol.hold == 2 and pol.shapes == summary["shapes"]
    with pytest.raises(DraftGymError, match="serving policy"):
        pol.plan(None)
    assert cli(["serve-eval", "--logs", str(root), "--split", "all", "--tune-split", "all", "--batch-sizes", "1,4",
                "--target-batches", "1,4", "--requests-per-rate", "4", "--no-oracle", "--policy", str(out),
                "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    learned = [r for r in rep["rows"] if r["name"].startswith("learned")]
    assert len(learned) == 1 and learned[0]["tokens"] == rep["rows"][0]["tokens"] and learned[0]["tokens_per_s"] > 0
    assert cli(["serve-eval", "--logs", str(root), "--split", "all", "--tune-split", "all", "--batch-sizes", "1,4",
                "--target-batches", "1,8", "--no-oracle", "--policy", str(out)]) == 2
    assert "trained for at most 4 rows" in capsys.readouterr().err


def test_a_batch_one_policy_is_not_a_chooser():
    with pytest.raises(DraftGymError, match="not a load-aware serving policy"):
        LearnedChooser(StaticPolicy(3, 4, 10))
