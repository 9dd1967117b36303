"""The controller interface: how policies steer the engine without touching it.

The engine calls, in each cycle:
  1. `plan(ctx)` once, before drafting            -> TreeShape(depth, width, verify_size)
     (Re-SpS-style shape policies; `depth` is the maximum number of draft forwards)
  2. `continue_drafting(step)` after every draft forward but the last allowed one
     -> False stops drafting there (LTD / RADAR depth policies, DDD, entropy stops)
  3. `verify_size(pool, shape)` once, before verification -> V (LTD size policy)
  4. `observe(record)` after the cycle, with what happened (for held actions, histories)
The engine times all controller calls together as t_controller (device-synchronised).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.tree import DraftPool, DraftStep

DEFAULT_DEPTH, DEFAULT_WIDTH, DEFAULT_VERIFY_SIZE = 8, 10, 60  # EAGLE-3 from_pretrained defaults


@dataclass(frozen=True)
class TreeShape:
    depth: int = DEFAULT_DEPTH              # D: draft forwards (max, when a depth policy stops early)
    width: int = DEFAULT_WIDTH              # W: top_k
    verify_size: int = DEFAULT_VERIFY_SIZE  # V: tokens verified, root included

    def __post_init__(self):
        for name in ("depth", "width", "verify_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


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


class Controller:
    """Base controller: a fixed shape, never stops early. Subclass and override any hook."""

    def __init__(self, shape: TreeShape | None = None):
        self.shape = shape or TreeShape()

    def reset(self) -> None:
        """Called at the start of every generation."""

    def plan(self, ctx: CycleContext) -> TreeShape:
        return self.shape

    def continue_drafting(self, step: DraftStep) -> bool:
        return True

    def verify_size(self, pool: DraftPool, shape: TreeShape) -> int:
        return shape.verify_size

    def observe(self, record: CycleRecord) -> None:
        pass


class StaticController(Controller):
    """Static EAGLE-3: the same (D, W, V) every cycle."""

    def __init__(self, depth: int = DEFAULT_DEPTH, width: int = DEFAULT_WIDTH, verify_size: int = DEFAULT_VERIFY_SIZE):
        super().__init__(TreeShape(depth, width, verify_size))
