"""Batched EAGLE-3 decoding (pipeline/decode/engine/core.py): lossless at batch B.

fp32: every row equals its own batch-1 AR output token for token, at B = 1..8, with mixed prompt
lengths, EOS mid-batch, refills from the queue, and off / chain / tree steps mixed in one generation;
with a static shape every row also equals its batch-1 EAGLE-3 run cycle for cycle (the same accepted
lengths: the batched draft is the batch-1 draft). bf16: rows classified as pipeline/decode/lossless.py
does, and a biased acceptance rule is caught as a mismatch at B > 1. T > 0: a row's output is its
batch-1 output with the same seed, and the batched rows' joint law of two tokens is the target's
(chi-square), while a biased sampling rule is rejected.
"""
from __future__ import annotations

import math

import pytest
import torch

import pipeline.decode.engine.verify as batch_verify_mod
from pipeline.decode.controller import Controller, ScheduleController, ScriptedController, StaticController
from pipeline.decode.draft import expand_tree
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.single import Engine
from pipeline.decode.engine.verify import accept_greedy_batch, select_trees, tree_masks
from pipeline.decode.lossless import classify, summarize_verdicts
from pipeline.decode.step_shape import StepShape
from pipeline.decode.tree import select_tree
from pipeline.decode.verify import accept_greedy
from pipeline.errors import DraftGymError
from pipeline.models.head import random_head
from tests.conftest import make_tiny_llama
from tests.pipeline.decode.conftest import MIXED, setup_tiny
from tests.pipeline.decode.test_lossless import plant_biased_rule
from tests.pipeline.decode.test_sampling import PROMPT, VOCAB, chi_square_pvalue, exact_law
from tests.pipeline.decode.test_sampling import biased_accept as biased_sampling

@pytest.mark.parametrize("B", range(1, 9))
def test_mixed_steps_equal_batch1_ar(tiny, B):
    """Off, chain and tree steps mixed in one generation, 10 prompts of 1-17 tokens (refills at every
    B <= 8), EOS mid-batch: each row is its batch-1 AR output, and drafts do get accepted."""
    eng, beng, prompts, ar = tiny
    res = beng.generate(prompts, 20, batch_size=B, controller=ScriptedController(MIXED))
    for r, a in zip(res, ar):
        assert r.output_ids == a.output_ids and r.stop_reason == a.stop_reason, (B, r.index)
    assert {a.stop_reason for a in ar} == {"eos", "max_new_tokens"}
    assert {s.shape.kind for s in res.steps} == {"off", "chain", "tree"}
    live = sum(a.new_tokens > 1 for a in ar)                # rows not finished by their prefill's token
    assert max(s.batch_size for s in res.steps) == min(B, live) and sum(s.accepted_sum for s in res.steps) > 10
    assert all(s.accepted == [0] * s.batch_size for s in res.steps if s.depth == 0)
    # the step log and the rows' cycles tell the same story
    assert sum(s.emitted_sum for s in res.steps) + len(prompts) == sum(r.new_tokens for r in res)
    assert sum(len(r.cycles) for r in res) == sum(s.batch_size for s in res.steps)


@pytest.mark.parametrize("shape", [StepShape.chain(3), StepShape(4, 3, 10), StepShape(8, 10, 60), StepShape(3, 4, 37)],
                         ids=lambda s: s.label())
def test_static_shape_equals_batch1_engine_cycle_for_cycle(tiny, shape):
    """With one shape every step, each row at B = 3 and 8 equals its batch-1 EAGLE-3 run: the same
    tokens and the same accepted length in every cycle (the draft of a row does not see its batch-mates)."""
    eng, beng, prompts, ar = tiny
    ctrl = StaticController(shape.depth, shape.width, shape.verify_size)
    ref = [eng.generate(p, 20, controller=ctrl) for p in prompts]
    for B in (3, 8):
        res = beng.generate(prompts, 20, batch_size=B, controller=StaticController(shape))
        for r, e, a in zip(res, ref, ar):
            assert r.output_ids == e.output_ids == a.output_ids
            assert [c.accepted for c in r.cycles] == [c.accepted for c in e.cycles]
            assert r.tau == e.tau
    if shape.depth == 3:          # vocabulary 6, W = 4, V = 37: most depth-1 and depth-2 nodes are in the tree
        assert max(c.accepted for r in res for c in r.cycles) == 3


