"""A simulator step chooser steering the batched engine: the same object picks the step's shape in
the serving replay (simulator/serving/load.py) and on the device (pipeline/decode/engine/core.py).

A chooser (simulator/serving/choosers/base.py) answers an index into a table of shapes, from a StepView
of the batch, and learns from each step's accepted lengths. Here the table is the chooser's own
shapes, and the view is built from the engine's StepContext:

    batch, context_len, requests, queued     the engine's (the same meaning as in the replay)
    left                                     max_new_tokens - tokens emitted, per row
    rows                                     -1: no log row on the device
    time, step_time                          wall s since reset at the plan; wall s from plan to observe
                                             (Nightjar's bandit learns from tokens per second)
    confidence                               [B, 1] float64: each root's depth-1 top draft log-prob,
                                             measured by the engine (only on the steps it is asked)

Which choosers run here. Static shapes, schedules (a per-B schedule, vLLM's example), SGLang's
adaptive rule and Nightjar's bandit read only the batch, the accepted lengths and the clock. A learned load-aware policy
(simulator/serving/choosers/learned.py LearnedChooser) also reads the batch's draft confidences s_r(d); the
engine measures s_r(1) (StepContext.confidence: the top-1 log-prob of the roots' pending draft
forward, the same at every width) when the controller's `uses_confidence` is True, which here is
exactly on the steps where the policy decides (every `hold` steps) and its observation has
confidences. So a policy with confidence depth <= 1 runs on the device with the replay's observation
function; a deeper one is refused in one line. The greedy oracle cannot run here at all: it picks
each step's shape from every row's logged acceptance under every shape, hindsight the device has not.

Per-request budgets (base.RowChooser: vLLM's adaptive verification, DraftGym's learned budget) run
as `RowChooserController`: plan asks draft_depth, the engine drafts that chain for every row, reads
its running draft log-probs once ([B, D], the engine's row_budgets hook) and row_caps turns them into
each row's kept drafts; the engine verifies each row's own prefix, losslessly (per-request budgets
are eager and greedy: pipeline/decode/engine/core.py). `controller_for` picks the class.

Cost. At a decision step the engine runs the pending draft forward before the policy is asked (the
probe). If the policy picks a drafting shape, that forward is its own first one (no extra work); if
it picks "off", the forward was paid for nothing but the confidences (and keeps the head's cache
current). That is the replay's charge (observations.probe_forwards: with k = 1 only "off" pays, one
forward), so device and replay price a decision alike; the policy call itself is in t_controller.
"""
from __future__ import annotations

import time

import numpy as np

from pipeline.decode.controller import Controller, StepContext, StepRecord
from pipeline.decode.step_shape import StepShape, canonical, label
from pipeline.errors import DraftGymError
from simulator.serving.choosers.base import Chooser, GreedyOracle, RowChooser, StepView
from simulator.serving.choosers.learned import LearnedChooser


class ShapeIndex:
    """The table a chooser sees on the device: its shapes, by index (ShapeTable's `index`, `shapes`,
    `depth`, `width`, `verify`, `step_time`; no `logs`: nothing here reads acceptance)."""

    def __init__(self, shapes):
        self.shapes = [canonical(s) for s in shapes]
        self._index = {s: i for i, s in enumerate(self.shapes)}
        a = np.array(self.shapes, np.int64).reshape(-1, 3)
        self.depth, self.width, self.verify = a[:, 0], a[:, 1], a[:, 2]                  # [A]

    def __len__(self) -> int:
        return len(self.shapes)

    def index(self, shape) -> int:
        s = canonical(shape)
        if s not in self._index:
            raise DraftGymError(f"shape {label(s)} is not among the chooser's shapes")
        return self._index[s]

    def step_time(self, latency, a, batch: int, context_len) -> np.ndarray:
        """Seconds of one step of shape(s) a over `batch` rows at context c, LatencyModel.t_step's
        numbers (ShapeTable.step_time tabulates the same): what a chooser that prices its
        candidates (SGLang's throughput-aware rule) reads."""
        a = np.asarray(a, np.int64)
        return latency.t_step(self.depth[a], self.width[a], self.verify[a], np.asarray(context_len, np.float64),
                              batch=batch)


class ChooserController(Controller):
    """A Chooser as a Controller (module docstring)."""

    def __init__(self, chooser: Chooser, max_new_tokens: list[int], latency=None):
        """latency: the LatencyModel a chooser prices its candidates with (SGLang's throughput-aware
        rule; the same one its replay gets), None for the choosers that need none."""
        if isinstance(chooser, GreedyOracle) or not chooser.shapes():
            raise DraftGymError(f"{chooser.name} reads the logs' acceptance; it replays only (draftgym serve-eval)")
        if isinstance(chooser, LearnedChooser):
            chooser.check_device()               # confidence depth > 1: one line
        self.chooser, self.max_new, self.latency = chooser, list(max_new_tokens), latency
        self.table = ShapeIndex(chooser.shapes())
        super().__init__(StepShape(*self.table.shapes[0]))

    @property
    def uses_confidence(self) -> bool:
        """Read by the engine before every plan: True exactly when the chooser's next choice is a
        decision that reads confidences (a learned policy's decision step); False otherwise."""
        return bool(getattr(self.chooser, "needs_confidence", False))

    def reset(self) -> None:
        self.chooser.reset(self.table, self.latency)
        self.view, self.a, self.t0 = None, None, time.perf_counter()

    def plan(self, ctx: StepContext) -> StepShape:
        B = ctx.batch_size
        req = np.asarray(ctx.rows, np.int64)
        conf = None
        if ctx.confidence is not None:                                   # [B] tensor -> [B, 1] float64
            conf = ctx.confidence.detach().to("cpu").double().numpy().reshape(B, 1)
        self.view = StepView(batch=B, rows=np.full(B, -1, np.int64), context_len=np.asarray(ctx.context_lens, np.int64),
                             left=np.array([self.max_new[r] for r in ctx.rows], np.int64) - np.asarray(ctx.new_tokens),
                             requests=req, time=time.perf_counter() - self.t0, queued=ctx.queued, confidence=conf)
        return self._choose()

    def _choose(self) -> StepShape:
        self.a = int(self.chooser.choose(self.view))
        return StepShape(*self.table.shapes[self.a])

    def observe(self, record: StepRecord) -> None:
        self.view.step_time = time.perf_counter() - self.t0 - self.view.time     # wall s since this step's plan
        self.chooser.observe(self.view, self.a, np.asarray(record.accepted, np.int64))


class RowChooserController(ChooserController):
    """A RowChooser as a Controller: its draft depth before drafting, its per-row caps after (module
    docstring)."""

    def _choose(self) -> StepShape:
        D = int(self.chooser.draft_depth(self.view))
        self.a = int(self.chooser.idx[D])
        return StepShape(*self.table.shapes[self.a])

    def row_budgets(self, scores, shape):
        return [int(k) for k in self.chooser.row_caps(self.view, np.asarray(scores, np.float64))]


def controller_for(chooser: Chooser, max_new_tokens: list[int], latency=None) -> ChooserController:
    """The controller that runs `chooser` on the device: per-request budgets or one shape a step."""
    cls = RowChooserController if isinstance(chooser, RowChooser) else ChooserController
    return cls(chooser, max_new_tokens, latency)
