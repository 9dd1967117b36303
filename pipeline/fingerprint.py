"""Environment fingerprint recorded next to every output: device, library versions, host."""
from __future__ import annotations

import os
import platform
import subprocess
from functools import lru_cache

import torch


@lru_cache(maxsize=None)
def _git_commit() -> str | None:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except Exception:
        return None


def device_name(device: torch.device | str | None = None) -> str:
    """'cpu (N threads, <processor>, <onednn|torch> linear)' or the CUDA device name, e.g. 'NVIDIA H100 80GB HBM3'."""
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    proc = platform.processor() or platform.machine()
    from pipeline.cpu_linear import backend_name
    # the linear backend changes both the speed and the fp32 rounding, so profiles and logs name it
    return f"cpu ({torch.get_num_threads()} threads, {proc}, {backend_name()} linear)"


def environment_fingerprint(device: torch.device | str | None = None) -> dict:
    import transformers

    return {
        "device": device_name(device),
        "device_type": torch.device(device).type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "draftgym_commit": _git_commit(),
    }