def test_ar_at_batch_b_is_the_off_step(tiny):
    """generate_ar runs every step off with no head work; rows equal batch-1 AR, greedy and sampled."""
    eng, beng, prompts, ar = tiny
    res = beng.generate_ar(prompts, 20, batch_size=4)
    assert [r.output_ids for r in res] == [a.output_ids for a in ar]
    assert all(s.depth == 0 and s.verify_size == 1 for s in res.steps) and res.method == "ar"
    assert all(r.tau == 1.0 for r in res if r.cycles)
    seeds = [3 * i + 1 for i in range(len(prompts))]
    sampled = beng.generate_ar(prompts, 20, 0.8, seeds, batch_size=3)
    assert [r.output_ids for r in sampled] == [eng.generate_ar(p, 20, 0.8, s).output_ids
                                                for p, s in zip(prompts, seeds)]
    no_head = BatchEngine(eng.model, None, eng.eos)
    assert [r.output_ids for r in no_head.generate_ar(prompts, 20, batch_size=8)] == [a.output_ids for a in ar]


def test_max_steps_stops_the_call_on_the_full_run_s_prefix(tiny):
    """max_steps = k: exactly k steps, each row's tokens a prefix of the unbounded run's, rows cut
    there keep stop_reason '' (the profile's timed steps, pipeline/profiling/steps.py)."""
    eng, beng, prompts, ar = tiny
    ctrl = lambda: ScriptedController(MIXED)
    full = beng.generate(prompts, 20, batch_size=4, controller=ctrl())
    cut = beng.generate(prompts, 20, batch_size=4, controller=ctrl(), max_steps=5)
    assert len(cut.steps) == 5 < len(full.steps)
    assert [s.accepted for s in cut.steps] == [s.accepted for s in full.steps[:5]]
    for r, f in zip(cut, full):
        assert f.output_ids[: len(r.output_ids)] == r.output_ids
    assert "" in {r.stop_reason for r in cut}


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampled_rows_equal_batch1_with_the_same_seed(tiny, temperature):
    """T > 0: row r draws from its own Generator(seeds[r]) exactly as the batch-1 engine does, so its
    output (and its accepted lengths) equal its batch-1 run's, at any B and any place in the batch."""
    eng, beng, prompts, _ = tiny
    seeds = [7 * i + 2 for i in range(len(prompts))]
    shape = StepShape(4, 3, 10)
    ref = [eng.generate(p, 20, temperature, s, controller=StaticController(4, 3, 10)) for p, s in zip(prompts, seeds)]
    for B in (2, 5):
        res = beng.generate(prompts, 20, temperature, seeds, batch_size=B, controller=StaticController(shape))
        assert [r.output_ids for r in res] == [e.output_ids for e in ref]
        assert [[c.accepted for c in r.cycles] for r in res] == [[c.accepted for c in e.cycles] for e in ref]
    moved = beng.generate(prompts[::-1], 20, temperature, seeds[::-1], batch_size=4,
                          controller=StaticController(shape))
    assert [r.output_ids for r in moved][::-1] == [e.output_ids for e in ref]
    assert sum(c.accepted for e in ref for c in e.cycles) > 5


N_LAW = 600


def _law_counts(beng, shapes, seed0: int) -> torch.Tensor:
    res = beng.generate([PROMPT] * N_LAW, 3, 1.0, list(range(seed0, seed0 + N_LAW)), batch_size=8,
                        controller=ScriptedController(shapes))
    counts = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    for r in res:
        counts[r.output_ids[1], r.output_ids[2]] += 1
    return counts


def test_sampling_law_at_batch_8_and_biased_rule_is_caught(monkeypatch):
    """T = 1 at B = 8 (600 rows of one prompt, seeds 0..599, chain / tree / off steps): the joint
    law of the 2nd and 3rd new tokens passes a chi-square test against the target's exact law
    (tests/pipeline/decode/test_sampling.py); with a rule that keeps rejected drafts in the residual it fails."""
    model = make_tiny_llama(vocab=VOCAB, hidden=16, seed=4)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    beng = BatchEngine(model, random_head(model, seed=2))
    law = exact_law(model)
    shapes = [StepShape.chain(2), StepShape(3, 2, 6), StepShape.off()]
    assert chi_square_pvalue(_law_counts(beng, shapes, 0), law) > 1e-3
    monkeypatch.setattr(batch_verify_mod, "accept_sampling", biased_sampling)
    assert chi_square_pvalue(_law_counts(beng, shapes[:2], 9000), law) < 1e-5


