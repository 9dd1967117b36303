"""The "rich" observation variant (simulator/observations/rich.py): the acceptance history by hand,
and the replay env building the same observations as the policies' hooks in replay (decision
traces equal on every sequence, with nets made to depend strongly on the rich columns). The
online side (engine == replay) is in tests/online/validate/test_sim_online_parity.py."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from simulator.observations import rich
from simulator.methods.checkpoint import load_checkpoint, read_manifest
from simulator.envs.vector import make_replay_env, resps_shapes
from simulator.policies.nets import build_net, set_obs_norm
from simulator.methods.ltd.policy import LTDPolicy
from simulator.methods.radar.policy import RadarPolicy
from simulator.methods.resps.policy import RespsPolicy
from simulator.replay import simulate
from tests.simulator.conftest import syn, syn_root  # noqa: F401

W = 10


def test_history_by_hand():
    h = rich.AcceptanceHistory(2)
    assert h.features().tolist() == [[0, 0, 0, 0], [0, 0, 0, 0]]
    h.update(np.array([0]), np.array([2]), np.array([4]))        # L/D = 0.5
    h.update(np.array([0]), np.array([3]), np.array([3]))        # L/D = 1
    f = h.features(0)
    # ema_rate = 0.8 (0.2 * 0.5) + 0.2 * 1 = 0.28; ema_accepted = 0.8 (0.2 * 2) + 0.2 * 3 = 0.92
    assert f == pytest.approx([1.0, 1.0, 0.28, 0.92 / 12], rel=1e-6)
    assert h.features(1).tolist() == [0, 0, 0, 0]
    # plan(): a generation's first cycle resets; later cycles add the previous one
    h.update_from_plan(np.array([0, 1]), np.array([0, 3]), np.array([True, True]), np.array([5, 1]), np.array([5, 2]))
    assert h.features(0).tolist() == [0, 0, 0, 0]
    assert h.features(1) == pytest.approx([1.0, 0.5, 0.1, 0.2 / 12])


def test_batch1_helpers_equal_batched():
    """The online controller's batch-1 helpers give the batched builders' numbers bit for bit: the
    cached history row follows every update and reset, the scalar entropy read matches the
    whole-tensor path (fp32, bf16 tensors, NaN = not logged)."""
    h = rich.AcceptanceHistory(1)
    assert h.features_one().tolist() == h.features(0).tolist() == [0, 0, 0, 0]
    h.update(0, 3, 7)
    assert h.features_one().tolist() == h.features(0).tolist() and h.features_one()[1] > 0
    h.update_from_plan(np.array([0]), np.array([4]), np.array([True]), np.array([1]), np.array([6]))
    assert h.features_one().tolist() == h.features(0).tolist()
    h.reset(0)
    assert h.features_one().tolist() == [0, 0, 0, 0]
    # update_from_context (the engine's StepContext at B = 1) == update_from_plan, bit for bit
    from types import SimpleNamespace as NS
    g = rich.AcceptanceHistory(1)
    for cycle, (L, D) in enumerate([(0, 0), (3, 7), (1, 1), (0, 5), (12, 12), (2, 9)]):
        last = None if cycle == 0 else NS(accepted=[L], depth=D)
        g.update_from_context(NS(step=cycle, last=last))
        h.update_from_plan(np.array([0]), np.array([cycle]), np.array([last is not None]), np.array([L]), np.array([D]))
        assert g.features_one().tobytes() == h.features(0).tobytes()
    for e in (torch.tensor([2.3456789, 1.0, 0.5]), torch.tensor([2.3456789, 1.0]).bfloat16(),
              torch.tensor([float("nan"), 1.0]), np.array([7.123, 1.0], np.float32)):
        one, batched = rich.entropy_feature_one(e), rich.entropy_feature(e)
        assert isinstance(one, np.float32) and one.tobytes() == np.float32(batched).tobytes()


def test_obs_dims_and_unknown_variant():
    assert rich.obs_dim("ltd_depth", "paper", W) == W * W + 2
    assert rich.obs_dim("ltd_depth", "rich", W) == W * W + 7
    assert rich.obs_dim("radar", "rich", W) == W + 6
    assert rich.obs_dim("resps", "rich") == 15 + 4
    with pytest.raises(ValueError, match="observation variant"):
        rich.obs_dim("radar", "fancy")


def _net(spec, sample, seed, extra):
    """A random net, input-standardised on `sample`, whose first layer weighs the last `extra`
    (rich) columns 8x: its decisions hinge on them, so a mismatch there changes the trace."""
    torch.manual_seed(seed)
    net = build_net(spec).eval()
    if spec["type"] == "mlp":
        set_obs_norm(net, sample)
    lin = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        first = net.cell.weight_ih if spec["type"] == "radar_lstm" else lin[0].weight
        first[:, -extra:] *= 8.0
        lin[-1].bias.zero_()
    return net


def _greedy(net):
    return lambda o: net(torch.from_numpy(np.ascontiguousarray(o, np.float32))).argmax(-1).numpy()


def _env(logs, lat, mode, **kw):
    return make_replay_env(logs, lat, mode, n_envs=1, autoreset=False, width=W, max_depth=logs.max_depth,
                     obs_variant="rich", seed=0, **kw)


def _one(logs, s):
    return logs.subset(np.arange(logs.n_sequences) == s)


def _sample(logs, lat, mode, **kw):
    env = make_replay_env(logs, lat, mode, n_envs=64, width=W, max_depth=logs.max_depth, obs_variant="rich", seed=1, **kw)
    o, _ = env.reset(seed=1)
    out = [o]
    rng = np.random.default_rng(0)
    for _ in range(40):
        o, *_ = env.step(rng.integers(0, env.n_actions, env.n))
        out.append(o)
    return np.concatenate(out)


def _cycles_depth_env(env, act, on_cycle_end=lambda: None):
    """Drive a one-env depth/radar env to the sequence end -> [(D, L)] per cycle."""
    out, d, p = [], 1, int(env.p[0])
    o = env.observe()
    while True:
        a = act(o)
        o, _, term, trunc, info = env.step(a)
        if info["cycle_end"][0]:
            out.append((d if a[0] == 0 else d + 1, int(env.p[0]) - p - 1))
            d, p = 1, int(env.p[0])
            on_cycle_end()
        else:
            d += 1
        if term[0] or trunc[0]:
            return out


def test_ltd_env_equals_replay(syn):
    logs, lat = syn
    logs = logs.with_width(W)
    dims = (rich.obs_dim("ltd_depth", "rich", W), rich.obs_dim("ltd_size", "rich", W, logs.max_depth))
    depth = _net({"type": "mlp", "in": dims[0], "hidden": [16], "out": 2, "obs_norm": True},
                 _sample(logs, lat, "depth"), 5, 5)
    values = tuple(int(v) for v in logs.verify_grid if v >= 2)
    size = _net({"type": "mlp", "in": dims[1], "hidden": [16], "out": len(values), "obs_norm": True},
                _sample(logs, lat, "size", size_values=values), 4, 4)
    pol = LTDPolicy(depth, size, width=W, max_depth=logs.max_depth, size_values=values, obs_variant="rich")
    n_cycles, depths = 0, set()
    for s in range(logs.n_sequences):
        one = _one(logs, s)
        tr = simulate(pol, one, lat, trace=True).trace
        want = list(zip(tr["depth"].tolist(), tr["accepted"].tolist()))
        vs = []
        g = _greedy(size)

        def size_policy(o):
            v = np.asarray(values)[g(o)]
            vs.append(int(v[0]))
            return v

        env = _env(one, lat, "depth", size_policy=size_policy)
        env.reset(seed=0)
        assert _cycles_depth_env(env, _greedy(depth)) == want, s
        # the replay's V is the effective one: min(V, 1 + pool size)
        assert [min(v, 1 + W + (d - 1) * W * W) for v, (d, _) in zip(vs, want)] == tr["verify"].tolist()
        n_cycles += len(want)
        depths |= set(tr["depth"].tolist())
    assert n_cycles > 30 and len(depths) > 2          # the decisions vary


def test_size_env_equals_replay(syn):
    """SizeEnv's depth decisions (a depth policy in the loop) see the same rich inputs."""
    logs, lat = syn
    logs = logs.with_width(W)
    values = tuple(int(v) for v in logs.verify_grid if v >= 2)
    depth = _net({"type": "mlp", "in": rich.obs_dim("ltd_depth", "rich", W), "hidden": [16], "out": 2,
                  "obs_norm": True}, _sample(logs, lat, "depth"), 5, 5)
    size = _net({"type": "mlp", "in": rich.obs_dim("ltd_size", "rich", W, logs.max_depth), "hidden": [16],
                 "out": len(values), "obs_norm": True}, _sample(logs, lat, "size", size_values=values), 6, 4)
    pol = LTDPolicy(depth, size, width=W, max_depth=logs.max_depth, size_values=values, obs_variant="rich")
    for s in range(logs.n_sequences):
        one = _one(logs, s)
        tr = simulate(pol, one, lat, trace=True).trace
        g = _greedy(depth)
        env = _env(one, lat, "size", depth_policy=lambda o: g(o) == 1, size_values=values)
        o, _ = env.reset(seed=0)
        got = []
        while True:
            D, p = int(env.D[0]), int(env.p[0])
            o, _, term, trunc, _ = env.step(_greedy(size)(o))
            got.append((D, int(env.p[0]) - p - 1))
            if term[0] or trunc[0]:
                break
        assert got == list(zip(tr["depth"].tolist(), tr["accepted"].tolist())), s


