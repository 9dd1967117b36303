"""A simulator step chooser steering the batched engine: the same object picks the step's shape in
the serving replay (simulator/serving/load.py) and on the device (pipeline/decode/batch_engine.py).

A chooser (simulator/serving/choosers.py) answers an index into a table of shapes, from a StepView
of the batch, and learns from each step's accepted lengths. Here the table is the chooser's own
shapes, and the view is built from the engine's BatchStepContext:

    batch, context_len, requests, queued     the engine's (the same meaning as in the replay)
    left                                     max_new_tokens - tokens emitted, per row
    rows                                     -1: no log row on the device

so a chooser that reads the logs' rows (the greedy oracle, a learned policy's log-derived
confidences) cannot run here, and says so in one line. Static shapes, schedules (a per-B schedule,
vLLM's example) and SGLang's adaptive rule read only the batch and the accepted lengths.
"""
from __future__ import annotations

import numpy as np

from pipeline.decode.controller import BatchController, BatchStepContext, StepRecord, StepShape
from pipeline.errors import DraftGymError
from simulator.serving.choosers import Chooser, GreedyOracle, StepView
from simulator.serving.shapes import canonical, label


class ShapeIndex:
    """The table a chooser sees on the device: its shapes, by index (ShapeTable's `index`, `shapes`)."""

    def __init__(self, shapes):
        self.shapes = [canonical(s) for s in shapes]
        self._index = {s: i for i, s in enumerate(self.shapes)}

    def __len__(self) -> int:
        return len(self.shapes)

    def index(self, shape) -> int:
        s = canonical(shape)
        if s not in self._index:
            raise DraftGymError(f"shape {label(s)} is not among the chooser's shapes")
        return self._index[s]


class ChooserController(BatchController):
    """A Chooser as a BatchController (module docstring)."""

    def __init__(self, chooser: Chooser, max_new_tokens: list[int]):
        if isinstance(chooser, GreedyOracle) or not chooser.shapes():
            raise DraftGymError(f"{chooser.name} reads the logs' acceptance; it replays only (draftgym serve-eval)")
        if getattr(chooser, "policy", None) is not None:
            raise DraftGymError(f"{chooser.name}: a learned load-aware policy reads log-derived confidences; "
                                f"it replays only (draftgym serve-eval --policy)")
        self.chooser, self.max_new = chooser, list(max_new_tokens)
        self.table = ShapeIndex(chooser.shapes())
        super().__init__(StepShape(*self.table.shapes[0]))

    def reset(self) -> None:
        self.chooser.reset(self.table, None)
        self.view, self.a = None, None

    def plan(self, ctx: BatchStepContext) -> StepShape:
        B = ctx.batch_size
        req = np.asarray(ctx.rows, np.int64)
        self.view = StepView(batch=B, rows=np.full(B, -1, np.int64), context_len=np.asarray(ctx.context_lens, np.int64),
                             left=np.array([self.max_new[r] for r in ctx.rows], np.int64) - np.asarray(ctx.new_tokens),
                             requests=req, time=0.0, queued=ctx.queued)
        self.a = int(self.chooser.choose(self.view))
        return StepShape(*self.table.shapes[self.a])

    def observe(self, record: StepRecord) -> None:
        self.chooser.observe(self.view, self.a, np.asarray(record.accepted, np.int64))
