"""CUDA graphs for the batched engine's fixed-shape step parts (after gpt-fast and vLLM).

A decode step of an 8B target in eager PyTorch launches thousands of small kernels, each costing
the host ~5-20 us to issue; at batch 1 the GPU finishes them faster than the host issues them, so
the step is launch-bound (22-39 ms where the weight read takes 4.8 ms on an H100). A CUDA graph
records the kernels of one call once and replays them with one launch.

A graph replays fixed device addresses and shapes, so a part is graphed only when

    * every shape it creates follows from its key (the caller buckets what varies: the key span,
      the pending entries; pipeline/decode/engine/core.py),
    * its per-call inputs are small tensors, copied into the graph's own input buffers before each
      replay (`run(key, fn, *inputs)`), and every other tensor it touches (caches, stores, weights)
      is named by the key (the caller puts their data_ptrs in it): a graph never writes to memory
      that is not where it was when it was captured,
    * it reads nothing back to the host (tests/pipeline/runtime/test_host_reads.py, tests/pipeline/decode/engine/test_compile_step.py).

First call of a key: `fn` runs eagerly (the real work of that call, and the warm-up capture needs),
then it is captured; later calls replay it and return its output tensors, which the next replay of
the same key overwrites (the caller uses them before that). Graphs share one memory pool, at most
`capacity` are kept (least recently used dropped). If a capture fails the cache turns itself off
for good and keeps the first line of the reason (`failure`): the engine runs eagerly, as on a CPU,
and reports say so.

Off on the CPU (nothing to gain: a CPU kernel's launch is a function call) and when
DRAFTGYM_CUDA_GRAPHS=0. DRAFTGYM_CAPTURE_MODE picks torch's capture_error_mode (global, the
default; thread_local; relaxed).
"""
from __future__ import annotations

import os
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch

from pipeline.errors import DraftGymError, first_line
from pipeline.runtime.env import env_flag

ENV = "DRAFTGYM_CUDA_GRAPHS"
MODE_ENV = "DRAFTGYM_CAPTURE_MODE"
CAPTURE_MODES = ("global", "thread_local", "relaxed")       # torch.cuda.graph's capture_error_mode


def graphs_wanted(device: torch.device | str) -> bool:
    """On for a CUDA device unless DRAFTGYM_CUDA_GRAPHS is 0 / off / false / no (another value: an error)."""
    return torch.device(device).type == "cuda" and env_flag(ENV) is not False


@dataclass
class _Graph:
    replay: Callable[[], None]
    inputs: tuple[torch.Tensor, ...]       # the buffers each replay reads its inputs from
    outputs: object                        # fn's return value at capture: the buffers each replay writes


class GraphCache:
    """One CUDA graph per key (module docstring); eager where graphs are off."""

    def __init__(self, device: torch.device | str, enabled: bool | None = None, capacity: int = 1024):
        device = torch.device(device)
        self.enabled = graphs_wanted(device) if enabled is None else (enabled and device.type == "cuda")
        self.capacity = capacity
        self.graphs: OrderedDict = OrderedDict()
        self.pool = None
        self.failure: str | None = None
        self.failure_detail: str | None = None     # the traceback's end, for reports
        self.captures = self.replays = 0
        self.capture_s = 0.0
        self.mode = os.environ.get(MODE_ENV, "").strip() or "global"
        if self.mode not in CAPTURE_MODES:
            raise DraftGymError(f"{MODE_ENV}={self.mode!r}: expected one of {', '.join(CAPTURE_MODES)}")

    def run(self, key: tuple, fn, *inputs: torch.Tensor):
        """fn(*inputs), from the graph of (key, the inputs' shapes and dtypes) when there is one."""
        if not self.enabled:
            return fn(*inputs)
        key = (key, tuple((tuple(x.shape), x.dtype) for x in inputs))
        g = self.graphs.get(key)
        if g is None:
            out = fn(*inputs)                      # eager: this call's work, and the warm-up
            self._capture(key, fn, inputs)
            return out
        self.graphs.move_to_end(key)
        for buf, x in zip(g.inputs, inputs):
            buf.copy_(x)
        g.replay()
        self.replays += 1
        return g.outputs

    def _capture(self, key, fn, inputs) -> None:
        t0 = time.perf_counter()
        static = tuple(x.clone() for x in inputs)
        try:
            replay, outputs = self._record(fn, static)
        except Exception as e:                     # a part that cannot be captured: eager from now on
            self.enabled, self.failure = False, f"{type(e).__name__}: {first_line(e)}"
            self.failure_detail = traceback.format_exc()[-3000:]
            self.clear()
            return
        self.graphs[key] = _Graph(replay, static, outputs)
        self.captures += 1
        self.capture_s += time.perf_counter() - t0
        while len(self.graphs) > self.capacity:
            self.graphs.popitem(last=False)

    def _record(self, fn, static: tuple[torch.Tensor, ...]):
        """Capture fn(*static) (its kernels are recorded, not run). Returns (replay, output buffers)."""
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode=self.mode):
                outputs = fn(*static)
        except Exception:
            torch.cuda.synchronize()
            raise
        return graph.replay, outputs

    def clear(self) -> None:
        """Drop every graph. Their pool goes with the last of them, so the next capture takes a new
        one (capturing into a dead pool's handle trips the caching allocator's internal assert)."""
        self.graphs.clear()
        self.pool = None

    def summary(self) -> dict:
        """For reports: on/off, captures, replays, capture seconds, the failure if any."""
        return {"cuda_graphs": self.enabled, "captures": self.captures, "replays": self.replays,
                "capture_s": round(self.capture_s, 3), "failure": self.failure, "failure_detail": self.failure_detail}
