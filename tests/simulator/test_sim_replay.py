"""Exact replay: hand-checked traces, the vectorised envs, the oracle bound, determinism, gymnasium."""
from __future__ import annotations

import numpy as np
import pytest

from simulator import baselines
from simulator.envs.vector import EnvConfig, make_replay_env, make_replay_gym_env, resps_shapes
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import load_logs
from simulator.observations.paper import RESPS_DIM, ltd_depth_obs_dim, ltd_size_obs_dim
from simulator.policies.nets import build_net
from simulator.methods.ltd.policy import LTDPolicy
from simulator.methods.radar.policy import RadarPolicy
from simulator.methods.resps.policy import RespsPolicy
from simulator.replay import autoregressive, simulate
from tests.helpers import replay_static
from tests.simulator.conftest import HAND_GRID, HAND_SEQS, hand_root, syn, syn_root  # noqa: F401

LAT = LatencyModel.from_constants(draft_step=0.01, verify=0.1, verify_per_token=0.001, policy=0.002, overhead=0.005)
T_STATIC = 8 * 0.01 + (0.1 + 0.060) + 0.005              # one (8, 10, 60) cycle: 0.245 s


def test_static_default_hand_trace(hand_root):
    logs = load_logs(hand_root)
    res = simulate(baselines.StaticPolicy(8, 10, 60), logs, LAT, trace=True)
    tr = res.trace
    for s, pid in enumerate(logs.prompt_id):
        m = tr["seq"] == s
        expect = {"A": [(0, 3), (4, 0), (5, 5)], "B": [(0, 0), (1, 4)]}[pid]
        assert list(zip(tr["position"][m].tolist(), tr["accepted"][m].tolist())) == expect
        # the collection module's reference walker agrees
        acc = logs.acceptance[logs.rows_of(s)]
        assert replay_static(acc, int(logs.new_tokens[s]), 8, 60, HAND_GRID) == expect
        assert tr["emitted"][m].tolist() == {"A": [4, 1, 6], "B": [1, 4]}[pid]   # B's last cycle is capped
        assert res.tokens[s] == HAND_SEQS[pid]["new_tokens"] - 1
        assert res.time[s] == pytest.approx(len(expect) * T_STATIC)
    assert res.summary()["tau"] == pytest.approx(16 / 5)
    # AR: one (V=1) forward + overhead per token
    ar = autoregressive(logs, LAT)
    assert ar.time.tolist() == pytest.approx([11 * 0.106, 5 * 0.106])


def test_depth_env_replays_hand_trace(hand_root):
    logs = load_logs(hand_root, split="train")                # sequence A only
    env = make_replay_env(logs, LAT, "depth", n_envs=1, autoreset=False)
    o, _ = env.reset(seed=0)
    assert o.shape == (1, ltd_depth_obs_dim(10))
    ps, rewards, steps = [int(env.p[0])], [], 0
    while True:
        o, r, term, trunc, info = env.step(np.array([1]))    # always CONTINUE: D = Dmax = 8
        steps += 1
        if info["cycle_end"][0]:
            ps.append(int(env.p[0]))
            rewards.append(r[0])
        else:
            assert r[0] == 0.0
        if term[0] or trunc[0]:
            break
    assert ps == [0, 4, 5, 11] and steps == 3 * 7
    t = T_STATIC + 7 * 0.002                                   # 7 depth-policy calls per cycle
    assert rewards == pytest.approx([4 / t, 1 / t, 6 / t])
    # STOP right after forward 1: D = 1, one call, V clamped to 1 + W = 11; from p = 0, L = min(1, 3) = 1
    env.reset(seed=0)
    _, r, *_ = env.step(np.array([0]))
    assert env.p[0] == 2 and r[0] == pytest.approx(2 / (0.01 + 0.111 + 0.005 + 0.002))


def test_size_and_radar_envs_hand(hand_root):
    logs = load_logs(hand_root, split="train")
    env = make_replay_env(logs, LAT, "size", n_envs=1, autoreset=False, depth_policy=lambda o: np.ones(len(o), bool),
                    size_values=[10, 60])
    env.reset(seed=0)
    assert env.D[0] == 8                                       # the depth policy always continues
    _, r, *_ = env.step(np.array([1]))                         # V = 60
    assert env.p[0] == 4 and r[0] == pytest.approx(4 / (T_STATIC + 8 * 0.002))
    env = make_replay_env(logs, LAT, "radar", n_envs=1, autoreset=False, radar_alpha=0.5)
    env.reset(seed=0)
    for _ in range(7):
        _, r, *_, info = env.step(np.array([1]))
    assert info["cycle_end"][0] and env.p[0] == 4               # capped at 8 calls, L = 3
    tgen = LAT.radar_tgen(8, 5)
    assert tgen == pytest.approx(T_STATIC + 8 * 0.002)         # T0 + 8 Tf + 8 Teye at t = t_max
    assert r[0] == pytest.approx(-0.5 + 4 / tgen)


