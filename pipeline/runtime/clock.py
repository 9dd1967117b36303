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
                 read_fn: Callable[[], float] = time.perf_counter):
        self.device = torch.device(device)
        self._sync = sync_fn or (lambda: sync(self.device))
        self._read = read_fn

    def __call__(self) -> float:
        self._sync()
        return self._read()
