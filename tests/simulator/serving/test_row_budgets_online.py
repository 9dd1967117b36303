"""Per-request budgets on the device (online/adapters/chooser.py RowChooserController around
simulator/serving/choosers/base.RowChooser): vLLM's adaptive verification and DraftGym's learned
budget steer the batched engine, each row verifying its own prefix of the drafted chain; every row
is its batch-1 AR output (fp32), each row's caps are what the chooser computes from the engine's own
running draft log-probs, and the learned budget's draft depth changes with what it learns."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from online.adapters.chooser import ChooserController, RowChooserController, controller_for
from pipeline.decode import step_shape
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.single import Engine
from pipeline.models.head import random_head
from simulator.latency.model import LatencyModel
from simulator.logs.replay_logs import load_logs
from simulator.logs.synthetic import SyntheticConfig, write_synthetic_logs
from simulator.serving.choosers.base import StaticChooser
from simulator.serving.choosers.row_budget import AcceptanceModel, CalibratedBudget
from simulator.serving.choosers.vllm_adaptive import VLLMAdaptiveVerification
from tests.conftest import make_tiny_llama

VOCAB, EOS, MAX_NEW = 6, 4, 16


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("rb-logs")
    write_synthetic_logs(d, SyntheticConfig(n_sequences=6, widths=(1, 4), new_tokens=(12, 30), latency_profile="gpu",
                                            latency_batches=(1, 2, 4, 8)))
    logs, lat = load_logs(d, widths="all", split="all"), LatencyModel.from_logs(d)
    model = make_tiny_llama(vocab=VOCAB, hidden=16, seed=0)
    head = random_head(model, seed=0)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (int(k),), generator=g).tolist() for k in torch.randint(1, 12, (9,), generator=g)]
    ar = [Engine(model, head, {EOS}).generate_ar(p, MAX_NEW) for p in prompts]
    return logs, lat, BatchEngine(model, head, {EOS}), prompts, ar


class _Seen(RowChooserController):
    def reset(self):
        super().reset()
        self.scores, self.caps = [], []

    def row_budgets(self, scores, shape):
        k = super().row_budgets(scores, shape)
        self.scores.append(np.array(scores))
        self.caps.append(k)
        return k


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("rule", ["vllm", "learned"])
def test_row_choosers_on_the_engine_are_lossless(setup, B, rule):
    logs, lat, beng, prompts, ar = setup
    ch = VLLMAdaptiveVerification(K=3) if rule == "vllm" else CalibratedBudget(AcceptanceModel.fit(logs, 3))
    assert type(controller_for(ch, [MAX_NEW] * len(prompts), lat)) is RowChooserController
    assert type(controller_for(StaticChooser(step_shape.chain(2)), [MAX_NEW] * len(prompts), lat)) is ChooserController
    ctl = _Seen(ch, [MAX_NEW] * len(prompts), lat)
    res = beng.generate(prompts, MAX_NEW, batch_size=B, controller=ctl)
    assert [r.output_ids for r in res] == [a.output_ids for a in ar]
    budgeted = [s for s in res.steps if s.row_budgets is not None]
    assert len(budgeted) == len(ctl.caps) > 0 and [s.row_budgets for s in budgeted] == ctl.caps
    assert all(L <= k for s in budgeted for L, k in zip(s.accepted, s.row_budgets))
    assert all(sc.shape == (s.batch_size, s.depth) and (sc <= 1e-6).all() for sc, s in zip(ctl.scores, budgeted))
    if rule == "vllm":
        assert {s.depth for s in res.steps} == {3}                          # vLLM's rule always drafts K


@pytest.mark.parametrize("B", [1, 4])
def test_nightjar_on_the_engine_is_lossless_and_learns_from_wall_time(setup, B):
    """Nightjar's bandit (a step rule, not a per-row one) through ChooserController: every row its batch-1
    AR output, each step's reward from the wall time between the plan and the observation."""
    from simulator.serving.choosers.nightjar import Nightjar

    _, lat, beng, prompts, ar = setup
    ch = Nightjar(3, seed=2)
    ctl = controller_for(ch, [MAX_NEW] * len(prompts), lat)
    assert type(ctl) is ChooserController
    res = beng.generate(prompts, MAX_NEW, batch_size=B, controller=ctl)
    assert [r.output_ids for r in res] == [a.output_ids for a in ar]
    assert ch.n.sum() == len(res.steps) and (ch.mean[ch.n > 0] > 0).all()
    assert {s.depth for s in res.steps} <= {1, 2, 3} and len({s.depth for s in res.steps}) > 1   # explores, never off
