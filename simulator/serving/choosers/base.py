"""Step choosers: who picks the one shape of a serving step (simulator/serving/load.py calls them).

A chooser sees, before each step, a `StepView` of the batch (B, the rows' log rows, contexts and
tokens left, the queue; on the device also the rows' measured draft confidences) and returns an
index into the replay's `ShapeTable` (one shape for every row), or a `RowShapes` (a per-request
budget: every row drafts the same chain, each verifies its own prefix of it; vLLM's adaptive
verification, simulator/serving/choosers/vllm_adaptive.py); after the step it is told every row's L
(SGLang's adaptive rule learns from it). A chooser whose decision costs time (a learned policy:
simulator/serving/choosers/learned.py) says how much in `extra_time`. Choosers here:

    StaticChooser     one shape for every step (AR is the static "off")
    ScheduleChooser   the shape of the schedule's range holding B (a per-B schedule, vLLM's example)
    GreedyOracle      hindsight, per step: the shape with the most tokens per second in this step,
                      given every row's logged acceptance (maths below)

The greedy oracle. The exact hindsight optimum is a dynamic programme over the joint state of all
rows (B positions plus the queue), intractable beyond a few rows. Per step it picks

    s* = argmax_s  sum_r min(L_r(s) + 1, left_r)  /  t(s, B, c)

from the logs, so it never guesses acceptance; it is greedy (no look-ahead), hence a strong
reference, not an upper bound. The batch-1 oracle (simulator/baselines.py) is the exact DP.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.decode.step_shape import OFF, canonical, chain, label


@dataclass
class StepView:
    batch: int                   # B active rows
    rows: np.ndarray             # [B] log rows (offsets[seq] + p)
    context_len: np.ndarray      # [B]
    left: np.ndarray             # [B] tokens each row still has to emit
    requests: np.ndarray         # [B] request ids
    time: float                  # s, at the start of the step
    queued: int                  # requests arrived and waiting for a slot
    confidence: np.ndarray | None = None   # [B, k] draft log-probs s_r(1..k) the engine measured (on the
                                           # device, k = 1: online/adapters/chooser.py; observations.step_obs
                                           # cleans them); None in the replay, which reads the logs' rows
    step_time: float | None = None         # s the step took, set once it ran, before observe (the replay: its
                                           # replayed time; the device: wall time from plan to observe)


@dataclass
class RowShapes:
    """One step, a shape per row: the step drafts `draft` (a shape index: its D forwards of W beams for
    every row, what the draft phase costs) and row r verifies `rows[r]` (a shape index of the same
    width and no deeper, or off: nothing verified beyond its root). The verify is one forward over
    sum_r V_r tokens (ShapeTable.row_step_time prices it)."""
    draft: int
    rows: np.ndarray             # [B] shape index each row verifies


class Chooser:
    name = "chooser"

    def reset(self, table, latency) -> None:
        """Called once before a run, with the replay's ShapeTable and the latency model."""
        self.table, self.latency = table, latency

    def choose(self, view: StepView) -> "int | RowShapes":
        raise NotImplementedError

    def observe(self, view: StepView, a: int, accepted: np.ndarray) -> None:
        """After the step: shape index a ran and row r accepted accepted[r] drafts."""

    def extra_time(self, view: StepView, a: int) -> float:
        """Seconds the choice itself adds to the step (a learned policy's probe forwards and call); 0 here."""
        return 0.0

    def shapes(self) -> list:
        """Shapes this chooser may pick (the replay's ShapeTable must hold them); [] = any."""
        return []


def draft_logprobs(scores) -> np.ndarray:
    """[n, D] each chain draft's own log-prob, from the drafts' running log-probs [n, D]."""
    s = np.asarray(scores, np.float64)
    return np.diff(np.concatenate([np.zeros((len(s), 1)), s], 1), axis=1)


def best_budget(values, batch: int, step_time) -> int:
    """N* = argmax over N of (B + the sum of the N largest `values`) / step_time(N): the verify budget
    of every per-request rule (vLLM's, SGLang's DSpark, row_budget.allocate). step_time takes N [M]."""
    v = np.sort(np.asarray(values, np.float64).ravel())[::-1]
    N = np.arange(len(v) + 1)
    return int(np.argmax((batch + np.concatenate([[0.0], np.cumsum(v)])) / np.asarray(step_time(N), np.float64)))


def keep_best(p: np.ndarray, n: int) -> np.ndarray:
    """k [B]: each row's count among the n largest p [B, K] (ties: the shallower draft), a prefix of
    every row when p falls along K."""
    B, K = p.shape
    order = np.lexsort((np.tile(np.arange(K), B), -p.ravel()))
    k = np.zeros(B, np.int64)
    np.add.at(k, order[:n] // K, 1)
    return k


class RowChooser(Chooser):
    """A chooser whose steps give each row its own prefix of one drafted chain (RowShapes), in two
    calls that the engine can make too (online/adapters/chooser.py):

        draft_depth(view) -> D             before drafting: the chain every row drafts (0: off)
        row_caps(view, scores) -> k [B]    after it: each row's kept drafts, 0 .. D, from scores
                                           [B, D], the rows' running draft log-probs

    In the replay the scores are the logs' (beam_scores of the width-1 chain, what the engine's
    draft computes); choose() runs both calls. Shapes: off and the chains 1 .. K."""
    K = 1

    def shapes(self):
        return [OFF, *[chain(k) for k in range(1, self.K + 1)]]

    def reset(self, table, latency):
        super().reset(table, latency)
        self.idx = np.array([table.index(s) for s in self.shapes()])

    def draft_depth(self, view: StepView) -> int:
        raise NotImplementedError

    def row_caps(self, view: StepView, scores: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def choose(self, view):
        D = int(self.draft_depth(view))
        if D == 0:
            return int(self.idx[0])
        scores = self.table.logs.w[1].beam_scores[view.rows, :D, 0].astype(np.float64)
        return RowShapes(int(self.idx[D]), self.idx[np.asarray(self.row_caps(view, scores), np.int64)])


class StaticChooser(Chooser):
    def __init__(self, shape, name: str | None = None):
        self.shape = canonical(shape)
        self.name = name or f"static {label(self.shape)}"

    def shapes(self):
        return [self.shape]

    def reset(self, table, latency):
        super().reset(table, latency)
        self.a = table.index(self.shape)

    def choose(self, view):
        return self.a


class ScheduleChooser(Chooser):
    def __init__(self, schedule, name: str = "schedule"):
        self.schedule, self.name = schedule, name

    def shapes(self):
        return self.schedule.shapes()

    def reset(self, table, latency):
        super().reset(table, latency)
        self.by_batch = {}

    def choose(self, view):
        if view.batch not in self.by_batch:
            self.by_batch[view.batch] = self.table.index(self.schedule.shape_for(view.batch))
        return self.by_batch[view.batch]


class GreedyOracle(Chooser):
    """Per-step hindsight best shape among every shape of the table (module docstring)."""
    name = "oracle (greedy per step)"

    def choose(self, view):
        A, B = len(self.table), view.batch
        a = np.repeat(np.arange(A), B)
        L = self.table.accepted(np.tile(view.rows, A), a).reshape(A, B)
        tokens = np.minimum(L + 1, view.left[None, :]).sum(1)                          # [A]
        dt = self.table.step_time(self.latency, np.arange(A), B, self.latency.step_context(view.context_len))
        return int(np.argmax(tokens / dt))
