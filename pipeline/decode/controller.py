"""The controller interface: how policies steer the engine without touching it.

One engine (pipeline/decode/batch_engine.py) decodes at every batch size, one shape per step for all
its rows, as SGLang and vLLM do; one shape type, StepShape (D, W, V): off (D = 0, V = 1, a plain AR
step), a chain (W = 1, V = D + 1) or an EAGLE-3 tree.

A batch controller has two hooks: `plan(BatchStepContext)` -> StepShape once per step, and
`observe(StepRecord)` after it. Provided: StaticBatchController (one shape; off every step is AR at
batch B), ScheduleBatchController (batch-size ranges -> shape) and ScriptedBatchController (a fixed
sequence of shapes).

A batch-1 `Controller` (the policies of the papers decide per sequence) is asked, in each cycle:
  1. `plan(ctx)` once, before drafting            -> StepShape(depth, width, verify_size)
     (Re-SpS-style shape policies; `depth` is the maximum number of draft forwards)
  2. `continue_drafting(step)` after every draft forward but the last allowed one
     -> False stops drafting there (LTD / RADAR depth policies, DDD, entropy stops)
  3. `verify_size(pool, shape)` once, before verification -> V (LTD size policy)
  4. `observe(record)` after the cycle, with what happened (for held actions, histories)
`OneRowController` runs it on the engine at B = 1 (what `Engine` does): plan sees a CycleContext,
observe a CycleRecord; with level hooks the engine drafts that step level by level, eagerly (each
ask reads the host). The engine times all controller calls together as t_controller.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.decode.tree import DraftPool, DraftStep
from pipeline.errors import DraftGymError

EAGLE3_DEFAULT_SHAPE = (8, 10, 60)     # EAGLE-3's from_pretrained (D, W, V): the static default everywhere
DEFAULT_DEPTH, DEFAULT_WIDTH, DEFAULT_VERIFY_SIZE = EAGLE3_DEFAULT_SHAPE


@dataclass(frozen=True)
class StepShape:
    """The shape of one step, at any batch size: D draft forwards over W beams, V tokens verified
    per row (root included; D is the most forwards when a depth policy stops early). Off: D = 0,
    V = 1. Chain: W = 1, V = D + 1. Otherwise an EAGLE-3 tree."""

    depth: int = DEFAULT_DEPTH
    width: int = DEFAULT_WIDTH
    verify_size: int = DEFAULT_VERIFY_SIZE

    def __post_init__(self):
        if int(self.depth) < 0 or int(self.width) < 1 or int(self.verify_size) < 1:
            raise ValueError(f"a step shape needs depth >= 0, width >= 1, verify_size >= 1, got {self}")
        if int(self.depth) == 0 and int(self.verify_size) != 1:
            raise ValueError(f"a step with no draft (depth 0) verifies the root only (verify_size 1), got {self}")

    @classmethod
    def off(cls) -> "StepShape":
        return cls(0, 1, 1)

    @classmethod
    def chain(cls, depth: int) -> "StepShape":
        return cls(depth, 1, depth + 1)

    @classmethod
    def of(cls, shape) -> "StepShape":
        """Any (depth, width, verify_size) object as a StepShape."""
        return cls(shape.depth, shape.width, shape.verify_size)

    @property
    def is_off(self) -> bool:
        return self.depth == 0

    @property
    def kind(self) -> str:
        return "off" if self.is_off else ("chain" if self.width == 1 else "tree")

    def label(self) -> str:
        """'off', 'chain3' or 'tree(8,10,60)' (for step logs and reports)."""
        if self.is_off:
            return "off"
        if self.width == 1 and self.verify_size == self.depth + 1:
            return f"chain{self.depth}"
        return f"tree({self.depth},{self.width},{self.verify_size})"


@dataclass
class CycleContext:
    """What `plan` sees at the start of a cycle."""

    cycle: int             # 0-based cycle index within this generation
    context_len: int       # tokens before the root (prompt + emitted, root excluded)
    new_tokens: int        # tokens emitted so far
    last: "CycleRecord | None" = None


@dataclass
class CycleRecord:
    """One verify cycle. Times are seconds, each device-synchronised."""

    depth: int             # D actually drafted
    width: int             # W
    verify_size: int       # V actually verified (root included; clamped to 1 + pool size)
    accepted: int          # L: drafted tokens accepted
    emitted: int           # tokens appended: L + 1, less when EOS or max_new_tokens cut the cycle
    context_len: int
    t_draft: float         # draft forwards + tree selection
    t_verify: float        # target verify forward + acceptance + KV compaction
    t_controller: float    # all controller calls of this cycle
    t_cycle: float         # the whole cycle; t_cycle - the three above = per-cycle overhead

    @property
    def t_overhead(self) -> float:
        """The cycle's time outside draft, verify and controller (the latency model's overhead op)."""
        return self.t_cycle - self.t_draft - self.t_verify - self.t_controller


class Controller:
    """Base controller: a fixed shape, never stops early. Subclass and override any hook."""

    def __init__(self, shape: StepShape | None = None):
        self.shape = shape or StepShape()

    def reset(self) -> None:
        """Called at the start of every generation."""

    def plan(self, ctx: CycleContext) -> StepShape:
        return self.shape

    def continue_drafting(self, step: DraftStep) -> bool:
        return True

    def verify_size(self, pool: DraftPool, shape: StepShape) -> int:
        return shape.verify_size

    def observe(self, record: CycleRecord) -> None:
        pass


class StaticController(Controller):
    """Static EAGLE-3: the same (D, W, V) every cycle."""

    def __init__(self, depth: int = DEFAULT_DEPTH, width: int = DEFAULT_WIDTH, verify_size: int = DEFAULT_VERIFY_SIZE):
        super().__init__(StepShape(depth, width, verify_size))


# -- batch controllers (module docstring) ---------------------------------------------------------


@dataclass
class BatchStepContext:
    """What a batch controller sees before a step. Lists are per active row, in slot order."""

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


class BatchController:
    """Base batch controller: a fixed shape every step. Subclass and override `plan` / `observe`.
    Set `uses_confidence = True` to be given the roots' depth-1 draft confidences: the engine then
    runs the head's forward over the pending entries before `plan` (work a drafting step does
    anyway; on an off step it keeps the head's cache current)."""

    uses_confidence = False

    def __init__(self, shape: StepShape | None = None):
        self.shape = StepShape.of(shape) if shape is not None else StepShape()

    def reset(self) -> None:
        """Called at the start of every generation."""

    def plan(self, ctx: BatchStepContext) -> StepShape:
        return self.shape

    def observe(self, record: StepRecord) -> None:
        pass


