"""Clock reads that are right on asynchronous devices (CUDA), and one place that defines them.

On a GPU, a Python call that launches kernels returns before the kernels have run. A timed region

    t0 = clock(); work(); t1 = clock()

therefore measures `work` only if the device has finished everything queued *before* t0 (else the
region is charged for earlier work still running) and everything `work` queued *before* t1 (else
the work leaks into whatever region reads the clock next). So every read of the clock first waits
for the device: `DeviceClock.__call__` = sync, then read. Spec-Bench syncs before each clock read
around a turn; the engine does it around every phase of a cycle (draft, controller, verify), so a
cycle's t_draft holds exactly the draft forwards and top-k, and t_controller holds only the
controller's own work, never a head forward still running on the device.

On a CPU `sync` is a no-op and the clock is `time.perf_counter`. Tests replace both with a fake
asynchronous device (a clock that advances only on sync) to check the attribution.

Phase marks (timing that does not tax the run). A sync per phase boundary stalls
the host while the GPU drains, so the next phase's launches start late: a step of three CUDA graphs
would pay several such gaps. `mark()` is a boundary without a sync: on CUDA a timing event recorded
on the current stream (the GPU stamps it when it gets there, after the work queued before it);
elsewhere a clock read as above. `seconds(a, b)` turns two marks into seconds, for events only once
both have completed, i.e. after a later host sync (the engine resolves a call's step times after
the call's last clock read). A region between two events is then the device time between them, and
host work that overlaps queued device work costs nothing, as it costs nothing to the run.
"""
from __future__ import annotations

import time
from typing import Callable

import torch


def sync(device: torch.device) -> None:
    """Wait for the device (CUDA: every stream's queued work) before a clock read."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DeviceClock:
    """clock() -> seconds, read after the device has finished all queued work.

    device: where the work runs; sync_fn / read_fn default to `sync(device)` and time.perf_counter
    (tests pass fakes)."""

    def __init__(self, device: torch.device | str, sync_fn: Callable[[], None] | None = None,
                 read_fn: Callable[[], float] = time.perf_counter, mark_fn: Callable[[], object] | None = None):
        """mark_fn: what `mark` returns (default: a CUDA event on a CUDA device with the default sync and
        read, else a clock read; tests pass a fake device's 'when the queue gets here')."""
        self.device = torch.device(device)
        self._sync = sync_fn or (lambda: sync(self.device))
        self._read = read_fn
        if mark_fn is None:
            mark_fn = _cuda_event if self.device.type == "cuda" and sync_fn is None else self.__call__
        self._mark = mark_fn

    def __call__(self) -> float:
        self._sync()
        return self._read()

    def mark(self):
        """A phase boundary, without a host sync on CUDA (module docstring)."""
        return self._mark()

    @staticmethod
    def seconds(a, b) -> float:
        """Seconds from mark a to mark b (events: both completed, i.e. read after a later sync)."""
        if isinstance(a, torch.cuda.Event):
            return a.elapsed_time(b) / 1e3
        return b - a


def _cuda_event() -> "torch.cuda.Event":
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e
