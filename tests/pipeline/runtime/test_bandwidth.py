"""The weight-read bound every GPU figure is reported beside (pipeline/runtime/bandwidth.py)."""
from __future__ import annotations

import pytest

from pipeline.errors import DraftGymError
from pipeline.runtime import bandwidth as bw
from tests.conftest import make_tiny_llama


@pytest.mark.parametrize("name, tbs", [("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H100 PCIe", 2.0), ("NVIDIA H200", 4.8),
                                       ("NVIDIA GH200 480GB", 4.0), ("NVIDIA H100 NVL", 3.9),
                                       ("NVIDIA A100-SXM4-80GB", 2.039), ("Some Future GPU", None)])
def test_datasheet_bandwidth_by_name(name, tbs, monkeypatch):
    monkeypatch.delenv(bw.ENV, raising=False)
    assert bw.bandwidth_tbs(name)[0] == tbs


def test_override_and_its_error(monkeypatch):
    monkeypatch.setenv(bw.ENV, "2.5")
    assert bw.bandwidth_tbs("Some Future GPU") == (2.5, f"${bw.ENV}")
    monkeypatch.setenv(bw.ENV, "fast")
    with pytest.raises(DraftGymError, match=bw.ENV):
        bw.bandwidth_tbs("NVIDIA H100 80GB HBM3")


def test_weight_bytes_count_shared_tensors_once():
    model = make_tiny_llama(vocab=64, hidden=32)
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    assert bw.weight_bytes(model) == n
    model.lm_head.weight = model.model.embed_tokens.weight                 # tied: one tensor
    assert bw.weight_bytes(model) == n - 64 * 32 * 4
    assert bw.weight_read_bound(model)["bound_ms"] is None                  # a CPU has no such bound here
