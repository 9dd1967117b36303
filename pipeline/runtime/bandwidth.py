"""The weight-read bound of a decode step: the least time a GPU can take to read the target's weights.

At batch 1 a decode step multiplies one token's activations by every weight matrix once, so it
cannot take less than

    t_bound = bytes of the target's weights / the GPU's memory bandwidth

(Llama-3.1-8B in bf16 on an H100 SXM: 16.06 GB / 3.35 TB/s = 4.8 ms). Serving engines with CUDA
graphs come within about 1.3x of it (SGLang: 6.3 ms on that pair). Every GPU figure of the engine is
reported beside this bound (tools/gpu_check/latency.py), so a step that is launch-bound or sync-bound
shows as a multiple of it, whatever the GPU.

Bandwidths are the vendors' datasheet figures (TB/s = 1e12 bytes/s), matched on the name torch
reports (`torch.cuda.get_device_name`), most specific first. `DRAFTGYM_GPU_BANDWIDTH_TBS` sets it for
a GPU not listed.
"""
from __future__ import annotations

import os

import torch

from pipeline.errors import DraftGymError

ENV = "DRAFTGYM_GPU_BANDWIDTH_TBS"
# (substring of the device name, TB/s): the first match wins
DATASHEET_TBS = (("GH200", 4.0), ("H200", 4.8), ("H100 NVL", 3.9), ("H100 PCIe", 2.0), ("H100", 3.35),
                 ("H800", 3.35), ("B200", 8.0), ("A100-SXM4-80GB", 2.039), ("A100 80GB PCIe", 1.935),
                 ("A100", 1.555), ("L40S", 0.864))


def bandwidth_tbs(device_name: str) -> tuple[float | None, str]:
    """(TB/s or None, where the figure comes from) for a GPU named as torch names it."""
    raw = os.environ.get(ENV, "").strip()
    if raw:
        try:
            v = float(raw)
        except ValueError:
            v = -1.0
        if not v > 0:
            raise DraftGymError(f"{ENV} must be a positive number of TB/s, got {raw!r}")
        return v, f"${ENV}"
    for key, tbs in DATASHEET_TBS:
        if key in device_name:
            return tbs, f"datasheet ({key})"
    return None, f"no datasheet bandwidth for {device_name!r} (set {ENV})"


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters (each tensor once, shared ones included once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def weight_read_bound(model: torch.nn.Module) -> dict:
    """The bound of the module docstring for `model` on its own device: bytes, bandwidth, ms.
    ms is None on a CPU or a GPU without a known bandwidth (the reason says which)."""
    dev = next(model.parameters()).device
    nbytes = weight_bytes(model)
    if dev.type != "cuda":
        return {"weight_bytes": nbytes, "bandwidth_tbs": None, "source": "not a GPU", "bound_ms": None}
    tbs, source = bandwidth_tbs(torch.cuda.get_device_name(dev))
    return {"weight_bytes": nbytes, "bandwidth_tbs": tbs, "source": source,
            "bound_ms": None if tbs is None else 1e3 * nbytes / (tbs * 1e12)}
