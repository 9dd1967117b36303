"""SGLang's throughput-aware speculation rule (`--speculative-adaptive`, strategy "throughput_aware"),
reimplemented from its source to replay it on DraftGym logs and to run it on the device.

Read on 2026-11-26 in sgl-project/sglang: python/sglang/srt/speculative/throughput_aware_controller.py
(commit 088c5ab: the config, `activate_step_by_batch` (the decision), `on_verify_complete` (the data))
and throughput_aware_spec_params.py (2357074: PositionAcceptanceTracker, BatchSizeCostTable,
score_candidates, pick_best_step). Chains only (topk = 1, draft tokens = steps + 1).

    tiers     integer-string keys are batch-size lower bounds, each with its candidate steps (K >= 1);
              a batch of B rows uses the tier with the largest key <= B (the smallest if none), B
              first padded up to the next CUDA-graph batch size when those are given
    start     steps = the server's --speculative-num-steps (`initial_steps`) if a tier holds it, else
              the middle candidate of the lowest tier
    after     for each position k < steps: p_k <- the share of the step's rows with L_r > k, appended
              to position k's window of `window_size` (one tracker for every tier); batches += 1
    decide    before a step, when batches is a positive multiple of `update_interval`, every
              position k < steps has a full window and the cost table is not empty: for each
              candidate S of this B's tier

                  score(S) = E[tokens | S] / cost_ms(B, S),   E = 1 + sum_{k < S} p_k

              p_k a window mean, or past the positions with data extrapolated geometrically from the
              rates so far (one known rate: itself; p_0 alpha^..., alpha = (p_last / p_0)^(1/(n-1)),
              capped at p_last); the best score wins (the first on ties, candidates ascending);
              moving down clears the windows of positions >= the new steps
    cost_ms   SGLang profiles it at start-up over its CUDA-graph batch sizes at one context (seq_len
              2048 by default) and looks B up by ceiling; here each entry is the latency model's step
              time of chain S at that batch size and `cost_context`, from the same profile every
              other method is charged with
"""
from __future__ import annotations

import bisect
from collections import deque

import numpy as np

from pipeline.decode.step_shape import chain
from pipeline.errors import DataError, DraftGymError
from simulator.serving.choosers.base import Chooser

# the example of its module docstring (no tiers are stored in its code)
DEFAULT_CONFIG = {"strategy": "throughput_aware", "window_size": 20, "update_interval": 10,
                  "1": {"candidate_steps": [1, 3, 5, 7]}, "8": {"candidate_steps": [1, 3, 5]},
                  "32": {"candidate_steps": [1, 3]}, "128": {"candidate_steps": [1]}}
COST_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)   # its CUDA-graph sizes, <= 128


def parse_tiers(cfg: dict) -> dict[int, list[int]]:
    """{tier lower bound: sorted candidate steps}, with the controller's own checks (one-line errors)."""
    where = "SGLang throughput-aware config"
    if not isinstance(cfg, dict):
        raise DataError(f"{where}: must be a JSON object")
    tiers = {}
    for key, entry in cfg.items():
        if not str(key).isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or not all(
                isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in steps):
            raise DataError(f"{where}: tier {key}: candidate_steps must be a non-empty list of positive ints, got {steps!r}")
        tiers[int(key)] = sorted(steps)
    if not tiers:
        raise DataError(f"{where}: needs at least one integer-string batch-size key, e.g. {{\"1\": {{\"candidate_steps\": [1, 3]}}}}")
    return dict(sorted(tiers.items()))