def test_rate_objective_hand(hand_root):
    """objective="rate": each cycle earns (L+1) - lambda t_cycle instead of (L+1)/t_cycle, in all four
    envs (Re-SpS sums its held cycles, RADAR uses the replayed t_cycle), and it ranks actions by the
    generation's rate: with lambda = 10 tokens/s, the deep cycle (4 tokens in 0.259 s) beats the
    shallow one (2 tokens in 0.128 s) although its own ratio is lower (15.4 < 15.6 tokens/s)."""
    logs = load_logs(hand_root, split="train")
    lam = 10.0
    env = make_replay_env(logs, LAT, "depth", n_envs=1, autoreset=False, objective="rate", rate_ref=lam)
    env.reset(seed=0)
    for _ in range(6):
        env.step(np.array([1]))
    _, r_deep, *_ = env.step(np.array([1]))                    # D = 8 from p = 0: L = 3
    t_deep = T_STATIC + 7 * 0.002
    assert r_deep[0] == pytest.approx(4 - lam * t_deep)
    env.reset(seed=0)
    _, r_shallow, *_ = env.step(np.array([0]))                 # D = 1: L = 1
    t_shallow = 0.01 + 0.111 + 0.005 + 0.002
    assert r_shallow[0] == pytest.approx(2 - lam * t_shallow)
    assert 4 / t_deep < 2 / t_shallow and r_deep[0] > r_shallow[0]       # ratio and rate disagree here
    env = make_replay_env(logs, LAT, "size", n_envs=1, autoreset=False, depth_policy=lambda o: np.ones(len(o), bool),
                    size_values=[10, 60], objective="rate", rate_ref=lam)
    env.reset(seed=0)
    _, r, *_ = env.step(np.array([1]))
    assert r[0] == pytest.approx(4 - lam * (T_STATIC + 8 * 0.002))
    env = make_replay_env(logs, LAT, "radar", n_envs=1, autoreset=False, objective="rate", rate_ref=lam)
    env.reset(seed=0)
    _, r, *_, info = env.step(np.array([0]))                   # stop after call 1: D = 1, V = 60 -> 11
    assert info["cycle_end"][0] and r[0] == pytest.approx(2 - lam * t_shallow)
    env = make_replay_env(logs, LAT, "shape", n_envs=1, autoreset=False, hold_cycles=3, shapes=((60, 8, 10),),
                    objective="rate", rate_ref=lam)
    env.reset(seed=0)
    _, r, *_ = env.step(np.array([0]))                         # A's three static cycles: 4 + 1 + 6 tokens
    assert r[0] == pytest.approx(11 - lam * (3 * T_STATIC + 0.002))
    with pytest.raises(ValueError, match="rate_ref"):
        make_replay_env(logs, LAT, "depth", n_envs=1, objective="rate")
    with pytest.raises(ValueError, match="unknown objective"):
        make_replay_env(logs, LAT, "depth", n_envs=1, objective="tokens")


def _random_mlp(i, o, hidden=(32,), seed=0):
    import torch

    torch.manual_seed(seed)
    return build_net({"type": "mlp", "in": i, "hidden": list(hidden), "out": o}).eval()


def _policies(logs, lat):
    import torch

    torch.manual_seed(0)
    radar = build_net({"type": "radar_lstm", "in": 10, "hidden": 16, "mlp_hidden": 16, "out": 2}).eval()
    shapes = resps_shapes(logs)
    return [baselines.StaticPolicy(8, 10, 60), baselines.StaticPolicy(3, 8, 10), baselines.StaticPolicy(12, 10, 240),
            baselines.StaticPolicy(1, 10, 2),
            baselines.DDDPolicy(), baselines.DDDPolicy(threshold=-3.0), baselines.EntropyStopPolicy(),
            baselines.GoodputPolicy.fit(logs, lat),
            baselines.RandomShapePolicy(logs, seed=1), baselines.OraclePolicy(logs, lat, "depth"),
            LTDPolicy(_random_mlp(ltd_depth_obs_dim(10), 2), _random_mlp(ltd_size_obs_dim(10), 12, seed=1)),
            LTDPolicy(None, _random_mlp(ltd_size_obs_dim(10), 12, seed=2), sample=True),
            RadarPolicy(radar), RespsPolicy(_random_mlp(RESPS_DIM, len(shapes)), shapes, hold=3)]


