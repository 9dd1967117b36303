"""CPU matmul backend for inference: oneDNN linear with pre-packed weights.

Why this exists. On a CPU, `torch.nn.functional.linear` in fp32 goes to MKL's sgemm. On the AMD
EPYC (Zen 5) box this project runs on, MKL takes a slow path for a few rows: the target's lm_head
(49152 x 576) costs 7.9 ms for 1 row, 16.1 ms for 2 and 16.4 ms for 8, so a verify of 2-8 tokens
costs 1.5-1.9x an AR step, an artefact of the kernel and not of the hardware. oneDNN, with the
weight reordered once into its blocked layout, takes 2.0 / 2.3 / 2.8 ms for the same shapes, and
the 2-8 token verify costs 1.2-1.3x an AR step (`docs/adhoc/linear_backends_matmul.py`,
`docs/adhoc/linear_backends.py` measure both). It is the kernel
PyTorch's own compiler (Inductor, with freezing) uses for CPU linears.

Both autoregressive decoding and speculative decoding run through the same packed model, so the
AR baseline is never a straw man, and the engine's losslessness (spec output == AR output) holds
within the backend. oneDNN's fp32 sums in another order than MKL's (max abs difference ~1e-4 on
logits), so logs collected with one backend replay exactly only with the same backend: the device
string names it (`pipeline.runtime.fingerprint.device_name`) and the latency profile is keyed by it.

Only inference runs packed: with autograd on, the module falls back to F.linear on the same weight.
Set `DRAFTGYM_CPU_LINEAR=torch` to switch the backend off.
"""
from __future__ import annotations

import os
import warnings
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.errors import DraftGymError


def backend_available() -> bool:
    return bool(torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
                and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def wanted() -> str:
    """The requested CPU linear backend: 'onednn' (default) or 'torch' (env DRAFTGYM_CPU_LINEAR)."""
    v = os.environ.get("DRAFTGYM_CPU_LINEAR", "onednn").strip().lower()
    if v not in ("onednn", "torch"):
        raise DraftGymError(f"DRAFTGYM_CPU_LINEAR must be 'onednn' or 'torch', got {v!r}")
    return v


def backend_name() -> str:
    """What CPU fp32 linears run on in this process: 'onednn' (packed) or 'torch' (MKL sgemm)."""
    return "onednn" if wanted() == "onednn" and backend_available() else "torch"


class PackedLinear(nn.Module):
    """y = x W^T + b with W held twice: `weight` (the original parameter, so state dicts, weight
    sharing, `.to()` and training keep working) and a packed copy in oneDNN's blocked layout, read
    by the kernel. The copy is rebuilt when the weight changes in place (an optimiser step, a
    loaded state dict); anything the packed kernel does not cover (autograd, another dtype or
    device) runs through F.linear on `weight`."""

    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.weight = lin.weight                                   # [out, in]
        self.bias = lin.bias                                       # [out] or None
        self._packed, self._packed_key = None, None

    def _pack(self) -> torch.Tensor:
        w = self.weight
        if torch.compiler.is_compiling() and self._packed is not None:
            return self._packed        # traced (torch.compile): the copy packed by the eager warm-up call
        key = (w.data_ptr(), w._version)
        if self._packed_key != key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)
            self._packed_key = key
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (x.device.type != "cpu" or x.dtype != torch.float32 or w.dtype != torch.float32
                or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
            return F.linear(x, w, self.bias)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)                       # [rows, in]
        y = torch.ops.mkldnn._linear_pointwise(x2, self._pack(), self.bias, "none", [None], "")
        return y.reshape(*lead, self.out_features)                 # [..., out]

    def __getstate__(self):                                        # deepcopy / pickle: repack on use
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        return {**state, "_packed": None, "_packed_key": None}

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, backend=onednn"


@lru_cache(maxsize=None)
def _self_check() -> bool:
    """The kernel runs and agrees with F.linear on this machine (a broken build falls back); once
    per process."""
    try:
        g = torch.Generator().manual_seed(0)
        lin = nn.Linear(64, 48, bias=True)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(48, 64, generator=g))
            lin.bias.copy_(torch.randn(48, generator=g))
        x = torch.randn(3, 5, 64, generator=g)
        with torch.inference_mode():
            packed = PackedLinear(lin)
            return bool(torch.allclose(packed(x), lin(x), atol=1e-4, rtol=1e-4) and packed._packed is not None)
    except Exception:
        return False


def free_memory_bytes() -> int:
    """Available physical memory (Linux sysconf; very large where it cannot be read)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def pack_linears(model: nn.Module) -> int:
    """Swap every fp32 nn.Linear on the CPU inside `model` for a PackedLinear, in place, when the
    backend is wanted, available, passes its self-check, and the packed copies (as large as the
    linears' weights: +540 MB for smollm2-135m) fit in half the free memory. Returns how many
    were swapped."""
    if wanted() != "onednn" or not backend_available():
        return 0
    targets = [(name, mod) for name, mod in model.named_modules()
               if type(mod) is nn.Linear and mod.weight.device.type == "cpu" and mod.weight.dtype == torch.float32]
    if not targets or not _self_check():
        return 0
    # the packed copies double the linears' memory; never let that push the machine into swap
    need = sum(lin.weight.numel() * lin.weight.element_size() for _, lin in targets)
    if need > free_memory_bytes() // 2:
        warnings.warn(f"not packing {need / 2**30:.1f} GiB of linear weights for oneDNN: too little free memory "
                      f"({free_memory_bytes() / 2**30:.1f} GiB); running on torch's default linear")
        os.environ["DRAFTGYM_CPU_LINEAR"] = "torch"      # so the device string (and later models) say so
        return 0
    for name, lin in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, PackedLinear(lin))
    return len(targets)