class PositionRates:
    """Per-position acceptance over a sliding window, shared by every tier (module docstring)."""

    def __init__(self, max_steps: int, window: int):
        self.window = window
        self.w = [deque(maxlen=window) for _ in range(max_steps)]

    def update(self, accepted, steps: int) -> None:
        L = np.asarray(accepted, np.int64)
        for k in range(min(steps, len(self.w))):
            self.w[k].append(float((L > k).mean()))

    def warmed(self, steps: int) -> bool:
        return all(len(self.w[k]) == self.window for k in range(min(steps, len(self.w))))

    def clear_above(self, steps: int) -> None:
        for k in range(steps, len(self.w)):
            self.w[k].clear()

    def expected_tokens(self, steps: int) -> float | None:
        """1 + sum of p_k over k < steps; None with no data at all."""
        rates: list[float] = []
        for k in range(steps):
            r = sum(self.w[k]) / len(self.w[k]) if k < len(self.w) and self.w[k] else None
            if r is None:
                if not rates:
                    return None
                if len(rates) == 1:
                    r = rates[0]
                elif rates[0] <= 0:
                    r = 0.0
                else:
                    alpha = (rates[-1] / rates[0]) ** (1.0 / (len(rates) - 1))
                    r = max(0.0, min(rates[-1], rates[-1] * alpha))
            rates.append(r)
        return 1.0 + sum(rates)


class SGLangThroughput(Chooser):
    """The rule as a step chooser (module docstring): picks this step's chain from this B's tier."""

    def __init__(self, config: dict | None = None, initial_steps: int = 3, cuda_graph_bs=None,
                 cost_context: float = 2048.0, cost_batch_sizes=COST_BATCH_SIZES,
                 name: str = "SGLang throughput-aware"):
        cfg = DEFAULT_CONFIG if config is None else config
        self.tiers = parse_tiers(cfg)
        self.window, self.interval = int(cfg.get("window_size", 20)), int(cfg.get("update_interval", 10))
        self.candidates = sorted({s for t in self.tiers.values() for s in t})
        self.initial = int(initial_steps) if int(initial_steps) in self.candidates else \
            self.tiers[min(self.tiers)][len(self.tiers[min(self.tiers)]) // 2]
        self.graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None
        self.cost_context, self.cost_bs = float(cost_context), sorted(int(b) for b in cost_batch_sizes)
        self.name = name

    def shapes(self):
        return [chain(k) for k in self.candidates]

    def reset(self, table, latency):
        if latency is None:
            raise DraftGymError(f"{self.name} prices its candidates with a latency profile; none was given")
        super().reset(table, latency)
        self.index = {k: table.index(chain(k)) for k in self.candidates}
        self.cost = {}                                       # (profiled B, steps) -> ms, filled on demand
        self.rates = PositionRates(max(self.candidates), self.window)
        self.steps, self.batches = self.initial, 0

    def tier(self, batch: int) -> list[int]:
        if self.graph_bs is not None:
            g = bisect.bisect_left(self.graph_bs, batch)
            batch = self.graph_bs[g] if g < len(self.graph_bs) else batch
        keys = list(self.tiers)
        return self.tiers[keys[max(0, bisect.bisect_right(keys, batch) - 1)]]

    def cost_ms(self, batch: int, steps: int) -> float:
        """Its start-up table: the step time at the first profiled batch size >= B (the last if none)."""
        i = min(bisect.bisect_left(self.cost_bs, batch), len(self.cost_bs) - 1)
        b = self.cost_bs[i]
        if (b, steps) not in self.cost:
            t = self.table.step_time(self.latency, [self.index[steps]], b, [self.cost_context])
            self.cost[b, steps] = 1e3 * float(np.asarray(t).ravel()[0])
        return self.cost[b, steps]

    def scores(self, batch: int) -> list[tuple[int, float | None]]:
        out = []
        for s in self.tier(batch):
            e = self.rates.expected_tokens(s)
            c = self.cost_ms(batch, s)
            out.append((s, e / c if e is not None and c > 0 else None))
        return out

    def choose(self, view):
        if self.batches > 0 and self.batches % self.interval == 0 and self.rates.warmed(self.steps):
            best, top = self.steps, -np.inf
            for s, sc in self.scores(view.batch):
                if sc is not None and sc > top:
                    best, top = s, sc
            if best < self.steps:
                self.rates.clear_above(best)
            self.steps = best
        return self.index[self.steps]

    def observe(self, view, a, accepted):
        if len(accepted):
            self.rates.update(accepted, self.steps)
            self.batches += 1