def test_radar_env_equals_replay(syn):
    logs, lat = syn
    logs = logs.with_width(W)
    dim = rich.obs_dim("radar", "rich", W)
    net = _net({"type": "radar_lstm", "in": dim, "hidden": 8, "mlp_hidden": 8, "out": 2},
               None, 19, 6)
    pol = RadarPolicy(net, width=W, verify_size=20, max_calls=logs.max_depth, obs_variant="rich")
    depths = set()
    for s in range(logs.n_sequences):
        one = _one(logs, s)
        tr = simulate(pol, one, lat, trace=True).trace
        env = _env(one, lat, "radar", verify_size=20, radar_max_calls=logs.max_depth)
        env.reset(seed=0)
        state = [net.init_state(1)]

        def act(o):
            with torch.no_grad():
                logits, state[0] = net(torch.from_numpy(o), state[0])
            return logits.argmax(-1).numpy()

        got = _cycles_depth_env(env, act, on_cycle_end=lambda: state.__setitem__(0, net.init_state(1)))
        assert got == list(zip(tr["depth"].tolist(), tr["accepted"].tolist())), s
        depths |= set(tr["depth"].tolist())
    assert len(depths) > 3


def test_shape_env_equals_replay(syn):
    logs, lat = syn
    shapes = resps_shapes(logs, space="wide")[::3]
    hold = 3
    sample = _sample(logs, lat, "shape", shapes=tuple(map(tuple, shapes.tolist())), hold_cycles=hold)
    net = _net({"type": "mlp", "in": rich.obs_dim("resps", "rich"), "hidden": [16], "out": len(shapes),
                "obs_norm": True}, sample, 8, 4)
    pol = RespsPolicy(net, shapes, hold=hold, max_depth=logs.max_depth, obs_variant="rich")
    chosen = set()
    for s in range(logs.n_sequences):
        one = _one(logs, s)
        tr = simulate(pol, one, lat, trace=True).trace
        want = [(int(v), int(d), int(w)) for v, d, w in zip(tr["verify"][::hold], tr["depth"][::hold], tr["width"][::hold])]
        env = make_replay_env(one, lat, "shape", n_envs=1, autoreset=False, shapes=tuple(map(tuple, shapes.tolist())),
                        hold_cycles=hold, max_depth=logs.max_depth, obs_variant="rich", seed=0)
        o, _ = env.reset(seed=0)
        got = []
        while True:
            a = int(_greedy(net)(o)[0])
            V, D, Wa = (int(x) for x in shapes[a])
            got.append((min(V, 1 + Wa + (D - 1) * Wa * Wa), D, Wa))      # the replay traces the effective V
            o, _, term, trunc, _ = env.step(np.array([a]))
            if term[0] or trunc[0]:
                break
        assert got == want, s
        chosen |= set(got)
    assert len(chosen) > 1


