"""The controller interface: how policies steer the engine without touching it.

One engine (pipeline/decode/engine/core.py) decodes at every batch size, one shape per step for all
its rows, as SGLang and vLLM do; one shape type, StepShape (D, W, V): off (D = 0, V = 1, a plain AR
step), a chain (W = 1, V = D + 1) or an EAGLE-3 tree. One controller interface, at every B:

  1. `plan(StepContext)` once per step, before drafting                  -> StepShape
     (the batch: B, each row's context and history; at B = 1 that is one sequence's cycle)
  2. `observe(StepRecord)` after the step, with what happened (held actions, histories)

and, at every B, for chains at T = 0, a per-request budget hook (the engine drafts the step's chain
for every row, reads the drafts' running log-probs once, and each row verifies its own prefix):

  2b. `row_budgets(scores [A, D], shape)` after drafting -> k_r in 0 .. D per row

and, at B = 1 only, two level hooks for the papers' per-sequence policies (the engine drafts that
step level by level, eagerly: each ask reads the host):

  3. `continue_drafting(DraftStep)` after every draft forward but the last allowed one
     -> False stops drafting there (LTD / RADAR depth policies, DDD, entropy stops)
  4. `verify_size(DraftPool, shape)` once, before verification -> V (LTD's size policy)

Provided: StaticController (one shape; off every step is AR), ScheduleController (batch-size
ranges -> shape, vLLM's and SGLang's per-B schedules) and ScriptedController (a fixed sequence).

Records: a `StepRecord` per step (the batch's shape, each row's L and tokens, the step's phase
times), and per row a `CycleRecord` per step it took part in (its L, its tokens, its context; the
step's times). A batch-1 generation's cycles are its one row's. The engine times all controller
calls of a step together as t_controller.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.decode.step_shape import (batch_ranges, DEFAULT_DEPTH, DEFAULT_VERIFY_SIZE, DEFAULT_WIDTH, shape_for_batch,
                                        StepShape)
from pipeline.decode.tree import DraftPool, DraftStep
from pipeline.errors import DraftGymError

@dataclass
class StepContext:
    """What `plan` sees before a step. Lists are per active row, in slot order (at B = 1, one entry)."""

    step: int                      # 0-based step index within this generation
    batch_size: int                # B: active rows in this step
    rows: list[int]                # each row's request (prompt index)
    context_lens: list[int]        # tokens before each row's root
    new_tokens: list[int]          # tokens each row has emitted so far
    history: list[list[int]]       # each row's accepted draft tokens L, one per step it took part in
    queued: int                    # requests waiting for a free row
    confidence: "object | None" = None   # [B] tensor: each root's depth-1 top draft log-prob, when
                                          # the controller sets uses_confidence (else None)
    last: "StepRecord | None" = None


@dataclass
class CycleRecord:
    """One row's cycle: a step as one row saw it. Times are the step's (shared by its rows; seconds
    between its phase marks, filled in when the generate call ends; 0 in an untimed call)."""

    step: int              # the step it took part in
    batch_size: int        # B active rows in that step
    depth: int             # D drafted (0: off)
    width: int             # W
    verify_size: int       # V verified (root included; clamped to 1 + pool size)
    accepted: int          # L: drafted tokens accepted
    emitted: int           # tokens appended: L + 1, less when EOS or max_new_tokens cut the row
    context_len: int       # tokens before the root
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_controller: float = 0.0
    t_cycle: float = 0.0   # the step's t_step

    @property
    def t_overhead(self) -> float:
        """The cycle's time outside draft, verify and controller (the latency model's overhead op)."""
        return self.t_cycle - self.t_draft - self.t_verify - self.t_controller


@dataclass
class StepRecord:
    """One step. Per-row lists in slot order; times are seconds of device time between the step's
    phase marks (pipeline/runtime/clock.py), filled in when the generate call ends."""

    step: int
    batch_size: int                # B active rows
    depth: int                     # D drafted (0: off)
    width: int                     # W (after clamping to the draft vocabulary)
    verify_size: int               # V verified per row (root included; clamped to 1 + pool size)
    rows: list[int]                # request of each row
    context_lens: list[int]        # tokens before each row's root
    accepted: list[int]            # L_r
    emitted: list[int]             # L_r + 1, less where EOS or max_new_tokens cut the row
    queued: int                    # requests waiting when the step began
    t_draft: float = 0.0           # head forwards (pending entries + tree levels) + tree selection
    t_verify: float = 0.0          # target forward over B x V tokens + acceptance + KV compaction
    t_controller: float = 0.0      # plan + observe
    t_step: float = 0.0            # the whole step, refills excluded; minus the three above = overhead
    t_refill: float = 0.0          # prefills of requests that joined after this step
    captures: int = 0              # CUDA graphs captured in this step (its time holds eager runs and captures)
    row_budgets: list[int] | None = None   # drafts each row verified, when a row_budgets hook set them

    @property
    def t_overhead(self) -> float:
        """The step's time outside draft, verify and controller (refills excluded, as from t_step)."""
        return self.t_step - self.t_draft - self.t_verify - self.t_controller

    @property
    def accepted_sum(self) -> int:
        return sum(self.accepted)

    @property
    def emitted_sum(self) -> int:
        return sum(self.emitted)

    @property
    def shape(self) -> StepShape:
        return StepShape(self.depth, self.width, self.verify_size)


