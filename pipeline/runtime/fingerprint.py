"""Environment fingerprint recorded next to every output: device, library versions, host."""
from __future__ import annotations

import os
import platform
import subprocess
from functools import lru_cache

import torch

from pipeline.runtime.attention_backends import label as attention_label


@lru_cache(maxsize=None)
def _git_commit(here: str | None = None) -> str | None:
    """The short commit of this checkout (or of the repository holding `here`), with '+dirty' when
    tracked files differ from it (so a run on uncommitted code is never stamped with a commit that did
    not produce it); None outside git."""
    try:
        here = here or os.path.dirname(os.path.abspath(__file__))
        git = lambda *a: subprocess.run(["git", "-C", here, *a], capture_output=True, text=True, timeout=5)
        commit = git("rev-parse", "--short", "HEAD").stdout.strip()
        if not commit:
            return None
        return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no").stdout.strip() else "")
    except Exception:
        return None


def dtype_name(dtype: torch.dtype | str) -> str:
    """torch.bfloat16 -> 'bfloat16' (the name logs, profiles and reports record)."""
    return str(dtype).removeprefix("torch.")


def device_name(device: torch.device | str | None = None, dtype: torch.dtype | str | None = None) -> str:
    """'cpu (N threads, <processor>, <onednn|torch> linear)' or the CUDA device name, e.g. 'NVIDIA H100 80GB HBM3';
    with `dtype`, followed by ' [bfloat16]' (etc.). The dtype is part of the name because it changes both
    the speed and the rounding: a latency profile belongs to one (device, dtype), and fp32 and bf16
    profiles of one machine must never mix (simulator.latency.model refuses to)."""
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    suffix = f" [{dtype_name(dtype)}]" if dtype is not None else ""
    if device.type == "cuda":
        # the SDPA kernels change a GPU's cost curve by up to 20x (pipeline/runtime/attention_backends.py),
        # so a GPU profile names them; a CPU's choice is torch's own flash / math either way
        return f"{torch.cuda.get_device_name(device)} ({attention_label()}){suffix}"
    proc = platform.processor() or platform.machine()
    from pipeline.runtime.cpu_linear import backend_name
    # the linear backend changes both the speed and the fp32 rounding, so profiles and logs name it;
    # the packed oneDNN path is fp32 only (pipeline/runtime/cpu_linear.py), other dtypes run torch's linear
    backend = backend_name() if dtype is None or dtype_name(dtype) == "float32" else "torch"
    return f"cpu ({torch.get_num_threads()} threads, {proc}, {backend} linear){suffix}"


@lru_cache(maxsize=None)
def cpu_model() -> str | None:
    """The CPU's model name (lscpu's 'Model name'), for every timing figure."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment_fingerprint(device: torch.device | str | None = None, dtype: torch.dtype | str | None = None) -> dict:
    import transformers

    return {
        "device": device_name(device, dtype),
        "dtype": dtype_name(dtype) if dtype is not None else None,
        "cpu_model": cpu_model(),
        "device_type": torch.device(device).type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "attention": attention_label(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "draftgym_commit": _git_commit(),
    }
