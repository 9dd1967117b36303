"""The SDPA kernels are chosen, not defaulted (pipeline/runtime/attention_backends.py).

On the CPU the choice cannot be timed (torch has no cuDNN kernel here), so these tests check that it
is made: every SDPA call of the target and of the head, in both engines, runs with cuDNN's kernel
switched off and the chosen ones on, and the process's flags are back to torch's afterwards, also
when a forward raises. The cost it buys on a GPU is tests/online/test_on_device.py's per-level draft test.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from pipeline.decode.controller import StaticController
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.single import Engine
from pipeline.decode.step_shape import StepShape
from pipeline.errors import DraftGymError
from pipeline.models.head import random_head
from pipeline.runtime import attention_backends as ab
from pipeline.runtime.fingerprint import environment_fingerprint
from tests.conftest import make_tiny_llama


def _flags() -> tuple:
    b = torch.backends.cuda
    return tuple(n for n, on in (("flash", b.flash_sdp_enabled()), ("efficient", b.mem_efficient_sdp_enabled()),
                                 ("math", b.math_sdp_enabled()), ("cudnn", b.cudnn_sdp_enabled())) if on)


@contextlib.contextmanager
def sdpa_calls(monkeypatch):
    """Record, at every SDPA call, which kernels were enabled at that moment."""
    seen, real = [], F.scaled_dot_product_attention

    def spy(*a, **k):
        seen.append(_flags())
        return real(*a, **k)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    yield seen


@pytest.fixture(scope="module")
def models():
    model = make_tiny_llama(vocab=48, hidden=32, seed=1)
    return model, random_head(model, seed=1)


def test_every_target_and_head_forward_runs_on_the_chosen_kernels(models, monkeypatch):
    model, head = models
    before, priority = _flags(), torch._C._get_sdp_priority_order()
    assert "cudnn" in before                      # torch's default allows it: the choice is ours to make
    eng, beng = Engine(model, head), BatchEngine(model, head)
    with sdpa_calls(monkeypatch) as seen:
        eng.generate([1, 2, 3, 4], 12, controller=StaticController(4, 3, 10))
        eng.generate_ar([5, 6], 4)
        beng.generate([[1, 2, 3], [4, 5, 6, 7, 8]], 12, batch_size=2, controller=StaticController(StepShape(3, 2, 6)))
    assert len(seen) > 40                         # target layers and head levels, both engines
    assert set(seen) == {ab.DEFAULT}              # flash, efficient, math on; cuDNN off, at every call
    assert _flags() == before and torch._C._get_sdp_priority_order() == priority    # restored after each forward


def test_the_flags_come_back_when_a_forward_raises(models):
    model, _ = models
    ab.choose_attention(model)
    before = _flags()
    with pytest.raises(Exception):
        model(input_ids=torch.tensor([[1000]]))   # an id past the vocabulary: the embedding raises
    assert _flags() == before


def test_the_override_and_its_errors(monkeypatch, models):
    monkeypatch.setenv(ab.ENV, "cudnn, math")
    assert ab.chosen() == ("cudnn", "math") and ab.label() == "sdpa cudnn>math"
    model, head = models
    with sdpa_calls(monkeypatch) as seen:
        Engine(model, head).generate([1, 2, 3], 6, controller=StaticController(2, 2, 4))
    assert set(seen) == {("math", "cudnn")}       # the flags as set: cuDNN and math only
    assert environment_fingerprint("cpu")["attention"] == "sdpa cudnn>math"
    for bad in ("flash,bogus", "math,math", ","):
        monkeypatch.setenv(ab.ENV, bad)
        with pytest.raises(DraftGymError, match=ab.ENV) as e:
            ab.chosen()
        assert "\n" not in str(e.value)
