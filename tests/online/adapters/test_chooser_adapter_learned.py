"""A learned load-aware policy steering the batched engine (online/adapters/chooser.py around
simulator/serving/choosers/learned.py): every row stays lossless against its batch-1 AR output (fp32), the
engine measures the roots' depth-1 confidences exactly on the policy's decision steps (every `hold`
steps), the observation built from them is the replay's (observations.step_obs on log rows holding
the same numbers), a policy that observes deeper confidences is refused in one line, and `draftgym
validate --load-trace --policy DIR` runs a checkpoint on the device and in the replay. Tiny random
models; seconds, except the end-to-end test (it collects logs of the tiny target)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from online.adapters.chooser import ChooserController
from online.cli import main as cli
from pipeline.decode import step_shape
from pipeline.decode.controller import StepContext
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.single import Engine
from pipeline.errors import DraftGymError
from pipeline.models.head import random_head
from simulator.methods.checkpoint import save_policy
from simulator.methods.resps.serving_policy import LoadAwarePolicy
from simulator.observations.paper import ltd_depth_obs_dim, ltd_size_obs_dim
from simulator.policies.nets import build_net
from simulator.serving import observations
from simulator.serving.choosers.base import GreedyOracle
from simulator.serving.choosers.learned import LearnedChooser
from simulator.train.ppo import mlp_spec
from tests.conftest import make_tiny_llama

VOCAB, EOS, MAX_NEW = 6, 4, 20
LENGTHS = (3, 9, 1, 17, 5, 12, 7)
SHAPES = [step_shape.OFF, step_shape.chain(1), step_shape.chain(3), step_shape.canonical((3, 4, 10))]


def _spec(k: int = 1, max_batch: int = 4) -> observations.LoadObsSpec:
    return observations.LoadObsSpec(max_batch=max_batch, confidence_depth=k, probe_width=1)


class _Cycling:
    """A stand-in serving policy: decision i plays shape i mod 4 (every shape runs, the shape changes
    at every decision); records each observation it is asked about."""
    serving = True

    def __init__(self, hold: int, spec: observations.LoadObsSpec):
        self.shapes, self.hold, self.obs_spec, self.name = [step_shape.label(s) for s in SHAPES], hold, spec.to_json(), "cycling"
        self.seen, self.i = [], 0

    def reset(self, n_envs=1, seed=0):
        pass

    def act(self, obs):
        self.seen.append(np.array(obs))
        a = self.i % len(self.shapes)
        self.i += 1
        return np.array([a])


def _mlp_policy(hold: int, spec: observations.LoadObsSpec) -> LoadAwarePolicy:
    """The real class over a seeded random MLP."""
    torch.manual_seed(0)
    net = build_net(mlp_spec(spec.dim, (8,), len(SHAPES), obs_norm=False)).eval()
    return LoadAwarePolicy(net, [step_shape.label(s) for s in SHAPES], hold=hold, obs=spec.to_json(), name="mlp")


class _Recording(ChooserController):
    """Records, per step, whether the engine measured confidences and the chooser's state before it chose."""

    def reset(self):
        super().reset()
        self.asked, self.conf = [], []

    def plan(self, ctx):
        self.asked.append(ctx.confidence is not None)
        self.conf.append(None if ctx.confidence is None else ctx.confidence.detach().clone())
        return super().plan(ctx)


def _logs_holding(conf: np.ndarray) -> SimpleNamespace:
    """Log rows 0..B-1 whose probe beam (width 1) scores s_r(1) = conf[r]: what confidences() reads."""
    beams = np.asarray(conf, np.float32).reshape(-1, 1, 1)                    # [N, Dmax = 1, W = 1]
    return SimpleNamespace(w={1: SimpleNamespace(beam_scores=beams)})