class Controller:
    """Base controller: a fixed shape every step, never stops early. Subclass and override any hook
    (module docstring). Set `uses_confidence = True` to be given the roots' depth-1 draft
    confidences: the engine then runs the head's forward over the pending entries before `plan`
    (work a drafting step does anyway; on an off step it keeps the head's cache current)."""

    uses_confidence = False

    def __init__(self, shape: StepShape | None = None):
        self.shape = StepShape.of(shape) if shape is not None else StepShape()

    def reset(self) -> None:
        """Called at the start of every generation."""

    def plan(self, ctx: StepContext) -> StepShape:
        return self.shape

    def continue_drafting(self, step: DraftStep) -> bool:
        """Level hook, B = 1 only: asked after each draft forward but the last allowed one."""
        return True

    def verify_size(self, pool: DraftPool, shape: StepShape) -> int:
        """Level hook, B = 1 only: V from the drafted pool."""
        return shape.verify_size

    def row_budgets(self, scores, shape: StepShape) -> list[int] | None:
        """Per-request budget hook, any B, chains at T = 0: each row's kept drafts (0 .. D) from the
        running log-probs of its drafts, scores [A, D] (numpy); None keeps every draft."""
        return None

    def observe(self, record: StepRecord) -> None:
        pass


def uses_row_budgets(controller: Controller) -> bool:
    """Whether a controller overrides `row_budgets`."""
    return type(controller).row_budgets is not Controller.row_budgets


class StaticController(Controller):
    """The same shape every step: StaticController(8, 10, 60), or StaticController(shape);
    StaticController(StepShape.off()) is AR."""

    def __init__(self, depth=DEFAULT_DEPTH, width: int = DEFAULT_WIDTH, verify_size: int = DEFAULT_VERIFY_SIZE):
        super().__init__(StepShape.of(depth) if hasattr(depth, "depth") else StepShape(depth, width, verify_size))


class ScheduleController(Controller):
    """A shape per batch-size range, as vLLM's per-batch-size speculative token counts and SGLang's
    adaptive tiers: ranges [(lo, hi, shape), ...], inclusive, hi None = no upper bound, checked by the
    schedule's one rule (pipeline/decode/step_shape.py `batch_ranges`: from B = 1 without gaps or
    overlaps; beyond a closed last range, its shape), the replay's `Schedule` ranges as they are."""

    def __init__(self, ranges):
        rs = batch_ranges(ranges)
        super().__init__(rs[0][2])
        self.ranges = rs

    def shape_for(self, batch_size: int) -> StepShape:
        return shape_for_batch(self.ranges, batch_size)

    def plan(self, ctx: StepContext) -> StepShape:
        return self.shape_for(ctx.batch_size)


class ScriptedController(Controller):
    """Plays a list of shapes step by step, round and round (tests; replays of a logged schedule)."""

    def __init__(self, shapes):
        if not shapes:
            raise DraftGymError("a scripted controller needs at least one shape")
        self.shapes = [StepShape.of(s) for s in shapes]
        super().__init__(self.shapes[0])

    def plan(self, ctx: StepContext) -> StepShape:
        return self.shapes[ctx.step % len(self.shapes)]


def uses_level_hooks(controller: Controller) -> bool:
    """Whether a controller drafts level by level (`continue_drafting`) or sizes the tree from the
    pool (`verify_size`), B = 1 only: its own `level_hooks` if it says, else whether it overrides either."""
    own = getattr(controller, "level_hooks", None)
    if own is not None:
        return bool(own)
    t = type(controller)
    return t.continue_drafting is not Controller.continue_drafting or t.verify_size is not Controller.verify_size

