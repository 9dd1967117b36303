"""The GPU check's report (tools/gpu_check/report.py): each GPU figure beside the weight-read bound."""
from __future__ import annotations

from tools.gpu_check.report import render_markdown


def test_the_report_gives_the_ar_step_as_a_multiple_of_the_bound():
    bound = {"weight_bytes": 16.06e9, "bandwidth_tbs": 3.35, "source": "datasheet (H100)", "bound_ms": 4.794}
    lat = {"status": "ok", "device": "NVIDIA H100 80GB HBM3", "weight_read_bound": bound,
           "ops": [{"op": "ar_step", "context": 1024, "W": None, "V": 1, "median": 9.588, "p10": 9.5, "p90": 9.7,
                    "n": 3, "x_bound": 2.0}]}
    rep = {"run_id": "r", "gpu": "NVIDIA H100 80GB HBM3", "steps": {"latency": lat},
           "environment": {"device": "d", "torch": "t", "cuda": "c", "transformers": "x", "python": "p",
                           "cpu_count": 16, "cpu_model": "m", "draftgym_commit": "abc"},
           "config": {"target": "llama-3.1-8b", "minutes": 7, "command": "python -m tools.gpu_check"}}
    md = render_markdown(rep)
    assert "16.06 GB of weights / 3.35 TB/s (datasheet (H100)) = **4.79 ms**" in md
    assert "the AR step is 2.00x it at context 1024" in md
