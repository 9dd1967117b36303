"""The weight-read bound every GPU figure is reported beside (pipeline/runtime/bandwidth.py)."""
from __future__ import annotations

import pytest

from online.gpu_check.report import render_markdown
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


def test_the_report_gives_the_ar_step_as_a_multiple_of_the_bound():
    bound = {"weight_bytes": 16.06e9, "bandwidth_tbs": 3.35, "source": "datasheet (H100)", "bound_ms": 4.794}
    lat = {"status": "ok", "device": "NVIDIA H100 80GB HBM3", "weight_read_bound": bound,
           "ops": [{"op": "ar_step", "context": 1024, "W": None, "V": 1, "median": 9.588, "p10": 9.5, "p90": 9.7,
                    "n": 3, "x_bound": 2.0}]}
    rep = {"run_id": "r", "gpu": "NVIDIA H100 80GB HBM3", "steps": {"latency": lat},
           "environment": {"device": "d", "torch": "t", "cuda": "c", "transformers": "x", "python": "p",
                           "cpu_count": 16, "cpu_model": "m", "draftgym_commit": "abc"},
           "config": {"target": "llama-3.1-8b", "minutes": 7, "command": "python -m online.gpu_check"}}
    md = render_markdown(rep)
    assert "16.06 GB of weights / 3.35 TB/s (datasheet (H100)) = **4.79 ms**" in md
    assert "the AR step is 2.00x it at context 1024" in md
