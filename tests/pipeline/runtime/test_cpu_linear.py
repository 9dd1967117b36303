"""The CPU linear backend (pipeline/runtime/cpu_linear.py): packed oneDNN linears compute F.linear, survive
copies, weight updates and autograd, and can be switched off; the engine stays lossless on them."""
import copy

import pytest
import torch
from torch import nn

from pipeline.runtime.cpu_linear import PackedLinear, backend_available, backend_name, pack_linears
from pipeline.errors import DraftGymError
from pipeline.runtime.fingerprint import device_name

pytestmark = pytest.mark.skipif(not backend_available(), reason="this torch build has no oneDNN linear")


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 7, bias=False))


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 61])
def test_packed_equals_linear(rows):
    m = _mlp()
    x = torch.randn(2, rows, 24)
    with torch.no_grad():
        ref = m(x)
    assert pack_linears(m) == 2 and all(type(m[i]) is PackedLinear for i in (0, 2))
    with torch.inference_mode():
        out = m(x)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert pack_linears(m) == 0                    # idempotent: nothing left to swap


def test_copies_updates_and_autograd():
    m = _mlp(1)
    pack_linears(m)
    x = torch.randn(5, 24)
    clone = copy.deepcopy(m)                       # the opaque packed tensor is not copied, rebuilt on use
    with torch.no_grad():
        torch.testing.assert_close(clone(x), m(x))
    # training through the packed module falls back to F.linear and the packed copy follows the weight
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m(x).square().sum().backward()
    assert m[0].weight.grad is not None
    opt.step()
    with torch.no_grad():
        plain = nn.functional.linear(torch.relu(nn.functional.linear(x, m[0].weight, m[0].bias)), m[2].weight)
        torch.testing.assert_close(m(x), plain, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(m(x), clone(x))
    # another dtype runs through F.linear on the same weights
    assert m.to(torch.bfloat16)(x.bfloat16()).dtype == torch.bfloat16
    assert m.state_dict().keys() == _mlp().state_dict().keys()


def test_no_packing_without_memory(monkeypatch):
    import pipeline.runtime.cpu_linear as cl

    monkeypatch.setattr(cl, "free_memory_bytes", lambda: 1000)
    monkeypatch.setenv("DRAFTGYM_CPU_LINEAR", "onednn")         # restored after the test
    m = _mlp()
    with pytest.warns(UserWarning, match="too little free memory"):
        assert pack_linears(m) == 0
    assert type(m[0]) is nn.Linear and backend_name() == "torch"     # the device string says so


def test_switch_off(monkeypatch):
    monkeypatch.setenv("DRAFTGYM_CPU_LINEAR", "torch")
    m = _mlp()
    assert pack_linears(m) == 0 and type(m[0]) is nn.Linear
    assert backend_name() == "torch" and device_name("cpu").endswith("torch linear)")
    monkeypatch.setenv("DRAFTGYM_CPU_LINEAR", "onednn")
    assert backend_name() == "onednn" and device_name("cpu").endswith("onednn linear)")
    monkeypatch.setenv("DRAFTGYM_CPU_LINEAR", "mkl")
    with pytest.raises(DraftGymError, match="DRAFTGYM_CPU_LINEAR must be 'onednn' or 'torch', got 'mkl'"):
        pack_linears(_mlp())


def test_engine_packs_and_stays_lossless(tiny_llama):
    """The engine packs the target and the head; EAGLE-3 output still equals AR token for token."""
    from pipeline.decode.controller import StaticController
    from pipeline.decode.engine.single import Engine
    from pipeline.models.head import random_head

    model = copy.deepcopy(tiny_llama)
    eng = Engine(model, random_head(model, seed=11))
    assert any(type(mod) is PackedLinear for mod in model.modules())
    assert any(type(mod) is PackedLinear for mod in eng.head.modules())
    prompt = list(range(5, 17))
    ar = eng.generate_ar(prompt, 24)
    spec = eng.generate(prompt, 24, controller=StaticController(3, 3, 8))
    assert spec.output_ids == ar.output_ids and spec.cycles
