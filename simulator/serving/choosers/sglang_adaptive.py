"""SGLang's adaptive speculation rule (`--speculative-adaptive`, strategy "ema"), reimplemented from
its documented behaviour to replay it on DraftGym logs.

Read on 2026-11-25 in sgl-project/sglang: python/sglang/srt/speculative/adaptive_spec_params.py
(commit 015c872628e3, classes AdaptiveStepSlot / AdaptiveSpeculativeParams and the default config),
adaptive_step_router.py (a12239f6ac74, the batch-size routing) and adaptive_runtime_state.py
(02a3cd954bab: one prepared state per candidate step, draft tokens = steps + 1). Only topk = 1 is
supported there: every shape is a chain of `steps` drafts, steps = 0 being a plain decode step.

The rule, per tier (a batch-size lower bound b_k with its candidate steps c_1 < c_2 < ... and its
own state; SGLang calls a tier a slot):

    routing       a batch of B rows uses the tier with the largest b_k <= B (the smallest if none);
                  with CUDA graphs, B is first padded up to the next captured batch size
    start         steps = the server's --speculative-num-steps if it is a candidate, else the middle
                  candidate c_{n // 2}; ema = steps - 1
    after a step  if steps > 0:  ema <- (1 - alpha) ema + alpha * mean_r L_r      (L_r: accepted drafts)
                  n <- n + 1; decide only when n > warmup and (n - warmup) % interval == 0
    decide        from steps = 0: probe the next candidate up (if ema < 0, ema <- that step - 1)
                  else down: while the next lower candidate c' has ema <= down(c') + h_down, move to c'
                        with down(c') = 0.5 if c' = 0 else c' - 0.5  (h_down: the down-hysteresis)
                  else up (only if it did not move down): while ema > c - 0.5 + h_up, move up one
                  ceiling (ceiling_coeff > 0): a target above max(1, ceil(ema * coeff)) that is not
                  above the current steps is lowered to the largest candidate under that ceiling

Defaults (alpha 0.2, warm-up 10 batches, interval 5, h_down -0.25, h_up 0, no ceiling) and the stored
tiers: B >= 1: {1, 3, 5, 7} (h_down -0.25); B >= 8: {0, 1, 3}; B >= 32: {0, 1}; B >= 64: {0} (h_down 0).

Config JSON (the file `--speculative-adaptive-config` reads): integer-string keys are tiers, each with
"candidate_steps" (non-empty list of ints >= 0) and optional per-tier overrides; other top-level keys
(ema_alpha, update_interval, warmup_batches, down_hysteresis, up_hysteresis, ceiling_coeff) apply
to every tier; "strategy" is "ema" (the default) or "throughput_aware", which this module does not
replay.
"""
from __future__ import annotations

import bisect
import json
import math
from pathlib import Path

import numpy as np

from pipeline.decode.step_shape import chain
from pipeline.errors import DataError
from simulator.serving.choosers.base import Chooser

PARAM_KEYS = ("ema_alpha", "update_interval", "warmup_batches", "down_hysteresis", "up_hysteresis", "ceiling_coeff")
PARAM_DEFAULTS = {"ema_alpha": 0.2, "update_interval": 5, "warmup_batches": 10, "down_hysteresis": -0.25,
                  "up_hysteresis": 0.0, "ceiling_coeff": 0.0}
DEFAULT_CONFIG = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