def test_bf16_real_rule_passes_biased_rule_fails(monkeypatch):
    """bf16 at B = 4 (a target with a wide logit range, as tests/pipeline/decode/test_lossless.py): every row is exact
    or a near-tie against batch-1 AR; the biased acceptance rule is caught as mismatches."""
    model = make_tiny_llama(vocab=64, hidden=32, seed=7)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model = model.to(torch.bfloat16)
    eng, beng = Engine(model, None), BatchEngine(model, random_head(model, seed=1))
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 12, (8,), generator=gen).tolist()
    prompts = [torch.randint(0, 64, (k,), generator=gen).tolist() for k in lengths]
    ars = [eng.generate_ar(p, 24).output_ids for p in prompts]
    ctrl = ScriptedController([StepShape(4, 4, 12), StepShape.chain(3), StepShape(2, 8, 10), StepShape.off()])

    def run():
        res = beng.generate(prompts, 24, batch_size=4, controller=ctrl)
        return summarize_verdicts([classify(model, p, a, r.output_ids) for p, a, r in zip(prompts, ars, res)])

    real = run()
    assert real["counts"]["mismatch"] == 0, real
    plant_biased_rule(monkeypatch)
    biased = run()
    assert biased["counts"]["mismatch"] >= 3, biased
    assert biased["counts"]["exact"] < real["counts"]["exact"]


def test_tree_selection_and_greedy_acceptance_equal_batch1():
    """select_trees and accept_greedy_batch row by row equal select_tree and accept_greedy, on
    pools of 6 roots and on logits whose argmax follows the tree for a random number of levels."""
    model = make_tiny_llama(vocab=64, hidden=32, seed=1)
    head = random_head(model, seed=5)
    g = torch.Generator().manual_seed(0)
    S, B = 9, 6
    feats = torch.randn(1, S, 32, generator=g)
    hid, logits, kv = head(torch.randint(0, 64, (1, S), generator=g), feats, torch.arange(S))
    n = torch.randint(1, S + 1, (B,), generator=g)
    mask = torch.arange(S)[None] < n[:, None]
    for D, W, V in [(4, 3, 12), (3, 1, 4), (2, 4, 40), (5, 2, 1), (8, 3, 30)]:
        pool = expand_tree(head, kv, mask, hid[0, n - 1], logits[0, n - 1], n - 1, W, D)
        roots = torch.randint(0, 64, (B,), generator=g)
        trees = select_trees(pool, roots, V)
        vlogits = torch.randn(B, trees.size, 64, generator=g)
        for r in range(B):
            one = select_tree(pool, r, int(roots[r]), V)
            assert torch.equal(trees.tokens[r], one.tokens) and torch.equal(trees.parents[r], one.parents)
            assert torch.equal(trees.depths[r], one.depths) and torch.equal(trees.mask[r], one.mask)
            node = 0                                  # the target's argmax follows the tree for r levels
            for _ in range(r % (D + 1)):
                kids = [c for c in range(one.size) if int(one.parents[c]) == node]
                if not kids:
                    break
                vlogits[r, node, one.tokens[kids[-1]]] = 50.0
                node = kids[-1]
        accepted, bonus = accept_greedy_batch(trees, vlogits)
        for r in range(B):
            path, b = accept_greedy(trees.row(r), vlogits[r])
            assert accepted[r].nonzero().flatten().tolist() == [0] + path and int(bonus[r]) == b
    assert torch.equal(tree_masks(torch.tensor([[-1, 0, 0, 1]]), 2)[0].int(),
                       torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]))


class _Recorder(Controller):
    """Asks for the roots' confidences; chain-2 when some root is confident, else off; records contexts."""

    uses_confidence = True

    def __init__(self):
        super().__init__()
        self.contexts, self.records = [], []

    def plan(self, ctx):
        self.contexts.append(ctx)
        return StepShape.chain(2) if bool((ctx.confidence > -1.7).any()) else StepShape.off()

    def observe(self, record):
        self.records.append(record)


