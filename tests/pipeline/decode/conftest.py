"""Fixtures of the decoding tests: a tiny target whose random head's drafts are often right, prompts of
mixed lengths, and their batch-1 AR outputs (shared by the batched-engine and arrival tests)."""
from __future__ import annotations

import pytest
import torch

from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.single import Engine
from pipeline.decode.step_shape import StepShape
from pipeline.models.head import random_head
from tests.conftest import make_tiny_llama

LENGTHS = (3, 9, 1, 17, 5, 12, 7, 2, 11, 4)
MIXED = [StepShape.off(), StepShape.chain(3), StepShape(4, 3, 10), StepShape.chain(1), StepShape(8, 10, 60),
         StepShape.off(), StepShape(3, 4, 37)]


def setup_tiny(vocab=6, hidden=16, eos=4, seed=0, n=len(LENGTHS)):
    """A tiny target whose random head's drafts are often right (a small vocabulary), and prompts of mixed lengths."""
    model = make_tiny_llama(vocab=vocab, hidden=hidden, seed=seed)
    head = random_head(model, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    prompts = [torch.randint(0, vocab, (k,), generator=g).tolist() for k in LENGTHS[:n]]
    return Engine(model, head, {eos}), BatchEngine(model, head, {eos}), prompts


@pytest.fixture(scope="module")
def tiny():
    eng, beng, prompts = setup_tiny()
    ar = [eng.generate_ar(p, 20) for p in prompts]
    return eng, beng, prompts, ar