@pytest.fixture(scope="module")
def tiny():
    model = make_tiny_llama(vocab=VOCAB, hidden=16, seed=0)
    head = random_head(model, seed=0)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (k,), generator=g).tolist() for k in LENGTHS]
    ar = [Engine(model, head, {EOS}).generate_ar(p, MAX_NEW) for p in prompts]
    return BatchEngine(model, head, {EOS}), prompts, ar


# ------------------------------------------------------------------ on the engine

@pytest.mark.parametrize("B, hold, k", [(2, 1, 1), (4, 3, 1), (3, 2, 0)])
def test_learned_chooser_on_the_engine(tiny, B, hold, k):
    """The cycling policy through ChooserController at batch B: every row is its batch-1 AR output;
    the engine measured confidences exactly on the decision steps (steps 0, hold, 2 hold, ...; never
    when k = 0); each step ran the shape of its block; and each decision's observation equals the
    replay's step_obs on log rows holding the engine's confidences, with the EMA and the previous
    shape recomputed from the step log."""
    beng, prompts, ar = tiny
    spec = _spec(k)
    pol = _Cycling(hold, spec)
    ctl = _Recording(LearnedChooser(pol), [MAX_NEW] * len(prompts))
    res = beng.generate(prompts, MAX_NEW, batch_size=B, controller=ctl)
    assert [r.output_ids for r in res] == [a.output_ids for a in ar]
    n = len(res.steps)
    dec = np.arange(n) % hold == 0
    assert ctl.asked == (dec if k else np.zeros(n, bool)).tolist()
    assert len(pol.seen) == dec.sum() == -(-n // hold)
    ran = [step_shape.canonical((s.depth, s.width, s.verify_size)) for s in res.steps]
    assert ran == [SHAPES[(i // hold) % len(SHAPES)] for i in range(n)]
    assert sum(s.accepted_sum for s in res.steps) > 0
    ema, has = 0.0, False
    j = 0
    for i, s in enumerate(res.steps):
        if dec[i]:
            prev = res.steps[i - 1] if i else None
            conf = ctl.conf[i].numpy() if k else np.zeros(s.batch_size, np.float32)
            want = observations.step_obs(spec, _logs_holding(conf), np.arange(s.batch_size), s.context_lens, s.queued, ema, has,
                              prev.depth if prev else 0, prev.verify_size if prev else 1)
            assert pol.seen[j].dtype == np.float32 and np.array_equal(pol.seen[j], want), i
            if k:
                assert len(conf) == s.batch_size and (conf <= 0).all() and (conf > -20).all()
                assert pol.seen[j][0, 7] == pytest.approx(conf.mean(), rel=1e-5)     # the batch's mean s(1)
                assert pol.seen[j][0, 8] == pytest.approx(conf.min(), rel=1e-5)      # and its min
            j += 1
        e, h = observations.ema_update(spec, ema, has, s.depth > 0, float(np.mean(s.accepted)))
        ema, has = float(e), bool(h)


def test_a_real_load_aware_policy_on_the_engine(tiny):
    """LoadAwarePolicy over a random MLP (the class `draftgym train-load` saves): lossless, its shape
    held for `hold` steps, confidences measured on the decision steps only."""
    beng, prompts, ar = tiny
    hold = 2
    ctl = _Recording(LearnedChooser(_mlp_policy(hold, _spec(1))), [MAX_NEW] * len(prompts))
    res = beng.generate(prompts, MAX_NEW, batch_size=3, controller=ctl)
    assert [r.output_ids for r in res] == [a.output_ids for a in ar]
    n = len(res.steps)
    assert ctl.asked == (np.arange(n) % hold == 0).tolist() and ctl.chooser.decisions == -(-n // hold)
    ran = [step_shape.canonical((s.depth, s.width, s.verify_size)) for s in res.steps]
    assert all(ran[i] == ran[i - 1] for i in range(n) if i % hold) and set(ran) <= set(SHAPES)


# ------------------------------------------------------------------ the adapter, without an engine

def test_the_adapter_hands_the_replays_observation_the_engines_confidence():
    """plan() turns ctx.confidence ([B] float32 tensor, with a NaN, a -inf and a value under the floor)
    into view.confidence [B, 1] float64, and the policy sees step_obs of log rows holding the same
    numbers (cleaned by the same clean_scores); off the decision steps nothing is asked; a decision
    step that got no confidences (no head) is refused in one line."""
    spec = _spec(1)
    pol = _Cycling(2, spec)
    ctl = ChooserController(LearnedChooser(pol), [50, 50, 50])
    ctl.reset()
    conf = torch.tensor([-0.25, -31.0, float("nan")], dtype=torch.float32)
    ctx = StepContext(step=0, batch_size=3, rows=[0, 1, 2], context_lens=[40, 17, 90], new_tokens=[3, 0, 7],
                           history=[[], [], []], queued=5, confidence=conf)
    assert ctl.uses_confidence
    shape = ctl.plan(ctx)
    assert (shape.depth, shape.width, shape.verify_size) == SHAPES[0]
    v = ctl.view
    assert v.confidence.dtype == np.float64 and v.confidence.shape == (3, 1)
    assert np.array_equal(v.confidence[:, 0], conf.double().numpy(), equal_nan=True)
    assert v.left.tolist() == [47, 50, 43] and (v.rows == -1).all()
    want = observations.step_obs(spec, _logs_holding(conf.numpy()), [0, 1, 2], [40, 17, 90], 5, 0.0, False, 0, 1)
    assert np.array_equal(pol.seen[0], want)
    assert pol.seen[0][0, 7] == pytest.approx((-0.25 - 20 - 20) / 3) and pol.seen[0][0, 8] == -20.0
    ctl.observe(SimpleNamespace(accepted=[0, 0, 0]))
    assert not ctl.uses_confidence                                      # held step: no probe
    ctl.plan(StepContext(step=1, batch_size=3, rows=[0, 1, 2], context_lens=[41, 18, 91], new_tokens=[4, 1, 8],
                              history=[[0], [0], [0]], queued=5))
    assert len(pol.seen) == 1 and ctl.uses_confidence                   # the next step decides again
    with pytest.raises(DraftGymError, match="no draft confidences") as e:
        ctl.plan(StepContext(step=2, batch_size=3, rows=[0, 1, 2], context_lens=[41, 18, 91],
                                  new_tokens=[4, 1, 8], history=[[0], [0], [0]], queued=5))
    assert "\n" not in str(e.value)


def test_deeper_confidences_and_the_oracle_are_refused_on_the_device():
    ch = LearnedChooser(_Cycling(2, _spec(2)))
    with pytest.raises(DraftGymError, match="depth 1 only") as e:
        ChooserController(ch, [10])
    assert "depth 2" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DraftGymError, match="replays only"):
        ChooserController(GreedyOracle(), [10])
    ChooserController(LearnedChooser(_Cycling(2, _spec(0))), [10])       # k = 0: nothing to measure
    assert not ChooserController(LearnedChooser(_Cycling(2, _spec(0))), [10]).uses_confidence


# ------------------------------------------------------------------ draftgym validate --load-trace --policy

CLI_SHAPES = [step_shape.OFF, step_shape.chain(1), step_shape.chain(2), step_shape.canonical((3, 10, 10))]


def _checkpoint(path, k: int = 1, max_batch: int = 2, hold: int = 2):
    """A resps-load checkpoint over one linear layer: chain:2 with one row (B / M = 0.5), off with two
    (logit of off = 2 B / M against chain:2's 1.5)."""
    spec = _spec(k, max_batch)
    net_spec = mlp_spec(spec.dim, (), len(CLI_SHAPES), obs_norm=False)
    net = build_net(net_spec)
    with torch.no_grad():
        net[-1].weight.zero_()
        net[-1].weight[0, 0] = 2.0
        net[-1].bias.copy_(torch.tensor([0.0, 0.0, 1.5, 0.0]))
    return save_policy(path, path.name, "resps-load", {"shape": {
        "module": net, "net": net_spec, "obs": spec.to_json(),
        "action": {"type": "serving_shape", "shapes": [step_shape.label(s) for s in CLI_SHAPES], "hold": hold}}},
        {"max_batch": max_batch})


def test_validate_load_trace_runs_a_learned_policy(tmp_path, tiny_model_dir, batch_logs, capsys):  # noqa: F811
    """The checkpoint runs on the device and in the replay of the same trace: every row exact against
    batch-1 AR, one-row steps draft chain:2 and two-row steps are off (so 0 < drafts/step < 2 on both
    sides)."""
    trace = tmp_path / "trace.txt"
    trace.write_text("0\n0\n0\n0.001\n0.002\n30\n30.5\n")
    ckpt = _checkpoint(tmp_path / "tiny-load")
    out = tmp_path / "load"
    rc = cli(["validate", "--model", str(tiny_model_dir), "--head", "random", "--load-trace", str(trace),
              "--max-batch", "2", "--n-prompts", "3", "--runs", "1", "--shapes", "chain:2", "--policy", str(ckpt),
              "--logs", str(batch_logs), "--out", str(out), "--json", "--no-progress"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    row = rep["rows"][-1]
    assert [r["name"] for r in rep["rows"]][:2] == ["AR", "static chain:2"]
    assert row["name"] == "learned tiny-load (tiny-load, hold 2)"
    assert row["lossless"] == {"exact": 7, "near-tie": 0, "mismatch": 0} and row["tokens_per_s"] > 0
    assert 0 < row["drafts_per_step"] < 2 and row["max_batch"] == 2
    assert row.get("replay_note") is None and row["replay"]["tokens_per_s"] > 0
    assert 1 <= row["replay"]["mean_batch"] <= 2 and row["replay"]["max_batch"] <= 2
    assert f"| {row['name']} |" in (out / "report.md").read_text()


def test_validate_load_trace_policy_bad_inputs(tmp_path, capsys):
    trace = tmp_path / "trace.txt"
    trace.write_text("0\n0\n")
    torch.manual_seed(0)
    specs = {"depth": {"type": "mlp", "in": ltd_depth_obs_dim(10), "hidden": [4], "out": 2},
             "size": {"type": "mlp", "in": ltd_size_obs_dim(10), "hidden": [4], "out": 12}}
    comps = {"depth": {"module": build_net(specs["depth"]), "net": specs["depth"],
                       "obs": {"name": "ltd_depth", "width": 10, "dim": ltd_depth_obs_dim(10)},
                       "action": {"type": "stop_continue", "max_depth": 12}},
             "size": {"module": build_net(specs["size"]), "net": specs["size"],
                      "obs": {"name": "ltd_size", "width": 10, "max_depth": 12, "dim": ltd_size_obs_dim(10)},
                      "action": {"type": "verify_size", "values": list(range(20, 241, 20))}}}
    batch1 = save_policy(tmp_path / "batch1", "batch1", "ltd", comps, {"width": 10, "max_depth": 12, "verify_size": 60})
    base = ["validate", "--logs", "", "--out", str(tmp_path / "r"), "--load-trace", str(trace), "--max-batch", "2"]
    cases = [(["--policy", str(_checkpoint(tmp_path / "deep", k=2))], "measures depth 1 only"),
             (["--policy", str(_checkpoint(tmp_path / "small", max_batch=1))], "trained for at most 1 rows"),
             (["--policy", str(batch1)], "not a load-aware serving policy"),
             (["--policy", "ddd"], "not built-in batch-1 policies"),
             (["--policy", str(tmp_path / "ok"), "--profile-first", "--logs", str(tmp_path)],
              "--profile-first runs at batch 1 only")]
    _checkpoint(tmp_path / "ok")
    for argv, msg in cases:
        assert cli([*base, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and err.startswith("draftgym: error:") and len(err.strip().splitlines()) == 1, err
