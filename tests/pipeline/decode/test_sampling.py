"""Lossless sampling (T = 1): EAGLE-3's emitted tokens follow the target's distribution exactly.

We compare the empirical joint law of the 2nd and 3rd new tokens (the 1st comes from the prefill,
which both methods share) against the EXACT law computed from the tiny target by enumeration, with
a chi-square goodness-of-fit test. Threshold: p-value > 1e-3 passes. The same test, run on a
deliberately biased acceptance rule (on rejection, resample from p without removing the rejected
draft token), must fail with p < 1e-6: that shows the test has the power to catch a wrong rule.
Seeds are fixed, so the outcome is deterministic. At N_RUNS = 1000 runs per law (1500 before; the
statistic grows with N): AR p = 0.92, EAGLE-3 p = 0.40, the biased rule p = 1.0e-15 (1.4e-30 at 1500).
"""
from __future__ import annotations


import pytest
import torch

import pipeline.decode.engine.verify as batch_verify_mod
from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.models.head import random_head
from tests.conftest import make_tiny_llama

VOCAB, PROMPT, N_RUNS = 6, [1, 4, 2], 1000


@pytest.fixture(scope="module")
def setup():
    model = make_tiny_llama(vocab=VOCAB, hidden=16, seed=4)
    with torch.no_grad():  # sharpen the target a little so the law is far from uniform
        model.lm_head.weight.mul_(8.0)
    return model, random_head(model, seed=2)


def exact_law(model) -> torch.Tensor:
    """P(x2, x3) = sum_x1 P(x1) P(x2 | x1) P(x3 | x1, x2) at T = 1, by enumeration. -> [VOCAB, VOCAB]."""
    def probs(seq):
        with torch.no_grad():
            return torch.softmax(model(torch.tensor([seq])).logits[0, -1].double(), -1)
    law = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    p1 = probs(PROMPT)
    for x1 in range(VOCAB):
        p2 = probs(PROMPT + [x1])
        for x2 in range(VOCAB):
            law[x2] += p1[x1] * p2[x2] * probs(PROMPT + [x1, x2])
    return law


def empirical(eng, method: str) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    ctrl = StaticController(depth=3, width=2, verify_size=6)
    for seed in range(N_RUNS):
        if method == "ar":
            out = eng.generate_ar(PROMPT, max_new_tokens=3, temperature=1.0, seed=seed).output_ids
        else:
            out = eng.generate(PROMPT, max_new_tokens=3, temperature=1.0, seed=seed, controller=ctrl).output_ids
        counts[out[1], out[2]] += 1
    return counts


def chi_square_pvalue(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Pearson chi-square; cells with expected count < 5 are pooled into one."""
    n = counts.sum()
    exp, obs = (law * n).flatten(), counts.flatten()
    small = exp < 5
    exp = torch.cat([exp[~small], exp[small].sum()[None]])
    obs = torch.cat([obs[~small], obs[small].sum()[None]])
    stat = ((obs - exp) ** 2 / exp.clamp(min=1e-12)).sum()
    df = len(exp) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


def biased_accept(tree, logits, temperature, generator):
    """WRONG on purpose: a rejected draft token stays in the residual."""
    tokens, kids = tree.tokens.tolist(), tree.children()
    node, path = 0, []
    while True:
        p = torch.softmax(logits[node] / temperature, dim=-1)
        nxt = next((c for c in kids[node] if torch.rand((), generator=generator) < p[tokens[c]]), None)
        if nxt is None:
            return path, int(torch.multinomial(p, 1, generator=generator))
        path.append(nxt)
        node = nxt


def test_sampling_is_lossless(setup):
    model, head = setup
    eng = Engine(model, head)
    law = exact_law(model)
    p_ar = chi_square_pvalue(empirical(eng, "ar"), law)
    p_eagle = chi_square_pvalue(empirical(eng, "eagle3"), law)
    print(f"chi-square p-values: ar {p_ar:.3g}, eagle3 {p_eagle:.3g}")
    assert p_ar > 1e-3
    assert p_eagle > 1e-3


def test_biased_rule_is_detected(setup, monkeypatch):
    model, head = setup
    monkeypatch.setattr(batch_verify_mod, "accept_sampling", biased_accept)
    p_biased = chi_square_pvalue(empirical(Engine(model, head), "eagle3"), exact_law(model))
    print(f"chi-square p-value of the biased rule: {p_biased:.3g}")
    assert p_biased < 1e-6


def test_sampling_accepts_drafts(setup):
    """The lossless test is only meaningful if drafts do get accepted at T = 1."""
    model, head = setup
    res = Engine(model, head).generate(PROMPT, max_new_tokens=40, temperature=1.0, seed=0,
                                       controller=StaticController(3, 2, 6))
    assert sum(c.accepted for c in res.cycles) > 5


def test_seeded_sampling_is_reproducible(setup):
    model, head = setup
    eng = Engine(model, head)
    a = eng.generate(PROMPT, max_new_tokens=20, temperature=0.7, seed=11).output_ids
    b = eng.generate(PROMPT, max_new_tokens=20, temperature=0.7, seed=11).output_ids
    assert a == b


