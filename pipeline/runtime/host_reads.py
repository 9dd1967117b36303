"""Counting the host's reads of tensor values: each one is a device sync on a GPU.

On CUDA the host queues kernels and runs ahead of the device; any Python use of a tensor's value
(`int(t)`, `t.item()`, `t.tolist()`, `if t.any():`) and any op whose output shape depends on values
(`nonzero`, `masked_select`, `t[bool_mask]`) makes the host wait until the device has caught up.
A decode step with many of them cannot overlap its launches with the device's work, and cannot be
captured as a CUDA graph. The CPU has no such cost, but the same calls happen there, so a test on
the CPU counts them (`HostReads`) and holds the engine to its budget: at most 2 per step with a
static shape or a schedule (the accepted lengths and emitted tokens, read once; docs/gpu.md).

What counts (a `TorchFunctionMode`, so both Python-level reads and value-dependent ops are seen):

    item  tolist  numpy  __bool__  __int__  __float__  __index__      a value to the host
    nonzero  argwhere  masked_select  unique  unique_consecutive      a value-dependent shape
    t[mask] / t[mask] = x with a bool mask                            (nonzero inside)

A device clock read (pipeline/runtime/clock.py) syncs too but reads no tensor; it is not counted.
"""
from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

READS = frozenset({"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                   "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"})
_INDEXING = frozenset({"__getitem__", "__setitem__"})


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class HostReads(TorchFunctionMode):
    """`with HostReads() as reads: ...` then `reads.total` and `reads.by_name` (a Counter)."""

    def __init__(self):
        super().__init__()
        self.by_name: Counter = Counter()

    @property
    def total(self) -> int:
        return sum(self.by_name.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            self.by_name[name] += 1
        elif name in _INDEXING and len(args) > 1 and _bool_index(args[1]):
            self.by_name[f"{name}[bool]"] += 1
        return func(*args, **(kwargs or {}))