class StaticBatchController(BatchController):
    """The same shape every step (StepShape.off() every step is AR at batch B)."""


class ScheduleBatchController(BatchController):
    """A shape per batch-size range, as vLLM's per-batch-size speculative token counts and SGLang's
    adaptive tiers: ranges [(lo, hi, shape), ...], inclusive, hi None = no upper bound. The ranges
    must cover 1, 2, ... without gaps or overlaps and end open (so every B has a shape)."""

    def __init__(self, ranges):
        rs = sorted(((int(lo), None if hi is None else int(hi), StepShape.of(s)) for lo, hi, s in ranges),
                    key=lambda r: r[0])
        nxt = 1
        for lo, hi, _ in rs:
            if nxt is None or lo != nxt or (hi is not None and hi < lo):
                raise DraftGymError(f"batch-size schedule {[(lo, hi) for lo, hi, _ in rs]}: ranges must cover "
                                    f"1, 2, ... without gaps or overlaps")
            nxt = None if hi is None else hi + 1
        if nxt is not None:
            raise DraftGymError(f"batch-size schedule ends at B = {nxt - 1}: the last range needs no upper bound")
        super().__init__(rs[0][2])
        self.ranges = rs

    def shape_for(self, batch_size: int) -> StepShape:
        return next(s for lo, hi, s in self.ranges if lo <= batch_size and (hi is None or batch_size <= hi))

    def plan(self, ctx: BatchStepContext) -> StepShape:
        return self.shape_for(ctx.batch_size)


class ScriptedBatchController(BatchController):
    """Plays a list of shapes step by step, round and round (tests; replays of a logged schedule)."""

    def __init__(self, shapes):
        if not shapes:
            raise DraftGymError("a scripted controller needs at least one shape")
        self.shapes = [StepShape.of(s) for s in shapes]
        super().__init__(self.shapes[0])

    def plan(self, ctx: BatchStepContext) -> StepShape:
        return self.shapes[ctx.step % len(self.shapes)]


def uses_level_hooks(controller: Controller) -> bool:
    """Whether a batch-1 controller drafts level by level (`continue_drafting`) or sizes the tree from
    the pool (`verify_size`): its own `level_hooks` if it says, else whether it overrides either."""
    own = getattr(controller, "level_hooks", None)
    if own is not None:
        return bool(own)
    t = type(controller)
    return t.continue_drafting is not Controller.continue_drafting or t.verify_size is not Controller.verify_size


def cycle_record(r: StepRecord) -> CycleRecord:
    """A B = 1 step as a batch-1 cycle record (t_cycle = t_step)."""
    return CycleRecord(depth=r.depth, width=r.width, verify_size=r.verify_size, accepted=r.accepted[0],
                       emitted=r.emitted[0], context_len=r.context_lens[0], t_draft=r.t_draft, t_verify=r.t_verify,
                       t_controller=r.t_controller, t_cycle=r.t_step)


class OneRowController(BatchController):
    """A batch-1 `Controller` on the batched engine at B = 1: `plan` sees the CycleContext and
    `observe` a CycleRecord per step; `level_hooks` tells the engine to ask
    `continue_drafting` after each draft level and `verify_size` before selection."""

    def __init__(self, controller: Controller):
        self.inner = controller
        self.level_hooks = uses_level_hooks(controller)
        self.shape = StepShape.of(getattr(controller, "shape", None) or StepShape())

    def reset(self) -> None:
        self.inner.reset()
        self.records: list[CycleRecord] = []      # what observe gave the controller, one per step

    def plan(self, ctx: BatchStepContext) -> StepShape:
        if ctx.batch_size != 1:
            raise DraftGymError(f"a batch-1 controller ({type(self.inner).__name__}) runs at batch size 1, "
                                f"got {ctx.batch_size} rows")
        last = self.records[-1] if ctx.last is not None else None
        return StepShape.of(self.inner.plan(CycleContext(ctx.step, ctx.context_lens[0], ctx.new_tokens[0], last)))

    def continue_drafting(self, step: DraftStep) -> bool:
        return self.inner.continue_drafting(step)

    def verify_size(self, pool: DraftPool, shape: StepShape) -> int:
        return self.inner.verify_size(pool, shape)

    def observe(self, record: StepRecord) -> None:
        """The controller gets the cycle's record before its times are known (they are resolved
        when the call ends); `finish` completes the same objects then."""
        self.records.append(cycle_record(record))
        self.inner.observe(self.records[-1])

    def finish(self, steps: list[StepRecord]) -> list[CycleRecord]:
        """The records observe handed out, with each step's times (known once the call has ended:
        the engine resolves its phase marks then)."""
        for rec, st in zip(self.records, steps):
            rec.t_draft, rec.t_verify, rec.t_controller, rec.t_cycle = st.t_draft, st.t_verify, st.t_controller, st.t_step
        return self.records
