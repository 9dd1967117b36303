"""Sim == real for policies: the online engine with a policy in the loop (PolicyController) makes
the same decisions, cycle by cycle, as the replay of that policy over the collected logs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.collect.prompt import CollectConfig, collect_prompt
from pipeline.decode.engine.single import Engine
from pipeline.errors import DraftGymError
from pipeline.models.head import random_head
from simulator import baselines
from simulator.observations import rich
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import load_logs
from simulator.observations.paper import RESPS_DIM, ltd_depth_obs_dim, ltd_size_obs_dim
from online.adapters.policy import PolicyController
from simulator.policies.nets import build_net
from simulator.methods.ltd.policy import LTDPolicy
from simulator.methods.radar.policy import RadarPolicy
from simulator.methods.resps.policy import RespsPolicy
from simulator.replay import simulate
from simulator.logs.synthetic import write_positions, write_sequences
from tests.conftest import make_tiny_llama

GRID = (1, 2, 4, 8, 10, 20, 30)
VOCAB, W, DMAX, T = 6, 3, 6, 40          # a 6-token target: a random head's top-3 is accepted often


def _net(spec, seed):
    """A random net with its last bias zeroed, so its argmax depends on the input, not on the bias."""
    torch.manual_seed(seed)
    net = build_net(spec).eval()
    with torch.no_grad():
        [m for m in net.modules() if isinstance(m, torch.nn.Linear)][-1].bias.zero_()
    return net


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    model = make_tiny_llama(vocab=VOCAB, hidden=16, seed=0)
    head = random_head(model, seed=0)
    eng = Engine(model, head)
    cfg = CollectConfig(max_new_tokens=T, widths=(W,), max_depth=DMAX, verify_grid=GRID, position_batch=8)
    rows, prompts = [], []
    for s in range(3):
        prompt = torch.randint(0, VOCAB, (5,), generator=torch.Generator().manual_seed(s)).tolist()
        log = collect_prompt(eng, head, prompt, cfg)
        c = log.positions[W]
        n = len(c["position"])
        write_positions(root, "tiny", "parity", 0.0, W, [f"p{s}"] * n, c["position"], c["context_len"],
                        c["acceptance"].reshape(n, DMAX, len(GRID)), c["beam_scores"], c["candidate_scores"],
                        c["entropy"], name=f"p{s}")
        rows.append({"prompt_id": f"p{s}", "split": "test", "prompt_tokens": prompt, "output_tokens": log.output_tokens,
                     "new_tokens": log.new_tokens, "widths": [W], "max_depth": DMAX, "verify_grid": list(GRID)})
        prompts.append(prompt)
    write_sequences(root, "tiny", "parity", 0.0, rows)
    return eng, load_logs(root), prompts


def _policies(logs):
    """Policies whose decisions vary on these logs: thresholds at the data's medians, nets with fitted
    input standardisation (seeds picked so the random nets' decisions vary: LTD D in 2..5, V in 1..30)."""
    from simulator.observations.paper import best_beam_entropy, best_beam_score, ltd_depth_obs, ltd_size_obs, resps_obs
    from simulator.policies.nets import set_obs_norm

    wa = logs.w[W]
    ddd_thr = float(np.median(best_beam_score(wa.beam_scores[:, 1])))
    theta = float(np.sqrt(0.15 * max(np.median(best_beam_entropy(wa.entropy[:, 1])), 0.3)))
    D = np.random.default_rng(0).integers(1, DMAX + 1, logs.n_positions)
    d_obs = np.concatenate([ltd_depth_obs(wa.candidate_scores[:, d], d + 1, logs.context_len, W) for d in range(3)])
    s_obs = ltd_size_obs(wa.candidate_scores, D, logs.context_len, W, DMAX)
    r_obs = resps_obs(wa.candidate_scores[:, 0, :W], logs.acceptance[:, 2, 3], D, 10, W, 2, logs.context_len, 1, DMAX)
    depth = _net({"type": "mlp", "in": ltd_depth_obs_dim(W), "hidden": [16], "out": 2, "obs_norm": True}, 9)
    size = _net({"type": "mlp", "in": ltd_size_obs_dim(W, DMAX), "hidden": [16], "out": 7, "obs_norm": True}, 109)
    shapes = np.array([(v, d, W) for v in (4, 10, 30) for d in (2, 3, 5)])
    shape = _net({"type": "mlp", "in": RESPS_DIM, "hidden": [16], "out": len(shapes), "obs_norm": True}, 3)
    for net, o in ((depth, d_obs), (size, s_obs), (shape, r_obs)):
        set_obs_norm(net, o)
    radar = _net({"type": "radar_lstm", "in": W, "hidden": 8, "mlp_hidden": 8, "out": 2}, 9)   # stops at call 3
    # the rich variant (observations_rich): the same inputs plus entropy / acceptance-history columns,
    # standardised on the paper sample plus uniform [0, 1] columns (the history's range)
    ext = lambda o, k, seed: np.concatenate([o, np.random.default_rng(seed).random((len(o), k), np.float32)], 1)
    depth_r = _net({"type": "mlp", "in": rich.obs_dim("ltd_depth", "rich", W), "hidden": [16], "out": 2,
                    "obs_norm": True}, 5)
    size_r = _net({"type": "mlp", "in": rich.obs_dim("ltd_size", "rich", W, DMAX), "hidden": [16], "out": 7,
                   "obs_norm": True}, 105)
    shape_r = _net({"type": "mlp", "in": rich.obs_dim("resps", "rich"), "hidden": [16], "out": len(shapes),
                    "obs_norm": True}, 5)
    for net, o, k in ((depth_r, d_obs, 5), (size_r, s_obs, 4), (shape_r, r_obs, 4)):
        set_obs_norm(net, ext(o, k, k))
    radar_r = _net({"type": "radar_lstm", "in": rich.obs_dim("radar", "rich", W), "hidden": 8, "mlp_hidden": 8,
                    "out": 2}, 5)      # seeds 5 / 105: the rich variants' D and V vary on these logs
    return [baselines.StaticPolicy(5, W, 20),
            baselines.DDDPolicy(threshold=ddd_thr, checkpoints=(2, 3, 4), width=W, verify=30, max_depth=DMAX),
            baselines.EntropyStopPolicy(theta=theta, width=W, verify=30, max_depth=DMAX),
            baselines.GoodputPolicy.fit(logs, LAT, width=W, verify=30),
            LTDPolicy(depth, size, width=W, max_depth=DMAX, size_values=GRID),
            RadarPolicy(radar, width=W, verify_size=30, max_calls=DMAX),
            RespsPolicy(shape, shapes, hold=2, max_depth=DMAX),
            LTDPolicy(depth_r, size_r, width=W, max_depth=DMAX, size_values=GRID, name="ltd-rich", obs_variant="rich"),
            RadarPolicy(radar_r, width=W, verify_size=30, max_calls=DMAX, name="radar-rich", obs_variant="rich"),
            RespsPolicy(shape_r, shapes, hold=2, max_depth=DMAX, name="resps-rich", obs_variant="rich")]


LAT = LatencyModel.from_constants(draft_step=0.004, verify=0.03, verify_per_token=5e-4)


def test_engine_with_policy_matches_replay(collected):
    eng, logs, prompts = collected
    total = 0
    for pol in _policies(logs):
        sim = simulate(pol, logs, LAT, trace=True).trace
        if pol.rich:             # the rich variants' decisions vary on these logs (else the test shows little)
            assert len(set(zip(sim["depth"].tolist(), sim["verify"].tolist()))) > 1, pol.name
        for s, prompt in enumerate(prompts):
            real = eng.generate(prompt, T, controller=PolicyController(pol, max_depth=DMAX))
            m = sim["seq"] == s
            got = [(c.depth, c.verify_size, c.accepted) for c in real.cycles]
            want = list(zip(sim["depth"][m].tolist(), sim["verify"][m].tolist(), sim["accepted"][m].tolist()))
            assert got == want, pol.name
            total += len(got)
    assert total > 100


def test_controller_takes_the_batch1_paths(collected):
    """LTD and RADAR run online through plan_one / continue_one / verify_size_one, never through the
    batched hooks; test_engine_with_policy_matches_replay shows those decisions equal the replay's."""
    eng, logs, prompts = collected
    for pol in [p for p in _policies(logs) if isinstance(p, (LTDPolicy, RadarPolicy))]:
        calls = {k: 0 for k in ("plan", "continue_drafting", "verify_size",
                                "plan_one", "continue_one", "verify_size_one")}

        def count(name, f):
            def g(*a, **kw):
                calls[name] += 1
                return f(*a, **kw)
            return g

        for name in calls:
            if hasattr(pol, name):
                setattr(pol, name, count(name, getattr(pol, name)))
        ctrl = PolicyController(pol, max_depth=DMAX)
        out = eng.generate(prompts[0], T, controller=ctrl)
        n = len(out.cycles)
        assert calls["plan"] == calls["continue_drafting"] == calls["verify_size"] == 0, pol.name
        assert calls["plan_one"] == n and calls["continue_one"] >= n, pol.name
        assert calls["verify_size_one"] == (n if isinstance(pol, LTDPolicy) else 0), pol.name
        assert ctrl.calls == calls["continue_one"] + calls["verify_size_one"], pol.name


def test_policy_controller_is_a_controller():
    """The adapter is a plain Controller subclass (the engine's interface), for any policy."""
    from online.adapters.specs import make_controller
    from pipeline.decode.controller import Controller, StaticController

    ctrl = PolicyController(baselines.StaticPolicy(2, 3, 4))
    assert isinstance(ctrl, Controller) and isinstance(ctrl, PolicyController)
    assert type(ctrl) is PolicyController
    assert isinstance(make_controller("ddd"), PolicyController)
    assert type(make_controller("static:2,3,4")) is StaticController


def test_oracle_is_offline_only(collected):
    _, logs, _ = collected
    with pytest.raises(DraftGymError, match="offline only"):
        PolicyController(baselines.OraclePolicy(logs, LAT))


def test_numpy_mlp_matches_torch():
    """The online controller's batch-1 numpy forward is the torch net's function: logits to 1e-5,
    also with only the drafted levels' weight rows read (LTD's size observation, padded levels)."""
    from simulator.observations.paper import SCORE_FLOOR, ltd_size_obs
    from simulator.policies.nets import NumpyMLP, set_obs_norm

    Wd, Dm = 4, 5
    n_in = ltd_size_obs_dim(Wd, Dm)
    net = _net({"type": "mlp", "in": n_in, "hidden": [64, 32], "out": 7, "obs_norm": True}, seed=3)
    rng = np.random.default_rng(0)
    set_obs_norm(net, rng.normal(-3, 2, (256, n_in)).astype(np.float32))
    fast = NumpyMLP(net, pad=np.full(n_in, SCORE_FLOOR, np.float32), tail=2)
    for depth in range(1, Dm + 1):
        lv = np.sort(rng.normal(-2, 1.5, (1, Dm, Wd * Wd)).astype(np.float32), -1)[..., ::-1]
        o = ltd_size_obs(lv, np.array([depth]), np.array([300]), Wd, Dm, presorted=True)
        with torch.no_grad():
            ref = net(torch.from_numpy(o)).numpy()[0]
        live = Wd + (depth - 1) * Wd * Wd
        np.testing.assert_allclose(fast(o[0], live=live), ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(fast(o[0]), ref, rtol=1e-5, atol=1e-5)
        assert fast(o[0], live=live).argmax() == ref.argmax()
        # the parts form (LTD's online size path) is the live form, bit for bit
        assert np.array_equal(fast.call_parts(o[0, :live], o[0, -2:]), fast(o[0], live=live))
    # a changed net (an optimiser step, a loaded state_dict) is noticed: `fresh` rebuilds the copy
    assert NumpyMLP.fresh(fast, net) is fast
    with torch.no_grad():
        next(net.parameters()).add_(1.0)
    again = NumpyMLP.fresh(fast, net)
    assert again is not fast
    with torch.no_grad():
        np.testing.assert_allclose(again(o[0]), net(torch.from_numpy(o)).numpy()[0], rtol=1e-5, atol=1e-5)


def test_numpy_radar_matches_torch():
    """RADAR's batch-1 numpy step (LSTMCell + MLP) is the torch net's function over a whole
    trajectory of calls: logits and LSTM state to 1e-5, the same STOP/CONTINUE decisions, and a
    batch-1 RadarPolicy makes the same decisions as the batched torch path."""
    from simulator.policies.base import StepBatch
    from simulator.policies.nets import NumpyRadar, make_radar_net
    from simulator.methods.radar.policy import RadarPolicy

    torch.manual_seed(4)
    net = make_radar_net(n_in=6, hidden=16, mlp_hidden=12).eval()
    fast = NumpyRadar(net)
    rng = np.random.default_rng(1)
    h, c = net.init_state(1)
    hn, cn = h[0].numpy(), c[0].numpy()
    for _ in range(6):
        x = rng.normal(-2, 1.5, 6).astype(np.float32)
        with torch.no_grad():
            ref, (h, c) = net(torch.from_numpy(x)[None], (h, c))
        logits, hn, cn = fast(x, hn, cn)
        np.testing.assert_allclose(logits, ref.numpy()[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(hn, h.numpy()[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(cn, c.numpy()[0], rtol=1e-5, atol=1e-5)
    # the policy: 3 envs stepped one at a time (numpy) vs all at once (torch)
    scores = rng.normal(-2, 1.5, (4, 3, 6)).astype(np.float32)      # [calls, envs, W]
    one, many = RadarPolicy(net, width=6), RadarPolicy(net, width=6)
    one.reset(3), many.reset(3)
    for t in range(4):
        env = np.arange(3)
        step = lambda e: StepBatch(env=env[e], depth=t + 1, width=6, beam_scores=scores[t, e], candidate_scores=None,
                                   entropy=None, context_len=np.full(len(env[e]), 100))
        batched = many.continue_drafting(step(slice(0, 3)))
        single = [one.continue_drafting(step(slice(i, i + 1)))[0] for i in range(3)]
        assert list(batched) == single
        np.testing.assert_allclose(one.h, many.h, rtol=1e-5, atol=1e-5)
