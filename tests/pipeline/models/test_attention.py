"""pipeline/models/attention.py: grouped-query attention under a mask without per-head K/V copies.

The same attention as transformers' `sdpa` (logits of masked multi-token forwards agree to fp32
rounding, and greedy decoding with speculation stays lossless), selected by load_target on a CPU,
and it really skips `repeat_kv` where `sdpa` calls it."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from pipeline.models import attention
from tests.conftest import make_tiny_llama


def _masked_forward(model, impl: str):
    """A prefill of 2 rows (row 1 left-padded by 3) then a 4-token step under a 4-D additive mask, as
    the batched engine and the verify pass them: logits [2, 4, vocab]."""
    model.set_attn_implementation(impl)
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, cache=cache, use_cache=True)
    step = torch.randint(0, model.config.vocab_size, (2, 4))
    c = 12
    allowed = torch.ones(2, 1, 4, c + 4, dtype=torch.bool)
    allowed[1, :, :, :3] = False                                       # row 1's padding
    allowed[:, :, :, c:] = torch.tril(torch.ones(4, 4, dtype=torch.bool))   # causal among the new tokens
    allowed[0, :, 3, c + 1] = False                                    # a tree: token 3 does not see token 1
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    pos = torch.arange(c, c + 4)[None].repeat(2, 1)
    return model(input_ids=step, position_ids=pos, cache=cache, attention_mask=mask, use_cache=True).logits


def test_grouped_attention_equals_sdpa_under_masks():
    model = make_tiny_llama(vocab=64, hidden=48, heads=6, kv_heads=2)          # g = 3, as SmolLM2
    ref = _masked_forward(model, "sdpa")
    got = _masked_forward(model, attention.register())
    assert got.shape == (2, 4, 64)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def test_grouped_attention_skips_the_per_head_copy(monkeypatch):
    """transformers' `sdpa` calls repeat_kv for a masked multi-token step; draftgym_sdpa does not."""
    import transformers.integrations.sdpa_attention as hf

    calls = []
    real = hf.repeat_kv
    monkeypatch.setattr(hf, "repeat_kv", lambda x, n: calls.append(n) or real(x, n))
    model = make_tiny_llama(vocab=64, hidden=32, heads=4, kv_heads=2)
    _masked_forward(model, "sdpa")
    assert calls                                     # the copy the module removes (the test can fail)
    calls.clear()
    _masked_forward(model, attention.register())
    assert not calls


def test_load_target_selects_it_on_a_cpu(tiny_model_dir):
    from pipeline.models.target import load_target

    t = load_target(str(tiny_model_dir), device="cpu")
    assert t.model.config._attn_implementation == attention.NAME
    eager = make_tiny_llama()
    eager.set_attn_implementation("eager")
    assert not attention.use_grouped_attention(eager) and eager.config._attn_implementation == "eager"


@pytest.mark.parametrize("tree", [(3, 4, 8), (1, 1, 2)])
def test_speculative_decoding_stays_lossless_with_it(tree):
    """fp32 speculation through draftgym_sdpa gives the AR tokens (AR's one-token steps take sdpa's
    own path; the verify takes the grouped one)."""
    from pipeline.decode.engine.core import BatchEngine
    from pipeline.decode.controller import StaticController
    from pipeline.decode.step_shape import StepShape
    from pipeline.decode.engine.single import Engine
    from pipeline.models.head import load_head_for

    model = make_tiny_llama(vocab=64, hidden=48, heads=6, kv_heads=2)
    attention.use_grouped_attention(model)
    assert model.config._attn_implementation == attention.NAME
    head = load_head_for("random", model, 0)
    eng = Engine(model, head)
    prompts = [list(range(5, 25)), list(range(30, 37)), list(range(9, 50))]
    ar = [eng.generate_ar(p, 24).output_ids for p in prompts]
    D, W, V = tree
    assert eng.generate(prompts[0], 24, controller=StaticController(D, W, V)).output_ids == ar[0]
    res = BatchEngine(model, head).generate(prompts, 24, batch_size=3,              # padded rows, masked steps
                                            controller=StaticController(StepShape(D, W, V)))
    assert [r.output_ids for r in res] == ar