def load_config(path) -> dict:
    """An adaptive config JSON file (checked by parse_config when used)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"SGLang adaptive config {path} not found")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not JSON ({e})") from None


def parse_config(cfg: dict | None, where: str = "adaptive config") -> dict[int, dict]:
    """SGLang's adaptive JSON -> {tier lower bound: its parameters} (module docstring), with the
    checks SGLang makes, as one-line DataErrors."""
    cfg = DEFAULT_CONFIG if cfg is None else cfg
    if not isinstance(cfg, dict):
        raise DataError(f"{where}: must be a JSON object")
    strategy = cfg.get("strategy", "ema")
    if strategy != "ema":
        raise DataError(f"{where}: strategy {strategy!r} is not replayed (only 'ema')")
    glob = {k: cfg[k] for k in PARAM_KEYS if k in cfg}
    tiers = {}
    for key, entry in cfg.items():
        if not str(key).isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
            raise DataError(f"{where}: tier {key}: candidate_steps must be a non-empty list of ints >= 0, got {steps!r}")
        params = {**PARAM_DEFAULTS, **glob, **{k: entry[k] for k in PARAM_KEYS if k in entry}}
        tiers[int(key)] = {"candidate_steps": sorted(set(steps)), **params}
    if not tiers:
        raise DataError(f"{where}: needs at least one integer-string batch-size key, e.g. {{\"1\": {{\"candidate_steps\": [1, 3]}}}}")
    return dict(sorted(tiers.items()))


class AdaptiveTier:
    """One tier's EMA of the accepted drafts and its step choice (module docstring)."""

    def __init__(self, initial_steps: int, params: dict):
        self.candidates = list(params["candidate_steps"])
        self.alpha = float(params["ema_alpha"])
        self.interval = int(params["update_interval"])
        self.warmup = int(params["warmup_batches"])
        self.h_down, self.h_up = float(params["down_hysteresis"]), float(params["up_hysteresis"])
        self.ceiling_coeff = float(params["ceiling_coeff"])
        self.steps = initial_steps if initial_steps in self.candidates else self.candidates[len(self.candidates) // 2]
        self.ema = float(self.steps - 1)
        self.n = 0

    def update(self, accepted) -> bool:
        """One verified batch's per-row accepted drafts; True when the step count changes."""
        acc = np.asarray(accepted, np.float64)
        if acc.size == 0:
            return False
        if self.steps > 0:
            self.ema = (1 - self.alpha) * self.ema + self.alpha * float(acc.mean())
        self.n += 1
        if self.n <= self.warmup or (self.n - self.warmup) % self.interval:
            return False
        return self._decide()

    def _decide(self) -> bool:
        old = self.steps
        i = self.candidates.index(old)
        if old == 0:                                            # probe upwards from "no speculation"
            i = min(i + 1, len(self.candidates) - 1)
            if self.candidates[i] > 0 and self.ema < 0:
                self.ema = float(self.candidates[i] - 1)
            return self._set(self.candidates[i])
        start = i
        while i > 0:
            lower = self.candidates[i - 1]
            if self.ema <= (0.5 if lower == 0 else lower - 0.5) + self.h_down:
                i -= 1
            else:
                break
        if i == start:
            while i < len(self.candidates) - 1 and self.ema > self.candidates[i] - 0.5 + self.h_up:
                i += 1
        if self.ceiling_coeff > 0:
            ceiling = max(1, math.ceil(self.ema * self.ceiling_coeff))
            if old >= self.candidates[i] > ceiling:
                while i > 0 and self.candidates[i] > ceiling:
                    i -= 1
        return self._set(self.candidates[i])

    def _set(self, steps: int) -> bool:
        changed, self.steps = steps != self.steps, steps
        return changed


class SGLangAdaptive(Chooser):
    """The rule as a step chooser: the tier of this step's B picks the chain length, and learns from
    the rows' accepted drafts after the step."""

    def __init__(self, config: dict | None = None, initial_steps: int = 3, cuda_graph_bs=None,
                 name: str = "SGLang adaptive"):
        self.tiers_cfg = parse_config(config)
        self.initial_steps, self.name = int(initial_steps), name
        self.graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def shapes(self):
        return [chain(k) for k in sorted({k for t in self.tiers_cfg.values() for k in t["candidate_steps"]})]

    def reset(self, table, latency):
        super().reset(table, latency)
        self.tiers = {b: AdaptiveTier(self.initial_steps, p) for b, p in self.tiers_cfg.items()}
        self.keys = list(self.tiers)
        self.index = {k: table.index(chain(k)) for k in {k for t in self.tiers_cfg.values() for k in t["candidate_steps"]}}

    def tier(self, batch: int) -> AdaptiveTier:
        if self.graph_bs is not None:
            g = bisect.bisect_left(self.graph_bs, batch)
            batch = self.graph_bs[g] if g < len(self.graph_bs) else batch
        return self.tiers[self.keys[max(0, bisect.bisect_right(self.keys, batch) - 1)]]

    def choose(self, view):
        return self.index[self.tier(view.batch).steps]

    def observe(self, view, a, accepted):
        self.tier(view.batch).update(accepted)