def test_controller_sees_the_batch_and_the_step_log(tiny):
    """The controller sees B, each row's context length, history and depth-1 confidence, the queue;
    records carry per-row L and the times; the schedule picks shapes by the step's batch size."""
    eng, beng, prompts, ar = tiny
    rec = _Recorder()
    res = beng.generate(prompts, 20, batch_size=4, controller=rec)
    assert [r.output_ids for r in res] == [a.output_ids for a in ar]
    assert rec.records == res.steps and len(rec.contexts) == len(res.steps)
    for ctx, s in zip(rec.contexts, res.steps):
        assert ctx.batch_size == s.batch_size == len(ctx.rows) == len(ctx.context_lens) == ctx.confidence.shape[0]
        assert ctx.context_lens == s.context_lens and ctx.rows == s.rows and ctx.queued == s.queued
        assert bool((ctx.confidence <= 0).all() and (ctx.confidence >= -math.log(6) - 1e-5).all())   # top of 6
    assert {s.shape.label() for s in res.steps} == {"off", "chain:2"}
    last = rec.contexts[-1]
    assert all(h == [c.accepted for c in res[i].cycles][: len(h)] for i, h in zip(last.rows, last.history))
    assert all(s.t_verify > 0 and s.t_draft > 0 and s.t_step >= s.t_draft + s.t_verify + s.t_controller
               for s in res.steps)
    table = res.step_rows()
    assert table[0]["shape"] in ("off", "chain:2") and table[0]["accepted_sum"] == sum(table[0]["accepted"])

    sched = ScheduleController([(1, 2, StepShape.off()), (3, 5, StepShape.chain(3)),
                                     (6, None, StepShape(4, 3, 10))])
    max_new = [20, 3, 18, 5, 16, 7, 14, 9, 12, 11]            # rows leave one by one: the batch drains
    res = beng.generate(prompts, max_new, batch_size=7, controller=sched)
    assert [r.output_ids for r in res] == [a.output_ids[:m] for a, m in zip(ar, max_new)]
    for s in res.steps:
        assert s.shape.label() == ("off" if s.batch_size <= 2 else "chain:3" if s.batch_size <= 5 else "tree:4,3,10")
    assert {s.shape.label() for s in res.steps} == {"off", "chain:3", "tree:4,3,10"}


def test_bad_inputs(tiny):
    eng, beng, prompts, _ = tiny
    with pytest.raises(DraftGymError, match="empty prompt"):
        beng.generate([[1], []], 4)
    with pytest.raises(DraftGymError, match="2 seeds for 1 prompts"):
        beng.generate([[1]], 4, seeds=[1, 2])
    with pytest.raises(DraftGymError, match="prompt too long"):
        beng.generate_ar([[1] * 500], 40)
    with pytest.raises(DraftGymError, match="batch_size"):
        beng.generate([[1]], 4, batch_size=0)
    with pytest.raises(DraftGymError, match="max_steps must be >= 1"):
        beng.generate([[1]], 4, max_steps=0)
    with pytest.raises(DraftGymError, match="needs an EAGLE-3 head"):
        BatchEngine(eng.model, None).generate([[1]], 4)
    with pytest.raises(DraftGymError, match="without gaps"):
        ScheduleController([(1, 2, StepShape.off()), (4, None, StepShape.chain(2))])
    closed = ScheduleController([(1, 8, StepShape.off()), (9, 16, StepShape.chain(2))])   # the replay's Schedule's
    assert closed.shape_for(16) == closed.shape_for(99) == StepShape.chain(2)             # ranges: beyond, the last
    with pytest.raises(ValueError):
        StepShape(0, 1, 5)                                     # no draft, yet more than the root verified
    assert StepShape.chain(4) == StepShape(4, 1, 5) and StepShape.off().label() == "off"
    assert beng.generate([], 4).rows == []
    one = beng.generate(prompts[:3], [1, 5, 2], batch_size=2)   # per-row max_new_tokens; a row done at its first token
    assert [r.new_tokens for r in one] == [1, min(5, len(one[1].output_ids)), min(2, len(one[2].output_ids))]
    assert one[0].cycles == [] and one[0].output_ids == eng.generate_ar(prompts[0], 1).output_ids


