"""The host side of a batched generate call (pipeline/decode/engine/core.py): the call's inputs,
result and queue (`Call`), and which request each slot holds with its tokens, generator and
accepted-length history (`Rows`). The device side is pipeline/decode/engine/kv.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from pipeline.models import arch
from pipeline.decode.engine.result import BatchResult
from pipeline.errors import DraftGymError


@dataclass
class Call:
    """One generate call: its inputs (per prompt), its result so far and the prompts still queued."""

    prompts: list[list[int]]
    max_new: list[int]              # max_new_tokens per prompt
    seeds: list[int]                # sampling seed per prompt
    T: float                        # temperature
    features: bool                  # EAGLE-3 (target features, head cache) or AR
    res: BatchResult
    queue: list[int]                # prompt indices not started, next last (pop())
    arrival: list[float] | None = None  # s on the call's clock, per prompt (None: all at 0)
    t0: float = 0.0                 # the clock at the call's start
    eos: frozenset = frozenset()    # the tokens that end a row (empty: every row runs to its max_new)
    on_result: Callable | None = None   # on_result(i, RowResult) as prompt i ends
    stop_refill: Callable | None = None  # stop_refill() -> True: take no more prompts (the rest stay unstarted)
    marks: list = field(default_factory=list)   # (StepRecord, its phase marks, level-hook s, its rows' CycleRecords):
                                                # times at the call's end

    def ready(self, now: float) -> bool:
        """May the next queued prompt start now? (arrived, and refills not stopped; a stop empties the
        queue, so the prompts it leaves keep stop_reason ''.)"""
        if self.queue and self.stop_refill is not None and self.stop_refill():
            self.queue.clear()
        return bool(self.queue) and (self.arrival is None or self.arrival[self.queue[-1]] <= now)


class Rows:
    """The host side of the slots: which request each holds (-1: none), its tokens, generator and history."""

    def __init__(self, B: int):
        self.req: list[int] = []
        self.out: list[list[int]] = []
        self.gen: list[torch.Generator | None] = []
        self.hist: list[list[int]] = []
        self.add(B)

    def add(self, k: int) -> None:
        self.req, self.out = self.req + [-1] * k, self.out + [[] for _ in range(k)]
        self.gen, self.hist = self.gen + [None] * k, self.hist + [[] for _ in range(k)]

    def set(self, s: int, req: int, out: list[int], gen: torch.Generator) -> None:
        self.req[s], self.out[s], self.gen[s], self.hist[s] = req, out, gen, []

    def keep(self, keep: list[int]) -> None:
        for name in ("req", "out", "gen", "hist"):
            setattr(self, name, [getattr(self, name)[s] for s in keep])


def check_call(config, prompts, max_new_tokens, temperature, seeds, batch_size, tree: int, arrivals=None):
    """A generate call's inputs, checked (one-line errors) and spread per prompt: (seeds, max_new,
    arrivals). tree: the verify tokens a sliding window must leave room for (pipeline/models/arch.py)."""
    if batch_size < 1:
        raise DraftGymError(f"batch_size must be >= 1, got {batch_size}")
    if temperature < 0:
        raise DraftGymError(f"temperature must be >= 0, got {temperature}")
    seeds = [seeds] * len(prompts) if isinstance(seeds, int) else list(seeds)
    max_new = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    for name, v in (("seeds", seeds), ("max_new_tokens", max_new)):
        if len(v) != len(prompts):
            raise DraftGymError(f"{len(v)} {name} for {len(prompts)} prompts")
    for p, m in zip(prompts, max_new):
        if len(p) == 0:
            raise DraftGymError("empty prompt: no input tokens")
        if m < 1:
            raise DraftGymError(f"max_new_tokens must be >= 1, got {m}")
        arch.check_length(config, len(p), m, tree)
    if arrivals is not None:
        arrivals = [float(a) for a in arrivals]
        if len(arrivals) != len(prompts):
            raise DraftGymError(f"{len(arrivals)} arrival times for {len(prompts)} prompts")
        if any(not a >= 0 for a in arrivals) or any(b < a for a, b in zip(arrivals, arrivals[1:])):
            raise DraftGymError("arrival times must be >= 0 and non-decreasing in prompt order")
    return seeds, max_new, arrivals