def test_oracle_bounds_every_policy_on_every_sequence(syn):
    logs, lat = syn
    oracle = baselines.OraclePolicy(logs, lat)
    best = simulate(oracle, logs, lat)
    assert best.time == pytest.approx(oracle.dp["best_time"], rel=1e-12)   # the DP value is what replay gives
    for pol in _policies(logs, lat):
        res = simulate(pol, logs, lat, seed=3)
        assert (res.tokens == best.tokens).all()
        slack = res.time - best.time
        assert (slack >= -1e-12 * best.time).all(), f"{pol.name} beats the oracle on sequence {np.argmin(slack)}"
    # the depth-space oracle is bounded by the full one and bounds DDD (same space)
    depth = simulate(baselines.OraclePolicy(logs, lat, "depth"), logs, lat)
    ddd = simulate(baselines.DDDPolicy(), logs, lat)
    assert (depth.time >= best.time - 1e-12).all() and (ddd.time >= depth.time - 1e-12).all()


def test_static_grid_matches_simulate(syn):
    logs, lat = syn
    cfgs = [(8, 10, 60), (3, 8, 10), (5, 10, 130)]
    r = baselines.simulate_static(logs, lat, cfgs)
    for a, c in enumerate(cfgs):
        s = simulate(baselines.StaticPolicy(*c), logs, lat)
        assert r["time"][:, a] == pytest.approx(s.time, rel=1e-12)
        assert (r["cycles"][:, a] == s.cycles).all()
    gs = baselines.grid_search(logs, lat)
    assert set(gs["by_dataset"]) == {"all", *logs.datasets}
    assert gs["tokens_per_s"].shape == (logs.n_sequences, len(baselines.static_space(logs)))


@pytest.mark.parametrize("mode", ["depth", "size", "shape", "radar"])
def test_env_determinism(syn, mode):
    logs, lat = syn

    def run(seed, noise):
        env = make_replay_env(logs, lat, mode, n_envs=16, episode_cycles=5, latency_noise=noise)
        o, _ = env.reset(seed=seed)
        rng = np.random.default_rng(0)
        out = [o]
        for _ in range(30):
            o, r, te, tr, _ = env.step(rng.integers(0, env.n_actions, env.n))
            out += [o, r, te, tr]
        return out

    a, b, c = run(7, True), run(7, True), run(8, True)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert all(x.dtype == np.float32 for x in [a[0], *a[1::4]])


def test_random_policy_seeded(syn):
    logs, lat = syn
    pol = baselines.RandomShapePolicy(logs, seed=0)
    t1, t2 = (simulate(pol, logs, lat, seed=5).time for _ in range(2))
    assert np.array_equal(t1, t2)
    assert not np.array_equal(t1, simulate(pol, logs, lat, seed=6).time)


@pytest.mark.parametrize("mode", ["depth", "size", "shape", "radar"])
def test_gymnasium_check_env(syn, mode):
    import warnings

    from gymnasium.utils.env_checker import check_env

    logs, lat = syn
    with warnings.catch_warnings():
        warnings.simplefilter("error")                          # no checker warnings either
        # shape: one step holds 10 cycles, so episodes are whole sequences (a 4-cycle budget ends at step 1)
        check_env(make_replay_gym_env(logs, lat, mode, episode_cycles=None if mode == "shape" else 4), skip_render_check=True)


def test_shape_env_restricts_to_logged_widths(syn):
    logs, lat = syn
    shapes = resps_shapes(logs)
    assert set(shapes[:, 2].tolist()) == {8}                    # Re-SpS widths present in the logs (8, 10)
    assert (shapes[:, 0] <= shapes[:, 2] ** (shapes[:, 1] - 1)).all()
    only10 = logs.with_width(10)
    only10 = type(only10)(**{**only10.__dict__, "w": {10: only10.w[10]}})
    assert set(resps_shapes(only10)[:, 2].tolist()) == {10}    # none of Re-SpS's widths logged: the logged one
    env = make_replay_env(logs, lat, "shape", n_envs=4, hold_cycles=3, config=EnvConfig())
    env.reset(seed=0)
    _, r, *_, info = env.step(np.zeros(4, np.int64))
    assert (info["held_cycles"] <= 3).all() and (r > 0).all()


def test_depth_env_throughput_smoke(syn):
    """Vectorised stepping is fast (the benchmark itself is in the report, not a test)."""
    import time

    logs, lat = syn
    env = make_replay_env(logs, lat, "depth", n_envs=2048)
    env.reset(seed=0)
    a = np.ones(env.n, np.int64)
    t = time.perf_counter()
    for _ in range(20):
        env.step(a)
    assert 20 * env.n / (time.perf_counter() - t) > 50_000