@pytest.mark.parametrize("name", ["gemma2", "qwen2"])
def test_other_architectures_and_sliding_window(name):
    """Gemma-2 (soft-capped logits and attention, alternating sliding / full layers) and Qwen2 with a
    sliding window of 48 (caches of 47 entries): batched rows equal batch-1 AR inside the window; a
    generation that could pass it is refused up front (the controller's V), or at the step that
    would pass it (a larger V chosen mid-generation), in one line (pipeline/models/arch.py)."""
    from tests.pipeline.models.test_architectures import tiny_model

    model = tiny_model(name, window=48)
    eng, beng = Engine(model, None), BatchEngine(model, random_head(model, seed=1))
    prompts = [[5, 9, 2, 7, 1, 3], [4, 4], [8, 1, 6, 2, 9, 9, 3, 1, 5]]
    ars = [eng.generate_ar(p, 20).output_ids for p in prompts]
    script = [StepShape(4, 4, 16), StepShape.chain(3), StepShape.off()]
    res = beng.generate(prompts, 20, batch_size=2, controller=ScriptedController(script))
    assert [r.output_ids for r in res] == ars
    for call in (lambda: beng.generate(prompts, 23, controller=StaticController(StepShape(4, 4, 16))),
                 lambda: beng.generate(prompts, 20,
                                       controller=ScriptedController(script + [StepShape(4, 4, 30)]))):
        with pytest.raises(DraftGymError, match="sliding attention window") as e:
            call()
        assert "\n" not in str(e.value)


class _Budgets(Controller):
    """Chains of 4 (one step in three off), and per-request budgets that cycle over 0..4 by row and step:
    every row verifies its own prefix of the chain."""

    def __init__(self):
        super().__init__(StepShape.chain(4))
        self.n, self.seen = 0, []

    def plan(self, ctx):
        return StepShape.off() if ctx.step % 3 == 2 else StepShape.chain(4)

    def row_budgets(self, scores, shape):
        self.seen.append(scores)
        self.n += 1
        return [(self.n + r) % (shape.depth + 1) for r in range(len(scores))]


@pytest.mark.parametrize("B", [1, 4, 16])
def test_per_request_budgets_are_lossless(B):
    """Per-request budgets (Controller.row_budgets): each row verifies its own prefix of the drafted
    chain, at B = 1, 4, 16, fp32: every row equals its batch-1 AR output, no row accepts more than its
    budget, the step verifies max_r k_r + 1 tokens, and the hook sees each row's running log-probs."""
    eng, beng, _ = setup_tiny()
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 6, (int(k),), generator=g).tolist() for k in torch.randint(1, 15, (18,), generator=g)]
    ar = [eng.generate_ar(p, 16) for p in prompts]
    ctrl = _Budgets()
    res = beng.generate(prompts, 16, batch_size=B, controller=ctrl)
    for r, a in zip(res, ar):
        assert r.output_ids == a.output_ids, (B, r.index)
    steps = [s for s in res.steps if s.row_budgets is not None]
    assert steps and all(s.verify_size == max(s.row_budgets) + 1 for s in steps)
    assert all(L <= k for s in steps for L, k in zip(s.accepted, s.row_budgets))
    live = sum(a.new_tokens > 1 for a in ar)                # rows not finished by their prefill's token
    assert sum(s.accepted_sum for s in steps) > 5 and max(s.batch_size for s in res.steps) == min(B, live)
    sc = ctrl.seen[0]
    assert sc.shape[1] == 4 and (sc <= 0).all() and (sc[:, 1:] <= sc[:, :-1] + 1e-6).all()   # running log-probs


def test_per_request_budgets_bad_hook_and_sampling_are_one_line(tiny):
    eng, beng, prompts, ar = tiny

    class Bad(_Budgets):
        def row_budgets(self, scores, shape):
            return [9] * len(scores)
    with pytest.raises(DraftGymError, match="one count in 0..4 per row"):
        beng.generate(prompts, 8, batch_size=2, controller=Bad())
    with pytest.raises(DraftGymError, match="temperature must be 0"):
        beng.generate(prompts, 8, batch_size=2, controller=_Budgets(), temperature=0.7)
