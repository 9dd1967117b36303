"""Lossless in reduced precision: exact / near-tie / mismatch (pipeline/decode/lossless.py).

What these tests must show: the bf16 tolerance passes the harmless divergences (rounding near-ties)
and does not hide bugs. A deliberately biased acceptance rule (accept a draft when it is among the
target's top-2) must be classified `mismatch`; the real rule must never be. fp32 stays strict.
"""
from __future__ import annotations

import pytest
import torch

import pipeline.decode.engine.core as batch_engine_mod
import pipeline.decode.engine.step as batch_step_mod
from pipeline.decode.engine.verify import paths_to_accepted
from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.models.head import load_head_for, random_head
from pipeline.decode.lossless import (NEAR_TIE_ULPS, ar_logits_at, classify, first_difference, rounding_noise,
                               summarize_verdicts, ulp)
from tests.conftest import make_tiny_llama


def biased_accept(tree, logits):
    """A plausible bug: a draft child is accepted when it is among the target's top-2 (not its argmax)."""
    top2 = logits.topk(2, -1).indices.tolist()
    tokens, kids = tree.tokens.tolist(), tree.children()
    node, path = 0, []
    while True:
        nxt = next((c for c in kids[node] if tokens[c] in top2[node]), None)
        if nxt is None:
            return path, top2[node][0]
        path.append(nxt)
        node = nxt


def biased_accept_batch(trees, logits):
    """`biased_accept` row by row, as the engine's greedy acceptance (accepted [B, V], bonus [B])."""
    paths, bonus = zip(*(biased_accept(trees.row(r), logits[r]) for r in range(trees.tokens.shape[0])))
    return paths_to_accepted(list(paths), trees.size, logits.device), torch.tensor(bonus)


def plant_biased_rule(monkeypatch) -> None:
    """The engine accepts with `biased_accept_batch`: in its eager path and in its graphed parts."""
    for mod in (batch_engine_mod, batch_step_mod):
        monkeypatch.setattr(mod, "accept_greedy_batch", biased_accept_batch)


def test_ulp_and_first_difference():
    assert ulp(20.0, torch.bfloat16) == 2.0 ** (4 - 7)          # 16 <= 20 < 32: spacing 2^-3
    assert ulp(-1.0, torch.float16) == 2.0 ** -10
    assert ulp(3.0, torch.float32) == 2.0 ** (1 - 23)
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2                # a strict prefix


def test_fp32_is_strict(tiny_llama):
    """In fp32 any difference is a mismatch, however small the gap."""
    prompt, ar = [1, 2, 3], Engine(tiny_llama, None).generate_ar([1, 2, 3], 6).output_ids
    assert classify(tiny_llama, prompt, ar, list(ar)).status == "exact"
    other = list(ar)
    other[3] = (other[3] + 1) % 64
    v = classify(tiny_llama, prompt, ar, other)
    assert v.status == "mismatch" and v.k == 3 and v.tol == 0.0
    assert classify(tiny_llama, prompt, ar, ar[:4]).status == "mismatch"          # stopped early


def test_ar_logits_are_ar_decodings_own():
    """The gap is read from the computation that chose the AR token: AR's argmax at k is ar[k]."""
    model = make_tiny_llama(seed=4).to(torch.bfloat16)
    prompt = [5, 9, 2, 7]
    ar = Engine(model, None).generate_ar(prompt, 10).output_ids
    for k in range(10):
        assert int(ar_logits_at(model, prompt, ar, k).argmax()) == ar[k]


def test_tiny_bf16_real_rule_passes_biased_rule_fails(monkeypatch):
    """A tiny bf16 target with a wide logit range (scaled lm_head), so that gaps are not all ties."""
    model = make_tiny_llama(vocab=64, hidden=32, seed=7)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model = model.to(torch.bfloat16)
    head = random_head(model, seed=1)
    eng = Engine(model, head)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 64, (6,), generator=gen).tolist() for _ in range(8)]
    shapes = [(4, 4, 12), (2, 8, 10), (6, 2, 8)]

    def run():
        out = []
        for p in prompts:
            ar = eng.generate_ar(p, 24).output_ids
            for s in shapes:
                out.append(classify(model, p, ar, eng.generate(p, 24, controller=StaticController(*s)).output_ids))
        return summarize_verdicts(out)

    real = run()
    assert real["counts"]["mismatch"] == 0, real
    plant_biased_rule(monkeypatch)
    biased = run()
    assert biased["counts"]["mismatch"] >= 3, biased
    assert biased["counts"]["exact"] < real["counts"]["exact"]


@pytest.mark.slow
def test_smollm2_bf16_shipped_head(monkeypatch):
    """The embedded default in bf16 with the shipped head on held-out test prompts: divergences happen
    (that is bf16) and every one is a near-tie; the biased rule gives mismatches on the same prompts."""
    from pipeline.datasets import load_prompts
    from pipeline.models.target import encode_prompt, load_target

    t = load_target("smollm2-135m", dtype="bfloat16")
    eng = Engine(t.model, load_head_for("default", t.model), t.eos_token_ids)
    # held-out prompts whose bf16 decodings were seen to part from AR within 64 tokens (AVX2 EPYC, (8, 10, 30):
    # at tokens 31, 38 and 52). The tree's size is not the point; (8, 10, 30) verifies half the rows of
    # (8, 10, 60), and in emulated bf16 the target's matmuls are the test's time.
    recs = [r for r in load_prompts("humaneval", split="test", n=6)
            if r.prompt_id.split("/", 1)[1] in ("HumanEval/3", "HumanEval/36", "HumanEval/54")]
    assert len(recs) == 3
    prompts = [encode_prompt(t.tokenizer, list(r.messages)) for r in recs]
    ars = [eng.generate_ar(p, 64).output_ids for p in prompts]

    def run(n=64, k=len(prompts)):
        return summarize_verdicts([classify(t.model, p, ar[:n], eng.generate(p, n, controller=StaticController(8, 10, 30)).output_ids)
                                   for p, ar in zip(prompts[:k], ars[:k])])

    real = run()
    assert real["counts"]["mismatch"] == 0, real
    assert real["counts"]["near-tie"] >= 1, real                    # bf16 does part at near-ties
    for d in real["divergences"]:
        assert d["gap_ulps"] <= NEAR_TIE_ULPS[torch.bfloat16]
    plant_biased_rule(monkeypatch)
    biased = run(16, 2)     # the biased rule parts from AR within 4-9 tokens on these prompts (AVX2 EPYC, bf16)
    assert biased["counts"]["mismatch"] == 2, biased


def test_rounding_noise_is_zero_for_identical_paths(tiny_llama):
    """chunk = 1 is path A itself: every move is exactly 0 (the measurement has no noise of its own)."""
    r = rounding_noise(tiny_llama, [[1, 2, 3, 4, 5, 6, 7, 8]], start=3, chunk=1)
    assert len(r["moves"]) == 5 and all(m == 0.0 for m in r["moves"])