def test_burn_in_gives_mid_sequence_episodes_a_history(syn):
    logs, lat = syn
    env = make_replay_env(logs.with_width(W), lat, "radar", n_envs=64, width=W, episode_cycles=1, obs_variant="rich", seed=0)
    o, _ = env.reset(seed=0)
    hist = o[:, -4:]
    assert (hist[:, 0] == 1).mean() > 0.5            # most episodes start after >= 1 burn-in cycle
    env0 = make_replay_env(logs.with_width(W), lat, "radar", n_envs=64, width=W, episode_cycles=1, obs_variant="rich",
                     history_burn_in=0, seed=0)
    assert (env0.reset(seed=0)[0][:, -4:] == 0).all()


def test_rich_checkpoint_round_trip(syn_root, tmp_path, capsys):
    from online.cli import main

    out = tmp_path / "ltd-rich"
    assert main(["train", "--method", "ltd", "--logs", str(syn_root), "--out", str(out), "--steps", "2048",
                 "--iters", "0", "--n-envs", "32", "--obs", "rich", "--no-progress", "--json"]) == 0
    json.loads(capsys.readouterr().out)
    man = read_manifest(out)
    assert {c["obs"]["variant"] for c in man["components"].values()} == {"rich"}
    assert man["components"]["depth"]["net"]["in"] == rich.obs_dim("ltd_depth", "rich", W)
    pol = load_checkpoint(out)
    assert pol.obs_variant == "rich" and "entropy" in pol.step_fields
    # components that disagree are refused with one line
    man["components"]["size"]["obs"]["variant"] = "paper"
    (out / "manifest.json").write_text(json.dumps(man))
    from pipeline.errors import DraftGymError
    with pytest.raises(DraftGymError, match="observation variant"):
        load_checkpoint(out)
