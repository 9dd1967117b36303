"""Batched generation (pipeline/decode/continuations.py) and batched collection (collect_prompts): equal to
batch-1 generation and per-prompt collection in fp32, per-row seeds, EOS, refill, the disk cache."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.decode.continuations import ContinuationCache, generate_batch
from pipeline.collect.prompt import CollectConfig, collect_prompt, collect_prompts, prompt_seed
from pipeline.decode.engine.single import Engine
from pipeline.errors import DraftGymError
from pipeline.models.head import random_head
from tests.conftest import make_tiny_llama

LENGTHS = (3, 9, 1, 17, 5, 12, 7)


def _setup(vocab=64, eos=5, seed=0):
    model = make_tiny_llama(vocab=vocab, hidden=32, seed=seed)
    eng = Engine(model, None, {eos})
    g = torch.Generator().manual_seed(seed + 1)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in LENGTHS]
    return eng, prompts


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_equals_batch1(temperature):
    """Mixed prompt lengths, per-row EOS, more prompts (7) than rows (3): every row equals batch-1
    Engine.generate_ar with its seed, token for token, and at least one row stops at EOS."""
    eng, prompts = _setup()
    seeds = [11 * i for i in range(len(prompts))]
    res = generate_batch(eng.model, prompts, 24, temperature, seeds, eng.eos, batch_size=3)
    stops = set()
    for p, s, r in zip(prompts, seeds, res):
        ref = eng.generate_ar(p, 24, temperature, s)
        assert r.output_ids == ref.output_ids and r.stop_reason == ref.stop_reason
        stops.add(r.stop_reason)
    assert stops == {"eos", "max_new_tokens"}


def test_run_past_eos_and_refill_order():
    """run_past_eos gives exactly max_new_tokens tokens per row (EOS inside), equal to generate_ar with
    no EOS; batch_size 1, 2 and 16 (refill, drop, compaction) give the same rows."""
    eng, prompts = _setup()
    outs = [generate_batch(eng.model, prompts, 20, 0.0, 0, eng.eos, run_past_eos=True, batch_size=b) for b in (1, 2, 16)]
    assert outs[0] == outs[1] == outs[2]
    assert all(len(r.output_ids) == 20 and r.stop_reason == "max_new_tokens" for r in outs[0])
    assert any(5 in r.output_ids[:-1] for r in outs[0])                         # EOS was generated and run past
    eos, eng.eos = eng.eos, set()
    assert [r.output_ids for r in outs[0]] == [eng.generate_ar(p, 20).output_ids for p in prompts]
    eng.eos = eos


def test_row_seed_independent_of_batch_mates():
    """At T = 1 a row's sample depends only on its own seed: alone, with other rows, and at another
    place in the batch, the output is the same; another seed gives another output."""
    eng, prompts = _setup()
    alone = generate_batch(eng.model, [prompts[3]], 30, 1.0, [7])[0]
    mixed = generate_batch(eng.model, [prompts[0], prompts[3], prompts[5]], 30, 1.0, [1, 7, 2], batch_size=3)[1]
    moved = generate_batch(eng.model, [prompts[3], prompts[3]], 30, 1.0, [9, 7], batch_size=2)
    assert alone.output_ids == mixed.output_ids == moved[1].output_ids
    assert moved[0].output_ids != moved[1].output_ids


def test_continuation_cache_hit_does_no_forward(tmp_path):
    """The second call with the same key runs no target forward; a torn last line is skipped and
    the next append starts on a fresh line; another seed or length is a miss."""
    eng, prompts = _setup()
    calls = []
    h = eng.model.register_forward_hook(lambda *a: calls.append(1))
    cache = ContinuationCache("tiny", torch.float32, root=tmp_path)
    first = generate_batch(eng.model, prompts, 12, 1.0, 3, eng.eos, batch_size=4, cache=cache)
    assert len(calls) > 0
    calls.clear()
    again = generate_batch(eng.model, prompts, 12, 1.0, 3, eng.eos, batch_size=4,
                           cache=ContinuationCache("tiny", "float32", root=tmp_path))
    assert again == first and calls == []
    with open(cache.path, "a") as f:
        f.write('{"key": "torn", "output_ids": [1, ')                           # a killed writer
    fresh = ContinuationCache("tiny", "float32", root=tmp_path)
    assert generate_batch(eng.model, prompts[:2], 12, 1.0, 3, eng.eos, cache=fresh) == first[:2] and calls == []
    generate_batch(eng.model, prompts[:1], 12, 1.0, 4, eng.eos, cache=fresh)    # another seed: a miss, appended
    assert len(calls) > 0
    assert len(ContinuationCache("tiny", "float32", root=tmp_path)._load()) == len(prompts) + 1
    h.remove()


def test_on_result_and_stop_refill(tmp_path):
    """on_result(i, cont) as each prompt ends (cache hits first, at once); stop_refill() -> True starts
    no further prompt: those in flight finish, the rest come back None. The engine's stores are not
    held after the call."""
    from pipeline.decode.continuations import ar_engine

    eng, prompts = _setup()
    cache = ContinuationCache("tiny", "float32", root=tmp_path)
    full = generate_batch(eng.model, prompts[:2], 10, 0.0, 0, eng.eos, run_past_eos=True, cache=cache)
    seen = []
    stop = lambda: len(seen) >= 3
    got = generate_batch(eng.model, prompts, 10, 0.0, 0, eng.eos, run_past_eos=True, batch_size=2, cache=cache,
                         on_result=lambda i, c: seen.append((i, c)), stop_refill=stop)
    assert seen[:2] == [(0, full[0]), (1, full[1])]                    # the hits
    assert [i for i, _ in seen] == [0, 1, 2, 3] and all(got[i] == c for i, c in seen)   # 2 and 3 in flight
    assert got[4:] == [None] * 3
    eos, eng.eos = eng.eos, set()
    assert [got[i].output_ids for i in (2, 3)] == [eng.generate_ar(p, 10).output_ids for p in prompts[2:4]]
    eng.eos = eos
    assert ar_engine(eng.model)._static == {}


def test_bad_input_is_one_line_error():
    eng, prompts = _setup()
    with pytest.raises(DraftGymError, match="empty prompt"):
        generate_batch(eng.model, [[1], []], 4)
    with pytest.raises(DraftGymError, match="2 seeds for 1 prompts"):
        generate_batch(eng.model, [[1]], 4, seeds=[1, 2])
    with pytest.raises(DraftGymError, match="prompt too long"):
        generate_batch(eng.model, [[1] * 500], 40)


def _assert_same_logs(a, b):
    assert a.output_tokens == b.output_tokens and a.new_tokens == b.new_tokens and a.stop_reason == b.stop_reason
    assert a.positions.keys() == b.positions.keys()
    for W in a.positions:
        x, y = a.positions[W], b.positions[W]
        for k in ("position", "context_len", "width", "root_token", "acceptance"):
            assert np.array_equal(x[k], y[k]), k
        for k in ("beam_scores", "candidate_scores", "entropy"):
            np.testing.assert_allclose(x[k], y[k], atol=1e-5, rtol=0, err_msg=k)
        if "accept_dist" in x or "accept_dist" in y:
            assert [d is None for d in x["accept_dist"]] == [d is None for d in y["accept_dist"]]
            for u, v in zip(x["accept_dist"], y["accept_dist"]):
                if u is not None:
                    np.testing.assert_allclose(u, v, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_collection_equals_per_prompt(temperature):
    """collect_prompts over mixed prompt lengths (some stopping at EOS)
    equals collect_prompt per prompt row for row in fp32: the same continuations, acceptance tables,
    roots and positions, scores and entropies to 1e-5 (and at T > 0 the acceptance distributions)."""
    model = make_tiny_llama(vocab=6, hidden=16, seed=0)
    head = random_head(model, seed=1)
    eng = Engine(model, head, {2})
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 6, (n,), generator=g).tolist() for n in (4, 1, 11, 6, 2)]
    cfg = CollectConfig(max_new_tokens=12, temperature=temperature, seed=3, widths=(3, 4), max_depth=4,
                        verify_grid=(1, 2, 4, 8, 20), position_batch=5, dist_verify_size=8)
    ref = [collect_prompt(eng, head, p, cfg) for p in prompts]
    got = collect_prompts(eng, head, prompts, cfg, batch_size=3)
    assert "eos" in {r.stop_reason for r in ref} and len({r.new_tokens for r in ref}) > 1
    assert temperature > 0 or {r.stop_reason for r in ref} == {"eos", "max_new_tokens"}
    for a, b in zip(ref, got):
        _assert_same_logs(a, b)
    _assert_same_logs(collect_prompts(eng, head, prompts[2:3], cfg)[0], ref[2])


def test_prompt_seed_depends_on_the_prompt_only():
    assert prompt_seed(0, [1, 2]) == prompt_seed(0, [1, 2]) != prompt_seed(1, [1, 2]) != prompt_seed(0, [2, 1])
    assert 0 <= prompt_seed(5, [3]) < 2 ** 63


def test_train_draft_regenerate_uses_batched_greedy(tmp_path, capsys):
    """train-draft's self-distillation: greedy answers equal to batch-1 generate_ar (cut after EOS, on the
    eager-attention copy it decodes with), written as JSONL rows; a rerun after a torn line regenerates
    only the missing prompt."""
    from types import SimpleNamespace

    from pipeline.train_head.config import TrainConfig
    from pipeline.train_head.data import regenerate

    eng, prompts = _setup()
    target = SimpleNamespace(model=eng.model, device=torch.device("cpu"), eos_token_ids={5}, tokenizer=None)
    rows = [{"prompt_id": f"p{i}", "dataset": "tiny", "prompt_ids": p} for i, p in enumerate(prompts)]
    cfg = TrainConfig(model="tiny", max_new_tokens=16, gen_batch_size=3, gen_dtype="float32", out="unused")
    path = tmp_path / "responses.jsonl"
    got = regenerate(target, rows, cfg, path, progress_bar=False)
    ref = [eng.generate_ar(p, 16) for p in prompts]
    assert [g["response_ids"] for g in got] == [r.output_ids for r in ref]
    assert [g["stop"] for g in got] == [r.stop_reason for r in ref] and "eos" in [g["stop"] for g in got]
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:10])               # the last row torn
    capsys.readouterr()
    again = regenerate(target, rows, cfg, path, progress_bar=False)
    assert again == got and "regenerating 1 answers (6 cached)" in capsys.readouterr().out
    assert len([ln for ln in path.read_text().splitlines() if ln.startswith("{\"prompt_id\"")]) >= len(rows)


def test_grouped_prefill_equals_batch1(monkeypatch):
    """The first rows' prompts are prefilled several per forward, right-padded, split into groups of
    at most PREFILL_TOKENS padded tokens; rows still equal batch-1 generate_ar (fp32). A target whose
    CausalLM changes logits after the lm_head (here flagged by a soft-capping config field) is
    prefilled one prompt per forward through the CausalLM, with the same rows."""
    import pipeline.decode.engine.prefill as bg

    eng, prompts = _setup()
    monkeypatch.setattr(bg, "PREFILL_TOKENS", 40)                  # 7 prompts of 1-17 tokens: several groups
    calls = []
    h = eng.model.model.register_forward_hook(lambda m, a, kw, out: calls.append(kw["input_ids"].shape), with_kwargs=True)
    ref = [eng.generate_ar(p, 16).output_ids for p in prompts]
    calls.clear()
    res = generate_batch(eng.model, prompts, 16, 0.0, 0, eng.eos, batch_size=7)
    prefills = [s for s in calls if s[1] > 1]
    assert [r.output_ids for r in res] == ref
    assert 1 < len(prefills) < len(prompts) and all(g * n <= 40 for g, n in prefills) and max(g for g, _ in prefills) > 1
    calls.clear()
    eng.model.config.final_logit_softcapping = 30.0
    again = generate_batch(eng.model, prompts, 16, 0.0, 0, eng.eos, batch_size=7)
    h.remove()
    assert again == res and all(s[0] == 1 for s in calls if s[1] > 1)
