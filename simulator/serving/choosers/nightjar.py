"""Nightjar's bandit (arXiv 2512.22420): the chain length per batch size, learned online from each
step's throughput, and speculation switched off under heavy load. Replayed on DraftGym logs.

What was read. The paper's method section is not in any source this project can reach (its abstract
is: "dynamically selecting the optimal speculative length for different batch sizes", a multi-armed
bandit, speculation disabled "upon detecting significant request queuing"). What is readable is its
authors' vLLM fork, lihuahua123/vllm_speculative, `vllm/core/spec_scheduler.py` as stored at commit
427535bb (class `ADABinGreedy`, the uncommented one; the fork's "Nightjar" mode selects a class whose
body is not stored). This module replays that class: the nearest readable variant of Nightjar, named
so in every table. Per step, with B rows in the batch:

    arms         chain lengths k = 0, 1, ..., K (K = --nightjar-k; the fork's default 3)
    bin          b = min((B - 1) // 2, 11): two batch sizes a bin, 12 bins; every bin learns on its own
    prior        p_b(k) = 0.5 for k >= 1 and p_b(0) = 0 while the bin's typical B (2 b + 1.5) is < 50
                 (always, with 12 bins), else 1 + (K + 1 - k) / (K + 1): "off" is never explored
    load rule    B > 20 and the request rate > 2 req/s: k = 0 (off), before anything else
    schedule     each bin runs blocks of 2^(j - 1) steps (j = 1, 2, ...), cut into sub-bins of
                 max(1, floor(sqrt(2^(j - 1)))) steps; a sub-bin is an exploration sub-bin with
                 probability 1 / sqrt(i) (i: its index in the block; the first of a block always)
    explore      k drawn with probability p_b(k) / sum p_b
    exploit      k = argmax_k (n_bk rbar_bk + 1 * p_b(k)) / (n_bk + 1)   (prior strength 1)
    update       r = (tokens emitted / B) / step seconds; rbar_bk <- rbar_bk + (r - rbar_bk) / n_bk

Where this differs from the fork, and why:
- the request rate: the fork's scheduler passes a `current_qps` whose source is not in the file; here
  it is the requests that joined the batch in the last 10 s over 10 s (over the elapsed time before
  10 s have passed);
- after the load rule fires the fork sets `have_disabled` and its re-enable branch reads a table that
  is never defined (it cannot run as stored); here the bandit simply resumes once the rule no longer
  holds;
- randomness from one seeded numpy Generator (the fork: numpy's global state), so a replay repeats.

On the device the step seconds are the wall time from the plan to the observation
(online/adapters/chooser.py sets `StepView.step_time`), in the replay the replayed step time.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from pipeline.decode.step_shape import chain
from pipeline.errors import DraftGymError
from simulator.serving.choosers.base import Chooser, StepView


class Nightjar(Chooser):
    """ADA-BinGreedy over chain lengths 0..K per batch-size bin (module docstring)."""

    def __init__(self, k: int = 3, bins: int = 12, bin_batches: int = 2, off_batch: int = 20, off_rate: float = 2.0,
                 rate_window_s: float = 10.0, prior_strength: float = 1.0, seed: int = 0,
                 name: str = "Nightjar bandit (authors' fork)"):
        if k < 1 or bins < 1 or bin_batches < 1 or rate_window_s <= 0:
            raise DraftGymError(f"Nightjar needs K >= 1, bins >= 1, batches per bin >= 1 and a rate window > 0, "
                                f"got {k}, {bins}, {bin_batches}, {rate_window_s}")
        self.k, self.bins, self.bin_batches = int(k), int(bins), int(bin_batches)
        self.off_batch, self.off_rate, self.window = int(off_batch), float(off_rate), float(rate_window_s)
        self.prior_strength, self.seed, self.name = float(prior_strength), int(seed), name
        self.prior = np.stack([self.bin_prior(b) for b in range(self.bins)])          # [bins, K + 1]

    def bin_prior(self, b: int) -> np.ndarray:
        """[K + 1] the fork's prior weights of bin b (module docstring)."""
        arms = self.k + 1
        if b * self.bin_batches + 1.5 < 50:
            p = np.full(arms, 0.5)
            p[0] = 0.0
            return p
        return 1.0 + (arms - np.arange(arms)) / arms

    def shapes(self):
        return [chain(k) for k in range(self.k + 1)]

    def reset(self, table, latency):
        super().reset(table, latency)
        self.index = [table.index(chain(k)) for k in range(self.k + 1)]
        self.n = np.zeros((self.k + 1, self.bins))                    # [K + 1, bins] updates per arm and bin
        self.mean = np.zeros((self.k + 1, self.bins))                 # [K + 1, bins] mean reward
        self.block = np.ones(self.bins, np.int64)                     # j: the block each bin is in
        self.sub = np.ones(self.bins, np.int64)                       # i: the sub-bin within the block
        self.count = np.zeros(self.bins, np.int64)                    # steps into the sub-bin
        self.exploring = np.ones(self.bins, bool)
        self.rng = np.random.default_rng(self.seed)
        self.seen: set[int] = set()                                   # requests seen in a batch so far
        self.joins: deque[float] = deque()                            # their join times within the window
        self.first_join: float | None = None
        self.arm = 0

    def bin_of(self, batch: int) -> int:
        return min((int(batch) - 1) // self.bin_batches, self.bins - 1)

    def request_rate(self, view: StepView) -> float:
        """Requests that joined in the trailing window, per second (module docstring)."""
        now = float(view.time)
        for r in np.asarray(view.requests).tolist():
            if r not in self.seen:
                self.seen.add(r)
                self.joins.append(now)
        if self.first_join is None:
            self.first_join = now
        while self.joins and self.joins[0] <= now - self.window:            # the clock never goes back
            self.joins.popleft()
        span = min(self.window, now - self.first_join)
        return len(self.joins) / span if span > 0 else 0.0

    def advance(self, b: int) -> None:
        """One step of bin b's block / sub-bin schedule; a new sub-bin draws whether it explores."""
        block_len = 2 ** (int(self.block[b]) - 1)
        sub_len = max(1, int(math.sqrt(block_len)))
        if self.count[b] >= sub_len:
            self.count[b] = 0
            self.sub[b] += 1
            if (self.sub[b] - 1) * sub_len >= block_len:
                self.block[b] += 1
                self.sub[b] = 1
            self.exploring[b] = self.rng.random() < 1.0 / math.sqrt(int(self.sub[b]))
        self.count[b] += 1

    def choose(self, view):
        b = self.bin_of(view.batch)
        rate = self.request_rate(view)
        if view.batch > self.off_batch and rate > self.off_rate:
            self.arm = 0
        else:
            self.advance(b)
            if self.exploring[b]:
                p = self.prior[b]
                self.arm = int(self.rng.choice(self.k + 1, p=p / p.sum()))
            else:
                n, m = self.n[:, b], self.mean[:, b]
                self.arm = int(np.argmax((m * n + self.prior[b] * self.prior_strength) / (n + self.prior_strength)))
        return self.index[self.arm]

    def observe(self, view, a, accepted):
        if not view.step_time or view.step_time <= 0:
            return
        emitted = np.minimum(np.asarray(accepted) + 1, view.left).sum()
        r = float(emitted) / view.batch / float(view.step_time)
        b = self.bin_of(view.batch)
        self.n[self.arm, b] += 1
        self.mean[self.arm, b] += (r - self.mean[self.arm, b]) / self.n[self.arm, b]
